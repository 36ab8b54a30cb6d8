"""What every idle-timeout integration shares: validation, the error, the shared timer.

The shared timer. Every connection of a process should be watched by one timer (one
driver, one wake-up for every connection whose deadline falls in the same tick), so
the integrations use one ``Timer`` per event loop unless given their own. It comes
from one of two owners:

* explicit: ``async with shared_timer():`` (a server's lifespan; ``IdleTimeoutMiddleware``
  does this by itself when the server runs the ASGI lifespan protocol) registers a timer
  for the block;
* the loop's own: on aiowheel's drop-in event loop (``aiowheel.new_event_loop``) the
  loop's timer, ``loop.timer``, which lives and closes with the loop (no second timer);
* lazy: the first connection that finds no timer starts one in a background task with
  a fresh context (asyncio: ``loop.create_task``; trio: a system task). That task owns
  the timer's task group and lives until the event loop shuts down, when asyncio and
  trio cancel leftover tasks; cancelling it closes the timer.

An explicit block wins over the loop's own timer, which wins over a lazy one.

The registry maps the loop (asyncio) or the trio token to its slot through weak keys;
the owner removes its slot when it ends, so a closed loop leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import socket
import struct
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Protocol

import anyio

from .. import Timer, TimerClosed, TimerHandle, loop_timer
from .._driver import loop_clock

__all__ = [
    "DEFAULT_TICK",
    "SCOPE_KEY",
    "IdleTimeoutError",
    "check_timeout",
    "get_shared_timer",
    "schedule_idle",
    "set_idle_timeout",
    "shared_timer",
]

logger = logging.getLogger("aiowheel.middleware")

_INF = math.inf

#: Tick of a shared timer the middleware creates: idle timeouts are seconds long, so
#: 10 ms resolution costs nothing in accuracy and lets the connections whose deadlines
#: fall in the same 10 ms share one wake-up.
DEFAULT_TICK: Final = 0.01

#: The ASGI scope key under which ``IdleTimeoutMiddleware`` puts a request's control
#: object (namespaced like Starlette's own ``starlette.*`` keys).
SCOPE_KEY: Final = "aiowheel.idle_timeout"


class IdleTimeoutError(TimeoutError):
    """A connection, request or stream was idle for longer than its idle timeout."""


class ConnectionAbort(Protocol):
    """What a connection-level integration (``uvicorn_protocol``) offers the requests
    it serves: dropping the connection at once."""

    async def abort_connection(self) -> None:
        """Abort the transport and return once the server has seen the connection
        lost (so that it counts the response as abandoned, not as the application's
        error)."""


#: The ASGI scope key under which a connection-level integration (``uvicorn_protocol``)
#: puts the connection serving the request (a ``ConnectionAbort``). ASGI has no way to
#: abort a response; with this, ``IdleTimeoutMiddleware`` drops the connection itself,
#: within its timeout and without the server logging an error, instead of raising. A
#: scope key, not a context variable: an application that calls another ASGI
#: application in-process (a new scope) must not abort its own client's connection.
CONNECTION_KEY: Final = "aiowheel.connection"


def scope_connection(scope: Mapping[str, Any]) -> ConnectionAbort | None:
    connection = scope.get(CONNECTION_KEY)
    return connection if callable(getattr(connection, "abort_connection", None)) else None


#: ``SO_LINGER`` on, with a zero linger time: closing the socket sends a reset and
#: drops whatever is still queued to send.
_LINGER_RESET: Final = struct.pack("ii", 1, 0)


def abort_with_reset(transport: Any) -> None:
    """Abort ``transport`` with a TCP reset: a connection a timeout gave up on.

    A plain ``abort()`` closes the socket with its unsent output still queued in the
    kernel, which then sends the FIN behind it: a peer that stopped reading keeps
    megabytes of the server's memory (FIN_WAIT1) until its own timeout. ``SO_LINGER``
    (on, 0 s) first makes the close send a reset and free the buffers at once (nginx's
    ``reset_timedout_connection``). A transport without a socket (a pipe, a test
    double, a socket already closed) is only aborted.
    """
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except (OSError, AttributeError, ValueError):
            pass  # not a TCP socket, or already closed: the abort is all we can do
    transport.abort()


def check_timeout(value: object, name: str = "timeout", unit: str = "seconds") -> float:
    """``value`` as a float when it is a positive finite number (of seconds, or of the
    ``unit`` named), else the documented ``TypeError``/``ValueError`` (raised where the
    configuration is made)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of {unit}, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number of {unit}, got {value!r}")
    return float(value)


