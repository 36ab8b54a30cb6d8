"""The Timer: the wheel, a driver and a worker pool, behind the API of API.md.

Rooms:

* ``Wheel`` (``_wheel.py``) files handles and hands back expired buckets;
* the driver (``_driver.py``) calls ``Timer._pass`` when the earliest occupied bucket
  comes due;
* ``_pass`` advances the wheel and dispatches: plain callbacks run right there, like
  ``call_later`` callbacks; a callback that returns an awaitable (an async function)
  is queued for the worker pool, a bounded set of long-lived tasks that await them
  FIFO, at most ``max_concurrency`` at once.

The lock. Kafka holds a write lock while its reaper advances the wheel so that ``add``
never sees a half-advanced hierarchy. Here the event loop is that lock: ``advance`` is
synchronous and returns only once the hierarchy is consistent and every due bucket is
detached, and ``_pass`` never awaits. A callback that schedules or cancels while the
pass dispatches sees a finished wheel; the pass never has to suspend mid-flush to wait
for worker capacity, because expired async callbacks wait in the run queue (where they
still count as pending, so ``max_pending`` bounds them). The uncontended ``schedule``
therefore never suspends and never allocates a waiter.
"""

from __future__ import annotations

import logging
import math
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ._driver import backend_name, current_clock, loop_clock, make_driver
from ._exceptions import TimerCancelled, TimerClosed, TimerFull
from ._handle import (
    _CANCELLED,
    _PENDING,
    _RUNNING,
    PeriodicHandle,
    TimerHandle,
    TracedHandle,
    _Failure,
    check_delay,
)
from ._timeout import Timeout
from ._wheel import Bucket, Wheel

__all__ = ["Timer", "TimerStats", "TraceRecorder"]

logger = logging.getLogger("aiowheel")

T = TypeVar("T")
_INF = math.inf

# Lifecycle states.
_NEW, _RUNNING_STATE, _DRAINING, _CLOSED = range(4)

# Set in the timer's own tasks, so that aclose() called from one of them does not
# wait for itself.
_inside: ContextVar[object] = ContextVar("aiowheel_inside", default=None)
# The handle whose async callback the current worker task is running, and that
# worker's cancel scope.
_current: ContextVar[object] = ContextVar("aiowheel_current", default=None)
_worker_scope: ContextVar[anyio.CancelScope | None] = ContextVar(
    "aiowheel_worker_scope", default=None
)


@dataclass(frozen=True, slots=True)
class TimerStats:
    """A snapshot of a timer's counters (``Timer.stats()``)."""

    pending: int  #: timers not yet started, expired async callbacks waiting for a worker included
    scheduled: int  #: arms: schedules, re-arms of fired/cancelled handles, periodic runs
    fired: int  #: callbacks started (those that raised included)
    cancelled: int  #: timers cancelled while pending
    failed: int  #: callbacks that raised
    levels: int  #: wheels in use (overflow wheels are created on demand)
    lateness_max: float  #: worst start time minus deadline, seconds
    running: int = 0  #: async callbacks running on workers now
    workers: int = 0  #: worker tasks alive
    wakeups: int = 0  #: driver passes


class TraceRecorder(Protocol):
    """What a timer calls when it has a recorder (see ``aiowheel.trace``)."""

    def open(self, *, backend: str, clock: float) -> None:
        """The timer started; ``clock`` is its loop time now."""

    def record(
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        fired_at: float | None,
        cancelled_at: float | None,
    ) -> None:
        """One timer ended (fired or cancelled). Must not block."""

    def close(self) -> None:
        """Flush and close; called once, from a worker thread, when the timer closes."""


class _Waiter:
    """Tasks waiting in ``handle.wait()`` for one handle share one of these."""

    __slots__ = ("event", "outcome")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.outcome: Any = _PENDING


def _log_error(handle: TimerHandle[Any], exc: BaseException) -> None:
    logger.error("timer callback %r raised", handle, exc_info=exc)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    return value


