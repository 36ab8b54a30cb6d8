"""The drop-in loop's timer handle: one object per ``call_at``/``call_later`` timer.

``LoopTimerHandle`` is at once the wheel's entry (a ``WheelEntry``: deadline, bucket,
links) and the handle ``call_at`` returns, so a pending loop timer costs one object,
not a handle plus a wheel node (docs/loop.md, "Memory"). A compiled class cannot
subclass ``asyncio.TimerHandle`` (a pure-Python class) and be a native ``WheelEntry``
at once, so it implements ``asyncio.TimerHandle``'s contract itself, as uvloop's own
``TimerHandle`` does: ``when()``, ``cancel()``, ``cancelled()``, ``get_context()``,
``_run()`` with ``Handle._run``'s rules, ordering, equality and hash as
``TimerHandle``'s, and the base loop's ``repr``.

Slots are kept to what the contract needs (the memory target is the plain asyncio
loop's, docs/loop.md): no ``_when`` (the entry's ``_deadline`` is it, unboxed when
compiled), no ``_scheduled`` (``_bucket is not None``) and no ``_cancelled``: a handle
is cancelled exactly when ``_args`` is ``None`` (``cancel()`` drops the callback and
its arguments, as ``Handle.cancel`` does; a live handle's arguments are a tuple).

Who writes what: ``file_loop``, the one rule of the loop's ``call_at`` (the compiled
``call_at``/``call_later`` here, and ``_WheelLoop.call_at`` in ``_loop.py`` for debug
mode, which gives it ``_source_traceback``), makes the handle and files it on the wheel
of ``loop.timer``'s engine, whose pass (``_pass.run_due``) runs it through
``run_in_pass``; ``cancel()`` unlinks it (``_cancelled``), and the close drops what
is left (``drop_all``). Those functions, at the end of this module, are the engine's
whole side of the drop-in loop's handles: the engine keeps the counts (through its
counter methods: ``len(loop.timer)``) and the wake-up.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

import asyncio
import asyncio.format_helpers as _format_helpers
import math
import sys
from _thread import get_ident
from collections.abc import Callable
from contextvars import Context
from typing import TYPE_CHECKING, Any, Final, Generic, NoReturn, TypeVar, cast, final

from ._handle import release, snapshot_context
from ._wheel import GC_START, Bucket, WheelEntry

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = [
    "IntWhenHandle",
    "LoopCalls",
    "LoopTimerHandle",
    "call_at",
    "call_later",
    "drop_all",
    "file_loop",
    "run_in_pass",
    "when_of",
]

T = TypeVar("T")
_EXIT: Final = (SystemExit, KeyboardInterrupt)
_INF: Final = math.inf
_format_callback_source: Final = _format_helpers._format_callback_source
_AsyncioTimerHandle: Final = asyncio.TimerHandle


def _callback_source(callback: object, args: tuple[Any, ...], debug: bool) -> str:
    """``cb(1, 'x') at file.py:12``, as asyncio's handles format their callback: from
    CPython 3.13 the arguments only in debug mode (they may hold secrets), so the
    loop's debug flag is passed, as ``Handle._repr_info`` and ``Handle._run`` do."""
    # One return per branch: mypy (and mypyc, which checks for the Python it builds
    # on) would call a statement after a version test that returns unreachable.
    if sys.version_info >= (3, 13):
        source: str = _format_callback_source(callback, args, debug=debug)
    else:
        source = _format_callback_source(callback, args)
    return source


