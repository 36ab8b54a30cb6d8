"""The worker pool (aiowheel/_dispatch.py): where expired async callbacks run.

Through the public Timer API where it can be seen there (``stats().running``,
``stats().workers``, ``len(timer)``, ``handle.wait()``, ``on_error``), on asyncio
(looptime), uvloop (real time) and trio (MockClock), as tests/conftest.py sets up.
These tests do not wait for time to pass: they await the events themselves, and the
few delays are multiples of ``unit`` (1 s on the virtual clocks, 10 ms on uvloop).
The first section covers the basics of async callbacks (states, a FIFO run with one
worker, cancel and reset of one queued callback); the others the pool's own
invariants: its FIFO with several workers, workers spawned on demand and reused,
every job ending whatever it raises, the real cancellation of aclose(), a re-entrant
close, and a worker killed by KeyboardInterrupt being replaced.

A queued coroutine that never runs must be closed: the callbacks here return
coroutines that the test keeps (``Jobs``), so that their state can be checked rather
than relying on a "never awaited" RuntimeWarning at garbage collection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import random
from collections.abc import Coroutine, Generator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support import Probe, assert_on_time

from aiowheel import Timer, TimerCancelled, TimerHandle
from aiowheel._dispatch import RunQueue, WorkerPool, close_awaitable
from aiowheel._driver import AsyncioBackend
from aiowheel._wheel import UNSCHEDULED, WheelEntry

pytestmark = pytest.mark.anyio

TICK = 0.001


@pytest.fixture
def unit(virtual: bool) -> float:
    """One "second" of a test: 1 s on virtual clocks, 10 ms on uvloop's real clock."""
    return 1.0 if virtual else 0.01


def pool_of(timer: Timer) -> WorkerPool:
    """The running timer's pool (to check what ``stats()`` cannot show after close)."""
    live = timer._live
    assert live is not None
    return live.pool


