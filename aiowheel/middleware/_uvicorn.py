"""``uvicorn_protocol``: connection-level idle timeouts for uvicorn.

What an ASGI middleware cannot see happens between requests: a connection that never
sends a request, a keep-alive gap, a request head trickled a byte at a time
(slowloris). uvicorn arms its keep-alive timer only after a response, so the first two
are unbounded there, and the third always is. This module subclasses uvicorn's HTTP/1.1
protocol (given to ``uvicorn.Config(http=...)``) so that:

* ``connection_made`` arms an aiowheel timer for the connection;
* each read and each write re-arms it (``reset``, O(1)); while a request head is
  arriving the deadline is capped at ``header_timeout`` after its first byte, so
  trickling bytes does not extend it;
* on expiry, a connection with no request in flight is closed (aborted when a partial
  request head or unsent output is pending); a request in flight belongs to the
  application and is left alone (``IdleTimeoutMiddleware`` times those: we only look
  again a timeout later); a connection uvicorn is already closing but whose output the
  peer does not read is aborted;
* ``connection_lost`` cancels the timer on every path (uvicorn itself cancels its
  keep-alive timer only when the connection closed cleanly, so we cancel that too).

Reliance on uvicorn internals, kept to this module and tested against the installed
uvicorn (0.54): the protocol constructor is untouched; the protocol writes through the
transport given to ``connection_made`` (we pass a thin wrapper that notices writes);
``protocol.cycle`` / ``cycle.response_complete`` tell whether a request is in flight;
``timeout_keep_alive_task`` is uvicorn's keep-alive handle. A websocket upgrade hands
the transport to another protocol (``transport.set_protocol``); the wrapper notices it
and stops timing that connection.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar, cast

from .. import Timer, TimerClosed, TimerHandle
from ._shared import (
    CONNECTION_KEY,
    abort_with_reset,
    check_timeout,
    check_timer,
    shared_timer_nowait,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

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


class _ConnectionWatch:
    """The idle timer of one uvicorn connection.

    Activity is a store (Netty's ``IdleStateHandler``, as ``IdleControl`` in
    ``_shared.py``): a read or a write computes the connection's deadline and stores
    it in ``_deadline``; the handle stays filed at ``_filed``. When it fires,
    ``_fired`` re-files it at ``_deadline`` if activity moved that later, or expires.

    Invariant: while ``_handle`` is set, ``_filed <= _deadline`` (the handle fires no
    later than the deadline): a deadline that moves earlier (a request head arriving
    under ``header_timeout``) re-files at once. Before the shared timer runs (the first
    connections of a process can arrive while it starts) only ``_deadline`` is kept.
    """

    __slots__ = (
        "_deadline",
        "_filed",
        "_handle",
        "_head_started",
        "_header_timeout",
        "_loop",
        "_lost",
        "_lost_waiters",
        "_protocol",
        "_stopped",
        "_timeout",
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
        self._protocol = protocol
        self._transport = transport
        self._timeout = timeout
        self._header_timeout = header_timeout
        self._loop = asyncio.get_running_loop()
        self._handle: TimerHandle[Any] | None = None
        self._head_started: float | None = None
        self._stopped = False
        self._lost = False  # connection_lost was called
        self._upgraded = False  # handed to a websocket protocol
        self._lost_waiters: list[asyncio.Future[None]] = []
        self._deadline = self._loop.time() + timeout
        self._filed = self._deadline

    def start(self, timer: Timer | None) -> None:
        if timer is None:
            timer = shared_timer_nowait(self._timer_ready)
            if timer is None:
                return
        self._timer_ready(timer)

    def _timer_ready(self, timer: Timer | None) -> None:
        if self._stopped or timer is None:
            return
        try:
            self._filed = self._deadline
            self._handle = timer.schedule_at_nowait(self._deadline, self._fired)
        except TimerClosed:
            if not timer.closed:
                raise  # a timer that was never started: a configuration error

    def _rearm(self, deadline: float) -> None:
        """Activity: store the deadline; re-file only if it moved earlier."""
        self._deadline = deadline
        if deadline < self._filed and self._handle is not None:
            self._refile()

    def _refile(self) -> None:
        handle = self._handle
        if handle is None:
            return
        deadline = self._filed = self._deadline
        try:
            handle.reset_at(deadline)
        except TimerClosed:  # the shared timer closed: the server is shutting down
            self._handle = None
            self._stopped = True

    def _fired(self) -> None:
        """The handle came due: sleep on to the stored deadline, or expire."""
        if self._loop.time() < self._deadline:
            self._refile()
        else:
            self._expire()

    def on_read(self) -> None:
        if self._stopped:
            return
        now = self._loop.time()
        deadline = now + self._timeout
        if _request_in_flight(self._protocol):
            self._head_started = None
        else:
            # A request head is arriving: trickling it does not buy more time.
            started = self._head_started
            if started is None:
                started = self._head_started = now
            deadline = min(deadline, started + self._header_timeout)
        self._rearm(deadline)

    def on_write(self) -> None:
        if not self._stopped:
            self._rearm(self._loop.time() + self._timeout)

    def stop(self) -> None:
        self._stopped = True
        handle = self._handle
        if handle is not None:
            self._handle = None
            handle.cancel()

    def lost(self) -> None:
        """``connection_lost``: stop timing, and wake ``abort_connection``."""
        self.stop()
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
            abort_with_reset(transport)
        elif _request_in_flight(self._protocol):
            # The application's business (IdleTimeoutMiddleware times requests). Look
            # again a timeout later: the request may end without a write that would
            # re-arm us, e.g. when uvicorn closes the connection after an error.
            self._deadline = self._loop.time() + self._timeout
            self._refile()
        elif self._head_started is not None or transport.get_write_buffer_size():
            abort_with_reset(transport)  # slowloris, or a peer that stopped reading
        else:
            transport.close()


class _WatchedTransport(asyncio.Transport):
    """The transport uvicorn's protocol sees: the real one, with writes noticed."""

    __slots__ = ("_transport", "_watch")

    def __init__(self, transport: asyncio.Transport, watch: _ConnectionWatch) -> None:
        super().__init__()
        self._transport = transport
        self._watch = watch

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)
        self._watch.on_write()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._transport.writelines(list_of_data)
        self._watch.on_write()

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def abort(self) -> None:
        self._transport.abort()

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

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        if protocol is not self._watch._protocol:
            # A websocket upgrade: the new protocol gets the data and connection_lost,
            # so this connection is no longer ours to time.
            self._watch.upgraded(protocol)
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()


