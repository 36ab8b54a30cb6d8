"""Periodic timers: their handle (``PeriodicHandle``, ``Timer.every``'s) and their
accounting, the slot each one holds for its whole life.

docs/design.md, "Periodic timers". An active periodic timer holds one pending slot for
its whole life: its filed (or queued) period, and while a run is in progress the next
period, which is armed (counted scheduled and pending) when the run starts and filed
when it ends. So the next period never needs admission, and the counters keep
``scheduled == fired + cancelled + pending`` (``_selfcheck.check_engine``).

``Periodics`` keeps the active periodic timers of one engine: ``start`` makes a new
one (``Timer.every``, past its argument checks), ``stop_all`` is the close's. The
handle applies the rules above to its own fields: its run (``PeriodicHandle._run``)
calls ``PeriodicHandle._begin``, then ``PeriodicHandle._end`` (or
``PeriodicHandle._queued`` when its callback returned an awaitable: the worker's host
calls ``_begin`` and ``_end`` again around the real run), and a re-arm is
``PeriodicHandle._rearm``. The engine files, counts and cancels, reached through
``Periodics.engine``, a reference typed as the engine itself (compiled, native calls),
as the worker pool does.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextvars import Context, copy_context
from typing import TYPE_CHECKING, Any, Final, SupportsFloat, TypeVar, final

from ._checks import too_far
from ._handle import HandleOwner, TracedHandle, release, same_variables

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["PeriodicHandle", "Periodics"]

_C = TypeVar("_C")

try:  # mypyc reads its class options from this decorator (aiowheel/_compiled.py)
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy installed: the decorator does nothing

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_C], _C]:
        return lambda cls: cls


_INF: Final = math.inf
_copy_context: Final = copy_context
_FLOAT_MAX: Final = sys.float_info.max
# A grid of more periods than floats resolve (2**52) cannot be stepped in floats.
_GRID_LIMIT: Final = 2.0**52


@final
class Periodics:
    """The active periodic timers of one engine, and their slots."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.active: set[PeriodicHandle] = set()

    def start(
        self,
        timer: HandleOwner,
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
        handle = PeriodicHandle(timer, self, callback, args, period, fixed_rate, now)
        engine.stamp(handle, label, now)  # traced or not: the pass reads it when traced
        engine.file(handle, now + period, False, new=True)
        self.active.add(handle)
        return handle

    def stop_all(self) -> list[PeriodicHandle]:
        """The close: every periodic timer stops. The filed and queued ones are the
        close's to cancel; returns those in a run, which gave back their reserved
        period (cancelled too: the close counts them and ends their trace's period)."""
        given_back: list[PeriodicHandle] = []
        for periodic in self.active:
            # (the wheel and the queue have let go of those not in a run)
            if periodic._stop():
                given_back.append(periodic)
        self.active.clear()
        return given_back

    def check(self) -> int:
        """Assert each active periodic timer's state (``_selfcheck.check_engine``); returns the
        slots reserved by runs in progress."""
        return sum(periodic._check_active() for periodic in self.active)


class PeriodicHandle(TracedHandle[Any]):
    """The handle of ``Timer.every``: it re-arms itself after each run.

    Its callback slot holds ``self._run``, which calls the user's callback and then
    re-arms, so the dispatcher treats periodic timers like any other. It is a
    ``TracedHandle`` whether or not the timer traces (periodic timers are few): a
    traced timer writes one row per period, all with the handle's ``timer_id``.
    """

    __slots__ = (
        "_active",
        "_anchor",
        "_fixed_rate",
        "_in_run",
        "_interval",
        "_k",
        "_origin",
        "_periodics",
        "_rearmed",
        "_user_args",
        "_user_cb",
    )

    # State (docs/design.md, "Periodic timers"): an active periodic timer is filed (in
    # a wheel bucket), queued (its async run waits for a worker), or in a run
    # (``_in_run``: its callback is being called or awaited). While in a run it holds
    # the pending slot of its next period, so that period needs no admission when it
    # is filed, and a reset() only records the next deadline (``_rearmed``): the next
    # run is filed when this one ends, so runs never overlap.

    def __init__(
        self,
        timer: HandleOwner,
        periodics: Periodics,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        interval: float,
        fixed_rate: bool,
        start: float,
    ) -> None:
        # The callback is a _Run of this handle (below), not the bound method
        # self._run: compiled, the collector does not track it, so a pending periodic
        # timer is nothing for it to walk (docs/design.md, "Pending timers and the
        # garbage collector").
        super().__init__(timer, _Run(self), ())
        # Its engine's periodic timers, which keep its slot (a run calls them).
        self._periodics = periodics
        # The scheduler's context, a snapshot maybe shared (aiowheel/_handle.py,
        # snapshot_context). A run runs in a context of the handle's own, directly, so
        # a run sees what the last one set (docs/usage.md, "Context variables"): a
        # copy of the snapshot made for the first run (_run_context), and kept while
        # runs leave it holding other variables than the snapshot; a run that set
        # nothing gives it back (_share_back), so a pending periodic timer holds no
        # object of its own for the collector to walk.
        self._origin = self._context
        self._user_cb = callback
        self._user_args = args
        self._interval = interval
        self._fixed_rate = fixed_rate
        # The grid: run k is due at anchor + k * interval (the first one at k == 1).
        self._anchor = start
        self._k = 1
        self._active = True
        self._in_run = False
        self._rearmed = False

    def _run_context(self) -> Context:
        """Its own context, run in directly: a run sees what the last one set. Made
        from the snapshot for the first run, and again after a run that set nothing
        (a shared snapshot is never run in)."""
        context: Context = self._context
        if context is self._origin:
            context = context.copy()
            self._context = context
        return context

    def _share_back(self) -> None:
        """A run ended: if its context holds the snapshot's variables, bound to the
        same objects, hold the snapshot again (the next run copies it anew)."""
        origin = self._origin
        if self._context is not origin and same_variables(self._context, origin):
            self._context = origin

    @property
    def callback(self) -> Callable[..., Any]:
        """The user's callable, run once per period."""
        return self._user_cb

    @property
    def interval(self) -> float:
        """Seconds between runs."""
        return self._interval

    def active(self) -> bool:
        """True until ``cancel()`` (or the timer's close) stops it."""
        return self._active

    def cancelled(self) -> bool:
        """True once stopped by ``cancel()`` or by the timer's close."""
        return not self._active

    def cancel(self) -> bool:
        """Stop the periodic timer: True while it was active; no run starts after."""
        # Checked first: a stopped one too refuses another thread or loop (nothing is
        # accepted silently); nothing to check once its timer has closed.
        self._timer._require_owner_loop_running()
        if not self._active:
            return False
        if self._bucket is not None:
            self._stop()
            periodics = self._periodics
            periodics.active.discard(self)
            return periodics.engine.cancel(self)
        # A run is in progress; it finishes, and it is not re-armed.
        self._halt()
        return True

    def reset(self, delay: SupportsFloat) -> None:
        """Move the next run to ``time() + delay`` (re-activating a stopped timer);
        later runs follow from there. Called while a run is in progress, it sets the
        deadline of the next run, which starts once this one has ended."""
        self._timer._reset(self, delay)  # no lazy path: the grid restarts

    def reset_at(self, deadline: SupportsFloat) -> None:
        """Move the next run to the absolute ``deadline`` (see ``reset``)."""
        self._timer._reset_at(self, deadline)

    def _stop(self) -> bool:
        # While active, the callback slot holds a _Run of this handle: a cycle (self ->
        # run -> self), which compiled the collector cannot see. Break it when stopped,
        # so a dropped handle is freed at once; _restart restores it. Returns whether a
        # run is in progress (it holds its next period's slot).
        self._active = False
        self._rearmed = False
        self._callback = _stopped
        return self._in_run

    def _halt(self) -> None:
        # Stop a periodic timer that is in a run: its reserved next period is cancelled.
        self._stop()
        periodics = self._periodics
        periodics.active.discard(self)
        engine = periodics.engine
        engine.count_cancelled()
        engine.pending_fell()
        # Its trace ends the period as cancelled, as a cancel of a filed one does
        # (Engine.cancel): every period ends fired or cancelled.
        self._trace_cancelled()

    def _check_active(self) -> int:
        # Periodics.check, for this active periodic timer: 1 when a run in progress
        # holds the next period's slot.
        assert self._active, self
        run = self._callback
        assert isinstance(run, _Run), self
        assert run.handle is self, self
        if self._bucket is None:
            assert self._in_run, f"{self!r}: active, not filed, not running"
            return 1
        return 0

    def _restart(self, deadline: float) -> None:
        # Called by the timer when reset() re-arms it: the grid restarts at deadline
        # (run 0 of the new grid; no subtraction, so no interval can overflow it).
        self._anchor = deadline
        self._k = 0
        if not self._active:
            self._active = True
            self._callback = _Run(self)

    def _run(self) -> Any:
        # The run starts (the timer reserves the next period's slot), the callback is
        # called; a plain callback's run ends here, an async one's when its worker has
        # awaited it (Engine._job_ended). The awaitable is handed back as it is, so a
        # queued run that never starts is closed like any async callback's.
        self._begin()
        try:
            result = self._user_cb(*self._user_args)
        except BaseException:
            self._end()
            raise
        if result is not None and _is_awaitable(result):
            self._queued()
            return result
        self._end()
        return result

    # -- its slot (the module docstring): a run's start and end, a re-arm ------------
    # Called by its run (_run), and for an async run by its worker's host
    # (Engine._job_started, _job_ended); _rearm by Engine.rearm.

    def _begin(self) -> None:
        # A run starts (plain: in the pass; async: on its worker).
        self._in_run = True
        if self._active:
            self._periodics.engine.reserve_slot()

    def _queued(self) -> None:
        # The callback returned an awaitable: the pass queues it for a worker, where it
        # counts as the pending period until it starts, so give back the slot reserved
        # for the next one (the worker reserves it again when the run really starts).
        self._in_run = False
        if self._active:
            self._periodics.engine.release_slot()

    def _end(self) -> None:
        # A run ended: file the next period in the slot it holds (no admission).
        self._in_run = False
        self._share_back()
        if not self._active:
            return  # stopped during the run: cancel() or the close gave its slot back
        engine = self._periodics.engine
        if engine.closed:
            return  # unreachable: closing stops every periodic timer
        if engine.draining:
            # A reset() during the drain re-activated it: no more periods.
            self._halt()
            return
        now = engine.clock()
        if self._rearmed:
            self._rearmed = False  # reset() during the run set the deadline
            deadline = self._deadline
        else:
            deadline = self._next_deadline(now)
        engine.wheel.reserve(deadline)  # levels first (see Engine.rearm)
        if self._stopped_meanwhile():
            return
        previous: Any = self._become_pending()
        self._scheduled_at = now
        engine.file(self, deadline, deadline <= now, new=False)
        release(previous)  # its finalizer may run now: the period is filed (see move)

    def _stopped_meanwhile(self) -> bool:
        # After an allocation in _end(): the collector ran user code (a finalizer, a
        # gc.callbacks hook) that closed the timer or stopped this periodic timer,
        # whose slot was given back then (docs/design.md, "Re-entrancy"). A method, so
        # that the tests made before the allocation do not answer for after it.
        return self._periodics.engine.closed or not self._active

    def _rearm(self, deadline: float) -> None:
        # reset()/reset_at() at a valid deadline (Engine.rearm made the levels).
        # During a run, only record the next deadline: the run's end files it, so a
        # second run never starts while the first one goes on.
        periodics = self._periodics
        engine = periodics.engine
        if self._in_run:
            if not self._active:
                # Stopped during this run: re-activating arms a new period.
                engine.admit()
                engine.reserve_slot()
                periodics.active.add(self)
            self._restart(deadline)
            self._deadline = deadline
            self._rearmed = True
            return
        if self._bucket is None:
            engine.admit()
        self._restart(deadline)
        self._rearmed = False
        periodics.active.add(self)
        engine.move(self, deadline)

    def _worker_stopped(self) -> None:
        # Its async run's worker was cancelled (Engine._job_stopped): the close
        # stopped it, and the run is over.
        self._in_run = False

    def _next_deadline(self, now: float) -> float:
        """The deadline of the next run, the current one having finished at ``now``.

        Never raises and never returns inf or NaN, whatever the interval: a grid
        finer than the float spacing near ``now`` restarts just after ``now`` (one
        run per tick at most), and a grid point beyond the largest float is the
        largest float (it never comes, and nothing overflows)."""
        interval = self._interval
        previous = self._deadline
        if not self._fixed_rate:
            deadline = now + interval
        else:
            # Skip missed periods instead of bunching them: the first grid point at
            # or after now, and never the same one twice.
            periods = (now - self._anchor) / interval
            if periods < _GRID_LIMIT:  # False for inf: the grid is finer than floats
                k = self._k + 1
                if periods > k:
                    k = math.ceil(periods)
                self._k = k
                deadline = self._anchor + k * interval
            else:
                deadline = previous  # restarted below
        if deadline != deadline or deadline == _INF:
            return _FLOAT_MAX
        if not deadline > previous:
            # The grid cannot move on in floats: restart it just after now.
            deadline = math.nextafter(max(now, previous), _INF)
            self._anchor = deadline
            self._k = 0
        return deadline


@final
@mypyc_attr(acyclic=True)
class _Run:
    """An active periodic timer's callback: one run of its handle.

    Compiled, the garbage collector does not track it (``acyclic``: mypyc gives the
    class no collector header), where a bound method ``handle._run`` would be one more
    object per periodic timer for every full collection to walk. Safe because the one
    cycle it is on, handle -> run -> handle, exists only while the handle is active:
    then its engine's ``Periodics.active`` holds the handle anyway, and ``_stop``
    replaces the run, which breaks the cycle, before the handle can be dropped."""

    __slots__ = ("handle",)

    def __init__(self, handle: PeriodicHandle) -> None:
        self.handle = handle

    def __call__(self) -> Any:
        return self.handle._run()


def _stopped() -> None:
    """The callback of a stopped periodic timer (never called: it is not pending)."""


def _is_awaitable(obj: object) -> bool:
    return hasattr(type(obj), "__await__")
