"""Tracing in the timer (aiowheel/_tracing.py): which timers a trace keeps (every one,
or one in ``every``: sampling), which handles they get, and the rows a recorder gets,
on asyncio, uvloop and trio. The Parquet side is in tests/analytics."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from aiowheel import Timer, TimerHandle
from aiowheel._handle import TracedHandle
from aiowheel._periodic import PeriodicHandle

pytestmark = pytest.mark.anyio


def noop() -> None:
    pass


@dataclasses.dataclass
class Row:
    timer_id: int
    label: str | None
    scheduled_at: float
    deadline: float
    level: int
    fired_at: float | None
    cancelled_at: float | None


class SampledRecorder:
    """A TraceRecorder that keeps its rows and samples one timer in ``every``."""

    def __init__(self, every: Any = 1) -> None:
        self.every = every
        self.rows: list[Row] = []

    def open(self, *, backend: str, clock: float) -> None:
        pass

    def record(self, *row: Any) -> None:
        self.rows.append(Row(*row))

    def close(self) -> None:
        pass


async def test_sampling_traces_the_first_timer_and_every_kth_after_it() -> None:
    recorder = SampledRecorder(every=3)
    async with Timer(recorder=recorder) as timer:
        now = timer.time()
        handles: list[TimerHandle[Any]] = []
        for i in range(10):
            if i % 2:
                handles.append(timer.schedule_at_nowait(now + 0.01 * i, noop, label=f"t{i}"))
            else:
                handles.append(timer.schedule_nowait(0.01 * i, noop, label=f"t{i}"))
        traced = [i for i, h in enumerate(handles) if isinstance(h, TracedHandle)]
        assert traced == [0, 3, 6, 9]
        # The others are plain handles: nothing of tracing on them.
        assert all(type(h) is TimerHandle for i, h in enumerate(handles) if i not in traced)
        for i in (0, 1, 2, 3):
            assert handles[i].cancel()
        await handles[-1].wait()
    # One row per traced timer, numbered by its place among all timers scheduled.
    rows = sorted(recorder.rows, key=lambda row: row.timer_id)
    assert [row.timer_id for row in rows] == [1, 4, 7, 10]
    assert [row.label for row in rows] == ["t0", "t3", "t6", "t9"]
    assert [row.cancelled_at is not None for row in rows] == [True, True, False, False]
    for row in rows[2:]:
        assert row.fired_at is not None
        assert row.fired_at >= row.deadline


async def test_periodic_timers_count_as_one_timer_each_traced_or_not() -> None:
    recorder = SampledRecorder(every=2)
    runs: list[str] = []
    second = anyio.Event()

    def run(name: str) -> None:
        runs.append(name)
        if runs.count("tock") == 2:
            second.set()

    async with Timer(recorder=recorder) as timer:
        first = timer.schedule_nowait(50.0, noop)  # timer 1: traced
        untraced = timer.every(0.01, run, "tick", label="tick")  # timer 2: not traced
        traced = timer.every(0.01, run, "tock", label="tock")  # timer 3: traced
        last = timer.schedule_nowait(50.0, noop)  # timer 4: not traced
        assert isinstance(first, TracedHandle)
        assert type(last) is TimerHandle
        assert isinstance(untraced, PeriodicHandle)
        assert untraced.label == "tick"  # a periodic handle keeps its label anyway
        await second.wait()
        assert untraced.cancel()
        assert traced.cancel()
    rows = recorder.rows
    assert {row.label for row in rows} == {None, "tock"}
    tocks = [row for row in rows if row.label == "tock"]
    assert {row.timer_id for row in tocks} == {3}
    # One row per period: each run fired, and the last period was cancelled.
    assert [row.fired_at is not None for row in tocks] == [True] * runs.count("tock") + [False]
    (at_close,) = (row for row in rows if row.label is None)
    assert at_close.timer_id == 1
    assert at_close.cancelled_at is not None


async def test_a_periodic_timer_stopped_in_its_own_run_ends_its_trace_cancelled() -> None:
    # Every period ends fired or cancelled: the rows are stats' fired + cancelled, and
    # the last row is the cancelled period the run had reserved.
    recorder = SampledRecorder()
    runs: list[int] = []
    stopped = anyio.Event()

    def run() -> None:
        runs.append(1)
        if len(runs) == 2:
            assert periodic.cancel()  # inside its own run
            stopped.set()

    async with Timer(recorder=recorder) as timer:
        periodic = timer.every(0.01, run, label="p")
        await stopped.wait()
        stats = timer.stats()
    assert (stats.fired, stats.cancelled) == (2, 1)
    assert len(recorder.rows) == stats.fired + stats.cancelled
    fired = [row for row in recorder.rows if row.fired_at is not None]
    (cancelled,) = (row for row in recorder.rows if row.cancelled_at is not None)
    assert len(fired) == 2
    assert cancelled.cancelled_at >= max(row.fired_at or 0.0 for row in fired)


async def test_a_close_during_a_periodic_run_ends_its_trace_cancelled() -> None:
    # aclose() while an async run is on a worker: its reserved period is cancelled by
    # the close, and the trace says so.
    recorder = SampledRecorder()
    started = anyio.Event()

    async def run() -> None:
        started.set()
        await anyio.sleep_forever()

    timer = Timer(recorder=recorder)
    async with timer:
        timer.every(0.01, run, label="p")
        await started.wait()
    stats = timer.stats()
    assert stats.fired == 1
    assert len(recorder.rows) == stats.fired + stats.cancelled
    assert [row.cancelled_at is not None for row in recorder.rows] == [False, True]


async def test_without_sampling_every_timer_gets_a_traced_handle() -> None:
    recorder = SampledRecorder()
    async with Timer(recorder=recorder) as timer:
        handles = [timer.schedule_nowait(10.0, noop) for _ in range(5)]
        assert all(isinstance(h, TracedHandle) for h in handles)
        assert handles[0].cancel()
        assert not handles[0].cancel()  # a second cancel writes no second row
    assert sorted(row.timer_id for row in recorder.rows) == [1, 2, 3, 4, 5]
    assert sum(row.cancelled_at is not None for row in recorder.rows) == 5


async def test_a_timer_without_a_recorder_makes_plain_handles() -> None:
    async with Timer() as timer:
        assert type(timer.schedule_nowait(10.0, noop)) is TimerHandle
        assert type(timer.schedule_at_nowait(timer.time() + 10.0, noop)) is TimerHandle


@pytest.mark.parametrize(
    ("every", "error"),
    [(0, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)],
)
def test_a_recorder_with_a_bad_sampling_rate_is_refused(every: Any, error: type) -> None:
    with pytest.raises(error, match="every"):
        Timer(recorder=SampledRecorder(every))
