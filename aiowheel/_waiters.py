"""Who waits on a started timer: tasks in ``handle.wait()``, tasks waiting for room
under ``max_pending`` (``schedule``/``schedule_at``), and the drain
(``aclose(drain=True)``).

The engine (``_engine.py``) owns the accounting and decides when to wake whom
(the *drain wake-up*, ``Engine.pending_fell``); this class keeps the waiting
tasks and wakes them. It reads the counters through a reference typed as
``Engine`` (compiled, native reads), as the worker pool does.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import anyio

from ._awaits import quiet
from ._handle import _PENDING, TimerHandle, _Failure

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["Waiters"]


class _Waiter:
    """Tasks waiting in ``handle.wait()`` for one handle share one of these."""

    __slots__ = ("event", "outcome")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.outcome: Any = _PENDING


@final
class Waiters:
    """The tasks waiting on one engine: for a handle to settle, for room, for the drain."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.handles: dict[TimerHandle[Any], _Waiter] = {}
        self.room: list[anyio.Event] = []
        self.idle: list[anyio.Event] = []

    def any(self) -> bool:
        """Anyone waiting at all (one of what makes a cancel notify)."""
        return bool(self.handles or self.room or self.idle)

    def settle(self, handle: TimerHandle[Any], outcome: Any) -> None:
        """``handle`` settled with ``outcome``: wake the tasks in its ``wait()``."""
        waiter = self.handles.pop(handle, None)
        if waiter is not None:
            waiter.outcome = outcome
            waiter.event.set()

    async def wait(self, handle: TimerHandle[Any]) -> Any:
        """What ``handle.wait()`` gets once the handle settles."""
        engine = self.engine
        if engine.closed and (handle._bucket is not None or handle._result is _PENDING):
            # This handle will never run: nothing would settle a waiter.
            return _Failure(engine._closed_error())
        waiter = self.handles.get(handle)
        if waiter is None:
            waiter = self.handles[handle] = _Waiter()
            engine.waiter_registered()
        await quiet(waiter.event.wait())
        return waiter.outcome

    async def wait_for_room(self) -> None:
        """Return once one more timer would be admitted (``TimerClosed`` if closed)."""
        engine = self.engine
        while engine.pending >= engine.limit:
            if engine.closed:
                raise engine._closed_error()
            event = anyio.Event()
            self.room.append(event)
            engine.waiter_registered()
            try:
                await quiet(event.wait())
            except BaseException:
                if event in self.room:
                    self.room.remove(event)
                elif self.room:
                    self.wake_room()  # pass on the wake-up we were given
                raise

    async def drain(self) -> None:
        """``aclose(drain=True)``: return once nothing is pending and no callback runs
        (but the caller, if a callback drains: it waits for us), or the engine closed
        (a callback's ``aclose()``). Woken by the *drain wake-up* (``pending_fell``)."""
        engine = self.engine
        pool = engine.pool
        me = 1 if pool.current() in pool.running else 0
        while (engine.pending or pool.busy > me) and not engine.closed:
            event = anyio.Event()
            self.idle.append(event)
            engine.waiter_registered()
            await quiet(event.wait())

    def wake_room(self) -> None:
        """Wake as many tasks waiting for room as there is room for."""
        engine = self.engine
        room = engine.limit - engine.pending
        waiters = self.room
        while room > 0 and waiters:
            waiters.pop(0).set()
            room -= 1

    def wake_idle(self) -> None:
        waiters = self.idle
        self.idle = []
        for event in waiters:
            event.set()

    def wake_all(self) -> None:
        """The engine closed: the tasks waiting for room or the drain re-check (and
        find it closed). The handles' waiters are settled one by one by the close."""
        for event in self.room + self.idle:
            event.set()
        self.room.clear()
        self.idle.clear()

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Settle every handle's waiters with ``error()`` (the engine broke)."""
        for waiter in self.handles.values():
            waiter.outcome = _Failure(error())
            waiter.event.set()
        self.handles.clear()
