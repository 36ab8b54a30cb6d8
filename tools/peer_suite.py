"""Run a peer's own test suite (uvloop's or anyio's) on the plain loop and on aiowheel's.

Usage: ``python tools/peer_suite.py uvloop|anyio [-j 2] [--timeout S] [--cache DIR]
[name ...]``.

The suite is the one of the version installed here: its sdist, fetched by ``pip
download`` from the package index into ``--cache`` (``build/peer-suites`` by default,
not committed), together with the test-only packages it imports (``pip install
--target``, appended to the children's ``sys.path`` so the environment's own versions
win). Each suite then runs twice, in processes of its own, and nothing of it is edited:

- ``uvloop``: ``tests/`` (but test_sourcecode, a lint of uvloop's source tree), one
  module per process, with ``uvloop._testbase``'s
  ``UVTestCase.new_loop`` / ``AIOTestCase.new_loop`` (how every test gets its loop)
  and ``uvloop.new_event_loop`` replaced by ``aiowheel.new_event_loop(base="uvloop")``
  / ``(base="asyncio")``: the suite's uvloop tests run on the uvloop base, its asyncio
  ones on the asyncio base. A watchdog bounds every test (``--timeout``): a test that
  hangs is a failure (``HANG``), and the module goes on after it in a new process.
- ``anyio``: its pytest suite in debug mode (``PYTHONASYNCIODEBUG=1``; its
  ``anyio_backend`` params ask for ``debug=True`` too), with tools/peer_pytest_plugin.py
  loaded by ``-p``: it replaces the default policy's ``new_event_loop`` (the
  ``asyncio`` param) and ``uvloop.new_event_loop`` (the ``asyncio+uvloop`` param's
  ``loop_factory``) and leaves out the trio params, which no loop of ours runs.
  anyio's own pytest-timeout setting (20 s) bounds each test.

A test failing (or hanging) only on aiowheel's loop fails the run (tools/suite_compare.py)
if it fails again when run once more on its own; one that then passes is listed as
flaky (the suites time things on a shared machine). Tests failing on both loops (no
IPv6 or DNS here, the peer's own bugs) are listed and do not fail it. The last line
reads ``N passed, M failed``, M counting the tests that fail on aiowheel's loop alone.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

# A sibling module of tools/: imported from this file's directory, which is on
# sys.path only when PYTHONSAFEPATH is unset (noxfile.py sets it).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_compare import CRASH, HANG, OUTCOMES, PASSED, compare, report

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent

# Test-only packages each suite imports that aiowheel's dev extra does not install
# (uvloop's "test" extra and anyio's "test" dependency group, less what is here already
# and less the linters that uvloop's test_sourcecode runs on a source tree it has not).
TEST_DEPS = {
    "uvloop": ["psutil", "pyOpenSSL"],
    "anyio": ["psutil", "trustme", "pytest-mock", "truststore"],
}

# Runs in the child for uvloop: one module's tests, one outcome per line of a file.
# A watchdog (faulthandler) is armed from start to exit and re-armed at each test's
# start and end: whatever hangs (a test, a class fixture, the interpreter's exit
# joining an executor thread) ends the process within `timeout`. The parent then
# records the hang and starts the module again after the test that hung.
#
# The suite asks "is this asyncio's own loop?" by module name (BaseTestCase's
# is_asyncio_loop: type(loop).__module__ starts with "asyncio."), to skip what only
# uvloop supports (e.g. a datagram transport's sendto without an address). aiowheel's
# asyncio base is asyncio's selector loop, transports and all, defined in aiowheel._loop;
# answered by name it would run uvloop-only paths, fail and leave an executor thread
# blocked in recv. So on AIOTestCase (the only one whose loops are asyncio's) the
# answer is the true one, as for the plain loop. docs/loop.md, "Peers' test suites".
_UVLOOP_CHILD = """
import faulthandler, json, sys, unittest
side, module, out, timeout, deps = sys.argv[1:6]
faulthandler.dump_traceback_later(float(timeout), exit=True)
sys.path.append(deps)
if side == "aiowheel":
    import aiowheel, uvloop, uvloop._testbase as tb
    tb.UVTestCase.new_loop = lambda self: aiowheel.new_event_loop(base="uvloop")
    tb.AIOTestCase.new_loop = lambda self: aiowheel.new_event_loop(base="asyncio")
    tb.AIOTestCase.is_asyncio_loop = lambda self: True
    uvloop.new_event_loop = lambda: aiowheel.new_event_loop(base="uvloop")
