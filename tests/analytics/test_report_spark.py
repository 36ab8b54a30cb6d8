"""The Spark job on small traces with known answers, the whole report end to end on a
recorded Timer run, and the same job through ``spark-submit --master local[2]``.

All tests but the spark-submit one share the session-scoped ``spark`` fixture (one JVM).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from aiowheel import Timer
from aiowheel.analytics import job, plots, report, schema, submit
from aiowheel.analytics.inputs import TraceFiles, TraceInputError, find_traces
from aiowheel.trace import ParquetRecorder

pytestmark = pytest.mark.spark

pd = pytest.importorskip("pandas")
pq = pytest.importorskip("pyarrow.parquet")

# Run A (asyncio): 1000 "req" timers, scheduled at loop time 100.2 with deadline 100.5,
# fired 1..1000 ms late; 500 "idle" timers cancelled at 103.1. Run B (trio): three
# unlabelled timers on other anchors, two fired 2 and 4 ms late, one cancelled.
FIRED = 1000
CANCELLED = 500
PNG = b"\x89PNG\r\n\x1a\n"
#: Short runs (these tests'): no per-second figures are written (issue 32).
PER_SECOND = (schema.P99_PNG, schema.RATES_PNG)
#: ... nor kafka's figure against the offered rate (their bench results have none).
NOT_WRITTEN = (*PER_SECOND, schema.KAFKA_PNG, schema.LOOP_PNG, schema.SERVER_PNG)
WITHOUT_HEADLINE = [
    name for name in schema.OUTPUTS if name != schema.HEADLINE_PNG and name not in NOT_WRITTEN
]
BENCH = Path(__file__).with_name("data") / "bench-results-quick.json"


def nearest_rank(values: list[float], q: float) -> float:
    """The percentile definition of docs/analytics.md."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory, tracegen: SimpleNamespace) -> SimpleNamespace:
    trace_row, write_rows = tracegen.row, tracegen.write
    wall = tracegen.WALL_ANCHOR
    folder = tmp_path_factory.mktemp("known")
    rows = [
        trace_row(i, scheduled_at=100.2, deadline=100.5, fired_at=100.5 + i / 1000, label="req")
        for i in range(1, FIRED + 1)
    ]
    rows += [
        trace_row(FIRED + i, scheduled_at=100.2, deadline=110.0, cancelled_at=103.1, label="idle")
        for i in range(1, CANCELLED + 1)
    ]
    b = {
        "run_id": "run-b",
        "backend": "trio",
        "clock_anchor": 5.0,
        "wall_anchor": wall + 100.0,
    }
    rows_b = [
        trace_row(1, scheduled_at=5.0, deadline=5.5, fired_at=5.502, **b),
        trace_row(2, scheduled_at=5.0, deadline=5.5, fired_at=5.504, **b),
        trace_row(3, scheduled_at=5.0, deadline=5.5, cancelled_at=5.25, **b),
    ]
    write_rows(folder / "a.parquet", rows)
    write_rows(folder / "b.parquet", rows_b)
    assert tracegen.CLOCK_ANCHOR == 100.0  # the window arithmetic below relies on it
    return SimpleNamespace(folder=folder, files=find_traces([str(folder)]), wall=wall)


@pytest.fixture(scope="module")
def result(spark: Any, known: SimpleNamespace) -> job.JobResult:
    return job.run_job(spark, known.files)


@pytest.fixture(scope="module")
def summary(result: job.JobResult) -> Any:
    assert result.rows == FIRED + CANCELLED + 3
    return result.summary


@pytest.fixture(scope="module")
def windows(result: job.JobResult) -> Any:
    return result.windows


def _row(frame: Any, **where: Any) -> Any:
    match = frame
    for key, value in where.items():
        match = match[match[key].isna()] if value is None else match[match[key] == value]
    assert len(match) == 1, match
    return match.iloc[0]


def test_summary_counts(summary: Any) -> None:
    assert list(summary["run_id"]) == ["run-a", "run-a", "run-b"]  # sorted, labels too
    assert list(summary["label"].fillna("-")) == ["idle", "req", "-"]
    req = _row(summary, run_id="run-a", label="req")
    assert (req.scheduled, req.fired, req.cancelled, req.cancel_ratio) == (FIRED, FIRED, 0, 0.0)
    idle = _row(summary, run_id="run-a", label="idle")
    assert (idle.scheduled, idle.fired, idle.cancelled) == (CANCELLED, 0, CANCELLED)
    assert idle.cancel_ratio == 1.0
    b = _row(summary, run_id="run-b")
    assert (b.backend, b.scheduled, b.fired, b.cancelled) == ("trio", 3, 2, 1)
    assert b.cancel_ratio == pytest.approx(1 / 3)


