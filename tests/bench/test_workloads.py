"""The repeated workloads (aiowheel/bench/workloads.py) on tiny N, every contender."""

from __future__ import annotations

from typing import Any

import pytest
from bench_support import (
    AIOWHEEL,
    RESULT_KEYS,
    TINY,
    against,
    applicable,
    ours,
    results_of,
    run_json,
)

from aiowheel import TimerHandle
from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.registry import WORKLOADS
from aiowheel.bench.results import Result, fill_ratios
from aiowheel.bench.settings import Settings
from aiowheel.bench.workload import RepeatedWorkload
from aiowheel.bench.workloads import Spread

REPEATED = [name for name, w in WORKLOADS.items() if isinstance(w, RepeatedWorkload)]

Lines = list[dict[str, Any]]


@pytest.fixture(scope="module")
def runs() -> dict[str, Lines]:
    """The --json lines of each workload run alone, shared by this module's tests."""
    return {}


def run_alone(runs: dict[str, Lines], capsys: pytest.CaptureFixture[str], workload: str) -> Lines:
    if workload not in runs:
        runs[workload] = run_json(capsys, "--workload", workload, *TINY)
    return runs[workload]


@pytest.mark.parametrize("workload", REPEATED)
def test_workload_runs_every_contender(
    workload: str, runs: dict[str, Lines], capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run_alone(runs, capsys, workload)
    assert lines[0]["type"] == "run"
    assert lines[-1]["type"] == "end"
    results = results_of(lines)
    spec = WORKLOADS[workload]
    for metric in spec.metrics:
        rows = {r["contender"]: r for r in results if r["metric"] == metric.key}
        having = {c.name for c in CONTENDERS if metric.kinds is None or c.kind in metric.kinds}
        assert set(rows) == applicable(workload) & having, metric.key
        for name, row in rows.items():
            assert set(row) == RESULT_KEYS
            assert row["workload"] == workload
            assert row["n"] == 300
            assert row["variant"] == "N=300"
            assert row["better"] == metric.better
            assert row["skipped"] is None
            assert row["reps"] == 2
            assert len(row["samples"]) == 2
            assert all(isinstance(s, float) for s in row["samples"])
            assert row["min"] <= row["median"] <= row["max"]
            if name in ours(workload) or not metric.ratio:
                assert row["ratios"] == {}
            else:
                # A ratio against aiowheel on the peer's own loop, > 0 or null.
                assert set(row["ratios"]) == against(workload, name, metric.kinds)
                for value in row["ratios"].values():
                    assert value is None or value > 0


def test_workload_figures_are_plausible(
    runs: dict[str, Lines], capsys: pytest.CaptureFixture[str]
) -> None:
    # What the figures mean, checked where the workload determines them exactly (on the
    # runs of the test above when it ran first: no need to measure twice).
    results = [
        row
        for workload in ("fire", "spread", "memory", "collector")
        for row in results_of(run_alone(runs, capsys, workload))
    ]

    def figures(workload: str, metric: str) -> dict[str, dict[str, Any]]:
        return {
            r["contender"]: r
            for r in results
            if r["workload"] == workload and r["metric"] == metric
        }

    for row in figures("fire", "late_p50_ms").values():
        assert row["min"] <= figures("fire", "late_p99_ms")[row["contender"]]["max"]
    # aiowheel never fires early (docs/design.md, guarantee 1), whatever the backend.
    for name, row in figures("fire", "early_pct").items():
        if name in AIOWHEEL:
            assert row["max"] == 0.0
    for row in figures("fire", "rate").values():
        assert row["median"] > 0
    for row in figures("spread", "wakeups").values():
        assert row["median"] >= 1
    occupied = {r["median"] for r in figures("spread", "occupied_ticks").values()}
    assert len(occupied) == 1  # the same deadlines for everyone
    for row in figures("memory", "bytes").values():
        assert row["median"] > 0
    # Every timer is still pending when the memory workload reads the growth, so an
    # aiowheel figure is at least one handle's object (it once divided the memory of
    # the timers that had not fired yet by N).
    for name, row in figures("memory", "bytes").items():
        if name in AIOWHEEL:
            assert row["min"] >= TimerHandle.__basicsize__, name
    # A pending timer is at least one object the collector tracks (its handle) on the
    # peers and on the pure core; on the compiled core, none (docs/design.md, "Pending
    # timers and the garbage collector": what is left is the harness's few hundred
    # objects, over this test's tiny N). The collections were timed.
    for name, row in figures("collector", "tracked").items():
        if name.startswith("aiowheel") and row["core"] == "compiled":
            assert row["max"] < 1, name
        else:
            assert row["min"] >= 1, name
    for row in figures("collector", "full_ms").values():
        assert row["min"] > 0


def test_trio_native_sits_out_sizes_above_the_task_cap() -> None:
    settings = Settings(workloads=["churn"], trio_max_tasks=1_000)
    trio_native = next(c for c in CONTENDERS if c.name == "trio-native")
    churn, memory = WORKLOADS["churn"], WORKLOADS["memory"]
    assert isinstance(churn, RepeatedWorkload)
    assert isinstance(memory, RepeatedWorkload)
    assert churn.skip_reason(trio_native, 1_000, settings) is None
    assert "N > 1,000 tasks" in (churn.skip_reason(trio_native, 1_001, settings) or "")
    # memory measures trio-native at the cap instead: the cost per task does not depend on N.
    assert memory.skip_reason(trio_native, 1_001, settings) is None


def test_churn_stops_its_pairs_at_the_time_budget() -> None:
    # bench --report: trio-native's 50,000 pairs took seconds each repetition; the
    # pairs stop after the budget (whole batches, at least 5), the figure is per pair.
    churn = WORKLOADS["churn"]
    assert isinstance(churn, RepeatedWorkload)
    contender = next(c for c in CONTENDERS if c.name == "aiowheel-asyncio")
    for budget, ops in ((1e-9, 5_000), (60.0, 12_000)):
        settings = Settings(workloads=["churn"], ops=12_000, op_seconds=budget)
        data = churn.prepare(100, 0, settings)
        values = churn.repetition(contender, 100, data, settings, {})
        assert values["_ops"] == ops
        assert values["pair_ns"] > 0
    params = churn.params(Settings(workloads=[], op_seconds=0.5))
    assert "in 0.5 s (at least 5,000)" in params["pairs"]


def test_quick_memory_measures_trio_native_at_10000_tasks() -> None:
    # A task per timer costs the same at any N; 50,000 under tracemalloc took 7 s of
    # CPU per quick repetition.
    memory = WORKLOADS["memory"]
    quick = memory.params(Settings(workloads=[], quick=True))
    full = memory.params(Settings(workloads=[]))
    assert quick["trio-native N"] == "min(N, 10,000)"
    assert full["trio-native N"] == "min(N, 200,000)"


def _spread_results(late_p99_ms: dict[str, float]) -> list[Result]:
    spread = Spread()
    by_name = {c.name: c for c in CONTENDERS}
    results = []
    for name, late in late_p99_ms.items():
        for metric in spread.metrics:
            value = {"wakeups": 900.0, "late_p99_ms": late}.get(metric.key, 1.0)
            results.append(
                spread.result(
                    metric, by_name[name], [value], variant="N=20,000", n=20_000, params={}
                )
            )
    return results


def test_spread_withholds_the_wakeup_ratio_of_a_loop_that_fell_behind() -> None:
    # trio-native at 20,000 timers/s on a busy machine: its loop ran back to back, so its
    # iteration count (2 for 20,000 timers) says how long an iteration took, not how
    # often timers woke it. No ratio may be computed from it (issue 10).
    results = _spread_results(
        {"aiowheel-trio": 3.0, "trio-native": 2_603.0, "call_later-asyncio": 4.0}
    )
    warnings = Spread().withhold_ratios(results, Settings(workloads=["spread"]))
    assert len(warnings) == 1
    assert "trio-native fell behind" in warnings[0]
    assert "no ratio" in warnings[0]
    fill_ratios(results)
    ratios = {(r.contender.name, r.metric): r.ratios for r in results}
    assert ratios["trio-native", "wakeups"] == {"aiowheel-trio": None}
    assert ratios["call_later-asyncio", "wakeups"] == {"aiowheel-trio": 1.0}
    # Its other figures keep their ratios: only the count is not comparable.
    assert ratios["trio-native", "late_p99_ms"]["aiowheel-trio"] == pytest.approx(2_603.0 / 3.0)


def test_spread_withholds_every_wakeup_ratio_against_an_aiowheel_that_fell_behind() -> None:
    results = _spread_results({"aiowheel-asyncio": 80.0, "call_later-asyncio": 4.0})
    (warning,) = Spread().withhold_ratios(results, Settings(workloads=["spread"]))
    assert "aiowheel-asyncio fell behind" in warning
    assert "driver wake-ups" in warning
    fill_ratios(results)
    wakeups = next(
        r for r in results if r.contender.name == "call_later-asyncio" and r.metric == "wakeups"
    )
    assert wakeups.ratios == {"aiowheel-asyncio": None}
