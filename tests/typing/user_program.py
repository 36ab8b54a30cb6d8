"""A user's program, type-checked by mypy and pyright as CI installs the package
(tests/typing/check.sh, run by .ci/run): the callbacks' arguments are checked against
``*args``, and ``wait()`` gives the callback's result type (awaited for an async
callback). Lines ending in an expect-error comment must be reported by both checkers; nothing
else may be. Never run, only checked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import assert_type

import aiowheel


def add(a: int, b: int) -> int:
    return a + b


async def fetch(url: str) -> bytes:
    return url.encode()


def tick() -> None:
    pass


async def main() -> None:
    async with aiowheel.Timer() as timer:
        handle = timer.schedule_nowait(0.5, add, 1, 2)
        assert_type(handle, aiowheel.TimerHandle[int])
        assert_type(await handle.wait(), int)

        later = await timer.schedule(0.5, fetch, "https://example.org")
        assert_type(await later.wait(), bytes)  # awaited: not Awaitable[bytes]

        at = timer.schedule_at_nowait(timer.time() + 1, add, 1, 2, label="sum")
        assert_type(await at.wait(), int)
        at2 = await timer.schedule_at(timer.time() + 1, fetch, "u")
        assert_type(await at2.wait(), bytes)

        periodic = timer.every(1.0, tick)
        assert_type(periodic, aiowheel.PeriodicHandle)

        future = timer.schedule_threadsafe(0.1, add, 1, 2)
        assert_type(future, concurrent.futures.Future[aiowheel.TimerHandle[int]])
        assert_type(timer.call_threadsafe(add, 1, 2), concurrent.futures.Future[int])

        timer.schedule_nowait(0.5, add, 1, "2")  # expect-error
        timer.schedule_nowait(0.5, add, 1)  # expect-error
        await timer.schedule(0.5, fetch, 3)  # expect-error
        timer.schedule_at_nowait(1.0, add, 1, 2, 3)  # expect-error
        timer.every(1.0, add, 1)  # expect-error
        timer.call_threadsafe(add, "1", 2)  # expect-error
        timer.schedule_threadsafe(0.1, fetch)  # expect-error
        name: str = await handle.wait()  # expect-error
        print(name)
        with timer.timeout(1) as t:
            assert_type(t, aiowheel.Timeout)
        async with timer.timeout(1):  # expect-error
            pass


# The drop-in loop (docs/loop.md): its type has `timer`, and loop_timer() gives the
# running loop's, or None on a loop that is not aiowheel's.
def drop_in_loop() -> None:
    loop = aiowheel.new_event_loop()
    assert_type(loop, aiowheel.WheelEventLoop)
    assert_type(loop.timer, aiowheel.Timer)
    assert_type(aiowheel.new_uvloop_event_loop().timer, aiowheel.Timer)
    assert_type(aiowheel.loop_timer(loop), aiowheel.Timer | None)
    plain: asyncio.AbstractEventLoop = loop  # still an asyncio loop
    print(plain)
    with asyncio.Runner(loop_factory=aiowheel.new_event_loop) as runner:
        runner.run(on_the_loop())
    uvloop_factory = functools.partial(aiowheel.new_event_loop, base="uvloop")
    with asyncio.Runner(loop_factory=uvloop_factory) as runner:
        runner.run(on_the_loop())
    aiowheel.loop_timer("loop")  # expect-error


async def on_the_loop() -> None:
    timer = aiowheel.loop_timer()
    assert_type(timer, aiowheel.Timer | None)
    if timer is not None:
        assert_type(timer.schedule_nowait(0.5, add, 1, 2), aiowheel.TimerHandle[int])
        print(len(timer), timer.stats().lateness_max)
    loop = asyncio.get_running_loop()
    if isinstance(loop, aiowheel.WheelEventLoop):
        assert_type(loop.timer.schedule_nowait(0.5, add, 1, 2), aiowheel.TimerHandle[int])
    asyncio.get_running_loop().timer.schedule_nowait(0.5, add, 1, 2)  # expect-error


# docs/loop.md, "Is my timer on the wheel?", as written there.
async def is_my_timer_on_the_wheel() -> None:
    timer = aiowheel.loop_timer()  # None: this loop's timers are on its heap
    print(type(asyncio.get_running_loop()).__name__, timer)
    if timer is None:
        return
    before = timer.stats()
    for _ in range(50):
        await asyncio.sleep(0.002)
    after = timer.stats()
    print(len(timer), after.fired - before.fired, f"{after.lateness_max * 1000:.2f} ms")