class Jobs:
    """A plain callback that returns a coroutine (so the timer runs it on a worker)
    and keeps every coroutine it made, by name, with what happened to it.

    ``hold`` makes a job wait for ``gate``; ``running``/``peak`` count the jobs inside
    their body at once; ``started`` lists names in the order their bodies began."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.gate = anyio.Event()
        self.coros: dict[str, list[Coroutine[Any, Any, str]]] = {}
        self.started: list[str] = []
        self.running = 0
        self.peak = 0
        self.workers_seen = 0
        self.changed = anyio.Event()

    def __call__(self, name: str, hold: bool = True) -> Coroutine[Any, Any, str]:
        coro = self._body(name, hold)
        self.coros.setdefault(name, []).append(coro)
        return coro

    async def _body(self, name: str, hold: bool) -> str:
        self.started.append(name)
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.workers_seen = max(self.workers_seen, self.timer.stats().workers)
        self._changed()
        try:
            if hold:
                await self.gate.wait()
            await anyio.lowlevel.checkpoint()
            return name.upper()
        finally:
            self.running -= 1
            self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def until(self, running: int) -> None:
        """Wait until exactly ``running`` job bodies are in progress (a virtual clock
        jumps to the guard at once if they never are)."""
        with anyio.fail_after(60):
            while self.running != running:
                await self.changed.wait()

    def state(self, name: str, index: int = -1) -> str:
        return inspect.getcoroutinestate(self.coros[name][index])


# == RunQueue and close_awaitable (no event loop needed) =================================


def test_run_queue_is_a_detached_bucket_to_the_handle() -> None:
    """A handle's lazy reset path (``TimerHandle.reset``) stays inline only while
    ``bucket.tick != UNSCHEDULED``; the run queue answers no, so a reset of a queued
    handle always goes to the timer, which takes it out of the queue."""
    queue = RunQueue()
    assert queue.tick == UNSCHEDULED
    assert queue.level == -2
    assert queue.time == float("inf")


def test_run_queue_is_fifo() -> None:
    queue = RunQueue()
    c, a, b = (WheelEntry(), WheelEntry(), WheelEntry())
    for entry in (c, a, b):
        queue.add(entry)
    assert all(entry._bucket is queue for entry in (c, a, b))
    queue.remove(a)
    assert a._bucket is None
    assert a._prev is None
    assert a._next is None
    queue.add(a)  # queued again: to the back
    assert [queue.pop_first() for _ in range(4)] == [c, b, a, None]
    assert all(e._bucket is None and e._prev is None and e._next is None for e in (c, a, b))


def test_close_awaitable_closes_coroutines_only() -> None:
    async def job() -> None:
        pass

    coro = job()
    close_awaitable(coro)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED

    class Custom:
        def __await__(self) -> Generator[None, None, None]:
            yield

    close_awaitable(Custom())  # nothing to close: no error
    close_awaitable(None)


# == the basics: states, one worker's FIFO, a queued callback cancelled or reset =========


async def test_async_callback_states_and_result(unit: float) -> None:
    async with Timer() as timer:
        started, release = anyio.Event(), anyio.Event()

        async def job(x: int) -> int:
            started.set()
            await release.wait()
            return 2 * x

        handle = timer.schedule_nowait(unit, job, 21)
        assert not handle.done()
        await started.wait()
        assert not handle.done()  # started, not finished
        assert handle.fired()
        assert not handle.pending()
        assert not handle.cancelled()
        assert len(timer) == 0
        assert handle.cancel() is False  # it started: too late to cancel
        assert timer.stats().running == 1
        release.set()
        assert await handle.wait() == 42
        assert handle.done()
        assert timer.stats().running == 0


async def test_plain_callable_returning_an_awaitable_runs_on_a_worker(unit: float) -> None:
    async with Timer() as timer:

        async def job(x: int) -> int:
            await anyio.lowlevel.checkpoint()
            return x + 1

        handle = timer.schedule_nowait(unit, functools.partial(job, 1))
        assert await handle.wait() == 2


async def test_max_concurrency_is_respected() -> None:
    async with Timer(max_concurrency=3) as timer:
        running = peak = 0
        three, release = anyio.Event(), anyio.Event()

        async def job() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            if running == 3:
                three.set()
            try:
                await release.wait()
            finally:
                running -= 1

        handles = [timer.schedule_nowait(0, job) for _ in range(10)]
        await three.wait()
        await anyio.lowlevel.checkpoint()
        stats = timer.stats()
        assert (stats.running, stats.workers) == (3, 3)
        assert len(timer) == 7  # expired, waiting for a worker: still pending
        assert sum(h.pending() for h in handles) == 7
        release.set()
        for handle in handles:
            await handle.wait()
        assert peak == 3
        assert timer.stats().workers <= 3


async def test_async_callbacks_run_fifo_in_expiry_order(unit: float) -> None:
    """With one worker busy, expired async callbacks queue up and then run one at a
    time in the order they expired (their deadlines), not in the order scheduled."""
    async with Timer(max_concurrency=1) as timer:
        gate, all_expired = anyio.Event(), anyio.Event()
        order: list[int] = []

        async def blocker() -> None:
            await gate.wait()

        async def job(i: int) -> None:
            order.append(i)
            await anyio.lowlevel.checkpoint()

        timer.schedule_nowait(0, blocker)
        step = 3 * TICK if unit < 1 else 0.01
        ids = list(range(12))
        random.Random(3).shuffle(ids)
        # Deadlines from one origin: on uvloop's real clock, scheduling the twelve may
        # take longer than a step (a loaded machine), and delays from each call's own
        # "now" would then put a later id before an earlier one.
        origin = timer.time()
        handles = {i: timer.schedule_at_nowait(origin + (i + 1) * step, job, i) for i in ids}
        timer.schedule_at_nowait(origin + 14 * step, all_expired.set)
        await all_expired.wait()
        assert order == []
        assert len(timer) == 12
        assert all(h.pending() for h in handles.values())
        gate.set()
        for handle in handles.values():
            await handle.wait()
        assert order == sorted(ids)


async def test_cancel_a_queued_async_callback(unit: float) -> None:
    async with Timer(max_concurrency=1) as timer:
        gate, queued = anyio.Event(), anyio.Event()
        ran: list[str] = []

        async def blocker() -> None:
            await gate.wait()

        async def job(name: str) -> None:
            ran.append(name)

        timer.schedule_nowait(0, blocker)
        victim = timer.schedule_nowait(unit, job, "victim")
        kept = timer.schedule_nowait(unit, job, "kept")
        timer.schedule_nowait(2 * unit, queued.set)
        await queued.wait()
        assert victim.pending()
        assert len(timer) == 2
        assert victim.cancel() is True
        assert len(timer) == 1
        assert victim.cancelled()
        gate.set()
        await kept.wait()
        with pytest.raises(TimerCancelled):
            await victim.wait()
        assert ran == ["kept"]


@pytest.mark.virtual_time
async def test_reset_a_queued_async_callback_puts_it_back_in_the_wheel() -> None:
    async with Timer(max_concurrency=1) as timer:
        gate, queued = anyio.Event(), anyio.Event()
        ran: list[float] = []

        async def blocker() -> None:
            await gate.wait()

        async def job() -> None:
            ran.append(timer.time())

        timer.schedule_nowait(0, blocker)
        handle = timer.schedule_nowait(0.1, job)
        timer.schedule_nowait(0.2, queued.set)
        await queued.wait()
        handle.reset(1.0)
        gate.set()
        await anyio.sleep(0.5)
        assert ran == []
        assert handle.pending()
        assert len(timer) == 1
        await handle.wait()
        assert_on_time(ran[0], handle.deadline, virtual=True)


@pytest.mark.virtual_time
async def test_slow_async_callback_does_not_delay_other_timers() -> None:
    async with Timer() as timer:
        probe = Probe(timer)

        async def slow() -> None:
            await anyio.sleep(10)

        timer.schedule_nowait(0.1, slow)
        for i in range(5):
            probe.schedule(0.2 + i, i)
        await probe.handles[4].wait()
        probe.check(virtual=True)


# == FIFO and max_concurrency =============================================================


async def test_expired_jobs_start_in_expiry_order_at_most_max_concurrency_at_once(
    unit: float,
) -> None:
    """Twelve async callbacks scheduled in shuffled order, with deadlines one bucket
    apart, and three workers: they start in deadline order (FIFO run queue), never
    more than three at once; the nine waiting for a worker are pending."""
    async with Timer(max_concurrency=3) as timer:
        jobs = Jobs(timer)
        expired = anyio.Event()
        step = 0.01 if unit == 1.0 else 3 * TICK
        names = [f"j{i:02d}" for i in range(12)]
        shuffled = names[:]
        random.Random(7).shuffle(shuffled)
        handles = {n: timer.schedule_nowait((names.index(n) + 1) * step, jobs, n) for n in shuffled}
        timer.schedule_nowait(14 * step, expired.set)
        await expired.wait()
        await jobs.until(3)
        assert jobs.started == names[:3]
        stats = timer.stats()
        assert (stats.running, stats.workers, stats.pending) == (3, 3, 9)
        assert len(timer) == 9
        assert [n for n, h in handles.items() if h.pending()] == [
            n for n in shuffled if n not in names[:3]
        ]
        jobs.gate.set()
        for name, handle in handles.items():
            assert await handle.wait() == name.upper()
        assert jobs.started == names
        assert jobs.peak == 3
        stats = timer.stats()
        assert (stats.running, stats.pending, stats.fired, stats.failed) == (0, 0, 13, 0)
        assert len(timer) == 0


async def test_cancel_a_queued_job_closes_its_coroutine() -> None:
    async with Timer(max_concurrency=2) as timer:
        jobs = Jobs(timer)
        handles = {n: timer.schedule_nowait(0, jobs, n) for n in ("a", "b", "c", "d", "e")}
        await jobs.until(2)
        assert len(timer) == 3
        assert handles["d"].pending()
        assert handles["d"].cancel() is True
        assert handles["d"].cancel() is False
        assert handles["d"].cancelled()
        assert not handles["d"].pending()
        assert jobs.state("d") == inspect.CORO_CLOSED  # closed, never awaited
        assert len(timer) == 2
        assert (timer.stats().pending, timer.stats().cancelled) == (2, 1)
        jobs.gate.set()
        for name in ("a", "b", "c", "e"):
            assert await handles[name].wait() == name.upper()
        with pytest.raises(TimerCancelled):
            await handles["d"].wait()
        assert jobs.started == ["a", "b", "c", "e"]
        assert timer.stats().running == 0


async def test_reset_a_queued_job_moves_it_back_to_the_wheel(unit: float) -> None:
    """A queued job re-armed for later leaves the run queue (its first coroutine is
    closed, never run) and is pending in the wheel; it runs once, at its new deadline,
    with a new coroutine. All backends, without waiting for the new deadline."""
    async with Timer(max_concurrency=1) as timer:
        jobs = Jobs(timer)
        first = timer.schedule_nowait(0, jobs, "first")
        moved = timer.schedule_nowait(0, jobs, "moved")
        last = timer.schedule_nowait(0, jobs, "last")
        await jobs.until(1)
        assert moved.pending()
        assert len(timer) == 2
        before = timer.time()
        moved.reset(1000 * unit)
        assert jobs.state("moved") == inspect.CORO_CLOSED
        assert moved.pending()
        assert len(timer) == 2
        assert before + 1000 * unit <= moved.deadline <= timer.time() + 1000 * unit
        jobs.gate.set()
        assert await first.wait() == "FIRST"
        assert await last.wait() == "LAST"
        assert jobs.started == ["first", "last"]  # "moved" was not run from the queue
        assert moved.pending()
        assert len(timer) == 1
        next_deadline = timer.next_deadline()  # its bucket's (a coarse level's)
        assert next_deadline is not None
        assert timer.time() < next_deadline <= moved.deadline
        moved.reset(0)  # now due again: a new call of the callback, a new coroutine
        assert await moved.wait() == "MOVED"
        assert jobs.started == ["first", "last", "moved"]
        assert len(jobs.coros["moved"]) == 2
        assert jobs.state("moved", 0) == inspect.CORO_CLOSED
        assert jobs.state("moved", 1) == inspect.CORO_CLOSED  # ran to its end
        assert timer.stats().fired == 3


async def test_reset_a_queued_job_to_now_requeues_it_at_the_back() -> None:
    async with Timer(max_concurrency=1) as timer:
        jobs = Jobs(timer)
        handles = {n: timer.schedule_nowait(0, jobs, n) for n in ("a", "b", "c")}
        await jobs.until(1)
        handles["b"].reset(0)
        assert handles["b"].pending()
        assert len(timer) == 2
        jobs.gate.set()
        for handle in handles.values():
            await handle.wait()
        assert jobs.started == ["a", "c", "b"]
        assert len(jobs.coros["b"]) == 2
        assert jobs.state("b", 0) == inspect.CORO_CLOSED


# == workers: spawned on demand, parked, reused ===========================================


async def test_workers_are_spawned_on_demand_and_reused() -> None:
    async with Timer(max_concurrency=4) as timer:
        jobs = Jobs(timer)
        assert timer.stats().workers == 0  # none before the first async callback
        timer.schedule_nowait(0, lambda: None)
        await timer.schedule_nowait(0, lambda: None).wait()
        assert timer.stats().workers == 0  # plain callbacks need none

        # One job at a time: the one worker parks and is woken again.
        for i in range(3):
            assert await timer.schedule_nowait(0, jobs, f"s{i}", False).wait() == f"S{i}"
            assert timer.stats().workers == 1
            assert timer.stats().running == 0

        # A burst of ten: workers grow to the limit, not beyond.
        burst = [timer.schedule_nowait(0, jobs, f"a{i}") for i in range(10)]
        await jobs.until(4)
        stats = timer.stats()
        assert (stats.workers, stats.running, stats.pending) == (4, 4, 6)
        jobs.gate.set()
        for handle in burst:
            await handle.wait()
        assert jobs.peak == 4
        assert jobs.workers_seen == 4
        stats = timer.stats()
        assert (stats.workers, stats.running) == (4, 0)  # parked, alive

        # A second burst: the parked workers take it; none is spawned.
        jobs.gate = anyio.Event()
        jobs.workers_seen = 0
        burst = [timer.schedule_nowait(0, jobs, f"b{i}") for i in range(10)]
        await jobs.until(4)
        assert timer.stats().workers == 4
        jobs.gate.set()
        for handle in burst:
            await handle.wait()
        assert jobs.workers_seen == 4
        assert timer.stats().workers == 4
        assert jobs.started[-10:] == [f"b{i}" for i in range(10)]
    assert timer.stats().workers == 0


async def test_a_job_scheduled_by_a_job_runs_when_a_worker_is_free() -> None:
    """With one worker, a job that schedules another and waits for it would wait for
    ever; one that schedules it and returns lets it run next on the same worker."""
    async with Timer(max_concurrency=1) as timer:
        order: list[str] = []
        child: list[TimerHandle[Any]] = []

        async def parent() -> str:
            order.append("parent")
            child.append(timer.schedule_nowait(0, kid))
            await anyio.lowlevel.checkpoint()
            order.append("parent end")
            return "p"

        async def kid() -> str:
            order.append("kid")
            return "k"

        assert await timer.schedule_nowait(0, parent).wait() == "p"
        assert await child[0].wait() == "k"
        assert order == ["parent", "parent end", "kid"]
        assert timer.stats().workers == 1


# == every job ends, whatever it raises ==================================================


class Stop(BaseException):
    """A BaseException that is neither an Exception nor one of Python's own."""


