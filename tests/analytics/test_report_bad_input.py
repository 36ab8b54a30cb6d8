"""Every bad input of ``aiowheel report``: one line naming the file, exit status 2, and
nothing written to DIR. These checks run before Spark starts, so no JVM is needed."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from aiowheel.analytics import report
from aiowheel.analytics.inputs import find_traces, schema_problem
from aiowheel.bench.contenders import install_hint
from aiowheel.trace import ParquetRecorder, trace_schema

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# The report looks for pyspark before it reads its arguments: these tests need it
# importable (though not Java). The suite on each Python (noxfile.py) installs no
# pyspark, so they run where the whole suite does (.ci/run, CPython 3.11).
needs_pyspark = pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None,
    reason="needs pyspark importable (the analytics extra)",
)


@pytest.fixture
def good_rows(tracegen: SimpleNamespace) -> list[dict[str, object]]:
    return [tracegen.row(1, scheduled_at=100.0, deadline=100.5, fired_at=100.6)]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = report.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.err


def _assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


def _assert_one_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("aiowheel report: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


@needs_pyspark
def test_a_path_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    status, err = _run(capsys, str(tmp_path / "nope.parquet"), "--out", str(out))
    assert status == 2
    _assert_one_line(err, "nope.parquet", "no such file")
    _assert_nothing_written(out)


@needs_pyspark
def test_a_directory_without_parquet_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "traces"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a trace")
    (empty / ".hidden.parquet").write_bytes(b"")  # hidden files are skipped, like Spark does
    out = tmp_path / "report"
    status, err = _run(capsys, str(empty), "--out", str(out))
    assert status == 2
    _assert_one_line(err, str(empty), "no Parquet files")
    _assert_nothing_written(out)


@needs_pyspark
def test_a_file_that_is_not_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.parquet"
    bogus.write_text("run_id,timer_id\nr,1\n")
    out = tmp_path / "report"
    status, err = _run(capsys, str(bogus), "--out", str(out))
    assert status == 2
    _assert_one_line(err, str(bogus), "not a Parquet file")
    _assert_nothing_written(out)


@needs_pyspark
def test_missing_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], good_rows: list[dict[str, object]]
) -> None:
    path = tmp_path / "partial.parquet"
    table = pa.Table.from_pylist(good_rows, schema=trace_schema())
    pq.write_table(table.drop_columns(["lateness", "wall_anchor"]), path)
    out = tmp_path / "report"
    status, err = _run(capsys, str(path), "--out", str(out))
    assert status == 2
    _assert_one_line(
        err, str(path), "not an aiowheel trace", "missing columns lateness, wall_anchor"
    )
    _assert_nothing_written(out)


@needs_pyspark
def test_wrong_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], good_rows: list[dict[str, object]]
) -> None:
    path = tmp_path / "ints.parquet"
    table = pa.Table.from_pylist(good_rows, schema=trace_schema())
    index = table.schema.get_field_index("deadline")
    table = table.set_column(index, "deadline", pa.array([100], pa.int64()))
    pq.write_table(table, path)
    out = tmp_path / "report"
    status, err = _run(capsys, str(path), "--out", str(out))
    assert status == 2
    _assert_one_line(err, str(path), "column deadline is int64, expected double")
    _assert_nothing_written(out)


@needs_pyspark
def test_an_empty_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorder = ParquetRecorder(tmp_path / "empty.parquet")
    recorder.open(backend="asyncio", clock=0.0)
    recorder.close()  # a run in which no timer ended: a valid file with no rows
    out = tmp_path / "report"
    status, err = _run(capsys, str(recorder.path), "--out", str(out))
    assert status == 2
    _assert_one_line(err, str(recorder.path), "empty trace")
    _assert_nothing_written(out)


@needs_pyspark
def test_one_bad_file_among_good_ones_is_named(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
) -> None:
    make_trace(good_rows, "a.parquet")
    bad = make_trace(good_rows, "b.parquet")
    bad.write_bytes(bad.read_bytes()[:-20])  # truncated: the footer is gone
    out = tmp_path / "report"
    status, err = _run(capsys, str(bad.parent), "--out", str(out))
    assert status == 2
    _assert_one_line(err, "b.parquet", "not a Parquet file")
    _assert_nothing_written(out)


@needs_pyspark
def test_out_is_a_file(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
) -> None:
    trace = make_trace(good_rows)
    out = tmp_path / "report"
    out.write_text("mine")
    status, err = _run(capsys, str(trace), "--out", str(out))
    assert status == 2
    _assert_one_line(err, str(out), "not a directory")
    assert out.read_text() == "mine"


def test_an_existing_report_dir_is_left_alone_on_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.csv").write_text("old")
    status, _ = _run(capsys, str(tmp_path / "missing"), "--out", str(out))
    assert status == 2
    assert [p.name for p in out.iterdir()] == ["summary.csv"]
    assert (out / "summary.csv").read_text() == "old"


@needs_pyspark
def test_no_java_is_one_sentence_and_exit_2(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    good_rows: list[dict[str, object]],
) -> None:
    trace = make_trace(good_rows)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    out = tmp_path / "report"
    status, err = _run(capsys, str(trace), "--out", str(out))
    assert status == 2
    _assert_one_line(err, "Java 17+ runtime", "JAVA_HOME")
    assert "Exception" not in err
    assert "Traceback" not in err
    _assert_nothing_written(out)


@needs_pyspark
def test_a_java_home_without_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    problem = report.java_problem()
    assert problem is not None
    assert str(tmp_path) in problem
    assert "no bin/java" in problem


def test_an_old_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.3.0")
    problem = report.java_problem()
    assert problem is not None
    assert "needs Java 17+" in problem
    assert "is Java 11" in problem


def test_java_8_version_strings_are_understood(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'java version \"1.8.0_402\"' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.5.1")
    assert report.java_problem() is None  # Spark 3.5 runs on Java 8


def test_missing_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    problem = report.java_problem()
    assert problem is not None
    assert install_hint("analytics") in problem


def test_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report.main(["trace.parquet"])  # --out is required
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        report.main(["trace.parquet", "--out", "x", "--accuracy", "0"])
    assert exit_info.value.code == 2
    capsys.readouterr()


def test_find_traces_expands_directories_and_skips_hidden_ones(
    make_trace: Callable[..., Path], good_rows: list[dict[str, object]]
) -> None:
    a = make_trace(good_rows, "a.parquet")
    nested = a.parent / "day2"
    nested.mkdir()
    b = make_trace(good_rows, "day2/b.parquet")
    hidden = a.parent / "_tmp"
    hidden.mkdir()
    (hidden / "c.parquet").write_bytes(b"junk")  # skipped, like Spark skips _ and . paths
    files = find_traces([str(a.parent), str(a)])  # a is named twice, read once
    assert files.local == (str(a.resolve()), str(b.resolve()))
    assert files.rows == 2
    assert files.remote == ()


def test_remote_paths_are_left_to_spark() -> None:
    files = find_traces(["hdfs://namenode/traces", "s3a://bucket/traces/"])
    assert files.remote == ("hdfs://namenode/traces", "s3a://bucket/traces/")
    assert files.local == ()


def test_string_types_parquet_stores_alike_are_accepted() -> None:
    types = {name: kind for name, kind in ((f.name, str(f.type)) for f in trace_schema())}
    types["label"] = "large_string"
    assert schema_problem(types) is None
    types["level"] = "int64"
    assert schema_problem(types) == "column level is int64, expected int8"


def test_out_parent_is_created_only_for_a_good_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deep" / "er" / "report"
    status, _ = _run(capsys, str(tmp_path / "missing"), "--out", str(out))
    assert status == 2
    assert not (tmp_path / "deep").exists()
    assert os.listdir(tmp_path) == []


def test_a_java_that_cannot_start_spark_is_one_line_and_exit_1(
    make_trace: Callable[..., Path], tmp_path: Path, good_rows: list[dict[str, object]]
) -> None:
    pytest.importorskip("pyspark")
    # Passes the version check, then fails as a broken runtime would.
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -version ]; then echo \'openjdk version "17.0.9"\' >&2; exit 0; fi\n'
        "echo 'Error: could not create the Java Virtual Machine.' >&2\nexit 1\n"
    )
    java.chmod(0o755)
    trace = make_trace(good_rows)
    out = tmp_path / "report"
    env = dict(os.environ, JAVA_HOME=str(tmp_path / "jdk"), TMPDIR=str(tmp_path))
    env.pop("PYSPARK_GATEWAY_PORT", None)
    done = subprocess.run(
        [sys.executable, "-m", "aiowheel.analytics.report", str(trace), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, done.stderr
    assert "Spark did not start" in lines[0]
    assert "Traceback" not in done.stderr
    assert not out.exists()
    (log,) = tmp_path.glob("aiowheel-report-*.spark.log")  # kept, and named, on failure
    assert str(log) in lines[0]


# -- issue 10: places and files the report must refuse, in one line ---------------------


@pytest.fixture
def no_java_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pass the Java check, so the test reaches what it tests without Spark."""
    monkeypatch.setattr(report, "java_problem", lambda: None)


