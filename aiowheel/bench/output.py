"""What a run prints: JSON lines for scripts, or a progress bar and rich tables.

``--json``: one JSON object per line on stdout: first ``{"type": "run", ...}`` (the
command, the machine, the load average), then one ``{"type": "result", ...}`` per
workload variant, metric and contender (see ``Result.as_json``), last
``{"type": "end", ...}`` with the load average again. Nothing else goes to stdout.

Otherwise: a progress bar on stderr while it runs (when stderr is a terminal) and
one line there as each variant is measured; at the end, on stdout, one table per
workload, each figure once: median, min-max over repetitions and, on each peer's row,
how many times better aiowheel is *on the peer's own event loop* (``> 1``: aiowheel
better; the direction of "better" is the metric's own: lower ns, higher
callbacks/s). The tables are rich's when rich is installed (the ``bench`` extra),
plain text otherwise.

Either way, a contender left out because its event loop is not installed gets one
line on stderr before the run starts.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

import aiowheel
from aiowheel import _compiled

from .contenders import CONTENDERS
from .export import machine
from .registry import WORKLOADS
from .results import Result
from .settings import Settings

__all__ = [
    "NO_DIFFERENCE",
    "RATIO_HEADER",
    "Output",
    "Table",
    "fmt",
    "fmt_cost",
    "fmt_ratio",
    "render_plain",
    "tables",
]

#: The ratio column's header: every figure there compares a peer with aiowheel on the
#: peer's own event loop (issue 32), ``> 1``: aiowheel better.
RATIO_HEADER = "\u00d7 same loop"
CONTENDER_BY_NAME = {c.name: c for c in CONTENDERS}

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


#: The ratio column when the ratio's range over the repetitions holds 1x.
NO_DIFFERENCE = "no difference measured"


def fmt_duration(seconds: float) -> str:
    """``4 min 50 s``; ``40 s``; rounded to 10 s above a minute."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    total = round(seconds / 10) * 10
    return f"{total // 60} min {total % 60} s" if total % 60 else f"{total // 60} min"


def fmt_ratio(value: float | None, bounds: list[float] | None = None) -> str:
    """A ratio to 3 significant digits (figures move more than that between runs);
    ``NO_DIFFERENCE`` when its range over the repetitions (``bounds``) holds 1x."""
    if value is None or not math.isfinite(value):
        return DASH
    if bounds is not None and bounds[0] <= 1.0 <= bounds[1]:
        return NO_DIFFERENCE
    rounded = float(f"{value:.3g}")
    if rounded >= 100:
        return f"{rounded:,.0f}{TIMES}"
    # 3 significant digits below 1 too: a real 0.004 is not "0.00".
    return f"{rounded:#.3g}{TIMES}"


def fmt_cost(fraction: float) -> str:
    """A fraction of a base (0.81: 81% of uvicorn's requests/s) as the cost it is, a
    percentage ("19%"; "-3%": no cost, faster): never a second kind of ratio."""
    if not math.isfinite(fraction):
        return DASH
    return f"{(1 - fraction) * 100:.0f}%"


class _Console(Protocol):
    def line(self, bold: str, rest: str = "") -> None: ...
    def table(self, table: Table) -> None: ...


class _PlainConsole:
    """Without rich (a core-only install): the same lines and tables, as plain text."""

    def __init__(self, file: TextIO) -> None:
        self.file = file

    def line(self, bold: str, rest: str = "") -> None:
        print(bold + rest, file=self.file, flush=True)

    def table(self, table: Table) -> None:
        print(render_plain(table), file=self.file, flush=True)


class _RichConsole:
    def __init__(self, file: TextIO) -> None:
        from rich.console import Console

        # Not a terminal (a file, a pipe): wide enough that the tables do not wrap.
        width = None if file.isatty() else 160
        self.console = Console(file=file, highlight=False, width=width)

    def line(self, bold: str, rest: str = "") -> None:
        from rich.text import Text

        self.console.print(Text.assemble((bold, "bold"), rest))

    def table(self, table: Table) -> None:
        self.console.print(render_rich(table))
        for note in table.notes:
            self.console.print(note, markup=False, highlight=False)


