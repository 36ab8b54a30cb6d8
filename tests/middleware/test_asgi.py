"""IdleTimeoutMiddleware end to end: real servers on 127.0.0.1 port 0, real clients.

uvicorn serves on asyncio and uvloop, hypercorn on trio. Sockets need real time, so
this module runs on real-time backends (it overrides ``anyio_backend``: no looptime,
no MockClock). Timing windows: never before the timeout (strict, measured from before
the client's last action, which precedes any re-arm on the server), and within the
timeout plus one tick plus a generous slack.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from support import TICK, Expiries, T, assert_idle_window, eventually, serve_uvicorn
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    TextMessage,
)
from wsproto.events import (
    Request as WSRequest,
)

from aiowheel import Timer
from aiowheel.middleware import (
    SCOPE_KEY,
    IdleTimeoutMiddleware,
    get_shared_timer,
    set_idle_timeout,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "uvloop", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    # Real time on every backend: the servers and clients use real sockets.
    if request.param == "asyncio":
        return ("asyncio", {})
    if request.param == "uvloop":
        return ("asyncio", {"use_uvloop": True})
    return ("trio", {})


# -- servers ------------------------------------------------------------------------


@asynccontextmanager
async def serving(app: Any, backend: str, *, lifespan: bool = False) -> AsyncIterator[int]:
    """Serve ``app`` in this event loop (uvicorn on asyncio/uvloop, hypercorn on trio)
    and yield its port."""
    if backend == "trio":
        import hypercorn.config
        import hypercorn.trio
        import trio

        config = hypercorn.config.Config()
        config.bind = ["127.0.0.1:0"]
        config.loglevel = "WARNING"
        config.graceful_timeout = 1.0
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(hypercorn.trio.serve, app, config, shutdown_trigger=shutdown.wait)
            )
            try:
                yield int(binds[0].rsplit(":", 1)[1])
            finally:
                shutdown.set()
        return
    async with serve_uvicorn(app, lifespan="on" if lifespan else "off") as port:
        yield port


async def read_until_closed(stream: anyio.abc.ByteStream) -> bytes:
    data = b""
    # Bounded: pytest-timeout's signal cannot interrupt a stuck uvloop.
    with anyio.fail_after(10):
        while True:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return data
            data += chunk


# -- the application --------------------------------------------------------------

background_done: dict[str, anyio.Event] = {}


async def index(request: Request) -> Response:
    return PlainTextResponse(f"ok {request.client.port if request.client else 0}")


async def upload(request: Request) -> Response:
    body = await request.body()
    return PlainTextResponse(f"got {len(body)}")


async def sleep(request: Request) -> Response:
    await anyio.sleep(float(request.query_params["s"]))
    return PlainTextResponse("slept")


async def stall_stream(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first chunk\n"
        await anyio.sleep_forever()

    return StreamingResponse(chunks(), media_type="text/plain")


async def slow_stream(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(6):
            yield f"chunk {i}\n".encode()
            await anyio.sleep(T / 2)

    return StreamingResponse(chunks(), media_type="text/plain")


async def long_poll(request: Request) -> Response:
    # The documented opt-out: no idle timeout for the rest of this request.
    assert set_idle_timeout(request.scope, None) is True
    await anyio.sleep(3 * T)
    return PlainTextResponse("polled")


async def longer(request: Request) -> Response:
    # A route's own, longer timeout.
    assert set_idle_timeout(request.scope, float(request.query_params["timeout"]))
    await anyio.sleep(float(request.query_params["s"]))
    return PlainTextResponse("done")


async def with_background(request: Request) -> Response:
    async def work() -> None:
        await anyio.sleep(3 * T)
        background_done[request.query_params["key"]].set()

    return PlainTextResponse("queued", background=BackgroundTask(work))


async def ws_echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        pass


async def ws_long(websocket: WebSocket) -> None:
    set_idle_timeout(websocket.scope, None)
    await websocket.accept()
    await anyio.sleep(3 * T)
    await websocket.send_text("still here")
    await websocket.close()


def make_app(timer: Timer | None, **options: Any) -> IdleTimeoutMiddleware:
    routes = [
        Route("/", index),
        Route("/upload", upload, methods=["POST"]),
        Route("/sleep", sleep),
        Route("/stall-stream", stall_stream),
        Route("/slow-stream", slow_stream),
        Route("/poll", long_poll),
        Route("/exempt/poll", sleep),
        Route("/exemption", sleep),
        Route("/longer", longer),
        Route("/background", with_background),
        WebSocketRoute("/ws", ws_echo),
        WebSocketRoute("/ws-long", ws_long),
    ]
    return IdleTimeoutMiddleware(Starlette(routes=routes), timeout=T, timer=timer, **options)


@asynccontextmanager
async def app_server(backend: str, **options: Any) -> AsyncIterator[tuple[int, Timer]]:
    """The test application behind the middleware with its own timer; on the way out,
    checks that the timer holds nothing for any request or connection (what is still
    pending is the middleware's spare filings, holding nothing: conftest.py)."""
    async with Timer(tick=TICK) as timer:
        app = SERVED[timer] = make_app(timer, **options)
        try:
            async with serving(app, backend) as port:
                yield port, timer
            assert_nothing_held(timer, app)
        finally:
            del SERVED[timer]


#: The middleware app_server serves, by its timer.
SERVED: dict[Timer, IdleTimeoutMiddleware] = {}


def assert_nothing_held(timer: Timer, *middlewares: IdleTimeoutMiddleware) -> None:
    spares = [s for m in middlewares if m._cached is not None for s in m._cached.spare]
    assert all(spare._request is None for spare in spares)
    assert len(timer) == sum(spare._handle is not None for spare in spares)


def nothing_held_now(timer: Timer) -> bool:
    try:
        assert_nothing_held(timer, SERVED[timer])
    except AssertionError:
        return False
    return True


# -- websocket client (wsproto over anyio: same code on asyncio and trio) -----------


class WSClient:
    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[Any] = []

    @classmethod
    async def connect(cls, port: int, path: str) -> WSClient:
        client = cls(await anyio.connect_tcp("127.0.0.1", port))
        await client.stream.send(client.ws.send(WSRequest(host="127.0.0.1", target=path)))
        event = await client.next_event()
        if not isinstance(event, AcceptConnection):
            raise AssertionError(f"handshake failed: {event!r}")
        return client

    async def next_event(self) -> Any:
        """The next websocket event; ``None`` when the connection ends."""
        while not self.events:
            try:
                with anyio.fail_after(10):  # pytest-timeout cannot interrupt uvloop
                    data = await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return None
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, Ping):
                    await self.stream.send(self.ws.send(event.response()))
                elif isinstance(event, RejectConnection):
                    self.events.append(event)
                else:
                    self.events.append(event)
        return self.events.pop(0)

    async def send_text(self, text: str) -> None:
        await self.stream.send(self.ws.send(Message(data=text)))

    async def aclose(self) -> None:
        await self.stream.aclose()


