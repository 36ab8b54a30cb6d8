"""``aiowheel report TRACES... --out DIR [--master URL]``: the command line.

What it does, in an order chosen so that mistakes cost as little as possible:

1. checks that its libraries are installed, that DIR is a place it may write, and
   finds and checks the trace files (pyarrow footers only): a bad input is a one-line
   error, exit status 2, in well under a second, before any JVM;
2. reads the bench's results (``bench-results.json``) for the headline, if there are any;
3. checks for a Java runtime Spark can use (one sentence and exit 2 if none);
4. starts Spark (or joins the session ``spark-submit`` or a caller started) and runs
   the pipeline of ``aiowheel.analytics.job`` with a progress display;
5. writes every output into a temporary directory next to DIR and moves it into
   place only once everything is written, so DIR never holds a half-written report;
6. prints the headline and the summary table.

Outputs in DIR: see ``schema.OUTPUTS`` (``headline.png`` only with the bench's results).
Dependencies run one way: report -> job -> inputs, schema; report -> render, plots,
bench_results -> schema.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from aiowheel.bench.contenders import install_hint

from .bench_results import (
    BenchResultsError,
    drop_in,
    find_bench_results,
    headline,
    kafka_rates,
    load_bench_results,
    server_figures,
)
from .inputs import (
    TraceFiles,
    TraceInputError,
    completeness_lines,
    find_traces,
    first_line,
    is_remote,
    sampling_lines,
)
from .render import Headline
from .schema import (
    ACCURACY,
    BENCH_RESULTS,
    CDF_PNG,
    HEADLINE_PNG,
    KAFKA_PNG,
    LOOP_PNG,
    OUTPUTS,
    P99_PNG,
    RATES_PNG,
    REPORT_MD,
    SERVER_PNG,
    SUMMARY_CSV,
    SUMMARY_PARQUET,
    WINDOWS_PARQUET,
)

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import SparkSession
    from rich.console import Console

    from .job import JobResult

__all__ = [
    "OUTPUTS",
    "ReportError",
    "ReportResult",
    "build_parser",
    "java_problem",
    "main",
    "missing_modules",
    "run_report",
]

#: JVM options, only when this process starts the JVM itself. The serial GC keeps the
#: driver's footprint small. The C1-only JIT (TieredStopAtLevel=1) roughly halves a
#: cold start, which is most of a small report's time; without the C2 JIT, though,
#: the percentile sketches over 10M rows ran 2.4x slower (51.6 s vs 21.5 s). So
#: small inputs get C1 only, and large or unknown (remote) ones the full JIT.
_JVM_SMALL_INPUT: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_JVM_LARGE_INPUT: Final = "-XX:+UseSerialGC"
_SMALL_INPUT_ROWS: Final = 2_000_000
_PROG: Final = "aiowheel report"
#: The libraries the report imports (the `analytics` extra).
_MODULES: Final = ("pyarrow", "pandas", "matplotlib", "rich", "pyspark")
_INSTALL: Final = install_hint("analytics")


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
    headline: pd.DataFrame | None = None  #: the ratios of the headline, if any
    #: the drop-in loop's ratios (bench_results.drop_in), if any
    drop_in: pd.DataFrame | None = None
    warnings: tuple[str, ...] = field(default=())  #: said on stderr, not fatal


# -- command line --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=(
            "Analyse aiowheel timer traces (Parquet) with Spark: lateness, cancel ratio "
            "and timers per second, per workload and contender, as tables and figures; "
            "with the bench's results, a headline of aiowheel against each peer."
        ),
        epilog=(
            "Runs locally (local[*]) unless --master or spark-submit say otherwise; "
            "see docs/analytics.md for clusters. Needs Java 17+ for Spark 4."
        ),
    )
    parser.add_argument(
        "traces", nargs="+", metavar="TRACES", help="trace files or directories of them"
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="report directory (not inside a trace directory)",
    )
    parser.add_argument(
        "--bench-results",
        default=None,
        metavar="PATH",
        help=(
            f"the bench's results for the headline (default: {BENCH_RESULTS} in the "
            "trace directories, if there is one)"
        ),
    )
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


def _say(kind: str, message: str) -> None:
    # Plain print, not rich: this is also how a missing rich is reported.
    print(f"{_PROG}: {kind}: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``aiowheel report``; returns the exit status (0 ok, 2 bad input, 1 Spark failed)."""
    args = build_parser().parse_args(argv)
    missing = missing_modules()
    if missing:
        _say("error", _missing_message(missing))
        return 2
    from rich.console import Console

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
            bench_results=args.bench_results,
        )
    except (TraceInputError, ReportError, BenchResultsError) as exc:
        _say("error", str(exc))
        return exc.status if isinstance(exc, ReportError) else 2
    except KeyboardInterrupt:
        # One line, not py4j's traceback from inside the Spark call; 130 = 128 + SIGINT.
        print(f"\n{_PROG}: interrupted", file=sys.stderr)
        return 130
    from .render import DROP_IN_TITLE, headline_table, summary_table

    if result.headline is not None and not result.headline.empty:
        out.print(headline_table(result.headline))
    if result.drop_in is not None and not result.drop_in.empty:
        out.print(headline_table(result.drop_in, DROP_IN_TITLE))
    out.print(summary_table(result.summary, out.width))
    out.print(
        f"{result.rows:,} timers from {result.files} trace file(s), Spark {result.master}, "
        f"{result.seconds:.1f} s: report in {result.out}/{REPORT_MD}",
        markup=False,
        soft_wrap=True,
    )
    for warning in result.warnings:
        _say("warning", warning)
    return 0


