"""The asyncio driver's wake-up rounding (aiowheel/_driver.py, AsyncioDriver.arm).

A bucket's time is ``origin + start * tick``: on no clock's grid, and often an ulp
or two off the millisecond or microsecond it stands for. uvloop rounds call_at delays
to whole milliseconds and looptime advances in whole microseconds; a wake-up armed a
hair past one of their ticks made the driver wake, find nothing due, and re-arm, in a
loop (up to 100k empty passes in 3 s on uvloop). The driver rounds wake-ups up to the
clock's grid, and never below the bucket's time.
"""

from __future__ import annotations

import asyncio
import math
import random

import pytest
import uvloop

from aiowheel._driver import AsyncioDriver

LOOPS = [
    pytest.param(asyncio.new_event_loop, 1e6, id="asyncio"),
    pytest.param(uvloop.new_event_loop, 1e3, id="uvloop"),
]


def noop() -> None:
    pass


@pytest.mark.parametrize(("new_loop", "grid"), LOOPS)
def test_wake_ups_are_rounded_up_to_the_clock_grid(new_loop: object, grid: float) -> None:
    loop = new_loop()  # type: ignore[operator]
    rnd = random.Random(7)

    async def main() -> None:
        driver = AsyncioDriver(noop)
        base = loop.time()
        for _ in range(2000):
            unit = base + rnd.randrange(1, 10**6) / grid
            # a grid point, and a few ulps on either side of it
            when = unit
            for _ in range(rnd.randrange(0, 4)):
                when = math.nextafter(when, math.inf if rnd.random() < 0.5 else -math.inf)
            driver.arm(when)
            handle = driver._handle
            assert handle is not None
            armed = handle.when()  # type: ignore[attr-defined]  # asyncio's or uvloop's
            assert armed >= when  # never early
            # At most one grid unit late (uvloop adds its own millisecond rounding of the
            # delay on top, so allow two there).
            assert armed - when < (2 if grid == 1e3 else 1) / grid + 1e-9
            assert abs(armed * grid - round(armed * grid)) < 1e-3  # on the grid
        driver.disarm()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
