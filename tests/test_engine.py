"""The engine on its own: ``aiowheel._engine.Engine`` driven directly, with no Timer
around it and no task group of its own (what the drop-in event loop will do).

Each test builds an engine on the running loop's backend (asyncio, uvloop or trio,
aiowheel/_driver.py) inside a task group of the test's own (trio's workers go there),
replaces
its driver with one that records what it is asked (so nothing wakes by itself) and
its clock with one the test moves, then calls the pass, ``fire_due``, by hand. So the
tests are exact on every backend, uvloop's real clock included. The handles belong to
a Timer that is never started: the engine needs one only as the handle's owner.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import pytest
from support import RecordingDriver

from aiowheel import Timer, TimerClosed, TimerFull
from aiowheel._dispatch import WorkerPool
from aiowheel._driver import backend_name, make_backend
from aiowheel._engine import Engine
from aiowheel._handle import (
    _CANCELLED,
    _PENDING,
    TimerHandle,
    TracedHandle,
    _Failure,
)
from aiowheel._pass import fire_due
from aiowheel._periodic import PeriodicHandle
from aiowheel._selfcheck import check_engine
from aiowheel._shutdown import close_engine
from aiowheel._tracing import Tracer

pytestmark = pytest.mark.anyio

TICK = 0.001


class Rows:
    """A trace recorder that keeps the rows (what the engine calls of one)."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def record(self, *row: Any) -> None:
        self.rows.append(row)


