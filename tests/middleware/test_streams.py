"""idle_timeout for asyncio.start_server: real loopback sockets on asyncio and uvloop.

Real time on both loops (this module overrides ``anyio_backend``). The 10,000
connection test runs its clients in a second process: in one process every loopback
connection costs two descriptors, and 10,000 of them plus the rest need more than the
20,000 this machine allows.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from support import TICK, Expiries, T, assert_idle_window, eventually, read_until_closed

from aiowheel import Timer
from aiowheel.middleware import (
    IdleStreamReader,
    IdleStreamWriter,
    IdleTimeoutError,
    get_shared_timer,
    idle_timeout,
    set_idle_timeout,
)

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


class LoopErrors:
    """Collects what the event loop would log through its exception handler."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.contexts.append(context)


@asynccontextmanager
async def serving(
    handler: Handler, *, idle: float = T, timer: Timer | None = None, backlog: int = 100
) -> AsyncIterator[tuple[int, Timer, LoopErrors]]:
    loop = asyncio.get_running_loop()
    errors = LoopErrors()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(errors)
    try:
        async with Timer(tick=TICK) as own:
            used = timer or own
            server = await asyncio.start_server(
                idle_timeout(handler, timeout=idle, timer=used),
                "127.0.0.1",
                0,
                backlog=backlog,
            )
            try:
                yield server.sockets[0].getsockname()[1], used, errors
            finally:
                server.close()
                await server.wait_closed()
    finally:
        loop.set_exception_handler(previous)


async def test_silent_connection_is_aborted_and_the_handler_told() -> None:
    outcomes: list[BaseException] = []
    done = anyio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(100)
        except BaseException as exc:
            outcomes.append(exc)
            raise  # the wrapper swallows its own IdleTimeoutError
        finally:
            done.set()

    async with serving(handler) as (port, timer, errors):
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await read_until_closed(reader)
        elapsed = anyio.current_time() - start
        writer.close()
        await done.wait()
        assert len(timer) == 0
    assert data in (b"", b"<reset>")
    assert_idle_window(elapsed)
    assert len(outcomes) == 1
    assert isinstance(outcomes[0], IdleTimeoutError)
    assert errors.contexts == []  # nothing logged: an idle close is a normal outcome


async def test_talking_connection_is_kept_and_every_read_kind_re_arms(expiries: Expiries) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert isinstance(reader, IdleStreamReader)
        assert isinstance(writer, IdleStreamWriter)
        line = await reader.readline()
        writer.write(b"1:" + line)
        data = await reader.readexactly(3)
        writer.writelines([b"2:", data, b"\n"])
        await writer.drain()
        data = await reader.readuntil(b";")
        writer.write(b"3:" + data + b"\n")
        data = await reader.read(4)
        writer.write(b"4:" + data + b"\n")
        async for line in reader:  # __anext__ -> readline
            writer.write(b"5:" + line)
        assert reader.at_eof()
        assert reader.exception() is None
        assert writer.can_write_eof()
        assert writer.get_extra_info("peername")[0] == "127.0.0.1"
        assert writer.transport is not None
        assert not writer.is_closing()
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async with serving(handler) as (port, timer, errors):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # Each piece comes T/2 after the previous one: 3 T in all, never idle for T.
        for piece in (b"a\n", b"bcd", b"ef;", b"ghij", b"k\n", b"l\n"):
            await asyncio.sleep(T / 2)
            writer.write(piece)
        writer.write_eof()
        answer = await read_until_closed(reader)
        writer.close()
        assert expiries.count == 0  # nobody was dropped
        assert len(timer) == 0
    assert answer == b"1:a\n2:bcd\n3:ef;\n4:ghij\n5:k\n5:l\n"
    assert errors.contexts == []


async def test_peer_that_stops_reading_is_aborted() -> None:
    loop = asyncio.get_running_loop()
    last_write: list[float] = []
    failed: list[tuple[float, BaseException]] = []
    aborted = anyio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunk = b"x" * 65536
        try:
            while True:  # until the buffers fill up and drain() blocks
                last_write.append(loop.time())  # the write below re-arms after this
                writer.write(chunk)
                await writer.drain()
        except IdleTimeoutError as exc:
            failed.append((loop.time(), exc))
            aborted.set()
            raise

    async with serving(handler) as (port, _, errors):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        with anyio.fail_after(10):
            await aborted.wait()  # the client never reads
        writer.close()
    assert_idle_window(failed[0][0] - last_write[-1])
    assert errors.contexts == []