RAISED: list[tuple[str, type[BaseException]]] = [
    ("Exception", ValueError),
    ("BaseException subclass", Stop),
    ("GeneratorExit", GeneratorExit),
    ("CancelledError raised by the callback", asyncio.CancelledError),
]


@pytest.mark.parametrize(("what", "kind"), RAISED, ids=[what for what, _ in RAISED])
@pytest.mark.parametrize("max_concurrency", [1, 3])
async def test_every_job_ends_whatever_it_raises(
    what: str, kind: type[BaseException], max_concurrency: int, unit: float
) -> None:
    """The exception goes to on_error, counts in stats().failed, is re-raised by
    wait(); the worker survives, the jobs behind run, running drops back to 0, and
    aclose(drain=True) returns. A CancelledError the callback raises itself (its
    worker is not being cancelled) is such a failure too, as in asyncio's Handle; on
    trio it is an ordinary exception."""
    reported: list[tuple[TimerHandle[Any], BaseException]] = []
    async with Timer(
        max_concurrency=max_concurrency, on_error=lambda h, e: reported.append((h, e))
    ) as timer:

        async def bad(where: str) -> None:
            if where == "after a checkpoint":
                await anyio.lowlevel.checkpoint()
            raise kind(where)

        async def good(n: int) -> int:
            await anyio.lowlevel.checkpoint()
            return n

        handles: list[TimerHandle[Any]] = []
        for where in ("at once", "after a checkpoint"):
            handles.append(timer.schedule_nowait(0, bad, where))
            handles.extend(timer.schedule_nowait(0, good, n) for n in range(3))
        with anyio.fail_after(100 * unit):
            for i, handle in enumerate(handles):
                if i % 4 == 0:
                    with pytest.raises(kind) as info:
                        await handle.wait()
                    assert type(info.value) is kind
                    assert handle.done()
                    assert handle.fired()
                else:
                    assert await handle.wait() == i % 4 - 1
        assert [(h, type(e)) for h, e in reported] == [(handles[0], kind), (handles[4], kind)]
        stats = timer.stats()
        assert (stats.fired, stats.failed, stats.running, stats.pending) == (8, 2, 0, 0)
        assert 1 <= stats.workers <= max_concurrency

        # Again, this time with aclose(drain=True) waiting for the failing jobs.
        again = [timer.schedule_nowait(unit, bad, "at once")]
        again += [timer.schedule_nowait(unit, good, n) for n in range(3)]
        again.append(timer.schedule_nowait(2 * unit, bad, "after a checkpoint"))
        with anyio.fail_after(100 * unit):
            assert await timer.aclose(drain=True) == []
        assert all(h.done() and h.fired() for h in again)
        assert [await h.wait() for h in again[1:4]] == [0, 1, 2]
        with pytest.raises(kind):
            await again[4].wait()
        assert timer.stats().failed == 4  # the counters outlive the close
        assert len(reported) == 4


