"""``IdleTimeoutMiddleware``: a plain ASGI middleware that drops idle requests.

Each request (or websocket) stores its deadlines, and every message either way moves
the idle one (a clock read and a float store: ``IdleControl`` in ``_shared.py``).
Nothing is armed per request: the request is timed by a filing that is already in
the timer, its connection's behind ``uvicorn_protocol``, else a spare one the
middleware keeps per concurrent request (``SpareHolder``). When that filing comes due
and a deadline has passed, the request's task is cancelled (asyncio: ``Task.cancel``
from the timer's callback, taken back with ``Task.uncancel`` as ``asyncio.timeout``
does; trio: an anyio cancel scope) and the middleware answers what can still be
answered:

* HTTP, no response started: ``408 Request Timeout`` when the application was waiting
  for the request body (the client stalled) or the body missed its deadline (a
  trickle: see ``body_timeout``), else ``503 Service Unavailable`` (the
  application itself did nothing: no read, no write);
* HTTP, response started: the response is aborted by raising ``IdleTimeoutError``
  (ASGI has no other way to abort; servers drop the connection), or behind
  ``uvicorn_protocol`` by aborting the connection;
* websocket: ``websocket.close`` with ``close_code`` (default 1001, "going away").

Timing stops once the response is complete (or the websocket closed): work after the
response, such as Starlette's background tasks, is not idleness. An endpoint changes
its own timeout with ``set_idle_timeout(scope, seconds_or_None)``; ``overrides`` does
it by path prefix.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Protocol

import anyio

from .. import Timer
from ._shared import (
    CONNECTION_KEY,
    SCOPE_KEY,
    IdleControl,
    IdleHost,
    IdleTimeoutError,
    check_timeout,
    check_timer,
    get_shared_timer,
    has_shared_timer,
    logger,
    loop_key,
    running_clock,
    scope_connection,
    shared_timer,
)
from ._uvicorn import _ConnectionWatch

__all__ = ["IdleTimeoutMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Close codes an endpoint may send (RFC 6455 section 7.4: 1004-1006 and 1015 are
# reserved and must never be sent; 3000-4999 are for libraries and applications).
_STARTS_RESPONSE = frozenset(
    ("http.response.start", "websocket.accept", "websocket.http.response.start")
)
_BODY = frozenset(("http.response.body", "websocket.http.response.body"))
_ENDS_RESPONSE = frozenset(("websocket.close", "http.response.pathsend"))

_INF = math.inf

_SENDABLE_CLOSE_CODES = frozenset((1000, 1001, 1002, 1003, *range(1007, 1015)))


def _check_close_code(code: object) -> int:
    if isinstance(code, bool) or not isinstance(code, int):
        raise TypeError(f"close_code must be an int, got {code!r}")
    if code not in _SENDABLE_CLOSE_CODES and not 3000 <= code <= 4999:
        raise ValueError(
            f"close_code must be a websocket close code an endpoint may send "
            f"(1000-1003, 1007-1014 or 3000-4999), got {code!r}"
        )
    return code


class _Default:
    """The type of ``body_timeout``'s default: the idle ``timeout``."""

    def __repr__(self) -> str:
        return "<timeout>"


_DEFAULT = _Default()


class _Cancellable(Protocol):
    """What expiry cancels: the request's ``asyncio.Task``, or an anyio cancel scope."""

    def cancel(self) -> object: ...


