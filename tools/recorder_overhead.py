"""What a trace recorder costs the event loop: churn and fire with and without one.

Runs the ``churn`` and ``fire`` workloads of ``aiowheel bench`` (the same code,
aiowheel/bench/workloads.py) on aiowheel, in three modes, alternating them repetition
after repetition (A B C, B C A, C A B ...: machine drift hits all alike):

* ``none``: ``Timer()``, no recorder;
* ``core``: a recorder whose ``record()`` does nothing: what the timer's own trace
  bookkeeping costs (traced handles, ids, clock reads, one ``record()`` call per timer);
* ``parquet``: ``aiowheel.trace.ParquetRecorder`` writing to a temporary directory.

It prints the median of each mode (churn: ns per schedule+cancel pair; fire: ns per
timer from the window start to the last callback, i.e. 1e9 / rate) and the ratios to
``none``. ``--micro`` also times ``ParquetRecorder.record()`` alone (timeit, ns/call)
and the writer thread's conversion of one chunk to an Arrow batch (ns/row).

    PYTHONPATH=$PWD python tools/recorder_overhead.py --reps 5
    PYTHONPATH=$PWD python tools/recorder_overhead.py --backend trio --quick --micro

On a shared machine single figures move by tens of percent: compare medians of
several repetitions, and rerun.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import aiowheel
from aiowheel.bench.contenders import Contender
from aiowheel.bench.env import open_env, run_fresh
from aiowheel.bench.settings import Settings
from aiowheel.bench.workloads import Churn, Fire
from aiowheel.trace import ParquetRecorder, trace_schema

MODES = ("none", "core", "parquet")


class NullRecorder:
    """A recorder that records nothing: isolates the timer's side of tracing."""

    def open(self, *, backend: str, clock: float) -> None:
        pass

    def record(
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        fired_at: float | None,
        cancelled_at: float | None,
    ) -> None:
        pass

    def close(self) -> None:
        pass


def _recorder(mode: str, directory: str, rep: int) -> aiowheel.TraceRecorder | None:
    if mode == "none":
        return None
    if mode == "core":
        return NullRecorder()
    return ParquetRecorder(directory, run_id=f"overhead-{rep}-{time.monotonic_ns()}")


def _run_once(
    workload: Churn | Fire,
    contender: Contender,
    n: int,
    data: Any,
    settings: Settings,
    state: dict[str, float],
    recorder: aiowheel.TraceRecorder | None,
) -> dict[str, float]:
    async def body() -> dict[str, float]:
        async with open_env(contender, recorder) as env:
            return await workload.run(env, n, data, settings, state)

    values: dict[str, float] = run_fresh(contender.backend, body)
    if isinstance(recorder, ParquetRecorder) and recorder.dropped:
        print(f"    ({recorder.dropped:,} rows dropped by the writer)")
    return values


