"""The benchmark figures the README and the docs quote come from the reference run
(docs/_data/reference-run.json, written by `aiowheel bench ... --save`): every one sits
between markers that tools/doc_figures.py rewrites, and this test checks that each is
what the tool renders from that file (issue 32: the docs' pages disagreed)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("doc_figures", ROOT / "tools" / "doc_figures.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["doc_figures"] = module
    spec.loader.exec_module(module)
    return module


def test_every_quoted_figure_is_the_reference_runs(capsys: object) -> None:
    tool = _tool()
    assert tool.main([]) == 0, "python tools/doc_figures.py --write, then review the diff"


def test_the_reference_run_is_a_bench_results_document() -> None:
    document = json.loads((ROOT / "docs" / "_data" / "reference-run.json").read_text())
    assert document["version"] == 1
    assert {"python", "cpus", "core", "loadavg"} <= set(document["machine"])
    assert document["results"]


def test_the_pages_quote_figures_through_the_markers() -> None:
    # The user-facing pages do quote the reference run (a page that lost its markers
    # would pass the check above with nothing checked).
    text = {name: (ROOT / name).read_text() for name in ("README.md", "docs/index.md")}
    for name, page in text.items():
        assert "<!-- ref " in page, name
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    assert benchmarks.count("<!-- reference-run table ") >= 5
    assert "<!-- reference-run machine -->" in benchmarks


def test_a_figure_edited_by_hand_is_caught(tmp_path: Path) -> None:
    tool = _tool()
    run = tool.Run(json.loads((ROOT / "docs" / "_data" / "reference-run.json").read_text()))
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert tool.render(page, run) == page
    # Change one digit of the first table's first figure: the render puts it back.
    start = page.index("<!-- reference-run table ")
    tail = re.sub(r"\| (\d)", lambda m: f"| {(int(m[1]) + 1) % 10}", page[start:], count=1)
    edited = page[:start] + tail
    assert edited != page
    assert tool.render(edited, run) == page
