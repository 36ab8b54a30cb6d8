"""The drop-in event loop: the base loop, with ``call_at``/``call_later`` on a wheel.

``new_event_loop(base=...)`` returns a subclass of the base loop (asyncio's default
selector loop, or ``uvloop.Loop``) in which only where timers live changes. Every
``call_at``/``call_later`` (and so ``asyncio.sleep``, ``asyncio.timeout``,
``wait_for`` and every library's timeouts) files a timer handle on the wheel of the
loop's own ``aiowheel.Timer``, ``loop.timer``. The base loop's own timer machinery
(the heap on asyncio, libuv's timers on uvloop) holds a single entry: that timer's
next wake-up, armed through the *base* class's ``call_at`` (never the override).

One wheel, one engine. ``loop.timer`` is opened with the loop (``TimerLifecycle._open_for_loop``:
its ``Engine`` without a supervisor task) on ``_LoopBackend``, whose driver (an
``AsyncioDriver`` given the base class's ``call_at``) arms the base loop directly.
``call_at`` files its handle through ``_loophandle.file_loop``, the one rule (the loop
sets compiled ``call_at``/``call_later`` on itself, ``_loophandle.LoopCalls``: no Python
frame per timer; the Python ones below make debug mode's checks first, and serve loop
classes that override either); the engine's pass
(``_pass.fire_due``) runs the loop's handles by ``Handle._run``'s rules and the
timer's own by the engine's, all in ``when`` order (``Wheel.in_order``).
``loop.close()`` closes the timer (``_shutdown.close_engine``), which drops the loop's pending
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
import importlib
import math
import sys
import time
from _thread import get_ident as _get_ident
from asyncio.log import logger as _asyncio_logger
from collections.abc import Callable, Coroutine
from contextvars import Context
from time import monotonic as _monotonic
from types import FrameType, MethodType
from typing import Any, TypeVar, cast

from ._checks import seconds
from ._driver import AsyncioBackend, AsyncioDriver, Driver, loop_clock
from ._engine import Engine
from ._loophandle import LoopCalls, LoopTimerHandle, beyond_floats, file_loop, when_of
from ._loophandle import call_at as compiled_call_at
from ._loophandle import call_later as compiled_call_later
from ._shutdown import close_engine
from ._timer import MAX_TICK, MIN_TICK, Timer
from ._wheel import WheelEntry

__all__ = [
    "EventLoopPolicy",
    "WheelEventLoop",
    "loop_base",
    "loop_timer",
    "new_event_loop",
    "new_uvloop_event_loop",
    "run",
]

_T = TypeVar("_T")
_BASES = ("asyncio", "uvloop")


def _guard_internals() -> None:
    # The private asyncio internals relied on below. Checked once at import so that a
    # Python release that changes them fails loudly here, not subtly at run time.
    for name in ("_format_callback_source", "extract_stack"):
        if not hasattr(_format_helpers, name):
            raise ImportError(f"aiowheel's loop: asyncio.format_helpers lost {name}")
    for name in ("_check_thread", "_check_callback", "_check_closed", "_check_running"):
        if not hasattr(asyncio.BaseEventLoop, name):
            raise ImportError(f"aiowheel's loop: asyncio.BaseEventLoop lost {name}")


_guard_internals()


class WheelEventLoop(asyncio.AbstractEventLoop):
    """The type of every loop ``new_event_loop()`` returns, on either base: an
    ``asyncio.AbstractEventLoop`` with its timer, ``loop.timer``.

    For type checkers and ``isinstance``: ``new_event_loop()`` is typed to return it,
    and ``isinstance(asyncio.get_running_loop(), aiowheel.WheelEventLoop)`` tells
    aiowheel's loop from any other (``loop_timer()`` answers the same question in one
    call). It is not a loop of its own: make one with ``aiowheel.new_event_loop()``."""

    #: The loop's ``aiowheel.Timer``, on the same wheel as the loop's own timers; open
    #: from the moment the loop is made, closed by ``loop.close()`` (docs/loop.md).
    timer: Timer

    def __init__(self) -> None:
        # The loops themselves are the base loop's class with aiowheel's in front
        # (_AsyncioWheelLoop, _UvloopWheelLoop), whose __init__ never comes here.
        raise TypeError(
            "aiowheel.WheelEventLoop is the type of aiowheel's loops; make one with "
            "aiowheel.new_event_loop()"
        )


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
        return AsyncioDriver(on_wakeup, loop, self._grid, loop._arm_at, loop._wake_soon)


class _WheelLoop(WheelEventLoop):
    """Mixed in front of the base loop class; see the module docstring."""

    _base_call_at: Callable[..., Any]
    _base_call_later: Callable[..., Any]
    # The base clock's grid (aiowheel/_driver.py, AsyncioDriver.arm), a class attribute
    # of each base's loop: one more instance attribute would pass CPython's limit of
    # inline attributes and materialise the loop's __dict__, which slows every
    # attribute access of its methods (tests/test_loop_affinity.py).
    _base_grid: float

    # The engine and its wheel are the timer's, read through it: properties, not
    # attributes. CPython 3.13 keeps an instance's attributes inline (no dict object)
    # only up to its class's shared-keys capacity, which the base loop's own 26 nearly
    # fill: with these two as well the loop's __dict__ became a real dict, and every
    # attribute access of the loop's own methods slower (tests/test_loop_affinity.py).
    @property
    def _engine(self) -> Engine:
        return cast("Engine", self.timer._engine)

    def _init_timer(self, name: str, tick: float, grid: float) -> None:
        _import_anyio_backend()
        self.timer = Timer(tick=tick)
        self.timer._open_for_loop(_LoopBackend(self, name, grid))
        loop: Any = self
        self._engine.set_loop_debug(bool(loop.get_debug()))
        self._engine.set_loop_debug_run(self._debug_run)
        # What the one filing rule reads (aiowheel/_loophandle.py, LoopCalls,
        # file_loop), for the Python call_at and the compiled ones alike.
        calls = LoopCalls(
            self,
            self._engine,
            MethodType(_WheelLoop.call_at, self),
            MethodType(_WheelLoop.call_later, self),
            self._base_call_at,
            self._base_call_later,
            self._due_call_soon(),
        )
        self._calls = calls
        cls = type(self)
        if cls.call_at is _WheelLoop.call_at and cls.call_later is _WheelLoop.call_later:
            # The compiled call_at/call_later, set on the loop itself: no Python frame
            # per timer. Not when a subclass overrides either (its override must be
            # what callers get).
            self.call_at = MethodType(compiled_call_at, calls)  # type: ignore[method-assign]
            self.call_later = MethodType(compiled_call_later, calls)  # type: ignore[method-assign]

    # -- the timer API ------------------------------------------------------------
    # (The overrides take any callback and arguments; mypy's override check does not
    # match them with typeshed's TypeVarTuple signatures, hence the ignores.)

    def call_later(  # type: ignore[override]
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> Any:
        if delay is None:
            raise TypeError("delay must not be None")
        loop: Any = self
        try:
            when = loop.time() + delay
        except OverflowError:  # an int delay past the float range (beyond_floats)
            return beyond_floats(self._base_call_later, delay, callback, args, context)
        # In debug mode call_at's source traceback leaves this frame out (_OWN_CODE).
        return self.call_at(when, callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> Any:
        # The Python call_at: debug mode, a patched clock, and loop classes that
        # override call_at or call_later (the compiled ones are set on the loop
        # otherwise). Its own checks, then the one rule (_loophandle.file_loop).
        if when is None:
            raise TypeError("when cannot be None")
        loop: Any = self
        try:
            number = when_of(when)
        except OverflowError:  # an int past the float range (beyond_floats)
            return beyond_floats(self._base_call_at, when, callback, args, context)
        if self._time_patched:
            # loop.time is patched on the instance (mock.patch.object(loop, "time")):
            # the base loop's own timer, which it runs on the patched clock, exactly
            # as it would without aiowheel (docs/loop.md, "A patched clock").
            return self._base_call_at(when, callback, *args, context=context)
        finite = number - number == 0.0  # NaN and infinities go to the base loop
        trace = None
        if finite and loop.get_debug():
            # Before filing: a foreign thread's call is refused as the base loop refuses
            # it, and nothing is filed (issue 28, finding 4).
            if loop.is_closed():
                raise RuntimeError("Event loop is closed")
            self._check_loop_thread()
            check_callback = getattr(loop, "_check_callback", None)
            if check_callback is not None:
                check_callback(callback, "call_at")
            # From the caller of call_at, as the base loop's (Handle.__init__ drops
            # its own frames and call_at's).
            trace = _format_helpers.extract_stack(_caller(sys._getframe(1)))
        calls = self._calls
        assert calls is not None  # made with the loop (_init_timer)
        # An int time is kept as given, as asyncio keeps it (IntWhenHandle).
        given_int = type(when) is int and number == when
        due = calls.soon_if_due and finite and number <= loop.time()  # uvloop: call_soon
        return file_loop(calls, number, callback, args, context, given_int, due, trace)

    # -- debug mode: the slow-callback warning names the slow timer ------------------
    # The base loop measures each callback it runs and warns about a slow one by name;
    # the wheel's timers run inside one base-loop callback, the pass, which the base
    # loop would name instead (AsyncioDriver._wake: issue 28, finding 11). So in debug
    # mode the pass measures each of the loop's timers itself (_loophandle.run_in_pass
    # calls _debug_run), and the base loop does not warn about the pass
    # (_measured_pass, armed by _arm_at while debug mode is on).

    def _debug_run(self, entry: WheelEntry) -> bool:
        handle = cast("LoopTimerHandle[Any]", entry)  # the pass runs only these here
        loop: Any = self
        started = _monotonic()
        ran = handle._run()  # Handle._run's rules: only SystemExit/KeyboardInterrupt leave
        took = _monotonic() - started
        loop._debug_measured += took  # the part of the pass named already (_measured_pass)
        if took >= self._slow_callback_limit():
            _asyncio_logger.warning("Executing %s took %.3f seconds", _format_handle(handle), took)
        return ran

    def _slow_callback_limit(self) -> float:
        loop: Any = self
        return float(loop.slow_callback_duration)

    def _due_call_soon(self) -> Callable[..., Any] | None:
        """Where a timer due now goes instead of the wheel: uvloop's ``call_soon``
        on the uvloop base (uvloop runs a due timer as a call_soon);
        None on the asyncio base (a due timer joins the next iteration, after what is
        queued: the wheel's wake-up for "now" is a heap entry, ``_wake_soon``)."""
        return None

    def _wake_soon(self, callback: Callable[[], None], *, context: Context) -> Any:
        """The driver's wake-up for "now" (``AsyncioDriver.arm(-inf)``), run in the
        driver's ``context``."""
        raise NotImplementedError  # each base's class

    def set_debug(self, enabled: bool) -> None:
        base: Any = super()
        base.set_debug(enabled)
        # Kept on the engine for the compiled call_at and LoopTimerHandle.cancel (one
        # attribute, not a get_debug() call per timer). The base loop's __init__ calls
        # this before the engine exists: _init_timer reads get_debug() then.
        engine: Engine | None = getattr(self, "_engine", None)
        if engine is not None:
            loop: Any = self
            engine.set_loop_debug(bool(loop.get_debug()))

    def _base_arming(self) -> tuple[float, Callable[..., Any]]:
        """How a timer's driver arms its wake-up on this loop (aiowheel/_driver.py,
        ``AsyncioBackend.make_driver``): the base clock's grid and the base class's
        ``call_at``, as loop.timer's own driver does. Through the loop's ``call_at``
        the wake-up would be a timer on this loop's wheel, its instant (already a
        tick of the timer's own wheel) rounded up a second time, to a tick of this
        one: up to a tick later."""
        return self._base_grid, self._base_call_at

    def _check_loop_thread(self) -> None:
        """Debug mode's thread check, as the base loop's ``_check_thread``: a call
        from a thread other than the one running the loop raises ``RuntimeError``."""
        raise NotImplementedError  # each base's class

    # -- lifecycle ----------------------------------------------------------------------

    def _check_can_run(self) -> None:
        """The base loop's own refusals of ``run_forever`` (closed, already running,
        another loop running in this thread), made before ``_bind_timer`` changes
        anything: a refused call must leave ``loop.timer`` with the thread that runs
        the loop (issue 28, finding 7)."""
        raise NotImplementedError  # each base's class

    def _bind_timer(self) -> None:
        # run_forever, once the base loop's checks passed (_check_can_run): loop.timer
        # belongs to the thread that runs the loop. The clock first: a refusal there
        # must not move the timer either.
        self._follow_clock()
        self.timer._bind_thread()

    # -- a patched clock: mock.patch.object(loop, "time", ...) --------------------------
    # Followed, not refused (issue 28, finding 8: aiohttp's own tests patch it and
    # expect their timers to fire on it). While time() is patched on the instance, new
    # timers go to the base loop, which reads its clock through self.time(), so they
    # fire as on the base loop; the wheel keeps its own clock (never early on it, never
    # moving backwards), and its wake-up is armed on the patched clock the same
    # distance ahead (_arm_at), so a patched clock that stands still holds the wheel's
    # timers as it holds the base loop's. Told by __setattr__/__delattr__ of "time".

    _time_patched = False
    _calls: LoopCalls | None = None
    _debug_measured = 0.0  # debug mode: the time the pass spent in _debug_run

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "time":
            self._clock_patched(True)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        if name == "time":
            self._clock_patched("time" in self.__dict__)

    def _clock_patched(self, patched: bool) -> None:
        object.__setattr__(self, "_time_patched", patched)
        calls = self._calls
        if calls is not None:
            calls.patched = patched
        engine: Engine | None = getattr(self, "_engine", None)
        if engine is None:
            return
        # The wake-up in place was armed on the other clock: a re-check after a cancel
        # must arm again rather than keep it (Engine.wakeup_after_cancel).
        engine.driver.clock_changed()
        if not patched:
            # The wake-up again, on the real clock (_arm_at). Not when the patch
            # begins: the new time() is often configured only after it is set (a
            # Mock's return_value); the next arming follows it.
            engine.sync_wakeup_unless_passing()

    def _follow_clock(self) -> None:
        # A patch that swaps the loop's class after the loop was made (looptime's
        # patch_event_loop: virtual time) changes its clock under the wheel, which was
        # made on the old one and keeps it: a deadline read on the new clock and fired
        # on the old could fire early. Refuse to run rather than break the never-early
        # rule (docs/loop.md, "What differs").
        if not self._time_patched and loop_clock(self) != self._engine.clock:
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
            close_engine(engine)


def _import_anyio_backend() -> None:
    # loop.timer's engine starts without anyio (no task group: the loop drives it), so
    # the first call that needs anyio's asyncio backend (a wait(), a sleep, an async
    # callback's worker) imported it then, 15-25 ms with a timer already pending: the
    # first loop.timer timer of a process fired that late (issue 32). Imported with
    # the first loop instead, when nothing can be pending yet, as a Timer started
    # with `async with` imports it at its start (docs/loop.md, "Is my timer on the
    # wheel?"). anyio's own name for it (anyio/_core/_eventloop.py, get_async_backend);
    # a later anyio that moves it only loses this head start.
    if "anyio._backends._asyncio" not in sys.modules:
        try:
            importlib.import_module("anyio._backends._asyncio")
        except ImportError:
            pass


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


def _format_handle(handle: LoopTimerHandle[Any]) -> str:
    # asyncio.base_events._format_handle: a task's step names the task.
    callback = handle._callback
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return repr(owner)
    return str(handle)


class _PassMeasured(Exception):
    """Raised at the end of a slow debug-mode pass on the uvloop base, whose timers the
    pass measured itself (``_WheelLoop._debug_run``): uvloop measures a timer callback
    that returns, not one that raises, and the loop's ``call_exception_handler``
    drops this one. (uvloop's check reads its own C field: nothing else can keep it
    from naming the pass.)"""


def loop_base(loop: object) -> str | None:
    """``"asyncio"`` or ``"uvloop"``: the base of aiowheel's drop-in loop ``loop``;
    ``None`` for any other loop. The drop-in loop's class is a subclass of the base
    loop's (``isinstance(loop, uvloop.Loop)`` holds) but lives in this module, so a
    check of ``type(loop).__module__`` does not see uvloop: ask this instead
    (docs/loop.md, "Which base")."""
    base = getattr(type(loop), "_aiowheel_base", None)
    return base if isinstance(loop, _WheelLoop) and isinstance(base, str) else None


def loop_timer(loop: asyncio.AbstractEventLoop | None = None) -> Timer | None:
    """The timer of aiowheel's drop-in loop, ``loop.timer``, or None.

    ``loop`` defaults to the running loop. None when it is not aiowheel's loop (a plain
    asyncio or uvloop loop), when it is closed, and when no asyncio loop runs in this
    thread (none at all, or trio): so ``aiowheel.loop_timer() is not None`` says that
    ``asyncio.sleep`` and every ``call_later`` of the running loop go on a wheel
    (docs/loop.md, "Is my timer on the wheel?"). Typed code gets ``Timer | None``;
    aiowheel's own integrations (the idle-timeout middleware's shared timer) use it
    instead of starting a second timer on this loop."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
    elif not isinstance(loop, asyncio.AbstractEventLoop):
        raise TypeError(f"loop must be an asyncio event loop or None, got {loop!r}")
    if isinstance(loop, _WheelLoop):
        timer = loop.timer
        if not timer.closed:
            return timer
    return None


class _AsyncioLoopState:
    """The asyncio base's own state, one object (see _AsyncioWheelLoop)."""

    __slots__ = (
        "calls",
        "debug_measured",
        "pass_measured",
        "slow_callback_duration",
        "time_patched",
    )

    def __init__(self) -> None:
        self.calls: LoopCalls | None = None
        self.time_patched = False
        self.pass_measured = False
        self.debug_measured = 0.0
        self.slow_callback_duration = 0.1  # BaseEventLoop.__init__ sets it again


def _own_state(name: str) -> Any:
    """A property of _AsyncioWheelLoop that reads and writes ``name`` of its state."""

    def get(loop: Any) -> Any:
        return getattr(loop._own, name)

    def set_(loop: Any, value: Any) -> None:
        setattr(loop._own, name, value)

    return property(get, set_)


class _AsyncioWheelLoop(_WheelLoop, asyncio.SelectorEventLoop):  # type: ignore[misc]
    # BaseEventLoop.time() is a Python method returning time.monotonic(); the C
    # function itself, as a class attribute (a builtin does not bind: loop.time() calls
    # it with no argument), gives the same clock without a Python frame. Every timer
    # reads it (call_later, asyncio.timeout, each loop iteration); a subclass's or
    # looptime's own time() still wins, as any override does.
    time = time.monotonic
    _base_grid = 1e6
    # What loop_base() answers; also read by aiowheel/_driver.py's backend_name().
    _aiowheel_base = "asyncio"
    _base_call_later = asyncio.SelectorEventLoop.call_later  # past _WheelLoop's override
    # The drop-in loop's own state lives in one side object (_AsyncioLoopState), read
    # through the properties below, not in five attributes of the loop: CPython keeps
    # an instance's attributes inline (no dict object) only up to 30 names per class on
    # 3.11 and up to 29 on 3.13, which the base loop's own 25 and call_at, call_later and
    # timer nearly fill; past that, and on 3.13 for any subclass with __slots__, the
    # loop's __dict__ is a real dict and every attribute access of the loop's own
    # methods takes the slower dict path (docs/benchmark-history.md, "Task steps on the
    # asyncio base"; tests/test_loop_affinity.py).
    _calls = _own_state("calls")
    _time_patched = _own_state("time_patched")
    _pass_measured = _own_state("pass_measured")
    _debug_measured = _own_state("debug_measured")
    _own: _AsyncioLoopState

    def __init__(self, tick: float) -> None:
        self._init_slots()
        asyncio.SelectorEventLoop.__init__(self)
        self._init_timer("asyncio", tick, self._base_grid)

    def _init_slots(self) -> None:
        # Before the base class's __init__, which already sets slow_callback_duration
        # (the property's setter writes the side object). A subclass that makes the
        # loop another way (tests/loop/test_on_the_wheel.py puts it on a virtual clock
        # first) calls this first too.
        self._own = _AsyncioLoopState()

    def _base_call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        return asyncio.SelectorEventLoop.call_at(self, when, callback, *args, context=context)

    def _wake_soon(self, callback: Callable[[], None], *, context: Context) -> asyncio.TimerHandle:
        # A heap entry at now, not call_soon: asyncio moves a due timer to the ready
        # queue at the next iteration, after the callbacks already queued, and so
        # must the wheel's pass that runs it (`call_later(0, B); call_soon(A);
        # call_later(0, C)` must run A B C, as asyncio does).
        return self._arm_at(self._engine.clock(), callback, context=context)

    def _arm_at(
        self, when: float, wake: Callable[[], None], *, context: Context
    ) -> asyncio.TimerHandle:
        # The driver's wake-up (`when` on the wheel's clock): one heap entry (the base
        # class's call_at), which the base loop compares with self.time().
        if self._time_patched:
            loop: Any = self
            patched_now = loop.time()
            if isinstance(patched_now, (int, float)):
                when = patched_now + (when - self._engine.clock())  # as far ahead
        if self._debug:  # type: ignore[attr-defined]
            return asyncio.SelectorEventLoop.call_at(
                self, when, self._measured_pass, wake, context=context
            )
        return asyncio.SelectorEventLoop.call_at(self, when, wake, context=context)

    def _measured_pass(self, wake: Callable[[], None]) -> None:
        self._debug_measured = 0.0
        started = _monotonic()
        wake()
        rest = _monotonic() - started - self._debug_measured
        # No warning for the pass (_run_once's next read), unless what was not measured
        # in it (loop.timer's own callbacks) was slow by itself.
        if self._debug and rest < self._own.slow_callback_duration:  # type: ignore[attr-defined]
            self._pass_measured = True

    # BaseEventLoop._run_once reads slow_callback_duration right after each callback
    # it runs, in debug mode: after a pass whose timers were measured one by one, that
    # read is infinite (once), so the pass itself is never named.

    @property
    def slow_callback_duration(self) -> float:
        own = self._own
        if own.pass_measured:
            own.pass_measured = False
            return math.inf
        return own.slow_callback_duration

    @slow_callback_duration.setter
    def slow_callback_duration(self, value: float) -> None:
        self._own.slow_callback_duration = value

    def _slow_callback_limit(self) -> float:
        return self._own.slow_callback_duration

    def _check_loop_thread(self) -> None:
        base: Any = asyncio.SelectorEventLoop
        base._check_thread(self)  # private, checked at import (_guard_internals)

    def _check_can_run(self) -> None:
        # run_forever's own checks (BaseEventLoop._check_closed, _check_running).
        base: Any = asyncio.SelectorEventLoop
        base._check_closed(self)
        base._check_running(self)

    def run_forever(self) -> None:
        self._check_can_run()
        self._bind_timer()
        asyncio.SelectorEventLoop.run_forever(self)

    def close(self) -> None:
        if not self.is_running() and not self.is_closed():
            self._close_timer()
        asyncio.SelectorEventLoop.close(self)


_uvloop_class: type[Any] | None = None
#: ``uvloop.Loop``, once the first loop on the uvloop base asked for it (uvloop is an
#: extra: importing aiowheel never imports it): the base class whose methods the
#: overrides below call (no instance exists before it is set).
_UvLoop: Any = None


def _uvloop() -> Any:
    """``uvloop.Loop``; ImportError naming the extra when uvloop is not installed (and
    asked again next time: only a successful import is kept)."""
    global _UvLoop
    if _UvLoop is None:
        try:
            import uvloop
        except ImportError as exc:
            raise ImportError(
                "base='uvloop' needs uvloop: pip install 'aiowheel[uvloop]' "
                "(from a checkout: pip install '.[uvloop]')"
            ) from exc
        _UvLoop = uvloop.Loop
    return _UvLoop


class _UvloopOverrides(_WheelLoop):
    """What the uvloop base does differently from the asyncio base (``_AsyncioWheelLoop``).

    It cannot subclass ``uvloop.Loop`` here, where uvloop may not be installed: the loop
    class is these overrides over ``uvloop.Loop``, put together by
    ``_uvloop_loop_class`` when a loop on the uvloop base is first asked for. Every
    ``_UvLoop.method(self, ...)`` below is that base class's method, called past
    ``_WheelLoop``'s override of the same name.
    """

    _base_grid = 1e3  # uvloop's clock: whole milliseconds
    _aiowheel_base = "uvloop"  # loop_base()

    def __init__(self, tick: float) -> None:
        _UvLoop.__init__(self)
        self._init_timer("uvloop", tick, self._base_grid)

    def _base_call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        # uvloop's call_at goes through self.call_later (our override): call
        # the base class's call_later directly, with the delay uvloop's own
        # call_at computes. Unclamped: uvloop makes a negative delay 0 and
        # refuses NaN with ValueError itself (max(0.0, nan) would be 0.0: a
        # NaN timer firing at once, issue 28, finding 10).
        handle: asyncio.TimerHandle = _UvLoop.call_later(
            self, when - self.time(), callback, *args, context=context
        )
        return handle

    def _due_call_soon(self) -> Callable[..., Any] | None:
        return MethodType(_UvLoop.call_soon, self)

    def _wake_soon(self, callback: Callable[[], None], *, context: Context) -> Any:
        return _UvLoop.call_soon(self, callback, context=context)

    def _arm_at(self, when: float, wake: Callable[[], None], *, context: Context) -> Any:
        # The driver's wake-up, on uvloop's real clock (its time() method may
        # be patched: the wheel's clock is uvloop's own).
        delay = when - _UvLoop.time(self)
        if self.get_debug():
            return _UvLoop.call_later(self, delay, self._measured_pass, wake, context=context)
        return _UvLoop.call_later(self, delay, wake, context=context)

    def _measured_pass(self, wake: Callable[[], None]) -> None:
        self._debug_measured = 0.0
        started = _monotonic()
        wake()
        took = _monotonic() - started
        limit = self.slow_callback_duration
        # uvloop would name this pass when it took over its limit (it measures
        # a little more than this: half the limit is the margin), unless what
        # was not measured in it (loop.timer's own callbacks) was slow itself.
        if self.get_debug() and took >= limit / 2 and took - self._debug_measured < limit / 2:
            raise _PassMeasured

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), _PassMeasured):
            return  # not an error: see _PassMeasured
        _UvLoop.call_exception_handler(self, context)

    def _check_loop_thread(self) -> None:
        # uvloop's _check_thread is not reachable from Python, and its
        # _thread_id is not readable: the running loop's thread is the one
        # run_forever bound loop.timer to (_bind_timer).
        if self.is_running() and _get_ident() != self._engine.affinity.thread:
            raise RuntimeError(
                "Non-thread-safe operation invoked on an event loop other than the current one"
            )

    def _check_can_run(self) -> None:
        # uvloop.Loop.run_forever's own checks, with its messages (its
        # _check_closed is not reachable from Python).
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        if self.is_running():
            raise RuntimeError("this event loop is already running.")
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("Cannot run the event loop while another loop is running")

    def run_forever(self) -> None:
        self._check_can_run()
        self._bind_timer()
        _UvLoop.run_forever(self)

    def close(self) -> None:
        if not self.is_running() and not self.is_closed():
            self._close_timer()
        _UvLoop.close(self)


