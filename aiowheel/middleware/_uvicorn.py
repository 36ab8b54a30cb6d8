"""``uvicorn_protocol``: connection-level idle timeouts for uvicorn.

What an ASGI middleware cannot see happens between requests: a connection that never
sends a request, a keep-alive gap, a request head trickled a byte at a time
(slowloris). uvicorn arms its keep-alive timer only after a response, so the first two
are unbounded there, and the third always is. This module subclasses uvicorn's HTTP/1.1
protocol (given to ``uvicorn.Config(http=...)``) so that:

* ``connection_made`` files the connection on an aiowheel timer (once);
* each read and each completed response stores the connection's new deadline (the
  filing looks at it when it fires: ``IdleControl`` in ``_shared.py``); while a
  request head is arriving the deadline is capped at ``header_timeout`` after its
  first byte, so trickling bytes does not extend it;
* the same filing times the request in flight for ``IdleTimeoutMiddleware``
  (``RequestHolder``): a request arms nothing of its own, and its response's
  completion (``on_response_complete``) and the client taking what a send waited to
  write (``resume_writing``) reach it from here;
* uvicorn's own keep-alive timer, which it arms after every response and cancels on
  the next request, is a store on the same filing (``_LoopView``): the keep-alive gap
  ends at the earlier of uvicorn's ``timeout_keep_alive`` and ours;
* on expiry, a connection with no request in flight is closed (aborted when a partial
  request head or unsent output is pending); a request in flight belongs to the
  application and is left alone (``IdleTimeoutMiddleware`` times those: we only look
  again a timeout later); a connection uvicorn is already closing but whose output the
  peer does not read is aborted;
* ``connection_lost`` cancels the timer on every path (uvicorn itself cancels its
  keep-alive timer only when the connection closed cleanly, so we cancel that too,
  when one was armed: see ``keep_alive``).

Reliance on uvicorn internals, kept to this module and tested against the installed
uvicorn (0.55): the protocol constructor is untouched; the protocol writes through the
transport given to ``connection_made`` (we pass a thin wrapper, whose ``write`` is the
real transport's); ``on_response_complete`` is called when a response has gone out;
``protocol.cycle`` / ``cycle.response_complete`` tell whether a request is in flight;
``protocol.scope`` is the latest request's scope, which gets the connection
(``CONNECTION_KEY``) before the request's task first runs (httptools:
``on_headers_complete``);
``timeout_keep_alive_task`` is uvicorn's keep-alive handle, which uvicorn gets from
``self.loop.call_later`` (only there: its ``loop`` is otherwise used for
``create_task``, and we replace it with a view of the loop after the constructor);
``resume_writing`` is the transport's flow-control call. A websocket upgrade hands
the transport to another protocol (``transport.set_protocol``); the wrapper notices it
and stops timing that connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, cast

from .. import Timer
from .._driver import loop_clock
from ._shared import (
    CONNECTION_KEY,
    IdleControl,
    RequestHolder,
    abort_with_reset,
    check_timeout,
    check_timer,
    shared_timer_nowait,
)

if TYPE_CHECKING:
    pass

__all__ = ["uvicorn_protocol"]


def _request_in_flight(protocol: object) -> bool:
    # uvicorn internal: the current request/response cycle (h11 and httptools alike).
    cycle = getattr(protocol, "cycle", None)
    return cycle is not None and not getattr(cycle, "response_complete", True)


def _cancel_uvicorn_keepalive(protocol: object) -> None:
    # uvicorn internal: connection_lost cancels this only when exc is None, so after a
    # reset it would keep the protocol alive until it fires. Duck-typed: whatever the
    # loop's call_later returned (asyncio.TimerHandle, uvloop's TimerHandle, the
    # drop-in loop's LoopTimerHandle) has a cancel(); checking for asyncio's class left
    # the handle, and the protocol it refers to, alive on every other loop.
    handle = getattr(protocol, "timeout_keep_alive_task", None)
    cancel = getattr(handle, "cancel", None)
    if callable(cancel):
        cancel()
        protocol.timeout_keep_alive_task = None  # type: ignore[attr-defined]


class _ConnectionWatch(RequestHolder):
    """The idle timeout of one uvicorn connection (``IdleControl``'s pattern: reads
    and completed responses store the deadline; the filing looks at it when it fires).

    While a request is in flight the connection's handle also times the request,
    when ``IdleTimeoutMiddleware`` asks (``hold``): the request arms nothing of its
    own. ``_due()`` is the earlier of the two deadlines. A request head arriving
    under ``header_timeout`` moves the connection's deadline earlier, which re-files
    at once. Before the shared timer runs (the first connections of a process can
    arrive while it starts) only the deadlines are kept; ``_timer_ready`` files.
    """

    __slots__ = (
        "_head_started",
        "_header_timeout",
        "_loop",
        "_lost",
        "_lost_waiters",
        "_marked",
        "_protocol",
        "_request",
        "_transport",
        "_upgraded",
    )

    def __init__(
        self,
        protocol: asyncio.Protocol,
        transport: asyncio.Transport,
        timeout: float,
        header_timeout: float,
    ) -> None:
        loop = self._loop = asyncio.get_running_loop()
        # One clock: the loop's, which is the timer's (Timer.time).
        self._init_idle(None, loop_clock(loop), timeout)
        self._protocol = protocol
        self._transport = transport
        self._header_timeout = header_timeout
        self._head_started: float | None = None
        self._request: IdleControl | None = None  # the request this connection times
        self._lost = False  # connection_lost was called
        self._upgraded = False  # handed to a websocket protocol
        self._lost_waiters: list[asyncio.Future[None]] = []
        self._marked: object = None  # the latest scope given CONNECTION_KEY
        self._deadline = self._clock() + timeout
        self._holder = self  # timed from now on (filed once a timer runs)

    def start(self, timer: Timer | None) -> None:
        if timer is None:
            timer = shared_timer_nowait(self._timer_ready)
            if timer is None:
                return
        self._timer_ready(timer)

    def _timer_ready(self, timer: Timer | None) -> None:
        if self._holder is None or timer is None:
            return
        self._timer = timer
        self._file()

    def _on_own_due(self) -> None:
        self._expire()

    def keep_alive(
        self, delay: float, callback: Callable[[], object]
    ) -> asyncio.TimerHandle | None:
        """uvicorn's ``loop.call_later(timeout_keep_alive, ...)`` after a response, as a
        store: the keep-alive gap ends at the earlier of uvicorn's deadline and ours,
        on this connection's filing (no loop timer armed and cancelled per request).
        While the connection is not timed (the shared timer is starting, or closed)
        uvicorn's own timer is armed as it would be."""
        if self._holder is None or self._handle is None:
            return self._loop.call_later(delay, callback)
        deadline = self._clock() + delay
        if deadline < self._deadline:
            self._deadline = deadline
            if deadline < self._filed:
                self._file()
        return None

    def stop(self) -> None:
        request = self._request
        if request is not None:
            # The request outlives our timing (a client gone away, an application
            # that goes on): it files a handle of its own.
            self._request = None
            request.rehome()
        super().stop()

    def lost(self) -> None:
        """``connection_lost``: stop timing, and wake ``abort_connection``."""
        self.stop()
        self._marked = None  # (the scope refers to us: no cycle left behind)
        self._lost = True
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def upgraded(self, protocol: asyncio.BaseProtocol) -> None:
        """A websocket upgrade: the connection is the websocket protocol's now (it
        gets the data and connection_lost), no longer ours to time. Its requests can
        still ask us to drop it (CONNECTION_KEY)."""
        self.stop()
        self._upgraded = True
        app = getattr(protocol, "app", None)
        if app is not None:
            # uvicorn's websocket protocols take `self.app` when their task first
            # runs, after this (the upgrade hands the transport over first).
            protocol.app = _app_for(app, self)  # type: ignore[attr-defined]

    async def abort_connection(self) -> None:
        # CONNECTION_KEY's protocol (see _shared.ConnectionAbort).
        if self._lost:
            return
        if self._upgraded:
            # connection_lost goes to the websocket protocol, which ends the
            # application's receive() and send(): nothing for uvicorn to log.
            abort_with_reset(self._transport)
            return
        waiter = self._loop.create_future()
        self._lost_waiters.append(waiter)
        abort_with_reset(self._transport)
        # abort() calls connection_lost at the loop's next iteration (asyncio and
        # uvloop alike), which sets uvicorn's cycle.disconnected: the application
        # returning then is a client gone away, not an error to log.
        await waiter

    def _expire(self) -> None:
        transport = self._transport
        if transport.is_closing():
            # uvicorn is closing it but the peer does not take the output: give up.
            self._give_up()
            abort_with_reset(transport)
        elif _request_in_flight(self._protocol):
            # The application's business (IdleTimeoutMiddleware times requests). Look
            # again a timeout later: the request may end without a read or a response
            # that would move the deadline, e.g. when uvicorn closes the connection
            # after an error.
            self._deadline = self._clock() + self._timeout  # type: ignore[operator]
        elif self._head_started is not None or transport.get_write_buffer_size():
            self._give_up()
            abort_with_reset(transport)  # slowloris, or a peer that stopped reading
        else:
            self._give_up()
            transport.close()

    def _give_up(self) -> None:
        """Stop timing the connection itself (it is being closed); a request it holds
        stays timed until connection_lost hands it over."""
        self._holder = None


