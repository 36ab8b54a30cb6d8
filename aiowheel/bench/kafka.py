"""``kafka``: the benchmark of Kafka's purgatory redesign proposal, in one Python process.

The proposal (2015, the design behind Kafka's hierarchical-wheel ``SystemTimer``)
measured how many requests per second a purgatory sustains: requests arrive with
exponential inter-arrival times at a target rate; each one waits in the purgatory
with a 200 ms timeout and is completed early, by a separate completer, after a time
drawn from a log-normal distribution; requests whose draw exceeds the timeout expire.
Two shapes: the *low-timeout* case (completion p50 20 ms, p75 60 ms: ~10% expire) and
the *high-timeout* case (p50 200 ms, p75 400 ms: half expire). Kafka's new purgatory
saturated at about 105,000 requests/s in the high-timeout case (Java, 200 MB heap).

Here one task is both the load generator and the completer: it creates each request
when its arrival time comes, and completes it when its completion time comes (a
``heapq`` of completion times, the same for every contender, like Kafka's separate
completer queue). The contender provides the timeout:

* aiowheel: ``aiowheel.Purgatory``: one ``DelayedOperation`` per request watched on
  one of 1,000 keys (as produce requests are on partitions), completed by the
  completer with ``force_complete()``, as Kafka's benchmark completes them;
* ``call_later``: ``loop.call_later(0.2, expire, request)`` plus a dict of watched
  requests (what a purgatory does, minus the generality);
* trio-native: a task per request sleeping in a ``CancelScope`` with the deadline.

A probe runs the load for a fixed time at one rate, in a fresh event loop. The
contender *falls behind* when arrivals cannot keep up with the schedule (arrival lag
p99, or the backlog left at the end, above 50 ms) or expirations are late (lateness
p99 above 50 ms). The search doubles the rate from 25k/s until a probe falls behind,
bisects (geometric mean) to within 5%, then confirms the best rate with a probe of
``--kafka-seconds`` (10 s): the sustained rate is one that held for that long. If the
confirmation fails, the search goes on with long probes: 20% lower until one passes,
then bisecting between the highest that passed and the lowest that failed to within
5% (ten long probes at most). Before each probe the
heap left by start-up is frozen (``gc.freeze()``) and the young generation's threshold
raised to ``GC_YOUNG_THRESHOLD``, as docs/purgatory.md advises a server, for every
contender alike. Contenders are probed
in turn, step by step (ABAB...), so drift hits all of them alike.

Then, as the proposal also did, each contender is held at fixed target rates
(``--kafka-targets``: 25,000, 50,000 and 100,000 req/s by default) for
``--kafka-target-seconds`` (3 s; 0.6 s quick), and two figures are read at each: the CPU
seconds the process spent per 1,000,000 requests (``time.process_time()``: the
load generator's share is the same for every contender), and the time the cyclic
garbage collector ran per second of load (``gc.callbacks``, a collection's start to
its stop). A contender that falls behind at a rate has no figure there: it is
saturated below it (the proposal's lines end at saturation too). Their variants are
named ``"<case> at <rate>"``; ``aiowheel report`` draws CPU against rate.

It is a ``SearchedWorkload`` (``workload.py``): the runner hands it the contenders
and it returns every figure.

``purgatory`` (``Cycle`` below), a repeated workload, times one request's cycle through
the purgatory alone, without the load generator: a new ``DelayedOperation``,
``try_complete_else_watch`` on one of 1,000 keys, and its ``force_complete`` N
requests later (N in flight, 40,000 by default); the peer is the same cycle written by
hand on ``loop.call_later`` with a dict of sets of watched requests.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import aiowheel

from .contenders import Contender
from .env import Env, GcClock, open_env, percentile, run_fresh
from .results import Result
from .settings import Settings
from .workload import Metric, Progress, Remote, RepeatedWorkload, SearchedWorkload, Trace

__all__ = [
    "CASES",
    "GC_YOUNG_THRESHOLD",
    "TARGET_METRICS",
    "Cycle",
    "Kafka",
    "ProbeResult",
    "run_probe",
    "target_variant",
]

TIMEOUT = 0.200
#: case -> (completion p50, p75), seconds
CASES = {"low": (0.020, 0.060), "high": (0.200, 0.400)}
_Z75 = 0.6744897501960817  # standard normal quantile at 0.75
_POOL = 1 << 20  # random draws cycled through by every probe
_MAX_BURST = 2_000  # arrivals created before yielding to the loop, when behind
#: The load generator's shortest sleep: with nothing due it sleeps at least this long
#: and then takes what came due meanwhile in one burst (a lag of at most about this,
#: against the 50 ms that counts as behind). Spinning on checkpoints instead, as the
#: generator did while the next arrival was under 0.5 ms away (always, above
#: 2,000 req/s), kept the CPU at 100% at every rate, whatever the contender.
_QUANTUM = 0.001
_KEYS = 1_000  # purgatory keys the requests are spread over ("partitions")
#: The young generation's threshold during a probe (CPython's default is 700):
#: docs/purgatory.md, "The garbage collector", measured.
GC_YOUNG_THRESHOLD = 10_000


@dataclass
class ProbeResult:
    rate: float
    seconds: float
    ok: bool
    arrivals: int
    achieved: float  # arrivals / seconds
    lag_p99_ms: float
    backlog_ms: float
    late_p99_ms: float
    expired: int
    completed: int
    cpu_pct: float
    implementation: str
    #: CPU seconds of the whole process over the probe's load.
    cpu_s: float = 0.0
    #: The cyclic collector's time over the probe's load, and its collections.
    gc_s: float = 0.0
    gc_collections: int = 0

    @property
    def cpu_s_per_m(self) -> float:
        """CPU seconds per 1,000,000 requests."""
        return self.cpu_s / self.arrivals * 1e6 if self.arrivals else math.nan

    @property
    def gc_ms_per_s(self) -> float:
        """The collector's milliseconds per second of load."""
        return self.gc_s / self.seconds * 1e3