class LoopTimerHandle(WheelEntry, Generic[T]):
    """An ``asyncio.TimerHandle`` look-alike filed on the loop's wheel (it *is* the
    wheel entry). ``Generic`` only gives the compiled class its ``__weakref__`` slot
    (as ``_handle.TimerHandle``; setup.py makes it safe)."""

    __slots__ = (
        "__weakref__",
        "_args",
        "_callback",
        "_context",
        "_engine",
        "_repr",
        "_shared_context",
        "_source_traceback",
    )

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        engine: Engine,
        context: Context | None,
    ) -> None:
        self._gc = GC_START  # the collector's ledger (aiowheel/_wheel.py)
        self._deadline = when
        self._bucket = None
        self._prev = self._next = None
        self._callback: Callable[..., object] | None = callback
        self._args: tuple[Any, ...] | None = args
        # The loop's timer engine (loop.timer's), whose wheel holds this handle; the
        # loop is its ``loop`` (one slot for both: the memory target).
        self._engine = engine
        # A context given is run in as it is (asyncio's rule: what the callback sets
        # stays in it); without one, a snapshot of the current context, shared with
        # other handles and so never run in: _run runs in a copy of it.
        if context is None:
            self._context: Context = snapshot_context()
            self._shared_context = True
        else:
            self._context = context
            self._shared_context = False
        # Set by the loop in debug mode (it knows which frames are its own).
        self._source_traceback: Any = None
        self._repr: str | None = None

    # -- asyncio.TimerHandle's contract ---------------------------------------------------

    def when(self) -> Any:
        """The absolute time, on the loop's clock, the callback is scheduled for.
        (``Any``, not ``float``: compiled, a float result would make every caller,
        ``_format`` included, box IntWhenHandle's int into a float.)"""
        return self._deadline

    def get_context(self) -> Context:
        """The context the callback will run in, the handle's own (asyncio's rule):
        a snapshot shared with other handles (``snapshot_context``) is copied first,
        so that what a caller sets in it (``get_context().run(var.set, v)``) reaches
        this handle's callback and no other's."""
        if self._shared_context:
            self._context = self._context.copy()
            self._shared_context = False
        return self._context

    def cancelled(self) -> bool:
        return self._args is None

    def cancel(self) -> None:
        """Off the wheel at once (no tombstone), callback and arguments dropped.

        Re-entrancy (docs/design.md): user code runs here in the debug repr (the
        callback's ``__repr__``) and in the finalizers of the callback and arguments
        this drops. The repr is made before any change; then the handle is cancelled
        (``_args`` None), unlinked and counted; the callback and arguments, held in
        locals, are released last. A finalizer that looks finds the handle cancelled
        and off the wheel, as after ``Handle.cancel``; one that cancels it again finds
        nothing to do."""
        args = self._args
        if args is None:
            return
        engine = self._engine
        if engine.loop_debug:  # the loop's get_debug(), kept by its set_debug
            # As Handle.cancel: keep the callback in the repr of a cancelled handle.
            cached = self._format(True)
            if self._args is None:
                return  # the repr's user code cancelled it meanwhile
            self._repr = cached
            if _foreign(engine):
                # From a thread other than the running loop's (debug mode tells them
                # apart; the base loops' cancel() never raises there, issue 28,
                # finding 6): cancelled now, as asyncio's Handle.cancel is; the wheel
                # belongs to the loop's thread, so the unlink and its counts are done
                # there. A pass that meets the handle first skips it (cancelled).
                callback = self._callback
                self._args = None
                self._callback = None
                if self._bucket is not None:
                    _unlink_soon(engine, self)
                release(callback)
                release(args)
                return
        callback = self._callback
        self._args = None
        self._callback = None
        bucket = self._bucket
        if bucket is not None:
            bucket.remove(self)
            _cancelled(self._engine, bucket)
        # Released here, once the cancel is complete (compiled, a local dies at its
        # last use: release() is that use, aiowheel/_handle.py).
        release(callback)
        release(args)

    @property
    def _loop(self) -> Any:
        return self._engine.loop

    @property
    def _when(self) -> Any:
        return self._deadline

    @property
    def _cancelled(self) -> bool:
        return self._args is None

    @property
    def _scheduled(self) -> bool:
        return self._bucket is not None

    def _run(self) -> bool:
        """``Handle._run``: the callback in its context; its exception goes to the
        loop's exception handler, but ``SystemExit``/``KeyboardInterrupt``
        propagate. Returns whether the callback was called (not: cancelled, from
        another thread after the pass took the handle; ``run_in_pass``)."""
        args = self._args
        if args is None:
            return False  # cancelled
        callback = self._callback
        run_in = self._context
        if self._shared_context:
            # Kept as the handle's own: get_context() after the run is the context
            # the callback ran in, as asyncio's (aiowheel/_handle.py, the invariant
            # of snapshot_context).
            run_in = self._context = run_in.copy()
            self._shared_context = False
        try:
            if args:
                run_in.run(callback, *args)  # type: ignore[arg-type]
            else:
                run_in.run(callback)  # type: ignore[arg-type]
        except _EXIT:
            raise
        except BaseException as exc:
            cb = _callback_source(callback, args, self._engine.loop_debug)
            context: dict[str, Any] = {
                "message": f"Exception in callback {cb}",
                "exception": exc,
                "handle": self,
            }
            if self._source_traceback:
                context["source_traceback"] = self._source_traceback
            self._loop.call_exception_handler(context)
        return True

    # -- as asyncio.TimerHandle: hash, equality, order, repr -------------------------------

    def __hash__(self) -> int:
        return hash(self._deadline)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LoopTimerHandle):
            return (
                self._deadline == other._deadline
                and self._callback == other._callback
                and self._args == other._args
            )
        if isinstance(other, _AsyncioTimerHandle):
            theirs: Any = other
            return bool(
                self._deadline == theirs._when
                and self._callback == theirs._callback
                and self._args == theirs._args
                and (self._args is None) == theirs._cancelled
            )
        return NotImplemented

    def __lt__(self, other: object) -> bool:
        return self._deadline < _when_of(other)

    def __le__(self, other: object) -> bool:
        if isinstance(other, (LoopTimerHandle, _AsyncioTimerHandle)):
            return self._deadline < _when_of(other) or self == other
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        return self._deadline > _when_of(other)

    def __ge__(self, other: object) -> bool:
        if isinstance(other, (LoopTimerHandle, _AsyncioTimerHandle)):
            return self._deadline > _when_of(other) or self == other
        return NotImplemented

    def __repr__(self) -> str:
        cached = self._repr
        if cached is not None:
            return cached
        return self._format(self._args is None)

    def _format(self, cancelled: bool) -> str:
        # TimerHandle._repr_info: name, "cancelled", when=..., the callback, where made.
        info = ["TimerHandle"]
        if cancelled:
            info.append("cancelled")
        info.append(f"when={self.when()}")  # an int as given (IntWhenHandle)
        callback = self._callback
        if callback is not None:
            info.append(_callback_source(callback, self._args or (), self._engine.loop_debug))
        trace = self._source_traceback
        if trace:
            frame = trace[-1]
            info.append(f"created at {frame[0]}:{frame[1]}")
        return "<{}>".format(" ".join(info))