class _WatchedTransport(asyncio.Transport):
    """The transport uvicorn's protocol sees: the real one, with its closing and its
    hand-over to a websocket protocol noticed.

    Everything else is the real transport's bound method, stored on the instance: a
    write, ``is_closing`` and the rest cost no frame of ours (a completed response is
    the write activity that counts: ``_IdleProtocolMixin.on_response_complete``).
    """

    __slots__ = (
        "_transport",
        "_watch",
        "abort",
        "can_write_eof",
        "get_extra_info",
        "get_protocol",
        "get_write_buffer_limits",
        "get_write_buffer_size",
        "is_closing",
        "is_reading",
        "pause_reading",
        "resume_reading",
        "set_write_buffer_limits",
        "write",
        "write_eof",
        "writelines",
    )

    def __init__(self, transport: asyncio.Transport, watch: _ConnectionWatch) -> None:
        super().__init__()
        self._transport = transport
        self._watch = watch
        # (mypy: a method replaced by an attribute of the same signature.)
        self.abort = transport.abort  # type: ignore[method-assign]
        self.can_write_eof = transport.can_write_eof  # type: ignore[method-assign]
        self.get_extra_info = transport.get_extra_info  # type: ignore[method-assign]
        self.get_protocol = transport.get_protocol  # type: ignore[method-assign]
        self.get_write_buffer_limits = transport.get_write_buffer_limits  # type: ignore[method-assign]
        self.get_write_buffer_size = transport.get_write_buffer_size  # type: ignore[method-assign]
        self.is_closing = transport.is_closing  # type: ignore[method-assign]
        self.is_reading = transport.is_reading  # type: ignore[method-assign]
        self.pause_reading = transport.pause_reading  # type: ignore[method-assign]
        self.resume_reading = transport.resume_reading  # type: ignore[method-assign]
        self.set_write_buffer_limits = transport.set_write_buffer_limits  # type: ignore[method-assign]
        self.write = transport.write  # type: ignore[method-assign]
        self.write_eof = transport.write_eof  # type: ignore[method-assign]
        self.writelines = transport.writelines  # type: ignore[method-assign]

    def close(self) -> None:
        if _request_in_flight(self._watch._protocol):
            # uvicorn closes with a response under way only when the response is
            # broken (the application raised, or returned without finishing it): what
            # is still buffered is worthless, and a graceful close would wait for a
            # peer that may never read it (a second timeout before the protocol's
            # timer aborted it). Abort at once.
            self._transport.abort()
        else:
            self._transport.close()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        if protocol is not self._watch._protocol:
            # A websocket upgrade: the new protocol gets the data and connection_lost,
            # so this connection is no longer ours to time.
            self._watch.upgraded(protocol)
        self._transport.set_protocol(protocol)


