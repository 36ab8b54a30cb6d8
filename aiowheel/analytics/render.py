"""What a person reads: the tables (terminal and Markdown) and ``report.md``.

Works on the collected frames only (pandas, rich); no Spark, no files.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .bench_results import BenchResults, kafka_mismatches, kafka_rates, server_figures
from .inputs import TraceFiles, completeness_lines, is_remote, sampling_lines
from .plots import metric_name, times
from .schema import (
    BENCH_RESULTS,
    CDF_PNG,
    HEADLINE_PNG,
    IMPOSSIBLY_EARLY_S,
    KAFKA_PNG,
    LOOP_PNG,
    P99_PNG,
    RATES_PNG,
    SEARCHED_WORKLOADS,
    SERVER_PNG,
    SINGLE_REPETITION,
    SINGLE_SEARCH,
    SUMMARY_CSV,
    SUMMARY_PARQUET,
    WINDOWS_PARQUET,
    contender_order,
    short_run_ids,
    visible,
)

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]

__all__ = [
    "DROP_IN_TITLE",
    "Headline",
    "headline_cells",
    "headline_subtitle",
    "headline_table",
    "md_code",
    "md_text",
    "render_markdown",
    "summary_cells",
    "summary_table",
]


@dataclass(frozen=True)
class Headline:
    """The headline's source: the bench's results and their ratios, or why there are none."""

    bench: BenchResults | None
    ratios: pd.DataFrame | None  #: bench_results.headline's frame
    missing: str  #: why there is no headline (when ``ratios`` is None)
    #: bench_results.drop_in's frame: the drop-in loop against the plain loops
    drop_in: pd.DataFrame | None = None


# -- formatting ----------------------------------------------------------------------------

#: What Markdown (CommonMark, and GitHub's tables and math) would read as markup in a
#: line of text: a backslash, code, emphasis, links, HTML, headings, table cells,
#: strikethrough, images, entities, math; ``_`` only where it can open or close
#: emphasis (not inside a word: ``call_later`` stays as it is).
_MARKUP: Final = re.compile(r"[\\`*\[\]<>#|~!&$]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")

_BLOCK_START: Final = re.compile(r"^(\s*(?:\d{1,9}(?=[.)](?:\s|$))|(?=[-+](?:\s|$))|(?==)))(.)")


def md_text(value: Any, *, line_start: bool = True) -> str:
    """``value`` as Markdown text that shows it as it is: on one line (control
    characters as escapes) and every character Markdown would read backslash-escaped.
    For everything the report takes from its data (labels, run ids, workload and
    contender names, notes) and writes outside a code span."""
    text = _MARKUP.sub(lambda match: "\\" + match.group(), visible(str(value)))
    if not line_start:  # a table cell: no block starts in it
        return text
    # What opens a block at the start of a line: a list item, a setext underline.
    return _BLOCK_START.sub(lambda match: f"{match[1]}\\{match[2]}", text)


def md_code(value: Any) -> str:
    """``value`` as a Markdown code span, on one line (control characters as escapes),
    fenced with more backticks than it holds in a row, so that none ends the span."""
    text = visible(str(value))
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    if text.startswith(("`", " ")) or text.endswith(("`", " ")):
        text = f" {text} "
    return f"{fence}{text}{fence}"


def _ms(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{float(value):.3f}"


def _seconds(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{float(value):.3g}"


def _label(value: Any) -> str:
    return value if isinstance(value, str) else "-"


def _shown_path(path: str | os.PathLike[str], out: Path | None) -> str:
    """A local path as report.md names it: relative to the report's directory ``out``
    (where a reader of report.md opens it from); a remote one (``s3a://``) as given."""
    text = os.fspath(path)
    if out is None or is_remote(text):
        return text
    local = Path(text.removeprefix("file://"))
    try:
        return os.path.relpath(local.resolve(), Path(out).resolve())
    except (OSError, ValueError):  # another drive (Windows), an unresolvable link
        return local.name


# -- the headline ------------------------------------------------------------------------


def headline_subtitle(bench: BenchResults) -> str:
    """Where the ratios come from, in one line: sizes, repetitions, machine."""
    settings, machine = bench.settings, bench.machine
    parts = []
    if "quick" in settings:
        parts.append("quick sizes" if settings["quick"] else "full sizes")
    reps = settings.get("reps")
    if isinstance(reps, int):
        if reps == 1:
            parts.append("ONE repetition per figure: ratios can flip between runs")
        else:
            parts.append(f"median of {reps} repetitions")
    searched = sorted({r["workload"] for r in bench.results} & SEARCHED_WORKLOADS)
    if searched:
        # A search per contender, not a median (issue 32).
        parts.append(f"{', '.join(searched)}: ONE search per contender")
    if machine.get("python"):
        parts.append(f"Python {machine['python']}")
    if isinstance(machine.get("cpus"), int):
        parts.append(f"{machine['cpus']} CPUs")
    load = machine.get("loadavg")
    if isinstance(load, list) and load and isinstance(load[0], int | float):
        parts.append(f"load average {load[0]:.1f}")
    return ", ".join(parts)


def headline_cells(ratios: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The ratio table: one row per workload variant and metric, one column per peer."""
    peers = contender_order(ratios["peer"])
    headers = ["workload", "metric", *(f"vs {peer}" for peer in peers)]
    rows: list[list[str]] = []
    keys = dict.fromkeys(zip(ratios["workload"], ratios["variant"], ratios["metric"], strict=True))
    for workload, variant, metric in keys:
        part = ratios[
            (ratios["workload"] == workload)
            & (ratios["variant"] == variant)
            & (ratios["metric"] == metric)
        ]
        first = part.iloc[0]
        cells = [
            f"{workload} {variant}".strip(),
            metric_name(first),
        ]
        for peer in peers:
            match = part[part["peer"] == peer]
            if match.empty:
                cells.append("")
                continue
            row = match.iloc[0]
            ratio = float(row["ratio"])
            if math.isnan(ratio):
                cells.append(row["note"] or "-")
            elif bool(row.get("no_difference", False)):
                # Both measured several times, their min-max ranges overlap: the
                # ratio's own range crosses 1x, so it is neither a gain nor a loss.
                cells.append(NO_DIFFERENCE)
            elif row["note"] in (SINGLE_REPETITION, SINGLE_SEARCH):
                cells.append(f"{times(ratio)} ({row['note']})")
            else:
                cells.append(times(ratio))
        rows.append(cells)
    return headers, rows


#: A ratio whose min-max range crosses 1x, in every table and figure.
NO_DIFFERENCE: Final = "no difference measured"

#: The terminal title of the drop-in loop's ratio table.
DROP_IN_TITLE: Final = (
    "The drop-in loop: how many times better it is than the plain loop on its own base "
    "(> 1\u00d7: the drop-in loop)"
)


def headline_table(
    ratios: pd.DataFrame,
    title: str = "How many times better aiowheel is than each peer (> 1\u00d7: aiowheel)",
) -> Any:
    """The ratio table as a rich Table."""
    from rich.table import Table
    from rich.text import Text

    headers, rows = headline_cells(ratios)
    table = Table(title=title)
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if i >= 2 else "left")
    for row in rows:
        # Text, not markup: a note's `pip install "aiowheel[uvloop]"` is no markup tag.
        table.add_row(*map(Text, row))
    return table


# -- the trace summary -------------------------------------------------------------------

_COLUMNS: Final[tuple[tuple[str, str, Callable[[Any], str]], ...]] = (
    ("workload", "workload", str),
    ("contender", "contender", str),
    ("label", "label", _label),
    ("scheduled", "scheduled", lambda v: f"{int(v):,}"),
    ("fired", "fired", lambda v: f"{int(v):,}"),
    ("cancelled", "cancelled", lambda v: f"{int(v):,}"),
    ("cancel_ratio", "cancel %", lambda v: f"{100 * float(v):.1f}"),
    ("lateness_p50_ms", "p50 ms", _ms),
    ("lateness_p90_ms", "p90 ms", _ms),
    ("lateness_p99_ms", "p99 ms", _ms),
    ("lateness_p999_ms", "p99.9 ms", _ms),
    ("lateness_max_ms", "max ms", _ms),
    ("lifetime_p50_s", "lifetime p50 s", _seconds),
)
_FIRST_NUMBER: Final = "scheduled"
#: Dropped in this order, one by one, while the table is wider than the terminal
#: (the full table is in summary.csv and report.md).
_OPTIONAL_HEADERS: Final = ("lifetime p50 s", "p90 ms", "cancel %", "max ms", "scheduled")


def summary_cells(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the summary table (lateness in milliseconds)."""
    columns = list(_COLUMNS)
    if summary["label"].isna().all():
        columns = [c for c in columns if c[0] != "label"]
    if summary["workload"].nunique() == 1 and summary["run_id"].nunique() > 1:
        columns = [c for c in columns if c[0] != "workload"]
    shared = summary.groupby(["workload", "contender"])["run_id"].nunique().max()
    if shared and shared > 1:
        # Several runs of one contender on one workload: tell them apart by run id,
        # without the prefix they all share (a benchmark's timestamp, say).
        short = short_run_ids(summary["run_id"])
        columns.insert(0, ("run_id", "run", lambda run: short[run]))
    headers = [header for _, header, _ in columns]
    cells = [[fmt(row[name]) for name, _, fmt in columns] for _, row in summary.iterrows()]
    return headers, cells


def summary_table(summary: pd.DataFrame, width: int | None = None) -> Any:
    """The summary as a rich Table, narrowed to ``width`` columns by leaving out the
    least important ones rather than cutting cells."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    headers, cells = summary_cells(summary)
    keep = list(range(len(headers)))
    first_number = headers.index(_FIRST_NUMBER)
    measure = Console(width=10_000)
    while True:
        table = Table(title="Timer lateness (fired_at - deadline) per run and label")
        for index in keep:
            numeric = index >= first_number
            table.add_column(headers[index], justify="right" if numeric else "left", no_wrap=True)
        for row in cells:
            table.add_row(*(Text(row[index]) for index in keep))  # a label's [..] is text
        if width is None or measure.measure(table).maximum <= width:
            return table
        droppable = [i for i in keep if headers[i] in _OPTIONAL_HEADERS]
        if not droppable:
            return table
        keep.remove(min(droppable, key=lambda i: _OPTIONAL_HEADERS.index(headers[i])))


def _markdown_table(headers: Sequence[str], cells: Sequence[Sequence[str]], numeric: int) -> str:
    """A Markdown table; columns from ``numeric`` on are right-aligned. Every header and
    cell is text from the data, escaped (``md_text``): a label with a newline or a
    ``|`` stays in its cell."""
    lines = [
        "| " + " | ".join(md_text(header, line_start=False) for header in headers) + " |",
        "|" + "|".join("---:" if i >= numeric else "---" for i in range(len(headers))) + "|",
    ]
    lines += [
        "| " + " | ".join(md_text(cell, line_start=False) for cell in row) + " |" for row in cells
    ]
    return "\n".join(lines)


# -- report.md -------------------------------------------------------------------------------


_X: Final = "\u00d7"  # the times sign


def _headline_section(headline: Headline, out: Path | None = None) -> str:
    if headline.ratios is None or headline.bench is None:
        return f"""## Headline: aiowheel against each peer

No headline: {headline.missing}. The headline compares aiowheel with each peer on
the benchmark's own measurements, which `aiowheel bench` saves as `{BENCH_RESULTS}`
next to its traces (`aiowheel bench --report` does); give it with
`--bench-results PATH` when it is elsewhere. The trace analysis follows.
"""
    if headline.ratios.empty:
        source = md_code(_shown_path(headline.bench.path, out))
        return f"""## Headline: aiowheel against each peer

{source} holds no ratios (no peer was measured next to aiowheel).
"""
    headers, cells = headline_cells(headline.ratios)
    cells, skipped = _footnoted(cells)
    subtitle = headline_subtitle(headline.bench)
    source = md_code(_shown_path(headline.bench.path, out))
    X = _X
    return f"""## Headline: aiowheel against each peer

![aiowheel against each peer, per workload]({HEADLINE_PNG})

How many times better aiowheel is than each peer, each compared with aiowheel on the
same backend (`call_later-uvloop` with `aiowheel-uvloop`, `trio-native` with
`aiowheel-trio`): above 1{X} aiowheel is better, below 1{X} the peer is, whichever way
the metric is better. The scale is logarithmic, so 2{X} and 0.5{X} are equally far from
the 1{X} line; a ratio past 100{X} is drawn to the edge, marked, with its value.
"{NO_DIFFERENCE}": the two contenders' min-max ranges over their repetitions overlap
(the ratio's range crosses 1{X}). From {source}{f" ({md_text(subtitle)})" if subtitle else ""}.

{_markdown_table(headers, cells, 2)}
{skipped}"""


def _footnoted(cells: list[list[str]]) -> tuple[list[list[str]], str]:
    """Cells whose note is long (a skipped contender's reason, repeated in every row
    it skips) as ``skipped (1)``, each reason listed once under the table."""
    reasons: dict[str, int] = {}
    shown = []
    for row in cells:
        out = []
        for cell in row:
            if cell.startswith("skipped: "):
                number = reasons.setdefault(cell.removeprefix("skipped: "), len(reasons) + 1)
                cell = f"skipped ({number})"
            out.append(cell)
        shown.append(out)
    notes = "\n".join(f"{number}. skipped: {md_text(why)}" for why, number in reasons.items())
    return shown, f"\n{notes}\n" if notes else ""


def _drop_in_section(headline: Headline, out: Path | None = None) -> str:
    """The drop-in loop's workloads and the server's: figures and ratios (issue 32)."""
    frame = headline.drop_in
    if frame is None or frame.empty or headline.bench is None:
        return ""
    headers, cells = headline_cells(frame)
    cells, skipped = _footnoted(cells)
    figures = _markdown_table(*_drop_in_figures(frame), 2)
    crossed = sorted(
        {
            f"{md_code(row.peer)} (with {md_code(row.aiowheel)})"
            for row in frame.itertuples()
            if row.peer.split("-")[-1] != row.aiowheel.split("-")[-1]
        }
    )
    across = (
        f"\nWith no drop-in loop on its own event loop, {', '.join(crossed)} is compared "
        "with the drop-in loop on the base named.\n"
        if crossed
        else ""
    )
    X = _X
    return f"""## The drop-in loop: `aiowheel.new_event_loop()` against the plain loops

![The drop-in loop against the plain loop on its base]({LOOP_PNG})

The same asyncio program (`loop.call_later`, `asyncio.timeout`, `asyncio.sleep`; and a
uvicorn server on 127.0.0.1 loaded from another process, the `server` workload) on
the drop-in loop and on the plain loop of the same base. How many times better the
drop-in loop is than each plain loop, on that loop's own base (`call_later-uvloop`
with `loop-uvloop`): above 1{X} the drop-in loop is better. From
{md_code(_shown_path(headline.bench.path, out))}; docs/bench-workloads.md says what each workload
does.
{across}
Above 1{X} the drop-in loop is better, below 1{X} the plain loop is; "{NO_DIFFERENCE}"
where the two loops' min-max ranges over their repetitions overlap (the ratio's range
crosses 1{X}).

{_markdown_table(headers, cells, 2)}
{skipped}
The figures (medians) behind the ratios:

{figures}
"""


def _kafka_section(headline: Headline) -> str:
    """Kafka's figures against the offered rate (issue 31): the figure, and the
    medians behind it; empty when the bench measured no target rate."""
    if headline.bench is None:
        return ""
    rates = kafka_rates(headline.bench)
    if rates.empty:
        note = _kafka_mismatch_note(headline.bench)
        if not note:
            return ""
        # No contender held any target rate: no figure, but the search said otherwise.
        return f"""## Kafka's purgatory benchmark: cost against the offered rate

No contender held any fixed target rate, so there is no figure.
{note}"""
    names = contender_order(rates["contender"])
    tables = []
    for metric, title in (
        ("cpu_s_per_m", "CPU seconds per 1,000,000 requests"),
        ("gc_ms_per_s", "the collector's milliseconds per second of load"),
    ):
        part = rates[rates["metric"] == metric]
        keys = list(dict.fromkeys(zip(part["case"], part["rate"], strict=True)))
        rows = []
        for case, rate in keys:
            at = part[(part["case"] == case) & (part["rate"] == rate)]
            values = dict(zip(at["contender"], at["value"], strict=True))
            rows.append(
                [
                    f"{case} at {rate:,.0f} req/s",
                    *(f"{_figure(values[n])}" if n in values else "behind" for n in names),
                ]
            )
        tables.append(f"{title}:\n\n{_markdown_table(['offered', *names], rows, 1)}")
    held = rates.drop_duplicates(["contender", "case"])
    sustained = ", ".join(
        f"{md_code(row.contender)} {row.sustained:,.0f} req/s ({md_text(row.case)})"
        for row in held.itertuples()
        if math.isfinite(row.sustained)
    )
    note = _kafka_mismatch_note(headline.bench)
    return f"""## Kafka's purgatory benchmark: cost against the offered rate

As Kafka's purgatory proposal measured its timer: each contender held at fixed
request rates (requests with a 200 ms timeout, most completed before it), the process's
CPU per 1,000,000 requests and the time the cyclic garbage collector ran, per second
of load. Lower is better; "behind" means the contender could not hold that rate.
Sustained rates (the search above): {sustained or "none"}.

![Kafka's figures against the offered rate]({KAFKA_PNG})

{tables[0]}

{tables[1]}
{note}"""


def _kafka_mismatch_note(bench: BenchResults) -> str:
    """Where the search sustained a rate its contender then fell behind at in the
    fixed-rate runs: why both can be true, with each run's length."""
    found = kafka_mismatches(bench)
    if not found:
        return ""

    def lasting(seconds: float) -> str:
        return f" for {seconds:g} s" if math.isfinite(seconds) else ""

    said = "\n".join(
        f"- {md_code(m.contender)} ({md_text(m.case)}): held {m.sustained:,.0f} req/s"
        f"{lasting(m.sustain_s)} in its search, fell behind at {m.rate:,.0f} req/s"
        f"{lasting(m.target_s)} in the fixed-rate run ({md_text(m.why)})"
        for m in found
    )
    return f"""
**The search and the fixed rates disagree here:**

{said}

Each is ONE run: the search's confirming probe and the fixed-rate run at that rate, minutes
apart in the same job, with other processes sharing the machine. Behind means arrival
lag, backlog or lateness p99 above 50 ms, so a contender near its limit passes one
run and fails the other: its sustainable rate lies near both, and neither figure is
a bound. A longer, repeated run (`aiowheel bench --report --full`, on a quiet machine)
narrows it.
"""


#: The server section's columns: metric key -> header.
_SERVER_COLUMNS: Final = (
    ("rps", "requests/s"),
    ("cpu_us", "server CPU per request (\u00b5s)"),
    ("p99_ms", "latency p99 (ms)"),
    ("vs_uvicorn", "requests/s against uvicorn's own keep-alive"),
)


def _ranged(median: float, low: float, high: float, rounds: int) -> str:
    """``12,300 (11,900-12,800)``: the median and its min-max over the rounds."""
    if math.isnan(low) or math.isnan(high):
        return f"{_figure(median)} (1 round)" if rounds <= 1 else _figure(median)
    return f"{_figure(median)} ({_figure(low)}-{_figure(high)})"


def _cost(median: float, low: float, high: float, rounds: int) -> str:
    """A fraction of another figure (0.81) as the change it is, in percent (-19%), with
    its range; "no difference measured" when the range holds no change (crosses 1)."""
    said = f"{median - 1:+.0%}"
    if math.isnan(low) or math.isnan(high):
        return f"{said} (1 round)" if rounds <= 1 else said
    span = f"{low - 1:+.0%} to {high - 1:+.0%}"
    if low <= 1 <= high:
        return f"{NO_DIFFERENCE} ({span})"
    return f"{said} ({span})"


def server_cells(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The server's figures (bench_results.server_figures): one row per variant and
    contender, with each figure's median and min-max over the rounds."""
    present = [(key, name) for key, name in _SERVER_COLUMNS if (frame["metric"] == key).any()]
    headers = ["variant", "contender", *(name for _, name in present)]
    rows = []
    keys = dict.fromkeys(zip(frame["variant"], frame["contender"], strict=True))
    for variant, contender in keys:
        part = frame[(frame["variant"] == variant) & (frame["contender"] == contender)]
        cells = [variant, contender]
        for key, _ in present:
            match = part[part["metric"] == key]
            if match.empty:
                cells.append("-")
                continue
            row = match.iloc[0]
            show = _cost if key == "vs_uvicorn" else _ranged
            cells.append(show(row["median"], row["min"], row["max"], int(row["rounds"])))
        rows.append(cells)
    return headers, rows


def _server_section(headline: Headline) -> str:
    """The server workload's own figures, every variant (the idle-timeout middleware's
    included), with their ranges; its figure."""
    if headline.bench is None:
        return ""
    frame = server_figures(headline.bench)
    if frame.empty:
        return ""
    headers, cells = server_cells(frame)
    rounds = int(frame["rounds"].max())
    spread = (
        "ONE round: no range, and such figures move by tens of percent between runs"
        if rounds <= 1
        else f"the median of {rounds} rounds (contenders alternating), min-max in brackets"
    )
    return f"""## The server: uvicorn on each loop, loaded from another process

![The server's requests/s and CPU per request]({SERVER_PNG})

Each figure is {spread}. `protocol` is `aiowheel.middleware.uvicorn_protocol` closing
idle connections instead of uvicorn's own keep-alive timeout, `middleware` the same
with `IdleTimeoutMiddleware` around the app (on the plain loops, where users run
them). Their last column is the change in requests/s against the same loop with
uvicorn's own keep-alive, in the same round: negative is a cost; "{NO_DIFFERENCE}" when
its range holds no change.

{_markdown_table(headers, cells, 2)}
"""


def _drop_in_figures(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Medians: one row per workload variant and metric, one column per contender."""
    # Each plain loop next to the drop-in loop on its base.
    bases = ("asyncio", "uvloop", "rloop")
    names = sorted(
        contender_order([*frame["aiowheel"], *frame["peer"]]),
        key=lambda n: (
            bases.index(n.split("-")[-1]) if n.split("-")[-1] in bases else len(bases),
            n.startswith("loop-"),
        ),
    )
    headers = ["workload", "metric", *names]
    rows = []
    keys = dict.fromkeys(zip(frame["workload"], frame["variant"], frame["metric"], strict=True))
    for workload, variant, metric in keys:
        part = frame[
            (frame["workload"] == workload)
            & (frame["variant"] == variant)
            & (frame["metric"] == metric)
        ]
        values: dict[str, float] = {}
        for row in part.itertuples():
            values[row.peer] = row.peer_median
            values[row.aiowheel] = row.aiowheel_median
        first = part.iloc[0]
        unit = first["unit"] if isinstance(first["unit"], str) else ""
        cells = [f"{workload} {variant}".strip(), metric_name(first)]
        for name in names:
            value = values.get(name, math.nan)
            cells.append("-" if math.isnan(value) else f"{_figure(value)} {unit}".strip())
        rows.append(cells)
    return headers, rows


def _figure(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


#: Per-second figures of runs shorter than this are left out of report.md (1-3 points
#: per line, contenders hidden under each other, say nothing a reader can use).
MIN_SECONDS_PER_FIGURE: Final = 5


def _same_repetition_note(headline: Headline) -> str:
    if headline.ratios is None or headline.ratios.empty:
        return ""
    return """
The traces come from one extra repetition per contender and workload, run after the
measured ones and not measured itself (recording every timer costs time). The tables
below are therefore from another repetition than the headline's medians: a figure in
both (a lateness percentile, say) can differ between them; the headline's is the one
to compare contenders by, the traces show the shape of one run.
"""


#: What each contender is, for the report's readers.
CONTENDER_NOTES: Final = {
    "aiowheel-asyncio": "`aiowheel.Timer` on the default asyncio loop",
    "aiowheel-uvloop": "`aiowheel.Timer` on uvloop",
    "aiowheel-trio": "`aiowheel.Timer` on trio (through anyio)",
    "call_later-asyncio": "`loop.call_later`/`call_at` on asyncio (a heap of TimerHandles)",
    "call_later-uvloop": "`loop.call_later`/`call_at` on uvloop (libuv's timer heap)",
    "trio-native": (
        "trio's own deadlines: a task per timer sleeping in a `CancelScope` whose "
        "deadline is the timer's"
    ),
    "deadline-asyncio": (
        "the idle workload only: aiohttp's way with idle timeouts, a stored deadline per "
        "connection and one `loop.call_at` per connection that re-checks it when it fires"
    ),
    "deadline-uvloop": "`deadline-asyncio`'s way on uvloop",
}


def _legend_section(summary: pd.DataFrame) -> str:
    """Every contender and every line style in the figures, explained."""
    names = contender_order(summary["contender"])
    lines = [
        f"- {md_code(name)}: {CONTENDER_NOTES.get(name, 'named by its trace')}" for name in names
    ]
    labels = sorted({label for label in summary["label"] if isinstance(label, str)})
    style = (
        "Line style is the timers' *label*: timers without one are drawn solid, each "
        "label in its own dash pattern (named in each figure's legend). "
    )
    if labels:
        style += "Labels here: " + ", ".join(md_code(label) for label in labels) + "."
        if "bench" in labels:
            style += (
                " `bench` is the name of the kafka workload's `Purgatory` (aiowheel "
                "labels a purgatory's timers with its name), so aiowheel's kafka lines "
                "are dashed: it is the same kind of timer as elsewhere."
            )
    else:
        style += "No timer here has a label, so every line is solid."
    return "\n### Contenders and line styles\n\n" + "\n".join(lines) + f"\n\n{style}\n"


def _impossible_note(summary: pd.DataFrame) -> str:
    if "impossible" not in summary or not summary["impossible"].fillna(0).sum():
        return ""
    bad = summary[summary["impossible"].fillna(0) > 0]
    said = ", ".join(
        f"{int(row.impossible):,} of {md_text(row.contender)} in {md_text(row.workload)}"
        for row in bad.itertuples()
    )
    return f"""
**Impossible rows left out**: {said}. These timers ended before they were
scheduled, or fired more than {IMPOSSIBLY_EARLY_S * 1000:g} ms before their deadline,
which no event loop does: a recording bug in what wrote the trace. They are counted
in `impossible` in `{SUMMARY_CSV}` and left out of every lateness figure.
"""


def _early_lines(summary: pd.DataFrame) -> str:
    if "early" not in summary:
        return ""
    early = summary.groupby(["workload", "contender"], sort=False)[["early", "fired"]].sum()
    said = [
        f"{md_text(contender)} in {md_text(workload)}: {int(row.early):,} of {int(row.fired):,} "
        f"({100 * row.early / row.fired:.1f}%)"
        for (workload, contender), row in early.iterrows()
        if row.early and row.fired
    ]
    if not said:
        return "No timer fired early.\n"
    return "Fired early: " + "; ".join(said) + ".\n"


def per_second_figures(longest_run_s: int | None, typical_run_s: int | None) -> bool:
    """Whether the per-second figures are drawn: not when the typical traced run is
    shorter than MIN_SECONDS_PER_FIGURE (issue 32: 1-2 points per line, empty
    panels)."""
    typical = typical_run_s if typical_run_s is not None else longest_run_s
    return typical is None or typical >= MIN_SECONDS_PER_FIGURE


def _per_second_sections(longest_run_s: int | None, typical_run_s: int | None) -> str:
    typical = typical_run_s if typical_run_s is not None else longest_run_s
    if typical is not None and not per_second_figures(longest_run_s, typical_run_s):
        if longest_run_s is not None and longest_run_s > typical:
            lasted = (
                f"half the traced runs lasted {typical} s or less (the longest "
                f"{longest_run_s} s, a contender slow enough to stretch its run)"
            )
        else:
            lasted = f"the longest traced run lasted {typical} s"
        return f"""### Per-second figures

Not drawn: {lasted}, so most per-second lines would have 1-{typical} point(s),
and contenders would hide under each other (`{P99_PNG}` and `{RATES_PNG}` are not
written). The counts are in `{WINDOWS_PARQUET}`; runs of {MIN_SECONDS_PER_FIGURE} s or
more (`aiowheel bench --report --full`) draw them here.
"""
    return f"""### Lateness p99 over time

![Lateness p99 per second]({P99_PNG})

The p99 lateness of the timers that fired in each second. Spikes line up with loop
stalls (a slow callback, a GC pause, a burst of expiries).

### Timers fired and cancelled per second

![Fired and cancelled per second]({RATES_PNG})

A timeout that is cancelled before it fires (the usual fate of an idle or request
timeout) shows up on the right; the cancel ratio is in the summary.
"""


def dropped_section(files: TraceFiles) -> str:
    """The top of report.md: how many trace rows were dropped, per run, and what that
    does to each figure. A trace is never silently incomplete."""
    known = [c for c in files.completeness if c.dropped is not None]
    dropped = sum(c.dropped or 0 for c in known)
    unknown = len(files.completeness) - len(known) + len(files.remote)
    lines = completeness_lines(files, code=md_code)
    if files.remote:
        lines.append(
            f"{len(files.remote)} remote path(s) read by Spark: not checked for dropped rows"
        )
    if not dropped and not unknown:
        return (
            f"**Complete traces:** no rows were dropped in any of the "
            f"{len(files.completeness)} run(s): every timer of every run is counted.\n"
        )
    listed = "\n".join(f"- {line}" for line in lines)
    head = (
        f"**Incomplete traces: {dropped:,} rows were dropped** (the recorder's writer could "
        "not keep up, so it dropped whole batches of rows rather than slow the timer down)"
        if dropped
        else "**Traces that may be incomplete:** some do not say whether rows were dropped"
    )
    return f"""{head}.

{listed}

What that does to each figure of the affected runs:

- **timers, fired, cancelled, and the per-second counts and rates** are lower bounds:
  the dropped timers are missing from them (by at most the counts above, in the
  seconds where the writer fell behind);
- **lateness percentiles, the lateness CDF and the lifetimes** are computed from the
  rows kept only. A dropped batch is a run of consecutive ends at a moment the writer
  fell behind, usually the busiest one, so the tail (p99, max) may be understated;
- **the headline** (ratios from the bench's own measurements, not from the traces) is
  not affected.
"""


def sampled_section(files: TraceFiles) -> str:
    """Under the dropped rows, at the top of report.md: which runs are sampled traces
    (``ParquetRecorder(path, every=k)``), at what rate, and what that does to each
    figure; empty when every trace keeps every timer."""
    lines = sampling_lines(files, code=md_code)
    if not lines:
        return ""
    listed = "\n".join(f"- {line}" for line in lines)
    return f"""**Sampled traces:** {len(lines)} run(s) traced one timer in k, not every timer.

{listed}

What that does to each figure of those runs:

- **timers, fired, cancelled, and the per-second counts and rates** are those of the
  sample: about 1/k of the run's (multiply by k for the run's own);
- **lateness percentiles, the lateness CDF and the lifetimes** are those of the
  sampled timers, an estimate of the run's (every k-th timer scheduled, so a tail
  made of a few timers may be missed);
- **the headline** (from the bench's own measurements) is not affected.
"""


def render_markdown(
    summary: pd.DataFrame,
    files: TraceFiles,
    rows: int,
    master: str,
    version: str,
    headline: Headline,
    longest_run_s: int | None = None,
    typical_run_s: int | None = None,
    out: Path | None = None,
) -> str:
    """report.md: the headline (figure and ratio table), then the trace analysis.

    ``longest_run_s`` and ``typical_run_s``: seconds of the longest and of the median
    traced run. When the median run is shorter than MIN_SECONDS_PER_FIGURE (the
    longest one, if the median is not given), the per-second figures are not shown
    (most lines would have 1-3 points; one slow contender's long run does not make
    the others' lines readable), and report.md says so.

    ``out``: the report's directory; local paths are written relative to it (a
    report.md moved with its traces, or published, names no directory of the machine
    that wrote it)."""
    headers, cells = summary_cells(summary)
    table = _markdown_table(headers, cells, headers.index(_FIRST_NUMBER))
    paths = files.paths
    shown = "\n".join(f"- {md_code(_shown_path(p, out))}" for p in paths[:20])
    if len(paths) > 20:
        shown += f"\n- ... and {len(paths) - 20} more"
    return f"""# aiowheel timer report

{dropped_section(files)}
{sampled_section(files)}
{_headline_section(headline, out)}
{_drop_in_section(headline, out)}
{_server_section(headline)}
{_kafka_section(headline)}
## The traces

{rows:,} timers from {len(paths)} trace file(s), analysed with Spark {version} ({master}).
Each figure has one panel per workload, and each contender has the same colour in
every panel and every figure.
{_same_repetition_note(headline)}
{_legend_section(summary)}{_impossible_note(summary)}
### Summary

Lateness is `fired_at - deadline` of fired timers, in milliseconds; percentiles are
nearest-rank. The full table, with lifetimes (end minus schedule time), is in
`{SUMMARY_CSV}` and `{SUMMARY_PARQUET}`; per-second counts are in `{WINDOWS_PARQUET}`.

{table}

### Lateness distribution

![Lateness CDF per workload]({CDF_PNG})

Left: the fraction of fired timers at most that late, on a symmetric logarithmic
scale: timers that fired *early* are left of 0 (linear within 10 \u00b5s of it), and
each panel says how many fired early, per contender. A curve closer to 0 is better; a
long flat top means a few timers were very late. Right: the tail (1 - CDF, both axes
logarithmic; early and on-time firings sit at 1 \u00b5s there): where a curve crosses
1e-2 is its p99, 1e-3 its p99.9, so the tails compare directly.

{_early_lines(summary)}
{_per_second_sections(longest_run_s, typical_run_s)}
### Inputs

{shown}
"""
