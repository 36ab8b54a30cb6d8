"""The command line (aiowheel/bench/cli.py, aiowheel/__main__.py): parsing, the
checks made before any measuring, exit statuses, and ``--report``."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from bench_support import TINY, UVLOOP_MISSING, StandInRecorder, applicable, parse

import aiowheel.__main__ as cli_main
from aiowheel.bench import cli
from aiowheel.bench.contenders import install_hint

# The report looks for pyspark before it reads its arguments: these tests need it
# importable (though not Java). The suite on each Python (noxfile.py) installs no
# pyspark, so they run where the whole suite does (.ci/run, CPython 3.11).
needs_pyspark = pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None,
    reason="needs pyspark importable (the analytics extra)",
)


def _fake_report(
    monkeypatch: pytest.MonkeyPatch, status: int, java: str | None = None
) -> list[list[str]]:
    """Stand in for aiowheel.analytics.report (pyspark, Java) and record its argv;
    ``java`` is what its java_problem() says (None: a Java runtime was found)."""
    calls: list[list[str]] = []
    fake = types.ModuleType("aiowheel.analytics.report")
    fake.main = lambda argv: calls.append(list(argv)) or status  # type: ignore[attr-defined]
    fake.java_problem = lambda: java  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "aiowheel.analytics.report", fake)
    monkeypatch.setitem(sys.modules, "aiowheel.analytics", types.ModuleType("aiowheel.analytics"))
    return calls


@needs_pyspark
def test_report_runs_traces_then_the_analytics_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_report(monkeypatch, 0)
    out = tmp_path / "out"
    args = ["-w", "fire", *TINY, "--report", "--out", str(out), "--json"]
    assert cli.run(parse(args), args, trace_factory=StandInRecorder) == 0
    capsys.readouterr()
    (argv,) = calls
    assert argv[-2:] == ["--out", str(out / "report")]
    traces = [Path(p) for p in argv[:-2]]
    assert {p.name for p in traces} == {f"fire-{n}.parquet" for n in applicable("fire")}
    assert all(p.parent == out / "traces" for p in traces)
    # Written before the report ran, next to the traces it reads.
    document = json.loads((out / "traces" / "bench-results.json").read_text())
    assert {r["workload"] for r in document["results"]} == {"fire"}


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
    seen = _fake_report(monkeypatch, 3)
    with pytest.raises(SystemExit) as info:
        cli_main.main(["report", "a.parquet", "--out", "r", "--help"])
    assert info.value.code == 3
    assert seen == [["a.parquet", "--out", "r", "--help"]]


def test_python_m_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["-w", "rearm", "--n", "50", "--ops", "100", "--reps", "1"]
    assert cli.main([*args, "-c", "aiowheel-asyncio,call_later-asyncio"]) == 0
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
        (["-w", "nope"], "invalid choice"),
    ],
)
def test_bad_arguments_are_rejected(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "nope"], "unknown contender 'nope'; choose from aiowheel-asyncio"),
        (["-c", ","], "no contender given"),
        (["--full"], "--full goes with --report"),
        (["--report", "--full", "--quick"], "--full and --quick contradict each other"),
        (["--out", "x"], "--out goes with --report"),
        (["--report", "--trace", "x"], "--report traces into OUT/traces"),
    ],
)
def test_bad_combinations_give_one_line_and_status_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aiowheel bench: error: {message}")
    assert err.count("\n") == 1


def test_a_requested_contender_whose_loop_is_missing_is_an_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    for spec in ("aiowheel-uvloop", "uvloop", "aiowheel-asyncio,call_later-uvloop"):
        assert cli.main(["-w", "churn", "-c", spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith("aiowheel bench: error: contender ")
        assert err.endswith(f": {UVLOOP_MISSING}\n")
        assert err.count("\n") == 1


@needs_pyspark
@pytest.mark.parametrize("option", ["--trace", "--out"])
def test_an_unwritable_directory_is_refused_before_measuring(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "below"  # below a regular file: no one can create it, root included
    args = ["-w", "churn", option, str(target)]
    if option == "--out":
        args.append("--report")
    assert cli.run(parse(args), args, trace_factory=StandInRecorder) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was measured
    assert captured.err == (
        f"aiowheel bench: error: {option} {target}: cannot write there (Not a directory)\n"
    )


def test_report_runs_quick_sizes_unless_full() -> None:
    # The README's main job (`aiowheel bench --report`) must finish in a few minutes.
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.settings_from(parser.parse_args(["--report"])).quick
    assert not cli.settings_from(parser.parse_args(["--report", "--full"])).quick
    assert not cli.settings_from(parser.parse_args([])).quick
    # More than one repetition for the report (one repetition's ratios flip, issue
    # 21); two, so that the main job keeps to its 5 minutes (issue 32); --full: 3.
    assert cli.settings_from(parser.parse_args(["--report"])).reps == 2
    assert cli.settings_from(parser.parse_args(["--report", "--full"])).reps == 3
    assert cli.settings_from(parser.parse_args(["--report", "--reps", "3"])).reps == 3
    assert cli.settings_from(parser.parse_args([])).reps == 3
    assert cli.settings_from(parser.parse_args(["--quick"])).reps == 1
    # The windows of the quick sizes (issue 32).
    quick = cli.settings_from(parser.parse_args(["--report"]))
    assert (quick.idle_timeout, quick.idle_seconds, quick.spread_window) == (0.5, 0.3, 0.5)
    full = cli.settings_from(parser.parse_args([]))
    assert (full.idle_timeout, full.idle_seconds, full.spread_window) == (1.0, 2.0, 5.0)
    # churn's pairs stop at half a second at the quick sizes (trio-native's took 7 s).
    assert cli.settings_from(parser.parse_args(["--report"])).op_seconds == 0.5
    assert cli.settings_from(parser.parse_args(["--report", "--full"])).op_seconds == 5.0
    settings = cli.settings_from(parser.parse_args(["--report", "--out", "o"]))
    assert settings.trace_dir == Path("o") / "traces"
    assert cli.settings_from(parser.parse_args(["--report"])).trace_dir == Path("bench-out/traces")


@needs_pyspark
def test_report_without_java_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 21: the whole benchmark ran before the report said Java was missing.
    calls = _fake_report(monkeypatch, 0, java="Spark needs a Java 17+ runtime and none was found")
    args = ["-w", "fire", *TINY, "--report", "--out", str(tmp_path / "out")]
    assert cli.run(parse(args), args, trace_factory=StandInRecorder) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was measured
    assert captured.err == (
        "aiowheel bench: error: --report: Spark needs a Java 17+ runtime and none was found\n"
    )
    assert calls == []


@needs_pyspark
def test_report_of_a_workload_without_traces_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 21: `bench --report -w memory` ended in argparse's "the following
    # arguments are required: TRACES" from `aiowheel report`.
    calls = _fake_report(monkeypatch, 0)
    args = ["-w", "memory", *TINY, "--report", "--out", str(tmp_path / "out")]
    assert cli.run(parse(args), args, trace_factory=StandInRecorder) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("aiowheel bench: error: --report analyses traces, and memory")
    assert captured.err.count("\n") == 1
    assert calls == []


def test_ctrl_c_ends_in_one_line_and_status_130(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.Runner, "run", interrupted)
    args = ["-w", "churn", *TINY]
    assert cli.run(parse(args), args) == 130
    assert capsys.readouterr().err.strip() == "aiowheel bench: interrupted"


def test_install_hints_from_a_checkout_point_at_the_checkout() -> None:
    # Issue 21: the package is not on a registry yet. Imported from a checkout (an
    # editable install), the hint names it; installed (noxfile.py installs the package
    # into each Python's virtualenv), it names the package.
    root = Path(cli.__file__).resolve().parents[2]
    hint = install_hint("uvloop")
    if (root / "pyproject.toml").is_file():
        assert hint.startswith('pip install ".[uvloop]"')
        assert str(root) in hint
    else:
        assert hint == 'pip install "aiowheel[uvloop]"'


def test_ctrl_c_inside_a_trio_nursery_is_a_plain_interruption() -> None:
    # A real Ctrl-C during trio-native's timers came out of trio.run wrapped in a
    # BaseExceptionGroup: a 60-line traceback and exit status 1 (issue 21).
    import trio

    from aiowheel.bench.env import run_fresh

    async def body() -> None:
        async def interrupted() -> None:
            raise KeyboardInterrupt

        async with trio.open_nursery() as nursery:
            nursery.start_soon(interrupted)
            await trio.sleep_forever()

    with pytest.raises(KeyboardInterrupt):
        run_fresh("trio", body)


@pytest.mark.parametrize("backend", ["asyncio", "uvloop"])
def test_ctrl_c_outside_the_workload_task_unwinds_it_in_its_own_task(backend: str) -> None:
    # The signal landed in a timer callback, not in the workload's task: the task was
    # left half-way and closed at exit from another task, with tracebacks (anyio's
    # "Attempted to exit cancel scope in a different task") under the one line.
    import asyncio

    pytest.importorskip(backend)
    from aiowheel.bench.env import run_fresh

    unwound: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    async def body() -> None:
        try:
            asyncio.get_running_loop().call_soon(interrupt)
            await asyncio.Event().wait()
        finally:
            unwound.append(asyncio.current_task().get_name())  # type: ignore[union-attr]

    with pytest.raises(KeyboardInterrupt):
        run_fresh(backend, body)
    assert len(unwound) == 1  # the task's own finally ran, once


def test_a_group_holding_ctrl_c_ends_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: object) -> None:
        raise BaseExceptionGroup("nursery", [KeyboardInterrupt()])

    monkeypatch.setattr(cli.Runner, "run", interrupted)
    args = ["-w", "churn", *TINY]
    assert cli.run(parse(args), args) == 130
    assert capsys.readouterr().err.strip() == "aiowheel bench: interrupted"


def test_save_writes_the_results_document_without_tracing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/_data/reference-run.json is written this way (issue 32).
    target = tmp_path / "deep" / "run.json"
    assert cli.main(["-w", "loop-few", "-c", "loop-asyncio", *TINY, "--save", str(target)]) == 0
    capsys.readouterr()
    document = json.loads(target.read_text())
    assert document["version"] == 1
    assert {r["metric"] for r in document["results"]} == {
        "enter_exit_ns",
        "sleep_cpu_us",
        "sleep_ms",
        "create_us",
    }
    assert not list(tmp_path.glob("deep/*.parquet"))
    # A place it cannot write: refused before measuring.
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["-w", "loop-few", "--save", str(blocker / "run.json")]) == 2
    assert "--save" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["--n", "9" * 400],
        ["--n", "2000000000"],
        ["--n", "1," + "x" * 400],
        ["--reps", "-" + "9" * 400],
        ["--ops", "9" * 5000],
        ["--server-seconds", "1" * 400 + "e9"],
        ["--kafka-rates", "1," + "2" * 400],
        ["--kafka-targets", "x" * 400],
        ["-c", "x" * 400],
    ],
)
def test_an_error_cuts_a_long_value(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # Never hundreds of digits on the terminal: the value's start, and its length.
    with contextlib.suppress(SystemExit):
        assert cli.main(["-w", "churn", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert " error: " in err
    assert len(err) < 200 or args[0] == "-c"  # -c lists the contenders to choose from
    for digit in "xy912":
        assert digit * 41 not in err
