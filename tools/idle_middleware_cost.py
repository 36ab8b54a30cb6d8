"""What one request costs through ``IdleTimeoutMiddleware``, without a server.

One trivial HTTP request (``http.response.start`` + ``http.response.body``, what the
``server`` workload's trivial app sends) is pushed through the ASGI callable again
and again inside one running event loop, in these modes, alternating them round after
round (A B C D, B C D A, ...: machine drift hits all alike):

* ``bare``: the app alone;
* ``scope``: the app inside a bare ``anyio.CancelScope`` (what a cancel scope per
  request costs, the old shape of the middleware's cancel);
* ``middleware``: ``IdleTimeoutMiddleware(app, timeout=30)`` on the loop's shared
  timer (the default: no ``timer=``), as ``aiowheel bench -w server`` runs it;
* ``behind-protocol``: the same with the request's connection in the scope, as
  ``uvicorn_protocol`` puts it there: the connection's filing times the request.

It prints each mode's median µs per request over the rounds, the range, and the
ratios of ``middleware`` to ``bare`` and to ``scope`` measured in the same run, and
the load average before and after. ``--profile`` also prints a cProfile of the
``middleware`` mode (the top entries by own time).

``--server`` measures what a server spends on it instead, without sockets: uvicorn's
h11 protocol driven in-process (a stand-in transport; each request fed to
``data_received``, its response awaited), in three modes, interleaved the same way:
``uvicorn`` (uvicorn's own protocol, the trivial app), ``protocol``
(``uvicorn_protocol``) and ``protocol+middleware`` (and ``IdleTimeoutMiddleware``
around the app), with each mode's ratio of requests per second to ``uvicorn``'s.
No kernel, no load generator: the per-request cost of the two on the server's CPU.

``--server --only MODE`` runs one mode alone, for an instruction count that the
machine's other work cannot move: run it under ``valgrind --tool=callgrind`` with two
``-n`` (``-n 2000`` and ``-n 8000``: 500 and 2,000 requests a round, one round
each), and divide the difference of the two totals by the difference of the
requests (the imports and the warm-up cancel out). CPython's bytecode is the same
whatever the machine runs beside it, so counts differ by well under 0.1% from one
run to the next, where CPU times move by tens of percent.

Every figure is this process's CPU time (``time.process_time``) per request, not the
wall clock: on a loaded machine the process is preempted, and the wall clock counts
the other processes' turns.

    PYTHONPATH=$PWD python tools/idle_middleware_cost.py --rounds 7
    PYTHONPATH=$PWD python tools/idle_middleware_cost.py --loop uvloop --profile
    PYTHONPATH=$PWD python tools/idle_middleware_cost.py --server --loop uvloop
    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
        python tools/idle_middleware_cost.py --server --only protocol --rounds 1 -n 2000

Under ``AIOWHEEL_PURE=1`` the timer's core is the pure-Python one. On a shared
machine single figures move by tens of percent: compare medians, and rerun.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from aiowheel.middleware import IdleTimeoutMiddleware, get_shared_timer
from aiowheel.middleware._shared import CONNECTION_KEY
from aiowheel.middleware._uvicorn import _ConnectionWatch

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
App = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
_START: Message = {"type": "http.response.start", "status": 200, "headers": _HEADERS}
_BODY: Message = {"type": "http.response.body", "body": b"ok"}
_REQUEST: Message = {"type": "http.request", "body": b"", "more_body": False}


async def trivial(scope: Scope, receive: Any, send: Any) -> None:
    await send(_START)
    await send(_BODY)


async def in_scope(scope: Scope, receive: Any, send: Any) -> None:
    with anyio.CancelScope():
        await trivial(scope, receive, send)


async def receive() -> Message:
    return _REQUEST


async def send(message: Message) -> None:
    pass


def http_scope() -> Scope:
    """A scope shaped like uvicorn's for ``GET /``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "GET",
        "root_path": "",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000")],
        "state": {},
    }


class _Cycle:
    response_complete = False  # a request in flight


class _Protocol:
    cycle = _Cycle()


class _Transport:
    def is_closing(self) -> bool:  # pragma: no cover - never expires here
        return False

    def get_write_buffer_size(self) -> int:  # pragma: no cover
        return 0


def connection() -> Any:
    """The connection ``uvicorn_protocol`` puts in a request's scope (its real watch,
    on a stand-in protocol and transport), filed on the loop's shared timer."""
    watch = _ConnectionWatch(_Protocol(), _Transport(), 30.0, 30.0)  # type: ignore[arg-type]
    watch.start(None)
    return watch


