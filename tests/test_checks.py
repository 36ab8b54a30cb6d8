"""The argument checks (aiowheel/_checks.py) at every entry point: one rule for times
(a delay, a deadline or an interval), the tick and the sizes of the constructor, the
callback and the label. Bad input gets a clear exception at the call, and nothing
already pending is lost.

Every async test runs on the three backends of ``conftest.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from support import VARIANTS, Probe, noop

from aiowheel import Timer, TimerClosed
from aiowheel._checks import closed

pytestmark = pytest.mark.anyio


# == the constructor: tick, sizes, on_error ==============================================


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"tick": 0}, ValueError),
        ({"tick": -0.001}, ValueError),
        ({"tick": math.nan}, ValueError),
        ({"tick": math.inf}, ValueError),
        ({"tick": "0.001"}, TypeError),
        ({"wheel_size": 1}, ValueError),
        ({"wheel_size": 0}, ValueError),
        ({"wheel_size": 8.0}, TypeError),
        ({"max_pending": 0}, ValueError),
        ({"max_pending": 1.5}, TypeError),
        ({"max_concurrency": 0}, ValueError),
        ({"max_concurrency": "4"}, TypeError),
        ({"on_error": 42}, TypeError),
    ],
)
def test_bad_constructor_argument(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        Timer(**kwargs)


def test_good_constructor_arguments() -> None:
    timer = Timer(tick=0.01, wheel_size=2, max_pending=1, max_concurrency=1, on_error=noop)
    assert timer.tick == 0.01


# == delays and deadlines: schedule, reset, sleep, timeout ===============================


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    ("delay", "callback", "error"),
    [
        (math.nan, noop, ValueError),
        (math.inf, noop, ValueError),
        (-math.inf, noop, ValueError),
        ("1", noop, TypeError),
        (None, noop, TypeError),
        (1.0, None, TypeError),
        (1.0, "noop", TypeError),
    ],
)
async def test_bad_input_raises_and_loses_nothing(
    variant: str, delay: Any, callback: Any, error: type[Exception], unit: float
) -> None:
    async with Timer() as timer:
        probe = Probe(timer)
        probe.schedule(unit, "kept")
        probe.schedule(2 * unit, "kept too")

        async def attempt() -> None:
            if variant == "schedule":
                await timer.schedule(delay, callback)
            elif variant == "schedule_nowait":
                timer.schedule_nowait(delay, callback)
            elif variant == "schedule_at":
                await timer.schedule_at(delay, callback)
            else:
                timer.schedule_at_nowait(delay, callback)

        with pytest.raises(error):
            await attempt()
        assert len(timer) == 2
        assert timer.stats().scheduled == 2
        await probe.handles["kept too"].wait()
        assert probe.names() == ["kept", "kept too"]


@pytest.mark.parametrize(
    ("delay", "error"),
    [(math.nan, ValueError), (math.inf, ValueError), (-math.inf, ValueError), ("1", TypeError)],
)
async def test_reset_bad_input_raises_and_keeps_the_timer(
    delay: Any, error: type[Exception], unit: float
) -> None:
    async with Timer() as timer:
        probe = Probe(timer)
        handle = probe.schedule(unit, "x")
        deadline = handle.deadline
        with pytest.raises(error):
            handle.reset(delay)
        assert handle.pending()
        assert handle.deadline == deadline
        assert len(timer) == 1
        await handle.wait()
        assert probe.names() == ["x"]


@pytest.mark.parametrize(("delay", "error"), [(math.nan, ValueError), ("1", TypeError)])
async def test_sleep_bad_input(delay: Any, error: type[Exception]) -> None:
    async with Timer() as timer:
        with pytest.raises(error):
            await timer.sleep(delay)
        with pytest.raises(error):
            await timer.sleep_until(delay)


async def test_timeout_bad_delay() -> None:
    async with Timer() as timer:
        with pytest.raises(ValueError, match="finite"):
            timer.timeout(math.nan)
        with timer.timeout(1) as t, pytest.raises(ValueError, match="finite"):
            t.reset(math.inf)


# == every: interval, callback, label ====================================================


@pytest.mark.parametrize(
    ("interval", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("1", TypeError),
    ],
)
async def test_every_bad_interval(interval: Any, error: type[Exception]) -> None:
    async with Timer() as timer:
        with pytest.raises(error):
            timer.every(interval, noop)
        assert len(timer) == 0


async def test_every_bad_callback() -> None:
    async with Timer() as timer:
        with pytest.raises(TypeError):
            timer.every(1.0, "not callable")  # type: ignore[arg-type]


@pytest.mark.parametrize("label", [3, b"tick", ["tick"]])
async def test_every_bad_label(label: Any) -> None:
    async with Timer() as timer:
        with pytest.raises(TypeError, match="str or None"):
            timer.every(1.0, noop, label=label)
        assert len(timer) == 0


def test_the_closed_error_says_why_and_keeps_the_cause() -> None:
    """``_checks.closed``: the one ``TimerClosed`` of every refused call, by state."""
    assert "not started" in str(closed("new", None))
    assert "draining" in str(closed("draining", None))
    assert str(closed("closed", None)) == "the timer is closed"
    bug = KeyError("heap")
    error = closed("closed", bug)
    assert isinstance(error, TimerClosed)
    assert "internal error: KeyError('heap')" in str(error)
    assert error.__cause__ is bug
    assert closed("new", None).__cause__ is None
