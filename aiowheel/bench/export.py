"""``bench-results.json``: a traced run's figures, next to its traces, for the report.

Whenever the bench traces (``--trace DIR``; ``--report`` traces into ``OUT/traces``)
it writes ``DIR/bench-results.json`` after the run, before the report is built::

    {"version": 1,
     "settings": {...},   # the same object as the settings of the --json "run" line
     "machine": {...},    # python, implementation, platform, cpus, loadavg (at the
                          # start), core and core_reason (this process's aiowheel core)
     "complete": true,    # false: written after a workload variant, the run not over
                          # (an interrupted run's file holds what it finished)
     "results": [...]}    # one Result.as_json() per result, skipped contenders included

It is written after each workload variant (``complete`` false), and once more at the
end. The file is replaced atomically (a temporary file in DIR, then a rename): a reader
sees the previous run's file or this one's, never half of one. docs/bench-json.md
("bench-results.json") documents the format.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import aiowheel
from aiowheel import _compiled

from .results import Result
from .settings import Settings

__all__ = ["RESULTS_FILE", "VERSION", "machine", "results_document", "write_results"]

RESULTS_FILE = "bench-results.json"
VERSION = 1


def machine() -> dict[str, Any]:
    """The machine a run measures on (the ``run`` line of ``--json`` has it too), and
    the aiowheel core this process runs (``-pure`` contenders run the pure one in child
    processes whatever this one runs)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in load] if load else None,
        "core": "compiled" if aiowheel.COMPILED else "pure",
        "core_reason": _compiled.REASON or None,
    }


def results_document(
    settings: Settings,
    machine_info: dict[str, Any],
    results: list[Result],
    *,
    complete: bool = True,
) -> dict[str, Any]:
    return {
        "version": VERSION,
        "settings": settings.as_json(),
        "machine": machine_info,
        "complete": complete,
        "results": [r.as_json() for r in results],
    }


def write_results(
    directory: Path,
    settings: Settings,
    machine_info: dict[str, Any],
    results: list[Result],
    *,
    name: str = RESULTS_FILE,
    complete: bool = True,
) -> Path:
    """Write ``directory/name`` (``bench-results.json``) atomically; returns its path."""
    document = results_document(settings, machine_info, results, complete=complete)
    text = json.dumps(document, allow_nan=False, default=str, indent=1)
    path = directory / name
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        os.chmod(temporary, 0o644)  # not mkstemp's 0600: other readers need it
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text + "\n")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path
