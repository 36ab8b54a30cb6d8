"""What the long-poll example's tests share: the example's modules, a server running in
the test's own event loop on 127.0.0.1 port 0 (uvicorn on asyncio and uvloop,
hypercorn on trio), and raw HTTP/1.1 over anyio streams for what httpx would not send
as is (``..`` in a path, a body that stops half-way) or not at this concurrency.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "longpoll"


def load(name: str) -> ModuleType:
    """``examples/longpoll/{name}.py`` as a module (loaded once per test run)."""
    module_name = f"longpoll_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


server = load("server")


def parse_response(data: bytes) -> tuple[int, dict[str, str], Any]:
    """(status, headers in lower case, decoded JSON body or None) of one response."""
    header, _, payload = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, json.loads(payload) if payload else None


class Server:
    def __init__(self, url: str, app: Any, http: httpx.AsyncClient) -> None:
        self.url = url
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.app = app
        self.service = app.state.longpoll
        self.log = self.service.log
        self.http = http

    def parked(self) -> int:
        return int(self.service.parked())

    async def publish(self, topic: str, message: str | bytes) -> int:
        body = message.encode() if isinstance(message, str) else message
        response = await self.http.post(f"/topics/{topic}", content=body)
        assert response.status_code == 200, response.text
        return int(response.json()["offset"])

    async def stats(self) -> dict[str, Any]:
        response = await self.http.get("/stats")
        assert response.status_code == 200
        result: dict[str, Any] = response.json()
        return result

    async def send(self, request: bytes) -> tuple[int, dict[str, str], Any]:
        """Send ``request`` as is on a new connection and read the whole answer (the
        request should say ``Connection: close``)."""
        async with await anyio.connect_tcp(self.host, self.port) as stream:
            await stream.send(request)
            data = b""
            try:
                while True:
                    data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
        return parse_response(data)

    async def raw(self, target: str, method: str = "GET", body: bytes = b"") -> tuple[int, Any]:
        """One request on its own connection, the target sent exactly as given:
        (status, decoded JSON body or None)."""
        head = f"{method} {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        head += f"Content-Length: {len(body)}\r\n\r\n"
        status, _, payload = await self.send(head.encode() + body)
        return status, payload


@asynccontextmanager
async def running(mode: str = "purgatory", **options: Any) -> AsyncIterator[Server]:
    app = server.create_app(mode, **options)
    async with (
        server.serving(app) as url,
        httpx.AsyncClient(base_url=url, timeout=None) as http,
    ):
        yield Server(url, app, http)


async def until(condition: Callable[[], bool], limit: float = 20.0) -> None:
    """Wait for a condition of the in-process server. It changes on I/O or on the
    server's timers, not by itself: polling it in 1 ms steps moves virtual clocks by as
    much, far below the 30 s max_wait_ms the polls use while we wait."""
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110 - the server exposes no event to await
            await anyio.sleep(0.001)
