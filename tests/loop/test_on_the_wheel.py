"""What a user of the drop-in loop checks and relies on (docs/loop.md, "Is my timer on
the wheel?"): the loop's type and ``aiowheel.loop_timer()``, ``lateness_max`` counting
the loop's own timers, one rounding for a ``Timer()`` started on the loop, and no
import while the first timers of a process are pending. (Starlette's ``TestClient``
and uvicorn's command line are adoption forms: tests/loop/test_adoption.py.)

Time is virtual where a test asserts an instant: ``_VirtualWheelLoop`` is the asyncio
base's drop-in loop with looptime's clock from the start (``looptime.patch_event_loop``
swaps the clock after the loop was made, which the loop refuses: tests/loop/test_loop.py).
Each sleep then jumps to the next entry of the base loop's heap, so a timer fires at
exactly the instant its wake-up was armed for.
"""

from __future__ import annotations

import asyncio
import math
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import looptime
import pytest

import aiowheel
from aiowheel._loop import _AsyncioWheelLoop

BASES = ["asyncio", "uvloop"]
# Looptime's resolution: its clock counts whole microseconds.
RESOLUTION = 1e-6


class _VirtualWheelLoop(looptime.LoopTimeEventLoop, _AsyncioWheelLoop):
    """The asyncio base's drop-in loop on looptime's virtual clock, from its start."""

    def __init__(self, tick: float, start: float) -> None:
        self._init_slots()
        asyncio.SelectorEventLoop.__init__(self)
        self.setup_looptime(start=start)
        self._init_timer("asyncio", tick, 1e6)


def run_virtual(
    main: Callable[[], Coroutine[Any, Any, Any]], *, tick: float, start: float = 1000.0
) -> Any:
    loop = _VirtualWheelLoop(tick, start)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def run_on(base: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    loop = aiowheel.new_event_loop(base=base)
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


# -- the loop's type and aiowheel.loop_timer() ---------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_the_loop_is_a_wheel_event_loop_with_its_timer(base: str) -> None:
    loop = aiowheel.new_event_loop(base=base)
    try:
        assert isinstance(loop, aiowheel.WheelEventLoop)
        assert isinstance(loop, asyncio.AbstractEventLoop)
        assert isinstance(loop.timer, aiowheel.Timer)
        # Not running: there is no running loop to ask, but the loop given is asked.
        assert aiowheel.loop_timer(loop) is loop.timer
    finally:
        loop.close()
    assert aiowheel.loop_timer(loop) is None  # closed with its loop


@pytest.mark.parametrize("base", BASES)
def test_loop_timer_of_the_running_loop(base: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, aiowheel.WheelEventLoop)
        assert aiowheel.loop_timer() is loop.timer
        assert aiowheel.loop_timer(loop) is loop.timer

    run_on(base, main)


def test_loop_timer_is_none_on_other_loops() -> None:
    import uvloop

    async def main() -> None:
        assert aiowheel.loop_timer() is None
        assert aiowheel.loop_timer(asyncio.get_running_loop()) is None

    asyncio.run(main())
    uvloop.run(main())
    assert aiowheel.loop_timer() is None  # no loop runs in this thread


def test_loop_timer_is_none_on_trio() -> None:
    import trio

    async def main() -> None:
        assert aiowheel.loop_timer() is None

    trio.run(main)


def test_loop_timer_refuses_what_is_not_a_loop() -> None:
    with pytest.raises(TypeError, match="an asyncio event loop"):
        aiowheel.loop_timer("loop")  # type: ignore[arg-type]


def test_a_wheel_event_loop_is_made_by_new_event_loop_only() -> None:
    with pytest.raises(TypeError, match=r"aiowheel\.new_event_loop\(\)"):
        aiowheel.WheelEventLoop()


# -- lateness_max counts the loop's own timers -----------------------------------------


def test_lateness_max_counts_the_loops_own_timers() -> None:
    # tick 10 ms, the loop's wheel starting at 1000.0: a sleep of 2.5 ms from there is
    # due at 1000.0025 and fires with the bucket that ends at 1000.010, 7.5 ms late.
    async def main() -> float:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, aiowheel.WheelEventLoop)
        assert loop.time() == 1000.0
        assert loop.timer.stats().lateness_max == 0.0
        await asyncio.sleep(0.0025)
        assert loop.time() == pytest.approx(1000.010, abs=RESOLUTION)
        return loop.timer.stats().lateness_max

    assert run_virtual(main, tick=0.01) == pytest.approx(0.0075, abs=2 * RESOLUTION)


