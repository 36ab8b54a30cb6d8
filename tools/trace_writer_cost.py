"""What the trace writer's stint holding the GIL costs per row, step by step.

    python tools/trace_writer_cost.py [BATCHES]

Builds batches of 32,768 rows shaped as a churn's (schedule + cancel: int ids, no
labels, scheduled and deadline times, fired_at the shared NaN, a cancel time, small
levels), then times each step of the conversion that
``_TraceWriter.write_columns`` (aiowheel/trace.py) makes before it lets the loop
go on, and the freeing of the rows' values that follows the write: ns per row,
medians over BATCHES (default 15). The steps are the same calls, repeated here one
by one so that each can be timed (docs/benchmark-history.md, "What bounds the
three that are missed").
"""

from __future__ import annotations

import math
import random
import statistics
import struct
import sys
import time
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

ROWS = 32_768
_packers: dict[str, struct.Struct] = {}


def churn_rows() -> list[list[Any]]:
    ids = [100_000 + i for i in range(ROWS)]
    random.shuffle(ids)
    scheduled = [random.random() * 100 for _ in range(ROWS)]
    deadlines = [x + random.random() * 30 for x in scheduled]
    nan = math.nan
    fired = [nan] * ROWS
    cancelled = [x + 0.001 for x in scheduled]
    levels = [random.randrange(4) for _ in range(ROWS)]
    return [ids, [None] * ROWS, scheduled, deadlines, fired, cancelled, levels]


def packed(fmt: str, values: list[Any], type_: pa.DataType) -> pa.Array:
    packer = _packers.get(fmt)
    if packer is None:
        packer = _packers[fmt] = struct.Struct(f"={ROWS}{fmt}")
    return pa.Array.from_buffers(type_, ROWS, [None, pa.py_buffer(packer.pack(*values))])


def convert(columns: list[list[Any]]) -> dict[str, float]:
    ids, labels, scheduled, deadlines, fired, cancelled, levels = columns
    f64 = pa.float64()
    marks = [("start", time.perf_counter())]
    deadline = packed("d", deadlines, f64)
    marks.append(("deadline", time.perf_counter()))
    fired_at = pa.array(fired, f64, from_pandas=True)
    marks.append(("fired_at (NaN as null)", time.perf_counter()))
    packed("q", ids, pa.int64())
    marks.append(("timer_id", time.perf_counter()))
    labels.count(None)
    marks.append(("label (all None)", time.perf_counter()))
    packed("b", levels, pa.int8())
    marks.append(("level", time.perf_counter()))
    packed("d", scheduled, f64)
    marks.append(("scheduled_at", time.perf_counter()))
    pa.array(cancelled, f64, from_pandas=True)
    marks.append(("cancelled_at (NaN as null)", time.perf_counter()))
    pc.subtract(fired_at, deadline)
    marks.append(("lateness kernel", time.perf_counter()))
    nones = [None] * ROWS
    for column in columns:
        column[:] = nones
    marks.append(("freeing the values", time.perf_counter()))
    steps = {name: (t - marks[i][1]) / ROWS * 1e9 for i, (name, t) in enumerate(marks[1:])}
    steps["total"] = (marks[-1][1] - marks[0][1]) / ROWS * 1e9
    return steps


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    if batches < 1:
        sys.exit("usage: python tools/trace_writer_cost.py [BATCHES >= 1]")
    runs = [convert(churn_rows()) for _ in range(batches)]
    for name in runs[0]:
        print(f"{name:28} {statistics.median(run[name] for run in runs):6.1f} ns/row")


if __name__ == "__main__":
    main()
