"""Handles (aiowheel/_handle.py): cancel, reset, wait, repr and the states of a
``TimerHandle``, and the ``PeriodicHandle`` that ``every`` returns.

Every async test runs on the three backends of ``conftest.py``. Timing assertions
("fires within [deadline, deadline + tick]") hold exactly on the virtual clocks; on
uvloop, which runs on real time, the same tests keep only what load cannot change:
never early, exactly once, order, and they use the ``unit`` fixture (10 ms instead of
1 s) so that they stay short. Tests that need virtual time to say anything are marked
``virtual_time`` (skipped on uvloop).

"Never early" is always checked the way guarantee 1 states it: ``timer.time()`` read
inside the callback is compared with that callback's ``handle.deadline``.

Bad delays given to ``reset`` and ``every`` are in tests/test_checks.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support import EPS, Probe, assert_on_time, noop
from support import TIMER_TICK as TICK

from aiowheel import PeriodicHandle, Timer, TimerCancelled, TimerHandle

pytestmark = pytest.mark.anyio


# == handles: cancel =====================================================================


async def test_cancel_pending(unit: float) -> None:
    async with Timer() as timer:
        ran: list[str] = []
        handle = timer.schedule_nowait(unit, ran.append, "cancelled")
        other = timer.schedule_nowait(2 * unit, ran.append, "other")
        assert len(timer) == 2
        assert handle.cancel() is True
        assert len(timer) == 1  # at once, no tick of lag
        assert handle.cancelled()
        assert not handle.pending()
        assert not handle.fired()
        assert handle.cancel() is False  # second cancel: a no-op
        with pytest.raises(TimerCancelled):
            await handle.wait()
        await other.wait()
        assert ran == ["other"]
        assert other.cancel() is False  # already fired
        assert other.fired()
        assert not other.cancelled()
        stats = timer.stats()
        assert (stats.scheduled, stats.fired, stats.cancelled, stats.pending) == (2, 1, 1, 0)


async def test_cancel_wakes_a_waiting_task(unit: float) -> None:
    async with Timer() as timer:
        handle = timer.schedule_nowait(100 * unit, noop)
        outcome: list[str] = []

        async def waiter() -> None:
            try:
                await handle.wait()
            except TimerCancelled:
                outcome.append("cancelled")

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.lowlevel.checkpoint()
            await anyio.lowlevel.checkpoint()
            handle.cancel()
        assert outcome == ["cancelled"]


async def test_cancel_from_an_earlier_callback_of_the_same_bucket(unit: float) -> None:
    """Netty: timers cancelled while their own bucket is being run never run, and the
    pending count ends at exactly 0 (no double decrement)."""
    async with Timer() as timer:
        ran: list[int] = []
        handles: list[TimerHandle[Any]] = []
        first = anyio.Event()

        def first_one_cancels_the_rest(i: int) -> None:
            ran.append(i)
            first.set()
            for handle in handles:
                handle.cancel()

        deadline = timer.time() + unit  # one bucket for all of them
        handles.extend(
            timer.schedule_at_nowait(deadline, first_one_cancels_the_rest, i) for i in range(10)
        )
        await first.wait()
        assert len(ran) == 1
        assert len(timer) == 0
        stats = timer.stats()
        assert (stats.fired, stats.cancelled, stats.pending) == (1, 9, 0)
        assert sum(h.cancelled() for h in handles) == 9


# == handles: reset ======================================================================


@pytest.mark.virtual_time
async def test_reset_later_does_not_fire_at_the_old_time() -> None:
    async with Timer() as timer:
        probe = Probe(timer)
        handle = probe.schedule(1.0, "x")
        t0 = timer.time()
        handle.reset(3.0)
        assert handle.deadline == t0 + 3.0
        await anyio.sleep(2.0)
        assert probe.runs == []
        await handle.wait()
        probe.check(virtual=True)
        assert probe.at("x") - t0 == pytest.approx(3.0, abs=TICK + EPS)


@pytest.mark.virtual_time
async def test_reset_earlier_fires_ahead_of_timers_it_was_behind() -> None:
    async with Timer() as timer:
        probe = Probe(timer)
        late = probe.schedule(5.0, "late")
        probe.schedule(2.0, "middle")
        late.reset(1.0)
        await probe.handles["middle"].wait()
        assert probe.names() == ["late", "middle"]
        probe.check(virtual=True)


@pytest.mark.virtual_time
async def test_reset_to_the_past_fires_at_once() -> None:
    async with Timer() as timer:
        probe = Probe(timer)
        handle = probe.schedule(50.0, "x")
        await anyio.sleep(1.0)
        now = timer.time()
        handle.reset(-1.0)
        await handle.wait()
        assert probe.at("x") == now


@pytest.mark.virtual_time
async def test_reset_sequence_only_the_last_counts() -> None:
    """tokio: 200 -> 50 -> 40 ms; then one->300, two->350, one->400."""
    async with Timer() as timer:
        probe = Probe(timer)
        t0 = timer.time()
        handle = probe.schedule(0.1, "x")
        for delay in (0.2, 0.05, 0.04):
            handle.reset(delay)
        await handle.wait()
        assert probe.at("x") - t0 == pytest.approx(0.04, abs=TICK + EPS)

        t0 = timer.time()
        one, two = probe.schedule(0.1, "one"), probe.schedule(0.1, "two")
        one.reset(0.3)
        two.reset(0.35)
        one.reset(0.4)
        await anyio.sleep(0.31)
        assert probe.names() == ["x"]
        await one.wait()
        assert probe.names() == ["x", "two", "one"]
        assert probe.at("two") - t0 == pytest.approx(0.35, abs=TICK + EPS)
        assert probe.at("one") - t0 == pytest.approx(0.4, abs=TICK + EPS)
        assert len(timer) == 0
        probe.check(virtual=True)


@pytest.mark.virtual_time
async def test_reset_of_an_already_due_timer_before_the_driver_ran() -> None:
    """tokio: created already expired, reset to the future twice before the driver
    ran: fires at the last deadline, and len() is 1 until then."""
    async with Timer() as timer:
        probe = Probe(timer)
        t0 = timer.time()
        handle = probe.schedule(-1.0, "x")
        handle.reset(0.5)
        handle.reset(0.7)
        assert len(timer) == 1
        await anyio.sleep(0.6)
        assert probe.runs == []
        assert len(timer) == 1
        await handle.wait()
        assert probe.at("x") - t0 == pytest.approx(0.7, abs=TICK + EPS)


@pytest.mark.virtual_time
async def test_reset_after_part_of_the_slot_passed() -> None:
    """tokio: at t=80 ms, 100 -> 120 ms fires at 120, not earlier."""
    async with Timer() as timer:
        probe = Probe(timer)
        t0 = timer.time()
        handle = probe.schedule(0.1, "x")
        await anyio.sleep(0.08)
        handle.reset(0.04)
        await handle.wait()
        probe.check(virtual=True)
        assert probe.at("x") - t0 == pytest.approx(0.12, abs=TICK + EPS)


async def test_reset_a_fired_handle_fires_again_and_wait_waits_for_it(
    virtual: bool, unit: float
) -> None:
    async with Timer() as timer:
        runs: list[float] = []

        def count() -> int:
            runs.append(timer.time())
            return len(runs)

        handle = timer.schedule_nowait(unit, count)
        assert await handle.wait() == 1
        handle.reset(2 * unit)
        assert handle.pending()
        assert not handle.fired()
        assert len(timer) == 1
        assert await handle.wait() == 2
        assert_on_time(runs[1], handle.deadline, virtual)
        assert timer.stats().scheduled == 2


async def test_reset_a_cancelled_handle_arms_it_again(unit: float) -> None:
    async with Timer() as timer:
        ran: list[str] = []
        handle = timer.schedule_nowait(unit, ran.append, "x")
        handle.cancel()
        handle.reset(unit)
        assert handle.pending()
        assert not handle.cancelled()
        assert len(timer) == 1
        await handle.wait()
        assert ran == ["x"]


async def test_reset_a_pending_handle_keeps_one_instance(unit: float) -> None:
    """Kafka: the same task added again while pending is pending only once."""
    async with Timer() as timer:
        ran: list[str] = []
        handle = timer.schedule_nowait(unit, ran.append, "x")
        for _ in range(100):
            handle.reset(2 * unit)
        assert len(timer) == 1
        assert timer.stats().scheduled == 1
        await handle.wait()
        await timer.sleep(2 * unit)
        assert ran == ["x"]


@pytest.mark.virtual_time
async def test_reset_at() -> None:
    async with Timer() as timer:
        probe = Probe(timer)
        handle = probe.schedule(5.0, "x")
        deadline = timer.time() + 1.25
        handle.reset_at(deadline)
        assert handle.deadline == deadline
        await handle.wait()
        probe.check(virtual=True)


async def test_callback_that_reschedules_itself(unit: float) -> None:
    """Netty: a callback re-arming its own handle runs again and again, and is still
    pending when the timer closes."""
    async with Timer() as timer:
        runs: list[int] = []
        box: list[TimerHandle[Any]] = []
        enough = anyio.Event()

        def again() -> None:
            runs.append(1)
            box[0].reset(unit)
            if len(runs) == 5:
                enough.set()

        box.append(timer.schedule_nowait(unit, again))
        await enough.wait()
        assert box[0].pending()
        assert await timer.aclose() == [box[0]]
        assert len(runs) == 5


@pytest.mark.parametrize("kind", ["one-shot", "periodic"])
async def test_handle_repr_and_wait_after_cancel(kind: str, unit: float) -> None:
    """``repr()`` of a handle works in every state, and so does ``wait()`` of a
    cancelled one (its TimerCancelled message names the handle)."""
    async with Timer() as timer:
        if kind == "periodic":
            handle: TimerHandle[Any] = timer.every(unit, noop)
        else:
            handle = timer.schedule_nowait(unit, noop)
        assert "pending" in repr(handle)
        handle.cancel()
        assert "cancelled" in repr(handle)
        with pytest.raises(TimerCancelled):
            await handle.wait()


# == every ===============================================================================


@pytest.mark.virtual_time
async def test_every_fixed_rate_keeps_the_grid() -> None:
    async with Timer() as timer:
        runs: list[float] = []
        start = timer.time()
        handle = timer.every(1.0, lambda: runs.append(timer.time()))
        assert isinstance(handle, PeriodicHandle)
        assert len(timer) == 1
        await anyio.sleep(5.5)
        assert len(runs) == 5
        for k, at in enumerate(runs, 1):
            assert_on_time(at, start + k * 1.0, virtual=True)
        assert handle.cancel() is True


@pytest.mark.virtual_time
async def test_every_fixed_rate_skips_missed_periods_without_overlap() -> None:
    async with Timer() as timer:
        starts: list[float] = []
        running = peak = 0

        async def job() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            starts.append(timer.time())
            if len(starts) == 1:
                await anyio.sleep(2.5)  # overruns periods 2 and 3
            running -= 1

        start = timer.time()
        handle = timer.every(1.0, job)
        await anyio.sleep(6.5)
        handle.cancel()
        assert peak == 1
        offsets = [at - start for at in starts]
        assert offsets == pytest.approx([1.0, 4.0, 5.0, 6.0], abs=TICK + EPS)


@pytest.mark.virtual_time
async def test_every_fixed_delay_waits_after_each_run() -> None:
    async with Timer() as timer:
        starts: list[float] = []
        running = peak = 0

        async def job() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            starts.append(timer.time())
            await anyio.sleep(0.3)
            running -= 1

        start = timer.time()
        handle = timer.every(1.0, job, fixed_rate=False)
        await anyio.sleep(5.0)
        handle.cancel()
        assert peak == 1
        offsets = [at - start for at in starts]
        assert offsets == pytest.approx([1.0, 2.3, 3.6, 4.9], abs=2 * (TICK + EPS))


@pytest.mark.parametrize("fixed_rate", [True, False])
async def test_every_errors_are_reported_and_it_goes_on(fixed_rate: bool, unit: float) -> None:
    reported: list[BaseException] = []
    async with Timer(on_error=lambda h, e: reported.append(e)) as timer:
        runs: list[int] = []
        five = anyio.Event()

        def job() -> None:
            runs.append(1)
            if len(runs) == 5:
                five.set()
            if len(runs) in (2, 3):
                raise ZeroDivisionError(len(runs))

        handle = timer.every(unit, job, fixed_rate=fixed_rate)
        await five.wait()
        assert handle.cancel() is True
        assert [type(e) for e in reported] == [ZeroDivisionError, ZeroDivisionError]
        assert timer.stats().failed == 2


async def test_every_cancel_stops_it(unit: float) -> None:
    async with Timer() as timer:
        runs: list[float] = []
        three = anyio.Event()

        def job() -> None:
            runs.append(timer.time())
            if len(runs) == 3:
                three.set()

        handle = timer.every(unit, job)
        await three.wait()
        assert handle.cancel() is True
        assert handle.cancelled()
        assert handle.cancel() is False
        assert len(timer) == 0
        await timer.sleep(5 * unit)
        assert len(runs) == 3


async def test_every_cancel_during_an_async_run(unit: float) -> None:
    async with Timer() as timer:
        started, release = anyio.Event(), anyio.Event()
        runs: list[str] = []

        async def job() -> None:
            runs.append("start")
            started.set()
            await release.wait()
            runs.append("end")

        handle = timer.every(unit, job)
        await started.wait()
        assert handle.cancel() is True  # active, though its run is in progress
        release.set()
        await timer.sleep(5 * unit)
        assert runs == ["start", "end"]  # the run finished; no run started after
        assert len(timer) == 0