class IntWhenHandle(LoopTimerHandle[T]):
    """A ``LoopTimerHandle`` for a ``call_at`` given an ``int`` time: ``when()`` (and
    ``_when``) give that int back, as ``asyncio.TimerHandle`` keeps ``when`` as
    passed (aiohttp's timeouts pass ``math.ceil(...)`` and their tests check the
    type). The wheel files the float; the class says it was an int, so a handle costs
    no slot more (docs/loop.md, "Memory"). Only for ints a float holds exactly."""

    __slots__ = ()

    def when(self) -> Any:
        return int(self._deadline)

    @property
    def _when(self) -> Any:
        return int(self._deadline)


def _when_of(other: object) -> float:
    # The comparisons return NotImplemented for a non-handle in asyncio; a TypeError
    # from the interpreter is what that ends as, so raise it here directly.
    if isinstance(other, LoopTimerHandle):
        return other._deadline
    if isinstance(other, _AsyncioTimerHandle):
        return other.when()
    raise TypeError(f"cannot compare a TimerHandle with {type(other).__name__!r}")


# -- the loop's call_at and call_later, compiled ----------------------------------------


@final
class LoopCalls:
    """What the drop-in loop's compiled ``call_at``/``call_later`` read: the loop, its
    timer's engine, and the loop's own Python methods for the rare cases.

    The loop binds ``call_at``/``call_later`` below to this object and sets them on
    itself (aiowheel/_loop.py, ``_WheelLoop._init_timer``): a call then goes from the
    caller straight into compiled code, with no Python frame between (a Python
    override costs a frame, a type call that parses its arguments and a method call
    that parses them again: about half of a reschedule, docs/loop.md, "Figures")."""

    def __init__(
        self,
        loop: Any,
        engine: Engine,
        debug_call_at: Callable[..., Any],
        debug_call_later: Callable[..., Any],
        base_call_at: Callable[..., Any],
        base_call_later: Callable[..., Any],
        base_call_soon: Callable[..., Any] | None,
    ) -> None:
        self.loop = loop
        self.engine = engine
        # The loop's Python call_at/call_later: debug mode (its checks and the source
        # traceback, which needs the Python frames these compiled calls do not have).
        self.debug_call_at = debug_call_at
        self.debug_call_later = debug_call_later
        # The base loop's call_at, for NaN and infinite times (as the base loop does),
        # and its call_at and call_later for an int past the float range, which only
        # the base loop can take as it is (``beyond_floats``).
        self.base_call_at = base_call_at
        self.base_call_later = base_call_later
        # uvloop's rule for a timer due now (a delay of 0 or less): its
        # call_soon, at the call, in call order with the other call_soon callbacks
        # (issue 28, finding 5). None on the asyncio base, where a due timer waits for
        # the next iteration as asyncio's do (the wheel's wake-up is then on the heap).
        self.base_call_soon = base_call_soon
        self.soon_if_due = base_call_soon is not None
        # True while the loop's time() is patched on the instance (mock.patch.object):
        # the Python methods then hand every new timer to the base loop, which follows
        # the patched clock (aiowheel/_loop.py, _WheelLoop._clock_patched).
        self.patched = False


