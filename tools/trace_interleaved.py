"""A traced and an untraced timer side by side in one event loop, their schedule +
cancel batches interleaved, so that whatever else runs on the machine hits both alike.

    python tools/trace_interleaved.py [N] [EVERY] [BATCHES] [asyncio|uvloop] [RECORDER]
    python tools/trace_interleaved.py fire [N] [EVERY] [ROUNDS] [asyncio|uvloop] [RECORDER]

Both timers hold N pending timers at random deadlines over 30 s (as ``aiowheel bench``
churn does); then BATCHES rounds of 1,000 schedule + cancel pairs on one timer and
1,000 on the other, the order swapped every round, each batch timed (wall clock and
the thread's CPU time). RECORDER: ``null`` (takes column batches and keeps nothing:
the timer's own side of tracing) or ``parquet`` (``ParquetRecorder(every=EVERY)``).
Prints the total per pair for each timer and the traced / untraced ratio, and the
median of the per-round ratios. ``fire``: bursts of N timers due within 20 ms, one
timer's then the other's, ROUNDS times; a burst is timed from its first callback to
its last.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import aiowheel
from aiowheel.trace import ParquetRecorder

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from trace_gc_probe import NullColumns


def _noop() -> None:
    pass


async def main(n: int, every: int, batches: int, kind: str) -> None:
    rng = random.Random(7)
    recorder: Any = (
        NullColumns(every) if kind == "null" else ParquetRecorder(tempfile.mkdtemp(), every=every)
    )
    async with aiowheel.Timer() as plain, aiowheel.Timer(recorder=recorder) as traced:
        for timer in (plain, traced):
            schedule = timer.schedule_nowait
            for _ in range(n):
                schedule(rng.uniform(0.0, 30.0), _noop)
        delays = [[rng.uniform(0.0, 30.0) for _ in range(1000)] for _ in range(batches)]
        gc.collect()
        totals = {"plain": [0.0, 0.0], "traced": [0.0, 0.0]}
        ratios = []
        perf, cpu = time.perf_counter, time.thread_time
        for number, batch in enumerate(delays):
            pair = [("plain", plain.schedule_nowait), ("traced", traced.schedule_nowait)]
            if number % 2:
                pair.reverse()
            took = {}
            for name, schedule in pair:
                w0, c0 = perf(), cpu()
                for delay in batch:
                    schedule(delay, _noop).cancel()
                w1, c1 = perf(), cpu()
                totals[name][0] += w1 - w0
                totals[name][1] += c1 - c0
                took[name] = c1 - c0
                await asyncio.sleep(0)
            if took["plain"] > 0:
                ratios.append(took["traced"] / took["plain"])
        pairs = batches * 1000
        for name, (wall, thread) in totals.items():
            wall_ns, cpu_ns = wall / pairs * 1e9, thread / pairs * 1e9
            print(f"{name:7} {wall_ns:7.0f} ns/pair wall  {cpu_ns:7.0f} cpu")
        p, t = totals["plain"], totals["traced"]
        print(
            f"traced/plain: wall {t[0] / p[0]:.3f}x  cpu {t[1] / p[1]:.3f}x  "
            f"median of rounds (cpu) {statistics.median(ratios):.3f}x"
        )


async def _burst(timer: aiowheel.Timer, n: int, rng: random.Random) -> list[tuple[float, float]]:
    # n timers due within 20 ms from 0.2 s ahead: (wall, CPU) at the first and last
    # callback.
    perf, cpu = time.perf_counter, time.thread_time
    marks: list[tuple[float, float]] = []
    left = n
    done = asyncio.Event()

    def callback() -> None:
        nonlocal left
        if left == n:
            marks.append((perf(), cpu()))
        left -= 1
        if not left:
            marks.append((perf(), cpu()))
            done.set()

    base = timer.time() + 0.2
    for _ in range(n):
        timer.schedule_at_nowait(base + rng.uniform(0.0, 0.02), callback)
    gc.collect()
    await done.wait()
    return marks


async def fire(n: int, every: int, rounds: int, kind: str) -> None:
    # Bursts of n timers due within 20 ms, on one timer then the other (the order
    # swapped every round); a burst's time runs from its first callback to its last
    # (wall clock and the loop thread's CPU time), as the bench's fire rate does.
    rng = random.Random(7)
    recorder: Any = (
        NullColumns(every) if kind == "null" else ParquetRecorder(tempfile.mkdtemp(), every=every)
    )
    totals = {"plain": [0.0, 0.0], "traced": [0.0, 0.0]}
    ratios = []
    async with aiowheel.Timer() as plain, aiowheel.Timer(recorder=recorder) as traced:
        for number in range(rounds):
            pair = [("plain", plain), ("traced", traced)]
            if number % 2:
                pair.reverse()
            took = {}
            for name, timer in pair:
                marks = await _burst(timer, n, rng)
                (w0, c0), (w1, c1) = marks
                totals[name][0] += w1 - w0
                totals[name][1] += c1 - c0
                took[name] = c1 - c0
            if took["plain"] > 0:
                ratios.append(took["traced"] / took["plain"])
    fired = rounds * n
    for name, (wall, thread) in totals.items():
        print(f"{name:7} {wall / fired * 1e9:7.0f} ns/timer wall  {thread / fired * 1e9:7.0f} cpu")
    p, t = totals["plain"], totals["traced"]
    print(
        f"fire traced/plain: wall {t[0] / p[0]:.3f}x  cpu {t[1] / p[1]:.3f}x  "
        f"median of rounds (cpu) {statistics.median(ratios):.3f}x"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["fire"]:
        fire_args = sys.argv[2:]
        if len(fire_args) > 3 and fire_args[3] == "uvloop":
            import uvloop

            uvloop.install()
        asyncio.run(
            fire(
                int(fire_args[0]) if fire_args else 200_000,
                int(fire_args[1]) if len(fire_args) > 1 else 100,
                int(fire_args[2]) if len(fire_args) > 2 else 10,
                fire_args[4] if len(fire_args) > 4 else "null",
            )
        )
        sys.exit()
    args = sys.argv[1:]
    n = int(args[0]) if args else 1_000_000
    every = int(args[1]) if len(args) > 1 else 100
    batches = int(args[2]) if len(args) > 2 else 200
    if len(args) > 3 and args[3] == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(main(n, every, batches, args[4] if len(args) > 4 else "null"))
