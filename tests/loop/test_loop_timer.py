"""The drop-in loop's handles (one object per timer) and ``loop.timer`` (docs/loop.md).

On both bases. No sleeps: each test awaits the event it checks (a future a callback
completes), and orders within one pass are made deterministic by a coarse tick that
puts every deadline in one bucket.
"""

from __future__ import annotations

import asyncio
import gc
import math
import re
import sys
import weakref
from collections.abc import Callable, Coroutine
from decimal import Decimal
from typing import Any

import pytest

import aiowheel
from aiowheel import Purgatory
from aiowheel._loophandle import LoopTimerHandle
from aiowheel.middleware import get_shared_timer, shared_timer
from aiowheel.middleware._shared import has_shared_timer

BASES = ["asyncio", "uvloop"]


def run_on(base: str, main: Callable[[], Coroutine[Any, Any, Any]], tick: float = 0.001) -> Any:
    loop = aiowheel.new_event_loop(base=base, tick=tick)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def check(loop: asyncio.AbstractEventLoop) -> None:
    """The engine's counters and the wheel's invariants, between passes: the timer's
    own self-check (``Timer._check``), which must see the loop's handles too."""
    loop.timer._check()  # type: ignore[attr-defined]


def cb(*args: object) -> None:
    pass


@pytest.mark.parametrize("base", BASES)
def test_the_timers_self_check_sees_pending_loop_handles(base: str) -> None:
    # Timer._check on loop.timer while loop timers are pending: it raised
    # AttributeError (a loop handle has no _timer), blind where the drop-in loop is.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        handles = [loop.call_later(10 + n, cb) for n in range(3)]
        check(loop)
        handles[1].cancel()
        check(loop)

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_a_handle_freed_holding_a_callback_whose_finalizer_schedules(base: str) -> None:
    # A handle that ran keeps its callback (as asyncio's do) until it is freed; the
    # callback's finalizer schedules there. mypyc's free list (free_list_len=1) gave
    # the new handles the dying handle's memory and then cleared their fields:
    # "attribute '_args' undefined", two of the three lost (docs/design.md, "Data
    # structures, compiled").
    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.TimerHandle] = []
        ran = asyncio.Event()

        class Callback:
            def __call__(self) -> None:
                ran.set()

            def __del__(self) -> None:
                made.extend(loop.call_later(10, cb, n) for n in range(3))

        handle = loop.call_later(0.001, Callback())
        await ran.wait()
        assert not made  # the handle holds its callback yet
        del handle
        assert len(made) == 3
        check(loop)
        assert [other._args for other in made] == [(0,), (1,), (2,)]
        assert not any(other.cancelled() for other in made)
        assert len(loop.timer) == 3  # type: ignore[attr-defined]
        for other in made:
            other.cancel()

    run_on(base, main)


# -- the handle's contract -------------------------------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_handle_is_the_wheel_entry(base: str) -> None:
    loop: Any = aiowheel.new_event_loop(base=base)
    try:
        handle = loop.call_later(10, cb, 1)
        assert type(handle) is LoopTimerHandle
        assert handle._bucket is not None
        assert handle._scheduled
        assert handle.when() == handle._when == handle._deadline
        assert not handle.cancelled()
        assert not handle._cancelled
        assert handle._loop is loop
        ref = weakref.ref(handle)
        assert len(loop.timer) == 1
        handle.cancel()
        assert handle.cancelled()
        assert not handle._scheduled
        assert handle._bucket is None
        assert len(loop.timer) == 0  # off the wheel at once
        handle.cancel()  # idempotent
        assert len(loop.timer) == 0
        del handle
        gc.collect()
        assert ref() is None
        check(loop)
    finally:
        loop.close()