# -- environment ---------------------------------------------------------------------


def missing_modules() -> list[str]:
    """The report's libraries that cannot be imported (not installed, or blocked)."""
    missing: list[str] = []
    for name in _MODULES:
        if name in sys.modules:
            if sys.modules[name] is None:  # import blocked: `import name` would fail
                missing.append(name)
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            missing.append(name)
    return missing


def _missing_message(missing: Sequence[str]) -> str:
    names = ", ".join(missing)
    return f"aiowheel report needs {names}, which cannot be imported here: {_INSTALL}."


# -- environment ---------------------------------------------------------------------


def java_problem() -> str | None:
    """None when a Java runtime Spark can use is found, else one sentence saying why."""
    try:
        spark_version = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return f"aiowheel report needs PySpark: {_INSTALL}."
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
    quiet = contextlib.nullcontext() if verbose else _py4j_root_logging_quiet()
    try:
        with quiet, _sigint_noted():
            yield from _stopped_at_the_end(spark, verbose)
    finally:
        if log is not None:
            with contextlib.suppress(OSError):
                log.unlink()


#: Set by a SIGINT while Spark runs: a Spark call that fails then failed because of it.
_INTERRUPTED: Final = threading.Event()


@contextlib.contextmanager
def _sigint_noted() -> Iterator[None]:
    """Note a Ctrl-C (``_INTERRUPTED``) before pyspark's own handler runs: it cancels
    every job, and a call collecting a result (``toPandas``) may then fail with
    "job cancelled" instead of the KeyboardInterrupt (the report said "Spark failed",
    exit status 1, under 80 lines of Java stack)."""
    import signal

    _INTERRUPTED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def noted(signum: int, frame: Any) -> None:
        _INTERRUPTED.set()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _py4j_root_logging_quiet() -> Iterator[None]:
    """Ctrl-C during a Spark call: pyspark's SIGINT handler cancels the jobs through
    py4j while the interrupted call is mid-answer, and py4j reports both with
    ``logging.exception`` on the *root* logger (which, without a handler, configures
    one: "ERROR:root:Exception while sending command." and 40 lines of traceback).
    The interruption itself ends in one line (main); a handler that drops records
    keeps py4j's from being printed, for as long as Spark runs."""
    import logging

    root = logging.getLogger()
    handler = logging.NullHandler()
    added = not root.handlers
    if added:
        root.addHandler(handler)
    try:
        yield
    finally:
        if added:
            root.removeHandler(handler)


