"""aiowheel.new_event_loop: the base loop with call_at/call_later on a wheel (docs/loop.md)."""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
import time
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
        assert len(loop._engine.wheel) == 1  # type: ignore[attr-defined]
        other.cancel()
        assert other.cancelled()
        assert len(loop._engine.wheel) == 0  # type: ignore[attr-defined]  # off the wheel at once

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_timers_share_a_snapshot_but_each_callback_runs_in_its_own_copy(base: str) -> None:
    # docs/loop.md: timers scheduled without context= while no variable changed share
    # one snapshot; each callback runs in a copy of its own, as on the base loop.
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="-")

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        done = loop.create_future()
        var.set("outer")

        def cb(name: str) -> None:
            seen.append(f"{name} saw {var.get()}")
            var.set(name)
            if len(seen) == 2:
                done.set_result(None)

        first = loop.call_later(0.005, cb, "first")
        second = loop.call_later(0.005, cb, "second")
        assert first._context is second._context  # one snapshot, shared
        var.set("changed")
        third = loop.call_later(10, cb, "third")
        assert third._context is not first._context
        third.cancel()
        await done
        # After its run, a handle's context is the copy it ran in, as asyncio's.
        assert first.get_context()[var] == "first"
        assert second.get_context()[var] == "second"
        assert var.get() == "changed"
        # A context given is run in as it is: what the callback sets stays in it.
        given = contextvars.copy_context()
        ran = loop.create_future()
        loop.call_later(0.001, lambda: (var.set("set in given"), ran.set_result(None)),
                        context=given)  # fmt: skip
        await ran
        assert given[var] == "set in given"
        return seen

    assert run_on(base, main) == ["first saw outer", "second saw outer"]


@pytest.mark.parametrize("base", BASES)
def test_get_context_is_the_handles_own_even_when_its_snapshot_is_shared(base: str) -> None:
    # asyncio's rule: what a caller sets in h1.get_context() reaches h1's callback and
    # no other's. The shared snapshot is copied for h1 first (LoopTimerHandle.get_context).
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="-")

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        done = loop.create_future()
        var.set("scheduler")

        def cb(name: str) -> None:
            seen.append(f"{name}={var.get()}")
            if len(seen) == 3:
                done.set_result(None)

        h1 = loop.call_later(0.002, cb, "h1")
        h2 = loop.call_later(0.002, cb, "h2")
        h3 = loop.call_later(0.002, cb, "h3")
        assert h1._context is h2._context is h3._context
        context = h1.get_context()
        assert context is h1.get_context()  # the handle's own from now on
        context.run(var.set, "only h1")
        assert h2.get_context() is not context
        await done
        assert h1.get_context() is context  # run in as it is, as asyncio's
        return sorted(seen)

    assert run_on(base, main) == ["h1=only h1", "h2=scheduler", "h3=scheduler"]


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
        # 100 ms ahead: no deadline passes before its call_at is made, under any load
        # (one that had passed runs at once, ahead of its ties that wait for their
        # bucket: tests/loop/test_loop_timer.py, the when-order test).
        now = loop.time() + 0.1
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
        assert len(loop._engine.wheel) == 0  # type: ignore[attr-defined]

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_close_drops_pending(base: str) -> None:
    loop = aiowheel.new_event_loop(base=base)
    handle = loop.call_later(100, print)
    assert isinstance(handle, LoopTimerHandle)
    loop.close()
    assert len(loop._engine.wheel) == 0  # type: ignore[attr-defined]
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
        assert len(loop._engine.wheel) == 0  # type: ignore[attr-defined]
    finally:
        loop.close()


def test_missing_uvloop_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiowheel._loop as module

    monkeypatch.setattr(module, "_uvloop_class", None)
    monkeypatch.setattr(module, "_UvLoop", None)
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(ImportError, match=r"aiowheel\[uvloop\]"):
        aiowheel.new_event_loop(base="uvloop")


@pytest.mark.parametrize("base", BASES)
def test_runner_and_policy(base: str) -> None:
    async def main() -> str:
        # The drop-in loop's own class, and above it the base's (on uvloop, through
        # its overrides: aiowheel/_loop.py, _UvloopOverrides).
        mro = [cls.__name__ for cls in type(asyncio.get_running_loop()).__mro__]
        return "_WheelLoop" if "_WheelLoop" in mro[1:3] else mro[1]

    with asyncio.Runner(loop_factory=lambda: aiowheel.new_event_loop(base=base)) as runner:
        assert runner.run(main()) == "_WheelLoop"
    policy = aiowheel.EventLoopPolicy(base=base)
    loop = policy.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == "_WheelLoop"
    finally:
        loop.close()


