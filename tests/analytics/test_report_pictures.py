"""The report's pictures and tables for the drop-in loop, the server and kafka, from a
bench's results: what the README leads with is drawn, no panel is empty, an outlier
does not flatten the axis, one meaning of a ratio, and ranges decide "no difference".
No Spark: the parts that read bench-results.json and draw from it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from aiowheel.analytics import plots, render
from aiowheel.analytics.bench_results import (
    drop_in,
    headline,
    kafka_mismatches,
    load_bench_results,
    server_figures,
)
from aiowheel.analytics.inputs import TraceFiles
from aiowheel.analytics.render import NO_DIFFERENCE, Headline
from aiowheel.analytics.schema import LOOP_PNG, SERVER_PNG

pd = pytest.importorskip("pandas")


def _result(
    workload: str,
    variant: str,
    metric: str,
    contender: str,
    kind: str,
    samples: list[float],
    *,
    better: str = "higher",
    unit: str = "1/s",
    label: str | None = None,
    ratios: dict[str, float | None] | None = None,
    params: dict[str, Any] | None = None,
    skipped: str | None = None,
) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "workload": workload,
        "variant": variant,
        "metric": metric,
        "label": label or metric,
        "unit": unit,
        "better": better,
        "contender": contender,
        "kind": kind,
        "backend": contender.split("-")[-1],
        "median": ordered[len(ordered) // 2] if ordered else None,
        "min": ordered[0] if ordered else None,
        "max": ordered[-1] if ordered else None,
        "samples": samples,
        "reps": len(samples),
        "n": None,
        "params": params or {},
        "ratios": ratios,
        "skipped": skipped,
    }


def _bench(tmp_path: Path) -> Path:
    server = []
    for contender, kind, rps, cpu in (
        ("loop-uvloop", "loop", [10_000.0, 10_400.0, 10_200.0], [80.0, 84.0, 82.0]),
        ("call_later-uvloop", "call_later", [10_100.0, 10_300.0, 9_900.0], [95.0, 99.0, 97.0]),
    ):
        ours = contender.startswith("loop-")
        ratios = None if ours else {"loop-uvloop": 10_200 / 10_100}
        server.append(_result("server", "trivial", "rps", contender, kind, rps, ratios=ratios))
        cpu_ratios = None if ours else {"loop-uvloop": 97 / 82}
        server.append(
            _result(
                "server",
                "trivial",
                "cpu_us",
                contender,
                kind,
                cpu,
                better="lower",
                unit="us",
                ratios=cpu_ratios,
            )
        )
    for variant, fractions in (("protocol", [0.97, 1.02, 0.99]), ("middleware", [0.8, 0.83, 0.78])):
        server.append(
            _result("server", variant, "rps", "call_later-uvloop", "call_later", [8_000.0, 8_300.0])
        )
        server.append(
            _result(
                "server",
                variant,
                "vs_uvicorn",
                "call_later-uvloop",
                "call_later",
                fractions,
                unit="x",
            )
        )
    loop = [
        _result("loop-steps", "", "steps_s", "loop-asyncio", "loop", [200.0, 210.0]),
        _result(
            "loop-steps",
            "",
            "steps_s",
            "call_later-asyncio",
            "call_later",
            [100.0, 105.0],
            ratios={"loop-asyncio": 2.0},
        ),
        _result("loop-steps", "", "steps_s", "loop-uvloop", "loop", [100.0, 104.0]),
        _result(
            "loop-steps",
            "",
            "steps_s",
            "call_later-uvloop",
            "call_later",
            [102.0, 103.0],
            ratios={"loop-uvloop": 1.0},
        ),
    ]
    timers = [
        _result(
            "idle",
            "N=1,000",
            "cpu_s",
            "aiowheel-trio",
            "aiowheel",
            [0.01, 0.011],
            better="lower",
            unit="s",
        ),
        _result(
            "idle",
            "N=1,000",
            "cpu_s",
            "trio-native",
            "trio",
            [7.7, 7.8],
            better="lower",
            unit="s",
            ratios={"aiowheel-trio": 771.3},
        ),
        _result(
            "idle",
            "N=1,000",
            "cpu_s",
            "call_later-asyncio",
            "call_later",
            [0.02, 0.021],
            better="lower",
            unit="s",
            ratios={"aiowheel-asyncio": 2514.82},
        ),
        _result(
            "idle",
            "N=1,000",
            "cpu_s",
            "aiowheel-asyncio",
            "aiowheel",
            [0.01, 0.0101],
            better="lower",
            unit="s",
        ),
    ]
    kafka = [
        _result(
            "kafka",
            "high",
            "sustained_rps",
            "call_later-uvloop",
            "call_later",
            [160_000.0],
            params={"case": "high", "sustain_s": 1.0},
        ),
        _result(
            "kafka",
            "high",
            "sustained_rps",
            "aiowheel-uvloop",
            "aiowheel",
            [200_000.0],
            params={"case": "high", "sustain_s": 1.0},
        ),
        _result(
            "kafka",
            "high at 100,000",
            "cpu_s_per_m",
            "aiowheel-uvloop",
            "aiowheel",
            [],
            better="lower",
            unit="s",
            params={"case": "high", "rate": 100_000, "probe": {"lag_p99_ms": 70.0}},
            skipped="fell behind at 100,000 req/s (saturated)",
        ),
        _result(
            "kafka",
            "high at 100,000",
            "cpu_s_per_m",
            "call_later-uvloop",
            "call_later",
            [],
            better="lower",
            unit="s",
            ratios={"aiowheel-uvloop": None},
            params={"case": "high", "rate": 100_000, "probe": {"lag_p99_ms": 61.0}},
            skipped="fell behind at 100,000 req/s (saturated)",
        ),
    ]
    data = {
        "version": 1,
        "settings": {"quick": True, "reps": 3, "kafka_target_seconds": 0.6},
        "machine": {"python": "3.12.1", "cpus": 2},
        "results": [*server, *loop, *timers, *kafka],
    }
    path = tmp_path / "bench" / "bench-results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path


def _markdown(bench_path: Path, out: Path) -> str:
    bench = load_bench_results(bench_path)
    summary = pd.DataFrame(
        {
            "workload": ["idle"],
            "contender": ["aiowheel-asyncio"],
            "run_id": ["r"],
            "label": [None],
            "scheduled": [1],
            "fired": [1],
            "cancelled": [0],
            "cancel_ratio": [0.0],
            **{f"lateness_{p}_ms": [1.0] for p in ("p50", "p90", "p99", "p999", "max")},
            "lifetime_p50_s": [0.5],
        }
    )
    files = TraceFiles(local=(str(out.parent / "traces" / "r.parquet"),), remote=(), rows=1)
    source = Headline(bench, headline(bench), "", drop_in(bench))
    return render.render_markdown(summary, files, 1, "local[1]", "4", source, out=out)


def test_the_server_section_has_every_variant_with_ranges_and_costs_in_percent(
    tmp_path: Path,
) -> None:
    text = _markdown(_bench(tmp_path), tmp_path / "report")
    section = text.split("## The server")[1].split("\n## ")[0]
    assert f"]({SERVER_PNG})" in section
    assert "| trivial | loop-uvloop | 10,200 (10,000-10,400) | 82 (80-84) | - |" in section
    # The middleware rows, as a cost in percent; a range holding 0% is no difference.
    assert "| middleware | call_later-uvloop | 8,300 (8,000-8,300) | - | -20% (-22% to -17%) |" in (
        section
    )
    assert (
        f"| protocol | call_later-uvloop | 8,300 (8,000-8,300) | - | {NO_DIFFERENCE} (-3% to +2%) |"
        in (section)
    )
    assert "0.8\u00d7" not in section  # no fraction printed as a ratio


def test_ratios_have_one_meaning_two_digits_and_overlapping_ranges_are_no_difference(
    tmp_path: Path,
) -> None:
    text = _markdown(_bench(tmp_path), tmp_path / "report")
    assert "2,500\u00d7" in text  # 2514.82x to two significant digits
    assert "770\u00d7" in text
    assert "2514" not in text
    # A skipped peer's reason is said once under its table, not in every cell.
    assert "| skipped (1) |" in text
    assert "1. skipped: fell behind at 100,000 req/s (saturated)" in text
    assert "771.3" not in text
    drop = text.split("## The drop-in loop")[1].split("\n## ")[0]
    assert f"]({LOOP_PNG})" in drop
    # loop-uvloop 100-104 against 102-103: ranges overlap; loop-asyncio 200-210 vs 100-105: 2x.
    assert f"| loop-steps | steps_s (1/s, higher is better) | 2\u00d7 | {NO_DIFFERENCE} |" in drop


def test_report_md_names_no_absolute_path(tmp_path: Path) -> None:
    text = _markdown(_bench(tmp_path), tmp_path / "report")
    assert str(tmp_path) not in text
    assert "`../bench/bench-results.json`" in text
    assert "`../traces/r.parquet`" in text


def test_kafka_search_and_fixed_rate_disagreeing_is_explained(tmp_path: Path) -> None:
    bench = load_bench_results(_bench(tmp_path))
    (found,) = [m for m in kafka_mismatches(bench) if m.contender == "call_later-uvloop"]
    assert (found.sustained, found.rate, found.why) == (
        160_000.0,
        100_000.0,
        "arrival lag p99 61 ms",
    )
    text = _markdown(_bench(tmp_path / "md"), tmp_path / "report")
    kafka = text.split("## Kafka")[1].split("\n## ")[0]
    assert "**The search and the fixed rates disagree here:**" in kafka
    assert (
        "- `call_later-uvloop` (high): held 160,000 req/s for 1 s in its search, fell behind "
        "at 100,000 req/s for 0.6 s in the fixed-rate run (arrival lag p99 61 ms)"
    ) in kafka


def test_pictures_for_the_loop_and_the_server_no_empty_panel_no_flattening_outlier(
    tmp_path: Path,
) -> None:
    bench = load_bench_results(_bench(tmp_path))
    ratios = headline(bench)
    figure = plots.plot_headline(ratios, tmp_path / "headline.png")
    titles = [ax.get_title(loc="left") for ax in figure.axes]
    assert not any("100,000" in title for title in titles)  # every peer skipped: no panel
    assert "no ratio: every peer skipped" in figure._supxlabel.get_text()  # type: ignore[attr-defined]
    (ax,) = figure.axes
    low, high = ax.get_xlim()
    assert high <= 3 * plots.RATIO_AXIS_LIMIT  # 2,500x does not set the axis
    texts = [t.get_text() for t in ax.texts]
    assert any("2,500\u00d7" in t and "off the axis" in t for t in texts)
    loop = plots.plot_headline(drop_in(bench), tmp_path / LOOP_PNG, ours="the drop-in loop")
    loop_texts = [t.get_text() for ax in loop.axes for t in ax.texts]
    assert any(NO_DIFFERENCE in t for t in loop_texts)
    server = server_figures(bench)
    assert set(server["variant"]) == {"trivial", "protocol", "middleware"}
    picture = plots.plot_server(server, tmp_path / SERVER_PNG)
    assert [ax.get_title(loc="left") for ax in picture.axes][:2] == [
        "requests/s (higher is better)",
        "server CPU per request, \u00b5s (lower is better)",
    ]
    # Whiskers: one per figure with a range (every one here has several rounds).
    whiskers = [c for c in picture.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(whiskers) == len(server[server["metric"] == "rps"])
    assert (tmp_path / SERVER_PNG).stat().st_size > 0
    assert math.isfinite(low)


def test_kafka_results_whose_params_are_no_object_are_left_out(tmp_path: Path) -> None:
    path = _bench(tmp_path)
    data = json.loads(path.read_text())
    for result in data["results"]:
        if result["workload"] == "kafka":
            result["params"] = ["rate"]
    path.write_text(json.dumps(data))
    bench = load_bench_results(path)
    assert kafka_mismatches(bench) == []
    from aiowheel.analytics.bench_results import kafka_rates

    assert kafka_rates(bench).empty


def test_a_long_reason_for_a_missing_bar_is_said_once_under_the_figure(tmp_path: Path) -> None:
    # A peer skipped for a long reason (rloop under wrk) had it drawn beside every row:
    # it ran off the figure, and constrained layout pushed the metric names out of it.
    why = "skipped: rloop 0.5.0 under wrk: " + "a reason long enough to run off " * 4
    row = {
        "workload": "server",
        "variant": "trivial",
        "label": "requests/s",
        "unit": "1/s",
        "better": "higher",
        "aiowheel": "loop-uvloop",
        "peer_median": 1.0,
        "aiowheel_median": 1.0,
        "peer_min": 1.0,
        "peer_max": 1.0,
        "aiowheel_min": 1.0,
        "aiowheel_max": 1.0,
        "no_difference": False,
    }
    rows = [
        {**row, "metric": metric, "peer": "call_later-uvloop", "ratio": 1.5, "note": ""}
        for metric in ("rps", "cpu_us")
    ] + [
        {**row, "metric": metric, "peer": "call_later-rloop", "ratio": math.nan, "note": why}
        for metric in ("rps", "cpu_us")
    ]
    figure = plots.plot_headline(pd.DataFrame(rows), tmp_path / LOOP_PNG, ours="the drop-in loop")
    beside = [t.get_text() for ax in figure.axes for t in ax.texts]
    assert not any("rloop 0.5.0" in text for text in beside)
    assert sum("no bar (why: under the figure)" in text for text in beside) == 2
    note = figure._supxlabel.get_text()  # type: ignore[attr-defined]
    assert note.count("rloop 0.5.0 under wrk") == 1
    assert all(len(line) <= plots._NOTE_WIDTH for line in note.splitlines())
