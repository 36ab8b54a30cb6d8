"""A second event loop in the owner's thread is refused like another thread (issue 20).

The contract (docs/usage.md, "Threads"): a ``Timer`` belongs to the event loop that
started it; a call from another event loop raises ``RuntimeError``. Another *thread*
running its own loop is covered in tests/test_faults.py; here the second loop runs in
the owner's own thread, where the thread check alone let every call through:

* asyncio and uvloop: the owner loop is stopped between two ``run_until_complete``
  (as with fixtures of different loop scopes) while another loop runs in the thread;
* trio: an asyncio loop runs nested in trio's thread (``asyncio.run`` from a
  synchronous call inside a trio task).

Every call that changes the timer raises at once and changes nothing; afterwards, the
owner loop uses the timer as before.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import looptime
import pytest
import trio
import trio.testing
import uvloop

import aiowheel
from aiowheel import Timer, TimerClosed, TimerHandle

TICK = 0.001


def noop() -> None:
    pass


def _outcome(call: Callable[[], object]) -> str:
    try:
        result = call()
    except RuntimeError as exc:
        return f"RuntimeError{'(TimerClosed)' if isinstance(exc, TimerClosed) else ''}"
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"
    if asyncio.iscoroutine(result):
        result.close()
    return "accepted"


def _calls(timer: Timer, handle: TimerHandle[Any], fired: TimerHandle[Any]) -> dict[str, Any]:
    return {
        "schedule_nowait": lambda: timer.schedule_nowait(1.0, noop),
        "schedule_at_nowait": lambda: timer.schedule_at_nowait(timer.time() + 1.0, noop),
        "handle.reset (later)": lambda: handle.reset(200.0),  # the inline lazy path
        "handle.reset (later, int)": lambda: handle.reset(300),  # its other branch
        "handle.reset (sooner)": lambda: handle.reset(1.0),
        "handle.reset_at": lambda: handle.reset_at(timer.time() + 1.0),
        "handle.cancel": handle.cancel,
        "fired.reset": lambda: fired.reset(1.0),
        "fired.reset_at": lambda: fired.reset_at(timer.time() + 1.0),
        "every": lambda: timer.every(1.0, noop),
        "timeout": lambda: timer.timeout(1.0),
    }


def _use_from_a_second_asyncio_loop(
    timer: Timer, handle: TimerHandle[Any], fired: TimerHandle[Any]
) -> dict[str, str]:
    async def use() -> dict[str, str]:
        return {name: _outcome(call) for name, call in _calls(timer, handle, fired).items()}

    return asyncio.run(use())


def _state(timer: Timer, handle: TimerHandle[Any], fired: TimerHandle[Any]) -> tuple[Any, ...]:
    stats = timer.stats()
    return (
        len(timer),
        stats.scheduled,
        stats.cancelled,
        handle.pending(),
        handle.deadline,
        fired.fired(),
        fired.pending(),
    )


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_a_second_asyncio_loop_in_the_same_thread_is_refused(kind: str) -> None:
    loop: asyncio.AbstractEventLoop = (
        looptime.new_event_loop(start=1000.0) if kind == "asyncio" else uvloop.new_event_loop()
    )
    box: dict[str, Any] = {}

    async def host() -> None:
        release = box["release"] = asyncio.Event()
        async with Timer(tick=TICK) as timer:
            box["timer"] = timer
            box["handle"] = timer.schedule_nowait(100.0, noop)
            fired = box["fired"] = timer.schedule_nowait(0, noop)
            await fired.wait()
            box["ready"].set()
            await release.wait()

    async def ready() -> None:
        box["ready"] = asyncio.Event()
        task = box["task"] = loop.create_task(host())
        await asyncio.wait_for(box["ready"].wait(), 100)
        assert not task.done()

    try:
        loop.run_until_complete(ready())
        timer: Timer = box["timer"]
        handle, fired = box["handle"], box["fired"]
        before = _state(timer, handle, fired)
        outcomes = _use_from_a_second_asyncio_loop(timer, handle, fired)
        assert outcomes == dict.fromkeys(outcomes, "RuntimeError"), outcomes
        assert _state(timer, handle, fired) == before

        async def back_on_the_owner_loop() -> None:
            handle.reset(50.0)
            again = timer.schedule_nowait(0.001, noop)
            await asyncio.wait_for(again.wait(), 100)
            assert handle.cancel()
            box["release"].set()
            await asyncio.wait_for(box["task"], 100)

        loop.run_until_complete(back_on_the_owner_loop())
    finally:
        task = box.get("task")
        if task is not None and not task.done():
            task.cancel()
            loop.run_until_complete(asyncio.wait([task]))
        loop.close()


def test_an_asyncio_loop_nested_in_trio_is_refused() -> None:
    async def main() -> dict[str, str]:
        async with Timer(tick=TICK) as timer:
            handle = timer.schedule_nowait(100.0, noop)
            fired = timer.schedule_nowait(0, noop)
            await fired.wait()
            before = _state(timer, handle, fired)
            # A synchronous call inside a trio task that runs an asyncio loop.
            outcomes = _use_from_a_second_asyncio_loop(timer, handle, fired)
            assert _state(timer, handle, fired) == before
            handle.reset(50.0)
            with timer.timeout(1.0):
                await timer.sleep(0.01)
            assert handle.cancel()
            return outcomes

    outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert outcomes == dict.fromkeys(outcomes, "RuntimeError"), outcomes


def _dict_materialised(obj: object) -> bool:
    # CPython 3.11+ keeps an instance's attributes inline until its __dict__ is asked
    # for; once it is, the collector sees that dict (the one holding `_ready`) among
    # the referents.
    return any(type(ref) is dict and "_ready" in ref for ref in gc.get_referents(obj))


@pytest.mark.parametrize("kind", ["plain", "drop-in"])
def test_a_timer_leaves_the_asyncio_loops_dict_unmaterialised(kind: str) -> None:
    """Reading the loop's ``__dict__`` (once, for its ``_thread_id``) made every
    attribute access of the loop's own methods take the slower dict path: task steps
    1.1x slower on any asyncio loop a Timer ran on (docs/loop.md, "Figures")."""
    factory = asyncio.new_event_loop if kind == "plain" else aiowheel.new_event_loop

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        async with Timer(tick=0.001) as timer:
            handle = timer.schedule_nowait(0.0, lambda: None)
            await handle.wait()
            timer.schedule_nowait(1.0, lambda: None).cancel()
        return _dict_materialised(loop)

    with asyncio.Runner(loop_factory=factory) as runner:
        assert not _dict_materialised(runner.get_loop())
        assert runner.run(main()) is False
