"""IdleTimeoutMiddleware called directly, without a server, on the suite's backends.

asyncio (looptime) and trio (MockClock) have virtual clocks, so the timing here is
exact: expiry happens at the deadline, within one tick, and never before it. uvloop
runs the same tests in real time with small delays.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

import anyio
import pytest
from support import Expiries

from aiowheel import Timer, TimerClosed
from aiowheel.middleware import (
    IdleTimeoutError,
    IdleTimeoutMiddleware,
    get_shared_timer,
    set_idle_timeout,
)

NothingHeld = Callable[..., None]  # conftest.py's nothing_held

pytestmark = pytest.mark.anyio

T = 0.05
TICK = 0.001
Message = MutableMapping[str, Any]


class Peer:
    """The server side of one ASGI call: scripted messages in, recorded messages out."""

    def __init__(self, timer: Timer, *incoming: Message) -> None:
        self.timer = timer
        self.incoming = list(incoming)
        self.sent: list[tuple[float, Message]] = []

    async def receive(self) -> Message:
        if self.incoming:
            return self.incoming.pop(0)
        await anyio.sleep_forever()  # the client went quiet
        raise AssertionError("unreachable")  # pragma: no cover

    async def send(self, message: Message) -> None:
        self.sent.append((self.timer.time(), message))

    def types(self) -> list[str]:
        return [message["type"] for _, message in self.sent]


def http_scope(path: str = "/") -> dict[str, Any]:
    return {"type": "http", "path": path, "method": "GET", "headers": []}


def assert_at_deadline(when: float, start: float, virtual: bool, timeout: float = T) -> None:
    assert when >= start + timeout  # never early (compared as the timer computes it)
    assert when <= start + timeout + TICK + (1e-9 if virtual else 0.1)


async def respond(send: Any, body: bytes = b"ok") -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def test_stalled_body_gets_408_at_the_deadline(virtual: bool) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await respond(send)  # pragma: no cover - the body never completes

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer, {"type": "http.request", "body": b"a", "more_body": True})
        start = timer.time()
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
        assert len(timer) == 0
    assert peer.types() == ["http.response.start", "http.response.body"]
    when, head = peer.sent[0]
    assert head["status"] == 408
    assert (b"connection", b"close") in head["headers"]
    assert_at_deadline(when, start, virtual)


async def test_idle_handler_gets_503(virtual: bool) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the whole (empty) body
        await anyio.sleep_forever()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer, {"type": "http.request", "body": b"", "more_body": False})
        start = timer.time()
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
    assert peer.sent[0][1]["status"] == 503
    assert_at_deadline(peer.sent[0][0], start, virtual)


async def test_stalled_response_is_aborted(virtual: bool) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"1", "more_body": True})
        await anyio.sleep_forever()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        start = timer.time()
        with pytest.raises(IdleTimeoutError, match="aborted"):
            await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
                http_scope(), peer.receive, peer.send
            )
        assert_at_deadline(timer.time(), start, virtual)
        assert len(timer) == 0
    assert peer.types() == ["http.response.start", "http.response.body"]


async def test_activity_re_arms(virtual: bool, expiries: Expiries) -> None:
    # Ten chunks 0.6 T apart: 6 T in all, never idle for T.
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(10):
            await anyio.sleep(0.6 * T)
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
        assert expiries.count == 0  # nobody was dropped
    assert len(peer.sent) == 12


async def test_idle_websocket_is_closed(virtual: bool) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await receive()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer, {"type": "websocket.connect"})
        start = timer.time()
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer, close_code=4000)(
            {"type": "websocket", "path": "/ws"}, peer.receive, peer.send
        )
    assert peer.types() == ["websocket.accept", "websocket.close"]
    when, close = peer.sent[1]
    assert close["code"] == 4000
    assert close["reason"] == "idle timeout"
    assert_at_deadline(when, start, virtual)


async def test_endpoint_extends_then_opts_out(
    virtual: bool, expiries: Expiries, nothing_held: NothingHeld
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert set_idle_timeout(scope, 3 * T)
        await anyio.sleep(2 * T)
        assert timer.stats().fired == 0  # re-filed at once: no wake-up at T
        assert set_idle_timeout(scope, None)
        await anyio.sleep(5 * T)
        await respond(send)

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        middleware = IdleTimeoutMiddleware(app, timeout=T, timer=timer)
        await middleware(http_scope(), peer.receive, peer.send)
        assert expiries.count == 0
        # The filing the request gave back came due holding nothing, and let go.
        assert timer.stats().fired <= 1
        nothing_held(timer, middleware)
    assert peer.sent[0][1]["status"] == 200


async def test_a_shorter_timeout_is_filed_at_once(virtual: bool) -> None:
    """Activity only stores the deadline; a timeout made shorter cannot wait for the
    handle filed for the old one (IdleControl.set_timeout re-files)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert set_idle_timeout(scope, 10 * T)
        assert set_idle_timeout(scope, T / 2)
        await anyio.sleep_forever()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        start = timer.time()
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
    assert peer.sent[0][1]["status"] == 503
    assert_at_deadline(peer.sent[0][0], start, virtual, T / 2)


