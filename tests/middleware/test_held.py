"""A request behind ``uvicorn_protocol``'s connection, driven in-process.

uvicorn's h11 protocol is fed its requests through ``data_received`` and writes to a
stand-in transport (no socket), so that flow control (``pause_writing`` /
``resume_writing``) and the collector can be driven exactly. asyncio runs on looptime's
virtual clock, uvloop in real time; the test whose scenario needs time to pass (an
application that thinks, a client's window that stays full) runs on the virtual clock
only, and every check awaits the event it is about, bounded, and never polls.

Behind the connection the middleware hands the application the server's own ``send``
(``_RequestWatch.send_held``): the connection stops the request's timing when the
response is complete and moves its deadline when the client takes what a send waited
to write. These tests pin what that path must keep from the general one.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, MutableMapping
from typing import Any

import looptime
import pytest

from aiowheel import Timer
from aiowheel.middleware import IdleTimeoutMiddleware, uvicorn_protocol

pytestmark = pytest.mark.anyio

T = 0.25
TICK = 0.001
Message = MutableMapping[str, Any]
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    # uvicorn needs asyncio: looptime's virtual clock, or uvloop in real time.
    if request.param == "asyncio":
        return ("asyncio", {"loop_factory": lambda: looptime.new_event_loop(start=1000.0)})
    return ("asyncio", {"use_uvloop": True})


class StandIn(asyncio.Transport):
    """What the protocol writes to: memory, and whether it was aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.closing = False
        self.aborted = False
        self.gone = asyncio.Event()  # set by abort: what a test awaits

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True
        self.gone.set()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def connect(app: Any, timer: Timer) -> tuple[Any, StandIn]:
    import uvicorn
    from uvicorn.server import ServerState

    config = uvicorn.Config(app, log_level="critical", access_log=False, timeout_keep_alive=30)
    config.load()
    protocol = uvicorn_protocol(timeout=20 * T, timer=timer, base="h11")(
        config=config, server_state=ServerState(), app_state={}
    )
    transport = StandIn()
    protocol.connection_made(transport)
    return protocol, transport


async def until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until ``predicate`` holds (bounded)."""
    for _ in range(1_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never true: {predicate}")


async def first(*events: asyncio.Event, seconds: float) -> None:
    """Wait until one of ``events`` is set; fail after ``seconds`` of the loop's clock."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        done, _ = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    if not done:
        raise AssertionError(f"none of {events} set within {seconds} s")


@pytest.mark.virtual_time  # time must pass in it: on looptime's clock, not uvloop's
async def test_a_send_the_client_let_through_is_activity() -> None:
    # The body's first chunk waits for flow control for 0.8 T, then the application
    # thinks for 0.5 T: 1.3 T after the send started, but only 0.5 T after the client
    # took the chunk (resume_writing). Not idle: the response completes.
    log: list[str] = []
    go = asyncio.Event()
    done = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await go.wait()
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        log.append("let through")
        await asyncio.sleep(0.5 * T)  # the application thinks (the scenario, not a wait)
        await send({"type": "http.response.body", "body": b"b"})
        log.append("done")
        done.set()

    async with Timer(tick=TICK) as timer:
        middleware = IdleTimeoutMiddleware(app, timeout=T, timer=timer)
        protocol, transport = connect(middleware, timer)
        protocol.data_received(GET)
        await until(lambda: bool(transport.data))  # the head went out
        protocol.pause_writing()  # the client's window is full: the chunk waits
        go.set()
        await asyncio.sleep(0.8 * T)  # the client's window stays full (the scenario)
        assert log == []
        protocol.resume_writing()  # the client took it
        await first(done, transport.gone, seconds=20 * T)
        assert log == ["let through", "done"]
        assert not transport.aborted
        assert transport.data.endswith(b"0\r\n\r\n")  # the chunked body's end
        protocol.connection_lost(None)


async def test_a_send_that_waits_for_ever_is_dropped() -> None:
    # The same send, never let through: the response is aborted through the
    # connection, never before one timeout after the send started.
    go = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await go.wait()
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})  # pragma: no cover

    loop = asyncio.get_running_loop()
    async with Timer(tick=TICK) as timer:
        middleware = IdleTimeoutMiddleware(app, timeout=T, timer=timer)
        protocol, transport = connect(middleware, timer)
        protocol.data_received(GET)
        await until(lambda: bool(transport.data))
        protocol.pause_writing()
        start = loop.time()  # before the send: precedes its deadline
        go.set()
        await first(transport.gone, seconds=20 * T)
        elapsed = loop.time() - start
        protocol.connection_lost(ConnectionResetError())
    assert elapsed >= T  # never early


async def test_requests_behind_the_connection_leave_no_cycle_for_the_collector() -> None:
    # A request's watch refers to the server's send, which refers to uvicorn's scope:
    # the watch must not be written into that scope (a cycle per request, each left
    # for the collector: it then ran every 50 requests of a trivial app).
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async with Timer(tick=TICK) as timer:
        protocol, transport = connect(IdleTimeoutMiddleware(app, timeout=T, timer=timer), timer)
        for _ in range(3):  # warm-up: first-request allocations
            protocol.data_received(GET)
            await until(lambda: transport.data.endswith(b"0\r\n\r\n"))
            transport.data.clear()
        gc.collect()
        gc.disable()
        try:
            for _ in range(50):
                protocol.data_received(GET)
                await until(lambda: transport.data.endswith(b"0\r\n\r\n"))
                transport.data.clear()
            unreachable = gc.collect()
        finally:
            gc.enable()
        protocol.connection_lost(None)
    assert unreachable < 50  # not one cycle (or more) per request