class Rig:
    """An engine, its recording driver, a clock the test sets, and what it reported."""

    def __init__(self, engine: Engine, driver: RecordingDriver, now: float) -> None:
        self.engine = engine
        self.driver = driver
        self.now = now
        # The handles' timer, never started. A periodic handle's run reaches the engine
        # through it (Timer._engine), so that is set.
        self.owner = Timer()
        self.owner._engine = engine
        self.errors: list[tuple[TimerHandle[Any], BaseException]] = []
        self.closes = 0

    def clock(self) -> float:
        return self.now

    def handle(self, callback: Callable[..., Any], *args: Any) -> TimerHandle[Any]:
        if self.engine.tracing is None:
            return TimerHandle(self.owner, callback, args)
        # A traced engine files only traced handles (the pass reads their rows).
        traced: TracedHandle[Any] = TracedHandle(self.owner, callback, args)
        self.engine.stamp(traced, None, self.now)
        return traced

    def file(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle[Any]:
        handle = self.handle(callback, *args)
        deadline = self.now + delay
        self.engine.file(handle, deadline, delay <= 0, new=True)
        return handle

    def advance(self, seconds: float) -> None:
        """Move the clock and run the pass, as the driver would."""
        self.now += seconds
        fire_due(self.engine)
        check_engine(self.engine)


@asynccontextmanager
async def rig(
    *, limit: int = 1000, max_concurrency: int = 4, traced: bool = False
) -> AsyncIterator[Rig]:
    holder: list[Rig] = []

    def on_error(handle: TimerHandle[Any], exc: BaseException) -> None:
        holder[0].errors.append((handle, exc))

    def on_close() -> None:
        holder[0].closes += 1

    def closed_error() -> BaseException:
        return TimerClosed("the engine is closed")

    async with anyio.create_task_group() as tg:
        backend = make_backend(backend_name(), tg)
        recorder: Any = Rows() if traced else None
        engine = Engine(
            backend, TICK, 64, limit, on_error, recorder, on_close, closed_error, fire_due=fire_due
        )
        driver = RecordingDriver()
        engine.driver = driver
        state = Rig(engine, driver, engine.clock())
        holder.append(state)
        engine.clock = state.clock
        engine.pool = WorkerPool(engine, max_concurrency, backend)
        try:
            yield state
        finally:
            if not engine.closed:
                close_engine(engine)
            await engine.pool.join()


# The pass runs an untraced timer's plain callbacks in run_due's inline copy of run_one,
# a traced timer's through run_one: both paths must follow the same rules.
TRACED = pytest.mark.parametrize("traced", [False, True], ids=["inline", "run_one"])


async def test_the_pass_runs_what_is_due_in_deadline_order_and_rearms_once() -> None:
    async with rig() as r:
        ran: list[str] = []
        # Ticks apart (within one tick, the order is the order of filing).
        r.file(0.030, ran.append, "c")
        r.file(0.010, ran.append, "a")
        r.file(0.020, ran.append, "b")
        r.file(10.0, ran.append, "later")
        e = r.engine
        # Arm-if-earlier: the first filing armed the driver, each earlier bucket moved
        # it earlier, and the later ones did not touch it.
        assert r.driver.armed == sorted(r.driver.armed, reverse=True)
        assert e.wake_at == r.driver.armed[-1]
        assert (e.pending, e.scheduled) == (4, 4)
        check_engine(e)

        armed_before = len(r.driver.armed)
        r.advance(0.05)
        assert ran == ["a", "b", "c"]
        assert (e.pending, e.fired, e.wakeups) == (1, 3, 1)
        # The pass re-armed the driver once, on its way out
        assert len(r.driver.armed) == armed_before + 1
        # (for the far timer's bucket: it cascades before it is due).
        assert e.wake_at == r.driver.armed[-1] == e.wheel.next_expiry()
        assert e.wake_at > r.now


async def test_nothing_due_is_never_run_early() -> None:
    async with rig() as r:
        ran: list[int] = []
        r.file(0.010, ran.append, 1)
        r.advance(0.009)
        assert ran == []
        r.advance(0.005)
        assert ran == [1]


@TRACED
async def test_run_one_keeps_a_callbacks_failure_with_its_handle(traced: bool) -> None:
    async with rig(traced=traced) as r:

        def boom() -> None:
            raise ValueError("boom")

        bad = r.file(0.001, boom)
        good = r.file(0.001, lambda: "ok")
        r.advance(0.002)
        e = r.engine
        assert (e.fired, e.failed, e.pending) == (2, 1, 0)
        assert [(h, type(x)) for h, x in r.errors] == [(bad, ValueError)]
        assert isinstance(bad._result, _Failure)
        assert good._result == "ok"
        assert bad.fired()
        assert good.done()
        if traced:  # one row per firing, failed or not, fired at the pass's now
            rows = cast(Rows, cast(Tracer, e.tracing).recorder).rows
            ids = [cast("TracedHandle[Any]", h)._id for h in (bad, good)]
            assert [(row[0], row[5]) for row in rows] == [(ids[0], r.now), (ids[1], r.now)]


@TRACED
async def test_system_exit_settles_its_handle_and_refiles_the_rest(traced: bool) -> None:
    async with rig(traced=traced) as r:
        ran: list[str] = []

        def stop() -> None:
            raise SystemExit(3)

        first = r.file(0.001, stop)
        rest = [r.file(0.001, ran.append, name) for name in ("x", "y")]
        r.now += 0.002
        with pytest.raises(SystemExit):
            fire_due(r.engine)
        e = r.engine
        check_engine(e)
        assert isinstance(first._result, _Failure)
        assert (e.fired, e.failed, e.pending) == (1, 1, 2)
        assert all(h.pending() for h in rest)
        # Nothing pending is lost: the next pass runs them.
        r.advance(0.0)
        assert ran == ["x", "y"]


@TRACED
async def test_an_async_callback_is_queued_still_pending_then_run_by_a_worker(traced: bool) -> None:
    async with rig(traced=traced) as r:
        done = anyio.Event()

        async def job() -> str:
            done.set()
            return "job"

        handle = r.file(0.001, job)
        r.now += 0.002
        fire_due(r.engine)
        e = r.engine
        # Queued: pending (it counts in len(timer)), not fired until a worker starts it.
        assert (e.pending, e.fired) == (1, 0)
        assert handle._bucket is e.pool.queue
        check_engine(e)
        assert await e.waiters.wait(handle) == "job"
        await done.wait()
        assert (e.pending, e.fired) == (0, 1)
        check_engine(e)


async def test_cancel_that_empties_the_armed_bucket_asks_for_a_recheck() -> None:
    async with rig() as r:
        handle = r.file(0.005, print)
        e = r.engine
        assert e.cancel(handle) is True
        assert e.cancel(handle) is False
        assert handle._result is _CANCELLED
        assert handle.cancelled()
        assert (e.pending, e.cancelled) == (0, 1)
        # The driver is not re-armed at once: the check runs once, later.
        assert len(r.driver.rechecks) == 1
        r.driver.rechecks[0]()
        assert e.wake_at == float("inf")
        assert r.driver.disarmed == 1
        check_engine(e)


async def test_a_recheck_leaves_the_driver_armed_when_the_bucket_was_filled_again() -> None:
    """A loop of timeouts: each block's deadline is cancelled as it ends (emptying the
    bucket the driver is armed for) and the next block's is filed in the same tick
    before the re-check runs. The driver is armed for that bucket still: no re-arm
    (on asyncio a call_at and a cancel on the base loop) and no disarm."""
    async with rig() as r:
        e = r.engine
        first = r.file(0.005, print)
        armed = e.wake_at  # the bucket's time, the deadline rounded up to a tick
        assert r.driver.armed == [armed]
        e.cancel(first)
        assert len(r.driver.rechecks) == 1
        second = r.file(0.005, print)  # the same tick: the same bucket
        assert first.deadline == second.deadline
        r.driver.rechecks[0]()
        assert r.driver.armed == [armed]
        assert r.driver.disarmed == 0
        assert e.wake_at == armed
        r.advance(0.010)  # past the bucket (the deadline rounded up to a tick)
        assert second.done()
        check_engine(e)


async def test_a_recheck_rearms_when_the_next_bucket_is_another() -> None:
    async with rig() as r:
        e = r.engine
        first = r.file(0.005, print)
        e.cancel(first)
        later = r.file(0.050, print)  # filed before the re-check, in a later bucket
        r.driver.rechecks[0]()
        assert len(r.driver.armed) == 2
        assert r.driver.armed[-1] == e.wake_at >= later.deadline
        check_engine(e)


async def test_admission_and_rearm() -> None:
    async with rig(limit=2) as r:
        e = r.engine
        a = r.file(1.0, print)
        r.file(2.0, print)
        with pytest.raises(TimerFull):
            e.admit()
        # A pending handle moves without admission; a fired one needs a slot.
        e.rearm(a, r.now + 5.0)
        assert a.deadline == r.now + 5.0
        assert a.pending()
        r.advance(3.0)
        assert e.pending == 1
        b = r.file(0.5, print)  # the slot the fired timer freed
        r.advance(1.0)
        e.rearm(b, r.now + 1.0)  # fired: it is a new pending timer again
        assert b.pending()
        assert b._result is _PENDING
        assert (e.pending, e.scheduled) == (2, 4)
        check_engine(e)


async def test_a_periodic_timer_holds_one_slot_and_runs_on_its_grid() -> None:
    async with rig() as r:
        e = r.engine
        runs: list[float] = []
        handle = PeriodicHandle(
            r.owner, e.periodics, lambda: runs.append(r.now), (), 1.0, True, r.now
        )
        e.stamp(handle, None, r.now)
        e.file(handle, r.now + 1.0, False, new=True)
        e.periodics.active.add(handle)
        start = r.now
        for k in (1, 2, 3):
            r.now = start + k + 0.002  # the grid point, rounded up to the tick
            fire_due(e)
            check_engine(e)
            assert e.pending == 1  # the next period, filed in the slot it holds
        assert runs == pytest.approx([start + 1.002, start + 2.002, start + 3.002])
        assert handle.cancel() is True  # the owner, never started, checks nothing
        assert (e.pending, e.fired, e.cancelled) == (0, 3, 1)
        check_engine(e)


async def test_close_cancels_everything_in_deadline_order_once() -> None:
    async with rig() as r:
        e = r.engine
        late = r.file(2.0, print)
        early = r.file(1.0, print)
        cancelled = close_engine(e)
        assert cancelled == [early, late]
        assert all(h.cancelled() for h in cancelled)
        assert e.closed
        assert r.closes == 1
        assert r.driver.stopped
        assert (e.pending, e.cancelled) == (0, 2)
        check_engine(e)
        # A closed engine's pass does nothing; a wait on a handle that will never run
        # gets the closed error at once.
        fire_due(e)
        assert e.wakeups == 0
        outcome = await e.waiters.wait(r.handle(print))
        assert isinstance(outcome, _Failure)
        assert isinstance(outcome.exc, TimerClosed)


async def test_a_wheel_fault_closes_the_engine_and_strands_every_handle() -> None:
    async with rig() as r:
        e = r.engine
        handles = [r.file(delay, print) for delay in (1.0, 2.0)]
        # A bug's stand-in: a corrupted heap of buckets (a method of the compiled
        # wheel cannot be patched).
        e.wheel._heap.insert(0, None)  # type: ignore[arg-type]
        r.now += 5.0
        fire_due(e)
        assert e.closed
        assert isinstance(e.broken, TypeError)
        assert r.closes == 1
        assert e.stranded == set(handles)
        assert all(h.cancelled() for h in handles)
        check_engine(e)
