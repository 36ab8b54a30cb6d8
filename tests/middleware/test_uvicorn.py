"""uvicorn_protocol end to end: uvicorn in-process on 127.0.0.1 port 0, raw sockets.

What only the connection level sees: a client that connects and says nothing, a
keep-alive gap, a slowloris request head, a reset. uvicorn runs on asyncio and uvloop
in real time (this module overrides ``anyio_backend``; uvicorn needs asyncio).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from support import (
    SLACK,
    TICK,
    T,
    assert_idle_window,
    eventually,
    read_until_closed,
    serve_uvicorn,
)
from uvicorn.protocols.http.h11_impl import H11Protocol

from aiowheel import Timer
from aiowheel.middleware import IdleTimeoutMiddleware, get_shared_timer, uvicorn_protocol

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    # Real time (no looptime): real sockets and a real server.
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


async def index(request: Request) -> Response:
    return PlainTextResponse(f"ok {request.client.port if request.client else 0}")


async def sleep(request: Request) -> Response:
    await anyio.sleep(float(request.query_params["s"]))
    return PlainTextResponse("slept")


async def ws_quiet(websocket: WebSocket) -> None:
    await websocket.accept()
    await anyio.sleep(2 * T)
    await websocket.send_text("still here")
    await websocket.close()


APP = Starlette(routes=[Route("/", index), Route("/sleep", sleep), WebSocketRoute("/ws", ws_quiet)])


@asynccontextmanager
async def serving(app: Any, protocol: type[asyncio.Protocol], **config: Any) -> AsyncIterator[int]:
    # uvicorn's own keep-alive closes after 5 s; make it irrelevant here.
    options: dict[str, Any] = {"timeout_keep_alive": 60, **config}
    async with serve_uvicorn(app, http=protocol, **options) as port:
        yield port


@asynccontextmanager
async def guarded(**options: Any) -> AsyncIterator[tuple[int, Timer]]:
    async with Timer(tick=TICK) as timer:
        protocol = uvicorn_protocol(timeout=T, timer=timer, **options)
        async with serving(APP, protocol) as port:
            yield port, timer
        assert len(timer) == 0


def reset_on_close(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


async def test_silent_connection_is_closed() -> None:
    async with guarded() as (port, _):
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await read_until_closed(reader)
        elapsed = anyio.current_time() - start
        writer.close()
    assert data == b""  # a clean close: nothing was pending
    assert_idle_window(elapsed)


async def test_slowloris_request_head_is_dropped() -> None:
    # One header byte every T/2: each byte is activity, but a request head gets
    # header_timeout (default: timeout) from its first byte, however it trickles.
    async with guarded() as (port, _):
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = 0

        async def trickle() -> None:
            nonlocal sent
            for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: yes\r\n\r\n":
                writer.write(bytes([byte]))
                sent += 1
                await asyncio.sleep(T / 2)

        trickler = asyncio.create_task(trickle())
        data = await read_until_closed(reader)
        elapsed = anyio.current_time() - start
        trickler.cancel()
        writer.close()
    assert data in (b"", b"<reset>")
    assert sent >= 2  # it was talking, and still dropped
    assert_idle_window(elapsed)


async def test_header_timeout_shorter_than_idle_timeout() -> None:
    async with guarded(header_timeout=T / 2) as (port, _):
        # Silent: the idle timeout applies.
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await read_until_closed(reader)
        silent = anyio.current_time() - start
        writer.close()
        # A partial head: header_timeout after its first byte.
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n")
        await read_until_closed(reader)
        partial = anyio.current_time() - start
        writer.close()
    assert_idle_window(silent, T)
    assert_idle_window(partial, T / 2)


async def test_keep_alive_gap_is_closed_after_the_response() -> None:
    async with guarded() as (port, _):
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await read_until_closed(reader)
        elapsed = anyio.current_time() - start
        writer.close()
    assert data.startswith(b"HTTP/1.1 200 ")
    assert data.endswith(b"ok " + str(writer.get_extra_info("sockname")[1]).encode())
    assert_idle_window(elapsed)


async def test_uvicorn_keep_alive_is_a_store_on_the_connection_filing(expiries: Any) -> None:
    # uvicorn arms a loop timer after every response (timeout_keep_alive) and cancels
    # it on the next request; behind uvicorn_protocol that is a store on the
    # connection's filing, which closes the gap at the earlier of the two deadlines.
    loop = asyncio.get_running_loop()
    async with Timer(tick=TICK) as timer:
        # Ours is long: only uvicorn's keep-alive explains a close after T.
        protocol = uvicorn_protocol(timeout=10 * T, timer=timer)
        async with serving(APP, protocol, timeout_keep_alive=T) as port:
            start = anyio.current_time()  # before the request: precedes the response
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"ok ")).startswith(b"HTTP/1.1 200")
            if hasattr(loop, "_scheduled"):  # asyncio (not uvloop): look in its heap
                armed = [
                    h
                    for h in loop._scheduled
                    if not h.cancelled()
                    and getattr(h._callback, "__name__", "") == "timeout_keep_alive_handler"
                ]
                assert armed == []
            data = await read_until_closed(reader)
            elapsed = anyio.current_time() - start
            writer.close()
    assert not data.endswith(b"<reset>")  # closed, not aborted: nothing was pending
    assert_idle_window(elapsed, T)
    assert expiries.count == 1  # by the connection's filing, not uvicorn's timer


async def test_active_keep_alive_client_and_long_request_are_not_dropped() -> None:
    async with guarded() as (port, timer):

        async def keep_alive_client() -> None:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                answers = set()
                for _ in range(6):  # 3 T of requests, T/2 apart
                    response = await client.get("/")
                    assert response.status_code == 200
                    answers.add(response.text)
                    await asyncio.sleep(T / 2)
            assert len(answers) == 1  # one connection all along

        async def long_request() -> None:
            # In flight: the application's business, not the connection's.
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                response = await client.get("/sleep", params={"s": 3 * T})
            assert response.text == "slept"

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_alive_client)
            tg.start_soon(long_request)
        # The clients closed their connections: nothing left to time.
        await eventually(lambda: len(timer) == 0, within=2)


async def test_websocket_upgrade_is_no_longer_timed_by_the_connection() -> None:
    from websockets.asyncio.client import connect

    async with guarded() as (port, timer), connect(f"ws://127.0.0.1:{port}/ws") as ws:
        assert len(timer) == 0  # handed to the websocket protocol: not ours
        assert await ws.recv() == "still here"  # after 2 T of silence


async def test_client_reset_cancels_every_timer() -> None:
    loop = asyncio.get_running_loop()
    # A long timeout: only the reset can explain the timers going away in time.
    async with Timer(tick=TICK) as timer:
        protocol = uvicorn_protocol(timeout=30, timer=timer)
        async with serving(APP, protocol, timeout_keep_alive=30) as port:
            # After a response (uvicorn's own keep-alive timer armed too).
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"ok ")).startswith(b"HTTP/1.1 200")
            # And in the middle of a request head.
            _, writer2 = await asyncio.open_connection("127.0.0.1", port)
            writer2.write(b"GET / HTTP/1.1\r\nHo")
            await eventually(lambda: len(timer) == 2, within=5)
            for w in (writer, writer2):
                reset_on_close(w)
                w.close()
            await eventually(lambda: len(timer) == 0, within=2)
            assert timer.stats().fired == 0
            if hasattr(loop, "_scheduled"):  # asyncio (not uvloop): look in its heap
                # uvicorn alone leaks its keep-alive handle after a reset.
                leaked = [
                    h
                    for h in loop._scheduled
                    if not h.cancelled()
                    and getattr(h._callback, "__name__", "") == "timeout_keep_alive_handler"
                ]
                assert leaked == []


async def test_shared_timer_is_started_lazily_by_the_first_connection() -> None:
    protocol = uvicorn_protocol(timeout=T)  # no timer: the loop's shared one
    async with serving(APP, protocol) as port:
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await read_until_closed(reader)
        elapsed = anyio.current_time() - start
        writer.close()
        timer = await get_shared_timer()
        assert len(timer) == 0
    assert_idle_window(elapsed)


async def test_with_the_asgi_middleware_on_the_lifespan_timer() -> None:
    # The full stack a user would deploy: both layers share the lifespan's timer.
    seen: list[Timer] = []

    async def upload(request: Request) -> Response:
        seen.append(await get_shared_timer())
        return PlainTextResponse(f"got {len(await request.body())}")

    app = IdleTimeoutMiddleware(Starlette(routes=[Route("/", upload, methods=["POST"])]), timeout=T)
    async with serving(app, uvicorn_protocol(timeout=T), lifespan="on") as port:
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nabc")
        answer = await read_until_closed(reader)
        elapsed = anyio.current_time() - start
        writer.close()
        assert len(seen[0]) == 0
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert_idle_window(elapsed)
    assert seen[0].closed  # closed by the lifespan, with the server


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_client_that_stops_reading_is_dropped_in_one_timeout_and_one_line() -> None:
    # Issue 28, finding 19: the middleware raised IdleTimeoutError, uvicorn logged a
    # full traceback for it, then closed the connection gracefully, and that close
    # waited for the peer to read until the protocol's own timer aborted it: two
    # timeouts. Now the middleware aborts the connection through the protocol, at
    # once, and logs one line.
    async def endless(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            while True:
                yield b"x" * 65536

        return StreamingResponse(chunks())

    records = _Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "aiowheel.middleware")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        async with Timer(tick=TICK) as timer:
            app = IdleTimeoutMiddleware(
                Starlette(routes=[Route("/", endless)]), timeout=T, timer=timer
            )
            # The connection's timeout is long: only the middleware can explain a drop.
            protocol = uvicorn_protocol(timeout=20 * T, timer=timer)
            async with serving(app, protocol, log_level="warning") as port:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=65536)
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                await reader.readuntil(b"\r\n\r\n")  # the response started; stop reading
                start = anyio.current_time()  # at most T after this the sends stall
                await eventually(lambda: len(timer) == 0, within=20 * T)
                elapsed = anyio.current_time() - start
                data = await read_until_closed(reader)  # what was in flight, then the end
                writer.close()
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    assert data.endswith(b"<reset>") or len(data) < 64 * 1024 * 1024
    assert elapsed < 2 * T + TICK + SLACK / 2, elapsed  # one timeout, not two
    lines = [(r.name, r.levelno, r.getMessage()) for r in records.records]
    assert lines == [
        ("aiowheel.middleware", logging.WARNING, f"aborted a response idle for more than {T} s")
    ]
    assert all(r.exc_info is None for r in records.records)


async def test_a_request_behind_the_protocol_arms_nothing_and_outlives_its_connection() -> None:
    # The connection's filing times the request in flight (nothing is filed per
    # request); when the connection goes away under a request whose application
    # ignores it, the request takes a filing of its own and is still cancelled at its
    # deadline.
    started = asyncio.Event()
    ended = asyncio.Event()
    cancelled: list[float] = []

    async def stuck(request: Request) -> Response:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(anyio.current_time())
            ended.set()
        raise AssertionError("unreachable")  # pragma: no cover

    async with Timer(tick=TICK) as timer:
        app = IdleTimeoutMiddleware(Starlette(routes=[Route("/", stuck)]), timeout=T, timer=timer)
        # The connection's own timeout is long: only the request's can explain a drop.
        protocol = uvicorn_protocol(timeout=20 * T, timer=timer)
        async with serving(app, protocol) as port:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            start = anyio.current_time()  # before the request: precedes its deadline
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            with anyio.fail_after(10):
                await started.wait()
            assert len(timer) == 1  # the connection's filing, and nothing for the request
            reset_on_close(writer)
            writer.close()  # the client goes away; the application does not notice
            with anyio.fail_after(20 * T):
                await ended.wait()
            await eventually(lambda: len(timer) == 0, within=2)
    assert_idle_window(cancelled[0] - start)


def small_window_socket() -> socket.socket:
    """A client socket with a tiny receive buffer (set before connecting, so that the
    window it announces is small): a peer that stops reading leaves the server's
    output in the server's kernel."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


