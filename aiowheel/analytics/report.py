"""``aiowheel report TRACES... --out DIR [--master URL]``: the command line.

What it does, in an order chosen so that mistakes cost as little as possible:

1. finds and checks the trace files (pyarrow footers only: a bad input is a one-line
   error naming the file, exit status 2, in well under a second, before any JVM);
2. checks for a Java runtime Spark can use (one sentence and exit 2 if none);
3. starts Spark (or joins the session ``spark-submit`` or a caller started), runs the
   aggregations of ``aiowheel.analytics.job`` with a progress display;
4. writes every output into a temporary directory next to DIR and moves it into
   place only once everything is written, so DIR never holds a half-written report;
5. prints the summary table.

Outputs in DIR: ``summary.parquet``, ``summary.csv``, ``windows.parquet``,
``lateness_cdf.png``, ``lateness_p99.png``, ``fired_cancelled.png``, ``report.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .inputs import TraceFiles, TraceInputError, find_traces
from .job import ACCURACY  # job.py imports pyspark lazily: this stays cheap

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import SparkSession
    from rich.console import Console

__all__ = [
    "OUTPUTS",
    "ReportError",
    "ReportResult",
    "build_parser",
    "java_problem",
    "main",
    "run_report",
]

OUTPUTS: Final = (
    "summary.parquet",
    "summary.csv",
    "windows.parquet",
    "lateness_cdf.png",
    "lateness_p99.png",
    "fired_cancelled.png",
    "report.md",
)

#: JVM options, only when this process starts the JVM itself. The serial GC keeps the
#: driver's footprint small. The C1-only JIT (TieredStopAtLevel=1) roughly halves a
#: cold start, which is most of a small report's time; without the C2 JIT, though,
#: the percentile sketches over 10M rows ran 2.4x slower (51.6 s vs 21.5 s). So
#: small inputs get C1 only, and large or unknown (remote) ones the full JIT.
_JVM_SMALL_INPUT: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_JVM_LARGE_INPUT: Final = "-XX:+UseSerialGC"
_SMALL_INPUT_ROWS: Final = 2_000_000
_PROG: Final = "aiowheel report"


class ReportError(Exception):
    """The report cannot run: the message is one sentence, ``status`` the exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ReportResult:
    out: Path  #: the report directory
    summary: pd.DataFrame  #: summary.parquet's rows
    windows: pd.DataFrame  #: windows.parquet's rows
    rows: int  #: trace rows read
    files: int  #: trace files (and remote paths) read
    master: str  #: where Spark ran
    seconds: float  #: wall time


# -- command line --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=(
            "Analyse aiowheel timer traces (Parquet) with Spark: lateness, cancel ratio "
            "and timers per second, per run, backend and label, as tables and plots."
        ),
        epilog=(
            "Runs locally (local[*]) unless --master or spark-submit say otherwise; "
            "see docs/analytics.md for clusters. Needs Java 17+ for Spark 4."
        ),
    )
    parser.add_argument(
        "traces", nargs="+", metavar="TRACES", help="trace files or directories of them"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="report directory")
    parser.add_argument(
        "--master",
        default=os.environ.get("AIOWHEEL_SPARK_MASTER") or None,
        metavar="URL",
        help=(
            "Spark master: local[2], spark://host:7077, yarn... "
            "(default: $AIOWHEEL_SPARK_MASTER, else spark-submit's, else local[*])"
        ),
    )
    parser.add_argument(
        "--driver-memory",
        default="1g",
        metavar="SIZE",
        help="JVM heap when this command starts Spark itself (default: 1g)",
    )
    parser.add_argument(
        "--accuracy",
        type=_positive_int,
        default=None,
        metavar="N",
        help=(
            "percentile_approx accuracy: relative rank error 1/N, exact on groups of up "
            "to N/2 timers (default: 10000)"
        ),
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress display, only the summary"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's own output and full tracebacks",
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """``aiowheel report``; returns the exit status (0 ok, 2 bad input, 1 Spark failed)."""
    from rich.console import Console

    args = build_parser().parse_args(argv)
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False)
    if not out.is_terminal:
        out.width = max(out.width, 200)  # a log file or a pipe: do not squeeze the table
    try:
        result = run_report(
            args.traces,
            args.out,
            master=args.master,
            driver_memory=args.driver_memory,
            accuracy=args.accuracy or ACCURACY,
            progress=not args.no_progress,
            verbose=args.verbose,
            console=err,
        )
    except (TraceInputError, ReportError) as exc:
        err.print(f"{_PROG}: error: {exc}", markup=False, soft_wrap=True)
        return exc.status if isinstance(exc, ReportError) else 2
    out.print(summary_table(result.summary, out.width))
    out.print(
        f"{result.rows:,} timers from {result.files} trace file(s), Spark {result.master}, "
        f"{result.seconds:.1f} s: report in {result.out}/report.md",
        markup=False,
        soft_wrap=True,
    )
    return 0


