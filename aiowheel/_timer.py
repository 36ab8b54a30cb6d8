"""The Timer: the public API, validation, admission and the lifecycle.

``Timer`` (here) is the public API: it checks every call, admits timers under
``max_pending``, starts and closes (the order of the steps), and keeps the hottest
path inline (``schedule_nowait``). Everything else is another module's, and
docs/design.md, "Module map", says whose: the inside face the handles see is its base
class ``TimerLifecycle`` (``_lifecycle.py``); a started timer's state, counters,
filing and accounting are ``Engine``'s (``_engine.py``), the pass that runs what
expired ``_pass.py``'s, the close ``_shutdown.py``'s.

The engine exists from ``__aenter__`` on; ``self._live`` is that engine exactly while
the timer accepts timers. So every entry point starts with one test, ``live is
None``, and the rest of its code needs no ``Optional`` checks.

The lock. Kafka holds a write lock while its reaper advances the wheel so that ``add``
never sees a half-advanced hierarchy. Here the event loop is that lock: ``advance`` is
synchronous and returns only once the hierarchy is consistent and every due bucket is
detached, and the pass never awaits. A callback that schedules or cancels while the
pass runs sees a finished wheel; the pass never has to suspend mid-flush to wait for
worker capacity, because expired async callbacks wait in the pool's run queue (where
they still count as pending, so ``max_pending`` bounds them).

Failure containment (docs/design.md, guarantee 5). Every public call validates all
of its arguments before it changes anything. The pass catches every exception of a
callback and of ``on_error`` (``_pass.callback_failed``); only ``SystemExit`` and
``KeyboardInterrupt`` escape it, after the callbacks it had not reached are filed
again, and whatever escapes, the pass re-arms the driver on its way out. An exception
from the wheel itself (a bug) closes the timer and makes every later call say why.

Loop affinity (the *owner check*). A timer belongs to the event loop that started it.
Every call that changes it compares the calling thread with the loop's
(``_thread.get_ident()``, about 45 ns here) and raises ``RuntimeError`` for a foreign
caller; threads go through ``call_threadsafe``/``schedule_threadsafe``. In the owner's
thread, a second event loop (the owner one stopped between two ``run_until_complete``,
another one running; an asyncio loop nested in trio's thread) is caught by
``Affinity.elsewhere()`` (``_affinity.py``), which asks the owner loop whether it
runs, in one attribute read or one C call (20-40 ns); every call that changes the
timer makes both tests. The obvious test, ``asyncio._get_running_loop() is loop``,
makes a ``getpid()`` system call whenever a loop runs (about 230-350 ns on CPython
3.11, more than a whole ``cancel()``), so only the calls that wait or set things up
(``wait``, ``aclose``, ``every``, ``timeout``, ``schedule``/``schedule_at`` waiting
for room) make it too. ``TimerLifecycle._live_on_owner_loop`` checks the thread and
``elsewhere()`` (``Affinity.here``), ``TimerLifecycle._live_on_owner_loop_running``
the running loop too (``Affinity.check``).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import sys
from _thread import get_ident
from collections.abc import Awaitable, Callable
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
    overload,
)

import anyio

from . import _threads
from ._awaits import quiet
from ._checks import (
    check_callable,
    check_int,
    check_label,
    full,
    not_copyable,
    seconds,
    shown,
)
from ._driver import current_clock
from ._engine import ASYNC_ON_ERROR, Engine, TimerStats
from ._handle import (
    TimerHandle,
    TracedHandle,
    to_seconds,
)
from ._host import Host
from ._lifecycle import _CLOSED, _DRAINING, _NEW, _OPEN, TimerLifecycle
from ._periodic import PeriodicHandle
from ._shutdown import close_engine
from ._timeout import Timeout, sleep_until
from ._tracing import sample_every

if TYPE_CHECKING:
    from .trace import TraceRecorder

__all__ = ["Timer", "TimerStats"]  # TimerStats: _engine's, re-exported

logger: Final = logging.getLogger("aiowheel")

T = TypeVar("T")
# The callback's positional arguments, checked against ``*args`` (as typeshed types
# ``loop.call_later``). Not a ParamSpec: ``P.args`` must come with ``P.kwargs``, and
# the scheduling calls pass no keyword arguments to the callback (``label`` is theirs).
Ts = TypeVarTuple("Ts")
# Final: compiled, these are C statics rather than lookups in the module's dict on
# every use (docs/design.md, "Rules for compiled modules").
_ONE_RESOURCE: Final = "a timer is one resource of its event loop; share the timer itself"
_get_ident: Final = get_ident

# Bounds of the constructor's arguments: a tick below a microsecond is finer than any
# loop clock; a wheel of more than 65,536 buckets costs seconds to build and gains
# nothing (levels are added on demand).
MIN_TICK = 1e-6
MAX_TICK = 86_400.0
MAX_WHEEL_SIZE = 1 << 16


def _log_error(handle: TimerHandle[Any], exc: BaseException) -> None:
    logger.error("timer callback %r raised", handle, exc_info=exc)


class Timer(TimerLifecycle):
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
        row per timer when it ends; a timer without one pays nothing for tracing. A
        recorder with ``every=k`` samples: one timer in k is traced (the 1st, the
        k+1-th...), the others pay nothing either (``TypeError``/``ValueError`` here
        when ``every`` is not an int of at least 1).
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
            raise TypeError(f"on_error is an async function; {ASYNC_ON_ERROR}")
        if recorder is not None:
            sample_every(recorder)  # a bad sampling rate fails here, not at the start
        on_error_ = on_error if on_error is not None else _log_error
        super().__init__(tick_, size, limit, concurrency, on_error_, recorder)

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Timer:
        if self._state is not _NEW:
            raise RuntimeError("a Timer can be started only once")
        # The tasks the engine runs in, and the recorder's opening, are the host's
        # (aiowheel/_host.py); if it raises, nothing it started is left running.
        host = self._host = Host(self._new_engine, self._recorder)
        self._started(await quiet(host.start()))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        with anyio.CancelScope(shield=True):
            await self.aclose()
        if self._host is not None:
            await quiet(self._host.exit(self._engine))  # every worker, then the task group
        return False

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
        live.affinity.check()  # the owner loop running (Affinity.check)
        if live.loop_timers:
            raise RuntimeError("this is an event loop's timer (loop.timer): loop.close() closes it")
        if drain and self._state is _OPEN:
            self._state = _DRAINING
            live.start_draining()
            for periodic in list(live.periodics.active):
                periodic.cancel()
            await live.waiters.drain()
        host = self._host
        assert host is not None  # an open timer's, but loop.timer's (refused above)
        if self._state is _CLOSED:
            # Closed during the drain, by a callback's aclose(): this call too returns
            # once every running callback (but its own caller) has ended, the closer
            # included, as aclose() does below.
            await quiet(host.join(live))
            return []
        cancelled = close_engine(live)
        # Whoever calls, every running callback has ended when aclose() returns, but
        # the one that calls it (its worker would wait for itself). A task that a
        # callback started is not that callback: the callback is cancelled, and
        # waited for (docs/usage.md, "Shutting down").
        await quiet(host.join(live))
        await quiet(host.close_recorder())
        return cancelled

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
        return live.backend.name if live is not None else ""

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` has run (or started)."""
        return self._state is _CLOSED

    def __len__(self) -> int:
        """Pending timers, exact at every moment (expired async callbacks still
        waiting for a worker included)."""
        engine = self._engine
        return engine.pending if engine is not None else 0

    def stats(self) -> TimerStats:
        """A snapshot of the counters; zeros on a timer that is not started."""
        engine = self._engine
        if engine is None:
            return TimerStats(0, 0, 0, 0, 0, 0, 0.0)
        live = self._live
        # A closed timer's wheel is gone: its last count of levels stays.
        return engine.snapshot(live.wheel.levels if live is not None else self._levels)

    def next_deadline(self) -> float | None:
        """When the driver next wakes (the earliest occupied bucket), or None."""
        live = self._live
        return live.next_deadline() if live is not None else None

    def __repr__(self) -> str:
        return (
            f"<Timer {self._state.value} tick={self._tick} wheel_size={self._wheel_size} "
            f"pending={len(self)}>"
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
        # The hot path: kept flat (no helper calls but on errors) on purpose; each
        # inline copy names its rule.
        live = self._live
        if live is None:
            raise self._closed_error()
        # inline copy of the owner check, Affinity.here
        if _get_ident() != self._loop_thread or live.affinity.elsewhere():
            raise live.affinity.foreign()
        # A finite float passes with two tests; anything else goes through the rule.
        seconds_ = delay if type(delay) is float and delay - delay == 0.0 else to_seconds(delay)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {shown(callback)}")
        if label is not None and type(label) is not str:
            check_label(label)
        if live.pending >= self._limit:  # inline copy of admission (Engine.admit)
            raise full(live.pending, self._limit)
        now = live.clock()
        if live.tracing is not None and live.tracing.pick():
            return self._add_traced(live, now + seconds_, now, callback, args, label)
        handle: TimerHandle[Any] = TimerHandle(self, callback, args)
        if seconds_ > 0:
            when = live.wheel.insert(handle, now + seconds_)  # raises only before filing
        else:
            # Due now: the next pass, not the next tick.
            when = live.wheel.insert_due(handle, now + seconds_)
        if live.closed:  # inline copy of Engine.file's closed-while-filing check
            live.closed_while_filing(handle, True)
        live.pending += 1  # inline copy of Engine.reserve_slot
        live.scheduled += 1
        if when < live.wake_at:  # inline copy of Engine.arm_if_earlier
            live.wake_at = when
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
        live = self._live_on_owner_loop()
        deadline = seconds(deadline, "deadline")
        check_callable(callback)
        live.admit()
        now = live.clock()
        if live.tracing is not None and live.tracing.pick():
            return self._add_traced(live, deadline, now, callback, args, label)
        handle: TimerHandle[Any] = TimerHandle(self, callback, args)
        live.file(handle, deadline, deadline <= now, new=True)
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
        live = self._live
        if live is not None and live.pending >= self._limit:
            self._live_on_owner_loop_running()
            seconds(delay)
            check_callable(callback)
            await live.waiters.wait_for_room()
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
        live = self._live
        if live is not None and live.pending >= self._limit:
            self._live_on_owner_loop_running()
            seconds(deadline, "deadline")
            check_callable(callback)
            await live.waiters.wait_for_room()
        return self.schedule_at_nowait(deadline, callback, *args, label=label)

    def _add_traced(
        self,
        live: Engine,
        deadline: float,
        now: float,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        label: str | None,
    ) -> TimerHandle[Any]:
        # A timer the trace keeps (Tracer.pick) gets a handle that carries what its
        # rows need; the others are plain handles.
        handle: TracedHandle[Any] = TracedHandle(self, callback, args)
        tracing = live.tracing
        assert tracing is not None
        handle._stamp(tracing, tracing.seen, label, now)
        live.file(handle, deadline, deadline <= now, new=True)
        return handle

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
        live = self._live_on_owner_loop_running()
        if self._state is not _OPEN:
            # Draining: aclose(drain=True) has cancelled the periodic timers.
            raise self._closed_error()
        period = seconds(interval, "interval")
        if not period > 0:
            raise ValueError(f"interval must be a positive finite number, got {interval!r}")
        check_callable(callback)
        if not isinstance(fixed_rate, bool):
            raise TypeError(f"fixed_rate must be a bool, got {fixed_rate!r}")
        check_label(label)
        return live.periodics.start(self, callback, args, period, fixed_rate, label)

    # -- threads ----------------------------------------------------------------------

    def call_threadsafe(self, fn: Callable[[*Ts], T], *args: *Ts) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on the timer's event loop, from any thread.

        Returns a ``concurrent.futures.Future`` of its result (or exception):
        ``timer.call_threadsafe(handle.cancel).result()`` cancels from a worker
        thread. Never call ``.result()`` on the loop's own thread: it would wait for
        the loop it blocks. On a closed timer the future raises ``TimerClosed``.
        """
        return _threads.call_threadsafe(self._backend_if_open(), self._closed_error, fn, args)

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
        return _threads.schedule_threadsafe(
            self._backend_if_open(),
            self._closed_error,
            self.schedule_nowait,
            delay,
            callback,
            args,
            label,
        )

    # -- conveniences -------------------------------------------------------------------

    async def sleep(self, delay: SupportsFloat) -> None:
        """Sleep ``delay`` seconds on this timer's wheel."""
        await self.sleep_until(self.time() + seconds(delay))

    async def sleep_until(self, deadline: SupportsFloat) -> None:
        """Sleep until ``deadline`` on the loop clock. ``TimerClosed`` if the timer is
        closed meanwhile (``aclose(drain=True)`` lets the sleep end first)."""
        await sleep_until(self, deadline)

    def timeout(self, delay: SupportsFloat) -> Timeout:
        """``with timer.timeout(delay) as t:`` cancels the block and raises
        ``TimeoutError`` when ``delay`` passes first; ``t.reset(delay)`` pushes the
        deadline out (an idle timeout). If the timer is closed (``aclose()``) while
        the block runs, the block is cancelled and raises ``TimerClosed``."""
        # A finite float passes with two tests (as in schedule_nowait); anything else
        # goes through the rule.
        seconds_ = delay if type(delay) is float and delay - delay == 0.0 else to_seconds(delay)
        live = self._live
        # The per-call owner check (Affinity.here, as schedule_nowait's): the full one
        # asks asyncio for the running loop, a getpid() system call on 3.11, once per
        # block (the block's task is found on the backend's own loop: TaskCancel).
        if live is None:
            raise self._closed_error()
        if _get_ident() != self._loop_thread or live.affinity.elsewhere():
            raise live.affinity.foreign()
        return Timeout(self, seconds_, live.backend)
