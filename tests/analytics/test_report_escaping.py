"""Text from the traced program (labels, run ids, workload names, paths) is shown as
it is in report.md and in the figures: never obeyed as Markdown, never split over
lines, never read as matplotlib's mathtext. Parsed back with markdown-it (rich's own
Markdown parser), GitHub's tables enabled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aiowheel.analytics import plots, render, schema
from aiowheel.analytics.inputs import TraceFiles
from aiowheel.analytics.render import Headline, md_code, md_text

markdown_it = pytest.importorskip("markdown_it")
pd = pytest.importorskip("pandas")


def _summary(runs: list[tuple[str, str, str, str | None, int, int]]) -> Any:
    """Summary rows as job.run_job returns them (one per run and label)."""
    rows = [
        {
            "workload": run_id,
            "contender": schema.contender_name(implementation, backend),
            "run_id": run_id,
            "implementation": implementation,
            "backend": backend,
            "host": "h",
            "label": label,
            "scheduled": fired + cancelled,
            "fired": fired,
            "cancelled": cancelled,
            "cancel_ratio": cancelled / (fired + cancelled),
            **{
                f"lateness_{p}_ms": v
                for p, v in zip(
                    ("p50", "p90", "p99", "p999", "max"), (1.0, 2.0, 3.0, 4.0, 5.0), strict=True
                )
            },
            "lifetime_p50_s": 0.5,
            "lateness_cdf": [q / 100 for q in schema.CDF_QUANTILES],
        }
        for run_id, implementation, backend, label, fired, cancelled in runs
    ]
    return pd.DataFrame(rows)


HOSTILE = (
    "two\nlines",
    "| x | y |",
    "# heading",
    "`tick`",
    "``",
    "*bold* _em_ [link](http://a) <b>html</b>",
    "$\\frac$ and $x$",
    "back\\slash & &amp;",
    "\x1b[31mred\u2028sep",
    " - item",
)


def _tokens(text: str) -> list[Any]:
    return list(markdown_it.MarkdownIt("commonmark").enable("table").parse(text))


def _inline_text(token: Any) -> str:
    """What a reader sees of an inline token: its text and code spans."""
    return "".join(
        child.content for child in token.children or () if child.type in ("text", "code_inline")
    )


@pytest.mark.parametrize("label", HOSTILE)
def test_md_text_and_md_code_show_the_text_as_it_is(label: str) -> None:
    shown = label.replace("\n", "\\n").replace("\x1b", "\\x1b").replace("\u2028", "\\u2028")
    for text in (md_text(label), f"a {md_code(label)} b"):
        assert "\n" not in text
        tokens = _tokens(text)
        assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"]
        seen = _inline_text(tokens[1])
        assert seen.strip() == (shown if text.startswith("a ") is False else f"a {shown} b").strip()


def test_labels_stay_in_their_cells_and_are_no_markdown() -> None:
    runs = [("e2e", "aiowheel", "asyncio", label, 10, 0) for label in HOSTILE]
    summary = _summary(runs).drop(columns=["lateness_cdf"])
    files = TraceFiles(local=("/t/x\n# not a heading/a.parquet",), remote=(), rows=10)
    text = render.render_markdown(
        summary, files, 10, "local[1]", "4", Headline(None, None, "none"), out=Path("/t/r")
    )
    tokens = _tokens(text)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not any("heading" in h for h in headings), headings  # only the report's own
    # The summary: one body row per label, and the label cell reads as the label.
    start = next(i for i, t in enumerate(tokens) if t.type == "table_open")
    end = next(i for i, t in enumerate(tokens) if t.type == "table_close" and i > start)
    rows: list[list[str]] = []
    for token in tokens[start:end]:
        if token.type == "tr_open":
            rows.append([])
        elif token.type == "inline":
            rows[-1].append(_inline_text(token))
    header, body = rows[0], rows[1:]
    assert len(body) == len(HOSTILE)
    assert all(len(row) == len(header) for row in body)
    column = header.index("label")
    shown = {
        label.replace("\n", "\\n").replace("\x1b", "\\x1b").replace("\u2028", "\\u2028")
        for label in HOSTILE
    }
    assert {row[column] for row in body} == {label.strip() for label in shown}
    # "Labels here:" names each label in a code span that holds it whole.
    paragraph = next(
        _inline_text(t) for t in tokens if t.type == "inline" and "Labels here" in t.content
    )
    for label in shown:
        assert label.strip() in paragraph
    # The input path: relative to the report's directory, in one code span.
    assert "- `../x\\n# not a heading/a.parquet`" in text


def test_a_label_with_dollars_is_no_formula_in_the_figures(tmp_path: Path) -> None:
    runs = [
        ("e2e", "aiowheel", "asyncio", "$\\frac$", 10, 0),
        ("e2e", "aiowheel", "asyncio", "two\nlines", 10, 0),
        ("$\\frac$-run", "aiowheel", "asyncio", None, 10, 0),
    ]
    figure = plots.plot_lateness_cdf(_summary(runs), tmp_path / "cdf.png")  # drawn: no error
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "label \\$\\frac\\$" in texts  # escaped: shown as typed
    assert "label two\\nlines" in texts
    assert (tmp_path / "cdf.png").stat().st_size > 0
