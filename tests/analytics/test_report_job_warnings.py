"""A Spark job that warns: the report ends, shows each warning once, and a failed job
is the documented one-line error with exit status 1 (docs/analytics.md).

The job is replaced by a function that warns (pyspark's own "toPandas attempted Arrow
optimization" warning is one such): no JVM. Each case runs in a child process with a
time limit and a memory limit, since the fault these tests guard against never ends
and eats memory at 100 MB/s.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None or sys.platform != "linux",
    reason="needs pyspark importable (the analytics extra) and Linux's resource limits",
)

_CHILD = textwrap.dedent(
    """
    import contextlib, resource, sys, types, warnings
    import pandas
    from aiowheel.analytics import job, report

    def job_that_warns(spark, files, accuracy, step):
        with step("summary per run and label"):
            warnings.warn("toPandas attempted Arrow optimization ...", UserWarning, stacklevel=1)
            warnings.warn("a second warning", UserWarning, stacklevel=1)
        if sys.argv[2] == "fails":
            raise RuntimeError("An error occurred while calling o455.getResult.\\nJava stack")
        frame = pandas.DataFrame({"impossible": [0], "lateness_cdf": [None]})
        return types.SimpleNamespace(summary=frame, windows=pandas.DataFrame(), rows=1)

    @contextlib.contextmanager
    def session(*args, **kwargs):
        yield types.SimpleNamespace(sparkContext=types.SimpleNamespace(master="local[1]"),
                                    version="4")

    job.run_job = job_that_warns
    report._spark_session = session
    report.java_problem = lambda: None
    report._write_outputs = lambda *args: ["report.md"]
    report._publish = lambda *args: None
    # From here on, at most 512 MiB more: a report that loops on its warnings dies.
    used = 0
    for line in open("/proc/self/status"):
        if line.startswith("VmData:"):
            used = int(line.split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (used + 512 * 1024 * 1024, resource.RLIM_INFINITY))
    if sys.argv[2] == "direct":
        steps = types.SimpleNamespace(step=lambda description, spark: contextlib.nullcontext())
        report._run_job(object(), None, steps, False, 100)
        print("returned")
        sys.exit(0)
    try:
        result = report.run_report([sys.argv[1]], sys.argv[1] + "-report", progress=False)
    except report.ReportError as exc:
        print(f"aiowheel report: error: {exc}", file=sys.stderr)
        sys.exit(exc.status)
    print("rows", result.rows)
    """
)


def _child(trace: Path, mode: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-W", "default::UserWarning", "-c", _CHILD, str(trace), mode],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the report did not end: its warnings are shown for ever")


@pytest.fixture
def trace(tmp_path: Path, tracegen: SimpleNamespace) -> Path:
    rows = [tracegen.row(1, scheduled_at=100.0, deadline=100.5, fired_at=100.6)]
    return Path(tracegen.write(tmp_path / "trace.parquet", rows))


def test_a_job_that_warns_ends_and_shows_each_warning_once(trace: Path) -> None:
    done = _child(trace, "direct")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "returned"
    assert done.stderr.count("toPandas attempted Arrow optimization") == 1, done.stderr
    assert done.stderr.count("a second warning") == 1, done.stderr


def test_a_job_that_warns_and_fails_is_one_line_and_status_1(trace: Path) -> None:
    done = _child(trace, "fails")
    assert done.returncode == 1, done.stderr[-2000:]
    # docs/analytics.md: "1 Spark failed", said in one line; the failed job's own
    # warnings (its failure told again, with a Java stack) are for --verbose.
    assert done.stderr.strip().splitlines() == [
        "aiowheel report: error: Spark failed: An error occurred while calling o455.getResult."
    ]


def test_a_job_that_warns_through_the_whole_report_ends(trace: Path) -> None:
    done = _child(trace, "succeeds")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rows 1" in done.stdout
    assert done.stderr.count("toPandas attempted Arrow optimization") == 1, done.stderr
