"""``tracing``: what a trace adds to a timer, a traced and an untraced timer side by side.

Tracing's own cost, measured in one event loop: the contender's ``Timer`` (no
recorder) and a second ``Timer`` whose recorder takes every timer's row
(``_DiscardColumns``: the column batches ``ParquetRecorder`` takes, handed back
unwritten, no thread, no file), both holding the same N pending timers. Then, in
rounds that alternate which timer goes first (whatever else runs on the machine hits
both alike):

* ``pair``: a batch of 1,000 ``schedule`` + ``cancel`` pairs on each timer (a row per
  cancel);
* ``fire``: a burst of timers due within 20 ms on each timer, from the first
  ``schedule`` to the last callback (a row per firing).

Each is timed on the event loop thread's CPU clock (``time.thread_time``: the wait
until the burst is due costs nothing, another process's work neither). A repetition's
figure is the sum over its rounds per operation; the runner takes the median over the
repetitions. ``*_added_ns`` is traced minus untraced: what the trace adds to one
operation. The writer's side (Arrow conversion, Parquet) is not in it: the
``aiowheel-<backend>-traced`` contenders measure a real recorder on the other
workloads (docs/bench-workloads.md).
"""

from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass
from typing import Any, Final

import aiowheel

from .contenders import Contender
from .env import Env
from .settings import Settings
from .workload import Metric, RepeatedWorkload

__all__ = ["Tracing"]

_BATCH: Final = 1_000
#: Timers per burst (fewer when ``ops`` is smaller).
_BURST: Final = 5_000
#: A burst's deadlines: uniform over this window, from this far ahead (seconds).
_WINDOW: Final = 0.020
_LEAD: Final = 0.010


def _noop() -> None:
    pass


class _DiscardColumns:
    """A recorder that takes every timer's row in column batches, as
    ``ParquetRecorder`` does, and keeps nothing: the timer's side of tracing only."""

    every = 1
    batch_rows = 32_768

    def __init__(self) -> None:
        self.rows = 0

    def open(self, *, backend: str, clock: float) -> None:
        pass

    def record(self, *row: Any) -> None:
        self.rows += 1

    def take_columns(self, columns: list[list[Any]], count: int) -> list[list[Any]] | None:
        self.rows += count
        return columns if count == self.batch_rows else None

    def close(self) -> None:
        pass


@dataclass
class _TracingData:
    fill: list[float]
    pairs: list[list[float]]
    bursts: list[list[float]]


