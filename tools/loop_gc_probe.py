"""Where the drop-in loop's time goes with many timers pending: the garbage collector.

Usage: ``python tools/loop_gc_probe.py [--reps 5] [--pending 100000] [--steps 200000]``.

Prints, per loop (asyncio, the drop-in loop on asyncio, uvloop, the drop-in loop on
uvloop), medians over repetitions interleaved loop by loop:

* the objects the collector tracks per pending ``call_later`` timer, and the time of a
  ``gc.collect()`` with ``--pending`` timers pending;
* what a cancelled timer leaves to the collector: the objects ``gc.collect()`` finds
  unreachable after 10,000 pending timers are cancelled and dropped (0 when reference
  counting freed them at once);
* for ``--steps`` task steps that each keep one new object alive (request state), with
  the timers pending: the collector's time per step (``gc.callbacks``) and the full
  collections run, as is and with the pending timers frozen out of the collector's
  reach (``gc.freeze()`` after filling them).

docs/loop.md ("Figures") quotes it. It changes nothing in aiowheel.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import aiowheel


class _Collector:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.full += info["generation"] == 2


def _loops() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop,
        "loop-asyncio": lambda: aiowheel.new_event_loop(base="asyncio"),
    }
    try:
        import uvloop
    except ImportError:
        return loops
    loops["uvloop"] = uvloop.new_event_loop
    loops["loop-uvloop"] = lambda: aiowheel.new_event_loop(base="uvloop")
    return loops


async def _probe(pending: int, steps: int, freeze: bool) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    rng = random.Random(20150515)
    gc.collect()
    before = len(gc.get_objects())
    handles = [loop.call_later(rng.uniform(60.0, 90.0), int) for _ in range(pending)]
    await asyncio.sleep(0)
    gc.collect()
    tracked = (len(gc.get_objects()) - before) / pending
    t0 = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t0) * 1e3
    # What cancelled timers leave to the collector.
    gc.disable()
    try:
        for handle in handles[-10_000:]:
            handle.cancel()
        del handles[-10_000:]
        left = gc.collect() / 10_000
    finally:
        gc.enable()
    if freeze:
        gc.freeze()
    kept: list[list[int]] = []
    per_task = steps // 100

    async def stepper() -> None:
        for _ in range(per_task):
            kept.append([])
            await asyncio.sleep(0)

    collector = _Collector()
    gc.callbacks.append(collector)
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*[stepper() for _ in range(100)])
        step_ns = (time.perf_counter() - t0) / (per_task * 100) * 1e9
    finally:
        gc.callbacks.remove(collector)
        gc.unfreeze()
    for handle in handles:
        handle.cancel()
    return {
        "tracked": tracked,
        "full_ms": full_ms,
        "left": left,
        "step_ns": step_ns,
        "gc_ns": collector.seconds / (per_task * 100) * 1e9,
        "full": collector.full,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=200_000)
    ns = parser.parse_args()
    loops = _loops()
    samples: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for _ in range(ns.reps):
        for freeze in (False, True):
            for name, new_loop in loops.items():
                loop = new_loop()
                try:
                    result = loop.run_until_complete(_probe(ns.pending, ns.steps, freeze))
                finally:
                    loop.close()
                samples.setdefault((name, freeze), []).append(result)

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    print(f"{ns.pending:,} pending call_later timers, {ns.steps:,} steps keeping an object")
    print(f"medians of {ns.reps}, loops interleaved; load average {_loadavg()}")
    for (name, freeze), rows in samples.items():
        if not freeze:
            print(
                f"{name:13s} tracked objects per timer {med(rows, 'tracked'):.2f}; "
                f"gc.collect() {med(rows, 'full_ms'):.1f} ms; "
                f"unreachable per cancelled timer {med(rows, 'left'):.2f}"
            )
    for (name, freeze), rows in samples.items():
        print(
            f"{name:13s} {'gc.freeze() ' if freeze else 'as is       '} step "
            f"{med(rows, 'step_ns'):6.0f} ns, in the collector {med(rows, 'gc_ns'):6.0f} ns, "
            f"full collections {med(rows, 'full'):.0f}"
        )


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
