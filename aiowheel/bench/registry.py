"""Every workload, by name, in the order ``aiowheel bench`` runs them by default.

The only module that imports the workloads: they import their interfaces
(``workload.py``) and never each other.
"""

from __future__ import annotations

from .kafka import Cycle, Kafka
from .workload import AnyWorkload
from .workloads import Churn, Fire, Idle, Memory, Rearm, Spread, TimeoutScope

__all__ = ["WORKLOADS"]

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
        Idle(),
        TimeoutScope(),
    )
}
