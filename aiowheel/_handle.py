"""Timer handles: what ``schedule`` returns.

A handle is also the wheel's entry (Kafka's ``TimerTaskEntry``): it is the node of
its bucket's linked list, so cancelling it is an unlink. A handle has nine slots
(four of ``WheelEntry``: deadline, bucket and the two links) and no ``__dict__``
(docs/benchmarks.md, "What you gain, and where", gives the bytes per pending timer).

A handle talks to its timer through ``HandleOwner`` (below): the methods a handle
calls and the three attributes it reads, which ``TimerLifecycle`` (``_lifecycle.py``,
``Timer``'s base class) implements (docs/design.md, "Module map", says who owns
what). ``TimerHandle.reset`` keeps one path inline, the lazy touch (a deadline moved
later than its bucket comes due only records it): it reads the clock, the thread and
the open ``Affinity`` itself, an inline copy of ``TimerLifecycle._is_owner_loop``,
instead of paying for the full ``_reset``. The timer and its engine own every counter
and decide every change of state; the handle owns its two state slots.

State lives in two slots. ``_bucket`` is the container holding the handle while it is
pending, ``None`` otherwise: the container links and unlinks it (``Bucket``,
``RunQueue``). ``_result`` says the rest, and changes only through the transition
methods at the end of ``TimerHandle`` (two hot paths keep tagged inline copies: the
pass, ``_pass.run_due``, and ``TimerLifecycle._cancel``). The states, the transition
that enters each, and the modules that call it (tests/test_module_map.py checks the
writes):

=========  =================================  ============================  ==============
state      ``_bucket``                        ``_result``                   entered by
=========  =================================  ============================  ==============
pending    a wheel bucket, or a bucket the    ``_PENDING``                  ``__init__``,
           wheel handed back as expired                                     ``_become_
                                                                            pending``
                                                                            (``_state``,
                                                                            ``_periodic``)
queued     the pool's run queue (``RunQueue``) the awaitable to run         ``_become_
                                                                            queued``
                                                                            (``_dispatch``)
running    ``None``                           ``_PENDING`` (a plain         ``_become_
                                              callback, in the pass) or     running``
                                              ``_RUNNING`` (an async one,   (``_dispatch``)
                                              on a worker)
done       ``None``                           the return value, or a        ``_settle``,
                                              ``_Failure``                  ``_settle_if_
                                                                            running``,
                                                                            ``_settle_
                                                                            unless_
                                                                            rearmed``
                                                                            (``_engine``,
                                                                            ``_state``,
                                                                            ``_shutdown``;
                                                                            a copy in
                                                                            ``_engine``)
cancelled  ``None``                           ``_CANCELLED``                ``_become_
                                                                            cancelled``
                                                                            (``_state``,
                                                                            ``_shutdown``;
                                                                            a copy in
                                                                            ``_lifecycle``)
=========  =================================  ============================  ==============

*Pending* covers queued (``pending()`` is true for both: they count in ``len(timer)``).
*Running* is a callback that has started and not finished (``WorkerPool.running``
counts those on workers); *closed* is said of a timer only (``Timer.closed``,
``Engine.closed``, ``WorkerPool`` closing with it). A handle re-armed while it runs is
pending again; its run settles it only if nothing re-armed it meanwhile.
"""

from __future__ import annotations

from _thread import get_ident
from collections.abc import Callable
from contextvars import Context, copy_context
from typing import TYPE_CHECKING, Any, Final, Generic, NoReturn, SupportsFloat, TypeVar, cast

from ._checks import not_copyable, seconds
from ._wheel import CORE_COMPILED, DUE_LEVEL, GC_START, UNSCHEDULED, WheelEntry

if TYPE_CHECKING:
    from ._affinity import Affinity
    from ._tracing import Tracer

__all__ = [
    "HandleOwner",
    "TimerHandle",
    "TracedHandle",
    "forget_snapshot",
    "same_variables",
    "snapshot_context",
    "to_seconds",
]

T = TypeVar("T")
_get_ident: Final = get_ident
_INF: Final = float("inf")
_ONE_TIMER: Final = "a handle is one timer, in its timer's wheel; share the handle itself"
_copy_context: Final = copy_context


