"""The report's PNG figures, drawn from the collected aggregates (matplotlib, Agg).

Every figure is small multiples: one panel per workload (``workload`` column, see
``schema.workload_names``), each contender in the same colour in every panel and
every figure (``CONTENDER_COLOURS``), so aiowheel and a peer are compared within one
panel and a contender is found at a glance across panels.

Figures are built with ``matplotlib.figure.Figure`` directly, not pyplot: no global
figure state, no GUI backend, nothing to close.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .schema import CDF_QUANTILES, SINGLE_REPETITION, SINGLE_SEARCH, contender_order, visible

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "CONTENDER_COLOURS",
    "MAX_PANELS",
    "contender_colour",
    "metric_name",
    "plot_headline",
    "plot_kafka_rates",
    "plot_lateness_cdf",
    "plot_lateness_p99",
    "plot_rates",
    "plot_server",
    "times",
]

#: One colour per contender (schema.CONTENDERS), in every figure. aiowheel's contenders are the cool
#: colours, the peers warm ones, so "ours" and "theirs" read apart before the legend.
CONTENDER_COLOURS: Final = {
    "aiowheel-asyncio": "#1f77b4",  # blue
    "aiowheel-uvloop": "#17becf",  # cyan
    "aiowheel-trio": "#2ca02c",  # green
    "call_later-asyncio": "#ff7f0e",  # orange
    "call_later-uvloop": "#d62728",  # red
    "trio-native": "#8c564b",  # brown
    "deadline-asyncio": "#e377c2",  # pink
    "deadline-uvloop": "#9467bd",  # purple
    "loop-asyncio": "#08306b",  # navy: the drop-in loop
    "loop-uvloop": "#6baed6",  # light blue
    "call_later-rloop": "#a50f15",  # dark red
}
#: For contenders not in the table: picked by a stable hash of the name (not Python's
#: salted ``hash``), so a name has the same colour in every figure and every run.
_FALLBACK_COLOURS: Final = (
    "#7f7f7f",
    "#bcbd22",
    "#393b79",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#637939",
    "#3182bd",
)
#: More panels than this make a figure unreadable: the busiest workloads are drawn
#: and the others named under the figure.
MAX_PANELS: Final = 12
#: Lateness below this (1 us) is drawn at it: a log axis has no zero, and a virtual
#: clock (looptime, trio's MockClock) fires exactly on time.
_FLOOR_MS: Final = 1e-3
_DPI: Final = 110
_WIDTH: Final = 10.0
_LINESTYLES: Final[tuple[Any, ...]] = ("-", "--", ":", "-.")
_NOTE: Final = {"fontsize": 8, "color": "0.35"}
#: Characters a line of a figure's footnote holds at its width.
_NOTE_WIDTH: Final = 150
#: A peer's reason for having no bar is written beside its row up to this length;
#: a longer one goes under the figure, once (_footnote).
_REASON_BESIDE: Final = 40


def contender_colour(name: str) -> str:
    """The contender's colour: fixed for the known ones, a stable pick for others."""
    known = CONTENDER_COLOURS.get(name)
    if known is not None:
        return known
    return _FALLBACK_COLOURS[zlib.crc32(name.encode()) % len(_FALLBACK_COLOURS)]


# -- shared pieces -------------------------------------------------------------------


def plain(text: Any) -> str:
    """Text from the data (a label, a workload or contender name) as matplotlib shows
    it as it is: on one line, and no ``$...$`` read as mathtext (which draws it as a
    formula, or fails the figure on a bad one)."""
    return visible(str(text)).replace("$", "\\$")


def _figure(rows: int, cols: int, row_height: float, *, sharex: bool = False) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(_WIDTH, 1.3 + row_height * rows), dpi=_DPI, layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False, sharex="col" if sharex else False)
    return figure, axes


def _panels(frame: pd.DataFrame, weight: str) -> tuple[list[str], list[str]]:
    """Workloads to draw (by name) and those left out (more than MAX_PANELS)."""
    totals = frame.groupby("workload", sort=True)[weight].sum()
    busiest = set(totals.sort_values(ascending=False, kind="stable").index[:MAX_PANELS])
    drawn = [w for w in totals.index if w in busiest]
    return drawn, [w for w in totals.index if w not in busiest]


