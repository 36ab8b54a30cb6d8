"""The benchmark's own results (``bench-results.json``) and the report's headline.

``aiowheel bench`` saves its results next to the traces it records, as a JSON object
``{"version": 1, "settings": {...}, "machine": {...}, "complete": ..., "results": [...]}``
(docs/bench-json.md; ``complete`` false: a run that did not finish, whose file holds
the workload variants it did finish, which are reported as any others); each result
is one metric of one contender on one workload variant (its median over repetitions),
and a peer's result (``kind`` other than ``"aiowheel"``) carries ``ratios``: aiowheel
contender name -> how many times better aiowheel is than that peer (> 1: aiowheel is
better, whichever way the metric is better; null when a ratio means nothing).

The headline compares each peer with the aiowheel contender on the same backend
(``call_later-uvloop`` with ``aiowheel-uvloop``, ``trio-native`` with ``aiowheel-trio``);
the drop-in loop's section (``drop_in``) each plain loop with the drop-in loop on the
same base (``call_later-uvloop`` with ``loop-uvloop``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .inputs import TraceFiles, is_remote, not_regular
from .schema import (
    BENCH_RESULTS,
    BENCH_RESULTS_VERSION,
    SEARCHED_WORKLOADS,
    SINGLE_REPETITION,
    SINGLE_SEARCH,
)

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]

__all__ = [
    "HEADLINE_COLUMNS",
    "KAFKA_RATE_COLUMNS",
    "SERVER_COLUMNS",
    "BenchResults",
    "BenchResultsError",
    "KafkaMismatch",
    "drop_in",
    "find_bench_results",
    "headline",
    "kafka_mismatches",
    "kafka_rates",
    "load_bench_results",
    "server_figures",
]

#: The headline frame's columns: one row per workload variant, metric and peer.
HEADLINE_COLUMNS: Final = (
    "workload",
    "variant",
    "metric",
    "label",
    "unit",
    "better",
    "peer",
    "aiowheel",
    "ratio",
    "peer_median",
    "aiowheel_median",
    "note",
    "peer_min",
    "peer_max",
    "aiowheel_min",
    "aiowheel_max",
    "no_difference",
)

# Keys every result must have, with the types they must be (None: null allowed).
_TEXT: Final = ("workload", "variant", "metric", "label", "unit", "contender", "kind", "backend")
#: Larger files are not a bench's results (a full bench writes well under 1 MB).
_MAX_BYTES: Final = 64 * 1024 * 1024


class BenchResultsError(Exception):
    """``bench-results.json`` is unusable: the message is one line naming the file."""


@dataclass(frozen=True)
class BenchResults:
    path: Path
    settings: dict[str, Any]
    machine: dict[str, Any]
    results: tuple[dict[str, Any], ...]


def find_bench_results(traces: Sequence[str], files: TraceFiles) -> list[Path]:
    """The ``bench-results.json`` files in the trace directories given and in the
    directories of the trace files found, in that order, each once."""
    directories: dict[Path, None] = {}
    for raw in traces:
        if not is_remote(raw):
            path = Path(raw.removeprefix("file://"))
            if path.is_dir():
                directories[path.resolve()] = None
    for file in files.local:
        directories[Path(file).parent] = None
    # Anything by that name, a FIFO or a dangling link too: load_bench_results says
    # what is wrong with it rather than the report saying there is none.
    return [
        d / BENCH_RESULTS
        for d in directories
        if (d / BENCH_RESULTS).exists() or (d / BENCH_RESULTS).is_symlink()
    ]


def load_bench_results(path: str | os.PathLike[str]) -> BenchResults:
    """Read and check a ``bench-results.json``; ``BenchResultsError`` if it is not one."""
    path = Path(path)
    problem = not_regular(path)
    if problem:
        raise BenchResultsError(f"{path}: {problem}")
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise BenchResultsError(f"{path}: too large for a bench's results")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchResultsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise BenchResultsError(f"{path}: not JSON (not UTF-8 text)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchResultsError(
            f"{path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise BenchResultsError(f'{path}: not a bench\'s results (no "results" list)')
    version = data.get("version")
    if not _is_number(version) or version != BENCH_RESULTS_VERSION:
        raise BenchResultsError(
            f"{path}: version {version!r}, but this report reads version "
            f"{BENCH_RESULTS_VERSION}: use the aiowheel that wrote it"
        )
    results = tuple(data["results"])
    for index, result in enumerate(results):
        problem = _result_problem(result)
        if problem:
            raise BenchResultsError(f"{path}: result {index}: {problem}")
    settings = data.get("settings")
    machine = data.get("machine")
    return BenchResults(
        path=path,
        settings=settings if isinstance(settings, dict) else {},
        machine=machine if isinstance(machine, dict) else {},
        results=results,
    )


def _result_problem(result: Any) -> str | None:
    if not isinstance(result, dict):
        return "not an object"
    for key in _TEXT:
        if not isinstance(result.get(key), str):
            return f"{key} is {_json_type(result.get(key))}, expected a string"
    if result.get("better") not in ("lower", "higher"):
        return f'better is {result.get("better")!r}, expected "lower" or "higher"'
    median = result.get("median")
    if median is not None and not _is_number(median):
        return f"median is {_json_type(median)}, expected a number or null"
    ratios = result.get("ratios")
    if ratios is not None:
        if not isinstance(ratios, dict):
            return f"ratios is {_json_type(ratios)}, expected an object"
        for name, value in ratios.items():
            if value is not None and not _is_number(value):
                return f"ratios[{name!r}] is {_json_type(value)}, expected a number or null"
    skipped = result.get("skipped")
    if skipped is not None and not isinstance(skipped, str):
        return f"skipped is {_json_type(skipped)}, expected a string or null"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    if value is None:
        return "missing or null"
    if isinstance(value, bool):
        return "a boolean"
    if _is_number(value):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def headline(bench: BenchResults) -> pd.DataFrame:
    """Each peer against the aiowheel contender on its backend, per workload variant
    and metric, in the bench's order; metrics without ratios (counts that are the same
    for everyone, say) are left out. ``ratio`` is NaN where there is none; ``note``
    says why. The drop-in loop's workloads are not here: see ``drop_in``."""
    return _ratio_frame(bench, "aiowheel")


