"""The report's presentation on hand-made aggregates: no Spark, no JVM.

The figures are checked as a reader would read them: one panel per workload, every
contender in its fixed colour in every panel and figure, the 1x line and the log
scale of the headline, and a note instead of a traceback when there is nothing to
draw.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from aiowheel.analytics import plots, render, schema
from aiowheel.analytics.bench_results import headline, load_bench_results
from aiowheel.analytics.inputs import (
    Completeness,
    TraceFiles,
    completeness_lines,
    find_traces,
    sampling_lines,
)
from aiowheel.analytics.render import Headline
from aiowheel.analytics.schema import CDF_QUANTILES

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("rich")
from matplotlib.colors import to_hex  # noqa: E402 - after the importorskip

PNG = b"\x89PNG\r\n\x1a\n"
BENCH = Path(__file__).with_name("data") / "bench-results-quick.json"
STAMP = "bench-20261121T151509-3609"


def _summary(runs: list[tuple[str, str, str, str | None, int, int]]) -> Any:
    """Rows as job.run_job returns them, named (contender, workload) the same way."""
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
    return _named(pd.DataFrame(rows))


def _windows(summary: Any, seconds: int = 3) -> Any:
    rows = [
        {
            "run_id": run.run_id,
            "implementation": run.implementation,
            "backend": run.backend,
            "host": "h",
            "second": pd.Timestamp(1_700_000_000 + s, unit="s", tz="UTC"),
            "elapsed_s": s,
            "scheduled": 10,
            "fired": 5 if run.fired else 0,
            "cancelled": 5 if run.cancelled else 0,
            "lateness_p99_ms": (1.0 + s if s != 1 else math.nan) if run.fired else math.nan,
        }
        for run in summary.drop_duplicates("run_id").itertuples()
        for s in range(seconds)
    ]
    return _named(pd.DataFrame(rows))


def _named(frame: Any) -> Any:
    frame.insert(
        0,
        "contender",
        [
            schema.contender_name(i, b)
            for i, b in zip(frame["implementation"], frame["backend"], strict=True)
        ],
    )
    runs = dict(zip(frame["run_id"], frame["contender"], strict=True))
    names = schema.workload_names(runs.items())
    frame.insert(0, "workload", [names[run] for run in frame["run_id"]])
    return frame


def _bench_runs(workloads: list[str], fired: int = 100) -> Any:
    """Every contender of a bench on each workload, with bench-style run ids."""
    runs = []
    for workload in workloads:
        for kind, backend in (
            ("aiowheel", "asyncio"),
            ("aiowheel", "trio"),
            ("call_later", "asyncio"),
            ("trio", "trio"),
        ):
            name = schema.contender_name(kind, backend)
            runs.append((f"{STAMP}-{workload}-{name}", kind, backend, None, fired, 3))
    return _summary(runs)


def _colours(ax: Any) -> set[str]:
    return {to_hex(line.get_color()) for line in ax.get_lines()}


def _panel_titles(figure: Any) -> list[str]:
    return [ax.get_title(loc="left") for ax in figure.axes if ax.get_visible()]


# -- naming runs -------------------------------------------------------------------------


def test_short_run_ids_drop_the_shared_prefix() -> None:
    ids = ["bench-20261121T1-42-fire-aiowheel", "bench-20261121T1-42-churn-aiowheel"]
    assert schema.short_run_ids(ids) == {
        ids[0]: "fire-aiowheel",
        ids[1]: "churn-aiowheel",
    }
    assert schema.short_run_ids(["only"]) == {"only": "only"}
    assert schema.short_run_ids(["abc-1", "abd-2"]) == {"abc-1": "abc-1", "abd-2": "abd-2"}


def test_contender_names_are_the_benchs() -> None:
    assert schema.contender_name("aiowheel", "uvloop") == "aiowheel-uvloop"
    assert schema.contender_name("call_later", "asyncio") == "call_later-asyncio"
    assert schema.contender_name("trio", "trio") == "trio-native"
    assert schema.contender_name("deadline", "uvloop") == "deadline-uvloop"


def test_workloads_come_from_bench_run_ids() -> None:
    runs = [
        (f"{STAMP}-churn-aiowheel-asyncio", "aiowheel-asyncio"),
        (f"{STAMP}-churn-trio-native", "trio-native"),
        (f"{STAMP}-idle-N10000-call_later-uvloop", "call_later-uvloop"),
    ]
    assert schema.workload_names(runs) == {
        runs[0][0]: "churn",
        runs[1][0]: "churn",
        runs[2][0]: "idle-N10000",
    }
    # One bench workload alone is still named, not left as the whole run id.
    assert schema.workload_names(runs[:1]) == {runs[0][0]: "churn"}


def test_other_runs_are_their_own_workloads() -> None:
    runs = [
        ("20261121T1515-101-ab12", "aiowheel-asyncio"),
        ("20261121T1515-102-cd34", "aiowheel-asyncio"),
        ("api-eu-aiowheel-trio", "aiowheel-trio"),  # the contender at the end is dropped
    ]
    assert schema.workload_names(runs) == {
        "20261121T1515-101-ab12": "20261121T1515-101-ab12",
        "20261121T1515-102-cd34": "20261121T1515-102-cd34",
        "api-eu-aiowheel-trio": "api-eu",
    }
    assert schema.workload_names([("e2e", "aiowheel-asyncio")]) == {"e2e": "e2e"}


# -- colours -------------------------------------------------------------------------------


def test_every_contender_has_its_own_fixed_colour() -> None:
    assert tuple(plots.CONTENDER_COLOURS) == schema.CONTENDERS
    colours = list(plots.CONTENDER_COLOURS.values())
    assert len(set(colours)) == len(colours)
    for name, colour in plots.CONTENDER_COLOURS.items():
        assert plots.contender_colour(name) == colour


def test_an_unknown_contender_gets_a_stable_colour() -> None:
    first = plots.contender_colour("twisted-reactor")
    assert first == plots.contender_colour("twisted-reactor")
    assert first not in plots.CONTENDER_COLOURS.values()
    # crc32, not Python's salted hash: the same in every process (fixed here).
    assert first == "#393b79"


def test_every_figure_has_a_panel_per_workload_and_the_fixed_colours(tmp_path: Path) -> None:
    summary = _bench_runs(["fire", "spread"])
    windows = _windows(summary)
    expected = {plots.contender_colour(name) for name in summary["contender"]}
    assert len(expected) == 4

    cdf = plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    assert _panel_titles(cdf) == [
        "fire: lateness CDF",
        "fire: tail (p99 at 1e-2)",
        "spread: lateness CDF",
        "spread: tail (p99 at 1e-2)",
    ]
    p99 = plots.plot_lateness_p99(windows, tmp_path / "p99.png")
    assert _panel_titles(p99) == ["fire", "spread"]
    rates = plots.plot_rates(windows, tmp_path / "rates.png")
    assert _panel_titles(rates) == [
        "fire: fired per second",
        "fire: cancelled per second",
        "spread: fired per second",
        "spread: cancelled per second",
    ]
    for figure in (cdf, p99, rates):
        for ax in figure.axes:
            assert _colours(ax) == expected  # every contender, in its colour, everywhere
        legend = figure.legends[0]
        shown = {
            text.get_text(): to_hex(handle.get_color())
            for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)
        }
        assert shown == {name: plots.CONTENDER_COLOURS[name] for name in summary["contender"]}
    for name in ("cdf.png", "p99.png", "rates.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


def test_labels_are_line_styles_and_named_in_the_legend(tmp_path: Path) -> None:
    summary = _summary(
        [
            ("e2e", "aiowheel", "asyncio", "req", 10, 0),
            ("e2e", "aiowheel", "asyncio", "idle", 10, 0),
            ("e2e", "aiowheel", "asyncio", None, 10, 0),
        ]
    )
    figure = plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    styles = {line.get_linestyle() for line in figure.axes[0].get_lines()}
    assert len(styles) == 3
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert texts == ["aiowheel-asyncio", "no label", "label idle", "label req"]


def test_workloads_beyond_the_limit_are_named_under_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plots, "MAX_PANELS", 2)  # 12 in earnest: the same code, faster
    names = ["w0", "w1", "w2", "w3"]
    summary = _summary(
        [
            (f"{STAMP}-{w}-aiowheel-asyncio", "aiowheel", "asyncio", None, 100 + i, 0)
            for i, w in enumerate(names)
        ]
    )
    figure = plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    assert _panel_titles(figure)[::2] == ["w2: lateness CDF", "w3: lateness CDF"]  # busiest
    assert figure.get_supxlabel() == "not shown (more than a figure holds): w0, w1"


def test_nothing_fired_is_said_not_drawn(tmp_path: Path) -> None:
    summary = _summary([("r", "aiowheel", "trio", "idle", 0, 7)])
    windows = _windows(summary)
    cdf = plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    assert "no timer fired" in cdf.get_supxlabel()
    assert "no lateness to show" in cdf.axes[0].texts[0].get_text()
    p99 = plots.plot_lateness_p99(windows, tmp_path / "p99.png")
    assert "no timer fired" in p99.get_supxlabel()
    rates = plots.plot_rates(windows, tmp_path / "rates.png")
    assert rates.axes[0].texts[0].get_text() == "no timer fired"
    for name in ("cdf.png", "p99.png", "rates.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


def test_a_lateness_that_is_all_nan_is_a_note_not_a_traceback(tmp_path: Path) -> None:
    # Fired timers whose lateness is NaN (or null) in the trace: Spark's percentiles
    # are then NaN (or null) too.
    summary = _bench_runs(["fire", "spread"])
    nan = [math.nan] * len(CDF_QUANTILES)
    summary["lateness_cdf"] = [
        nan if w == "fire" else [None] * len(CDF_QUANTILES) for w in summary["workload"]
    ]
    windows = _windows(summary).assign(lateness_p99_ms=math.nan)
    cdf = plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    assert cdf.get_supxlabel() == "not shown (no lateness recorded): fire, spread"
    p99 = plots.plot_lateness_p99(windows, tmp_path / "p99.png")
    assert "no lateness recorded" in p99.get_supxlabel()
    assert (tmp_path / "cdf.png").read_bytes()[:8] == PNG


def test_early_timers_are_drawn_left_of_zero_and_counted(tmp_path: Path) -> None:
    # Issue 21: early firings were drawn at 1 us, as the most punctual timers.
    summary = _summary([("r", "call_later", "uvloop", None, 10, 0)])
    summary["lateness_cdf"] = [[-0.002 + q / 100 for q in CDF_QUANTILES]]
    summary["early"] = [3]
    figure = plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    cdf, tail = figure.axes[0], figure.axes[1]
    assert cdf.get_xscale() == "symlog"
    xs = [x for x in cdf.get_lines()[0].get_xdata() if x < 0]
    assert min(xs) == pytest.approx(-2.0)  # ms, on the early side of zero
    assert cdf.get_xlim()[0] < -2.0
    assert cdf.get_title(loc="right") == "fired early:\ncall_later-uvloop 3 of 10 (30.0%)"
    # The tail (1 - CDF, log-log) is about the late side: early is at its floor there.
    assert min(tail.get_lines()[0].get_xdata()) == pytest.approx(1e-3)


# -- the headline ----------------------------------------------------------------------


def test_the_headline_figure_reads_as_ratios_around_one(tmp_path: Path) -> None:
    bench = load_bench_results(BENCH)
    ratios = headline(bench)
    figure = plots.plot_headline(ratios, tmp_path / "headline.png", "quick sizes")
    titles = _panel_titles(figure)
    assert titles == ["churn (N=100,000)", "fire (N=50,000)", "spread (N=20,000)"]
    for ax in figure.axes:
        assert ax.get_xscale() == "log"
        assert any(list(line.get_xdata()) == [1.0, 1.0] for line in ax.get_lines())  # 1x
        bars = ax.patches
        assert {to_hex(bar.get_facecolor()) for bar in bars} == {
            plots.CONTENDER_COLOURS[p]
            for p in ("call_later-asyncio", "call_later-uvloop", "trio-native")
        }
        for bar in bars:  # every bar starts at 1x
            assert min(bar.get_x(), bar.get_x() + bar.get_width()) == pytest.approx(
                min(1.0, bar.get_x() + bar.get_width())
            )
    fire = figure.axes[1]
    values = {text.get_text().strip() for text in fire.texts}
    # fire callbacks/s: trio-native vs aiowheel-trio; one repetition, said on the bar.
    assert "26\u00d7 (1 rep)" in values
    assert (tmp_path / "headline.png").read_bytes()[:8] == PNG


def test_ratio_formatting() -> None:
    assert plots.times(2.2676) == "2.3\u00d7"
    assert plots.times(0.5615) == "0.56\u00d7"
    assert plots.times(75.39) == "75\u00d7"
    # 2 significant digits: a run supports no more (2514.82x was printed as such).
    assert plots.times(1234.0) == "1,200\u00d7"
    assert plots.times(2514.82) == "2,500\u00d7"
    assert plots.times(771.3) == "770\u00d7"
    assert plots.times(0.0034) == "0.003\u00d7"
    assert plots.times(math.nan) == "-"


# -- tables and report.md ----------------------------------------------------------------


def test_the_table_narrows_by_leaving_columns_out() -> None:
    from rich.console import Console

    summary = _bench_runs(["fire", "churn"])
    wide = _headers(render.summary_table(summary))
    assert wide[:2] == ["workload", "contender"]
    assert "lifetime p50 s" in wide
    assert "label" not in wide  # no run has labels
    assert "run" not in wide  # one run per workload and contender
    narrow_table = render.summary_table(summary, 100)
    narrow = _headers(narrow_table)
    assert "lifetime p50 s" not in narrow
    assert {"workload", "contender", "p50 ms", "p99 ms", "p99.9 ms"} <= set(narrow)
    assert Console(width=10_000).measure(narrow_table).maximum <= 100


def test_two_runs_of_one_contender_on_one_workload_get_a_run_column() -> None:
    summary = _summary(
        [
            ("bench-20261121T151509-1-fire-aiowheel-asyncio", "aiowheel", "asyncio", None, 9, 0),
            ("bench-20261122T151509-2-fire-aiowheel-asyncio", "aiowheel", "asyncio", None, 9, 0),
        ]
    )
    headers, cells = render.summary_cells(summary)
    assert headers[0] == "run"
    assert [row[0] for row in cells] == [
        "20261121T151509-1-fire-aiowheel-asyncio",
        "20261122T151509-2-fire-aiowheel-asyncio",
    ]


def _headers(table: Any) -> list[str]:
    return [str(column.header) for column in table.columns]


def _files() -> TraceFiles:
    return TraceFiles(local=("/t/a.parquet",), remote=("hdfs:///t",), rows=4)


def test_report_md_opens_with_the_headline_figure_and_its_table() -> None:
    bench = load_bench_results(BENCH)
    summary = _bench_runs(["fire"])
    text = render.render_markdown(
        summary.drop(columns=["lateness_cdf"]),
        _files(),
        4,
        "local[2]",
        "4.3.0",
        Headline(bench, headline(bench), ""),
    )
    # First whether the traces are complete (issue 19), then the headline.
    assert text.startswith("# aiowheel timer report\n\n**Traces that may be incomplete:**")
    assert "remote path(s) read by Spark: not checked for dropped rows" in text
    assert "\n## Headline: aiowheel against each peer\n" in text
    first_figure = text.index("](")
    assert text[first_figure:].startswith(f"]({schema.HEADLINE_PNG})")
    table = [line for line in text.splitlines() if line.startswith("| fire N=50,000 |")]
    # One repetition (a --quick run): every ratio says so (issue 21).
    assert table[0] == (
        "| fire N=50,000 | callbacks/s (1/s, higher is better) | 3\u00d7 (1 rep) "
        "| 1.9\u00d7 (1 rep) | 26\u00d7 (1 rep) |"
    )
    assert text.index("## Headline") < text.index("## The traces")
    for name in (schema.CDF_PNG, schema.P99_PNG, schema.RATES_PNG):
        assert f"]({name})" in text
    assert "quick sizes, ONE repetition per figure: ratios can flip between runs" in text


def test_per_second_figures_left_out_when_most_runs_are_short() -> None:
    # bench --report's quick sizes: most runs last 1-2 s, trio-native's 30 s. Its one
    # long line does not make the others' 1-2 points readable (issue 21).
    summary = _summary([("r", "aiowheel", "uvloop", "req", 3, 1)]).drop(columns=["lateness_cdf"])
    args = (summary, _files(), 4, "local[2]", "4.3.0", Headline(None, None, "none"))
    text = render.render_markdown(*args, 31, 2)
    assert "Not drawn: half the traced runs lasted 2 s or less (the longest 31 s" in text
    for name in (schema.P99_PNG, schema.RATES_PNG):
        assert f"]({name})" not in text
        assert f"`{name}`" in text  # said not to be written (issue 32: empty panels)
    assert not render.per_second_figures(31, 2)
    assert render.per_second_figures(31, render.MIN_SECONDS_PER_FIGURE)
    shown = render.render_markdown(*args, 31, render.MIN_SECONDS_PER_FIGURE)
    for name in (schema.P99_PNG, schema.RATES_PNG):
        assert f"]({name})" in shown
    # Without the median (an older caller), the longest run decides.
    assert "the longest traced run lasted 3 s" in render.render_markdown(*args, 3)


def test_report_md_says_what_the_headline_needs_without_bench_results() -> None:
    summary = _summary([("r", "aiowheel", "uvloop", "req|x", 3, 1)])
    text = render.render_markdown(
        summary.drop(columns=["lateness_cdf"]),
        _files(),
        4,
        "local[2]",
        "4.3.0",
        Headline(None, None, "no bench-results.json was found next to the traces"),
    )
    assert "No headline: no bench-results.json was found next to the traces" in text
    assert "--bench-results PATH" in text
    assert schema.HEADLINE_PNG not in text
    assert "4 timers from 2 trace file(s), analysed with Spark 4.3.0 (local[2])" in text
    assert "| req\\|x |" in text  # a | in a label does not break the table
    assert "- `hdfs:///t`" in text


def test_the_fixture_is_a_copy_of_a_real_quick_run(tmp_path: Path) -> None:
    # The fixture came from `aiowheel bench --quick --json -w churn -w fire -w spread`,
    # its result lines wrapped in the bench-results.json object (version 1).
    copy = Path(shutil.copy(BENCH, tmp_path / "bench-results.json"))
    bench = load_bench_results(copy)
    assert {r["workload"] for r in bench.results} == {"churn", "fire", "spread"}
    assert bench.settings["quick"] is True


def test_the_modules_depend_one_way() -> None:
    """report -> job -> inputs -> schema; plots -> schema; nothing imports report but
    the spark-submit entry, and schema imports none of its siblings."""
    import ast

    package = Path(schema.__file__).parent
    imports: dict[str, set[str]] = {}
    for source in package.glob("*.py"):
        tree = ast.parse(source.read_text())
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "aiowheel.analytics."
            ):
                found.add(str(node.module).rsplit(".", 1)[1])
        imports[source.stem] = found
    assert imports["schema"] == set()
    assert imports["plots"] == {"schema"}
    assert "plots" not in imports["bench_results"]
    assert imports["job"] == {"inputs", "schema"}
    assert imports["submit"] == {"report"}
    assert [name for name, found in imports.items() if "report" in found] == ["submit"]


def test_bench_results_are_found_next_to_the_traces(tmp_path: Path) -> None:
    from aiowheel.analytics.bench_results import BenchResultsError, find_bench_results

    traces = tmp_path / "traces"
    (traces / "day2").mkdir(parents=True)
    files = TraceFiles(local=(str(traces / "day2" / "a.parquet"),), remote=(), rows=1)
    assert find_bench_results([str(traces)], files) == []
    shutil.copy(BENCH, traces / "day2" / schema.BENCH_RESULTS)
    assert find_bench_results([str(traces)], files) == [traces / "day2" / schema.BENCH_RESULTS]
    shutil.copy(BENCH, traces / schema.BENCH_RESULTS)  # the directory given comes first
    assert find_bench_results([str(traces)], files) == [
        traces / schema.BENCH_RESULTS,
        traces / "day2" / schema.BENCH_RESULTS,
    ]
    # A FIFO by that name is found, and refused when read: never opened, never waited on.
    (traces / schema.BENCH_RESULTS).unlink()
    os.mkfifo(traces / schema.BENCH_RESULTS)
    (found, _) = find_bench_results([str(traces)], files)
    with pytest.raises(
        BenchResultsError, match=r"bench-results.json: not a regular file \(a FIFO\)"
    ):
        load_bench_results(found)


def test_the_headline_pairs_each_peer_with_aiowheel_on_its_backend() -> None:
    bench = load_bench_results(BENCH)
    ratios = headline(bench)
    pairs = set(zip(ratios["peer"], ratios["aiowheel"], strict=True))
    assert pairs == {
        ("call_later-asyncio", "aiowheel-asyncio"),
        ("call_later-uvloop", "aiowheel-uvloop"),
        ("trio-native", "aiowheel-trio"),
    }
    assert "early_pct" not in set(ratios["metric"])  # no ratios: not in the headline
    for row in ratios.itertuples():
        (source,) = [
            r
            for r in bench.results
            if (r["workload"], r["variant"], r["metric"], r["contender"])
            == (row.workload, row.variant, row.metric, row.peer)
        ]
        assert row.ratio == pytest.approx(source["ratios"][row.aiowheel])
        assert row.peer_median == pytest.approx(source["median"])


# == dropped rows (issue 19): a trace is never silently incomplete ==========================


def _completeness(*dropped: int | None) -> TraceFiles:
    runs = tuple(
        Completeness(f"/t/{i}.parquet", f"run-{i}", 1000, d) for i, d in enumerate(dropped)
    )
    return TraceFiles(tuple(c.file for c in runs), (), 1000 * len(runs), runs)


def test_report_md_says_at_the_top_that_every_trace_is_complete() -> None:
    text = render.dropped_section(_completeness(0, 0))
    assert text.startswith("**Complete traces:** no rows were dropped in any of the 2 run(s)")
    assert completeness_lines(_completeness(0, 0)) == []


def test_report_md_states_dropped_rows_per_run_and_what_they_do_to_each_figure() -> None:
    files = _completeness(0, 250, None)
    text = render.dropped_section(files)
    assert text.startswith("**Incomplete traces: 250 rows were dropped**")
    assert "- run `run-1`: 250 rows dropped (20.0% of its timers; 1,000 kept)" in text
    assert "- run `run-2`: the trace does not say whether rows were dropped" in text
    assert "run-0" not in text  # complete runs are not listed
    # aiowheel report warns about the run that dropped rows (the other is in report.md).
    assert completeness_lines(files, unknown=False) == [
        "run `run-1`: 250 rows dropped (20.0% of its timers; 1,000 kept)"
    ]
    for figure in ("lower bounds", "lateness percentiles", "headline"):
        assert figure in text
    summary = _summary([("r", "aiowheel", "uvloop", None, 3, 1)])
    bench = Headline(None, None, "no bench-results.json")
    markdown = render.render_markdown(
        summary.drop(columns=["lateness_cdf"]), files, 3000, "local[2]", "4.3.0", bench
    )
    assert markdown.startswith("# aiowheel timer report\n\n**Incomplete traces: 250 rows")


def test_report_md_states_sampled_runs_and_their_rate_at_the_top() -> None:
    runs = (
        Completeness("/t/0.parquet", "full", 1000, 0),
        Completeness("/t/1.parquet", "sampled", 1000, 0, sample_every=100),
    )
    files = TraceFiles(tuple(c.file for c in runs), (), 2000, runs)
    assert sampling_lines(files) == [
        "run `sampled`: sampled, one timer in 100 (1,000 rows stand for about 100,000 timers)"
    ]
    text = render.sampled_section(files)
    assert text.startswith("**Sampled traces:** 1 run(s) traced one timer in k")
    assert "full" not in text
    for figure in ("about 1/k of the run's", "lateness percentiles", "headline"):
        assert figure in text
    assert render.sampled_section(_completeness(0, 0)) == ""
    summary = _summary([("r", "aiowheel", "uvloop", None, 3, 1)])
    bench = Headline(None, None, "no bench-results.json")
    markdown = render.render_markdown(
        summary.drop(columns=["lateness_cdf"]), files, 2000, "local[2]", "4.3.0", bench
    )
    top = markdown.split("## The traces")[0]
    assert "**Complete traces:**" in top
    assert "**Sampled traces:**" in top


def test_find_traces_reads_what_each_footer_says(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from aiowheel.trace import ParquetRecorder

    recorder = ParquetRecorder(tmp_path / "a.parquet", run_id="run-a")
    recorder.open(backend="asyncio", clock=0.0)
    recorder.record(1, None, 1.0, 2.0, 0, 2.5, None)
    recorder.close()
    table = pq.read_table(recorder.path)
    pq.write_table(table.replace_schema_metadata(None), tmp_path / "b.parquet")
    files = find_traces([str(tmp_path)])
    by_name = {Path(c.file).name: c for c in files.completeness}
    assert by_name["a.parquet"] == Completeness(str(recorder.path), "run-a", 1, 0)
    assert by_name["b.parquet"].dropped is None
    assert by_name["b.parquet"].run_id is None
    assert isinstance(table, pa.Table)


# == the drop-in loop's section (issue 32) ===================================================


def _drop_in_bench(tmp_path: Path) -> Any:
    """bench-results.json of a run with a loop-* workload and the server's."""
    import json

    def row(
        workload: str,
        variant: str,
        metric: str,
        name: str,
        median: float,
        ratios: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        kind, backend = name.split("-")
        return {
            "type": "result", "workload": workload, "variant": variant, "n": None,
            "metric": metric, "label": metric, "unit": "ns", "better": "lower",
            "contender": name, "kind": kind, "backend": backend, "core": None,
            "core_reason": None, "median": median, "min": median, "max": median,
            "samples": [median, median], "reps": 2, "ratios": ratios or {},
            "skipped": None, "params": {},
        }  # fmt: skip

    results = [
        row("loop-reschedule", "N=10", "reschedule_ns", "loop-asyncio", 1000.0),
        row("loop-reschedule", "N=10", "reschedule_ns", "loop-uvloop", 400.0),
        row("loop-reschedule", "N=10", "reschedule_ns", "call_later-asyncio", 3000.0,
            {"loop-asyncio": 3.0}),
        row("loop-reschedule", "N=10", "reschedule_ns", "call_later-uvloop", 800.0,
            {"loop-uvloop": 2.0}),
        row("loop-reschedule", "N=10", "reschedule_ns", "call_later-rloop", 500.0,
            {"loop-uvloop": 1.25}),
        row("churn", "N=10", "pair_ns", "aiowheel-asyncio", 100.0),
        row("churn", "N=10", "pair_ns", "call_later-asyncio", 300.0, {"aiowheel-asyncio": 3.0}),
        # The timeout workload has a figure of each: the timer's block, and
        # asyncio.timeout on the drop-in loop (the same plain loop in both).
        row("timeout", "N=10", "enter_exit_ns", "aiowheel-asyncio", 100.0),
        row("timeout", "N=10", "enter_exit_ns", "call_later-asyncio", 400.0,
            {"aiowheel-asyncio": 4.0}),
        row("timeout", "N=10", "loop_enter_exit_ns", "loop-asyncio", 200.0),
        row("timeout", "N=10", "loop_enter_exit_ns", "call_later-asyncio", 400.0,
            {"loop-asyncio": 2.0}),
    ]  # fmt: skip
    path = tmp_path / "bench-results.json"
    settings = {"quick": True, "reps": 2}
    path.write_text(json.dumps({"version": 1, "settings": settings, "machine": {},
                                "results": results}))  # fmt: skip
    return load_bench_results(path)


def test_the_drop_in_loop_has_a_section_comparing_each_loop_on_its_own_base(
    tmp_path: Path,
) -> None:
    from aiowheel.analytics.bench_results import drop_in

    bench = _drop_in_bench(tmp_path)
    # The timer's headline leaves the drop-in loop's workloads to their own section,
    # and each figure of a workload that has both goes to its own table, with a ratio.
    timer = headline(bench)
    assert set(zip(timer["workload"], timer["metric"], strict=True)) == {
        ("churn", "pair_ns"),
        ("timeout", "enter_exit_ns"),
    }
    assert not timer["note"].any()
    frame = drop_in(bench)
    pairs = set(zip(frame["peer"], frame["aiowheel"], strict=True))
    assert pairs == {
        ("call_later-asyncio", "loop-asyncio"),
        ("call_later-uvloop", "loop-uvloop"),
        ("call_later-rloop", "loop-uvloop"),
    }
    assert set(frame[frame["workload"] == "timeout"]["metric"]) == {"loop_enter_exit_ns"}
    assert not frame["note"].any()
    summary = _bench_runs(["fire"])
    text = render.render_markdown(
        summary.drop(columns=["lateness_cdf"]), _files(), 4, "local[2]", "4.3.0",
        Headline(bench, headline(bench), "", frame),
    )  # fmt: skip
    assert "\n## The drop-in loop: `aiowheel.new_event_loop()` against the plain loops\n" in text
    assert (
        text.index("## Headline") < text.index("## The drop-in loop") < text.index("## The traces")
    )
    ratios = [line for line in text.splitlines() if line.startswith("| loop-reschedule N=10 |")]
    # The ratio table, then the figures behind it.
    assert ratios[0].endswith("| 3\u00d7 | 2\u00d7 | 1.2\u00d7 |")
    assert ratios[1].endswith("| 3,000 ns | 1,000 ns | 800 ns | 400 ns | 500 ns |")
    assert "`call_later-rloop` (with `loop-uvloop`)" in text


def test_a_single_search_is_marked_on_the_plot_and_in_the_headline(tmp_path: Path) -> None:
    # Issue 32: kafka's figure is one search per contender; the headline said "median
    # of 3 repetitions".
    import json

    document = json.loads(BENCH.read_text())
    document["settings"]["reps"] = 3
    for r in document["results"]:
        if r["workload"] != "kafka" and len(r["samples"]) == 1:
            r["samples"] = r["samples"] * 3
    kafka = [
        {**r, "workload": "kafka", "variant": "high", "samples": r["samples"][:1]}
        for r in document["results"]
        if r["workload"] == "churn"
    ]
    document["results"] += kafka
    path = tmp_path / "bench-results.json"
    path.write_text(json.dumps(document))
    bench = load_bench_results(path)
    ratios = headline(bench)
    assert set(ratios[ratios["workload"] == "kafka"]["note"]) == {schema.SINGLE_SEARCH}
    assert set(ratios[ratios["workload"] == "churn"]["note"]) == {""}
    subtitle = render.headline_subtitle(bench)
    assert "median of 3 repetitions" in subtitle
    assert "kafka: ONE search per contender" in subtitle
    figure = plots.plot_headline(ratios, tmp_path / "headline.png", subtitle)
    titles = _panel_titles(figure)
    assert "kafka (high): ONE search per contender, not a median" in titles
    kafka_ax = figure.axes[titles.index("kafka (high): ONE search per contender, not a median")]
    assert all("(1 search)" in t.get_text() for t in kafka_ax.texts if "\u00d7" in t.get_text())
    _headers, rows = render.headline_cells(ratios)
    kafka_rows = [row for row in rows if row[0] == "kafka high"]
    assert kafka_rows
    assert all(any(cell.endswith("(1 search)") for cell in row) for row in kafka_rows)


def test_the_cdf_legend_names_only_what_its_panels_draw_and_its_ticks_do_not_collide(
    tmp_path: Path,
) -> None:
    # Issue 32: the legend listed a label no panel drew (a workload whose timers were
    # all cancelled), and the early side's tick labels overlapped.
    summary = _summary(
        [
            (f"{STAMP}-fire-aiowheel-asyncio", "aiowheel", "asyncio", None, 100, 0),
            (f"{STAMP}-idle-aiowheel-asyncio", "aiowheel", "asyncio", "conn", 0, 100),
        ]
    )
    early = [(-2.0 + 2.5 * q / 100) / 1000 for q in CDF_QUANTILES]  # -2 ms to +0.5 ms
    summary.at[0, "lateness_cdf"] = early
    figure = plots.plot_lateness_cdf(summary, tmp_path / "cdf.png")
    assert _panel_titles(figure)[::2] == ["fire: lateness CDF"]
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert texts == ["aiowheel-asyncio"]  # not "label conn": no panel draws it
    cdf_ax = figure.axes[0]
    ticks = [t for t in cdf_ax.get_xticks() if cdf_ax.get_xlim()[0] <= t <= cdf_ax.get_xlim()[1]]
    assert len([t for t in ticks if t < 0]) == 1  # one label on the early side
    assert 0.0 in ticks
    assert cdf_ax.xaxis.get_minor_locator().tick_values(0, 1) == []


# == kafka's figures against the offered rate (issue 31) ====================================


def _kafka_bench(tmp_path: Path) -> Any:
    """bench-results.json of a kafka run with two target rates; call_later-asyncio fell
    behind at the higher one."""
    import json

    def row(
        variant: str, metric: str, name: str, median: float | None, params: dict[str, Any]
    ) -> dict[str, Any]:
        kind, backend = name.split("-")
        return {
            "type": "result", "workload": "kafka", "variant": variant, "n": None,
            "metric": metric, "label": metric, "unit": "s", "better": "lower",
            "contender": name, "kind": kind, "backend": backend, "core": None,
            "core_reason": None, "median": median, "min": median, "max": median,
            "samples": [] if median is None else [median], "reps": 1, "ratios": {},
            "skipped": None if median is not None else "fell behind at 50,000 req/s",
            "params": params,
        }  # fmt: skip

    results = [
        row("high", "sustained_rps", "aiowheel-asyncio", 80_000.0, {"case": "high"}),
        row("high", "sustained_rps", "call_later-asyncio", 40_000.0, {"case": "high"}),
    ]
    for rate, ours, theirs in ((25_000.0, 6.0, 9.0), (50_000.0, 5.5, None)):
        at = {"case": "high", "rate": rate}
        variant = f"high at {rate:,.0f} req/s"
        results += [
            row(variant, "cpu_s_per_m", "aiowheel-asyncio", ours, at),
            row(variant, "gc_ms_per_s", "aiowheel-asyncio", ours / 10, at),
            row(variant, "cpu_s_per_m", "call_later-asyncio", theirs, at),
            row(variant, "gc_ms_per_s", "call_later-asyncio", theirs and theirs / 10, at),
        ]
    path = tmp_path / "bench-results.json"
    path.write_text(json.dumps({"version": 1, "settings": {"quick": True, "reps": 1},
                                "machine": {}, "results": results}))  # fmt: skip
    return load_bench_results(path)


def test_kafka_target_rates_are_drawn_against_the_offered_rate(tmp_path: Path) -> None:
    from aiowheel.analytics.bench_results import kafka_rates

    bench = _kafka_bench(tmp_path)
    rates = kafka_rates(bench)
    # A rate a contender fell behind at has no row; the search's figures are not here.
    assert sorted(zip(rates["contender"], rates["rate"], rates["metric"], strict=True)) == [
        ("aiowheel-asyncio", 25_000.0, "cpu_s_per_m"),
        ("aiowheel-asyncio", 25_000.0, "gc_ms_per_s"),
        ("aiowheel-asyncio", 50_000.0, "cpu_s_per_m"),
        ("aiowheel-asyncio", 50_000.0, "gc_ms_per_s"),
        ("call_later-asyncio", 25_000.0, "cpu_s_per_m"),
        ("call_later-asyncio", 25_000.0, "gc_ms_per_s"),
    ]
    held = dict(zip(rates["contender"], rates["sustained"], strict=False))
    assert held == {"aiowheel-asyncio": 80_000.0, "call_later-asyncio": 40_000.0}
    figure = plots.plot_kafka_rates(rates, tmp_path / schema.KAFKA_PNG)
    assert (tmp_path / schema.KAFKA_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    titles = _panel_titles(figure)
    assert titles == ["kafka high: CPU s per 1,000,000 requests", "kafka high: collector ms per s"]
    cpu_ax = figure.axes[0]
    # One line per contender in its colour, ending where it fell behind; a dotted mark
    # at each sustained rate.
    solid = {
        to_hex(line.get_color()): list(line.get_xdata())
        for line in cpu_ax.lines
        if line.get_linestyle() == "-"
    }
    assert solid == {
        plots.contender_colour("aiowheel-asyncio"): [25_000.0, 50_000.0],
        plots.contender_colour("call_later-asyncio"): [25_000.0],
    }
    dotted = sorted(line.get_xdata()[0] for line in cpu_ax.lines if line.get_linestyle() == ":")
    assert dotted == [40_000.0, 80_000.0]

    summary = _bench_runs(["fire"])
    text = render.render_markdown(
        summary.drop(columns=["lateness_cdf"]), _files(), 4, "local[2]", "4.3.0",
        Headline(bench, headline(bench), ""),
    )  # fmt: skip
    assert "\n## Kafka's purgatory benchmark: cost against the offered rate\n" in text
    assert f"]({schema.KAFKA_PNG})" in text
    assert text.index("## Kafka's purgatory") < text.index("## The traces")
    assert "| high at 25,000 req/s | 6 | 9 |" in text
    assert "| high at 50,000 req/s | 5.5 | behind |" in text
    assert "`aiowheel-asyncio` 80,000 req/s (high)" in text


def test_no_kafka_section_without_target_rates() -> None:
    bench = load_bench_results(BENCH)
    assert render._kafka_section(Headline(bench, headline(bench), "")) == ""