def _spark_must_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started")

    monkeypatch.setattr(report, "_spark_session", refuse)


@needs_pyspark
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.timeout(60)
def test_a_fifo_named_parquet_is_refused_not_waited_on(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
) -> None:
    trace = make_trace(good_rows, "a.parquet")
    fifo = trace.parent / "b.parquet"
    os.mkfifo(fifo)  # opening it would wait for a writer for ever
    out = tmp_path / "report"
    status, err = _run(capsys, str(trace.parent), "--out", str(out))
    assert status == 2
    _assert_one_line(err, str(fifo), "not a regular file (a FIFO)")
    _assert_nothing_written(out)
    # Named on its own, and behind a symbolic link, too.
    link = tmp_path / "link.parquet"
    link.symlink_to(fifo)
    for path in (fifo, link):
        status, err = _run(capsys, str(path), "--out", str(out))
        assert status == 2
        _assert_one_line(err, str(path), "not a regular file (a FIFO)")


@needs_pyspark
def test_a_dangling_symbolic_link_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "gone.parquet").symlink_to(tmp_path / "nowhere.parquet")
    status, err = _run(capsys, str(traces), "--out", str(tmp_path / "report"))
    assert status == 2
    _assert_one_line(err, "gone.parquet", "a symbolic link to nothing")