done = set()
with open(out) as f:
    for line in f:
        done.add(json.loads(line)["id"])
log = open(out, "a")
def write(test, outcome, detail=""):
    log.write(json.dumps({"id": test, "outcome": outcome, "detail": detail}) + "\\n")
    log.flush()
class Result(unittest.TestResult):
    def startTest(self, test):
        super().startTest(test)
        self._bad, self._ended = None, False
        write(test.id(), "started")
        faulthandler.dump_traceback_later(float(timeout), exit=True)
    def stopTest(self, test):
        faulthandler.dump_traceback_later(float(timeout), exit=True)
        if not self._ended and self._bad:  # a subtest failed: no add* for the test
            self._end(test, *self._bad)
        super().stopTest(test)
    def _end(self, test, outcome, err=None):
        self._ended = True
        write(test.id(), outcome, self._exc_info_to_string(err, test) if err else "")
    def addSuccess(self, test):
        self._end(test, "ok")
    def addFailure(self, test, err):
        self._end(test, "FAIL", err)
    def addError(self, test, err):
        self._end(test, "ERROR", err)
    def addSkip(self, test, reason):
        self._end(test, "skipped")
    def addExpectedFailure(self, test, err):
        self._end(test, "expected failure")
    def addUnexpectedSuccess(self, test):
        self._end(test, "unexpected success")
    def addSubTest(self, test, subtest, err):
        if err is not None and self._bad is None:
            failed = issubclass(err[0], test.failureException)
            self._bad = ("FAIL" if failed else "ERROR", err)
def flat(suite):
    for t in suite:
        yield from flat(t) if isinstance(t, unittest.TestSuite) else [t]
tests = [t for t in flat(unittest.defaultTestLoader.loadTestsFromName("tests." + module))
         if t.id() not in done]
