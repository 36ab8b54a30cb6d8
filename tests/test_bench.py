"""The benchmark suite's command line, JSON output, tracing and every workload on tiny N.

Nothing here asserts a speed: the suite measures, the tests check that it runs every
contender on every workload and reports what it measured in the documented shape.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import aiowheel.__main__ as cli_main
from aiowheel.bench import cli
from aiowheel.bench.contenders import CONTENDERS, parse_contenders
from aiowheel.bench.results import Result, ratio
from aiowheel.bench.workloads import WORKLOADS

# Tiny sizes and windows: each repetition takes milliseconds.
TINY = [
    "--n",
    "300",
    "--ops",
    "1000",
    "--reps",
    "2",
    "--spread-window",
    "0.05",
    "--idle-seconds",
    "0.03",
    "--idle-timeout",
    "0.02",
    "--kafka-probe",
    "0.05",
    "--kafka-seconds",
    "0.1",
    "--kafka-rates",
    "2000,4000",
]

RESULT_KEYS = {
    "type",
    "workload",
    "variant",
    "n",
    "metric",
    "label",
    "unit",
    "better",
    "contender",
    "kind",
    "backend",
    "median",
    "min",
    "max",
    "samples",
    "reps",
    "ratios",
    "skipped",
    "params",
}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert cli.main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]


def applicable(workload: str) -> set[str]:
    return {c.name for c in CONTENDERS if c.kind in WORKLOADS[workload].kinds}


@pytest.mark.parametrize("workload", [w for w in WORKLOADS if w != "kafka"])
def test_workload_runs_every_contender(workload: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_json(capsys, "--workload", workload, *TINY)
    assert lines[0]["type"] == "run"
    assert lines[-1]["type"] == "end"
    results = [line for line in lines if line["type"] == "result"]
    spec = WORKLOADS[workload]
    for metric in spec.metrics:
        rows = {r["contender"]: r for r in results if r["metric"] == metric.key}
        assert set(rows) == applicable(workload), metric.key
        for name, row in rows.items():
            assert set(row) == RESULT_KEYS
            assert row["workload"] == workload
            assert row["n"] == 300
            assert row["variant"] == "N=300"
            assert row["better"] == metric.better
            assert row["reps"] == 2
            assert len(row["samples"]) == 2
            assert all(isinstance(s, float) for s in row["samples"])
            assert row["min"] <= row["median"] <= row["max"]
            if name.startswith("aiowheel-") or not metric.ratio:
                assert row["ratios"] == {}
            else:
                # A ratio against each aiowheel contender, > 0 or null.
                assert set(row["ratios"]) == {
                    "aiowheel-asyncio",
                    "aiowheel-uvloop",
                    "aiowheel-trio",
                }
                for value in row["ratios"].values():
                    assert value is None or value > 0


def test_workload_figures_are_plausible(capsys: pytest.CaptureFixture[str]) -> None:
    # What the figures mean, checked where the workload determines them exactly.
    lines = run_json(capsys, "-w", "fire", "-w", "spread", "-w", "memory", *TINY)
    results = [line for line in lines if line["type"] == "result"]

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
        if name.startswith("aiowheel-"):
            assert row["max"] == 0.0
    for row in figures("fire", "rate").values():
        assert row["median"] > 0
    for row in figures("spread", "wakeups").values():
        assert row["median"] >= 1
    occupied = {r["median"] for r in figures("spread", "occupied_ticks").values()}
    assert len(occupied) == 1  # the same deadlines for everyone
    for row in figures("memory", "bytes").values():
        assert row["median"] > 0


def test_kafka_search(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_json(capsys, "-w", "kafka", "--kafka-case", "both", *TINY)
    results = [line for line in lines if line["type"] == "result"]
    for case in ("high", "low"):
        rows = {r["contender"]: r for r in results if r["variant"] == case}
        assert set(rows) == applicable("kafka")
        for name, row in rows.items():
            assert row["workload"] == "kafka"
            assert row["n"] is None
            probes = row["params"]["probes"]
            assert probes, name
            assert probes[0]["rate"] == 2000
            assert all(p["rate"] <= 4000 for p in probes)
            sustained = [
                r for r in results if r["variant"] == case and r["metric"] == "sustained_rps"
            ]
            assert all(
                r["median"] in (0.0, *(p["rate"] for p in probes if p["ok"])) or True
                for r in sustained
            )
        for row in results:
            if row["metric"] == "sustained_rps" and row["variant"] == case:
                confirmed = [p for p in row["params"]["probes"] if p["ok"]]
                if row["median"]:
                    assert any(
                        math.isclose(p["rate"], row["median"], rel_tol=1e-3) for p in confirmed
                    )


class StandInRecorder:
    """A TraceRecorder that keeps rows in memory and writes a marker file on close."""

    made: list[StandInRecorder] = []

    def __init__(self, path: str, *, run_id: str, implementation: str) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.implementation = implementation
        self.opened: dict[str, Any] | None = None
        self.rows: list[tuple[Any, ...]] = []
        self.closed = 0
        StandInRecorder.made.append(self)

    def open(self, *, backend: str, clock: float) -> None:
        assert self.opened is None
        self.opened = {"backend": backend, "clock": clock}

    def record(self, *row: Any) -> None:
        assert self.opened is not None
        assert not self.closed
        self.rows.append(row)

    def close(self) -> None:
        self.closed += 1
        self.path.write_text(f"{len(self.rows)} rows\n")


def parse(args: list[str]) -> Any:
    return cli.build_parser().parse_args(args)


def test_trace_writes_one_file_per_contender_and_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    StandInRecorder.made = []
    args = ["-w", "fire", "-w", "idle", "-w", "kafka", *TINY, "--trace", str(tmp_path), "--json"]
    assert cli.run(parse(args), args, trace_factory=StandInRecorder) == 0
    capsys.readouterr()
    by_path = {r.path.name: r for r in StandInRecorder.made}
    for name in applicable("fire"):
        assert f"fire-{name}.parquet" in by_path
    for name in applicable("idle"):
        assert f"idle-{name}.parquet" in by_path
    assert any(p.startswith("kafka-high-") for p in by_path)
    for recorder in StandInRecorder.made:
        assert recorder.closed == 1, recorder.path
        assert recorder.opened is not None
        contender = recorder.path.name.split("-", 1)[1].removesuffix(".parquet")
        if recorder.path.name.startswith("fire-"):
            expected_kind = next(c for c in CONTENDERS if c.name == contender).kind
            assert recorder.implementation == expected_kind
            assert (
                recorder.opened["backend"]
                == next(c for c in CONTENDERS if c.name == contender).backend
            )
            # The burst: every timer of the traced repetition fired, once.
            fired = [row for row in recorder.rows if row[5] is not None]
            assert len(fired) >= 300
        for row in recorder.rows:
            timer_id, _label, scheduled_at, deadline, level, fired_at, cancelled_at = row
            assert (fired_at is None) != (cancelled_at is None)
            assert isinstance(timer_id, int)
            assert isinstance(deadline, float)
            if recorder.implementation == "aiowheel":
                assert level >= -1
            else:
                assert level == -1
            # Where no callback re-arms its own handle (idle's do: the core then
            # records the new period's scheduled_at/deadline for the firing that just
            # ended), each row is ordered and aiowheel is never early.
            if not recorder.path.name.startswith("idle-"):
                assert scheduled_at <= (fired_at if fired_at is not None else cancelled_at)
            fire = recorder.path.name.startswith("fire-")
            if fire and fired_at is not None and recorder.implementation == "aiowheel":
                assert fired_at >= deadline
        assert recorder.path.exists()


def test_report_runs_traces_then_the_analytics_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    fake = types.ModuleType("aiowheel.analytics.report")
    fake.main = lambda argv: calls.append(list(argv)) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aiowheel.analytics.report", fake)
    monkeypatch.setitem(sys.modules, "aiowheel.analytics", types.ModuleType("aiowheel.analytics"))
    out = tmp_path / "out"
    args = ["-w", "fire", *TINY, "--report", "--out", str(out), "--json"]
    assert cli.run(parse(args), args, trace_factory=StandInRecorder) == 0
    capsys.readouterr()
    (argv,) = calls
    assert argv[-2:] == ["--out", str(out / "report")]
    traces = [Path(p) for p in argv[:-2]]
    assert {p.name for p in traces} == {f"fire-{n}.parquet" for n in applicable("fire")}
    assert all(p.parent == out / "traces" for p in traces)


def test_console_script_dispatches(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main.main(["--help"])
    assert info.value.code == 0
    assert "bench" in capsys.readouterr().out

    with pytest.raises(SystemExit) as info:
        cli_main.main(["bench", "--help"])
    assert info.value.code == 0
    assert "--workload" in capsys.readouterr().out

    with pytest.raises(SystemExit) as info:
        cli_main.main(["bench", "--workload", "nope"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err

    with pytest.raises(SystemExit) as info:
        cli_main.main(["bench", "-w", "churn", "--n", "50", "--ops", "100", "--reps", "1"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "churn" in out
    assert "aiowheel-asyncio" in out
    assert "call_later-uvloop" in out

    # `report` hands everything after the word to aiowheel.analytics.report.main.
    seen: list[list[str]] = []
    fake = types.ModuleType("aiowheel.analytics.report")
    fake.main = lambda argv: seen.append(list(argv)) or 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aiowheel.analytics.report", fake)
    monkeypatch.setitem(sys.modules, "aiowheel.analytics", types.ModuleType("aiowheel.analytics"))
    with pytest.raises(SystemExit) as info:
        cli_main.main(["report", "a.parquet", "--out", "r", "--help"])
    assert info.value.code == 3
    assert seen == [["a.parquet", "--out", "r", "--help"]]


def test_python_m_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(
            [
                "-w",
                "rearm",
                "--n",
                "50",
                "--ops",
                "100",
                "--reps",
                "1",
                "-c",
                "aiowheel-asyncio,call_later-asyncio",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "aiowheel-asyncio" in out
    assert "call_later-asyncio" in out
    assert "call_later-uvloop" not in out
    assert "trio-native" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n", "0"], "positive"),
        (["--n", "ten"], "expected N"),
        (["--reps", "0"], "at least 1"),
        (["--spread-window", "-1"], "positive"),
        (["--kafka-rates", "5000,10"], "START <= MAX"),
        (["--kafka-case", "medium"], "invalid choice"),
    ],
)
def test_bad_arguments_are_rejected(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_contender_selection() -> None:
    assert [c.name for c in parse_contenders(["aiowheel"])] == [
        "aiowheel-asyncio",
        "aiowheel-uvloop",
        "aiowheel-trio",
    ]
    assert [c.name for c in parse_contenders(["uvloop,trio-native"])] == [
        "aiowheel-uvloop",
        "call_later-uvloop",
        "deadline-uvloop",
        "trio-native",
    ]
    assert parse_contenders(None) == list(CONTENDERS)
    with pytest.raises(ValueError, match="unknown contender"):
        parse_contenders(["libuv"])
    with pytest.raises(SystemExit):
        cli.main(["-c", "libuv"])


def test_ratio_direction() -> None:
    ours, peer = CONTENDERS[0], CONTENDERS[3]

    def result(contender: Any, better: str, value: float) -> Result:
        return Result("w", "v", 1, "m", "m", "", better, contender, [value])

    # Lower is better: the peer's 300 ns against our 100 ns is 3x in our favour.
    assert ratio(result(ours, "lower", 100.0), result(peer, "lower", 300.0)) == 3.0
    # Higher is better: our 200k/s against the peer's 100k/s is 2x.
    assert ratio(result(ours, "higher", 2e5), result(peer, "higher", 1e5)) == 2.0
    # Negative lateness (fired early) or nothing measured: no ratio.
    assert ratio(result(ours, "lower", 1.0), result(peer, "lower", -0.5)) is None
    empty = Result("w", "v", 1, "m", "m", "", "lower", peer, [])
    assert ratio(result(ours, "lower", 1.0), empty) is None


def test_report_runs_quick_sizes_unless_full() -> None:
    # The README's main job (`aiowheel bench --report`) must finish in a few minutes.
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.settings_from(parser.parse_args(["--report"])).quick
    assert not cli.settings_from(parser.parse_args(["--report", "--full"])).quick
    assert not cli.settings_from(parser.parse_args([])).quick
    with pytest.raises(SystemExit, match="--full goes with --report"):
        cli.settings_from(parser.parse_args(["--full"]))
    with pytest.raises(SystemExit, match="contradict"):
        cli.settings_from(parser.parse_args(["--report", "--full", "--quick"]))
