"""Figures and ratios (aiowheel/bench/results.py)."""

from __future__ import annotations

import json
import math

from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.results import Result, fill_ratios, ratio

OURS, OURS_TRIO, PEER = CONTENDERS[0], CONTENDERS[2], CONTENDERS[3]


def result(contender: object, better: str, *samples: float, metric: str = "m") -> Result:
    return Result("w", "v", 1, metric, metric, "", better, contender, list(samples))  # type: ignore[arg-type]


def test_ratio_direction() -> None:
    # Lower is better: the peer's 300 ns against our 100 ns is 3x in our favour.
    assert ratio(result(OURS, "lower", 100.0), result(PEER, "lower", 300.0)) == 3.0
    # Higher is better: our 200k/s against the peer's 100k/s is 2x.
    assert ratio(result(OURS, "higher", 2e5), result(PEER, "higher", 1e5)) == 2.0
    # Negative lateness (fired early) or nothing measured: no ratio.
    assert ratio(result(OURS, "lower", 1.0), result(PEER, "lower", -0.5)) is None
    assert ratio(result(OURS, "lower", 1.0), result(PEER, "lower")) is None


def test_median_min_max() -> None:
    r = result(OURS, "lower", 3.0, 1.0, 2.0)
    assert (r.median, r.low, r.high) == (2.0, 1.0, 3.0)
    empty = result(OURS, "lower")
    assert math.isnan(empty.median)
    assert empty.as_json()["median"] is None


def test_fill_ratios() -> None:
    ours, ours_trio = result(OURS, "lower", 100.0), result(OURS_TRIO, "lower", 200.0)
    peer, skipped = result(PEER, "lower", 400.0), result(CONTENDERS[4], "lower")
    skipped.skipped = "uvloop is not installed"
    count = result(PEER, "lower", 5.0, metric="count")
    count.has_ratio = False
    fill_ratios([ours, ours_trio, peer, skipped, count])
    # Against aiowheel on the peer's own backend only (issue 32).
    assert peer.ratios == {"aiowheel-asyncio": 4.0}
    # None on its backend (uvloop): against the one preferred base measured.
    assert skipped.ratios == {"aiowheel-asyncio": None}
    assert count.ratios == {}  # no ratio for a figure that describes the input
    assert ours.ratios == {}
    # A withheld figure has no ratio, and nothing is compared with it.
    ours.withheld = "fell behind"
    fill_ratios([ours, ours_trio, peer])
    assert peer.ratios == {"aiowheel-asyncio": None}


def test_as_json_is_strict_json() -> None:
    r = result(PEER, "higher", math.inf, 2.0)
    line = r.as_json()
    assert line["samples"] == [None, 2.0]
    json.dumps(line, allow_nan=False)