def call_at(
    calls: LoopCalls,
    when: Any,
    callback: Callable[..., object],
    *args: Any,
    context: Context | None = None,
) -> Any:
    """The drop-in loop's ``call_at``, bound to the loop's ``LoopCalls``."""
    if when is None:
        raise TypeError("when cannot be None")
    if calls.engine.loop_debug or calls.patched:  # debug mode, or loop.time patched
        return calls.debug_call_at(when, callback, *args, context=context)
    if type(when) is float:
        number = when
        given_int = False
    else:
        try:
            number = when_of(when)
        except OverflowError:
            return beyond_floats(calls.base_call_at, when, callback, args, context)
        given_int = type(when) is int and number == when
    # uvloop's call_at: its call_later of when - time(), which runs a timer due now as
    # a call_soon. (uvloop also runs one up to half a millisecond ahead at once, as it
    # rounds to whole ones: that one stays on the wheel, never early, docs/loop.md.)
    # Not NaN or an infinity (finite: number - number == 0), which go to the base loop
    # unchanged (file_loop).
    due = calls.soon_if_due and number - number == 0.0 and number <= calls.engine.clock()
    return file_loop(calls, number, callback, args, context, given_int, due)


def beyond_floats(
    base_call: Callable[..., Any],
    time: Any,
    callback: Callable[..., object],
    args: tuple[Any, ...],
    context: Context | None,
) -> Any:
    """A time (or delay) that is an int past the float range (``10**400``): no wheel
    holds it, and the base loops differ on it, so the base loop's own ``call_at`` or
    ``call_later`` takes it as given. asyncio files such a ``call_at`` on its heap and
    raises ``OverflowError`` at such a ``call_later``; uvloop the other way round."""
    return base_call(time, callback, *args, context=context)


def when_of(when: Any) -> float:
    """``call_at``'s ``when`` (not None) as a float: any number. Not text, which
    ``float()`` would parse ("5", b"5"): the base loops take none (uvloop raises
    TypeError, asyncio fails later, inside its own loop)."""
    cls = type(when)
    if not (hasattr(cls, "__float__") or hasattr(cls, "__index__")):
        raise TypeError(f"when must be a number, got {when!r}")
    return float(when)


