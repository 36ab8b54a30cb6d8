"""Every workload, by name, in the order ``aiowheel bench`` runs them (the opt-in ones,
``-w loop``, ``server`` and ``tracing``, last).

The only module that imports the workloads: they import their interfaces
(``workload.py``) and never each other.
"""

from __future__ import annotations

from .kafka import Cycle, Kafka
from .loop_workloads import (
    LOOP_GROUP,
    LoopCollector,
    LoopFew,
    LoopMemory,
    LoopReschedule,
    LoopSteps,
    LoopTimeout,
)
from .server import Server
from .tracing import Tracing
from .workload import AnyWorkload
from .workloads import Churn, Collector, Fire, Idle, Memory, Rearm, Spread, TimeoutScope

__all__ = ["DEFAULT_WORKLOADS", "GROUPS", "WORKLOADS"]

WORKLOADS: dict[str, AnyWorkload] = {
    w.name: w
    for w in (
        Churn(),
        Rearm(),
        Fire(),
        Spread(),
        Kafka(),
        Cycle(),
        Memory(),
        Collector(),
        Idle(),
        TimeoutScope(),
        LoopReschedule(),
        LoopSteps(),
        LoopTimeout(),
        LoopFew(),
        LoopMemory(),
        LoopCollector(),
        Server(),
        Tracing(),
    )
}

#: What runs when no ``--workload`` is given: every workload but the opt-in ones (the
#: drop-in loop's, issue 18: the main job must stay within its few minutes).
DEFAULT_WORKLOADS: list[str] = [name for name, w in WORKLOADS.items() if w.default]

#: ``--workload GROUP``: several workloads by one name.
GROUPS: dict[str, list[str]] = {
    LOOP_GROUP: [name for name in WORKLOADS if name.startswith(f"{LOOP_GROUP}-")],
}
