"""Issue 20, section 1: re-entrancy through finalizers and the garbage collector.

Dropping the last reference to a user object runs its ``__del__`` right there, and
any allocation may run the cyclic collector (and ``gc.callbacks``). Either can call
back into the timer. The rule (docs/design.md, "Re-entrancy"): no user code runs
between deciding a change of the wheel or the counters and completing it. Each test
re-enters at one of the places where an old reference is dropped or an allocation is
made during a change, and checks the wheel's invariants (``Wheel._check``), that
``len(timer)`` counts what is pending, and that each arm runs its callback once.
They run on asyncio (looptime), uvloop and trio, on both cores (CI runs the suite on
each).
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
import trio
from support import at_next_collection

from aiowheel import Timer, TimerCancelled, TimerClosed, TimerHandle
from aiowheel import _wheel as wheel_module
from aiowheel._wheel import Bucket, Wheel, WheelEntry

pytestmark = pytest.mark.anyio

TICK = 0.001


def check(timer: Timer, handles: list[TimerHandle[Any]]) -> None:
    """The wheel is well formed and ``len(timer)`` counts the pending handles."""
    live = timer._live
    assert live is not None
    live.wheel._check()
    assert len(timer) == sum(handle.pending() for handle in handles)


class OnDel:
    """Calls ``action`` once, when it is freed."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.action = action

    def __del__(self) -> None:
        action, self.action = self.action, _nothing
        action()


def _nothing() -> None:
    pass


@pytest.mark.parametrize("what", ["reset", "cancel", "schedule"])
async def test_a_finalizer_of_the_old_result_re_enters_a_reset(what: str) -> None:
    """The issue's reproduction: the callback's result re-arms (or cancels, or
    schedules) when ``reset()`` drops it. It ran three times, ``len()`` went to -1 and
    the loop could freeze in a self-linked bucket."""
    calls: list[int] = []
    extra: list[TimerHandle[Any]] = []
    async with Timer(tick=TICK) as timer:

        def act() -> None:
            if what == "reset":
                handle.reset(0.01)
            elif what == "cancel":
                handle.cancel()
            else:
                extra.append(timer.schedule_nowait(0.01, calls.append, -1))

        def callback() -> OnDel:
            calls.append(1)
            return OnDel(act) if len(calls) == 1 else None  # type: ignore[return-value]

        handle = timer.schedule_nowait(0.01, callback)
        with anyio.fail_after(5):
            await handle.wait()
        handle.reset(0.01)  # drops the OnDel: its finalizer re-enters here
        check(timer, [handle, *extra])
        expected_pending = 0 if what == "cancel" else 1
        assert handle.pending() is (what != "cancel")
        assert len(timer) == expected_pending + len(extra)
        with anyio.fail_after(5):
            if what != "cancel":
                await handle.wait()
            for other in extra:
                await other.wait()
        check(timer, [handle, *extra])
        assert len(timer) == 0
    assert calls.count(1) == (1 if what == "cancel" else 2)
    assert calls.count(-1) == len(extra)


async def test_a_queued_async_callback_whose_awaitable_re_arms_when_dropped() -> None:
    """A queued async callback re-armed: its awaitable is dropped (and closed), and
    its finalizer re-arms the same handle."""
    gate = anyio.Event()
    runs: list[str] = []
    async with Timer(tick=TICK, max_concurrency=1) as timer:

        async def blocker() -> None:
            await gate.wait()

        class Awaitable:
            def __init__(self) -> None:
                self.guard = OnDel(lambda: queued.reset(0.02))

            def __await__(self) -> Iterator[None]:
                runs.append("awaited")
                yield from ()

        called = anyio.Event()

        def make() -> Any:
            runs.append("called")
            called.set()  # the pass queues its awaitable before anyone wakes
            return Awaitable() if runs.count("called") == 1 else blocker_done()

        async def blocker_done() -> None:
            runs.append("second run")

        first = timer.schedule_nowait(0.005, blocker)
        queued = timer.schedule_nowait(0.006, make)
        with anyio.fail_after(5):
            await called.wait()
        assert queued.pending()
        handles = [first, queued]
        check(timer, handles)
        queued.reset(0.01)  # drops the Awaitable: its finalizer re-arms `queued`
        check(timer, handles)
        assert len(timer) == 1
        assert queued.pending()
        gate.set()
        with anyio.fail_after(5):
            await queued.wait()
            await first.wait()
        check(timer, handles)
        assert len(timer) == 0
    assert runs.count("awaited") == 0
    assert runs.count("second run") == 1


