"""docs/design.md, guarantee 7: a cancelled or fired timer is released at once; the timer keeps no
reference to it.

Handles have ``__slots__`` and no ``__weakref__`` slot (one pointer less per pending
timer), so the tests watch what a handle holds instead: its callback and its
arguments. A handle that is still referenced somewhere keeps both alive, so "the
argument died" means "the handle died". Each check runs with the cycle collector
disabled: "at once" means reference counting frees it, not a later ``gc`` pass.
"""

from __future__ import annotations

import gc
import random
import sys
import types
import weakref
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

from aiowheel import Timer, TimerCancelled

pytestmark = pytest.mark.anyio


class Payload:
    """An argument or callback object we can watch with a weak reference."""

    def __call__(self, *args: object) -> None:
        pass


class Counted:
    """Counts how many instances were freed (cheaper than 100,000 weakrefs)."""

    freed = 0

    def __del__(self) -> None:
        Counted.freed += 1


@pytest.fixture
def unit(virtual: bool) -> float:
    """One "second" of a test: 1 s on virtual clocks, 10 ms on uvloop's real clock."""
    return 1.0 if virtual else 0.01


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Only reference counting frees objects while a test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """gc.get_referrers() sees every object: tests/conftest.py froze the ones made
    before the tests ran, and frozen objects are invisible to it."""
    gc.unfreeze()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()


def noop(*args: object) -> None:
    pass


def ignore(*args: object) -> None:
    pass


@pytest.mark.usefixtures("no_gc")
async def test_cancelled_timer_released_at_once(unit: float) -> None:
    async with Timer() as timer:
        arg, callback = Payload(), Payload()
        refs = [weakref.ref(arg), weakref.ref(callback)]
        handle = timer.schedule_nowait(100 * unit, callback, arg)
        del arg, callback
        assert all(ref() is not None for ref in refs)  # pending: the timer holds it
        assert handle.cancel()
        del handle
        assert all(ref() is None for ref in refs)  # long before the deadline


@pytest.mark.usefixtures("unfrozen", "no_gc")
async def test_timer_keeps_no_reference_to_a_cancelled_handle(unit: float) -> None:
    async with Timer() as timer:
        handle = timer.schedule_nowait(100 * unit, noop)
        other = timer.schedule_nowait(100 * unit, noop)  # keeps the bucket alive
        handle.cancel()
        # Only this coroutine's frame (its locals) may hold it: no bucket, no list,
        # no dict of the timer's.
        holders = gc.get_referrers(handle)
        assert all(isinstance(r, types.FrameType) for r in holders), holders
        other.cancel()


@pytest.mark.usefixtures("no_gc")
async def test_fired_timer_released_at_once(unit: float) -> None:
    async with Timer() as timer:
        arg, callback = Payload(), Payload()
        refs = [weakref.ref(arg), weakref.ref(callback)]
        handle = timer.schedule_nowait(unit, callback, arg)
        del arg, callback
        await handle.wait()
        del handle
        assert all(ref() is None for ref in refs)


@pytest.mark.usefixtures("no_gc")
async def test_fired_async_timer_released_at_once(unit: float) -> None:
    async with Timer() as timer:
        arg = Payload()
        ref = weakref.ref(arg)

        async def job(x: object) -> Payload:
            await anyio.lowlevel.checkpoint()
            return Payload()

        handle = timer.schedule_nowait(unit, job, arg)
        del arg
        result = await handle.wait()
        result_ref = weakref.ref(result)
        del handle, result
        await anyio.lowlevel.checkpoint()
        assert ref() is None
        assert result_ref() is None


@pytest.mark.usefixtures("no_gc")
async def test_failed_timer_released_at_once(unit: float) -> None:
    async with Timer(on_error=ignore) as timer:
        arg = Payload()
        ref = weakref.ref(arg)

        def boom(x: object) -> None:
            raise ValueError("boom")

        handle = timer.schedule_nowait(unit, boom, arg)
        del arg
        with pytest.raises(ValueError, match="boom"):
            await handle.wait()
        del handle
        assert ref() is None