def check_timer(timer: object) -> Timer | None:
    if timer is not None and not isinstance(timer, Timer):
        raise TypeError(f"timer must be an aiowheel.Timer or None, got {timer!r}")
    return timer


def schedule_idle(
    timer: Timer, deadline: float, callback: Callable[[], None]
) -> TimerHandle[Any] | None:
    """``timer.schedule_at_nowait(deadline, callback)``, or ``None`` when the timer is
    closed (a server shutting down): the connection is then simply not timed. A timer
    that was never started is a configuration error and raises ``TimerClosed``."""
    try:
        return timer.schedule_at_nowait(deadline, callback)
    except TimerClosed:
        if timer.closed:
            return None
        raise


class IdleControl:
    """One request's or one connection's idle timeout, and what ``set_idle_timeout``
    talks to: the one "store the deadline, check on fire" pattern every integration
    uses (``_asgi.py``, ``_uvicorn.py``, ``_streams.py``).

    Activity is a store, not a re-arm (Netty's ``IdleStateHandler``): ``touch`` writes
    the new deadline, now + timeout, in ``_deadline`` and leaves the wheel alone. A
    timer handle stays filed at ``_filed``; when it fires, ``_fired`` hands the due
    deadlines to ``_on_due`` (which expires what is due) and re-files the handle at
    ``_due()`` for what is left. A connection that reads all the time costs one
    wake-up per timeout, not one wheel operation per read; the timeout is exactly as
    before, because the stored deadline is the one a ``reset`` would have filed.

    Who files: a control is timed by a *holder*, ``_holder``: itself (its own
    handle), or a connection that already has a handle filed and looks at the
    control's deadlines too when it fires (``hold``: a request behind
    ``uvicorn_protocol`` arms nothing of its own).

    One clock: every deadline is on the event loop's clock, read through ``_clock``
    (``running_clock``: the clock the timer itself reads), whichever timer files.

    Invariants, kept by every method here:

    * ``_holder`` is set exactly while timing; ``None`` once timing stopped (opted
      out, finished, expired, or the timer closed), so ``touch`` is one attribute test
      when there is nothing to time. ``_handle`` is this control's own filed handle,
      set only while it times something (itself or a control it holds).
    * The filing is never later than the deadlines it covers: ``_filed <= _due()``
      while ``_handle`` is set (a touch only moves a deadline later; whatever moves one
      earlier, ``set_timeout``, a body deadline, a held request, calls ``_earlier``).
      So nothing is dropped early, and never late by more than the timer's tick:
      ``_on_due`` expires only what has reached its deadline.

    Subclasses say what expiry does (``_on_due``, which must stop timing what it
    expires) and when timing is over for good (``_timing``).
    """

    __slots__ = ("_clock", "_deadline", "_filed", "_handle", "_holder", "_timeout", "_timer")

    _timer: Timer | None
    _clock: Callable[[], float]
    _timeout: float | None
    _deadline: float
    _filed: float
    _handle: TimerHandle[Any] | None
    _holder: IdleControl | None

    def _init_idle(
        self, timer: Timer | None, clock: Callable[[], float], timeout: float | None
    ) -> None:
        """Set up the slots above; nothing is timed until ``arm`` (``timer`` may be
        ``None`` until a shared timer runs: ``_timer_ready``)."""
        self._timer = timer
        self._clock = clock
        self._timeout = timeout
        self._handle = None
        self._holder = None
        self._deadline = 0.0
        self._filed = 0.0

    def arm(self) -> None:
        """Start timing on this control's own handle, with a timeout (without one there
        is nothing to time)."""
        timeout = self._timeout
        if timeout is not None:
            self._deadline = self._clock() + timeout
            self._holder = self
            self._file()

    def _file(self) -> None:
        """File this control's own handle at ``_due()`` (or re-file it there)."""
        timer = self._timer
        if timer is None:  # the shared timer is starting: _timer_ready files
            return
        due = self._filed = self._due()
        handle = self._handle
        if handle is None:
            handle = self._handle = schedule_idle(timer, due, self._fired)
            if handle is None:  # the timer closed (a server shutting down): not timed
                self._closed()
        else:
            try:
                handle.reset_at(due)
            except TimerClosed:  # the timer closed under us (a server shutting down)
                self._handle = None
                self._closed()

    def _closed(self) -> None:
        """The timer closed under this control: stop timing (and what it holds)."""
        self._holder = None

    def _earlier(self, deadline: float) -> None:
        """A deadline this control's handle covers moved to ``deadline``: re-file at
        once if that is before the filing (a later one is caught by ``_fired``)."""
        if deadline < self._filed and self._handle is not None:
            self._file()

    def _due(self) -> float:
        """The earliest deadline this control's handle must look at."""
        return self._deadline

    @property
    def deadline(self) -> float | None:
        """When the connection is dropped unless there is activity first (the event
        loop's clock); ``None`` when nothing is being timed."""
        return self._deadline if self._holder is not None else None

    def touch(self) -> None:
        if self._holder is not None:
            self._deadline = self._clock() + self._timeout  # type: ignore[operator]  # set while timing

    def hold(self, control: IdleControl) -> bool:
        """Time ``control``, which starts timing now (its idle deadline stored), on
        this control's handle instead of a handle of its own; False when this control
        cannot (the default)."""
        return False

    def release(self, control: IdleControl) -> None:
        """``control``, held by this one, stopped timing."""

    def response_complete(self) -> None:
        """The connection holding this control sent its response whole and let it go
        (it no longer holds it): timing is over for good. Only requests have
        responses: nothing to do here."""

    def rehome(self) -> None:
        """The control that held this one stopped timing (a connection lost or
        upgraded): time this one on a handle of its own from now on."""
        if self._holder is not None and self._holder is not self:
            self._holder = self
            self._file()

    def stop(self) -> None:
        holder = self._holder
        self._holder = None
        if holder is not None and holder is not self:
            holder.release(self)
        handle = self._handle
        if handle is not None:
            self._handle = None
            handle.cancel()

    def set_timeout(self, timeout: float | None) -> None:
        if not self._timing():
            return
        self._timeout = timeout
        if timeout is None:
            self.stop()
            return
        self._deadline = self._clock() + timeout
        holder = self._holder
        if holder is None:
            self._holder = self
            self._file()
        elif holder._handle is not None:
            # Re-file at once: a shorter timeout must not wait for the old filing (a
            # longer one would be caught by _fired, but this call is rare).
            holder._file()

    def _fired(self) -> None:
        """The handle came due: expire what is due, sleep on to what is left."""
        if self._handle is None:  # stopped meanwhile: nothing to do
            return
        self._on_due(self._clock())
        if self._holder is None and not self._holds():
            self._handle = None  # nothing left to time (it fired: nothing to cancel)
        elif self._handle is not None:
            self._file()  # the fired handle, re-filed for what is left

    def _holds(self) -> bool:
        """True while this control times another one (a connection holding a request
        after the connection itself stopped timing)."""
        return False

    def _timing(self) -> bool:
        """False once timing is over for good (expired, or finished)."""
        return True

    def _on_due(self, now: float) -> None:  # pragma: no cover - abstract
        """The handle fired at ``now``: expire what has reached its deadline (and stop
        timing it), leave the rest."""
        raise NotImplementedError


