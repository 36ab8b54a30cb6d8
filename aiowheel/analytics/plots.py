"""The report's PNG plots, drawn from the collected aggregates (matplotlib, Agg).

Figures are built with ``matplotlib.figure.Figure`` directly, not pyplot: no global
figure state, no GUI backend, nothing to close.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from matplotlib.axes import Axes

__all__ = [
    "CDF_PNG",
    "MAX_SERIES",
    "P99_PNG",
    "RATES_PNG",
    "plot_lateness_cdf",
    "plot_lateness_p99",
    "plot_rates",
    "run_names",
    "short_run_ids",
]

CDF_PNG: Final = "lateness_cdf.png"
P99_PNG: Final = "lateness_p99.png"
RATES_PNG: Final = "fired_cancelled.png"
#: More lines than this make a plot unreadable: the busiest series are drawn.
MAX_SERIES: Final = 12
#: Lateness below this (1 us) is drawn at it: a log axis has no zero, and a virtual
#: clock (looptime, trio's MockClock) fires exactly on time.
_FLOOR_MS: Final = 1e-3
_DPI: Final = 110


def short_run_ids(run_ids: Iterable[str]) -> dict[str, str]:
    """run_id -> the run id without the prefix all runs share (up to a ``-``, ``_``,
    ``.`` or ``/``): ``bench-20261121T151509-3609-fire-aiowheel-asyncio`` becomes
    ``fire-aiowheel-asyncio`` when every run id starts with ``bench-20261121T151509-3609-``.
    """
    ids = sorted(set(run_ids))
    if len(ids) < 2:
        return {run: run for run in ids}
    first, last = ids[0], ids[-1]  # sorted: their common prefix is everyone's
    shared = 0
    while shared < min(len(first), len(last)) and first[shared] == last[shared]:
        shared += 1
    prefix = first[:shared]
    cut = max(prefix.rfind(sep) for sep in "-_./") + 1
    return {run: run[cut:] or run for run in ids}


def run_names(frame: pd.DataFrame) -> dict[str, str]:
    """run_id -> a legend name: ``implementation/backend``, plus the (shortened) run id
    when two runs would otherwise share a name."""
    runs = frame.drop_duplicates("run_id")
    base = {row.run_id: f"{row.implementation}/{row.backend}" for row in runs.itertuples()}
    short = short_run_ids(base)
    counts: dict[str, int] = {}
    for name in base.values():
        counts[name] = counts.get(name, 0) + 1
    return {
        run: name if counts[name] == 1 else f"{name} ({short[run]})" for run, name in base.items()
    }


def _figure(rows: int = 1, cols: int = 1, height: float = 4.5) -> tuple[Any, list[Axes]]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9.5, height * rows), dpi=_DPI, layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, [ax for row in axes for ax in row]


def _busiest(frame: pd.DataFrame, by: str, weight: str) -> tuple[list[Any], int]:
    totals = frame.groupby(by, sort=False, dropna=False)[weight].sum()
    ordered = totals.sort_values(ascending=False, kind="stable")
    keys = list(ordered.index[:MAX_SERIES])
    return keys, len(ordered) - len(keys)


def _note_hidden(ax: Axes, hidden: int) -> None:
    if hidden:
        ax.text(
            0.99,
            0.01,
            f"{hidden} quieter series not drawn",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            color="0.4",
        )


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center", color="0.4")


def plot_lateness_cdf(summary: pd.DataFrame, path: Path) -> None:
    """Lateness CDF per (run, label), log x; and its tail (1 - CDF), log-log."""
    from .job import CDF_QUANTILES

    names = run_names(summary)
    figure, (cdf_ax, tail_ax) = _figure(1, 2, height=4.8)
    fired = summary[summary["fired"] > 0]
    busiest = fired.sort_values("fired", ascending=False, kind="stable").head(MAX_SERIES)
    hidden = len(fired) - len(busiest)
    drawn = 0
    for row in busiest.itertuples():
        values = row.lateness_cdf
        if values is None or len(values) != len(CDF_QUANTILES):
            continue
        xs = [max(float(v) * 1000.0, _FLOOR_MS) for v in values]
        name = names[row.run_id] + (f" [{row.label}]" if isinstance(row.label, str) else "")
        cdf_ax.plot(xs, CDF_QUANTILES, label=name, linewidth=1.4)
        # 1 - q below 1/fired says nothing: no sample that rare was seen.
        rarest = 1.0 / row.fired
        tail = [(x, 1.0 - q) for x, q in zip(xs, CDF_QUANTILES, strict=True) if 1.0 - q >= rarest]
        tail_ax.plot([x for x, _ in tail], [t for _, t in tail], label=name, linewidth=1.4)
        drawn += 1
    for ax in (cdf_ax, tail_ax):
        ax.set_xscale("log")
        ax.set_xlabel("lateness (ms, fired_at - deadline)")
        ax.grid(True, which="both", alpha=0.3)
    cdf_ax.set_ylabel("fraction of fired timers at most this late")
    cdf_ax.set_ylim(0, 1.001)
    cdf_ax.set_title("Lateness CDF")
    tail_ax.set_yscale("log")
    tail_ax.set_ylabel("fraction later than this (1 - CDF)")
    tail_ax.set_title("Tail: p90 = 1e-1, p99 = 1e-2, p99.9 = 1e-3")
    if drawn:
        cdf_ax.legend(fontsize=8, loc="lower right")
    else:
        _empty(cdf_ax, "no timer fired")
        _empty(tail_ax, "no timer fired")
    _note_hidden(tail_ax, hidden)
    figure.savefig(path)


def _runs(windows: pd.DataFrame, weight: str) -> Iterator[tuple[str, pd.DataFrame]]:
    names = run_names(windows)
    keys, _ = _busiest(windows, "run_id", weight)
    for run in keys:
        yield names[run], windows[windows["run_id"] == run].sort_values("elapsed_s")


def plot_lateness_p99(windows: pd.DataFrame, path: Path) -> None:
    """Lateness p99 per second over the run's elapsed time, one line per run."""
    figure, (ax,) = _figure()
    drawn = 0
    smallest, largest = math.inf, 0.0
    for name, run in _runs(windows, "fired"):
        points = run.dropna(subset=["lateness_p99_ms"])
        if points.empty:
            continue
        ys = points["lateness_p99_ms"].clip(lower=_FLOOR_MS)
        smallest, largest = min(smallest, float(ys.min())), max(largest, float(ys.max()))
        ax.plot(points["elapsed_s"], ys, label=name, linewidth=1.2, marker=".", markersize=3)
        drawn += 1
    if drawn and largest > 20 * smallest:
        ax.set_yscale("log")
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("lateness p99 (ms) of timers fired in that second")
    ax.set_title("Lateness p99 over time")
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no timer fired")
    _note_hidden(ax, max(0, windows["run_id"].nunique() - MAX_SERIES))
    figure.savefig(path)


def plot_rates(windows: pd.DataFrame, path: Path) -> None:
    """Timers fired and cancelled per second, one line per run."""
    figure, (fired_ax, cancelled_ax) = _figure(2, 1, height=3.2)
    for column, ax in (("fired", fired_ax), ("cancelled", cancelled_ax)):
        drawn = 0
        for name, run in _runs(windows, column):
            ax.plot(
                run["elapsed_s"], run[column], label=name, linewidth=1.2, drawstyle="steps-post"
            )
            drawn += 1
        ax.set_ylabel(f"{column} per second")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if drawn:
            ax.legend(fontsize=8)
    fired_ax.set_title("Timers fired and cancelled per second")
    cancelled_ax.set_xlabel("seconds since the run started")
    _note_hidden(cancelled_ax, max(0, windows["run_id"].nunique() - MAX_SERIES))
    figure.savefig(path)
