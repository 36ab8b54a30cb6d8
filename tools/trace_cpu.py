"""What tracing costs a timer, in CPU time: the event loop's thread and the process.

    python tools/trace_cpu.py [REPS] [asyncio|uvloop]

Churn (100,000 pending, 400,000 schedule + cancel pairs) and fire (200,000 timers due
within 20 ms, from the first callback to the last), without a recorder, with a
``ParquetRecorder`` tracing every timer and with one tracing one timer in 100; the
modes alternate every repetition. Prints medians per operation: wall clock, the loop
thread's CPU time, and the process's (the recorder's writer thread included), each
against no recorder. ``aiowheel bench -c traced`` measures the wall clock side by
side; this separates the loop's cost from the writer's (docs/analytics.md,
"Benchmarks of the pipeline itself").
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiowheel
from aiowheel.trace import ParquetRecorder

Figures = tuple[float, float, float]  # ns per operation: wall, loop CPU, process CPU


def _noop() -> None:
    pass


def _recorder(mode: str, directory: str) -> ParquetRecorder | None:
    if mode == "none":
        return None
    return ParquetRecorder(directory, every=1 if mode == "traced" else 100)


def _now() -> Figures:
    return time.perf_counter(), time.thread_time(), time.process_time()


def _per(start: Figures, end: Figures, ops: int) -> Figures:
    wall, loop, process = ((b - a) / ops * 1e9 for a, b in zip(start, end, strict=True))
    return wall, loop, process


async def churn(mode: str, directory: str, n: int = 100_000, ops: int = 400_000) -> Figures:
    async with aiowheel.Timer(recorder=_recorder(mode, directory)) as timer:
        schedule = timer.schedule_nowait
        for i in range(n):
            schedule(10 + i * 1e-4, _noop)
        gc.collect()
        delays = [5.0 + i * 1e-3 for i in range(1000)]
        start = _now()
        for _ in range(ops // 1000):
            for delay in delays:
                schedule(delay, _noop).cancel()
            await asyncio.sleep(0)
        return _per(start, _now(), ops)


async def fire(mode: str, directory: str, n: int = 200_000) -> Figures:
    async with aiowheel.Timer(recorder=_recorder(mode, directory)) as timer:
        done = asyncio.Event()
        left = n
        first: list[Figures] = []

        def callback() -> None:
            nonlocal left
            if left == n:
                first.append(_now())
            left -= 1
            if not left:
                done.set()

        base = timer.time() + 0.5
        for i in range(n):
            timer.schedule_at_nowait(base + (i % 1000) * 2e-5, callback)
        await done.wait()
        return _per(first[0], _now(), n)


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    if len(sys.argv) > 2 and sys.argv[2] == "uvloop":
        import uvloop

        uvloop.install()
    directory = tempfile.mkdtemp()
    workloads: list[Callable[[str, str], Coroutine[Any, Any, Figures]]] = [churn, fire]
    try:
        for workload in workloads:
            results: dict[str, list[Figures]] = {}
            for _ in range(reps):
                for mode in ("none", "traced", "sampled"):
                    results.setdefault(mode, []).append(asyncio.run(workload(mode, directory)))
            base = [statistics.median(r[k] for r in results["none"]) for k in range(3)]
            for mode, runs in results.items():
                med = [statistics.median(r[k] for r in runs) for k in range(3)]
                print(
                    f"{workload.__name__:6} {mode:8}"
                    + "".join(
                        f"  {name} {m:6.0f} ns ({m / b - 1:+.0%})"
                        for name, m, b in zip(("wall", "loop", "all"), med, base, strict=True)
                    )
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