# -- environment ---------------------------------------------------------------------


def java_problem() -> str | None:
    """None when a Java runtime Spark can use is found, else one sentence saying why."""
    try:
        spark_version = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return "aiowheel report needs PySpark: pip install 'aiowheel[analytics]'."
    need = 17 if int(spark_version.split(".")[0]) >= 4 else 8
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home, "bin", "java.exe" if os.name == "nt" else "java")
        if not java.is_file():
            return (
                f"JAVA_HOME is {home}, which has no bin/java: point it at a Java {need}+ "
                "runtime or unset it."
            )
        found = str(java)
    else:
        which = shutil.which("java")
        if which is None:
            return (
                f"Spark needs a Java {need}+ runtime and none was found: install one "
                "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
            )
        found = which
    major = _java_major(found)
    if major is not None and major < need:
        return (
            f"Spark {spark_version} needs Java {need}+, but {found} is Java {major}: "
            "install a newer runtime or set JAVA_HOME."
        )
    return None


def _java_major(java: str) -> int | None:
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    # `openjdk version "17.0.15" ...`, `java version "1.8.0_402"`, `openjdk version "21"`
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    return major


def _under_spark_submit() -> bool:
    # spark-submit starts the JVM first and hands the Python driver its gateway.
    return "PYSPARK_GATEWAY_PORT" in os.environ