@needs_pyspark
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_out_where_no_directory_can_be_made(
    make_trace: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
    monkeypatch: pytest.MonkeyPatch,
    no_java_check: None,
) -> None:
    _spark_must_not_start(monkeypatch)
    trace = make_trace(good_rows)
    for out in ("/proc/out", "/proc/self/deeper/out"):
        status, err = _run(capsys, str(trace), "--out", out)
        assert status == 2
        _assert_one_line(err, f"--out {out}", "cannot create a directory in")
        assert "Traceback" not in err


def test_out_read_only_parent(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
    monkeypatch: pytest.MonkeyPatch,
    no_java_check: None,
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    _spark_must_not_start(monkeypatch)
    trace = make_trace(good_rows)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    status, err = _run(capsys, str(trace), "--out", str(locked / "report"))
    assert status == 2
    _assert_one_line(err, "cannot create a directory in", "Permission denied")


@needs_pyspark
def test_out_through_a_symbolic_link_loop(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
) -> None:
    trace = make_trace(good_rows)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    status, err = _run(capsys, str(trace), "--out", str(loop / "report"))
    assert status == 2
    _assert_one_line(err, f"--out {loop / 'report'}: cannot be resolved")


@needs_pyspark
def test_out_empty(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = make_trace(good_rows)
    monkeypatch.chdir(tmp_path)  # "" would otherwise mean the current directory
    status, err = _run(capsys, str(trace), "--out", "")
    assert status == 2
    _assert_one_line(err, "--out is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces"]


@needs_pyspark
@pytest.mark.parametrize("where", ["the directory", "inside it", "deep inside it"])
def test_out_in_the_trace_directory(
    where: str,
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
    no_java_check: None,
) -> None:
    trace = make_trace(good_rows)
    traces = trace.parent
    out = {
        "the directory": traces,
        "inside it": traces / "report",
        "deep inside it": traces / "a" / ".." / "a" / "b",
    }[where]
    status, err = _run(capsys, str(traces), "--out", str(out))
    assert status == 2
    _assert_one_line(err, f"--out {out}", f"the trace directory {traces}: the next report")
    assert sorted(p.name for p in traces.iterdir()) == ["trace.parquet"]


@needs_pyspark
def test_out_in_the_trace_directory_through_a_symbolic_link(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
    no_java_check: None,
) -> None:
    trace = make_trace(good_rows)
    alias = tmp_path / "alias"
    alias.symlink_to(trace.parent)
    status, err = _run(capsys, str(trace.parent), "--out", str(alias / "report"))
    assert status == 2
    _assert_one_line(err, "inside the trace directory")


@needs_pyspark
def test_out_beside_a_trace_file_given_by_name(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
    no_java_check: None,
) -> None:
    trace = make_trace(good_rows)
    status, err = _run(capsys, str(trace), "--out", str(trace.parent))
    assert status == 2
    _assert_one_line(err, "is the directory of the trace", str(trace))


@needs_pyspark
def test_a_report_left_among_traces_is_named_as_such(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
) -> None:
    # What an older report, written into its trace directory, leaves behind.
    trace = make_trace(good_rows)
    old = trace.parent / "report"
    old.mkdir()
    pq.write_table(pa.table({"run_id": ["r"], "scheduled": [1]}), old / "summary.parquet")
    status, err = _run(capsys, str(trace.parent), "--out", str(tmp_path / "new"))
    assert status == 2
    _assert_one_line(err, "summary.parquet", "a report's own table")


@needs_pyspark
def test_an_output_name_taken_by_a_directory(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
) -> None:
    trace = make_trace(good_rows)
    out = tmp_path / "report"
    (out / "summary.csv").mkdir(parents=True)
    status, err = _run(capsys, str(trace), "--out", str(out))
    assert status == 2
    _assert_one_line(err, str(out / "summary.csv"), "is a directory")


@pytest.mark.parametrize("module", ["rich", "pyarrow", "pandas", "matplotlib", "pyspark"])
def test_a_missing_library_is_one_line(
    module: str,
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    good_rows: list[dict[str, object]],
) -> None:
    trace = make_trace(good_rows)
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    out = tmp_path / "report"
    status, err = _run(capsys, str(trace), "--out", str(out))
    assert status == 2
    _assert_one_line(err, f"needs {module},", install_hint("analytics"))
    _assert_nothing_written(out)


@pytest.mark.parametrize("module", ["rich", "pyarrow"])
def test_a_missing_library_from_the_command(
    module: str, make_trace: Callable[..., Path], tmp_path: Path, good_rows: list[dict[str, object]]
) -> None:
    # In a fresh process, as a user meets it: `aiowheel report` without the library.
    trace = make_trace(good_rows)
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from aiowheel.__main__ import main; main(sys.argv[1:])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "report", str(trace), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    _assert_one_line(done.stderr, f"needs {module},")
    assert "Traceback" not in done.stderr


@needs_pyspark
def test_bench_results_given_but_bad(
    make_trace: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    good_rows: list[dict[str, object]],
) -> None:
    trace = make_trace(good_rows)
    out = tmp_path / "report"
    bad = tmp_path / "results.json"
    cases = {
        "[1, 2": "not JSON (Expecting ',' delimiter at line 1 column 6)",
        '{"version": 2, "results": []}': "version 2, but this report reads version 1",
        '{"version": 1}': 'no "results" list',
        '{"version": 1, "results": [{"workload": "fire"}]}': "result 0: variant is missing",
    }
    for text, message in cases.items():
        bad.write_text(text)
        status, err = _run(capsys, str(trace), "--out", str(out), "--bench-results", str(bad))
        assert status == 2
        _assert_one_line(err, str(bad), message)
    status, err = _run(capsys, str(trace), "--out", str(out), "--bench-results", "")
    assert status == 2
    _assert_one_line(err, "--bench-results is empty")
    status, err = _run(capsys, str(trace), "--out", str(out), "--bench-results", str(tmp_path))
    assert status == 2
    _assert_one_line(err, str(tmp_path), "a directory, not a file")
    _assert_nothing_written(out)


@needs_pyspark
def test_ctrl_c_ends_in_one_line_and_status_130(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    make_trace: Callable[..., Path],
    good_rows: list[dict[str, object]],
) -> None:
    # Issue 21: Ctrl-C during the Spark job printed a 40-60 line traceback.
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "run_report", interrupted)
    status, err = _run(capsys, str(make_trace(good_rows)), "--out", str(tmp_path / "r"))
    assert status == 130
    assert err.strip() == "aiowheel report: interrupted"


def test_an_interrupted_step_is_not_shown_as_done() -> None:
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with report._Progress(console, True) as steps:
        with steps.step("finished"):
            pass
        with pytest.raises(KeyboardInterrupt), steps.step("summary per run and label"):
            raise KeyboardInterrupt
        live = steps._live
        assert live is not None
        done, stopped = live.tasks
    assert done.finished
    assert not stopped.finished
    assert stopped.description == "summary per run and label (stopped)"


def test_a_spark_call_failing_after_ctrl_c_is_an_interruption(
    monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    # Issue 21, seen with a real Ctrl-C: pyspark's handler cancels every job, and
    # toPandas then failed with "job cancelled" (plus a warning carrying the Java
    # stack): the report said "Spark failed", exit status 1, under 80 lines.
    from aiowheel.analytics import job

    def cancelled(*args: object, **kwargs: object) -> None:
        report._INTERRUPTED.set()
        import warnings

        warnings.warn("toPandas attempted Arrow optimization ...", UserWarning, stacklevel=1)
        raise RuntimeError("An error occurred while calling o455.getResult.")

    monkeypatch.setattr(job, "run_job", cancelled)
    steps = SimpleNamespace(step=lambda description, spark: contextlib.nullcontext())
    try:
        with pytest.raises(KeyboardInterrupt):
            report._run_job(object(), None, steps, False, 100)  # type: ignore[arg-type]
    finally:
        report._INTERRUPTED.clear()
    assert not [w for w in recwarn if "Arrow" in str(w.message)]
    # The same failure without Ctrl-C is Spark's: one line, exit status 1.
    monkeypatch.setattr(job, "run_job", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(report.ReportError, match="Spark failed: x"):
        report._run_job(object(), None, steps, False, 100)  # type: ignore[arg-type]


def test_py4j_root_logging_is_quiet_while_spark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # py4j reports an interrupted call with logging.exception on the root logger,
    # which configures a handler of its own when there is none ("ERROR:root:...").
    import logging

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        with report._py4j_root_logging_quiet():
            logging.exception("KeyboardInterrupt while sending command.")
        assert not root.handlers  # removed again, nothing configured
    finally:
        root.handlers[:] = saved
    assert capsys.readouterr().err == ""