@pytest.mark.parametrize("what", ["reset", "cancel"])
async def test_the_collector_re_enters_while_a_reset_creates_levels(what: str) -> None:
    """A 100 s re-arm on a fresh timer creates levels (buckets: allocations); a
    ``gc.callbacks`` hook re-arms or cancels the handle there. The handle ended in two
    buckets, and a ghost in the level-2 bucket ran the callback again."""
    calls: list[float] = []
    async with Timer(tick=TICK) as timer:
        handle = timer.schedule_nowait(0.001, lambda: calls.append(timer.time()))
        with anyio.fail_after(5):
            await handle.wait()
        assert timer.stats().levels == 1

        filed = [False]  # whether the reset had filed the handle when the hook ran

        def act() -> None:
            filed[0] = handle._bucket is not None
            if what == "reset":
                handle.reset(0.01)
            else:
                handle.cancel()

        wheel = timer._live.wheel  # type: ignore[union-attr]
        # At a collection while the second overflow level's buckets are made.
        with at_next_collection(act, lambda: wheel.levels > 1) as hooked:
            handle.reset(100.0)
        assert hooked, "the collector did not run"
        check(timer, [handle])
        # Up to CPython 3.11 the collection runs inside the allocation, before the
        # handle is filed: the reset that was filing it wins. From 3.12 it runs at the
        # interpreter's next check of its eval breaker, which compiled code never makes:
        # on the compiled core that is the first Python the reset calls after filing the
        # handle (the driver's arm, aiowheel/_driver.py), so a cancel made there comes
        # last, and stands. Either way the handle is in one bucket or none.
        cancelled_last = what == "cancel" and filed[0]
        assert len(timer) == (0 if cancelled_last else 1)
        assert handle.pending() is not cancelled_last
        handle.cancel()
        check(timer, [handle])
        assert len(timer) == 0
    assert len(calls) == 1


@pytest.mark.parametrize("what", ["reset", "cancel", "schedule"])
async def test_the_collector_re_enters_a_reset_of_a_pending_handle(what: str) -> None:
    """An eager re-file (moving a pending timer earlier) with the collector running at
    every allocation, re-entering through a hook."""
    calls: list[str] = []
    extra: list[TimerHandle[Any]] = []
    async with Timer(tick=TICK) as timer:
        handle = timer.schedule_nowait(50.0, calls.append, "handle")

        def act() -> None:
            if what == "reset":
                handle.reset(0.02)
            elif what == "cancel":
                handle.cancel()
            else:
                extra.append(timer.schedule_nowait(0.03, calls.append, "extra"))

        with at_next_collection(act) as hooked:
            handle.reset(0.01)
            handle.reset(0.015)
        assert hooked
        check(timer, [handle, *extra])
        with anyio.fail_after(5):
            if handle.pending():
                await handle.wait()
            for other in extra:
                await other.wait()
        check(timer, [handle, *extra])
        assert len(timer) == 0
    assert calls.count("handle") <= 1
    assert calls.count("extra") == len(extra)


async def test_a_finalizer_closing_the_timer_during_a_reset() -> None:
    """``aclose()`` stepped from a finalizer (its synchronous part closes the timer)
    while a reset files the handle: the reset completes, the close settles it."""
    async with Timer(tick=TICK) as timer:
        closer: list[Any] = []

        def close() -> None:
            coro = timer.aclose()
            closer.append(coro)
            try:
                coro.send(None)
            except StopIteration:
                pass

        def callback() -> OnDel:
            return OnDel(close)

        handle = timer.schedule_nowait(0.01, callback)
        with anyio.fail_after(5):
            await handle.wait()
        handle.reset(0.01)
        assert timer.closed
        assert not handle.pending()
        assert handle.cancelled()
        assert len(timer) == 0
        for coro in closer:
            coro.close()


