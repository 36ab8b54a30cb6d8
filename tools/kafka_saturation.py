"""What a request costs each contender of ``aiowheel bench -w kafka``, at saturation.

    python tools/kafka_saturation.py [CONTENDERS] [SECONDS] [ROUNDS]

A probe offered far more requests than anyone sustains (1,000,000/s, the high-timeout
case) runs flat out: the requests it gets through per second are the inverse of what
one costs, harness included. ``null`` is the harness alone (arrivals, the heap of
completions, the measured lags) with a model that does nothing. Each probe also
counts the garbage collector's collections per generation, how long they took, and
how many objects the young generation held when one started (CPython 3.11 counts the
frees of old objects against the young generation, so it can hold several times its
threshold). Contenders alternate, round by round (docs/benchmark-history.md, "What
bounds the three that are missed").

CONTENDERS: comma-separated, default ``aiowheel-uvloop,call_later-uvloop,null``.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any

from aiowheel.bench import kafka
from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.settings import Settings

RATE = 1_000_000.0
#: The contenders the kafka workload runs in this process (the -pure ones run in a
#: child: ``aiowheel bench``), and the harness alone.
NAMES = {c.name for c in CONTENDERS if kafka.Kafka().applies_to(c) and not c.pure} | {"null"}


class GcWatch:
    """A ``gc.callbacks`` hook: the collections per generation and their seconds, and
    the young list's size at every eighth young collection."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.young: list[int] = []
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        gen = info["generation"]
        if phase == "start":
            if gen == 0 and self.count[0] % 8 == 0:
                self.young.append(len(gc.get_objects(0)))
            self._t = time.perf_counter()
        else:
            self.count[gen] += 1
            self.seconds[gen] += time.perf_counter() - self._t


def _null_model(env: Any, counters: Any) -> Any:
    return (lambda key, created: None), (lambda request: None)


def probe(workload: kafka.Kafka, name: str, seconds: float, settings: Settings) -> str:
    contender_name = "call_later-uvloop" if name == "null" else name
    contender = next(c for c in CONTENDERS if c.name == contender_name)
    models = kafka._timer_model, kafka._purgatory_model
    if name == "null":
        kafka._timer_model = kafka._purgatory_model = _null_model
    watch = GcWatch()
    gc.callbacks.append(watch)
    try:
        result = workload.probe_once(contender, RATE, seconds, "high", settings)
    finally:
        gc.callbacks.remove(watch)
        kafka._timer_model, kafka._purgatory_model = models
    young = statistics.median(watch.young) if watch.young else 0
    collections = ", ".join(
        f"gen{g} {n} in {s * 1e3:.0f} ms"
        for g, (n, s) in enumerate(zip(watch.count, watch.seconds, strict=True))
    )
    return (
        f"{name:20} {result.achieved:>9,.0f} req/s  {1e6 / result.achieved:5.2f} us/request  "
        f"gc: {collections}; young list at a collection ~{young:,.0f} objects"
    )


def main() -> None:
    default = "aiowheel-uvloop,call_later-uvloop,null"
    names = (sys.argv[1] if len(sys.argv) > 1 else default).split(",")
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    unknown = sorted(set(names) - NAMES)
    if unknown or not seconds > 0 or rounds < 1:
        sys.exit(
            f"usage: {__doc__.strip().splitlines()[2].strip()}\n"
            f"CONTENDERS from: {', '.join(sorted(NAMES))}; SECONDS > 0; ROUNDS >= 1"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    workload = kafka.Kafka()
    settings = Settings(workloads=["kafka"])
    workload.pools(settings)  # drawn once, before the first probe
    for _ in range(rounds):
        for name in names:
            print(probe(workload, name, seconds, settings), flush=True)


if __name__ == "__main__":
    main()