def _rich_installed() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


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
        self._console: _Console | None = None
        self._started = 0.0
        #: The run's plan (``start``), and what one step of the current workload weighs.
        self.planned_seconds: float | None = None
        self.step_seconds = 1.0
        self._steps = 0
        #: What follows the measuring, said with the plan (``--report``'s Spark job).
        self.then = ""

    # -- lifecycle ----------------------------------------------------------------

    def start(
        self, steps: int, machine_info: dict[str, Any], *, planned_seconds: float | None = None
    ) -> None:
        """The run begins: ``steps`` progress steps in all (every workload's, the
        server's too), about ``planned_seconds`` long (the bar's measure, and its time
        remaining; each step weighs ``step_seconds``, set per workload)."""
        settings = self.settings
        self._started = time.perf_counter()
        self.planned_seconds = planned_seconds
        for contender, reason in settings.unavailable:
            print(f"aiowheel bench: skipping {contender.name}: {reason}", file=self.stderr)
        if self.json:
            self._line(
                {
                    "type": "run",
                    "argv": self.argv,
                    **machine_info,
                    "settings": settings.as_json(),
                    "planned_steps": steps,
                    "planned_seconds": None
                    if planned_seconds is None
                    else round(planned_seconds, 1),
                }
            )
            self.same_core_note()
            return
        rich = _rich_installed()
        self._console = _RichConsole(self.stdout) if rich else _PlainConsole(self.stdout)
        core = f", aiowheel core: {machine_info['core']}" if "core" in machine_info else ""
        if machine_info.get("core_reason"):
            core += f" ({machine_info['core_reason']})"
        self._console.line(
            "aiowheel bench",
            f"  Python {machine_info['python']} on {machine_info['cpus']} CPUs, "
            f"load average {machine_info['loadavg']}{core}  ({' '.join(self.argv)})",
        )
        if planned_seconds:
            self._console.line(
                "",
                f"{steps:,} steps, about {fmt_duration(planned_seconds)} on a 2-core machine"
                + self.then,
            )
        self.same_core_note()
        if rich and settings.progress and self.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[steps]}/{task.fields[of]}"),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=Console(file=self.stderr),
                transient=True,
            )
            self._progress.start()
            # The bar measures planned seconds (a server's step weighs several of a
            # repetition's): its time remaining follows the plan, not a step count.
            self._task = self._progress.add_task(
                "starting", total=max(planned_seconds or steps, 1), steps=0, of=steps
            )
        self._steps = 0

    def same_core_note(self) -> None:
        """This process runs the pure core too: say that a ``-pure`` contender measures
        the same core as its peer here (in another process)."""
        pure = [c.name for c in self.settings.contenders if c.pure]
        if pure and not aiowheel.COMPILED:
            self.warn(
                f"this process runs the pure core too ({_compiled.REASON}): the -pure "
                f"contenders measure the same core as "
                f"{', '.join(n.removesuffix('-pure') for n in pure)}, in child processes"
            )

    def step(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def advance(self, steps: int = 1) -> None:
        """``steps`` more steps done, each weighing ``step_seconds`` of the plan."""
        self._steps += steps
        if self._progress is not None:
            weight = self.step_seconds if self.planned_seconds else 1.0
            self._progress.update(self._task, advance=steps * weight, steps=self._steps)

    def warn(self, message: str) -> None:
        if self.json:
            self._line({"type": "warning", "message": message})
        elif self._progress is not None:
            from rich.text import Text

            # Through the live bar's console, which prints above the bar: a plain
            # print to the same stderr would be glued onto the bar's line.
            self._progress.console.print(Text(f"warning: {message}"))
        else:
            print(f"warning: {message}", file=self.stderr)

    def close(self) -> None:
        """Stop the live bar (idempotent): after an interruption too, so that the
        terminal is left on a clean line."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def results(self, results: list[Result]) -> None:
        """One workload variant measured: its figures as JSON lines; otherwise, above a
        live progress bar, one line saying so (the figures are printed once, in the
        tables at the end)."""
        if self.json:
            for r in results:
                self._line(r.as_json())
            return
        if not results:
            return
        head = results[0]
        measured = sum(1 for r in results if not r.skipped)
        text = f"{head.workload} {head.variant}: {measured} figures measured"
        if self._progress is not None:
            from rich.text import Text

            self._progress.console.print(Text(text, style="dim"))

    def finish(self, results: list[Result]) -> None:
        self.close()
        elapsed = time.perf_counter() - self._started
        load = machine()["loadavg"]
        if self.json:
            self._line({"type": "end", "seconds": round(elapsed, 1), "loadavg": load})
            return
        assert self._console is not None
        for table in tables(results):
            self._console.table(table)
        self._console.line("", f"{elapsed:.0f} s; load average at the end {load}")

    # -- helpers ------------------------------------------------------------------

    def _print(self, bold: str, rest: str) -> None:
        if self._progress is not None:
            from rich.text import Text

            # Above the live bar (on stderr); the final tables go to stdout.
            self._progress.console.print(Text.assemble((bold, "bold"), rest))
        else:
            assert self._console is not None
            self._console.line(bold, rest)

    def _line(self, obj: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(obj, allow_nan=False, default=str) + "\n")
        self.stdout.flush()


# -- the tables ---------------------------------------------------------------------


@dataclass
class Table:
    """A table to print, rich or plain: rows in sections, aiowheel's rows bold, and
    notes printed under it."""

    title: str
    #: (header, right-justified)
    columns: list[tuple[str, bool]]
    #: sections of rows; a row is (cells, bold)
    sections: list[list[tuple[list[str], bool]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def tables(results: list[Result]) -> list[Table]:
    """One table per workload: each figure, and aiowheel's ratio to every peer.

    A contender that sat out gets no rows: one note under the table says which
    variants it sat out and why.
    """
    by_workload: dict[str, list[Result]] = {}
    for r in results:
        by_workload.setdefault(r.workload, []).append(r)
    out = []
    # aiowheel's contenders first (the -pure ones too), then the peers.
    ranked = sorted(CONTENDERS, key=lambda c: not c.is_aiowheel)
    order = {c.name: i for i, c in enumerate(ranked)}
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
        has_ratios = any(r.ratios for r in rows)
        table = Table(
            title=f"{name}: {workload.title if workload else ''}",
            columns=[
                ("variant", False),
                ("metric", False),
                ("contender", False),
                ("median", True),
                (f"min{DASH}max", True),
                *([(RATIO_HEADER, True)] if has_ratios else []),
            ],
        )
        undecided = False
        previous: tuple[str, str] | None = None
        skipped: dict[tuple[str, str], list[str]] = {}
        across: dict[str, str] = {}
        for r in rows:
            if r.skipped:
                why = f"{r.contender.name} failed" if r.failed else f"skipped {r.contender.name}"
                sat_out = skipped.setdefault((why, r.failed or r.skipped), [])
                if r.variant not in sat_out:
                    sat_out.append(r.variant)
                continue
            key = (r.variant, r.metric)
            if key != previous:
                table.sections.append([])
            previous = key
            if _is_fraction(r):
                # A fraction of the same loop's figure: shown as the cost it is.
                holds_1 = len(r.samples) > 1 and r.low <= 1.0 <= r.high
                undecided = undecided or holds_1
                cells = [
                    r.variant,
                    f"{r.label.replace('requests/s vs', 'requests/s cost vs')} (%)",
                    r.contender.label,
                    NO_DIFFERENCE if holds_1 else fmt_cost(r.median),
                    "1 rep"
                    if len(r.samples) <= 1
                    else f"{fmt_cost(r.high)}{DASH}{fmt_cost(r.low)}",
                ]
            else:
                cells = [
                    r.variant,
                    f"{r.label} ({r.unit})" if r.unit else r.label,
                    r.contender.label,
                    fmt(r.median),
                    _spread(r),
                ]
            if has_ratios:
                # fill_ratios gives a peer one ratio: against aiowheel on its own base
                # (or, with none there, on another base: said under the table).
                (against, value), *_ = [*r.ratios.items(), ("", None)]
                bounds = r.ratio_ranges.get(against)
                cells.append(fmt_ratio(value, bounds) if against else "")
                if against and cells[-1] == NO_DIFFERENCE:
                    undecided = True
                base = CONTENDER_BY_NAME[against].backend if against in CONTENDER_BY_NAME else ""
                if against and base != r.contender.backend:
                    across[r.contender.name] = against
            table.sections[-1].append((cells, r.contender.is_aiowheel))
        table.notes = [
            f"{why} ({', '.join(variants)}): {reason}"
            for (why, reason), variants in skipped.items()
        ]
        table.notes += [
            f"{peer}: no aiowheel contender on its event loop; its {TIMES} column compares "
            f"it with {against}"
            for peer, against in across.items()
        ]
        if undecided:
            table.notes.append(
                f"{NO_DIFFERENCE}: the ratio's range over the repetitions (the worst and the "
                f"best pairing of min and max) holds 1{TIMES}; a cost's range holds 0%"
            )
        table.notes += _capped_notes(rows)
        out.append(table)
    return out


def _is_fraction(r: Result) -> bool:
    """A figure that is a fraction of another of the same contender (``unit`` x, no
    ratio column: the server's guarded variants against uvicorn's keep-alive)."""
    return r.unit == "x" and not r.has_ratio


def _capped_notes(rows: list[Result]) -> list[str]:
    """A contender measured at fewer timers than its variant's N says so (memory's
    trio-native: a task per timer costs the same at any N)."""
    notes = []
    for r in rows:
        cap = r.params.get("trio_native_cap")
        if r.skipped or r.contender.kind != "trio" or not isinstance(cap, int):
            continue
        if r.n is not None and r.n > cap:
            note = (
                f"{r.contender.name} ({r.variant}): measured at {cap:,} timers, a task "
                "each: its cost per timer does not depend on N"
            )
            if note not in notes:
                notes.append(note)
    return notes


def _spread(r: Result) -> str:
    """min-max over the repetitions; "1 rep" when there was one (no spread to show:
    "317-317" read as a figure that never varies)."""
    if len(r.samples) <= 1:
        return "1 rep"
    return f"{fmt(r.low)}{DASH}{fmt(r.high)}"


def render_rich(table: Table) -> Any:
    from rich.table import Table as RichTable
    from rich.text import Text

    # Text, not markup, for the title too: a bracket in it is no markup tag.
    rich_table = RichTable(title=Text(table.title), title_justify="left")
    for header, right in table.columns:
        # The metric's label may wrap; nothing else does.
        rich_table.add_column(
            header, justify="right" if right else "left", no_wrap=header != "metric"
        )
    for i, section in enumerate(table.sections):
        if i:
            rich_table.add_section()
        for cells, bold in section:
            # Text, not markup: "aiowheel-asyncio [compiled]" is no markup tag.
            rich_table.add_row(*map(Text, cells), style="bold" if bold else None)
    return rich_table


def render_plain(table: Table) -> str:
    rows = [cells for section in table.sections for cells, _bold in section]
    headers = [header for header, _right in table.columns]
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, (_header, right) in zip(cells, widths, table.columns, strict=True)
        ).rstrip()

    rule = "  ".join("-" * width for width in widths)
    out = [table.title, line(headers)]
    for section in table.sections:
        out.append(rule)
        out.extend(line(cells) for cells, _bold in section)
    return "\n".join([*out, *table.notes]) + "\n"
