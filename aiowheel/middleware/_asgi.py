"""``IdleTimeoutMiddleware``: a plain ASGI middleware that drops idle requests.

One aiowheel timer handle per request (or websocket). Every message either way
re-arms it with ``handle.reset(timeout)`` (O(1); moving a deadline later only records
it). When it fires, the callback cancels the application's cancel scope; the
middleware then answers what can still be answered:

* HTTP, no response started: ``408 Request Timeout`` when the application was waiting
  for the request body (the client stalled) or the body missed its deadline (a
  trickle: see ``body_timeout``), else ``503 Service Unavailable`` (the
  application itself did nothing: no read, no write);
* HTTP, response started: the response is aborted by raising ``IdleTimeoutError``
  (ASGI has no other way to abort; servers drop the connection);
* websocket: ``websocket.close`` with ``close_code`` (default 1001, "going away").

Timing stops once the response is complete (or the websocket closed): work after the
response, such as Starlette's background tasks, is not idleness. An endpoint changes
its own timeout with ``set_idle_timeout(scope, seconds_or_None)``; ``overrides`` does
it by path prefix.

The application runs inside an anyio ``CancelScope``, so the same code serves
asyncio, uvloop and trio (hypercorn) servers.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import anyio

from .. import Timer, TimerClosed, TimerHandle
from ._shared import (
    SCOPE_KEY,
    IdleControl,
    IdleTimeoutError,
    check_timeout,
    check_timer,
    get_shared_timer,
    has_shared_timer,
    logger,
    schedule_idle,
    scope_connection,
    shared_timer,
)

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


class _RequestWatch(IdleControl):
    """The idle timer of one HTTP request or one websocket.

    Invariant (``IdleControl``'s): ``_handle`` is the filed handle exactly while the
    request is being timed; it is ``None`` once timing stopped (opted out,
    response complete, expired, or the timer closed), so ``touch`` is one attribute
    test when there is nothing to time.
    """

    __slots__ = (
        "_body_deadline",
        "_body_handle",
        "_body_rate",
        "_body_timeout",
        "_cancel_scope",
        "_parent",
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
        timeout: float | None,
        cancel_scope: anyio.CancelScope,
        parent: IdleControl | None,
        body_timeout: float | None = None,
        body_rate: float | None = None,
    ) -> None:
        self._init_idle(timer, timeout)
        self._body_timeout = body_timeout
        self._body_rate = body_rate
        self._body_handle: TimerHandle[Any] | None = None
        self._body_deadline = 0.0
        self._cancel_scope = cancel_scope
        self._parent = parent
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

    def set_timeout(self, timeout: float | None) -> None:
        if self._parent is not None:  # an outer idle middleware times this request too
            self._parent.set_timeout(timeout)
        super().set_timeout(timeout)

    def _timing(self) -> bool:
        return not (self.complete or self.expired)

    # -- the body deadline: a separate handle, so that it neither depends on nor
    # changes how activity re-arms the idle one (touch) --

    def body_wanted(self) -> None:
        """The application asks for the body: start its deadline (once)."""
        if (
            self._body_handle is None
            and self._body_timeout is not None
            and not self.body_complete
            and self._handle is not None  # timed at all (not opted out, not over)
        ):
            self._body_deadline = self._timer.time() + self._body_timeout
            self._body_handle = schedule_idle(self._timer, self._body_deadline, self._body_expire)

    def body_received(self, size: int, more: bool) -> None:
        handle = self._body_handle
        if handle is None:
            return
        if not more:
            self._body_handle = None
            handle.cancel()
        elif size and self._body_rate is not None:
            # Progress buys time at the minimum rate (mod_reqtimeout's MinRate): a
            # steady upload is never cut, a trickle gets almost nothing.
            self._body_deadline += size / self._body_rate
            if not math.isfinite(self._body_deadline):
                # A tiny body_min_rate buys an infinite extension: no deadline at
                # all (the timer only takes finite ones).
                self._body_handle = None
                handle.cancel()
                return
            try:
                handle.reset_at(self._body_deadline)
            except TimerClosed:
                self._body_handle = None

    def stop(self) -> None:
        super().stop()
        handle = self._body_handle
        if handle is not None:
            self._body_handle = None
            handle.cancel()

    def _body_expire(self) -> None:
        # The body is not complete by its deadline, however it trickled: the
        # client's doing (408), whether or not the application was in receive().
        self._body_handle = None
        if not self._timing():
            return
        handle = self._handle
        self._handle = None
        if handle is not None:
            handle.cancel()
        self.expired = True
        self.body_expired = True
        self.stalled_body = True
        self._cancel_scope.cancel()

    def _expire(self) -> None:
        # Runs on the timer's driver. The handle has fired: forget it so that messages
        # racing with the cancellation do not re-arm it.
        self._handle = None
        self.expired = True
        # Who were we waiting for? Decided now: the cancellation unwinds receive().
        self.stalled_body = self.receiving > 0 and not self.body_complete
        self._cancel_scope.cancel()


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
        if kind == "http" or kind == "websocket":
            await self._watch(scope, receive, send, kind == "http")
        elif kind == "lifespan" and self._timer is None and not has_shared_timer():
            await self._lifespan(scope, receive, send)
        else:
            await self.app(scope, receive, send)

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

    async def _watch(self, scope: Scope, receive: Receive, send: Send, http: bool) -> None:
        timer = self._timer
        if timer is None:
            timer = await get_shared_timer()
        parent = scope.get(SCOPE_KEY)
        with anyio.CancelScope() as cancel_scope:
            watch = _RequestWatch(
                timer,
                self.timeout_for(scope.get("path", "")),
                cancel_scope,
                parent if isinstance(parent, IdleControl) else None,
                self._body_timeout if http else None,
                self._body_rate,
            )
            # ASGI: copy the scope before changing it for the inner application.
            scope = dict(scope)
            scope[SCOPE_KEY] = watch

            async def watched_receive() -> Message:
                watch.body_wanted()
                watch.receiving += 1
                try:
                    message = await receive()
                finally:
                    watch.receiving -= 1
                watch.touch()
                kind = message.get("type")
                if kind == "http.request":
                    more = bool(message.get("more_body", False))
                    if not more:
                        watch.body_complete = True
                    watch.body_received(len(message.get("body", b"")), more)
                elif kind == "http.disconnect" or kind == "websocket.disconnect":
                    # Keep timing: an application that ignores the disconnect is
                    # still cancelled after the timeout; there is nobody to answer.
                    watch.disconnected = True
                    watch.body_received(0, False)  # no body to wait for any more
                return message

            async def watched_send(message: Message) -> None:
                kind = message.get("type")
                if kind in _STARTS_RESPONSE:
                    watch.response_started = True
                watch.touch()
                await send(message)
                if kind in _ENDS_RESPONSE or (
                    kind in _BODY and not message.get("more_body", False)
                ):
                    watch.complete = True
                    watch.stop()
                else:
                    watch.touch()  # the client took it: flow control let it through

            watch.arm()
            try:
                await self.app(scope, watched_receive, watched_send)
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