async def test_a_handle_freed_holding_a_callback_whose_finalizer_schedules() -> None:
    """A handle that ran keeps its callback (as asyncio's handles do) until it is
    freed; freeing it runs the callback's finalizer, which schedules here. The new
    handles are whole: nothing of the freed handle's memory is handed to them while
    it is still being cleared (mypyc's free list, ``free_list_len=1``, did that:
    docs/design.md, "Data structures, compiled")."""
    made: list[TimerHandle[Any]] = []
    calls: list[int] = []
    async with Timer(tick=TICK) as timer:

        def schedule_more() -> None:
            for _ in range(3):
                made.append(timer.schedule_nowait(0.01, calls.append, 1))

        class Callback:
            def __init__(self) -> None:
                self.guard = OnDel(schedule_more)

            def __call__(self) -> None:
                calls.append(0)

        handle = timer.schedule_nowait(0.005, Callback())
        with anyio.fail_after(5):
            await handle.wait()
        assert not made  # the handle holds its callback yet
        del handle  # the last reference: its callback's finalizer runs here
        assert len(made) == 3
        check(timer, made)
        assert all(other.pending() for other in made)
        with anyio.fail_after(5):
            for other in made:
                await other.wait()
        check(timer, made)
        assert len(timer) == 0
    assert calls == [0, 1, 1, 1]


def test_bucket_add_refuses_a_linked_entry() -> None:
    bucket, other = Bucket(0), Bucket(0)
    entry = WheelEntry(1.0)
    bucket.add(entry)
    with pytest.raises(RuntimeError, match="already filed"):
        bucket.add(entry)
    with pytest.raises(RuntimeError, match="already filed"):
        other.add(entry)
    assert list(bucket) == [entry]
    assert list(other) == []
    assert entry._prev is None
    assert entry._next is None


# == issue 28, item 3: a finalizer re-arms a handle while that handle's reset files it ===