@pytest.mark.parametrize("base", BASES)
def test_call_at_and_call_later_are_compiled_on_the_loop(base: str) -> None:
    # The loop sets the compiled call_at/call_later (aiowheel/_loophandle.py) on
    # itself: a timer costs no Python frame. Same contract as the Python methods.
    from aiowheel import _loophandle

    loop = aiowheel.new_event_loop(base=base)
    try:
        assert loop.call_at.__func__ is _loophandle.call_at  # type: ignore[attr-defined]
        assert loop.call_later.__func__ is _loophandle.call_later  # type: ignore[attr-defined]
        handle = loop.call_at(when=loop.time() + 10, callback=print)
        assert isinstance(handle, LoopTimerHandle)
        assert handle.when() == loop.time() + 10 or handle.when() > loop.time()
        handle.cancel()
        later = loop.call_later(5, print, "x", context=contextvars.copy_context())
        assert isinstance(later, LoopTimerHandle)
        assert later._args == ("x",)
        later.cancel()
        past = loop.call_at(3, print)
        assert past.when() == 3  # an int: kept, as asyncio keeps it
        assert type(past.when()) is int
        past.cancel()
        with pytest.raises(TypeError, match="when cannot be None"):
            loop.call_at(None, print)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="delay must not be None"):
            loop.call_later(None, print)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            loop.call_later("soon", print)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            loop.call_at()  # type: ignore[call-arg]
        # NaN: what the base loop does with it, never the wheel: asyncio files it on
        # its heap, uvloop refuses it (tests/loop/test_loop_parity.py compares).
        if base == "uvloop":
            with pytest.raises(ValueError, match="NaN"):
                loop.call_at(math.nan, print)
        else:
            nan = loop.call_at(math.nan, print)
            assert not isinstance(nan, LoopTimerHandle)
            nan.cancel()
        assert len(loop._engine.wheel) == 0  # type: ignore[attr-defined]
    finally:
        loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_at(1.0, print)
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_later(1.0, print)


@pytest.mark.parametrize("base", BASES)
def test_a_subclass_override_of_call_at_is_what_callers_get(base: str) -> None:
    seen: list[float] = []
    probe = aiowheel.new_event_loop(base=base)
    cls = type(probe)
    probe.close()

    class Counting(cls):  # type: ignore[misc, valid-type]
        def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
            seen.append(when)
            return super().call_at(when, callback, *args, context=context)

    async def main() -> None:
        await asyncio.sleep(0.001)

    with asyncio.Runner(loop_factory=lambda: Counting(0.001)) as runner:
        runner.run(main())
    assert len(seen) == 1  # asyncio.sleep -> call_later -> the subclass's call_at


@pytest.mark.parametrize("base", BASES)
def test_debug_mode_takes_the_python_path_with_its_checks(base: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        handle = loop.call_later(10, print)
        assert handle._source_traceback[-1].name == "main"  # type: ignore[attr-defined]
        handle.cancel()
        if base == "asyncio":  # the base loop's _check_callback (uvloop has none)
            with pytest.raises(TypeError, match="coroutines cannot be used"):
                loop.call_at(loop.time() + 1, main)
        assert loop._engine.loop_debug  # type: ignore[attr-defined]  # set_debug keeps it
        loop.set_debug(False)
        assert not loop._engine.loop_debug  # type: ignore[attr-defined]
        plain = loop.call_later(10, print)
        assert plain._source_traceback is None  # type: ignore[attr-defined]
        plain.cancel()

    run_on(base, main)


@pytest.mark.parametrize("base", BASES)
def test_debug_mode_from_the_runner(base: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        handle = loop.call_later(10, print)
        assert handle._source_traceback[-1].name == "main"  # type: ignore[attr-defined]
        handle.cancel()
        assert "print" in repr(handle)  # as Handle.cancel in debug mode: the callback kept

    aiowheel.run(main(), base=base, debug=True)


def test_the_asyncio_base_reads_its_clock_without_a_python_frame() -> None:
    # BaseEventLoop.time() is a Python method around time.monotonic; the drop-in loop
    # has the C function itself (same clock).
    loop = aiowheel.new_event_loop()
    try:
        assert loop.time is time.monotonic
    finally:
        loop.close()


def test_a_clock_patched_in_after_the_loop_was_made_is_refused() -> None:
    # looptime swaps the loop's class (virtual time) after it was made: the wheel keeps
    # the clock it was made with, so running would risk firing early. It refuses.
    import looptime

    loop = looptime.patch_event_loop(aiowheel.new_event_loop(), start=0)
    try:
        with pytest.raises(RuntimeError, match="clock was changed after the loop was made"):
            loop.run_forever()
    finally:
        loop.close()
