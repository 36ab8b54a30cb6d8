"""What the parts of ``aiowheel report`` share: names, quantiles, file names, and how a
trace run is named (its contender and workload).

No imports beyond the standard library: every other module of the package may import
this one, and this one imports none of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

__all__ = [
    "ACCURACY",
    "BENCH_RESULTS",
    "BENCH_RESULTS_VERSION",
    "CDF_PNG",
    "CDF_QUANTILES",
    "CONTENDERS",
    "HEADLINE_PNG",
    "IMPOSSIBLY_EARLY_S",
    "KAFKA_PNG",
    "LIFETIME_QUANTILES",
    "LOOP_PNG",
    "OUTPUTS",
    "P99_PNG",
    "RATES_PNG",
    "REPORT_MD",
    "RUN_KEYS",
    "SEARCHED_WORKLOADS",
    "SERVER_PNG",
    "SINGLE_REPETITION",
    "SINGLE_SEARCH",
    "SUMMARY_CSV",
    "SUMMARY_KEYS",
    "SUMMARY_PARQUET",
    "SUMMARY_QUANTILES",
    "WINDOWS_PARQUET",
    "WINDOW_ACCURACY",
    "contender_name",
    "contender_order",
    "short_run_ids",
    "visible",
    "workload_names",
]

#: A run is one recorder: these columns are constant within it.
RUN_KEYS: Final = ("run_id", "implementation", "backend", "host")
#: The summary has one row per run and label.
SUMMARY_KEYS: Final = (*RUN_KEYS, "label")
#: Lateness percentiles in the summary: column suffix -> quantile.
SUMMARY_QUANTILES: Final = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
#: Lifetime percentiles in the summary.
LIFETIME_QUANTILES: Final = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
#: Points of the lateness CDF plot: fine where the tail is (p99 and beyond).
CDF_QUANTILES: Final[tuple[float, ...]] = tuple(
    sorted(
        {round(i / 100, 6) for i in range(101)}
        | {round(0.99 + i / 1000, 6) for i in range(10)}
        | {round(0.999 + i / 10_000, 6) for i in range(10)}
        | {round(0.9999 + i / 100_000, 6) for i in range(10)}
        | set(SUMMARY_QUANTILES.values())
    )
)
#: A fired timer this many seconds early is a recording bug, not a timer: event loops
#: fire at most a clock tick early (uvloop's clock has 1 ms resolution).
IMPOSSIBLY_EARLY_S: Final = 0.01
#: percentile_approx's default accuracy: relative rank error 1e-4 (exact on groups of
#: up to 5,000 values). `aiowheel report --accuracy 100000` trades time for 1e-5
#: (measured on 10M rows: about 2.5x the summary's time).
ACCURACY: Final = 10_000
#: Per-second lateness p99.
WINDOW_ACCURACY: Final = 10_000

# -- the report directory ----------------------------------------------------------------

SUMMARY_PARQUET: Final = "summary.parquet"
SUMMARY_CSV: Final = "summary.csv"
WINDOWS_PARQUET: Final = "windows.parquet"
HEADLINE_PNG: Final = "headline.png"
CDF_PNG: Final = "lateness_cdf.png"
P99_PNG: Final = "lateness_p99.png"
RATES_PNG: Final = "fired_cancelled.png"
#: Kafka's figures against the offered rate (only when the bench measured them).
KAFKA_PNG: Final = "kafka_rates.png"
#: The drop-in loop against the plain loops (only when the bench measured it).
LOOP_PNG: Final = "drop_in_loop.png"
#: The server's requests/s and CPU per request, with ranges (only when measured).
SERVER_PNG: Final = "server.png"
REPORT_MD: Final = "report.md"
#: Every file the report may write (headline.png only with the bench's results,
#: kafka_rates.png only when they hold kafka's target rates).
OUTPUTS: Final = (
    SUMMARY_PARQUET,
    SUMMARY_CSV,
    WINDOWS_PARQUET,
    HEADLINE_PNG,
    CDF_PNG,
    P99_PNG,
    RATES_PNG,
    KAFKA_PNG,
    LOOP_PNG,
    SERVER_PNG,
    REPORT_MD,
)

# -- the bench's results -------------------------------------------------------------------

#: A headline ratio's note when the peer's figure is one repetition's.
SINGLE_REPETITION: Final = "1 rep"
#: ... and when it is one search's (kafka's sustained rate: a search per contender,
#: whatever --reps says; issue 32: the headline said "median of 3 repetitions").
SINGLE_SEARCH: Final = "1 search"
#: The bench's searched workloads (one figure per contender per case).
SEARCHED_WORKLOADS: Final = frozenset({"kafka"})

#: Written by ``aiowheel bench`` next to its traces; the report's headline comes from it.
BENCH_RESULTS: Final = "bench-results.json"
BENCH_RESULTS_VERSION: Final = 1

# -- naming runs ---------------------------------------------------------------------------

#: The bench's contenders, in its order: aiowheel's first, then the peers.
CONTENDERS: Final = (
    "aiowheel-asyncio",
    "aiowheel-uvloop",
    "aiowheel-trio",
    "call_later-asyncio",
    "call_later-uvloop",
    "trio-native",
    "deadline-asyncio",
    "deadline-uvloop",
    "loop-asyncio",
    "loop-uvloop",
    "call_later-rloop",
)

#: ``bench-<YYYYmmddTHHMMSS>-<pid>-<workload>-<contender>``: the bench's trace run ids.
_BENCH_RUN: Final = re.compile(r"^bench-\d{8}T\d{6}-\d+-(?P<rest>.+)$")


def contender_name(implementation: str, backend: str) -> str:
    """The bench's name for what made a run's timers: ``aiowheel-asyncio``,
    ``call_later-uvloop``...; an implementation that is its own backend is
    ``<name>-native`` (``trio-native``: trio's own deadlines)."""
    if implementation == backend:
        return f"{implementation}-native"
    return f"{implementation}-{backend}"


def contender_order(names: Iterable[str]) -> list[str]:
    """The distinct names: the bench's contenders in its order, then others by name."""
    unique = set(names)
    return [n for n in CONTENDERS if n in unique] + sorted(unique - set(CONTENDERS))


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


def workload_names(runs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(run_id, contender) pairs -> run_id -> the workload the run belongs to: what the
    report draws one panel for.

    A bench run id (``bench-<stamp>-<pid>-<workload>-<contender>``) names its workload.
    Any other run is a workload of its own, named by its run id without the
    contender at its end and without the prefix all such runs share.
    """
    found: dict[str, str] = {}
    others: dict[str, str] = {}
    for run_id, contender in runs:
        stem = run_id.removesuffix(f"-{contender}") or run_id
        match = _BENCH_RUN.match(stem)
        if match:
            found[run_id] = match["rest"]
        else:
            others[run_id] = stem
    short = short_run_ids(others.values())
    found.update({run: short[stem] for run, stem in others.items()})
    return found


# -- text from the data ----------------------------------------------------------------------

#: Characters that would end or split a line, or hide, in a table cell, a legend or a
#: terminal line: C0 and C1 controls, line and paragraph separators, zero-width and
#: direction marks.
_INVISIBLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]"
)
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str) -> str:
    """``text`` on one line, every control or invisible character written as an escape
    (``\\n``, ``\\x1b``, ``\\u2028``): a label, run id or name from the traced
    program, shown as it is rather than obeyed."""

    def escape(match: re.Match[str]) -> str:
        char = match.group()
        named = _NAMED.get(char)
        if named is not None:
            return named
        code = ord(char)
        return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"

    return _INVISIBLE.sub(escape, text)
