"""The drop-in loop wherever a loop factory or policy is taken (docs/loop.md, "Adopting it").

Each path, on both bases, serves on 127.0.0.1 and a handler answers ``probe()``
(tests/loop/adoption_app.py): the running loop's class, which must be the class of
``aiowheel.new_event_loop(base=...)``'s loops, and whether its ``asyncio.timeout``
fired never early. The servers started as programs (``uvicorn.run``, aiohttp's
``web.run_app``, hypercorn's runner) run in a child process on a socket the test bound
and put in listening state first: the client connects at once and its request waits in
the kernel's backlog until the server accepts (no readiness polling), and SIGINT
(Ctrl-C) stops the server, which must then exit cleanly.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import aiowheel

from .adoption_app import asgi_app, loop_kind, probe, wheel_kind

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uvloop, SIGINT, pass_fds")

HERE = Path(__file__).resolve().parent
BASES = ["asyncio", "uvloop"]
REQUESTS = 5
# Generous: a child process imports its server on a shared, loaded machine. Only a
# bound on a hang; nothing waits for it to pass.
PATIENCE = 60.0

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def factory(base: str) -> LoopFactory:
    """A zero-argument loop factory as the issue writes them."""
    if base == "asyncio":
        return aiowheel.new_event_loop
    return functools.partial(aiowheel.new_event_loop, base="uvloop")


def on_time(base: str) -> str:
    return f"{wheel_kind(base)} on-time"


def test_the_probe_tells_the_wheel_loops_apart() -> None:
    # What the tests below compare is meaningful: each base's wheel loop has its own
    # class, a proper subclass of the base loop's, so a plain loop cannot pass.
    import uvloop

    kinds = {wheel_kind(base) for base in BASES}
    assert len(kinds) == 2
    for base, plain in (("asyncio", asyncio.SelectorEventLoop), ("uvloop", uvloop.Loop)):
        loop = aiowheel.new_event_loop(base=base)
        try:
            assert isinstance(loop, plain)
            assert type(loop) is not plain
        finally:
            loop.close()
        other = plain()
        try:
            assert loop_kind(other) not in kinds
        finally:
            other.close()


async def _serve_streams() -> list[str]:
    """An asyncio stream server on 127.0.0.1 whose handler answers ``probe()``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write((await probe()).encode() + b"\n")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def ask(port: int) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"probe\n")
        await writer.drain()
        reply = await reader.readline()
        writer.close()
        await writer.wait_closed()
        return reply.decode().strip()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return list(await asyncio.gather(*(ask(port) for _ in range(REQUESTS))))


@pytest.mark.parametrize("base", BASES)
def test_asyncio_runner_loop_factory(base: str) -> None:
    # Python 3.11: asyncio.Runner(loop_factory=aiowheel.new_event_loop), and
    # functools.partial(aiowheel.new_event_loop, base="uvloop") for uvloop.
    with asyncio.Runner(loop_factory=factory(base)) as runner:
        assert loop_kind(runner.get_loop()) == wheel_kind(base)
        assert runner.run(_serve_streams()) == [on_time(base)] * REQUESTS


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.run(loop_factory=) is 3.12+")
@pytest.mark.parametrize("base", BASES)
def test_asyncio_run_loop_factory(base: str) -> None:
    run: Callable[..., list[str]] = asyncio.run
    assert run(_serve_streams(), loop_factory=factory(base)) == [on_time(base)] * REQUESTS


async def _get_all(port: int) -> list[str]:
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        replies = await asyncio.gather(
            *(client.get(f"http://127.0.0.1:{port}/") for _ in range(REQUESTS))
        )
    for reply in replies:
        reply.raise_for_status()
    return [reply.text for reply in replies]


def _listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(REQUESTS * 2)
    return sock


