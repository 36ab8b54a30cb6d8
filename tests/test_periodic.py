"""Periodic timers, sleep() and timeout() keep their promises (issue 20, sections 2 and 5).

On asyncio (looptime), uvloop (real time) and trio (MockClock), as tests/conftest.py
sets up. Every test ends with ``timer._check()``: the accounting identity of
docs/design.md ("Accounting") against the wheel, the run queue and the periodic timers.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Coroutine
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from aiowheel import PeriodicHandle, Timer, TimerClosed, TimerFull

pytestmark = pytest.mark.anyio

TICK = 0.001
EPS = 2e-6


@pytest.fixture
def unit(virtual: bool) -> float:
    """One "second" of a test: 1 s on virtual clocks, 10 ms on uvloop's real clock."""
    return 1.0 if virtual else 0.01


def noop() -> None:
    pass


def identity(timer: Timer) -> None:
    stats = timer.stats()
    assert stats.scheduled == stats.fired + stats.cancelled + stats.pending, stats
    timer._check()


# == sleep() and timeout() when the timer closes ==========================================


async def test_sleep_raises_timer_closed_when_the_timer_closes(unit: float) -> None:
    async with Timer() as timer:
        outcome: list[object] = []
        asleep = anyio.Event()

        async def sleeper() -> None:
            asleep.set()
            try:
                await timer.sleep(50 * unit)
            except TimerClosed as exc:
                outcome.append(exc)
            else:
                outcome.append("woke up")

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await asleep.wait()
            await anyio.lowlevel.checkpoint()  # into sleep()'s wait
            start = anyio.current_time()
            with anyio.fail_after(5 * unit + 1):
                await timer.aclose()
        assert anyio.current_time() - start < 5 * unit
        assert len(outcome) == 1
        assert isinstance(outcome[0], TimerClosed)
        identity(timer)


async def test_sleep_ends_normally_under_a_draining_close(unit: float) -> None:
    async with Timer() as timer:
        woke: list[float] = []

        async def sleeper() -> None:
            await timer.sleep(unit)
            woke.append(timer.time())

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()
            await timer.aclose(drain=True)
        assert len(woke) == 1


async def test_a_timeout_block_whose_timer_closes_raises_timer_closed(unit: float) -> None:
    async with Timer() as timer:
        outcome: list[object] = []
        entered = anyio.Event()

        async def guarded() -> None:
            try:
                with timer.timeout(5 * unit):
                    entered.set()
                    await anyio.sleep(100 * unit)  # the body would outlive the guard
                outcome.append("ran to its end")
            except BaseException as exc:
                outcome.append(exc)

        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(guarded)
            await entered.wait()
            await timer.aclose()
        assert anyio.current_time() - start < 5 * unit
        assert len(outcome) == 1
        assert isinstance(outcome[0], TimerClosed), outcome
        identity(timer)


async def test_a_timeout_that_ends_before_the_close_is_unaffected(unit: float) -> None:
    async with Timer() as timer:
        with timer.timeout(5 * unit) as t:
            await anyio.lowlevel.checkpoint()
        await timer.aclose()
        assert not t.expired()


# == max_pending bounds periodic timers too (guarantee 8) ==================================


async def test_a_plain_periodic_callback_cannot_push_len_past_max_pending(unit: float) -> None:
    async with Timer(max_pending=3) as timer:
        seen: list[int] = []
        refused = anyio.Event()

        def fill() -> None:
            try:
                while True:
                    timer.schedule_nowait(1000 * unit, noop)
            except TimerFull:
                seen.append(len(timer))
                refused.set()

        periodic = timer.every(unit, fill)
        await refused.wait()
        assert len(timer) <= 3
        assert seen == [3]  # the periodic timer's slot stays reserved during its run
        assert periodic.pending()
        identity(timer)
        periodic.cancel()
        identity(timer)


