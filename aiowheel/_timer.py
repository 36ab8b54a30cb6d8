"""The Timer: the public API, and the accounting that ties the rooms together.

Rooms (docs/design.md, "Module map"):

* ``Wheel`` (``_wheel.py``) files handles and hands back expired buckets;
* a driver (``_driver.py``) calls ``Timer._fire_due`` when the earliest occupied
  bucket comes due;
* ``_fire_due`` advances the wheel and dispatches: plain callbacks run right there,
  like ``call_later`` callbacks; a callback that returns an awaitable (an async
  function) is handed to the worker pool (``_dispatch.py``);
* handles (``_handle.py``) call back into the timer through four methods only:
  ``_cancel``, ``_reset``, ``_reset_at``, ``_wait``.

The running parts (wheel, driver, pool, clock, the loop the timer belongs to) exist
only between ``__aenter__`` and ``aclose()``; they are one object, ``_Running``, and
``self._live`` is that object exactly while the timer accepts timers. So every entry
point starts with one test, ``live is None``, and the rest of its code needs no
``Optional`` checks.

The lock. Kafka holds a write lock while its reaper advances the wheel so that ``add``
never sees a half-advanced hierarchy. Here the event loop is that lock: ``advance`` is
synchronous and returns only once the hierarchy is consistent and every due bucket is
detached, and the pass never awaits. A callback that schedules or cancels while the
pass dispatches sees a finished wheel; the pass never has to suspend mid-flush to wait
for worker capacity, because expired async callbacks wait in the pool's run queue
(where they still count as pending, so ``max_pending`` bounds them).

Failure containment (docs/design.md, guarantee 5). Every public call validates all
of its arguments before it changes anything. The pass catches every exception of a
callback and of ``on_error``; only ``SystemExit`` and ``KeyboardInterrupt`` escape it,
after the callbacks it had not reached are filed again, and whatever escapes, the
pass re-arms the driver on its way out (``finally``). An exception from the wheel
itself (a bug) closes the timer and makes every later call say why: never stuck.

Loop affinity. A timer belongs to the event loop that started it. Every call that
changes it compares the calling thread with the loop's (``_thread.get_ident()``, about
45 ns here) and raises ``RuntimeError`` for a foreign caller; threads go through
``call_threadsafe``/``schedule_threadsafe``. The calls that wait or set things up
(``wait``, ``aclose``, ``every``, ``timeout``, ``schedule``/``schedule_at`` waiting for
room) also compare the running asyncio loop, which catches a second loop in the same
thread; ``asyncio._get_running_loop()`` costs about 230 ns on CPython 3.11, five times
the thread check, so the calls that run per timer do without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import logging
import math
import sys
from _thread import get_ident
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    NoReturn,
    SupportsFloat,
    SupportsIndex,
    TypeVar,
    TypeVarTuple,
    cast,
    overload,
)

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ._checks import (
    check_callable,
    check_int,
    check_label,
    full,
    not_copyable,
    seconds,
    too_far,
)
from ._dispatch import WorkerPool, close_awaitable, inside
from ._driver import Driver, backend_name, current_clock, loop_clock, make_driver
from ._exceptions import TimerCancelled, TimerClosed
from ._handle import (
    _CANCELLED,
    _PENDING,
    _RUNNING,
    PeriodicHandle,
    TimerHandle,
    TracedHandle,
    _Failure,
    release,
    to_seconds,
    without_frame,
)
from ._timeout import Guard, Timeout, Wake
from ._wheel import Bucket, Wheel, deadline_of

if TYPE_CHECKING:
    from .trace import TraceRecorder

__all__ = ["Timer", "TimerStats"]

logger: Final = logging.getLogger("aiowheel")

T = TypeVar("T")
# The callback's positional arguments, checked against ``*args`` (as typeshed types
# ``loop.call_later``). Not a ParamSpec: ``P.args`` must come with ``P.kwargs``, and
# the scheduling calls pass no keyword arguments to the callback (``label`` is theirs).
Ts = TypeVarTuple("Ts")
# Final: compiled, these are C statics rather than lookups in the module's dict on
# every use (docs/design.md, "Rules for compiled modules").
_INF: Final = math.inf
_EXIT: Final = (SystemExit, KeyboardInterrupt)
_ASYNC_ON_ERROR: Final = (
    "the timer calls on_error inside its pass, which never awaits: pass a plain "
    "function (it may start a task for async work)"
)
_ONE_RESOURCE: Final = "a timer is one resource of its event loop; share the timer itself"
_get_ident: Final = get_ident

# Bounds of the constructor's arguments: a tick below a microsecond is finer than any
# loop clock; a wheel of more than 65,536 buckets costs seconds to build and gains
# nothing (levels are added on demand).
MIN_TICK = 1e-6
MAX_TICK = 86_400.0
MAX_WHEEL_SIZE = 1 << 16


class _State(enum.Enum):
    NEW = "new"
    OPEN = "running"
    DRAINING = "draining"
    CLOSED = "closed"


_NEW, _OPEN, _DRAINING, _CLOSED = _State.NEW, _State.OPEN, _State.DRAINING, _State.CLOSED


@dataclass(frozen=True, slots=True)
class TimerStats:
    """A snapshot of a timer's counters (``Timer.stats()``)."""

    pending: int  #: timers not yet started, expired async callbacks waiting for a worker included
    scheduled: int  #: arms (schedules, re-arms of fired or cancelled handles, periodic runs)
    fired: int  #: callbacks started (those that raised included)
    cancelled: int  #: timers cancelled while pending
    failed: int  #: callbacks that raised
    levels: int  #: wheels in use (overflow wheels are created on demand)
    lateness_max: float  #: worst start time minus deadline, seconds
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


class _Running:
    """The parts of a started timer: built by ``_supervise``, dropped by ``aclose``."""

    __slots__ = (
        "backend",
        "call_soon_threadsafe",
        "clock",
        "closing",
        "driver",
        "loop",
        "pool",
        "stopped",
        "wheel",
    )

    def __init__(self, timer: Timer, backend: str, tg: TaskGroup) -> None:
        self.backend = backend
        self.call_soon_threadsafe: Callable[[Callable[[], object]], object]
        if backend == "trio":
            import trio

            self.clock: Callable[[], float] = trio.current_time
            self.loop: asyncio.AbstractEventLoop | None = None
            self.call_soon_threadsafe = trio.lowlevel.current_trio_token().run_sync_soon
        else:
            loop = asyncio.get_running_loop()
            self.clock = loop_clock(loop)
            self.loop = loop
            self.call_soon_threadsafe = loop.call_soon_threadsafe
        self.wheel = Wheel(timer._tick, timer._wheel_size, self.clock())
        self.driver: Driver = make_driver(backend, timer._fire_due)
        self.pool = WorkerPool(timer, timer._max_concurrency, backend, tg)
        self.closing = anyio.Event()
        self.stopped = anyio.Event()