def _inside_wheel(name: str) -> bool:
    """Whether the wheel's method ``name`` is on the stack (a collection inside it)."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == name and frame.f_code.co_filename == wheel_module.__file__:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


@pytest.mark.parametrize("inner", [0.02, 200.0])
@pytest.mark.parametrize("nth", range(1, 12))
async def test_a_finalizer_re_arming_a_handle_during_its_own_reset(nth: int, inner: float) -> None:
    """Issue 28, item 3: a ``gc.callbacks`` hook re-arms a fired handle at the n-th
    collection inside that handle's own ``reset`` (with a level to create and, on the
    pure core, a collection inside the wheel's filing). The outer ``reset`` raised
    ``RuntimeError: ... is already filed``. Now it returns; the handle is filed once,
    counted once, at the deadline of one of the two calls (docs/usage.md, "Failure
    semantics"), and runs once. A re-arm to 200 s creates a level inside the one
    the outer call is creating: the outer level was appended with a stale number
    and width (``Wheel._check`` caught it)."""
    calls: list[float] = []
    async with Timer(tick=TICK) as timer:
        handle = timer.schedule_nowait(0.001, lambda: calls.append(timer.time()))
        with anyio.fail_after(5):
            await handle.wait()
        count = [0]

        def act() -> None:
            handle.reset(inner)

        def when() -> bool:
            count[0] += 1
            return count[0] == nth

        start = timer.time()
        with at_next_collection(act, when):
            handle.reset(100.0)
        check(timer, [handle])
        assert len(timer) == 1
        assert handle.pending()
        delay = handle.deadline - start  # one of the two calls' (uvloop: real clock)
        assert delay in (pytest.approx(inner, abs=0.01), pytest.approx(100.0, abs=0.01))
        handle.reset(0.01)  # (uvloop runs on the real clock)
        with anyio.fail_after(5):
            await handle.wait()
        check(timer, [handle])
        assert len(timer) == 0
    assert len(calls) == 2


async def test_a_finalizer_re_arming_a_handle_inside_the_wheels_filing() -> None:
    """The same, at a collection inside ``Wheel._file`` itself (pure core: the level
    search unpacked a tuple, which allocates until the interpreter specializes it)."""
    async with Timer(tick=TICK) as timer:
        warm = timer.schedule_nowait(1000.0, _nothing)  # levels exist: no reserve work
        handle = timer.schedule_nowait(0.001, _nothing)
        with anyio.fail_after(5):
            await handle.wait()
        with at_next_collection(lambda: handle.reset(0.02), lambda: _inside_wheel("_file")):
            handle.reset(50.0)
        check(timer, [handle, warm])
        assert len(timer) == 2
        warm.cancel()
        handle.reset(0.01)  # (uvloop runs on the real clock)
        with anyio.fail_after(5):
            await handle.wait()
        check(timer, [handle, warm])


@pytest.mark.skipif(
    sys.version_info >= (3, 12),
    reason="from CPython 3.12 the collector runs at the next eval-breaker check, not at "
    "the allocation inside Wheel._file, so no finalizer can run between its check and "
    "its link there: the backstop is reachable (and tested) on 3.11",
)
def test_the_wheel_files_nothing_when_a_finalizer_filed_the_entry_meanwhile() -> None:
    """The backstop in ``Wheel._file``: a collection while it creates a level (no
    ``reserve`` first) runs a finalizer that files the same entry. The later call
    stands; the outer insert files nothing and says so (NaN)."""
    wheel = Wheel(1.0, 4, 0.0)
    entry = WheelEntry()
    with at_next_collection(lambda: wheel.insert(entry, 5.0), lambda: wheel.levels > 1) as hooked:
        result = wheel.insert(entry, 1000.0)
    assert hooked
    assert math.isnan(result)
    assert entry._deadline == 5.0
    assert entry._bucket is not None
    wheel._check()
    assert wheel.advance(5.0)[0]._first is entry


# == issue 20, section 2: a timer that closes settles every handle it held ===============


def block(backend: str, seconds: float) -> None:
    """Block the loop: its clock moves on while nothing runs."""
    if backend == "trio":
        clock: Any = trio.lowlevel.current_clock()
        clock.jump(seconds)
    elif backend == "asyncio":
        loop: Any = asyncio.get_running_loop()
        loop.setup_looptime(start=loop.time() + seconds)
    else:
        time.sleep(seconds)


async def test_an_error_inside_advance_settles_every_handle(backend: str) -> None:
    """An error raised half-way through ``Wheel.advance``, after it had handed out
    buckets (here a corrupt deadline that the cascade refuses), closed the timer with
    those handles still pending() while len() was 0, and their wait() hung. Now each
    is settled: not pending, wait() raises TimerClosed with the error as its cause."""
    async with Timer(tick=TICK) as timer:
        due = [timer.schedule_nowait(0.0, noop) for _ in range(2)]  # the due bucket
        soon = [timer.schedule_nowait(0.005, noop) for _ in range(3)]  # level 0
        later = [timer.schedule_nowait(0.1, noop) for _ in range(2)]  # level 1
        later[1]._deadline = math.nan  # the fault: the cascade raises ValueError
        handles = [*due, *soon, *later]
        block(backend, 0.2)  # one pass: the due bucket, level 0, then the cascade
        with anyio.fail_after(5):
            await anyio.sleep(0.01)
        assert timer.closed
        assert len(timer) == 0
        for handle in handles:
            assert not handle.pending(), handle
            with anyio.fail_after(5), pytest.raises(TimerClosed) as info:
                await handle.wait()
            assert isinstance(info.value.__cause__, ValueError)


def noop() -> None:
    pass


async def test_wait_on_a_closed_timer_never_hangs() -> None:
    """A handle that will never run, on a closed timer, is settled for wait()."""
    async with Timer(tick=TICK) as timer:
        handle = timer.schedule_nowait(1.0, noop)
    with anyio.fail_after(5), pytest.raises(TimerCancelled):
        await handle.wait()


# == issue 20, section 2: far deadlines and a clock that jumps ===========================


async def test_a_far_deadline_costs_few_wake_ups_on_a_jumping_clock(backend: str) -> None:
    """trio's MockClock with autojump jumps to each wake-up: a timer 1e16 s out took
    about 35,000 wake-ups (one per horizon), 1e300 never finished. (looptime cannot
    jump 1e16 s: its own clock arithmetic stalls; uvloop runs on real time.)"""
    if backend != "trio":
        pytest.skip("needs trio's MockClock with autojump")
    async with Timer(tick=TICK) as timer:
        fired: list[float] = []
        handle = timer.schedule_nowait(1e16, lambda: fired.append(timer.time()))
        astronomic = timer.schedule_nowait(1e300, noop)
        with anyio.fail_after(2e16):
            await handle.wait()
        assert fired[0] >= handle.deadline
        assert timer.stats().wakeups < 20
        assert astronomic.pending()
        astronomic.cancel()
