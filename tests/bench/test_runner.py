"""The runner (aiowheel/bench/runner.py): traced repetitions, bench-results.json, and
contenders whose event loop is not installed."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_support import (
    RESULT_KEYS,
    TINY,
    UVLOOP_MISSING,
    StandInRecorder,
    applicable,
    parse,
    results_of,
    run_json,
)

from aiowheel.bench import cli
from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.output import Output
from aiowheel.bench.registry import WORKLOADS
from aiowheel.bench.runner import Runner


def test_trace_writes_one_file_per_contender_and_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    StandInRecorder.made = []
    args = ["-w", "fire", "-w", "idle", "-w", "kafka", *TINY, "--trace", str(tmp_path), "--json"]
    assert cli.run(parse(args), args, trace_factory=StandInRecorder) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
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
            spec = next(c for c in CONTENDERS if c.name == contender)
            assert recorder.implementation == spec.kind
            assert recorder.opened["backend"] == spec.backend
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

    # bench-results.json: the run's settings and every result, as the --json lines say.
    document = json.loads((tmp_path / "bench-results.json").read_text())
    assert set(document) == {"version", "settings", "machine", "complete", "results"}
    assert document["complete"] is True
    assert document["version"] == 1
    run_line = lines[0]
    assert document["settings"] == run_line["settings"]
    machine = ("python", "implementation", "platform", "cpus", "loadavg", "core", "core_reason")
    assert document["machine"] == {key: run_line[key] for key in machine}
    assert document["results"] == results_of(lines)
    assert all(set(r) == RESULT_KEYS for r in document["results"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_missing_event_loops_are_skipped_in_every_variant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As after `pip install "aiowheel[analytics]"`: no uvloop (issue 10).
    monkeypatch.setitem(sys.modules, "uvloop", None)
    args = ["-w", "rearm", "-w", "kafka", *TINY, "--kafka-rates", "2000,2000", "--json"]
    StandInRecorder.made = []
    all_args = [*args, "--trace", str(tmp_path)]
    assert cli.run(parse(all_args), all_args, trace_factory=StandInRecorder) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    # Only the contenders that rearm or kafka would have run are news.
    uvloop = {
        c.name
        for c in CONTENDERS
        if c.backend == "uvloop"
        and not c.pure
        and not c.trace_every
        and (WORKLOADS["rearm"].applies_to(c) or WORKLOADS["kafka"].applies_to(c))
    }
    # One line per skipped contender, on stderr; stdout stays JSON.
    assert sorted(captured.err.splitlines()) == sorted(
        f"aiowheel bench: skipping {name}: {UVLOOP_MISSING}" for name in uvloop
    )
    assert set(lines[0]["settings"]["unavailable"]) == uvloop
    assert not uvloop & set(lines[0]["settings"]["contenders"])
    results = results_of(lines)
    for workload in ("rearm", "kafka"):
        for metric in WORKLOADS[workload].metrics:
            rows = {
                r["contender"]: r
                for r in results
                if r["workload"] == workload and r["metric"] == metric.key
            }
            assert set(rows) == applicable(workload), (workload, metric.key)
            for name in applicable(workload) & uvloop:
                assert rows[name]["skipped"] == UVLOOP_MISSING
                assert rows[name]["samples"] == []
                assert rows[name]["median"] is None
            for name in applicable(workload) - uvloop:
                assert rows[name]["skipped"] is None
                assert rows[name]["samples"]
                # Peers have a ratio against aiowheel on their own loop, which ran.
                if metric.ratio and not name.startswith("aiowheel-"):
                    backend = "trio" if name == "trio-native" else name.split("-")[-1]
                    assert set(rows[name]["ratios"]) == {f"aiowheel-{backend}"}
    assert not any("uvloop" in r.path.name for r in StandInRecorder.made)
    document = json.loads((tmp_path / "bench-results.json").read_text())
    skipped = {r["contender"] for r in document["results"] if r["skipped"]}
    assert skipped == uvloop - {"deadline-uvloop"}  # deadline-* apply to idle only


def test_default_run_without_trace_writes_no_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_json(capsys, "-w", "rearm", "--n", "50", "--ops", "100", "--reps", "1", "-c", "asyncio")
    assert list(tmp_path.iterdir()) == []


def _failing_repetition(
    monkeypatch: pytest.MonkeyPatch, workload: str, contender: str, error: BaseException, rep: int
) -> None:
    """Make ``contender``'s repetition number ``rep`` (from 1) of ``workload`` raise."""
    target = WORKLOADS[workload]
    real = type(target).repetition
    calls: dict[str, int] = {}

    def repetition(self: Any, c: Any, n: int, data: Any, *args: Any, **kwargs: Any) -> Any:
        calls[c.name] = calls.get(c.name, 0) + 1
        if c.name == contender and calls[c.name] == rep:
            raise error
        return real(self, c, n, data, *args, **kwargs)

    monkeypatch.setattr(type(target), "repetition", repetition)


