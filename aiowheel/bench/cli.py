"""``aiowheel bench`` / ``python -m aiowheel.bench``: the command line."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import math
import os
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path

from .child import ChildError
from .contenders import CONTENDERS, install_hint, select
from .env import TraceFactory, parquet_recorder
from .export import RESULTS_FILE, write_results
from .output import Output
from .registry import DEFAULT_WORKLOADS, GROUPS, WORKLOADS
from .results import Result
from .runner import Runner
from .settings import Settings

__all__ = ["UsageError", "add_arguments", "main", "run", "settings_from"]

PROG = "aiowheel bench"
#: About how long ``--report``'s Spark job takes on a 2-core machine (the plan).
REPORT_SECONDS = 40
DEFAULT_OUT = Path("bench-out")


class UsageError(Exception):
    """A command line that cannot run: one line on stderr, exit status 2."""


DESCRIPTION = """\
Measure aiowheel against the timers you would use instead (loop.call_later on asyncio
and uvloop, trio's own deadlines), side by side in one process (the -pure contenders,
aiowheel's pure-Python core, in child processes): repetitions alternate between
contenders, each in a fresh event loop. Prints medians (min-max) and how many
times better aiowheel is than each peer (> 1: better)."""


def _paragraph(text: str) -> str:
    """One paragraph of the epilog, wrapped (RawDescriptionHelpFormatter keeps the
    line breaks made here: one 1,500-character line was unreadable, issue 32)."""
    return textwrap.fill(
        text, width=88, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
    )


EPILOG = "\n\n".join(
    [
        "workloads:",
        *(
            textwrap.fill(
                f"{w.name}: {w.title}",
                width=88,
                initial_indent="  ",
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
            for w in WORKLOADS.values()
        ),
        _paragraph(
            "The loop-* workloads and server (aiowheel's drop-in event loop against the "
            "plain loops; server: a uvicorn server under load) run only when asked for "
            "(-w loop runs every loop-* one), or with --report; tracing (what a trace "
            "adds to an aiowheel timer) only when asked for."
        ),
        _paragraph(
            "contenders: "
            + ", ".join(c.name for c in CONTENDERS)
            + "; or a kind or backend: aiowheel, loop, call_later, deadline, asyncio, "
            "uvloop, trio, rloop; or pure: the -pure ones, aiowheel's pure-Python core in a "
            "child process, never by default; or traced: the -traced and -sampled ones, "
            "aiowheel tracing every timer or one in 100, compared with untraced aiowheel, "
            "never by default."
        ),
        _paragraph(
            "Ratios (x): how many times better aiowheel is than a peer on the peer's own "
            "event loop (> 1: aiowheel better)."
        ),
    ]
).replace("\n\n  ", "\n  ")


#: The largest count (timers, operations, repetitions) the command line takes: a
#: billion timers do not fit a machine's memory; more is a typing error.
MAX_COUNT = 1_000_000_000


def _shown(text: str, limit: int = 40) -> str:
    """A value from the command line in an error message, cut: ``--n`` given 400
    digits gets a line, not a screenful."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[: limit // 2]!r}... ({len(text):,} characters)"


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,N,... got {_shown(text)}") from None
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive integers, got {_shown(text)}")
    if any(n > MAX_COUNT for n in sizes):
        raise argparse.ArgumentTypeError(f"sizes are at most {MAX_COUNT:,}, got {_shown(text)}")
    return sizes


def _rates(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        start, top = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START,MAX req/s, got {_shown(text)}") from None
    if not 0 < start <= top < float("inf"):
        raise argparse.ArgumentTypeError(f"need 0 < START <= MAX, got {_shown(text)}")
    return start, top


def _targets(text: str) -> tuple[float, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        rates = tuple(float(p.replace("_", "")) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected req/s separated by commas (or none), got {_shown(text)}"
        ) from None
    if not all(0 < r < float("inf") for r in rates):
        raise argparse.ArgumentTypeError(
            f"every rate must be a positive number, got {_shown(text)}"
        )
    return tuple(sorted(set(rates)))


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {_shown(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {_shown(text)}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT:,}, got {_shown(text)}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {_shown(text)}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, got {_shown(text)}"
        )
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        "-w",
        action="append",
        choices=[*WORKLOADS, *GROUPS],
        metavar="NAME",
        help=f"run this workload (repeatable; default: all but the loop-* ones, server "
        f"and tracing; "
        f"loop: every loop-* one): {', '.join([*WORKLOADS, *GROUPS])}",
    )
    parser.add_argument(
        "--contenders",
        "-c",
        action="append",
        metavar="LIST",
        help="comma-separated contenders (repeatable; default: all that apply, but the -pure ones)",
    )
    parser.add_argument(
        "--n",
        type=_sizes,
        metavar="N[,N...]",
        help="number of timers (connections for idle) for every N-based workload "
        "(default per workload: churn and memory 1,000,000; rearm 100,000; fire 200,000; "
        "spread 100,000; idle 10,000 and 100,000; tracing 200,000)",
    )
    parser.add_argument(
        "--reps",
        type=_positive_int,
        help="repetitions per contender (default 3; 2 with --report, 3 with --report "
        "--full; 1 with --quick); the server's rounds (default: at least 3)",
    )
    parser.add_argument(
        "--ops",
        type=_positive_int,
        help="timed operations per repetition: churn (200,000; 50,000 quick), rearm "
        "(2N, from 10,000 to 1,000,000), timeout (100,000; 40,000 quick), purgatory "
        "(400,000; 120,000 quick), loop-reschedule (200,000; 30,000 quick), "
        "loop-steps (1,000,000; 100,000 quick), loop-timeout (500,000; 100,000 quick), "
        "loop-few (100,000)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller N, shorter windows, 1 repetition (the server: 3 rounds): one to two minutes",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per result line, nothing else"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="DIR",
        help="also write one Parquet trace per contender and workload to DIR "
        "(an extra repetition each, not measured)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="trace into OUT/traces and build the analytics report in OUT/report; "
        "runs the --quick sizes (a few minutes in all) unless --full is given",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="with --report: the full default sizes (about 20 minutes before the report)",
    )
    parser.add_argument("--out", type=Path, help=f"--report's directory (./{DEFAULT_OUT})")
    parser.add_argument(
        "--save",
        type=Path,
        metavar="FILE",
        help="also write the run's results to FILE, in bench-results.json's format "
        "(docs/_data/reference-run.json is one)",
    )
    parser.add_argument(
        "--seed", type=int, default=20150515, help="random seed (same data for all)"
    )
    parser.add_argument(
        "--spread-window", type=_seconds, help="spread: seconds the deadlines span (5; 0.5 quick)"
    )
    parser.add_argument(
        "--idle-seconds", type=_seconds, help="idle: seconds of reads per repetition (2; 0.3 quick)"
    )
    parser.add_argument(
        "--idle-timeout", type=_seconds, help="idle: the idle timeout (1 s; 0.5 quick)"
    )
    parser.add_argument(
        "--kafka-case",
        choices=["high", "low", "both"],
        default="high",
        help="kafka: the high-timeout case (default), the low-timeout case, or both",
    )
    parser.add_argument(
        "--kafka-probe", type=_seconds, help="kafka: seconds per search probe (1; 0.3 quick)"
    )
    parser.add_argument(
        "--kafka-seconds",
        type=_seconds,
        help="kafka: how long the found rate must be sustained (10; 1 quick)",
    )
    parser.add_argument(
        "--kafka-rates",
        type=_rates,
        metavar="START,MAX",
        help="kafka: search from START doubling up to at most MAX req/s (25000,1600000)",
    )
    parser.add_argument(
        "--kafka-targets",
        type=_targets,
        metavar="RATE,...",
        help="kafka: fixed rates at which CPU and collector time are measured, as Kafka's "
        "proposal did (25000,50000,100000; none: skip)",
    )
    parser.add_argument(
        "--kafka-target-seconds",
        type=_seconds,
        help="kafka: seconds of load at each fixed rate (3; 0.6 quick)",
    )
    parser.add_argument(
        "--loop-seconds",
        type=_seconds,
        help="loop-few: seconds the N tasks sleep 1 ms over and over (1; 0.3 quick)",
    )
    parser.add_argument(
        "--server-seconds",
        type=_seconds,
        help="server: seconds of load per variant and contender (2; 0.5 quick)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def settings_from(ns: argparse.Namespace) -> Settings:
    """The run the command line asks for; ``UsageError`` if it cannot be run."""
    if ns.full and ns.quick:
        raise UsageError("--full and --quick contradict each other")
    if ns.full and not ns.report:
        raise UsageError("--full goes with --report")
    if ns.out is not None and not ns.report:
        raise UsageError("--out goes with --report (--trace DIR traces without the report)")
    if ns.trace is not None and ns.report:
        raise UsageError("--report traces into OUT/traces: give --out, not --trace")
    # The main job (`aiowheel bench --report`, the README's quick start) must finish
    # in a few minutes on a 2-core machine: with --report, quick sizes by default.
    quick: bool = ns.quick or (ns.report and not ns.full)
    try:
        selection = select(ns.contenders)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    pure = [c.name for c in selection.run if c.pure or c.trace_every]
    if pure and (ns.trace is not None or ns.report):
        # A trace names its contender by implementation and backend: the report would
        # take a -pure contender's traces for its compiled peer's.
        raise UsageError(
            f"{'--report' if ns.report else '--trace'} does not trace the -pure contenders "
            "(they run in child processes) nor the -traced and -sampled ones (they trace "
            f"every repetition): leave out {', '.join(pure)}"
        )
    asked = [name for w in ns.workload for name in GROUPS.get(w, [w])] if ns.workload else None
    if asked:
        workloads = list(dict.fromkeys(asked))
    elif ns.report:
        # The main job shows the drop-in loop too (issue 32): its workloads and the
        # server's quick variant, after the timer's.
        workloads = [*DEFAULT_WORKLOADS, *GROUPS["loop"], "server"]
    else:
        workloads = list(DEFAULT_WORKLOADS)
    idle = [w for w in workloads if not any(WORKLOADS[w].applies_to(c) for c in selection.run)]
    # A workload asked for by name (or every one) that no chosen contender runs: an
    # error; of the default set, such a workload is simply not run (`-c deadline`).
    if selection.run and idle and (asked or len(idle) == len(workloads)):
        idle = [w for w in idle if asked is None or w in asked] or idle
        # `-w server -c trio-native` measured nothing and said nothing.
        w = WORKLOADS[idle[0]]
        runs = ", ".join(
            c.name for c in CONTENDERS if w.applies_to(c) and not c.pure and not c.trace_every
        )
        raise UsageError(f"no contender chosen runs {w.name} (its contenders: {runs})")
    # Only the contenders left out that one of these workloads would have run are
    # news (rloop and the drop-in loop run the loop-* workloads only).
    unavailable = [
        (c, why)
        for c, why in selection.unavailable
        if any(WORKLOADS[w].applies_to(c) for w in workloads)
    ]
    _check_kafka_windows(ns, quick)
    trace_dir: Path | None = ns.trace
    if ns.report:
        trace_dir = _out(ns) / "traces"
    cases = ("high", "low") if ns.kafka_case == "both" else (ns.kafka_case,)
    return Settings(
        workloads=workloads,
        contenders=selection.run,
        unavailable=unavailable,
        n=ns.n,
        # --report runs 2 repetitions of the quick sizes (and a traced one): one
        # repetition's ratios flip from run to run (issue 21), and 3 no longer fit
        # the main job, with the drop-in loop's and the server's workloads in it, in
        # its 5 minutes (issue 32: 7 min on a quiet machine). --full: 3.
        reps=ns.reps if ns.reps is not None else _default_reps(ns),
        quick=quick,
        ops=ns.ops,
        op_seconds=0.5 if quick else 5.0,
        seed=ns.seed,
        json=ns.json,
        trace_dir=trace_dir,
        # Quick (and so the main job, `bench --report`: issue 32's 5 minutes): the
        # windows shortest that still hold the figure; the default ones are for
        # figures to quote.
        spread_window=ns.spread_window or (0.5 if quick else 5.0),
        idle_seconds=ns.idle_seconds or (0.3 if quick else 2.0),
        idle_timeout=ns.idle_timeout or (0.5 if quick else 1.0),
        kafka_cases=cases,
        kafka_probe=ns.kafka_probe or (0.3 if quick else 1.0),
        kafka_seconds=ns.kafka_seconds or (1.0 if quick else 10.0),
        kafka_start_rate=ns.kafka_rates[0] if ns.kafka_rates else 25_000.0,
        kafka_max_rate=ns.kafka_rates[1] if ns.kafka_rates else 1_600_000.0,
        kafka_targets=(
            ns.kafka_targets if ns.kafka_targets is not None else (25_000.0, 50_000.0, 100_000.0)
        ),
        kafka_target_seconds=ns.kafka_target_seconds or (0.6 if quick else 3.0),
        loop_seconds=ns.loop_seconds or (0.3 if quick else 1.0),
        server_seconds=ns.server_seconds,
        server_rounds=ns.reps,
        progress=not (ns.no_progress or ns.json),
    )


def _check_kafka_windows(ns: argparse.Namespace, quick: bool) -> None:
    """``UsageError`` for a kafka rate that expects less than one request in its window
    (a probe of it measures nothing): each fixed rate in ``--kafka-target-seconds``,
    the search's start in ``--kafka-probe``."""
    target_seconds = ns.kafka_target_seconds or (0.6 if quick else 3.0)
    probe_seconds = ns.kafka_probe or (0.3 if quick else 1.0)
    checks = [
        (rate, target_seconds, "--kafka-targets", "--kafka-target-seconds")
        for rate in (ns.kafka_targets or ())
    ]
    if ns.kafka_rates:
        checks.append((ns.kafka_rates[0], probe_seconds, "--kafka-rates", "--kafka-probe"))
    for rate, seconds, option, window in checks:
        if rate * seconds < 1:
            raise UsageError(
                f"{option}: {_short(rate)} req/s expects fewer than one request in its "
                f"{seconds:g} s window ({window}): give at least {math.ceil(1 / seconds):,} req/s"
            )


def _short(value: float) -> str:
    """A number from the command line, for an error message: never hundreds of digits."""
    return f"{value:.6g}"


def _default_reps(ns: argparse.Namespace) -> int:
    if ns.quick:
        return 1
    return 2 if ns.report and not ns.full else 3


def _out(ns: argparse.Namespace) -> Path:
    out: Path = ns.out if ns.out is not None else DEFAULT_OUT
    return out


def check_setup(ns: argparse.Namespace, settings: Settings, trace_factory: TraceFactory) -> None:
    """Fail now, not after minutes of measuring: ``UsageError`` if the traces, the
    report or ``--save``'s file cannot be written, or what they need is not installed."""
    save: Path | None = getattr(ns, "save", None)
    if save is not None:
        try:
            save.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=save.parent):
                pass
        except OSError as exc:
            raise UsageError(f"--save {save}: cannot write there ({exc.strerror or exc})") from None
    if settings.trace_dir is None:
        return
    option = "--report" if ns.report else "--trace"
    if trace_factory is parquet_recorder:
        try:
            importlib.import_module("pyarrow")
        except ImportError:
            raise UsageError(
                f"{option} records Parquet traces with pyarrow: {install_hint('analytics')}"
            ) from None
    if ns.report and importlib.util.find_spec("pyspark") is None:
        raise UsageError(f"--report runs a Spark job: {install_hint('analytics')}")
    if ns.report:
        untraced = [w for w in settings.workloads if not WORKLOADS[w].traced]
        if len(untraced) == len(settings.workloads):
            # The report is built from traces: with none, `aiowheel report` would end
            # in argparse's "the following arguments are required: TRACES".
            raise UsageError(
                f"--report analyses traces, and {', '.join(untraced)} writes none "
                "(its timers never fire): run it without --report, or add a traced workload"
            )
        # Checked now, not after minutes of measuring: the report needs a Java runtime.
        problem = _java_problem()
        if problem:
            raise UsageError(f"--report: {problem}")
    where = f"--out {_out(ns)}" if ns.report else f"--trace {settings.trace_dir}"
    try:
        settings.trace_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=settings.trace_dir):
            pass
    except OSError as exc:
        raise UsageError(f"{where}: cannot write there ({exc.strerror or exc})") from None


def _java_problem() -> str | None:
    try:
        java_problem = importlib.import_module("aiowheel.analytics.report").java_problem
    except ImportError:  # pragma: no cover - pyspark is checked before
        return None  # said by the report itself, with what is missing
    problem: str | None = java_problem()
    return problem


def run(
    ns: argparse.Namespace,
    argv: Sequence[str] | None = None,
    *,
    trace_factory: TraceFactory = parquet_recorder,
) -> int:
    """Run what ``ns`` asks for; returns the exit status (2: a bad command line,
    130: interrupted by Ctrl-C, said in one line)."""
    saved: list[Path] = []
    try:
        return _run(ns, argv, trace_factory=trace_factory, saved=saved)
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is None:
            raise
        # One line, not the traceback of wherever the signal landed (a workload, a
        # child process's pipe, the Spark job's py4j call); 130 = 128 + SIGINT. A
        # timer task the signal cut off before its first step is not news either.
        warnings.filterwarnings("ignore", message="coroutine .* was never awaited")
        kept = ""
        if saved:
            kept = f"; the finished workloads' results are in {', '.join(map(str, saved))}"
            if ns.report:
                report = _out(ns) / "report"
                kept += f" (aiowheel report {saved[0].parent} --out {report} makes their report)"
        print(f"\n{PROG}: interrupted{kept}", file=sys.stderr)
        return 130


def _run(
    ns: argparse.Namespace,
    argv: Sequence[str] | None,
    *,
    trace_factory: TraceFactory,
    saved: list[Path],
) -> int:
    try:
        settings = settings_from(ns)
        check_setup(ns, settings, trace_factory)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    output = Output(settings, argv=["aiowheel", "bench", *(argv or [])])
    if ns.report:
        output.then = f", then the report, about {REPORT_SECONDS} s"
    targets = [] if settings.trace_dir is None else [settings.trace_dir / RESULTS_FILE]
    if getattr(ns, "save", None) is not None:
        targets.append(ns.save)

    def checkpoint(results: list[Result]) -> None:
        """What finished so far, saved (``complete`` false): an interrupted or broken
        run keeps it. A file that cannot be written is said at the end."""
        for path in targets:
            with contextlib.suppress(OSError):
                write_results(path.parent, settings, runner.machine, results, name=path.name,
                              complete=False)  # fmt: skip
                if path not in saved:
                    saved.append(path)

    runner = Runner(settings, output, trace_factory=trace_factory, checkpoint=checkpoint)
    try:
        try:
            results = runner.run()
        finally:
            output.close()
    except ChildError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of stdout went away (`aiowheel bench --json | head`): stop quietly,
        # and keep the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    for path in targets:
        try:
            write_results(path.parent, settings, runner.machine, results, name=path.name)
        except OSError as exc:
            print(f"{PROG}: error: cannot write {path}: {exc}", file=sys.stderr)
            return 1
    status = _report(runner.trace_files, _out(ns) / "report") if ns.report else 0
    failed = sorted({f"{r.workload} {r.contender.name}" for r in results if r.failed})
    if failed and status == 0:
        # Everything else was measured, saved and reported; the status says not all.
        print(f"{PROG}: failed: {', '.join(failed)} (the reasons are above)", file=sys.stderr)
        return 1
    return status


def _report(trace_files: list[Path], report_dir: Path) -> int:
    try:
        # Looked up at run time: another part of the package, needing pyspark.
        report_main = importlib.import_module("aiowheel.analytics.report").main
    except ImportError as exc:
        print(
            f"{PROG}: traces are in {trace_files[0].parent if trace_files else '-'}, "
            f"but the report needs aiowheel.analytics: {exc}",
            file=sys.stderr,
        )
        return 2
    existing = [str(p) for p in trace_files if p.exists()]
    result: int | None = report_main([*existing, "--out", str(report_dir)])
    return int(result or 0)


def build_parser(prog: str = "aiowheel bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser("python -m aiowheel.bench").parse_args(args)
    return run(ns, args)