@pytest.mark.parametrize("base", BASES)
def test_repr_as_the_base_loop(base: str) -> None:
    loop: Any = aiowheel.new_event_loop(base=base)
    plain = asyncio.SelectorEventLoop()
    try:
        # Not in debug mode first (PYTHONASYNCIODEBUG=1 starts loops in it): the repr
        # would then end with where each handle was made, two different lines.
        loop.set_debug(False)
        plain.set_debug(False)
        handle = loop.call_at(1000.5, cb, 1, "x")
        reference = asyncio.TimerHandle(1000.5, cb, (1, "x"), plain)
        assert repr(handle) == repr(reference)
        # From CPython 3.13 a handle shows its callback's arguments in debug mode only.
        shown = r"\(\)" if sys.version_info >= (3, 13) else r"\(1, 'x'\)"
        assert re.fullmatch(rf"<TimerHandle when=1000\.5 cb{shown} at .*:\d+>", repr(handle))
        handle.cancel()
        reference.cancel()
        assert repr(handle) == repr(reference) == "<TimerHandle cancelled when=1000.5>"
        # Debug mode: the cancelled repr keeps the callback, and where it was made.
        loop.set_debug(True)
        plain.set_debug(True)
        # The arguments, in every version: the loop's debug flag reaches the format.
        handle = loop.call_at(1000.5, cb, 1, "x")
        reference = asyncio.TimerHandle(1000.5, cb, (1, "x"), plain)
        assert "cb(1, 'x') at " in repr(handle)
        assert repr(handle).split(" created at ")[0] == repr(reference).split(" created at ")[0]
        handle.cancel()
        handle = loop.call_at(1000.5, cb)
        assert handle._source_traceback[-1].name == "test_repr_as_the_base_loop"
        handle.cancel()
        assert repr(handle).startswith("<TimerHandle cancelled when=1000.5 cb() at ")
        assert "created at " in repr(handle)
        assert __file__ in repr(handle)
        later = loop.call_later(5, cb)
        assert later._source_traceback[-1].name == "test_repr_as_the_base_loop"
        later.cancel()
    finally:
        loop.close()
        plain.close()


@pytest.mark.parametrize("base", BASES)
def test_order_equality_hash(base: str) -> None:
    loop: Any = aiowheel.new_event_loop(base=base)
    plain = asyncio.SelectorEventLoop()
    try:
        a = loop.call_at(100.0, cb)
        b = loop.call_at(200.0, cb)
        same = loop.call_at(100.0, cb)
        assert a < b
        assert b > a
        assert a <= same
        assert a >= same
        assert not a < same
        assert a == same
        assert a != b
        assert hash(a) == hash(same) == hash(100.0)
        theirs = asyncio.TimerHandle(100.0, cb, (), plain)
        assert a == theirs
        assert a <= theirs
        assert b > theirs
        assert sorted([b, a]) == [a, b]
        assert (a == object()) is False
        with pytest.raises(TypeError):
            a < 1  # noqa: B015
        same.cancel()
        assert a != same
    finally:
        loop.close()
        plain.close()


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("base", BASES)
def test_context_and_exceptions_as_handle_run(base: str, debug: bool) -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outer")
    seen: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_debug(debug)
        loop.set_exception_handler(lambda _loop, context: seen.append(context))
        ctx = contextvars.copy_context()
        ctx.run(var.set, "inner")
        got = loop.create_future()
        handle = loop.call_later(0, lambda: got.set_result(var.get()), context=ctx)
        assert handle.get_context() is ctx
        assert await got == "inner"

        def boom(x: int) -> None:
            raise ZeroDivisionError(x)

        failing = loop.call_later(0, boom, 7)
        done = loop.create_future()
        loop.call_later(0.001, done.set_result, None)
        await done
        assert len(seen) == 1
        context = seen[0]
        # In debug mode (PYTHONASYNCIODEBUG=1) Handle._run adds where it was made.
        made = {"source_traceback"} if loop.get_debug() else set()
        assert set(context) == {"message", "exception", "handle", *made}
        assert context["handle"] is failing
        assert isinstance(context["exception"], ZeroDivisionError)
        # As Handle._run formats it: from CPython 3.13, the arguments in debug mode only.
        shown = r"\(7\)" if debug or sys.version_info < (3, 13) else r"\(\)"
        assert re.fullmatch(rf"Exception in callback .*boom{shown} at .*:\d+", context["message"])

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_keyboard_interrupt_propagates_and_the_rest_still_runs(base: str) -> None:
    loop: Any = aiowheel.new_event_loop(base=base, tick=0.05)
    try:
        fired: list[str] = []

        def stop() -> None:
            raise KeyboardInterrupt

        when = loop.time() + 0.01
        loop.call_at(when, fired.append, "a")
        loop.call_at(when + 0.001, stop)
        loop.call_at(when + 0.002, fired.append, "b")
        with pytest.raises(KeyboardInterrupt):
            loop.run_forever()
        if base == "asyncio":
            assert fired == ["a"]
            assert len(loop.timer) == 1  # "b" is still pending, filed again
        # (uvloop raises it at the end of its loop iteration, as it does for its own
        # timers: "b", filed again, may already have run.)
        check(loop)
        loop.call_at(when + 0.003, loop.stop)
        loop.run_forever()
        assert fired == ["a", "b"]
        check(loop)
    finally:
        loop.close()