async def test_failing_job_keeps_its_worker_and_its_error_stays_with_its_handle() -> None:
    """Failures do not leak into the next job of the same worker: each handle gets
    its own outcome, and a worker that ran a failing job is reused."""
    reported: list[BaseException] = []
    async with Timer(max_concurrency=1, on_error=lambda h, e: reported.append(e)) as timer:

        async def job(n: int) -> int:
            await anyio.lowlevel.checkpoint()
            if n % 2:
                raise KeyError(n)
            return n

        handles = [timer.schedule_nowait(0, job, n) for n in range(6)]
        for n, handle in enumerate(handles):
            if n % 2:
                with pytest.raises(KeyError) as info:
                    await handle.wait()
                assert info.value.args == (n,)
            else:
                assert await handle.wait() == n
        assert [e.args for e in reported] == [(1,), (3,), (5,)]
        assert timer.stats().workers == 1


# == a real cancellation: aclose() ========================================================


async def test_aclose_cancels_running_jobs_and_ends_every_worker(unit: float) -> None:
    """aclose() (no drain) cancels the running jobs: their wait() raises
    TimerCancelled while fired() stays True; their cleanup (even one that awaits,
    shielded) has run when aclose() returns; the queued job's coroutine is closed and
    its handle is among those returned; no worker is left."""
    async with Timer(max_concurrency=2) as timer:
        pool = pool_of(timer)
        cleaned: list[str] = []
        started = 0
        two = anyio.Event()

        async def forever(name: str) -> None:
            nonlocal started
            started += 1
            if started == 2:
                two.set()
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(unit)
                cleaned.append(name)

        jobs = Jobs(timer)
        running = [timer.schedule_nowait(0, forever, n) for n in ("x", "y")]
        queued = timer.schedule_nowait(0, jobs, "queued")
        later = timer.schedule_nowait(1000 * unit, jobs, "later")
        await two.wait()
        assert timer.stats().running == 2
        assert len(timer) == 2
        closed = await timer.aclose()
        assert closed == [queued, later]
        assert sorted(cleaned) == ["x", "y"]  # aclose() waited for the workers
        assert jobs.state("queued") == inspect.CORO_CLOSED
        assert "later" not in jobs.coros  # never called
        for handle in running:
            assert handle.fired()
            assert handle.done()
            assert not handle.cancelled()
            assert not handle.pending()
            with pytest.raises(TimerCancelled):
                await handle.wait()
        assert queued.cancelled()
        with pytest.raises(TimerCancelled):
            await queued.wait()
        assert (pool.workers, pool.running, len(pool.queue)) == (0, {}, 0)
        stats = timer.stats()
        assert (stats.workers, stats.running, stats.pending) == (0, 0, 0)
        assert stats.cancelled == 2
        assert stats.failed == 0  # cancelled by the timer is not a failure
        assert len(timer) == 0


