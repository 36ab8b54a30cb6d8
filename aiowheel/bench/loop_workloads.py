"""The drop-in loop's workloads (issue 18): asyncio's own timer APIs, nothing else.

Each runs one program that uses only what every asyncio application uses
(``loop.call_at``/``call_later`` and ``TimerHandle.cancel``, ``asyncio.timeout`` and
its ``reschedule``, ``asyncio.sleep``) on each event loop: aiowheel's drop-in loop on
each base (``loop-asyncio``, ``loop-uvloop``: ``aiowheel.new_event_loop(base=...)``)
and the plain loops with the timers on their own heaps (``call_later-asyncio``,
``call_later-uvloop``, ``call_later-rloop``). The ratio that matters is the drop-in
loop's against the plain loop of the same base, from the same run (and against rloop,
the fastest plain loop at moving a deadline).

``loop-reschedule``  N timers pending (60 to 90 s out), then 6 N reschedules of
                     random ones: ``handle.cancel()`` + ``loop.call_at(...)`` (what
                     ``asyncio.timeout(...).reschedule()`` does): ns per reschedule,
                     over a window long enough to hold the lumps of deferred work
                     (heap compaction, full collections) a server pays (_WINDOW).
``loop-steps``       N timers pending (60 to 90 s out, none fires), then 100 tasks
                     each taking steps that do no timer work (``await
                     asyncio.sleep(0)``): ns per task step; then the same steps each
                     keeping one small object alive to the end of the run (as a
                     server's steps keep request state), which makes the garbage
                     collector run its full collections, and those traverse every
                     pending timer: ns per step, and of it ns in the collector.
``loop-timeout``     N tasks, each inside ``asyncio.timeout(30)``, each "read" (a task
                     step, ``await asyncio.sleep(0)``) followed by
                     ``cm.reschedule(loop.time() + 30)``: ns per read.
``loop-few``         few timers: ``async with asyncio.timeout(10): pass`` with nothing
                     else pending (ns per enter + exit), then N tasks (200) sleeping
                     1 ms over and over for ``--loop-seconds``: CPU per sleep, and the
                     wall time a 1 ms sleep took; and what a new loop costs (made and
                     closed, never run: a test suite makes one per test).
``loop-memory``      bytes per pending ``call_later`` timer at N (tracemalloc growth,
                     as ``memory``).
``loop-collector``   the garbage collector's pauses with N ``call_later`` timers
                     pending, as ``collector``.

``loop-reschedule`` and ``loop-steps`` also report the time spent in the garbage
collector (``gc.callbacks``, from a collection's start to its stop) per operation: on
the drop-in loop, that is where most of the difference goes (docs/loop.md,
"Figures").

None of them runs by default (``Workload.default``): ``aiowheel bench -w loop`` runs
them all, ``-w loop-steps`` one. They trace nothing (their timers are asyncio's
own, not the ``Env``'s).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import aiowheel

from .contenders import Contender
from .env import Env, GcClock
from .settings import Settings
from .workload import Metric, RepeatedWorkload
from .workloads import Collector, Memory

__all__ = [
    "LOOP_GROUP",
    "LoopCollector",
    "LoopFew",
    "LoopMemory",
    "LoopReschedule",
    "LoopSteps",
    "LoopTimeout",
]

#: ``-w loop`` selects every workload of this module.
LOOP_GROUP = "loop"

_BATCH = 1_000
#: loop-reschedule measures this many reschedules per pending timer. The costs a
#: reschedule leaves behind are paid in lumps: a plain loop compacts its heap once
#: its cancelled handles outnumber the live ones (about every N reschedules), and the
#: collector's full collection, which walks every pending timer, comes each time the
#: surviving objects grew by a quarter. A window shorter than those periods holds
#: none of them, or one, depending on where it starts: 30,000 reschedules at N =
#: 50,000 gave the drop-in loop 2.0x to 6.1x plain asyncio in one sitting (issue 31).
#: Six per timer hold several of each: the steady state a long-running server
#: sees (4.2x to 6.7x in the same sitting).
_WINDOW = 6
#: Where the pending timers are: far enough that none fires while measuring (the
#: slowest repetition here is a few seconds), near enough to be a server's timeouts.
_PENDING_FROM = 60.0
_PENDING_SPAN = 30.0
_KINDS = frozenset({"loop", "call_later"})
_BACKENDS = frozenset({"asyncio", "uvloop", "rloop"})


def _noop() -> None:
    pass


def _rng(settings: Settings, name: str, n: int, rep: int) -> random.Random:
    return random.Random(f"{settings.seed}:{name}:{n}:{rep}")


def _pending(data_rng: random.Random, n: int) -> list[float]:
    uniform = data_rng.uniform
    return [uniform(_PENDING_FROM, _PENDING_FROM + _PENDING_SPAN) for _ in range(n)]


async def _fill(delays: Sequence[float]) -> list[asyncio.TimerHandle]:
    """The N pending timers, on the running loop, then one loop iteration."""
    call_later = asyncio.get_running_loop().call_later
    noop = _noop
    handles = [call_later(delay, noop) for delay in delays]
    await asyncio.sleep(0)
    return handles


def _cancel_all(handles: list[asyncio.TimerHandle]) -> None:
    for handle in handles:
        handle.cancel()


class _LoopWorkload(RepeatedWorkload):
    kinds: ClassVar[frozenset[str]] = _KINDS
    backends: ClassVar[frozenset[str]] = _BACKENDS
    traced = False
    default = False


# -- loop-reschedule ------------------------------------------------------------------


@dataclass
class _RescheduleData:
    fill: list[float]
    #: batches of (which timer, its new delay)
    moves: list[Sequence[tuple[int, float]]]
    ops: int


class LoopReschedule(_LoopWorkload):
    name = "loop-reschedule"
    quick_step_seconds = 1.2
    title = "reschedule one pending timer (cancel + call_at), N pending"
    metrics = (
        Metric("reschedule_ns", "reschedule (cancel + call_at)", "ns", "lower"),
        Metric("gc_ns", "of which in the garbage collector", "ns", "lower", ratio=False),
    )

    def default_sizes(self, quick: bool) -> list[int]:
        # Quick (and so `bench --report`, issue 32: the main job's 5 minutes): a
        # fifth, so that the window (_WINDOW) stays as long relative to N.
        return [20_000] if quick else [100_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> _RescheduleData:
        rng = _rng(settings, self.name, n, rep)
        ops = settings.ops if settings.ops is not None else _WINDOW * n
        fill = _pending(rng, n)
        randrange, uniform = rng.randrange, rng.uniform
        end = _PENDING_FROM + _PENDING_SPAN
        moves = [(randrange(n), uniform(_PENDING_FROM, end)) for _ in range(ops)]
        return _RescheduleData(fill, [moves[i : i + _BATCH] for i in range(0, ops, _BATCH)], ops)

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "pending": f"N timers {_PENDING_FROM:g} to {_PENDING_FROM + _PENDING_SPAN:g} s out",
            "op": "handles[i].cancel(); handles[i] = loop.call_at(loop.time() + d, cb)",
            "batch": f"{_BATCH:,} reschedules, then await asyncio.sleep(0)",
        }

    async def run(
        self, env: Env, n: int, data: _RescheduleData, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        handles = await _fill(data.fill)
        call_at, now, noop = loop.call_at, loop.time, _noop
        sleep = asyncio.sleep
        perf = time.perf_counter
        gc.collect()
        with GcClock() as collector:
            t0 = perf()
            for batch in data.moves:
                for i, delay in batch:
                    handles[i].cancel()
                    handles[i] = call_at(now() + delay, noop)
                await sleep(0)
            elapsed = perf() - t0
        _cancel_all(handles)
        return {
            "reschedule_ns": elapsed / data.ops * 1e9,
            "gc_ns": collector.seconds / data.ops * 1e9,
            "_collections": float(collector.collections),
        }


# -- loop-steps -----------------------------------------------------------------------

#: loop-steps' and loop-timeout's tasks take this many steps in all, per repetition.
_STEPS_QUICK = 100_000
_STEPS_FULL = 1_000_000
_STEP_TASKS = 100


def _steps(settings: Settings, full: int = _STEPS_FULL) -> int:
    if settings.ops is not None:
        return settings.ops
    return _STEPS_QUICK if settings.quick else full


class LoopSteps(_LoopWorkload):
    name = "loop-steps"
    quick_step_seconds = 0.9
    title = "task steps that do no timer work, N timers pending"
    metrics = (
        Metric("step_ns", "task step (await asyncio.sleep(0))", "ns", "lower"),
        Metric("keep_ns", "task step keeping one small object alive", "ns", "lower"),
        Metric("keep_gc_ns", "of which in the garbage collector", "ns", "lower", ratio=False),
    )

    def default_sizes(self, quick: bool) -> list[int]:
        return [50_000] if quick else [100_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> list[float]:
        return _pending(_rng(settings, self.name, n, rep), n)

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "pending": f"N timers {_PENDING_FROM:g} to {_PENDING_FROM + _PENDING_SPAN:g} s "
            "out (none fires while measuring)",
            "tasks": _STEP_TASKS,
            "steps": f"M in all (--ops; {_STEPS_FULL:,}, {_STEPS_QUICK:,} quick)",
            "keeping": "each step appends a new empty list to one list, emptied after",
            "gc": "gc.callbacks: the time from each collection's start to its stop",
        }

    async def run(
        self, env: Env, n: int, data: list[float], settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        handles = await _fill(data)
        per_task = max(_steps(settings) // _STEP_TASKS, 1)
        steps = per_task * _STEP_TASKS
        sleep = asyncio.sleep
        kept: list[list[int]] = []
        keep = kept.append

        async def stepper() -> None:
            for _ in range(per_task):
                await sleep(0)

        async def keeper() -> None:
            for _ in range(per_task):
                keep([])
                await sleep(0)

        gc.collect()
        t0 = time.perf_counter()
        await asyncio.gather(*[stepper() for _ in range(_STEP_TASKS)])
        plain = time.perf_counter() - t0
        gc.collect()
        with GcClock() as collector:
            t0 = time.perf_counter()
            await asyncio.gather(*[keeper() for _ in range(_STEP_TASKS)])
            keeping = time.perf_counter() - t0
        del kept[:]
        _cancel_all(handles)
        return {
            "step_ns": plain / steps * 1e9,
            "keep_ns": keeping / steps * 1e9,
            "keep_gc_ns": collector.seconds / steps * 1e9,
            "_collections": float(collector.collections),
        }


# -- loop-timeout ---------------------------------------------------------------------

_TIMEOUT = 30.0
#: loop-timeout's reads in all (50 per task at N = 10,000): a read costs several times
#: a bare step, and more reads per task changed nothing but the run's length.
_READS_FULL = 500_000


class LoopTimeout(_LoopWorkload):
    name = "loop-timeout"
    quick_step_seconds = 1.4
    title = "N tasks each inside asyncio.timeout, rescheduled on every read"
    metrics = (Metric("read_ns", "read (a task step) + cm.reschedule(now + 30 s)", "ns", "lower"),)

    def default_sizes(self, quick: bool) -> list[int]:
        return [5_000] if quick else [10_000]

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "task": "async with asyncio.timeout(30) as cm: for each read: "
            "await asyncio.sleep(0); cm.reschedule(loop.time() + 30)",
            "reads": f"M in all, shared by the N tasks (--ops; {_READS_FULL:,}, "
            f"{_STEPS_QUICK:,} quick)",
            "timed": "from releasing the tasks (each already inside its block) to the "
            "last one leaving it",
        }

    async def run(
        self, env: Env, n: int, data: Any, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        reads = max(_steps(settings, _READS_FULL) // n, 1)
        start = asyncio.Event()
        ready = 0
        all_ready = asyncio.Event()
        now = loop.time
        sleep = asyncio.sleep
        timeout = asyncio.timeout

        async def connection() -> None:
            nonlocal ready
            async with timeout(_TIMEOUT) as cm:
                reschedule = cm.reschedule
                ready += 1
                if ready == n:
                    all_ready.set()
                await start.wait()
                for _ in range(reads):
                    await sleep(0)
                    reschedule(now() + _TIMEOUT)

        tasks = [asyncio.create_task(connection()) for _ in range(n)]
        await all_ready.wait()
        gc.collect()
        t0 = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        return {"read_ns": elapsed / (reads * n) * 1e9}


# -- loop-few -------------------------------------------------------------------------

_SLEEP = 0.001
_CREATIONS = 50


def _loop_factory(contender: Contender) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new event loop of ``contender``'s kind (as ``env.run_fresh`` makes them)."""
    if contender.kind == "loop":
        return lambda: aiowheel.new_event_loop(base=contender.backend)
    if contender.backend == "asyncio":
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = importlib.import_module(
        contender.backend
    ).new_event_loop
    return factory


