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
``middleware`` mode (cumulative, the top entries).

    PYTHONPATH=$PWD python tools/idle_middleware_cost.py --rounds 7
    PYTHONPATH=$PWD python tools/idle_middleware_cost.py --loop uvloop --profile

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
    start = time.perf_counter()
    for _ in range(n):
        await app(scope, receive, send)
    return (time.perf_counter() - start) / n * 1e6


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per mode (default 7)")
    parser.add_argument("-n", type=int, default=20_000, help="requests per round")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--profile", action="store_true", help="also cProfile the middleware")
    args = parser.parse_args()
    if args.rounds < 1 or args.n < 1:
        parser.error("--rounds and -n must be at least 1")
    load_before = os.getloadavg()
    coro = measure(args.rounds, args.n, args.profile)
    if args.loop == "uvloop":
        import uvloop

        figures = uvloop.run(coro)
    else:
        figures = asyncio.run(coro)
    load_after = os.getloadavg()
    medians = {name: statistics.median(values) for name, values in figures.items()}
    print(
        f"loop {args.loop}, {args.rounds} rounds of {args.n:,} requests, "
        f"AIOWHEEL_PURE={os.environ.get('AIOWHEEL_PURE', '')!r}"
    )
    for name, values in figures.items():
        low, high = min(values), max(values)
        print(f"{name:>16}: {medians[name]:6.2f} us/request  (range {low:.2f}-{high:.2f})")
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
