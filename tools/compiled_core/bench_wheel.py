"""Micro-benchmark of the wheel's operations: pure Python vs compiled variants
(docs/design.md, "Compiled core"; tools/compiled_core/run.sh builds the variants).

Each variant is a module with the Wheel/WheelEntry API of aiowheel/_wheel.py, loaded
from a file (``NAME=path.py``) or imported from a directory (``NAME=module@dir``, for
an extension module, which keeps the name it was compiled under). Variants are measured
round-robin in one process, so noise hits all alike; each figure is the median of the
repeats, in ns of this thread's CPU time per operation.

    python bench_wheel.py NAME=TARGET [NAME=TARGET ...] [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import random
import statistics
import sys
import time
import tracemalloc
from typing import Any


def load(name: str, target: str) -> Any:
    """``path/to/file.py`` is loaded as module ``name``; ``module@dir`` is imported
    from ``dir`` (an extension module must keep the name it was compiled under)."""
    if "@" in target:
        module_name, _, directory = target.partition("@")
        sys.path.insert(0, directory)
        try:
            return importlib.import_module(module_name)
        finally:
            sys.path.remove(directory)
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


SPAN = 60.0  # deadlines uniform over a minute: idle-timeout-like
TICK = 0.001
SIZE = 64


def filled(mod: Any, n: int, seed: int) -> tuple[Any, list[Any]]:
    rng = random.Random(seed)
    wheel = mod.Wheel(TICK, SIZE, 0.0)
    entries = [mod.WheelEntry() for _ in range(n)]
    insert = wheel.insert
    for entry in entries:
        insert(entry, rng.uniform(0.001, SPAN))
    return wheel, entries


def timed(fn: Any, *args: Any) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = time.thread_time_ns()
        fn(*args)
        return time.thread_time_ns() - t0
    finally:
        gc.enable()


def op_insert(wheel: Any, batch: list[Any], deadlines: list[float]) -> None:
    insert = wheel.insert
    for entry, deadline in zip(batch, deadlines, strict=True):
        insert(entry, deadline)


def op_remove(wheel: Any, batch: list[Any]) -> None:
    remove = wheel.remove
    for entry in batch:
        remove(entry)


def op_extend(wheel: Any, batch: list[Any], deadlines: list[float]) -> None:
    extend = wheel.extend
    for entry, deadline in zip(batch, deadlines, strict=True):
        extend(entry, deadline)


def op_drain(wheel: Any, drain_bucket: Any = None) -> int:
    """Drive the wheel as the driver does (to next_expiry) and fire everything."""
    fired = 0
    inf = float("-inf")
    while True:
        when = wheel.next_expiry()
        if when is None:
            return fired
        if when == inf:
            when = wheel.tick_time(wheel.now_tick)
        for bucket in wheel.advance(when):
            if drain_bucket is not None:
                fired += drain_bucket(bucket)
                continue
            for entry in bucket:
                entry._bucket = None
            fired += len(bucket)
            bucket.clear()


def measure(mod: Any, n: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed + 1)
    wheel, entries = filled(mod, n, seed)
    m = min(n, 100_000)
    batch = [mod.WheelEntry() for _ in range(m)]
    deadlines = [rng.uniform(0.001, SPAN) for _ in range(m)]
    out = {}
    out["insert"] = timed(op_insert, wheel, batch, deadlines) / m
    out["remove"] = timed(op_remove, wheel, batch) / m
    # Re-arm later (the idle-timeout pattern): the lazy extend.
    sample = rng.sample(entries, m)
    later = [e._deadline + 5.0 for e in sample]
    out["extend_later"] = timed(op_extend, wheel, sample, later) / m
    # Move earlier: out of its bucket and filed again.
    earlier = [max(0.001, e._deadline - 30.0) for e in sample]
    out["extend_earlier"] = timed(op_extend, wheel, sample, earlier) / m
    out["drain"] = timed(op_drain, wheel, getattr(mod, "drain_bucket", None)) / n
    return out


def memory(mod: Any, n: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    wheel, entries = filled(mod, n, 7)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del wheel, entries
    return (after - before) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    mods = {}
    for spec in args.variants:
        name, _, path = spec.partition("=")
        mods[name] = load(f"variant_{name}", path)
    sizes = [int(s) for s in args.sizes.split(",")]
    ops = ["insert", "remove", "extend_later", "extend_earlier", "drain"]
    print(f"python {sys.version.split()[0]}, medians of {args.repeats}, ns per op")
    for n in sizes:
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in mods}
        for r in range(args.repeats):
            for name, mod in mods.items():
                runs[name].append(measure(mod, n, seed=r))
        print(f"\nN = {n:,} pending")
        print(f"{'variant':<12}" + "".join(f"{op:>16}" for op in ops))
        for name in mods:
            med = {op: statistics.median(run[op] for run in runs[name]) for op in ops}
            print(f"{name:<12}" + "".join(f"{med[op]:>16.0f}" for op in ops))
    print("\nmemory per pending entry (entry + bucket slot), N = 100,000:")
    for name, mod in mods.items():
        print(f"{name:<12}{memory(mod, 100_000):>8.1f} B")


if __name__ == "__main__":
    main()
