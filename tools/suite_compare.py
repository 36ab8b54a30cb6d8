"""What tools/asyncio_suite.py and tools/peer_suite.py share: a suite's per-test
outcomes on a plain loop and on aiowheel's, and the verdict drawn from the two.

An outcome is one of ``OUTCOMES``. A test *regresses* when aiowheel's loop fails it
(or it hangs there, or never reports) while the plain loop passes it: that, and only
that, fails a run. A test that fails on both loops is this machine's (no IPv6, no DNS)
or the peer's own, and is listed without failing the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

OK = "ok"
FAIL = "FAIL"
ERROR = "ERROR"
# The per-test watchdog fired, or the test's process died under it.
HANG = "HANG"
CRASH = "CRASH"
SKIPPED = "skipped"
XFAIL = "expected failure"
XPASS = "unexpected success"
OUTCOMES = (OK, FAIL, ERROR, HANG, CRASH, SKIPPED, XFAIL, XPASS)
FAILED = frozenset({FAIL, ERROR, HANG, CRASH})
# Passed (an unexpected success too): counted as passed, and what a re-run must end
# with for a failure to be called flaky.
PASSED = frozenset({OK, XPASS})


@dataclass(frozen=True)
class Verdict:
    """The comparison of one suite's outcomes on the plain loop and on aiowheel's."""

    passed: int  # passed on aiowheel's loop
    regressions: list[str] = field(default_factory=list)  # fail only on aiowheel's
    both: list[str] = field(default_factory=list)  # fail on both loops
    only_plain: list[str] = field(default_factory=list)  # fail only on the plain loop
    skipped: int = 0  # skipped (or xfail) on aiowheel's loop

    @property
    def ok(self) -> bool:
        return not self.regressions


def compare(plain: Mapping[str, str], ours: Mapping[str, str]) -> Verdict:
    """The verdict on ``ours`` (aiowheel's loop) against ``plain`` (the base loop).

    Both map a test's id to its outcome. A test the plain loop passed that is missing
    from ``ours`` regresses (its run died before it); a test only ``ours`` has is
    judged on its own outcome, with nothing to excuse a failure.
    """
    for outcomes in (plain, ours):
        for test, outcome in outcomes.items():
            if outcome not in OUTCOMES:
                raise ValueError(f"unknown outcome {outcome!r} for {test}")
    regressions, both, only_plain = [], [], []
    passed = skipped = 0
    for test in sorted(set(plain) | set(ours)):
        mine, ref = ours.get(test), plain.get(test)
        mine_failed = mine in FAILED or (mine is None and ref in PASSED)
        ref_failed = ref in FAILED
        if mine_failed and not ref_failed:
            regressions.append(test)
        elif mine_failed:
            both.append(test)
        elif ref_failed:
            only_plain.append(test)
        if mine in PASSED:
            passed += 1
        elif mine in (SKIPPED, XFAIL):
            skipped += 1
    return Verdict(passed, regressions, both, only_plain, skipped)


def report(
    name: str,
    verdict: Verdict,
    details: Mapping[str, str] | None = None,
    both_details: Mapping[str, str] | None = None,
) -> int:
    """Print ``verdict`` and return the exit status (1 when a test regresses).

    The last line reads like pytest's (``N passed, M failed``), M counting only the
    tests that fail on aiowheel's loop alone, so CI's log reader takes it as is.
    """
    details = details or {}
    both_details = both_details or {}
    for test in verdict.both:
        line = both_details.get(test, "")
        print(f"fails on both loops: {test}" + (f": {line}" if line else ""))
    for test in verdict.only_plain:
        print(f"fails only on the plain loop: {test}")
    for test in verdict.regressions:
        print(f"FAILS ONLY ON AIOWHEEL: {test}")
        for line in details.get(test, "").splitlines()[-12:]:
            print(f"    {line}")
    print(
        f"{name}: {verdict.passed} passed, {len(verdict.regressions)} failed "
        f"(on aiowheel's loop only; {len(verdict.both)} fail on both loops, "
        f"{verdict.skipped} skipped)"
    )
    return 0 if verdict.ok else 1