# -- tests ----------------------------------------------------------------------------


async def test_slow_request_body_gets_408(backend: str) -> None:
    async with app_server(backend) as (port, _):
        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with stream:
            start = anyio.current_time()
            await stream.send(
                b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npartial"
            )
            answer = await read_until_closed(stream)
            elapsed = anyio.current_time() - start
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert_idle_window(elapsed)


async def test_clients_that_keep_talking_or_opted_out_are_not_dropped(
    backend: str, expiries: Expiries
) -> None:
    """Everything that must survive 2-3 timeouts, side by side on one server."""
    key = f"bg-{backend}"
    background_done[key] = anyio.Event()
    async with app_server(backend) as (port, _):
        base = f"http://127.0.0.1:{port}"

        async def keep_alive_client() -> None:
            async with httpx.AsyncClient(base_url=base) as client:
                ports = set()
                for _ in range(6):  # 3 T of requests, T/2 apart, on one connection
                    response = await client.get("/")
                    assert response.status_code == 200
                    ports.add(response.text)
                    await anyio.sleep(T / 2)
            assert len(ports) == 1, "the idle middleware must not drop a talking client"

        async def trickled_body() -> None:
            # Activity re-arms: a piece every T/2 for 2.5 T is slow but not idle, and
            # 200 bytes a piece is above the body deadline's minimum rate (500 B/s
            # buys 0.4 s a piece), so the body deadline keeps moving too.
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(
                    b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
                )
                for byte in b"hello":
                    await anyio.sleep(T / 2)
                    await stream.send(bytes([byte]) * 200)
                answer = b""
                while b"got 1000" not in answer:
                    answer += await stream.receive()
            assert answer.startswith(b"HTTP/1.1 200 "), answer

        async def flowing_stream() -> None:
            async with httpx.AsyncClient(base_url=base) as client:
                response = await client.get("/slow-stream")
            assert response.text == "".join(f"chunk {i}\n" for i in range(6))

        async def chatty_websocket() -> None:
            client = await WSClient.connect(port, "/ws")
            try:
                for i in range(6):  # 3 T, a message every T/2
                    await anyio.sleep(T / 2)
                    await client.send_text(str(i))
                    event = await client.next_event()
                    assert isinstance(event, TextMessage)
                    assert event.data == str(i)
            finally:
                await client.aclose()

        async def opted_out_websocket() -> None:
            client = await WSClient.connect(port, "/ws-long")
            try:
                event = await client.next_event()
            finally:
                await client.aclose()
            assert isinstance(event, TextMessage)
            assert event.data == "still here"

        async def long_poll() -> None:
            async with httpx.AsyncClient(base_url=base) as client:
                response = await client.get("/poll")
            assert response.status_code == 200
            assert response.text == "polled"

        async def longer_route_timeout() -> None:
            async with httpx.AsyncClient(base_url=base) as client:
                response = await client.get("/longer", params={"timeout": 4 * T, "s": 2 * T})
            assert response.status_code == 200

        async def background_task() -> None:
            # Work after the response (Starlette's background tasks) is not idleness.
            async with httpx.AsyncClient(base_url=base) as client:
                response = await client.get("/background", params={"key": key})
            assert response.text == "queued"
            with anyio.fail_after(3 * T + 5):
                await background_done[key].wait()

        async with anyio.create_task_group() as tg:
            for client in (
                keep_alive_client,
                trickled_body,
                flowing_stream,
                chatty_websocket,
                opted_out_websocket,
                long_poll,
                longer_route_timeout,
                background_task,
            ):
                tg.start_soon(client, name=client.__name__)
        assert expiries.count == 0  # nobody was dropped