class _Waiter:
    """Tasks waiting in ``handle.wait()`` for one handle share one of these."""

    __slots__ = ("event", "outcome")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.outcome: Any = _PENDING


def _log_error(handle: TimerHandle[Any], exc: BaseException) -> None:
    logger.error("timer callback %r raised", handle, exc_info=exc)


class Timer:
    """A hierarchical timing-wheel timer on the running event loop.

    ``async with Timer() as timer:`` starts it (on asyncio, uvloop or trio); leaving
    the block closes it (``aclose()``).

    :param tick: resolution of the lowest wheel, in seconds, from 1e-6 to 86,400.
        Callbacks never start before their deadline and at most one tick (plus the
        loop's own delay) after it.
    :param wheel_size: buckets per wheel, from 2 to 65,536; coarser wheels are added
        on demand, so any finite delay is accepted.
    :param max_pending: bound on ``len(timer)`` (pending timers, expired async
        callbacks still waiting for a worker included), or None for no bound.
    :param max_concurrency: most async callbacks running at once.
    :param on_error: ``on_error(handle, exc)`` when a callback raises; by default the
        error is logged at ERROR on the ``"aiowheel"`` logger. What ``on_error``
        itself raises is logged there too, and the timer goes on. It is a plain
        function (an ``async def`` one is refused: the pass never awaits).
    :param recorder: a trace recorder (``aiowheel.trace.ParquetRecorder``) that gets one
        row per timer when it ends; a timer without one pays nothing for tracing.
    """

    def __init__(
        self,
        *,
        tick: SupportsFloat = 0.001,
        wheel_size: SupportsIndex = 64,
        max_pending: SupportsIndex | None = None,
        max_concurrency: SupportsIndex = 256,
        on_error: Callable[[TimerHandle[Any], BaseException], object] | None = None,
        recorder: TraceRecorder | None = None,
    ) -> None:
        tick_ = seconds(tick, "tick")
        if not MIN_TICK <= tick_ <= MAX_TICK:
            raise ValueError(f"tick must be from {MIN_TICK} to {MAX_TICK:g} seconds, got {tick!r}")
        size = check_int("wheel_size", wheel_size, 2, MAX_WHEEL_SIZE)
        limit = sys.maxsize if max_pending is None else check_int("max_pending", max_pending, 1)
        concurrency = check_int("max_concurrency", max_concurrency, 1)
        if on_error is not None and not callable(on_error):
            raise TypeError(f"on_error must be callable, got {on_error!r}")
        if inspect.iscoroutinefunction(on_error):
            raise TypeError(f"on_error is an async function; {_ASYNC_ON_ERROR}")
        self._tick = tick_
        self._wheel_size = size
        self._limit = limit
        self._max_concurrency = concurrency
        self._on_error = on_error if on_error is not None else _log_error
        # The recorder the timer opens and closes, and the one it writes rows to: the
        # same, until a record() raises (see _recorder_failed).
        self._recorder = recorder
        self._tracing = recorder

        self._state = _NEW
        # The running parts, exactly while the timer accepts timers (open or draining).
        self._live: _Running | None = None
        self._outer_tg: TaskGroup | None = None
        self._parts: _Running | None = None  # the running parts, kept for __aexit__
        # What handles read (see _handle.py): the loop's thread and clock, once started.
        self._loop_thread = 0
        self._now: Callable[[], float] = _not_started_clock
        self._levels = 0  # the wheel's levels when it closed
        self._broken: BaseException | None = None  # what stopped the timer, if not aclose
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

        self._waiters: dict[TimerHandle[Any], _Waiter] = {}
        self._room_waiters: list[anyio.Event] = []
        self._idle_waiters: list[anyio.Event] = []
        # True whenever a cancel must do more than count: someone may be waiting (on
        # the handle, for room, for the drain), or there is a recorder. Set on every
        # registration, recomputed lazily, so that cancel() checks one attribute.
        self._notify_cancel = recorder is not None
        self._periodic: set[PeriodicHandle] = set()
        # The handles an internal error cancelled (see _break): their wait() says why.
        self._stranded: set[TimerHandle[Any]] = set()
        self._last_id = 0  # trace rows number the timers from 1

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Timer:
        if self._state is not _NEW:
            raise RuntimeError("a Timer can be started only once")
        backend = backend_name()
        outer = anyio.create_task_group()
        await outer.__aenter__()
        self._outer_tg = outer
        try:
            live: _Running = await outer.start(self._supervise, backend)
        except BaseException:
            await outer.__aexit__(*sys.exc_info())
            raise
        if self._recorder is not None:
            try:
                self._recorder.open(backend=backend, clock=live.clock())
            except BaseException:
                # Nothing is scheduled yet: take down what this call started, so that
                # a recorder that cannot open leaves no task running behind the error.
                self._state = _CLOSED
                self._tracing = None
                live.driver.stop()
                live.pool.close()
                live.closing.set()
                await outer.__aexit__(None, None, None)  # the supervisor returns
                raise
        self._state = _OPEN
        self._loop_thread = _get_ident()
        self._now = live.clock
        self._live = self._parts = live
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with anyio.CancelScope(shield=True):
            await self.aclose()
            parts = self._parts
            if parts is not None and inside.get() is not self:
                # aclose() called by one of the timer's own jobs did not wait for the
                # workers (it runs on one); the block does not end before they have.
                await parts.stopped.wait()
                await parts.pool.join()
        outer = self._outer_tg
        if outer is not None:
            # Our tasks are finished, so the task group has nothing to wrap: the
            # body's exception, if any, propagates as itself, not in an ExceptionGroup.
            await outer.__aexit__(None, None, None)
        return False

    async def _supervise(self, backend: str, *, task_status: TaskStatus[_Running]) -> None:
        # The driver (on trio) and the workers (on trio) live in this inner task
        # group; the host task of ``async with`` is never cancelled by us. aclose()
        # stops the driver and cancels each worker's own scope (not the group's, so
        # that an async callback that calls aclose() is not cancelled by its own call),
        # then sets `closing`, and the group ends once every child has returned.
        inside.set(self)
        stopped: anyio.Event | None = None
        try:
            async with anyio.create_task_group() as tg:
                live = _Running(self, backend, tg)
                stopped = live.stopped
                await live.driver.start(tg)
                task_status.started(live)
                await live.closing.wait()
        finally:
            if stopped is not None:
                stopped.set()

    async def aclose(self, drain: bool = False) -> list[TimerHandle[Any]]:
        """Close the timer. ``drain=False``: cancel every pending timer and running async
        callback, return the cancelled handles in deadline order. ``drain=True``: stop
        periodic timers, wait until everything pending has fired and every callback has
        finished (timers scheduled meanwhile included), return ``[]``. Idempotent."""
        if not isinstance(drain, bool):
            raise TypeError(f"drain must be a bool, got {drain!r}")
        if self._state is _NEW:
            self._state = _CLOSED
            return []
        live = self._live
        if live is None:
            return []
        self._check_owner(live)
        if drain and self._state is _OPEN:
            self._state = _DRAINING
            for periodic in list(self._periodic):
                periodic.cancel()
            # Called from an async callback, that callback is one of the running
            # ones: do not wait for it (it is waiting for us).
            pool = live.pool
            me = 1 if pool.current() in pool.running else 0
            while (self._pending or pool.busy > me) and self._state is _DRAINING:
                event = anyio.Event()
                self._idle_waiters.append(event)
                self._notify_cancel = True
                await event.wait()
        if self._state is _CLOSED:
            return []
        cancelled = self._shut(live)
        if inside.get() is not self:
            await live.stopped.wait()
            await live.pool.join()
        if self._recorder is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(self._recorder.close)
                except Exception:
                    # The timer is closed whatever the recorder says (ParquetRecorder
                    # itself logs rather than raises, for the same reason).
                    logger.exception("aiowheel: the trace recorder failed to close")
        return cancelled

    def _shut(self, live: _Running) -> list[TimerHandle[Any]]:
        # The synchronous part of closing: after it, nothing is pending, nobody waits,
        # and the supervisor task is on its way out.
        self._state = _CLOSED
        self._live = None
        self._levels = live.wheel.levels
        self._wake_at = _INF
        live.driver.stop()
        try:
            cancelled = self._cancel_everything(live)
        finally:
            live.pool.close()
            live.closing.set()
            for event in self._room_waiters + self._idle_waiters:
                event.set()
            self._room_waiters.clear()
            self._idle_waiters.clear()
        return cancelled

    def _cancel_everything(self, live: _Running) -> list[TimerHandle[Any]]:
        handles: list[TimerHandle[Any]] = live.wheel.clear()
        handles.extend(live.pool.take_queue())
        handles.sort(key=deadline_of)
        now = live.clock()
        # The queued awaitables are closed (user code) and released at the very end.
        olds: list[Any] = []
        for handle in handles:
            olds.append(handle._result)
            handle._result = _CANCELLED
            self._settle(handle, _CANCELLED)
        # Every periodic timer stops: the filed and queued ones are among the handles;
        # one whose run is in progress gives back its reserved period, cancelled too.
        reserved = 0
        for periodic in self._periodic:
            if periodic._in_run:  # (the wheel and queue have let go of the others)
                reserved += 1
            periodic._stop()
        self._periodic.clear()
        self._cancelled += len(handles) + reserved
        self._pending = 0
        # A task in sleep() or a timeout() block whose timer this was learns it now
        # (its guard will never fire): it raises TimerClosed.
        for handle in handles:
            callback = handle._callback
            if isinstance(callback, Guard):
                callback.timer_closed()
        current = live.pool.current()
        for handle in live.pool.running:
            if handle is current:
                continue  # the callback that called aclose() runs to its end
            # It started, so it stays fired(); its wait() raises TimerCancelled.
            outcome = _Failure(
                TimerCancelled(f"{handle!r} was cancelled by aclose() while running")
            )
            handle._result = outcome
            self._settle(handle, outcome)
        # The trace rows last: everything above is settled whatever a recorder raises
        # (even SystemExit, which _trace lets through).
        try:
            for handle in handles:
                if isinstance(handle, TracedHandle):
                    self._trace(handle, None, now)
        finally:
            for old in olds:
                close_awaitable(old)
            olds.clear()
        return handles

    def _break(self, exc: BaseException) -> None:
        # The wheel raised: a bug, and its state cannot be trusted. Close the timer
        # rather than leave it stuck, and say why on every later call.
        logger.critical("aiowheel timer stopped by an internal error", exc_info=exc)
        live = self._live
        if live is None:
            return
        self._broken = exc
        # Whoever waits on a handle learns why, and does not wait for ever.
        for waiter in self._waiters.values():
            waiter.outcome = _Failure(self._closed())
            waiter.event.set()
        self._waiters.clear()
        try:
            # Every handle it held (the wheel, the buckets a pass had taken, the run
            # queue) is cancelled, and its wait() raises TimerClosed from `exc`.
            self._stranded.update(self._shut(live))
        except Exception:
            logger.exception("while closing the broken timer")

    # -- clock and introspection ----------------------------------------------------

    def time(self) -> float:
        """Now, on the running event loop's clock; every deadline is on this clock."""
        live = self._live
        if live is None:
            return current_clock()()
        return live.clock()

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
        """``"asyncio"``, ``"uvloop"`` or ``"trio"`` while started, ``""`` before."""
        live = self._live
        return live.backend if live is not None else ""

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` has run (or started)."""
        return self._state is _CLOSED

    def __len__(self) -> int:
        """Pending timers, exact at every moment (expired async callbacks still
        waiting for a worker included)."""
        return self._pending

    def stats(self) -> TimerStats:
        """A snapshot of the counters; zeros on a timer that is not started."""
        live = self._live
        parts = self._parts
        return TimerStats(
            pending=self._pending,
            scheduled=self._scheduled,
            fired=self._fired,
            cancelled=self._cancelled,
            failed=self._failed,
            levels=live.wheel.levels if live is not None else self._levels,
            lateness_max=self._lateness_max,
            # The pool outlives aclose() while its last jobs finish (the one that
            # called aclose() runs to its end): count what really runs.
            running=parts.pool.busy if parts is not None else 0,
            workers=parts.pool.workers if parts is not None else 0,
            wakeups=self._wakeups,
        )

    def next_deadline(self) -> float | None:
        """When the driver next wakes (the earliest occupied bucket), or None."""
        live = self._live
        if live is None:
            return None
        when = live.wheel.next_expiry()
        if when == -_INF:
            return live.clock()
        return when

    def __repr__(self) -> str:
        return (
            f"<Timer {self._state.value} tick={self._tick} wheel_size={self._wheel_size} "
            f"pending={self._pending}>"
        )

    # A copy would share the original's wheel, driver and pool but keep counters of
    # its own: both would file into one wheel and disagree about what is pending.
    # A timer is one resource, like the event loop it runs on.

    def __copy__(self) -> NoReturn:
        not_copyable(self, _ONE_RESOURCE)

    def __deepcopy__(self, memo: object) -> NoReturn:
        not_copyable(self, _ONE_RESOURCE)

    def __reduce__(self) -> NoReturn:
        not_copyable(self, _ONE_RESOURCE)

    # -- admission checks -----------------------------------------------------------

    def _closed_reason(self) -> str:
        if self._state is _NEW:
            return "the timer is not started: use `async with Timer() as timer:`"
        if self._state is _DRAINING:
            return "the timer is draining (aclose(drain=True)): no new periodic timers"
        if self._broken is not None:
            return f"the timer stopped after an internal error: {self._broken!r}"
        return "the timer is closed"

    def _closed(self) -> TimerClosed:
        error = TimerClosed(self._closed_reason())
        error.__cause__ = self._broken
        return error

    def _check_owner(self, live: _Running) -> None:
        if _get_ident() != self._loop_thread or (
            live.loop is not None and asyncio._get_running_loop() is not live.loop
        ):
            raise self._foreign(live)

    def _foreign(self, live: _Running) -> RuntimeError:
        return RuntimeError(
            f"this Timer belongs to the {live.backend} event loop that started it; call it "
            "from that loop, or from another thread use timer.call_threadsafe() or "
            "timer.schedule_threadsafe()"
        )

    def _here(self) -> _Running:
        """The running parts, for a call from the timer's thread; else raise."""
        live = self._live
        if live is None:
            raise self._closed()
        if _get_ident() != self._loop_thread:
            raise self._foreign(live)
        return live

    def _open(self) -> _Running:
        """The running parts, for a call from the timer's own loop; else raise."""
        live = self._here()
        if live.loop is not None and asyncio._get_running_loop() is not live.loop:
            raise self._foreign(live)
        return live

    # -- scheduling -----------------------------------------------------------------

    @overload
    def schedule_nowait(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    @overload
    def schedule_nowait(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], T],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    def schedule_nowait(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], Any],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[Any]:
        """Run ``callback(*args)`` ``delay`` seconds from now; ``TimerFull`` at
        ``max_pending``. ``delay <= 0`` fires on the driver's next pass."""
        # The hot path: kept flat (no helper calls but on errors) on purpose.
        live = self._live
        if live is None:
            raise self._closed()
        if _get_ident() != self._loop_thread:
            raise self._foreign(live)
        # A finite float passes with two tests; anything else goes through the rule.
        seconds_ = delay if type(delay) is float and delay - delay == 0.0 else to_seconds(delay)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        if label is not None and type(label) is not str:
            check_label(label)
        if self._pending >= self._limit:
            raise full(self._pending, self._limit)
        now = live.clock()
        if self._tracing is not None:
            return self._add_traced(live, now + seconds_, now, callback, args, label)
        handle: TimerHandle[Any] = TimerHandle(self, callback, args)
        if seconds_ > 0:
            when = live.wheel.insert(handle, now + seconds_)  # raises only before filing
        else:
            # Due now: the next pass, not the next tick.
            when = live.wheel.insert_due(handle, now + seconds_)
        self._pending += 1
        self._scheduled += 1
        if when < self._wake_at:
            self._wake_at = when
            live.driver.arm(when)
        return handle

    @overload
    def schedule_at_nowait(
        self,
        deadline: SupportsFloat,
        callback: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    @overload
    def schedule_at_nowait(
        self,
        deadline: SupportsFloat,
        callback: Callable[[*Ts], T],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    def schedule_at_nowait(
        self,
        deadline: SupportsFloat,
        callback: Callable[[*Ts], Any],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[Any]:
        """Run ``callback(*args)`` at the absolute ``deadline`` (loop clock)."""
        live = self._here()
        deadline = seconds(deadline, "deadline")
        check_callable(callback)
        if self._pending >= self._limit:
            raise full(self._pending, self._limit)
        now = live.clock()
        if self._tracing is not None:
            return self._add_traced(live, deadline, now, callback, args, label)
        handle: TimerHandle[Any] = TimerHandle(self, callback, args)
        self._file(live, handle, deadline, deadline <= now, new=True)
        return handle

    @overload
    async def schedule(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    @overload
    async def schedule(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], T],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    async def schedule(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], Any],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[Any]:
        """Like ``schedule_nowait``, but waits for room while ``max_pending`` is reached;
        the deadline is computed when the timer is admitted."""
        if self._pending >= self._limit and self._live is not None:
            self._open()
            seconds(delay)
            check_callable(callback)
            await self._wait_for_room()
        return self.schedule_nowait(delay, callback, *args, label=label)

    @overload
    async def schedule_at(
        self,
        deadline: SupportsFloat,
        callback: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    @overload
    async def schedule_at(
        self,
        deadline: SupportsFloat,
        callback: Callable[[*Ts], T],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[T]: ...

    async def schedule_at(
        self,
        deadline: SupportsFloat,
        callback: Callable[[*Ts], Any],
        *args: *Ts,
        label: str | None = None,
    ) -> TimerHandle[Any]:
        """Like ``schedule_at_nowait``, waiting for room while ``max_pending`` is reached."""
        if self._pending >= self._limit and self._live is not None:
            self._open()
            seconds(deadline, "deadline")
            check_callable(callback)
            await self._wait_for_room()
        return self.schedule_at_nowait(deadline, callback, *args, label=label)

    def _add_traced(
        self,
        live: _Running,
        deadline: float,
        now: float,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        label: str | None,
    ) -> TimerHandle[Any]:
        # Timers with a recorder get handles that carry what a trace row needs.
        handle: TracedHandle[Any] = TracedHandle(self, callback, args)
        self._stamp(handle, label, now)
        self._file(live, handle, deadline, deadline <= now, new=True)
        return handle

    def _stamp(self, handle: TracedHandle[Any], label: str | None, now: float) -> None:
        # What a trace row reads of a new handle, but its level (_file sets it, and
        # _move sets scheduled_at again for each later period of the same handle).
        handle._label = label
        handle._scheduled_at = now
        self._last_id = handle._id = self._last_id + 1

    def _file(
        self, live: _Running, handle: TimerHandle[Any], deadline: float, due: bool, *, new: bool
    ) -> None:
        # File a handle that is in no bucket, count it if it is a new pending timer,
        # and move the driver's wake-up earlier if its bucket comes due first.
        wheel = live.wheel
        when = wheel.insert_due(handle, deadline) if due else wheel.insert(handle, deadline)
        if new:
            self._pending += 1
            self._scheduled += 1
        if isinstance(handle, TracedHandle):
            handle._level = _level_of(handle)
        if when < self._wake_at:
            self._wake_at = when
            live.driver.arm(when)

    def every(
        self,
        interval: SupportsFloat,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        fixed_rate: bool = True,
        label: str | None = None,
    ) -> PeriodicHandle:
        """Run ``callback(*args)`` every ``interval`` seconds, first at now + interval.

        ``fixed_rate=True`` keeps deadlines on the grid start + k*interval (missed
        periods are skipped, not bunched); ``fixed_rate=False`` waits ``interval``
        after each run finishes. Runs never overlap. ``cancel()`` stops it. ``label``
        names it in a trace (one row per period), as for ``schedule``.
        """
        live = self._open()
        if self._state is not _OPEN:
            # Draining: aclose(drain=True) has cancelled the periodic timers.
            raise self._closed()
        period = seconds(interval, "interval")
        if not period > 0:
            raise ValueError(f"interval must be a positive finite number, got {interval!r}")
        check_callable(callback)
        if not isinstance(fixed_rate, bool):
            raise TypeError(f"fixed_rate must be a bool, got {fixed_rate!r}")
        check_label(label)
        if self._pending >= self._limit:
            raise full(self._pending, self._limit)
        now = live.clock()
        if now + period == _INF:
            too_far("interval", period)
        handle = PeriodicHandle(self, callback, args, period, fixed_rate, now)
        self._stamp(handle, label, now)  # traced or not: the pass reads it when traced
        self._file(live, handle, now + period, False, new=True)
        self._periodic.add(handle)
        return handle

    # -- what handles call ------------------------------------------------------------

    def _cancel(self, handle: TimerHandle[Any]) -> bool:
        # handle.cancel() of a pending handle: the common case is a few assignments.
        live = self._live
        if live is None:
            return False
        if _get_ident() != self._loop_thread:
            raise self._foreign(live)
        bucket = handle._bucket
        if bucket is None:
            return False
        bucket.remove(handle)
        previous = handle._result
        handle._result = _CANCELLED
        self._pending -= 1
        self._cancelled += 1
        # The rest is rare: the bucket the driver waits for emptied, an async callback
        # queued for a worker (its coroutine must be closed), someone waiting, or a
        # trace row to write.
        if bucket._first is None or previous is not _PENDING or self._notify_cancel:
            self._after_cancel(live, handle, bucket, previous)
        return True

    def _after_cancel(
        self, live: _Running, handle: TimerHandle[Any], bucket: Bucket, previous: Any
    ) -> None:
        queue: object = live.pool.queue  # also a handle's container (a RunQueue)
        if bucket is queue:
            pass  # its awaitable is closed last, below (user code)
        elif bucket._first is None and bucket.time == self._wake_at:
            # The driver was armed for the bucket this cancel emptied: re-arm it for
            # the next occupied bucket instead of waking for nothing. On asyncio that
            # costs a handle cancel and a call_at, so the driver defers it to one check
            # per loop iteration (still before any timer of that iteration): a loop of
            # schedule + cancel on an otherwise idle timer re-arms once, not each time.
            live.driver.recheck(self._sync_wakeup_unless_passing)
        if self._tracing is not None and isinstance(handle, TracedHandle):
            self._trace(handle, None, live.clock())
        if self._waiters:
            self._settle(handle, _CANCELLED)
        if self._room_waiters:
            self._wake_room()
        if self._idle_waiters and not self._pending and live.pool.busy <= 1:
            self._wake_idle()  # the drainer re-checks (it may be running itself)
        self._notify_cancel = bool(
            self._tracing is not None or self._waiters or self._room_waiters or self._idle_waiters
        )
        if bucket is queue:
            # A coroutine's close() runs its finally blocks: user code, which may
            # re-arm the handle; the cancel is complete by now (docs/design.md,
            # "Re-entrancy").
            close_awaitable(previous)

    def _reset(self, handle: TimerHandle[Any], delay: SupportsFloat) -> None:
        # handle.reset() past its inline lazy path (TimerHandle.reset), which every
        # real number takes: what is left is a re-file, a foreign thread, bad input.
        live = self._here()
        delay_ = to_seconds(delay)
        deadline = live.clock() + delay_
        if deadline == _INF:
            too_far("delay", delay_)
        self._rearm(live, handle, deadline)

    def _reset_at(self, handle: TimerHandle[Any], deadline: SupportsFloat) -> None:
        self._rearm(self._here(), handle, to_seconds(deadline, "deadline"))

    def _rearm(self, live: _Running, handle: TimerHandle[Any], deadline: float) -> None:
        # reset()/reset_at() past the fast path. Admission first: nothing changes
        # unless the whole re-arm can be done. (The levels first: creating one may
        # run finalizers that change the handle; see _move.)
        live.wheel.reserve(deadline)
        if isinstance(handle, PeriodicHandle):
            self._periodic_rearm(live, handle, deadline)
            return
        if handle._bucket is None and self._pending >= self._limit:
            raise full(self._pending, self._limit)
        self._move(live, handle, deadline)

    def _move(self, live: _Running, handle: TimerHandle[Any], deadline: float) -> None:
        # Re-file a handle at a valid deadline, wherever it is now. Cannot fail.
        #
        # Re-entrancy (docs/design.md, "Re-entrancy"): no user code may run between
        # reading the handle's state and finishing the change. So the levels the
        # filing needs are created first (an allocation may run the garbage
        # collector, whose finalizers may re-arm this very handle), the state is read
        # after that, and the old result or awaitable, whose finalizer may re-enter,
        # is released only once the handle is filed and counted.
        now = live.clock()
        live.wheel.reserve(deadline)
        bucket: object = handle._bucket
        due = deadline <= now
        if bucket is None:
            # Fired or cancelled: a new pending period starts.
            old = handle._result
            handle._result = _PENDING
            if isinstance(handle, TracedHandle):
                handle._scheduled_at = now
            self._file(live, handle, deadline, due, new=True)
            release(old)  # its finalizer may run now: the handle is filed and counted
            return
        if bucket is live.pool.queue:
            live.pool.queue.remove(handle)
            old = handle._result
            handle._result = _PENDING
            self._file(live, handle, deadline, due, new=False)
            close_awaitable(old)  # user code (a coroutine's finally): last
            return
        if not due:
            when = live.wheel.extend(handle, deadline)
            if isinstance(handle, TracedHandle):
                handle._level = _level_of(handle)
            if when < self._wake_at:
                self._wake_at = when
                live.driver.arm(when)
            return
        live.wheel.remove(handle)
        self._file(live, handle, deadline, due, new=False)

    # Periodic timers (docs/design.md, "Periodic timers"). An active periodic timer
    # holds one pending slot for its whole life: its filed (or queued) period, and
    # while a run is in progress the next period, which is armed (counted scheduled
    # and pending) when the run starts and filed when it ends. So the next period
    # never needs admission under max_pending, and the counters keep
    # scheduled == fired + cancelled + pending (see _check).

    def _periodic_begin(self, handle: PeriodicHandle) -> None:
        # A run starts (plain: in the pass; async: on its worker).
        handle._in_run = True
        if handle._active:
            self._pending += 1
            self._scheduled += 1

    def _periodic_queued(self, handle: PeriodicHandle) -> None:
        # The callback returned an awaitable: the pass queues it for a worker, where it
        # counts as the pending period until it starts, so give back the slot reserved
        # for the next one (the worker reserves it again when the run really starts).
        handle._in_run = False
        if handle._active:
            self._pending -= 1
            self._scheduled -= 1

    def _periodic_end(self, handle: PeriodicHandle) -> None:
        # A run ended: file the next period in the slot it holds (no admission).
        handle._in_run = False
        if not handle._active:
            return  # stopped during the run: cancel() or the close gave its slot back
        live = self._live
        if live is None:
            return  # unreachable: closing stops every periodic timer
        if self._state is not _OPEN:
            # Draining (a reset() during the drain re-activated it): no more periods.
            self._periodic_halt(live, handle)
            return
        now = live.clock()
        if handle._rearmed:
            handle._rearmed = False  # reset() during the run set the deadline
            deadline = handle._deadline
        else:
            deadline = handle._next_deadline(now)
        live.wheel.reserve(deadline)  # levels first (see _move)
        previous: Any = handle._result
        handle._result = _PENDING
        handle._scheduled_at = now
        self._file(live, handle, deadline, deadline <= now, new=False)
        release(previous)  # its finalizer may run now: the period is filed (see _move)

    def _periodic_halt(self, live: _Running, handle: PeriodicHandle) -> None:
        # Stop a periodic timer that is in a run: its reserved next period is cancelled.
        handle._stop()
        self._periodic.discard(handle)
        self._pending -= 1
        self._cancelled += 1
        if self._room_waiters:
            self._wake_room()
        if self._idle_waiters and not self._pending and live.pool.busy <= 1:
            self._wake_idle()  # the drainer re-checks (it may be running itself)

    def _periodic_stop(self, handle: PeriodicHandle) -> bool:
        live = self._live
        if live is None:
            handle._stop()  # unreachable: closing stops every periodic timer
            return True
        self._check_owner(live)
        if handle._bucket is not None:
            handle._stop()
            self._periodic.discard(handle)
            return self._cancel(handle)
        # A run is in progress; it finishes, and it is not re-armed.
        self._periodic_halt(live, handle)
        return True

    def _cancelled_error(self, handle: TimerHandle[Any]) -> BaseException:
        """What ``wait()`` of a cancelled handle raises."""
        if handle in self._stranded:
            return self._closed()
        return TimerCancelled(f"{handle!r} was cancelled")

    def _periodic_rearm(self, live: _Running, handle: PeriodicHandle, deadline: float) -> None:
        # reset()/reset_at() of a periodic timer. During a run, only record the next
        # deadline: the run's end files it, so a second run never starts while the
        # first one goes on.
        if handle._in_run:
            if not handle._active:
                # Stopped during this run: re-activating arms a new period.
                if self._pending >= self._limit:
                    raise full(self._pending, self._limit)
                self._pending += 1
                self._scheduled += 1
                self._periodic.add(handle)
            handle._restart(deadline)
            handle._deadline = deadline
            handle._rearmed = True
            return
        if handle._bucket is None and self._pending >= self._limit:
            raise full(self._pending, self._limit)
        handle._restart(deadline)
        handle._rearmed = False
        self._periodic.add(handle)
        self._move(live, handle, deadline)

    async def _wait(self, handle: TimerHandle[Any]) -> Any:
        live = self._live
        if live is not None:
            self._check_owner(live)
        elif handle._bucket is not None or handle._result is _PENDING:
            # Closed, and this handle will never run: nothing would settle a waiter.
            return _Failure(self._closed())
        waiter = self._waiters.get(handle)
        if waiter is None:
            waiter = self._waiters[handle] = _Waiter()
            self._notify_cancel = True
        await waiter.event.wait()
        return waiter.outcome

    # -- self-check (tests) ------------------------------------------------------------

    def _check(self) -> None:
        """Assert the counters against the wheel, the run queue and the periodic
        timers (docs/design.md, "Accounting"), then the wheel's own invariants. For
        tests, between passes (not from inside a callback): O(pending)."""
        pending = self._pending
        assert self._scheduled == self._fired + self._cancelled + pending, (
            f"scheduled {self._scheduled} != fired {self._fired} + cancelled "
            f"{self._cancelled} + pending {pending}"
        )
        assert 0 <= self._failed <= self._fired
        parts = self._parts
        if parts is not None:
            pool = parts.pool
            assert pool.busy == sum(pool.running.values()) >= 0
            assert pool.busy <= self._max_concurrency
        live = self._live
        if live is None:
            assert pending == 0, f"closed with {pending} pending"
            assert not self._periodic, "closed with active periodic timers"
            return
        live.wheel._check()
        filed = 0
        for entry in live.wheel:
            handle = cast("TimerHandle[Any]", entry)
            assert handle._timer is self, handle
            assert handle._result is _PENDING, handle
            filed += 1
        queued = 0
        for entry in live.pool.queue:
            handle = cast("TimerHandle[Any]", entry)
            assert handle._bucket is live.pool.queue
            assert hasattr(type(handle._result), "__await__"), handle
            queued += 1
        reserved = 0
        for periodic in self._periodic:
            assert periodic._active, periodic
            assert periodic._callback == periodic._run, periodic
            if periodic._bucket is None:
                assert periodic._in_run, f"{periodic!r}: active, not filed, not running"
                reserved += 1
        assert pending == filed + queued + reserved, (
            f"pending {pending} != filed {filed} + queued {queued} + runs {reserved}"
        )
        assert pending <= self._limit, f"pending {pending} > max_pending {self._limit}"

    # -- waking the driver ----------------------------------------------------------

    def _sync_wakeup(self, live: _Running) -> None:
        """Point the driver at the wheel's earliest occupied bucket (or nowhere)."""
        when = live.wheel.next_expiry()
        if when is None:
            self._wake_at = _INF
            live.driver.disarm()
        else:
            self._wake_at = when
            live.driver.arm(when)

    def _sync_wakeup_unless_passing(self) -> None:
        # The deferred re-check after a cancel emptied the armed bucket; a pass in
        # progress re-arms at its end anyway.
        live = self._live
        if live is not None and self._wake_at != -_INF:
            self._sync_wakeup(live)

    # -- the driver's pass ----------------------------------------------------------

    def _fire_due(self) -> None:
        """Advance the wheel to now and run what expired. Called by the driver.

        Raises nothing but ``SystemExit``/``KeyboardInterrupt``, and whatever it raises
        the driver is re-armed on the way out."""
        live = self._live
        if live is None:
            return
        self._wake_at = -_INF
        self._wakeups += 1
        try:
            now = live.clock()
            buckets = live.wheel.advance(now)
        except BaseException as exc:
            self._wake_at = _INF
            self._break(exc)
            if isinstance(exc, _EXIT):
                raise
            return
        try:
            if buckets:
                self._dispatch(live, buckets, now)
        finally:
            self._wake_at = _INF
            if self._live is not None:
                try:
                    live.wheel.release()  # what the pass did not reach: filed again
                    self._sync_wakeup(live)
                except BaseException as exc:
                    self._break(exc)
                    if isinstance(exc, _EXIT):
                        raise
            if self._room_waiters:
                self._wake_room()
            if self._idle_waiters and not self._pending and live.pool.busy <= 1:
                self._wake_idle()  # the drainer re-checks (it may be running itself)

    def _dispatch(self, live: _Running, buckets: list[Bucket], now: float) -> None:
        waiters = self._waiters
        recorder = self._tracing
        lateness_max = self._lateness_max
        fired = failed = 0
        index = 0
        # Declared here so that `finally` can drop them: a stored exception's
        # traceback keeps this frame alive (through its callers' f_back), and the
        # frame must not keep the last handle or outcome alive with it. (Typed, so
        # that compiled, its attributes are read and written natively, not by name.)
        handle: TimerHandle[Any] | None = None
        outcome: Any = None
        result: Any = None
        try:
            for index, bucket in enumerate(buckets):  # noqa: B007 - used after the loop
                # One at a time off the front: a callback may cancel or re-arm later
                # handles of this bucket, which unlinks them.
                while True:
                    # Release the previous handle and its outcome here, between two
                    # handles: dropping the last reference may run a finalizer (user
                    # code), which must not run between the pop below and the count
                    # (docs/design.md, "Re-entrancy").
                    handle = entry = None
                    outcome = result = None
                    entry = bucket.pop_first()
                    if entry is None:
                        break
                    handle = cast("TimerHandle[Any]", entry)  # the timer files only these
                    self._pending -= 1
                    lateness = now - handle._deadline
                    if lateness > lateness_max:
                        lateness_max = lateness
                    if recorder is not None:
                        # The trace row describes this firing: read it before the
                        # callback runs, since a callback may re-arm its own handle.
                        # (A traced timer files only traced handles.)
                        traced = cast("TracedHandle[Any]", handle)
                        row_id = traced._id
                        row_label = traced._label
                        row_scheduled_at = traced._scheduled_at
                        row_deadline = traced._deadline
                        row_level = traced._level
                    fired += 1
                    try:
                        # In the context captured at schedule time (loop.call_later's
                        # rule); without arguments, no tuple is built for the call.
                        args = handle._args
                        if args:
                            result = handle._context.run(handle._callback, *args)
                        else:
                            result = handle._context.run(handle._callback)
                    except _EXIT as exc:
                        # Settle this one, then let it stop the loop; `except` below
                        # files again what this pass had not reached.
                        failed += 1
                        outcome = _Failure(without_frame(exc))
                        if handle._bucket is None:
                            handle._result = outcome
                        self._settle(handle, outcome)
                        raise
                    except BaseException as exc:
                        # Anything else a callback raises, CancelledError and
                        # GeneratorExit included, is its failure alone (asyncio's
                        # Handle._run does the same).
                        failed += 1
                        outcome = _Failure(without_frame(exc))
                        if handle._bucket is None:  # unless it re-armed itself
                            handle._result = outcome
                        try:
                            self._report(handle, exc)  # on_error may re-arm the handle
                        except _EXIT:
                            self._settle(handle, outcome)  # on_error's SystemExit...
                            raise
                    else:
                        if result is not None and hasattr(type(result), "__await__"):
                            fired -= 1  # it fires when a worker starts it
                            self._pending += 1
                            live.pool.submit(handle, result)
                            continue
                        outcome = result
                        if handle._bucket is None:
                            handle._result = result
                    if waiters:
                        self._settle(handle, outcome)
                    if recorder is not None:
                        try:
                            recorder.record(
                                row_id,
                                row_label,
                                row_scheduled_at,
                                row_deadline,
                                row_level,
                                now,
                                None,
                            )
                        except _EXIT:
                            raise
                        except BaseException as exc:
                            self._recorder_failed(exc)
                            recorder = None
        except BaseException as exc:
            # SystemExit/KeyboardInterrupt (from a callback or on_error): put back
            # what this pass did not get to, so nothing pending is lost.
            self._refile(live, buckets[index:])
            if isinstance(exc, _EXIT):
                raise
            logger.exception("aiowheel: the pass stopped early; the rest fires next pass")
        finally:
            self._fired += fired
            self._failed += failed
            self._lateness_max = lateness_max
            handle = outcome = result = None

    def _refile(self, live: _Running, buckets: list[Bucket]) -> None:
        # One at a time: each entry stays linked (pending, findable by aclose) until
        # it is filed again.
        wheel = live.wheel
        for bucket in buckets:
            entry = bucket.pop_first()
            while entry is not None:
                wheel.insert(entry, entry._deadline)
                entry = bucket.pop_first()

    def _report(self, handle: TimerHandle[Any], exc: BaseException) -> None:
        try:
            result = self._on_error(handle, exc)
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
                _ASYNC_ON_ERROR,
                handle,
                exc_info=exc,
            )

    def _trace(
        self, handle: TracedHandle[Any], fired_at: float | None, cancelled_at: float | None
    ) -> None:
        recorder = self._tracing
        if recorder is not None:
            try:
                recorder.record(
                    handle._id,
                    handle._label,
                    handle._scheduled_at,
                    handle._deadline,
                    handle._level,
                    fired_at,
                    cancelled_at,
                )
            except _EXIT:
                raise
            except BaseException as exc:
                self._recorder_failed(exc)

    def _recorder_failed(self, exc: BaseException) -> None:
        # A recorder only observes: its failure must cost no timer anything (a raise
        # out of the pass used to re-file the rest, so one timer fired per pass; out
        # of cancel() or aclose() it reached the caller, and aclose() left waiters
        # unsettled). So tracing stops here with one error logged, not one per row,
        # and aclose() still closes the recorder. (Once: the pass holds the recorder in
        # a local, and a callback's cancel() may have let it go meanwhile.)
        if self._tracing is None:
            return
        self._tracing = None
        logger.error(
            "aiowheel: the trace recorder failed; this timer records no more rows",
            exc_info=exc,
        )

    def _settle(self, handle: TimerHandle[Any], outcome: Any) -> None:
        waiter = self._waiters.pop(handle, None)
        if waiter is not None:
            waiter.outcome = outcome
            waiter.event.set()

    # -- the worker pool's host (see _dispatch.JobHost) ----------------------------------

    def _job_started(self, handle: TimerHandle[Any]) -> None:
        self._pending -= 1
        self._fired += 1
        if isinstance(handle, PeriodicHandle):
            self._periodic_begin(handle)
        live = self._live
        now = live.clock() if live is not None else handle._deadline
        lateness = now - handle._deadline
        if lateness > self._lateness_max:
            self._lateness_max = lateness
        if isinstance(handle, TracedHandle):
            self._trace(handle, now, None)
        if self._room_waiters:
            self._wake_room()

    def _job_failed(self, handle: TimerHandle[Any], exc: BaseException) -> None:
        self._failed += 1
        self._report(handle, exc)

    def _job_ended(self, handle: TimerHandle[Any], outcome: Any, *, last: bool) -> None:
        if isinstance(outcome, _Failure) and isinstance(outcome.exc, _EXIT):
            self._failed += 1
        if isinstance(handle, PeriodicHandle):
            self._periodic_end(handle)  # the next period, before the settling below
        # A handle re-armed while it ran may have a newer run still going, or be
        # pending again: then wait() waits for that one (the newest firing).
        if last and handle._bucket is None:
            if handle._result is _RUNNING:
                handle._result = outcome
            if self._waiters:
                self._settle(handle, outcome)
        live = self._live
        busy = live.pool.busy if live is not None else 0
        if self._idle_waiters and not self._pending and busy <= 1:
            self._wake_idle()  # the drainer re-checks (it may be running itself)

    def _job_stopped(self, handle: TimerHandle[Any]) -> None:
        # aclose() cancelled the worker and already settled the handle as
        # cancelled-while-running; anything else cancelling a worker is treated the
        # same way.
        if isinstance(handle, PeriodicHandle):
            handle._in_run = False  # the close stopped it
        if handle._result is _RUNNING:
            stopped = _Failure(TimerCancelled(f"{handle!r} was cancelled while running"))
            handle._result = stopped
            self._settle(handle, stopped)

    # -- backpressure -----------------------------------------------------------------

    async def _wait_for_room(self) -> None:
        while self._pending >= self._limit:
            if self._live is None:
                raise self._closed()
            event = anyio.Event()
            self._room_waiters.append(event)
            self._notify_cancel = True
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

    # -- threads ----------------------------------------------------------------------

    def call_threadsafe(self, fn: Callable[[*Ts], T], *args: *Ts) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on the timer's event loop, from any thread.

        Returns a ``concurrent.futures.Future`` of its result (or exception):
        ``timer.call_threadsafe(handle.cancel).result()`` cancels from a worker
        thread. Never call ``.result()`` on the loop's own thread: it would wait for
        the loop it blocks. On a closed timer the future raises ``TimerClosed``.
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        live = self._live
        if live is None:
            future.set_exception(self._closed())
            return future

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
                if isinstance(exc, _EXIT):
                    raise
            else:
                future.set_result(result)

        try:
            live.call_soon_threadsafe(run)
        except Exception as exc:  # the loop is closed, or trio's run has finished
            error = self._closed()
            error.__cause__ = exc
            future.set_exception(error)
        return future

    @overload
    def schedule_threadsafe(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], Awaitable[T]],
        *args: *Ts,
        label: str | None = None,
    ) -> concurrent.futures.Future[TimerHandle[T]]: ...

    @overload
    def schedule_threadsafe(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], T],
        *args: *Ts,
        label: str | None = None,
    ) -> concurrent.futures.Future[TimerHandle[T]]: ...

    def schedule_threadsafe(
        self,
        delay: SupportsFloat,
        callback: Callable[[*Ts], Any],
        *args: *Ts,
        label: str | None = None,
    ) -> concurrent.futures.Future[TimerHandle[Any]]:
        """``schedule_nowait`` from any thread: a ``concurrent.futures.Future`` of the
        handle. The delay counts from when the loop runs the request."""
        seconds(delay)
        check_callable(callback)
        return self.call_threadsafe(self._schedule_labelled, delay, callback, label, args)

    def _schedule_labelled(
        self,
        delay: SupportsFloat,
        callback: Callable[..., Any],
        label: str | None,
        args: tuple[Any, ...],
    ) -> TimerHandle[Any]:
        return self.schedule_nowait(delay, callback, *args, label=label)

    # -- conveniences -------------------------------------------------------------------

    async def sleep(self, delay: SupportsFloat) -> None:
        """Sleep ``delay`` seconds on this timer's wheel."""
        await self.sleep_until(self.time() + seconds(delay))

    async def sleep_until(self, deadline: SupportsFloat) -> None:
        """Sleep until ``deadline`` on the loop clock. ``TimerClosed`` if the timer is
        closed meanwhile (``aclose(drain=True)`` lets the sleep end first)."""
        wake = Wake()
        handle = await self.schedule_at(deadline, wake)
        try:
            await wake.event.wait()
        finally:
            handle.cancel()
        if wake.closed:
            # aclose() cancelled it: the sleep would never end (TimerClosed, as for
            # every call on a closed timer).
            raise self._closed()

    def timeout(self, delay: SupportsFloat) -> Timeout:
        """``with timer.timeout(delay) as t:`` cancels the block and raises
        ``TimeoutError`` when ``delay`` passes first; ``t.reset(delay)`` pushes the
        deadline out (an idle timeout). If the timer is closed (``aclose()``) while
        the block runs, the block is cancelled and raises ``TimerClosed``."""
        delay = to_seconds(delay)
        live = self._open()
        return Timeout(self, delay, live.loop is None)  # trio: no asyncio loop


def _not_started_clock() -> float:
    raise TimerClosed("the timer is not started: use `async with Timer() as timer:`")


def _level_of(handle: TimerHandle[Any]) -> int:
    """The wheel the handle is filed in (-1: due at once)."""
    bucket = handle._bucket
    return bucket.level if bucket is not None else -1