def _never(snapshot: Context, /) -> bool:
    """Stands for aiowheel._ctxutil's holds_current where it is not built (a pure
    install): the current context is then copied to be compared (snapshot_context)."""
    return False


try:
    from ._ctxutil import holds_current as _c_holds_current
    from ._ctxutil import layout_known as _layout_known
except ImportError:  # a pure install
    _c_holds_current = _never
    _FOUND = False
else:
    _FOUND = _layout_known()  # False: CPython's context object was not recognised
# Final: compiled, a C static, called without a module-dict lookup.
_holds_current: Final = _c_holds_current
#: Whether snapshot_context asks aiowheel._ctxutil before it copies: on the compiled
#: core, which is built with it (the pure core compares copies: CORE_COMPILED).
ASKS_WITHOUT_COPY: Final = _FOUND and CORE_COMPILED
# The last snapshot taken (snapshot_context), shared by the next handles scheduled in
# an equal context. One per process, whatever the thread: a race between two threads
# only costs a share that is not made. It keeps one context alive that its handles may
# no longer hold, so it is let go (forget_snapshot) at every pass of any timer and when
# a timer or a drop-in loop closes: a finished request's variables are not held by it
# past the next pass (docs/usage.md, "Context variables").
_last_context: Final[list[Any]] = [None]
_MISSING_VALUE: Final = object()
# Contexts with more variables than this are not shared: asking whether two hold the
# same objects walks them all, on every schedule, and a copy per handle (the old
# rule) is the cheaper of the two there.
_SHARE_LIMIT: Final = 16


def snapshot_context() -> Context:
    """A copy of the current context for a new handle, shared with the handles
    scheduled before it while the context held the same variables.

    A server's timeouts are scheduled by tasks whose variables rarely change, and a
    ``Context`` per pending timer was 64 of a handle's 200 bytes and one more object
    for every full collection to walk (docs/bench-workloads.md, ``collector``).

    *The same variables* means the same objects, not equal ones (``Context ==
    Context`` compares values with ``==``: ``1 == True``, and two equal dicts are two
    request states): a callback must get the very objects its scheduler had.

    The invariant that makes the share invisible: **a shared snapshot is never run
    in.** Whoever runs a callback runs it in a copy of the snapshot
    (``_pass.run_one``, ``LoopTimerHandle._run``), so what a callback sets stays its
    own, as with a copy per handle. Only a periodic timer's handle has a context of
    its own, run in directly (``PeriodicHandle``: a run sees what the last one set)."""
    last = _last_context[0]
    # The common case, asked without a copy (aiowheel/_ctxutil.c): the current context
    # holds the very mapping of variables the snapshot holds.
    if last is not None and ASKS_WITHOUT_COPY and _holds_current(last):
        return cast("Context", last)
    context = _copy_context()
    if last is not None and same_variables(context, last):
        return cast("Context", last)
    _last_context[0] = context
    return context


def forget_snapshot() -> None:
    """Let go of the last snapshot: the next handle takes a new one."""
    _last_context[0] = None


def same_variables(context: Context, other: Context) -> bool:
    """Whether two contexts hold the same variables bound to the same objects (at
    most _SHARE_LIMIT of them)."""
    n = len(context)
    if n != len(other) or n > _SHARE_LIMIT:
        return False
    if n:
        get = other.get
        for var, value in context.items():
            if get(var, _MISSING_VALUE) is not value:
                return False
    return True


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_PENDING: Final[Any] = _Sentinel("PENDING")
_RUNNING: Final[Any] = _Sentinel("RUNNING")
_CANCELLED: Final[Any] = _Sentinel("CANCELLED")


# The types the rule (_checks.seconds) has accepted once: numbers.Real and Decimal
# subclasses other than bool. Membership is for ever (an ABC cannot unregister a type),
# so the next value of such a type is converted with float() alone. Bounded, in case a
# program makes number types on the fly.
_REAL_TYPES: Final[set[type]] = set()
_REAL_TYPES_MAX: Final = 256