def _stopped_at_the_end(spark: SparkSession, verbose: bool) -> Iterator[SparkSession]:
    """Yields ``spark``, and stops it when the report is done (or interrupted)."""
    try:
        spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
        _runtime_conf(spark)
        yield spark
    finally:
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        try:
            spark.stop()
        except Exception:
            # Stopping after Ctrl-C can fail in py4j (the call it interrupted left the
            # gateway mid-answer): that must not replace the interruption, which
            # ends in one line (main), with a traceback.
            if not interrupted:
                raise


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
            f"Spark did not start ({first_line(exc)}){tail}; Spark's output is in {log}",
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
        except BaseException:
            # Not "done": the bar shows the step stopped where it was.
            self._live.update(task, description=f"{description} (stopped)")
            raise
        else:
            total = self._live.tasks[task].total or 1
            self._live.update(task, total=total, completed=total)
        finally:
            stop.set()
            if poller is not None:
                poller.join()

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
    bench_results: str | os.PathLike[str] | None = None,
) -> ReportResult:
    """Everything ``aiowheel report`` does but printing the tables.

    Raises ``TraceInputError`` or ``BenchResultsError`` (bad input) or ``ReportError``
    (a missing library, no Java, a bad DIR, Spark failed); DIR is then left as it was.
    """
    started = time.perf_counter()
    if not os.fspath(out):
        raise ReportError("--out is empty: give the report directory")
    missing = missing_modules()
    if missing:
        raise ReportError(_missing_message(missing))
    files = find_traces(list(traces))
    target = Path(out)
    _check_target(target, list(traces), files)
    # Runs that dropped rows get a warning each; traces that do not say (written before
    # the count existed) are listed in report.md only.
    warnings: list[str] = [
        f"incomplete trace: {line} ({REPORT_MD} says what that does to each figure)"
        for line in completeness_lines(files, unknown=False)
    ]
    # A sampled trace's counts are a fraction of the run's: said at once, not only in
    # report.md.
    warnings += [
        f"sampled trace: {line} ({REPORT_MD} says what that does to each figure)"
        for line in sampling_lines(files)
    ]
    source = _headline_source(list(traces), files, bench_results, warnings)
    problem = java_problem() if not _under_spark_submit() else None
    if problem:
        raise ReportError(problem)
    staging = _make_staging(target)
    try:
        with _Progress(console, progress) as steps, contextlib.ExitStack() as spark_scope:
            with steps.step("starting Spark"):
                small = not files.remote and files.rows < _SMALL_INPUT_ROWS
                jvm_options = _JVM_SMALL_INPUT if small else _JVM_LARGE_INPUT
                spark = spark_scope.enter_context(
                    _spark_session(master, driver_memory, verbose, jvm_options)
                )
            result = _run_job(spark, files, steps, verbose, accuracy)
            impossible = int(result.summary["impossible"].sum())
            if impossible:
                warnings.append(
                    f"{impossible:,} impossible trace row(s) (ended before scheduled, or "
                    "fired far before the deadline: a recording bug) are left out of the "
                    f"lateness figures; {REPORT_MD} says which"
                )
            where = spark.sparkContext.master or "?"
            version = spark.version
        with steps.step("figures and report.md"):
            written = _write_outputs(staging, result, source, files, where, version, target)
        _publish(staging, target, written)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return ReportResult(
        out=target,
        summary=result.summary.drop(columns=["lateness_cdf"]),
        windows=result.windows,
        rows=result.rows,
        files=len(files.paths),
        master=where,
        seconds=time.perf_counter() - started,
        headline=source.ratios,
        drop_in=source.drop_in,
        warnings=tuple(warnings),
    )


def _resolve_strictly(target: Path) -> Path:
    """``target.resolve()`` that raises on a symbolic link loop on every Python.

    From CPython 3.13 a non-strict ``resolve()`` no longer raises on a loop: it returns
    a path through it, and making the directory then failed with "File exists". So the
    part of ``target`` that exists is resolved strictly (an OSError on a loop), and the
    part not made yet, which can hold no link, is appended as given."""
    existing = target
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    return existing.resolve(strict=True) / target.relative_to(existing)