# -- one rounding: a Timer() on the drop-in loop ---------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_a_timers_wake_up_is_not_a_timer_on_the_loops_wheel(base: str) -> None:
    # The Timer's driver arms the base loop, as loop.timer's does: its wake-up is not a
    # call_at on the loop's wheel (which would round it up a second time), so the
    # loop's timer does not count it.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, aiowheel.WheelEventLoop)
        async with aiowheel.Timer() as timer:
            handle = timer.schedule_nowait(60, lambda: None)
            assert len(timer) == 1
            assert len(loop.timer) == 0
            handle.cancel()

    run_on(base, main)


def test_a_timer_on_the_loop_is_as_late_as_loop_timer() -> None:
    # Virtual time: each timer fires at exactly the instant its driver armed. Both
    # wheels tick every 10 ms, the Timer's 3 ms after the loop's (origins 1000.000 and
    # 1000.003): a deadline rounds up to its own wheel's next tick, once. Rounded a
    # second time through the loop's wheel, the Timer's were up to two ticks late
    # (1000.008 fired at 1000.020: 12 ms). No deadline is a whole number of ticks
    # from either origin (the wheel's ceil would then hinge on a float's last bit).
    tick = 0.01
    offsets = [0.005, 0.0125, 0.0131, 0.0203, 0.0299, 0.0473, 0.0634, 0.1001]
    fired: dict[str, dict[float, float]] = {"loop.timer": {}, "Timer()": {}}

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, _VirtualWheelLoop)
        # An entry on the base loop's heap, not on the wheel: the clock moves to
        # exactly 1000.003.
        moved = loop.create_future()
        loop._base_call_at(1000.003, moved.set_result, None)
        await moved
        async with aiowheel.Timer(tick=tick) as timer:
            start = loop.time()
            done = loop.create_future()
            left = [2 * len(offsets)]

            def fire(kind: str, deadline: float) -> None:
                fired[kind][deadline] = loop.time()
                left[0] -= 1
                if not left[0]:
                    done.set_result(None)

            for offset in offsets:
                deadline = start + offset
                loop.timer.schedule_at_nowait(deadline, fire, "loop.timer", deadline)
                timer.schedule_at_nowait(deadline, fire, "Timer()", deadline)
            await done
            origins = (loop.timer._engine, timer._engine)
            return tuple(engine.wheel.origin for engine in origins if engine)  # type: ignore[return-value]

    loop_origin, timer_origin = run_virtual(main, tick=tick)
    assert loop_origin == 1000.0
    assert timer_origin == pytest.approx(1000.003, abs=RESOLUTION)
    for kind, origin in (("loop.timer", loop_origin), ("Timer()", timer_origin)):
        assert len(fired[kind]) == len(offsets)
        for deadline, at in fired[kind].items():
            due = origin + math.ceil((deadline - origin) / tick) * tick
            assert at == pytest.approx(due, abs=2 * RESOLUTION), (kind, deadline, at)
            assert 0.0 <= at - deadline <= tick + RESOLUTION, (kind, deadline, at)
    for deadline, at in fired["Timer()"].items():
        theirs = fired["loop.timer"][deadline] - deadline
        assert abs((at - deadline) - theirs) <= tick + RESOLUTION


# -- the first timer of a process ------------------------------------------------------

_FIRST_TIMERS = """
import asyncio, sys
import aiowheel

async def main():
    timer = aiowheel.loop_timer()
    before = set(sys.modules)
    await timer.sleep(0.001)
    handle = timer.schedule_nowait(0.001, lambda: None)
    await handle.wait()

    async def job():
        return 1

    assert await timer.schedule_nowait(0.001, job).wait() == 1
    try:
        with timer.timeout(0.001):
            await asyncio.sleep(1)
    except TimeoutError:
        pass
    print(sorted(set(sys.modules) - before))

aiowheel.run(main(), base=sys.argv[1])
"""


@pytest.mark.parametrize("base", BASES)
def test_the_first_timers_of_a_process_import_nothing(base: str) -> None:
    # A fresh interpreter: its first loop.timer timers of each kind (a sleep, a wait(),
    # an async callback, a timeout) import nothing while they are pending. Importing
    # anyio's asyncio backend there (15-25 ms) made the first one that late.
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FIRST_TIMERS), base],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout == "[]\n", out.stderr


# -- docs/loop.md, "Is my timer on the wheel?" ---------------------------------------


def test_the_docs_check_prints_what_the_docs_say() -> None:
    # The section's program, run as written: what it prints has the documented shape
    # (the lateness figure is the machine's).
    docs = (Path(__file__).resolve().parents[2] / "docs" / "loop.md").read_text()
    section = docs.split("## Is my timer on the wheel?", 1)[1]
    program = section.split("```python\n", 1)[1].split("```", 1)[0]
    printed = section.split("```text\n", 1)[1].split("```", 1)[0]
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    shape = re.compile(r"\d+\.\d\d ms$")
    got = [shape.sub("X ms", line) for line in out.stdout.splitlines()]
    assert got == [shape.sub("X ms", line) for line in printed.splitlines()], out.stderr