def to_seconds(value: object, what: str = "delay") -> float:
    """``_checks.seconds(value, what)``, without its ``isinstance`` tests for the types
    it already accepted: one fast conversion for every real number a user passes.

    A float or an int costs a type test and ``float()``; a ``Fraction``, a NumPy float,
    a float subclass or a ``Decimal`` a set look-up more, from its second value on.
    Whatever is refused, and whatever converts to NaN, an infinity or nothing at all,
    goes to ``seconds``, which raises the rule's exception: the rule stays in one
    place (docs/usage.md, "Times and bad input")."""
    tp = type(value)
    if tp is int:
        try:
            return float(cast("int", value))  # exact up to 2**53, always finite
        except OverflowError:
            return seconds(value, what)  # raises: past the largest float
    if tp is float or tp in _REAL_TYPES:
        try:
            result = float(value)  # type: ignore[arg-type]
        except (ValueError, OverflowError, ArithmeticError, TypeError):
            return seconds(value, what)  # raises
        if result - result == 0.0:  # finite
            return result
        return seconds(value, what)  # raises: NaN or an infinity
    result = seconds(value, what)  # raises, or the type is a real number
    if len(_REAL_TYPES) < _REAL_TYPES_MAX:
        _REAL_TYPES.add(tp)
    return result


def release(obj: object) -> None:
    """Drop a reference the caller kept alive on purpose, here and nowhere earlier.

    The re-entrancy rule (docs/design.md, "Re-entrancy") holds an old result or
    awaitable in a local until the change it belonged to is complete, because its
    finalizer is user code. Compiled, a local dies at its *last use*, not where it is
    rebound or deleted: ``old = None`` or ``del old`` after an unread ``old`` would let
    mypyc free the object at the read, right in the middle of the change. Passing it
    here is that last use, on both cores."""


class _Failure:
    """The exception a callback raised, kept for ``wait()``.

    The traceback is kept apart and restored on each re-raise (as asyncio's futures
    do), so waiting twice does not grow it.
    """

    __slots__ = ("exc", "tb")

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.tb = exc.__traceback__


def without_frame(exc: BaseException) -> BaseException:
    """Drop the first traceback entry, the frame that called the callback.

    That frame refers to the handle: a stored exception would make a cycle handle ->
    result -> traceback -> frame -> handle, which only the garbage collector breaks.
    The callback's own frames are kept."""
    tb = exc.__traceback__
    if tb is not None:
        exc.__traceback__ = tb.tb_next
    return exc


class HandleOwner:
    """The timer as its handles see it: what a handle reads and calls on its timer.

    ``TimerLifecycle`` (``_lifecycle.py``, ``Timer``'s base class) is the one
    subclass, and implements every method. The
    handle's rooms (this module, ``_periodic.py``) know only this class, so they sit
    below the timer in the import map, with no import back up (docs/design.md,
    "Module map"); compiled, a call through it is a native call (a vtable slot), as a
    call on ``Timer`` was. A ``Protocol`` would not do: mypyc calls its methods by
    name, a dictionary look-up per call on the hot paths (``cancel``, ``reset``).
    """

    # Set by the timer once started (aiowheel/_lifecycle.py, TimerLifecycle._started):
    # the loop's clock and thread, and the owner check's Affinity exactly while the
    # timer is open (None before and after): the handle's inline lazy reset reads them.
    _now: Callable[[], float]
    _loop_thread: int
    _open_affinity: Affinity | None

    def _cancel(self, handle: TimerHandle[Any]) -> bool:
        """``handle.cancel()`` of a pending handle (owner-checked)."""
        raise NotImplementedError

    def _reset(self, handle: TimerHandle[Any], delay: SupportsFloat) -> None:
        """``handle.reset(delay)`` past the handle's inline lazy path."""
        raise NotImplementedError

    def _reset_at(self, handle: TimerHandle[Any], deadline: SupportsFloat) -> None:
        """``handle.reset_at(deadline)``."""
        raise NotImplementedError

    async def _wait(self, handle: TimerHandle[Any]) -> Any:
        """What ``handle.wait()`` of an unsettled handle gets once it settles."""
        raise NotImplementedError

    def _cancelled_error(self, handle: TimerHandle[Any]) -> BaseException:
        """What ``wait()`` of a cancelled handle raises."""
        raise NotImplementedError

    def _is_owner_loop(self) -> bool:
        """Open, and called on the owner's loop (``Affinity.here``)."""
        raise NotImplementedError

    def _require_owner_loop(self) -> None:
        """For a room outside the timer: raise unless called on the timer's loop
        (``Affinity.here``); nothing while the timer is not open."""
        raise NotImplementedError

    def _require_owner_loop_running(self) -> None:
        """``_require_owner_loop``, the running loop too (``Affinity.check``): for the
        calls that wait."""
        raise NotImplementedError