def _styles(labels: Iterable[Any]) -> dict[Any, Any]:
    """label -> line style: unlabelled timers solid, then the labels in name order."""
    values = {_label(label) for label in labels}
    named = sorted(label for label in values if label is not None)
    first = 1 if None in values else 0  # solid is taken by "no label"
    styles: dict[Any, Any] = {None: "-"}
    for i, label in enumerate(named):
        styles[label] = _LINESTYLES[(first + i) % len(_LINESTYLES)]
    return styles


def _label(value: Any) -> str | None:
    return value if isinstance(value, str) else None  # None, NaN: no label


def _style_of(styles: dict[Any, Any], label: Any) -> Any:
    return styles[_label(label)]


def _legend(
    figure: Figure, title: str, contenders: Iterable[str], labels: Sequence[Any] = ()
) -> None:
    """The figure's title, and under it one legend for all panels: contenders by
    colour, and the timers' labels by line style when there is more than one.

    The title is the legend's (a suptitle and a legend outside the axes overlap under
    the constrained layout)."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=contender_colour(name), linewidth=2.5, label=plain(name))
        for name in contender_order(contenders)
    ]
    kinds = {_label(label) for label in labels}
    if len(kinds) > 1:
        styles = _styles(kinds)
        for label in sorted(kinds, key=lambda v: (v is not None, v or "")):
            text = f"label {plain(label)}" if label is not None else "no label"
            handles.append(
                Line2D([], [], color="0.2", linestyle=_style_of(styles, label), label=text)
            )
    if not handles:
        figure.suptitle(title, fontsize=11)
        return
    figure.legend(
        handles=handles,
        loc="outside upper center",
        ncols=min(len(handles), 4),
        fontsize=8.5,
        frameon=False,
        title=title,
        title_fontproperties={"size": 11},
    )


def _footnote(
    figure: Figure, left_out: dict[str, str], peers_left_out: dict[str, str] | None = None
) -> None:
    """Name the workloads a figure does not show, and why, under it; and the peers a
    panel names without a bar (``peers_left_out``: peer -> why), each reason once,
    wrapped to the figure's width (a reason drawn beside each bar ran off the figure
    and pushed the metric names out of it)."""
    lines: list[str] = []
    reasons: dict[str, list[str]] = {}
    for workload, reason in left_out.items():
        reasons.setdefault(reason, []).append(workload)
    lines.extend(f"not shown ({why}): {', '.join(names)}" for why, names in reasons.items())
    lines.extend(f"{peer}: {why}" for peer, why in (peers_left_out or {}).items())
    if not lines:
        return
    wrapped = "\n".join(textwrap.fill(plain(line), _NOTE_WIDTH) for line in lines)
    figure.supxlabel(wrapped, ha="left", x=0.01, **_NOTE)


def _nothing_to_show(left_out: dict[str, str]) -> str:
    reasons = sorted(set(left_out.values())) or ["no timer fired"]
    return f"no lateness to show: {'; '.join(reasons)}"


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center", color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _zorder(contender: str) -> float:
    """aiowheel's lines on top of the peers' where they overlap."""
    return 2.5 if contender.startswith("aiowheel-") else 2.0


def _save(figure: Figure, path: Path) -> Figure:
    figure.savefig(path)
    return figure


# -- headline ------------------------------------------------------------------------


#: The headline figures' axis ends here (and at its inverse): a ratio beyond it (trio's
#: 771x on idle) is drawn to the edge, marked, with its value, rather than setting an
#: axis that flattens every other bar.
RATIO_AXIS_LIMIT: Final = 100.0


def plot_headline(
    headline: pd.DataFrame,
    path: Path,
    subtitle: str = "",
    *,
    ours: str = "aiowheel",
    theirs: str = "the peer",
    title: str = (
        "aiowheel against each peer, per workload (each peer against aiowheel on its backend)"
    ),
) -> Figure:
    """``ours`` against each peer, one panel per workload variant: how many times
    better ``ours`` is (log scale; bars start at the 1x line, right = ours better).

    A variant with no ratio at all (every peer skipped) gets no panel: it is named
    under the figure. A ratio past RATIO_AXIS_LIMIT is drawn to the axis's edge with
    an arrow and its value; one whose min-max range crosses 1x is drawn grey, "no
    difference measured"."""
    every = list(dict.fromkeys(zip(headline["workload"], headline["variant"], strict=True)))
    groups = [
        (w, v)
        for w, v in every
        if headline[(headline.workload == w) & (headline.variant == v)]["ratio"].notna().any()
    ]
    empty = [f"{w} ({v})" if v else w for w, v in every if (w, v) not in groups]
    shown = headline[
        [(w, v) in groups for w, v in zip(headline["workload"], headline["variant"], strict=True)]
    ]
    peers = contender_order(shown["peer"])
    finite = shown["ratio"].dropna()
    low = min(1.0, float(finite.min())) if len(finite) else 1.0
    high = max(1.0, float(finite.max())) if len(finite) else 1.0
    low, high = max(low, 1 / RATIO_AXIS_LIMIT), min(high, RATIO_AXIS_LIMIT)
    # Room on both sides for the value printed at each bar's end.
    limits = (min(low / 3.0, 0.25), max(high * 3.0, 4.0))
    sizes = [len(shown[(shown.workload == w) & (shown.variant == v)]) for w, v in groups]
    from matplotlib.figure import Figure

    height = 1.4 + sum(0.6 + 0.19 * n for n in sizes)
    figure = Figure(figsize=(_WIDTH, height), dpi=_DPI, layout="constrained")
    if not groups:
        ax = figure.subplots()
        _empty(ax, "the bench's results have no ratios to show")
        return _save(figure, path)
    axes = figure.subplots(
        len(groups), 1, squeeze=False, sharex=True, height_ratios=[0.6 + 0.19 * n for n in sizes]
    )[:, 0]
    peers_left_out: dict[str, str] = {}
    for ax, (workload, variant) in zip(axes, groups, strict=True):
        part = shown[(shown.workload == workload) & (shown.variant == variant)]
        _headline_panel(ax, part, peers, limits, peers_left_out)
        name = f"{workload} ({variant})" if variant else workload
        if (part["note"] == SINGLE_SEARCH).any():
            name += ": ONE search per contender, not a median"
        ax.set_title(plain(name), loc="left", fontsize=10)
    axes[-1].set_xlabel(
        f"how many times better {ours} is than {theirs} on its base (log scale)", fontsize=9
    )
    top = axes[0]
    # The first panel's title goes above the "who is better" labels, not through them.
    top.set_title(top.get_title(loc="left"), loc="left", fontsize=10, pad=16)
    for text, align in (
        (f"\u2190 {theirs} is better  ", "right"),
        (f"  {ours} is better \u2192", "left"),
    ):
        top.annotate(
            text,
            xy=(1.0, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 3),
            textcoords="offset points",
            ha=align,
            va="bottom",
            fontsize=8.5,
            color="0.3",
        )
    _footnote(figure, dict.fromkeys(empty, "no ratio: every peer skipped"), peers_left_out)
    _legend(figure, f"{title}\n{subtitle}" if subtitle else title, peers)
    return _save(figure, path)