async def test_aclose_with_parked_workers_ends_them() -> None:
    async with Timer(max_concurrency=3) as timer:
        pool = pool_of(timer)
        jobs = Jobs(timer)
        handles = [timer.schedule_nowait(0, jobs, n) for n in "abc"]
        await jobs.until(3)
        jobs.gate.set()
        for handle in handles:
            await handle.wait()
        assert timer.stats().workers == 3  # parked
        assert await timer.aclose() == []
        assert pool.workers == 0
        assert not pool._parked


async def test_a_job_waiting_on_its_own_cancellation_cannot_keep_the_timer_open(
    unit: float,
) -> None:
    """A job that swallows the cancellation and returns a value: aclose() still
    returns, and wait() reports that the timer cancelled it."""
    async with Timer() as timer:
        started = anyio.Event()

        async def stubborn() -> str:
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                return "swallowed"
            return "unreachable"

        handle = timer.schedule_nowait(0, stubborn)
        await started.wait()
        with anyio.fail_after(100 * unit):
            assert await timer.aclose() == []
        assert handle.fired()
        with pytest.raises(TimerCancelled):
            await handle.wait()
        assert timer.stats().workers == 0


# == a job that closes its own timer =====================================================


@pytest.mark.parametrize("drain", [False, True])
async def test_a_job_that_closes_its_timer_finishes(drain: bool, unit: float) -> None:
    """An async callback awaiting timer.aclose() is not cancelled by its own call and
    does not wait for itself: aclose() returns to it, it goes on (awaiting, even) and
    finishes with its value. The other running job is cancelled (drain=False) or
    waited for (drain=True); the pending one is cancelled or run."""
    async with Timer(max_concurrency=2) as timer:
        pool = pool_of(timer)
        other_started, closer_done = anyio.Event(), anyio.Event()
        log: list[object] = []

        async def other() -> str:
            other_started.set()
            await anyio.sleep(5 * unit)
            log.append("other")
            return "other"

        async def closer() -> str:
            await other_started.wait()
            log.append(await timer.aclose(drain=drain))
            await anyio.sleep(unit)  # still running, after its timer closed
            log.append("closer")
            closer_done.set()
            return "closed"

        o = timer.schedule_nowait(0, other)
        c = timer.schedule_nowait(0, closer)
        pending = timer.schedule_nowait(2 * unit, log.append, "pending")
        with anyio.fail_after(100 * unit):
            assert await c.wait() == "closed"
        assert timer.closed
        assert c.fired()
        assert not c.cancelled()
        if drain:
            assert log == ["pending", "other", [], "closer"]
            assert await o.wait() == "other"
        else:
            assert log == [[pending], "closer"]
            with pytest.raises(TimerCancelled):
                await o.wait()
            assert pending.cancelled()
        assert closer_done.is_set()
        assert await timer.aclose() == []
    assert pool.running == {}


