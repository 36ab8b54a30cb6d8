"""The verdict of tools/peer_suite.py and tools/asyncio_suite.py --compare: from a
suite's per-test outcomes on the plain loop and on aiowheel's, without running a suite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_compare", TOOLS / "suite_compare.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("suite_compare", module)
    spec.loader.exec_module(module)
    return module


sc = _load()


def test_a_test_failing_only_on_aiowheel_fails_the_run() -> None:
    plain = {"a": "ok", "b": "ok", "c": "ok"}
    ours = {"a": "ok", "b": "FAIL", "c": "ERROR"}
    verdict = sc.compare(plain, ours)
    assert verdict.regressions == ["b", "c"]
    assert verdict.passed == 1
    assert not verdict.ok


def test_failing_on_both_loops_is_listed_and_passes_the_run() -> None:
    # This machine has no IPv6 and no DNS: such tests fail on the plain loop too.
    plain = {"ipv6": "ERROR", "dns": "FAIL", "x": "ok"}
    ours = {"ipv6": "ERROR", "dns": "ERROR", "x": "ok"}
    verdict = sc.compare(plain, ours)
    assert verdict.ok
    assert verdict.both == ["dns", "ipv6"]
    assert verdict.regressions == []
    assert verdict.passed == 1


def test_a_hang_or_crash_on_aiowheel_is_a_failure() -> None:
    plain = {"hangs": "ok", "crashes": "ok"}
    ours = {"hangs": "HANG", "crashes": "CRASH"}
    assert sc.compare(plain, ours).regressions == ["crashes", "hangs"]


def test_a_test_missing_on_aiowheel_that_passed_on_plain_fails() -> None:
    # Its run died before it: nothing says it passed.
    verdict = sc.compare({"a": "ok", "b": "ok", "s": "skipped"}, {"a": "ok"})
    assert verdict.regressions == ["b"]  # a skip on plain excuses nothing missing


def test_a_test_only_aiowheel_ran_is_judged_on_its_own() -> None:
    # e.g. "tests.test_x (exit)": the interpreter hung at exit on aiowheel's side only.
    verdict = sc.compare({"a": "ok"}, {"a": "ok", "tests.test_x (exit)": "HANG"})
    assert verdict.regressions == ["tests.test_x (exit)"]


def test_skips_xfails_and_plain_only_failures() -> None:
    plain = {"s": "skipped", "x": "expected failure", "p": "FAIL", "u": "ok"}
    ours = {"s": "skipped", "x": "expected failure", "p": "ok", "u": "unexpected success"}
    verdict = sc.compare(plain, ours)
    assert verdict.ok
    assert verdict.only_plain == ["p"]
    assert (verdict.passed, verdict.skipped) == (2, 2)


def test_a_failure_where_plain_skipped_fails_the_run() -> None:
    assert sc.compare({"a": "skipped"}, {"a": "FAIL"}).regressions == ["a"]


def test_an_unknown_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown outcome 'passed' for a"):
        sc.compare({"a": "passed"}, {"a": "ok"})


def test_report_closing_line_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    verdict = sc.compare({"a": "ok", "b": "ok", "c": "FAIL"}, {"a": "ok", "b": "FAIL", "c": "FAIL"})
    status = sc.report("uvloop 0.23.0", verdict, {"b": "Traceback\nAssertionError: late"})
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    assert "fails on both loops: c" in lines
    assert "FAILS ONLY ON AIOWHEEL: b" in lines
    assert "    AssertionError: late" in lines
    assert lines[-1].startswith("uvloop 0.23.0: 1 passed, 1 failed (on aiowheel's loop only;")
    assert sc.report("x", sc.compare({"a": "ok"}, {"a": "ok"})) == 0


def _load_asyncio_suite() -> ModuleType:
    # asyncio_suite imports suite_compare from its own directory (sys.path).
    spec = importlib.util.spec_from_file_location("asyncio_suite", TOOLS / "asyncio_suite.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_result_line_split_by_a_warning_is_still_read() -> None:
    """CPython 3.12's test_streams on plain uvloop, as CI printed it: the unclosed-file
    ResourceWarning lands inside test_read_line_breaks's result line, so only the
    failure header says it errored. Missed, the plain side had no outcome for it and
    the comparison called it a failure of aiowheel's loop alone."""
    stderr = (
        "test_read_line_breaks (test.test_asyncio.test_streams.StreamTests.test_read_line_breaks)"
        " ... /usr/lib/python3.12/traceback.py:416: ResourceWarning: unclosed file"
        " <_io.FileIO name=167 mode='rb' closefd=True>\n"
        "  return ast.parse(source)\n"
        "ERROR\n"
        "test_readline (test.test_asyncio.test_streams.StreamTests.test_readline) ... ok\n"
        "test_slow (test.test_asyncio.test_streams.StreamTests.test_slow) ... skipped 'slow'\n"
        "\n"
        "======================================================================\n"
        "ERROR: test_read_line_breaks"
        " (test.test_asyncio.test_streams.StreamTests.test_read_line_breaks)\n"
        "----------------------------------------------------------------------\n"
    )
    results = _load_asyncio_suite().parse_results(stderr)
    prefix = "test.test_asyncio.test_streams.StreamTests."
    assert results == {
        f"{prefix}test_read_line_breaks.test_read_line_breaks": "ERROR",
        f"{prefix}test_readline.test_readline": "ok",
        f"{prefix}test_slow.test_slow": "skipped",
    }


def test_a_failed_test_is_named_for_its_run_alone() -> None:
    """A test that failed runs once more alone (tools/asyncio_suite.py, rerun): its id
    (``parse_results``') gives back its module and the ``Class.test`` name unittest
    takes, with the method's doubled name (3.11's ``-v`` lines) dropped once."""
    test_name = _load_asyncio_suite().test_name
    prefix = "test.test_asyncio.test_waitfor.AsyncioWaitForTest."
    assert test_name(f"{prefix}test_wait_for.test_wait_for") == (
        "test_waitfor",
        "AsyncioWaitForTest.test_wait_for",
    )
    assert test_name(f"{prefix}test_wait_for") == (
        "test_waitfor",
        "AsyncioWaitForTest.test_wait_for",
    )