async def test_a_touch_is_a_store_and_the_firing_sleeps_on(
    virtual: bool, expiries: Expiries
) -> None:
    """Netty's IdleStateHandler shape: 40 sends, a wake-up per timeout at most, and
    the expiry exactly one timeout after the last send, never early."""
    last: list[float] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(40):
            await anyio.sleep(T / 10)
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            last.append(timer.time())
        await anyio.sleep_forever()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        with pytest.raises(IdleTimeoutError, match="aborted"):
            await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
                http_scope(), peer.receive, peer.send
            )
        assert_at_deadline(timer.time(), last[-1], virtual)
        assert expiries.count == 1
        # 80 touches (before and after each send) over 4 T + T: a handful of firings,
        # each re-filing for what is left, where a reset per touch would be 80 moves.
        assert timer.stats().fired <= 6 + 1


async def test_override_none_then_endpoint_opts_back_in(virtual: bool) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await anyio.sleep(3 * T)  # no timeout on this path
        assert set_idle_timeout(scope, T)  # until the endpoint asks for one
        await anyio.sleep_forever()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        start = timer.time()
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer, overrides={"/poll": None})(
            http_scope("/poll/topic"), peer.receive, peer.send
        )
    assert peer.sent[0][1]["status"] == 503
    assert_at_deadline(peer.sent[0][0], start, virtual, 4 * T)


async def test_work_after_the_response_is_not_timed(virtual: bool) -> None:
    finished = False

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal finished
        await respond(send)
        await anyio.sleep(5 * T)  # e.g. a background task
        finished = True

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
    assert finished


async def test_client_gone_and_app_stuck_is_cancelled_silently(virtual: bool) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        assert (await receive())["type"] == "http.disconnect"
        await anyio.sleep_forever()  # ignores the disconnect

    async with Timer(tick=TICK) as timer:
        peer = Peer(
            timer,
            {"type": "http.request", "body": b"", "more_body": False},
            {"type": "http.disconnect"},
        )
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
    assert peer.sent == []  # cancelled; nobody to answer


async def test_unstarted_timer_is_a_clear_error() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await respond(send)  # pragma: no cover

    middleware = IdleTimeoutMiddleware(app, timeout=T, timer=Timer())
    with pytest.raises(TimerClosed, match="not started"):
        await middleware(http_scope(), Peer(Timer()).receive, Peer(Timer()).send)


async def test_closed_timer_serves_without_timeout() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await respond(send)

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
    middleware = IdleTimeoutMiddleware(app, timeout=T, timer=timer)
    await middleware(http_scope(), peer.receive, peer.send)  # the server is shutting down
    assert [m["type"] for _, m in peer.sent] == ["http.response.start", "http.response.body"]


async def test_lifespan_owns_the_shared_timer() -> None:
    seen: list[Timer] = []
    shutdown_sent = anyio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        assert (await receive())["type"] == "lifespan.startup"
        seen.append(await get_shared_timer())
        await send({"type": "lifespan.startup.complete"})
        assert (await receive())["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.complete"})

    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        if message["type"] == "lifespan.shutdown.complete":
            # Closed before the server hears that the lifespan is over.
            assert seen[0].closed
            shutdown_sent.set()

    await IdleTimeoutMiddleware(app, timeout=T)({"type": "lifespan"}, receive, send)
    assert shutdown_sent.is_set()
    assert seen[0].closed
    assert await get_shared_timer() is not seen[0]  # later users get a lazy one


