"""The server of the ``server`` workload: one uvicorn on 127.0.0.1, in a process of its
own, on the event loop its contender names (``server.py`` starts it).

``python -m aiowheel.bench._serve LOOP GUARD``; LOOP: ``asyncio``, ``uvloop``,
``rloop``, ``loop-asyncio``, ``loop-uvloop`` (the drop-in loop on that base);
GUARD, what closes idle connections (after ``GUARD_TIMEOUT`` seconds, longer than
any measuring window: the idle connections stay open): ``uvicorn`` (uvicorn's own
keep-alive timeout), ``protocol`` (``aiowheel.middleware.uvicorn_protocol``),
``middleware`` (``IdleTimeoutMiddleware`` around the app, and ``uvicorn_protocol``).

It binds port 0, prints the port on one line of stdout, and serves until SIGTERM or
stdin closes (the parent gone: the server never outlives it):

* ``GET /``: the trivial app (a few bytes);
* ``GET /t``: the timeout-heavy app: each request awaits three short operations
  under ``asyncio.timeout(10)`` and two under ``asyncio.wait_for(..., 10)``, as
  database and HTTP clients do (each completes at once; its timeout is armed, then
  cancelled);
* ``GET /__stats``: this process's CPU seconds, RSS and collector pauses, as JSON;
  ``/__stats?gc=1`` also times one full ``gc.collect()``; ``?reset=1`` starts the
  longest pause over (after reporting it).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: The idle timeout of the guarded servers (longer than any measuring window).
GUARD_TIMEOUT = 30.0
LOOPS = ("asyncio", "uvloop", "rloop", "loop-asyncio", "loop-uvloop")
GUARDS = ("uvicorn", "protocol", "middleware")

_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
_TIMEOUT = 10.0


class _Pauses:
    """The collector's pauses (``gc.callbacks``: a collection's start to its stop)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.longest = 0.0
        self.collections = 0
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause = time.perf_counter() - self._start
        self.total += pause
        self.longest = max(self.longest, pause)
        self.collections += 1


_pauses = _Pauses()


def _rss() -> int | None:
    """Resident bytes (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _stats(full_gc: bool, reset: bool = False) -> bytes:
    gc_full = None
    if full_gc:
        t0 = time.perf_counter()
        gc.collect()
        gc_full = time.perf_counter() - t0
    longest = _pauses.longest
    if reset:
        # The next report's longest pause is of the collections from now on.
        _pauses.longest = 0.0
    return json.dumps(
        {
            # process_time: user + system CPU of this process, at a finer grain than
            # os.times()'s clock ticks.
            "cpu": time.process_time(),
            "rss": _rss(),
            "gc_total": _pauses.total,
            "gc_longest": longest,
            "gc_collections": _pauses.collections,
            "gc_full": gc_full,
        }
    ).encode()


async def _short() -> None:
    """An operation that completes on the next loop iteration (a reply already in)."""
    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(future.set_result, None)
    await future


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/t":
        for _ in range(3):
            async with asyncio.timeout(_TIMEOUT):
                await _short()
        for _ in range(2):
            await asyncio.wait_for(_short(), _TIMEOUT)
    if path == "/__stats":
        query = scope.get("query_string", b"")
        body = _stats(b"gc=1" in query, reset=b"reset=1" in query)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": b"ok"})


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    if name.startswith("loop-"):
        import aiowheel

        return aiowheel.new_event_loop(base=name.removeprefix("loop-"))
    if name == "asyncio":
        return asyncio.new_event_loop()
    # uvloop, rloop: imported by name (rloop ships no type information).
    loop: asyncio.AbstractEventLoop = importlib.import_module(name).new_event_loop()
    return loop


def _watch_parent(loop: asyncio.AbstractEventLoop, server: Any) -> None:
    """Stop when stdin closes: the parent exited or gave up on us."""

    def read() -> None:
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(setattr, server, "should_exit", True)

    threading.Thread(target=read, daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in LOOPS or argv[1] not in GUARDS:
        print(
            f"usage: python -m aiowheel.bench._serve {{{','.join(LOOPS)}}} {{{','.join(GUARDS)}}}",
            file=sys.stderr,
        )
        return 2
    import uvicorn

    loop_name, guard = argv
    asgi: Any = app
    options: dict[str, Any] = {"timeout_keep_alive": GUARD_TIMEOUT}
    if guard in ("protocol", "middleware"):
        from aiowheel.middleware import IdleTimeoutMiddleware, uvicorn_protocol

        options["http"] = uvicorn_protocol(timeout=GUARD_TIMEOUT)
        if guard == "middleware":
            asgi = IdleTimeoutMiddleware(app, timeout=GUARD_TIMEOUT)
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY on accepted sockets only when their
    # proto says TCP, and a socket made with proto 0 gets Nagle's delays (40 ms a
    # response, each written in two parts, against the client's delayed ACKs).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    config = uvicorn.Config(
        asgi,
        loop="none",
        lifespan="off",
        log_level="error",
        access_log=False,
        backlog=4096,
        limit_concurrency=None,
        timeout_graceful_shutdown=1,
        **options,
    )
    server = uvicorn.Server(config)
    loop = new_loop(loop_name)
    asyncio.set_event_loop(loop)
    print(sock.getsockname()[1], flush=True)
    _watch_parent(loop, server)
    try:
        loop.run_until_complete(server.serve(sockets=[sock]))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