@contextlib.contextmanager
def _spark_session(
    master: str | None, driver_memory: str, verbose: bool, jvm_options: str
) -> Iterator[SparkSession]:
    """The session to use; stopped at the end only if it was started here."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        # A caller's session (tests, notebooks): leave it running and as it was.
        previous = _runtime_conf(active)
        try:
            yield active
        finally:
            for key, value in previous.items():
                if value is None:
                    active.conf.unset(key)
                else:
                    active.conf.set(key, value)
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName("aiowheel report")
    if master:
        builder = builder.master(master)
    if not _under_spark_submit():
        # These take effect only when the JVM is started by this process; under
        # spark-submit its own flags (--driver-memory, --conf) decide.
        builder = (
            builder.config("spark.driver.memory", driver_memory)
            .config("spark.driver.extraJavaOptions", jvm_options)
            .config("spark.ui.showConsoleProgress", "false")
        )
        if master is None or master.startswith("local"):
            builder = builder.config("spark.ui.enabled", "false")
    log: Path | None = None
    if verbose or _under_spark_submit():
        spark = builder.getOrCreate()
    else:
        spark, log = _start_quietly(builder)
    try:
        spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
        _runtime_conf(spark)
        yield spark
    finally:
        spark.stop()
        if log is not None:
            with contextlib.suppress(OSError):
                log.unlink()


def _start_quietly(builder: Any) -> tuple[SparkSession, Path]:
    # The JVM inherits this process's stderr when pyspark launches it, and prints its
    # start-up chatter there (log4j profile, native-hadoop warning...) before any log
    # level can be set. Point fd 2 at a log file for the launch: the JVM keeps the file
    # as its stderr for good, and this process gets its own stderr back.
    fd, name = tempfile.mkstemp(prefix="aiowheel-report-", suffix=".spark.log")
    log = Path(name)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        try:
            spark = builder.getOrCreate()
        finally:
            os.dup2(saved, 2)
    except Exception as exc:
        tail = _log_tail(log)
        raise ReportError(
            f"Spark did not start ({_first_line(exc)}){tail}; Spark's output is in {log}",
            status=1,
        ) from None
    finally:
        os.close(saved)
        os.close(fd)
    return spark, log


def _log_tail(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    errors = [line for line in lines if "Exception" in line or "Error" in line]
    return f": {errors[-1]}" if errors else ""


def _runtime_conf(spark: SparkSession) -> dict[str, str | None]:
    """Apply the job's runtime SQL settings; return what they replaced."""
    settings = {
        # Per-second windows are Unix seconds: show them in UTC whatever the host says.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    master = spark.sparkContext.master or ""
    if master.startswith("local"):
        # The aggregates are small: a shuffle partition per core, not 200 tiny ones.
        settings["spark.sql.shuffle.partitions"] = str(
            max(1, spark.sparkContext.defaultParallelism)
        )
    previous: dict[str, str | None] = {}
    for key, value in settings.items():
        previous[key] = spark.conf.get(key, None)
        spark.conf.set(key, value)
    return previous


# -- progress ------------------------------------------------------------------------


class _Progress:
    """One line per step; Spark steps show their tasks (statusTracker), polled."""

    def __init__(self, console: Console | None, enabled: bool) -> None:
        self._console = console
        self._live: Any = None
        if enabled and console is not None and console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._live = Progress(
                SpinnerColumn(finished_text="[green]done"),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tasks"),
                TimeElapsedColumn(),
                console=console,
            )
        self._quiet = not enabled or console is None

    def __enter__(self) -> _Progress:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    @contextlib.contextmanager
    def step(self, description: str, spark: SparkSession | None = None) -> Iterator[None]:
        started = time.perf_counter()
        if self._live is None:
            yield
            if not self._quiet:
                assert self._console is not None
                elapsed = time.perf_counter() - started
                self._console.print(f"  {description}: {elapsed:.1f} s", markup=False)
            return
        task = self._live.add_task(description, total=None)
        stop = threading.Event()
        poller = None
        if spark is not None:
            poller = threading.Thread(
                target=self._poll, args=(spark, task, stop), name="aiowheel-report-progress"
            )
            poller.daemon = True
            poller.start()
        try:
            yield
        finally:
            stop.set()
            if poller is not None:
                poller.join()
            total = self._live.tasks[task].total or 1
            self._live.update(task, total=total, completed=total)

    def _poll(self, spark: SparkSession, task: Any, stop: threading.Event) -> None:
        # Every stage started during this step adds its tasks to the bar.
        tracker = spark.sparkContext.statusTracker()
        stages: set[int] = set()
        try:
            while not stop.wait(0.25):
                stages.update(tracker.getActiveStageIds())
                total = done = 0
                for stage in stages:
                    info = tracker.getStageInfo(stage)
                    if info is not None:
                        total += info.numTasks
                        done += info.numCompletedTasks
                if total:
                    self._live.update(task, total=total, completed=done)
        except Exception:  # pragma: no cover - progress must never break the job
            return


# -- the report ----------------------------------------------------------------------


def run_report(
    traces: Sequence[str],
    out: str | os.PathLike[str],
    *,
    master: str | None = None,
    driver_memory: str = "1g",
    accuracy: int = ACCURACY,
    progress: bool = True,
    verbose: bool = False,
    console: Console | None = None,
) -> ReportResult:
    """Everything ``aiowheel report`` does but printing the summary table.

    Raises ``TraceInputError`` (bad input) or ``ReportError`` (no Java or PySpark,
    bad DIR, Spark failed); DIR is then left as it was.
    """
    started = time.perf_counter()
    files = find_traces(list(traces))
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise ReportError(f"{target}: exists and is not a directory")
    problem = java_problem() if not _under_spark_submit() else None
    if problem:
        raise ReportError(problem)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    )
    umask = os.umask(0o022)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become DIR's mode
    try:
        with _Progress(console, progress) as steps, contextlib.ExitStack() as spark_scope:
            with steps.step("starting Spark"):
                small = not files.remote and files.rows < _SMALL_INPUT_ROWS
                jvm_options = _JVM_SMALL_INPUT if small else _JVM_LARGE_INPUT
                spark = spark_scope.enter_context(
                    _spark_session(master, driver_memory, verbose, jvm_options)
                )
            summary, windows, rows, where = _run(spark, files, staging, steps, verbose, accuracy)
        _publish(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return ReportResult(
        out=target,
        summary=summary,
        windows=windows,
        rows=rows,
        files=len(files.paths),
        master=where,
        seconds=time.perf_counter() - started,
    )


def _run(
    spark: SparkSession,
    files: TraceFiles,
    staging: Path,
    steps: _Progress,
    verbose: bool,
    accuracy: int,
) -> tuple[pd.DataFrame, pd.DataFrame, int, str]:
    from . import job, plots

    try:
        with steps.step("reading traces", spark):
            traces = job.read_traces(spark, files)
        with steps.step("summary per run and label", spark):
            summary = job.collect_summary(traces, accuracy)
        rows = int(summary["scheduled"].sum())
        if rows == 0:
            raise TraceInputError(f"{', '.join(files.paths)}: empty trace (no rows)")
        with steps.step("timers per second", spark):
            windows = job.collect_windows(traces)
    except (TraceInputError, ReportError):
        raise
    except Exception as exc:
        if verbose:
            raise
        raise ReportError(f"Spark failed: {_first_line(exc)}", status=1) from None
    master = spark.sparkContext.master or "?"
    version = spark.version
    with steps.step("plots and report.md"):
        table = summary.drop(columns=["lateness_cdf"])
        _write_parquet(table, staging / "summary.parquet")
        table.to_csv(staging / "summary.csv", index=False)
        _write_parquet(windows, staging / "windows.parquet")
        plots.plot_lateness_cdf(summary, staging / plots.CDF_PNG)
        plots.plot_lateness_p99(windows, staging / plots.P99_PNG)
        plots.plot_rates(windows, staging / plots.RATES_PNG)
        (staging / "report.md").write_text(
            render_markdown(table, files, rows, master, version), encoding="utf-8"
        )
    return table, windows, rows, master


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    table = pa.Table.from_pandas(frame, preserve_index=False)
    # Microsecond timestamps: Spark cannot read Parquet's nanosecond ones back.
    pq.write_table(
        table, path, compression="zstd", coerce_timestamps="us", allow_truncated_timestamps=True
    )


def _publish(staging: Path, target: Path) -> None:
    """Move the finished report into place: one rename when DIR is new or empty."""
    try:
        os.replace(staging, target)
        return
    except OSError:
        pass  # DIR exists and holds files: replace ours one by one, keep the others
    for name in OUTPUTS:
        os.replace(staging / name, target / name)
    staging.rmdir()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


# -- presentation ----------------------------------------------------------------------


def _ms(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{float(value):.3f}"


def _seconds(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{float(value):.3g}"


def _label(value: Any) -> str:
    return value if isinstance(value, str) else "-"


_COLUMNS: Final[tuple[tuple[str, str, Callable[[Any], str]], ...]] = (
    ("implementation", "implementation", str),
    ("backend", "backend", str),
    ("label", "label", _label),
    ("scheduled", "scheduled", lambda v: f"{int(v):,}"),
    ("fired", "fired", lambda v: f"{int(v):,}"),
    ("cancelled", "cancelled", lambda v: f"{int(v):,}"),
    ("cancel_ratio", "cancel %", lambda v: f"{100 * float(v):.1f}"),
    ("lateness_p50_ms", "p50 ms", _ms),
    ("lateness_p90_ms", "p90 ms", _ms),
    ("lateness_p99_ms", "p99 ms", _ms),
    ("lateness_p999_ms", "p99.9 ms", _ms),
    ("lateness_max_ms", "max ms", _ms),
    ("lifetime_p50_s", "lifetime p50 s", _seconds),
)


def _rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    from .plots import short_run_ids

    columns = list(_COLUMNS)
    if summary["label"].isna().all():
        columns = [c for c in columns if c[0] != "label"]
    shared = summary.groupby(["implementation", "backend"])["run_id"].nunique().max()
    if shared and shared > 1:
        # Several runs per implementation and backend: tell them apart by run id,
        # without the prefix they all share (a benchmark's timestamp, say).
        short = short_run_ids(summary["run_id"])
        columns.insert(0, ("run_id", "run", lambda run: short[run]))
    headers = [header for _, header, _ in columns]
    cells = [[fmt(row[name]) for name, _, fmt in columns] for _, row in summary.iterrows()]
    return headers, cells


#: Dropped in this order, one by one, while the table is wider than the terminal
#: (the full table is in summary.csv and report.md).
_OPTIONAL_HEADERS: Final = ("lifetime p50 s", "p90 ms", "implementation", "backend", "max ms")


def summary_table(summary: pd.DataFrame, width: int | None = None) -> Any:
    """The summary as a rich Table (lateness in milliseconds), narrowed to ``width``
    columns by leaving out the least important ones rather than cutting cells."""
    from rich.console import Console
    from rich.table import Table

    headers, cells = _rows(summary)
    keep = list(range(len(headers)))
    measure = Console(width=10_000)
    while True:
        table = Table(title="Timer lateness (fired_at - deadline) per run and label")
        for index in keep:
            numeric = index >= headers.index("scheduled")
            table.add_column(headers[index], justify="right" if numeric else "left", no_wrap=True)
        for row in cells:
            table.add_row(*(row[index] for index in keep))
        if width is None or measure.measure(table).maximum <= width:
            return table
        droppable = [i for i in keep if headers[i] in _OPTIONAL_HEADERS]
        if not droppable or ("run" not in headers and len(droppable) <= 3):
            return table  # implementation and backend stay unless a run column names them
        keep.remove(min(droppable, key=lambda i: _OPTIONAL_HEADERS.index(headers[i])))


def render_markdown(
    summary: pd.DataFrame, files: TraceFiles, rows: int, master: str, version: str
) -> str:
    """report.md: the summary table and the plots, with how to read them."""
    from .plots import CDF_PNG, P99_PNG, RATES_PNG

    headers, cells = _rows(summary)
    table = [
        "| " + " | ".join(headers) + " |",
        "|"
        + "|".join(
            "---:" if i >= headers.index("scheduled") else "---" for i in range(len(headers))
        )
        + "|",
    ]
    table += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in cells]
    paths = files.paths
    shown = "\n".join(f"- `{p}`" for p in paths[:20])
    if len(paths) > 20:
        shown += f"\n- ... and {len(paths) - 20} more"
    return f"""# aiowheel timer report

{rows:,} timers from {len(paths)} trace file(s), analysed with Spark {version} ({master}).

## Summary

Lateness is `fired_at - deadline` of fired timers, in milliseconds; percentiles are
nearest-rank. The full table, with lifetimes (end minus schedule time), is in
`summary.csv` and `summary.parquet`; per-second counts are in `windows.parquet`.

{chr(10).join(table)}

## Lateness distribution

![Lateness CDF per run]({CDF_PNG})

Left: the fraction of fired timers at most that late (x is logarithmic). A curve to the
left is better; a long flat top means a few timers were very late. Right: the tail
(1 - CDF, both axes logarithmic): where a curve crosses 1e-2 is its p99, 1e-3 its
p99.9.

## Lateness p99 over time

![Lateness p99 per second]({P99_PNG})

The p99 lateness of the timers that fired in each second. Spikes line up with loop
stalls (a slow callback, a GC pause, a burst of expiries).

## Timers fired and cancelled per second

![Fired and cancelled per second]({RATES_PNG})

A timeout that is cancelled before it fires (the usual fate of an idle or request
timeout) shows up in the lower plot; the cancel ratio is in the summary.

## Inputs

{shown}
"""


if __name__ == "__main__":
    sys.exit(main())
