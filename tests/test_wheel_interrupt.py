"""Issue 28, item 2: a ``KeyboardInterrupt`` at any bytecode of a pass leaves the wheel
recoverable, and the timer usable.

On the pure core a signal handler's ``KeyboardInterrupt`` is raised at whatever
bytecode the interpreter is at: under trio (its driver task is not KI-protected) or
``loop.run_until_complete`` that may be inside ``Wheel.advance``. The timer used to
close for good ("stopped after an internal error"), though docs/usage.md promises the
timer still works if the loop goes on. Now the engine calls ``Wheel.recover``, which
files every pending entry again (its docstring states the invariant that makes that
possible), re-arms, and lets the interrupt go.

The interrupt is injected the way a signal arrives: a ``sys.settrace`` hook with
opcode events in the wheel's own frames raises at the k-th bytecode, for every k
(``tests/test_faults.py`` injects its interrupts from callbacks and ``on_error``,
where they land between bytecodes of the engine; this file reaches inside the
wheel). Traced frames are Python frames: pure core only.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from types import FrameType
from typing import Any, cast

import looptime
import pytest
from support import Entry

import aiowheel
from aiowheel import Timer
from aiowheel import _wheel as wheel_module
from aiowheel._wheel import Wheel

pytestmark = pytest.mark.skipif(
    aiowheel.COMPILED, reason="traces Python frames of the wheel: the pure core only"
)

WHEEL_FILE = wheel_module.__file__
# The wheel's steps of a pass, as the engine calls them (and what they call).
PASS_STEPS = frozenset({"advance", "in_order", "release", "next_expiry", "recover"})

Fired = list[tuple[float, Entry]]  # (the pass's now, the entry), in firing order


class Interrupter:
    """Raises ``KeyboardInterrupt`` (or ``raises``) at the ``at``-th bytecode run in
    aiowheel/_wheel.py while armed (``at`` < 0: never; it counts all the same)."""

    def __init__(self, at: int, raises: type[BaseException] = KeyboardInterrupt) -> None:
        self.at = at
        self.raises = raises
        self.count = 0
        self.raised = False

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.count += 1
            if self.count - 1 == self.at:
                self.raised = True
                sys.settrace(None)
                raise self.raises(f"at bytecode {self.at}")
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != WHEEL_FILE or self.raised:
            return None
        outer = frame  # the wheel method the caller called
        while outer.f_back is not None and outer.f_back.f_code.co_filename == WHEEL_FILE:
            outer = outer.f_back
        if outer.f_code.co_name not in PASS_STEPS:
            return None  # a pop by the engine's run_due, a cancel: not the wheel's pass
        frame.f_trace_opcodes = True
        return self._local

    @contextmanager
    def armed(self) -> Iterator[None]:
        previous = sys.gettrace()
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(previous)


def scene(size: int) -> tuple[Wheel, list[Entry], list[float]]:
    """A wheel holding a bit of everything a pass touches: entries filed as due (out
    of order: the pass sorts them), level-0 ones, lazily extended ones, ones that
    cascade down several levels, far ones (one extended to the far bucket's own
    time, issue 28's lost timer); and the instants to advance to."""
    wheel = Wheel(1.0, size, 0.0)
    entries: list[Entry] = []

    def add(deadline: float, due: bool = False) -> Entry:
        entry = Entry(len(entries))
        if due:
            wheel.insert_due(entry, deadline)
        else:
            wheel.insert(entry, deadline)
        entries.append(entry)
        return entry

    add(-0.5, due=True)
    add(-2.0, due=True)
    add(0.0, due=True)
    for deadline in [0.5, 1.0, 1.0, 2.5, 3.0, 7.0, 9.5, 20.0, 64.0, 65.5, 100.0]:
        add(deadline)
    wheel.extend(entries[4], 30.0)  # lazy: stays in its bucket, re-filed when due
    wheel.extend(entries[9], 5.0)  # earlier: re-filed now
    far = add(2.0**49)
    far_time = wheel.next_expiry()
    assert far_time is not None
    add(2.0**49 + 5.0)  # keeps the far bucket scheduled after the first leaves
    # The far bucket comes due at 2**48: extended to that instant, it stays there.
    wheel.extend(far, 2.0**48)
    times = [0.0, 2.0, 9.0, 70.0, 2.0**48]  # then `drive` takes the rest, unarmed
    return wheel, entries, times


def one_pass(
    wheel: Wheel,
    now: float,
    fired: list[tuple[float, Entry]],
    stop: int,
    interrupter: Interrupter | None = None,
) -> None:
    """A pass as the engine makes it: advance, the loop's deadline order, run up to
    ``stop`` entries, release the rest (filed again). ``interrupter`` is armed around
    the wheel's own steps (the pops are the caller's: ``_pass.run_due``)."""
    armed = interrupter.armed if interrupter is not None else nullcontext
    with armed():
        buckets = wheel.in_order(wheel.advance(now))
    ran = 0
    for bucket in buckets:
        while ran < stop and (entry := bucket.pop_first()) is not None:
            assert isinstance(entry, Entry)
            fired.append((now, entry))
            ran += 1
    with armed():
        wheel.release()


def drive(wheel: Wheel, fired: list[tuple[float, Entry]]) -> None:
    while (when := wheel.next_expiry()) is not None:
        if when == -math.inf:
            when = wheel.tick_time(wheel._now)
        one_pass(wheel, when, fired, stop=sys.maxsize)


def run(size: int, armed: int, at: int) -> tuple[Interrupter, Fired, list[Entry]]:
    """The scene's passes, the ``armed``-th one with the interrupter; then the rest
    driven to the end."""
    wheel, entries, times = scene(size)
    interrupter = Interrupter(at)
    fired: list[tuple[float, Entry]] = []
    for index, now in enumerate(times):
        try:
            # Every other pass stops after one entry: release re-files the rest.
            stop = 1 if index % 2 else sys.maxsize
            one_pass(wheel, now, fired, stop, interrupter if index == armed else None)
        except KeyboardInterrupt:
            assert interrupter.raised
            wheel.recover()
        wheel._check()
    drive(wheel, fired)
    wheel._check()
    return interrupter, fired, entries


def check(fired: list[tuple[float, Entry]], entries: list[Entry], at: int) -> None:
    # Each entry once (the scene's names are its indices).
    names = sorted(cast(int, entry.name) for _, entry in fired)
    assert names == [entry.name for entry in entries], f"interrupted at bytecode {at}"
    for now, entry in fired:
        assert entry._deadline <= now, (entry, now, at)  # never early


@pytest.mark.parametrize(("size", "stride"), [(4, 1), (2, 7)])
def test_an_interrupt_at_any_bytecode_of_a_pass_loses_nothing(size: int, stride: int) -> None:
    """Every entry fires exactly once, never early, whichever bytecode of advance,
    in_order or release the interrupt lands on, once ``recover`` has run (every
    bytecode of every pass of the scene on a wheel of 4; every 7th on a wheel of 2,
    whose passes are longer: more levels)."""
    _wheel, _entries, times = scene(size)
    for armed in range(len(times)):
        counter, fired, entries = run(size, armed, -1)
        check(fired, entries, -1)
        assert counter.count > 100  # each pass does real work
        for at in range(armed % stride, counter.count, stride):
            interrupter, fired, entries = run(size, armed, at)
            assert interrupter.raised
            check(fired, entries, at)


@pytest.mark.parametrize(("size", "stride"), [(4, 3), (2, 11)])
def test_clear_after_an_interrupt_at_any_bytecode_hands_back_every_pending_entry(
    size: int, stride: int
) -> None:
    """The record's other reader: a timer that closes after an interrupted pass
    (``Wheel.clear``, not ``recover``) settles every handle it held. Whichever
    bytecode the interrupt lands on, each entry has fired or comes back from
    ``clear`` exactly once, unlinked and seen by the collector again, and the wheel
    is empty: the entry being moved (``_moving``), the ones being re-linked
    (``_held``) and the buckets handed out (``_out``) included."""
    _wheel, _entries, times = scene(size)
    cleared_some_in_a_move = False
    for armed in range(len(times)):
        counter = Interrupter(-1)
        wheel, entries, _ = scene(size)
        for index, now in enumerate(times[: armed + 1]):
            one_pass(wheel, now, [], 1 if index % 2 else sys.maxsize, counter)
        for at in range(armed % stride, counter.count, stride):
            wheel, entries, _ = scene(size)
            interrupter = Interrupter(at)
            fired: Fired = []
            try:
                for index, now in enumerate(times[: armed + 1]):
                    stop = 1 if index % 2 else sys.maxsize
                    one_pass(wheel, now, fired, stop, interrupter if index == armed else None)
            except KeyboardInterrupt:
                assert interrupter.raised
            moving = wheel._moving
            cleared = wheel.clear()
            cleared_some_in_a_move |= moving is not None and moving in cleared
            names = sorted(cast(int, e.name) for e in [*(entry for _, entry in fired), *cleared])
            assert names == [entry.name for entry in entries], f"interrupted at bytecode {at}"
            for entry in cleared:
                assert entry._bucket is entry._prev is entry._next is None, (entry, at)
                assert entry._gc in (wheel_module.GC_TRACKED, wheel_module.GC_OFF), (entry, at)
            assert len(wheel) == 0, at
            assert wheel.next_expiry() is None, at
            assert (wheel._moving, wheel._held, wheel._out) == (None, None, []), at
    assert cleared_some_in_a_move  # the interrupts did land between an unlink and a link


def test_recover_twice_and_on_a_whole_wheel_changes_nothing() -> None:
    wheel, entries, _times = scene(3)
    wheel.recover()
    wheel.recover()
    wheel._check()
    fired: list[tuple[float, Entry]] = []
    drive(wheel, fired)
    check(fired, entries, -1)


def test_issue_28_interrupted_pass_keeps_the_timer_usable() -> None:
    """The timer itself: an interrupt inside the wheel's pass leaves
    ``run_until_complete``; running the loop again, every handle fires once and the
    timer is open (it used to be closed "after an internal error")."""
    interrupted = 0
    for at in range(0, 600, 7):
        loop = looptime.new_event_loop(start=1000.0)
        interrupter = Interrupter(at)
        fired: list[int] = []
        seen: dict[str, bool] = {}

        async def host(
            interrupter: Interrupter = interrupter,
            fired: list[int] = fired,
            seen: dict[str, bool] = seen,
        ) -> None:
            async with Timer(tick=0.001, wheel_size=4) as timer:
                handles = [timer.schedule_nowait(0.001 * i * i, fired.append, i) for i in range(12)]
                with interrupter.armed():
                    await asyncio.sleep(0.2)  # the passes run meanwhile
                seen["open"] = not timer.closed
                handles.append(timer.schedule_nowait(0.01, fired.append, 99))
                for handle in handles:
                    await asyncio.wait_for(handle.wait(), 10.0)
                assert len(timer) == 0

        task = loop.create_task(host())
        try:
            try:
                loop.run_until_complete(task)
            except KeyboardInterrupt:
                assert interrupter.raised
                interrupted += 1
                loop.run_until_complete(task)  # the loop goes on: so does the timer
            assert seen["open"], f"closed by an interrupt at bytecode {at}"
            assert sorted(fired) == [*range(12), 99], at
        finally:
            sys.settrace(None)
            if not task.done():
                task.cancel()
                try:
                    loop.run_until_complete(task)
                except BaseException:  # cleaning up after a failure already reported
                    pass
            loop.close()
    assert interrupted > 20


class _Fault(Exception):
    """A signal handler's own exception: not an interrupt, so the pass cannot tell it
    from a bug of the wheel."""


def test_a_fault_at_any_bytecode_of_a_pass_closes_the_timer_and_settles_every_handle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any exception but an interrupt inside the wheel's pass breaks the timer
    (docs/design.md, "Failure containment"), and its close settles every handle the
    wheel held, the ones the pass was moving or re-linking included (``Wheel.clear``):
    each has fired or its ``wait()`` raises, none waits for ever."""
    broken = 0
    counter = Interrupter(-1)
    for at in [-1, *range(1000)]:
        if at >= counter.count > 0:
            break  # past the last bytecode of the passes
        loop = looptime.new_event_loop(start=1000.0)
        interrupter = counter if at < 0 else Interrupter(at, _Fault)
        seen: dict[str, bool] = {}

        async def host(
            interrupter: Interrupter = interrupter, seen: dict[str, bool] = seen, at: int = at
        ) -> None:
            async with Timer(tick=0.001, wheel_size=4) as timer:
                # Already due, latest first (the pass sorts them), and a spread of
                # levels (cascades: entries moved between buckets).
                handles = [timer.schedule_nowait(-0.001 * i, int) for i in range(4)]
                handles += [timer.schedule_nowait(0.001 * i * i, int) for i in range(12)]
                with interrupter.armed():
                    await asyncio.sleep(0.2)  # the passes run meanwhile
                for handle in handles:
                    try:
                        await asyncio.wait_for(handle.wait(), 10.0)
                    except (aiowheel.TimerCancelled, aiowheel.TimerClosed):
                        assert handle.cancelled(), (handle, at)
                    else:
                        assert handle.fired(), (handle, at)
                assert len(timer) == 0
                seen["closed"] = timer.closed
                await timer.aclose()

        try:
            with caplog.at_level("CRITICAL", logger="aiowheel"):
                loop.run_until_complete(host())
        finally:
            sys.settrace(None)
            loop.close()
        assert seen["closed"] == interrupter.raised, at
        broken += interrupter.raised
    assert broken > 200
