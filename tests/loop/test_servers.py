"""Real servers on the drop-in loop, driven by httpx on 127.0.0.1 (docs/loop.md)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aiohttp import web

import aiowheel


async def _handler(request: web.Request) -> web.Response:
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        async with asyncio.timeout(0.02):
            await asyncio.Event().wait()
    except TimeoutError:
        waited = loop.time() - start
        return web.Response(text="timeout" if waited >= 0.02 else f"early {waited}")
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
