"""The ``server`` workload (aiowheel/bench/server.py, issue 32): a uvicorn server per
contender on 127.0.0.1, a load generator in another process. Tiny windows; no speed
is asserted: the tests check that it runs end to end, reports each figure in the
documented shape, and leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_support import results_of, run_json

from aiowheel.bench import cli, server
from aiowheel.bench.contenders import CONTENDERS, Contender
from aiowheel.bench.registry import GROUPS, WORKLOADS

BY_NAME = {c.name: c for c in CONTENDERS}

#: One round, 50 ms of load per variant, 20 idle connections.
SERVER_TINY = ["-w", "server", "--reps", "1", "--server-seconds", "0.05", "--n", "20"]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uvicorn on 127.0.0.1, POSIX")


def _children() -> set[int]:
    """This process's live child processes (Linux: /proc)."""
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ")".
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == me and fields[0] != "Z":
            found.add(int(entry.name))
    return found


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")


@needs_proc
def test_the_drop_in_loop_serves_every_variant_and_nothing_is_left_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _children()
    lines = run_json(capsys, *SERVER_TINY, "-c", "loop-asyncio")
    assert _children() <= before  # every server, load generator and holder stopped
    results = results_of(lines)
    assert {r["contender"] for r in results} == {"loop-asyncio"}
    by_variant: dict[str, set[str]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], set()).add(r["metric"])
        assert r["samples"]
        assert all(s is not None and s >= 0 for s in r["samples"])
        assert r["skipped"] is None
    core = {"rps", "p50_ms", "p99_ms", "cpu_us"}
    # The guarded variants run on the plain loops only.
    assert by_variant == {
        "trivial": core,
        "timeouts": core,
        "idle N=20": core | {"rss_per_conn", "gc_full_ms", "gc_max_ms"},
    }
    rps = next(r for r in results if r["variant"] == "trivial" and r["metric"] == "rps")
    assert rps["median"] > 0
    assert rps["params"]["load"] in ("wrk", "aiowheel.bench._load (asyncio)")


