"""The self-check (aiowheel/_selfcheck.py): it passes on a healthy timer in every state
and names what is wrong when the accounting does not match what the timer holds.

tests/test_fault_model.py and tests/test_fault_finalizers.py call it after every step;
these tests make sure it would catch what it is there to catch.
"""

from __future__ import annotations

import pytest
from support import noop

from aiowheel import Timer
from aiowheel._selfcheck import check_engine

pytestmark = pytest.mark.anyio


async def test_a_healthy_timer_passes_in_every_state() -> None:
    timer = Timer()
    timer._check()  # not started: nothing to check (check_timer)
    async with timer:
        handles = [timer.schedule_nowait(delay, noop) for delay in (0.0, 1.0, 2.0)]
        periodic = timer.every(1.0, noop)
        handles[1].cancel()
        await handles[0].wait()
        timer._check()
        assert timer._engine is not None
        check_engine(timer._engine)
        periodic.cancel()
    timer._check()  # closed: nothing pending, no periodic timer active


async def test_a_counter_that_does_not_add_up_is_named() -> None:
    async with Timer() as timer:
        timer.schedule_nowait(1.0, noop)
        engine = timer._engine
        assert engine is not None
        engine.scheduled += 1
        with pytest.raises(AssertionError, match=r"scheduled 2 != fired 0 \+ cancelled 0"):
            check_engine(engine)
        engine.scheduled -= 1
        engine.pending += 1
        engine.scheduled += 1
        with pytest.raises(AssertionError, match=r"pending 2 != filed 1 \+ queued 0"):
            check_engine(engine)
        engine.pending -= 1
        engine.scheduled -= 1
        check_engine(engine)


async def test_a_closed_engine_must_hold_nothing() -> None:
    async with Timer() as timer:
        pass
    engine = timer._engine
    assert engine is not None
    engine.pending += 1
    engine.scheduled += 1
    with pytest.raises(AssertionError, match="closed with 1 pending"):
        check_engine(engine)


async def test_a_handle_of_another_timer_in_the_wheel_is_caught() -> None:
    async with Timer() as timer, Timer() as other:
        stranger = other.schedule_nowait(1.0, noop)
        assert timer._engine is not None
        assert other._engine is not None
        # File the other timer's handle in this wheel, counted: only the owner test fails.
        other._engine.wheel.remove(stranger)
        timer._engine.wheel.insert(stranger, stranger.deadline)
        for engine in (timer._engine, other._engine):
            engine.pending += 1 if engine is timer._engine else -1
        other._engine.cancelled += 1
        timer._engine.scheduled += 1
        check_engine(timer._engine)
        with pytest.raises(AssertionError):
            timer._check()  # check_timer, with the timer's own state
        timer._engine.wheel.remove(stranger)
        timer._engine.pending -= 1
        timer._engine.cancelled += 1