class RequestHolder(IdleControl):
    """An ``IdleControl`` whose filing also times one request it holds (``hold``), so
    that the request arms nothing of its own: a uvicorn connection
    (``_uvicorn._ConnectionWatch``), or a spare filing a middleware keeps for requests
    with no connection to hold them (``SpareHolder``).

    ``_due()`` is the earlier of its own deadline (while it times itself) and the held
    request's; ``_on_due`` expires the request when the request's is reached, then
    this control when its own is (``_on_own_due``).
    """

    __slots__ = ("_request",)

    _request: IdleControl | None

    def _due(self) -> float:
        deadline = self._deadline if self._holder is not None else _INF
        request = self._request
        if request is not None:
            held = request._due()
            if held < deadline:
                return held
        return deadline

    def hold(self, control: IdleControl) -> bool:
        # Called as ``control`` starts timing: its only deadline is its idle one.
        if self._request is not None or self._timer is None:
            return False  # holding one already, or no timer runs yet
        self._request = control
        if self._handle is None:
            self._file()
            if self._handle is None:  # the timer closed: nothing times it here
                self._request = None
                return False
        elif control._deadline < self._filed:  # _earlier, inline
            self._file()
        return True

    def release(self, control: IdleControl) -> None:
        if self._request is control:
            self._request = None

    def _holds(self) -> bool:
        return self._request is not None

    def _on_due(self, now: float) -> None:
        request = self._request
        if request is not None and now >= request._due():
            request._on_due(now)  # expires it: it stops timing, which releases it
        if self._holder is not None and now >= self._deadline:
            self._on_own_due()

    def _on_own_due(self) -> None:
        """This control's own deadline is reached."""


