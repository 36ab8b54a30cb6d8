"""A Kafka-style long-poll message log over HTTP, parked in aiowheel's purgatory.

Endpoints:

* ``POST /topics/{topic}`` appends the request body as one message and answers
  ``{"offset": n}``.
* ``GET /topics/{topic}?offset=o&max_wait_ms=w&min_bytes=b`` answers
  ``{"messages": [...], "next_offset": n}`` as soon as at least ``min_bytes`` bytes of
  messages at or after ``offset`` exist, or after ``max_wait_ms`` with whatever is
  there (possibly nothing). This is Kafka's fetch with ``fetch.max.wait.ms`` and
  ``fetch.min.bytes``.
* ``GET /stats``: parked, completed, expired and disconnected polls, and the server's
  CPU time (``time.process_time()``), which the load client turns into CPU per poll.

Two ways to park a poll (``--mode``):

* ``purgatory`` (default): each waiting poll is a ``DelayedOperation`` watched on its
  topic, its timeout a timer on the wheel; a publish calls
  ``purgatory.check_and_complete(topic)``, which completes exactly the polls whose
  ``min_bytes`` are now met, without waking the others. Runs on asyncio, uvloop
  (uvicorn) and trio (hypercorn).
* ``wait_for``: the baseline most asyncio code would write: every poll waits with
  ``asyncio.wait_for(topic_event.wait(), remaining)``; a publish sets the topic's
  event, every waiter wakes, re-checks its ``min_bytes`` and parks again with the time
  it has left. asyncio and uvloop only.

Run it::

    python examples/longpoll/server.py --host 127.0.0.1 --port 8080
    python examples/longpoll/server.py --backend trio --port 8080
    python examples/longpoll/server.py --mode wait_for --backend uvloop --port 8081

``--port 0`` picks a free port; the first line on stdout is always
``listening on http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aiowheel import Timer
from aiowheel.purgatory import DelayedOperation, Purgatory

__all__ = ["LongPollService", "MessageLog", "create_app", "main", "serving"]

MAX_WAIT_MS_LIMIT = 30_000  # below common proxy idle timeouts (nginx: 60 s)
DEFAULT_MAX_WAIT_MS = 500  # Kafka's fetch.max.wait.ms
DEFAULT_MIN_BYTES = 1  # Kafka's fetch.min.bytes
MIN_BYTES_LIMIT = 2**31 - 1
# Kafka's legal topic names: 1 to 249 of these characters.
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
POLL_PARAMETERS = ("offset", "max_wait_ms", "min_bytes")
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only; int() would take "٣" or " 3"


class BadRequest(Exception):
    """A client error, answered as ``{"error": message, "parameter": name}``."""

    def __init__(self, status: int, parameter: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.parameter = parameter
        self.message = message
        self.extra = extra

    def response(self) -> JSONResponse:
        body = {"error": self.message, "parameter": self.parameter, **self.extra}
        return JSONResponse(body, status_code=self.status)


# -- the log -----------------------------------------------------------------------------


class Topic:
    """One topic's messages, with cumulative sizes so that "how many bytes at or after
    offset o" is O(1) (the question every poll's ``try_complete`` asks)."""

    __slots__ = ("base", "messages", "sizes")

    def __init__(self) -> None:
        self.base = 0  # offset of messages[0]
        self.messages: list[str] = []
        # sizes[i] = bytes in messages[:i]; len(sizes) == len(messages) + 1.
        self.sizes = [0]

    @property
    def end(self) -> int:
        """The offset the next message will get."""
        return self.base + len(self.messages)

    def append(self, message: str, size: int, retention: int) -> int:
        offset = self.end
        self.messages.append(message)
        self.sizes.append(self.sizes[-1] + size)
        if len(self.messages) > 2 * retention:
            # Drop the oldest half at once: O(retention) every retention appends.
            cut = len(self.messages) - retention
            del self.messages[:cut]
            dropped = self.sizes[cut]
            self.sizes = [s - dropped for s in self.sizes[cut:]]
            self.base += cut
        return offset

    def bytes_from(self, offset: int) -> int:
        index = offset - self.base
        if index >= len(self.messages):
            return 0
        return self.sizes[-1] - self.sizes[max(index, 0)]

    def read(self, offset: int, limit: int) -> tuple[list[str], int]:
        index = max(offset - self.base, 0)
        batch = self.messages[index : index + limit]
        return batch, max(offset, self.base) + len(batch)