# -- when: never early, one pass in when order ----------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_same_pass_in_when_order_ties_in_scheduling_order(base: str) -> None:
    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        fired: list[int] = []
        early: list[int] = []
        # The deadlines start 100 ms ahead, so that none has passed before its call_at
        # is made: one that had passed would run at once (uvloop's base: call_soon),
        # while an equal one filed a moment earlier waits for its bucket, up to a
        # tick. CI's pure run, two streams on two cores, took over 1 ms to schedule
        # these when they started at once, and a tie ran in reverse order.
        now = loop.time() + 0.1
        # A 50 ms tick: they land in one or two buckets, filed out of order.
        offsets = [0.004, 0.001, 0.003, 0.001, 0.002, 0.004, 0.0015]
        whens = [now + d for d in offsets]
        done = loop.create_future()

        def fire(i: int) -> None:
            if loop.time() < whens[i]:
                early.append(i)
            fired.append(i)
            if len(fired) == len(whens):
                done.set_result(None)

        for i, when in enumerate(whens):
            loop.call_at(when, fire, i)
        # A Timer's handle in the same pass goes in when order too.
        loop.timer.schedule_at_nowait(now + 0.0025, fired.append, 99)
        await done
        assert early == []
        expected = sorted(
            [*range(len(whens)), 99], key=lambda i: (whens[i] if i < 99 else now + 0.0025, i)
        )
        assert fired == expected
        check(loop)

    run_on(base, main, tick=0.05)


@pytest.mark.parametrize("base", BASES)
def test_never_early_across_many_deadlines(base: str) -> None:
    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        early: list[float] = []
        count = 200
        done = loop.create_future()
        left = [count]

        def fire(when: float) -> None:
            if loop.time() < when:
                early.append(when - loop.time())
            left[0] -= 1
            if not left[0]:
                done.set_result(None)

        now = loop.time()
        for i in range(count):
            when = now + (i * 37 % 97) * 0.0003
            loop.call_at(when, fire, when)
        await done
        assert early == []
        assert len(loop.timer) == 0
        check(loop)

    run_on(base, main)


# -- loop.timer -----------------------------------------------------------------------