def _uvloop_loop_class() -> type[Any]:
    global _uvloop_class
    if _uvloop_class is None:

        class _UvloopWheelLoop(_UvloopOverrides, _uvloop()):  # type: ignore[misc]
            # uvloop's own call_later, past _WheelLoop's override (beyond_floats).
            _base_call_later = _UvLoop.call_later

        _uvloop_class = _UvloopWheelLoop
    return _uvloop_class


def _check_base(base: object) -> str:
    if base not in _BASES:
        raise ValueError(f"base must be 'asyncio' or 'uvloop', got {base!r}")
    return str(base)


def new_event_loop(*, base: str = "asyncio", tick: float = 0.001) -> WheelEventLoop:
    """A new event loop: ``base``'s loop with its timers on an aiowheel wheel, and that
    wheel's ``aiowheel.Timer`` as ``loop.timer`` (typed: ``WheelEventLoop``)."""
    name = _check_base(base)
    tick_ = seconds(tick, "tick")
    if not MIN_TICK <= tick_ <= MAX_TICK:
        raise ValueError(f"tick must be from {MIN_TICK} to {MAX_TICK:g} seconds, got {tick!r}")
    if name == "uvloop":
        loop: WheelEventLoop = _uvloop_loop_class()(tick_)
    else:
        loop = _AsyncioWheelLoop(tick_)
    return loop


def new_uvloop_event_loop(*, tick: float = 0.001) -> WheelEventLoop:
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

    def new_event_loop(self) -> WheelEventLoop:
        return new_event_loop(base=self._aiowheel_base)