async def test_leaving_async_with_waits_for_a_job_that_closed_its_timer(unit: float) -> None:
    """The job that called aclose() goes on after it; when the body of ``async with``
    then ends, leaving the block must not leave that job running behind (its worker is
    one of the timer's tasks)."""
    log: list[str] = []
    async with Timer() as timer:
        pool = pool_of(timer)
        closed = anyio.Event()

        async def closer() -> None:
            await timer.aclose()
            closed.set()
            await anyio.sleep(unit)
            log.append("closer ended")

        timer.schedule_nowait(0, closer)
        await closed.wait()
    assert log == ["closer ended"]
    assert pool.workers == 0


@pytest.mark.parametrize("where", ["outside", "child"])
async def test_aclose_from_a_task_a_job_started_cancels_that_job_and_waits(
    where: str, unit: float
) -> None:
    """A task that a job started is not that job (issue 20): aclose() from it cancels
    the job like any running one and returns only once it has ended (its cleanup,
    even one that awaits shielded, has run). ``outside``: the task lives in a task
    group of the test; ``child``: in the job's own task group, so the job's
    cancellation reaches the closer too: its aclose() raises the cancellation, after
    closing the timer."""
    log: list[str] = []
    async with anyio.create_task_group() as outer, Timer(max_concurrency=2) as timer:
        pool = pool_of(timer)
        returned, ended = anyio.Event(), anyio.Event()

        async def closer() -> None:
            try:
                assert await timer.aclose() == []
            except anyio.get_cancelled_exc_class():
                log.append("closer cancelled")
                raise
            log.append(f"aclose returned, {pool.busy} running")
            returned.set()

        async def job() -> str:
            try:
                if where == "outside":
                    outer.start_soon(closer)
                    await anyio.sleep_forever()
                async with anyio.create_task_group() as inner:
                    inner.start_soon(closer)
                    await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(unit)
                log.append("job ended")
                ended.set()
            return "unreachable"

        handle = timer.schedule_nowait(0, job)
        with anyio.fail_after(100 * unit):
            await ended.wait()
            if where == "outside":
                await returned.wait()
            assert timer.closed
            assert handle.fired()
            with pytest.raises(TimerCancelled):
                await handle.wait()
    if where == "outside":
        assert log == ["job ended", "aclose returned, 0 running"]
    else:
        assert log == ["closer cancelled", "job ended"]
    assert pool.workers == 0