class _Finalizer:
    """Runs ``action`` when the last reference goes: user code inside a cancel."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action

    def __call__(self, *args: object) -> None:
        pass

    def __del__(self) -> None:
        self.action()


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("debug", [False, True])
def test_cancel_releases_the_callback_and_arguments_last(base: str, debug: bool) -> None:
    """A finalizer of what cancel() drops finds the cancel complete (cancelled, off
    the wheel, counted), as after asyncio's Handle.cancel, and may re-enter: cancel
    the handle again, file a new timer, cancel another."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_debug(debug)
        seen: list[tuple[bool, bool, int]] = []
        handles: list[Any] = []
        other = loop.call_later(50, cb)

        def look() -> None:
            handle = handles[0]
            seen.append((handle.cancelled(), handle._bucket is None, len(loop.timer)))
            handle.cancel()  # again: nothing left to do
            handles.append(loop.call_later(60, cb))  # files while the cancel returns
            other.cancel()
            check(loop)

        handles.append(loop.call_later(40, _Finalizer(look), _Finalizer(lambda: None)))
        assert len(loop.timer) == 2
        handles[0].cancel()
        # The callback's finalizer ran once the handle was off the wheel and counted
        # (1 pending: `other`, not yet cancelled by the finalizer).
        assert seen == [(True, True, 1)]
        assert handles[0].cancelled()
        assert other.cancelled()
        assert len(loop.timer) == 1
        assert not handles[1].cancelled()
        check(loop)
        handles[1].cancel()
        assert len(loop.timer) == 0
        check(loop)
        loop.set_debug(False)

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_loop_timer_lifecycle(base: str) -> None:
    loop: Any = aiowheel.new_event_loop(base=base)
    timer = loop.timer
    assert isinstance(timer, aiowheel.Timer)
    # Started with the loop: before its first callback.
    assert not timer.closed
    assert timer.backend == base
    seen: list[object] = []

    async def first() -> None:
        seen.append(len(timer))
        h = timer.schedule_nowait(0, seen.append, "timer")
        assert h.pending()
        await h.wait()
        loop.call_later(100, cb)
        timer.schedule_nowait(100, cb)
        assert len(timer) == 2  # call_later's timers count
        with pytest.raises(RuntimeError, match=r"loop\.close\(\)"):
            await timer.aclose()

    loop.run_until_complete(first())
    assert seen == [0, "timer"]
    pending = loop.call_later(50, cb)
    assert len(timer) == 3
    check(loop)
    loop.close()
    assert timer.closed
    assert len(timer) == 0
    assert pending._bucket is None
    assert not pending.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_later(1, cb)
    loop.close()  # idempotent


@pytest.mark.parametrize("base", BASES)
def test_close_releases_the_dropped_handles_last(base: str) -> None:
    """loop.close() drops the pending handles; a finalizer of what they held (user
    code) that calls back into the loop finds it closing: its call_later is refused,
    as on the base loop, instead of filing into the wheel the close has walked (which
    made close() raise and left the loop open with a timer pending)."""
    loop: Any = aiowheel.new_event_loop(base=base)
    timer = loop.timer
    seen: list[object] = []

    def call_back() -> None:
        try:
            loop.call_later(5, cb)
        except RuntimeError as exc:
            seen.append(exc)
        seen.append(len(timer))

    loop.call_later(10, _Finalizer(call_back))
    other = loop.call_later(20, cb)
    check(loop)
    loop.close()
    assert loop.is_closed()
    assert timer.closed
    assert len(timer) == 0
    assert len(seen) == 2
    assert isinstance(seen[0], RuntimeError)
    assert seen[1] == 0
    assert other._bucket is None  # dropped, as the base loop drops its heap
    assert not other.cancelled()
    check(loop)


def _close_cancelling_at(base: str, nth: int) -> None:
    # loop.close() with a gc.callbacks hook that cancels two of its handles at the
    # nth collection during the close.
    loop: Any = aiowheel.new_event_loop(base=base)
    handles = [loop.call_later(delay, cb) for delay in (0.5, 3, 40, 700, 9000, 0.7)]
    collections = 0

    def hook(phase: str, info: dict[str, int]) -> None:
        nonlocal collections
        if phase == "start":
            collections += 1
            if collections == nth:
                handles[0].cancel()
                handles[5].cancel()

    threshold = gc.get_threshold()
    gc.callbacks.append(hook)
    gc.set_threshold(1, 1, 1)
    try:
        loop.close()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(hook)
    assert len(loop.timer) == 0
    check(loop)


