"""How a contender runs (aiowheel/bench/env.py): the parts the workload tests do not
reach (every workload test runs every contender through ``open_env``)."""

from __future__ import annotations

import math

import pytest

from aiowheel.bench.contenders import Contender
from aiowheel.bench.env import open_env, percentile, run_fresh


def test_percentile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile(values, 0.0) == 1.0
    assert math.isnan(percentile([], 0.5))


def test_unknown_backend_or_kind() -> None:
    async def nothing() -> None:
        pass

    with pytest.raises(ValueError, match="unknown backend 'tokio'"):
        run_fresh("tokio", nothing)

    async def enter() -> None:
        async with open_env(Contender("x", "heap", "asyncio")):
            pass

    with pytest.raises(ValueError, match="unknown contender kind 'heap'"):
        run_fresh("asyncio", enter)