class Timer:
    """A hierarchical timing-wheel timer on the running event loop.

    ``async with Timer() as timer:`` starts it (on asyncio, uvloop or trio); leaving
    the block closes it (``aclose()``).

    :param tick: resolution of the lowest wheel, in seconds (> 0). Callbacks never
        start before their deadline and at most one tick (plus the loop's own delay)
        after it.
    :param wheel_size: buckets per wheel (>= 2); coarser wheels are added on demand,
        so any finite delay is accepted.
    :param max_pending: bound on ``len(timer)`` (pending timers, expired async
        callbacks still waiting for a worker included), or None for no bound.
    :param max_concurrency: most async callbacks running at once.
    :param on_error: ``on_error(handle, exc)`` when a callback raises; by default the
        error is logged at ERROR on the ``"aiowheel"`` logger.
    :param recorder: a trace recorder (``aiowheel.trace.ParquetRecorder``) that gets one
        row per timer when it ends; a timer without one pays nothing for tracing.
    """

    def __init__(
        self,
        *,
        tick: float = 0.001,
        wheel_size: int = 64,
        max_pending: int | None = None,
        max_concurrency: int = 256,
        on_error: Callable[[TimerHandle[Any], BaseException], object] | None = None,
        recorder: TraceRecorder | None = None,
    ) -> None:
        if isinstance(tick, bool) or not isinstance(tick, int | float):
            raise TypeError(f"tick must be a number of seconds, got {tick!r}")
        if not (tick > 0 and math.isfinite(tick)):
            raise ValueError(f"tick must be a positive finite number of seconds, got {tick!r}")
        _check_int("wheel_size", wheel_size, 2)
        if max_pending is not None:
            _check_int("max_pending", max_pending, 1)
        _check_int("max_concurrency", max_concurrency, 1)
        if on_error is not None and not callable(on_error):
            raise TypeError(f"on_error must be callable, got {on_error!r}")
        self._tick = float(tick)
        self._wheel_size = wheel_size
        self._max_pending = max_pending
        self._limit = sys.maxsize if max_pending is None else max_pending
        self._max_concurrency = max_concurrency
        self._on_error = on_error if on_error is not None else _log_error
        self._recorder = recorder

        self._state = _NEW
        self._open = False  # accepting new timers (running or draining)
        self._backend = ""
        self._clock: Callable[[], float] = _not_started_clock
        self._wheel: Wheel | None = None
        self._driver: Any = None
        # When the driver is armed for; -inf during a pass (no re-arming from
        # callbacks: the pass re-arms once at its end), inf when idle.
        self._wake_at = _INF

        # Counters. _pending is exact at every moment (len(timer)).
        self._pending = 0
        self._scheduled = 0
        self._fired = 0
        self._cancelled = 0
        self._failed = 0
        self._lateness_max = 0.0
        self._wakeups = 0

        # Async callbacks: expired and waiting for a worker (still pending), running.
        self._runq = _RunQueue()
        self._running: dict[TimerHandle[Any], None] = {}
        self._parked: list[anyio.Event] = []
        self._nworkers = 0

        self._waiters: dict[TimerHandle[Any], _Waiter] = {}
        # True whenever any of the three waiter collections below may be non-empty
        # (set on every registration, recomputed lazily), so that handle.cancel()
        # checks one attribute instead of three.
        self._listening = False
        self._room_waiters: list[anyio.Event] = []
        self._idle_waiters: list[anyio.Event] = []
        self._periodic: set[PeriodicHandle] = set()
        self._last_id = 0  # trace rows number the timers from 1

        self._outer_tg: TaskGroup | None = None
        self._inner_tg: TaskGroup | None = None
        self._stopped: anyio.Event | None = None
        self._closing: anyio.Event | None = None
        self._worker_scopes: set[anyio.CancelScope] = set()

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Timer:
        if self._state != _NEW:
            raise RuntimeError("a Timer can be started only once")
        self._backend = backend_name()
        if self._backend == "trio":
            import trio

            self._clock = trio.current_time
        else:
            import asyncio

            self._clock = loop_clock(asyncio.get_running_loop())
        self._wheel = Wheel(self._tick, self._wheel_size, self._clock())
        self._driver = make_driver(self._backend, self._pass)
        self._stopped = anyio.Event()
        self._closing = anyio.Event()
        outer = anyio.create_task_group()
        await outer.__aenter__()
        self._outer_tg = outer
        try:
            await outer.start(self._supervise)
        except BaseException:
            await outer.__aexit__(*sys.exc_info())
            raise
        if self._recorder is not None:
            self._recorder.open(backend=self._backend, clock=self._clock())
        self._state = _RUNNING_STATE
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with anyio.CancelScope(shield=True):
            await self.aclose()
        outer = self._outer_tg
        assert outer is not None
        # Our tasks are finished, so the task group has nothing to wrap: the body's
        # exception, if any, propagates as itself rather than in an ExceptionGroup.
        await outer.__aexit__(None, None, None)
        return False

    async def _supervise(self, *, task_status: TaskStatus[None]) -> None:
        # The driver (on trio) and the workers (on trio) live in this inner task
        # group; the host task of ``async with`` is never cancelled by us. aclose()
        # stops the driver and cancels each worker's own scope (not the group's, so
        # that an async callback that calls aclose() is not cancelled by its own call),
        # then sets _closing, and the group ends once every child has returned.
        _inside.set(self)
        assert self._closing is not None
        try:
            async with anyio.create_task_group() as tg:
                self._inner_tg = tg
                if self._driver.needs_task:
                    await tg.start(self._driver.run)
                task_status.started()
                await self._closing.wait()
        finally:
            assert self._stopped is not None
            self._stopped.set()

    async def aclose(self, drain: bool = False) -> list[TimerHandle[Any]]:
        """Close the timer. ``drain=False``: cancel every pending timer and running async
        callback, return the cancelled handles in deadline order. ``drain=True``: stop
        periodic timers, wait until everything pending has fired and every callback has
        finished (timers scheduled meanwhile included), return ``[]``. Idempotent."""
        if self._state == _NEW:
            self._state = _CLOSED
            return []
        if self._state == _CLOSED:
            return []
        if drain and self._state == _RUNNING_STATE:
            self._state = _DRAINING
            for periodic in list(self._periodic):
                periodic.cancel()
            # Called from an async callback, that callback is one of the running
            # ones: do not wait for it (it is waiting for us).
            me = 1 if _current.get() in self._running else 0
            while (self._pending or len(self._running) > me) and self._state == _DRAINING:
                event = anyio.Event()
                self._idle_waiters.append(event)
                self._listening = True
                await event.wait()
        if self._state == _CLOSED:
            return []
        self._state = _CLOSED
        self._open = False
        self._driver.disarm()
        self._wake_at = _INF
        cancelled = self._cancel_everything()
        assert self._stopped is not None
        assert self._closing is not None
        self._driver.stop()
        own = _worker_scope.get()
        for scope in self._worker_scopes:
            if scope is not own:
                scope.cancel()
        self._closing.set()
        for parked in self._parked:
            parked.set()  # a parked worker sees the timer closed and returns
        for event in self._room_waiters + self._idle_waiters:
            event.set()
        self._room_waiters.clear()
        self._idle_waiters.clear()
        if _inside.get() is not self:
            await self._stopped.wait()
            await self._driver.join_workers()
        if self._recorder is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._recorder.close)
        return cancelled

    def _cancel_everything(self) -> list[TimerHandle[Any]]:
        assert self._wheel is not None
        handles: list[TimerHandle[Any]] = self._wheel.clear()
        for handle, _ in self._runq.items():
            handle._bucket = None
            _close_awaitable(handle._result)
            handles.append(handle)
        self._runq.clear()
        handles.sort(key=_deadline_of)
        now = self._clock()
        for handle in handles:
            handle._result = _CANCELLED
            if isinstance(handle, PeriodicHandle):
                handle._stop()
            self._settle(handle, _CANCELLED)
            if self._recorder is not None and isinstance(handle, TracedHandle):
                self._trace(handle, None, now)
        self._periodic.clear()
        self._cancelled += len(handles)
        self._pending = 0
        current = _current.get()
        for handle in self._running:
            if handle is current:
                continue  # the callback that called aclose() runs to its end
            # It started, so it stays fired(); its wait() raises TimerCancelled.
            outcome = _Failure(
                TimerCancelled(f"{handle!r} was cancelled by aclose() while running")
            )
            handle._result = outcome
            self._settle(handle, outcome)
        return handles

    # -- clock and introspection ----------------------------------------------------

    def time(self) -> float:
        """Now, on the running event loop's clock; every deadline is on this clock."""
        if self._state == _NEW or self._state == _CLOSED:
            return current_clock()()
        return self._clock()

    @property
    def tick(self) -> float:
        """Resolution of the lowest wheel, in seconds."""
        return self._tick

    @property
    def wheel_size(self) -> int:
        """Buckets per wheel."""
        return self._wheel_size

    @property
    def backend(self) -> str:
        """``"asyncio"``, ``"uvloop"`` or ``"trio"`` once started, ``""`` before."""
        return self._backend

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` has run (or started)."""
        return self._state == _CLOSED

    def __len__(self) -> int:
        """Pending timers, exact at every moment (expired async callbacks still
        waiting for a worker included)."""
        return self._pending

    def stats(self) -> TimerStats:
        """A snapshot of the counters; zeros on a timer that is not started."""
        return TimerStats(
            pending=self._pending,
            scheduled=self._scheduled,
            fired=self._fired,
            cancelled=self._cancelled,
            failed=self._failed,
            levels=self._wheel.levels if self._wheel is not None else 0,
            lateness_max=self._lateness_max,
            running=len(self._running),
            workers=self._nworkers,
            wakeups=self._wakeups,
        )

    def next_deadline(self) -> float | None:
        """When the driver next wakes (the earliest occupied bucket), or None."""
        if self._wheel is None or not self._open:
            return None
        when = self._wheel.next_expiry()
        if when == -_INF:
            return self._clock()
        return when

    def __repr__(self) -> str:
        state = ("new", "running", "draining", "closed")[self._state]
        return (
            f"<Timer {state} tick={self._tick} wheel_size={self._wheel_size} "
            f"pending={self._pending}>"
        )

    # -- scheduling -----------------------------------------------------------------

    def schedule_nowait(
        self, delay: float, callback: Callable[..., Any], *args: Any, label: str | None = None
    ) -> TimerHandle[Any]:
        """Run ``callback(*args)`` ``delay`` seconds from now; ``TimerFull`` at
        ``max_pending``. ``delay <= 0`` fires on the driver's next pass."""
        # The hot path: kept flat (no helper calls) on purpose; schedule_at_nowait
        # is the same with an absolute deadline.
        if not self._open:
            raise TimerClosed(self._closed_reason())
        try:
            finite = delay - delay == 0  # False for NaN and +-inf
        except TypeError:
            raise TypeError(f"delay must be a number of seconds, got {delay!r}") from None
        if not finite:
            raise ValueError(f"delay must be finite, got {delay!r}")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        if self._pending >= self._limit:
            raise TimerFull(f"{self._pending} timers pending (max_pending={self._limit})")
        if self._recorder is not None:
            now = self._clock()
            return self._add_traced(now + delay, now, callback, args, label)
        handle: TimerHandle[Any] = TimerHandle(self, callback, args)
        if delay > 0:
            when = self._wheel.insert(handle, self._clock() + delay)  # type: ignore[union-attr]
        else:
            # Due now: the next pass, not the next tick.
            when = self._wheel.insert_due(handle, self._clock() + delay)  # type: ignore[union-attr]
        self._pending += 1
        self._scheduled += 1
        if when < self._wake_at:
            self._arm(when)
        return handle

    def schedule_at_nowait(
        self, deadline: float, callback: Callable[..., Any], *args: Any, label: str | None = None
    ) -> TimerHandle[Any]:
        """Run ``callback(*args)`` at the absolute ``deadline`` (loop clock)."""
        if not self._open:
            raise TimerClosed(self._closed_reason())
        check_delay(deadline, "deadline")
        _check_callable(callback)
        if self._pending >= self._limit:
            raise TimerFull(f"{self._pending} timers pending (max_pending={self._limit})")
        if self._recorder is not None:
            return self._add_traced(float(deadline), self._clock(), callback, args, label)
        handle: TimerHandle[Any] = TimerHandle(self, callback, args)
        deadline = float(deadline)
        if deadline > self._clock():
            when = self._wheel.insert(handle, deadline)  # type: ignore[union-attr]
        else:
            when = self._wheel.insert_due(handle, deadline)  # type: ignore[union-attr]
        self._pending += 1
        self._scheduled += 1
        if when < self._wake_at:
            self._arm(when)
        return handle

    async def schedule(
        self, delay: float, callback: Callable[..., Any], *args: Any, label: str | None = None
    ) -> TimerHandle[Any]:
        """Like ``schedule_nowait``, but waits for room while ``max_pending`` is reached;
        the deadline is computed when the timer is admitted."""
        if self._pending >= self._limit and self._open:
            check_delay(delay)
            _check_callable(callback)
            await self._wait_for_room()
        return self.schedule_nowait(delay, callback, *args, label=label)

    async def schedule_at(
        self, deadline: float, callback: Callable[..., Any], *args: Any, label: str | None = None
    ) -> TimerHandle[Any]:
        """Like ``schedule_at_nowait``, waiting for room while ``max_pending`` is reached."""
        if self._pending >= self._limit and self._open:
            check_delay(deadline, "deadline")
            _check_callable(callback)
            await self._wait_for_room()
        return self.schedule_at_nowait(deadline, callback, *args, label=label)

    def _add_traced(
        self,
        deadline: float,
        now: float,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        label: str | None,
    ) -> TimerHandle[Any]:
        # Timers with a recorder get handles that carry what a trace row needs.
        handle: TracedHandle[Any] = TracedHandle(self, callback, args)
        self._last_id = handle._id = self._last_id + 1
        handle._label = label
        handle._scheduled_at = now
        wheel = self._wheel
        assert wheel is not None
        if deadline > now:
            when = wheel.insert(handle, deadline)
        else:
            when = wheel.insert_due(handle, deadline)
        handle._level = wheel_level(handle)
        self._pending += 1
        self._scheduled += 1
        if when < self._wake_at:
            self._arm(when)
        return handle

    def every(
        self,
        interval: float,
        callback: Callable[..., Any],
        *args: Any,
        fixed_rate: bool = True,
        label: str | None = None,
    ) -> PeriodicHandle:
        """Run ``callback(*args)`` every ``interval`` seconds, first at now + interval.

        ``fixed_rate=True`` keeps deadlines on the grid start + k*interval (missed
        periods are skipped, not bunched); ``fixed_rate=False`` waits ``interval``
        after each run finishes. Runs never overlap. ``cancel()`` stops it.
        """
        if self._state != _RUNNING_STATE:
            # While draining too: aclose(drain=True) has cancelled the periodic timers.
            raise TimerClosed(self._closed_reason())
        try:
            valid = interval > 0 and interval - interval == 0
        except TypeError:
            raise TypeError(f"interval must be a number of seconds, got {interval!r}") from None
        if not valid:
            raise ValueError(f"interval must be a positive finite number, got {interval!r}")
        _check_callable(callback)
        if self._pending >= self._limit:
            raise TimerFull(f"{self._pending} timers pending (max_pending={self._limit})")
        now = self._clock()
        handle = PeriodicHandle(self, callback, args, interval + 0.0, bool(fixed_rate), now)
        assert self._wheel is not None
        when = self._wheel.insert(handle, now + interval)
        self._pending += 1
        self._scheduled += 1
        self._periodic.add(handle)
        if when < self._wake_at:
            self._arm(when)
        return handle

    # -- re-arming and cancelling (called by handles) -------------------------------

    def _rearm(self, handle: TimerHandle[Any], deadline: float) -> None:
        if not self._open:
            raise TimerClosed(self._closed_reason())
        wheel = self._wheel
        assert wheel is not None
        bucket: object = handle._bucket
        due = deadline <= self._clock()
        if bucket is None:
            # Fired or cancelled: a new pending period starts.
            if self._pending >= self._limit:
                raise TimerFull(f"{self._pending} timers pending (max_pending={self._limit})")
            self._pending += 1
            self._scheduled += 1
            handle._result = _PENDING
            if isinstance(handle, TracedHandle):
                handle._scheduled_at = self._clock()
        elif bucket is self._runq:
            del self._runq[handle]
            _close_awaitable(handle._result)
            handle._result = _PENDING
        elif not due:
            when = wheel.extend(handle, deadline)
            if isinstance(handle, TracedHandle):
                handle._level = wheel_level(handle)
            if when < self._wake_at:
                self._arm(when)
            return
        else:
            wheel.remove(handle)
        when = wheel.insert_due(handle, deadline) if due else wheel.insert(handle, deadline)
        if isinstance(handle, TracedHandle):
            handle._level = wheel_level(handle)
        if when < self._wake_at:
            self._arm(when)

    def _after_cancel(self, handle: TimerHandle[Any], bucket: Bucket, previous: Any) -> None:
        # The rare part of handle.cancel(); the counters are already updated.
        runq: object = self._runq
        if bucket is runq:
            _close_awaitable(previous)
        elif not bucket and bucket.time == self._wake_at:
            # The driver was armed for the bucket this cancel emptied: re-arm it for
            # the next occupied bucket instead of waking for nothing. On asyncio that
            # costs a handle cancel and a call_at, so the driver defers it to one check
            # per loop iteration (still before any timer of that iteration): a loop of
            # schedule + cancel on an otherwise idle timer re-arms once, not each time.
            self._driver.recheck(self._recheck_wake)
        if self._waiters:
            self._settle(handle, _CANCELLED)
        if self._room_waiters:
            self._wake_room()
        if self._idle_waiters and not self._pending and len(self._running) <= 1:
            self._wake_idle()  # the drainer re-checks (it may be running itself)
        self._listening = bool(self._waiters or self._room_waiters or self._idle_waiters)

    def _trace(
        self, handle: TracedHandle[Any], fired_at: float | None, cancelled_at: float | None
    ) -> None:
        recorder = self._recorder
        assert recorder is not None
        recorder.record(
            handle._id,
            handle._label,
            handle._scheduled_at,
            handle._deadline,
            handle._level,
            fired_at,
            cancelled_at,
        )

    def _recheck_wake(self) -> None:
        if self._open and self._wake_at != -_INF:
            self._rearm_driver()

    def _rearm_driver(self) -> None:
        assert self._wheel is not None
        when = self._wheel.next_expiry()
        if when is None:
            self._wake_at = _INF
            self._driver.disarm()
        else:
            self._arm(when)

    def _arm(self, when: float) -> None:
        self._wake_at = when
        self._driver.arm(when)

    def _accepting_periodic(self) -> bool:
        return self._state == _RUNNING_STATE

    def _closed_reason(self) -> str:
        if self._state == _NEW:
            return "the timer is not started: use `async with Timer() as timer:`"
        if self._state == _DRAINING:
            return "the timer is draining (aclose(drain=True)): no new periodic timers"
        return "the timer is closed"

    # -- the driver's pass ----------------------------------------------------------

    def _pass(self) -> None:
        """Advance the wheel to now and run what expired. Called by the driver."""
        wheel = self._wheel
        assert wheel is not None
        self._wake_at = -_INF
        self._wakeups += 1
        now = self._clock()
        buckets = wheel.advance(now)
        if buckets:
            self._dispatch(buckets, now)
        self._wake_at = _INF
        if self._open:
            when = wheel.next_expiry()
            if when is not None:
                self._arm(when)
        if self._room_waiters:
            self._wake_room()
        if self._idle_waiters and not self._pending and len(self._running) <= 1:
            self._wake_idle()  # the drainer re-checks (it may be running itself)

    def _dispatch(self, buckets: list[Bucket], now: float) -> None:
        waiters = self._waiters
        recorder = self._recorder
        lateness_max = self._lateness_max
        fired = failed = 0
        index = 0
        # Declared here so that `finally` can drop them: a stored exception's
        # traceback keeps this frame alive (through its callers' f_back), and the
        # frame must not keep the last handle or outcome alive with it.
        handle: Any = None
        outcome: Any = None
        try:
            for index, bucket in enumerate(buckets):  # noqa: B007 - used after the loop
                # A snapshot: callbacks may cancel (del) later handles of this bucket.
                for handle in cast("list[TimerHandle[Any]]", list(bucket)):
                    if handle._bucket is not bucket:
                        continue  # cancelled or re-armed by an earlier callback
                    handle._bucket = None
                    self._pending -= 1
                    lateness = now - handle._deadline
                    if lateness > lateness_max:
                        lateness_max = lateness
                    if recorder is not None:
                        # The trace row describes this firing: read it before the
                        # callback runs, since a callback may re-arm its own handle.
                        t_id = handle._id
                        t_label = handle._label
                        t_scheduled = handle._scheduled_at
                        t_deadline = handle._deadline
                        t_level = handle._level
                    try:
                        result = handle._callback(*handle._args)
                    except Exception as exc:
                        fired += 1
                        failed += 1
                        self._report(handle, exc)
                        outcome = _Failure(_without_frame(exc))
                        if handle._bucket is None:
                            handle._result = outcome
                    else:
                        if result is not None and hasattr(type(result), "__await__"):
                            self._enqueue(handle, result)
                            continue
                        fired += 1
                        outcome = result
                        if handle._bucket is None:
                            handle._result = result
                    if waiters:
                        self._settle(handle, outcome)
                    if recorder is not None:
                        recorder.record(t_id, t_label, t_scheduled, t_deadline, t_level, now, None)
                bucket.clear()
        except BaseException:
            # KeyboardInterrupt/SystemExit from a callback: put back what this pass
            # did not get to, so nothing pending is lost, then let it propagate.
            self._refile(buckets[index:])
            raise
        finally:
            self._fired += fired
            self._failed += failed
            self._lateness_max = lateness_max
            handle = outcome = None

    def _refile(self, buckets: list[Bucket]) -> None:
        wheel = self._wheel
        assert wheel is not None
        for bucket in buckets:
            for handle in list(bucket):
                if handle._bucket is bucket:
                    wheel.insert(handle, handle._deadline)
            bucket.clear()

    def _report(self, handle: TimerHandle[Any], exc: BaseException) -> None:
        try:
            self._on_error(handle, exc)
        except Exception:
            logger.exception("on_error raised while reporting an error of %r", handle)

    def _settle(self, handle: TimerHandle[Any], outcome: Any) -> None:
        waiter = self._waiters.pop(handle, None)
        if waiter is not None:
            waiter.outcome = outcome
            waiter.event.set()

    async def _wait_for(self, handle: TimerHandle[Any]) -> Any:
        waiter = self._waiters.get(handle)
        if waiter is None:
            waiter = self._waiters[handle] = _Waiter()
            self._listening = True
        await waiter.event.wait()
        return waiter.outcome

    # -- backpressure -----------------------------------------------------------------

    async def _wait_for_room(self) -> None:
        while self._pending >= self._limit:
            if not self._open:
                raise TimerClosed(self._closed_reason())
            event = anyio.Event()
            self._room_waiters.append(event)
            self._listening = True
            try:
                await event.wait()
            except BaseException:
                if event in self._room_waiters:
                    self._room_waiters.remove(event)
                elif self._room_waiters:
                    self._wake_room()  # pass on the wake-up we were given
                raise

    def _wake_room(self) -> None:
        room = self._limit - self._pending
        waiters = self._room_waiters
        while room > 0 and waiters:
            waiters.pop(0).set()
            room -= 1

    def _wake_idle(self) -> None:
        waiters = self._idle_waiters
        self._idle_waiters = []
        for event in waiters:
            event.set()

    # -- the worker pool ----------------------------------------------------------------

    def _enqueue(self, handle: TimerHandle[Any], awaitable: Awaitable[Any]) -> None:
        # An expired async callback: pending again until a worker starts it.
        self._pending += 1
        handle._result = awaitable
        runq = self._runq
        runq[handle] = None
        handle._bucket = runq  # type: ignore[assignment]
        if self._parked:
            self._parked.pop().set()
        elif self._nworkers < self._max_concurrency:
            self._nworkers += 1
            assert self._inner_tg is not None
            self._driver.spawn(self._worker, self._inner_tg)

    async def _worker(self) -> None:
        _inside.set(self)
        scope = anyio.CancelScope()
        _worker_scope.set(scope)
        self._worker_scopes.add(scope)
        try:
            with scope:
                await self._work()
        finally:
            self._worker_scopes.discard(scope)
            self._nworkers -= 1

    async def _work(self) -> None:
        # One worker's loop: take the oldest expired async callback and run it. Each
        # job runs in its own frame (_run_job), so a parked worker keeps no reference
        # to its last handle, awaitable or result: memory is released at once.
        runq = self._runq
        while self._state != _CLOSED:
            if runq:
                await self._run_job(runq.popitem(last=False)[0])
                continue
            parked = anyio.Event()
            self._parked.append(parked)
            try:
                await parked.wait()
            finally:
                if parked in self._parked:
                    self._parked.remove(parked)

    async def _run_job(self, handle: TimerHandle[Any]) -> None:
        running = self._running
        awaitable = handle._result
        handle._bucket = None
        handle._result = _RUNNING
        self._pending -= 1
        self._fired += 1
        now = self._clock()
        lateness = now - handle._deadline
        if lateness > self._lateness_max:
            self._lateness_max = lateness
        if self._recorder is not None:
            self._trace(handle, now, None)  # type: ignore[arg-type]
        running[handle] = None
        _current.set(handle)
        if self._room_waiters:
            self._wake_room()
        try:
            value = await awaitable
        except anyio.get_cancelled_exc_class():
            # aclose() cancelled us and already settled the handle as
            # cancelled-while-running; anything else cancelling a worker is treated
            # the same way.
            running.pop(handle, None)
            if handle._result is _RUNNING:
                stopped = _Failure(TimerCancelled(f"{handle!r} was cancelled while running"))
                handle._result = stopped
                self._settle(handle, stopped)
            raise
        except Exception as exc:
            self._failed += 1
            self._report(handle, exc)
            outcome: Any = _Failure(_without_frame(exc))
        else:
            outcome = value
            del value
        finally:
            _current.set(None)
        running.pop(handle, None)
        if handle._bucket is None and handle._result is _RUNNING:
            handle._result = outcome
        if self._waiters:
            self._settle(handle, outcome)
        if self._idle_waiters and not self._pending and len(running) <= 1:
            self._wake_idle()  # the drainer re-checks (it may be running itself)
        # A failed job's traceback keeps this frame alive: it must not keep the handle.
        del handle, awaitable, outcome

    # -- conveniences -------------------------------------------------------------------

    async def sleep(self, delay: float) -> None:
        """Sleep ``delay`` seconds on this timer's wheel."""
        check_delay(delay)
        await self.sleep_until(self.time() + delay)

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` on the loop clock."""
        event = anyio.Event()
        handle = await self.schedule_at(deadline, event.set)
        try:
            await event.wait()
        finally:
            handle.cancel()

    def timeout(self, delay: float) -> Timeout:
        """``with timer.timeout(delay) as t:`` cancels the block and raises
        ``TimeoutError`` when ``delay`` passes first; ``t.reset(delay)`` pushes the
        deadline out (an idle timeout)."""
        check_delay(delay)
        if not self._open:
            raise TimerClosed(self._closed_reason())
        return Timeout(self, delay)


class _RunQueue(OrderedDict["TimerHandle[Any]", None]):
    """Expired async callbacks waiting for a worker, oldest first.

    It is the container (``handle._bucket``) of the handles it holds, like a wheel
    bucket, and answers ``tick is None`` as a detached bucket does, so the handle's
    lazy re-arm check treats it as "not in the wheel"."""

    tick = None
    time = _INF
    level = -2


def wheel_level(handle: TimerHandle[Any]) -> int:
    """The wheel the handle is filed in (-1: due at once)."""
    bucket = handle._bucket
    assert bucket is not None
    return bucket.level


def _not_started_clock() -> float:
    raise TimerClosed("the timer is not started: use `async with Timer() as timer:`")


def _check_callable(callback: object) -> None:
    if not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")


def _deadline_of(handle: TimerHandle[Any]) -> float:
    return handle._deadline


def _without_frame(exc: BaseException) -> BaseException:
    # The stored exception's traceback starts in the frame that called the callback,
    # and that frame refers to the handle: a cycle handle -> result -> traceback ->
    # frame -> handle, which only the garbage collector would break. Keep the
    # callback's own frames only.
    tb = exc.__traceback__
    if tb is not None:
        exc.__traceback__ = tb.tb_next
    return exc


def _close_awaitable(awaitable: Any) -> None:
    # A queued async callback that will never run: close it so Python does not warn
    # that a coroutine was never awaited.
    if isinstance(awaitable, Coroutine):
        awaitable.close()