@pytest.mark.parametrize("base", BASES)
def test_close_counts_a_handle_cancelled_while_it_walks_once(base: str) -> None:
    """loop.close() walks the wheel for the loop's handles, and the walk allocates:
    a gc.callbacks hook (user code) may cancel a handle already taken. Each handle is
    counted once, by the cancel or by the drop (it was counted by both: more timers
    cancelled than scheduled). The hook runs at each collection in turn."""
    for nth in range(1, 25):
        _close_cancelling_at(base, nth)


def _call_later_closing_at(base: str, delay: float, nth: int) -> None:
    # call_later with a gc.callbacks hook that closes the loop at the nth collection,
    # if that comes before the call counted its handle (not in uvloop's own
    # call_later, which the driver's arm calls afterwards: a close there crashes
    # uvloop itself).
    loop: Any = aiowheel.new_event_loop(base=base)
    engine = loop._engine
    collections = 0

    def hook(phase: str, info: dict[str, int]) -> None:
        nonlocal collections
        if phase == "start":
            collections += 1
            if collections == nth and not engine.scheduled:
                loop.close()

    threshold = gc.get_threshold()
    gc.callbacks.append(hook)
    gc.set_threshold(1, 1, 1)
    try:
        handle = loop.call_later(delay, cb)
    except RuntimeError:
        assert loop.is_closed()  # refused: the loop closed under the call
    else:
        assert not loop.is_closed()
        handle.cancel()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(hook)
        loop.close()
    assert len(loop.timer) == 0
    check(loop)


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("delay", [0.0005, 3.0, 40.0, 700.0, 9e4, 1e7])
def test_call_later_fails_cleanly_when_the_loop_closes_while_it_files(
    base: str, delay: float
) -> None:
    """Filing a handle allocates (a level of the wheel, the heap's tuple), and the
    collector may run user code there: a gc.callbacks hook that closes the loop. The
    call fails as on a closed loop and leaves nothing pending (it used to file the
    handle into the closed wheel and count it: a closed timer with one timer pending,
    for good). The hook closes the loop at each collection in turn."""
    for nth in range(1, 12):
        _call_later_closing_at(base, delay, nth)


@pytest.mark.parametrize("base", BASES)
def test_loop_timer_reset_and_every(base: str) -> None:
    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        timer = loop.timer
        ticks: list[float] = []
        done = loop.create_future()

        def tick() -> None:
            ticks.append(loop.time())
            if len(ticks) == 3:
                periodic.cancel()
                done.set_result(None)

        with timer.timeout(10):
            await asyncio.sleep(0)
        periodic = timer.every(0.002, tick)
        h = timer.schedule_nowait(100, cb)
        h.reset(0)
        await h.wait()
        await done
        assert ticks == sorted(ticks)
        check(loop)

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_middleware_and_purgatory_use_loop_timer(base: str) -> None:
    async def main() -> None:
        loop: Any = asyncio.get_running_loop()
        assert has_shared_timer()
        assert await get_shared_timer() is loop.timer
        async with shared_timer() as timer:
            assert timer is loop.timer
        assert not loop.timer.closed  # the block only registered it
        assert await get_shared_timer() is loop.timer
        purgatory = Purgatory(loop.timer)
        assert purgatory.timer is loop.timer

    run_on(base, main)


# -- bad input ----------------------------------------------------------------------------


def test_bad_base_and_tick() -> None:
    with pytest.raises(ValueError, match="base"):
        aiowheel.new_event_loop(base="tokio")
    for tick in (0, -1, math.nan, math.inf, 1e9):
        with pytest.raises(ValueError, match="tick"):
            aiowheel.new_event_loop(tick=tick)
    with pytest.raises(TypeError):
        aiowheel.new_event_loop(tick="1")  # type: ignore[arg-type]