async def test_an_async_periodic_run_keeps_its_slot_while_others_fill_the_timer(
    unit: float,
) -> None:
    async with Timer(max_pending=3) as timer:
        running, release, ended = anyio.Event(), anyio.Event(), anyio.Event()

        async def job() -> None:
            running.set()
            await release.wait()
            ended.set()

        periodic = timer.every(unit, job)
        await running.wait()
        assert len(timer) == 1  # its next period
        identity(timer)
        for _ in range(2):
            timer.schedule_nowait(1000 * unit, noop)
        with pytest.raises(TimerFull):
            timer.schedule_nowait(1000 * unit, noop)
        release.set()
        await ended.wait()
        await anyio.lowlevel.checkpoint()
        assert len(timer) == 3
        assert periodic.pending()
        identity(timer)


# == reset() during a run ====================================================================


@pytest.mark.virtual_time
@pytest.mark.parametrize("fixed_rate", [True, False])
async def test_a_reset_from_the_callback_sets_the_next_run(fixed_rate: bool) -> None:
    async with Timer(tick=TICK) as timer:
        runs: list[float] = []
        handle: list[PeriodicHandle] = []

        def job() -> None:
            runs.append(timer.time())
            if len(runs) == 1:
                handle[0].reset(0.05)

        handle.append(timer.every(1.0, job, fixed_rate=fixed_rate))
        await anyio.sleep(2.5)
        assert len(runs) >= 2
        assert runs[1] - runs[0] == pytest.approx(0.05, abs=TICK + EPS)
        assert runs[2] - runs[1] == pytest.approx(1.0, abs=TICK + EPS)
        identity(timer)


@pytest.mark.virtual_time
async def test_a_reset_during_an_async_run_never_overlaps_it() -> None:
    async with Timer(tick=TICK) as timer:
        starts: list[float] = []
        ends: list[float] = []
        active = peak = 0
        handle: list[PeriodicHandle] = []

        async def job() -> None:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            starts.append(timer.time())
            await anyio.sleep(0.1)
            ends.append(timer.time())
            active -= 1

        handle.append(timer.every(1.0, job))
        await anyio.sleep(1.02)  # inside the first run
        assert len(starts) == 1
        handle[0].reset(0.01)  # due before the run ends
        identity(timer)
        await anyio.sleep(1.5)
        assert peak == 1
        # The second run starts once the first has ended (its deadline had passed).
        assert starts[1] >= ends[0]
        assert starts[1] - ends[0] <= TICK + EPS
        assert starts[2] - starts[1] == pytest.approx(1.0, abs=0.1 + TICK + EPS)
        identity(timer)


async def test_a_reset_re_activates_a_periodic_stopped_during_its_run(unit: float) -> None:
    async with Timer() as timer:
        starts: list[float] = []
        active = peak = 0
        second = anyio.Event()
        handle: list[PeriodicHandle] = []

        async def job() -> None:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            starts.append(timer.time())
            if len(starts) == 1:
                assert handle[0].cancel() is True
                identity(timer)
                handle[0].reset(0)  # due at once, yet after this run
                await anyio.sleep(unit)
            else:
                second.set()
            active -= 1

        handle.append(timer.every(unit, job))
        await second.wait()
        assert peak == 1
        assert handle[0].active()
        identity(timer)


# == extreme intervals ======================================================================


@pytest.mark.parametrize("interval", [5e-324, 1e-310, 1e-12])
async def test_a_tiny_interval_runs_once_per_tick_and_never_fails(
    interval: float, unit: float
) -> None:
    errors: list[BaseException] = []
    async with Timer(on_error=lambda h, e: errors.append(e)) as timer:
        runs: list[float] = []
        five = anyio.Event()

        def job() -> None:
            runs.append(timer.time())
            if len(runs) == 5:
                five.set()

        periodic = timer.every(interval, job)
        with anyio.fail_after(100 * unit):
            await five.wait()
        assert errors == []
        assert timer.stats().failed == 0
        assert periodic.active()
        assert periodic.pending()
        assert math.isfinite(periodic.deadline)
        identity(timer)
        assert periodic.cancel()
        identity(timer)


