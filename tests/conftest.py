"""Shared fixtures: every async test runs on asyncio, uvloop and trio (anyio's plugin).

* ``asyncio``: the default loop with looptime's virtual clock: time jumps to the next
  timer whenever the loop would sleep, so a 10-second test takes microseconds and
  timing assertions are exact.
* ``uvloop``: uvloop has no virtual clock (looptime patches pure-Python loops only),
  so it runs on real time. Tests marked ``virtual_time`` are skipped there; the
  others use small delays and await the events themselves.
* ``trio``: ``trio.testing.MockClock(autojump_threshold=0)``, virtual like asyncio.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import hypothesis  # noqa: F401  (before the freeze below: see pytest_collection_finish)
import looptime
import pytest
import trio.testing

BACKENDS = ["asyncio", "uvloop", "trio"]


def _looptime_loop() -> asyncio.AbstractEventLoop:
    # start=1000.0: a non-zero epoch catches code that assumes the clock starts at 0.
    loop = looptime.new_event_loop(start=1000.0)
    join = loop.shutdown_default_executor

    async def shutdown_default_executor(timeout: float | None = None) -> None:  # noqa: ASYNC109 (asyncio's signature)
        # From Python 3.12 the runner joins the default executor's threads (anyio's
        # connect_tcp resolves names there) under a 300 s timeout. Joining takes real
        # time, and virtual time jumps the 300 s at once while the loop waits: the test
        # then failed with "The executor did not finish joining its threads within
        # 300 seconds". So no timeout here: pytest-timeout bounds a stuck join.
        await join()

    loop.shutdown_default_executor = shutdown_default_executor  # type: ignore[method-assign]
    return loop


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    name = request.param
    if name == "asyncio":
        return ("asyncio", {"loop_factory": _looptime_loop})
    if name == "uvloop":
        return ("asyncio", {"use_uvloop": True})
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


@pytest.fixture
def backend(anyio_backend: tuple[str, dict[str, Any]]) -> str:
    """``"asyncio"``, ``"uvloop"`` or ``"trio"``."""
    name, options = anyio_backend
    if name == "asyncio" and options.get("use_uvloop"):
        return "uvloop"
    return name


@pytest.fixture
def virtual(backend: str) -> bool:
    """True when time is virtual (asyncio with looptime, trio with MockClock)."""
    return backend != "uvloop"


@pytest.fixture
def unit(virtual: bool) -> float:
    """One "second" of a test: 1 s on virtual clocks, 10 ms on uvloop's real clock."""
    return 1.0 if virtual else 0.01


def _freeze_what_lives() -> None:
    # What lives now (pytest, hypothesis, the backends, the test modules, whatever the
    # tests so far imported: pandas, matplotlib, pyspark) is long-lived: move it out of
    # the cycle collector's reach. Each full ``gc.collect()`` (the benchmark runs one
    # before every repetition, the memory tests before each measurement) then walks only
    # what the running test module made: ~40-130 ms -> ~1 ms. Objects made later are
    # collected as usual; only gc.get_referrers() does not see frozen ones
    # (tests/test_memory.py unfreezes where it asks; hypothesis asks when it is first
    # imported, hence its import above).
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_what_lives()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield
    # After the last test of a module, its module-scoped fixtures are gone too.
    if nextitem is None or nextitem.path != item.path:
        _freeze_what_lives()
    return result


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "virtual_time: needs a virtual clock; skipped on uvloop (real time)"
    )


@pytest.fixture(autouse=True)
def _skip_real_time(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("virtual_time") is None:
        return
    if "anyio_backend" in request.fixturenames and request.getfixturevalue("backend") == "uvloop":
        pytest.skip("needs a virtual clock; uvloop runs on real time")
