"""The asyncio driver's wake-up rounding (aiowheel/_driver.py).

A bucket's time is ``origin + start * tick``: on no clock's grid, and often an ulp
or two off the millisecond or microsecond it stands for. uvloop rounds call_at delays
to whole milliseconds and looptime advances in whole microseconds; a wake-up armed a
hair past one of their ticks made the driver wake, find nothing due, and re-arm, in a
loop (up to 100k empty passes in 3 s on uvloop). The driver rounds wake-ups up to the
clock's grid (``round_up``), and never below the bucket's time.
"""

from __future__ import annotations

import asyncio
import math

from hypothesis import given
from hypothesis import strategies as st

from aiowheel._driver import AsyncioDriver, round_up

GRIDS = st.sampled_from([1e3, 1e6])


@given(
    grid=GRIDS,
    units=st.integers(min_value=0, max_value=10**13),
    ulps=st.integers(min_value=-3, max_value=3),
)
def test_round_up_is_on_the_grid_never_early_and_at_most_one_unit_late(
    grid: float, units: int, ulps: int
) -> None:
    when = units / grid
    step = math.inf if ulps > 0 else -math.inf
    for _ in range(abs(ulps)):
        when = math.nextafter(when, step)  # a grid point, or a few ulps either side
    rounded = round_up(when, grid)
    assert rounded >= when
    assert rounded == round(rounded * grid) / grid  # on the grid: n / grid, as clocks make it
    assert rounded - when <= 1 / grid * (1 + 1e-9) + math.ulp(when)


def test_asyncio_driver_arms_the_rounded_time() -> None:
    loop = asyncio.new_event_loop()

    async def main() -> None:
        driver = AsyncioDriver(lambda: None)
        when = math.nextafter(loop.time() + 0.25, math.inf)  # an ulp past a microsecond
        driver.arm(when)
        handle = driver._handle
        assert isinstance(handle, asyncio.TimerHandle)
        assert handle.when() == round_up(when, 1e6) >= when
        driver.disarm()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