class Tracing(RepeatedWorkload):
    name = "tracing"
    quick_step_seconds = 2.5
    title = "what a trace adds: a traced and an untraced timer, N pending each"
    kinds = frozenset({"aiowheel"})
    traced = False  # it traces one of its own two timers
    default = False  # opt-in: `-w tracing`
    metrics = (
        Metric("pair_ns", "schedule+cancel pair, untraced", "ns", "lower"),
        Metric("traced_pair_ns", "schedule+cancel pair, traced", "ns", "lower"),
        Metric("pair_added_ns", "added by the trace, per pair", "ns", "lower", ratio=False),
        Metric("fire_ns", "schedule+fire, untraced", "ns", "lower"),
        Metric("traced_fire_ns", "schedule+fire, traced", "ns", "lower"),
        Metric("fire_added_ns", "added by the trace, per timer", "ns", "lower", ratio=False),
    )

    def default_sizes(self, quick: bool) -> list[int]:
        return [20_000] if quick else [200_000]

    def skip_reason(self, contender: Contender, n: int | None, settings: Settings) -> str | None:
        if contender.trace_every:
            return (
                "it measures tracing itself, a traced timer beside an untraced one: "
                f"run it on aiowheel-{contender.backend}"
            )
        return super().skip_reason(contender, n, settings)

    def _ops(self, settings: Settings) -> int:
        if settings.ops is not None:
            return settings.ops
        return 50_000 if settings.quick else 200_000

    def prepare(self, n: int, rep: int, settings: Settings) -> _TracingData:
        rng = random.Random(f"{settings.seed}:{self.name}:{n}:{rep}")
        uniform = rng.uniform
        ops = self._ops(settings)
        fill = [uniform(0.0, 30.0) for _ in range(n)]
        pairs = [
            [uniform(0.0, 30.0) for _ in range(min(_BATCH, ops - i))] for i in range(0, ops, _BATCH)
        ]
        burst = min(_BURST, max(ops, 1))
        bursts = [
            sorted(uniform(0.0, _WINDOW) for _ in range(min(burst, ops - i)))
            for i in range(0, ops, burst)
        ]
        for burst_offsets in bursts:
            rng.shuffle(burst_offsets)  # inserted in random order, as fire does
        return _TracingData(fill, pairs, bursts)

    def params(self, settings: Settings) -> dict[str, Any]:
        ops = self._ops(settings)
        return {
            "recorder": "every timer's row taken in column batches and discarded",
            "pending": "N per timer, uniform over 30 s",
            "pairs": f"{ops:,} per timer, batches of {_BATCH:,}",
            "fired": f"{ops:,} per timer, bursts of {min(_BURST, ops):,} due within "
            f"{_WINDOW * 1e3:g} ms",
            "clock": "the event loop thread's CPU time",
            "order": "alternating per round",
        }

    async def run(
        self, env: Env, n: int, data: _TracingData, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        plain = env.timer
        assert plain is not None  # an aiowheel contender's env has its timer
        recorder = _DiscardColumns()
        async with aiowheel.Timer(recorder=recorder) as traced:
            timers = {"plain": plain, "traced": traced}
            for timer in timers.values():
                schedule = timer.schedule_nowait
                for delay in data.fill:
                    schedule(delay, _noop)
            await env.checkpoint()
            gc.collect()
            pair_s = dict.fromkeys(timers, 0.0)
            cpu = time.thread_time
            for number, batch in enumerate(data.pairs):
                for name in _order(number):
                    schedule = timers[name].schedule_nowait
                    t0 = cpu()
                    for delay in batch:
                        schedule(delay, _noop).cancel()
                    pair_s[name] += cpu() - t0
                    await env.checkpoint()
            fire_s = dict.fromkeys(timers, 0.0)
            for number, offsets in enumerate(data.bursts):
                for name in _order(number):
                    fire_s[name] += await _burst(env, timers[name], offsets)
            # The pending timers are cancelled here, outside the timed parts (the
            # traced one's rows with them).
        pairs = max(sum(len(batch) for batch in data.pairs), 1)
        fired = max(sum(len(offsets) for offsets in data.bursts), 1)
        pair_ns = {name: seconds / pairs * 1e9 for name, seconds in pair_s.items()}
        fire_ns = {name: seconds / fired * 1e9 for name, seconds in fire_s.items()}
        return {
            "pair_ns": pair_ns["plain"],
            "traced_pair_ns": pair_ns["traced"],
            "pair_added_ns": pair_ns["traced"] - pair_ns["plain"],
            "fire_ns": fire_ns["plain"],
            "traced_fire_ns": fire_ns["traced"],
            "fire_added_ns": fire_ns["traced"] - fire_ns["plain"],
            "_rows": float(recorder.rows),
        }


def _order(number: int) -> tuple[str, str]:
    """Which timer goes first in round ``number``: each, every other round."""
    return ("plain", "traced") if number % 2 == 0 else ("traced", "plain")


async def _burst(env: Env, timer: aiowheel.Timer, offsets: list[float]) -> float:
    """Schedule ``offsets`` as a burst due from ``_LEAD`` ahead; the loop thread's CPU
    seconds from the first ``schedule`` to the last callback."""
    if not offsets:
        return 0.0
    cpu = time.thread_time
    left = len(offsets)
    done = env.new_event()
    end = [0.0]

    def callback() -> None:
        nonlocal left
        left -= 1
        if not left:
            end[0] = cpu()
            done.set()

    schedule_at = timer.schedule_at_nowait
    gc.collect()
    start = cpu()
    base = timer.time() + _LEAD
    for offset in offsets:
        schedule_at(base + offset, callback)
    await done.wait()
    return end[0] - start
