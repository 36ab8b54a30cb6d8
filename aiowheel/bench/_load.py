"""The load generator of the ``server`` workload (when ``wrk`` is not installed), in a
process of its own; and the holder of its idle connections.

``python -m aiowheel.bench._load load PORT PATH CONNECTIONS SECONDS MAX_REQUESTS``:
CONNECTIONS keep-alive HTTP/1.1 connections to 127.0.0.1:PORT, each sending ``GET
PATH`` as soon as the previous response is in, until SECONDS have passed or
MAX_REQUESTS responses came (whichever first; every read is bounded too). Prints one
JSON object: requests, seconds, latency p50 and p99 (ms), errors.

``python -m aiowheel.bench._load hold PORT N``: opens N connections, makes one request
on each, prints ``ready N`` (the number of connections that got their response) and
holds them, silent, until stdin closes.

It runs on uvloop when installed (the same client for every contender either way).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any, cast

#: No response for this long: the connection counts as an error and stops.
READ_TIMEOUT = 10.0


class _Client(asyncio.Protocol):
    """One keep-alive connection: sends a request each time the previous response is
    complete (a head and its ``content-length`` bytes)."""

    def __init__(self, request: bytes, run: _Run) -> None:
        self.request = request
        self.run = run
        self.buffer = b""
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance.
        self.transport = cast(asyncio.Transport, transport)
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        if not self.run.going():
            self.transport.close()
            return
        self.run.started += 1
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = 0
            for line in self.buffer[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            self.buffer = self.buffer[end:]
            self.run.done(time.perf_counter() - self.sent)
            self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.run.going():
            self.run.errors += 1
        if not self.closed.done():
            self.closed.set_result(None)


class _Run:
    def __init__(self, seconds: float, max_requests: int) -> None:
        self.deadline = time.perf_counter() + seconds
        self.max_requests = max_requests
        self.started = 0
        self.latencies: list[float] = []
        self.errors = 0
        #: When the last response came in (the run's end when MAX_REQUESTS ends it).
        self.last = 0.0

    def going(self) -> bool:
        return self.started < self.max_requests and time.perf_counter() < self.deadline

    def done(self, latency: float) -> None:
        self.latencies.append(latency)
        self.last = time.perf_counter()


def _request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode("ascii")


def _percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile of seconds, in ms."""
    if not sorted_values:
        return None
    return sorted_values[min(int(q * len(sorted_values)), len(sorted_values) - 1)] * 1e3


async def load(port: int, path: str, connections: int, seconds: float, max_requests: int) -> Any:
    loop = asyncio.get_running_loop()
    run = _Run(seconds, max_requests)
    request = _request(path)
    t0 = time.perf_counter()
    clients = []
    for _ in range(connections):
        _transport, client = await loop.create_connection(
            lambda: _Client(request, run), "127.0.0.1", port
        )
        clients.append(client)
    # Bounded: a server that stops answering ends the run at its deadline, plus one
    # read timeout; its connections are then closed and counted as errors.
    await asyncio.wait([c.closed for c in clients], timeout=seconds + READ_TIMEOUT)
    for client in clients:
        if not client.closed.done() and client.transport is not None:
            run.errors += 1
            client.transport.abort()
    elapsed = min(run.last or time.perf_counter(), run.deadline) - t0
    latencies = sorted(run.latencies)
    return {
        "requests": len(latencies),
        "seconds": elapsed,
        "p50_ms": _percentile(latencies, 0.50),
        "p99_ms": _percentile(latencies, 0.99),
        "errors": run.errors,
    }


async def hold(port: int, n: int) -> None:
    loop = asyncio.get_running_loop()
    request = _request("/")
    held: list[asyncio.StreamWriter] = []
    answered = 0

    async def one() -> None:
        nonlocal answered
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append(writer)
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        answered += 1

    # In batches: a burst of thousands of connects overflows the listen backlog.
    async with asyncio.timeout(max(READ_TIMEOUT, n / 500)):
        for start in range(0, n, 200):
            results = await asyncio.gather(
                *(one() for _ in range(min(200, n - start))), return_exceptions=True
            )
            del results
    print(f"ready {answered}", flush=True)
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    for writer in held:
        writer.close()


def main(argv: list[str]) -> int:
    new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    with contextlib.suppress(ImportError):
        import uvloop

        new_loop = uvloop.new_event_loop
    usage = (
        "usage: python -m aiowheel.bench._load load PORT PATH CONNECTIONS SECONDS "
        "MAX_REQUESTS | hold PORT N"
    )
    with asyncio.Runner(loop_factory=new_loop) as runner:
        if len(argv) == 6 and argv[0] == "load":
            port, path, conns, seconds, most = argv[1:]
            result = runner.run(load(int(port), path, int(conns), float(seconds), int(most)))
            print(json.dumps(result), flush=True)
            return 0
        if len(argv) == 3 and argv[0] == "hold":
            with contextlib.suppress(KeyboardInterrupt):
                runner.run(hold(int(argv[1]), int(argv[2])))
            return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
