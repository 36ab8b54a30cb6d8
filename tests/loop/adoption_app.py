"""What tests/loop/test_adoption.py serves: the probe, the apps, the servers' programs.

Run as a program it is a user's server, started as the docs tell (docs/loop.md,
"Adopting it"), on a listening socket the test inherited to it (``fd``)::

    python adoption_app.py uvicorn|aiohttp|hypercorn asyncio|uvloop FD

and it serves until SIGINT (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import aiowheel

DELAY = 0.02


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """The loop's class by name: compares across processes."""
    cls = type(loop)
    return f"{cls.__module__}.{cls.__qualname__}"


def wheel_kind(base: str) -> str:
    """The class of ``aiowheel.new_event_loop(base=base)``'s loops."""
    loop = aiowheel.new_event_loop(base=base)
    try:
        return loop_kind(loop)
    finally:
        loop.close()


async def probe() -> str:
    """``"<loop class> on-time"`` when an ``asyncio.timeout`` fired never early.

    Never early means the loop's clock reached the scope's deadline when the timeout
    fired (``loop.time() >= when``); not ``elapsed >= DELAY``, which float rounding of
    uvloop's whole-millisecond clock breaks on a timeout that fired exactly on time.
    """
    loop = asyncio.get_running_loop()
    when = float("inf")
    try:
        async with asyncio.timeout(DELAY) as scope:
            when = scope.when() or when
            await asyncio.Event().wait()
    except TimeoutError:
        now = loop.time()
        verdict = "on-time" if now >= when else f"early-by-{when - now!r}"
    else:  # pragma: no cover - the event is never set
        verdict = "no-timeout"
    return f"{loop_kind(loop)} {verdict}"


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI app (uvicorn, hypercorn): every GET answers ``probe()``."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    assert scope["type"] == "http"
    body = (await probe()).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def aiohttp_app() -> Any:
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=await probe())

    app = web.Application()
    app.router.add_get("/", handler)
    return app


def serve_uvicorn(base: str, fd: int) -> None:
    import uvicorn

    # As docs/loop.md says: the import string of aiowheel's loop factory. uvicorn
    # imports it and calls it with no arguments (asyncio.Runner's loop_factory).
    loop = "aiowheel:new_event_loop" if base == "asyncio" else "aiowheel:new_uvloop_event_loop"
    uvicorn.run(asgi_app, loop=loop, fd=fd, lifespan="on", log_level="warning")


def serve_aiohttp(base: str, fd: int) -> None:
    from aiohttp import web

    sock = socket.socket(fileno=fd)
    web.run_app(aiohttp_app(), sock=sock, loop=aiowheel.new_event_loop(base=base), print=None)


def serve_hypercorn(base: str, fd: int) -> None:
    import hypercorn.config
    import hypercorn.run

    # hypercorn's own runner (what its command line does) takes no loop factory: its
    # "asyncio" worker asks the policy for a loop (its "uvloop" worker calls
    # uvloop.new_event_loop directly, so aiowheel's uvloop base goes through the policy).
    asyncio.set_event_loop_policy(aiowheel.EventLoopPolicy(base=base))
    config = hypercorn.config.Config()
    config.application_path = "adoption_app:asgi_app"
    config.bind = [f"fd://{fd}"]
    config.worker_class = "asyncio"
    config.workers = 0  # serve in this process
    config.loglevel = "WARNING"
    hypercorn.run.run(config)


if __name__ == "__main__":
    server, base, fd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    serve = {"uvicorn": serve_uvicorn, "aiohttp": serve_aiohttp, "hypercorn": serve_hypercorn}
    serve[server](base, fd)
    print("stopped cleanly", flush=True)
