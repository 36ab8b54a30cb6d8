"""aiowheel under plain ``asyncio.run`` / ``uvloop.run``, without anyio's runner.

anyio's test plugin runs every test inside ``anyio.run``, which sets a context
variable that lets anyio detect the backend anywhere, even in loop callbacks. A plain
asyncio program does not have it: there, anyio only works inside tasks. The
driver's pass runs in a ``call_at`` callback, so everything it does (spawning a worker
for an async callback, waking waiters, cancelling a ``timeout()`` scope) must work
without that variable. These tests run on real time with small delays and await the
events themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

import aiowheel

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
RUNNERS = [pytest.param(asyncio.run, id="asyncio"), pytest.param(uvloop.run, id="uvloop")]


@pytest.mark.parametrize("run", RUNNERS)
def test_async_callbacks_run_on_workers(run: Runner) -> None:
    async def main() -> list[int]:
        async with aiowheel.Timer(max_concurrency=3) as timer:

            async def double(x: int) -> int:
                await asyncio.sleep(0.001)
                return 2 * x

            handles = [timer.schedule_nowait(0.001 * i, double, i) for i in range(10)]
            results = [await handle.wait() for handle in handles]
            assert timer.stats().workers <= 3
            return results

    assert run(main()) == [2 * i for i in range(10)]


@pytest.mark.parametrize("run", RUNNERS)
def test_timeout_cancels_a_plain_task(run: Runner) -> None:
    async def idle_reader(timer: aiowheel.Timer, scope: aiowheel.Timeout) -> None:
        with scope:
            for _ in range(3):
                await asyncio.sleep(0.005)
                scope.reset(0.02)  # idle timeout: activity pushes it out
            await asyncio.sleep(5)

    async def main() -> float:
        async with aiowheel.Timer() as timer:
            scope = timer.timeout(0.02)
            with pytest.raises(TimeoutError):
                await idle_reader(timer, scope)
            assert scope.expired()
            return timer.time() - scope.deadline

    assert run(main()) >= 0  # never before the deadline


@pytest.mark.parametrize("run", RUNNERS)
def test_sleep_wait_and_close(run: Runner) -> None:
    async def main() -> None:
        async with aiowheel.Timer() as timer:
            start = timer.time()
            await timer.sleep(0.01)
            assert timer.time() >= start + 0.01  # the deadline, computed as the timer does

            started = asyncio.Event()

            async def forever() -> None:
                started.set()
                await asyncio.sleep(3600)

            running = timer.schedule_nowait(0, forever)
            later = timer.schedule_nowait(60, print)
            await started.wait()
            cancelled = await timer.aclose()
            assert cancelled == [later]
            with pytest.raises(aiowheel.TimerCancelled):
                await running.wait()
            assert timer.stats().workers == 0

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_body_exception_propagates_as_itself(run: Runner) -> None:
    async def main() -> None:
        async with aiowheel.Timer() as timer:
            timer.schedule_nowait(10, print)
            raise KeyError("body")

    with pytest.raises(KeyError, match="body"):
        run(main())
