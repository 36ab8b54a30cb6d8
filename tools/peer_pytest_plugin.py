"""pytest plugin (``-p peer_pytest_plugin``) for tools/peer_suite.py's anyio run.

Loaded before the suite's conftest imports anything, so the conftest's
``loop_factory: uvloop.new_event_loop`` already reads the replacement. On the
``aiowheel`` side (``AIOWHEEL_PEER_SIDE``) every loop the suite makes is aiowheel's:
``asyncio.new_event_loop()`` through the default policy (anyio's ``asyncio`` param, no
loop factory) on the asyncio base, ``uvloop.new_event_loop()`` on the uvloop base. Each
test phase's outcome goes to ``AIOWHEEL_PEER_OUT``, one JSON line each, as it ends: a
run that dies still leaves what it did.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

_SIDE = os.environ.get("AIOWHEEL_PEER_SIDE", "plain")
_OUT = os.environ.get("AIOWHEEL_PEER_OUT")

# Not in __main__ (the launcher below): importing aiowheel imports anyio, which pytest
# must import itself first (`-p anyio`) to rewrite its asserts.
if _SIDE == "aiowheel" and __name__ != "__main__":
    import uvloop

    import aiowheel

    def _asyncio_loop(self: object) -> asyncio.AbstractEventLoop:
        return aiowheel.new_event_loop(base="asyncio")

    def _uvloop_loop() -> asyncio.AbstractEventLoop:
        return aiowheel.new_event_loop(base="uvloop")

    # It stands in for uvloop's factory, and anyio's tests ask the factory (not the
    # loop) whether it is uvloop's, e.g. to expect uvloop's own UDP abort bug
    # (test_close_during_send): the loop it makes is uvloop's, bugs and all, so it
    # answers as uvloop's factory does. The loops' own module stays aiowheel's.
    _uvloop_loop.__module__ = "uvloop"

    asyncio.events.BaseDefaultEventLoopPolicy.new_event_loop = _asyncio_loop  # type: ignore[method-assign]
    uvloop.new_event_loop = _uvloop_loop  # type: ignore[assignment]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The trio params run no loop of ours: the same on both sides, so left out.
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("anyio_backend") if callspec else None
        (drop if backend == "trio" else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _OUT is None:
        return
    if report.passed:
        if report.when != "call":
            return
        outcome = "unexpected success" if hasattr(report, "wasxfail") else "ok"
    elif report.skipped:
        outcome = "expected failure" if hasattr(report, "wasxfail") else "skipped"
    else:
        outcome = "FAIL" if report.when == "call" else "ERROR"
    detail: Any = report.longreprtext if report.failed else ""
    with open(_OUT, "a") as f:
        f.write(json.dumps({"id": report.nodeid, "outcome": outcome, "detail": detail}) + "\n")


if __name__ == "__main__":
    # tools/peer_suite.py starts the suite as `python tools/peer_pytest_plugin.py DEPS
    # ARGS...` (sys.path[0] is then tools/, so `-p peer_pytest_plugin` finds this file),
    # not `python -c`: anyio's to_process tests need a __main__ with a __file__.
    import sys

    sys.path.append(sys.argv[1])  # after site-packages: the environment's versions win
    sys.exit(pytest.main(sys.argv[2:]))