def _app_for(app: Any, watch: _ConnectionWatch) -> Any:
    async def app_on_connection(scope: Any, receive: Any, send: Any) -> None:
        scope = dict(scope)  # ASGI: copy the scope before changing it
        scope[CONNECTION_KEY] = watch
        await app(scope, receive, send)

    return app_on_connection


class _LoopView:
    """The event loop uvicorn's protocol sees (its ``loop`` attribute): the real one,
    but ``call_later``, which uvicorn calls only to arm its keep-alive timer after
    each response, is the connection's ``keep_alive`` (a store). ``create_task`` is
    the loop's bound method (no frame of ours); the rest is looked up on the loop."""

    __slots__ = ("_loop", "call_later", "create_task")

    def __init__(self, loop: asyncio.AbstractEventLoop, watch: _ConnectionWatch) -> None:
        self._loop = loop
        self.create_task = loop.create_task
        self.call_later = watch.keep_alive

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


class _IdleProtocolMixin(asyncio.Protocol):
    """Put before uvicorn's protocol class in the bases (see ``uvicorn_protocol``)."""

    idle_timeout: ClassVar[float]
    header_timeout: ClassVar[float]
    idle_timer: ClassVar[Timer | None] = None
    _aiowheel_watch: _ConnectionWatch | None = None
    app: Any  # uvicorn's: the ASGI application a request's task runs
    # The base protocol's methods, called without super()'s frame (uvicorn_protocol).
    _base_data_received: Callable[[bytes], None]
    _base_on_response_complete: Callable[[], None]
    loop: Any  # uvicorn's: the event loop (its call_later arms the keep-alive timer)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A socket transport (uvloop's are not asyncio.Transport subclasses).
        transport = cast(asyncio.Transport, transport)
        watch = _ConnectionWatch(self, transport, self.idle_timeout, self.header_timeout)
        self._aiowheel_watch = watch
        super().connection_made(_WatchedTransport(transport, watch))
        # Each request's scope carries this connection (CONNECTION_KEY), which tells
        # IdleTimeoutMiddleware how to drop it and lets its filing time the request:
        # written into uvicorn's scope once it is built, before the request's task
        # first runs (_mark). A loop with a task factory may run the task at once
        # (eager tasks): there, the application is wrapped instead.
        if watch._loop.get_task_factory() is not None:
            self.app = _app_for(self.app, watch)
        if getattr(self, "loop", None) is watch._loop:
            self.loop = _LoopView(watch._loop, watch)
        watch.start(self.idle_timer)

    def _mark(self, watch: _ConnectionWatch) -> None:
        # uvicorn's `scope` of the latest request (h11: built in handle_events, which
        # data_received and on_response_complete run; httptools: see
        # on_headers_complete). Its task has not run yet.
        scope = getattr(self, "scope", None)
        if scope is not None and scope is not watch._marked:
            watch._marked = scope
            scope[CONNECTION_KEY] = watch

    def data_received(self, data: bytes) -> None:
        self._base_data_received(data)
        watch = self._aiowheel_watch
        if watch is not None:
            scope = getattr(self, "scope", None)  # self._mark(watch), inline
            if scope is not None and scope is not watch._marked:
                watch._marked = scope
                scope[CONNECTION_KEY] = watch
            if watch._holder is not None:  # the read stores the new deadline
                now = watch._clock()
                deadline = now + watch._timeout  # type: ignore[operator]  # set while timing
                cycle = getattr(self, "cycle", None)  # _request_in_flight, inline
                if cycle is not None and not getattr(cycle, "response_complete", True):
                    watch._head_started = None
                else:
                    # A request head is arriving: trickling it does not buy more time.
                    started = watch._head_started
                    if started is None:
                        started = watch._head_started = now
                    header = started + watch._header_timeout
                    if header < deadline:
                        deadline = header
                watch._deadline = deadline
                if deadline < watch._filed:
                    watch._earlier(deadline)

    def on_headers_complete(self) -> None:
        # httptools' (h11's protocol has no such method and never calls it): the
        # request's scope is complete and its cycle, and maybe its task, come next.
        watch = self._aiowheel_watch
        if watch is not None:
            self._mark(watch)
        super().on_headers_complete()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        # uvicorn's: a response has gone out whole (called from the request's last
        # send); the keep-alive gap starts now.
        watch = self._aiowheel_watch
        if watch is not None:
            request = watch._request
            if request is not None:
                # The request this connection times is complete: its timing stops
                # here, not in a coroutine of the middleware's around that send.
                watch._request = None
                request.response_complete()
            if watch._holder is not None:  # watch.touch(), inline
                watch._deadline = watch._clock() + watch._timeout  # type: ignore[operator]
        # uvicorn's keep-alive, if shorter, comes in through keep_alive (_LoopView).
        self._base_on_response_complete()
        if watch is not None:
            # (h11 may have started a pipelined request) self._mark(watch), inline:
            scope = getattr(self, "scope", None)
            if scope is not None and scope is not watch._marked:
                watch._marked = scope
                scope[CONNECTION_KEY] = watch

    def resume_writing(self) -> None:
        # The transport's buffer drained: the client took what a send of the request
        # in flight waited to write, which is activity for it (the middleware's
        # send_held returns the server's send, so it cannot see the send return).
        watch = self._aiowheel_watch
        if watch is not None:
            request = watch._request
            if request is not None:
                request.touch()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        watch = self._aiowheel_watch
        if watch is not None:
            watch.lost()
        try:
            super().connection_lost(exc)
        finally:
            _cancel_uvicorn_keepalive(self)


