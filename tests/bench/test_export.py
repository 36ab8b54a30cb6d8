"""bench-results.json (aiowheel/bench/export.py): its shape, and the atomic write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import aiowheel
from aiowheel.bench import export
from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.results import Result
from aiowheel.bench.settings import Settings


def _results() -> list[Result]:
    measured = Result("churn", "N=10", 10, "pair_ns", "pair", "ns", "lower", CONTENDERS[3], [2.0])
    measured.ratios = {"aiowheel-asyncio": 2.0}
    skipped = Result("churn", "N=10", 10, "pair_ns", "pair", "ns", "lower", CONTENDERS[4], [])
    skipped.skipped = "uvloop is not installed"
    return [measured, skipped]


def test_document(tmp_path: Path) -> None:
    settings = Settings(workloads=["churn"], trace_dir=tmp_path)
    machine = export.machine()
    path = export.write_results(tmp_path, settings, machine, _results())
    assert path == tmp_path / "bench-results.json"
    document = json.loads(path.read_text())
    assert document == {
        "version": 1,
        "settings": settings.as_json(),
        "machine": machine,
        "complete": True,
        "results": [r.as_json() for r in _results()],
    }
    partial = export.write_results(tmp_path, settings, machine, _results()[:1], complete=False)
    assert json.loads(partial.read_text())["complete"] is False
    assert document["results"][0]["ratios"] == {"aiowheel-asyncio": 2.0}
    assert document["results"][1]["skipped"] == "uvloop is not installed"
    assert set(machine) == {
        "python",
        "implementation",
        "platform",
        "cpus",
        "loadavg",
        "core",
        "core_reason",
    }
    assert machine["core"] == ("compiled" if aiowheel.COMPILED else "pure")
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_write_replaces_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(workloads=["churn"])
    path = tmp_path / "bench-results.json"
    path.write_text('{"version": 1, "old": true}')

    def fail(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        export.write_results(tmp_path, settings, {}, _results())
    # The old file is intact and the temporary file is gone.
    assert json.loads(path.read_text()) == {"version": 1, "old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["bench-results.json"]
    monkeypatch.undo()
    export.write_results(tmp_path, settings, {}, _results())
    assert json.loads(path.read_text())["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["bench-results.json"]