def measure(
    name: str,
    workload: Churn | Fire,
    figure: Callable[[dict[str, float]], float],
    n: int,
    settings: Settings,
    contender: Contender,
    directory: str,
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    states: dict[str, dict[str, float]] = {mode: {} for mode in MODES}
    for rep in range(settings.reps + 1):  # rep 0 warms up (and sizes fire's lead time)
        data = workload.prepare(n, rep, settings)
        # Rotated each repetition, so that no mode always runs first or last.
        shift = rep % len(MODES)
        for mode in MODES[shift:] + MODES[:shift]:
            recorder = _recorder(mode, directory, rep)
            values = _run_once(workload, contender, n, data, settings, states[mode], recorder)
            if rep:
                samples[mode].append(figure(values))
        if rep:
            line = "  ".join(f"{m} {samples[m][-1]:8.1f}" for m in MODES)
            print(f"  {name} rep {rep}: {line}")
    return samples


def micro(batch_rows: int = 32_768) -> None:
    """record() alone (timeit, ns per call, the writer busy meanwhile), then the
    writer's conversion of one full chunk to an Arrow record batch (ns per row)."""
    calls = 4 * batch_rows
    with tempfile.TemporaryDirectory() as directory:
        recorder = ParquetRecorder(
            directory, run_id="micro", batch_rows=batch_rows, max_queued_batches=1000
        )
        recorder.open(backend="asyncio", clock=0.0)
        for stmt in (
            "r.record(12345, 'label', 1000.25, 1001.5, 2, 1001.51, None)",
            "r.record(12345, None, 1000.25, 1001.5, 2, None, 1000.75)",
        ):
            best = min(timeit.repeat(stmt, globals={"r": recorder}, number=calls, repeat=5))
            print(f"record(): {best / calls * 1e9:6.1f} ns/call  {stmt}")
        recorder.close()
        print(f"  (written {recorder.written:,}, dropped {recorder.dropped:,})")

        # The conversion alone, into a writer that keeps the batch.
        class Keep:
            schema = trace_schema()
            batch: Any = None

            def write_batch(self, batch: Any) -> None:
                self.batch = batch

        recorder = ParquetRecorder(directory, run_id="micro-conv", batch_rows=batch_rows + 1)
        recorder.open(backend="asyncio", clock=0.0)
        for i in range(batch_rows):
            recorder.record(i, "label" if i % 2 else None, 1.0 * i, 2.0 * i, 1, None, 1.5 * i)
        chunk = recorder._take_chunk()
        recorder.close()
        # (close() leaves the writer's typed constants in place for write_batch.)
        keep = Keep()
        best = min(
            timeit.repeat(
                lambda: recorder._writer.write_batch(keep, chunk),  # type: ignore[arg-type]
                number=1,
                repeat=20,
            )
        )
        print(f"writer: chunk to Arrow batch {best / batch_rows * 1e9:6.1f} ns/row")
    nothing = NullRecorder()
    best = min(
        timeit.repeat(
            "r.record(12345, 'label', 1000.25, 1001.5, 2, 1001.51, None)",
            globals={"r": nothing},
            number=calls,
            repeat=5,
        )
    )
    print(f"a no-op record() method, for scale: {best / calls * 1e9:6.1f} ns/call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", choices=("asyncio", "uvloop", "trio"), default="asyncio")
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions per mode")
    parser.add_argument("--quick", action="store_true", help="the bench's --quick sizes")
    parser.add_argument("--churn-n", type=int, default=None, help="pending timers in churn")
    parser.add_argument("--fire-n", type=int, default=None, help="timers in fire")
    parser.add_argument("--only", choices=("churn", "fire"), default=None)
    parser.add_argument("--micro", action="store_true", help="also time record() alone")
    ns = parser.parse_args()
    if ns.micro:
        micro()
    settings = Settings(workloads=["churn", "fire"], reps=ns.reps, quick=ns.quick)
    contender = Contender(f"aiowheel-{ns.backend}", "aiowheel", ns.backend)
    churn, fire = Churn(), Fire()
    plan: list[tuple[str, Churn | Fire, Callable[[dict[str, float]], float], int]] = [
        ("churn", churn, lambda v: v["pair_ns"], ns.churn_n or churn.default_sizes(ns.quick)[0]),
        ("fire", fire, lambda v: 1e9 / v["rate"], ns.fire_n or fire.default_sizes(ns.quick)[0]),
    ]
    summary = []
    with tempfile.TemporaryDirectory() as directory:
        for name, workload, figure, n in plan:
            if ns.only not in (None, name):
                continue
            print(f"{name} N={n:,} on {ns.backend}, {ns.reps} reps (ns per op):")
            samples = measure(name, workload, figure, n, settings, contender, directory)
            medians = {mode: statistics.median(samples[mode]) for mode in MODES}
            base = medians["none"]
            summary.append(
                f"{name:6s} N={n:>9,}  none {base:8.1f}  "
                f"core {medians['core']:8.1f} ({medians['core'] / base - 1:+6.1%})  "
                f"parquet {medians['parquet']:8.1f} ({medians['parquet'] / base - 1:+6.1%})  "
                f"parquet/core {medians['parquet'] / medians['core'] - 1:+6.1%}"
            )
    print(f"medians ({ns.backend}, ns per op, vs no recorder):")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
