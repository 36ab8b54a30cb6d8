"""The drop-in event loop: the base loop, with ``call_at``/``call_later`` on a wheel.

``new_event_loop(base=...)`` returns a subclass of the base loop (asyncio's default
selector loop, or ``uvloop.Loop``) in which only where timers live changes. Every
``call_at``/``call_later`` (and so ``asyncio.sleep``, ``asyncio.timeout``,
``wait_for`` and every library's timeouts) files a timer handle on the
loop's one ``Wheel`` (aiowheel/_wheel.py). The base loop's own timer machinery (the
heap on asyncio, libuv's timers on uvloop) holds a single entry: the wheel's next
wake-up, armed through the *base* class's ``call_at`` (never through the override).

Seam (for the engine refactor, issue 17): the loop drives the wheel only through
``_WheelLoop._wake`` (the pass: ``Wheel.advance`` and running what is due) and
``_WheelLoop._arm`` (keeping the one base-loop entry at the wheel's next expiry).

Design: one object per timer (docs/loop.md, "Memory"). The handle ``call_at`` returns
is the wheel's entry, a compiled ``LoopTimerHandle`` (aiowheel/_loophandle.py) that
implements ``asyncio.TimerHandle``'s contract itself (a native class cannot subclass
the pure-Python ``asyncio.TimerHandle``; uvloop's handles are not ones either), and
cancel() unlinks it at once: no tombstones.

Invariants:

* a handle is on the wheel exactly while ``handle._bucket is not None``;
* ``self._armed_at`` is the instant the base-loop entry ``self._wake_handle`` is armed
  for (``inf`` when none), and it is never later than the wheel's next expiry outside
  a pass;
* the pass runs only entries the wheel hands back, whose deadline is at or before the
  loop time read at the start of the pass: never early.
"""

from __future__ import annotations

import asyncio
import asyncio.format_helpers as _format_helpers
import math
import sys
from collections.abc import Callable, Coroutine
from contextvars import Context
from typing import Any, TypeVar

from ._checks import seconds
from ._loophandle import LoopTimerHandle
from ._timer import MAX_TICK, MIN_TICK
from ._wheel import Wheel, WheelEntry

__all__ = ["EventLoopPolicy", "new_event_loop", "run"]

_T = TypeVar("_T")
_INF = math.inf
_isfinite = math.isfinite
_BASES = ("asyncio", "uvloop")
_WHEEL_SIZE = 64


def _guard_internals() -> None:
    # The private asyncio internals relied on below. Checked once at import so that a
    # Python release that changes them fails loudly here, not subtly at run time.
    for name in ("_format_callback_source", "extract_stack"):
        if not hasattr(_format_helpers, name):
            raise ImportError(f"aiowheel's loop: asyncio.format_helpers lost {name}")
    for name in ("_check_thread", "_check_callback", "_check_closed"):
        if not hasattr(asyncio.BaseEventLoop, name):
            raise ImportError(f"aiowheel's loop: asyncio.BaseEventLoop lost {name}")


_guard_internals()


class _WheelLoop:
    """Mixed in front of the base loop class; see the module docstring."""

    _wheel: Wheel
    _wake_handle: asyncio.TimerHandle | None
    _armed_at: float
    _grid: float
    _base_call_at: Callable[..., asyncio.TimerHandle]

    def _init_wheel(self, tick: float, grid: float) -> None:
        loop: Any = self
        self._wheel = Wheel(tick, _WHEEL_SIZE, loop.time())
        self._wake_handle = None
        self._armed_at = _INF
        self._grid = grid

    # -- the timer API ------------------------------------------------------------

    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> Any:
        if delay is None:
            raise TypeError("delay must not be None")
        loop: Any = self
        handle = self.call_at(loop.time() + delay, callback, *args, context=context)
        trace = handle._source_traceback
        if trace and isinstance(handle, LoopTimerHandle):
            del trace[-1]  # this frame, as the base loop does
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> Any:
        if when is None:
            raise TypeError("when cannot be None")
        loop: Any = self
        when = float(when)
        if not _isfinite(when):
            # NaN or an infinity: exactly what the base loop does with it (the wheel
            # accepts finite deadlines only, so it never sees one).
            return self._base_call_at(when, callback, *args, context=context)
        if loop.is_closed():
            raise RuntimeError("Event loop is closed")
        if loop.get_debug():
            check_thread = getattr(loop, "_check_thread", None)
            if check_thread is not None:
                check_thread()
            check_callback = getattr(loop, "_check_callback", None)
            if check_callback is not None:
                check_callback(callback, "call_at")
            handle: LoopTimerHandle[Any] = LoopTimerHandle(when, callback, args, loop, context)
            # From the caller of call_at, as the base loop's (Handle.__init__ drops
            # its own frames and call_at's).
            handle._source_traceback = _format_helpers.extract_stack(sys._getframe(1))
        else:
            handle = LoopTimerHandle(when, callback, args, loop, context)
        at = self._wheel.insert(handle, when)
        if at < self._armed_at:
            self._arm(at)
        return handle

    # -- the seam: arming and the pass ------------------------------------------------

    def _arm(self, at: float) -> None:
        """Keep the base loop's one timer entry at ``at`` (``-inf``: now)."""
        old = self._wake_handle
        if old is not None:
            old.cancel()
        self._armed_at = at
        if at == _INF:
            self._wake_handle = None
            return
        if at == -_INF:
            at = 0.0  # already due: the base loop runs it on its next iteration
        else:
            # Round up to the base clock's grid: uvloop keeps whole milliseconds, and a
            # wake-up a hair early would otherwise be re-armed at the same instant.
            units = math.ceil(at * self._grid)
            rounded = units / self._grid
            at = rounded if rounded >= at else (units + 1) / self._grid
        self._wake_handle = self._base_call_at(at, self._wake)

    def _wake(self) -> None:
        """The pass: run every timer due now, in ``when`` order, then re-arm."""
        self._wake_handle = None
        self._armed_at = -_INF  # no re-arming from callbacks: we re-arm once below
        loop: Any = self
        wheel = self._wheel
        buckets = wheel.advance(loop.time())
        due: list[LoopTimerHandle[Any]] = []
        for bucket in buckets:
            node = bucket._first
            while node is not None:
                due.append(node)  # type: ignore[arg-type]
                node = node._next
        if len(due) > 1:
            # Stable: ties keep the order they were filed in (scheduling order).
            due.sort(key=_deadline)
        index = -1
        try:
            for handle in due:
                index += 1
                held = handle._bucket
                if held is None:
                    continue  # cancelled by an earlier callback of this pass
                held.remove(handle)
                handle._run()
        except BaseException:
            # SystemExit/KeyboardInterrupt from a callback (Handle._run lets only
            # those through): put back what this pass had not reached.
            for rest in due[index + 1 :]:
                if rest._bucket is not None:
                    rest._bucket.remove(rest)
                    wheel.insert_due(rest, rest._deadline)
            self._armed_at = _INF
            self._rearm()
            raise
        finally:
            due.clear()
        self._armed_at = _INF
        self._rearm()

    def _wheel_cancelled(self, handle: LoopTimerHandle[Any], bucket: object) -> None:
        """A handle's cancel() took it off the wheel (the hook ``loop.timer`` counts)."""

    def _rearm(self) -> None:
        nxt = self._wheel.next_expiry()
        if nxt is not None:
            self._arm(nxt)

    def _drop_wheel(self) -> None:
        # close(): pending timers are dropped as the base loop drops its heap.
        self._wheel.clear()
        old = self._wake_handle
        self._wake_handle = None
        self._armed_at = _INF
        if old is not None:
            old.cancel()

    def _wheel_len(self) -> int:
        return len(self._wheel)


