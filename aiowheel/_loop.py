"""The drop-in event loop: the base loop, with ``call_at``/``call_later`` on a wheel.

``new_event_loop(base=...)`` returns a subclass of the base loop (asyncio's default
selector loop, or ``uvloop.Loop``) in which only where timers live changes. Every
``call_at``/``call_later`` (and so ``asyncio.sleep``, ``asyncio.timeout``,
``wait_for`` and every library's timeouts) files a timer handle on the wheel of the
loop's own ``aiowheel.Timer``, ``loop.timer``. The base loop's own timer machinery
(the heap on asyncio, libuv's timers on uvloop) holds a single entry: that timer's
next wake-up, armed through the *base* class's ``call_at`` (never the override).

One wheel, one engine. ``loop.timer`` is opened with the loop (``Timer._open_for_loop``:
its ``Engine`` without a supervisor task) on ``_LoopBackend``, whose driver (an
``AsyncioDriver`` given the base class's ``call_at``) arms the base loop directly.
``call_at`` files its handle through ``Engine.file_loop`` (the loop sets compiled
``call_at``/``call_later`` on itself, ``_loophandle.LoopCalls``: no Python frame per
timer; the Python methods below keep the same rules for debug mode and subclasses
that override them); the engine's pass
(``Engine.fire_due``) runs the loop's handles by ``Handle._run``'s rules and the
timer's own by the engine's, all in ``when`` order (``Wheel.in_order``).
``loop.close()`` closes the timer (``Engine.close``), which drops the loop's pending
handles as the base loop drops its heap.

One object per timer (docs/loop.md, "Memory"): the handle ``call_at`` returns is the
wheel's entry, a compiled ``LoopTimerHandle`` (aiowheel/_loophandle.py) that implements
``asyncio.TimerHandle``'s contract itself (a native class cannot subclass the
pure-Python ``asyncio.TimerHandle``; uvloop's handles are not ones either), and
cancel() unlinks it at once: no tombstones.

Invariants:

* a handle is on the wheel exactly while ``handle._bucket is not None``, and then it
  counts in ``len(loop.timer)``;
* the engine's ``wake_at`` is the instant the base-loop entry is armed for (the
  engine's own rule, docs/design.md);
* the pass runs only entries the wheel hands back, whose deadline is at or before the
  loop time read at the start of the pass: never early.
"""

from __future__ import annotations

import asyncio
import asyncio.format_helpers as _format_helpers
import math
import sys
import time
from collections.abc import Callable, Coroutine
from contextvars import Context
from types import FrameType, MethodType
from typing import Any, TypeVar, cast

from ._checks import seconds
from ._driver import AsyncioBackend, AsyncioDriver, Driver, loop_clock
from ._engine import Engine
from ._loophandle import LoopCalls, LoopTimerHandle, when_of
from ._loophandle import call_at as compiled_call_at
from ._loophandle import call_later as compiled_call_later
from ._timer import MAX_TICK, MIN_TICK, Timer
from ._wheel import Wheel

__all__ = ["EventLoopPolicy", "loop_timer", "new_event_loop", "new_uvloop_event_loop", "run"]

_T = TypeVar("_T")
_INF = math.inf
_isfinite = math.isfinite
_BASES = ("asyncio", "uvloop")
# Past this (about 31 years of loop time) a microsecond is near float resolution.


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


class _LoopBackend(AsyncioBackend):
    """``AsyncioBackend`` for a loop that is not running yet: its own driver."""

    __slots__ = ("_grid",)

    def __init__(self, loop: _WheelLoop, name: str, grid: float) -> None:
        # Not AsyncioBackend.__init__: it asks for the running loop.
        base: Any = loop
        self.name = name
        self.loop = base
        self.clock = loop_clock(base)
        self.call_soon_threadsafe = base.call_soon_threadsafe
        self._tasks = set()
        self._grid = grid

    def make_driver(self, on_wakeup: Callable[[], None]) -> Driver:
        loop: Any = self.loop
        # loop.timer's driver: one base-loop timer entry, armed through the base
        # class's call_at (the override would file the wake-up on the wheel it wakes);
        # the loop need not be running yet.
        return AsyncioDriver(on_wakeup, loop, self._grid, loop._base_call_at)


