"""The workload registry (aiowheel/bench/registry.py) and the two interfaces."""

from __future__ import annotations

import subprocess
import sys

from bench_support import subprocess_env

from aiowheel.bench.registry import WORKLOADS
from aiowheel.bench.workload import RepeatedWorkload, SearchedWorkload


def test_every_workload_in_the_default_order() -> None:
    assert list(WORKLOADS) == [
        "churn",
        "rearm",
        "fire",
        "spread",
        "kafka",
        "purgatory",
        "memory",
        "collector",
        "idle",
        "timeout",
        "loop-reschedule",
        "loop-steps",
        "loop-timeout",
        "loop-few",
        "loop-memory",
        "loop-collector",
        "server",
        "tracing",
    ]
    for name, workload in WORKLOADS.items():
        assert workload.name == name
        assert workload.metrics
        assert isinstance(workload, RepeatedWorkload) != isinstance(workload, SearchedWorkload)
    assert [n for n, w in WORKLOADS.items() if isinstance(w, SearchedWorkload)] == [
        "kafka",
        "server",
    ]


def test_workload_modules_import_alone_in_any_order() -> None:
    # They import their interfaces, never each other (issue 11): any one first works.
    for first in ("kafka", "workloads", "registry", "runner", "cli"):
        code = f"import aiowheel.bench.{first}"
        subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env())
