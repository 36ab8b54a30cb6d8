"""What a run prints (aiowheel/bench/output.py): rich tables, or plain text without rich."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

import aiowheel
from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.output import (
    NO_DIFFERENCE,
    RATIO_HEADER,
    Output,
    Table,
    fmt,
    fmt_cost,
    fmt_ratio,
    render_plain,
    tables,
)
from aiowheel.bench.results import Result, fill_ratios
from aiowheel.bench.settings import Settings


def test_fmt() -> None:
    assert fmt(1234567.8, "ns") == "1,234,568 ns"
    assert fmt(12.345, "ms") == "12.3 ms"
    assert fmt(0.012345) == "0.0123"
    assert fmt(0.0) == "0"
    assert fmt(float("nan")) == "\u2013"
    assert fmt(5e5, "1/s") == "500,000"


def test_fmt_ratio_prints_three_significant_digits_and_never_rounds_a_small_one_to_zero() -> None:
    assert fmt_ratio(2.345) == "2.35\u00d7"
    assert fmt_ratio(0.1) == "0.100\u00d7"
    assert fmt_ratio(0.0047169) == "0.00472\u00d7"
    assert fmt_ratio(1.0) == "1.00\u00d7"
    assert fmt_ratio(99.96) == "100\u00d7"
    assert fmt_ratio(2514.82) == "2,510\u00d7"
    assert fmt_ratio(None) == "\u2013"
    assert fmt_ratio(float("nan")) == "\u2013"


def test_a_ratio_whose_range_holds_1x_is_no_difference_measured() -> None:
    assert fmt_ratio(1.67, [0.9, 2.1]) == "no difference measured"
    assert fmt_ratio(1.67, [1.0, 2.1]) == "no difference measured"
    assert fmt_ratio(1.67, [1.2, 2.1]) == "1.67\u00d7"
    assert fmt_ratio(0.84, [0.7, 0.95]) == "0.840\u00d7"
    assert fmt_ratio(1.67, None) == "1.67\u00d7"  # one repetition: no range to judge


def test_a_fraction_of_the_same_loop_is_printed_as_a_cost() -> None:
    assert fmt_cost(0.81) == "19%"
    assert fmt_cost(1.03) == "-3%"
    assert fmt_cost(float("nan")) == "\u2013"


def _results() -> list[Result]:
    ours, peer, gone = CONTENDERS[0], CONTENDERS[3], CONTENDERS[4]
    rows = [
        Result("churn", "N=10", 10, "pair_ns", "pair", "ns", "lower", ours, [100.0, 120.0]),
        Result("churn", "N=10", 10, "pair_ns", "pair", "ns", "lower", peer, [300.0, 360.0]),
        Result("churn", "N=10", 10, "pair_ns", "pair", "ns", "lower", gone, [], skipped="no"),
    ]
    fill_ratios(rows)
    return rows


def test_render_plain() -> None:
    (table,) = tables(_results())
    text = render_plain(table)
    lines = text.splitlines()
    assert lines[0] == "churn: schedule + cancel with N pending"
    assert lines[1].split() == [
        "variant",
        "metric",
        "contender",
        "median",
        "min\u2013max",
        "\u00d7",
        "same",
        "loop",
    ]
    assert set(lines[2]) <= {"-", " "}
    core = "compiled" if aiowheel.COMPILED else "pure"
    assert lines[3].split() == [
        "N=10",
        "pair",
        "(ns)",
        "aiowheel-asyncio",
        f"[{core}]",
        "110",
        "100\u2013120",
    ]
    assert lines[4].split()[-3:] == ["330", "300\u2013360", "3.00\u00d7"]
    # A contender that sat out: a note under the table, not a row per figure.
    assert lines[5:] == ["skipped call_later-uvloop (N=10): no"]
    # Right-justified columns line up: the medians end where their header does.
    end = lines[1].index("median") + len("median")
    assert lines[3][end - 3 : end] == "110"
    assert lines[4][end - 3 : end] == "330"


def test_render_plain_right_justifies() -> None:
    table = Table(
        "t", [("name", False), ("n", True)], [[(["a", "1"], False), (["bb", "100"], True)]]
    )
    assert render_plain(table).splitlines()[1:] == [
        "name    n",
        "----  ---",
        "a       1",
        "bb    100",
    ]


def test_console_output_without_rich_is_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # A core-only install has no rich (issue 10): the same figures, as plain text.
    monkeypatch.setitem(sys.modules, "rich", None)
    settings = Settings(workloads=["churn"])
    stdout, stderr = io.StringIO(), io.StringIO()
    output = Output(settings, stdout=stdout, stderr=stderr, argv=["aiowheel", "bench"])
    output.start(10, {"python": "3.x", "cpus": 2, "loadavg": [0.5, 0.5, 0.5]})
    output.results(_results())
    output.finish(_results())
    text = stdout.getvalue()
    assert text.startswith("aiowheel bench  Python 3.x on 2 CPUs, load average [0.5, 0.5, 0.5]")
    assert "call_later-asyncio" in text
    assert "3.00\u00d7" in text
    assert "\x1b[" not in text  # no terminal codes
    assert stderr.getvalue() == ""


def test_each_figure_is_printed_once() -> None:
    # Issue 32: the figures were printed as each variant ended and again in the tables.
    settings = Settings(workloads=["churn"], progress=False)
    stdout, stderr = io.StringIO(), io.StringIO()
    output = Output(settings, stdout=stdout, stderr=stderr, argv=["aiowheel", "bench"])
    output.start(10, {"python": "3.x", "cpus": 2, "loadavg": [0.5, 0.5, 0.5]})
    results = _results()
    output.results(results)
    output.finish(results)
    everything = stdout.getvalue() + stderr.getvalue()
    assert everything.count("330") == 1  # the peer's median
    assert everything.count("110") == 1  # aiowheel's median
    assert everything.count("3.00\u00d7") == 1


def _pair(name: str, value: float) -> Result:
    contender = next(c for c in CONTENDERS if c.name == name)
    return Result(
        "loop-reschedule",
        "N=10",
        10,
        "reschedule_ns",
        "reschedule",
        "ns",
        "lower",
        contender,
        [value],
    )


def test_a_peer_is_compared_with_aiowheel_on_its_own_loop() -> None:
    # Issue 32: call_later-uvloop's row showed its ratio against loop-asyncio (0.51x),
    # which read as a regression of the drop-in loop.
    rows = [
        _pair("loop-asyncio", 1000.0),
        _pair("loop-uvloop", 400.0),
        _pair("call_later-asyncio", 3000.0),
        _pair("call_later-uvloop", 800.0),
        _pair("call_later-rloop", 500.0),
    ]
    fill_ratios(rows)
    by = {r.contender.name: r.ratios for r in rows}
    assert by["call_later-asyncio"] == {"loop-asyncio": 3.0}
    assert by["call_later-uvloop"] == {"loop-uvloop": 2.0}
    # No drop-in loop on rloop: compared with the uvloop base, and the table says so.
    assert by["call_later-rloop"] == {"loop-uvloop": 1.25}
    (table,) = tables(rows)
    assert [h for h, _ in table.columns].count(RATIO_HEADER) == 1
    cells = {c[2]: c[-1] for section in table.sections for c, _bold in section}
    assert cells["call_later-uvloop"] == "2.00\u00d7"
    assert cells["call_later-asyncio"] == "3.00\u00d7"
    assert (
        "call_later-rloop: no aiowheel contender on its event loop; its \u00d7 column "
        "compares it with loop-uvloop" in table.notes
    )


def test_json_output_and_skipped_lines() -> None:
    gone = CONTENDERS[1]
    settings = Settings(workloads=["churn"], json=True, unavailable=[(gone, "uvloop is gone")])
    stdout, stderr = io.StringIO(), io.StringIO()
    output = Output(settings, stdout=stdout, stderr=stderr, argv=["x"])
    output.start(1, {"python": "3.x"})
    output.warn("careful")
    output.results(_results())
    output.finish(_results())
    lines = stdout.getvalue().splitlines()
    assert [line.split('"type": ')[1].split('"')[1] for line in lines] == [
        "run",
        "warning",
        "result",
        "result",
        "result",
        "end",
    ]
    assert '"unavailable": {"aiowheel-uvloop": "uvloop is gone"}' in lines[0]
    assert stderr.getvalue() == "aiowheel bench: skipping aiowheel-uvloop: uvloop is gone\n"


def test_rich_tables_print_brackets_as_text() -> None:
    # Issue 21: rich read `[uvloop]` in a hint as a markup tag and dropped it.
    from rich.console import Console

    from aiowheel.bench.output import render_rich

    table = Table(title='t: pip install "aiowheel[uvloop]"', columns=[("metric", False)])
    table.sections = [[(["aiowheel-asyncio [compiled]"], True)]]
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(render_rich(table))
    text = " ".join(buffer.getvalue().split())
    assert 'pip install "aiowheel[uvloop]"' in text
    assert "aiowheel-asyncio [compiled]" in text


def test_a_warning_goes_above_the_live_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 21: a plain print to stderr was glued onto the progress bar's line.
    output = Output(Settings(workloads=["churn"], contenders=[]), stderr=io.StringIO())
    printed: list[str] = []

    class Bar:
        class console:  # stands in for rich.progress.Progress.console
            @staticmethod
            def print(text: object) -> None:
                printed.append(str(text))

        def stop(self) -> None:
            printed.append("stopped")

    output._progress = Bar()
    output.warn("the machine is busy")
    output.close()
    output.close()
    assert printed == ["warning: the machine is busy", "stopped"]
    assert output.stderr.getvalue() == ""  # type: ignore[attr-defined]


def test_a_single_repetition_is_marked_not_shown_as_a_spread() -> None:
    # Issue 21: with one repetition, min-max read "317-317", as if it never varied.
    ours, peer = CONTENDERS[0], CONTENDERS[3]
    rows = [
        Result("churn", "N=10", 10, "pair_ns", "pair", "ns", "lower", ours, [317.0]),
        Result("churn", "N=10", 10, "pair_ns", "pair", "ns", "lower", peer, [300.0, 360.0]),
    ]
    fill_ratios(rows)
    (table,) = tables(rows)
    spreads = [cells[4] for section in table.sections for cells, _bold in section]
    assert spreads == ["1 rep", "300\u2013360"]


def test_a_contender_measured_below_n_says_so_under_the_table() -> None:
    # memory's trio-native runs at most 10,000 tasks at the quick sizes: the table's
    # "N=50,000" must not pass for its N.
    by_name = {c.name: c for c in CONTENDERS}
    params = {"trio_native_cap": 10_000}
    rows = [
        Result("memory", f"N={n:,}", n, "bytes", "per timer", "B", "lower", by_name[name], [9.0])
        for n in (5_000, 50_000)
        for name in ("aiowheel-trio", "trio-native")
    ]
    for r in rows:
        r.params = params
    fill_ratios(rows)
    (table,) = tables(rows)
    assert table.notes == [
        "trio-native (N=50,000): measured at 10,000 timers, a task each: its cost per "
        "timer does not depend on N"
    ]


def _server_rows(ours: list[float], peer: list[float], fractions: list[float]) -> list[Result]:
    def row(name: str, metric: str, unit: str, samples: list[float], **kw: Any) -> Result:
        contender = next(c for c in CONTENDERS if c.name == name)
        return Result("server", kw.pop("variant", "trivial"), None, metric, metric, unit,
                      "higher", contender, samples, **kw)  # fmt: skip

    rows = [
        row("loop-uvloop", "rps", "1/s", ours),
        row("call_later-uvloop", "rps", "1/s", peer),
        row(
            "call_later-uvloop", "vs_uvicorn", "x", fractions, variant="middleware", has_ratio=False
        ),
    ]
    fill_ratios(rows)
    return rows


def test_a_ratio_whose_rounds_overlap_is_no_difference_measured() -> None:
    # The drop-in loop at 1.67x plain uvloop's requests/s from one round, on an app with
    # no timers: three rounds whose ranges overlap say nothing of the kind.
    rows = _server_rows([9000.0, 15000.0, 11000.0], [9000.0, 10000.0, 8000.0], [0.9, 1.05, 0.8])
    assert rows[1].ratios == {"loop-uvloop": pytest.approx(11000 / 9000)}
    assert rows[1].ratio_ranges == {"loop-uvloop": pytest.approx([9000 / 10000, 15000 / 8000])}
    assert rows[1].as_json()["ratio_ranges"] == rows[1].ratio_ranges
    (table,) = tables(rows)
    cells = {(c[0], c[2]): c for section in table.sections for c, _bold in section}
    assert cells[("trivial", "call_later-uvloop")][-1] == NO_DIFFERENCE
    # The middleware's requests/s as a cost, never as a second kind of ratio.
    middleware = cells[("middleware", "call_later-uvloop")]
    assert middleware[1] == "vs_uvicorn (%)"
    assert middleware[3] == NO_DIFFERENCE  # 0.8-1.05 of uvicorn's own: holds no cost
    assert middleware[4] == "-5%\u201320%"
    assert any(note.startswith(f"{NO_DIFFERENCE}: the ratio's range") for note in table.notes)
    text = render_plain(table)
    assert "target" not in text
    assert "met" not in text.split()


def test_a_ratio_whose_rounds_do_not_overlap_is_printed_to_3_digits() -> None:
    rows = _server_rows([15000.0, 16000.0, 15500.0], [9000.0, 10000.0, 8000.0], [0.7, 0.8, 0.75])
    (table,) = tables(rows)
    cells = {(c[0], c[2]): c for section in table.sections for c, _bold in section}
    assert cells[("trivial", "call_later-uvloop")][-1] == "1.72\u00d7"
    assert cells[("middleware", "call_later-uvloop")][3] == "25%"
    assert not any(note.startswith(NO_DIFFERENCE) for note in table.notes)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_measures_the_plan_and_never_passes_its_end() -> None:
    settings = Settings(workloads=["churn"])
    stdout, stderr = io.StringIO(), _Tty()
    output = Output(settings, stdout=stdout, stderr=stderr, argv=["aiowheel", "bench"])
    output.start(4, {"python": "3.x", "cpus": 2, "loadavg": [0.5, 0.5, 0.5]},
                 planned_seconds=290.0)  # fmt: skip
    assert "4 steps, about 4 min 50 s on a 2-core machine" in stdout.getvalue()
    task = output._progress.tasks[0]
    assert task.total == 290.0
    output.step_seconds = 2.5
    output.advance()
    assert (task.completed, task.fields["steps"], task.fields["of"]) == (2.5, 1, 4)
    output.close()
