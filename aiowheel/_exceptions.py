"""The exceptions aiowheel raises (docs/usage.md, "Failure semantics").

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

__all__ = ["TimerCancelled", "TimerClosed", "TimerError", "TimerFull"]


class TimerError(Exception):
    """Base class of every aiowheel error."""


class TimerFull(TimerError):
    """``schedule_nowait`` found ``max_pending`` timers already pending."""


class TimerClosed(TimerError, RuntimeError):
    """The timer is not running: not started yet, or closed by ``aclose()``."""


class TimerCancelled(TimerError):
    """The handle was cancelled before its callback ran (or while it was running,
    by ``aclose()``), so there is no result to wait for."""
