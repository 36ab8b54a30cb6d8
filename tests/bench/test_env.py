"""How a contender runs (aiowheel/bench/env.py): the parts the workload tests do not
reach (every workload test runs every contender through ``open_env``)."""

from __future__ import annotations

import math

import pytest

from aiowheel.bench.contenders import Contender
from aiowheel.bench.env import open_env, percentile, run_fresh


def test_percentile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile(values, 0.0) == 1.0
    assert math.isnan(percentile([], 0.5))


def test_unknown_backend_or_kind() -> None:
    async def nothing() -> None:
        pass

    with pytest.raises(ValueError, match="unknown backend 'tokio'"):
        run_fresh("tokio", nothing)

    async def enter() -> None:
        async with open_env(Contender("x", "heap", "asyncio")):
            pass

    with pytest.raises(ValueError, match="unknown contender kind 'heap'"):
        run_fresh("asyncio", enter)


def test_a_trio_timer_re_armed_after_its_deadline_was_delivered_records_that_deadline() -> None:
    # Issue 21: the traced rearm run wrote the new deadline into a scope whose old one
    # trio had already delivered; the task then fired and recorded the new deadline
    # with the old firing (lateness -30 s).
    trio = pytest.importorskip("trio")
    from trio.testing import MockClock

    from aiowheel.bench.env import TrioNativeTimers

    rows: list[tuple[object, ...]] = []

    class Rows:
        def record(self, *row: object) -> None:
            rows.append(row)

    fired: list[float] = []
    clock = MockClock()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            timers = TrioNativeTimers(nursery, Rows())  # type: ignore[arg-type]
            timer = timers.call_later(1.0, lambda: fired.append(trio.current_time()))
            await trio.testing.wait_all_tasks_blocked()
            # The deadline passed and its cancellation was delivered, the task not run
            # yet (as when the deadline passes between two batches of re-arms; the
            # cancel stands in for trio's run loop delivering the deadline).
            clock.jump(1.5)
            timer.scope.cancel()
            timer.reset(30.0)
            assert timer.deadline == 1.0

    trio.run(main, clock=clock)
    assert fired == [1.5]
    ((_id, _parent, scheduled, deadline, level, fired_at, cancelled_at),) = rows
    assert (scheduled, deadline, level, fired_at, cancelled_at) == (0.0, 1.0, -1, 1.5, None)


def test_a_pending_trio_timer_is_re_armed() -> None:
    trio = pytest.importorskip("trio")
    from trio.testing import MockClock

    from aiowheel.bench.env import TrioNativeTimers

    fired: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            timers = TrioNativeTimers(nursery)
            timer = timers.call_later(1.0, lambda: fired.append(trio.current_time()))
            await trio.sleep(0.5)
            timer.reset(30.0)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert fired == [30.5]
