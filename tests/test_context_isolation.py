"""The pass and its worker tasks run in the timer's own context, never in a stranger's,
and no finished request's context is kept alive by the timer (docs/usage.md, "Context
variables"). On asyncio and uvloop the driver's wake-up is a ``call_at`` handle, which
copies the context of whoever arms it unless it is given one: the task that filed the
earliest timer. These tests fail when the driver arms without its own context.

Also here: a worker that could not be started is not counted (the pool starts one
later, and every async callback runs)."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import weakref
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiowheel
from aiowheel import Timer

pytestmark = pytest.mark.anyio

rid: contextvars.ContextVar[str] = contextvars.ContextVar("rid", default="unset")


class _State:
    """What a request keeps in a context variable: its memory must be freed with it."""


async def test_on_error_sees_the_timers_context_not_the_armers() -> None:
    seen: list[str] = []

    def on_error(handle: Any, exc: BaseException) -> None:
        seen.append(rid.get())

    def failing() -> None:
        raise ValueError("boom")

    async def async_failing() -> None:
        raise ValueError("boom")

    async with Timer(tick=0.001, on_error=on_error) as timer:

        async def request() -> None:
            rid.set("request-A")
            await timer.sleep(0.02)  # A files the earliest timer: it arms the driver

        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            await anyio.sleep(0.005)
            # Scheduled from outside any request, after A armed the driver.
            plain = timer.schedule_nowait(0.01, failing)
            job = timer.schedule_nowait(0.01, async_failing)
        with pytest.raises(ValueError, match="boom"):
            await plain.wait()
        with pytest.raises(ValueError, match="boom"):
            await job.wait()
    assert seen == ["unset", "unset"]


@pytest.mark.parametrize("base", ["asyncio", "uvloop"])
def test_the_loop_handlers_record_has_no_strangers_context(base: str) -> None:
    # The drop-in loop: a timer callback's error reaches the loop's exception handler
    # (what a logging filter or structlog's merge_contextvars reads) in the loop's
    # context, as on the plain loop: "unset", not the request that armed the pass.
    pytest.importorskip(base)
    seen: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: seen.append(rid.get()))

        async def request() -> None:
            rid.set("request-A")
            await asyncio.sleep(0.02)

        def failing() -> None:
            raise ValueError("boom")

        task = asyncio.ensure_future(request())
        await asyncio.sleep(0.005)
        ran = loop.create_future()
        loop.call_later(0.005, failing)
        loop.call_later(0.006, ran.set_result, None)
        await ran
        await task

    runner = asyncio.Runner(loop_factory=lambda: aiowheel.new_event_loop(base=base))
    with runner:
        runner.run(main())
    assert seen == ["unset"]


async def test_a_finished_requests_context_is_freed() -> None:
    # The request's state lives in a context variable; it schedules one async
    # callback and one plain one, then ends. The worker task the pass started, and the
    # snapshot cache, must not keep its context alive.
    freed: list[weakref.ref[_State]] = []

    async def job() -> None:
        await anyio.lowlevel.checkpoint()

    async with Timer(tick=0.001) as timer:

        async def request() -> None:
            state = _State()
            freed.append(weakref.ref(state))
            var: contextvars.ContextVar[_State] = contextvars.ContextVar("state")
            var.set(state)
            await timer.schedule_nowait(0.005, job).wait()
            await timer.schedule_nowait(0.005, lambda: None).wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
        # One more pass, from outside the request: the timer's own activity.
        await timer.schedule_nowait(0.005, lambda: None).wait()
        gc.collect()
        assert freed[0]() is None  # while the timer (and its worker) still lives


async def test_a_rearmed_async_callback_starts_from_its_schedulers_context() -> None:
    # docs/usage.md: a handle re-armed after it fired does not see what its last run
    # set. Async callbacks too: the pass keeps the run's copy for the job, not as the
    # handle's own context.
    seen: list[str] = []
    async with Timer(tick=0.001) as timer:
        rid.set("scheduler")
        runs = 0

        async def job() -> None:
            nonlocal runs
            runs += 1
            seen.append(rid.get())
            rid.set(f"async-run-{runs}")

        handle = timer.schedule_nowait(0.005, job)
        for _ in range(3):
            await handle.wait()
            handle.reset(0.005)
        await handle.wait()
    assert seen == ["scheduler"] * 4


def test_the_snapshot_cache_lets_go_when_the_loop_closes() -> None:
    # After aiowheel.run() has returned, no module keeps the last scheduler's context.
    freed: list[weakref.ref[_State]] = []
    var: contextvars.ContextVar[_State] = contextvars.ContextVar("state")

    async def main() -> None:
        state = _State()
        freed.append(weakref.ref(state))
        var.set(state)
        asyncio.get_running_loop().call_later(10, lambda: None)
        await asyncio.sleep(0.001)

    aiowheel.run(main())
    gc.collect()
    assert freed[0]() is None


async def test_a_worker_that_could_not_start_is_not_counted(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A task factory that refuses its first two tasks (as uvloop with an eager task
    # factory refuses every one): the pool logs it, counts no worker, and starts one
    # at the next async callback; every callback runs.
    if backend == "trio":
        pytest.skip("trio has no task factory")
    loop = asyncio.get_running_loop()
    refusals = 2
    original = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        nonlocal refusals
        if refusals:
            refusals -= 1
            coro.close()
            raise TypeError("refused by the task factory")
        return asyncio.Task(coro, loop=loop, **kwargs)

    ran: list[int] = []

    async def job(n: int) -> None:
        ran.append(n)

    async with Timer(tick=0.001, max_concurrency=2) as timer:
        loop.set_task_factory(factory)  # the timer's own host tasks are started
        try:
            with caplog.at_level(logging.ERROR, logger="aiowheel"):
                handles = [timer.schedule_nowait(0.005 * (n + 1), job, n) for n in range(5)]
                for handle in handles:
                    await handle.wait()
        finally:
            loop.set_task_factory(original)
        assert timer.stats().pending == 0
    assert sorted(ran) == [0, 1, 2, 3, 4]
    refused = [r for r in caplog.records if "could not start a worker" in r.message]
    assert len(refused) == 2
    assert all(r.exc_info and isinstance(r.exc_info[1], TypeError) for r in refused)