def _serve_in_child(server: str, base: str) -> list[str]:
    """Run ``adoption_app.py server base FD``, GET it, stop it with SIGINT."""
    sock = _listening_socket()
    port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    command = [sys.executable, str(HERE / "adoption_app.py"), server, base, str(sock.fileno())]
    child = subprocess.Popen(
        command,
        pass_fds=[sock.fileno()],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The child holds the listening socket now; closing ours means a child that dies
    # before serving fails the client at once (connection reset), not after a timeout.
    sock.close()
    try:
        replies = aiowheel.run(_get_all(port))
    except Exception as exc:
        child.kill()
        _, err = child.communicate(timeout=PATIENCE)
        raise AssertionError(f"{server} on {base} did not serve; its stderr:\n{err}") from exc
    child.send_signal(signal.SIGINT)
    try:
        out, err = child.communicate(timeout=PATIENCE)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise AssertionError(f"{server} on {base} did not stop on SIGINT") from None
    # Stopped cleanly: not killed by the signal, no traceback. (Not "stderr is empty":
    # a newer Python may warn there, e.g. 3.14 about event-loop policies.)
    assert child.returncode == 0, err
    assert out == "stopped cleanly\n", err
    assert "Traceback" not in err, err
    return replies


@pytest.mark.parametrize("base", BASES)
def test_uvicorn_run_with_the_loop_import_string(base: str) -> None:
    # uvicorn.run(app, loop="aiowheel:new_event_loop"): uvicorn imports the string and
    # uses what it names as asyncio.Runner's loop_factory (called with no arguments).
    # The uvloop base: loop="aiowheel:new_uvloop_event_loop".
    assert _serve_in_child("uvicorn", base) == [on_time(base)] * REQUESTS


@pytest.mark.parametrize("base", BASES)
def test_uvicorn_command_line_loop_option(base: str) -> None:
    # `uvicorn --loop aiowheel:new_event_loop app:app`: uvicorn's command line takes the
    # import string as it is, and its Config resolves it to the factory uvicorn.run
    # uses above (the server itself is the test above's).
    import uvicorn
    from uvicorn.main import main as uvicorn_cli

    name = "new_event_loop" if base == "asyncio" else "new_uvloop_event_loop"
    context = uvicorn_cli.make_context("uvicorn", ["--loop", f"aiowheel:{name}", "app:app"])
    assert context.params["loop"] == f"aiowheel:{name}"
    config = uvicorn.Config(asgi_app, loop=context.params["loop"])
    loop_factory = config.get_loop_factory()
    assert loop_factory is getattr(aiowheel, name)
    loop = loop_factory()
    try:
        assert loop_kind(loop) == wheel_kind(base)
    finally:
        loop.close()


# Starlette 1.x asks for httpx2 beside httpx; the client is the same for this test.
@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
@pytest.mark.parametrize("base", BASES)
def test_starlette_test_client_with_anyio_loop_factory(base: str) -> None:
    # FastAPI's TestClient is Starlette's: it runs the app through anyio, on a plain
    # loop unless anyio's asyncio backend is given the loop factory.
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def endpoint(request: object) -> PlainTextResponse:
        on_wheel = aiowheel.loop_timer() is not None
        return PlainTextResponse(f"{await probe()} {on_wheel}")

    app = Starlette(routes=[Route("/", endpoint)])
    options = {"loop_factory": factory(base)}
    with TestClient(app, backend="asyncio", backend_options=options) as client:
        assert client.get("/").text == f"{on_time(base)} True"
    with TestClient(app) as client:  # without it: a plain loop
        assert client.get("/").text.endswith(" False")


@pytest.mark.parametrize("base", BASES)
def test_aiohttp_run_app_with_the_loop(base: str) -> None:
    # web.run_app(app, loop=aiowheel.new_event_loop(base=...)); run_app closes it.
    assert _serve_in_child("aiohttp", base) == [on_time(base)] * REQUESTS


@pytest.mark.parametrize("base", BASES)
def test_hypercorn_runner_with_the_policy(base: str) -> None:
    # hypercorn's own runner (its command line) takes no loop factory: its asyncio
    # worker gets its loop from aiowheel.EventLoopPolicy(base=...).
    assert _serve_in_child("hypercorn", base) == [on_time(base)] * REQUESTS


@pytest.mark.parametrize("base", BASES)
def test_hypercorn_serve_on_the_loop(base: str) -> None:
    # hypercorn.asyncio.serve(), the programmatic form, in asyncio.Runner(loop_factory=).
    import hypercorn.asyncio
    import hypercorn.config

    async def main() -> list[str]:
        sock = _listening_socket()
        port = sock.getsockname()[1]
        config = hypercorn.config.Config()
        config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) it now
        config.loglevel = "WARNING"
        stop = asyncio.Event()
        serving = asyncio.ensure_future(
            hypercorn.asyncio.serve(asgi_app, config, shutdown_trigger=stop.wait)
        )
        try:
            return await _get_all(port)
        finally:
            stop.set()
            await serving

    with asyncio.Runner(loop_factory=factory(base)) as runner:
        assert runner.run(main()) == [on_time(base)] * REQUESTS


