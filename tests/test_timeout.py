"""``Timer.sleep``, ``Timer.sleep_until`` and ``Timer.timeout`` (aiowheel/_timeout.py).

Every async test runs on the three backends of ``conftest.py``. Timing assertions
("fires within [deadline, deadline + tick]") hold exactly on the virtual clocks; on
uvloop, which runs on real time, the same tests keep only what load cannot change:
never early, exactly once, order, and they use the ``unit`` fixture (10 ms instead of
1 s) so that they stay short. Tests that need virtual time to say anything are marked
``virtual_time`` (skipped on uvloop).

"Never early" is always checked the way guarantee 1 states it: ``timer.time()`` read
inside the callback is compared with that callback's ``handle.deadline``.

Bad delays are in tests/test_checks.py; ``sleep`` and ``timeout`` when their timer
closes in tests/test_periodic.py.
"""

from __future__ import annotations

import gc

import anyio
import anyio.lowlevel
import pytest
from support import assert_on_time

from aiowheel import Timeout, Timer

pytestmark = pytest.mark.anyio


# == sleep ===============================================================================


@pytest.mark.virtual_time
async def test_sleep_and_sleep_until() -> None:
    async with Timer() as timer:
        t0 = timer.time()
        await timer.sleep(1.5)
        assert_on_time(timer.time(), t0 + 1.5, virtual=True)
        deadline = timer.time() + 0.0123
        await timer.sleep_until(deadline)
        assert_on_time(timer.time(), deadline, virtual=True)
        now = timer.time()
        await timer.sleep_until(now - 10)  # a past deadline returns at once
        assert timer.time() == now
        assert len(timer) == 0


async def test_sleep_real_time_never_early(unit: float) -> None:
    async with Timer() as timer:
        t0 = timer.time()
        await timer.sleep(unit)
        assert timer.time() >= t0 + unit


async def test_cancelled_sleep_leaves_nothing_pending(unit: float) -> None:
    async with Timer() as timer:
        with anyio.move_on_after(unit):
            await timer.sleep(100 * unit)
        assert len(timer) == 0
        assert timer.stats().cancelled == 1


# == timeout =============================================================================


async def test_timeout_expires(virtual: bool, unit: float) -> None:
    async with Timer() as timer:
        reached: list[str] = []
        # The TimeoutError comes out of the timeout block's exit: the block is the point.
        with pytest.raises(TimeoutError), timer.timeout(unit) as t:  # noqa: PT012
            deadline = t.deadline
            await anyio.sleep(100 * unit)
            reached.append("after sleep")  # pragma: no cover
        assert reached == []
        assert t.expired()
        assert_on_time(timer.time(), deadline, virtual)
        assert len(timer) == 0


async def test_timeout_not_reached_leaves_no_timer(unit: float) -> None:
    async with Timer() as timer:
        with timer.timeout(100 * unit) as t:
            await anyio.sleep(unit)
        assert not t.expired()
        assert len(timer) == 0
        assert timer.stats().cancelled == 1


@pytest.mark.virtual_time
async def test_timeout_reset_is_an_idle_timeout() -> None:
    async with Timer() as timer:
        with timer.timeout(1.0) as t:
            for _ in range(10):
                await anyio.sleep(0.6)  # a "read" arrives in time
                t.reset(1.0)
        assert not t.expired()
        last_reset = 0.0
        with pytest.raises(TimeoutError), timer.timeout(1.0) as t:  # noqa: PT012
            for _ in range(3):
                await anyio.sleep(0.9)
                t.reset(1.0)
                last_reset = timer.time()
            await anyio.sleep(100)  # the peer goes quiet
        assert t.deadline == last_reset + 1.0
        assert_on_time(timer.time(), last_reset + 1.0, virtual=True)
        assert len(timer) == 0


async def test_async_with_a_timeout_says_to_use_with(unit: float) -> None:
    # `async with timer.timeout(...)`, the habit from asyncio.timeout: a TypeError that
    # says what to write, raised before anything is scheduled; the Timeout is still
    # good for a plain `with`.
    async with Timer() as timer:
        t = timer.timeout(unit)
        with pytest.raises(TypeError, match=r"write `with timer\.timeout\(\.\.\.\):`"):
            async with t:  # type: ignore[attr-defined]
                pass  # pragma: no cover
        assert len(timer) == 0
        with t:
            await anyio.lowlevel.checkpoint()
        assert not t.expired()
        assert len(timer) == 0


async def test_timeout_body_exception_propagates_as_itself(unit: float) -> None:
    async with Timer() as timer:
        with pytest.raises(KeyError), timer.timeout(100 * unit):  # noqa: PT012
            await anyio.lowlevel.checkpoint()
            raise KeyError("mine")
        assert len(timer) == 0


@pytest.mark.virtual_time
async def test_timeout_inside_an_earlier_outer_scope() -> None:
    async with Timer() as timer:
        with anyio.move_on_after(0.5) as outer:
            with timer.timeout(1.0) as t:
                await anyio.sleep(10)
        assert outer.cancelled_caught
        assert not t.expired()
        with anyio.move_on_after(2.0) as outer:
            with pytest.raises(TimeoutError), timer.timeout(1.0):
                await anyio.sleep(10)
        assert not outer.cancelled_caught
        assert len(timer) == 0


async def test_a_block_leaves_no_cycle_for_the_collector(unit: float) -> None:
    # The deadline's handle holds its callback, which holds the Timeout: a Timeout that
    # kept its handle after the block was a reference cycle, freed only by the garbage
    # collector (a collection every few hundred blocks, a sixth of a block's cost). A
    # block that ends (here: in time) leaves nothing for the collector. (An expired one
    # may: its exceptions' tracebacks hold frames, a cycle of the language's own.)
    async with Timer() as timer:
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                with timer.timeout(100 * unit) as t:
                    await anyio.lowlevel.checkpoint()
                assert t.deadline > timer.time()  # kept as the block ended
            del t
            left = [o for o in gc.get_objects() if type(o) is Timeout]
        finally:
            gc.enable()
        assert left == []
