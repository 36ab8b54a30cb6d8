"""``aiowheel bench``: aiowheel against the timers you would use instead, side by side.

Run ``aiowheel bench`` (or ``python -m aiowheel.bench``) for every workload, or
``--workload churn`` for one; ``--quick`` takes one to two minutes; ``--json`` prints one
JSON object per figure. docs/benchmarks.md has the figures
measured on the project's machine; docs/bench-workloads.md says what each workload
does.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
