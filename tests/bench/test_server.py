"""The ``server`` workload (aiowheel/bench/server.py, issue 32): a uvicorn server per
contender on 127.0.0.1, a load generator in another process. Tiny windows; no speed
is asserted: the tests check that it runs end to end, reports each figure in the
documented shape, and leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_support import results_of, run_json

from aiowheel.bench import cli, server
from aiowheel.bench.registry import GROUPS, WORKLOADS

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
    with server._process(["-m", "aiowheel.bench._serve", "asyncio", "uvicorn"], "s") as proc:
        port = int(server._first_line(proc, "s"))
        assert server._stats(port)["cpu"] > 0
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_a_load_run_is_bounded_by_its_request_count() -> None:
    with server._process(["-m", "aiowheel.bench._serve", "asyncio", "uvicorn"], "s") as proc:
        port = int(server._first_line(proc, "s"))
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


def test_a_server_that_cannot_start_is_one_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_loop_name", lambda contender: "no-such-loop")
    assert cli.main([*SERVER_TINY, "-c", "loop-asyncio", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiowheel bench: error: the loop-asyncio server did not start: usage:")
    assert err.count("\n") == 1


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