class _RequestWatch(IdleControl):
    """The idle timeout of one HTTP request or one websocket, and the request's
    ``receive`` and ``send`` (bound methods: nothing is wrapped per request).

    Two deadlines, one filing (``IdleControl``): the idle one, ``_deadline``, and the
    body's, ``_body_deadline`` (``inf`` when there is none), both stored and looked at
    when the filing fires (``_on_due``). The filing is a spare one of the middleware's
    (``SpareHolder``), or, behind ``uvicorn_protocol``, the connection's
    (``IdleControl.hold``). Expiry calls ``_target.cancel()``: the request's task on
    asyncio (edge-triggered, as ``asyncio.timeout`` does it: the middleware takes the
    request back with ``Task.uncancel``), an anyio cancel scope on trio.

    Behind ``uvicorn_protocol`` an HTTP request's ``send`` is ``send_held``: the
    server's own send, returned after a store, no coroutine of ours; the connection
    tells the request when its response is complete (``response_complete``, from
    uvicorn's ``on_response_complete``) and when the client took what a send was
    waiting to write (``touch``, from the protocol's ``resume_writing``).
    """

    __slots__ = (
        "_body_deadline",
        "_body_rate",
        "_body_started",
        "_body_timeout",
        "_parent",
        "_receive",
        "_send",
        "_target",
        "body_complete",
        "body_expired",
        "complete",
        "disconnected",
        "expired",
        "receiving",
        "response_started",
        "stalled_body",
    )

    def __init__(
        self,
        timer: Timer,
        clock: Callable[[], float],
        timeout: float | None,
        target: _Cancellable,
        parent: IdleControl | None,
        receive: Receive,
        send: Send,
        body_timeout: float | None = None,
        body_rate: float | None = None,
    ) -> None:
        # IdleControl._init_idle, inline (one frame less per request)
        self._timer = timer
        self._clock = clock
        self._timeout = timeout
        self._handle = None
        self._holder = None
        self._deadline = 0.0
        self._filed = 0.0
        self._target = target
        self._parent = parent
        self._receive = receive
        self._send = send
        self._body_timeout = body_timeout
        self._body_rate = body_rate
        self._body_started = False
        self._body_deadline = _INF
        self.expired = False
        self.complete = False  # response complete or websocket closed: timing stopped
        self.disconnected = False
        self.receiving = 0  # receive() calls in progress
        self.body_complete = False
        self.body_expired = False  # expired by the body deadline, not by idleness
        self.response_started = False
        self.stalled_body = False  # at expiry: the application was waiting for the body

    @property
    def timeout(self) -> float | None:
        return self._timeout

    def start(self, host: IdleHost, connection: IdleControl | None) -> None:
        """Start timing: on ``connection``'s filing when it takes the request, else on
        a spare filing of ``host``'s."""
        timeout = self._timeout
        if timeout is None:
            return
        self._deadline = self._clock() + timeout
        if connection is None or not connection.hold(self):
            connection = host.holder()
            if not connection.hold(self):  # the timer closed: a server shutting down
                return
        self._holder = connection

    def set_timeout(self, timeout: float | None) -> None:
        if self._parent is not None:  # an outer idle middleware times this request too
            self._parent.set_timeout(timeout)
        super().set_timeout(timeout)

    def _timing(self) -> bool:
        return not (self.complete or self.expired)

    def _due(self) -> float:
        deadline = self._deadline
        body = self._body_deadline
        return body if body < deadline else deadline

    def stop(self) -> None:
        # IdleControl.stop, inline, and the body deadline with it.
        holder = self._holder
        handle = self._handle
        if holder is None and handle is None:
            return  # not timing (stopped already, or never started)
        self._holder = None
        if holder is not None and holder is not self:
            holder.release(self)
        if handle is not None:
            self._handle = None
            handle.cancel()
        # No idle timeout, no body deadline (a later set_timeout starts a new one).
        self._body_deadline = _INF
        self._body_started = False

    # -- the body deadline: stored beside the idle one, so that it neither depends on
    # nor changes how activity moves the idle one (touch) --

    def body_wanted(self) -> None:
        """The application asks for the body: start its deadline (once)."""
        self._body_started = True
        holder = self._holder
        if (
            self._body_timeout is not None
            and not self.body_complete
            and holder is not None  # timed at all (not opted out, not over)
        ):
            deadline = self._body_deadline = self._clock() + self._body_timeout
            holder._earlier(deadline)

    def body_received(self, size: int, more: bool) -> None:
        deadline = self._body_deadline
        if deadline == _INF:
            return
        if not more:
            self._body_deadline = _INF
        elif size and self._body_rate is not None:
            # Progress buys time at the minimum rate (mod_reqtimeout's MinRate): a
            # steady upload is never cut, a trickle gets almost nothing. A tiny
            # body_min_rate buys an infinite extension: no deadline at all.
            deadline += size / self._body_rate
            self._body_deadline = deadline if math.isfinite(deadline) else _INF

    def _on_due(self, now: float) -> None:
        if now >= self._body_deadline:
            self._body_expire()
        elif now >= self._deadline:
            self._expire()

    def _body_expire(self) -> None:
        # The body is not complete by its deadline, however it trickled: the
        # client's doing (408), whether or not the application was in receive().
        self.stop()
        self.expired = True
        self.body_expired = True
        self.stalled_body = True
        self._target.cancel()

    def _expire(self) -> None:
        # Runs on the timer's driver. Stop timing first, so that messages racing with
        # the cancellation do not move deadlines any more.
        self.stop()
        self.expired = True
        # Who were we waiting for? Decided now: the cancellation unwinds receive().
        self.stalled_body = self.receiving > 0 and not self.body_complete
        self._target.cancel()

    # -- the application's receive and send --

    async def receive(self) -> Message:
        if not self._body_started:
            self.body_wanted()
        self.receiving += 1
        try:
            message = await self._receive()
        finally:
            self.receiving -= 1
        if self._holder is not None:  # touch(), inline
            self._deadline = self._clock() + self._timeout  # type: ignore[operator]
        kind = message.get("type")
        if kind == "http.request":
            more = bool(message.get("more_body", False))
            if not more:
                self.body_complete = True
            if self._body_deadline != _INF:
                self.body_received(len(message.get("body", b"")), more)
        elif kind == "http.disconnect" or kind == "websocket.disconnect":
            # Keep timing: an application that ignores the disconnect is still
            # cancelled after the timeout; there is nobody to answer.
            self.disconnected = True
            self._body_deadline = _INF  # no body to wait for any more
        return message

    def send(self, message: Message) -> Awaitable[None]:
        kind = message.get("type")
        if self._holder is not None:  # touch(), inline
            self._deadline = self._clock() + self._timeout  # type: ignore[operator]
        if kind == "http.response.start":
            # Nothing to do once it is sent: the server's own send is awaited
            # directly (no coroutine of ours on the way).
            self.response_started = True
            return self._send(message)
        return self._send_watched(message, kind)

    def send_held(self, message: Message) -> Awaitable[None]:
        """``send`` behind ``uvicorn_protocol``'s connection (see the class)."""
        self.response_started = True  # an HTTP response's first message starts it
        if self._holder is not None:  # touch(), inline
            self._deadline = self._clock() + self._timeout  # type: ignore[operator]
        return self._send(message)

    def response_complete(self) -> None:
        # The connection holding this request saw the response go out whole, and let
        # the request go: stop() without the release.
        self.complete = True
        self._holder = None
        handle = self._handle
        if handle is not None:  # pragma: no cover - a held request files no handle
            self._handle = None
            handle.cancel()
        self._body_deadline = _INF
        self._body_started = False

    async def _send_watched(self, message: Message, kind: object) -> None:
        if not self.response_started and kind in _STARTS_RESPONSE:
            self.response_started = True
        await self._send(message)
        if (kind in _BODY and not message.get("more_body", False)) or kind in _ENDS_RESPONSE:
            self.complete = True
            self.stop()
        elif self._holder is not None:  # the client took it: flow control let it through
            self._deadline = self._clock() + self._timeout  # type: ignore[operator]


