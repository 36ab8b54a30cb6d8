"""Shutdown (aiowheel/_shutdown.py) on an engine driven by hand: what closing leaves.

The engine rig is tests/test_engine.py's (a recording driver, a clock the test moves,
no Timer around the engine). ``close_engine`` and ``break_engine`` through a Timer
are tested in tests/test_timer.py and tests/test_dispatch.py (aclose), the fault
models (an internal error) and tests/loop/ (loop.close()).
"""

from __future__ import annotations

import anyio
import pytest
from test_engine import rig

from aiowheel import TimerCancelled, TimerClosed
from aiowheel._handle import _Failure
from aiowheel._pass import fire_due
from aiowheel._selfcheck import check_engine
from aiowheel._shutdown import abort_start, close_engine

pytestmark = pytest.mark.anyio


async def test_close_cancels_a_reserved_period_and_every_waiter() -> None:
    async with rig() as r:
        e = r.engine
        # A periodic timer whose run is in progress holds its next period's slot: the
        # close cancels that slot too, so the counters still add up.
        seen: list[int] = []

        def run_and_close() -> None:
            seen.append(len(close_engine(e)))

        periodic = e.periodics.start(r.owner, run_and_close, (), 1.0, True, None)
        other = r.file(5.0, print)
        r.now += 1.5
        fire_due(e)
        assert seen == [1]  # the other handle; the periodic one was running
        assert other.cancelled()
        assert not periodic._active
        assert (e.pending, e.fired, e.cancelled, e.scheduled) == (0, 1, 2, 3)
        assert not e.periodics.active
        check_engine(e)


async def test_close_settles_a_running_job_as_cancelled_while_running() -> None:
    async with rig(max_concurrency=1) as r:
        e = r.engine
        started = anyio.Event()

        async def job() -> None:
            started.set()
            await anyio.sleep_forever()

        running = r.file(0.0, job)
        queued = r.file(0.0, job)  # one worker: this one waits in the run queue
        r.advance(0.001)
        await started.wait()
        assert close_engine(e) == [queued]
        assert queued.cancelled()
        # It started, so it stays fired; its wait() says it was cancelled while running.
        outcome = running._result
        assert isinstance(outcome, _Failure)
        assert isinstance(outcome.exc, TimerCancelled)
        assert running.fired()
        assert not running.cancelled()
        await e.pool.join()
        check_engine(e)


async def test_abort_start_leaves_nothing_running_and_closes_the_owner() -> None:
    async with rig(traced=True) as r:
        e = r.engine
        abort_start(e)
        assert e.closed
        assert e.tracing is None
        assert r.closes == 1  # the owner stops accepting (Engine._on_close)
        assert r.driver.stopped
        assert e.closing.is_set()
        check_engine(e)
        outcome = await e.waiters.wait(r.handle(print))
        assert isinstance(outcome, _Failure)
        assert isinstance(outcome.exc, TimerClosed)
