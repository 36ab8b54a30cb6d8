"""Drivers: what wakes the timer when the earliest occupied bucket comes due.

This replaces Kafka's reaper thread blocked in ``DelayQueue.poll``. A driver knows
one thing, the instant of its next wake-up, and calls ``on_wakeup`` then. It never
wakes periodically: with no timers it is not armed at all. What it wakes is the
timer's pass (``_pass.fire_due``), which never raises but for ``SystemExit`` and
``KeyboardInterrupt`` and re-arms the driver itself (docs/design.md, guarantee 5).

* ``AsyncioDriver`` uses one ``loop.call_at`` handle. Re-arming it (only when a timer
  lands in a bucket earlier than the armed one) costs a handle cancel and a heap push
  in the loop; a task step per wake-up would cost several times more.
* ``AnyioDriver`` is one task sleeping in a ``CancelScope`` whose deadline is the next
  wake-up; re-arming is an assignment to ``scope.deadline``. It is used on trio (and
  works on any anyio backend).

Both read time only from the loop's clock, so virtual clocks (``looptime``,
``trio.testing.MockClock``) drive them.

The backend seam (anyio's shape: one class per backend). Everything the core does
differently on asyncio/uvloop and on trio is a method of ``AsyncioBackend`` or
``TrioBackend``: the clock, the thread-safe call, the driver, and how the worker pool
starts, joins and tells its own cancellation apart, and how ``timer.timeout()``
cancels its block (``TaskCancel``, ``ScopeCancel``). The engine, the pool, the timer
and the timeout hold a ``Backend`` and never branch on its name; a new backend (or the drop-in event
loop) is one more class here.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Coroutine
from contextvars import Context, copy_context
from types import TracebackType
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ._awaits import quiet

_C = TypeVar("_C")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # not a runtime dependency: the pure core only needs a no-op

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_C], _C]:
        return lambda cls: cls


__all__ = [
    "AnyioDriver",
    "AsyncioBackend",
    "AsyncioDriver",
    "Backend",
    "BlockCancel",
    "Driver",
    "ScopeCancel",
    "TaskCancel",
    "TrioBackend",
    "backend_name",
    "loop_clock",
    "make_backend",
    "round_up",
]

_INF = math.inf
_NAN = math.nan
_ceil = math.ceil
# Past this (about 31 years of loop time) a microsecond is near float resolution.
_ROUNDING_LIMIT = 1e9


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The cheapest callable returning ``loop.time()``.

    ``BaseEventLoop.time`` is a Python method around ``time.monotonic``; when the loop
    does not override it (looptime and other virtual clocks do), call the C function
    directly and save a Python frame per call. (The bound method tells both a class
    and an instance override apart without asking for the loop's ``__dict__``, which
    would slow every attribute access of the loop's own methods: aiowheel/_affinity.py,
    ``_AsyncioAffinity.elsewhere``.)
    """
    if getattr(loop.time, "__func__", None) is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


def round_up(when: float, grid: float) -> float:
    """The first instant at or after ``when`` on a clock that counts units of
    ``1 / grid`` seconds."""
    units = _ceil(when * grid)
    if units / grid < when:
        units += 1  # when * grid rounded down onto an integer: one ulp short
    return units / grid