@pytest.mark.slow
@needs_proc
def test_plain_and_drop_in_loops_with_the_guards_compare_on_their_own_base(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _children()
    lines = run_json(capsys, *SERVER_TINY, "-c", "call_later-asyncio,loop-asyncio")
    assert _children() <= before
    results = results_of(lines)
    variants = {r["variant"] for r in results}
    assert variants == {"trivial", "timeouts", "idle N=20", "protocol", "middleware"}
    for r in results:
        if r["contender"] == "call_later-asyncio" and r["variant"] in ("trivial", "timeouts"):
            assert set(r["ratios"]) == {"loop-asyncio"}
        if r["variant"] in ("protocol", "middleware"):
            assert r["contender"] == "call_later-asyncio"
            assert r["ratios"] == {}
    vs = [r for r in results if r["metric"] == "vs_uvicorn"]
    assert {r["variant"] for r in vs} == {"protocol", "middleware"}


def test_the_server_stops_when_its_parent_goes_away() -> None:
    # stdin closed (the parent exited or gave up): the server ends on its own.
    with server._process(["-m", "aiowheel.bench._serve", "asyncio", "uvicorn"], "s") as child:
        port = int(server._first_line(child))
        assert server._stats(port)["cpu"] > 0
        assert child.proc.stdin is not None
        child.proc.stdin.close()
        assert child.proc.wait(timeout=30) == 0


def test_a_load_run_is_bounded_by_its_request_count() -> None:
    with server._process(["-m", "aiowheel.bench._serve", "asyncio", "uvicorn"], "s") as child:
        port = int(server._first_line(child))
        done = subprocess.run(
            [sys.executable, "-m", "aiowheel.bench._load", "load", str(port), "/t", "2", "60", "7"],
            capture_output=True,
            text=True,
            timeout=60,
            env=server._env(),
            check=True,
        )
    figures: dict[str, Any] = __import__("json").loads(done.stdout)
    # 60 s allowed, 7 requests asked: it stops at 7 (two connections, so at most 7 sent).
    assert figures["requests"] == 7
    assert figures["errors"] == 0
    assert figures["seconds"] < 60


def test_a_server_that_cannot_start_is_recorded_as_failed_with_its_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_loop_name", lambda contender: "no-such-loop")
    assert cli.main([*SERVER_TINY, "-c", "loop-asyncio", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "aiowheel bench: failed: server loop-asyncio (the reasons are above)\n"
    lines = [json.loads(line) for line in captured.out.splitlines()]
    [warning] = [line["message"] for line in lines if line["type"] == "warning"]
    assert warning.startswith(
        "server (trivial, timeouts, idle N=20): loop-asyncio failed: round 1/1, uvicorn: "
        "the loop-asyncio server did not start: usage: python -m aiowheel.bench._serve"
    )
    failed = [line for line in lines if line["type"] == "result"]
    assert [r["variant"] for r in failed] == ["trivial", "timeouts", "idle N=20"]
    assert all(r["failed"].startswith("round 1/1, uvicorn: the loop-asyncio") for r in failed)


#: A server that starts (prints its port) and then never answers: it accepts
#: connections and reads nothing, until its stdin closes.
SILENT_SERVER = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
print("the silent server is listening", file=sys.stderr, flush=True)
sys.stdin.read()
"""


@needs_proc
def test_a_server_that_stops_answering_fails_alone_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # loop-uvloop's server answers nothing; loop-asyncio's is the real one. Each of the
    # bench's requests has a timeout: the silent one costs one of them (0.3 s here).
    monkeypatch.setattr(server, "REQUEST_TIMEOUT", 0.3)
    real = server._serve_args

    def serve_args(contender: Contender, guard: str) -> list[str]:
        if contender.name == "loop-uvloop":
            return ["-c", SILENT_SERVER]
        return real(contender, guard)

    monkeypatch.setattr(server, "_serve_args", serve_args)
    before = _children()
    save = tmp_path / "run.json"
    args = [*SERVER_TINY, "-c", "loop-asyncio,loop-uvloop", "--save", str(save), "--no-progress"]
    assert cli.main(args) == 1
    assert _children() <= before  # the silent server was stopped too
    captured = capsys.readouterr()
    reason = (
        "round 1/1, uvicorn: GET /: no answer within 0.3 s (the server stopped answering); "
        "the loop-uvloop server's last log line: the silent server is listening"
    )
    # Said in the terminal as it happens, under the table, and in the results.
    assert (
        f"warning: server (trivial, timeouts, idle N=20): loop-uvloop failed: {reason}; "
        "the run goes on without it"
    ) in captured.err.splitlines()
    assert captured.err.splitlines()[-1] == (
        "aiowheel bench: failed: server loop-uvloop (the reasons are above)"
    )
    assert f"loop-uvloop failed (trivial, timeouts, idle N=20): {reason}" in " ".join(
        captured.out.split()
    )
    results = json.loads(save.read_text())["results"]
    measured = [r for r in results if r["contender"] == "loop-asyncio"]
    assert {r["variant"] for r in measured} == {"trivial", "timeouts", "idle N=20"}
    assert all(r["samples"] and r["failed"] is None for r in measured)
    failed = [r for r in results if r["contender"] == "loop-uvloop"]
    assert {r["failed"] for r in failed} == {reason}


def test_a_child_that_writes_much_to_stderr_is_not_blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server's log went to a pipe read only at its end: past 64 KiB of log lines (an
    # error logged per request), the server blocked on its next write and stopped
    # answering. Its stderr is a file now, its last line the reason given.
    monkeypatch.setattr(server, "START_TIMEOUT", 20.0)
    code = (
        "import sys\n"
        "for i in range(4000): print('x' * 100, 'line', i, file=sys.stderr)\n"
        "print('LocalProtocolError: ' + 'y' * 400, file=sys.stderr, flush=True)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with server._process(["-c", code], "the chatty child") as child:
        assert server._first_line(child) == "ready"
        last = child.last_error()
    assert last.startswith("LocalProtocolError: yyy")
    assert len(last) == 200
    assert last.endswith("...")


def test_rloop_sits_out_under_wrk_with_the_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rloop = BY_NAME["call_later-rloop"]
    monkeypatch.setattr(server.shutil, "which", lambda name: None)
    assert server._wrk_problem(rloop) is None  # the bench's own load generator measures it
    monkeypatch.setattr(server.shutil, "which", lambda name: f"/opt/bin/{name}")
    assert server._wrk_problem(BY_NAME["call_later-uvloop"]) is None
    reason = server._wrk_problem(rloop)
    assert reason is not None
    assert "under wrk" in reason
    assert "connection_lost from inside transport.write" in reason
    # Said on stderr and in the results; no server is started for it.
    monkeypatch.setattr(server, "_process", None)
    assert cli.main(["-w", "server", "-c", "call_later-rloop", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert f"warning: server: skipping call_later-rloop: {reason}" in captured.err.splitlines()
    assert "skipped call_later-rloop (trivial, timeouts" in captured.out


def test_wrk_output_is_read() -> None:
    text = """Running 1s test @ http://127.0.0.1:8000/
  1 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.95ms    1.01ms  13.12ms   85.20%
  Latency Distribution
     50%    4.78ms
     75%    5.10ms
     90%    5.80ms
     99%  812.00us
  10123 requests in 1.00s, 1.35MB read
Requests/sec:  10113.00
"""
    figures = server.parse_wrk(text)
    assert figures["requests"] == 10123
    assert figures["seconds"] == 1.0
    assert figures["p50_ms"] == 4.78
    assert figures["p99_ms"] == pytest.approx(0.812)
    assert figures["errors"] == 0
    with pytest.raises(server.ServerError, match="cannot read wrk's output"):
        server.parse_wrk("wrk: connection refused")


def test_the_idle_connections_fit_the_open_file_limit() -> None:
    settings = cli.settings_from(cli.build_parser().parse_args(["-w", "server", "--n", "50"]))
    assert server.idle_connections(settings) == 50
    full = cli.settings_from(cli.build_parser().parse_args(["--report", "--full"]))
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert server.idle_connections(full) <= max(soft - 200, 1)


def test_the_main_job_runs_the_drop_in_loop_and_the_server() -> None:
    # Issue 32: `aiowheel bench --report` shows the drop-in loop too.
    settings = cli.settings_from(cli.build_parser().parse_args(["--report"]))
    assert [w for w in settings.workloads if w in GROUPS["loop"]] == GROUPS["loop"]
    assert "server" in settings.workloads
    assert not WORKLOADS["server"].default  # but not in a plain `aiowheel bench`
    plain = cli.settings_from(cli.build_parser().parse_args([]))
    assert "server" not in plain.workloads


def test_the_help_is_wrapped() -> None:
    text = cli.build_parser().format_help()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "server: uvicorn on 127.0.0.1" in text
    # --ops names every workload that takes it.
    ops = " ".join(text.split("\n  --ops OPS", 1)[1].split("--quick", 1)[0].split())
    for name in ("churn", "rearm", "timeout", "purgatory", "loop-reschedule", "loop-few"):
        assert name in ops


def test_without_uvicorn_the_server_workload_sits_out_and_says_why(tmp_path: Path) -> None:
    from bench_support import run_without

    done = run_without(["uvicorn"], "bench", *SERVER_TINY, "-c", "loop-asyncio", "--json",
                       cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    import json

    results = [json.loads(line) for line in done.stdout.splitlines()]
    skipped = [r for r in results if r["type"] == "result"]
    assert skipped
    assert all(r["skipped"].startswith("uvicorn is not installed") for r in skipped)


def test_a_workload_no_chosen_contender_runs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # `-w server -c trio-native` measured nothing and said nothing (hostile-user run).
    assert cli.main(["-w", "server", "-c", "trio-native"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "aiowheel bench: error: no contender chosen runs server (its contenders: "
    )
    assert "loop-uvloop" in err
