"""What the benchmark's test modules (tests/bench/) share.

Nothing here asserts a speed: the suite measures, the tests check that it runs every
contender on every workload and reports what it measured in the documented shape.
Sizes and windows are tiny (``TINY``): each repetition takes milliseconds.

* ``run_json``: ``python -m aiowheel.bench ... --json`` in this process, parsed.
* ``StandInRecorder``: a trace recorder that keeps rows in memory (no pyarrow).
* ``run_without``: ``aiowheel bench`` in a subprocess where some modules cannot be
  imported (``sys.modules[name] = None``), to play a partial install without
  uninstalling anything from the shared environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aiowheel
from aiowheel.bench import cli
from aiowheel.bench.contenders import CONTENDERS, install_hint
from aiowheel.bench.registry import WORKLOADS

TINY = [
    "--n",
    "300",
    "--ops",
    "1000",
    "--reps",
    "2",
    "--spread-window",
    "0.05",
    "--idle-seconds",
    "0.03",
    "--idle-timeout",
    "0.02",
    "--kafka-probe",
    "0.05",
    "--kafka-seconds",
    "0.1",
    "--kafka-rates",
    "2000,4000",
    "--kafka-targets",
    "2000,3000",
    "--kafka-target-seconds",
    "0.1",
    "--loop-seconds",
    "0.02",
]

#: The keys of a result line (docs/bench-json.md, "Output").
RESULT_KEYS = {
    "type",
    "workload",
    "variant",
    "n",
    "metric",
    "label",
    "unit",
    "better",
    "contender",
    "kind",
    "backend",
    "core",
    "core_reason",
    "median",
    "min",
    "max",
    "samples",
    "reps",
    "ratios",
    "ratio_ranges",
    "skipped",
    "failed",
    "params",
}

AIOWHEEL = {"aiowheel-asyncio", "aiowheel-uvloop", "aiowheel-trio"}
#: The drop-in loop's contenders (aiowheel too: the peers' ratios are against them).
LOOP = {"loop-asyncio", "loop-uvloop"}

#: Why a contender whose event loop is not installed sits out.
UVLOOP_MISSING = f"uvloop is not installed ({install_hint('uvloop')})"
TRIO_MISSING = f"trio is not installed ({install_hint('trio')})"
RLOOP_MISSING = f"rloop is not installed ({install_hint('bench')})"

#: What a core-only install lacks (`pip install aiowheel`: anyio only).
NOT_IN_CORE = ["uvloop", "trio", "rloop", "rich", "pyarrow", "pyspark", "pandas", "matplotlib"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert cli.main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]


def results_of(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["type"] == "result"]


def applicable(workload: str) -> set[str]:
    """The default set's contenders that run ``workload`` (the -pure, -traced and
    -sampled ones are opt-in)."""
    return {
        c.name
        for c in CONTENDERS
        if WORKLOADS[workload].applies_to(c) and not c.pure and not c.trace_every
    }


def ours(workload: str, kinds: frozenset[str] | None = None) -> set[str]:
    """The aiowheel contenders of ``workload`` that every peer's ratios are against
    (of a figure only ``kinds`` have, when given: ``Metric.kinds``)."""
    return {
        c.name
        for c in CONTENDERS
        if c.is_aiowheel and c.name in applicable(workload) and (kinds is None or c.kind in kinds)
    }


def against(workload: str, peer: str, kinds: frozenset[str] | None = None) -> set[str]:
    """The aiowheel contender a peer's ratio is against: the one on the peer's own
    event loop, else (rloop) the uvloop one (issue 32: one meaning of a ratio); of a
    figure only ``kinds`` have, one of those."""
    backend = next(c.backend for c in CONTENDERS if c.name == peer)
    mine = {c.name: c.backend for c in CONTENDERS if c.name in ours(workload, kinds)}
    same = {name for name, b in mine.items() if b == backend}
    if same:
        return same
    for preferred in ("uvloop", "asyncio", "trio"):
        found = {name for name, b in mine.items() if b == preferred}
        if found:
            return found
    return set()


def parse(args: list[str]) -> Any:
    return cli.build_parser().parse_args(args)


class StandInRecorder:
    """A TraceRecorder that keeps rows in memory and writes a marker file on close."""

    made: list[StandInRecorder] = []

    def __init__(self, path: str, *, run_id: str, implementation: str) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.implementation = implementation
        self.opened: dict[str, Any] | None = None
        self.rows: list[tuple[Any, ...]] = []
        self.closed = 0
        StandInRecorder.made.append(self)

    def open(self, *, backend: str, clock: float) -> None:
        assert self.opened is None
        self.opened = {"backend": backend, "clock": clock}

    def record(self, *row: Any) -> None:
        assert self.opened is not None
        assert not self.closed
        self.rows.append(row)

    def close(self) -> None:
        self.closed += 1
        self.path.write_text(f"{len(self.rows)} rows\n")


_SHIM = """\
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` raises ImportError, as if not installed
from aiowheel.__main__ import main
main(sys.argv[2:])
"""


def subprocess_env() -> dict[str, str]:
    """The environment for a child Python that imports this copy of aiowheel."""
    root = Path(aiowheel.__file__).resolve().parent.parent
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def run_without(
    missing: list[str], *args: str, cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``aiowheel ARGS`` in a subprocess where the ``missing`` modules do not import."""
    return subprocess.run(
        [sys.executable, "-c", _SHIM, ",".join(missing), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=subprocess_env(),
        timeout=timeout,
        check=False,
    )