def backend_name() -> str:
    """``"asyncio"``, ``"uvloop"`` or ``"trio"``: what is running in this thread."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        # aiowheel's drop-in loop says which base it wraps (aiowheel/_loop.py,
        # loop_base): its class lives in aiowheel, not in uvloop's module.
        base = getattr(type(loop), "_aiowheel_base", None)
        if isinstance(base, str):
            return base
        return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return "trio"
    raise RuntimeError("aiowheel needs a running asyncio or trio event loop")


def current_clock() -> Callable[[], float]:
    """The clock of the running event loop (asyncio ``loop.time``, trio ``current_time``)."""
    name = backend_name()
    if name == "trio":
        import trio

        # Annotated: where the build has no trio (it is optional), trio is Any.
        clock: Callable[[], float] = trio.current_time
        return clock
    return loop_clock(asyncio.get_running_loop())


class Driver(Protocol):
    """What the timer asks of a driver."""

    async def start(self, tg: TaskGroup) -> None:
        """Start waking (a task driver starts its task in ``tg``)."""

    def arm(self, when: float) -> None:
        """Wake at ``when`` (loop clock), instead of any earlier arming; ``-inf``: at
        once (the next loop iteration)."""

    def disarm(self) -> None:
        """Do not wake."""

    def armed_for(self, when: float) -> bool:
        """Whether the driver will wake at ``when`` as ``arm(when)`` arms it (and not
        before): so that a re-check need not arm again."""

    def clock_changed(self) -> None:
        """The clock the wake-up was armed on changed (a drop-in loop's ``time``
        patched or restored): armed for nothing ``armed_for`` can vouch for, until the
        next ``arm``."""

    def recheck(self, check: Callable[[], None]) -> None:
        """Run ``check`` soon, before any timer of the next loop iteration."""

    def stop(self) -> None:
        """Stop for good (the timer is closing)."""


class AsyncioDriver:
    """Wakes the timer with a single ``call_at`` handle on the running loop."""

    __slots__ = (
        "_armed",
        "_call_at",
        "_call_soon",
        "_context",
        "_grid",
        "_handle",
        "_loop",
        "_on_wakeup",
        "_recheck",
    )

    def __init__(
        self,
        on_wakeup: Callable[[], None],
        loop: asyncio.AbstractEventLoop | None = None,
        grid: float | None = None,
        call_at: Callable[..., asyncio.Handle] | None = None,
        call_soon: Callable[..., asyncio.Handle] | None = None,
    ) -> None:
        # By default the running loop, its grid, its call_at and its call_soon (the
        # wake-up for "now"); the drop-in loop (aiowheel/_loop.py) gives its own,
        # before it runs, with its base class's call_at (its override would file the
        # wake-up on the wheel it wakes) and its own rule for "now".
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._on_wakeup = on_wakeup
        self._handle: asyncio.Handle | None = None
        # What the live handle was armed for (arm's ``when``, before rounding).
        self._armed = _INF
        # Wake-ups are rounded up to the loop clock's grid (see arm): uvloop keeps
        # whole milliseconds; for the others a microsecond covers the virtual clocks.
        if grid is None:
            grid = 1e3 if backend_name() == "uvloop" else 1e6
        self._grid = grid
        self._call_at = call_at if call_at is not None else self._loop.call_at
        self._call_soon = call_soon if call_soon is not None else self._loop.call_soon
        self._recheck: Callable[[], None] | None = None
        # The context every wake-up (the pass) and re-check runs in: the timer's own,
        # copied where the timer was made, and given to every call_at and call_soon.
        # Without it the base loop copies the caller's context, and the caller of
        # arm() is whichever task filed the earliest timer: the pass, its error
        # reports (on_error, the loop's exception handler, the logger) and the
        # worker tasks it starts (each copies the pass's context for its whole life)
        # would run in a stranger's request context and keep it alive. trio's driver
        # is a task of the timer's own, which has the same rule by construction.
        self._context: Context = copy_context()

    def recheck(self, check: Callable[[], None]) -> None:
        """Run ``check`` once, early in the next loop iteration (coalesced)."""
        if self._recheck is None:
            self._recheck = check
            try:
                self._loop.call_soon(self._run_recheck, context=self._context)
            except BaseException:
                # Not queued (a closed loop, debug mode's thread check): not latched
                # either, or every later re-check would be dropped (issue 28,
                # finding 6).
                self._recheck = None
                raise

    def _run_recheck(self) -> None:
        check = self._recheck
        self._recheck = None
        if check is not None:
            check()

    async def start(self, tg: TaskGroup) -> None:
        pass  # call_at needs no task

    def stop(self) -> None:
        self.disarm()

    def arm(self, when: float) -> None:
        # The new wake-up first, the old one cancelled once it exists: an arm that
        # raises (the base loop refused the call) leaves the previous arming in place,
        # which the engine's wake_at still describes (issue 28, finding 4).
        old = self._handle
        if when == -_INF:
            self._handle = self._call_soon(self._wake, context=self._context)
            self._armed = when
            if old is not None:
                old.cancel()
            return
        armed = when
        if when < _ROUNDING_LIMIT:
            # Round the wake-up *up* to the loop clock's grid. A bucket's time,
            # origin + start * tick, is on no clock's grid, and a loop whose clock
            # counts whole units may wake us for it one unit early and then never move:
            # uvloop rounds a call_at delay to whole milliseconds, so a wake-up less
            # than half a millisecond ahead becomes a 0 ms timer on an unchanged clock
            # (the driver would spin until the millisecond turns); an integer-
            # microsecond virtual clock (looptime) asked to sleep a few nanoseconds
            # rounds the step to zero, for ever. One grid unit of lateness at most
            # (on uvloop its clock's own resolution), and never early.
            when = round_up(when, self._grid)
        self._handle = self._call_at(when, self._wake, context=self._context)
        self._armed = armed
        if old is not None:
            old.cancel()

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def armed_for(self, when: float) -> bool:
        return self._handle is not None and self._armed == when

    def clock_changed(self) -> None:
        self._armed = _NAN  # equal to no time

    def _wake(self) -> None:
        self._handle = None
        self._on_wakeup()


class AnyioDriver:
    """One task that sleeps until the next wake-up in a movable ``CancelScope``."""

    __slots__ = ("_deadline", "_on_wakeup", "_recheck", "_scope", "_stopped")

    def __init__(self, on_wakeup: Callable[[], None]) -> None:
        self._on_wakeup = on_wakeup
        self._deadline = _INF
        self._scope: anyio.CancelScope | None = None
        self._stopped = False
        self._recheck: Callable[[], None] | None = None

    def arm(self, when: float) -> None:
        self._deadline = when
        scope = self._scope
        if scope is not None:
            scope.deadline = when

    def disarm(self) -> None:
        self.arm(_INF)

    def armed_for(self, when: float) -> bool:
        # Not while a re-check is pending: it moved the one deadline to -inf.
        return self._deadline == when and self._recheck is None

    def clock_changed(self) -> None:
        pass  # trio's clock is the run's: no loop patches it under the driver

    def recheck(self, check: Callable[[], None]) -> None:
        """Run ``check`` once, when the driver task next runs (coalesced).

        Not at once: every move of a cancel scope's deadline pushes an entry onto
        trio's deadline heap, which keeps the stale ones until its next scheduler
        pass, so a burst of schedule + cancel re-checking each time would grow that
        heap by one entry per cycle (docs/design.md, guarantee 6). One move to -inf
        wakes the task at the next pass; re-arms meanwhile may move the deadline
        later, which only delays the check to a wake-up that was due anyway."""
        if self._recheck is None:
            self._recheck = check
            self.arm(-_INF)

    async def start(self, tg: TaskGroup) -> None:
        await quiet(tg.start(self.run))

    def stop(self) -> None:
        self._stopped = True
        self.arm(-_INF)  # wake the task: it sees _stopped and returns

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while not self._stopped:
            # Invariant: while we sleep, _scope.deadline is the wake-up instant; while
            # the timer's pass runs, _scope is None and arming only records _deadline.
            with anyio.CancelScope(deadline=self._deadline) as scope:
                self._scope = scope
                await quiet(anyio.sleep_forever())
            self._scope = None
            self._deadline = _INF
            check = self._recheck
            self._recheck = None
            if not self._stopped:
                if check is not None:
                    # Woken for a re-check (or due meanwhile: the check re-arms for
                    # the due bucket, at or before now; the next round wakes at once).
                    check()
                else:
                    self._on_wakeup()


Worker = Callable[[], Coroutine[Any, Any, None]]


class BlockCancel(Protocol):
    """How ``timer.timeout()`` cancels the block it guards (aiowheel/_timeout.py):
    opened as the block is entered, ``cancel()`` when the deadline comes (or the timer
    closes under it), ``leave()`` as the block ends."""

    def cancel(self) -> None:
        """Cancel the block (the deadline's callback calls it, once)."""

    def leave(
        self,
        cancelled: bool,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """The block ends; ``cancelled`` says whether ``cancel()`` was called.
        None when the block ended by that cancellation (the timeout raises its own
        error); else what ``__exit__`` returns."""


class TaskCancel:
    """asyncio and uvloop: ``asyncio.timeout``'s own mechanism. The deadline cancels
    the task (``task.cancel()``); leaving takes that request back (``task.uncancel()``)
    and the ``CancelledError`` is the timeout's only when no other cancellation came
    meanwhile, so a cancellation from outside wins and nested scopes unwind one at a
    time."""

    __slots__ = ("_cancelling", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # The task of the timer's own loop (the caller passed the owner check): asked
        # of that loop, not of asyncio's running-loop lookup, a getpid() per call on
        # CPython 3.11.
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("timer.timeout() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()

    def cancel(self) -> None:
        self._task.cancel()

    def leave(
        self,
        cancelled: bool,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if not cancelled:
            return False
        if self._task.uncancel() > self._cancelling or exc_type is None:
            return False
        if not issubclass(exc_type, asyncio.CancelledError):
            return False
        return None


class ScopeCancel:
    """trio: a ``trio.CancelScope`` around the block, which the deadline cancels."""

    __slots__ = ("_scope",)

    def __init__(self) -> None:
        import trio

        self._scope = trio.CancelScope()
        self._scope.__enter__()

    def cancel(self) -> None:
        self._scope.cancel()

    def leave(
        self,
        cancelled: bool,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        scope = self._scope
        suppressed = bool(scope.__exit__(exc_type, exc, tb))
        if not cancelled or not scope.cancelled_caught:
            return suppressed
        return None


class Backend(Protocol):
    """What the core asks of an event-loop backend."""

    name: str  #: ``"asyncio"``, ``"uvloop"`` or ``"trio"``
    #: The asyncio loop a timer belongs to (the owner check compares the running one
    #: with it), or None where there is none to compare (trio).
    loop: asyncio.AbstractEventLoop | None
    clock: Callable[[], float]  #: the loop's clock

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` on the loop, from any thread; raises if the loop is gone."""

    def make_driver(self, on_wakeup: Callable[[], None]) -> Driver:
        """The driver that calls ``on_wakeup`` when the wheel's next bucket is due."""

    def spawn(self, worker: Worker) -> None:
        """Start a worker task of the pool."""

    async def join(self) -> None:
        """Wait for the worker tasks (but the calling one) to end."""

    def current_task(self) -> object:
        """The calling task, or None outside of one (a loop callback on asyncio)."""

    def block_cancel(self) -> BlockCancel:
        """Open the cancellation of a ``timer.timeout()`` block, in the calling task."""

    def cancelled_by_us(self, scope: anyio.CancelScope) -> bool:
        """In a worker whose job raised the backend's cancellation: True when the
        worker itself is being cancelled (``scope`` is its own cancel scope), False
        when the job raised it by itself."""


@mypyc_attr(allow_interpreted_subclasses=True)  # the drop-in loop's _LoopBackend
class AsyncioBackend:
    """asyncio and uvloop: a ``call_at`` driver; workers made with ``loop.create_task``.

    The pass that needs a worker runs inside a ``call_at`` callback, where no task is
    current, so anyio cannot tell the backend and its task groups cannot be used: the
    workers are spawned by hand and joined by hand."""

    __slots__ = ("_tasks", "call_soon_threadsafe", "clock", "loop", "name")

    def __init__(self, name: str = "asyncio") -> None:
        loop = asyncio.get_running_loop()
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = loop
        self.clock = loop_clock(loop)
        self.call_soon_threadsafe: Callable[[Callable[[], object]], object] = (
            loop.call_soon_threadsafe
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def make_driver(self, on_wakeup: Callable[[], None]) -> Driver:
        # On aiowheel's drop-in loop the wake-up goes to the base loop directly, as
        # loop.timer's does: through the loop's call_at it would be a timer on the
        # loop's wheel, rounded up a second time (aiowheel/_loop.py, _base_arming).
        arming = getattr(self.loop, "_base_arming", None)
        if arming is not None:
            grid, call_at = arming()
            return AsyncioDriver(on_wakeup, self.loop, grid, call_at)
        return AsyncioDriver(on_wakeup)

    def spawn(self, worker: Worker) -> None:
        assert self.loop is not None
        task = self.loop.create_task(worker())
        self._tasks.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            # A worker killed by SystemExit/KeyboardInterrupt: that went up through
            # the loop already; retrieving it here keeps asyncio from logging it again
            # when the task is collected.
            task.exception()

    def current_task(self) -> object:
        assert self.loop is not None
        return asyncio.current_task(self.loop)

    async def join(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        if tasks:
            await quiet(asyncio.wait(tasks))

    def block_cancel(self) -> BlockCancel:
        assert self.loop is not None
        return TaskCancel(self.loop)

    def cancelled_by_us(self, scope: anyio.CancelScope) -> bool:
        if scope.cancel_called:
            return True
        # asyncio.CancelledError raised by the callback itself, its worker not being
        # cancelled, is a failure like any other (asyncio's Handle does so).
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0


class TrioBackend:
    """trio (through anyio): a task driver; workers in the timer's task group (the
    pass runs in the driver's task, inside that group)."""

    __slots__ = ("_tg", "call_soon_threadsafe", "clock", "loop", "name")

    def __init__(self, tg: TaskGroup) -> None:
        import trio

        self.name = "trio"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clock: Callable[[], float] = trio.current_time
        self.call_soon_threadsafe: Callable[[Callable[[], object]], object] = (
            trio.lowlevel.current_trio_token().run_sync_soon
        )
        self._tg = tg

    def make_driver(self, on_wakeup: Callable[[], None]) -> Driver:
        return AnyioDriver(on_wakeup)

    def spawn(self, worker: Worker) -> None:
        self._tg.start_soon(worker)

    async def join(self) -> None:
        pass  # the workers live in the timer's task group, which waits for them

    def current_task(self) -> object:
        import trio

        return trio.lowlevel.current_task()

    def block_cancel(self) -> BlockCancel:
        return ScopeCancel()

    def cancelled_by_us(self, scope: anyio.CancelScope) -> bool:
        return True  # user code cannot raise trio.Cancelled


def make_backend(name: str, tg: TaskGroup) -> Backend:
    """The backend ``name`` (``backend_name()``); ``tg`` is where trio's tasks go."""
    if name == "trio":
        return TrioBackend(tg)
    return AsyncioBackend(name)