@pytest.mark.parametrize("fixed_rate", [True, False])
async def test_a_huge_interval_reset_soon_keeps_a_finite_deadline(
    fixed_rate: bool, unit: float
) -> None:
    errors: list[BaseException] = []
    async with Timer(on_error=lambda h, e: errors.append(e)) as timer:
        ran = anyio.Event()
        periodic = timer.every(1e308, ran.set, fixed_rate=fixed_rate)
        periodic.reset(unit)
        await ran.wait()
        await anyio.lowlevel.checkpoint()
        assert errors == []
        assert periodic.pending()
        assert math.isfinite(periodic.deadline)
        assert periodic.deadline > timer.time()
        identity(timer)
        periodic.reset(unit)  # and again, from the far grid point
        assert math.isfinite(periodic.deadline)


async def test_the_largest_interval_is_accepted_and_stays_finite(unit: float) -> None:
    async with Timer() as timer:
        periodic = timer.every(sys.float_info.max, noop)
        assert math.isfinite(periodic.deadline)
        identity(timer)


# == a queued async run that never starts closes the user's coroutine =======================


@pytest.mark.parametrize("how", ["cancel", "reset", "aclose"])
async def test_a_queued_periodic_run_that_never_starts_is_closed(how: str, unit: float) -> None:
    async with Timer(max_concurrency=1) as timer:
        release = anyio.Event()
        busy = anyio.Event()
        made: list[Coroutine[Any, Any, None]] = []

        async def blocker() -> None:
            busy.set()
            await release.wait()

        async def job() -> None:
            pass

        def start_job() -> Coroutine[Any, Any, None]:
            coro = job()
            made.append(coro)
            return coro

        timer.schedule_nowait(0, blocker)
        await busy.wait()  # the one worker is taken
        periodic = timer.every(unit, start_job)
        while not made:  # its first run expires and waits in the run queue
            await timer.sleep(unit / 2)
        assert periodic.pending()
        if how == "cancel":
            assert periodic.cancel()
        elif how == "reset":
            periodic.reset(1000 * unit)
        else:
            await timer.aclose()
        assert inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED
        identity(timer)
        release.set()


# == the counters of periodic timers (section 5) ============================================


async def test_a_periodic_cancelled_during_its_run_keeps_the_identity(unit: float) -> None:
    async with Timer() as timer:
        running, release = anyio.Event(), anyio.Event()

        async def job() -> None:
            running.set()
            await release.wait()

        periodic = timer.every(unit, job)
        await running.wait()
        identity(timer)
        before = timer.stats().cancelled
        assert periodic.cancel()
        assert timer.stats().cancelled == before + 1  # its next period
        assert len(timer) == 0
        identity(timer)
        release.set()
        await timer.aclose(drain=True)
        identity(timer)


async def test_a_periodic_running_at_close_is_cancelled_and_stays_so(unit: float) -> None:
    async with Timer() as timer:
        running = anyio.Event()

        async def job() -> None:
            running.set()
            await anyio.sleep(1000 * unit)

        periodic = timer.every(unit, job)
        await running.wait()
        await timer.aclose()
        assert not periodic.active()
        assert periodic.cancelled()
        stats = timer.stats()
        assert stats.pending == 0
        identity(timer)
        assert periodic.cancel() is False
        assert timer.stats() == stats
        identity(timer)


async def test_a_plain_periodic_counts_one_arm_per_period(unit: float) -> None:
    async with Timer() as timer:
        runs: list[int] = []
        three = anyio.Event()

        def job() -> None:
            runs.append(1)
            if len(runs) == 3:
                three.set()

        periodic = timer.every(unit, job)
        await three.wait()
        stats = timer.stats()
        assert stats.fired == 3
        assert stats.scheduled == 4  # the every() and the period after each run
        assert stats.pending == 1
        identity(timer)
        periodic.cancel()
        identity(timer)