async def test_aborted_slow_reader_gets_a_reset_not_a_queued_close() -> None:
    # A plain abort() closes a socket with unsent output, and the kernel queues the
    # FIN behind it: the connection sat in FIN_WAIT1 holding megabytes per client.
    # The abort of a connection the timeout gave up on now sets SO_LINGER 0 first,
    # so the client sees a reset (and the server's buffers are dropped).
    async def endless(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            while True:
                yield b"x" * 65536

        return StreamingResponse(chunks())

    ended = asyncio.Event()
    async with Timer(tick=TICK) as timer:
        inner = IdleTimeoutMiddleware(
            Starlette(routes=[Route("/", endless)]), timeout=T, timer=timer
        )

        async def app(scope: Any, receive: Any, send: Any) -> None:
            try:
                await inner(scope, receive, send)
            finally:
                if scope["type"] == "http":
                    ended.set()  # after the middleware's abort, connection_lost seen

        # The connection's timeout is long: the middleware gives up on the response.
        protocol = uvicorn_protocol(timeout=20 * T, timer=timer)
        async with serving(app, protocol) as port:
            sock = small_window_socket()
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            with anyio.fail_after(20 * T):
                await ended.wait()  # never reading meanwhile
            data = await read_until_closed(reader)
            writer.close()
    assert data.endswith(b"<reset>"), (len(data), data[-40:])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeout": 0}, ValueError),
        ({"timeout": float("inf")}, ValueError),
        ({"timeout": "1"}, TypeError),
        ({"timeout": 1, "header_timeout": -1}, ValueError),
        ({"timeout": 1, "header_timeout": float("nan")}, ValueError),
        ({"timeout": 1, "timer": "shared"}, TypeError),
        ({"timeout": 1, "base": "zttp"}, ValueError),
        ({"timeout": 1, "base": asyncio.Protocol}, ValueError),
    ],
)
def test_bad_configuration_raises(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        uvicorn_protocol(**kwargs)


def test_bases() -> None:
    if importlib.util.find_spec("httptools") is None:
        with pytest.raises(ImportError, match="httptools"):
            uvicorn_protocol(timeout=1, base="httptools")
        assert issubclass(uvicorn_protocol(timeout=1), H11Protocol)  # auto: h11
    else:  # pragma: no cover - not installed here
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        assert issubclass(uvicorn_protocol(timeout=1, base="httptools"), HttpToolsProtocol)

    class Custom(H11Protocol):
        pass

    custom = uvicorn_protocol(timeout=2, header_timeout=1, base=Custom)
    assert issubclass(custom, Custom)
    assert custom.idle_timeout == 2.0  # type: ignore[attr-defined]
    assert custom.header_timeout == 1.0  # type: ignore[attr-defined]
    assert issubclass(uvicorn_protocol(timeout=1, base="h11"), H11Protocol)


def _loop_factory(name: str) -> Any:
    import uvloop

    import aiowheel

    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        return uvloop.new_event_loop
    return lambda: aiowheel.new_event_loop(base=name.removeprefix("aiowheel-"))


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop", "aiowheel-asyncio", "aiowheel-uvloop"])
def test_no_protocol_outlives_a_reset_connection(loop_name: str) -> None:
    # Issue 28, finding 17: uvicorn's keep-alive handle was cancelled only when it was
    # an asyncio.TimerHandle; uvloop's handles and the drop-in loop's LoopTimerHandle
    # are not, so after a reset the handle (and through its callback the protocol)
    # lived until timeout_keep_alive (30 s here). Plain asyncio is the control.
    import gc
    import weakref

    alive: weakref.WeakSet[asyncio.Protocol] = weakref.WeakSet()
    base = uvicorn_protocol(timeout=30, timer=None)

    class Tracked(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            alive.add(self)
            super().connection_made(transport)

    async def main() -> None:
        async with Timer(tick=TICK) as timer:
            Tracked.idle_timer = timer
            async with serving(APP, Tracked, timeout_keep_alive=30) as port:
                writers = []
                for _ in range(5):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert (await reader.readuntil(b"ok ")).startswith(b"HTTP/1.1 200")
                    writers.append(writer)
                assert len(alive) == 5
                for writer in writers:
                    reset_on_close(writer)
                    writer.close()
                await eventually(lambda: len(timer) == 0, within=5)
                # The server has seen every reset; nothing but a leaked handle refers
                # to the protocols now.
                await eventually(lambda: gc.collect() >= 0 and len(alive) == 0, within=5)

    with asyncio.Runner(loop_factory=_loop_factory(loop_name)) as runner:
        runner.run(main())


WS_HANDSHAKE = (
    b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


# uvicorn's "websockets" implementation is the legacy one, deprecated by websockets.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The `websockets` implementation is deprecated")
@pytest.mark.parametrize("ws", ["websockets", "websockets-sansio", "wsproto"])
async def test_websocket_whose_peer_stops_reading_is_aborted(ws: str) -> None:
    # Issue 28, finding 16: the middleware expired and cancelled the application,
    # then its own websocket.close waited for the paused transport for ever. The
    # close is now bounded by the timeout, and the connection aborted after it.
    async def flood(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            await websocket.send_bytes(b"x" * 65536)

    records = _Records()
    logger = logging.getLogger("aiowheel.middleware")
    logger.addHandler(records)
    ended = asyncio.Event()
    try:
        async with Timer(tick=TICK) as timer:
            inner = IdleTimeoutMiddleware(
                Starlette(routes=[WebSocketRoute("/ws", flood)]), timeout=T, timer=timer
            )

            async def app(scope: Any, receive: Any, send: Any) -> None:
                try:
                    await inner(scope, receive, send)
                finally:
                    if scope["type"] == "websocket":
                        ended.set()

            protocol = uvicorn_protocol(timeout=20 * T, timer=timer)
            async with serving(app, protocol, ws=ws) as port:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=65536)
                writer.write(WS_HANDSHAKE)
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
                start = anyio.current_time()  # we stop reading here
                # The server's sends stall within a moment, then the middleware's
                # timeout, then at most one more for the close frame.
                with anyio.fail_after(3 * T + SLACK):
                    await ended.wait()
                elapsed = anyio.current_time() - start
                data = await read_until_closed(reader)
                writer.close()
                await eventually(lambda: len(timer) == 0, within=2)
    finally:
        logger.removeHandler(records)
    # (No lower bound: the server's sends may have stalled before we read the 101.)
    assert elapsed < 3 * T + SLACK
    # Aborted: what was in flight, then a reset (or the end), and no close frame
    # after it can be read as a clean close; the server side is gone.
    assert data.endswith(b"<reset>") or len(data) < 64 * 1024 * 1024
    assert [r.getMessage() for r in records.records if r.levelno >= logging.WARNING] == [
        f"aborted a websocket whose close was not taken within {T} s"
    ]


async def test_trickled_body_is_cut_off_end_to_end() -> None:
    # Issue 28, finding 15, as slowhttptest -B sends it: a chunked body, one small
    # chunk every T/2 (activity each time), against a server that reads its body.
    async def upload(request: Request) -> Response:
        return PlainTextResponse(f"got {len(await request.body())}")

    async with Timer(tick=TICK) as timer:
        app = IdleTimeoutMiddleware(
            Starlette(routes=[Route("/", upload, methods=["POST"])]), timeout=T, timer=timer
        )
        async with serving(app, uvicorn_protocol(timeout=T, timer=timer)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            start = anyio.current_time()  # before the first chunk: precedes the deadline

            async def trickle() -> None:
                for _ in range(40):  # 20 T of it, if nothing cuts it off
                    writer.write(b"1\r\nx\r\n")
                    await asyncio.sleep(T / 2)

            trickler = asyncio.create_task(trickle())
            with anyio.fail_after(10):
                # The head first: the trickler's next chunk after the server closed
                # draws a reset, which would hide what was read before it.
                head = await reader.readuntil(b"\r\n\r\n")
            await read_until_closed(reader)
            elapsed = anyio.current_time() - start
            trickler.cancel()
            writer.close()
    assert head.startswith(b"HTTP/1.1 408 ")
    assert_idle_window(elapsed, T)