async def test_idle_handler_gets_503(backend: str) -> None:
    async with (
        app_server(backend) as (port, _),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        start = anyio.current_time()
        response = await client.get("/sleep", params={"s": 10 * T})
        elapsed = anyio.current_time() - start
    assert response.status_code == 503
    assert response.headers["connection"] == "close"
    assert_idle_window(elapsed)


async def test_stalled_streaming_response_is_aborted(backend: str) -> None:
    async with (
        app_server(backend) as (port, _),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        received: list[bytes] = []

        async def consume() -> None:
            async with client.stream("GET", "/stall-stream") as response:
                assert response.status_code == 200
                async for chunk in response.aiter_raw():
                    received.append(chunk)

        start = anyio.current_time()
        with pytest.raises(httpx.RemoteProtocolError):
            await consume()
        elapsed = anyio.current_time() - start
    assert b"".join(received) == b"first chunk\n"
    assert_idle_window(elapsed)


async def test_idle_websocket_is_closed_with_the_close_code(backend: str) -> None:
    async with app_server(backend) as (port, _):
        client = await WSClient.connect(port, "/ws")
        try:
            # Measured from before the message whose echo is the server's last
            # activity: that re-arm comes after this instant, so never early.
            start = anyio.current_time()
            await client.send_text("hello")
            assert (await client.next_event()).data == "hello"
            event = await client.next_event()
            elapsed = anyio.current_time() - start
        finally:
            await client.aclose()
    assert isinstance(event, CloseConnection), event
    assert event.code == 1001
    assert event.reason == "idle timeout"
    assert_idle_window(elapsed)


async def test_idle_websocket_window_is_never_early(backend: str) -> None:
    async with app_server(backend, close_code=4408) as (port, _):
        start = anyio.current_time()  # before the handshake: precedes every re-arm
        client = await WSClient.connect(port, "/ws")
        try:
            event = await client.next_event()
            elapsed = anyio.current_time() - start
        finally:
            await client.aclose()
    assert isinstance(event, CloseConnection)
    assert event.code == 4408
    assert_idle_window(elapsed)


async def test_overrides_by_path_prefix(backend: str) -> None:
    overrides = {"/exempt": None, "/exemption": T / 2}
    async with (
        app_server(backend, overrides=overrides) as (port, _),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        exempt = await client.get("/exempt/poll", params={"s": 2 * T})
        start = anyio.current_time()
        shorter = await client.get("/exemption", params={"s": 2 * T})
        elapsed = anyio.current_time() - start
    assert exempt.status_code == 200
    assert shorter.status_code == 503  # "/exempt" does not match "/exemption"
    assert_idle_window(elapsed, T / 2)


async def test_route_sets_a_longer_timeout(backend: str) -> None:
    async with (
        app_server(backend) as (port, _),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        start = anyio.current_time()
        beyond = await client.get("/longer", params={"timeout": 2 * T, "s": 10 * T})
        elapsed = anyio.current_time() - start
    assert beyond.status_code == 503
    assert_idle_window(elapsed, 2 * T)


async def test_client_reset_mid_request_leaves_no_pending_timer(backend: str) -> None:
    async with app_server(backend) as (port, timer):
        stream = await anyio.connect_tcp("127.0.0.1", port)
        await stream.send(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
        # It reached the middleware: one filing times the request's idle deadline and
        # its body deadline (both stored, looked at when it fires).
        await eventually(lambda: len(timer) == 1, within=5)
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        await stream.aclose()  # SO_LINGER 0: the close sends a RST
        # Well before the timeout could explain it:
        await eventually(lambda: nothing_held_now(timer), within=T / 2)
        assert timer.stats().fired == 0


async def test_shared_timer_lives_for_the_lifespan(backend: str) -> None:
    seen: list[Timer] = []

    async def which(request: Request) -> Response:
        seen.append(await get_shared_timer())
        await anyio.sleep(10)
        return PlainTextResponse("never")

    app = IdleTimeoutMiddleware(Starlette(routes=[Route("/", which)]), timeout=T)
    async with (
        serving(app, backend, lifespan=True) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        response = await client.get("/")
        assert response.status_code == 503
        assert len(seen[0]) == 0
    # The server's lifespan owned it: closed with the server, not at loop shutdown.
    assert seen[0].closed
    assert seen[0].tick == 0.01


async def test_lazy_shared_timer_without_lifespan(backend: str) -> None:
    app = IdleTimeoutMiddleware(Starlette(routes=[Route("/sleep", sleep)]), timeout=T)
    async with (
        serving(app, backend) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        response = await client.get("/sleep", params={"s": 10 * T})
    assert response.status_code == 503
    timer = await get_shared_timer()  # the one the middleware started
    assert not timer.closed
    assert_nothing_held(timer, app)


async def test_stacked_middlewares_opt_out_together(backend: str) -> None:
    inner = make_app(None)
    outer = IdleTimeoutMiddleware(inner, timeout=T)
    async with (
        serving(outer, backend) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        response = await client.get("/poll")
    assert response.status_code == 200


async def test_websockets_library_client_sees_the_close_code(backend: str) -> None:
    if backend == "trio":
        pytest.skip("the websockets client is asyncio-only; wsproto covers trio above")
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with app_server(backend) as (port, _):
        start = anyio.current_time()
        async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            with pytest.raises(ConnectionClosed) as caught:
                await ws.recv()
            elapsed = anyio.current_time() - start
    assert caught.value.rcvd is not None
    assert caught.value.rcvd.code == 1001
    assert_idle_window(elapsed)


# -- configuration errors (no server needed) ---------------------------------------


async def noop_app(scope: Any, receive: Any, send: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeout": 0}, ValueError),
        ({"timeout": -1.0}, ValueError),
        ({"timeout": float("nan")}, ValueError),
        ({"timeout": float("inf")}, ValueError),
        ({"timeout": "5"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"timeout": None}, TypeError),
        ({"timeout": 1, "timer": object()}, TypeError),
        ({"timeout": 1, "overrides": ["/x"]}, TypeError),
        ({"timeout": 1, "overrides": {"x": None}}, ValueError),
        ({"timeout": 1, "overrides": {1: None}}, TypeError),
        ({"timeout": 1, "overrides": {"/x": 0}}, ValueError),
        ({"timeout": 1, "overrides": {"/x": "1"}}, TypeError),
        ({"timeout": 1, "close_code": 1006}, ValueError),
        ({"timeout": 1, "close_code": 999}, ValueError),
        ({"timeout": 1, "close_code": 5000}, ValueError),
        ({"timeout": 1, "close_code": "1001"}, TypeError),
    ],
)
def test_bad_configuration_raises_at_construction(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        IdleTimeoutMiddleware(noop_app, **kwargs)


def test_app_must_be_callable() -> None:
    with pytest.raises(TypeError):
        IdleTimeoutMiddleware("app", timeout=1)  # type: ignore[arg-type]


def test_override_prefixes_match_whole_segments() -> None:
    middleware = IdleTimeoutMiddleware(
        noop_app, timeout=5, overrides={"/poll": None, "/poll/fast": 1, "/static/": 60}
    )
    assert middleware.timeout_for("/poll") is None
    assert middleware.timeout_for("/poll/x") is None
    assert middleware.timeout_for("/polling") == 5
    assert middleware.timeout_for("/poll/fast/1") == 1
    assert middleware.timeout_for("/static/a.css") == 60
    assert middleware.timeout_for("/") == 5


def test_set_idle_timeout_without_middleware() -> None:
    assert set_idle_timeout({"type": "http"}, None) is False
    assert set_idle_timeout({"type": "http", SCOPE_KEY: "junk"}, 5) is False
    with pytest.raises(ValueError, match="positive finite"):
        set_idle_timeout({"type": "http"}, 0)
    with pytest.raises(TypeError):
        set_idle_timeout({"type": "http"}, "5")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        set_idle_timeout(object(), None)