def call_later(
    calls: LoopCalls,
    delay: Any,
    callback: Callable[..., object],
    *args: Any,
    context: Context | None = None,
) -> Any:
    """The drop-in loop's ``call_later``, bound to the loop's ``LoopCalls``."""
    if delay is None:
        raise TypeError("delay must not be None")
    if calls.engine.loop_debug or calls.patched:  # debug mode, or loop.time patched
        return calls.debug_call_later(delay, callback, *args, context=context)
    # The loop's time() unpatched is the engine's clock (aiowheel/_driver.py,
    # loop_clock), which on the asyncio base is time.monotonic itself: no Python frame
    # of BaseEventLoop.time per call (a tenth of a call_later and its cancel).
    try:
        when = float(calls.engine.clock() + delay)
    except OverflowError:
        return beyond_floats(calls.base_call_later, delay, callback, args, context)
    due = calls.soon_if_due and delay <= 0 and when - when == 0.0  # see call_at
    return file_loop(calls, when, callback, args, context, False, due)


# -- the engine's side: the drop-in loop's handles on its wheel --------------------------
# They count in pending/scheduled/fired/cancelled as the timer's own handles do
# (len(loop.timer) counts them), through the engine's counter methods; no admission,
# no tracing, no waiters. The engine's pass calls run_in_pass; the close, drop_all.


def file_loop(
    calls: LoopCalls,
    when: float,
    callback: Callable[..., object],
    args: tuple[Any, ...],
    context: Context | None,
    given_int: bool,
    due: bool,
    source_traceback: Any = None,
) -> Any:
    """The drop-in loop's ``call_at`` past its argument checks: the one rule, for the
    compiled ``call_at``/``call_later`` above and the loop's Python ``call_at``
    (``_WheelLoop.call_at``: debug mode, whose checks and ``source_traceback`` it
    makes first, and loop classes that override either method).

    ``when`` is NaN or an infinity: exactly what the base loop does with it (the wheel
    accepts finite deadlines only, so it never sees one). ``due`` (the uvloop base, a
    timer due now): uvloop's ``call_soon`` runs the handle (its ``_run``: Handle._run's
    rules), in call order with the other call_soon callbacks, as uvloop runs its own
    due timers; the wheel never holds it, so ``len(loop.timer)``
    does not count it, and cancel() marks it cancelled (its _run then does nothing).
    Else the handle is filed on the wheel of ``loop.timer``'s engine and counted."""
    if when - when != 0.0:
        return calls.base_call_at(when, callback, *args, context=context)
    engine = calls.engine
    # loop.close() closes the engine first (an engine closed on its own, after an
    # internal error, raises its own error below); uvloop's call_soon does not check.
    if (due or engine.closed) and calls.loop.is_closed():
        raise RuntimeError("Event loop is closed")
    handle: LoopTimerHandle[Any]
    if given_int:
        handle = IntWhenHandle(when, callback, args, engine, context)
    else:
        handle = LoopTimerHandle(when, callback, args, engine, context)
    if source_traceback is not None:
        handle._source_traceback = source_traceback
    if due:
        base_call_soon = calls.base_call_soon
        assert base_call_soon is not None
        base_call_soon(handle._run)
        return handle
    if engine.closed:
        raise engine._closed_error()  # only after an internal error (break_)
    at = engine.wheel.insert(handle, when)
    if engine.closed:
        _closed_while_filing(engine, handle)
    engine.reserve_slot()
    try:
        engine.arm_if_earlier(at)
    except BaseException:
        # The base loop refused the wake-up: the call fails and changes nothing. The
        # driver kept its previous arming, and so did the engine (arm_if_earlier);
        # the handle leaves the wheel uncounted (issue 28, finding 4: the engine
        # believed in an arming that failed, and no later timer fired).
        engine.wheel.remove(handle)
        engine.release_slot()
        raise
    return handle


