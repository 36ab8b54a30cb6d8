"""What a run prints: JSON lines for scripts, or a progress bar and rich tables.

``--json``: one JSON object per line on stdout: first ``{"type": "run", ...}`` (the
command, the machine, the load average), then one ``{"type": "result", ...}`` per
workload variant, metric and contender (see ``Result.as_json``), last
``{"type": "end", ...}`` with the load average again. Nothing else goes to stdout.

Otherwise: a progress bar on stderr while it runs (when stderr is a terminal), each
variant's figures as soon as they are measured, and at the end one table per
workload: every figure (median, min-max over repetitions) and, on each peer's row,
how many times better aiowheel is on each backend (``> 1``: aiowheel better; the
direction of "better" is the metric's own: lower ns, higher callbacks/s).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from typing import Any, TextIO

from .results import Result
from .settings import Settings

__all__ = ["Output", "fmt"]

# Written as escapes: ruff flags the characters themselves as look-alikes.
DASH = "\u2013"  # en dash, for ranges
TIMES = "\u00d7"  # multiplication sign, for ratios


def fmt(value: float | None, unit: str = "") -> str:
    """A figure for people: thousands separators, three significant digits below 100."""
    if value is None or not math.isfinite(value):
        return DASH
    magnitude = abs(value)
    if magnitude >= 100:
        text = f"{value:,.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude == 0:
        text = "0"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".rstrip() if unit and unit not in ("1/s",) else text


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.2f}{TIMES}"


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in load] if load else None,
    }


class Output:
    def __init__(
        self,
        settings: Settings,
        *,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        argv: list[str] | None = None,
    ) -> None:
        self.settings = settings
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr
        self.argv = argv if argv is not None else sys.argv
        self.json = settings.json
        self._progress: Any = None
        self._task: Any = None
        self._console: Any = None
        self._started = 0.0

    # -- lifecycle ----------------------------------------------------------------

    def start(self, settings: Settings, steps: int) -> None:
        self._started = time.perf_counter()
        info = {"type": "run", "argv": self.argv, **machine(), "settings": _settings_json(settings)}
        if self.json:
            self._line(info)
            return
        from rich.console import Console

        # Not a terminal (a file, a pipe): wide enough that the tables do not wrap.
        width = None if self.stdout.isatty() else 160
        self._console = Console(file=self.stdout, highlight=False, width=width)
        self._console.print(
            f"[bold]aiowheel bench[/bold]  Python {info['python']} on {info['cpus']} CPUs, "
            f"load average {info['loadavg']}  ({' '.join(self.argv)})"
        )
        use_bar = settings.progress and self.stderr.isatty()
        if use_bar:
            from rich.console import Console as _Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=_Console(file=self.stderr),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("starting", total=max(steps, 1))

    def step(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def advance(self, steps: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, steps)

    def warn(self, message: str) -> None:
        if self.json:
            self._line({"type": "warning", "message": message})
        else:
            print(f"warning: {message}", file=self.stderr)

    def results(self, results: list[Result]) -> None:
        if self.json:
            for r in results:
                self._line(r.as_json())
            return
        assert self._console is not None
        if not results:
            return
        head = results[0]
        lines = [f"[bold]{head.workload}[/bold] {head.variant}"]
        for r in results:
            if r.skipped:
                continue
            lines.append(
                f"  {r.label:<34} {r.contender.name:<20} {fmt(r.median, r.unit):>14}"
                f"  ({fmt(r.low)}{DASH}{fmt(r.high)})"
            )
        self._print("\n".join(lines))

    def finish(self, results: list[Result]) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elapsed = time.perf_counter() - self._started
        load = machine()["loadavg"]
        if self.json:
            self._line({"type": "end", "seconds": round(elapsed, 1), "loadavg": load})
            return
        assert self._console is not None
        for table in tables(results):
            self._console.print(table)
        self._console.print(f"{elapsed:.0f} s; load average at the end {load}")

    # -- helpers ------------------------------------------------------------------

    def _print(self, text: str) -> None:
        if self._progress is not None:
            # Above the live bar (on stderr); the final tables go to stdout.
            self._progress.console.print(text, highlight=False)
        else:
            assert self._console is not None
            self._console.print(text)

    def _line(self, obj: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(obj, allow_nan=False, default=str) + "\n")
        self.stdout.flush()


def tables(results: list[Result]) -> list[Any]:
    """One rich Table per workload: each figure, and aiowheel's ratio to every peer."""
    from rich.table import Table

    from .contenders import CONTENDERS
    from .workloads import WORKLOADS

    by_workload: dict[str, list[Result]] = {}
    for r in results:
        by_workload.setdefault(r.workload, []).append(r)
    out = []
    order = {c.name: i for i, c in enumerate(CONTENDERS)}
    for name, unsorted in by_workload.items():
        workload = WORKLOADS.get(name)
        variants = list(dict.fromkeys(r.variant for r in unsorted))
        metrics = [m.key for m in workload.metrics] if workload else []
        rows = sorted(
            unsorted,
            key=lambda r: (
                variants.index(r.variant),
                metrics.index(r.metric) if r.metric in metrics else len(metrics),
                order.get(r.contender.name, len(order)),
            ),
        )
        ours = []
        for r in rows:
            if r.contender.is_aiowheel and r.contender.name not in ours and r.samples:
                ours.append(r.contender.name)
        table = Table(title=f"{name}: {workload.title if workload else ''}", title_justify="left")
        table.add_column("variant", no_wrap=True)
        table.add_column("metric")
        table.add_column("contender", no_wrap=True)
        table.add_column("median", justify="right", no_wrap=True)
        table.add_column(f"min{DASH}max", justify="right", no_wrap=True)
        for a in ours:
            table.add_column(
                f"{a.removeprefix('aiowheel-')} {TIMES}", justify="right", no_wrap=True
            )
        previous: tuple[str, str] | None = None
        for r in rows:
            key = (r.variant, r.metric)
            if previous is not None and key != previous:
                table.add_section()
            previous = key
            if r.skipped:
                cells = [r.variant, r.label, r.contender.name, "skipped", r.skipped]
                table.add_row(*cells, *["" for _ in ours])
                continue
            cells = [
                r.variant,
                f"{r.label} ({r.unit})" if r.unit else r.label,
                r.contender.name,
                fmt(r.median),
                f"{fmt(r.low)}{DASH}{fmt(r.high)}",
            ]
            ratio_cells = [fmt_ratio(r.ratios.get(a)) if r.ratios else "" for a in ours]
            table.add_row(*cells, *ratio_cells, style="bold" if r.contender.is_aiowheel else None)
        out.append(table)
    return out


def _settings_json(settings: Settings) -> dict[str, Any]:
    return {
        "workloads": settings.workloads,
        "contenders": [c.name for c in settings.contenders],
        "n": settings.n,
        "reps": settings.reps,
        "quick": settings.quick,
        "ops": settings.ops,
        "seed": settings.seed,
        "trace_dir": str(settings.trace_dir) if settings.trace_dir else None,
        "spread_window": settings.spread_window,
        "idle_seconds": settings.idle_seconds,
        "idle_timeout": settings.idle_timeout,
        "kafka_cases": list(settings.kafka_cases),
        "kafka_probe": settings.kafka_probe,
        "kafka_seconds": settings.kafka_seconds,
    }
