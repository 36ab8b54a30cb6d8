"""Run CPython's own asyncio test suites with every default loop from aiowheel.

Usage: ``python tools/asyncio_suite.py [--base asyncio|uvloop|plain-uvloop] [-j 2]
[module ...]``. Each module (``test.test_asyncio.<name>``) runs in its own process, with
the default policy's ``new_event_loop`` replaced, so every loop a test gets from
``asyncio.new_event_loop()`` (or a policy its module installs) is
``aiowheel.new_event_loop(base=...)``. ``plain-uvloop`` runs the same modules on plain
uvloop loops, the reference that ``--base uvloop`` is compared against (docs/loop.md).
Exit status 0 when no module fails (``--compare``: when no test fails on aiowheel's
uvloop loop that passes on plain uvloop). A test that fails on aiowheel's loop runs once
more, alone: one that passes then is listed as flaky, not failed (the suites time
things, and CI's two streams share two cores); one that fails twice fails the run, as
does a module that dies without saying which test failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import time

# A sibling module of tools/: imported from this file's directory, which is on
# sys.path only when PYTHONSAFEPATH is unset (noxfile.py sets it).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_compare import FAILED, PASSED, compare, report

MODULES = [
    "test_timeouts",
    "test_waitfor",
    "test_tasks",
    "test_events",
    "test_base_events",
    "test_locks",
    "test_queues",
    "test_futures",
    "test_streams",
    "test_taskgroups",
    "test_pep492",
    "test_unix_events",
    "test_sock_lowlevel",
    "test_selector_events",
]

# Runs in the child: patch the default policy's loop factory, then run the module.
_CHILD = """
import asyncio, sys, unittest
base = sys.argv[1]
if base == "plain-uvloop":
    import uvloop
    factory = uvloop.new_event_loop
else:
    import aiowheel
    def factory(base=base):
        return aiowheel.new_event_loop(base=base)
asyncio.events.BaseDefaultEventLoopPolicy.new_event_loop = lambda self: factory()
unittest.main(module="test.test_asyncio." + sys.argv[2], argv=["x", "-v", *sys.argv[3:]], exit=True)
"""

_RESULT = re.compile(
    r"^(test\w+) \(([\w.]+)\)[^\n]*? \.\.\. "
    r"(ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)$",
    re.M,
)
# unittest's failure headers ("ERROR: test_x (module.Class.test_x)"), each at the start
# of a line of its own. A warning the test prints to stderr can split its "... ERROR"
# result line (the ResourceWarning of an unclosed file, at collection), which _RESULT
# then misses: the header still says how it ended.
_HEADER = re.compile(r"^(FAIL|ERROR): (test\w+) \(([\w.]+)\)", re.M)


def parse_results(stderr: str) -> dict[str, str]:
    """Each test's outcome (suite_compare.OUTCOMES) from a ``unittest -v`` run's stderr."""
    # "skipped 'why'" -> "skipped"; the rest are suite_compare's outcomes already.
    results = {
        f"{m[2]}.{m[1]}": "skipped" if m[3].startswith("skipped") else m[3]
        for m in _RESULT.finditer(stderr)
    }
    for m in _HEADER.finditer(stderr):
        results[f"{m[3]}.{m[2]}"] = m[1]
    return results


def test_name(test_id: str) -> tuple[str, str]:
    """A ``parse_results`` id as (module, ``Class.test``): what runs the test alone.
    Since 3.11 unittest names a test ``test_x (package.module.Class.test_x)``, so the
    id ends with the method twice."""
    parts = test_id.split(".")
    module = parts[2]  # test.test_asyncio.<module>.Class.test_x[.test_x]
    if parts[-1] == parts[-2]:
        parts.pop()
    return module, ".".join(parts[3:])


def run_module(
    base: str, module: str, tests: tuple[str, ...] = ()
) -> tuple[str, int, dict[str, str], float]:
    """Run ``module`` (only ``tests``, ``Class.test`` names, when given) on ``base``."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, base, module, *tests],
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = parse_results(proc.stderr)
    return module, proc.returncode, results, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="asyncio", choices=["asyncio", "uvloop", "plain-uvloop"])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--compare", action="store_true", help="uvloop: also run plain uvloop")
    parser.add_argument("modules", nargs="*", default=MODULES)
    args = parser.parse_args()
    bases = [args.base] + (["plain-uvloop"] if args.compare else [])
    outcome: dict[str, dict[str, str]] = {b: {} for b in bases}
    codes: dict[str, dict[str, int]] = {b: {} for b in bases}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_module, b, m): b for b in bases for m in args.modules}
        for future in concurrent.futures.as_completed(futures):
            b = futures[future]
            module, code, results, took = future.result()
            outcome[b].update(results)
            codes[b][module] = code
            bad = sum(1 for r in results.values() if r in ("FAIL", "ERROR"))
            print(
                f"{b:13} {module:22} rc={code} tests={len(results):4} failed={bad:3} {took:5.1f}s"
            )
    ours = outcome[args.base]
    # The modules that said which of their tests failed (before any re-run).
    reported = {test_name(t)[0] for t, r in ours.items() if r in FAILED}
    if args.compare:
        again = compare(outcome["plain-uvloop"], ours).regressions
    else:
        again = [t for t, r in ours.items() if r in FAILED]
    for test in rerun(args.base, again):
        ours[test] = "ok"
        print(f"flaky on aiowheel's loop (failed, then passed alone): {test}")
    if args.compare:
        verdict = compare(outcome["plain-uvloop"], ours)
        return report(f"test.test_asyncio on {args.base}", verdict)
    # A module fails when a test of it failed twice, or when it died without saying
    # which test failed (its exit status is all there is).
    failed = sorted(
        {test_name(t)[0] for t, r in ours.items() if r in FAILED}
        | {m for m, c in codes[args.base].items() if c != 0 and m not in reported}
    )
    print("failed modules:", failed or "none")
    return 1 if failed else 0


#: More failures than this are no flake: they are not re-run.
_RERUN_LIMIT = 10


def rerun(base: str, tests: list[str]) -> list[str]:
    """Run each of ``tests`` (``parse_results`` ids) once more on ``base``, alone:
    those that pass. The suites time things (test_waitfor: a 0.1 ms timeout against a
    0.2 s sleep) on a machine the other CI stream shares; a real difference fails
    every time (tools/peer_suite.py does the same)."""
    if len(tests) > _RERUN_LIMIT:
        print(f"{len(tests)} tests failed: not re-run (more than {_RERUN_LIMIT})")
        return []
    passed = []
    for test in tests:
        module, name = test_name(test)
        print(f"re-running on aiowheel's loop, alone: {test}", flush=True)
        results = run_module(base, module, (name,))[2]
        if results.get(test) in PASSED:
            passed.append(test)
    return passed


if __name__ == "__main__":
    sys.exit(main())