@pytest.mark.parametrize("base", BASES)
def test_nan_and_infinite_when_never_reach_the_wheel(base: str) -> None:
    loop: Any = aiowheel.new_event_loop(base=base)
    try:
        for when in (math.nan, math.inf, -math.inf):
            try:
                handle = loop.call_at(when, cb)
            except (ValueError, OverflowError):
                continue  # the base loop refuses it
            assert not isinstance(handle, LoopTimerHandle)
            handle.cancel()
        assert len(loop.timer) == 0
        loop.call_later(1e300, cb).cancel()  # finite and huge: on the wheel, then off
        assert len(loop.timer) == 0
        check(loop)
    finally:
        loop.close()


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("debug", [False, True])
def test_call_at_refuses_text(base: str, debug: bool) -> None:
    """call_at takes a time, not text: float() would parse "5" (or b"5") into a
    deadline the base loop never accepts (uvloop raises TypeError, asyncio fails
    later in its own loop). TypeError at the call, nothing filed; numbers of other
    types (an int, a Decimal) are still times."""
    loop: Any = aiowheel.new_event_loop(base=base)
    loop.set_debug(debug)
    try:
        for when in ("5", b"5", bytearray(b"5"), memoryview(b"5")):
            with pytest.raises(TypeError, match="when must be a number"):
                loop.call_at(when, cb)
        assert len(loop.timer) == 0
        loop.call_at(5, cb).cancel()
        loop.call_at(Decimal("5.5"), cb).cancel()
        assert len(loop.timer) == 0
        check(loop)
    finally:
        loop.close()


def test_wheel_in_order_merges_the_buckets_of_one_pass() -> None:
    from aiowheel._wheel import Wheel, WheelEntry

    wheel = Wheel(0.01, 4, 0.0)
    deadlines = [0.035, 0.001, 0.2, 0.009, 0.0351, 0.15, 0.002, 0.2]
    entries = [WheelEntry() for _ in deadlines]
    for entry, deadline in zip(entries, deadlines, strict=True):
        wheel.insert(entry, deadline)
    late = WheelEntry()
    wheel.insert_due(late, 0.0005)  # filed as due: merged by deadline
    buckets = wheel.in_order(wheel.advance(1.0))
    got = [entry for bucket in buckets for entry in bucket]
    assert [e._deadline for e in got] == sorted([*deadlines, 0.0005])
    # ties keep the order they were filed in
    assert got.index(entries[2]) < got.index(entries[7])
    for bucket in buckets:
        while bucket.pop_first() is not None:
            pass
    wheel.release()
    wheel._check()
    assert len(wheel) == 0


@pytest.mark.parametrize("base", BASES)
def test_loop_timer_belongs_to_the_thread_that_runs_the_loop(base: str) -> None:
    import threading

    loop: Any = aiowheel.new_event_loop(base=base)  # made here, run in another thread
    seen: list[object] = []

    async def main() -> None:
        handle = loop.timer.schedule_nowait(0, seen.append, "ran")
        await handle.wait()

    def run() -> None:
        loop.run_until_complete(main())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    loop.close()
    assert seen == ["ran"]


@pytest.mark.parametrize("base", BASES)
def test_debug_mode_exception_context_has_the_source_traceback(base: str) -> None:
    seen: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.set_exception_handler(lambda _loop, context: seen.append(context))

        def cancelled() -> None:
            raise asyncio.CancelledError  # a BaseException: the handler gets it too

        handle = loop.call_later(0, cancelled)
        done = loop.create_future()
        loop.call_later(0.001, done.set_result, None)
        await done
        assert [c["handle"] for c in seen] == [handle]
        context = seen[0]
        assert set(context) == {"message", "exception", "handle", "source_traceback"}
        assert isinstance(context["exception"], asyncio.CancelledError)
        assert context["source_traceback"][-1].name == "main"

    run_on(base, main)
