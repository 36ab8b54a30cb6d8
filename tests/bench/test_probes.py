"""The by-hand probes of tools/ (tools/README.md) still run: each once, at tiny sizes,
in a child Python as a maintainer runs it (``PYTHONSAFEPATH=1``, warnings as errors).
Nothing here asserts a figure: only that the probe runs to its end and prints what its
docstring says it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bench_support import subprocess_env

TOOLS = Path(__file__).resolve().parents[2] / "tools"

#: probe -> its runs: (tiny arguments, a line its output has).
PROBES: dict[str, list[tuple[list[str], str]]] = {
    "kafka_saturation.py": [(["aiowheel-asyncio,null", "0.1", "1"], "us/request")],
    "loop_gc_probe.py": [
        (["--reps", "1", "--pending", "500", "--steps", "1000"], "in the collector")
    ],
    "loop_lateness_probe.py": [(["--timers", "3"], "median")],
    "idle_middleware_cost.py": [(["--rounds", "1", "-n", "50"], "middleware / bare")],
    "server_profile.py": [
        (
            ["--measure", "cpu", "-n", "20", "--warm-up", "5", "--loops", "asyncio,loop-asyncio"],
            "drop-in / plain asyncio",
        ),
        # Under load (wrk, or the bench's own load generator), with the plain loop
        # whose timers are stubbed out.
        (
            [
                *("--measure", "load", "--seconds", "0.3", "--rounds", "1"),
                *("--warm-up", "5", "--loops", "asyncio,stub-asyncio"),
            ],
            "timers stubbed / plain asyncio",
        ),
    ],
}


def test_every_probe_of_tools_is_listed_here_or_run_elsewhere() -> None:
    """A new probe gets its line above; the others are run by .ci/run, noxfile.py or
    their own tests (tools/README.md, "run by")."""
    elsewhere = {
        "asyncio_suite.py",
        "peer_suite.py",
        "peer_pytest_plugin.py",
        "suite_compare.py",
        "check_doc_links.py",
        "doc_figures.py",
    }
    assert {path.name for path in TOOLS.glob("*.py")} == set(PROBES) | elsewhere
    readme = (TOOLS / "README.md").read_text()
    for name in [*PROBES, *elsewhere]:
        assert f"`{name}`" in readme, name


RUNS = [(probe, run) for probe in sorted(PROBES) for run in range(len(PROBES[probe]))]


@pytest.mark.parametrize(("probe", "run"), RUNS)
def test_the_probe_runs(probe: str, run: int) -> None:
    args, expected = PROBES[probe][run]
    done = subprocess.run(
        [sys.executable, "-W", "error", str(TOOLS / probe), *args],
        capture_output=True,
        text=True,
        env={**subprocess_env(), "PYTHONSAFEPATH": "1"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout, done.stdout[-2000:]