# The harness keeps its numbers in arrays of C doubles, not lists of floats: a list is
# one object for the garbage collector but each of its items is visited by every full
# collection, and a probe at 100,000 req/s held some 3 million of them (two pools, the
# arrival lags). The collections they caused were the harness's own stalls, charged to
# the contender (docs/purgatory.md, "The garbage collector").
@dataclass
class _Pools:
    exponential: array[float]
    completion: dict[str, array[float]] = field(default_factory=dict)


def _pools(seed: int, cases: tuple[str, ...], size: int) -> _Pools:
    rng = random.Random(f"{seed}:kafka")
    expovariate = rng.expovariate
    pools = _Pools(array("d", [expovariate(1.0) for _ in range(size)]))
    for case in cases:
        p50, p75 = CASES[case]
        mu = math.log(p50)
        sigma = (math.log(p75) - mu) / _Z75
        lognormvariate = rng.lognormvariate
        pools.completion[case] = array("d", [lognormvariate(mu, sigma) for _ in range(size)])
    return pools


class _Request:
    """The hand-written models' request: its key, arrival time and timeout handle."""

    __slots__ = ("created", "handle", "key")

    def __init__(self, key: int, created: float) -> None:
        self.key = key
        self.created = created
        self.handle: Any = None


# Each model gives the load generator two functions: ``arrive(key, now)`` parks a new
# request and returns what the completer will hand to ``complete`` (aiowheel: the
# DelayedOperation itself, which is the request, as in a server; the hand-written
# models: a _Request holding its timeout handle).
_Model = tuple[Callable[[int, float], Any], Callable[[Any], None]]

#: The keys' one-item tuples, made once (a server passes the keys it has).
_KEY_TUPLES = [(k,) for k in range(_KEYS)]


class _Counters:
    __slots__ = ("completed", "expired", "late")

    def __init__(self) -> None:
        self.expired = 0
        self.completed = 0
        self.late: array[float] = array("d")


