"""The drop-in loop's workloads (aiowheel/bench/loop_workloads.py, issue 18): who runs
them, on which loop, opt-in, and the shape of their figures. Tiny sizes; no speed is
asserted (the figures are in docs/loop.md, "Figures")."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from bench_support import LOOP, RLOOP_MISSING, TINY, parse, results_of, run_json

from aiowheel.bench import cli
from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.env import run_fresh
from aiowheel.bench.registry import DEFAULT_WORKLOADS, GROUPS, WORKLOADS

LOOP_WORKLOADS = [
    "loop-reschedule",
    "loop-steps",
    "loop-timeout",
    "loop-few",
    "loop-memory",
    "loop-collector",
]
PEERS = {"call_later-asyncio", "call_later-uvloop", "call_later-rloop"}


def test_loop_group_names_every_loop_workload_and_none_runs_by_default() -> None:
    assert GROUPS["loop"] == LOOP_WORKLOADS
    assert not set(LOOP_WORKLOADS) & set(DEFAULT_WORKLOADS)
    assert cli.settings_from(parse(["-w", "loop"])).workloads == LOOP_WORKLOADS
    assert cli.settings_from(parse(["-w", "loop-steps", "-w", "loop"])).workloads[0] == (
        "loop-steps"
    )
    # No --workload: the default set, which the main job's time budget was made for.
    assert cli.settings_from(parse([])).workloads == DEFAULT_WORKLOADS


def test_loop_workloads_run_only_the_loops_and_the_loops_run_nothing_else() -> None:
    for name, workload in WORKLOADS.items():
        runs = {c.name for c in CONTENDERS if workload.applies_to(c) and not c.pure}
        if name in [*LOOP_WORKLOADS, "server"]:
            assert runs == LOOP | PEERS, name
        elif name == "timeout":
            # The one timer workload with a drop-in figure (asyncio.timeout on the
            # drop-in loop, N pending): its peers are the plain loops it runs anyway.
            assert runs & LOOP == LOOP
            assert "call_later-rloop" not in runs
        else:
            # The default run pays nothing for them.
            assert not runs & (LOOP | {"call_later-rloop"}), name
    assert {c.name for c in CONTENDERS if c.kind == "loop"} == LOOP
    for contender in CONTENDERS:
        if contender.kind == "loop":
            # aiowheel's wheel holds the timers: labelled by the core that runs it.
            assert contender.is_aiowheel
            assert contender.core in ("compiled", "pure")


@pytest.mark.parametrize(
    ("backend", "drop_in"),
    [("asyncio", True), ("uvloop", True), ("rloop", False), ("asyncio", False)],
)
def test_each_contender_runs_in_its_own_loop(backend: str, drop_in: bool) -> None:
    async def which() -> str:
        loop = asyncio.get_running_loop()
        loop.call_later(10.0, print).cancel()
        return type(loop).__module__

    module = run_fresh(backend, which, drop_in=drop_in)
    if drop_in:
        assert module == "aiowheel._loop"
    else:
        assert module.split(".")[0] == {"asyncio": "asyncio", "rloop": "rloop"}[backend]


def test_loop_workloads_report_every_loop_with_ratios_against_the_drop_in_loop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = run_json(capsys, "-w", "loop", *TINY)
    results = results_of(lines)
    assert [r["workload"] for r in results] == sorted(
        (r["workload"] for r in results), key=LOOP_WORKLOADS.index
    )
    for name in LOOP_WORKLOADS:
        for metric in WORKLOADS[name].metrics:
            rows = {
                r["contender"]: r
                for r in results
                if r["workload"] == name and r["metric"] == metric.key
            }
            assert set(rows) == LOOP | PEERS, (name, metric.key)
            for contender, row in rows.items():
                assert row["skipped"] is None
                assert row["reps"] == 2
                # The collector's share may be nothing at all (no collection ran, or
                # 300 timers added less to a full collection than its noise).
                low = 0.0 if "gc" in metric.key or metric.key == "per_timer_ns" else 1e-9
                assert all(s >= low for s in row["samples"]), (name, contender)
                if contender in LOOP:
                    assert row["core"] in ("compiled", "pure")
                    assert row["ratios"] == {}
                elif metric.ratio:
                    # Against the drop-in loop on its own base (rloop: the uvloop one).
                    base = contender.removeprefix("call_later-")
                    assert set(row["ratios"]) == {
                        "loop-asyncio" if base == "asyncio" else "loop-uvloop"
                    }
                    assert all(v is None or v > 0 for v in row["ratios"].values())
    # Memory: a pending timer costs at least its handle, on every loop. The collector
    # tracks at least one object per pending timer on the plain loops (rloop's timers
    # live in Rust, beside one tracked Python object each at most) and on the pure
    # core's drop-in loop; none on the compiled core's, which hides its pending handles
    # from it (docs/design.md, "Pending timers and the garbage collector"): what is left
    # is the harness's own objects, a few hundred whatever N, over this test's tiny N.
    for row in results:
        if row["workload"] == "loop-memory":
            assert row["min"] >= 64, row["contender"]
        if row["workload"] == "loop-collector" and row["metric"] == "tracked":
            if row["contender"] in LOOP and row["core"] == "compiled":
                assert row["max"] < 1, row
            else:
                assert row["min"] >= (0 if row["contender"] == "call_later-rloop" else 1)


def test_a_missing_rloop_is_news_only_for_the_loop_workloads(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rloop", None)
    args = ["-w", "rearm", *TINY, "-c", "call_later,loop", "--json"]
    assert cli.run(parse(args), args) == 0
    captured = capsys.readouterr()
    assert "rloop" not in captured.err
    args = ["-w", "loop-steps", *TINY, "--json"]
    assert cli.run(parse(args), args) == 0
    captured = capsys.readouterr()
    assert captured.err == f"aiowheel bench: skipping call_later-rloop: {RLOOP_MISSING}\n"
    rows: list[dict[str, Any]] = results_of([json.loads(x) for x in captured.out.splitlines()])
    skipped = {r["contender"]: r["skipped"] for r in rows if r["skipped"]}
    assert skipped == {"call_later-rloop": RLOOP_MISSING}
