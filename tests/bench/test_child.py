"""The cores: every aiowheel contender labelled by the core it runs, and the ``-pure``
contenders measured in a child process on the pure core (aiowheel/bench/child.py)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_support import TINY, parse, results_of, run_json

import aiowheel
from aiowheel.bench import child, cli, export
from aiowheel.bench.child import ChildError, PureChildren
from aiowheel.bench.contenders import CONTENDERS, PURE_REASON, select
from aiowheel.bench.output import Output
from aiowheel.bench.settings import Settings

PARENT_CORE = "compiled" if aiowheel.COMPILED else "pure"
BY_NAME = {c.name: c for c in CONTENDERS}


def test_pure_contenders_are_opt_in() -> None:
    pure = {"aiowheel-asyncio-pure", "aiowheel-uvloop-pure", "aiowheel-trio-pure"}
    assert {c.name for c in CONTENDERS if c.pure} == pure
    # Not by default, nor by kind or backend: by name, or all of them with `pure`.
    for specs in (None, ["aiowheel"], ["asyncio,uvloop,trio"]):
        assert not any(c.pure for c in select(specs).run), specs
    assert [c.name for c in select(["pure"]).run] == sorted(pure, key=list(BY_NAME).index)
    assert [c.name for c in select(["aiowheel-asyncio-pure"]).run] == ["aiowheel-asyncio-pure"]


def test_labels_say_the_core() -> None:
    assert BY_NAME["aiowheel-asyncio"].label == f"aiowheel-asyncio [{PARENT_CORE}]"
    assert BY_NAME["aiowheel-trio-pure"].label == "aiowheel-trio-pure [pure]"
    assert BY_NAME["aiowheel-trio-pure"].core_reason == PURE_REASON == "AIOWHEEL_PURE is set"
    assert BY_NAME["call_later-asyncio"].label == "call_later-asyncio"
    assert BY_NAME["call_later-asyncio"].core is None


def test_a_pure_contender_runs_in_a_child_on_the_pure_core(
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = "aiowheel-asyncio,aiowheel-asyncio-pure,call_later-asyncio"
    lines = run_json(capsys, "-w", "churn", "-c", names, *TINY)
    assert lines[0]["core"] == PARENT_CORE
    assert lines[0]["settings"]["contenders"] == names.split(",")
    results = results_of(lines)
    by_contender = {r["contender"]: r for r in results if r["metric"] == "pair_ns"}
    ours, pure, peer = (by_contender[name] for name in names.split(","))
    assert (ours["core"], pure["core"], peer["core"]) == (PARENT_CORE, "pure", None)
    assert pure["core_reason"] == "AIOWHEEL_PURE is set"
    assert ours["core_reason"] == (None if aiowheel.COMPILED else aiowheel._compiled.REASON)
    # The same sizes and repetitions as its peers, and ratios against it like any other.
    assert pure["reps"] == ours["reps"] == peer["reps"] == 2
    assert all(s > 0 for s in pure["samples"])
    assert set(peer["ratios"]) == {"aiowheel-asyncio", "aiowheel-asyncio-pure"}
    assert peer["ratios"]["aiowheel-asyncio-pure"] == pytest.approx(peer["median"] / pure["median"])


def test_the_child_reports_its_core() -> None:
    settings = Settings(workloads=["churn"], n=[100], ops=200)
    children = PureChildren(settings)
    try:
        contender = BY_NAME["aiowheel-trio-pure"]
        state: dict[str, float] = {}
        request = {"op": "repeat", "workload": "churn", "n": 100, "rep": 0, "state": state}
        answer = children(contender, request)
        # The child ran the pure core, whichever this process runs.
        assert answer["compiled"] is False
        assert answer["reason"] == "AIOWHEEL_PURE is set"
        assert answer["values"]["pair_ns"] > 0
        # A request it cannot serve: a one-line error naming the contender.
        with pytest.raises(ChildError) as info:
            children(contender, {**request, "workload": "kafka"})
        assert str(info.value) == (
            "aiowheel-trio-pure: child process failed: ValueError: cannot repeat workload kafka"
        )
    finally:
        children.close()


def _failing_child(monkeypatch: pytest.MonkeyPatch, code: str) -> list[subprocess.Popen[str]]:
    """Make the -pure contenders' child run ``code``; returns the processes started."""
    monkeypatch.setattr(child._Child, "command", (sys.executable, "-c", code))
    started: list[subprocess.Popen[str]] = []
    popen = subprocess.Popen

    def recording(*args: object, **kwargs: object) -> subprocess.Popen[str]:
        process: subprocess.Popen[str] = popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process

    monkeypatch.setattr(subprocess, "Popen", recording)
    return started


def _ended_and_closed(processes: list[subprocess.Popen[str]]) -> bool:
    # A refused child is not left behind: waited for, its pipes closed.
    return bool(processes) and all(
        p.returncode is not None
        and p.stdin is not None
        and p.stdin.closed
        and p.stdout is not None
        and p.stdout.closed
        for p in processes
    )