async def test_a_job_that_closes_its_timer_waits_for_the_other_jobs(unit: float) -> None:
    """The job that calls aclose() is not cancelled by it (it goes on, see above), but
    the others are, and aclose() returns to it once they have ended."""
    log: list[str] = []
    async with Timer(max_concurrency=3) as timer:
        started = anyio.Event()

        async def other(name: str) -> None:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(unit)
                log.append(f"{name} ended")

        async def closer() -> str:
            await started.wait()
            await anyio.lowlevel.checkpoint()
            await timer.aclose()
            log.append("aclose returned")
            return "closed"

        others = [timer.schedule_nowait(0, other, n) for n in ("a", "b")]
        c = timer.schedule_nowait(0, closer)
        with anyio.fail_after(100 * unit):
            assert await c.wait() == "closed"
        assert sorted(log[:2]) == ["a ended", "b ended"]
        assert log[2:] == ["aclose returned"]
        for handle in others:
            with pytest.raises(TimerCancelled):
                await handle.wait()


# == a worker killed by KeyboardInterrupt or SystemExit (asyncio, an explicit loop) ========


@contextlib.contextmanager
def interruptible_loop() -> Iterator[tuple[asyncio.AbstractEventLoop, list[dict[str, Any]]]]:
    """A plain asyncio loop for a host task that a KeyboardInterrupt stops and that is
    then run on; yields it with the list its exception handler appends to.

    The handler only records: a worker task that died of KeyboardInterrupt keeps it
    unretrieved (see test_a_dead_worker_leaves_no_unretrieved_task_exception), and
    asyncio's default handler would log it with a traceback from the garbage
    collector, at any moment. On CPython 3.11 that formatting calls ast.parse, and a
    collection that happens inside another ast.parse (pytest's assertion rewriting or
    traceback rendering) makes the outer parse raise "SystemError: AST constructor
    recursion depth mismatch": a pytest INTERNALERROR. The dead tasks are collected
    here, while the loop still has this handler."""
    loop = asyncio.new_event_loop()
    reports: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reports.append(context))
    try:
        yield loop, reports
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:  # a failing test: end the host (its timer closes)
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending))
        loop.close()
        gc.collect()


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
def test_a_worker_killed_by_keyboard_interrupt_is_replaced(kind: type[BaseException]) -> None:
    """A job raising KeyboardInterrupt (or SystemExit) settles its handle first (done,
    counted failed; wait() re-raises it; on_error is not called: it is not an error of
    the callback but a stop of the program), then the exception stops the loop. If the
    loop goes on, the jobs queued behind it still run: the pool has replaced the dead
    worker."""
    reported: list[BaseException] = []
    box: dict[str, Any] = {}

    async def host() -> list[str]:
        async with Timer(max_concurrency=1, on_error=lambda h, e: reported.append(e)) as timer:
            jobs = Jobs(timer)
            box["timer"], box["jobs"] = timer, jobs

            async def killer() -> None:
                await asyncio.sleep(0)
                raise kind("stop")

            box["killer"] = timer.schedule_nowait(0, killer)
            after = [timer.schedule_nowait(0, jobs, n, False) for n in ("a", "b", "c")]
            results = [await h.wait() for h in after]
            with pytest.raises(kind):
                await box["killer"].wait()
            box["workers"] = timer.stats().workers
        return results

    with interruptible_loop() as (loop, _):
        task = loop.create_task(host())
        with pytest.raises(kind):
            loop.run_until_complete(task)
        timer: Timer = box["timer"]
        killed: TimerHandle[Any] = box["killer"]
        assert killed.done()
        assert killed.fired()
        stats = timer.stats()
        assert (stats.failed, stats.running, stats.pending) == (1, 0, 3)
        assert stats.workers == 1  # the replacement, not started yet
        assert box["jobs"].started == []
        assert reported == []
        assert loop.run_until_complete(task) == ["A", "B", "C"]
        assert box["jobs"].started == ["a", "b", "c"]
        assert box["workers"] == 1
        assert timer.stats().workers == 0