def _base_class(base: str | type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    try:
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError as exc:  # pragma: no cover - uvicorn is in the middleware extra
        raise ImportError(
            "uvicorn_protocol() needs uvicorn: pip install 'aiowheel[middleware]' "
            "(from a checkout: pip install '.[middleware]')"
        ) from exc
    supported: list[type[asyncio.Protocol]] = [H11Protocol]
    httptools_protocol: type[asyncio.Protocol] | None
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is an optional uvicorn dependency
        httptools_protocol = None
    else:  # pragma: no cover - httptools is not installed in our test environment
        httptools_protocol = HttpToolsProtocol
        supported.append(HttpToolsProtocol)
    if base == "auto":
        return httptools_protocol or H11Protocol
    if base == "h11":
        return H11Protocol
    if base == "httptools":
        if httptools_protocol is None:
            raise ImportError("base='httptools' needs httptools: pip install httptools")
        return httptools_protocol  # pragma: no cover
    if isinstance(base, type) and issubclass(base, tuple(supported)):
        return base
    raise ValueError(
        "base must be 'auto', 'h11', 'httptools' or a subclass of uvicorn's H11Protocol "
        f"or HttpToolsProtocol, got {base!r}"
    )


def uvicorn_protocol(
    *,
    timeout: float,
    header_timeout: float | None = None,
    timer: Timer | None = None,
    base: str | type[asyncio.Protocol] = "auto",
) -> type[asyncio.Protocol]:
    """An HTTP/1.1 protocol class for ``uvicorn.Config(http=...)`` with idle timeouts.

    ``timeout``: seconds with no byte read or written before a connection with no
    request in flight is closed (a connection that never sends a request, a
    keep-alive gap). ``header_timeout``: seconds a request head may take from its first
    byte (default: ``timeout``); a slowloris client is dropped after it. ``timer``: a
    running aiowheel ``Timer``; default: the event loop's shared timer. ``base``:
    ``"auto"`` (httptools if installed, else h11), ``"h11"``, ``"httptools"`` or a
    subclass of one of uvicorn's protocols. Bad arguments raise here.

    ``uvicorn.run(app, http=uvicorn_protocol(timeout=15))``.
    """
    idle = check_timeout(timeout)
    header = idle if header_timeout is None else check_timeout(header_timeout, "header_timeout")
    check_timer(timer)
    base_class = _base_class(base)
    name = f"IdleTimeout{base_class.__name__}"
    namespace: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"uvicorn's {base_class.__name__} with aiowheel connection idle timeouts.",
        "idle_timeout": idle,
        "header_timeout": header,
        "idle_timer": timer,
        "_base_data_received": base_class.data_received,
        "_base_on_response_complete": base_class.on_response_complete,  # type: ignore[attr-defined]
    }
    return type(name, (_IdleProtocolMixin, base_class), namespace)
