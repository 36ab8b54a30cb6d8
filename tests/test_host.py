"""The host (aiowheel/_host.py): the task groups of a Timer started with ``async with``.

The lifecycle through the Timer (a recorder that fails to open or to close, aclose()
from a job, the block's end waiting for every worker) is tested in tests/test_timer.py
and tests/test_dispatch.py; here the host is driven step by step.
"""

from __future__ import annotations

import anyio
import pytest
from support import noop

from aiowheel import Timer
from aiowheel._host import Host
from aiowheel._shutdown import close_engine

pytestmark = pytest.mark.anyio


async def test_the_host_runs_the_engine_until_it_closes() -> None:
    timer = Timer()
    host = Host(timer._new_engine, None)
    engine = await host.start()
    timer._started(engine)  # as Timer.__aenter__ does
    assert not engine.closed
    assert not engine.stopped.is_set()  # the supervisor waits on `closing`
    handle = timer.schedule_nowait(0.0, noop)
    await handle.wait()  # the driver runs in the host's tasks
    assert close_engine(engine) == []
    await host.join(engine)
    assert engine.stopped.is_set()  # the supervisor returned
    await host.exit(engine)
    assert timer.closed


async def test_a_started_timer_has_a_host_until_the_end_of_its_block() -> None:
    timer = Timer()
    assert timer._host is None
    async with timer:
        assert timer._host is not None
        engine = timer._engine
        assert engine is not None

        started = anyio.Event()

        async def job() -> None:
            started.set()
            await anyio.sleep_forever()

        timer.schedule_nowait(0.0, job)
        await started.wait()
        assert engine.pool.busy == 1
    # aclose() cancelled the job, and the block waited for its worker and the
    # supervisor before it ended.
    assert engine.stopped.is_set()
    assert engine.pool.busy == 0
