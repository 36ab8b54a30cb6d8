"""A timer's life, and the side of it that its handles and rooms see.

``Timer`` (``_timer.py``) is the public API: every call checked, admitted, scheduled.
This is its base class, the inside face (docs/design.md, "Module map"):

* the lifecycle: the states (new, open, draining, closed), the engine while the timer
  lives (``_live``; ``_engine`` after it too), starting it (``_new_engine``,
  ``_started``, ``_open_for_loop`` for the drop-in loop) and what the engine's close
  calls back (``_on_close``). ``Timer.__aenter__`` and ``Timer.aclose`` drive them;
* the owner check (``Affinity``, aiowheel/_affinity.py), each name saying which:
  ``_live_on_owner_loop`` and ``_live_on_owner_loop_running`` (the engine, or raise),
  ``_require_owner_loop`` and ``_require_owner_loop_running`` (the way to ask it from
  outside the core: the purgatory, a periodic handle's cancel), ``_is_owner_loop``;
* ``HandleOwner`` (aiowheel/_handle.py), implemented: what a handle calls on its timer
  (``_cancel``, the hot one, with an inline copy of ``Engine.cancel``;
  ``_reset``, ``_reset_at``, ``_wait``, ``_cancelled_error``, ``_is_owner_loop``);
* the self-check (``_check``) and the error a closed timer raises (``_closed_error``).

Compiled with the core: ``Timer`` is a compiled class, and a compiled class's base is
compiled too.
"""

from __future__ import annotations

import enum
from _thread import get_ident
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, SupportsFloat

from ._checks import closed, too_far
from ._driver import Backend
from ._engine import Engine
from ._exceptions import TimerCancelled, TimerClosed
from ._handle import _CANCELLED, _PENDING, HandleOwner, TimerHandle, to_seconds
from ._host import Host
from ._pass import fire_due

if TYPE_CHECKING:
    from .trace import TraceRecorder

__all__ = ["TimerLifecycle"]

_INF: Final = float("inf")
_get_ident: Final = get_ident


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    DRAINING = "draining"
    CLOSED = "closed"


_NEW, _OPEN, _DRAINING, _CLOSED = _State.NEW, _State.OPEN, _State.DRAINING, _State.CLOSED