def drop_in(bench: BenchResults) -> pd.DataFrame:
    """The drop-in loop's workloads (``loop-*``, ``server``): each plain loop against
    the drop-in loop on its own base (``call_later-uvloop`` with ``loop-uvloop``); a
    plain loop with no drop-in loop on its base (``call_later-rloop``) against the
    one its ratios name (the bench picks ``loop-uvloop``). Same columns as the
    headline's."""
    return _ratio_frame(bench, "loop")


def _ratio_frame(bench: BenchResults, kind: str) -> pd.DataFrame:
    import pandas as pd

    # The figures whose baseline is of this kind (its contenders have them): by
    # workload and metric, as one workload may have figures of both (the timeout
    # workload's drop-in loop figure).
    figures = {(r["workload"], r["metric"]) for r in bench.results if r["kind"] == kind}
    ours_by_backend: dict[tuple[str, str, str], str] = {}
    medians: dict[tuple[str, str, str, str], float] = {}
    spans: dict[tuple[str, str, str, str], tuple[float, float] | None] = {}
    for r in bench.results:
        if r["kind"] == kind:
            ours_by_backend.setdefault((r["workload"], r["metric"], r["backend"]), r["contender"])
            key = (r["workload"], r["variant"], r["metric"], r["contender"])
            medians[key] = _float(r.get("median"))
            spans[key] = _span(r)
    rows: list[dict[str, Any]] = []
    for r in bench.results:
        ratios = r.get("ratios") or {}
        figure = (r["workload"], r["metric"])
        if r["kind"] in ("aiowheel", "loop") or not ratios or figure not in figures:
            continue
        ours = ours_by_backend.get((r["workload"], r["metric"], r["backend"]))
        if ours is None:
            # No contender of this kind on the peer's backend: the one its ratio names.
            ours = next(iter(ratios)) if len(ratios) == 1 else f"{kind}-{r['backend']}"
        value = _ratio(ratios.get(ours))
        note = ""
        if r.get("skipped"):
            note = f"skipped: {r['skipped']}"
        elif ours not in ratios:
            note = f"no {ours} result"
        elif math.isnan(value):
            note = "no meaningful ratio"
        elif len(r.get("samples") or ()) <= 1:
            # One repetition: no spread, and such ratios flip between runs (issue 21).
            note = SINGLE_SEARCH if r["workload"] in SEARCHED_WORKLOADS else SINGLE_REPETITION
        theirs = _span(r)
        mine = spans.get((r["workload"], r["variant"], r["metric"], ours))
        rows.append(
            {
                "workload": r["workload"],
                "variant": r["variant"],
                "metric": r["metric"],
                "label": r["label"],
                "unit": r["unit"],
                "better": r["better"],
                "peer": r["contender"],
                "aiowheel": ours,
                "ratio": value,
                "peer_median": _float(r.get("median")),
                "aiowheel_median": medians.get(
                    (r["workload"], r["variant"], r["metric"], ours), math.nan
                ),
                "note": note,
                "peer_min": theirs[0] if theirs else math.nan,
                "peer_max": theirs[1] if theirs else math.nan,
                "aiowheel_min": mine[0] if mine else math.nan,
                "aiowheel_max": mine[1] if mine else math.nan,
                # Both measured more than once and their min-max ranges overlap: the
                # ratio's own range (worst to best pairing) crosses 1x.
                "no_difference": bool(
                    not note
                    and theirs is not None
                    and mine is not None
                    and theirs[0] <= mine[1]
                    and mine[0] <= theirs[1]
                ),
            }
        )
    return pd.DataFrame(rows, columns=list(HEADLINE_COLUMNS))


