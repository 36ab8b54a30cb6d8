"""Where a sampled trace's cost comes from: churn at several pending counts, with the
garbage collector's work counted (gc.callbacks) during the timed part.

    python tools/trace_gc_probe.py [REPS] [asyncio|uvloop] [N,N,...]

Modes, alternating every repetition: ``none`` (no recorder); ``null-k`` (a recorder
that takes column batches like ``ParquetRecorder`` but keeps nothing and starts no
thread: the timer's own side of tracing, every=k); ``parquet-k`` (``ParquetRecorder``,
every=k). For each mode and N it prints the median ns per schedule + cancel pair, the
ratio to ``none``, and the collections per generation with the time they took.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import aiowheel
from aiowheel.trace import ParquetRecorder


def _noop() -> None:
    pass


class NullColumns:
    """Takes column batches and hands the same lists back: no thread, no file."""

    def __init__(self, every: int, batch_rows: int = 32_768) -> None:
        self.every = every
        self.batch_rows = batch_rows
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


class GcCount:
    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.active = False
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.active:
            return
        gen = info["generation"]
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.count[gen] += 1
            self.seconds[gen] += time.perf_counter() - self._t


def _recorder(mode: str, directory: str) -> Any:
    if mode == "none":
        return None
    kind, every = mode.split("-")
    if kind == "null":
        return NullColumns(int(every))
    return ParquetRecorder(directory, every=int(every))


async def churn(
    mode: str, directory: str, n: int, ops: int = 100_000
) -> tuple[float, GcCount, float]:
    counter = GcCount()
    gc.callbacks.append(counter)
    try:
        async with aiowheel.Timer(recorder=_recorder(mode, directory)) as timer:
            schedule = timer.schedule_nowait
            for i in range(n):
                schedule(10 + i * 1e-4, _noop)
            gc.collect()
            delays = [5.0 + i * 1e-3 for i in range(1000)]
            counter.active = True
            t0 = time.perf_counter()
            c0 = time.thread_time()
            for _ in range(ops // 1000):
                for delay in delays:
                    schedule(delay, _noop).cancel()
                await asyncio.sleep(0)
            elapsed = time.perf_counter() - t0
            cpu = time.thread_time() - c0
            counter.active = False
        return elapsed / ops * 1e9, counter, cpu / ops * 1e9
    finally:
        gc.callbacks.remove(counter)


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    if len(sys.argv) > 2 and sys.argv[2] == "uvloop":
        import uvloop

        uvloop.install()
    sizes = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1000, 50_000]
    modes = sys.argv[4].split(",") if len(sys.argv) > 4 else ["none", "null-100", "null-1"]
    directory = tempfile.mkdtemp()
    try:
        for n in sizes:
            results: dict[str, list[tuple[float, GcCount, float]]] = {m: [] for m in modes}
            for rep in range(reps):
                for mode in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
                    results[mode].append(asyncio.run(churn(mode, directory, n)))
            base = statistics.median(r[0] for r in results["none"]) if "none" in modes else 0
            cbase = statistics.median(r[2] for r in results["none"]) if "none" in modes else 0
            for mode, runs in results.items():
                med = statistics.median(r[0] for r in runs)
                counts = [statistics.median(r[1].count[g] for r in runs) for g in range(3)]
                ms = [statistics.median(r[1].seconds[g] for r in runs) * 1e3 for g in range(3)]
                cpu = statistics.median(r[2] for r in runs)
                ratio = f"{med / base:.2f}x" if base else ""
                cratio = f"{cpu / cbase:.2f}x" if cbase else ""
                print(
                    f"N={n:>7} {mode:11} {med:6.0f} ns/pair {ratio:6} cpu {cpu:6.0f} {cratio:6} gc "
                    + " ".join(f"g{g}:{counts[g]:.0f}/{ms[g]:.1f}ms" for g in range(3))
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