class MessageLog:
    """Topics by name, created by their first message."""

    def __init__(self, retention: int) -> None:
        self.retention = retention
        self.topics: dict[str, Topic] = {}

    def append(self, name: str, message: str, size: int) -> int:
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic()
        return topic.append(message, size, self.retention)

    def bytes_from(self, name: str, offset: int) -> int:
        topic = self.topics.get(name)
        return 0 if topic is None else topic.bytes_from(offset)

    def read(self, name: str, offset: int, limit: int) -> tuple[list[str], int]:
        topic = self.topics.get(name)
        if topic is None:
            return [], offset
        return topic.read(offset, limit)

    def check_retained(self, name: str, offset: int) -> None:
        topic = self.topics.get(name)
        if topic is not None and offset < topic.base:
            raise BadRequest(
                410,
                "offset",
                f"offset {offset} of topic {name!r} is no longer retained",
                earliest=topic.base,
            )


# -- a poll in the purgatory ---------------------------------------------------------------


class Fetch(DelayedOperation):
    """One waiting poll: Kafka's DelayedFetch.

    ``on_complete`` builds the answer (like Kafka's ``onComplete`` building the fetch
    response) and cancels the scope in which the request handler waits, which wakes
    the handler. The handler waits by reading ``receive()``, so a client that goes
    away wakes it too: one task per poll, nothing spawned to watch the connection.
    """

    __slots__ = (
        "abandoned",
        "expired",
        "limit",
        "log",
        "min_bytes",
        "offset",
        "result",
        "scope",
        "topic",
    )

    def __init__(
        self, log: MessageLog, topic: str, offset: int, min_bytes: int, timeout: float, limit: int
    ) -> None:
        super().__init__(timeout)
        self.log = log
        self.topic = topic
        self.offset = offset
        self.min_bytes = min_bytes
        self.limit = limit
        self.result: tuple[list[str], int] | None = None
        self.scope: anyio.CancelScope | None = None
        self.abandoned = False  # the client went away: nothing to build
        self.expired = False

    def try_complete(self) -> bool:
        if self.log.bytes_from(self.topic, self.offset) >= self.min_bytes:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        if self.abandoned:
            return
        self.result = self.log.read(self.topic, self.offset, self.limit)
        if self.scope is not None:
            self.scope.cancel()

    def on_expiration(self) -> None:
        self.expired = True


# -- the service --------------------------------------------------------------------------


