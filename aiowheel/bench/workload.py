"""What a workload is: the two interfaces the runner drives.

* ``RepeatedWorkload`` (``workloads.py``: churn, rearm, fire, spread, memory, idle):
  for each size N, repetition after repetition, every contender runs ``run()`` once
  in a fresh event loop (A B C A B C ...) on data ``prepare()`` drew for that
  repetition; a figure is the median over the repetitions.
* ``SearchedWorkload`` (``kafka.py``): a search per contender for one figure (the
  highest rate it sustains); it drives its own probes and returns its results.

Both declare their metrics and the kinds of contender they apply to. ``registry.py``
lists the workloads; this module imports none of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeAlias

import aiowheel

from .child import ChildError
from .contenders import Contender
from .env import Env, open_env, run_fresh
from .results import Result
from .settings import Settings

__all__ = [
    "AnyWorkload",
    "Metric",
    "Progress",
    "Remote",
    "RepeatedWorkload",
    "SearchedWorkload",
    "Trace",
    "Workload",
    "failure_reason",
]


def failure_reason(exc: BaseException, contender: Contender | None = None, limit: int = 300) -> str:
    """Why ``contender`` failed, in one line of at most ``limit`` characters: the
    message of the bench's own errors (a server, a child process: without the
    contender's name, said beside it), else the exception's type and message."""
    text = str(exc) if isinstance(exc, ChildError) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split()) or type(exc).__name__
    if contender is not None:
        text = text.removeprefix(f"{contender.name}: ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: How much longer a step takes at the default sizes and windows than at the quick
#: ones (5 s operation windows instead of 0.5 s, larger N).
FULL_STEP_FACTOR = 8.0


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    better: str  # "lower" | "higher"
    #: False for figures where a ratio means nothing (counts that describe the input).
    ratio: bool = True
    #: The contender kinds that have this figure (None: every kind the workload runs),
    #: for a pattern only some contenders have (idle's ``handle.reset`` row).
    kinds: frozenset[str] | None = None


#: Announces the next step of a searched workload (drives the progress bar).
Progress: TypeAlias = Callable[[str], None]
#: ``trace(name, contender)``: a recorder for one traced run and its file, or None
#: when the run is not traced.
Trace: TypeAlias = Callable[[str, Contender], tuple[aiowheel.TraceRecorder, Path] | None]


class Remote(Protocol):
    """Runs one unit of a ``-pure`` contender's work in its child process and returns
    the child's answer (``child.PureChildren``; the requests are in ``child.py``)."""

    def __call__(self, contender: Contender, request: dict[str, Any]) -> dict[str, Any]: ...


class Workload(ABC):
    """What every workload declares."""

    name: ClassVar[str]
    title: ClassVar[str]
    metrics: ClassVar[tuple[Metric, ...]]
    kinds: ClassVar[frozenset[str]] = frozenset({"aiowheel", "call_later", "trio"})
    #: The event loops it runs on (rloop is a peer of the drop-in loop only).
    backends: ClassVar[frozenset[str]] = frozenset({"asyncio", "uvloop", "trio"})
    #: Trace its timers with --trace (an extra, unmeasured run per contender).
    traced: ClassVar[bool] = True
    #: Runs when no ``--workload`` is given (the drop-in loop's workloads are opt-in:
    #: ``-w loop``).
    default: ClassVar[bool] = True
    #: About how many seconds one progress step (a repetition of one contender, a
    #: probe) takes in a quick run, the main job's, on a 2-core machine (measured with
    #: other work on it: a quiet one is faster): the progress bar's plan and its time
    #: remaining.
    quick_step_seconds: ClassVar[float] = 1.0

    def step_seconds(self, settings: Settings) -> float:
        """About how many seconds one progress step takes with ``settings``."""
        return self.quick_step_seconds * (1.0 if settings.quick else FULL_STEP_FACTOR)

    def applies_to(self, contender: Contender) -> bool:
        return contender.kind in self.kinds and contender.backend in self.backends

    def skip_reason(self, contender: Contender, n: int | None, settings: Settings) -> str | None:
        """Why ``contender``, which the workload applies to, sits out this run's
        variant (size ``n`` of a repeated workload; ``None`` for a searched one), or
        ``None`` when it runs. The runner asks this one question of every workload."""
        return None

    def params(self, settings: Settings) -> dict[str, Any]:
        """What else a reader needs to reproduce a figure (goes into the JSON)."""
        return {}

    def result(
        self,
        metric: Metric,
        contender: Contender,
        samples: list[float],
        *,
        variant: str,
        n: int | None,
        params: dict[str, Any],
        skipped: str | None = None,
        failed: str | None = None,
    ) -> Result:
        """One figure of ``contender`` (``skipped``: why it has none; ``failed``: it
        was to run and failed, and why: ``skipped`` then says so too)."""
        if failed is not None:
            skipped = f"failed: {failed}"
        return Result(
            workload=self.name,
            variant=variant,
            n=n,
            metric=metric.key,
            label=metric.label,
            unit=metric.unit,
            better=metric.better,
            contender=contender,
            samples=samples,
            has_ratio=metric.ratio,
            params=params,
            skipped=skipped,
            failed=failed,
        )


