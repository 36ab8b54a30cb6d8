"""Real servers on the drop-in loop, driven by httpx on 127.0.0.1 (docs/loop.md)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aiohttp import web

import aiowheel

# Never early means the loop's clock has reached the deadline the scope set
# (``loop.time() >= when``). Not ``loop.time() - start >= 0.02``: uvloop's clock counts
# whole milliseconds, and ``(start + 0.02) - start`` is 0.01999999999998 in floats, so
# that test failed on a timeout that fired exactly on time (plain uvloop too).
_INF = float("inf")


async def _handler(request: web.Request) -> web.Response:
    loop = asyncio.get_running_loop()
    when = _INF
    try:
        async with asyncio.timeout(0.02) as scope:
            when = scope.when() or _INF
            await asyncio.Event().wait()
    except TimeoutError:
        now = loop.time()
        return web.Response(text="timeout" if now >= when else f"early {when - now}")
    return web.Response(text="no timeout")


@pytest.mark.parametrize("base", ["asyncio", "uvloop"])
def test_aiohttp_on_the_loop(base: str) -> None:
    async def main() -> list[str]:
        app = web.Application()
        app.router.add_get("/", _handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with httpx.AsyncClient() as client:
                replies = await asyncio.gather(
                    *(client.get(f"http://127.0.0.1:{port}/") for _ in range(5))
                )
            return [r.text for r in replies]
        finally:
            await runner.cleanup()

    assert aiowheel.run(main(), base=base) == ["timeout"] * 5


@pytest.mark.parametrize("base", ["asyncio", "uvloop"])
def test_uvicorn_starlette_on_the_loop(base: str) -> None:
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def endpoint(request: Request) -> PlainTextResponse:
        loop = asyncio.get_running_loop()
        when = _INF
        try:
            async with asyncio.timeout(0.02) as scope:
                when = scope.when() or _INF
                await asyncio.Event().wait()
        except TimeoutError:
            now = loop.time()
            return PlainTextResponse("timeout" if now >= when else f"early {when - now}")
        return PlainTextResponse("no timeout")

    app = Starlette(routes=[Route("/", endpoint)])

    async def main() -> list[str]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        # uvicorn offers no start-up event: yield (no clock) until its flag is set
        while not server.started:  # noqa: ASYNC110
            await asyncio.sleep(0)
        try:
            async with httpx.AsyncClient() as client:
                replies = await asyncio.gather(
                    *(client.get(f"http://127.0.0.1:{port}/") for _ in range(5))
                )
            return [r.text for r in replies]
        finally:
            server.should_exit = True
            await serving

    assert aiowheel.run(main(), base=base) == ["timeout"] * 5