class LongPollService:
    """The message log, the parking strategy and the counters behind ``/stats``."""

    def __init__(
        self,
        mode: str = "purgatory",
        *,
        max_body_bytes: int = 1 << 20,
        max_messages: int = 1000,
        retention: int = 100_000,
        tick: float = 0.001,
    ) -> None:
        if mode not in ("purgatory", "wait_for"):
            raise ValueError(f"mode must be 'purgatory' or 'wait_for', got {mode!r}")
        for name, value in (
            ("max_body_bytes", max_body_bytes),
            ("max_messages", max_messages),
            ("retention", retention),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.mode = mode
        self.max_body_bytes = max_body_bytes
        self.max_messages = max_messages
        self.tick = tick
        self.log = MessageLog(retention)
        self.purgatory: Purgatory | None = None
        self.backend = ""
        # wait_for mode: one event per topic with waiters, replaced on each publish.
        self._events: dict[str, asyncio.Event] = {}
        self._waiting = 0  # wait_for mode's parked polls
        self.immediate = 0  # answered without parking
        self.completed = 0  # parked, answered because data arrived
        self.expired = 0  # parked, answered empty-handed or short at max_wait_ms
        self.disconnected = 0  # parked, client went away first
        self.published = 0

    # -- lifecycle (the app's lifespan) --

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self.backend = current_backend()
        if self.mode == "wait_for":
            if self.backend == "trio":
                raise RuntimeError("--mode wait_for parks polls on asyncio.wait_for: not on trio")
            yield
            return
        async with Timer(tick=self.tick) as timer:
            with Purgatory(timer, name="fetch") as purgatory:
                self.purgatory = purgatory
                try:
                    yield
                finally:
                    self.purgatory = None

    # -- counters --

    def parked(self) -> int:
        if self.purgatory is not None:
            return self.purgatory.delayed()
        return self._waiting

    def stats(self) -> dict[str, Any]:
        answered = self.immediate + self.completed + self.expired
        return {
            "mode": self.mode,
            "backend": self.backend,
            "parked": self.parked(),
            "immediate": self.immediate,
            "completed": self.completed,
            "expired": self.expired,
            "disconnected": self.disconnected,
            "answered": answered,
            "published": self.published,
            "watched": self.purgatory.watched() if self.purgatory is not None else None,
            # How late the wheel fired expiries at worst: tells server-side lateness
            # from the HTTP round trip and the scheduling of a busy machine.
            "timer_lateness_max_ms": (
                self.purgatory.timer.stats().lateness_max * 1000
                if self.purgatory is not None
                else None
            ),
            "topics": len(self.log.topics),
            "cpu_time": time.process_time(),
        }

    # -- publishing --

    def publish(self, topic: str, message: str, size: int) -> int:
        offset = self.log.append(topic, message, size)
        self.published += 1
        if self.purgatory is not None:
            self.purgatory.check_and_complete(topic)
        else:
            event = self._events.pop(topic, None)
            if event is not None:
                event.set()
        return offset

    # -- polling --

    def answer(self, result: tuple[list[str], int]) -> Response:
        messages, next_offset = result
        return _json({"messages": messages, "next_offset": next_offset})

    async def poll_purgatory(
        self, request: Request, topic: str, offset: int, max_wait_ms: int, min_bytes: int
    ) -> Response:
        purgatory = self.purgatory
        assert purgatory is not None
        op = Fetch(self.log, topic, offset, min_bytes, max_wait_ms / 1000, self.max_messages)
        if purgatory.try_complete_else_watch(op, (topic,)):
            self.immediate += 1
            assert op.result is not None
            return self.answer(op.result)
        # Parked. Wait for whichever comes first: the operation completes (on_complete
        # cancels this scope) or the client disconnects (receive() says so). Reading
        # receive() ourselves is what lets a dropped poll leave the purgatory at once.
        try:
            with anyio.CancelScope() as scope:
                op.scope = scope
                receive = request.receive
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        break
        finally:
            if not op.is_completed():
                # Disconnected, or this handler is being cancelled (server shutdown):
                # take the poll out now rather than leave it parked until its timeout.
                op.abandoned = True
                if op.force_complete():
                    self.disconnected += 1
        if op.abandoned:
            return Response(status_code=204)  # nobody is listening
        if op.expired:
            self.expired += 1
        else:
            self.completed += 1
        assert op.result is not None
        return self.answer(op.result)

    async def poll_wait_for(
        self, request: Request, topic: str, offset: int, max_wait_ms: int, min_bytes: int
    ) -> Response:
        log = self.log
        if log.bytes_from(topic, offset) >= min_bytes:
            self.immediate += 1
            return self.answer(log.read(topic, offset, self.max_messages))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch_disconnect() -> None:
            nonlocal gone
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    task.cancel()
                    return

        watcher = loop.create_task(watch_disconnect())
        self._waiting += 1
        expired = False
        try:
            while log.bytes_from(topic, offset) < min_bytes:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    expired = True
                    break
                event = self._events.get(topic)
                if event is None:
                    event = self._events[topic] = asyncio.Event()
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    expired = True
                    break
        except asyncio.CancelledError:
            if not gone:
                raise
        finally:
            self._waiting -= 1
            watcher.cancel()
            if gone and task.cancelling():
                task.uncancel()  # our own cancellation, from watch_disconnect
        if gone:
            self.disconnected += 1
            return Response(status_code=204)
        if expired:
            self.expired += 1
        else:
            self.completed += 1
        return self.answer(log.read(topic, offset, self.max_messages))


def current_backend() -> str:
    """``"asyncio"``, ``"uvloop"`` or ``"trio"``: the event loop running this code."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return "trio"  # anyio runs us on asyncio or trio; not asyncio, so trio
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def _json(body: Any, status: int = 200) -> Response:
    # Compact separators: smaller answers, and the same encoding in both modes.
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(data, status_code=status, media_type="application/json")


# -- request parsing ------------------------------------------------------------------------


def parse_topic(request: Request) -> str:
    name: str = request.path_params.get("topic", "")
    if not name:
        raise BadRequest(400, "topic", "the topic name must not be empty")
    if not TOPIC_NAME.fullmatch(name):
        raise BadRequest(
            400,
            "topic",
            "a topic name is 1 to 249 characters from A-Z, a-z, 0-9, '.', '_' and '-'",
        )
    return name


def _integer(parameter: str, raw: str | None, default: int | None, low: int, high: int) -> int:
    if raw is None:
        if default is None:
            raise BadRequest(400, parameter, f"{parameter} is required")
        return default
    if not _DIGITS.fullmatch(raw):
        if raw.startswith("-") and _DIGITS.fullmatch(raw[1:]):
            raise BadRequest(400, parameter, f"{parameter} must not be negative, got {raw!r}")
        raise BadRequest(400, parameter, f"{parameter} must be an integer, got {raw!r}")
    value = int(raw)
    if not low <= value <= high:
        raise BadRequest(
            400, parameter, f"{parameter} must be between {low} and {high}, got {value}"
        )
    return value


def parse_poll(request: Request) -> tuple[int, int, int]:
    """``(offset, max_wait_ms, min_bytes)`` from the query string, validated by hand so
    that every error names its parameter."""
    seen: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name not in POLL_PARAMETERS:
            raise BadRequest(400, name, f"unknown query parameter {name!r}")
        if name in seen:
            raise BadRequest(400, name, f"query parameter {name!r} given more than once")
        seen[name] = value
    offset = _integer("offset", seen.get("offset"), 0, 0, 2**62)
    max_wait_ms = _integer(
        "max_wait_ms", seen.get("max_wait_ms"), DEFAULT_MAX_WAIT_MS, 0, MAX_WAIT_MS_LIMIT
    )
    min_bytes = _integer("min_bytes", seen.get("min_bytes"), DEFAULT_MIN_BYTES, 0, MIN_BYTES_LIMIT)
    return offset, max_wait_ms, min_bytes


# How much of an oversized body we still read (and drop) before answering 413.
DRAIN_BYTES = 1 << 20


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 once it is known to exceed ``limit``.

    An answer sent while the client is still sending its body is often lost: the
    server closes a connection that has unread data, the kernel resets it, and the
    client's kernel drops the answer the client has not read yet ("server disconnected
    without sending a response"). So a body that is only moderately too large (up to
    ``DRAIN_BYTES`` more) is read to its end and dropped before the 413 goes out;
    beyond that we answer at once and let the connection go.
    """
    too_large = BadRequest(413, "body", f"the body exceeds {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + DRAIN_BYTES:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit + DRAIN_BYTES:
            break
        if size <= limit:
            chunks.append(chunk)
    if size > limit:
        raise too_large
    return b"".join(chunks)


# -- the app ----------------------------------------------------------------------------------


def create_app(
    mode: str = "purgatory",
    *,
    max_body_bytes: int = 1 << 20,
    max_messages: int = 1000,
    retention: int = 100_000,
    tick: float = 0.001,
) -> Starlette:
    """The ASGI app. ``app.state.longpoll`` is its ``LongPollService``."""
    service = LongPollService(
        mode,
        max_body_bytes=max_body_bytes,
        max_messages=max_messages,
        retention=retention,
        tick=tick,
    )
    park = service.poll_purgatory if mode == "purgatory" else service.poll_wait_for

    async def poll(request: Request) -> Response:
        try:
            topic = parse_topic(request)
            offset, max_wait_ms, min_bytes = parse_poll(request)
            service.log.check_retained(topic, offset)
        except BadRequest as error:
            return error.response()
        return await park(request, topic, offset, max_wait_ms, min_bytes)

    async def publish(request: Request) -> Response:
        try:
            topic = parse_topic(request)
            for name, _ in request.query_params.multi_items():
                raise BadRequest(400, name, f"unknown query parameter {name!r}")
            body = await read_body(request, service.max_body_bytes)
            if not body:
                raise BadRequest(400, "body", "the message (request body) must not be empty")
            try:
                message = body.decode()
            except UnicodeDecodeError:
                raise BadRequest(400, "body", "the message must be UTF-8 text") from None
        except BadRequest as error:
            return error.response()
        return _json({"offset": service.publish(topic, message, len(body))})

    async def stats(request: Request) -> Response:
        return _json(service.stats())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service.running():
            yield

    routes = [
        Route("/topics/{topic:path}", poll, methods=["GET"]),
        Route("/topics/{topic:path}", publish, methods=["POST"]),
        # "/topics" alone: the empty topic name, answered like "/topics/".
        Route("/topics", poll, methods=["GET"]),
        Route("/topics", publish, methods=["POST"]),
        Route("/stats", stats, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.longpoll = service
    return app


# -- serving ------------------------------------------------------------------------------------


@asynccontextmanager
async def serving(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` in this event loop while the block runs; yields the base URL.

    uvicorn on asyncio and uvloop, hypercorn on trio. For tests and embedding: the
    command line (``main``) lets each server own the process and its signals.
    """
    if current_backend() == "trio":
        from functools import partial

        import hypercorn.config
        import hypercorn.trio
        import trio

        config = hypercorn.config.Config()
        config.bind = [f"{host}:{port}"]
        config.backlog = 2048
        config.graceful_timeout = 1.0
        config.accesslog = None
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(hypercorn.trio.serve, _asgi(app), config, shutdown_trigger=stop.wait)
            )
            try:
                yield str(binds[0])
            finally:
                stop.set()
        return

    import uvicorn

    sock = _listening_socket(host, port)
    server = uvicorn.Server(_uvicorn_config(app, "none"))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # startup failed: raise its error
                raise RuntimeError("uvicorn exited during startup")
            await asyncio.sleep(0.001)
        yield _url(sock)
    finally:
        server.should_exit = True
        await task


def _asgi(app: Starlette) -> Any:
    # Starlette's and hypercorn's ASGI type declarations differ in detail only.
    return app


def _listening_socket(host: str, port: int) -> socket.socket:
    # proto=IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets
    # whose proto says TCP. Without it, Nagle holds the body of an answer back until
    # the client's delayed ACK of the headers arrives (~40 ms on Linux).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_config(app: Starlette, loop: str) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        loop=loop,
        http="h11",
        lifespan="on",
        log_level="warning",
        access_log=False,
        backlog=2048,
        timeout_graceful_shutdown=1,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--backend", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    parser.add_argument("--mode", choices=("purgatory", "wait_for"), default="purgatory")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-messages", type=int, default=1000, help="per answer")
    parser.add_argument("--retention", type=int, default=100_000, help="messages per topic")
    parser.add_argument("--tick-ms", type=float, default=1.0, help="the timer's tick")
    args = parser.parse_args(argv)
    if args.mode == "wait_for" and args.backend == "trio":
        parser.error("--mode wait_for uses asyncio.wait_for: choose --backend asyncio or uvloop")
    app = create_app(
        args.mode,
        max_body_bytes=args.max_body_bytes,
        max_messages=args.max_messages,
        retention=args.retention,
        tick=args.tick_ms / 1000,
    )
    sock = _listening_socket(args.host, args.port)
    announce: Callable[[], None] = lambda: print(f"listening on {_url(sock)}", flush=True)  # noqa: E731
    if args.backend == "trio":
        import hypercorn.config
        import hypercorn.trio
        import trio

        config = hypercorn.config.Config()
        config.accesslog = None
        config.graceful_timeout = 1.0
        # hypercorn binds its own socket: hand it ours by file descriptor.
        config.bind = [f"fd://{sock.fileno()}"]
        announce()
        try:
            trio.run(hypercorn.trio.serve, _asgi(app), config)
        except KeyboardInterrupt:
            pass
        return
    import uvicorn

    announce()
    try:
        uvicorn.Server(_uvicorn_config(app, args.backend)).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the SIGINT it handled, once it has shut down


if __name__ == "__main__":
    main(sys.argv[1:])