async def per_request_us(app: App, scope: Scope, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        await app(scope, receive, send)
    return (time.process_time() - start) / n * 1e6


async def measure(rounds: int, n: int, profile: bool) -> dict[str, list[float]]:
    middleware = IdleTimeoutMiddleware(trivial, timeout=30)
    await get_shared_timer()
    behind = dict(http_scope())
    behind[CONNECTION_KEY] = connection()
    modes: list[tuple[str, App, Scope]] = [
        ("bare", trivial, http_scope()),
        ("scope", in_scope, http_scope()),
        ("middleware", middleware, http_scope()),
        ("behind-protocol", middleware, behind),
    ]
    for _, app, scope in modes:  # warm-up: the shared timer starts, caches fill
        await per_request_us(app, scope, n // 10 or 1)
    figures: dict[str, list[float]] = {name: [] for name, _, _ in modes}
    for round_ in range(rounds):
        k = round_ % len(modes)
        for name, app, scope in modes[k:] + modes[:k]:
            figures[name].append(await per_request_us(app, scope, n))
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await per_request_us(middleware, http_scope(), n)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    return figures


class _StandInTransport(asyncio.Transport):
    """What uvicorn's protocol writes to, in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def writelines(self, list_of_data: Any) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in ("sockname", "peername"):
            return ("127.0.0.1", 8000)
        return default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:  # pragma: no cover - keep-alive: never closed here
        self.closing = True

    def abort(self) -> None:  # pragma: no cover
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:  # pragma: no cover
        pass

    def get_write_buffer_size(self) -> int:
        return 0


_GET = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n"


def _signalling(base: type[Any]) -> type[Any]:
    """``base`` with its completed responses counted and awaited."""

    class Signalling(base):  # type: ignore[misc]
        done: asyncio.Future[None] | None = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.done is not None:
                self.done.set_result(None)

    return Signalling


async def server_per_request_us(protocol: Any, n: int) -> float:
    loop = asyncio.get_running_loop()
    start = time.process_time()
    for _ in range(n):
        done = protocol.done = loop.create_future()
        protocol.data_received(_GET)
        await done
    return (time.process_time() - start) / n * 1e6


async def measure_server(rounds: int, n: int, only: str | None = None) -> dict[str, list[float]]:
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.server import ServerState

    from aiowheel.middleware import uvicorn_protocol

    def connect(app: Any, cls: type[Any]) -> Any:
        config = uvicorn.Config(app, log_level="error", access_log=False, timeout_keep_alive=30)
        config.load()
        protocol = _signalling(cls)(config=config, server_state=ServerState(), app_state={})
        protocol.connection_made(_StandInTransport())
        return protocol

    await get_shared_timer()
    guarded = uvicorn_protocol(timeout=30, base="h11")
    modes = [
        ("uvicorn", connect(trivial, H11Protocol)),
        ("protocol", connect(trivial, guarded)),
        ("protocol+middleware", connect(IdleTimeoutMiddleware(trivial, timeout=30), guarded)),
    ]
    if only is not None:
        modes = [(name, protocol) for name, protocol in modes if name == only]
    for _, protocol in modes:  # warm-up
        await server_per_request_us(protocol, n // 10 or 1)
    figures: dict[str, list[float]] = {name: [] for name, _ in modes}
    for round_ in range(rounds):
        k = round_ % len(modes)
        for name, protocol in modes[k:] + modes[:k]:
            figures[name].append(await server_per_request_us(protocol, n))
    for _, protocol in modes:
        protocol.transport.close()
        protocol.connection_lost(None)
    return figures


SERVER_MODES = ("uvicorn", "protocol", "protocol+middleware")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per mode (default 7)")
    parser.add_argument("-n", type=int, default=20_000, help="requests per round")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--profile", action="store_true", help="also cProfile the middleware")
    parser.add_argument(
        "--server", action="store_true", help="uvicorn's protocol in-process instead"
    )
    parser.add_argument(
        "--only",
        choices=SERVER_MODES,
        help="with --server: this mode alone (for an instruction count: see the docstring)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.n < 1:
        parser.error("--rounds and -n must be at least 1")
    if args.only is not None and not args.server:
        parser.error("--only goes with --server")
    load_before = os.getloadavg()
    n = args.n if not args.server else max(1, args.n // 4)
    coro = (
        measure_server(args.rounds, n, args.only)
        if args.server
        else measure(args.rounds, n, args.profile)
    )
    if args.loop == "uvloop":
        import uvloop

        figures = uvloop.run(coro)
    else:
        figures = asyncio.run(coro)
    load_after = os.getloadavg()
    medians = {name: statistics.median(values) for name, values in figures.items()}
    print(
        f"loop {args.loop}, {args.rounds} rounds of {n:,} requests, "
        f"AIOWHEEL_PURE={os.environ.get('AIOWHEEL_PURE', '')!r}"
    )
    for name, values in figures.items():
        low, high = min(values), max(values)
        print(f"{name:>20}: {medians[name]:6.2f} us/request  (range {low:.2f}-{high:.2f})")
    if args.only is not None:
        pass
    elif args.server:
        base = medians["uvicorn"]
        for name in ("protocol", "protocol+middleware"):
            print(
                f"{name} - uvicorn: {medians[name] - base:.2f} us; "
                f"requests/s against uvicorn's: {base / medians[name]:.3f}"
            )
    else:
        for name in ("middleware", "behind-protocol"):
            print(
                f"{name} - bare: {medians[name] - medians['bare']:.2f} us; "
                f"{name} / bare: {medians[name] / medians['bare']:.1f}x; "
                f"{name} / scope: {medians[name] / medians['scope']:.2f}x"
            )
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*load_before))
    print("load average after:  {:.2f} {:.2f} {:.2f}".format(*load_after))


if __name__ == "__main__":
    main()