# -- pytest-asyncio: a project's own suite on the loop --------------------------------

# The project's tests: an async fixture serving on 127.0.0.1 and tests that check they
# run on the loop their parameter names (the id ends with the base) and that a timeout
# inside the server's handler fires never early. The second test shares a module-scoped
# loop.
INNER_TESTS = """
import asyncio

import pytest
import pytest_asyncio

from adoption_app import probe, wheel_kind


def expected(request):
    base = "uvloop" if request.node.name.endswith("uvloop]") else "asyncio"
    return f"{wheel_kind(base)} on-time"


@pytest_asyncio.fixture
async def port():
    async def handle(reader, writer):
        await reader.readline()
        writer.write((await probe()).encode() + b"\\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


@pytest.mark.asyncio
async def test_server_handler_on_the_loop(port, request):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"probe\\n")
    reply = (await reader.readline()).decode().strip()
    writer.close()
    assert reply == expected(request)


@pytest.mark.asyncio(loop_scope="module")
async def test_module_scoped_loop(request):
    assert await probe() == expected(request)
"""

INNER_INI = """
[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
"""


def _run_inner_suite(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str
) -> pytest.RunResult:
    pytester.makeini(INNER_INI)
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_project=INNER_TESTS)
    # In a process of its own, with adoption_app importable: pytest-asyncio's session
    # run in this one left an unclosed event loop behind (`-W error::ResourceWarning`
    # reported it in another module's test, when it was collected).
    pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    # Without looptime's plugin (installed here for this repository's own tests): on a
    # pure-Python loop it swaps in a subclass of the loop's class to fake its clock.
    return pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", "-p", "no:looptime_plugin")


def test_pytest_asyncio_loop_factories_hook(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest-asyncio 1.5's way (its event_loop_policy fixture is deprecated there): the
    # pytest_asyncio_loop_factories hook; every async test runs once per factory.
    result = _run_inner_suite(
        pytester,
        monkeypatch,
        """
import functools

import aiowheel


def pytest_asyncio_loop_factories(config, item):
    return {
        "wheel-asyncio": aiowheel.new_event_loop,
        "wheel-uvloop": functools.partial(aiowheel.new_event_loop, base="uvloop"),
    }
""",
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines_random(
        [
            "*test_server_handler_on_the_loop?wheel-asyncio? PASSED*",
            "*test_server_handler_on_the_loop?wheel-uvloop? PASSED*",
            "*test_module_scoped_loop?wheel-asyncio? PASSED*",
            "*test_module_scoped_loop?wheel-uvloop? PASSED*",
        ]
    )


def test_pytest_asyncio_event_loop_policy_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The event-loop policy fixture (pytest-asyncio < 1.5's way; 1.5 still honours it
    # with a PytestDeprecationWarning), parametrized over the bases.
    result = _run_inner_suite(
        pytester,
        monkeypatch,
        """
import pytest

import aiowheel


@pytest.fixture(scope="session", params=["asyncio", "uvloop"])
def event_loop_policy(request):
    return aiowheel.EventLoopPolicy(base=request.param)
""",
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(['*Overriding the "event_loop_policy" fixture is deprecated*'])
    result.stdout.fnmatch_lines_random(
        [
            "*test_server_handler_on_the_loop?asyncio? PASSED*",
            "*test_server_handler_on_the_loop?uvloop? PASSED*",
            "*test_module_scoped_loop?asyncio? PASSED*",
            "*test_module_scoped_loop?uvloop? PASSED*",
        ]
    )
