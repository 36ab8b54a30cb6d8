"""The engine: a started timer's parts, its counters and the rules that change them.

``Engine`` holds what every room of a started timer shares (the wheel, the driver,
the worker pool, the waiters, the periodic timers, the trace) and the only methods
that change the counters (docs/design.md, "Accounting"); the named rules the hot
paths copy inline, each copy tagged with the method it copies and driven against it
by tests/test_copies_agree.py; filing, re-filing, the cancel and the driver's
wake-up. The rooms that serve it are handed it; what acts on the whole engine stands
above it and is handed it too: the pass (``_pass.py``, the driver's callback, given
by the maker, ``TimerLifecycle._new_engine``), the close (``_shutdown.py``), the
self-check (``_selfcheck.py``). Who may write each attribute: tests/test_module_map.py,
``ENGINE_WRITERS``; where the module stands: docs/design.md, "Module map".

Re-entrancy (docs/design.md, "Re-entrancy"): no user code, finalizers included, runs
between deciding a linked-list change and completing it. Each method below that
changes a bucket says where it releases what it replaced.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from contextvars import Context
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NoReturn, final

import anyio

from ._affinity import affinity_for
from ._checks import full
from ._dispatch import WorkerPool, close_awaitable
from ._driver import Backend, Driver
from ._exceptions import TimerCancelled
from ._handle import _CANCELLED, _PENDING, TimerHandle, TracedHandle, _Failure, release
from ._periodic import PeriodicHandle, Periodics
from ._tracing import Tracer
from ._waiters import Waiters
from ._wheel import Bucket, Wheel, WheelEntry

if TYPE_CHECKING:
    from .trace import TraceRecorder

__all__ = ["ASYNC_ON_ERROR", "Engine", "TimerStats"]

logger: Final = logging.getLogger("aiowheel")

_INF: Final = math.inf
_EXIT: Final = (SystemExit, KeyboardInterrupt)
ASYNC_ON_ERROR: Final = (
    "the timer calls on_error inside its pass, which never awaits: pass a plain "
    "function (it may start a task for async work)"
)


@dataclass(frozen=True, slots=True)
class TimerStats:
    """A snapshot of a timer's counters (``Timer.stats()``, ``Engine.snapshot``):
    they live here, beside the only class that writes them."""

    pending: int  #: timers not yet started, expired async callbacks waiting for a worker included
    scheduled: int  #: arms (schedules, re-arms of fired or cancelled handles, periodic runs)
    fired: int  #: callbacks started (those that raised included)
    cancelled: int  #: timers cancelled while pending
    failed: int  #: callbacks that raised
    levels: int  #: wheels in use (overflow wheels are created on demand)
    #: worst start time minus deadline, seconds (``loop.timer``'s: of the drop-in loop's
    #: ``call_at``/``call_later`` timers too)
    lateness_max: float
    running: int = 0  #: async callbacks running on workers now
    workers: int = 0  #: worker tasks alive
    wakeups: int = 0  #: driver passes

    def __reduce__(self) -> tuple[type[TimerStats], tuple[int | float, ...]]:
        # copy, deepcopy and pickle rebuild a snapshot through the constructor. The
        # default path restores slots with setattr, which the frozen class refuses on
        # the compiled core (FrozenInstanceError) while the pure one has dataclass's
        # own __setstate__: one answer on both cores (issue 20, section 4).
        return (
            TimerStats,
            (
                self.pending,
                self.scheduled,
                self.fired,
                self.cancelled,
                self.failed,
                self.levels,
                self.lateness_max,
                self.running,
                self.workers,
                self.wakeups,
            ),
        )


@final  # compiled, calls between its own methods are direct (no vtable)
class Engine:
    """A started timer's engine: its parts, its state and its accounting, and the
    rules that change them. The pass (``_pass.py``) runs on it; the close
    (``_shutdown.py``) ends it."""

    # Built here when the owner gives ``max_concurrency`` (the pool's host is this
    # object); a test rig may build its own and assign it.
    pool: WorkerPool

    def __init__(
        self,
        backend: Backend,
        tick: float,
        wheel_size: int,
        limit: int,
        on_error: Callable[[TimerHandle[Any], BaseException], object],
        tracing: TraceRecorder | None,
        on_close: Callable[[], None],
        closed_error: Callable[[], BaseException],
        *,
        fire_due: Callable[[Engine], None],
        max_concurrency: int | None = None,
        loop_timers: bool = False,
    ) -> None:
        # What differs between event loops is the backend's (aiowheel/_driver.py); its
        # clock and loop are copied here for the hot paths.
        self.backend = backend
        self.clock: Callable[[], float] = backend.clock
        self.loop: asyncio.AbstractEventLoop | None = backend.loop
        # The owner check's thread and loop (the owner starts the engine in its thread).
        self.affinity = affinity_for(self.loop, backend.name)
        self.wheel = Wheel(tick, wheel_size, self.clock())
        # What wakes the pass: its callback is the pass, _pass.fire_due, which the
        # maker hands in (TimerLifecycle._new_engine): this module does not import the
        # pass, which sees the engine as a type (docs/design.md, "Module map").
        self.driver: Driver = backend.make_driver(partial(fire_due, self))
        # The owner's supervisor waits on `closing`; `stopped` once it has returned.
        self.closing = anyio.Event()
        self.stopped = anyio.Event()
        self.limit = limit
        self.on_error = on_error
        # The trace (``_tracing.py``): which timers it keeps, and their rows.
        self.tracing: Tracer | None = Tracer(tracing, self.clock) if tracing is not None else None
        # What the owner does when the engine closes (stop accepting), and the error a
        # call on the closed engine raises.
        self._on_close = on_close
        self._closed_error = closed_error

        # Closed: for good. Draining: aclose(drain=True) waits for the rest.
        self.closed = False
        self.draining = False
        self.broken: BaseException | None = None  # what closed it, if not aclose
        # When the driver is armed for; -inf during a pass (no re-arming from
        # callbacks: the pass re-arms once at its end) or when armed for "now", inf
        # when idle. So -inf does not say a pass is running: `passing` does.
        self.wake_at = _INF
        self.passing = False
        # A re-check asked of the driver (request_recheck) that has not run yet.
        self.recheck_queued = False

        # Counters (docs/design.md, "Accounting"). pending is exact at every moment.
        self.pending = 0
        self.scheduled = 0
        self.fired = 0
        self.cancelled = 0
        self.failed = 0
        self.lateness_max = 0.0
        self.wakeups = 0

        # The tasks waiting on handles, for room and for the drain.
        self.waiters = Waiters(self)
        # True whenever a cancel must do more than count: someone may be waiting (on
        # the handle, for room, for the drain). Set on every registration, recomputed
        # lazily, so that cancel() checks one attribute. (A traced handle writes its
        # row itself: TracedHandle.cancel.)
        self.notify_cancel = False
        self.periodics = Periodics(self)
        # The handles an internal error cancelled (see break_): their wait() says why.
        self.stranded: set[TimerHandle[Any]] = set()
        # True for the timer of a drop-in event loop (aiowheel/_loop.py, loop.timer):
        # its wheel also holds the loop's call_at handles (see "the drop-in loop").
        self.loop_timers = loop_timers
        # That loop's debug mode (its get_debug()), kept here by its set_debug: the
        # loop's compiled call_at and LoopTimerHandle.cancel read one attribute, not a
        # Python method per timer (aiowheel/_loop.py, _WheelLoop.set_debug).
        self.loop_debug = False
        # In debug mode the pass runs each of the loop's handles through this, the
        # loop's own (aiowheel/_loop.py, _WheelLoop._debug_run): it measures each, as
        # the base loop measures its callbacks, so that a slow-callback warning names
        # the slow timer, not the pass (issue 28, finding 11).
        # (An entry: this module does not know the loop's handle class.)
        self.loop_debug_run: Callable[[WheelEntry], bool] | None = None
        if max_concurrency is not None:
            self.pool = WorkerPool(self, max_concurrency, backend)

    # -- the flags, set through these by the rooms that decide them ------------------

    def start_draining(self) -> None:
        """``aclose(drain=True)`` began (``Timer.aclose``)."""
        self.draining = True

    def close_for_good(self) -> None:
        """The close began (``_shutdown.close_engine``, ``_shutdown.abort_start``):
        every later filing is refused, and the driver is armed for nothing."""
        self.closed = True
        self.wake_at = _INF

    def mark_broken(self, exc: BaseException) -> None:
        """The wheel raised ``exc`` (``_shutdown.break_engine``): what every later call
        says."""
        self.broken = exc

    def drop_trace(self) -> None:
        """No trace rows after all (``_shutdown.abort_start``: the recorder did not
        open)."""
        self.tracing = None

    def waiter_registered(self) -> None:
        """Someone now waits (``Waiters``: on a handle, for room, for the drain), so a
        cancel must tell the waiters (``notify_cancel``, recomputed by ``cancel``)."""
        self.notify_cancel = True

    def set_loop_debug(self, debug: bool) -> None:
        """The drop-in loop's debug mode (``_WheelLoop.set_debug``, ``_loop.py``)."""
        self.loop_debug = debug

    def set_loop_debug_run(self, run: Callable[[WheelEntry], bool]) -> None:
        """How the pass runs the drop-in loop's handles in debug mode
        (``_WheelLoop._debug_run``, ``_loop.py``)."""
        self.loop_debug_run = run

    # -- the named rules ------------------------------------------------------------

    def admit(self) -> None:
        """Admission: ``TimerFull`` when one more pending timer would pass the bound.
        (Inline copy, tagged: ``Timer.schedule_nowait``.)"""
        if self.pending >= self.limit:
            raise full(self.pending, self.limit)

    def arm_if_earlier(self, when: float) -> None:
        """Arm-if-earlier: a bucket that comes due before the armed wake-up moves it.
        (Inline copy, tagged: ``Timer.schedule_nowait``.)"""
        armed = self.wake_at
        if when < armed:
            self.wake_at = when
            try:
                self.driver.arm(when)
            except BaseException:
                # The driver kept its previous arming (AsyncioDriver.arm): so does
                # wake_at, and the next filing arms again (issue 28, finding 4).
                self.wake_at = armed
                raise

    def pending_fell(self) -> None:
        """Fewer timers pending: wake tasks waiting for room, and the drain (which
        re-checks: it may be running itself, on a worker) when nothing is left."""
        waiters = self.waiters
        if waiters.room:
            waiters.wake_room()
        if waiters.idle and not self.pending and self.pool.busy <= 1:
            waiters.wake_idle()

    def note_lateness(self, handle: TimerHandle[Any], now: float) -> None:
        """Lateness: the worst start time minus deadline. (Inline copy, tagged:
        ``run_due``.)"""
        lateness = now - handle.deadline
        if lateness > self.lateness_max:
            self.lateness_max = lateness

    # -- filing ---------------------------------------------------------------------

    def stamp(self, handle: TracedHandle[Any], label: str | None, now: float) -> None:
        # A new periodic handle: its label, and whether the trace keeps it (then what
        # its rows read, but its level: file sets it, and each later period sets
        # scheduled_at again).
        tracing = self.tracing
        tracer: Tracer | None = None
        timer_id = 0
        if tracing is not None and tracing.pick():
            tracer, timer_id = tracing, tracing.seen
        handle._stamp(tracer, timer_id, label, now)

    # -- the counters: the methods that change them (docs/design.md, "Accounting") ------
    # Every other room changes them through these methods. The two hot paths of
    # Timer (schedule_nowait and cancel) keep inline copies, each tagged with the
    # method it copies. Each is `+=`/`-=` only: they commute with a re-entrant change
    # made meanwhile by a finalizer (docs/design.md, "Re-entrancy").

    def reserve_slot(self) -> None:
        """A new pending timer: one more pending, one more scheduled."""
        self.pending += 1
        self.scheduled += 1

    def release_slot(self) -> None:
        """Undo ``reserve_slot``: the timer it counted never became pending."""
        self.pending -= 1
        self.scheduled -= 1

    def count_cancelled(self, count: int = 1) -> None:
        """``count`` pending timers were cancelled."""
        self.pending -= count
        self.cancelled += count

    def count_ran(self) -> None:
        """A pending timer's callback starts: one fewer pending, one more fired.
        (Inline copy, tagged: ``_pass.run_due``, which adds up ``fired`` in a local.)"""
        self.pending -= 1
        self.fired += 1

    def count_closed(self, count: int) -> None:
        """The close cancelled the ``count`` timers still pending: none is left."""
        self.cancelled += count
        self.pending = 0

    def count_fired_as_cancelled(self) -> None:
        """A drop-in loop's handle counted fired (``count_ran``) whose callback was not
        called after all: cancelled from another thread before it ran
        (``_loophandle.run_in_pass``)."""
        self.fired -= 1
        self.cancelled += 1

    def count_failed(self) -> None:
        """A callback raised (in the pass, ``_pass.callback_failed``; on a worker,
        ``_job_failed``), or its job stopped the program (``_job_ended``)."""
        self.failed += 1

    def file(self, handle: TimerHandle[Any], deadline: float, due: bool, *, new: bool) -> None:
        """File a handle that is in no bucket, count it if it is a new pending timer,
        and move the driver's wake-up earlier if its bucket comes due first."""
        wheel = self.wheel
        when = wheel.insert_due(handle, deadline) if due else wheel.insert(handle, deadline)
        if when != when:
            # NaN: a finalizer re-armed the handle while this call filed it (Wheel._file);
            # that later re-arm filed and counted it, and stands.
            return
        if self.closed:
            self.closed_while_filing(handle, new)
        if new:
            self.reserve_slot()
        if isinstance(handle, TracedHandle):
            handle._note_level()
        self.arm_if_earlier(when)

    def closed_while_filing(self, handle: TimerHandle[Any], new: bool) -> NoReturn:
        """*Closed while filing*: an allocation while filing ``handle`` (the handle
        itself, a level, the heap's tuple) ran the garbage collector, and a finalizer
        or a gc.callbacks hook closed the timer (docs/design.md, "Re-entrancy"). The
        call fails with TimerClosed, and the counters stay exact: nothing is pending
        on a closed timer. (Inline copy: ``Timer.schedule_nowait``.)"""
        self.take_back(handle, new)
        handle._become_cancelled()
        raise self._closed_error()

    def take_back(self, entry: WheelEntry, new: bool) -> None:
        """The counters of *closed while filing* (``closed_while_filing``, and
        ``_loophandle._closed_while_filing`` for the drop-in loop's handles): ``entry`` leaves
        the closed timer's wheel, counted cancelled exactly once."""
        if entry._bucket is not None:
            self.wheel.remove(entry)  # filed in the closed timer's wheel: take it back
            if not new:
                self.cancelled += 1  # it was pending, out of the close's reach
        elif new:
            self.cancelled -= 1  # the close took it before this call counted it

    def rearm(self, handle: TimerHandle[Any], deadline: float) -> None:
        """``reset()``/``reset_at()`` past the fast path, at a valid deadline.

        Two verbs, as tokio's: extend in place (``Wheel.extend``: a pending handle
        moved later, or earlier within the wheel) or re-file (a handle that fired, was
        cancelled or waits in the run queue, or is due at once); ``move`` chooses.
        Admission first: nothing changes unless the whole re-arm can be done. The
        levels first, once, here: creating one may run finalizers that change the
        handle, so its state is read only after (``move``, ``PeriodicHandle._rearm``)."""
        self.wheel.reserve(deadline)
        if self.closed:
            raise self._closed_error()  # the collector ran, and user code closed the timer
        if isinstance(handle, PeriodicHandle):
            handle._rearm(deadline)
            return
        if handle._bucket is None:
            self.admit()
        self.move(handle, deadline)

    def move(self, handle: TimerHandle[Any], deadline: float) -> None:
        """Re-file a handle at a valid deadline, wherever it is now. Cannot fail.

        Re-entrancy: the caller (``rearm``) created the levels the filing needs first
        (an allocation may run the garbage collector, whose finalizers may re-arm this
        very handle); the state is read here, after that, and the old result or
        awaitable, whose finalizer may re-enter, is released only once the handle is
        filed and counted."""
        now = self.clock()
        bucket: object = handle._bucket
        due = deadline <= now
        if bucket is None:
            # Fired or cancelled: a new pending period starts.
            old = handle._become_pending()
            if isinstance(handle, TracedHandle):
                handle._restamp(now)
            self.file(handle, deadline, due, new=True)
            release(old)  # its finalizer may run now: the handle is filed and counted
            return
        if bucket is self.pool.queue:
            self.pool.queue.remove(handle)
            old = handle._become_pending()
            self.file(handle, deadline, due, new=False)
            close_awaitable(old)  # user code (a coroutine's finally): last
            return
        if not due:
            when = self.wheel.extend(handle, deadline)
            if isinstance(handle, TracedHandle):
                handle._note_level()
            self.arm_if_earlier(when)
            return
        self.wheel.remove(handle)
        self.file(handle, deadline, due, new=False)

    def cancel(self, handle: TimerHandle[Any]) -> bool:
        """Cancel: unlink a pending handle and count it. (Inline copy, tagged:
        ``TimerLifecycle._cancel``, the hot path.)"""
        bucket = handle._bucket
        if bucket is None:
            return False
        bucket.remove(handle)
        previous = handle._become_cancelled()
        self.count_cancelled()
        if bucket._first is None or previous is not _PENDING or self.notify_cancel:
            self.after_cancel(handle, bucket, previous)
        if isinstance(handle, TracedHandle):
            handle._trace_cancelled()  # as TracedHandle.cancel does
        return True

    def after_cancel(self, handle: TimerHandle[Any], bucket: Bucket, previous: Any) -> None:
        """The rare part of a cancel: the bucket the driver waits for emptied, an async
        callback queued for a worker (its coroutine must be closed), or someone
        waiting."""
        queue: object = self.pool.queue  # also a handle's container (a RunQueue)
        if bucket is queue:
            pass  # its awaitable is closed last, below (user code)
        elif bucket._first is None and bucket.time == self.wake_at:
            # The driver was armed for the bucket this cancel emptied: re-arm it for
            # the next occupied bucket instead of waking for nothing. On asyncio that
            # costs a handle cancel and a call_at, so the driver defers it to one check
            # per loop iteration (still before any timer of that iteration): a loop of
            # schedule + cancel on an otherwise idle timer re-arms once, not each time.
            self.request_recheck()
        if self.waiters.handles:
            self.waiters.settle(handle, _CANCELLED)
        self.pending_fell()
        self.notify_cancel = self.waiters.any()
        if bucket is queue:
            # A coroutine's close() runs its finally blocks: user code, which may
            # re-arm the handle; the cancel is complete by now.
            close_awaitable(previous)

    # -- waking the driver ----------------------------------------------------------

    def sync_wakeup(self) -> None:
        """Point the driver at the wheel's earliest occupied bucket (or nowhere)."""
        when = self.wheel.next_expiry()
        if when is None:
            self.wake_at = _INF
            self.driver.disarm()
        else:
            armed = self.wake_at
            self.wake_at = when
            try:
                self.driver.arm(when)
            except BaseException:
                self.wake_at = armed  # the driver kept that arming (see arm_if_earlier)
                raise

    def sync_wakeup_unless_passing(self) -> None:
        # A pass in progress re-arms at its end anyway. Not `wake_at != -inf`: a timer
        # filed as due meanwhile arms -inf too, and on trio a re-check's wake-up is the
        # only one coming (the driver's one cancel scope carries both), so skipping
        # the re-arm then stranded the due timer and every later one (found by
        # tests/test_fault_model.py; fixed program there).
        if not self.closed and not self.passing:
            self.sync_wakeup()

    def request_recheck(self) -> None:
        """A cancel emptied the bucket the driver is armed for: one deferred re-check
        (``wakeup_after_cancel``), unless one is queued already. The driver coalesces
        too, but asking it is a call through its protocol and a bound method, a fifth
        of a drop-in ``call_at`` and its ``cancel`` in a loop of timeouts, where every
        block's cancel empties the armed bucket (docs/design.md, "Eager O(1) cancel")."""
        if not self.recheck_queued:
            self.driver.recheck(self.wakeup_after_cancel)
            self.recheck_queued = True  # after: a driver that refused queued nothing

    def wakeup_after_cancel(self) -> None:
        """The deferred re-check after a cancel emptied the bucket the driver is armed
        for (``after_cancel``; a drop-in loop handle's cancel, ``_loophandle.py``):
        point the driver at the earliest occupied bucket, unless it is armed for that
        one still. That is the common case of a loop of timeouts (each block's
        deadline cancelled as it ends, the next block's filed in the same tick before
        the re-check runs): on asyncio, a re-arm is a ``call_at`` and a ``cancel`` on
        the base loop, as much as the block's own timer costs there. The driver says
        whether it is armed (``Driver.armed_for``): trio's re-check moves its one
        deadline, so there it never is, and the re-check re-arms."""
        self.recheck_queued = False
        if self.closed or self.passing:
            return
        when = self.wheel.next_expiry()
        if when is not None and when == self.wake_at and self.driver.armed_for(when):
            return
        self.sync_wakeup()

    def to_worker(self, handle: TimerHandle[Any], awaitable: Any, context: Context) -> None:
        """The callback returned an awaitable: queue it for a worker, still pending;
        it is stepped in ``context``, the copy its call ran in."""
        self.fired -= 1  # it fires when a worker starts it
        self.pending += 1
        self.pool.submit(handle, awaitable, context)

    def report(self, handle: TimerHandle[Any], exc: BaseException) -> None:
        try:
            result = self.on_error(handle, exc)
        except _EXIT:
            raise
        except BaseException:
            logger.exception("on_error raised while reporting an error of %r", handle)
            return
        if result is not None and hasattr(type(result), "__await__"):
            # An async on_error that got past the constructor's check (a lambda or a
            # partial around one): nothing would ever await it, so the callback's
            # error would vanish behind a "never awaited" warning. Log it instead.
            close_awaitable(result)
            logger.error(
                "on_error returned an awaitable; %s. The error of %r was:",
                ASYNC_ON_ERROR,
                handle,
                exc_info=exc,
            )

    # -- the worker pool's host (_dispatch.WorkerPool) --------------------------------

    def _job_started(self, handle: TimerHandle[Any]) -> None:
        """A worker took ``handle`` from the queue (it is no longer pending)."""
        self.pending -= 1
        self.fired += 1
        if isinstance(handle, PeriodicHandle):
            handle._begin()
        now = self.clock()
        self.note_lateness(handle, now)
        if isinstance(handle, TracedHandle):
            handle._trace_fired(now)
        if self.waiters.room:
            self.waiters.wake_room()

    def _job_failed(self, handle: TimerHandle[Any], exc: BaseException) -> None:
        """The job raised ``exc`` (reported to ``on_error``)."""
        self.count_failed()
        self.report(handle, exc)

    def _job_ended(self, handle: TimerHandle[Any], outcome: Any, *, last: bool) -> None:
        """The job finished with ``outcome`` (a value or a ``_Failure``); ``last``: no
        other run of the same handle is still running."""
        if isinstance(outcome, _Failure) and isinstance(outcome.exc, _EXIT):
            self.count_failed()
        if isinstance(handle, PeriodicHandle):
            handle._end()  # the next period, before the settling below
        # A handle re-armed while it ran may have a newer run still going, or be
        # pending again: then wait() waits for that one (the newest firing).
        if last and handle._bucket is None:
            handle._settle_if_running(outcome)
            if self.waiters.handles:
                self.waiters.settle(handle, outcome)
        self.pending_fell()

    def _job_stopped(self, handle: TimerHandle[Any]) -> None:
        """The job was cancelled while running: aclose() cancelled the worker and
        already settled the handle as cancelled-while-running; anything else
        cancelling a worker is treated the same way."""
        if isinstance(handle, PeriodicHandle):
            handle._worker_stopped()  # the close stopped it
        stopped = _Failure(TimerCancelled(f"{handle!r} was cancelled while running"))
        if handle._settle_if_running(stopped):
            self.waiters.settle(handle, stopped)

    # -- introspection (Timer.stats, Timer.next_deadline) ---------------------------

    def snapshot(self, levels: int) -> TimerStats:
        """The counters now; ``levels``: the wheels in use (the owner's count once the
        wheel is gone)."""
        return TimerStats(
            pending=self.pending,
            scheduled=self.scheduled,
            fired=self.fired,
            cancelled=self.cancelled,
            failed=self.failed,
            levels=levels,
            lateness_max=self.lateness_max,
            # The pool outlives aclose() while its last jobs finish (the one that called
            # aclose() runs to its end): count what really runs.
            running=self.pool.busy,
            workers=self.pool.workers,
            wakeups=self.wakeups,
        )

    def next_deadline(self) -> float | None:
        """The earliest occupied bucket's deadline; now if one is already due; None
        when nothing is filed."""
        when = self.wheel.next_expiry()
        return self.clock() if when == -_INF else when
