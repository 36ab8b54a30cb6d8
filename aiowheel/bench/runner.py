"""Runs the chosen workloads against the chosen contenders, side by side.

A repeated workload (``workload.RepeatedWorkload``): for each size, repetition after
repetition, every contender runs once (ABAB...: machine drift and other engineers'
test runs hit everyone alike), each time in a fresh event loop after a full
``gc.collect()``. A figure is the median of the repetitions, printed with their min
and max. A searched workload (``workload.SearchedWorkload``, kafka) runs its own
search and hands back its figures.

With a trace directory, every workload except ``memory`` gets one more repetition
per contender, recorded with a trace recorder and *not* measured (recording costs
time, and only that repetition pays it). The trace of contender ``C`` on workload
``W`` is ``DIR/W-C.parquet`` (``W-N=n-C`` when the workload ran several sizes).

A ``-pure`` contender runs each of its repetitions (or kafka probes) in its child
process (``child.py``), in its turn: the order, the data and the sizes are the same as
for the contenders measured in this process.

Contenders left out because their event loop is not installed
(``Settings.unavailable``) appear in every variant of every workload that applies
to them as skipped results, with the reason.

A contender that fails (an exception, a child process that dies, a server that stops
answering, a timeout) is recorded as failed with the reason (``Result.failed``), said
on stderr, and runs nothing more of that variant; the run goes on. ``checkpoint``,
when given, is called with every result so far after each workload variant: the
command line saves them then, so that an interrupted run keeps what it finished.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, assert_never

import aiowheel

from .child import PureChildren
from .contenders import CONTENDERS, Contender
from .env import TraceFactory, parquet_recorder
from .export import machine
from .output import Output
from .registry import WORKLOADS
from .results import Result, fill_ratios
from .settings import Settings
from .workload import AnyWorkload, RepeatedWorkload, SearchedWorkload, Workload, failure_reason

__all__ = ["Runner"]


class Runner:
    def __init__(
        self,
        settings: Settings,
        output: Output,
        *,
        trace_factory: TraceFactory = parquet_recorder,
        checkpoint: Callable[[list[Result]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.checkpoint = checkpoint
        self.output = output
        self.trace_factory = trace_factory
        self.trace_files: list[Path] = []
        self.results: list[Result] = []
        #: The machine at the start of the run (the --json run line, bench-results.json).
        self.machine: dict[str, Any] = {}
        #: The ``-pure`` contenders' child processes (started on first use).
        self.children = PureChildren(settings)
        self._stamp = time.strftime("%Y%m%dT%H%M%S")
        #: How many of ``trace_files`` belong to finished workload variants.
        self._finished_traces = 0

    # -- tracing ------------------------------------------------------------------

    def _recorder(self, name: str, contender: Contender) -> tuple[aiowheel.TraceRecorder, Path]:
        directory = self.settings.trace_dir
        assert directory is not None
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

    def _trace(self, name: str, contender: Contender) -> tuple[aiowheel.TraceRecorder, Path] | None:
        return None if self.settings.trace_dir is None else self._recorder(name, contender)

    # -- running ------------------------------------------------------------------

    def run(self) -> list[Result]:
        s = self.settings
        workloads = [WORKLOADS[name] for name in s.workloads]
        self.machine = machine()
        planned = [(self._planned_steps(w), w.step_seconds(s)) for w in workloads]
        self.output.start(
            sum(steps for steps, _ in planned),
            self.machine,
            planned_seconds=sum(steps * seconds for steps, seconds in planned),
        )
        try:
            for workload in workloads:
                match workload:
                    case RepeatedWorkload():
                        self.output.step_seconds = workload.step_seconds(s)
                        sizes = workload.sizes(s)
                        for n in sizes:
                            self._repeat(workload, n, multi=len(sizes) > 1)
                    case SearchedWorkload():
                        self.output.step_seconds = workload.step_seconds(s)
                        self._search(workload)
                    case _:
                        assert_never(workload)
        except BaseException:
            # Interrupted (Ctrl-C) or broken: the traces of the variant it was in may
            # be half written; those of the finished ones stay, with their results.
            for path in self.trace_files[self._finished_traces :]:
                with contextlib.suppress(OSError):
                    path.unlink()
            del self.trace_files[self._finished_traces :]
            raise
        finally:
            self.children.close()
            self.output.finish(self.results)
        return self.results

    def _applicable(self, workload: Workload) -> list[Contender]:
        return [c for c in self.settings.contenders if workload.applies_to(c)]

    def _runnable(self, workload: RepeatedWorkload, n: int) -> list[Contender]:
        s = self.settings
        return [c for c in self._applicable(workload) if workload.skip_reason(c, n, s) is None]

    def _searched(self, workload: SearchedWorkload) -> list[Contender]:
        s = self.settings
        return [c for c in self._applicable(workload) if workload.skip_reason(c, None, s) is None]

    def _planned_steps(self, workload: AnyWorkload) -> int:
        s = self.settings
        if isinstance(workload, SearchedWorkload):
            return workload.planned_steps(s, self._searched(workload))
        steps = 0
        for n in workload.sizes(s):
            per_rep = len(self._runnable(workload, n))
            steps += per_rep * s.reps + (per_rep if s.trace_dir and workload.traced else 0)
        return steps

    def _skipped(self, workload: Workload, n: int | None) -> list[tuple[Contender, str]]:
        """Contenders the workload applies to that sit out this variant, and why."""
        s = self.settings
        reasons = {c: reason for c, reason in s.unavailable if workload.applies_to(c)}
        for c in self._applicable(workload):
            if (reason := workload.skip_reason(c, n, s)) is not None:
                reasons[c] = reason
        return [(c, reasons[c]) for c in CONTENDERS if c in reasons]

    def _repeat(self, workload: RepeatedWorkload, n: int, *, multi: bool) -> None:
        s = self.settings
        variant = f"N={n:,}"
        runnable = self._runnable(workload, n)
        samples: dict[tuple[str, str], list[float]] = {}
        states: dict[str, dict[str, float]] = {c.name: {} for c in runnable}
        failed: dict[str, str] = {}
        for rep in range(s.reps):
            data = workload.prepare(n, rep, s)
            for contender in runnable:
                step = f"{workload.name} {variant} rep {rep + 1}/{s.reps}: {contender.name}"
                if contender.name in failed:
                    self.output.step(f"{step}: not run, it failed")
                    self.output.advance()
                    continue
                self.output.step(step)
                try:
                    values = self._one(workload, contender, n, rep, data, states[contender.name])
                except Exception as exc:  # a contender that fails: said, the run goes on
                    failed[contender.name] = (
                        f"rep {rep + 1}/{s.reps}: {failure_reason(exc, contender)}"
                    )
                    self.output.advance()
                    continue
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
                self.output.step(f"{workload.name} {variant} traced: {contender.name}")
                if contender.name not in failed:
                    name = f"{workload.name}-{variant}" if multi else workload.name
                    recorder, path = self._recorder(name, contender)
                    assert not contender.pure, "settings_from refuses to trace them"
                    try:
                        workload.repetition(contender, n, data, s, states[contender.name], recorder)
                    except Exception as exc:
                        # Its measured figures stand; its trace, half written, goes.
                        self.output.warn(
                            f"{workload.name} ({variant}): {contender.name}'s traced run "
                            f"failed: {failure_reason(exc, contender)}; its trace is left out"
                        )
                        self.trace_files.remove(path)
                        with contextlib.suppress(OSError):
                            path.unlink()
                self.output.advance()
            del data
        params = {**workload.params(s), "reps": s.reps}
        skipped = self._skipped(workload, n)
        variant_results: list[Result] = []
        for metric in workload.metrics:
            for contender in runnable:
                measured = samples.get((contender.name, metric.key))
                if contender.name in failed:
                    if metric.kinds is None or contender.kind in metric.kinds:
                        variant_results.append(
                            workload.result(
                                metric,
                                contender,
                                [],
                                variant=variant,
                                n=n,
                                params=params,
                                failed=failed[contender.name],
                            )
                        )
                elif measured is not None:
                    variant_results.append(
                        workload.result(
                            metric, contender, measured, variant=variant, n=n, params=params
                        )
                    )
            variant_results.extend(
                workload.result(
                    metric, contender, [], variant=variant, n=n, params=params, skipped=reason
                )
                for contender, reason in skipped
                if metric.kinds is None or contender.kind in metric.kinds
            )
        for warning in workload.withhold_ratios(variant_results, s):
            self.output.warn(warning)
        self._done(variant_results)

    def _done(self, results: list[Result]) -> None:
        """One workload variant measured (or failed): its ratios, the failures said,
        its figures printed and saved."""
        fill_ratios(results)
        failures: dict[tuple[str, str], list[str]] = {}
        for r in results:
            if r.failed is not None:
                variants = failures.setdefault((r.contender.name, r.failed), [])
                if r.variant not in variants:
                    variants.append(r.variant)
        for (name, reason), variants in failures.items():
            self.output.warn(
                f"{results[0].workload} ({', '.join(variants)}): {name} failed: {reason}; "
                "the run goes on without it"
            )
        self.results.extend(results)
        self._finished_traces = len(self.trace_files)
        self.output.results(results)
        if self.checkpoint is not None:
            self.checkpoint(self.results)

    def _one(
        self,
        workload: RepeatedWorkload,
        contender: Contender,
        n: int,
        rep: int,
        data: Any,
        state: dict[str, float],
    ) -> dict[str, float]:
        """One measured repetition: here, or in a ``-pure`` contender's child."""
        if not contender.pure:
            return workload.repetition(contender, n, data, self.settings, state)
        request = {"op": "repeat", "workload": workload.name, "n": n, "rep": rep}
        answer = self.children(contender, {**request, "state": state})
        state.update(answer["state"])
        values: dict[str, float] = answer["values"]
        return values

    def _search(self, workload: SearchedWorkload) -> None:
        s = self.settings
        contenders = self._searched(workload)
        planned = workload.planned_steps(s, contenders)
        steps = 0

        def progress(message: str) -> None:
            # The bar never counts past the workload's plan (a search that takes more
            # probes than a typical one): its total stays the run's.
            nonlocal steps
            self.output.step(message)
            if steps < planned:
                steps += 1
                self.output.advance()

        for contender, reason in self._skipped(workload, None):
            if contender in self.settings.contenders:
                self.output.warn(f"{workload.name}: skipping {contender.name}: {reason}")
        params = workload.params(s)
        try:
            results = workload.measure(s, contenders, progress, self._trace, self.children)
        except Exception as exc:  # the whole search failed: every contender's, said
            reason = failure_reason(exc)
            results = [
                workload.result(metric, c, [], variant=v, n=None, params=params, failed=reason)
                for v in workload.variants(s)[:1]
                for metric in workload.variant_metrics(v)[:1]
                for c in contenders
            ]
        for variant in workload.variants(s):
            results.extend(
                workload.result(
                    metric, contender, [], variant=variant, n=None, params=params, skipped=reason
                )
                for contender, reason in self._skipped(workload, None)
                for metric in workload.variant_metrics(variant)
            )
        if steps < planned:
            self.output.advance(planned - steps)
        self._done(results)