class SpareHolder(RequestHolder):
    """A filing a middleware keeps for the requests no connection holds (aiohttp's
    shape: a handle kept and a deadline stored, per connection; here per concurrent
    request). A request takes one from ``IdleHost.spare`` and gives it back when it
    stops timing; its handle stays filed meanwhile (only a store per request), and a
    spare that comes due holding nothing lets its handle go until it is taken again.
    """

    __slots__ = ("_spare",)

    def __init__(self, host: IdleHost) -> None:
        self._init_idle(host.timer, host.clock, None)
        self._request = None
        self._spare = host.spare

    def release(self, control: IdleControl) -> None:
        if self._request is control:
            self._request = None
            self._spare.append(self)


class IdleHost:
    """What the requests a middleware serves on one event loop share, found once:
    the loop (or trio token) it was found on, the timer, and the loop's clock."""

    __slots__ = ("clock", "key", "spare", "timer")

    def __init__(self, key: object, timer: Timer, clock: Callable[[], float]) -> None:
        self.key = key
        self.timer = timer
        self.clock = clock
        #: SpareHolders not holding a request (most recently given back last).
        self.spare: list[SpareHolder] = []

    def holder(self) -> SpareHolder:
        """A spare filing for a request (the most recently used: the likeliest to be
        filed still)."""
        spare = self.spare
        return spare.pop() if spare else SpareHolder(self)


def running_clock() -> Callable[[], float]:
    """The running event loop's clock: the one every idle deadline is on (the timer's
    own, ``Timer.time``, without its frame)."""
    try:
        return loop_clock(asyncio.get_running_loop())
    except RuntimeError:
        pass
    import trio

    return trio.current_time