def _headline_panel(
    ax: Axes,
    part: pd.DataFrame,
    peers: Sequence[str],
    limits: tuple[float, float],
    left_out: dict[str, str],
) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    metrics = list(dict.fromkeys(part["metric"]))
    ticks: list[float] = []
    names: list[str] = []
    y = 0.0
    for metric in metrics:
        rows = part[part["metric"] == metric]
        present = [p for p in peers if p in set(rows["peer"])]
        start = y
        for peer in present:
            row = rows[rows["peer"] == peer].iloc[0]
            ratio = float(row["ratio"])
            colour = contender_colour(peer)
            if math.isnan(ratio):
                why = str(row["note"] or "no ratio")
                if len(why) > _REASON_BESIDE:
                    left_out.setdefault(peer, why)
                    why = "no bar (why: under the figure)"
                ax.text(
                    1.0,
                    y,
                    f"  {plain(peer)}: {plain(why)}",
                    va="center",
                    ha="left",
                    fontsize=7,
                    color=colour,
                )
                y += 1.0
                continue
            same = bool(row.get("no_difference", False))
            # Past the axis: drawn to its edge, with an arrow and the value.
            drawn = min(max(ratio, limits[0] * 1.5), limits[1] / 1.5)
            clipped = drawn != ratio
            ax.barh(
                y,
                drawn - 1.0,
                left=1.0,
                height=0.8,
                color="0.75" if same else colour,
                edgecolor=colour,
                hatch="//" if same else None,
            )
            better = ratio >= 1.0
            # One search (kafka) or one repetition: said on the bar (issue 32).
            single = row["note"] in (SINGLE_REPETITION, SINGLE_SEARCH)
            text = f"{times(ratio)} ({row['note']})" if single else times(ratio)
            if same:
                text = f"{text}: no difference measured (ranges overlap)"
            if clipped:
                arrow = "\u25b6" if better else "\u25c0"
                text = f"{arrow} {text}, off the axis"
            ax.text(
                drawn,
                y,
                f" {text} ",
                va="center",
                ha="left" if better else "right",
                fontsize=7.5,
            )
            y += 1.0
        first = rows.iloc[0]
        ticks.append((start + y - 1.0) / 2.0)
        names.append(metric_name(first))
        y += 0.6  # a gap between metrics
    ax.set_xscale("log")
    ax.set_xlim(*limits)
    # A narrow range gets 2x and 5x ticks too: 1x alone says nothing.
    decades = math.log10(limits[1] / limits[0])
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 3 else (1.0,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: times(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="0.1", linewidth=1.2)
    ax.set_yticks(ticks, [plain(name) for name in names], fontsize=8)
    ax.set_ylim(y - 0.3, -0.9)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.tick_params(axis="y", length=0)


def metric_name(row: Any) -> str:
    """``lateness p99 (ms, lower is better)``; without a unit when there is none."""
    unit = f"{row['unit']}, " if row["unit"] else ""
    return f"{row['label']} ({unit}{row['better']} is better)"


def times(ratio: float) -> str:
    """A ratio as the report prints it, to 2 significant digits (what runs that move
    by tens of percent support): 2.3, 0.45, 75, 2,500, each with a times sign."""
    if math.isnan(ratio):
        return "-"
    if ratio >= 100:
        return f"{float(f'{ratio:.2g}'):,.0f}\u00d7"
    if ratio >= 10:
        return f"{ratio:.0f}\u00d7"
    if ratio >= 0.01:
        return f"{ratio:.2g}\u00d7"
    return f"{ratio:.1g}\u00d7"


# -- lateness distribution ---------------------------------------------------------------


def _cdf_points(values: Any, floor: float | None = None) -> list[tuple[float, float]]:
    """(lateness ms, quantile) pairs with a finite lateness; none when the job found no
    lateness (all null or NaN). Early firings keep their sign unless ``floor`` lifts
    them to it (the tail panel: 1 - CDF is about the late side, on a log axis)."""
    if values is None or len(values) != len(CDF_QUANTILES):
        return []
    points = []
    for value, q in zip(values, CDF_QUANTILES, strict=True):
        if value is None:
            continue
        ms = float(value) * 1000.0
        if math.isfinite(ms):
            points.append((ms if floor is None else max(ms, floor), q))
    return points


def _count_of(row: Any, column: str) -> int:
    value = getattr(row, column, 0)
    return 0 if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def _early_note(part: pd.DataFrame) -> str:
    """Per contender, how many of its fired timers fired early, for the panel's caption."""
    counts: dict[str, list[int]] = {}
    for row in part.itertuples():
        early, fired = counts.setdefault(row.contender, [0, 0])
        counts[row.contender] = [early + _count_of(row, "early"), fired + int(row.fired)]
    said = [
        f"{plain(name)} {early:,} of {fired:,} ({100 * early / fired:.1f}%)"
        for name, (early, fired) in counts.items()
        if early and fired
    ]
    return "fired early:\n" + ("\n".join(said) if said else "none")


def plot_lateness_cdf(summary: pd.DataFrame, path: Path) -> Figure:
    """Per workload: the lateness CDF of each contender (log x) and its tail (1 - CDF,
    log-log)."""
    workloads, hidden = _panels(summary, "fired")
    left_out = dict.fromkeys(hidden, "more than a figure holds")
    drawable: list[tuple[str, pd.DataFrame]] = []
    for workload in workloads:
        part = summary[(summary["workload"] == workload) & (summary["fired"] > 0)]
        if part.empty:
            left_out[workload] = "no timer fired"
        elif not any(_cdf_points(v) for v in part["lateness_cdf"]):
            left_out[workload] = "no lateness recorded"
        else:
            drawable.append((workload, part))
    figure, axes = _figure(max(1, len(drawable)), 2, 2.5)
    if not drawable:
        _empty(axes[0][0], _nothing_to_show(left_out))
        _empty(axes[0][1], _nothing_to_show(left_out))
    styles = _styles(summary["label"])
    for (cdf_ax, tail_ax), (workload, part) in zip(axes, drawable, strict=False):
        lowest, highest = math.inf, 0.0
        earliest = 0.0
        for row in part.itertuples():
            signed = _cdf_points(row.lateness_cdf)
            points = _cdf_points(row.lateness_cdf, _FLOOR_MS)
            if not points:
                continue
            style = {
                "color": contender_colour(row.contender),
                "zorder": _zorder(row.contender),
                "linestyle": _style_of(styles, row.label),
                "linewidth": 1.5,
            }
            xs = [x for x, _ in points]
            lowest, highest = min(lowest, min(xs)), max(highest, max(xs))
            earliest = min(earliest, min(x for x, _ in signed))
            # Early firings on their own side of zero (symmetric log scale), never
            # drawn as the most punctual.
            cdf_ax.plot([x for x, _ in signed], [q for _, q in signed], **style)
            # 1 - q below 1/fired says nothing: no sample that rare was seen.
            rarest = 1.0 / row.fired
            tail = [(x, 1.0 - q) for x, q in points if 1.0 - q >= rarest]
            tail_ax.plot([x for x, _ in tail], [t for _, t in tail], **style)
        tail_ax.set_xscale("log")
        tail_ax.set_xlim(lowest / 1.5, highest * 1.5)
        cdf_ax.set_xscale("symlog", linthresh=_FLOOR_MS * 10)
        left = earliest * 1.5 if earliest < 0 else 0.0
        cdf_ax.set_xlim(left, highest * 1.5)
        _symlog_ticks(cdf_ax, left, highest * 1.5)
        for ax in (cdf_ax, tail_ax):
            ax.grid(True, which="both", alpha=0.25)
        # Above the panel, right of its title: inside, it would cover the curves.
        cdf_ax.set_title(_early_note(part), loc="right", fontsize=7, color="0.25")
        cdf_ax.set_ylim(0, 1.02)
        cdf_ax.set_ylabel("fraction fired\nat most this late", fontsize=8)
        cdf_ax.set_title(f"{plain(workload)}: lateness CDF", loc="left", fontsize=10)
        tail_ax.set_yscale("log")
        tail_ax.set_ylabel("fraction later\n(1 - CDF)", fontsize=8)
        tail_ax.set_title(f"{plain(workload)}: tail (p99 at 1e-2)", loc="left", fontsize=10)
    if drawable:
        axes[-1][0].set_xlabel(
            "lateness, ms (symmetric log: early firings left of 0, linear within \u00b110 \u00b5s)",
            fontsize=9,
        )
        axes[-1][1].set_xlabel(
            "lateness, ms (log; early or on time drawn at 1 \u00b5s)", fontsize=9
        )
    # The legend names what the panels draw: the rows of workloads left out (no timer
    # fired, more than a figure holds) do not add a contender or a line style.
    drawn = [part for _, part in drawable]
    _legend(
        figure,
        "How late timers fired, per workload (closer to 0 is better; left of 0: fired early)",
        [name for part in drawn for name in part["contender"]],
        [label for part in drawn for label in part["label"]],
    )
    _footnote(figure, left_out)
    return _save(figure, path)


def _symlog_ticks(ax: Axes, left: float, right: float) -> None:
    """Ticks of a symmetric-log lateness axis that do not collide: 0, the decades from
    10 us up on the late side, and on the early side only the decade nearest its end
    (its span is a sliver: several labels there overlapped, issue 32)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    floor = _FLOOR_MS * 10
    ticks = [0.0]
    decade = floor
    while decade <= right:
        ticks.append(decade)
        decade *= 10
    if left < 0:
        ticks.insert(0, -max(floor, 10 ** math.floor(math.log10(-left))))
    # On the late side too, every other decade when there are many (narrow panels).
    late = ticks[1 + (left < 0) :]
    if len(late) > 6:
        ticks = [t for t in ticks if t <= 0] + late[::2]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: "0" if x == 0 else f"{x:g}"))


def plot_lateness_p99(windows: pd.DataFrame, path: Path) -> Figure:
    """Per workload: the p99 lateness of the timers fired in each second, per run."""
    workloads, hidden = _panels(windows, "fired")
    left_out = dict.fromkeys(hidden, "more than a figure holds")
    drawable: list[tuple[str, pd.DataFrame]] = []
    for workload in workloads:
        part = windows[windows["workload"] == workload].dropna(subset=["lateness_p99_ms"])
        if part.empty:
            left_out[workload] = (
                "no timer fired" if not _fired(windows, workload) else ("no lateness recorded")
            )
        else:
            drawable.append((workload, part))
    cols = 2 if len(drawable) > 1 else 1
    rows = max(1, math.ceil(len(drawable) / cols))
    figure, grid = _figure(rows, cols, 2.6)
    axes = [ax for row in grid for ax in row]
    if not drawable:
        _empty(axes[0], _nothing_to_show(left_out))
    for ax in axes[len(drawable) :]:
        if drawable:
            ax.set_visible(False)
    for ax, (workload, part) in zip(axes, drawable, strict=False):
        ys_all = part["lateness_p99_ms"].clip(lower=_FLOOR_MS)
        every_second = windows[windows["workload"] == workload]
        for _, run in every_second.groupby("run_id", sort=True):
            run = run.sort_values("elapsed_s")
            # Seconds in which nothing fired have no p99 (NaN): the line breaks there
            # rather than joining the seconds around them.
            ax.plot(
                run["elapsed_s"],
                run["lateness_p99_ms"].clip(lower=_FLOOR_MS),
                color=contender_colour(run["contender"].iloc[0]),
                zorder=_zorder(run["contender"].iloc[0]),
                linewidth=1.3,
                marker="o",
                markersize=3.5,
            )
        if float(ys_all.max()) > 20 * float(ys_all.min()):
            ax.set_yscale("log")
        ax.set_title(plain(workload), loc="left", fontsize=10)
        ax.set_xlabel("seconds since the run started", fontsize=8)
        ax.set_ylabel("lateness p99, ms", fontsize=8)
        ax.grid(True, which="both", alpha=0.25)
    _legend(
        figure,
        "Lateness p99 of the timers fired in each second, per workload",
        windows["contender"] if drawable else [],
    )
    _footnote(figure, left_out)
    return _save(figure, path)


def _fired(windows: pd.DataFrame, workload: str) -> bool:
    return bool(windows.loc[windows["workload"] == workload, "fired"].sum() > 0)


def plot_rates(windows: pd.DataFrame, path: Path) -> Figure:
    """Per workload: timers fired (left) and cancelled (right) per second, per run."""
    windows = windows.assign(ended=windows["fired"] + windows["cancelled"])
    workloads, hidden = _panels(windows, "ended")
    left_out = dict.fromkeys(hidden, "more than a figure holds")
    figure, axes = _figure(max(1, len(workloads)), 2, 2.2)
    if not workloads:
        _empty(axes[0][0], "no timers")
        _empty(axes[0][1], "no timers")
    for (fired_ax, cancelled_ax), workload in zip(axes, workloads, strict=False):
        part = windows[windows["workload"] == workload]
        for column, ax in (("fired", fired_ax), ("cancelled", cancelled_ax)):
            ax.set_title(f"{plain(workload)}: {column} per second", loc="left", fontsize=10)
            if part[column].sum() == 0:
                _empty(ax, f"no timer {column}")
                continue
            for _, run in part.groupby("run_id", sort=True):
                run = run.sort_values("elapsed_s")
                # Each count covers its whole second: the last one too, up to s + 1.
                xs = [*run["elapsed_s"], int(run["elapsed_s"].iloc[-1]) + 1]
                ys = [*run[column], run[column].iloc[-1]]
                ax.plot(
                    xs,
                    ys,
                    color=contender_colour(run["contender"].iloc[0]),
                    zorder=_zorder(run["contender"].iloc[0]),
                    linewidth=1.4,
                    drawstyle="steps-post",
                )
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.25)
            ax.yaxis.set_major_formatter(_count_formatter())
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the run started", fontsize=8)
    _legend(figure, "Timers fired and cancelled per second, per workload", windows["contender"])
    _footnote(figure, left_out)
    return _save(figure, path)


# -- the server ----------------------------------------------------------------------

#: The server figure's panels: metric key -> title.
_SERVER_PANELS: Final = (
    ("rps", "requests/s (higher is better)"),
    ("cpu_us", "server CPU per request, \u00b5s (lower is better)"),
)


def plot_server(frame: pd.DataFrame, path: Path, subtitle: str = "") -> Figure:
    """The server workload's requests/s and CPU per request (``bench_results.
    server_figures``' frame): one bar per variant and contender at the median, a
    whisker over the min-max of its rounds (none with one round). Only the panels
    with figures are drawn."""
    panels = [(key, what) for key, what in _SERVER_PANELS if (frame["metric"] == key).any()]
    drawn = frame[frame["metric"].isin([key for key, _ in panels])]
    keys = list(dict.fromkeys(zip(drawn["variant"], drawn["contender"], strict=True)))
    from matplotlib.figure import Figure

    height = 1.6 + 0.24 * max(len(keys), 1)
    figure = Figure(figsize=(_WIDTH, height), dpi=_DPI, layout="constrained")
    if not panels:
        _empty(figure.subplots(), "the bench measured no server figure")
        return _save(figure, path)
    axes = figure.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    positions = {
        key: i + 0.6 * list(dict.fromkeys(v for v, _ in keys)).index(key[0])
        for i, key in enumerate(keys)
    }
    for ax, (metric, what) in zip(axes, panels, strict=True):
        part = frame[frame["metric"] == metric]
        for row in part.itertuples():
            y = positions[(row.variant, row.contender)]
            colour = contender_colour(row.contender)
            ax.barh(y, row.median, height=0.75, color=colour)
            if math.isfinite(row.min) and math.isfinite(row.max):
                ax.errorbar(
                    row.median,
                    y,
                    xerr=[[row.median - row.min], [row.max - row.median]],
                    color="0.15",
                    capsize=3,
                    linewidth=1.0,
                )
        ax.set_title(what, loc="left", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlim(left=0)
        ax.xaxis.set_major_formatter(_count_formatter())
    names = [plain(f"{variant}: {contender}") for variant, contender in keys]
    axes[0].set_yticks([positions[key] for key in keys], names, fontsize=8)
    axes[0].invert_yaxis()
    title = "The server: uvicorn on each loop (bar: median; whisker: min-max over the rounds)"
    _legend(figure, f"{title}\n{subtitle}" if subtitle else title, frame["contender"])
    return _save(figure, path)


# -- kafka's figures against the offered rate ---------------------------------------


def plot_kafka_rates(rates: pd.DataFrame, path: Path) -> Figure:
    """Kafka's proposal's figure: CPU per 1,000,000 requests (left) and the
    collector's time per second (right) against the offered rate, one line per
    contender, one row per case (``bench_results.kafka_rates``' frame). A line ends
    where its contender fell behind; a dotted vertical mark is its sustained rate."""
    cases = list(dict.fromkeys(rates["case"])) or [""]
    figure, axes = _figure(len(cases), 2, 2.6)
    panels = (
        ("cpu_s_per_m", "CPU s per 1,000,000 requests"),
        ("gc_ms_per_s", "collector ms per s"),
    )
    for row_axes, case in zip(axes, cases, strict=True):
        part = rates[rates["case"] == case]
        for ax, (metric, what) in zip(row_axes, panels, strict=True):
            ax.set_title(f"kafka {plain(case)}: {what}", loc="left", fontsize=10)
            lines = part[part["metric"] == metric]
            if lines.empty:
                _empty(ax, "no contender held any target rate")
                continue
            for contender in contender_order(lines["contender"]):
                line = lines[lines["contender"] == contender].sort_values("rate")
                colour = contender_colour(contender)
                ax.plot(
                    line["rate"],
                    line["value"],
                    color=colour,
                    marker="o",
                    markersize=4,
                    linewidth=1.6,
                    zorder=_zorder(contender),
                )
                held = float(line["sustained"].iloc[0])
                if math.isfinite(held) and held > 0:
                    ax.axvline(held, color=colour, linestyle=":", linewidth=1.0, alpha=0.7)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.25)
            ax.xaxis.set_major_formatter(_count_formatter())
            ax.set_xlabel("offered rate (requests/s)", fontsize=8)
    _legend(
        figure,
        "Kafka's purgatory benchmark: cost against the offered rate (lower is better;"
        " dotted: each contender's sustained rate)",
        rates["contender"],
    )
    return _save(figure, path)


def _count(value: float, _: Any) -> str:
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if abs(value) >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def _count_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(_count)
