"""Pending timers the garbage collector never walks (docs/design.md, "Pending timers and
the garbage collector").

On the compiled core a handle a bucket links is counted young, and hidden from the
cyclic collector at the start of the next collection; it is back in the collector's
lists from the moment it leaves (fired, cancelled, or its timer
or loop closed). So no collection walks a pending timer, the objects the collector
tracks do not grow with the number of pending timers, and a cycle through a handle that
left (a callback that refers to its own handle) is freed by the next collection once
the user lets go of it. The pure core keeps every handle tracked: the same tests check
that it does.

Each cycle test keeps only a weak reference to an object on the cycle and asks the
collector; none waits on a clock (a handle fires by awaiting ``wait()``).
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import aiowheel
from aiowheel import Timer, TimerCancelled
from aiowheel._wheel import _DIRTY, GC_HIDDEN, GC_OFF, GC_TRACKED, GC_YOUNG, HIDES

pytestmark = pytest.mark.anyio

#: Timers per count: enough that the harness's own few hundred objects are small
#: beside them.
N = 5_000


def noop() -> None:
    pass


class Quiet:
    """A trace recorder that keeps nothing (its rows would be objects of its own)."""

    def open(self, *, backend: str, clock: float) -> None:
        pass

    def record(self, *row: Any) -> None:
        pass

    def close(self) -> None:
        pass


def tracked_per_call(make: Callable[[], object], n: int = N) -> float:
    """Objects the collector tracks per call of ``make``, everything before frozen
    (``gc.freeze``, as the bench's ``collector`` workload does), counted after a
    collection (as a full collection walks them)."""
    gc.collect()
    gc.freeze()
    try:
        before = len(gc.get_objects())
        for _ in range(n):
            make()
        gc.collect()
        return (len(gc.get_objects()) - before) / n
    finally:
        gc.unfreeze()


def assert_hidden_while_pending(handle: Any) -> None:
    """A pending handle, once a collection has started (a young one will do): hidden
    (compiled)."""
    gc.collect(0)
    assert handle._gc == (GC_HIDDEN if HIDES else GC_OFF)
    assert gc.is_tracked(handle) is not HIDES


def assert_seen(handle: Any) -> None:
    assert handle._gc in (GC_TRACKED, GC_OFF)
    assert gc.is_tracked(handle)


class SelfRef:
    """A callback on a cycle with its own handle (a closure that re-arms or cancels it
    would be one too)."""

    handle: Any = None

    def __call__(self) -> None:
        pass


@pytest.fixture
def collected() -> Callable[[weakref.ref[Any]], bool]:
    """Whether the collector freed what a weak reference points at."""

    def freed(ref: weakref.ref[Any]) -> bool:
        gc.collect()
        return ref() is None

    return freed


def test_hiding_is_on_exactly_on_the_compiled_core() -> None:
    # Built together (setup.py): aiowheel/_gcutil.c with the compiled core, and the
    # pure core (AIOWHEEL_PURE=1 beside a build, or no build) hides nothing.
    assert HIDES is aiowheel.COMPILED


# -- the count ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "traced", "periodic"])
async def test_pending_timers_add_no_tracked_objects_on_the_compiled_core(kind: str) -> None:
    async with Timer(recorder=Quiet() if kind == "traced" else None) as timer:
        if kind == "periodic":
            per = tracked_per_call(lambda: timer.every(600.0, noop))
        else:
            per = tracked_per_call(lambda: timer.schedule_nowait(600.0, noop))
        assert len(timer) == N
        if HIDES:
            assert per < 0.1  # the harness's few hundred objects, over N
        else:
            assert per >= 1.0  # the pure core: the handle at least, as before


@pytest.mark.parametrize("base", ["asyncio", "uvloop"])
def test_the_drop_in_loops_pending_timers_add_no_tracked_objects(base: str) -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        per = tracked_per_call(lambda: loop.call_later(600.0, noop))
        assert len(loop.timer) >= N  # type: ignore[attr-defined]
        return per

    per = aiowheel.run(main(), base=base)
    assert per < 0.1 if HIDES else per >= 1.0


# -- the flag follows the bucket ------------------------------------------------------


async def test_a_handle_is_hidden_while_pending_and_seen_once_it_leaves() -> None:
    async with Timer() as timer:
        handle = timer.schedule_nowait(0.001, noop)
        assert_hidden_while_pending(handle)
        handle.reset(600.0)  # a move between buckets keeps it hidden
        assert_hidden_while_pending(handle)
        handle.cancel()
        assert_seen(handle)
        handle.reset(0.001)  # re-armed: hidden again
        assert_hidden_while_pending(handle)
        await handle.wait()
        assert_seen(handle)
        # A fired handle re-armed keeps working, and hides again.
        handle.reset(0.001)
        assert handle.pending()
        assert_hidden_while_pending(handle)
        await handle.wait()
        assert handle.fired()
        assert_seen(handle)
        pending = timer.schedule_nowait(600.0, noop)
    # The close hands every pending handle back: seen again.
    assert pending.cancelled()
    assert_seen(pending)


# -- cycles are freed on every way out --------------------------------------------------


async def test_a_cycle_through_a_fired_handle_is_freed(collected: Any) -> None:
    async with Timer() as timer:
        callback = SelfRef()
        callback.handle = timer.schedule_nowait(0.001, callback)
        await callback.handle.wait()
        ref = weakref.ref(callback)
        del callback
        assert collected(ref)


async def test_a_cycle_through_a_cancelled_handle_is_freed(collected: Any) -> None:
    async with Timer() as timer:
        callback = SelfRef()
        callback.handle = timer.schedule_nowait(600.0, callback)
        gc.collect()  # a collection while it is pending neither frees nor shows it
        assert_hidden_while_pending(callback.handle)
        assert callback.handle.cancel()
        ref = weakref.ref(callback)
        del callback
        assert collected(ref)


async def test_a_cycle_through_a_handle_its_timer_closed_on_is_freed(collected: Any) -> None:
    timer = Timer()
    async with timer:
        callback = SelfRef()
        callback.handle = timer.schedule_nowait(600.0, callback)
        ref = weakref.ref(callback)
        del callback
        gc.collect()
        assert ref() is not None  # pending: the wheel holds it
    assert collected(ref)


async def test_a_cycle_through_a_periodic_handle_and_its_timer_is_freed(collected: Any) -> None:
    # The callback refers to its own periodic handle, whose callback slot holds a
    # _Run of it while active (aiowheel/_periodic.py): freed once stopped and dropped.
    timer = Timer()
    async with timer:
        callback = SelfRef()
        callback.handle = timer.every(600.0, callback)
        callback.handle.cancel()
        ref = weakref.ref(callback)
        del callback
        assert collected(ref)


async def test_a_cancelled_handles_wait_still_raises_after_a_collection() -> None:
    async with Timer() as timer:
        handle = timer.schedule_nowait(600.0, noop)
        handle.cancel()
        gc.collect()
        with pytest.raises(TimerCancelled):
            await handle.wait()


@pytest.mark.parametrize("base", ["asyncio", "uvloop"])
@pytest.mark.parametrize("way", ["fired", "cancelled", "loop closed"])
def test_a_cycle_through_a_drop_in_loop_handle_is_freed(base: str, way: str) -> None:
    refs: list[weakref.ref[Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        callback = SelfRef()
        done = loop.create_future()
        if way == "fired":
            callback.handle = loop.call_later(0.001, lambda: done.set_result(callback))
            await done
        else:
            callback.handle = loop.call_later(600.0, callback)
            assert_hidden_while_pending(callback.handle)
            if way == "cancelled":
                callback.handle.cancel()
        refs.append(weakref.ref(callback))

    aiowheel.run(main(), base=base)
    gc.collect()
    assert refs[0]() is None


# -- a collector disabled, and collections at any point ---------------------------------


async def test_with_the_collector_disabled_a_collection_still_hides_them() -> None:
    # No collection starts, so none walks the young handles; gc.collect() (which runs
    # the callbacks even when disabled) hides them; a handle that leaves is seen at once.
    gc.disable()
    try:
        async with Timer() as timer:
            handles = [timer.schedule_nowait(600.0, noop) for _ in range(3000)]
            assert all(gc.is_tracked(h) for h in handles)
            assert all(h._gc == (GC_YOUNG if HIDES else GC_OFF) for h in handles)
            assert_hidden_while_pending(handles[1])
            for handle in handles[::2]:
                handle.cancel()
                assert_seen(handle)
            assert_hidden_while_pending(handles[1])
    finally:
        gc.enable()
    for handle in handles:
        assert_seen(handle)


async def test_a_handle_that_leaves_before_any_collection_is_never_hidden() -> None:
    async with Timer() as timer:
        gc.collect()
        handle = timer.schedule_nowait(600.0, noop)
        assert handle._gc == (GC_YOUNG if HIDES else GC_OFF)
        assert handle._bucket in _DIRTY or not HIDES
        assert gc.is_tracked(handle)
        handle.cancel()
        assert_seen(handle)


async def test_a_collection_inside_a_pass_meets_no_hidden_handle_that_left() -> None:
    # Callbacks that collect while the pass runs (a collection may start at any
    # allocation): every handle that left by then is seen, every pending one hidden.
    async with Timer() as timer:
        done = anyio.Event()
        handles: list[Any] = []

        def check() -> None:
            gc.collect(0)
            for handle in handles:
                if handle.pending():
                    assert_hidden_while_pending(handle)
                else:
                    assert_seen(handle)

        handles += [timer.schedule_nowait(0.001 * (i % 3 + 1), check) for i in range(30)]
        last = timer.schedule_nowait(0.004, done.set)
        await done.wait()
        await last.wait()
        check()