def test_on_error_raising_keyboard_interrupt_still_settles_the_job() -> None:
    """A KeyboardInterrupt raised by on_error while it reports a job's failure (a
    Ctrl-C landing in a logging call, say) stops the loop like one raised by the job;
    the job must still end first: not running any more, its wait() answering, and
    aclose(drain=True) not waiting for it for ever."""
    box: dict[str, Any] = {}

    def on_error(handle: TimerHandle[Any], exc: BaseException) -> None:
        raise KeyboardInterrupt

    async def host() -> None:
        async with Timer(max_concurrency=1, on_error=on_error) as timer:
            box["timer"] = timer

            async def bad() -> None:
                await asyncio.sleep(0)
                raise ValueError("bad")

            box["bad"] = timer.schedule_nowait(0, bad)
            box["next"] = timer.schedule_nowait(0, asyncio.sleep, 0, "next")
            assert await box["next"].wait() == "next"
            with anyio.fail_after(1):
                await timer.aclose(drain=True)

    with interruptible_loop() as (loop, _):
        task = loop.create_task(host())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(task)
        stats = box["timer"].stats()
        assert (stats.running, stats.failed) == (0, 1)
        assert box["bad"].done()
        loop.run_until_complete(task)
        with pytest.raises(ValueError, match="bad"):
            loop.run_until_complete(box["bad"].wait())


def test_a_dead_worker_leaves_no_unretrieved_task_exception() -> None:
    """The KeyboardInterrupt that killed a worker has propagated out of the loop: the
    pool must not leave it in the worker task as well, for asyncio to report again,
    as "Task exception was never retrieved", when the task is collected."""

    async def host() -> None:
        async with Timer(max_concurrency=1) as timer:

            async def killer() -> None:
                await asyncio.sleep(0)
                raise KeyboardInterrupt

            timer.schedule_nowait(0, killer)
            await timer.schedule_nowait(0, asyncio.sleep, 0).wait()

    with interruptible_loop() as (loop, reports):
        task = loop.create_task(host())
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(task)
        loop.run_until_complete(task)
        del task
    assert [context.get("message") for context in reports] == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_job_that_cancels_its_own_worker_task_is_stopped_and_replaced(
    anyio_backend: str,
) -> None:
    """asyncio: a job that cancels the task it runs in (its worker) is stopped like a
    job cancelled by the timer (wait() raises TimerCancelled, not a failure); the
    worker ends, and the jobs queued behind it run on a new one."""
    async with Timer(max_concurrency=1) as timer:
        pool = pool_of(timer)

        async def suicide() -> None:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)

        async def job(n: int) -> int:
            await asyncio.sleep(0)
            return n

        victim = timer.schedule_nowait(0, suicide)
        after = [timer.schedule_nowait(0, job, n) for n in range(3)]
        assert [await h.wait() for h in after] == [0, 1, 2]
        with pytest.raises(TimerCancelled):
            await victim.wait()
        assert victim.fired()
        assert victim.done()
        stats = timer.stats()
        assert (stats.failed, stats.running, stats.workers) == (0, 0, 1)
        backend = pool._backend  # the worker tasks are the backend's (AsyncioBackend)
        assert isinstance(backend, AsyncioBackend)
        assert len(backend._tasks) == 1
