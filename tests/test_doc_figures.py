"""The benchmark figures the README and the docs quote come from the reference run
(docs/_data/reference-run.json, written by `aiowheel bench ... --save`): every one sits
between markers that tools/doc_figures.py rewrites, and this test checks that each is
what the tool renders from that file, and that the pages quote no measured figure in
prose outside those markers (a figure typed by hand drifts from the run's)."""

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
    assert "<!-- reference-run machine -->" in benchmarks


def test_each_section_of_benchmarks_is_generated_tables_each_from_a_named_command() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", page, flags=re.MULTILINE)
    titled = {s.split("\n", 1)[0]: s for s in sections[1:]}
    for title in ("What you gain, and where", "What it costs", "What does not change"):
        assert "<!-- reference-run table " in titled[title], title
    # Every table or list of figures follows the command that measures it: the prose
    # since the previous table names `aiowheel bench -w ...` (a table right after
    # another continues it).
    previous_end = 0
    for m in re.finditer(r"<!-- reference-run (table|list) .*?<!-- /reference-run -->", page, re.S):
        between = page[previous_end : m.start()]
        assert "`aiowheel bench -w " in between or not between.strip(), m.group(0)[:80]
        previous_end = m.end()
    assert len(page.splitlines()) <= 200, "benchmarks.md is for users: keep it short"


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


# --- no measured figure in prose outside the markers ----------------------------------

#: The pages that quote the reference run, and the part of each that does (None: all).
PROSE_PAGES: dict[str, str | None] = {
    "README.md": None,
    "docs/index.md": None,
    "docs/benchmarks.md": None,
    "docs/bench-method.md": None,
    "docs/bench-workloads.md": None,
    "docs/bench-json.md": None,
    "docs/loop.md": None,
}
#: Figures in that prose that are not measured by a run, each with why.
NOT_MEASURED = {
    "README.md": {
        "1.2 GB": "the size of the installed environment, not a benchmark figure",
        "490 MB": "pyspark's share of it",
    },
    "docs/benchmarks.md": {"1\u00d7": "the line between better and worse"},
    "docs/loop.md": {
        "1\u00d7": "the line between better and worse",
        "144 B": "the handle's size, by its layout (sys.getsizeof)",
        "64 B": "a context's size, by its layout",
        "5%": "the timers' share of a request in the callgrind table beside it "
        "(tools/server_profile.py), instructions, not the reference run",
    },
    "docs/bench-method.md": {
        "1.5\u00d7": "a worked example of reading a ratio",
        "50%": "the same example",
    },
    "docs/bench-workloads.md": {
        "105,000 requests/s": "the figure Kafka published, which the workload mirrors",
        "100,000 requests/s": "a fixed rate the workload offers (a setting)",
        "5 %": "the search's precision (a setting)",
        "20 %": "the search's step (a setting)",
    },
}
_UNIT = r"(?:ns|\u00b5s|us|B|KB|KiB|MB|MiB|GB|req/s|requests/s|callbacks/s|%|\u00d7|x)"
_FIGURE = re.compile(r"(?<![\w.\-=/])\d[\d,]*(?:\.\d+)?\s?" + _UNIT + r"(?![\w/])")


def prose_figures(text: str) -> list[str]:
    """The measured-looking figures (a number with a unit of time per operation, of
    memory, of rate, a percentage or a ratio) in the prose of a page: not in code, not
    in a table, not between the markers that tools/doc_figures.py renders."""
    text = re.sub(r"<!-- ref .*?<!-- /ref -->", "", text, flags=re.DOTALL)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return [" ".join(m.group(0).split()) for m in _FIGURE.finditer(text)]


def _prose_part(name: str) -> str:
    text = (ROOT / name).read_text(encoding="utf-8")
    start = PROSE_PAGES[name]
    if start is None:
        return text
    part = text[text.index(start) :]
    following = re.search(r"^## ", part[len(start) :], flags=re.MULTILINE)
    return part if following is None else part[: len(start) + following.start()]


def test_the_pages_quote_no_measured_figure_in_prose_outside_the_markers() -> None:
    stray = {}
    for name in PROSE_PAGES:
        allowed = NOT_MEASURED.get(name, {})
        found = [f for f in prose_figures(_prose_part(name)) if f not in allowed]
        if found:
            stray[name] = found
    assert stray == {}, "quote them through <!-- ref ... --> markers, or refer to the table"


def test_a_figure_typed_into_prose_is_caught() -> None:
    assert prose_figures("costs 4,472 ns a read, 3.4\u00d7 less, 152 B, 12% more") == [
        "4,472 ns",
        "3.4\u00d7",
        "152 B",
        "12%",
    ]
    quoted = "costs <!-- ref loop-timeout:read_ns loop-uvloop -->4,472 ns<!-- /ref --> a read"
    assert prose_figures(quoted) == []
    assert prose_figures("| re-arm | 479 ns | 15.75\u00d7 |\n") == []
    assert prose_figures("a 1 ms tick, N=100,000, 30 s out, `2 B`") == []


def test_every_page_that_quotes_the_reference_run_is_checked() -> None:
    tool = _tool()
    for name in tool.FILES:
        if name != "docs/benchmark-history.md":
            assert name in PROSE_PAGES, name


def test_a_ratio_is_printed_to_the_precision_its_run_supports() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    ratios = re.findall(r"(\d[\d,]*(?:\.\d+)?)\u00d7 \|", page)
    assert ratios
    for ratio in ratios:
        whole = "." not in ratio
        digits = ratio.replace(",", "").replace(".", "").lstrip("0")
        assert len(digits.rstrip("0") if whole else digits) <= 3, ratio