def test_lateness_percentiles_are_exact_on_small_data(summary: Any) -> None:
    req = _row(summary, run_id="run-a", label="req")
    lateness_ms = [float(i) for i in range(1, FIRED + 1)]
    for name, q in schema.SUMMARY_QUANTILES.items():
        expected = nearest_rank(lateness_ms, q)
        assert req[f"lateness_{name}_ms"] == pytest.approx(expected, abs=1e-6), name
    assert (req.lateness_p50_ms, req.lateness_p999_ms) == pytest.approx((500.0, 999.0))
    assert req.lateness_max_ms == pytest.approx(1000.0)
    assert req.lateness_mean_ms == pytest.approx(500.5)
    b = _row(summary, run_id="run-b")
    # Nearest rank: the p50 of {2, 4} is 2, not an interpolated 3.
    assert (b.lateness_p50_ms, b.lateness_p99_ms, b.lateness_max_ms) == pytest.approx(
        (2.0, 4.0, 4.0)
    )
    idle = _row(summary, run_id="run-a", label="idle")
    assert math.isnan(idle.lateness_p50_ms)  # nothing fired: no lateness


def test_lifetimes(summary: Any) -> None:
    req = _row(summary, run_id="run-a", label="req")
    lifetimes = [0.3 + i / 1000 for i in range(1, FIRED + 1)]
    assert req.lifetime_p50_s == pytest.approx(nearest_rank(lifetimes, 0.5))
    assert req.lifetime_p99_s == pytest.approx(nearest_rank(lifetimes, 0.99))
    assert req.lifetime_max_s == pytest.approx(1.3)
    idle = _row(summary, run_id="run-a", label="idle")
    assert (idle.lifetime_p50_s, idle.lifetime_max_s) == pytest.approx((2.9, 2.9))
    assert idle.duration_s == pytest.approx(2.9)
    assert idle.start_unix == pytest.approx(1_700_000_000.2)


def test_the_cdf_covers_all_quantiles(summary: Any) -> None:
    req = _row(summary, run_id="run-a", label="req")
    cdf = list(req.lateness_cdf)
    assert len(cdf) == len(schema.CDF_QUANTILES)
    assert cdf == sorted(cdf)
    assert cdf[0] == pytest.approx(0.001)  # q=0: the smallest value
    assert cdf[-1] == pytest.approx(1.0)  # q=1: the largest


def test_windows_per_second(windows: Any, known: SimpleNamespace) -> None:
    a = windows[windows["run_id"] == "run-a"].reset_index(drop=True)
    # scheduled at 100.2 -> second 0; fired 100.501..101.5 -> seconds 0 and 1;
    # cancelled at 103.1 -> second 3; second 2 saw nothing and is filled in.
    assert list(a["elapsed_s"]) == [0, 1, 2, 3]
    assert list(a["scheduled"]) == [FIRED + CANCELLED, 0, 0, 0]
    assert list(a["fired"]) == [499, 501, 0, 0]
    assert list(a["cancelled"]) == [0, 0, 0, CANCELLED]
    first = [float(i) for i in range(1, 500)]
    second = [float(i) for i in range(500, FIRED + 1)]
    assert a["lateness_p99_ms"][0] == pytest.approx(nearest_rank(first, 0.99))
    assert a["lateness_p99_ms"][1] == pytest.approx(nearest_rank(second, 0.99))
    assert a["lateness_p99_ms"][2:].isna().all()
    assert list(a["second"]) == [
        pd.Timestamp(int(known.wall) + s, unit="s", tz="UTC") for s in range(4)
    ]
    b = windows[windows["run_id"] == "run-b"]
    # Run B's anchors put loop time 5.0 at wall_anchor + 100 s: aligned by Unix time.
    assert list(b["second"]) == [pd.Timestamp(int(known.wall) + 100, unit="s", tz="UTC")]
    assert (b["scheduled"].iloc[0], b["fired"].iloc[0], b["cancelled"].iloc[0]) == (3, 2, 1)


def test_a_remote_path_with_a_bad_schema_is_named(
    spark: Any, tmp_path: Path, tracegen: SimpleNamespace
) -> None:
    path = tracegen.write(
        tmp_path / "x.parquet", [tracegen.row(1, scheduled_at=1.0, deadline=2.0, fired_at=2.5)]
    )
    pq.write_table(pq.read_table(path).drop_columns(["host"]), path)
    uri = path.as_uri().replace("file:///", "file:/")  # a URI Spark resolves itself
    files = TraceFiles(local=(), remote=(uri,), rows=0)
    with pytest.raises(TraceInputError, match="missing column host"):
        job.read_traces(spark, files)


# -- the whole report ------------------------------------------------------------------


def _noop() -> None:
    pass