def _purgatory_model(env: Env, counters: _Counters) -> _Model:
    assert env.timer is not None
    now = env.now
    late = counters.late

    class BenchOperation(aiowheel.DelayedOperation):
        __slots__ = ("created",)

        def __init__(self, created: float) -> None:
            super().__init__(TIMEOUT)
            self.created = created

        def try_complete(self) -> bool:
            return False  # completed only by the completer (force_complete) or timeout

        def on_complete(self) -> None:
            pass

        def on_expiration(self) -> None:
            counters.expired += 1
            late.append(now() - self.created - TIMEOUT)

    purgatory = aiowheel.Purgatory(env.timer, name="bench")
    watch = purgatory.try_complete_else_watch
    keys = _KEY_TUPLES

    def arrive(key: int, created: float) -> BenchOperation:
        op = BenchOperation(created)
        # Watched on one of _KEYS keys, as produce requests are on partitions.
        watch(op, keys[key % _KEYS])
        return op

    def complete(op: BenchOperation) -> None:
        # Kafka's completer holds the operation and forces it; its watch-list entry
        # goes at the key's next check or the next purge (every purge_interval).
        if op.force_complete():
            counters.completed += 1

    return arrive, complete


def _timer_model(env: Env, counters: _Counters) -> _Model:
    # A dict of watched keys and a timeout timer per request: what a purgatory does,
    # minus the generality. The completion logic is the same for every contender.
    watched: dict[int, _Request] = {}
    call_later = env.call_later
    now = env.now
    late = counters.late

    def expire(request: _Request) -> None:
        if watched.pop(request.key, None) is not None:
            counters.expired += 1
            late.append(now() - request.created - TIMEOUT)

    def arrive(key: int, created: float) -> _Request:
        request = _Request(key, created)
        watched[key] = request
        request.handle = call_later(TIMEOUT, expire, request)
        return request

    def complete(request: _Request) -> None:
        if watched.pop(request.key, None) is not None:
            request.handle.cancel()
            counters.completed += 1

    return arrive, complete


async def run_probe(
    env: Env, rate: float, seconds: float, case: str, pools: _Pools, max_lag: float
) -> ProbeResult:
    """Offer ``rate`` requests/s for ``seconds`` to the contender in ``env``."""
    counters = _Counters()
    if env.contender.is_aiowheel:
        implementation = "purgatory"
        arrive, complete = _purgatory_model(env, counters)
    else:
        implementation = env.contender.kind
        arrive, complete = _timer_model(env, counters)
    exponential = pools.exponential
    completion = pools.completion[case]
    size = len(exponential)
    spacing = 1.0 / rate
    now = env.now
    sleep = env.sleep
    checkpoint = env.checkpoint
    heap: list[tuple[float, int, Any]] = []
    push, pop = heapq.heappush, heapq.heappop
    lags: array[float] = array("d")
    lag = lags.append
    key = 0
    with GcClock() as collector:  # the collector's time over the load alone
        cpu0 = time.process_time()
        start = now()
        end = start + seconds
        next_arrival = start + exponential[0] * spacing
        while True:
            t = now()
            if t >= end:
                break
            burst = 0
            while next_arrival <= t and burst < _MAX_BURST:
                lag(t - next_arrival)
                request = arrive(key, t)
                draw = completion[key % size]
                if draw < TIMEOUT:
                    push(heap, (t + draw, key, request))
                key += 1
                burst += 1
                next_arrival += exponential[key % size] * spacing
            while heap and heap[0][0] <= t:
                complete(pop(heap)[2])
            # Never past the window's end: at a low rate the next arrival may be long
            # after it (1/rate seconds away, on average).
            wake = min(next_arrival, heap[0][0], end) if heap else min(next_arrival, end)
            delay = wake - now()
            if delay > 0.0:
                await sleep(delay if delay > _QUANTUM else _QUANTUM)
            else:
                await checkpoint()  # behind: yield once, and on with the backlog
        cpu = time.process_time() - cpu0
    backlog = max(0.0, end - next_arrival)
    lags_sorted = sorted(lags)
    late = sorted(counters.late)
    lag_p99 = percentile(lags_sorted, 0.99) if lags_sorted else 0.0
    late_p99 = percentile(late, 0.99) if late else 0.0
    ok = lag_p99 <= max_lag and backlog <= max_lag and late_p99 <= max_lag
    return ProbeResult(
        rate=rate,
        seconds=seconds,
        ok=ok,
        arrivals=key,
        achieved=key / seconds,
        lag_p99_ms=lag_p99 * 1e3,
        backlog_ms=backlog * 1e3,
        late_p99_ms=late_p99 * 1e3,
        expired=counters.expired,
        completed=counters.completed,
        cpu_pct=100.0 * cpu / seconds,
        implementation=implementation,
        cpu_s=cpu,
        gc_s=collector.seconds,
        gc_collections=collector.collections,
    )