class Trickle:
    """A client that sends its body in ``chunk``-byte pieces every ``gap`` seconds."""

    def __init__(self, timer: Timer, chunk: int, gap: float, pieces: int) -> None:
        self.timer = timer
        self.chunk = chunk
        self.gap = gap
        self.left = pieces
        self.sent: list[tuple[float, Message]] = []

    async def receive(self) -> Message:
        await anyio.sleep(self.gap)
        self.left -= 1
        return {"type": "http.request", "body": b"b" * self.chunk, "more_body": self.left > 0}

    async def send(self, message: Message) -> None:
        self.sent.append((self.timer.time(), message))


async def read_body_then_respond(scope: Any, receive: Any, send: Any) -> None:
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await respond(send, str(size).encode())


@pytest.mark.virtual_time  # gaps a fraction of T: too tight for a loaded real clock
async def test_a_trickled_body_gets_408_at_its_deadline(virtual: bool) -> None:
    # Issue 28, finding 15 (slowhttptest -B): a piece every 0.4 T is activity, so the
    # idle timeout never fires; the body deadline (body_timeout, default: timeout,
    # plus a second per body_min_rate bytes) does.
    async with Timer(tick=TICK) as timer:
        client = Trickle(timer, chunk=1, gap=0.4 * T, pieces=1000)
        start = timer.time()
        await IdleTimeoutMiddleware(read_body_then_respond, timeout=T, timer=timer)(
            {**http_scope(), "method": "POST"}, client.receive, client.send
        )
        assert len(timer) == 0
    when, head = client.sent[0]
    assert head["status"] == 408
    assert (b"connection", b"close") in head["headers"]
    # T, plus the 2 bytes that came before it at 500 bytes a second.
    assert_at_deadline(when, start, virtual, T + 2 / 500)


@pytest.mark.virtual_time  # gaps a fraction of T: too tight for a loaded real clock
async def test_a_steady_upload_outlives_the_body_timeout(
    virtual: bool, nothing_held: NothingHeld
) -> None:
    # 10 T in all, but 1,000 bytes every 0.5 T is far above the minimum rate.
    async with Timer(tick=TICK) as timer:
        client = Trickle(timer, chunk=1000, gap=0.5 * T, pieces=20)
        middleware = IdleTimeoutMiddleware(
            read_body_then_respond, timeout=T, timer=timer, body_min_rate=1000
        )
        await middleware(http_scope(), client.receive, client.send)
        nothing_held(timer, middleware)
    assert client.sent[0][1]["status"] == 200
    assert client.sent[1][1]["body"] == b"20000"


@pytest.mark.virtual_time  # gaps a fraction of T: too tight for a loaded real clock
async def test_body_timeout_settings(virtual: bool, nothing_held: NothingHeld) -> None:
    # No minimum rate: the whole body within body_timeout. None: no body deadline.
    async with Timer(tick=TICK) as timer:
        client = Trickle(timer, chunk=10_000, gap=0.5 * T, pieces=20)
        start = timer.time()
        await IdleTimeoutMiddleware(
            read_body_then_respond, timeout=T, timer=timer, body_timeout=3 * T, body_min_rate=None
        )(http_scope(), client.receive, client.send)
        assert client.sent[0][1]["status"] == 408
        assert_at_deadline(client.sent[0][0], start, virtual, 3 * T)
        client = Trickle(timer, chunk=1, gap=0.5 * T, pieces=20)
        await IdleTimeoutMiddleware(
            read_body_then_respond, timeout=T, timer=timer, body_timeout=None
        )(http_scope(), client.receive, client.send)
        assert client.sent[0][1]["status"] == 200
        # An endpoint that opts out of its idle timeout opts out of the body deadline.
        client = Trickle(timer, chunk=1, gap=0.5 * T, pieces=20)

        async def opted_out(scope: Any, receive: Any, send: Any) -> None:
            set_idle_timeout(scope, None)
            await read_body_then_respond(scope, receive, send)

        middleware = IdleTimeoutMiddleware(opted_out, timeout=T, timer=timer)
        await middleware(http_scope(), client.receive, client.send)
        assert client.sent[0][1]["status"] == 200
        nothing_held(timer, middleware)
    with pytest.raises(ValueError, match="body_timeout"):
        IdleTimeoutMiddleware(read_body_then_respond, timeout=1, body_timeout=0)
    with pytest.raises(TypeError, match="body_min_rate must be a number of bytes per second"):
        IdleTimeoutMiddleware(read_body_then_respond, timeout=1, body_min_rate="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive finite number of bytes per second"):
        IdleTimeoutMiddleware(read_body_then_respond, timeout=1, body_min_rate=-1)
    with pytest.raises(
        ValueError, match="body_timeout must be a positive finite number of seconds"
    ):
        IdleTimeoutMiddleware(read_body_then_respond, timeout=1, body_timeout=float("nan"))