def _check_target(target: Path, traces: Sequence[str], files: TraceFiles) -> None:
    """DIR must be a directory (or nothing yet), and not where traces are read from:
    a report among the traces would be read as a trace by the next report."""
    if target.exists() and not target.is_dir():
        raise ReportError(f"{target}: exists and is not a directory")
    try:
        resolved = _resolve_strictly(target)
    except (OSError, RuntimeError) as exc:  # a symbolic link loop: RuntimeError up to 3.12
        raise ReportError(f"--out {target}: cannot be resolved ({first_line(exc)})") from None
    for raw in traces:
        if is_remote(raw):
            continue
        directory = Path(raw.removeprefix("file://"))
        if directory.is_dir():
            directory = directory.resolve()
            if resolved == directory or directory in resolved.parents:
                where = "is" if resolved == directory else "is inside"
                raise ReportError(
                    f"--out {target} {where} the trace directory {raw}: the next report "
                    "over it would read the report's own tables as traces; choose a "
                    "directory outside it"
                )
    for file in files.local:
        if resolved == Path(file).parent:
            raise ReportError(
                f"--out {target} is the directory of the trace {file}: choose another "
                "directory, or the report's tables would sit among the traces"
            )
    if target.is_dir():
        for name in OUTPUTS:
            if (target / name).is_dir():
                raise ReportError(f"{target / name}: is a directory, where the report writes")


def _headline_source(
    traces: Sequence[str],
    files: TraceFiles,
    given: str | os.PathLike[str] | None,
    warnings: list[str],
) -> Headline:
    """The bench's results for the headline: the file given (which must be good), else
    the one next to the traces (a bad one is a warning: the traces are still worth a
    report)."""
    if given is not None:
        if not os.fspath(given):
            raise ReportError("--bench-results is empty: give the bench's results file")
        bench = load_bench_results(given)
        return Headline(bench, headline(bench), "", drop_in(bench))
    found = find_bench_results(traces, files)
    if not found:
        return Headline(None, None, f"no {BENCH_RESULTS} was found next to the traces")
    if len(found) > 1:
        names = ", ".join(str(p) for p in found)
        message = f"several bench results ({names}): choose one with --bench-results"
        warnings.append(f"no headline: {message}")
        return Headline(None, None, message)
    try:
        bench = load_bench_results(found[0])
    except BenchResultsError as exc:
        warnings.append(f"no headline: {exc}")
        return Headline(None, None, f"{exc}")
    return Headline(bench, headline(bench), "", drop_in(bench))


