"""A cancelled await point of the core warns on no Python, on either core.

mypyc forwards an exception thrown into a compiled coroutine with the three-argument
``throw(type, value, traceback)``, which CPython 3.12 deprecated for its own coroutines
and futures: cancelling a task in ``timer.sleep()`` or ``handle.wait()`` emitted
``DeprecationWarning`` on the compiled core, and under ``-W error`` the task ended with
that warning instead of its cancellation (aiowheel/_awaits.py). Each await point is
cancelled here with every warning an error; the suite runs like this on every Python
(pyproject.toml, ``filterwarnings``), and these tests say where it would break.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from aiowheel import DelayedOperation, Purgatory, Timer

pytestmark = pytest.mark.anyio


async def _cancelled_in(make: Callable[[], Awaitable[Any]]) -> None:
    """Start ``make()`` in a task, let it block, cancel it: it must end cancelled,
    with no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reached = anyio.Event()
        ended: list[str] = []

        async def body() -> None:
            try:
                reached.set()
                await make()
            except anyio.get_cancelled_exc_class():
                ended.append("cancelled")
                raise
            except BaseException as exc:  # pragma: no cover - the failure this finds
                ended.append(repr(exc))
                raise

        async with anyio.create_task_group() as tg:
            tg.start_soon(body)
            await reached.wait()
            await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
        assert ended == ["cancelled"]


async def test_sleep() -> None:
    async with Timer() as timer:
        await _cancelled_in(lambda: timer.sleep(10))


async def test_handle_wait() -> None:
    async with Timer() as timer:
        handle = timer.schedule_nowait(10, lambda: None)
        await _cancelled_in(handle.wait)


async def test_schedule_waiting_for_room() -> None:
    async with Timer(max_pending=1) as timer:
        timer.schedule_nowait(10, lambda: None)
        await _cancelled_in(lambda: timer.schedule(1, lambda: None))


async def test_aclose_draining() -> None:
    timer = Timer()
    async with timer:
        timer.schedule_nowait(10, lambda: None)
        await _cancelled_in(lambda: timer.aclose(drain=True))


async def test_timeout_block() -> None:
    async with Timer() as timer:

        async def blocked() -> None:
            with timer.timeout(10):
                await anyio.sleep(10)

        await _cancelled_in(blocked)


async def test_purgatory_wait() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = DelayedOperation(10)
        purgatory.try_complete_else_watch(op, ["k"])
        await _cancelled_in(op.wait)


async def test_a_worker_cancelled_by_the_close() -> None:
    # The timer's close cancels its parked and busy workers (their awaits on anyio
    # events and on the job): nothing warns.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        started = anyio.Event()

        async def job() -> None:
            started.set()
            await anyio.sleep(10)

        async with Timer(max_concurrency=4) as timer:
            timer.schedule_nowait(0.001, job)
            timer.schedule_nowait(0.001, anyio.sleep, 0)  # a worker that parks
            await started.wait()
            await anyio.lowlevel.checkpoint()
