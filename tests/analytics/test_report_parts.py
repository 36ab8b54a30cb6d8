"""The report's presentation on hand-made aggregates: no Spark, no JVM."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from aiowheel.analytics import plots, report
from aiowheel.analytics.inputs import TraceFiles
from aiowheel.analytics.job import CDF_QUANTILES

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("rich")

PNG = b"\x89PNG\r\n\x1a\n"


def _summary(runs: list[tuple[str, str, str, str | None, int, int]]) -> Any:
    rows = []
    for run_id, implementation, backend, label, fired, cancelled in runs:
        cdf = [q / 100 for q in CDF_QUANTILES] if fired else None
        rows.append(
            {
                "run_id": run_id,
                "implementation": implementation,
                "backend": backend,
                "host": "h",
                "label": label,
                "scheduled": fired + cancelled,
                "fired": fired,
                "cancelled": cancelled,
                "cancel_ratio": cancelled / (fired + cancelled),
                "lateness_p50_ms": 1.0 if fired else math.nan,
                "lateness_p90_ms": 2.0 if fired else math.nan,
                "lateness_p99_ms": 3.0 if fired else math.nan,
                "lateness_p999_ms": 4.0 if fired else math.nan,
                "lateness_max_ms": 5.0 if fired else math.nan,
                "lifetime_p50_s": 0.5,
                "lateness_cdf": cdf,
            }
        )
    return pd.DataFrame(rows)


def _windows(run_ids: list[str], seconds: int = 3) -> Any:
    rows = [
        {
            "run_id": run,
            "implementation": "aiowheel",
            "backend": "asyncio",
            "host": "h",
            "second": pd.Timestamp(1_700_000_000 + s, unit="s", tz="UTC"),
            "elapsed_s": s,
            "scheduled": 10,
            "fired": 5,
            "cancelled": 5,
            "lateness_p99_ms": 1.0 + s if s != 1 else math.nan,
        }
        for run in run_ids
        for s in range(seconds)
    ]
    return pd.DataFrame(rows)


def test_short_run_ids_drop_the_shared_prefix() -> None:
    ids = ["bench-20261121T1-42-fire-aiowheel", "bench-20261121T1-42-churn-aiowheel"]
    assert plots.short_run_ids(ids) == {
        ids[0]: "fire-aiowheel",
        ids[1]: "churn-aiowheel",
    }
    assert plots.short_run_ids(["only"]) == {"only": "only"}
    assert plots.short_run_ids(["abc-1", "abd-2"]) == {"abc-1": "abc-1", "abd-2": "abd-2"}


def test_legend_names_add_the_run_only_when_needed() -> None:
    summary = _summary(
        [
            ("x-1", "aiowheel", "asyncio", None, 10, 0),
            ("x-2", "aiowheel", "asyncio", None, 10, 0),
            ("x-3", "call_later", "asyncio", None, 10, 0),
        ]
    )
    assert plots.run_names(summary) == {
        "x-1": "aiowheel/asyncio (1)",
        "x-2": "aiowheel/asyncio (2)",
        "x-3": "call_later/asyncio",
    }


def test_plots_are_pngs_even_when_nothing_fired(tmp_path: Path) -> None:
    summary = _summary([("r", "aiowheel", "trio", "idle", 0, 7)])
    windows = _windows(["r"]).assign(fired=0, lateness_p99_ms=math.nan)
    plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    plots.plot_lateness_p99(windows, tmp_path / "p99.png")
    plots.plot_rates(windows, tmp_path / "rates.png")
    for name in ("cdf.png", "p99.png", "rates.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


def test_plots_draw_the_busiest_series_only(tmp_path: Path) -> None:
    many = [(f"run-{i:02d}", "aiowheel", "asyncio", None, 100 + i, 1) for i in range(15)]
    plots.plot_lateness_cdf(_summary(many), tmp_path / "cdf.png")
    plots.plot_lateness_p99(_windows([r[0] for r in many]), tmp_path / "p99.png")
    assert (tmp_path / "cdf.png").read_bytes()[:8] == PNG
    assert (tmp_path / "p99.png").read_bytes()[:8] == PNG


def test_the_table_narrows_by_leaving_columns_out() -> None:
    from rich.console import Console

    summary = _summary(
        [
            ("bench-1-fire-aiowheel-asyncio", "aiowheel", "asyncio", None, 10, 5),
            ("bench-1-churn-aiowheel-asyncio", "aiowheel", "asyncio", None, 10, 5),
        ]
    )
    wide = summary_headers(report.summary_table(summary))
    assert wide[0] == "run"  # two runs share aiowheel/asyncio
    assert "lifetime p50 s" in wide
    assert "label" not in wide  # no run has labels
    narrow_table = report.summary_table(summary, 110)
    narrow = summary_headers(narrow_table)
    assert "lifetime p50 s" not in narrow
    assert {"run", "p50 ms", "p99 ms", "p99.9 ms"} <= set(narrow)
    assert Console(width=10_000).measure(narrow_table).maximum <= 110


def summary_headers(table: Any) -> list[str]:
    return [str(column.header) for column in table.columns]


def test_markdown_report_embeds_the_plots_and_the_table() -> None:
    summary = _summary([("r", "aiowheel", "uvloop", "req|x", 3, 1)])
    files = TraceFiles(local=("/t/a.parquet",), remote=("hdfs:///t",), rows=4)
    text = report.render_markdown(summary, files, 4, "local[2]", "4.3.0")
    assert text.startswith("# aiowheel timer report\n")
    assert "4 timers from 2 trace file(s), analysed with Spark 4.3.0 (local[2])" in text
    for name in (plots.CDF_PNG, plots.P99_PNG, plots.RATES_PNG):
        assert f"]({name})" in text
    assert "| req\\|x |" in text  # a | in a label does not break the table
    assert "- `hdfs:///t`" in text