def _app_for(app: Any, watch: _ConnectionWatch) -> Any:
    async def app_on_connection(scope: Any, receive: Any, send: Any) -> None:
        scope = dict(scope)  # ASGI: copy the scope before changing it
        scope[CONNECTION_KEY] = watch
        await app(scope, receive, send)

    return app_on_connection


class _IdleProtocolMixin(asyncio.Protocol):
    """Put before uvicorn's protocol class in the bases (see ``uvicorn_protocol``)."""

    idle_timeout: ClassVar[float]
    header_timeout: ClassVar[float]
    idle_timer: ClassVar[Timer | None] = None
    _aiowheel_watch: _ConnectionWatch | None = None
    app: Any  # uvicorn's: the ASGI application a request's task runs

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A socket transport (uvloop's are not asyncio.Transport subclasses).
        transport = cast(asyncio.Transport, transport)
        watch = _ConnectionWatch(self, transport, self.idle_timeout, self.header_timeout)
        self._aiowheel_watch = watch
        super().connection_made(_WatchedTransport(transport, watch))
        # Each request's task runs the application through this wrapper, which tells
        # IdleTimeoutMiddleware (CONNECTION_KEY in the scope) how to drop this connection.
        # uvicorn's protocols take `self.app` when they start a request's task.
        self.app = _app_for(self.app, watch)
        watch.start(self.idle_timer)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        watch = self._aiowheel_watch
        if watch is not None:
            watch.on_read()

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
    }
    return type(name, (_IdleProtocolMixin, base_class), namespace)
