"""The repeated workloads: what each repetition does, and what it measures.

Every workload is written once per *kind* of timer with the contender's own API
bound to local names (see ``env.Env``), so that a timed loop calls nothing but
the operation being measured. Random data (delays, which timer a read touches) is
drawn before the clock starts, from a seed shared by every contender in the same
repetition: all contenders see the same workload.

``churn``   N timers pending at random deadlines over 30 s, then M schedule + cancel
            pairs, or as many whole batches of them as fit in ``Settings.op_seconds``
            (ns per pair); also the cost of filling to N (ns per schedule).
``rearm``   N pending timers, then M re-arms of random ones to 30 s out (ns per re-arm):
            aiowheel ``reset``, trio ``scope.deadline =``, asyncio/uvloop cancel + re-add.
``fire``    a burst of N timers due within 20 ms, inserted in random order:
            callbacks/s and lateness p50/p99/max (the callback's start on the loop
            clock minus its deadline).
``spread``  N timers due uniformly over 5 s: driver wake-ups (loop iterations for the
            peers), CPU seconds per million fired, lateness p99.
``memory``  bytes per pending timer at N (tracemalloc growth over N pending timers).
``collector`` N pending timers and the cyclic garbage collector: the pause of a full
            collection and of a young one (``gc.callbacks``, start to stop), and what
            each pending timer adds to a full collection (ns per timer).
``idle``    N connections, each with an idle timeout re-armed on every read; reads hit
            random connections flat out for a few seconds, after a warm-up of one
            timeout: ns per read, everything included (aiowheel ``reset``; uvicorn's
            cancel + ``call_later``; aiohttp's stored deadline re-checked when its
            ``call_at`` fires; trio's deadline), and idle closes per second (a
            connection whose reads came too late: a sign the contender fell behind).
``timeout`` a timeout block with N other timers pending: ns per enter + exit (nothing
            inside), and ns per reset of the open block's deadline (one per read):
            aiowheel ``timer.timeout``; ``asyncio.timeout`` on asyncio and uvloop (the
            ``call_later`` contenders: the loop's own timer heap, and the same
            block with the loop's ``call_at`` stubbed, what no timer can save); trio's
            ``move_on_after`` (``trio-native``).
``kafka``, a searched workload, is in ``kafka.py``; ``registry.py`` lists them all.

Between batches of 1,000 operations the timed loops yield to the event loop once,
as a server would: whatever the contender defers to the loop (asyncio's heap clean-up,
uvloop's handle close, trio's task steps) is inside the measurement.
"""

from __future__ import annotations

import gc
import math
import random
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .contenders import Contender
from .env import Env, GcClock, percentile
from .results import Result
from .settings import Settings
from .workload import Metric, RepeatedWorkload

__all__ = [
    "Churn",
    "Collector",
    "Fire",
    "Idle",
    "Memory",
    "Rearm",
    "Spread",
    "TimeoutScope",
]

_BATCH = 1_000
#: churn's time budget stops the pairs no sooner than this many batches.
_MIN_BATCHES = 5


def _noop() -> None:
    pass


def _chunks(values: Sequence[Any], size: int = _BATCH) -> list[Sequence[Any]]:
    return [values[i : i + size] for i in range(0, len(values), size)]


def _rng(settings: Settings, name: str, n: int, rep: int) -> random.Random:
    return random.Random(f"{settings.seed}:{name}:{n}:{rep}")


async def _settle(env: Env) -> None:
    # Two checkpoints: trio runs the tasks spawned before our first checkpoint in the
    # same batch as us, in random order; after the second all have taken their first
    # step (registered their deadlines).
    await env.checkpoint()
    await env.checkpoint()


# -- churn --------------------------------------------------------------------------


@dataclass
class _ChurnData:
    fill: list[float]
    pairs: list[Sequence[float]]
    ops: int


