"""``aiowheel bench`` on partial installs (issue 10), in a subprocess where the missing
extras cannot be imported (``sys.modules[name] = None``; see bench_support.run_without).

The shared environment has every extra installed: nothing is uninstalled here.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench_support import NOT_IN_CORE, TRIO_MISSING, UVLOOP_MISSING, run_without

from aiowheel.bench.contenders import install_hint

TINY = ["--n", "100", "--ops", "200", "--reps", "1"]
#: With churn or rearm: only the contenders they would have run are news (not
#: deadline-uvloop, idle's only; not loop-uvloop or call_later-rloop, the loop-* ones').
SKIP_LINES = {
    f"aiowheel bench: skipping aiowheel-uvloop: {UVLOOP_MISSING}",
    f"aiowheel bench: skipping aiowheel-trio: {TRIO_MISSING}",
    f"aiowheel bench: skipping call_later-uvloop: {UVLOOP_MISSING}",
    f"aiowheel bench: skipping trio-native: {TRIO_MISSING}",
}


def test_analytics_extra_alone_traces_what_it_can(tmp_path: Path) -> None:
    # `pip install "aiowheel[analytics]"` then `aiowheel bench --trace DIR`, as
    # docs/analytics.md suggests: no uvloop, no trio; rich and pyarrow are there.
    done = run_without(
        ["uvloop", "trio"], "bench", "-w", "churn", *TINY, "--trace", "traces", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert set(done.stderr.splitlines()) == SKIP_LINES
    assert "call_later-asyncio" in done.stdout
    traces = tmp_path / "traces"
    assert {p.name for p in traces.glob("*.parquet")} == {
        "churn-aiowheel-asyncio.parquet",
        "churn-call_later-asyncio.parquet",
    }
    document = json.loads((traces / "bench-results.json").read_text())
    skipped = {r["contender"]: r["skipped"] for r in document["results"] if r["skipped"]}
    assert skipped == {
        "aiowheel-uvloop": UVLOOP_MISSING,
        "aiowheel-trio": TRIO_MISSING,
        "call_later-uvloop": UVLOOP_MISSING,
        "trio-native": TRIO_MISSING,
    }


def test_core_only_prints_plain_text(tmp_path: Path) -> None:
    done = run_without(NOT_IN_CORE, "bench", "-w", "rearm", *TINY, "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert set(done.stderr.splitlines()) == SKIP_LINES
    lines = done.stdout.splitlines()
    assert lines[0].startswith("aiowheel bench  Python ")
    assert "rearm: re-arm a pending timer to 30 s, N pending" in lines
    header = next(line for line in lines if line.startswith("variant"))
    assert header.split()[:5] == ["variant", "metric", "contender", "median", "min\u2013max"]
    assert any(line.startswith("N=100") and "call_later-asyncio" in line for line in lines)


def test_core_only_refuses_what_needs_an_extra_in_one_line(tmp_path: Path) -> None:
    for args, message in [
        (
            ["--trace", "t"],
            f"--trace records Parquet traces with pyarrow: {install_hint('analytics')}",
        ),
        (
            ["--report"],
            f"--report records Parquet traces with pyarrow: {install_hint('analytics')}",
        ),
        (["-c", "aiowheel-uvloop"], f"contender aiowheel-uvloop cannot run: {UVLOOP_MISSING}"),
        (["-c", "trio"], f"contender aiowheel-trio cannot run: {TRIO_MISSING}"),
    ]:
        done = run_without(NOT_IN_CORE, "bench", "-w", "churn", *TINY, *args, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (2, f"aiowheel bench: error: {message}\n"), args
        assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing created
