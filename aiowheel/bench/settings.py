"""What one ``aiowheel bench`` run was asked to do (built from the command line)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contenders import CONTENDERS, Contender

__all__ = ["Settings"]


@dataclass
class Settings:
    workloads: list[str]
    #: Default: every contender but the -pure ones (``contenders.select(None)``).
    contenders: list[Contender] = field(
        default_factory=lambda: [c for c in CONTENDERS if not c.pure]
    )
    #: Contenders of the default set (or of a kind) whose event loop is not installed,
    #: with the reason: every workload that applies to them lists them as skipped.
    unavailable: list[tuple[Contender, str]] = field(default_factory=list)
    #: Sizes for every N-based workload (None: each workload's default).
    n: list[int] | None = None
    reps: int = 3
    quick: bool = False
    #: Timed operations per repetition for churn/rearm (None: workload default).
    ops: int | None = None
    #: churn: the pairs stop at this many seconds (after whole batches, at least 5).
    op_seconds: float = 5.0
    seed: int = 20150515
    json: bool = False
    #: Write one Parquet trace per contender and workload here (an extra, unmeasured
    #: repetition each).
    trace_dir: Path | None = None
    #: spread: timers are due uniformly over this many seconds.
    spread_window: float = 5.0
    #: idle: seconds of reads per repetition, and the idle timeout.
    idle_seconds: float = 2.0
    idle_timeout: float = 1.0
    #: kafka: "high", "low" or both; search probe length; the final confirmation
    #: length (the rate must be sustained this long); falling-behind threshold.
    kafka_cases: tuple[str, ...] = ("high",)
    kafka_probe: float = 1.0
    kafka_seconds: float = 10.0
    kafka_max_lag: float = 0.050
    #: kafka: the search starts at this rate and stops at the maximum (req/s).
    kafka_start_rate: float = 25_000.0
    kafka_max_rate: float = 1_600_000.0
    #: kafka: the fixed rates (req/s) at which the CPU and the collector's time are
    #: measured, as Kafka's proposal did (empty: none), and each probe's length.
    kafka_targets: tuple[float, ...] = (25_000.0, 50_000.0, 100_000.0)
    kafka_target_seconds: float = 3.0
    #: loop-few: seconds the N tasks sleep 1 ms over and over.
    loop_seconds: float = 1.0
    #: server: seconds of load per phase (None: 0.5 quick, 2 otherwise).
    server_seconds: float | None = None
    #: server: rounds (None: the larger of 3 and ``reps``; --reps, when given, sets it).
    server_rounds: int | None = None
    #: Tasks are ~3 KB each: the trio-native contender skips sizes above this.
    trio_max_tasks: int = 200_000
    progress: bool = True

    def as_json(self) -> dict[str, Any]:
        """The settings in the ``run`` line of ``--json`` and in bench-results.json."""
        return {
            "workloads": self.workloads,
            "contenders": [c.name for c in self.contenders],
            "unavailable": {c.name: reason for c, reason in self.unavailable},
            "n": self.n,
            "reps": self.reps,
            "quick": self.quick,
            "ops": self.ops,
            "op_seconds": self.op_seconds,
            "seed": self.seed,
            "trace_dir": str(self.trace_dir) if self.trace_dir else None,
            "spread_window": self.spread_window,
            "idle_seconds": self.idle_seconds,
            "idle_timeout": self.idle_timeout,
            "kafka_cases": list(self.kafka_cases),
            "kafka_probe": self.kafka_probe,
            "kafka_seconds": self.kafka_seconds,
            "kafka_targets": list(self.kafka_targets),
            "kafka_target_seconds": self.kafka_target_seconds,
            "loop_seconds": self.loop_seconds,
            "server_seconds": self.server_seconds,
            "server_rounds": self.server_rounds,
        }