class Churn(RepeatedWorkload):
    name = "churn"
    quick_step_seconds = 0.9
    title = "schedule + cancel with N pending"
    metrics = (
        Metric("pair_ns", "schedule+cancel pair", "ns", "lower"),
        Metric("fill_ns", "schedule, filling to N", "ns", "lower"),
    )

    def default_sizes(self, quick: bool) -> list[int]:
        # Quick: 20,000 pending: trio-native's task per timer made the churn of
        # 100,000 a quarter of `bench --report`'s time (fill, teardown and the full
        # garbage collections that 100,000 tasks bring, 14 s of CPU per repetition),
        # and at 50,000 still 23 s of its 5 minutes (issue 32), while the other
        # contenders' figures barely move with N.
        return [20_000] if quick else [1_000_000]

    def _ops(self, n: int, settings: Settings) -> int:
        if settings.ops is not None:
            return settings.ops
        return 50_000 if settings.quick else 200_000

    def prepare(self, n: int, rep: int, settings: Settings) -> _ChurnData:
        rng = _rng(settings, self.name, n, rep)
        uniform = rng.uniform
        ops = self._ops(n, settings)
        fill = [uniform(0.0, 30.0) for _ in range(n)]
        pairs = [uniform(0.0, 30.0) for _ in range(ops)]
        return _ChurnData(fill, _chunks(pairs), ops)

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "deadlines": "uniform over 30 s",
            "batch": _BATCH,
            "pairs": f"M, or the whole batches done in {settings.op_seconds:g} s "
            f"(at least {_MIN_BATCHES * _BATCH:,})",
        }

    async def run(
        self, env: Env, n: int, data: _ChurnData, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        schedule = env.call_later
        noop = _noop
        checkpoint = env.checkpoint
        perf = time.perf_counter
        t0 = perf()
        for delay in data.fill:
            schedule(delay, noop)
        await _settle(env)
        fill = perf() - t0
        gc.collect()  # start the timed part with the same GC state for everyone
        # The same pairs for everyone, up to a time budget: a contender that has
        # not done them all in op_seconds stops after the batch under way (at least
        # _MIN_BATCHES batches), and its figure is the time per pair it did. Only
        # trio-native, about 100x slower per pair, meets the budget at the defaults.
        done = 0
        t0 = perf()
        stop = t0 + settings.op_seconds
        for number, batch in enumerate(data.pairs, 1):
            for delay in batch:
                schedule(delay, noop).cancel()
            await checkpoint()
            done += len(batch)
            if number >= _MIN_BATCHES and perf() >= stop:
                break
        pairs = perf() - t0
        return {
            "pair_ns": pairs / max(done, 1) * 1e9,
            "fill_ns": fill / max(n, 1) * 1e9,
            "_ops": float(done),
        }


# -- rearm --------------------------------------------------------------------------


@dataclass
class _RearmData:
    fill: list[float]
    picks: list[Sequence[int]]
    ops: int


class Rearm(RepeatedWorkload):
    name = "rearm"
    quick_step_seconds = 0.7
    title = "re-arm a pending timer to 30 s, N pending"
    metrics = (Metric("rearm_ns", "re-arm", "ns", "lower"),)

    def default_sizes(self, quick: bool) -> list[int]:
        return [20_000] if quick else [100_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> _RearmData:
        rng = _rng(settings, self.name, n, rep)
        ops = settings.ops if settings.ops is not None else min(max(2 * n, 10_000), 1_000_000)
        fill = [rng.uniform(0.0, 30.0) for _ in range(n)]
        randrange = rng.randrange
        picks = [randrange(n) for _ in range(ops)]
        return _RearmData(fill, _chunks(picks), ops)

    def params(self, settings: Settings) -> dict[str, Any]:
        return {"initial deadlines": "uniform over 30 s", "new delay": 30.0}

    async def run(
        self, env: Env, n: int, data: _RearmData, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        schedule = env.call_later
        noop = _noop
        handles = [schedule(delay, noop) for delay in data.fill]
        await _settle(env)
        checkpoint = env.checkpoint
        perf = time.perf_counter
        kind = env.contender.kind
        gc.collect()
        t0 = perf()
        if kind == "aiowheel":
            for batch in data.picks:
                for i in batch:
                    handles[i].reset(30.0)
                await checkpoint()
        elif kind == "trio" and not env.traced:
            # trio's own re-arm: assign the cancel scope's deadline. (Traced, the
            # handles' reset below leaves a scope that has already fired alone.)
            scopes = [h.scope for h in handles]
            clock = env.time
            t0 = perf()
            for batch in data.picks:
                for i in batch:
                    scopes[i].deadline = clock() + 30.0
                await checkpoint()
        elif kind == "trio":
            for batch in data.picks:
                for i in batch:
                    handles[i].reset(30.0)
                await checkpoint()
        else:
            for batch in data.picks:
                for i in batch:
                    handles[i].cancel()
                    handles[i] = schedule(30.0, noop)
                await checkpoint()
        elapsed = perf() - t0
        return {"rearm_ns": elapsed / data.ops * 1e9}


# -- memory -------------------------------------------------------------------------


# How far ahead the memory workload's first deadline is (seconds).
_MEMORY_LEAD: Final = 600.0


def _trio_memory_cap(settings: Settings) -> int:
    """How many of the N timers trio-native's memory is measured at: a task each costs
    the same at any N, and 50,000 tasks under tracemalloc took 7 s of CPU per quick
    repetition, a tenth of `bench --report`'s time for one figure."""
    return min(settings.trio_max_tasks, 10_000) if settings.quick else settings.trio_max_tasks


class Memory(RepeatedWorkload):
    name = "memory"
    quick_step_seconds = 0.9
    title = "bytes per pending timer"
    metrics = (Metric("bytes", "per pending timer", "B", "lower"),)
    traced = False  # its timers never end: a trace would be N cancellations

    def default_sizes(self, quick: bool) -> list[int]:
        # Quick: bytes per timer do not depend on N (a heap's or a list's spare
        # slots are a share of it at any N), and tracemalloc slows every allocation.
        return [20_000] if quick else [1_000_000]

    def skip_reason(self, contender: Contender, n: int | None, settings: Settings) -> str | None:
        # Per-timer cost does not depend on N for tasks: trio is measured at the cap.
        return None

    def prepare(self, n: int, rep: int, settings: Settings) -> list[float]:
        # The deadlines start _MEMORY_LEAD ahead: every timer must still be pending
        # when the growth is read. (With deadlines from 0 s, the timers that came due
        # while N were scheduled under tracemalloc fired at the first checkpoint, and
        # the figure divided the memory of the survivors by N: a 1M run under-reported
        # by 10 to 30 %, more for the slower contenders.)
        rng = _rng(settings, self.name, n, rep)
        return [_MEMORY_LEAD + rng.uniform(0.0, 30.0) for _ in range(n)]

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "method": "tracemalloc growth / N (handle, deadline float, container slot)",
            "deadlines": f"{_MEMORY_LEAD:g} to {_MEMORY_LEAD + 30:g} s ahead (none fires)",
            "trio-native N": f"min(N, {_trio_memory_cap(settings):,})",
            # Read by output.tables: a note under the table when N is above it.
            "trio_native_cap": _trio_memory_cap(settings),
        }

    async def run(
        self, env: Env, n: int, data: list[float], settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        if env.contender.kind == "trio":
            data = data[: _trio_memory_cap(settings)]
            n = len(data)
        schedule = env.call_later
        noop = _noop
        await _settle(env)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            t0 = time.perf_counter()
            for delay in data:
                schedule(delay, noop)
            await _settle(env)
            after = tracemalloc.get_traced_memory()[0]
            took = time.perf_counter() - t0
        finally:
            tracemalloc.stop()
        if took >= _MEMORY_LEAD:
            raise RuntimeError(
                f"memory: scheduling {n:,} timers took {took:.0f} s, past the first "
                f"deadline ({_MEMORY_LEAD:g} s): some fired, so the figure would be low"
            )
        return {"bytes": (after - before) / max(n, 1), "_n": float(n)}


# -- collector ----------------------------------------------------------------------

#: Timed collections per figure (the median is kept): full ones walk every pending
#: timer, young ones only what is new.
_FULL_COLLECTIONS: Final = 3
_YOUNG_COLLECTIONS: Final = 7


def _pause(generation: int, times: int) -> float:
    """The median pause of ``times`` collections of ``generation`` (seconds), each
    timed by ``gc.callbacks`` from its start to its stop."""
    pauses = []
    for _ in range(times):
        with GcClock() as clock:
            gc.collect(generation)
        pauses.append(clock.seconds)
    return sorted(pauses)[len(pauses) // 2]


class Collector(RepeatedWorkload):
    """What N pending timers cost CPython's cyclic garbage collector.

    A full collection visits every object the collector tracks; a pending timer is
    one or more of them (its handle, the callback's arguments, the ``Context`` it
    runs in) for as long as it is pending, and a server holding a million timeouts
    pays that in every full collection, as a pause of the whole loop. Young
    collections visit only what was allocated since the last one: with the timers
    already there, their pause should not grow with N.

    Measured with the harness frozen (``gc.freeze()`` after the deadlines are drawn,
    as ``kafka`` does and docs/purgatory.md advises a server), so that a collection
    walks the event loop and what the contender allocated, nothing of the bench's:
    first with nothing pending, then with N timers pending (deadlines 600 to 630 s
    out: none fires). ``per_timer_ns`` is the difference over N. ``tracked`` counts
    the objects the collector tracks per pending timer (``gc.get_objects()``, which
    leaves out the frozen ones): the pause's cause, without the machine's noise.
    """

    name = "collector"
    quick_step_seconds = 0.8
    title = "the garbage collector with N timers pending"
    metrics = (
        Metric("full_ms", "full collection (gc.collect()) pause", "ms", "lower"),
        Metric("young_us", "young collection (gc.collect(0)) pause", "us", "lower"),
        Metric("per_timer_ns", "a pending timer's share of a full collection", "ns", "lower"),
        Metric("tracked", "objects the collector tracks per pending timer", "", "lower"),
    )
    kinds = frozenset({"aiowheel", "call_later"})
    traced = False  # its timers never end: a trace would be N cancellations

    def default_sizes(self, quick: bool) -> list[int]:
        return [100_000] if quick else [1_000_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> list[float]:
        rng = _rng(settings, self.name, n, rep)
        return [_MEMORY_LEAD + rng.uniform(0.0, 30.0) for _ in range(n)]

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "method": "gc.callbacks, a collection's start to its stop; medians of "
            f"{_FULL_COLLECTIONS} full and {_YOUNG_COLLECTIONS} young collections",
            "harness": "gc.freeze() before the timers are scheduled",
            "deadlines": f"{_MEMORY_LEAD:g} to {_MEMORY_LEAD + 30:g} s ahead (none fires)",
        }

    async def run(
        self, env: Env, n: int, data: list[float], settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        schedule = env.call_later
        noop = _noop
        await _settle(env)
        gc.collect()
        gc.freeze()
        try:
            empty = _pause(2, _FULL_COLLECTIONS)
            objects = len(gc.get_objects())
            t0 = time.perf_counter()
            for delay in data:
                schedule(delay, noop)
            await _settle(env)
            took = time.perf_counter() - t0
            full = _pause(2, _FULL_COLLECTIONS)
            young = _pause(0, _YOUNG_COLLECTIONS)
            tracked = len(gc.get_objects()) - objects
        finally:
            gc.unfreeze()
        if took >= _MEMORY_LEAD:
            raise RuntimeError(
                f"collector: scheduling {n:,} timers took {took:.0f} s, past the first "
                f"deadline ({_MEMORY_LEAD:g} s): some fired"
            )
        return {
            "full_ms": full * 1e3,
            "young_us": young * 1e6,
            "per_timer_ns": max(0.0, full - empty) / max(n, 1) * 1e9,
            "tracked": tracked / max(n, 1),
            "_empty_ms": empty * 1e3,
        }


# -- fire ---------------------------------------------------------------------------

# First repetition's guess of the time to insert one timer (seconds), by kind, so that
# every deadline is still ahead when insertion ends; later repetitions use twice the
# insertion time they measured.
_INSERT_GUESS = {"aiowheel": 5e-6, "call_later": 8e-6, "deadline": 8e-6, "trio": 40e-6}


def _lead(env: Env, n: int, state: dict[str, float]) -> float:
    if "insert_s" in state:
        return 0.05 + 2.0 * state["insert_s"]
    return 0.1 + n * _INSERT_GUESS[env.contender.kind]


def _lateness_ms(fired: list[float], deadlines: list[float]) -> list[float]:
    return sorted((f - d) * 1e3 for f, d in zip(fired, deadlines, strict=True))


class Fire(RepeatedWorkload):
    name = "fire"
    quick_step_seconds = 1.0
    title = "burst of N timers due within 20 ms"
    metrics = (
        Metric("rate", "callbacks/s", "1/s", "higher"),
        Metric("late_p50_ms", "lateness p50", "ms", "lower"),
        Metric("late_p99_ms", "lateness p99", "ms", "lower"),
        Metric("late_max_ms", "lateness max", "ms", "lower"),
        Metric("early_pct", "fired before deadline", "%", "lower", ratio=False),
    )
    window = 0.020

    def default_sizes(self, quick: bool) -> list[int]:
        # Quick: 20,000 (a burst of a million timers per second still), not 50,000:
        # trio-native's task per timer took 4.5 s of CPU per repetition at 50,000.
        return [20_000] if quick else [200_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> list[float]:
        rng = _rng(settings, self.name, n, rep)
        return [rng.uniform(0.0, self.window) for _ in range(n)]

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "window_s": self.window,
            "rate": "N / (last callback - window start)",
            "lateness": "callback start (loop clock, read fresh) - deadline",
        }

    async def run(
        self, env: Env, n: int, data: list[float], settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        base = env.time() + _lead(env, n, state)
        deadlines = [base + offset for offset in data]
        fired = [0.0] * n
        left = n
        done = env.new_event()
        now = env.now

        def callback(i: int) -> None:
            nonlocal left
            fired[i] = now()
            left -= 1
            if not left:
                done.set()

        call_at = env.call_at
        perf = time.perf_counter
        t0 = perf()
        for i, deadline in enumerate(deadlines):
            call_at(deadline, callback, i)
        await _settle(env)
        state["insert_s"] = perf() - t0
        overrun = env.time() - base
        if n:
            await done.wait()
        else:
            return {}
        lateness = _lateness_ms(fired, deadlines)
        span = max(fired) - base
        return {
            "rate": n / span if span > 0 else math.inf,
            "late_p50_ms": percentile(lateness, 0.50),
            "late_p99_ms": percentile(lateness, 0.99),
            "late_max_ms": lateness[-1],
            "early_pct": 100.0 * sum(1 for x in lateness if x < 0) / n,
            "_overrun_ms": max(0.0, overrun * 1e3),
        }


# -- spread -------------------------------------------------------------------------


class Spread(RepeatedWorkload):
    name = "spread"
    quick_step_seconds = 1.1
    title = "N timers due uniformly over the window"
    metrics = (
        Metric("wakeups", "driver wake-ups / loop iterations", "", "lower"),
        Metric("cpu_s_per_1m", "CPU per 1M fired", "s", "lower"),
        Metric("late_p99_ms", "lateness p99", "ms", "lower"),
        Metric("occupied_ticks", "distinct 1 ms ticks with a deadline", "", "lower", ratio=False),
    )
    count_iterations = True
    #: A contender whose median lateness p99 is above this fell behind the window: its
    #: loop ran back to back, each iteration catching up on everything overdue, so its
    #: wake-up count says how long an iteration took, not how often timers woke it.
    #: trio-native does at 20,000 timers/s on a busy 2-core machine: 19 iterations (all
    #: but one firing a batch) for 20,000 timers over 1 s, or 2 when spawning its tasks
    #: took longer than the window. Its wake-ups get no ratio. The threshold is kafka's.
    behind_ms = 50.0

    def default_sizes(self, quick: bool) -> list[int]:
        return [20_000] if quick else [100_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> list[float]:
        rng = _rng(settings, self.name, n, rep)
        window = settings.spread_window
        return [rng.uniform(0.0, window) for _ in range(n)]

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "window_s": settings.spread_window,
            "wakeups": (
                "aiowheel: timer.stats().wakeups (driver passes); asyncio call_later: "
                "selector.select calls; uvloop call_later: distinct values of the cached "
                "loop.time() seen by callbacks (lower bound); trio-native: before_io_wait"
            ),
            "cpu": "time.process_time() from end of insertion to last callback",
            "wakeups ratio": f"none for a contender whose lateness p99 > {self.behind_ms:g} ms",
        }

    def withhold_ratios(self, results: list[Result], settings: Settings) -> list[str]:
        wakeups = {r.contender: r for r in results if r.metric == "wakeups" and r.samples}
        warnings = []
        for r in results:
            if r.metric != "late_p99_ms" or r.contender not in wakeups:
                continue
            if r.median > self.behind_ms:
                counted = "driver wake-ups" if r.contender.is_aiowheel else "loop iterations"
                wakeups[r.contender].withheld = f"fell behind: lateness p99 {r.median:,.0f} ms"
                warnings.append(
                    f"{self.name} {r.variant} {r.contender.name} fell behind (lateness p99 "
                    f"{r.median:,.0f} ms > {self.behind_ms:g} ms): its {counted} are catch-up "
                    "passes, not wake-ups for timers; no ratio"
                )
        return warnings

    async def run(
        self, env: Env, n: int, data: list[float], settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        if not n:
            return {}
        base = env.time() + _lead(env, n, state)
        deadlines = [base + offset for offset in data]
        fired = [0.0] * n
        left = n
        done = env.new_event()
        now = env.now
        uvloop_peer = env.contender.kind == "call_later" and env.contender.backend == "uvloop"
        seen = [0.0] * n if uvloop_peer else []
        iteration_clock = env.iteration_clock

        def callback(i: int) -> None:
            nonlocal left
            fired[i] = now()
            left -= 1
            if not left:
                done.set()

        def uvloop_callback(i: int) -> None:
            nonlocal left
            fired[i] = now()
            seen[i] = iteration_clock()
            left -= 1
            if not left:
                done.set()

        cb = uvloop_callback if uvloop_peer else callback
        call_at = env.call_at
        perf = time.perf_counter
        t0 = perf()
        for i, deadline in enumerate(deadlines):
            call_at(deadline, cb, i)
        await _settle(env)
        state["insert_s"] = perf() - t0
        overrun = env.time() - base
        timer = env.timer
        wake0 = timer.stats().wakeups if timer is not None else env.loop_iterations()
        cpu0 = time.process_time()
        await done.wait()
        cpu = time.process_time() - cpu0
        if timer is not None:
            wakeups = float(timer.stats().wakeups - wake0)
        elif uvloop_peer:
            wakeups = float(len(set(seen)))
        else:
            wakeups = float(env.loop_iterations() - wake0)
        lateness = _lateness_ms(fired, deadlines)
        tick = 0.001
        occupied = len({math.ceil(offset / tick) for offset in data})
        return {
            "wakeups": wakeups,
            "cpu_s_per_1m": cpu / n * 1e6,
            "late_p99_ms": percentile(lateness, 0.99),
            "occupied_ticks": float(occupied),
            "_overrun_ms": max(0.0, overrun * 1e3),
        }


# -- idle ---------------------------------------------------------------------------


@dataclass
class _IdleData:
    initial: list[float]
    picks: list[Sequence[int]]


class Idle(RepeatedWorkload):
    name = "idle"
    quick_step_seconds = 1.5
    title = "idle timeout re-armed on every read, N connections"
    metrics = (
        Metric("read_ns", "per read (re-arm + deferred timer work)", "ns", "lower"),
        Metric("timeouts_per_s", "idle closes/s (reads fell behind)", "1/s", "lower", ratio=False),
        Metric(
            "reset_read_ns",
            "per read, aiowheel's handle.reset(timeout) instead",
            "ns",
            "lower",
            kinds=frozenset({"aiowheel"}),
        ),
    )
    kinds = frozenset({"aiowheel", "call_later", "deadline", "trio"})

    def default_sizes(self, quick: bool) -> list[int]:
        return [10_000] if quick else [10_000, 100_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> _IdleData:
        rng = _rng(settings, self.name, n, rep)
        timeout = settings.idle_timeout
        # Connections in steady state: their deadlines spread over one timeout.
        initial = [rng.uniform(0.0, timeout) for _ in range(n)]
        # Reads visit every connection once per pass, in a new random order each
        # pass (two passes, cycled): a connection is idle only if the contender cannot
        # get round all N within the timeout.
        picks: list[int] = []
        for _ in range(2):
            order = list(range(n))
            rng.shuffle(order)
            picks.extend(order)
        return _IdleData(initial, _chunks(picks))

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "timeout_s": settings.idle_timeout,
            "seconds": settings.idle_seconds,
            "patterns": {
                "aiowheel": "Netty's IdleStateHandler (aiowheel.middleware): store "
                "loop.time() + timeout; the wheel timer re-files itself to the stored "
                "deadline when it fires (reset_read_ns: handle.reset(timeout) per read)",
                "call_later": "uvicorn: handle.cancel(); loop.call_later(timeout, ...)",
                "deadline": "aiohttp: store loop.time() + timeout; call_at re-checks and "
                "re-arms to the stored deadline when it fires",
                "trio": "scope.deadline = trio.current_time() + timeout",
            },
        }

    async def run(
        self, env: Env, n: int, data: _IdleData, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        if not n:
            return {}
        kind = env.contender.kind
        if kind != "aiowheel":
            return await self._pattern(env, n, data, settings, kind)
        # aiowheel's pattern is the middleware's (a store per read); handle.reset per
        # read is its own row, measured after it on the same timer.
        touch = await self._pattern(env, n, data, settings, "touch")
        reset = await self._pattern(env, n, data, settings, "reset")
        return {**touch, "reset_read_ns": reset["read_ns"]}

    async def _pattern(
        self, env: Env, n: int, data: _IdleData, settings: Settings, kind: str
    ) -> dict[str, float]:
        """One pattern's steady state: ``kind`` is the contender's kind, or aiowheel's
        ``touch`` (the stored deadline) or ``reset``."""
        timeout = settings.idle_timeout
        call_later = env.call_later
        call_at = env.call_at
        clock = env.time
        timeouts = 0
        handles: list[Any]

        # What each pattern does when a connection's timer fires: count an idle
        # close and start a new connection in its place (so N stays constant).
        deadlines = [clock() + offset for offset in data.initial]
        if kind == "reset":

            def on_idle(i: int) -> None:
                nonlocal timeouts
                timeouts += 1
                handles[i].reset(timeout)

        elif kind == "touch":

            def on_idle(i: int) -> None:
                nonlocal timeouts
                deadline = deadlines[i]
                now = clock()
                if now < deadline:  # touched since filed: re-file, to the stored deadline
                    handles[i].reset_at(deadline)
                else:
                    timeouts += 1
                    deadlines[i] = now + timeout
                    handles[i].reset_at(now + timeout)

        elif kind == "deadline":

            def on_idle(i: int) -> None:
                nonlocal timeouts
                deadline = deadlines[i]
                now = clock()
                if now < deadline:  # touched since armed: sleep on, to the stored deadline
                    handles[i] = call_at(deadline, on_idle, i)
                else:
                    timeouts += 1
                    deadlines[i] = now + timeout
                    handles[i] = call_at(now + timeout, on_idle, i)

        else:

            def on_idle(i: int) -> None:
                nonlocal timeouts
                timeouts += 1
                handles[i] = call_later(timeout, on_idle, i)

        handles = [call_later(offset, on_idle, i) for i, offset in enumerate(data.initial)]
        await _settle(env)
        checkpoint = env.checkpoint
        perf = time.perf_counter
        gc.collect()
        # Warm up for one timeout first: connections armed during set-up that expired
        # while it ran fire now, not inside the measurement; afterwards every
        # connection has been armed by the read loop itself (steady state).
        warm_until = perf() + timeout
        measuring = False
        reads = 0
        t0 = 0.0
        end = math.inf
        timeouts_before = 0
        traced = env.traced
        running = True
        while running:
            for batch in data.picks:
                if kind == "reset":
                    for i in batch:
                        handles[i].reset(timeout)
                elif kind == "touch" or kind == "deadline":
                    for i in batch:
                        deadlines[i] = clock() + timeout
                elif kind == "call_later":
                    for i in batch:
                        handles[i].cancel()
                        handles[i] = call_later(timeout, on_idle, i)
                elif traced:
                    # A traced trio re-arm leaves a scope whose deadline trio already
                    # delivered alone (env.TrioTimer.reset): written, the trace
                    # recorded the new deadline with the old firing (issue 21).
                    for i in batch:
                        handles[i].reset(timeout)
                else:
                    for i in batch:
                        handles[i].scope.deadline = clock() + timeout
                reads += len(batch)
                await checkpoint()
                now = perf()
                if not measuring and now >= warm_until:
                    measuring = True
                    reads = 0
                    t0 = now
                    end = now + settings.idle_seconds
                    timeouts_before = timeouts
                elif now >= end:
                    running = False
                    break
        elapsed = perf() - t0
        if kind == "touch":  # the next pattern runs on this timer: leave it empty
            for handle in handles:
                handle.cancel()
            await _settle(env)
        return {
            "read_ns": elapsed / reads * 1e9,
            "timeouts_per_s": (timeouts - timeouts_before) / elapsed,
        }


# -- timeout ------------------------------------------------------------------------


@dataclass
class _TimeoutData:
    fill: list[float]
    ops: int


#: The timeout workload's figures of the timer's own blocks (aiowheel's timer.timeout,
#: asyncio.timeout, trio's move_on_after), and those of asyncio.timeout on the drop-in
#: loop against the plain loops' (each peer is compared with one aiowheel contender of
#: its base per figure: fill_ratios).
_TIMER_KINDS = frozenset({"aiowheel", "call_later", "trio"})
_LOOP_KINDS = frozenset({"loop", "call_later"})


class _StubHandle:
    __slots__ = ()

    def cancel(self) -> None:
        pass


_STUB_HANDLE = _StubHandle()


def _stub_call_at(when: float, callback: object, *args: object, context: object = None) -> Any:
    """A timer that costs nothing but a Python call: the timeout workload's floor."""
    return _STUB_HANDLE


async def _asyncio_timeout_blocks(
    batches: range, inner: range, checkpoint: Callable[[], Awaitable[None]]
) -> float:
    """Seconds for ``async with asyncio.timeout(10): pass``, batch after batch, with a
    checkpoint between batches (the timeout workload's asyncio block)."""
    import asyncio

    asyncio_timeout = asyncio.timeout
    perf = time.perf_counter
    t0 = perf()
    for _ in batches:
        for _ in inner:
            async with asyncio_timeout(10.0):
                pass
        await checkpoint()
    return perf() - t0


class TimeoutScope(RepeatedWorkload):
    name = "timeout"
    quick_step_seconds = 1.0
    title = "a timeout block: enter + exit, and reset per read, N other timers pending"
    kinds = _TIMER_KINDS | _LOOP_KINDS
    metrics = (
        Metric(
            "enter_exit_ns", "enter + exit of a timeout block", "ns", "lower", kinds=_TIMER_KINDS
        ),
        Metric(
            "reset_ns",
            "reset of the open block's deadline (per read)",
            "ns",
            "lower",
            kinds=_TIMER_KINDS,
        ),
        # The drop-in loop's own asyncio.timeout, the same block on the same loop
        # with the N timers on its wheel: what an application gains unchanged.
        Metric(
            "loop_enter_exit_ns",
            "drop-in loop: enter + exit of asyncio.timeout",
            "ns",
            "lower",
            kinds=_LOOP_KINDS,
        ),
        # The plain loops' block with its timer stubbed out (_stub_call_at: call_at
        # and cancel() do nothing): the part of the block no loop's timer can make
        # cheaper, so plain / this is the most any timer could gain (docs/loop.md,
        # "asyncio.timeout on the drop-in loop").
        Metric(
            "stub_timer_ns",
            "the same asyncio.timeout block, its call_at and cancel stubbed",
            "ns",
            "lower",
            ratio=False,
            kinds=frozenset({"call_later"}),
        ),
    )
    traced = False  # one-block guards that never fire: the trace is all cancellations

    def default_sizes(self, quick: bool) -> list[int]:
        return [10_000] if quick else [10_000, 100_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> _TimeoutData:
        rng = _rng(settings, self.name, n, rep)
        # Quick (the main job): 40,000 blocks, enough for a stable per-op median (the
        # cost per block does not move with the count) and a share of `bench
        # --report`'s five minutes in line with the other workloads.
        ops = settings.ops if settings.ops is not None else 40_000 if settings.quick else 100_000
        return _TimeoutData([rng.uniform(0.0, 30.0) for _ in range(n)], ops)

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "delay": 10.0,
            "patterns": {
                "aiowheel": "with timer.timeout(10): pass; t.reset(10)",
                "call_later": "async with asyncio.timeout(10): pass; "
                "cm.reschedule(loop.time() + 10)",
                "trio": "with trio.move_on_after(10): pass; "
                "scope.deadline = trio.current_time() + 10",
                "loop": "on aiowheel.new_event_loop(): async with asyncio.timeout(10): pass",
            },
        }

    async def run(
        self, env: Env, n: int, data: _TimeoutData, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        # The other pending timers: a timeout shares its loop with them.
        handles = [env.call_later(delay, _noop) for delay in data.fill]
        await _settle(env)
        checkpoint = env.checkpoint
        perf = time.perf_counter
        kind = env.contender.kind
        batches = range(max(data.ops // _BATCH, 1))
        ops = len(batches) * _BATCH
        inner = range(_BATCH)
        stub_timer = 0.0  # the plain loops' only (below)
        gc.collect()
        if kind == "aiowheel":
            assert env.timer is not None
            timeout = env.timer.timeout
            t0 = perf()
            for _ in batches:
                for _ in inner:
                    with timeout(10.0):
                        pass
                await checkpoint()
            enter_exit = perf() - t0
            with timeout(10.0) as scope:
                reset = scope.reset
                t0 = perf()
                for _ in batches:
                    for _ in inner:
                        reset(10.0)
                    await checkpoint()
                resets = perf() - t0
        elif kind == "trio":
            import trio

            move_on_after = trio.move_on_after
            clock = trio.current_time
            t0 = perf()
            for _ in batches:
                for _ in inner:
                    with move_on_after(10.0):
                        pass
                await checkpoint()
            enter_exit = perf() - t0
            with move_on_after(10.0) as trio_scope:
                t0 = perf()
                for _ in batches:
                    for _ in inner:
                        trio_scope.deadline = clock() + 10.0
                    await checkpoint()
                resets = perf() - t0
        else:
            import asyncio

            loop_time = asyncio.get_running_loop().time
            enter_exit = await _asyncio_timeout_blocks(batches, inner, checkpoint)
            if kind == "loop":  # its figure is the block's only (loop-timeout: reschedule)
                for handle in handles:
                    handle.cancel()
                return {"loop_enter_exit_ns": enter_exit / ops * 1e9}
            # The stub, set on the loop instance, shadows the loop's call_at for the
            # block's reschedule, which looks it up on the loop at each call.
            loop: Any = asyncio.get_running_loop()
            loop.call_at = _stub_call_at
            try:
                stub_timer = await _asyncio_timeout_blocks(batches, inner, checkpoint)
            finally:
                del loop.call_at
            async with asyncio.timeout(10.0) as cm:
                reschedule = cm.reschedule
                t0 = perf()
                for _ in batches:
                    for _ in inner:
                        reschedule(loop_time() + 10.0)
                    await checkpoint()
                resets = perf() - t0
        for handle in handles:
            handle.cancel()
        figures = {"enter_exit_ns": enter_exit / ops * 1e9, "reset_ns": resets / ops * 1e9}
        if kind == "call_later":
            # The plain loop's block: the peer of the drop-in loop's as well.
            figures["loop_enter_exit_ns"] = figures["enter_exit_ns"]
            figures["stub_timer_ns"] = stub_timer / ops * 1e9
        return figures