class RepeatedWorkload(Workload):
    """Measured by repetitions at each size N (see the module docstring)."""

    #: Count event-loop iterations (wraps the selector / adds a trio instrument).
    count_iterations: ClassVar[bool] = False

    def sizes(self, settings: Settings) -> list[int]:
        if settings.n:
            return list(settings.n)
        return self.default_sizes(settings.quick)

    @abstractmethod
    def default_sizes(self, quick: bool) -> list[int]: ...

    def skip_reason(self, contender: Contender, n: int | None, settings: Settings) -> str | None:
        """Why ``contender``, which the workload applies to, sits out size ``n``."""
        if contender.kind == "trio" and n is not None and n > settings.trio_max_tasks:
            return f"a task per timer: N > {settings.trio_max_tasks:,} tasks (~3 KB each)"
        return None

    def prepare(self, n: int, rep: int, settings: Settings) -> Any:
        """Data shared by every contender of one repetition."""
        return None

    @abstractmethod
    async def run(
        self, env: Env, n: int, data: Any, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        """One repetition; returns metric key -> value (keys starting with ``_`` are
        diagnostics). ``state`` persists across one contender's repetitions."""

    def repetition(
        self,
        contender: Contender,
        n: int,
        data: Any,
        settings: Settings,
        state: dict[str, float],
        recorder: aiowheel.TraceRecorder | None = None,
    ) -> dict[str, float]:
        """``run()`` once for ``contender``, in a fresh event loop of its backend."""

        async def body() -> dict[str, float]:
            async with open_env(contender, recorder, count_iterations=self.count_iterations) as env:
                return await self.run(env, n, data, settings, state)

        values: dict[str, float] = run_fresh(
            contender.backend, body, drop_in=contender.kind == "loop"
        )
        return values

    def withhold_ratios(self, results: list[Result], settings: Settings) -> list[str]:
        """Mark (``Result.withheld``) the figures of one measured variant whose ratio
        means nothing in this run; returns one warning per mark."""
        return []


class SearchedWorkload(Workload):
    """Searched per contender (see the module docstring)."""

    @abstractmethod
    def variants(self, settings: Settings) -> list[str]:
        """The variants ``measure`` returns results for (kafka: its cases)."""

    def variant_metrics(self, variant: str) -> tuple[Metric, ...]:
        """The metrics a variant has (kafka's target rates have figures of their own)."""
        return self.metrics

    @abstractmethod
    def planned_steps(self, settings: Settings, contenders: list[Contender]) -> int:
        """About how many ``progress`` calls ``measure`` makes (for the progress bar)."""

    @abstractmethod
    def measure(
        self,
        settings: Settings,
        contenders: list[Contender],
        progress: Progress,
        trace: Trace,
        remote: Remote,
    ) -> list[Result]:
        """Every figure of every contender (each of which the workload applies to);
        a ``-pure`` contender's measurements are made by ``remote``."""


AnyWorkload: TypeAlias = RepeatedWorkload | SearchedWorkload