def test_a_contender_that_raises_is_recorded_as_failed_and_the_others_are_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_repetition(monkeypatch, "churn", "aiowheel-asyncio", RuntimeError("boom\nline 2"), 2)
    save = tmp_path / "run.json"
    args = ["-w", "churn", "-w", "loop-few", "-c", "aiowheel-asyncio,call_later-asyncio"]
    args += ["-c", "loop-asyncio", *TINY, "--save", str(save), "--json"]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    assert (
        captured.err == "aiowheel bench: failed: churn aiowheel-asyncio (the reasons are above)\n"
    )
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [m["message"] for m in lines if m["type"] == "warning"] == [
        "churn (N=300): aiowheel-asyncio failed: rep 2/2: RuntimeError: boom line 2; "
        "the run goes on without it"
    ]
    results = json.loads(save.read_text())["results"]
    churn = [r for r in results if r["workload"] == "churn"]
    ours = [r for r in churn if r["contender"] == "aiowheel-asyncio"]
    assert ours
    assert all(r["failed"] == "rep 2/2: RuntimeError: boom line 2" for r in ours)
    assert all(r["samples"] == [] for r in ours)
    peer = [r for r in churn if r["contender"] == "call_later-asyncio"]
    assert peer
    assert all(len(r["samples"]) == 2 and r["failed"] is None for r in peer)
    # No ratio against a contender that failed.
    assert all(r["ratios"] == {} or set(r["ratios"].values()) == {None} for r in peer)
    # The next workload ran.
    assert any(r["workload"] == "loop-few" and r["samples"] for r in results)


def test_an_interrupted_run_keeps_the_results_of_what_it_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_repetition(monkeypatch, "fire", "call_later-asyncio", KeyboardInterrupt(), 1)
    save = tmp_path / "run.json"
    args = ["-w", "churn", "-w", "fire", "-c", "aiowheel-asyncio,call_later-asyncio", *TINY]
    args += ["--save", str(save), "--no-progress"]
    assert cli.main(args) == 130
    err = capsys.readouterr().err
    assert err.strip() == (
        f"aiowheel bench: interrupted; the finished workloads' results are in {save}"
    )
    document = json.loads(save.read_text())
    assert document["complete"] is False
    assert {r["workload"] for r in document["results"]} == {"churn"}
    assert all(r["samples"] for r in document["results"])


def test_the_traces_of_an_interrupted_variant_are_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FileRecorder(StandInRecorder):
        def __init__(self, path: str, **kwargs: Any) -> None:
            super().__init__(path, **kwargs)
            Path(path).write_text("half a trace")

    StandInRecorder.made = []
    _failing_repetition(monkeypatch, "fire", "call_later-asyncio", KeyboardInterrupt(), 3)
    args = ["-w", "churn", "-w", "fire", "-c", "aiowheel-asyncio,call_later-asyncio", *TINY]
    args += ["--trace", str(tmp_path), "--no-progress"]
    assert cli.run(parse(args), args, trace_factory=FileRecorder) == 130
    capsys.readouterr()
    # churn's traces stay (its results are in bench-results.json); fire's, cut off
    # in its traced repetition, are gone.
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == [
        "churn-aiowheel-asyncio.parquet",
        "churn-call_later-asyncio.parquet",
    ]
    document = json.loads((tmp_path / "bench-results.json").read_text())
    assert {r["workload"] for r in document["results"]} == {"churn"}


class _CountingOutput(Output):
    """Records the plan and every step done."""

    def start(self, steps: int, machine_info: dict[str, Any], **kw: Any) -> None:
        super().start(steps, machine_info, **kw)
        self.plan = (steps, kw.get("planned_seconds"))
        self.done: list[tuple[int, float]] = []

    def advance(self, steps: int = 1) -> None:
        super().advance(steps)
        self.done.append((steps, self.step_seconds))


def test_the_plan_counts_every_phase_and_a_long_search_never_passes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A kafka search that takes more probes than its plan: the bar counted past its
    # end (266/258) and its time stopped. The server's steps are in the plan too.
    monkeypatch.setattr(type(WORKLOADS["kafka"]), "planned_steps", lambda self, s, c: 2)
    args = ["-w", "kafka", "-w", "fire", *TINY, "-c", "aiowheel-asyncio,call_later-asyncio"]
    settings = cli.settings_from(parse([*args, "--json"]))
    output = _CountingOutput(settings, stdout=io.StringIO(), stderr=io.StringIO())
    Runner(settings, output).run()
    steps, seconds = output.plan
    assert sum(n for n, _ in output.done) == steps
    assert sum(n * w for n, w in output.done) == pytest.approx(seconds)
    report = cli.settings_from(parse(["--report"]))
    server = WORKLOADS["server"]
    runner = Runner(report, Output(report))
    assert runner._planned_steps(server) > 0
    assert server.step_seconds(report) > 2 * WORKLOADS["churn"].step_seconds(report)


def test_a_failed_traced_run_leaves_out_its_trace_and_keeps_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FileRecorder(StandInRecorder):
        def __init__(self, path: str, **kwargs: Any) -> None:
            super().__init__(path, **kwargs)
            Path(path).write_text("half a trace")

    StandInRecorder.made = []
    # Its third run is the traced one (TINY: 2 repetitions).
    _failing_repetition(monkeypatch, "fire", "call_later-asyncio", OSError("disk full"), 3)
    args = ["-w", "fire", "-c", "aiowheel-asyncio,call_later-asyncio", *TINY]
    args += ["--trace", str(tmp_path), "--json"]
    assert cli.run(parse(args), args, trace_factory=FileRecorder) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["message"] for m in lines if m["type"] == "warning"] == [
        "fire (N=300): call_later-asyncio's traced run failed: OSError: disk full; "
        "its trace is left out"
    ]
    assert [p.name for p in tmp_path.glob("*.parquet")] == ["fire-aiowheel-asyncio.parquet"]
    results = [line for line in lines if line["type"] == "result"]
    assert all(len(r["samples"]) == 2 and r["failed"] is None for r in results)