def set_idle_timeout(target: object, timeout: float | None) -> bool:
    """Change the idle timeout of the request or connection ``target`` from now on.

    ``target`` is an ASGI scope (an endpoint passes its own, e.g. Starlette's
    ``request.scope``) or a reader/writer handed out by ``idle_timeout``. ``timeout`` is
    a positive number of seconds (re-arms to now + timeout, and later activity re-arms by
    that much) or ``None`` (no idle timeout for the rest of this request or connection:
    a long-poll endpoint). Returns ``False`` when no idle timeout watches ``target``
    (e.g. an endpoint tested without the middleware).
    """
    if timeout is not None:
        timeout = check_timeout(timeout)
    if isinstance(target, Mapping):
        control = target.get(SCOPE_KEY)
    else:
        control = getattr(target, "_aiowheel_idle", _MISSING)
        if control is _MISSING:
            raise TypeError(
                "set_idle_timeout() takes an ASGI scope or a stream from "
                f"aiowheel.middleware.idle_timeout, got {target!r}"
            )
    if not isinstance(control, IdleControl):
        return False
    control.set_timeout(timeout)
    return True


_MISSING: Any = object()

# -- the shared timer ---------------------------------------------------------------


class _Slot:
    """The shared timer of one event loop, or the promise of one while it starts.

    States: starting (``ready`` false, not ``dead``), running (``ready``, timer not
    closed), over (``dead`` or timer closed). Callbacks wait for the end of starting.
    """

    __slots__ = ("__weakref__", "callbacks", "dead", "owner", "ready", "timer")

    def __init__(self) -> None:
        self.timer: Timer | None = None
        self.ready = False
        self.dead = False
        self.callbacks: list[Callable[[Timer | None], None]] = []
        # Strong reference to the asyncio owner task (the loop keeps only weak ones).
        self.owner: asyncio.Task[None] | None = None

    def running(self) -> Timer | None:
        timer = self.timer
        if self.ready and timer is not None and not timer.closed:
            return timer
        return None

    def alive(self) -> bool:
        timer = self.timer
        return not self.dead and (timer is None or not timer.closed)

    def start(self, timer: Timer) -> None:
        self.timer = timer
        self.ready = True
        self.notify()

    def end(self) -> None:
        self.dead = True
        self.owner = None
        self.notify()  # anyone still waiting for a timer that never started gets None

    def notify(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        timer = self.running()
        for callback in callbacks:
            try:
                callback(timer)
            except Exception:  # pragma: no cover - our callbacks do not raise
                logger.exception("shared-timer callback %r raised", callback)


_slots: weakref.WeakKeyDictionary[object, _Slot] = weakref.WeakKeyDictionary()


def loop_key() -> tuple[object, bool]:
    """(registry key, is_trio) for the running event loop."""
    try:
        return asyncio.get_running_loop(), False
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio.lowlevel.current_trio_token(), True
        except RuntimeError:
            pass
    raise RuntimeError("aiowheel.middleware needs a running asyncio or trio event loop")


async def _own(key: object, slot: _Slot) -> None:
    # The lazy owner: holds the shared timer open until cancelled (loop shutdown).
    try:
        async with Timer(tick=DEFAULT_TICK) as timer:
            slot.start(timer)
            await anyio.sleep_forever()
    except Exception:  # pragma: no cover - Timer() with these arguments does not fail
        logger.exception("the shared aiowheel timer failed")
    finally:
        if _slots.get(key) is slot:
            del _slots[key]
        slot.end()


def _start_lazy(key: object, is_trio: bool) -> _Slot:
    slot = _Slot()
    _slots[key] = slot
    # A fresh context: the owner must not inherit the context variables of the
    # request that happened to start it (its worker tasks would see them too).
    context = contextvars.Context()
    if is_trio:
        import trio

        trio.lowlevel.spawn_system_task(
            _own, key, slot, name="aiowheel shared idle timer", context=context
        )
    else:
        assert isinstance(key, asyncio.AbstractEventLoop)
        slot.owner = key.create_task(
            _own(key, slot), name="aiowheel shared idle timer", context=context
        )
    return slot


def shared_timer_nowait(on_ready: Callable[[Timer | None], None]) -> Timer | None:
    """The loop's running shared timer, or ``None`` after arranging for one to start
    and for ``on_ready(timer)`` to be called once it runs (``None`` if it failed).
    For synchronous callers such as ``Protocol.connection_made``."""
    key, is_trio = loop_key()
    slot = _slots.get(key)
    if slot is not None:
        timer = slot.running()
        if timer is not None:
            return timer
        if not slot.alive():  # closed: its owner is on its way out
            slot = None
    if slot is None:
        timer = loop_timer()
        if timer is not None:
            return timer  # aiowheel's drop-in loop: its own timer
    if slot is None:
        slot = _start_lazy(key, is_trio)
    slot.callbacks.append(on_ready)
    return None


async def get_shared_timer() -> Timer:
    """The running event loop's shared timer, started on first use.

    It is the timer of the enclosing ``async with shared_timer():`` block if there is
    one, else a timer owned by a background task that lives until the event loop
    shuts down (asyncio: a task; trio: a system task).
    """
    key, is_trio = loop_key()
    slot = _slots.get(key)
    if slot is not None:
        timer = slot.running()
        if timer is not None:
            return timer
    own = loop_timer()
    if own is not None and (slot is None or not slot.alive()):
        return own  # aiowheel's drop-in loop: its own timer
    # Not running: wait for it (shared_timer_nowait registers the callback before it
    # returns, and we have not awaited since the check above, so it returns None).
    done: list[Timer | None] = []
    if is_trio:
        import trio

        event = trio.Event()

        def wake_trio(timer: Timer | None) -> None:
            done.append(timer)
            event.set()

        if shared_timer_nowait(wake_trio) is None:
            await event.wait()
    else:
        assert isinstance(key, asyncio.AbstractEventLoop)
        future: asyncio.Future[None] = key.create_future()

        def wake_asyncio(timer: Timer | None) -> None:
            done.append(timer)
            if not future.done():
                future.set_result(None)

        if shared_timer_nowait(wake_asyncio) is None:
            await future
    if not done or done[0] is None:
        raise RuntimeError("the shared aiowheel timer could not be started")
    return done[0]


@asynccontextmanager
async def shared_timer(timer: Timer | None = None) -> AsyncIterator[Timer]:
    """``async with shared_timer() as timer:`` makes ``timer`` the running event loop's
    shared idle timer for the block (e.g. a server's lifespan), so its lifetime is
    explicit rather than tied to the event loop.

    ``timer`` may be a new ``Timer`` (started here and closed at the end of the block)
    or a running one (only registered). Default: ``Timer(tick=DEFAULT_TICK)``, or on
    aiowheel's drop-in event loop that loop's own timer, ``loop.timer``. Raises
    ``RuntimeError`` if this event loop already has a running shared timer.
    """
    check_timer(timer)
    key, _ = loop_key()
    existing = _slots.get(key)
    if existing is not None and existing.alive():
        raise RuntimeError("this event loop already has a shared aiowheel timer")
    if timer is None:
        own = loop_timer()  # (not `or`: a Timer with nothing pending is falsy)
        timer = own if own is not None else Timer(tick=DEFAULT_TICK)
    if timer.closed:
        raise ValueError("shared_timer() needs a new or running Timer, got a closed one")
    slot = _Slot()
    _slots[key] = slot
    try:
        if timer.backend == "":  # not started: this block owns it
            async with timer:
                slot.start(timer)
                yield timer
        else:
            slot.start(timer)
            yield timer
    finally:
        if _slots.get(key) is slot:
            del _slots[key]
        slot.end()


def has_shared_timer() -> bool:
    """True when the running event loop has a shared timer (running or starting)."""
    key, _ = loop_key()
    slot = _slots.get(key)
    return (slot is not None and slot.alive()) or loop_timer() is not None
