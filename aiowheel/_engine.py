"""The engine: what runs a started timer between ``__aenter__`` and ``aclose()``.

``Timer`` (``_timer.py``) validates, admits and owns the lifecycle; the engine owns
everything that happens once a timer is filed (docs/design.md, "Module map"):

* the parts: the wheel (``_wheel.py``), the driver that wakes it (``_driver.py``) and
  the worker pool of async callbacks (``_dispatch.py``; its host is this class, typed
  as itself so that compiled, the pool's calls are native);
* the counters (docs/design.md, "Accounting") and the driver's wake-up;
* filing and re-filing: ``file``, ``move``, ``rearm``; the periodic timers' slots
  are ``Periodics``' (``_periodic.py``);
* the pass: ``fire_due`` (the driver's callback) advances the wheel, ``run_due`` is a
  short loop over what it hands back, and ``run_one`` runs one callback: the only
  place where the pass calls one (but ``run_due``'s inline copy, tagged, for a plain
  callback on an untraced timer), next to ``callback_failed``, where its exception
  rules live (``WorkerPool._run`` applies the same rules to jobs);
* the drain wake-up (the waiting tasks are ``Waiters``', ``_waiters.py``). Closing
  (``close``; ``break_`` when the wheel itself raised) is ``_shutdown.py``'s, the
  self-check (``check``, for tests) ``_selfcheck.py``'s. Tracing is ``_tracing.py``'s:
  the engine calls its ``Tracer`` where a traced timer ends.

The engine needs no task group: the driver arms a wake-up and calls ``fire_due``, a
plain method; the owner builds the pool (which may need one) and assigns ``pool``
(``Timer._new_engine``; the task groups of ``async with`` are ``_host.py``'s).

The rules copied into hot paths (``Timer.schedule_nowait``, ``Timer._cancel``, the
handle's inline ``reset``) are named here once; each inline copy is tagged with the
name of its rule: *arm-if-earlier* (``arm_if_earlier``), *admission* (``admit``), the
*drain wake-up* (``pending_fell``), *lateness* (``note_lateness``), the *cancel*
(``cancel``), the *lazy extend* (``Wheel.extend``), the
*owner check* (``Affinity.here``, ``_affinity.py``), *closed while filing*
(``closed_while_filing``) and *run one* (``run_one``).

Re-entrancy (docs/design.md, "Re-entrancy"): no user code, finalizers included, runs
between deciding a linked-list change and completing it. Each method below that
changes a bucket says where it releases what it replaced.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast, final

import anyio

from ._affinity import affinity_for
from ._checks import full
from ._dispatch import close_awaitable
from ._driver import Backend, Driver
from ._exceptions import TimerCancelled
from ._handle import (
    _CANCELLED,
    _PENDING,
    _RUNNING,
    TimerHandle,
    TracedHandle,
    _Failure,
    release,
    without_frame,
)
from ._loophandle import LoopTimerHandle, run_in_pass
from ._periodic import PeriodicHandle, Periodics
from ._shutdown import break_engine, close_engine
from ._tracing import Tracer
from ._waiters import Waiters
from ._wheel import DUE_LEVEL, Bucket, Wheel, WheelEntry

if TYPE_CHECKING:
    from ._dispatch import WorkerPool
    from .trace import TraceRecorder

__all__ = ["Engine", "TimerStats"]

logger: Final = logging.getLogger("aiowheel")

_INF: Final = math.inf
_EXIT: Final = (SystemExit, KeyboardInterrupt)
ASYNC_ON_ERROR: Final = (
    "the timer calls on_error inside its pass, which never awaits: pass a plain "
    "function (it may start a task for async work)"
)


@dataclass(frozen=True, slots=True)
class TimerStats:
    """A snapshot of a timer's counters (``Timer.stats()``, ``Engine.snapshot``): they
    live here, beside the only class that writes them."""

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
    """The running parts and the accounting of one started timer."""

    # Assigned by the owner once the engine exists (the pool's host is the engine).
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
    ) -> None:
        # What differs between event loops is the backend's (aiowheel/_driver.py); its
        # clock and loop are copied here for the hot paths.
        self.backend = backend
        self.clock: Callable[[], float] = backend.clock
        self.loop: asyncio.AbstractEventLoop | None = backend.loop
        # The owner check's thread and loop (the owner starts the engine in its thread).
        self.affinity = affinity_for(self.loop, backend.name)
        self.wheel = Wheel(tick, wheel_size, self.clock())
        self.driver: Driver = backend.make_driver(self.fire_due)
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
        self.loop_timers = False
        # That loop's debug mode (its get_debug()), kept here by its set_debug: the
        # loop's compiled call_at and LoopTimerHandle.cancel read one attribute, not a
        # Python method per timer (aiowheel/_loop.py, _WheelLoop.set_debug).
        self.loop_debug = False
        # In debug mode the pass runs each of the loop's handles through this, the
        # loop's own (aiowheel/_loop.py, _WheelLoop._debug_run): it measures each, as
        # the base loop measures its callbacks, so that a slow-callback warning names
        # the slow timer, not the pass (issue 28, finding 11).
        self.loop_debug_run: Callable[[LoopTimerHandle[Any]], None] | None = None

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
        lateness = now - handle._deadline
        if lateness > self.lateness_max:
            self.lateness_max = lateness

    # -- filing ---------------------------------------------------------------------

    def stamp(self, handle: TracedHandle[Any], label: str | None, now: float) -> None:
        # A new periodic handle: its label, and whether the trace keeps it (then what
        # its rows read, but its level: file sets it, and each later period sets
        # scheduled_at again).
        tracing = self.tracing
        if tracing is not None and tracing.pick():
            tracing.adopt(handle, label, now)
            return
        handle._label = label
        handle._scheduled_at = now
        handle._id = 0

    # -- the counters: their one writer (docs/design.md, "Accounting") ------------------
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

    def count_closed(self, count: int) -> None:
        """The close cancelled the ``count`` timers still pending: none is left."""
        self.cancelled += count
        self.pending = 0

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
            handle._level = _level_of(handle)
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
        handle, so its state is read only after (``move``, ``Periodics.rearm``)."""
        self.wheel.reserve(deadline)
        if self.closed:
            raise self._closed_error()  # the collector ran, and user code closed the timer
        if isinstance(handle, PeriodicHandle):
            self.periodics.rearm(handle, deadline)
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
                handle._scheduled_at = now
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
                handle._level = _level_of(handle)
            self.arm_if_earlier(when)
            return
        self.wheel.remove(handle)
        self.file(handle, deadline, due, new=False)

    def cancel(self, handle: TimerHandle[Any]) -> bool:
        """Cancel: unlink a pending handle and count it. (Inline copy, tagged:
        ``Timer._cancel``, the hot path.)"""
        bucket = handle._bucket
        if bucket is None:
            return False
        bucket.remove(handle)
        previous = handle._become_cancelled()
        self.count_cancelled()
        if bucket._first is None or previous is not _PENDING or self.notify_cancel:
            self.after_cancel(handle, bucket, previous)
        if isinstance(handle, TracedHandle) and handle._tracer is not None:
            handle._tracer.cancelled_now(handle)  # as TracedHandle.cancel does
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
            self.driver.recheck(self.sync_wakeup_unless_passing)
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
        # The deferred re-check after a cancel emptied the armed bucket; a pass in
        # progress re-arms at its end anyway. Not `wake_at != -inf`: a timer filed as
        # due meanwhile arms -inf too, and on trio the re-check's wake-up is the only
        # one coming (the driver's one cancel scope carries both), so skipping the
        # re-arm then stranded the due timer and every later one (found by
        # tests/test_fault_model.py; fixed program there).
        if not self.closed and not self.passing:
            self.sync_wakeup()

    # -- the pass -------------------------------------------------------------------

    def fire_due(self) -> None:
        """Advance the wheel to now and run what expired. Called by the driver.

        Raises nothing but ``SystemExit``/``KeyboardInterrupt``, and whatever it raises
        the driver is re-armed on the way out."""
        if self.closed:
            return
        self.wake_at = -_INF
        self.passing = True
        self.wakeups += 1
        try:
            now = self.clock()
            buckets = self.wheel.advance(now)
            if self.loop_timers and buckets:
                buckets = self.wheel.in_order(buckets)  # the loop's rule: when order
        except BaseException as exc:
            self.wake_at = _INF
            self.passing = False
            if isinstance(exc, _EXIT):
                # An interrupt (on the pure core it may arrive at any bytecode of
                # advance) is not a fault of the wheel: put it back together, re-arm
                # and let the interrupt go; the timer goes on if the loop does.
                self.wheel_interrupted()
                raise
            self.break_(exc)
            return
        try:
            if buckets:
                self.run_due(buckets, now)
        finally:
            self.wake_at = _INF
            self.passing = False
            if not self.closed:
                try:
                    self.wheel.release()  # what the pass did not reach: filed again
                    self.sync_wakeup()
                except _EXIT:
                    self.wheel_interrupted()  # as above
                    raise
                except BaseException as exc:
                    self.break_(exc)
            self.pending_fell()

    def wheel_interrupted(self) -> None:
        """``SystemExit``/``KeyboardInterrupt`` stopped the wheel half-way through a
        pass (``Wheel.recover``'s invariant lets it find every pending entry): make it
        whole, file every entry again, re-arm. Only if that fails too is the timer
        broken (``break_``)."""
        try:
            self.wheel.recover()
            self.sync_wakeup()
        except BaseException as exc:
            self.break_(exc)

    def run_due(self, buckets: list[Bucket], now: float) -> None:
        """Run every handle of the expired ``buckets``, one at a time off the front: a
        callback may cancel or re-arm later handles of a bucket, which unlinks them."""
        # The common counts are kept in locals and written once, at the end (run_one
        # writes only the rare ones: a failure, a callback queued for a worker).
        fired = 0
        lateness_max = self.lateness_max
        index = 0
        # A handle without a trace row to write runs in the inline copy of run_one
        # below (a call per callback is a tenth of its cost): every handle of an
        # untraced timer (for the whole pass: tracing only ever stops), and on a
        # sampled one the handles the sample left plain.
        traced = self.tracing is not None
        # Declared here so that `finally` can drop them: a stored exception's traceback
        # keeps this frame alive, and the frame must not keep the last handle alive.
        handle: TimerHandle[Any] | None = None
        result: Any = None
        context: Any = None  # the copy a callback runs in (run_one)
        try:
            for index, bucket in enumerate(buckets):  # noqa: B007 - used after the loop
                while True:
                    # Release the previous handle and result here, between two handles:
                    # dropping the last reference may run a finalizer (user code), which
                    # must not run between the pop below and the count (re-entrancy).
                    handle = entry = result = context = None
                    entry = bucket.pop_first()
                    if entry is None:
                        break
                    if not isinstance(entry, TimerHandle):
                        # A drop-in loop's call_at handle: its lateness counts as a
                        # timer's (stats().lateness_max).
                        lateness = self.run_loop_entry(entry, now)
                        if lateness > lateness_max:
                            lateness_max = lateness
                        continue
                    handle = entry  # the timer files only these (and loop handles, above)
                    self.pending -= 1
                    fired += 1
                    lateness = now - handle._deadline  # inline copy of note_lateness
                    if lateness > lateness_max:
                        lateness_max = lateness
                    if traced and isinstance(handle, TracedHandle):
                        self.run_one(handle, now)
                        continue
                    # Inline copy of run_one (the *run one* rule), but the trace row.
                    try:
                        context = handle._run_context()  # never run in a snapshot
                        if handle._args:
                            result = context.run(handle._callback, *handle._args)
                        else:
                            result = context.run(handle._callback)
                    except BaseException as exc:
                        result = self.callback_failed(handle, exc)
                    else:
                        if result is not None and hasattr(type(result), "__await__"):
                            handle._context = context  # its worker steps it there
                            self.to_worker(handle, result)
                            continue
                        if handle._bucket is None:
                            handle._result = result  # inline copy of TimerHandle._settle
                    if self.waiters.handles:
                        self.waiters.settle(handle, result)
        except BaseException as exc:
            self.pass_stopped(buckets[index:], exc)
        finally:
            self.fired += fired
            self.lateness_max = lateness_max
            handle = entry = result = context = None

    def run_loop_entry(self, entry: WheelEntry, now: float) -> float:
        """Run a drop-in loop's ``call_at`` handle the pass popped
        (aiowheel/_loophandle.py, ``run_in_pass``: ``Handle._run``'s rules); return
        its lateness, ``-inf`` when it did not run. Counted before it runs: it may
        raise (SystemExit, KeyboardInterrupt)."""
        self.pending -= 1
        if cast("LoopTimerHandle[Any]", entry)._args is None:
            # Cancelled from another thread, its unlink still queued
            # (LoopTimerHandle.cancel): counted as the cancel it is.
            self.cancelled += 1
            return -_INF
        self.fired += 1
        lateness = now - entry._deadline
        run_in_pass(self, entry)
        return lateness

    def run_one(self, handle: TimerHandle[Any], now: float) -> None:
        """*Run one* expired handle (popped, counted fired, no longer pending): the
        only place where the pass calls a callback (``run_due`` keeps an inline copy,
        tagged, for an untraced timer). A callback that returns an awaitable is queued
        for a worker, still pending; its exceptions go to ``callback_failed``."""
        tracer: Tracer | None = None
        if self.tracing is not None and isinstance(handle, TracedHandle):
            tracer = handle._tracer
            if tracer is not None:
                # The trace row describes this firing: read it before the callback
                # runs, since a callback may re-arm its own handle.
                row_id = handle._id
                row_label = handle._label
                row_scheduled_at = handle._scheduled_at
                row_deadline = handle._deadline
                row_level = handle._level
        args = handle._args
        outcome: Any = None
        result: Any = None
        context: Any = None
        try:
            try:
                # In a copy of the context captured at schedule time (loop.call_later's
                # rule): that one may be a snapshot shared with other handles, never
                # run in (aiowheel/_handle.py, snapshot_context), so each run starts
                # from it and what the callback sets stays its own. A periodic
                # handle's context is its own: run in directly, so a run sees what the
                # last one set. Without arguments, no tuple is built for the call.
                context = handle._run_context()
                if args:
                    result = context.run(handle._callback, *args)
                else:
                    result = context.run(handle._callback)
            except BaseException as exc:
                outcome = self.callback_failed(handle, exc)
            else:
                if result is not None and hasattr(type(result), "__await__"):
                    # Its worker steps it in the copy its call ran in.
                    handle._context = context
                    self.to_worker(handle, result)
                    return
                outcome = result
                if handle._bucket is None:
                    handle._settle(result)
            if self.waiters.handles:
                self.waiters.settle(handle, outcome)
            if tracer is not None:
                tracer.fired(row_id, row_label, row_scheduled_at, row_deadline, row_level, now)
        finally:
            # A stored exception's traceback keeps this frame alive (the callback's
            # frame links back to it), and the frame must not keep the handle, its
            # arguments or its outcome alive with it (pure Python; compiled functions
            # have no frame).
            tracer = outcome = result = context = None
            del handle, args

    def callback_failed(self, handle: TimerHandle[Any], exc: BaseException) -> _Failure:
        """The pass's exception rules, as in ``WorkerPool._run``: a callback's
        exception, ``CancelledError`` and ``GeneratorExit`` included, is its failure
        alone (reported to ``on_error``; returned, the handle's outcome);
        ``SystemExit`` and ``KeyboardInterrupt`` settle the handle and propagate."""
        self.failed += 1
        outcome = _Failure(without_frame(exc))
        if handle._bucket is None:  # unless it re-armed itself
            handle._settle(outcome)
        if isinstance(exc, _EXIT):
            # Settle this one, then let it stop the loop (run_due re-files the rest).
            self.waiters.settle(handle, outcome)
            raise exc
        try:
            self.report(handle, exc)  # on_error may re-arm the handle
        except _EXIT:
            self.waiters.settle(handle, outcome)  # on_error's SystemExit...
            raise
        return outcome

    def to_worker(self, handle: TimerHandle[Any], awaitable: Any) -> None:
        """The callback returned an awaitable: queue it for a worker, still pending."""
        self.fired -= 1  # it fires when a worker starts it
        self.pending += 1
        self.pool.submit(handle, awaitable)

    def pass_stopped(self, rest: list[Bucket], exc: BaseException) -> None:
        """``exc`` stopped the pass (SystemExit/KeyboardInterrupt from a callback or
        on_error, or a fault): put back what it did not get to, so nothing pending is
        lost, and let an exit go on; anything else is logged, and the rest fires on
        the next pass. Called in the ``except`` block (the log has the traceback)."""
        self.refile(rest)
        if isinstance(exc, _EXIT):
            raise exc
        logger.exception("aiowheel: the pass stopped early; the rest fires next pass")

    def refile(self, buckets: list[Bucket]) -> None:
        # One at a time: each entry stays linked (pending, findable by aclose) until
        # it is filed again.
        wheel = self.wheel
        for bucket in buckets:
            entry = bucket.pop_first()
            while entry is not None:
                wheel.insert(entry, entry._deadline)
                entry = bucket.pop_first()

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
            self.periodics.begin(handle)
        now = self.clock()
        self.note_lateness(handle, now)
        if isinstance(handle, TracedHandle) and handle._tracer is not None:
            handle._tracer.fired_handle(handle, now)
        if self.waiters.room:
            self.waiters.wake_room()

    def _job_failed(self, handle: TimerHandle[Any], exc: BaseException) -> None:
        """The job raised ``exc`` (reported to ``on_error``)."""
        self.failed += 1
        self.report(handle, exc)

    def _job_ended(self, handle: TimerHandle[Any], outcome: Any, *, last: bool) -> None:
        """The job finished with ``outcome`` (a value or a ``_Failure``); ``last``: no
        other run of the same handle is still running."""
        if isinstance(outcome, _Failure) and isinstance(outcome.exc, _EXIT):
            self.failed += 1
        if isinstance(handle, PeriodicHandle):
            self.periodics.end(handle)  # the next period, before the settling below
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
            handle._in_run = False  # the close stopped it
        if handle._result is _RUNNING:
            stopped = _Failure(TimerCancelled(f"{handle!r} was cancelled while running"))
            handle._settle(stopped)
            self.waiters.settle(handle, stopped)

    # -- closing (aiowheel/_shutdown.py) --------------------------------------------

    def close(self) -> list[TimerHandle[Any]]:
        """Close for good (``close_engine``): after it, nothing is pending and nobody
        waits. Returns the cancelled handles in deadline order."""
        return close_engine(self)

    def break_(self, exc: BaseException) -> None:
        """The wheel raised (``break_engine``): close, and make every later call say
        why."""
        break_engine(self, exc)

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

    # -- self-check (tests; aiowheel/_selfcheck.py) ------------------------------------

    def check(self) -> None:
        """Assert the counters against the wheel, the run queue and the periodic
        timers, then the wheel's own invariants (``check_engine``). For tests, between
        passes (not from inside a callback): O(pending)."""
        from ._selfcheck import check_engine  # test-only: not imported otherwise

        check_engine(self)


def _level_of(handle: TimerHandle[Any]) -> int:
    """The wheel the handle is filed in (-1: due at once)."""
    bucket = handle._bucket
    return bucket.level if bucket is not None else DUE_LEVEL