def _closed_while_filing(engine: Engine, handle: LoopTimerHandle[Any]) -> NoReturn:
    """*Closed while filing*, for ``file_loop``: an allocation of the insert (a level,
    the heap's tuple) ran the garbage collector, and user code closed the loop
    (docs/design.md, "Re-entrancy"). The call fails as on a closed loop, and the
    counters stay exact: nothing is pending on a closed timer."""
    engine.take_back(handle, True)  # a new handle, as every call_at's
    loop = engine.loop
    if loop is not None and loop.is_closed():
        raise RuntimeError("Event loop is closed")
    raise engine._closed_error()


def _cancelled(engine: Engine, bucket: Bucket) -> None:
    """A loop handle's ``cancel()`` unlinked it from ``bucket``."""
    engine.count_cancelled()
    if bucket._first is None and bucket.time == engine.wake_at:
        engine.request_recheck()  # as Engine.after_cancel
    if engine.notify_cancel:
        engine.pending_fell()


def _foreign(engine: Engine) -> bool:
    """True in a thread other than the one running the drop-in loop (debug mode asks,
    for ``LoopTimerHandle.cancel``; the thread is the one ``run_forever`` bound,
    ``TimerLifecycle._bind_thread``)."""
    loop = engine.loop
    return loop is not None and loop.is_running() and get_ident() != engine.affinity.thread


def _unlink_soon(engine: Engine, handle: LoopTimerHandle[Any]) -> None:
    """A loop handle cancelled from another thread: take it off the wheel in the
    loop's thread (``_unlink_cancelled``). A loop closed meanwhile has dropped its
    timers: nothing is left to do, and cancel() does not raise."""
    loop = engine.loop
    if loop is None:
        return
    try:
        loop.call_soon_threadsafe(_unlink_cancelled, engine, handle)
    except RuntimeError:
        pass  # closed: the close dropped the handle with the rest


def _unlink_cancelled(engine: Engine, handle: LoopTimerHandle[Any]) -> None:
    """In the loop's thread: the rest of a cross-thread ``cancel()``, unless a pass met
    the handle first (it counted it cancelled then: ``run_in_pass``)."""
    bucket = handle._bucket
    if bucket is not None:
        bucket.remove(handle)
        _cancelled(engine, bucket)


def run_in_pass(engine: Engine, entry: WheelEntry, now: float) -> float:
    """The pass (``_pass.run_due``) popped a loop handle: count it and run it,
    measured in debug mode as the base loop measures its callbacks. Returns its
    lateness (``stats().lateness_max`` counts it as a timer's), ``-inf`` when it did
    not run. Counted before it runs: it may raise (SystemExit, KeyboardInterrupt)."""
    handle = cast("LoopTimerHandle[Any]", entry)
    if handle._args is None:
        # Cancelled from another thread, its unlink still queued
        # (LoopTimerHandle.cancel): counted as the cancel it is.
        engine.count_cancelled()
        return -_INF
    engine.count_ran()
    lateness = now - handle._deadline
    debug_run = engine.loop_debug_run
    ran = debug_run(handle) if engine.loop_debug and debug_run is not None else handle._run()
    if not ran:
        # Cancelled from another thread between the check above and the run (debug
        # mode's cancel marks it at once, and the loop's measuring frame lets that
        # thread in): its callback was not called, so it is the cancel it is.
        engine.count_fired_as_cancelled()
        return -_INF
    return lateness


def drop_all(engine: Engine) -> list[WheelEntry]:
    """``loop.close()`` (through the engine's close, the engine already closed): the
    loop's pending handles are dropped (not cancelled), as the base loop drops its
    heap; counted cancelled here. Returned: the caller releases them once the close
    is complete (their finalizers are user code)."""
    # Walking the wheel allocates (a gc.callbacks hook may cancel a handle already
    # collected here): count only what is still linked when it is taken.
    dropped: list[WheelEntry] = [e for e in engine.wheel if isinstance(e, LoopTimerHandle)]
    count = 0
    for entry in dropped:
        bucket = entry._bucket
        if bucket is not None:
            bucket.remove(entry)
            count += 1
    engine.count_cancelled(count)
    return dropped
