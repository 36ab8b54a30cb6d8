"""The shared idle timer: one per event loop, lazily started, or explicitly owned."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio
import uvloop

from aiowheel import Timer
from aiowheel.middleware import DEFAULT_TICK, get_shared_timer, shared_timer
from aiowheel.middleware._shared import abort_with_reset


def run_lazily_on_asyncio(runner: Any) -> tuple[Timer, list[dict[str, Any]]]:
    errors: list[dict[str, Any]] = []

    async def main() -> Timer:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        timers = await asyncio.gather(*(get_shared_timer() for _ in range(20)))
        assert all(timer is timers[0] for timer in timers)  # concurrent first users share
        assert await get_shared_timer() is timers[0]
        handle = timers[0].schedule_nowait(60, print)  # left pending on purpose
        assert handle.pending()
        return timers[0]

    return runner(main()), errors


@pytest.mark.parametrize("runner", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_lazy_timer_lives_until_the_loop_shuts_down(runner: Any) -> None:
    timer, errors = run_lazily_on_asyncio(runner)
    # asyncio.run cancelled its owner task at shutdown, which closed it cleanly.
    assert timer.closed
    assert len(timer) == 0
    assert timer.tick == DEFAULT_TICK
    assert errors == []
    # Another loop, another timer.
    other, _ = run_lazily_on_asyncio(runner)
    assert other is not timer


def test_lazy_timer_on_trio_is_a_system_task() -> None:
    async def main() -> Timer:
        async with trio.open_nursery() as nursery:
            found: list[Timer] = []

            async def use() -> None:
                found.append(await get_shared_timer())

            for _ in range(5):
                nursery.start_soon(use)
        assert all(timer is found[0] for timer in found)
        assert found[0].backend == "trio"
        assert not found[0].closed
        return found[0]

    timer = trio.run(main)
    assert timer.closed  # trio cancelled its system task when main returned
    assert trio.run(main) is not timer


@pytest.mark.anyio
async def test_explicit_shared_timer_owns_the_lifetime() -> None:
    async with shared_timer() as timer:
        assert await get_shared_timer() is timer
        with pytest.raises(RuntimeError, match="already has a shared"):
            async with shared_timer():
                pass  # pragma: no cover
    assert timer.closed
    lazy = await get_shared_timer()  # afterwards: a lazy one again
    assert lazy is not timer
    assert not lazy.closed


@pytest.mark.anyio
async def test_explicit_shared_timer_with_a_given_timer() -> None:
    new = Timer(tick=0.005)
    async with shared_timer(new) as timer:
        assert timer is new
        assert await get_shared_timer() is new
        assert new.backend != ""  # started by shared_timer()
    assert new.closed  # started here, so closed here

    async with Timer() as running:
        async with shared_timer(running) as timer:
            assert timer is running
            assert await get_shared_timer() is running
        assert not running.closed  # someone else's: only registered

    with pytest.raises(ValueError, match="closed"):
        async with shared_timer(new):
            pass  # pragma: no cover
    with pytest.raises(TypeError):
        async with shared_timer("timer"):  # type: ignore[arg-type]
            pass  # pragma: no cover


class _Transport:
    """A transport double: what ``abort_with_reset`` asks of it."""

    def __init__(self, sock: object) -> None:
        self.sock = sock
        self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    def abort(self) -> None:
        self.aborted = True


class _RefusingSocket:
    def setsockopt(self, *args: object) -> None:
        raise OSError(95, "Operation not supported")


@pytest.mark.parametrize("sock", [None, _RefusingSocket()], ids=["no socket", "refused"])
def test_abort_with_reset_aborts_transports_without_a_tcp_socket(sock: object) -> None:
    transport = _Transport(sock)
    abort_with_reset(transport)
    assert transport.aborted


def test_abort_with_reset_sets_a_zero_linger_first() -> None:
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        transport = _Transport(sock)
        abort_with_reset(transport)
        assert transport.aborted
        linger = sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.calcsize("ii"))
        assert struct.unpack("ii", linger) == (1, 0)