async def test_stalled_response_behind_a_connection_is_aborted_quietly(virtual: bool) -> None:
    # Issue 28, finding 19: a connection-level integration (uvicorn_protocol) puts the
    # connection in the scope; the middleware drops it rather than raising (which the
    # server logs with a traceback). A scope without it (another server, or an ASGI
    # application called in-process) still gets IdleTimeoutError: see
    # test_stalled_response_is_aborted.
    from aiowheel.middleware._shared import CONNECTION_KEY

    class Connection:
        aborted: list[float] = []

        async def abort_connection(self) -> None:
            self.aborted.append(timer.time())

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"1", "more_body": True})
        await anyio.sleep_forever()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        start = timer.time()
        connection = Connection()
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            {**http_scope(), CONNECTION_KEY: connection}, peer.receive, peer.send
        )
        assert len(timer) == 0
    assert len(connection.aborted) == 1
    assert_at_deadline(connection.aborted[0], start, virtual)


@pytest.mark.virtual_time  # gaps a fraction of T: too tight for a loaded real clock
async def test_a_tiny_body_min_rate_does_not_overflow_the_deadline(
    virtual: bool, nothing_held: NothingHeld
) -> None:
    # Hostile review of issue 28's fixes: body_min_rate is accepted down to any
    # positive float, and 1,000 bytes at 1e-306 bytes a second buy an infinite
    # extension; Timer.reset_at(inf) raised ValueError out of the app's receive().
    async with Timer(tick=TICK) as timer:
        client = Trickle(timer, chunk=1000, gap=0.5 * T, pieces=4)
        middleware = IdleTimeoutMiddleware(
            read_body_then_respond, timeout=T, timer=timer, body_min_rate=1e-306
        )
        await middleware(http_scope(), client.receive, client.send)
        nothing_held(timer, middleware)
    assert client.sent[0][1]["status"] == 200
    assert client.sent[1][1]["body"] == b"4000"


# -- the cancellation on asyncio: Task.cancel from the expiry, taken back with
# Task.uncancel, as asyncio.timeout does it --


async def test_the_cancellation_is_taken_back(backend: str) -> None:
    if backend == "trio":
        pytest.skip("trio: an anyio cancel scope, nothing to take back")
    import asyncio

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await anyio.sleep_forever()

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0  # nothing left pending for the server's task
        await asyncio.sleep(0)  # and no CancelledError left to come
    assert peer.sent[0][1]["status"] == 503


async def test_a_cancellation_not_only_ours_goes_on_up(backend: str) -> None:
    if backend == "trio":
        pytest.skip("trio: an anyio cancel scope")
    import asyncio

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await anyio.sleep_forever()
        except asyncio.CancelledError:
            # Someone else (a server shutting down) cancels the task too, meanwhile.
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            raise

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        task = asyncio.current_task()
        assert task is not None
        before = task.cancelling()
        with pytest.raises(asyncio.CancelledError):
            await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
                http_scope(), peer.receive, peer.send
            )
        # Ours taken back, the other one left for whoever asked for it: still
        # counted, and delivered at the task's next await.
        assert task.cancelling() == before + 1
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(0)
        task.uncancel()
    assert peer.sent == []  # not answered: the task is going away


async def test_an_application_that_swallows_the_cancellation(backend: str) -> None:
    if backend == "trio":
        pytest.skip("trio: an anyio cancel scope")
    import asyncio

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await anyio.sleep_forever()
        except asyncio.CancelledError:
            pass  # carries on (asyncio.timeout's rule: it is not cancelled again)
        await respond(send, b"late")

    async with Timer(tick=TICK) as timer:
        peer = Peer(timer)
        await IdleTimeoutMiddleware(app, timeout=T, timer=timer)(
            http_scope(), peer.receive, peer.send
        )
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
    assert [m.get("body") for _, m in peer.sent] == [None, b"late"]