def _deadline(entry: WheelEntry) -> float:
    return entry._deadline


class _AsyncioWheelLoop(_WheelLoop, asyncio.SelectorEventLoop):  # type: ignore[misc]
    def __init__(self, tick: float) -> None:
        asyncio.SelectorEventLoop.__init__(self)
        self._init_wheel(tick, 1e6)

    def _base_call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        return asyncio.SelectorEventLoop.call_at(self, when, callback, *args, context=context)

    def close(self) -> None:
        if not self.is_running() and not self.is_closed():
            self._drop_wheel()
        asyncio.SelectorEventLoop.close(self)


_uvloop_class: type[Any] | None = None


def _uvloop_loop_class() -> type[Any]:
    global _uvloop_class
    if _uvloop_class is None:
        try:
            import uvloop
        except ImportError as exc:
            raise ImportError(
                "base='uvloop' needs uvloop: pip install 'aiowheel[uvloop]' "
                "(from a checkout: pip install '.[uvloop]')"
            ) from exc

        class _UvloopWheelLoop(_WheelLoop, uvloop.Loop):  # type: ignore[misc]
            def __init__(self, tick: float) -> None:
                uvloop.Loop.__init__(self)
                self._init_wheel(tick, 1e3)

            def _base_call_at(
                self,
                when: float,
                callback: Callable[..., object],
                *args: Any,
                context: Context | None = None,
            ) -> asyncio.TimerHandle:
                # uvloop's call_at goes through self.call_later (our override): call
                # the base class's call_later directly, with its delay.
                return uvloop.Loop.call_later(
                    self, max(0.0, when - self.time()), callback, *args, context=context
                )

            def close(self) -> None:
                if not self.is_running() and not self.is_closed():
                    self._drop_wheel()
                uvloop.Loop.close(self)

        _uvloop_class = _UvloopWheelLoop
    return _uvloop_class


def _check_base(base: object) -> str:
    if base not in _BASES:
        raise ValueError(f"base must be 'asyncio' or 'uvloop', got {base!r}")
    return str(base)


def new_event_loop(*, base: str = "asyncio", tick: float = 0.001) -> asyncio.AbstractEventLoop:
    """A new event loop: ``base``'s loop with its timers on an aiowheel wheel."""
    name = _check_base(base)
    tick_ = seconds(tick, "tick")
    if not MIN_TICK <= tick_ <= MAX_TICK:
        raise ValueError(f"tick must be from {MIN_TICK} to {MAX_TICK:g} seconds, got {tick!r}")
    if name == "uvloop":
        loop: asyncio.AbstractEventLoop = _uvloop_loop_class()(tick_)
    else:
        loop = _AsyncioWheelLoop(tick_)
    return loop


def run(main: Coroutine[Any, Any, _T], *, base: str = "asyncio", debug: bool | None = None) -> _T:
    """Like ``asyncio.run``/``uvloop.run``, on ``new_event_loop(base=base)``."""
    name = _check_base(base)
    if name == "uvloop":
        _uvloop_loop_class()  # the ImportError that names the extra, before anything
    with asyncio.Runner(debug=debug, loop_factory=lambda: new_event_loop(base=name)) as runner:
        return runner.run(main)


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """A policy whose new loops are ``new_event_loop(base=base)`` (for runners that
    take a policy; policies are deprecated from Python 3.14, prefer loop factories)."""

    def __init__(self, *, base: str = "asyncio") -> None:
        self._aiowheel_base = _check_base(base)
        if self._aiowheel_base == "uvloop":
            _uvloop_loop_class()
        super().__init__()

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return new_event_loop(base=self._aiowheel_base)