# A failed confirmation goes on with long probes: this much lower until one passes,
# then bisecting to within the search's precision (issue 19: the sustained rate to
# within 5%), this many long probes at most. A short probe can pass at nearly twice
# the rate a long one holds (full collections grow with the requests in flight): the
# 5% steps down this replaced gave up at 0.66x of the first try and reported 0.
_STEP_DOWN = 0.8
_CONFIRM_TRIES = 10
#: The steps of a typical search, for the progress bar: about 6 short probes, the
#: long confirmation and a traced short probe (then a probe per target rate).
_SEARCH_STEPS = 8


@dataclass
class _Search:
    """One contender's search for its sustained rate."""

    contender: Contender
    rate: float
    precision: float
    max_rate: float
    phase: str = "double"  # double -> bisect -> confirm -> done
    lo: float = 0.0
    hi: float = math.inf
    tries: int = 0
    # The long probes' bounds: the highest rate that passed, the lowest that failed.
    held: float = 0.0
    failed: float = math.inf
    sustained: float = 0.0
    confirmed: ProbeResult | None = None
    probes: list[ProbeResult] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def probe_seconds(self, settings: Settings) -> float:
        return settings.kafka_seconds if self.phase == "confirm" else settings.kafka_probe

    def update(self, result: ProbeResult) -> None:
        self.probes.append(result)
        if self.phase == "confirm":
            self.tries += 1
            if result.ok:
                if result.rate > self.held:
                    self.held, self.confirmed = result.rate, result
            else:
                self.failed = min(self.failed, result.rate)
                if self.confirmed is None:
                    self.confirmed = result  # reported if nothing ever holds
            if self.held and (self.failed == math.inf or self.failed / self.held <= self.precision):
                # The first confirmation held (the short search's bound is within
                # the precision above it), or the long probes met within it.
                self.sustained, self.phase = self.held, "done"
            elif self.tries >= _CONFIRM_TRIES or (not self.held and self.rate * _STEP_DOWN < 1000):
                self.sustained, self.phase = self.held, "done"
            elif not self.held:
                # Short search probes can pass a rate that a long one cannot hold:
                # step down until one holds, rather than report zero.
                self.rate *= _STEP_DOWN
            else:
                self.rate = math.sqrt(self.held * self.failed)
            return
        if result.ok:
            self.lo = result.rate
        else:
            self.hi = result.rate
        if self.phase == "double":
            if not result.ok:
                self.phase = "bisect"
            elif self.rate * 2 > self.max_rate:
                self.rate = self.lo
                self.phase = "confirm"
                return
            else:
                self.rate *= 2
                return
        # bisect
        if self.lo == 0.0:
            self.rate = self.hi / 2  # failed at the start rate: go down
            if self.rate < 1000:
                self.phase = "done"
            return
        if self.hi / self.lo <= self.precision:
            self.rate = self.lo
            self.phase = "confirm"
        else:
            self.rate = math.sqrt(self.lo * self.hi)


#: The figures read at each fixed target rate (variant ``target_variant(case, rate)``).
TARGET_METRICS = (
    Metric("cpu_s_per_m", "CPU per 1,000,000 requests at this rate", "s", "lower"),
    Metric("gc_ms_per_s", "collector's time per second at this rate", "ms", "lower"),
)


def target_variant(case: str, rate: float) -> str:
    """The variant of the figures read at a fixed target rate."""
    return f"{case} at {rate:,.0f} req/s"


