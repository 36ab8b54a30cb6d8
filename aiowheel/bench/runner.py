"""Runs the chosen workloads against the chosen contenders, side by side.

For each workload and size, repetition after repetition, every contender runs once
(ABAB...: machine drift and other engineers' test runs hit everyone alike), each
time in a fresh event loop after a full ``gc.collect()``. A figure is the median of
the repetitions, printed with their min and max.

With a trace directory, every workload except ``memory`` gets one more repetition
per contender, recorded with a trace recorder and *not* measured (recording costs
time, and only that repetition pays it). The trace of contender ``C`` on workload
``W`` is ``DIR/W-C.parquet`` (``W-N=n-C`` when the workload ran several sizes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiowheel

from .contenders import Contender, TraceFactory, open_env, parquet_recorder, run_fresh
from .output import Output
from .results import Result, fill_ratios
from .settings import Settings
from .workloads import WORKLOADS, Metric, Workload

__all__ = ["Runner"]


class Runner:
    def __init__(
        self,
        settings: Settings,
        output: Output,
        *,
        trace_factory: TraceFactory = parquet_recorder,
    ) -> None:
        self.settings = settings
        self.output = output
        self.trace_factory = trace_factory
        self.trace_files: list[Path] = []
        self.results: list[Result] = []
        self._stamp = time.strftime("%Y%m%dT%H%M%S")

    # -- tracing ------------------------------------------------------------------

    def _recorder(self, name: str, contender: Contender) -> tuple[Any, Path] | None:
        directory = self.settings.trace_dir
        if directory is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        safe = name.replace(",", "").replace("=", "")
        path = directory / f"{safe}-{contender.name}.parquet"
        recorder = self.trace_factory(
            str(path),
            run_id=f"bench-{self._stamp}-{os.getpid()}-{safe}-{contender.name}",
            implementation=contender.kind,
        )
        self.trace_files.append(path)
        return recorder, path

    # -- running ------------------------------------------------------------------

    def _planned_steps(self, workloads: list[Workload]) -> int:
        s = self.settings
        steps = 0
        for w in workloads:
            if w.name == "kafka":
                steps += 8 * len(s.kafka_cases) * len(self._eligible(w, 0))
                continue
            for n in w.sizes(s):
                per_rep = len(self._eligible(w, n))
                steps += per_rep * s.reps + (per_rep if s.trace_dir and w.traced else 0)
        return steps

    def _eligible(self, workload: Workload, n: int) -> list[Contender]:
        return [
            c for c in self.settings.contenders if workload.skip_reason(c, n, self.settings) is None
        ]

    def run(self) -> list[Result]:
        s = self.settings
        workloads = [WORKLOADS[name] for name in s.workloads]
        self.output.start(s, self._planned_steps(workloads))
        try:
            for workload in workloads:
                if workload.name == "kafka":
                    self._run_kafka(workload)
                else:
                    for n in workload.sizes(s):
                        self._run_variant(workload, n, multi=len(workload.sizes(s)) > 1)
        finally:
            self.output.finish(self.results)
        return self.results

    def _run_variant(self, workload: Workload, n: int, *, multi: bool) -> None:
        s = self.settings
        variant = f"N={n:,}"
        runnable = self._eligible(workload, n)
        skipped = [
            (c, reason)
            for c in s.contenders
            if (reason := workload.skip_reason(c, n, s)) is not None and reason != "not applicable"
        ]
        samples: dict[tuple[str, str], list[float]] = {}
        states: dict[str, dict[str, float]] = {c.name: {} for c in runnable}
        for rep in range(s.reps):
            data = workload.prepare(n, rep, s)
            for contender in runnable:
                self.output.step(
                    f"{workload.name} {variant} rep {rep + 1}/{s.reps}: {contender.name}"
                )
                values = self._one(workload, contender, n, data, states[contender.name], None)
                for key, value in values.items():
                    if key.startswith("_"):
                        if key == "_overrun_ms" and value > 0:
                            self.output.warn(
                                f"{workload.name} {variant} {contender.name}: insertion ran "
                                f"{value:.1f} ms past the first deadline (lateness includes it)"
                            )
                        continue
                    samples.setdefault((contender.name, key), []).append(value)
                self.output.advance()
            del data
        if s.trace_dir is not None and workload.traced:
            data = workload.prepare(n, 0, s)
            for contender in runnable:
                name = f"{workload.name}-{variant}" if multi else workload.name
                traced = self._recorder(name, contender)
                assert traced is not None
                self.output.step(f"{workload.name} {variant} traced: {contender.name}")
                self._one(workload, contender, n, data, states[contender.name], traced[0])
                self.output.advance()
            del data
        params = {**workload.params(s), "reps": s.reps}
        variant_results: list[Result] = []
        for metric in workload.metrics:

            def result(
                contender: Contender,
                samples: list[float],
                skipped: str | None = None,
                metric: Metric = metric,
            ) -> Result:
                return Result(
                    workload=workload.name,
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
                )

            for contender in runnable:
                measured = samples.get((contender.name, metric.key))
                if measured is not None:
                    variant_results.append(result(contender, measured))
            for contender, reason in skipped:
                variant_results.append(result(contender, [], reason))
        fill_ratios(variant_results)
        self.results.extend(variant_results)
        self.output.results(variant_results)

    def _one(
        self,
        workload: Workload,
        contender: Contender,
        n: int,
        data: Any,
        state: dict[str, float],
        recorder: aiowheel.TraceRecorder | None,
    ) -> dict[str, float]:
        settings = self.settings

        async def body() -> dict[str, float]:
            async with open_env(
                contender, recorder, count_iterations=workload.count_iterations
            ) as env:
                return await workload.run(env, n, data, settings, state)

        values: dict[str, float] = run_fresh(contender.backend, body)
        return values

    def _run_kafka(self, workload: Workload) -> None:
        from .kafka import Kafka

        assert isinstance(workload, Kafka)
        contenders = self._eligible(workload, 0)
        steps = [0]

        def progress(message: str) -> None:
            self.output.step(message)
            steps[0] += 1
            self.output.advance()

        trace: Callable[[str, Contender], tuple[Any, Path] | None] = self._recorder
        results = workload.measure(self.settings, contenders, progress, trace)
        fill_ratios(results)
        self.results.extend(results)
        planned = 8 * len(self.settings.kafka_cases) * len(contenders)
        if steps[0] < planned:
            self.output.advance(planned - steps[0])
        self.output.results(results)
