"""A measured figure: one metric of one contender on one workload variant, over reps."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .contenders import Contender

__all__ = ["Result", "ratio", "ratio_range"]


@dataclass
class Result:
    workload: str
    variant: str  # "N=1,000,000", "high", ...
    n: int | None
    metric: str
    label: str
    unit: str
    better: str  # "lower" | "higher"
    contender: Contender
    samples: list[float]
    has_ratio: bool = True
    params: dict[str, Any] = field(default_factory=dict)
    #: aiowheel contender name -> how many times better aiowheel is (> 1: aiowheel
    #: better), filled in for peers once every contender of the variant is measured.
    ratios: dict[str, float | None] = field(default_factory=dict)
    #: The same keys: the ratio's range over the repetitions, [low, high] (the worst
    #: and the best pairing of the two contenders' min and max), None with fewer than
    #: two repetitions on either side. A range holding 1: no difference measured.
    ratio_ranges: dict[str, list[float] | None] = field(default_factory=dict)
    skipped: str | None = None
    #: Why the contender, which was to run, has no figure: it failed (a server that
    #: stopped answering, an exception, a timeout). ``skipped`` is then
    #: ``"failed: " + failed``, so that readers of ``skipped`` alone see it too.
    failed: str | None = None
    #: Why this figure, measured, is not comparable in this run (its ratios, and the
    #: peers' ratios against it, are None): e.g. a loop that fell behind.
    withheld: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def low(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def high(self) -> float:
        return max(self.samples) if self.samples else math.nan

    def as_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "type": "result",
            "workload": self.workload,
            "variant": self.variant,
            "n": self.n,
            "metric": self.metric,
            "label": self.label,
            "unit": self.unit,
            "better": self.better,
            "contender": self.contender.name,
            "kind": self.contender.kind,
            "backend": self.contender.backend,
            # The aiowheel core that ran it ("compiled" | "pure"; None: not aiowheel),
            # and why the pure one (aiowheel._compiled.REASON in its process).
            "core": self.contender.core,
            "core_reason": self.contender.core_reason,
            "median": num(self.median),
            "min": num(self.low),
            "max": num(self.high),
            "samples": [num(s) for s in self.samples],
            "reps": len(self.samples),
            "ratios": self.ratios,
            "ratio_ranges": self.ratio_ranges,
            "skipped": self.skipped,
            "failed": self.failed,
            "params": self.params,
        }


def ratio(aiowheel: Result, peer: Result) -> float | None:
    """How many times better aiowheel's median is than the peer's (> 1: better).

    None when a ratio means nothing: a missing or non-positive figure (lateness can
    be negative on uvloop, which fires early).
    """
    a, p = aiowheel.median, peer.median
    if not (math.isfinite(a) and math.isfinite(p)) or a <= 0 or p <= 0:
        return None
    return p / a if aiowheel.better == "lower" else a / p


def ratio_range(aiowheel: Result, peer: Result) -> list[float] | None:
    """The lowest and the highest ``ratio`` the repetitions allow: aiowheel's worst
    against the peer's best, and its best against the peer's worst. None without two
    repetitions on each side (one repetition has no range) or a non-positive figure."""
    if len(aiowheel.samples) < 2 or len(peer.samples) < 2:
        return None
    a_low, a_high, p_low, p_high = aiowheel.low, aiowheel.high, peer.low, peer.high
    values = (a_low, a_high, p_low, p_high)
    if not all(math.isfinite(v) and v > 0 for v in values):
        return None
    if aiowheel.better == "lower":
        return [p_low / a_high, p_high / a_low]
    return [a_low / p_high, a_high / p_low]


#: The base a peer with no aiowheel contender on its own backend is compared with.
_PREFERRED = ("uvloop", "asyncio", "trio")


def fill_ratios(results: list[Result]) -> None:
    """Give every peer result its ratios against the untraced aiowheel contender of
    the same workload, variant, metric and *backend* (None where either figure is
    withheld): a ratio always compares one event loop with itself, the timer being
    the only difference (``call_later-uvloop`` against ``loop-asyncio`` would read
    uvloop's lead over asyncio as a regression of the drop-in loop).

    A peer with no aiowheel contender on its backend (``call_later-rloop``: there is
    no drop-in loop on rloop) gets one ratio, against the first of ``_PREFERRED``
    measured (uvloop: the fastest base), and the tables say so. A
    traced aiowheel contender (``-traced``, ``-sampled``) is a peer here: its ratio
    against its untraced self is what tracing costs."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.workload, r.variant, r.metric), []).append(r)
    for group in groups.values():
        ours = [r for r in group if r.contender.baseline and r.samples]
        for r in group:
            if r.contender.baseline or not r.has_ratio:
                continue
            against = [a for a in ours if a.contender.backend == r.contender.backend]
            if not against and ours:
                against = [
                    min(
                        ours,
                        key=lambda a: (
                            _PREFERRED.index(a.contender.backend)
                            if a.contender.backend in _PREFERRED
                            else len(_PREFERRED)
                        ),
                    )
                ]
            r.ratios = {
                a.contender.name: None if r.withheld or a.withheld else ratio(a, r) for a in against
            }
            r.ratio_ranges = {
                a.contender.name: None if r.withheld or a.withheld else ratio_range(a, r)
                for a in against
            }