class Kafka(SearchedWorkload):
    name = "kafka"
    title = "Kafka purgatory proposal: sustained rate, and CPU and collector time at fixed rates"
    search_metrics = (
        Metric("sustained_rps", "sustained rate", "req/s", "higher"),
        Metric("probe_rps", "highest rate passing a search probe", "req/s", "higher"),
        Metric("late_p99_ms", "expiry lateness p99 at that rate", "ms", "lower", ratio=False),
        Metric("cpu_pct", "CPU at that rate", "%", "lower", ratio=False),
    )
    metrics = (*search_metrics, *TARGET_METRICS)

    def __init__(self) -> None:
        self._pools: _Pools | None = None
        self._pool_key: tuple[int, tuple[str, ...], int] | None = None

    def variants(self, settings: Settings) -> list[str]:
        return [
            *settings.kafka_cases,
            *(
                target_variant(case, rate)
                for case in settings.kafka_cases
                for rate in settings.kafka_targets
            ),
        ]

    def variant_metrics(self, variant: str) -> tuple[Metric, ...]:
        return self.search_metrics if variant in CASES else TARGET_METRICS

    def skip_reason(self, contender: Contender, n: int | None, settings: Settings) -> str | None:
        # Quick (and so the main job, issue 32's 5 minutes): the asyncio and uvloop
        # contenders, whose figures issue 31 set targets for. Each search takes 10 to
        # 13 s, and the trio contenders' two were a tenth of the main job.
        if settings.quick and contender.backend == "trio":
            return "kafka with --quick (and --report) searches on asyncio and uvloop only"
        return None

    def step_seconds(self, settings: Settings) -> float:
        # The mean step of a planned search (planned_steps): its short probes, the
        # long confirmation and a probe per target rate, each with its window and
        # its fresh event loop, pools and collection (about half a second). The
        # short probe's window alone, as it was, put a full run at half its time.
        targets = len(settings.kafka_targets)
        windows = (
            (_SEARCH_STEPS - 1) * settings.kafka_probe
            + settings.kafka_seconds
            + targets * settings.kafka_target_seconds
        )
        return windows / (_SEARCH_STEPS + targets) + 0.5

    def planned_steps(self, settings: Settings, contenders: list[Contender]) -> int:
        per_case = _SEARCH_STEPS + len(settings.kafka_targets)
        return per_case * len(settings.kafka_cases) * len(contenders)

    def pools(self, settings: Settings) -> _Pools:
        # Enough draws for the longest probe at the highest rate, up to _POOL (then
        # cycled): drawing a million of each takes about a second.
        longest = max(settings.kafka_probe, settings.kafka_seconds)
        size = min(_POOL, max(1024, int(settings.kafka_max_rate * longest * 1.2)))
        key = (settings.seed, tuple(settings.kafka_cases), size)
        if self._pools is None or self._pool_key != key:
            self._pools = _pools(settings.seed, tuple(settings.kafka_cases), size)
            self._pool_key = key
        return self._pools

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "timeout_s": TIMEOUT,
            "cases": {c: {"p50_s": CASES[c][0], "p75_s": CASES[c][1]} for c in CASES},
            "probe_s": settings.kafka_probe,
            "sustain_s": settings.kafka_seconds,
            "max_lag_ms": settings.kafka_max_lag * 1e3,
            "aiowheel": "Purgatory",
            "gc": f"gc.freeze() after start-up; gc.set_threshold({GC_YOUNG_THRESHOLD}, ...)",
            "target_rates": list(settings.kafka_targets),
            "target_s": settings.kafka_target_seconds,
            "cpu": "time.process_time() of the whole process over the load",
            "collector": "gc.callbacks: each collection's start to its stop",
        }

    def probe_once(
        self,
        contender: Contender,
        rate: float,
        seconds: float,
        case: str,
        settings: Settings,
        recorder: Any = None,
    ) -> ProbeResult:
        pools = self.pools(settings)

        async def body() -> ProbeResult:
            async with open_env(contender, recorder) as env:
                return await run_probe(env, rate, seconds, case, pools, settings.kafka_max_lag)

        # What docs/purgatory.md advises a server: freeze what start-up left (here the
        # harness: modules, pools, earlier results) so that full collections walk only
        # what the probe allocates, and raise the young generation's threshold so that
        # the bursts of a steady load do not start a collection every few
        # milliseconds. Every contender is probed the same way.
        gc.collect()
        gc.freeze()
        threshold = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *threshold[1:])
        try:
            result: ProbeResult = run_fresh(contender.backend, body)
        finally:
            gc.set_threshold(*threshold)
            gc.unfreeze()
        return result

    def measure(
        self,
        settings: Settings,
        contenders: list[Contender],
        progress: Progress,
        trace: Trace,
        remote: Remote,
    ) -> list[Result]:
        """Search each contender's sustained rate, case by case; returns results."""

        def probe(contender: Contender, rate: float, seconds: float, case: str) -> ProbeResult:
            if not contender.pure:
                return self.probe_once(contender, rate, seconds, case, settings)
            request = {"op": "probe", "workload": self.name, "rate": rate, "seconds": seconds}
            answer = remote(contender, {**request, "case": case})
            return ProbeResult(**{f.name: answer[f.name] for f in fields(ProbeResult)})

        results: list[Result] = []
        params = self.params(settings)
        start = min(settings.kafka_start_rate, settings.kafka_max_rate)
        precision = 1.3 if settings.quick else 1.05
        for case in settings.kafka_cases:
            searches = [_Search(c, start, precision, settings.kafka_max_rate) for c in contenders]
            while not all(s.done for s in searches):
                for search in searches:
                    if search.done:
                        continue
                    seconds = search.probe_seconds(settings)
                    progress(
                        f"kafka {case}: {search.contender.name} {search.phase} "
                        f"{search.rate:,.0f}/s for {seconds:g} s"
                    )
                    result = probe(search.contender, search.rate, seconds, case)
                    search.update(result)
            search_long = (
                settings.kafka_seconds
                if settings.kafka_seconds > settings.kafka_probe
                else math.inf
            )
            for search in searches:
                confirmed = search.confirmed
                probes = [
                    {
                        "rate": round(p.rate),
                        "seconds": p.seconds,
                        "ok": p.ok,
                        "lag_p99_ms": round(p.lag_p99_ms, 3),
                        "backlog_ms": round(p.backlog_ms, 3),
                        "late_p99_ms": round(p.late_p99_ms, 3),
                        "cpu_pct": round(p.cpu_pct, 1),
                    }
                    for p in search.probes
                ]
                extra = {
                    **params,
                    "case": case,
                    "implementation": confirmed.implementation if confirmed else None,
                    "probes": probes,
                }
                passed = [p.rate for p in search.probes if p.ok and p.seconds < search_long]
                values = {
                    "sustained_rps": search.sustained,
                    "probe_rps": max(passed, default=0.0),
                    "late_p99_ms": confirmed.late_p99_ms if confirmed else math.nan,
                    "cpu_pct": confirmed.cpu_pct if confirmed else math.nan,
                }
                results.extend(
                    self.result(
                        metric,
                        search.contender,
                        [values[metric.key]],
                        variant=case,
                        n=None,
                        params=extra,
                    )
                    for metric in self.search_metrics
                )
                traced = trace(f"kafka-{case}", search.contender) if search.sustained else None
                if traced is not None:
                    recorder, _path = traced
                    progress(f"kafka {case}: {search.contender.name} traced probe")
                    self.probe_once(
                        search.contender,
                        search.sustained,
                        min(2.0, settings.kafka_seconds),
                        case,
                        settings,
                        recorder,
                    )
            results.extend(self._at_targets(settings, contenders, case, probe, progress))
        return results

    def _at_targets(
        self,
        settings: Settings,
        contenders: list[Contender],
        case: str,
        probe: Callable[[Contender, float, float, str], ProbeResult],
        progress: Progress,
    ) -> list[Result]:
        """CPU per request and the collector's time at each fixed target rate, every
        contender in turn at each rate (so that drift hits all alike)."""
        results: list[Result] = []
        params = self.params(settings)
        seconds = settings.kafka_target_seconds
        for rate in settings.kafka_targets:
            variant = target_variant(case, rate)
            for contender in contenders:
                progress(f"kafka {case}: {contender.name} at {rate:,.0f}/s for {seconds:g} s")
                p = probe(contender, rate, seconds, case)
                extra = {
                    **params,
                    "case": case,
                    "rate": rate,
                    "implementation": p.implementation,
                    "probe": {
                        "ok": p.ok,
                        "achieved_rps": round(p.achieved),
                        "lag_p99_ms": round(p.lag_p99_ms, 3),
                        "backlog_ms": round(p.backlog_ms, 3),
                        "late_p99_ms": round(p.late_p99_ms, 3),
                        "cpu_s": round(p.cpu_s, 4),
                        "gc_s": round(p.gc_s, 4),
                        "gc_collections": p.gc_collections,
                    },
                }
                # Behind at this rate: saturated below it, so no figure (a CPU per
                # request read while falling behind is not the rate's).
                skipped = None if p.ok else f"fell behind at {rate:,.0f} req/s (saturated)"
                values = {"cpu_s_per_m": p.cpu_s_per_m, "gc_ms_per_s": p.gc_ms_per_s}
                results.extend(
                    self.result(
                        metric,
                        contender,
                        [] if skipped else [values[metric.key]],
                        variant=variant,
                        n=None,
                        params=extra,
                        skipped=skipped,
                    )
                    for metric in TARGET_METRICS
                )
        return results