def _make_staging(target: Path) -> Path:
    """The hidden temporary directory next to DIR that the report is written into."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
        )
    except OSError as exc:
        raise ReportError(
            f"--out {target}: cannot create a directory in {target.parent} "
            f"({exc.strerror or first_line(exc)})"
        ) from None
    umask = os.umask(0o022)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become DIR's mode
    return staging


def _run_job(
    spark: SparkSession, files: TraceFiles, steps: _Progress, verbose: bool, accuracy: int
) -> JobResult:
    import warnings

    from . import job

    # Warnings are held back until the job is over (after a Ctrl-C, pyspark warns that
    # its Arrow path failed, with the cancelled job's Java stack: 80 lines of no news),
    # and shown only once the recording has ended: shown inside it, each would be
    # recorded again, appended to the list being shown, for ever.
    said: list[warnings.WarningMessage] = []
    failed = True
    try:
        with warnings.catch_warnings(record=True) as recorded:
            said = recorded
            result = job.run_job(
                spark, files, accuracy, step=lambda description: steps.step(description, spark)
            )
        failed = False
        return result
    except (TraceInputError, ReportError):
        raise
    except Exception as exc:
        if _INTERRUPTED.is_set():
            # The jobs were cancelled by Ctrl-C: an interruption (one line, 130).
            raise KeyboardInterrupt from None
        if verbose:
            raise
        raise ReportError(f"Spark failed: {first_line(exc)}", status=1) from None
    finally:
        # A failed job's warnings are its failure told again (pyspark's "toPandas
        # attempted Arrow optimization ..." with the Java stack): the one-line error
        # says it; --verbose shows them.
        if not _INTERRUPTED.is_set() and (verbose or not failed):
            _show_warnings(said)


def _show_warnings(said: Sequence[Any]) -> None:
    """Show recorded warnings, each once (call it outside any recording of them)."""
    import warnings

    for warning in list(said):
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


def _write_outputs(
    staging: Path,
    result: JobResult,
    source: Headline,
    files: TraceFiles,
    master: str,
    version: str,
    out: Path | None = None,
) -> list[str]:
    """Every output file, written into ``staging``; returns their names. ``out``: the
    report directory they are moved to (report.md's paths are relative to it)."""
    from . import plots
    from .render import headline_subtitle, per_second_figures, render_markdown

    table = result.summary.drop(columns=["lateness_cdf"])
    try:
        _write_parquet(table, staging / SUMMARY_PARQUET)
        table.to_csv(staging / SUMMARY_CSV, index=False)
        _write_parquet(result.windows, staging / WINDOWS_PARQUET)
        written = [SUMMARY_PARQUET, SUMMARY_CSV, WINDOWS_PARQUET]
        if source.bench is not None and source.ratios is not None and not source.ratios.empty:
            subtitle = headline_subtitle(source.bench)
            plots.plot_headline(source.ratios, staging / HEADLINE_PNG, subtitle)
            written.append(HEADLINE_PNG)
        if source.bench is not None and source.drop_in is not None and not source.drop_in.empty:
            plots.plot_headline(
                source.drop_in,
                staging / LOOP_PNG,
                headline_subtitle(source.bench),
                ours="the drop-in loop",
                theirs="the plain loop",
                title="The drop-in loop against the plain loop on its own base, per workload",
            )
            written.append(LOOP_PNG)
        server = server_figures(source.bench) if source.bench is not None else None
        if source.bench is not None and server is not None and not server.empty:
            plots.plot_server(server, staging / SERVER_PNG, headline_subtitle(source.bench))
            written.append(SERVER_PNG)
        rates = kafka_rates(source.bench) if source.bench is not None else None
        if rates is not None and not rates.empty:
            plots.plot_kafka_rates(rates, staging / KAFKA_PNG)
            written.append(KAFKA_PNG)
        plots.plot_lateness_cdf(result.summary, staging / CDF_PNG)
        written.append(CDF_PNG)
        per_run = result.windows.groupby("run_id")["elapsed_s"].max()
        longest = int(per_run.max()) + 1 if len(per_run) else None
        typical = int(per_run.median()) + 1 if len(per_run) else None
        # Short runs (the quick main job): no per-second figures at all, rather than
        # lines of 1-2 points and empty panels (issue 32); report.md says why.
        if per_second_figures(longest, typical):
            plots.plot_lateness_p99(result.windows, staging / P99_PNG)
            plots.plot_rates(result.windows, staging / RATES_PNG)
            written += [P99_PNG, RATES_PNG]
        markdown = render_markdown(
            table, files, result.rows, master, version, source, longest, typical, out
        )
        (staging / REPORT_MD).write_text(markdown, encoding="utf-8")
    except OSError as exc:
        raise ReportError(
            f"cannot write the report in {staging.parent} ({exc.strerror or first_line(exc)})",
            status=1,
        ) from None
    return [*written, REPORT_MD]


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    table = pa.Table.from_pandas(frame, preserve_index=False)
    # Microsecond timestamps: Spark cannot read Parquet's nanosecond ones back.
    pq.write_table(
        table, path, compression="zstd", coerce_timestamps="us", allow_truncated_timestamps=True
    )


def _publish(staging: Path, target: Path, written: Sequence[str]) -> None:
    """Move the finished report into place: one rename when DIR is new or empty; else
    ours are replaced one by one (and one a previous report wrote but this one did not,
    a headline.png, is removed), other files are kept."""
    try:
        os.replace(staging, target)
        return
    except OSError:
        pass  # DIR exists and holds files
    try:
        for name in written:
            os.replace(staging / name, target / name)
        for name in set(OUTPUTS) - set(written):
            with contextlib.suppress(FileNotFoundError):
                (target / name).unlink()
        staging.rmdir()
    except OSError as exc:
        raise ReportError(
            f"cannot move the report into {target} ({exc.strerror or first_line(exc)})",
            status=1,
        ) from None


if __name__ == "__main__":
    sys.exit(main())