def _span(result: dict[str, Any]) -> tuple[float, float] | None:
    """A result's min-max range over its repetitions (rounds), None with fewer than two
    (one figure has no range) or without both ends."""
    samples = result.get("samples")
    if not isinstance(samples, list) or len(samples) < 2:
        return None
    low, high = _float(result.get("min")), _float(result.get("max"))
    if math.isnan(low) or math.isnan(high):
        numbers = [_float(v) for v in samples]
        numbers = [v for v in numbers if not math.isnan(v)]
        if len(numbers) < 2:
            return None
        low, high = min(numbers), max(numbers)
    return (low, high)


#: kafka_rates' columns: one row per contender, case, target rate and figure.
KAFKA_RATE_COLUMNS: Final = (
    "contender",
    "case",
    "rate",
    "metric",
    "label",
    "unit",
    "value",
    "sustained",
)


def kafka_rates(bench: BenchResults) -> pd.DataFrame:
    """The kafka workload's figures at its fixed target rates (CPU per 1,000,000
    requests, the collector's time per second), as Kafka's proposal drew them against
    the offered rate; ``sustained`` is the contender's sustained rate in that case (NaN
    when the run has none). A rate a contender fell behind at has no row. Empty when
    the run measured no target rate."""
    import pandas as pd

    sustained: dict[tuple[str, str], float] = {}
    rows: list[dict[str, Any]] = []
    for r in bench.results:
        params = r.get("params")
        if r["workload"] != "kafka" or not isinstance(params, dict):
            continue
        value = _float(r.get("median"))
        if r["metric"] == "sustained_rps" and "rate" not in params:
            sustained[(r["contender"], str(r["variant"]))] = value
        if "rate" not in params or r.get("skipped") or math.isnan(value):
            continue
        rows.append(
            {
                "contender": r["contender"],
                "case": str(params.get("case", "")),
                "rate": _float(params["rate"]),
                "metric": r["metric"],
                "label": r.get("label", r["metric"]),
                "unit": r.get("unit", ""),
                "value": value,
            }
        )
    for row in rows:
        row["sustained"] = sustained.get((row["contender"], row["case"]), math.nan)
    return pd.DataFrame(rows, columns=list(KAFKA_RATE_COLUMNS))