# -- purgatory: the request cycle -----------------------------------------------------

#: The cycle's timeout: long enough that no request expires while it is measured.
_CYCLE_TIMEOUT = 30.0
_CYCLE_BATCH = 1_000  # requests between two yields to the loop


class _HandRequest:
    """The hand-written purgatory's request: its timeout handle and its key."""

    __slots__ = ("done", "handle", "key")

    def __init__(self, key: int) -> None:
        self.key = key
        self.done = False
        self.handle: Any = None


class Cycle(RepeatedWorkload):
    name = "purgatory"
    quick_step_seconds = 1.3
    title = "purgatory request cycle: new op, watch on one key, complete N requests later"
    metrics = (Metric("cycle_ns", "per request (create + watch + complete)", "ns", "lower"),)
    kinds = frozenset({"aiowheel", "call_later"})

    def default_sizes(self, quick: bool) -> list[int]:
        return [40_000]

    def prepare(self, n: int, rep: int, settings: Settings) -> int:
        # Quick: 120,000 requests, three times round the ring of 40,000 (the steady
        # state: every request completes an older one), in a share of the main job's
        # five minutes in line with the other workloads.
        ops = settings.ops if settings.ops is not None else 120_000 if settings.quick else 400_000
        return max(ops, n + _CYCLE_BATCH)

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "keys": _KEYS,
            "timeout_s": _CYCLE_TIMEOUT,
            "aiowheel": "DelayedOperation subclass; try_complete_else_watch; force_complete",
            "call_later": "call_later + dict of sets; cancel + discard",
        }

    async def run(
        self, env: Env, n: int, data: int, settings: Settings, state: dict[str, float]
    ) -> dict[str, float]:
        ops = data
        checkpoint = env.checkpoint
        perf = time.perf_counter
        ring: list[Any] = [None] * n
        keys = [(i % _KEYS,) for i in range(_KEYS)]
        timeout = _CYCLE_TIMEOUT
        if env.contender.is_aiowheel:
            assert env.timer is not None

            class Operation(aiowheel.DelayedOperation):
                __slots__ = ()

            purgatory = aiowheel.Purgatory(env.timer, name="cycle")
            watch = purgatory.try_complete_else_watch

            def cycle(start: int, stop: int) -> None:
                for i in range(start, stop):
                    slot = i % n
                    old = ring[slot]
                    if old is not None:
                        old.force_complete()
                    op = ring[slot] = Operation(timeout)
                    watch(op, keys[i % _KEYS])

        else:
            call_later = env.call_later
            watchers: dict[int, set[_HandRequest]] = {}

            def expire(request: _HandRequest) -> None:
                if not request.done:
                    request.done = True
                    watchers[request.key].discard(request)

            def cycle(start: int, stop: int) -> None:
                for i in range(start, stop):
                    slot = i % n
                    old = ring[slot]
                    if old is not None and not old.done:
                        old.done = True
                        old.handle.cancel()
                        watchers[old.key].discard(old)
                    key = i % _KEYS
                    request = ring[slot] = _HandRequest(key)
                    request.handle = call_later(timeout, expire, request)
                    watch_set = watchers.get(key)
                    if watch_set is None:
                        watch_set = watchers[key] = set()
                    watch_set.add(request)

        # Warm up: fill the window (N in flight), then time the steady state.
        for start in range(0, n, _CYCLE_BATCH):
            cycle(start, min(n, start + _CYCLE_BATCH))
            await checkpoint()
        gc.collect()
        starts = range(n, n + ops, _CYCLE_BATCH)
        t0 = perf()
        for start in starts:
            cycle(start, start + _CYCLE_BATCH)
            await checkpoint()
        elapsed = perf() - t0
        done = len(starts) * _CYCLE_BATCH
        for request in ring:  # leave nothing pending behind
            if env.contender.is_aiowheel:
                request.force_complete()
            elif not request.done:
                request.handle.cancel()
        return {"cycle_ns": elapsed / done * 1e9}
