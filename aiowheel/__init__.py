"""aiowheel: a hierarchical timing-wheel timer for asyncio, uvloop and trio.

Kafka's SystemTimer brought to async Python: O(1) schedule, cancel and re-arm, one
driver per timer that wakes only when the earliest occupied bucket is due, async
callbacks on a bounded worker pool, and a purgatory of delayed operations.
"""

from pathlib import Path as _Path

from ._compiled import select_core as _select_core

#: True when the compiled core runs (the C extensions built by mypyc from the same
#: sources), False when the pure-Python one does (no C compiler at install time, or
#: ``AIOWHEEL_PURE=1``). Chosen here, before any core module is imported.
COMPILED: bool = _select_core(__name__, _Path(__file__).parent)

from ._exceptions import TimerCancelled, TimerClosed, TimerError, TimerFull
from ._handle import TimerHandle
from ._loop import (
    EventLoopPolicy,
    WheelEventLoop,
    loop_base,
    loop_timer,
    new_event_loop,
    new_uvloop_event_loop,
    run,
)
from ._periodic import PeriodicHandle
from ._timeout import Timeout
from ._timer import Timer, TimerStats
from .purgatory import DelayedOperation, Purgatory
from .trace import TraceRecorder

__version__ = "0.1.0"

__all__ = [
    "COMPILED",
    "DelayedOperation",
    "EventLoopPolicy",
    "PeriodicHandle",
    "Purgatory",
    "Timeout",
    "Timer",
    "TimerCancelled",
    "TimerClosed",
    "TimerError",
    "TimerFull",
    "TimerHandle",
    "TimerStats",
    "TraceRecorder",
    "WheelEventLoop",
    "__version__",
    "loop_base",
    "loop_timer",
    "new_event_loop",
    "new_uvloop_event_loop",
    "run",
]
