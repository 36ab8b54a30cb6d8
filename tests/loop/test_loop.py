"""aiowheel.new_event_loop: the base loop with call_at/call_later on a wheel (docs/loop.md)."""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
from typing import Any

import pytest

import aiowheel
from aiowheel._loophandle import LoopTimerHandle

BASES = ["asyncio", "uvloop"]


def run_on(base: str, main: Any) -> Any:
    return aiowheel.run(main(), base=base)


@pytest.mark.parametrize("base", BASES)
def test_handle_contract(base: str) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outer")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, bool]] = []
        done = loop.create_future()
        ctx = contextvars.copy_context()
        ctx.run(var.set, "inner")

        def cb() -> None:
            seen.append((var.get(), loop.time() >= handle.when()))
            done.set_result(None)

        handle = loop.call_later(0.005, cb, context=ctx)
        assert isinstance(handle, LoopTimerHandle)  # the wheel's entry itself
        assert handle.get_context() is ctx
        assert repr(handle).startswith("<TimerHandle when=")
        assert not handle.cancelled()
        await done
        assert seen == [("inner", True)]
        other = loop.call_later(10, cb)
        assert len(loop._wheel) == 1  # type: ignore[attr-defined]
        other.cancel()
        assert other.cancelled()
        assert len(loop._wheel) == 0  # type: ignore[attr-defined]  # off the wheel at once

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_exceptions_go_to_the_loop_handler(base: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        got = loop.create_future()
        loop.set_exception_handler(lambda _loop, context: got.set_result(context))

        def boom() -> None:
            raise ZeroDivisionError

        loop.call_later(0.001, boom)
        context = await got
        assert isinstance(context["exception"], ZeroDivisionError)
        assert isinstance(context["handle"], LoopTimerHandle)

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_order_and_never_early(base: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fired: list[int] = []
        early: list[float] = []
        now = loop.time()
        whens = [now + d for d in (0.02, 0.01, 0.015, 0.01, 0.0, 0.02, 0.003)]
        done = loop.create_future()

        def cb(i: int) -> None:
            if loop.time() < whens[i]:
                early.append(whens[i] - loop.time())
            fired.append(i)
            if len(fired) == len(whens):
                done.set_result(None)

        for i, when in enumerate(whens):
            loop.call_at(when, cb, i)
        await done
        assert early == []
        # when order, ties in scheduling order
        assert fired == sorted(range(len(whens)), key=lambda i: (whens[i], i))

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_cancel_inside_the_same_pass(base: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fired: list[str] = []
        when = loop.time() + 0.005
        done = loop.create_future()
        loop.call_at(when, lambda: (fired.append("a"), second.cancel()))
        second = loop.call_at(when, fired.append, "b")
        loop.call_at(when + 0.001, done.set_result, None)
        await done
        assert fired == ["a"]

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_asyncio_timeouts(base: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        assert loop.time() >= start + 0.01
        assert await asyncio.wait_for(asyncio.sleep(0, "x"), 1) == "x"
        assert len(loop._wheel) == 0  # type: ignore[attr-defined]

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_close_drops_pending(base: str) -> None:
    loop = aiowheel.new_event_loop(base=base)
    handle = loop.call_later(100, print)
    assert isinstance(handle, LoopTimerHandle)
    loop.close()
    assert len(loop._wheel) == 0  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_later(1, print)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="base"):
        aiowheel.new_event_loop(base="tokio")
    with pytest.raises(ValueError, match="tick"):
        aiowheel.new_event_loop(tick=0)
    with pytest.raises(ValueError, match="tick"):
        aiowheel.new_event_loop(tick=math.nan)
    with pytest.raises(ValueError, match="base"):
        aiowheel.EventLoopPolicy(base="nope")
    loop = aiowheel.new_event_loop()
    try:
        with pytest.raises(TypeError):
            loop.call_at(None, print)  # type: ignore[arg-type]
        # NaN and infinities: what the base loop does (its heap), never the wheel
        loop.call_at(math.inf, print).cancel()
        assert len(loop._wheel) == 0  # type: ignore[attr-defined]
    finally:
        loop.close()


def test_missing_uvloop_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiowheel._loop as module

    monkeypatch.setattr(module, "_uvloop_class", None)
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(ImportError, match=r"aiowheel\[uvloop\]"):
        aiowheel.new_event_loop(base="uvloop")


@pytest.mark.parametrize("base", BASES)
def test_runner_and_policy(base: str) -> None:
    async def main() -> str:
        return type(asyncio.get_running_loop()).__mro__[1].__name__

    with asyncio.Runner(loop_factory=lambda: aiowheel.new_event_loop(base=base)) as runner:
        assert runner.run(main()) == "_WheelLoop"
    policy = aiowheel.EventLoopPolicy(base=base)
    loop = policy.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == "_WheelLoop"
    finally:
        loop.close()