@pytest.mark.usefixtures("no_gc")
async def test_cancelled_periodic_timer_released(unit: float) -> None:
    async with Timer() as timer:
        arg = Payload()
        ref = weakref.ref(arg)
        runs: list[int] = []
        three = anyio.Event()

        def tick(x: object) -> None:
            runs.append(1)
            if len(runs) == 3:
                three.set()

        handle = timer.every(unit, tick, arg)
        del arg
        await three.wait()
        assert handle.cancel()
        del handle
        assert ref() is None


@pytest.mark.usefixtures("no_gc")
async def test_handles_returned_by_aclose_released_when_dropped(unit: float) -> None:
    async with Timer() as timer:
        args = [Payload() for _ in range(10)]
        refs = [weakref.ref(a) for a in args]
        for a in args:
            timer.schedule_nowait(100 * unit, noop, a)
        del args, a
        closed = await timer.aclose()
        assert len(closed) == 10
        for handle in closed:
            with pytest.raises(TimerCancelled):
                await handle.wait()
        del closed, handle
        assert all(ref() is None for ref in refs)


def _blocks() -> int:
    """Memory blocks Python has allocated now (cheap, unlike tracemalloc, which would
    slow the 100,000-cycle loops below ten-fold). A retained timer costs several
    blocks (handle, args tuple, dict slot growth), so 100,000 of them are ~10**5+."""
    gc.collect()
    return sys.getallocatedblocks()


@pytest.mark.parametrize("spread", ["one bucket", "random deadlines"])
async def test_schedule_cancel_cycles_retain_nothing(spread: str, virtual: bool) -> None:
    """Netty #5647 / asyncio tombstones: 100,000 schedule + cancel cycles, with time
    moving on meanwhile, leave nothing behind: every argument freed, memory flat."""
    rng = random.Random(0)
    n = 100_000
    async with Timer(tick=0.001) as timer:
        # Warm up: levels, buckets and the driver's paths allocated once.
        for _ in range(1000):
            timer.schedule_nowait(rng.uniform(0, 3600), noop).cancel()
        await anyio.sleep(0.002)
        Counted.freed = 0
        before = _blocks()
        for i in range(n):
            delay = 30.0 if spread == "one bucket" else rng.uniform(0, 3600)
            timer.schedule_nowait(delay, noop, Counted()).cancel()
            if i % 10_000 == 0:
                await anyio.sleep(0.002 if virtual else 0.0005)
        # One more loop iteration: asyncio drops the call_at handles the driver
        # cancelled meanwhile (the loop's own tombstones) at the start of each.
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        growth = _blocks() - before
        assert Counted.freed == n
        assert len(timer) == 0
        stats = timer.stats()
        assert stats.cancelled == n + 1000
        assert stats.pending == 0
        assert growth < 2000, f"{growth} memory blocks retained after {n} cycles"


@pytest.mark.virtual_time
async def test_idle_timeout_touches_do_not_grow_memory() -> None:
    """The idle-timeout pattern: reset a pending deadline on every "read", 100,000
    times, while time moves on: nothing accumulates per touch."""
    async with Timer(tick=0.001) as timer:
        handle = timer.schedule_nowait(1.0, noop)
        with timer.timeout(1.0) as idle:
            for _ in range(100):
                handle.reset(1.0)
                idle.reset(1.0)
            await anyio.sleep(0.01)
            before = _blocks()
            for i in range(100_000):
                handle.reset(1.0)
                idle.reset(1.0)
                if i % 1000 == 0:
                    await anyio.sleep(0.005)  # time moves: buckets come due
            growth = _blocks() - before
        assert len(timer) == 1
        assert timer.stats().fired == 0
        assert growth < 2000, f"{growth} memory blocks retained after 100,000 touches"