unittest.TestSuite(tests).run(Result())
write("", "done")
faulthandler.dump_traceback_later(float(timeout), exit=True)
"""


def installed_version(peer: str) -> str:
    return importlib.metadata.version(peer)


def fetch(peer: str, version: str, cache: Path) -> tuple[Path, Path]:
    """The suite's directory (holding ``tests/``) and the test-only packages' one."""
    suite = cache / f"{peer}-{version}"
    deps = cache / f"deps-{peer}"
    if not (suite / "tests").is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            # --no-binary for the peer alone: its build requirements (Cython for
            # uvloop) still come as wheels, and pip only reads the sdist's metadata.
            _pip("download", "--no-deps", "--no-binary", peer, f"{peer}=={version}", "-d", tmp)
            (sdist,) = Path(tmp).glob("*.tar.gz")
            with tarfile.open(sdist) as tar:
                top = f"{peer}-{version}/"
                members = [
                    m
                    for m in tar.getmembers()
                    if m.name.startswith(top + "tests/") or m.name == top + "pyproject.toml"
                ]
                tar.extractall(tmp, members=members, filter="data")
            shutil.rmtree(suite, ignore_errors=True)
            suite.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(Path(tmp) / f"{peer}-{version}", suite)
    if not (deps / ".complete").exists():
        shutil.rmtree(deps, ignore_errors=True)
        _pip("install", "--quiet", "--target", str(deps), *TEST_DEPS[peer])
        (deps / ".complete").touch()
    return suite, deps


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, stdout=subprocess.DEVNULL)


def _read(out: Path) -> tuple[dict[str, str], dict[str, str], str | None, bool]:
    """Outcomes, details, the test started last without an outcome, and whether the
    child got to its end."""
    outcomes: dict[str, str] = {}
    details: dict[str, str] = {}
    started, finished = None, False
    for line in out.read_text().splitlines():
        record = json.loads(line)
        if record["outcome"] == "started":
            started = record["id"]
        elif record["outcome"] == "done":
            finished = True
        else:
            outcomes[record["id"]] = record["outcome"]
            details[record["id"]] = record["detail"]
            started = None
    return outcomes, details, started, finished


def run_uvloop_module(
    side: str, module: str, suite: Path, deps: Path, timeout: float, scratch: Path
) -> tuple[dict[str, str], dict[str, str]]:
    out = scratch / f"{side}-{module}.jsonl"
    out.write_text("")
    while True:
        cmd = [sys.executable, "-c", _UVLOOP_CHILD, side, module, str(out), str(timeout)]
        try:
            # The child's watchdog bounds every step; this bounds the watchdog.
            proc = subprocess.run(
                [*cmd, str(deps)], cwd=suite, capture_output=True, text=True, timeout=1800
            )
            code, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, stderr = -1, f"Timeout (1800 s, the watchdog's): {exc.stderr!r:.3000}"
        outcomes, details, started, finished = _read(out)
        kind = HANG if "Timeout (" in stderr else CRASH
        detail = f"{kind} (rc={code})\n{stderr[-3000:]}"
        if finished or started is None:
            if code != 0:
                # Died outside any test: at its import, a class fixture or its exit.
                where = f"tests.{module} ({'exit' if finished else 'outside tests'})"
                outcomes[where], details[where] = kind, detail
            return outcomes, details
        # The test that started last hung or took the process down: record it, then
        # go on with the module's other tests in a new process.
        with out.open("a") as f:
            f.write(json.dumps({"id": started, "outcome": kind, "detail": detail}) + "\n")


Results = dict[str, tuple[dict[str, str], dict[str, str]]]  # side: (outcomes, details)
SIDES = ("plain", "aiowheel")


def run_uvloop(
    suite: Path, deps: Path, jobs: int, timeout: float, names: list[str], sides: tuple[str, ...]
) -> Results:
    modules = names or sorted(
        # test_sourcecode lints uvloop's own source tree (flake8, mypy), which the
        # suite's run has not: no loop in it.
        (p.stem for p in (suite / "tests").glob("test_*.py") if p.stem != "test_sourcecode"),
        # The longest first, so that two workers finish together.
        key=lambda m: -(suite / "tests" / f"{m}.py").stat().st_size,
    )
    results: Results = {s: ({}, {}) for s in sides}
    with (
        tempfile.TemporaryDirectory() as tmp,
        concurrent.futures.ThreadPoolExecutor(jobs) as pool,
    ):
        futures = {
            pool.submit(run_uvloop_module, s, m, suite, deps, timeout, Path(tmp)): (s, m)
            for m in modules
            for s in sides
        }
        for future in concurrent.futures.as_completed(futures):
            side, module = futures[future]
            outcomes, details = future.result()
            results[side][0].update(outcomes)
            results[side][1].update(details)
            bad = sum(1 for o in outcomes.values() if o not in ("ok", "skipped"))
            print(f"{side:8} {module:24.24} tests={len(outcomes):4} not ok={bad:3}", flush=True)
    return results


def run_anyio(
    suite: Path, deps: Path, jobs: int, timeout: float, names: list[str], sides: tuple[str, ...]
) -> Results:
    results: Results = {}

    def one(side: str) -> tuple[str, float]:
        start = time.perf_counter()
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
            env = dict(
                os.environ,
                PYTHONASYNCIODEBUG="1",
                AIOWHEEL_PEER_SIDE=side,
                AIOWHEEL_PEER_OUT=out.name,
                # Only the plugins anyio's own configuration names (-p anyio,
                # pytest_mock, timeout), and ours: not the environment's others.
                PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
            )
            args = ["-q", "-p", "peer_pytest_plugin", "-p", "no:cacheprovider", *names]
            proc = subprocess.run(
                [sys.executable, str(TOOLS / "peer_pytest_plugin.py"), str(deps), *args],
                cwd=suite,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            outcomes: dict[str, str] = {}
            details: dict[str, str] = {}
            for line in out:
                record = json.loads(line)
                # A test's worst phase counts: a teardown error after a pass fails it.
                if outcomes.get(record["id"]) in (None, "ok", "skipped"):
                    outcomes[record["id"]] = record["outcome"]
                    details[record["id"]] = record["detail"]
            if not outcomes:
                outcomes["anyio suite"] = "ERROR"
                details["anyio suite"] = proc.stdout[-3000:] + proc.stderr[-3000:]
            results[side] = (outcomes, details)
        return side, time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(min(jobs, 2)) as pool:
        for side, took in pool.map(one, sides):
            outcomes = results[side][0]
            bad = sum(1 for o in outcomes.values() if o not in ("ok", "skipped"))
            print(f"{side:8} tests={len(outcomes):5} not ok={bad:3} {took:6.1f}s", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=sorted(TEST_DEPS))
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="uvloop: seconds per test (default 60); anyio: seconds per side (default 900)",
    )
    parser.add_argument("--cache", type=Path, default=ROOT / "build" / "peer-suites")
    parser.add_argument("names", nargs="*", help="uvloop: modules; anyio: pytest arguments")
    args = parser.parse_args()
    if args.jobs < 1 or (args.timeout is not None and not args.timeout > 0):
        parser.error("--jobs and --timeout must be positive")
    try:
        version = installed_version(args.peer)
    except importlib.metadata.PackageNotFoundError:
        parser.error(f"{args.peer} is not installed here: its suite runs against it")
    try:
        suite, deps = fetch(args.peer, version, args.cache.resolve())
    except subprocess.CalledProcessError as exc:
        print(
            f"could not fetch {args.peer} {version}'s suite from the index: {exc}", file=sys.stderr
        )
        return 2
    if args.peer == "uvloop":
        # A misspelt module would fail the same on both loops, and so pass.
        unknown = [
            n for n in args.names if not (suite / "tests" / f"{n.split('.')[0]}.py").is_file()
        ]
        if unknown:
            parser.error(f"no such module in uvloop {version}'s tests/: {', '.join(unknown)}")
    start = time.perf_counter()
    run = run_uvloop if args.peer == "uvloop" else run_anyio
    timeout = args.timeout or (60.0 if args.peer == "uvloop" else 900.0)
    results = run(suite, deps, args.jobs, timeout, args.names, SIDES)
    plain, plain_details = results["plain"]
    ours, details = results["aiowheel"]
    if "anyio suite" in plain:  # pytest ran nothing: bad arguments, or no suite
        print(plain_details["anyio suite"], file=sys.stderr)
        return 2
    # Once more on aiowheel's loop, each test that failed there alone: the suites time
    # things (uvloop's test_call_at: a 50 ms timer within 70 ms), and this machine is
    # shared. A test that passes the second time is listed as flaky, not failed; one
    # that fails twice (a real difference fails every time) fails the run.
    flaky = []
    again = compare(plain, ours).regressions
    if again:
        print(f"re-running on aiowheel's loop: {' '.join(again)}", flush=True)
        ids = [t for t in again if " " not in t]  # not "tests.x (exit)": a module's
        names = [t.removeprefix("tests.") for t in ids] if run is run_uvloop else ids
        second = run(suite, deps, args.jobs, timeout, names, ("aiowheel",))["aiowheel"][0]
        flaky = [t for t in again if second.get(t) in PASSED]
        ours.update({t: second[t] for t in flaky})
    assert set(plain.values()) | set(ours.values()) <= set(OUTCOMES)
    print(f"{args.peer} {version}'s suite, both loops: {time.perf_counter() - start:.0f} s")
    for side, outcomes in (("plain", plain), ("aiowheel", ours)):
        counts = {o: sum(1 for v in outcomes.values() if v == o) for o in OUTCOMES}
        print(f"{side} loop: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n))
    for test in flaky:
        print(f"flaky on aiowheel's loop (failed, then passed): {test}")
    both = {t: _last_line(plain_details.get(t, "")) for t in plain}
    return report(f"{args.peer} {version}", compare(plain, ours), details, both)


def _last_line(detail: str) -> str:
    lines = [line for line in detail.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


if __name__ == "__main__":
    sys.exit(main())