class LoopFew(_LoopWorkload):
    name = "loop-few"
    quick_step_seconds = 1.0
    title = "few timers: asyncio.timeout with nothing pending; N tasks sleeping 1 ms"
    metrics = (
        Metric(
            "enter_exit_ns", "enter + exit of asyncio.timeout(10), nothing pending", "ns", "lower"
        ),
        Metric("sleep_cpu_us", "CPU per asyncio.sleep(0.001), N tasks sleeping", "us", "lower"),
        Metric("sleep_ms", "wall time a 1 ms sleep took", "ms", "lower", ratio=False),
        Metric("create_us", "new event loop + close", "us", "lower"),
    )

    def default_sizes(self, quick: bool) -> list[int]:
        return [200]

    def params(self, settings: Settings) -> dict[str, Any]:
        ops = settings.ops if settings.ops is not None else 100_000
        return {
            "enter_exit": f"{ops:,} x `async with asyncio.timeout(10): pass`, "
            f"await asyncio.sleep(0) every {_BATCH:,}",
            "sleepers": "N tasks: while running: await asyncio.sleep(0.001)",
            "seconds": settings.loop_seconds,
            "cpu": "time.process_time() over the sleepers' run / sleeps done",
            "create": f"{_CREATIONS} x new_event_loop() + close(), never run",
        }

    async def run(
        self, env: Env, n: int, data: Any, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        sleep = asyncio.sleep
        perf = time.perf_counter
        timeout = asyncio.timeout
        ops = settings.ops if settings.ops is not None else 30_000 if settings.quick else 100_000
        batches = range(max(ops // _BATCH, 1))
        inner = range(_BATCH)
        gc.collect()
        t0 = perf()
        for _ in batches:
            for _ in inner:
                async with timeout(10.0):
                    pass
            await sleep(0)
        enter_exit = (perf() - t0) / (len(batches) * _BATCH)

        running = True
        sleeps = 0

        async def sleeper() -> None:
            nonlocal sleeps
            while running:
                await sleep(_SLEEP)
                sleeps += 1

        tasks = [asyncio.create_task(sleeper()) for _ in range(n)]
        await sleep(0)  # every sleeper has started its first sleep
        gc.collect()
        cpu0, wall0 = time.process_time(), perf()
        await sleep(settings.loop_seconds)
        running = False
        await asyncio.gather(*tasks)
        cpu, wall = time.process_time() - cpu0, perf() - wall0
        done = max(sleeps, 1)
        # What a new loop of this kind costs (a test suite makes one per test): made
        # and closed, never run, _CREATIONS times.
        factory = _loop_factory(env.contender)
        t0 = perf()
        for _ in range(_CREATIONS):
            factory().close()
        created = (perf() - t0) / _CREATIONS
        return {
            "enter_exit_ns": enter_exit * 1e9,
            "sleep_cpu_us": cpu / done * 1e6,
            "sleep_ms": wall * n / done * 1e3,
            "create_us": created * 1e6,
        }


# -- loop-memory ----------------------------------------------------------------------


class LoopMemory(_LoopWorkload, Memory):
    name = "loop-memory"
    quick_step_seconds = 0.65
    title = "bytes per pending call_later timer"
    metrics = (Metric("bytes", "per pending call_later timer", "B", "lower"),)

    def default_sizes(self, quick: bool) -> list[int]:
        # Bytes per timer do not depend on N: quick measures fewer.
        return [20_000] if quick else [100_000]

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "method": "tracemalloc growth / N over N pending loop.call_later timers",
            "deadlines": "600 to 630 s ahead (none fires)",
            "rloop": "a lower bound: tracemalloc sees Python objects, not rloop's own "
            "Rust allocations (its timer heap)",
        }


# -- loop-collector -------------------------------------------------------------------


class LoopCollector(_LoopWorkload, Collector):
    name = "loop-collector"
    quick_step_seconds = 0.6
    title = "the garbage collector with N call_later timers pending"

    def default_sizes(self, quick: bool) -> list[int]:
        return [100_000] if quick else [1_000_000]