async def _recorded_run(folder: Path) -> None:
    async with Timer(recorder=ParquetRecorder(folder, run_id="e2e")) as timer:
        handles = [
            timer.schedule_nowait(0.001 * (1 + i % 10), _noop, label="req" if i % 2 else "idle")
            for i in range(300)
        ]
        for handle in handles[::3]:
            handle.cancel()
        for handle in handles:
            if handle.pending():
                await handle.wait()


def test_report_end_to_end_on_a_recorded_timer_run(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    anyio.run(_recorded_run, traces)
    out = tmp_path / "report"
    assert report.main([str(traces), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Timer lateness" in printed
    assert "300 timers from 1 trace file(s)" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(WITHOUT_HEADLINE)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]

    table = pd.read_csv(out / "summary.csv")
    assert list(table["label"]) == ["idle", "req"]
    assert table["scheduled"].sum() == 300
    assert table["cancelled"].sum() == 100
    assert table["fired"].sum() == 200
    assert (table["lateness_p50_ms"] >= 0).all()
    assert pq.read_table(out / "summary.parquet").num_rows == 2
    windows = pq.read_table(out / "windows.parquet").to_pandas()
    assert windows["fired"].sum() == 200
    assert windows["scheduled"].sum() == 300
    assert (out / schema.CDF_PNG).read_bytes()[:8] == PNG
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# aiowheel timer report")
    assert "No headline: no bench-results.json was found next to the traces" in markdown
    assert f"]({schema.CDF_PNG})" in markdown
    # A run of a second or two: a per-second line of 1-2 points says nothing (issue 21).
    assert "Not drawn: the longest traced run lasted" in markdown
    for name in (schema.P99_PNG, schema.RATES_PNG):
        assert f"]({name})" not in markdown
    assert "| e2e | aiowheel-asyncio | idle |" in markdown


def test_a_second_report_replaces_ours_and_keeps_other_files(
    spark: Any, known: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "summary.csv").write_text("stale")
    assert report.main([str(known.folder), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert (out / "notes.txt").read_text() == "keep me"
    assert (out / "summary.csv").read_text() != "stale"
    assert sorted(p.name for p in out.iterdir()) == sorted([*WITHOUT_HEADLINE, "notes.txt"])


def test_a_failure_midway_leaves_dir_untouched(
    spark: Any, known: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(plots, "plot_lateness_cdf", broken)
    out = tmp_path / "report"
    with pytest.raises(RuntimeError, match="plotting failed"):
        report.run_report([str(known.folder)], out, progress=False)
    assert list(tmp_path.iterdir()) == []  # no DIR, no temporary directory


def test_spark_submit_runs_the_same_job(known: SimpleNamespace, tmp_path: Path) -> None:
    spark_submit = Path(sys.executable).with_name("spark-submit")
    if not spark_submit.exists():
        pytest.skip("spark-submit is not next to the Python interpreter")
    out = tmp_path / "report"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    command = [
        str(spark_submit),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        submit.__file__,
        str(known.folder),
        "--out",
        str(out),
        "--no-progress",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "master local[2]" in done.stdout or "Spark local[2]" in done.stdout
    table = pd.read_csv(out / "summary.csv")
    req = table[table["label"] == "req"].iloc[0]
    assert (req.scheduled, req.fired) == (FIRED, FIRED)
    assert req.lateness_p99_ms == pytest.approx(990.0)
    assert sorted(p.name for p in out.iterdir()) == sorted(WITHOUT_HEADLINE)


# -- the headline and small multiples, end to end ----------------------------------------

STAMP = "bench-20261123T115151-5933"


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory, tracegen: SimpleNamespace) -> Path:
    """What `aiowheel bench --trace DIR` leaves: one trace per workload and contender,
    named as the bench names them, and the bench's results."""
    folder = tmp_path_factory.mktemp("bench") / "traces"
    folder.mkdir()
    contenders = {
        "aiowheel-asyncio": ("aiowheel", "asyncio"),
        "aiowheel-trio": ("aiowheel", "trio"),
        "call_later-asyncio": ("call_later", "asyncio"),
        "trio-native": ("trio", "trio"),
    }
    for w, workload in enumerate(("fire", "spread")):
        for c, (name, (kind, backend)) in enumerate(contenders.items()):
            late = 0.001 * (1 + c) * (1 + w)
            rows = [
                tracegen.row(
                    i,
                    scheduled_at=100.0,
                    deadline=100.1,
                    fired_at=100.1 + late * (1 + i / 50),
                    run_id=f"{STAMP}-{workload}-{name}",
                    implementation=kind,
                    backend=backend,
                )
                for i in range(50)
            ]
            tracegen.write(folder / f"{workload}-{name}.parquet", rows)
    (folder / schema.BENCH_RESULTS).write_text(BENCH.read_text())
    return folder


def test_a_bench_directory_gets_its_headline_first(
    spark: Any, bench_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert report.main([str(bench_dir), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("How many times better aiowheel is") < printed.index("Timer lateness")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        name for name in schema.OUTPUTS if name not in NOT_WRITTEN
    )
    for name in (schema.HEADLINE_PNG, schema.CDF_PNG):
        assert (out / name).read_bytes()[:8] == PNG
    markdown = (out / "report.md").read_text()
    assert markdown.index(f"]({schema.HEADLINE_PNG})") < markdown.index(f"]({schema.CDF_PNG})")
    assert "| fire N=50,000 | lateness p99 (ms, lower is better) |" in markdown
    table = pd.read_csv(out / "summary.csv")
    assert list(dict.fromkeys(table["workload"])) == ["fire", "spread"]
    assert list(table["contender"][:4]) == [
        "aiowheel-asyncio",
        "aiowheel-trio",
        "call_later-asyncio",
        "trio-native",
    ]

    # The bench's results given elsewhere, and then a report without them: the
    # headline of the first report does not linger in DIR.
    elsewhere = tmp_path / "results.json"
    elsewhere.write_text(BENCH.read_text())
    (bench_dir / schema.BENCH_RESULTS).rename(tmp_path / "moved.json")
    try:
        traces = [str(p) for p in sorted(bench_dir.glob("*.parquet"))]
        args = [*traces, "--out", str(out), "--no-progress"]
        assert report.main([*args, "--bench-results", str(elsewhere)]) == 0
        assert (out / schema.HEADLINE_PNG).exists()
        assert report.main(args) == 0
        assert not (out / schema.HEADLINE_PNG).exists()
        assert "No headline" in (out / "report.md").read_text()
    finally:
        (tmp_path / "moved.json").rename(bench_dir / schema.BENCH_RESULTS)
    capsys.readouterr()


def test_a_broken_bench_results_file_next_to_the_traces_is_a_warning(
    spark: Any, bench_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces"
    shutil.copytree(bench_dir, traces)
    (traces / schema.BENCH_RESULTS).write_text('{"version": 1, "results": [')
    out = tmp_path / "report"
    assert report.main([str(traces), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("aiowheel report: warning: no headline: ")
    assert "not JSON" in err[0]
    assert not (out / schema.HEADLINE_PNG).exists()
    assert "not JSON" in (out / "report.md").read_text()


def test_a_trace_whose_lateness_is_all_nan_still_gets_a_report(
    spark: Any, tmp_path: Path, tracegen: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        tracegen.row(i, scheduled_at=1.0, deadline=1.5, fired_at=1.6, run_id="nan")
        for i in range(20)
    ]
    for row in rows[:10]:
        row["lateness"] = math.nan  # NaN in the file
    for row in rows[10:]:
        row["lateness"] = None  # and null, though fired_at is there
    traces = tmp_path / "traces"
    traces.mkdir()
    tracegen.write(traces / "nan.parquet", rows)
    out = tmp_path / "report"
    assert report.main([str(traces), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert (out / schema.CDF_PNG).read_bytes()[:8] == PNG
    table = pd.read_csv(out / "summary.csv")
    assert table["fired"].sum() == 20


def test_impossible_rows_are_counted_flagged_and_not_drawn(
    spark: Any, tmp_path: Path, tracegen: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 21: the trio baseline recorded re-armed timers 30 s early, and the report
    # drew them. Early by a clock tick (uvloop) is real and counted as early.
    rows = [
        tracegen.row(i, scheduled_at=1.0, deadline=1.5, fired_at=1.5 + i / 1000, run_id="r")
        for i in range(1, 11)
    ]
    rows.append(tracegen.row(11, scheduled_at=1.0, deadline=1.5, fired_at=1.4995, run_id="r"))
    rows.append(tracegen.row(12, scheduled_at=1.0, deadline=31.5, fired_at=1.5, run_id="r"))
    traces = tmp_path / "traces"
    traces.mkdir()
    tracegen.write(traces / "r.parquet", rows)
    out = tmp_path / "report"
    assert report.main([str(traces), "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "1 impossible trace row(s)" in err
    table = pd.read_csv(out / "summary.csv")
    (row,) = table.itertuples()
    assert (row.fired, row.early, row.impossible) == (12, 1, 1)
    assert row.lateness_p50_ms > 0  # the -30 s row is not in the percentiles
    assert row.lifetime_p50_s > 0
    markdown = (out / schema.REPORT_MD).read_text()
    assert "**Impossible rows left out**: 1 of" in markdown
    assert "Fired early: " in markdown
    assert "1 of 12" in markdown