async def test_peer_that_stops_reading_gets_a_reset() -> None:
    # The abort sets SO_LINGER 0 first: the unsent output is dropped with a reset,
    # not kept in the kernel with a FIN queued behind it.
    aborted = anyio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # until the buffers fill up and drain() blocks
                writer.write(b"x" * 65536)
                await writer.drain()
        except IdleTimeoutError:
            aborted.set()
            raise

    async with serving(handler) as (port, _, errors):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        with anyio.fail_after(10):
            await aborted.wait()  # the client never reads
        data = await read_until_closed(reader)
        writer.close()
    assert data.endswith(b"<reset>"), (len(data), data[-40:])
    assert errors.contexts == []


async def test_handler_can_opt_out_or_extend() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        command = await reader.readline()
        if command == b"forever\n":
            assert set_idle_timeout(reader, None)
            assert writer.idle_deadline is None  # type: ignore[attr-defined]
            await asyncio.sleep(2 * T)
        else:
            assert set_idle_timeout(writer, 3 * T)
            await asyncio.sleep(2 * T)
        writer.write(b"still here\n")
        await writer.drain()
        writer.close()

    async with serving(handler) as (port, timer, _):
        for command in (b"forever\n", b"longer\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(command)
            assert await read_until_closed(reader) == b"still here\n"
            writer.close()
        assert timer.stats().fired == 0


async def test_idle_deadline_follows_activity() -> None:
    seen: list[tuple[float, float | None, float | None]] = []
    loop = asyncio.get_running_loop()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = reader.idle_deadline  # type: ignore[attr-defined]
        await reader.readline()
        seen.append((loop.time(), first, reader.idle_deadline))  # type: ignore[attr-defined]
        writer.close()

    async with serving(handler) as (port, _, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(T / 2)
        writer.write(b"hi\n")
        await read_until_closed(reader)
        writer.close()
    now, first, after = seen[0]
    assert first is not None
    assert after is not None
    assert after > first  # the read pushed it out
    assert now <= after <= now + T


async def test_client_reset_cancels_the_timer() -> None:
    handled = anyio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()
        finally:
            handled.set()

    # A long timeout: only the reset can explain the timer going away.
    async with serving(handler, idle=30) as (port, timer, errors):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await eventually(lambda: len(timer) == 1, within=5)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()  # SO_LINGER 0: a RST
        with anyio.fail_after(T):
            await handled.wait()
        assert len(timer) == 0
        assert timer.stats().fired == 0
    # A reset is the handler's business (it read b"" or got ConnectionResetError):
    # nothing of ours is logged.
    assert all("IdleTimeoutError" not in repr(c) for c in errors.contexts)


async def test_handler_errors_propagate_and_cancel_the_timer() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        raise RuntimeError("handler bug")

    async with serving(handler, idle=30) as (port, timer, errors):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"go\n")
        await read_until_closed(reader)  # asyncio closes the transport after the error
        writer.close()
        assert len(timer) == 0
    assert [type(c.get("exception")) for c in errors.contexts] == [RuntimeError]


async def test_shared_timer_by_default() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server = await asyncio.start_server(idle_timeout(handler, timeout=T), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        start = anyio.current_time()  # before connecting: precedes any arming
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await read_until_closed(reader)
        elapsed = anyio.current_time() - start
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert_idle_window(elapsed)
    assert len(await get_shared_timer()) == 0


def test_wrapper_keeps_the_handler_name() -> None:
    async def my_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pass

    assert idle_timeout(my_handler, timeout=1).__name__ == "my_handler"


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("not callable",), {"timeout": 1}, TypeError),
        ((print,), {"timeout": 0}, ValueError),
        ((print,), {"timeout": -5}, ValueError),
        ((print,), {"timeout": float("nan")}, ValueError),
        ((print,), {"timeout": "1"}, TypeError),
        ((print,), {"timeout": 1, "timer": 1}, TypeError),
    ],
)
def test_bad_configuration_raises(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        idle_timeout(*args, **kwargs)


# -- 10,000 idle connections ----------------------------------------------------------

N_IDLE = 10_000
IDLE_T = 0.5
BURST_SLACK = 3.0  # see the lateness assertion below

# Opens N connections, a batch at a time (each waits for the server's greeting, so no
# more than one batch waits in the accept queue and none is dropped from a full
# backlog), then waits until the server has closed every one of them and prints the
# close times, on the monotonic clock (system-wide, so comparable with the server's).
CLIENT = textwrap.dedent(
    """
    import asyncio, json, sys, time

    n, port = int(sys.argv[1]), int(sys.argv[2])

    class Idle(asyncio.Protocol):
        def __init__(self, greeted, closed):
            self.greeted, self.closed = greeted, closed
        def data_received(self, data):
            if not self.greeted.done():
                self.greeted.set_result(None)
        def connection_lost(self, exc):
            self.closed.append(time.monotonic())
            if not self.greeted.done():
                self.greeted.set_result(None)

    async def main():
        loop = asyncio.get_running_loop()
        closed = []
        async def one():
            greeted = loop.create_future()
            await loop.create_connection(lambda: Idle(greeted, closed), "127.0.0.1", port)
            await greeted
        for start in range(0, n, 250):
            await asyncio.gather(*(one() for _ in range(min(250, n - start))))
        while len(closed) < n:
            await asyncio.sleep(0.05)
        print(json.dumps(closed))

    asyncio.run(main())
    """
)


@pytest.mark.slow
async def test_ten_thousand_idle_connections(backend: str) -> None:
    """10,000 connections held at once, then all idle: each is closed within the
    timeout plus a tick plus slack of its last activity, and the timer ends empty.

    Opening 10,000 connections takes 2-5 s here (two processes on two cores), longer
    than any timeout worth waiting for in a test, so the connections start with a long
    timeout and, once all are held, the test gives each its short one with
    ``set_idle_timeout`` (a ``reset``, like any activity): their idle periods then
    start together and they expire in one burst, the hardest case for the timer.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = N_IDLE + 200  # per process: the clients are in the other one
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} file descriptors per process, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    loop = asyncio.get_running_loop()
    readers: list[asyncio.StreamReader] = []
    all_held = anyio.Event()
    lateness: list[float] = []  # close time minus the connection's deadline, loop clock
    all_closed = anyio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello\n")  # a greeting, then silence
        readers.append(reader)
        if len(readers) == N_IDLE:
            all_held.set()
        try:
            await reader.read()
        except IdleTimeoutError:
            lateness.append(loop.time() - deadlines[id(reader)])
            raise
        finally:
            if len(lateness) == N_IDLE:
                all_closed.set()

    deadlines: dict[int, float] = {}
    try:
        async with serving(handler, idle=60, backlog=4096) as (port, timer, errors):
            client = await anyio.open_process(
                [sys.executable, "-c", CLIENT, str(N_IDLE), str(port)]
            )
            async with client:
                assert client.stdout is not None
                with anyio.fail_after(60):
                    await all_held.wait()
                assert len(timer) == N_IDLE  # all held at once, each with its timer
                start = time.monotonic()
                start_loop = loop.time()
                for reader in readers:
                    set_idle_timeout(reader, IDLE_T)
                    deadlines[id(reader)] = reader.idle_deadline  # type: ignore[attr-defined]
                output = b""
                with anyio.fail_after(60):
                    async for chunk in client.stdout:
                        output += chunk
                    await client.wait()
                    await all_closed.wait()
            assert client.returncode == 0
            stats = timer.stats()
            assert len(timer) == 0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # Never early, for any of them, on the timer's clock.
    assert min(deadlines.values()) >= start_loop + IDLE_T
    assert min(lateness) >= 0, f"a connection was dropped {-min(lateness):.4f} s early"
    # Every one closed by the timer, each within a tick plus slack of its deadline.
    # The slack is the loop's own scheduling delay (docs/design.md, guarantee 2): the timer's
    # passes in the burst wait while the loop runs the thousands of aborts and handler
    # wake-ups that the earlier passes queued, hundreds of milliseconds on this 2-core
    # machine (up to 1.3 s measured on uvloop with a busy-looping process beside it).
    assert stats.fired == N_IDLE
    assert stats.lateness_max < TICK + BURST_SLACK, stats
    closed = sorted(json.loads(output))
    assert len(closed) == N_IDLE
    lateness.sort()
    print(
        f"\n{backend}: {N_IDLE} idle connections closed {closed[0] - start:.3f}-"
        f"{closed[-1] - start:.3f} s (median {closed[N_IDLE // 2] - start:.3f} s) after a "
        f"{IDLE_T} s timeout was armed (client side); handler lateness median "
        f"{lateness[N_IDLE // 2] * 1000:.1f} ms, max {lateness[-1] * 1000:.1f} ms; timer "
        f"lateness max {stats.lateness_max * 1000:.1f} ms, {stats.wakeups} wake-ups"
    )
    # What the clients saw. Beyond the timer's lateness, the last of them also waits
    # while both processes tear down the 9,999 connections aborted before it (about
    # 2 s of Python work for 10,000 closes on this 2-core machine).
    assert closed[-1] - start < IDLE_T + TICK + BURST_SLACK + 3.0, closed[-1] - start
    assert errors.contexts == []