class TimerLifecycle(HandleOwner):
    """A timer's states, its engine, the owner check and its handles' calls; ``Timer``
    is the one subclass."""

    def __init__(
        self,
        tick: float,
        wheel_size: int,
        limit: int,
        max_concurrency: int,
        on_error: Callable[[TimerHandle[Any], BaseException], object],
        recorder: TraceRecorder | None,
    ) -> None:
        # The configuration, checked by Timer.__init__.
        self._tick = tick
        self._wheel_size = wheel_size
        self._limit = limit
        self._max_concurrency = max_concurrency
        self._on_error = on_error
        # The recorder the timer opens and closes (the engine writes the rows).
        self._recorder = recorder

        self._state = _NEW
        # The engine, exactly while the timer accepts timers (open or draining).
        self._live: Engine | None = None
        # The engine from __aenter__ on, kept after the close (stats, __aexit__).
        self._engine: Engine | None = None
        # The tasks it runs in, from __aenter__ on (aiowheel/_host.py).
        self._host: Host | None = None
        # What handles read (see _handle.py): the loop's thread and clock, once started,
        # and the owner check's Affinity exactly while open. Invariant (_check):
        # _open_affinity is _live.affinity, or None when _live is (_started and
        # _on_close set the two together).
        self._loop_thread = 0
        self._now = _not_started_clock
        self._open_affinity = None
        self._levels = 0  # the wheel's levels when it closed

    # -- lifecycle ----------------------------------------------------------------------

    def _new_engine(self, backend: Backend, *, loop_timers: bool = False) -> Engine:
        """This timer's engine on ``backend``, with its worker pool: built by the host's
        supervisor, or by ``_open_for_loop`` (where there is no recorder)."""
        live = Engine(
            backend,
            self._tick,
            self._wheel_size,
            self._limit,
            self._on_error,
            self._recorder,
            self._on_close,
            self._closed_error,
            fire_due=fire_due,
            max_concurrency=self._max_concurrency,
            loop_timers=loop_timers,
        )
        return live

    def _started(self, live: Engine) -> None:
        # Open: the engine accepts timers; what handles read (see _handle.py) is set.
        self._state = _OPEN
        self._loop_thread = _get_ident()
        self._now = live.clock
        self._live = self._engine = live
        self._open_affinity = live.affinity  # the handle's inline reset reads it

    def _open_for_loop(self, backend: Backend) -> Engine:
        """Start this new timer synchronously as a drop-in event loop's ``loop.timer``
        (aiowheel/_loop.py): the engine without a host (the loop's backend drives it
        and spawns its workers; the loop closes it, through ``close()``)."""
        live = self._new_engine(backend, loop_timers=True)
        self._started(live)
        return live

    def _bind_thread(self) -> None:
        # The drop-in loop starts running (maybe in another thread than it was made in).
        self._loop_thread = _get_ident()
        live = self._live
        if live is not None:
            live.affinity.thread = self._loop_thread

    def _on_close(self) -> None:
        # The engine is closing (aclose(), or an internal error): accept no more.
        live = self._live
        self._state = _CLOSED
        self._live = None
        self._open_affinity = None
        if live is not None:
            self._levels = live.wheel.levels
            live.closing.set()  # the supervisor returns

    # -- the closed error and the owner check -----------------------------------------

    def _closed_error(self) -> TimerClosed:
        # Why this timer refuses (_checks.closed): its state, and what broke it.
        broken = self._engine.broken if self._engine is not None else None
        return closed(self._state.value, broken)

    # The owner check (aiowheel/_timer.py's docstring, "Loop affinity"; and
    # aiowheel/_affinity.py), under names that say which check: *owner loop* is
    # Affinity.here (the owner's thread, and no other loop running in it: the per-timer
    # calls; schedule_nowait, _cancel and the handle's inline reset keep a tagged
    # inline copy), *owner loop running* is Affinity.check (the running loop is the
    # owner's too: the calls that wait or set things up). ``_live_...`` returns the
    # engine and raises TimerClosed when the timer is not open; ``_require_...`` is for
    # the rooms outside the core and does nothing then; ``_is_owner_loop`` asks.

    def _live_on_owner_loop(self) -> Engine:
        """The engine, for a call on the owner's loop (``Affinity.here``); raise
        ``TimerClosed`` unless open, the owner's ``RuntimeError`` unless there."""
        live = self._live
        if live is None:
            raise self._closed_error()
        if not live.affinity.here():
            raise live.affinity.foreign()
        return live

    def _live_on_owner_loop_running(self) -> Engine:
        """The engine, for a call from the owner's running loop (``Affinity.check``);
        raise ``TimerClosed`` unless open, the owner's ``RuntimeError`` unless there."""
        live = self._live
        if live is None:
            raise self._closed_error()
        live.affinity.check()
        return live

    def _require_owner_loop(self) -> None:
        """For the rooms outside the core that keep their state on the timer's loop
        (the purgatory, aiowheel/_purgatory.py): raise the timer's ``RuntimeError``
        unless called on its loop (``Affinity.here``, as the per-timer calls); nothing
        while the timer is not open (the call then fails on its own, or has nothing to
        do)."""
        live = self._live
        if live is not None and (_get_ident() != self._loop_thread or live.affinity.elsewhere()):
            raise live.affinity.foreign()

    def _require_owner_loop_running(self) -> None:
        """``_require_owner_loop`` for the calls that wait: the running loop must be
        the owner's too (``Affinity.check``); nothing while the timer is not open."""
        live = self._live
        if live is not None:
            live.affinity.check()

    def _is_owner_loop(self) -> bool:
        """For the handle's inline reset: open, and called on the owner's loop (inline
        copy of ``Affinity.here``)."""
        live = self._live
        return (
            live is not None and _get_ident() == self._loop_thread and not live.affinity.elsewhere()
        )

    # -- what handles call ------------------------------------------------------------

    def _cancel(self, handle: TimerHandle[Any]) -> bool:
        # handle.cancel() of a pending handle: the common case is a few assignments.
        # Inline copy of Engine.cancel (the hot path), after the owner check.
        live = self._live
        if live is None:
            return False
        # inline copy of the owner check, Affinity.here
        if _get_ident() != self._loop_thread or live.affinity.elsewhere():
            raise live.affinity.foreign()
        bucket = handle._bucket
        if bucket is None:
            return False
        bucket.remove(handle)
        previous = handle._result  # inline copy of TimerHandle._become_cancelled
        handle._result = _CANCELLED
        live.pending -= 1  # inline copy of Engine.count_cancelled
        live.cancelled += 1
        # The rest is rare: the bucket the driver waits for emptied, an async callback
        # queued for a worker (its coroutine must be closed), someone waiting, or a
        # trace row to write.
        if bucket._first is None or previous is not _PENDING or live.notify_cancel:
            live.after_cancel(handle, bucket, previous)
        return True

    def _reset(self, handle: TimerHandle[Any], delay: SupportsFloat) -> None:
        # handle.reset() past its inline lazy path (TimerHandle.reset), which every
        # real number takes: what is left is a re-file, a foreign thread, bad input.
        live = self._live_on_owner_loop()
        delay_ = to_seconds(delay)
        deadline = live.clock() + delay_
        if deadline == _INF:
            too_far("delay", delay_)
        live.rearm(handle, deadline)

    def _reset_at(self, handle: TimerHandle[Any], deadline: SupportsFloat) -> None:
        self._live_on_owner_loop().rearm(handle, to_seconds(deadline, "deadline"))

    def _cancelled_error(self, handle: TimerHandle[Any]) -> BaseException:
        """What ``wait()`` of a cancelled handle raises."""
        engine = self._engine
        if engine is not None and handle in engine.stranded:
            return self._closed_error()
        return TimerCancelled(f"{handle!r} was cancelled")

    async def _wait(self, handle: TimerHandle[Any]) -> Any:
        self._require_owner_loop_running()
        engine = self._engine
        assert engine is not None  # a handle needs a started timer
        return await engine.waiters.wait(handle)

    # -- self-check (tests) ------------------------------------------------------------

    def _check(self) -> None:
        """Assert the accounting against what the timer holds (docs/design.md
        "Accounting"; aiowheel/_selfcheck.py). For tests, between passes."""
        from ._selfcheck import check_timer  # test-only: not imported otherwise

        live = self._live
        assert self._open_affinity is (live.affinity if live is not None else None)
        check_timer(self, self._engine, open_=live is not None)

    def _backend_if_open(self) -> Backend | None:
        live = self._live  # read in the calling thread, as every call's first step
        return live.backend if live is not None else None


def _not_started_clock() -> float:
    raise closed(_NEW.value, None)