class IdleTimeoutMiddleware:
    """Drop HTTP requests and websockets that stay idle for ``timeout`` seconds.

    ``app``: the ASGI application. ``timeout``: seconds with no ASGI message either
    way (positive, finite). ``timer``: the aiowheel ``Timer`` to use (started by you);
    default: the event loop's shared timer (see ``shared_timer``), which this
    middleware opens for the server's lifespan when the server runs the lifespan
    protocol. ``overrides``: path prefix -> timeout in seconds, or ``None`` for no idle
    timeout (e.g. ``{"/poll": None}``); the longest matching prefix wins and matches
    whole path segments (``"/poll"`` matches ``/poll`` and ``/poll/x``, not
    ``/polling``). ``close_code``: the websocket close code sent on expiry.

    ``body_timeout``: seconds a request body may take from the application's first
    ``receive()`` (default: ``timeout``; ``None``: no body deadline), extended by one
    second per ``body_min_rate`` bytes received (default 500; ``None``: not extended),
    so that a body trickled a byte at a time gets 408 however active it looks.

    Bad configuration raises ``TypeError``/``ValueError`` here, not on a request.
    """

    #: Status sent when the application was waiting for the request body.
    request_timeout_status = 408
    #: Status sent when the application itself was idle before starting a response.
    handler_timeout_status = 503

    def __init__(
        self,
        app: ASGIApp,
        *,
        timeout: float,
        timer: Timer | None = None,
        overrides: Mapping[str, float | None] | None = None,
        close_code: int = 1001,
        body_timeout: float | _Default | None = _DEFAULT,
        body_min_rate: float | None = 500.0,
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI application (a callable), got {app!r}")
        self.app = app
        self._timeout = check_timeout(timeout)
        self._body_timeout = (
            self._timeout
            if isinstance(body_timeout, _Default)
            else None
            if body_timeout is None
            else check_timeout(body_timeout, "body_timeout")
        )
        self._body_rate = (
            None
            if body_min_rate is None
            else check_timeout(body_min_rate, "body_min_rate", "bytes per second")
        )
        self._timer = check_timer(timer)
        self._overrides = _check_overrides(overrides)
        # The running loop's timer and clock, found on its first request.
        self._cached: IdleHost | None = None
        self._close_code = _check_close_code(close_code)

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def close_code(self) -> int:
        return self._close_code

    @property
    def body_timeout(self) -> float | None:
        return self._body_timeout

    @property
    def body_min_rate(self) -> float | None:
        return self._body_rate

    def timeout_for(self, path: str) -> float | None:
        """The idle timeout a request for ``path`` starts with."""
        for prefix, timeout in self._overrides:
            if path.startswith(prefix) and (
                len(path) == len(prefix) or prefix.endswith("/") or path[len(prefix)] == "/"
            ):
                return timeout
        return self._timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            if kind == "lifespan" and self._timer is None and not has_shared_timer():
                await self._lifespan(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        # A request: what follows is the per-request path, kept in this one frame.
        http = kind == "http"
        connection = scope.get(CONNECTION_KEY)
        parent = scope.get(SCOPE_KEY)
        timeout = self.timeout_for(scope.get("path", "")) if self._overrides else self._timeout
        watch: _RequestWatch
        if (
            http
            and type(connection) is _ConnectionWatch
            and connection._request is None  # hold(), inline: not holding one already
            and connection._handle is not None  # filed: the shared timer runs
            and parent is None  # not under another idle middleware
            and timeout is not None
        ):
            # Behind uvicorn_protocol (its connection is asyncio's, and the loop's
            # timer files it): the connection's filing times the request, the
            # connection's loop finds the task, the server's send is the request's.
            task = asyncio.current_task(connection._loop)
            if task is None:  # pragma: no cover - a coroutine always runs in a task here
                await self._watch_in_scope(scope, receive, send, http)
                return
            clock = connection._clock
            watch = _RequestWatch(
                connection._timer,  # type: ignore[arg-type]  # set: it is filed
                clock,
                timeout,
                task,
                None,
                receive,
                send,
                self._body_timeout,
                self._body_rate,
            )
            deadline = watch._deadline = clock() + timeout
            connection._request = watch
            if deadline < connection._filed:
                connection._file()
            watch._holder = connection
            watch_send: Send = watch.send_held
            # ASGI: copy the scope before changing it for the inner application. (Not
            # written into uvicorn's own: the request's watch refers to the server's
            # send, which refers to that scope, and the cycle would outlive each
            # request until the collector ran: it ran every 50 requests.)
            scope = dict(scope)
            scope[SCOPE_KEY] = watch
        else:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # trio: anyio's cancel scope
                await self._watch_in_scope(scope, receive, send, http)
                return
            task = asyncio.current_task(loop)
            if task is None:  # pragma: no cover - a coroutine always runs in a task here
                await self._watch_in_scope(scope, receive, send, http)
                return
            host = self._cached
            if host is None or host.key is not loop or host.timer.closed:
                host = await self._host()
            watch = _RequestWatch(
                host.timer,
                host.clock,
                timeout,
                task,
                parent if isinstance(parent, IdleControl) else None,
                receive,
                send,
                self._body_timeout if http else None,
                self._body_rate,
            )
            watch_send = watch.send
            # ASGI: copy the scope before changing it for the inner application.
            scope = dict(scope)
            scope[SCOPE_KEY] = watch
            if timeout is not None:  # watch.start(host, connection), inline
                watch._deadline = host.clock() + timeout
                if not (isinstance(connection, IdleControl) and connection.hold(watch)):
                    connection = host.holder()
                    if not connection.hold(watch):  # the timer closed: a server shutting down
                        connection = None
                watch._holder = connection
        # asyncio.timeout's bookkeeping: the cancellation is ours only if taking ours
        # back leaves no more than there were when the request started.
        cancelling = task.cancelling()
        try:
            await self.app(scope, watch.receive, watch_send)
        except asyncio.CancelledError:
            watch.stop()
            if not watch.expired or task.uncancel() > cancelling:
                raise  # not ours, or not only ours
        except BaseException:
            watch.stop()
            if watch.expired:
                task.uncancel()
            raise
        else:
            if watch._holder is not None or watch._handle is not None:
                watch.stop()
            if watch.expired:  # the application swallowed our cancellation
                task.uncancel()
        if watch.expired and not watch.complete:
            await self._expired(watch, scope, send, http)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Tie the shared timer to the server's lifetime: opened before the first
        # request, closed after the last one rather than at event loop shutdown.
        async with shared_timer() as timer:

            async def lifespan_send(message: Message) -> None:
                if message.get("type") in (
                    "lifespan.shutdown.complete",
                    "lifespan.shutdown.failed",
                ):
                    # Close it before the server hears that we are done: servers do not
                    # wait for the lifespan call to return (uvicorn's event loop may be
                    # torn down right after this message).
                    await timer.aclose()
                await send(message)

            await self.app(scope, receive, lifespan_send)

    async def _host(self) -> IdleHost:
        """The timer and clock of the running event loop, found on the loop's first
        request (and again when the loop or its shared timer changes)."""
        timer = self._timer
        if timer is None:
            timer = await get_shared_timer()
        host = self._cached = IdleHost(loop_key()[0], timer, running_clock())
        return host

    async def _watch_in_scope(self, scope: Scope, receive: Receive, send: Send, http: bool) -> None:
        # trio (hypercorn): an anyio cancel scope, cancelled by the expiry.
        host = self._cached
        if host is None or host.key is not loop_key()[0] or host.timer.closed:
            host = await self._host()
        parent = scope.get(SCOPE_KEY)
        with anyio.CancelScope() as cancel_scope:
            watch = _RequestWatch(
                host.timer,
                host.clock,
                self.timeout_for(scope.get("path", "")),
                cancel_scope,
                parent if isinstance(parent, IdleControl) else None,
                receive,
                send,
                self._body_timeout if http else None,
                self._body_rate,
            )
            scope = dict(scope)
            scope[SCOPE_KEY] = watch
            watch.start(host, None)
            try:
                await self.app(scope, watch.receive, watch.send)
            finally:
                watch.stop()
        if watch.expired and not watch.complete:
            await self._expired(watch, scope, send, http)

    async def _expired(self, watch: _RequestWatch, scope: Scope, send: Send, http: bool) -> None:
        timeout = watch.timeout
        if http and watch.response_started:
            connection = scope_connection(scope)
            if connection is not None:
                # Behind uvicorn_protocol: drop the connection ourselves, now (a
                # graceful close would wait for a peer that does not read), and say
                # so in one line; the server sees a client that went away.
                await connection.abort_connection()
                logger.warning("aborted a response idle for more than %s s", timeout)
                return
            # ASGI has no other way to abort a response: the server drops the
            # connection when the application raises (and logs the error).
            logger.debug("aborting a response idle for more than %s s", timeout)
            raise IdleTimeoutError(f"response idle for more than {timeout} s: aborted")
        if watch.disconnected:
            return
        try:
            if http:
                stalled_body = watch.stalled_body
                status = (
                    self.request_timeout_status if stalled_body else self.handler_timeout_status
                )
                body = b"Request Timeout\n" if stalled_body else b"Service Unavailable\n"
                logger.debug("answering %d to a request idle for more than %s s", status, timeout)
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            logger.debug("closing a websocket idle for more than %s s", timeout)
            # Bounded: a peer that stopped reading never lets the close frame out
            # (the server's send waits for the paused transport for ever).
            with anyio.move_on_after(timeout if timeout is not None else self._timeout):
                await send(
                    {"type": "websocket.close", "code": self._close_code, "reason": "idle timeout"}
                )
                return
        except Exception as exc:  # the client went away meanwhile: nothing to tell it
            logger.debug("could not send the idle-timeout answer: %r", exc)
            return
        # The close frame did not go out within the timeout: drop the connection.
        connection = scope_connection(scope)
        if connection is not None:
            await connection.abort_connection()
            logger.warning("aborted a websocket whose close was not taken within %s s", timeout)
            return
        raise IdleTimeoutError(f"websocket close not sent within {timeout} s: aborted")


def _check_overrides(
    overrides: Mapping[str, float | None] | None,
) -> tuple[tuple[str, float | None], ...]:
    if overrides is None:
        return ()
    if not isinstance(overrides, Mapping):
        raise TypeError(f"overrides must be a mapping of path prefix to timeout, got {overrides!r}")
    checked: list[tuple[str, float | None]] = []
    for prefix, timeout in overrides.items():
        if not isinstance(prefix, str):
            raise TypeError(f"overrides keys must be path prefixes (str), got {prefix!r}")
        if not prefix.startswith("/"):
            raise ValueError(f"overrides keys must start with '/', got {prefix!r}")
        value = None if timeout is None else check_timeout(timeout, f"overrides[{prefix!r}]")
        checked.append((prefix, value))
    # Longest prefix first: the most specific rule wins.
    checked.sort(key=lambda item: len(item[0]), reverse=True)
    return tuple(checked)
