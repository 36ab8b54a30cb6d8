"""Periodic timers' accounting: the slot each one holds for its whole life.

docs/design.md, "Periodic timers". An active periodic timer holds one pending slot for
its whole life: its filed (or queued) period, and while a run is in progress the next
period, which is armed (counted scheduled and pending) when the run starts and filed
when it ends. So the next period never needs admission, and the counters keep
``scheduled == fired + cancelled + pending`` (``Engine.check``).

``start`` makes a new one (``Timer.every``, past its argument checks). A periodic
handle's run (``PeriodicHandle._run``) calls ``begin``, then ``end`` (or
``queued`` when its callback returned an awaitable: the worker calls ``begin`` and
``end`` again around the real run). The engine files, counts and cancels; this class
keeps the active periodic timers and applies the rules above, through a reference typed
as the engine itself (compiled, native calls), as the worker pool does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, final

from ._checks import too_far
from ._handle import _PENDING, PeriodicHandle, release

if TYPE_CHECKING:
    from ._engine import Engine
    from ._timer import Timer

__all__ = ["Periodics"]

_INF: Final = math.inf


@final
class Periodics:
    """The active periodic timers of one engine, and their slots."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.active: set[PeriodicHandle] = set()

    def start(
        self,
        timer: Timer,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        period: float,
        fixed_rate: bool,
        label: str | None,
    ) -> PeriodicHandle:
        """``Timer.every`` past its argument checks: admission, then a new periodic
        timer whose first period, at now + ``period``, takes the slot it holds."""
        engine = self.engine
        engine.admit()
        now = engine.clock()
        if now + period == _INF:
            too_far("interval", period)
        handle = PeriodicHandle(timer, callback, args, period, fixed_rate, now)
        engine.stamp(handle, label, now)  # traced or not: the pass reads it when traced
        engine.file(handle, now + period, False, new=True)
        self.active.add(handle)
        return handle

    def begin(self, handle: PeriodicHandle) -> None:
        # A run starts (plain: in the pass; async: on its worker).
        handle._in_run = True
        if handle._active:
            engine = self.engine
            engine.pending += 1
            engine.scheduled += 1

    def queued(self, handle: PeriodicHandle) -> None:
        # The callback returned an awaitable: the pass queues it for a worker, where it
        # counts as the pending period until it starts, so give back the slot reserved
        # for the next one (the worker reserves it again when the run really starts).
        handle._in_run = False
        if handle._active:
            engine = self.engine
            engine.pending -= 1
            engine.scheduled -= 1

    def end(self, handle: PeriodicHandle) -> None:
        # A run ended: file the next period in the slot it holds (no admission).
        handle._in_run = False
        if not handle._active:
            return  # stopped during the run: cancel() or the close gave its slot back
        engine = self.engine
        if engine.closed:
            return  # unreachable: closing stops every periodic timer
        if engine.draining:
            # A reset() during the drain re-activated it: no more periods.
            self.halt(handle)
            return
        now = engine.clock()
        if handle._rearmed:
            handle._rearmed = False  # reset() during the run set the deadline
            deadline = handle._deadline
        else:
            deadline = handle._next_deadline(now)
        engine.wheel.reserve(deadline)  # levels first (see Engine.move)
        if self.stopped_meanwhile(handle):
            return
        previous: Any = handle._result
        handle._result = _PENDING
        handle._scheduled_at = now
        engine.file(handle, deadline, deadline <= now, new=False)
        release(previous)  # its finalizer may run now: the period is filed (see move)

    def stopped_meanwhile(self, handle: PeriodicHandle) -> bool:
        # After an allocation in end(): the collector ran user code (a finalizer, a
        # gc.callbacks hook) that closed the timer or stopped this periodic timer,
        # whose slot was given back then (docs/design.md, "Re-entrancy"). A method, so
        # that the tests made before the allocation do not answer for after it.
        return self.engine.closed or not handle._active

    def halt(self, handle: PeriodicHandle) -> None:
        # Stop a periodic timer that is in a run: its reserved next period is cancelled.
        handle._stop()
        self.active.discard(handle)
        engine = self.engine
        engine.pending -= 1
        engine.cancelled += 1
        engine.pending_fell()

    def stop(self, handle: PeriodicHandle) -> bool:
        """``cancel()`` of an active periodic timer (the owner checked the caller)."""
        if handle._bucket is not None:
            handle._stop()
            self.active.discard(handle)
            return self.engine.cancel(handle)
        # A run is in progress; it finishes, and it is not re-armed.
        self.halt(handle)
        return True

    def rearm(self, handle: PeriodicHandle, deadline: float) -> None:
        # reset()/reset_at() of a periodic timer. During a run, only record the next
        # deadline: the run's end files it, so a second run never starts while the
        # first one goes on.
        engine = self.engine
        if handle._in_run:
            if not handle._active:
                # Stopped during this run: re-activating arms a new period.
                engine.admit()
                engine.pending += 1
                engine.scheduled += 1
                self.active.add(handle)
            handle._restart(deadline)
            handle._deadline = deadline
            handle._rearmed = True
            return
        if handle._bucket is None:
            engine.admit()
        handle._restart(deadline)
        handle._rearmed = False
        self.active.add(handle)
        engine.move(handle, deadline)

    def stop_all(self) -> int:
        """The close: every periodic timer stops. The filed and queued ones are the
        close's to cancel; returns how many runs in progress gave back their reserved
        period (cancelled too)."""
        reserved = 0
        for periodic in self.active:
            if periodic._in_run:  # (the wheel and queue have let go of the others)
                reserved += 1
            periodic._stop()
        self.active.clear()
        return reserved

    def check(self) -> int:
        """Assert each active periodic timer's state (``Engine.check``); returns the
        slots reserved by runs in progress."""
        reserved = 0
        for periodic in self.active:
            assert periodic._active, periodic
            assert periodic._callback == periodic._run, periodic
            if periodic._bucket is None:
                assert periodic._in_run, f"{periodic!r}: active, not filed, not running"
                reserved += 1
        return reserved