class TimerHandle(WheelEntry, Generic[T]):
    """A scheduled callback. Returned by ``Timer.schedule`` and friends."""

    # __weakref__: users keep handles in WeakValueDictionaries (the compiled core has
    # the slot through Generic; setup.py makes it safe there).
    __slots__ = ("__weakref__", "_args", "_callback", "_context", "_result", "_timer")

    def __init__(
        self, timer: HandleOwner, callback: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self._gc = GC_START  # the collector's ledger (aiowheel/_wheel.py)
        self._timer = timer
        self._callback = callback
        self._args = args
        # The callback runs in a copy of the scheduler's context, as loop.call_later
        # does (docs/usage.md, "Context variables"): captured here, once per handle
        # (a re-arm keeps it; a periodic timer's runs all use the one of every()),
        # and shared with the handles scheduled in an equal one (snapshot_context).
        self._context = snapshot_context()
        self._result = _PENDING
        self._bucket = None
        self._prev = self._next = None

    def _run_context(self) -> Context:
        """The context a firing of this handle runs its callback in: a copy of the one
        captured at schedule, which may be a snapshot shared with other handles and is
        never run in itself (``snapshot_context``). So each run starts from what the
        scheduler saw, and what a callback sets stays its own, as with
        ``loop.call_later``. (A periodic handle runs in its own context directly:
        ``PeriodicHandle._run_context``.)"""
        context: Context = self._context.copy()
        return context

    # -- state ----------------------------------------------------------------------

    @property
    def deadline(self) -> float:
        """When the callback is due, on the timer's clock (``time() + delay``)."""
        return self._deadline

    @property
    def callback(self) -> Callable[..., Any]:
        """The callable this handle runs."""
        return self._callback

    def pending(self) -> bool:
        """True from scheduling until the callback starts (also while an expired async
        callback waits for a worker)."""
        return self._bucket is not None

    def cancelled(self) -> bool:
        """True when the timer was cancelled before its callback started. (An async
        callback that ``aclose()`` cancels while it runs stays ``fired()``; its
        ``wait()`` raises ``TimerCancelled``.)"""
        return self._result is _CANCELLED

    def fired(self) -> bool:
        """True once the callback has started (also when it raised)."""
        return self._bucket is None and self._result is not _CANCELLED

    def done(self) -> bool:
        """True when there is nothing left to wait for: finished or cancelled."""
        return (
            self._bucket is None and self._result is not _PENDING and self._result is not _RUNNING
        )

    def __repr__(self) -> str:
        state = (
            "pending"
            if self._bucket is not None
            else "cancelled"
            if self._result is _CANCELLED
            else "running"
            if self._result is _RUNNING or self._result is _PENDING
            else "done"
        )
        callback = self.callback
        name = getattr(callback, "__qualname__", None) or type(callback).__name__
        deadline = self._deadline
        when = f"{deadline:.6f}" if abs(deadline) < 1e15 else f"{deadline:.6g}"
        return f"<{type(self).__name__} {state} deadline={when} callback={name}>"

    # -- a handle is a timer, not a value --------------------------------------------
    # A copy would carry the original's links and bucket without being in the list:
    # cancelling the copy would unlink the original, which then never fires and stays
    # pending() for ever (the pure core did exactly that). A handle is an identity, so
    # copying it and pickling it raise instead.

    def __copy__(self) -> NoReturn:
        not_copyable(self, _ONE_TIMER)

    def __deepcopy__(self, memo: object) -> NoReturn:
        not_copyable(self, _ONE_TIMER)

    def __reduce__(self) -> NoReturn:
        not_copyable(self, _ONE_TIMER)

    # -- control ----------------------------------------------------------------------

    def cancel(self) -> bool:
        """Stop the timer. True exactly when it was pending: its callback will never
        run. The timer drops its reference to the handle at once (eager O(1) removal:
        no tombstone is left behind)."""
        if self._bucket is None:
            # Nothing to stop; a call from another thread or loop still raises, as on
            # a pending handle (docs/usage.md, "Threads": never accepted silently).
            self._timer._require_owner_loop()
            return False
        return self._timer._cancel(self)

    def reset(self, delay: SupportsFloat) -> None:
        """Re-arm to ``timer.time() + delay``: pending, fired or cancelled alike.

        Moving a pending timer later only records the new deadline (O(1), no bucket
        work); the wheel re-files it when its old bucket comes due. A bad ``delay``
        raises as ``schedule`` does and leaves the handle as it was.
        """
        bucket = self._bucket
        if bucket is not None and bucket.tick != UNSCHEDULED:
            # The idle-timeout touch, inline (Wheel.extend's lazy case): a pending
            # timer moved later than its bucket comes due only records the deadline;
            # the bucket re-files it when it comes due. Any real number takes this
            # path (to_seconds: an int costs what a float does); everything else, a
            # call from a foreign thread included, goes to the timer. A bad delay
            # raises here as it would there (a pending handle's timer is open).
            # For a float (the common touch) the owner's thread is asked first, since the
            # clock may be readable only there (trio's), and the rest of the owner check
            # after the lazy test (a re-arm that is not lazy makes it in the timer); for
            # anything else the whole check comes before to_seconds (a foreign caller
            # learns that first, as from the timer).
            timer = self._timer
            if type(delay) is float and _get_ident() == timer._loop_thread:
                deadline = timer._now() + delay
                if _INF > deadline >= bucket.time:
                    affinity = timer._open_affinity
                    # inline copy of the owner check (TimerLifecycle._is_owner_loop)
                    if affinity is not None and not affinity.elsewhere():
                        self._deadline = deadline
                        return
            elif timer._is_owner_loop():  # the owner check (TimerLifecycle._is_owner_loop)
                deadline = timer._now() + to_seconds(delay)
                if _INF > deadline >= bucket.time:
                    self._deadline = deadline
                    return
        self._timer._reset(self, delay)

    def reset_at(self, deadline: SupportsFloat) -> None:
        """Re-arm to the absolute ``deadline`` (same rules as ``reset``)."""
        self._timer._reset_at(self, deadline)

    async def wait(self) -> T:
        """The callback's return value once it (awaited, for async callbacks) has
        finished; re-raises its exception; ``TimerCancelled`` if cancelled first."""
        if self._bucket is not None or self._result is _RUNNING or self._result is _PENDING:
            outcome = await self._timer._wait(self)
        else:
            outcome = self._result
        if outcome is _CANCELLED:
            raise self._timer._cancelled_error(self)
        if type(outcome) is _Failure:
            exc, tb = outcome.exc, outcome.tb
            try:
                raise exc.with_traceback(tb)
            finally:
                # Raising added this frame to the exception's traceback, and the
                # handle keeps the exception: handle -> result -> exception -> frame ->
                # handle would be a cycle that only the garbage collector frees. So the
                # exception leaves with its stored traceback (callers add theirs).
                exc.__traceback__ = tb
        return outcome  # type: ignore[no-any-return]

    # -- the transitions of ``_result`` (the state table above): its one writer ------
    # Each is called once the transition is decided, by the room named in the table.
    # The ones that replace a value return it: the caller releases it (or closes an
    # awaitable) only once its change is complete, because dropping it may run a
    # finalizer (docs/design.md, "Re-entrancy"). Two hot paths keep inline copies,
    # tagged with the method they copy: the pass (``_pass.run_due``) and
    # ``TimerLifecycle._cancel``.

    def _become_pending(self) -> Any:
        """Fired or cancelled (or queued, re-armed) -> pending; returns the old value."""
        old = self._result
        self._result = _PENDING
        return old

    def _become_cancelled(self) -> Any:
        """Pending or queued -> cancelled; returns the old value (an awaitable, if it
        was queued, which the caller closes)."""
        old = self._result
        self._result = _CANCELLED
        return old

    def _become_queued(self, awaitable: Any) -> None:
        """Its callback returned an awaitable: it waits in the run queue for a worker."""
        self._result = awaitable

    def _become_running(self) -> Any:
        """Queued -> running on a worker; returns the awaitable to run."""
        awaitable = self._result
        self._result = _RUNNING
        return awaitable

    def _settle(self, outcome: Any) -> None:
        """-> done: the callback's return value, or its ``_Failure``."""
        self._result = outcome

    def _settle_unless_rearmed(self, outcome: Any) -> None:
        """The pass's -> done: ``_settle``, unless its callback (or ``on_error``)
        re-armed it, pending again."""
        if self._bucket is None:
            self._result = outcome

    def _settle_if_running(self, outcome: Any) -> bool:
        """Running on a worker -> done with ``outcome``, unless a re-arm or the close
        settled it meanwhile; True when it did."""
        if self._result is _RUNNING:
            self._result = outcome
            return True
        return False

    def _check_held(self, queue: object) -> None:
        """The self-check of a handle its timer holds (aiowheel/_selfcheck.py): filed
        in a wheel bucket and pending (``queue`` None), or waiting in the run queue
        ``queue`` with the awaitable its callback returned."""
        if queue is None:
            assert self._bucket is not None, self
            assert self._result is _PENDING, self
        else:
            assert self._bucket is queue, self
            assert hasattr(type(self._result), "__await__"), self


class TracedHandle(TimerHandle[T]):
    """A handle that carries what a trace row needs.

    A timer with a trace recorder creates these for the timers its trace keeps (every
    one, or one in ``every`` when the recorder samples: ``_tracing.Tracer.pick``), and
    plain ``TimerHandle`` for the others, which pay nothing for tracing. Every
    ``PeriodicHandle`` is one of these, traced or not (``_tracer`` None when not).
    """

    __slots__ = ("_id", "_label", "_level", "_scheduled_at", "_tracer")

    _id: int
    _label: str | None
    _level: int
    _scheduled_at: float
    # The trace that records this handle's rows; None: not traced.
    _tracer: Tracer | None

    def __init__(
        self, timer: HandleOwner, callback: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        super().__init__(timer, callback, args)
        self._tracer = None
        self._level = -1

    @property
    def label(self) -> str | None:
        """The label given at schedule time, written to the trace."""
        return self._label

    def cancel(self) -> bool:
        """Stop the timer (``TimerHandle.cancel``); a traced timer's row says when."""
        if self._bucket is None:
            return False
        if not self._timer._cancel(self):
            return False  # pragma: no cover - a pending handle's cancel succeeds
        self._trace_cancelled()
        return True

    # -- its trace rows (aiowheel/_tracing.py): the fields they read, and the rows ----

    def _stamp(self, tracer: Tracer | None, timer_id: int, label: str | None, now: float) -> None:
        """A new timer's trace fields but its level (filing sets that): the trace that
        keeps it (None: not traced), its id there, its label, when it was scheduled."""
        self._tracer = tracer
        self._id = timer_id
        self._label = label
        self._scheduled_at = now

    def _restamp(self, now: float) -> None:
        """Armed again at ``now`` (a re-arm of a fired or cancelled handle, a period)."""
        self._scheduled_at = now

    def _note_level(self) -> None:
        """Just filed (or moved): its rows' level, the wheel it is in (-1: due at once)."""
        bucket = self._bucket
        self._level = bucket.level if bucket is not None else DUE_LEVEL

    def _trace_row(self) -> tuple[int, str | None, float, float, int]:
        """What a row says of this firing: id, label, scheduled_at, deadline, level,
        for the pass to read before the callback runs (it may re-arm its own handle)."""
        return (self._id, self._label, self._scheduled_at, self._deadline, self._level)

    def _trace_fired(self, now: float) -> None:
        """A traced timer fired at ``now`` (an async callback that a worker starts)."""
        tracer = self._tracer
        if tracer is not None:
            tracer.fired(
                self._id, self._label, self._scheduled_at, self._deadline, self._level, now
            )

    def _trace_cancelled(self, now: object = None) -> None:
        """A traced timer was cancelled at ``now`` (a float; None: the trace's clock,
        read only when the trace still records)."""
        tracer = self._tracer
        if tracer is not None and tracer.active:
            tracer.cancelled_at(
                self._id,
                self._label,
                self._scheduled_at,
                self._deadline,
                self._level,
                tracer.clock() if now is None else now,
            )
