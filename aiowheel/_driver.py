"""Drivers: what wakes the timer when the earliest occupied bucket comes due.

This replaces Kafka's reaper thread blocked in ``DelayQueue.poll``. A driver knows
one thing, the instant of its next wake-up, and calls ``on_wakeup`` then. It never
wakes periodically: with no timers it is not armed at all.

* ``AsyncioDriver`` uses one ``loop.call_at`` handle. Re-arming it (only when a timer
  lands in a bucket earlier than the armed one) costs a handle cancel and a heap push
  in the loop; a task step per wake-up would cost several times more.
* ``AnyioDriver`` is one task sleeping in a ``CancelScope`` whose deadline is the next
  wake-up; re-arming is an assignment to ``scope.deadline``. It is used on trio (and
  works on any anyio backend).

Both read time only from the loop's clock, so virtual clocks (``looptime``,
``trio.testing.MockClock``) drive them.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

__all__ = ["AnyioDriver", "AsyncioDriver", "backend_name", "loop_clock", "round_up"]

_INF = math.inf
_ceil = math.ceil
# Past this (about 31 years of loop time) a microsecond is near float resolution.
_ROUNDING_LIMIT = 1e9


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The cheapest callable returning ``loop.time()``.

    ``BaseEventLoop.time`` is a Python method around ``time.monotonic``; when the loop
    does not override it (looptime and other virtual clocks do), call the C function
    directly and save a Python frame per call.
    """
    if type(loop).time is asyncio.BaseEventLoop.time and "time" not in getattr(
        loop, "__dict__", {}
    ):
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

        return trio.current_time
    return loop_clock(asyncio.get_running_loop())


class AsyncioDriver:
    """Wakes the timer with a single ``call_at`` handle on the running loop.

    It also spawns the timer's worker tasks, with ``loop.create_task``: the pass that
    needs a worker runs inside a ``call_at`` callback, where no task is current, so
    anyio cannot tell which backend runs and its task groups cannot be used there.
    """

    __slots__ = ("_grid", "_handle", "_loop", "_on_wakeup", "_recheck", "_tasks")

    needs_task = False

    def __init__(self, on_wakeup: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_wakeup = on_wakeup
        self._handle: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Wake-ups are rounded up to the loop clock's grid (see arm): uvloop keeps
        # whole milliseconds; for the others a microsecond covers the virtual clocks.
        self._grid = 1e3 if backend_name() == "uvloop" else 1e6
        self._recheck: Callable[[], None] | None = None

    def recheck(self, check: Callable[[], None]) -> None:
        """Run ``check`` once, early in the next loop iteration (coalesced)."""
        if self._recheck is None:
            self._recheck = check
            self._loop.call_soon(self._run_recheck)

    def _run_recheck(self) -> None:
        check = self._recheck
        self._recheck = None
        if check is not None:
            check()

    def spawn(self, worker: Callable[[], Coroutine[Any, Any, None]], tg: TaskGroup) -> None:
        task = self._loop.create_task(worker())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        self.disarm()

    async def join_workers(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        if tasks:
            await asyncio.wait(tasks)

    def arm(self, when: float) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel()
        if when == -_INF:
            self._handle = self._loop.call_soon(self._wake)
            return
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
        self._handle = self._loop.call_at(when, self._wake)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _wake(self) -> None:
        self._handle = None
        self._on_wakeup()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        raise NotImplementedError  # pragma: no cover - needs_task is False


class AnyioDriver:
    """One task that sleeps until the next wake-up in a movable ``CancelScope``."""

    __slots__ = ("_deadline", "_on_wakeup", "_scope", "_stopped")

    needs_task = True

    def __init__(self, on_wakeup: Callable[[], None]) -> None:
        self._on_wakeup = on_wakeup
        self._deadline = _INF
        self._scope: anyio.CancelScope | None = None
        self._stopped = False

    def arm(self, when: float) -> None:
        self._deadline = when
        scope = self._scope
        if scope is not None:
            scope.deadline = when

    def disarm(self) -> None:
        self.arm(_INF)

    def recheck(self, check: Callable[[], None]) -> None:
        check()  # moving a CancelScope deadline is cheap: no need to defer

    def spawn(self, worker: Callable[[], Coroutine[Any, Any, None]], tg: TaskGroup) -> None:
        # The pass runs in this driver's own task, so the task group can be used.
        tg.start_soon(worker)

    def stop(self) -> None:
        self._stopped = True
        self.arm(-_INF)  # wake the task: it sees _stopped and returns

    async def join_workers(self) -> None:
        pass  # they live in the timer's inner task group, which the timer waits for

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while not self._stopped:
            # Invariant: while we sleep, _scope.deadline is the wake-up instant; while
            # the timer's pass runs, _scope is None and arming only records _deadline.
            with anyio.CancelScope(deadline=self._deadline) as scope:
                self._scope = scope
                await anyio.sleep_forever()
            self._scope = None
            self._deadline = _INF
            if not self._stopped:
                self._on_wakeup()


Driver = AsyncioDriver | AnyioDriver


def make_driver(name: str, on_wakeup: Callable[[], None]) -> Any:
    if name in ("asyncio", "uvloop"):
        return AsyncioDriver(on_wakeup)
    return AnyioDriver(on_wakeup)