def test_a_failed_child_is_recorded_as_failed_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _failing_child(
        monkeypatch,
        "import sys; print('Traceback (most recent call last):', file=sys.stderr); "
        "sys.exit('MemoryError: the child ran out')",
    )
    args = ["-w", "rearm", "-w", "fire", "-c", "call_later-asyncio,aiowheel-asyncio-pure", *TINY]
    # Exit status 1: not every contender was measured; the others were, and said so.
    assert cli.main([*args, "--json", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "aiowheel bench: failed: fire aiowheel-asyncio-pure, rearm aiowheel-asyncio-pure "
        "(the reasons are above)"
    ]
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert lines[0]["type"] == "run"
    assert lines[-1]["type"] == "end"
    reason = "rep 1/2: child process failed: exit status 1: MemoryError: the child ran out"
    warnings = [line["message"] for line in lines if line["type"] == "warning"]
    assert f"rearm (N=300): aiowheel-asyncio-pure failed: {reason}; the run goes on without it" in (
        warnings
    )
    results = [line for line in lines if line["type"] == "result"]
    # Both workloads ran to their end: the peer measured, the child's contender failed.
    for workload in ("rearm", "fire"):
        rows = [r for r in results if r["workload"] == workload]
        peer = [r for r in rows if r["contender"] == "call_later-asyncio"]
        pure = [r for r in rows if r["contender"] == "aiowheel-asyncio-pure"]
        assert peer
        assert all(r["samples"] and r["failed"] is None for r in peer)
        assert pure
        assert all(r["failed"] == reason and r["skipped"] == f"failed: {reason}" for r in pure)
        assert all(r["samples"] == [] for r in pure)
    assert _ended_and_closed(started)


def test_a_child_claiming_the_compiled_core_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    package = str(Path(aiowheel.__file__).resolve().parent)
    hello = json.dumps({"compiled": True, "reason": "", "package": package})
    # It stays running (waiting on its stdin) after its hello, until it is closed.
    started = _failing_child(monkeypatch, f"print({hello!r}, flush=True); input()")
    args = ["-w", "fire", "-c", "aiowheel-uvloop-pure", *TINY]
    assert cli.main([*args, "--no-progress"]) == 1
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    # (A pure parent first warns that the -pure contenders measure its own core.)
    assert [line for line in err if not line.startswith("warning: ")] == [
        "aiowheel bench: failed: fire aiowheel-uvloop-pure (the reasons are above)"
    ]
    assert (
        "warning: fire (N=300): aiowheel-uvloop-pure failed: rep 1/2: child process failed: "
        "it ran the compiled core although AIOWHEEL_PURE=1; the run goes on without it"
    ) in err
    assert "aiowheel-uvloop-pure failed (N=300): rep 1/2: child process failed" in captured.out
    assert _ended_and_closed(started)


@pytest.mark.parametrize("option", [["--trace", "traces"], ["--report"]])
def test_pure_contenders_are_not_traced(option: list[str]) -> None:
    ns = parse(["-c", "aiowheel-asyncio,aiowheel-asyncio-pure", *option])
    with pytest.raises(cli.UsageError, match=r"leave out aiowheel-asyncio-pure$"):
        cli.settings_from(ns)


def test_a_pure_parent_warns_that_pure_contenders_measure_its_own_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aiowheel, "COMPILED", False)
    monkeypatch.setattr(aiowheel._compiled, "REASON", "no compiled extension was built")
    contenders = [BY_NAME["aiowheel-asyncio"], BY_NAME["aiowheel-asyncio-pure"]]
    settings = Settings(workloads=["churn"], contenders=contenders, json=True)
    stdout, stderr = io.StringIO(), io.StringIO()
    output = Output(settings, stdout=stdout, stderr=stderr, argv=["x"])
    output.start(1, export.machine())
    run, warning = (json.loads(line) for line in stdout.getvalue().splitlines())
    assert (run["core"], run["core_reason"]) == ("pure", "no compiled extension was built")
    assert warning["message"] == (
        "this process runs the pure core too (no compiled extension was built): the -pure "
        "contenders measure the same core as aiowheel-asyncio, in child processes"
    )
    assert BY_NAME["aiowheel-asyncio"].label == "aiowheel-asyncio [pure]"


def test_a_child_that_stops_answering_fails_alone_within_the_timeout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every request the bench makes has a timeout: a hung child is stopped and its
    # contender recorded as failed; the run goes on.
    monkeypatch.setattr(child, "ANSWER_TIMEOUT", 0.3)
    package = str(Path(aiowheel.__file__).resolve().parent)
    hello = json.dumps({"compiled": False, "reason": "", "package": package})
    started = _failing_child(monkeypatch, f"print({hello!r}, flush=True); input(); input()")
    args = ["-w", "fire", "-c", "call_later-asyncio,aiowheel-asyncio-pure", *TINY]
    assert cli.main([*args, "--json"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    failed = {r["failed"] for r in lines if r["type"] == "result" and r["failed"]}
    assert failed == {"rep 1/2: child process failed: no answer within 0.3 s (stopped)"}
    peer = [r for r in lines if r["type"] == "result" and r["contender"] == "call_later-asyncio"]
    assert peer
    assert all(len(r["samples"]) == 2 for r in peer)
    assert all(p.returncode is not None for p in started)