def _float(value: Any) -> float:
    return float(value) if _is_number(value) and math.isfinite(value) else math.nan


def _ratio(value: Any) -> float:
    number = _float(value)
    return number if number > 0 else math.nan


#: server_figures' columns: one row per variant, metric and contender.
SERVER_COLUMNS: Final = (
    "variant",
    "metric",
    "label",
    "unit",
    "better",
    "contender",
    "median",
    "min",
    "max",
    "rounds",
)


def server_figures(bench: BenchResults) -> pd.DataFrame:
    """The ``server`` workload's figures, as measured (not as ratios): every variant
    (the middleware's included, which has no drop-in loop to compare with), metric and
    contender, with the median, min and max over its rounds (``samples``). Empty when
    the run did not measure the server."""
    import pandas as pd

    rows = []
    for r in bench.results:
        if r["workload"] != "server" or r.get("skipped"):
            continue
        median = _float(r.get("median"))
        if math.isnan(median):
            continue
        samples = r.get("samples")
        rounds = len(samples) if isinstance(samples, list) else 1
        span = _span(r)
        rows.append(
            {
                "variant": r["variant"],
                "metric": r["metric"],
                "label": r["label"],
                "unit": r["unit"],
                "better": r["better"],
                "contender": r["contender"],
                "median": median,
                "min": span[0] if span else math.nan,
                "max": span[1] if span else math.nan,
                "rounds": rounds,
            }
        )
    return pd.DataFrame(rows, columns=list(SERVER_COLUMNS))


@dataclass(frozen=True)
class KafkaMismatch:
    """A contender whose search sustained a rate at least as high as a fixed target
    rate it then fell behind at (``kafka_mismatches``)."""

    contender: str
    case: str
    sustained: float  #: req/s held by the search's confirming probe
    sustain_s: float  #: how long that probe held it (NaN if not said)
    rate: float  #: the fixed target rate it fell behind at
    target_s: float  #: how long the fixed-rate run lasted (NaN if not said)
    why: str  #: what the fixed-rate run saw, e.g. "arrival lag p99 61 ms"


def kafka_mismatches(bench: BenchResults) -> list[KafkaMismatch]:
    """Where kafka's search and its fixed-rate runs seem to disagree: the search
    sustained a rate, and the same contender fell behind at a lower or equal fixed
    rate. Both are single runs, minutes apart; the report says so where it happens."""
    sustained: dict[tuple[str, str], tuple[float, float]] = {}
    behind: list[tuple[str, str, float, dict[str, Any]]] = []
    settings = bench.settings
    for r in bench.results:
        params = r.get("params")
        if r["workload"] != "kafka" or not isinstance(params, dict):
            continue  # a hand-edited file's params that are no object say nothing here
        case = str(params.get("case", r["variant"]))
        if r["metric"] == "sustained_rps" and "rate" not in params:
            value = _float(r.get("median"))
            if value > 0:
                sustained[(r["contender"], case)] = (value, _float(params.get("sustain_s")))
        elif "rate" in params and r.get("skipped") and r["metric"] == "cpu_s_per_m":
            given = params.get("probe")
            probe: dict[str, Any] = given if isinstance(given, dict) else {}
            behind.append((r["contender"], case, _float(params["rate"]), probe))
    found = []
    target_s = _float(settings.get("kafka_target_seconds"))
    for contender, case, rate, probe in behind:
        held = sustained.get((contender, case))
        if held is None or math.isnan(rate) or held[0] < rate:
            continue
        said = [
            f"{name} {_float(probe.get(key)):,.0f} ms"
            for key, name in (
                ("lag_p99_ms", "arrival lag p99"),
                ("backlog_ms", "backlog"),
                ("late_p99_ms", "lateness p99"),
            )
            if _float(probe.get(key)) > 50
        ]
        found.append(
            KafkaMismatch(
                contender, case, held[0], held[1], rate, target_s, ", ".join(said) or "behind"
            )
        )
    return found
