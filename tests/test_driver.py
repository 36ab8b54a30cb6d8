"""The driver: when it wakes, and what it does after the loop was blocked.

Wake-ups are counted with ``timer.stats().wakeups`` (driver passes). docs/design.md,
guarantee 6, says the driver sleeps until the earliest occupied bucket and wakes for
nothing else: no wake-up at all while the timer is empty, a handful (one per level at
most: the cascades) for one far timer, one for a whole bucket of timers, none for a bucket that
cancellation emptied. These need a virtual clock to say "over an hour" in a test, so
they are skipped on uvloop.

The blocked-loop tests need the loop's clock to jump while the loop is busy in one
synchronous step. A virtual clock cannot be moved by busy-waiting (``time.sleep`` does
not touch it), so ``block_loop`` moves it the way each clock allows:

* trio: ``MockClock.jump(seconds)``, the clock's public API for exactly this;
* asyncio (looptime): ``loop.setup_looptime(start=now + seconds)``, looptime's public
  re-initialisation, which sets the virtual "now" forward (forward only: looptime warns
  if time would go back);
* uvloop: real time, so a real synchronous ``time.sleep`` blocks the loop; a short one
  (50 ms = 50 ticks), and only order / exactly-once / never-early are asserted there.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiowheel import Timer, TimerHandle
from aiowheel._driver import AnyioDriver, AsyncioDriver, backend_name, round_up

pytestmark = pytest.mark.anyio

TICK = 0.001
# Slack for "at most one tick late" on virtual clocks: looptime counts whole
# microseconds, and float sums of deadlines are off by ulps.
EPS = 2e-6


def noop() -> None:
    pass


@pytest.fixture
def block_loop(anyio_backend: tuple[str, dict[str, Any]], backend: str) -> Callable[[float], None]:
    """Block the running loop for ``seconds`` of its own clock, synchronously."""
    if backend == "trio":
        clock = anyio_backend[1]["clock"]
        return clock.jump  # type: ignore[no-any-return]
    if backend == "asyncio":

        def jump(seconds: float) -> None:
            loop: Any = asyncio.get_running_loop()
            loop.setup_looptime(start=loop.time() + seconds)

        return jump
    return time.sleep


# == wake-up counts ======================================================================


@pytest.mark.virtual_time
async def test_no_wakeups_while_empty() -> None:
    async with Timer() as timer:
        await anyio.sleep(3600)
        assert timer.stats().wakeups == 0
        # Empty again after work: still no wake-up.
        handle = timer.schedule_nowait(0.01, noop)
        await handle.wait()
        woke = timer.stats().wakeups
        await anyio.sleep(3600)
        assert timer.stats().wakeups == woke


@pytest.mark.virtual_time
@pytest.mark.parametrize("delay", [10.0, 60.0, 3600.0, 86400.0, 1e6], ids=lambda d: f"{d:g}s")
async def test_one_far_timer_wakes_a_handful_of_times(delay: float) -> None:
    """10 s is 10,000 ticks: the driver wakes once per cascade (at most once per
    level), not once per tick or per bucket. (On looptime's microsecond clock this
    also checks that the driver does not spin at a cascade point whose float time is
    not on the clock's grid.)"""
    async with Timer(tick=TICK, wheel_size=64) as timer:
        handle = timer.schedule_nowait(delay, noop)
        await handle.wait()
        stats = timer.stats()
        assert stats.wakeups <= stats.levels, stats


@pytest.mark.virtual_time
async def test_one_bucket_of_timers_is_one_wakeup() -> None:
    async with Timer(tick=TICK) as timer:
        deadline = timer.time() + 0.0305
        handles = [timer.schedule_at_nowait(deadline, noop) for _ in range(1000)]
        await handles[-1].wait()
        assert timer.stats().wakeups == 1
        assert timer.stats().fired == 1000


@pytest.mark.virtual_time
async def test_wakes_early_for_a_nearer_timer_scheduled_later() -> None:
    async with Timer(tick=TICK) as timer:
        far = timer.schedule_nowait(10.0, noop)
        await anyio.sleep(1.0)
        assert timer.stats().wakeups == 0  # still asleep for the far timer's bucket
        fired: list[float] = []
        near = timer.schedule_nowait(0.5, lambda: fired.append(timer.time()))
        await near.wait()
        assert near.deadline <= fired[0] <= near.deadline + TICK + EPS
        await far.wait()
        assert timer.stats().wakeups <= timer.stats().levels + 2


@pytest.mark.virtual_time
async def test_no_wakeup_for_a_bucket_emptied_by_cancel() -> None:
    async with Timer(tick=TICK) as timer:
        handle = timer.schedule_nowait(5.0, noop)
        assert handle.cancel()
        assert timer.next_deadline() is None  # idle again at once
        await anyio.sleep(3600)
        assert timer.stats().wakeups == 0


@pytest.mark.virtual_time
async def test_emptied_buckets_cost_nothing_before_a_later_timer() -> None:
    """Cancelled timers on every level before a 5 s timer: the driver wakes exactly
    as often as for the 5 s timer alone (measured side by side in the same loop)."""
    async with (
        Timer(tick=TICK, wheel_size=8) as with_cancels,
        Timer(tick=TICK, wheel_size=8) as alone,
    ):
        cancelled = [with_cancels.schedule_nowait(d, noop) for d in (0.003, 0.02, 0.2, 1.5)]
        kept = with_cancels.schedule_nowait(5.0, noop)
        baseline = alone.schedule_nowait(5.0, noop)
        await anyio.sleep(0.001)
        for handle in cancelled:
            assert handle.cancel()
        await kept.wait()
        await baseline.wait()
        assert with_cancels.stats().wakeups == alone.stats().wakeups


@pytest.mark.virtual_time
async def test_no_wakeups_after_aclose() -> None:
    async with Timer(tick=TICK) as timer:
        timer.schedule_nowait(0.5, noop)
        timer.schedule_nowait(50.0, noop)
        await timer.aclose()
        woke = timer.stats().wakeups
        await anyio.sleep(3600)
        assert timer.stats().wakeups == woke


@pytest.mark.virtual_time
async def test_never_early_on_cascade_wakeups() -> None:
    """tokio: the driver wakes at cascade points (bucket starts of higher levels); no
    callback may start on such a wake before its deadline."""
    rng = random.Random(11)
    async with Timer(tick=TICK, wheel_size=4) as timer:
        runs: list[tuple[float, float]] = []
        handles: list[TimerHandle[Any]] = []

        def run(i: int) -> None:
            runs.append((timer.time(), handles[i].deadline))

        for i in range(300):
            handles.append(timer.schedule_nowait(rng.uniform(0, 3.0), run, i))
        for handle in handles:
            await handle.wait()
        assert len(runs) == 300
        for fired_at, deadline in runs:
            assert deadline <= fired_at <= deadline + TICK + EPS


# == a blocked loop ======================================================================


@pytest.mark.parametrize("where", ["in a callback", "in the caller"])
async def test_blocked_loop_fires_every_overdue_timer_once_in_deadline_order(
    where: str, virtual: bool, block_loop: Callable[[float], None]
) -> None:
    """The loop is blocked for many ticks (a synchronous step: see the module doc).
    When it runs again, every overdue timer fires exactly once, in deadline order
    across ticks (across the cascades of every level), never early; on a virtual clock
    all of them at the instant the block ends (one catch-up, not one tick at a time),
    and the timers due after the block still fire on time, not a revolution late."""
    rng = random.Random(where)
    block = 0.3 if virtual else 0.05
    horizon = 0.5 if virtual else 0.1
    async with Timer(tick=TICK, wheel_size=8) as timer:
        runs: list[tuple[int, float]] = []
        handles: list[TimerHandle[Any]] = []

        def run(i: int) -> None:
            runs.append((i, timer.time()))

        for i in range(600):
            handles.append(timer.schedule_nowait(rng.uniform(0.002, horizon), run, i))
        ended: list[float] = []

        def blocker() -> None:
            started = timer.time()
            block_loop(block)
            ended.append(timer.time())
            assert ended[0] - started >= block - EPS  # the clock did move while blocked

        if where == "in a callback":
            await timer.schedule_nowait(TICK, blocker).wait()
        else:
            await anyio.sleep(TICK)
            blocker()
        block_end = ended[0]
        for handle in handles:
            await handle.wait()

        fired = [i for i, _ in runs]
        assert sorted(fired) == list(range(600))  # each exactly once
        latest = 0.0
        for i, fired_at in runs:
            deadline = handles[i].deadline
            assert fired_at >= deadline  # never early
            assert deadline >= latest - TICK - EPS  # deadline order across ticks
            latest = max(latest, deadline)
            if virtual:
                if deadline <= block_end:
                    assert fired_at == block_end  # overdue: all at once when it ends
                else:
                    assert fired_at - deadline <= TICK + EPS  # not a revolution late
        assert any(handles[i].deadline <= block_end for i in fired)
        assert any(handles[i].deadline > block_end for i in fired)


async def test_blocked_loop_with_far_timers_on_high_levels(
    virtual: bool, block_loop: Callable[[float], None]
) -> None:
    """A block longer than several level spans (wheel_size 4: spans of 4, 16, 64, 256
    ticks): the catch-up cascades through every level in one go."""
    rng = random.Random(2)
    block = 2.0 if virtual else 0.05
    async with Timer(tick=TICK, wheel_size=4) as timer:
        runs: list[tuple[float, float]] = []
        handles: list[TimerHandle[Any]] = []

        def run(i: int) -> None:
            runs.append((handles[i].deadline, timer.time()))

        for i in range(300):
            handles.append(timer.schedule_nowait(rng.uniform(0.001, 1.5 * block), run, i))
        block_loop(block)
        for handle in handles:
            await handle.wait()
        assert len(runs) == 300
        deadlines = [deadline for deadline, _ in runs]
        latest = 0.0
        for deadline, fired_at in runs:
            assert fired_at >= deadline
            assert deadline >= latest - TICK - EPS
            latest = max(latest, deadline)
        assert sorted(deadlines) == sorted(h.deadline for h in handles)


async def test_due_now_timers_scheduled_after_a_block_keep_deadline_order(
    block_loop: Callable[[float], None],
) -> None:
    """After the loop was blocked, an older timer is overdue in its bucket; a timer
    scheduled then with a past deadline (delay <= 0) is due too, but its deadline is
    later: it must not jump the queue (deadlines more than a tick apart fire in
    deadline order, guarantee 4)."""
    async with Timer(tick=TICK) as timer:
        order: list[str] = []
        early = timer.schedule_nowait(2 * TICK, order.append, "early")
        block_loop(0.010)  # the loop is busy for 10 ticks: `early` is overdue
        late = timer.schedule_nowait(-0.004, order.append, "late")  # due now
        assert late.deadline - early.deadline > TICK
        await late.wait()
        await early.wait()
        assert order == ["early", "late"]


# -- the asyncio driver's wake-up rounding --------------------------------------------
#
# The asyncio driver's wake-up rounding (aiowheel/_driver.py).
#
# A bucket's time is ``origin + start * tick``: on no clock's grid, and often an ulp
# or two off the millisecond or microsecond it stands for. uvloop rounds call_at delays
# to whole milliseconds and looptime advances in whole microseconds; a wake-up armed a
# hair past one of their ticks made the driver wake, find nothing due, and re-arm, in a
# loop (up to 100k empty passes in 3 s on uvloop). The driver rounds wake-ups up to the
# clock's grid (``round_up``), and never below the bucket's time.

GRIDS = st.sampled_from([1e3, 1e6])


@given(
    grid=GRIDS,
    units=st.integers(min_value=0, max_value=10**13),
    ulps=st.integers(min_value=-3, max_value=3),
)
def test_round_up_is_on_the_grid_never_early_and_at_most_one_unit_late(
    grid: float, units: int, ulps: int
) -> None:
    when = units / grid
    step = math.inf if ulps > 0 else -math.inf
    for _ in range(abs(ulps)):
        when = math.nextafter(when, step)  # a grid point, or a few ulps either side
    rounded = round_up(when, grid)
    assert rounded >= when
    assert rounded == round(rounded * grid) / grid  # on the grid: n / grid, as clocks make it
    assert rounded - when <= 1 / grid * (1 + 1e-9) + math.ulp(when)


def test_asyncio_driver_arms_the_rounded_time() -> None:
    loop = asyncio.new_event_loop()

    async def main() -> None:
        driver = AsyncioDriver(lambda: None)
        when = math.nextafter(loop.time() + 0.25, math.inf)  # an ulp past a microsecond
        driver.arm(when)
        handle = driver._handle
        assert isinstance(handle, asyncio.TimerHandle)
        assert handle.when() == round_up(when, 1e6) >= when
        driver.disarm()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def _trio_deadline_entries() -> int:
    """Entries in trio's deadline heap, stale ones included (trio keeps a moved cancel
    scope's old deadline there until a scheduler pass pops it): what a burst of
    re-arms would grow. Runner internals, read-only."""
    import trio

    runner = trio.lowlevel.current_task()._runner
    return len(runner.deadlines._heap)


def test_trio_schedule_cancel_burst_does_not_grow_the_deadline_heap() -> None:
    """A burst of schedule + cancel on an idle timer, with no checkpoint in between,
    re-arms the driver at most a few times, not once or twice per cycle
    (docs/design.md, guarantee 6): on trio each move of the driver's cancel-scope
    deadline leaves an entry in trio's deadline heap until the next scheduler pass.
    (Its own trio.run: the heap is the runner's, read through trio's internals.)"""
    import trio
    import trio.testing

    async def main() -> None:
        async with Timer(tick=TICK) as timer:
            await trio.lowlevel.checkpoint()
            before = _trio_deadline_entries()
            for _ in range(10_000):
                timer.schedule_nowait(0.5, noop).cancel()
            assert _trio_deadline_entries() - before <= 4
            assert len(timer) == 0
            # Never early after the burst: the deferred re-check leaves the driver
            # armed for the right bucket.
            fired: list[float] = []
            handle = timer.schedule_nowait(0.25, lambda: fired.append(timer.time()))
            await handle.wait()
            assert handle.deadline <= fired[0] <= handle.deadline + TICK + EPS
            await trio.sleep(10)
            assert timer.stats().wakeups <= 3

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.virtual_time
async def test_deferred_recheck_is_never_early_after_a_cancel_burst() -> None:
    async with Timer(tick=TICK) as timer:
        later = timer.schedule_nowait(2.0, noop)
        for _ in range(100):
            timer.schedule_nowait(0.5, noop).cancel()
        fired: list[float] = []
        handle = timer.schedule_nowait(1.0, lambda: fired.append(timer.time()))
        await handle.wait()
        assert handle.deadline <= fired[0] <= handle.deadline + TICK + EPS
        await later.wait()
        assert timer.stats().wakeups <= 4


async def test_a_timer_due_now_after_a_cancel_emptied_the_armed_bucket_fires() -> None:
    """Found by tests/test_fault_model.py on trio: the cancel queues a re-check of the
    wake-up, a zero-delay timer then arms "now" before the driver runs, and the driver
    wakes once for both. The re-check took wake_at == -inf for a pass in progress and
    did nothing: that timer, and every later one, never fired."""
    fired: list[str] = []
    async with Timer(tick=0.001) as timer:
        timer.schedule_nowait(1.0, fired.append, "cancelled").cancel()
        due = timer.schedule_nowait(0.0, fired.append, "due")
        with anyio.fail_after(5.0):
            await due.wait()
        later = timer.schedule_nowait(0.01, fired.append, "later")
        with anyio.fail_after(5.0):
            await later.wait()
    assert fired == ["due", "later"]


def test_the_asyncio_driver_says_what_it_is_armed_for() -> None:
    loop = asyncio.new_event_loop()

    async def main() -> None:
        woken = asyncio.Event()
        driver = AsyncioDriver(woken.set)
        when = loop.time() + 0.01
        assert not driver.armed_for(when)
        driver.arm(when)
        assert driver.armed_for(when)  # as arm was asked, before the rounding
        assert not driver.armed_for(when + 0.01)
        driver.disarm()
        assert not driver.armed_for(when)
        driver.arm(when)
        driver.clock_changed()  # armed on another clock: nothing it can vouch for
        assert not driver.armed_for(when)
        driver.arm(when)
        await woken.wait()
        assert not driver.armed_for(when)  # woken: armed for nothing

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_the_anyio_driver_is_not_armed_while_a_recheck_is_pending() -> None:
    """Its re-check moves the one deadline to -inf: the check must arm again."""
    driver = AnyioDriver(lambda: None)
    driver.arm(5.0)
    assert driver.armed_for(5.0)
    assert not driver.armed_for(6.0)
    driver.recheck(lambda: None)
    assert not driver.armed_for(5.0)
    assert not driver.armed_for(-math.inf)


@pytest.mark.virtual_time
async def test_a_loop_of_timeout_blocks_arms_the_base_loop_once() -> None:
    """Each block's deadline is cancelled as it ends and the next block's is filed in
    the same tick before the driver's re-check runs: the driver stays armed
    (``Engine.wakeup_after_cancel``). It re-armed the base loop for every block, a
    ``call_at`` and a ``cancel`` each, as much as the block's own timer costs there."""
    if backend_name() == "trio":
        pytest.skip("trio's driver moves one cancel scope's deadline: no call_at")
    loop = asyncio.get_running_loop()
    call_at = loop.call_at
    arms = 0

    def counting_call_at(*args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal arms
        arms += 1
        return call_at(*args, **kwargs)

    loop.call_at = counting_call_at  # type: ignore[method-assign, assignment]
    try:
        async with Timer(tick=TICK) as timer:
            for _ in range(50):
                with timer.timeout(10.0):
                    await asyncio.sleep(0)  # a loop iteration: the re-check runs
            assert arms == 1
            assert timer.stats().wakeups == 0
    finally:
        del loop.call_at


@pytest.mark.virtual_time
async def test_cancels_that_empty_the_armed_bucket_ask_the_driver_once() -> None:
    """Each block's cancel empties the bucket the driver is armed for. The engine asks
    the driver for a re-check once, until that re-check has run
    (``Engine.request_recheck``); asking it again per cancel (a call through the
    driver's protocol and a bound method each) was a fifth of a drop-in ``call_at``
    and its ``cancel``."""
    async with Timer(tick=TICK) as timer:
        engine = timer._engine
        assert engine is not None
        driver = engine.driver
        asked = 0

        class CountingDriver:
            """The timer's driver, counting the re-checks asked of it."""

            def __getattr__(self, name: str) -> Any:
                return getattr(driver, name)

            def recheck(self, check: Callable[[], None]) -> None:
                nonlocal asked
                asked += 1
                driver.recheck(check)

        def queued() -> bool:
            assert engine is not None
            return engine.recheck_queued

        engine.driver = CountingDriver()
        try:
            for _ in range(50):
                with timer.timeout(10.0):
                    pass
            assert asked == 1
            assert queued()
            for _ in range(10):  # the re-check runs in a later loop iteration
                await anyio.lowlevel.checkpoint()
                if not queued():
                    break
            assert not queued()
            with timer.timeout(10.0):
                pass
            assert asked == 2  # a new cancel after it: asked again
        finally:
            engine.driver = driver
        assert len(timer) == 0