class _WheelLoop:
    """Mixed in front of the base loop class; see the module docstring."""

    timer: Timer
    _base_call_at: Callable[..., Any]

    # The engine and its wheel are the timer's, read through it: properties, not
    # attributes. CPython 3.13 keeps an instance's attributes inline (no dict object)
    # only up to its class's shared-keys capacity, which the base loop's own 26 nearly
    # fill: with these two as well the loop's __dict__ became a real dict, and every
    # attribute access of the loop's own methods slower (tests/test_loop_affinity.py).
    @property
    def _engine(self) -> Engine:
        return cast("Engine", self.timer._engine)

    @property
    def _wheel(self) -> Wheel:
        return self._engine.wheel

    def _init_timer(self, name: str, tick: float, grid: float) -> None:
        self.timer = Timer(tick=tick)
        self.timer._open_for_loop(_LoopBackend(self, name, grid))
        loop: Any = self
        self._engine.loop_debug = bool(loop.get_debug())
        cls = type(self)
        if cls.call_at is _WheelLoop.call_at and cls.call_later is _WheelLoop.call_later:
            # The compiled call_at/call_later (aiowheel/_loophandle.py, LoopCalls), set
            # on the loop itself: no Python frame per timer. Not when a subclass
            # overrides either (its override must be what callers get).
            calls = LoopCalls(
                self,
                self._engine,
                MethodType(_WheelLoop.call_at, self),
                MethodType(_WheelLoop.call_later, self),
                self._base_call_at,
            )
            self.call_at = MethodType(compiled_call_at, calls)  # type: ignore[method-assign]
            self.call_later = MethodType(compiled_call_later, calls)  # type: ignore[method-assign]

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
        # In debug mode call_at's source traceback leaves this frame out (_OWN_CODE).
        return self.call_at(loop.time() + delay, callback, *args, context=context)

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
        when = when_of(when)
        if not _isfinite(when):
            # NaN or an infinity: exactly what the base loop does with it (the wheel
            # accepts finite deadlines only, so it never sees one).
            return self._base_call_at(when, callback, *args, context=context)
        if loop.is_closed():
            raise RuntimeError("Event loop is closed")
        engine = self._engine
        if loop.get_debug():
            check_thread = getattr(loop, "_check_thread", None)
            if check_thread is not None:
                check_thread()
            check_callback = getattr(loop, "_check_callback", None)
            if check_callback is not None:
                check_callback(callback, "call_at")
            handle: LoopTimerHandle[Any] = LoopTimerHandle(when, callback, args, engine, context)
            # From the caller of call_at, as the base loop's (Handle.__init__ drops
            # its own frames and call_at's).
            handle._source_traceback = _format_helpers.extract_stack(_caller(sys._getframe(1)))
        else:
            handle = LoopTimerHandle(when, callback, args, engine, context)
        engine.file_loop(handle, when)
        return handle

    def set_debug(self, enabled: bool) -> None:
        base: Any = super()
        base.set_debug(enabled)
        # Kept on the engine for the compiled call_at and LoopTimerHandle.cancel (one
        # attribute, not a get_debug() call per timer). The base loop's __init__ calls
        # this before the engine exists: _init_timer reads get_debug() then.
        engine: Engine | None = getattr(self, "_engine", None)
        if engine is not None:
            loop: Any = self
            engine.loop_debug = bool(loop.get_debug())

    # -- lifecycle ----------------------------------------------------------------------

    def _bind_timer(self) -> None:
        # run_forever: loop.timer belongs to the thread that runs the loop.
        self.timer._bind_thread()
        self._follow_clock()

    def _follow_clock(self) -> None:
        # A patch that swaps the loop's class after the loop was made (looptime's
        # patch_event_loop: virtual time) changes its clock under the wheel, which was
        # made on the old one and keeps it: a deadline read on the new clock and fired
        # on the old could fire early. Refuse to run rather than break the never-early
        # rule (docs/loop.md, "What differs").
        if loop_clock(self) != self._engine.clock:  # type: ignore[arg-type]
            raise RuntimeError(
                "the event loop's clock was changed after the loop was made (a patch "
                "such as looptime.patch_event_loop): aiowheel's drop-in loop keeps the "
                "clock it was made with; use the plain loop for virtual time"
            )

    def _close_timer(self) -> None:
        # close(): loop.timer closes; the loop's pending timers are dropped as the
        # base loop drops its heap, the timer's own are cancelled (aclose()'s rule).
        engine = self._engine
        if not engine.closed:
            engine.close()


# The loop's own frames between a caller and call_at's source traceback, left out as
# the base loop leaves out its call_later and call_at: this call_later, and the pure
# core's _loophandle.call_at/call_later (compiled, they have no frame).
_OWN_CODE = frozenset(
    code
    for function in (_WheelLoop.call_later, compiled_call_at, compiled_call_later)
    if (code := getattr(function, "__code__", None)) is not None
)


def _caller(frame: FrameType) -> FrameType | None:
    # The first frame, from `frame` outwards, that is not the loop's own.
    found: FrameType | None = frame
    while found is not None and found.f_code in _OWN_CODE:
        found = found.f_back
    return found


def loop_timer(loop: object) -> Timer | None:
    """``loop.timer`` when ``loop`` is aiowheel's drop-in loop and it is open, else None:
    what aiowheel's own integrations (the idle-timeout middleware's shared timer) use
    on this loop instead of starting a second timer."""
    if isinstance(loop, _WheelLoop):
        timer = loop.timer
        if not timer.closed:
            return timer
    return None


class _AsyncioWheelLoop(_WheelLoop, asyncio.SelectorEventLoop):  # type: ignore[misc]
    # BaseEventLoop.time() is a Python method returning time.monotonic(); the C
    # function itself, as a class attribute (a builtin does not bind: loop.time() calls
    # it with no argument), gives the same clock without a Python frame. Every timer
    # reads it (call_later, asyncio.timeout, each loop iteration); a subclass's or
    # looptime's own time() still wins, as any override does.
    time = time.monotonic

    def __init__(self, tick: float) -> None:
        asyncio.SelectorEventLoop.__init__(self)
        self._init_timer("asyncio", tick, 1e6)

    def _base_call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        return asyncio.SelectorEventLoop.call_at(self, when, callback, *args, context=context)

    def run_forever(self) -> None:
        self._bind_timer()
        asyncio.SelectorEventLoop.run_forever(self)

    def close(self) -> None:
        if not self.is_running() and not self.is_closed():
            self._close_timer()
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
                self._init_timer("uvloop", tick, 1e3)  # uvloop's clock: whole ms

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

            def run_forever(self) -> None:
                self._bind_timer()
                uvloop.Loop.run_forever(self)

            def close(self) -> None:
                if not self.is_running() and not self.is_closed():
                    self._close_timer()
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


def new_uvloop_event_loop(*, tick: float = 0.001) -> asyncio.AbstractEventLoop:
    """``new_event_loop(base="uvloop")``, for where only a loop factory's import string
    fits: ``uvicorn.run(app, loop="aiowheel:new_uvloop_event_loop")``."""
    return new_event_loop(base="uvloop", tick=tick)


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
