"""The kafka workload (aiowheel/bench/kafka.py): the search, and one probe."""

from __future__ import annotations

import json
import math

import pytest
from bench_support import TINY, applicable, results_of, run_json

from aiowheel.bench import cli
from aiowheel.bench.contenders import CONTENDERS
from aiowheel.bench.env import open_env, run_fresh
from aiowheel.bench.kafka import TARGET_METRICS, Cycle, Kafka, ProbeResult, _Search, run_probe
from aiowheel.bench.registry import WORKLOADS
from aiowheel.bench.settings import Settings
from aiowheel.bench.workload import SearchedWorkload


def test_kafka_search(capsys: pytest.CaptureFixture[str]) -> None:
    results = results_of(run_json(capsys, "-w", "kafka", "--kafka-case", "both", *TINY))
    metrics = [m.key for m in Kafka.search_metrics]
    for case in ("high", "low"):
        rows = [r for r in results if r["variant"] == case]
        assert {(r["contender"], r["metric"]) for r in rows} == {
            (c, m) for c in applicable("kafka") for m in metrics
        }
        for row in rows:
            assert row["workload"] == "kafka"
            assert row["n"] is None
            assert row["skipped"] is None
            params = row["params"]
            assert params["case"] == case
            assert params["aiowheel"] == "Purgatory"
            probes = params["probes"]
            assert probes, row["contender"]
            assert probes[0]["rate"] == 2000
            assert all(p["rate"] <= 4000 for p in probes)
            if row["metric"] == "sustained_rps" and row["median"]:
                # The sustained rate is one a probe of --kafka-seconds passed.
                assert any(
                    math.isclose(p["rate"], row["median"], rel_tol=1e-3)
                    and p["ok"]
                    and p["seconds"] == 0.1
                    for p in probes
                )
            if row["metric"] == "sustained_rps":
                # aiowheel always goes through the Purgatory (no fallback).
                kind = next(c.kind for c in CONTENDERS if c.name == row["contender"])
                expected = "purgatory" if kind == "aiowheel" else kind
                assert params["implementation"] in (expected, None)


def test_kafka_reads_cpu_and_the_collector_at_each_target_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Kafka's proposal measured CPU against offered rate, below saturation, and the
    # collector's time (issue 31): one probe per contender at each fixed rate.
    results = results_of(run_json(capsys, "-w", "kafka", *TINY))
    targets = [r for r in results if r["variant"] != "high"]
    assert {r["variant"] for r in targets} == {"high at 2,000 req/s", "high at 3,000 req/s"}
    assert {(r["variant"], r["contender"], r["metric"]) for r in targets} == {
        (v, c, m.key)
        for v in ("high at 2,000 req/s", "high at 3,000 req/s")
        for c in applicable("kafka")
        for m in TARGET_METRICS
    }
    for row in targets:
        params = row["params"]
        assert params["case"] == "high"
        assert params["rate"] in (2000, 3000)
        probe = params["probe"]
        assert probe["gc_collections"] >= 0
        if row["skipped"] is not None:
            # Behind at this rate: no figure, and the probe says why.
            assert not probe["ok"]
            assert row["samples"] == []
            continue
        assert probe["ok"]
        assert probe["cpu_s"] > 0
        (value,) = row["samples"]
        if row["metric"] == "cpu_s_per_m":
            # CPU seconds per million requests: the probe's CPU over its requests.
            assert value > 0
        else:
            assert value >= 0.0
            assert math.isclose(value, probe["gc_s"] / 0.1 * 1e3, rel_tol=0.01, abs_tol=0.05)


def test_a_probe_counts_its_cpu_and_collector_time() -> None:
    settings = Settings(workloads=["kafka"], kafka_probe=0.05, kafka_max_rate=4000.0)
    ours = next(c for c in CONTENDERS if c.name == "aiowheel-asyncio")
    result = Kafka().probe_once(ours, 2000.0, 0.2, "high", settings)
    assert result.cpu_s > 0
    assert result.cpu_s_per_m == pytest.approx(result.cpu_s / result.arrivals * 1e6)
    assert result.gc_ms_per_s == pytest.approx(result.gc_s / 0.2 * 1e3)
    assert result.gc_s >= 0.0
    assert result.gc_collections >= 0


def test_kafka_is_a_searched_workload() -> None:
    kafka = WORKLOADS["kafka"]
    assert isinstance(kafka, SearchedWorkload)
    settings = Settings(workloads=["kafka"], kafka_cases=("high", "low"))
    assert kafka.variants(settings)[:2] == ["high", "low"]
    assert kafka.variants(settings)[2:] == [
        f"{case} at {rate} req/s"
        for case in ("high", "low")
        for rate in ("25,000", "50,000", "100,000")
    ]
    assert kafka.variant_metrics("high") == Kafka.search_metrics
    assert kafka.variant_metrics("low at 25,000 req/s") == TARGET_METRICS
    assert kafka.planned_steps(settings, list(CONTENDERS[:3])) == (8 + 3) * 2 * 3


def test_kafka_plans_the_time_of_its_long_windows() -> None:
    # A search's steps add up to its windows (7 short probes, the long confirmation,
    # a probe per target rate) and half a second of set-up each: a full run's
    # estimate once counted the short probe's window for every step, half the time
    # it took.
    kafka = WORKLOADS["kafka"]
    settings = Settings(workloads=["kafka"], kafka_cases=("high",))
    planned = kafka.planned_steps(settings, list(CONTENDERS[:1])) * kafka.step_seconds(settings)
    windows = 7 * settings.kafka_probe + settings.kafka_seconds + 3 * settings.kafka_target_seconds
    assert planned == pytest.approx(windows + 0.5 * (8 + 3))


def test_probe_uses_the_purgatory_for_aiowheel() -> None:
    settings = Settings(workloads=["kafka"], kafka_probe=0.05, kafka_max_rate=4000.0)
    ours = next(c for c in CONTENDERS if c.name == "aiowheel-asyncio")
    result = Kafka().probe_once(ours, 2000.0, 0.05, "high", settings)
    assert result.implementation == "purgatory"
    assert result.arrivals > 0
    assert result.expired + result.completed <= result.arrivals


def _probe(rate: float, ok: bool, seconds: float = 1.0) -> ProbeResult:
    return ProbeResult(rate, seconds, ok, 0, rate, 0.0, 0.0, 0.0, 0, 0, 50.0, "purgatory")


def test_search_doubles_bisects_then_confirms() -> None:
    search = _Search(CONTENDERS[0], 25_000.0, 1.05, 1_600_000.0)
    search.update(_probe(25_000.0, True))
    assert (search.phase, search.rate) == ("double", 50_000.0)
    search.update(_probe(50_000.0, False))
    assert search.phase == "bisect"
    assert search.rate == pytest.approx(math.sqrt(25_000.0 * 50_000.0))
    while search.phase == "bisect":
        search.update(_probe(search.rate, search.rate < 40_000.0))
    assert search.phase == "confirm"
    assert search.hi / search.lo <= 1.05  # the sustained rate to within 5 %
    # A failed confirmation steps 20 % down with long probes until one holds, then
    # bisects between the long probes to within 5 %.
    first = search.rate
    search.update(_probe(first, False, 10.0))
    assert search.phase == "confirm"
    assert search.rate == pytest.approx(first * 0.8)
    search.update(_probe(search.rate, False, 10.0))
    assert search.rate == pytest.approx(first * 0.64)
    holds = first * 0.7  # what a long probe holds
    while not search.done:
        search.update(_probe(search.rate, search.rate <= holds, 10.0))
    assert holds / 1.05 <= search.sustained <= holds
    assert search.confirmed is not None
    assert search.confirmed.ok
    assert search.tries <= 10


def test_a_first_confirmation_that_holds_ends_the_search() -> None:
    search = _Search(CONTENDERS[0], 25_000.0, 1.05, 1_600_000.0)
    search.phase, search.lo, search.hi, search.rate = "confirm", 40_000.0, 41_000.0, 40_000.0
    search.update(_probe(40_000.0, True, 10.0))
    assert search.done
    assert search.sustained == 40_000.0


def test_a_search_where_nothing_holds_reports_zero() -> None:
    search = _Search(CONTENDERS[0], 25_000.0, 1.05, 1_600_000.0)
    search.phase, search.lo, search.rate = "confirm", 40_000.0, 40_000.0
    while not search.done:
        search.update(_probe(search.rate, False, 10.0))
    assert search.sustained == 0.0
    assert search.confirmed is not None
    assert not search.confirmed.ok


def test_the_purgatory_cycle_runs_for_both_kinds() -> None:
    settings = Settings(workloads=["purgatory"], ops=2_000)
    cycle = Cycle()
    data = cycle.prepare(1_000, 0, settings)
    for name in ("aiowheel-asyncio", "call_later-asyncio"):
        contender = next(c for c in CONTENDERS if c.name == name)
        values = cycle.repetition(contender, 1_000, data, settings, {})
        assert values["cycle_ns"] > 0


def test_kafka_quick_searches_on_asyncio_and_uvloop_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The main job's 5 minutes (issue 32): with --quick (and so --report) the trio
    # contenders sit out the search, listed as skipped and why, in every variant.
    argv = ["-w", "kafka", "--quick", "-c", "aiowheel-asyncio,trio-native", *TINY]
    results = results_of(run_json(capsys, *argv))
    assert {r["contender"] for r in results if r["skipped"] is None} == {"aiowheel-asyncio"}
    skipped = [r for r in results if r["contender"] == "trio-native"]
    assert {r["variant"] for r in skipped} == {
        "high",
        "high at 2,000 req/s",
        "high at 3,000 req/s",
    }
    assert all("asyncio and uvloop only" in r["skipped"] for r in skipped)
    # Without --quick every contender is searched.
    full = Settings(workloads=["kafka"], quick=False)
    trio = next(c for c in CONTENDERS if c.name == "trio-native")
    assert Kafka().skip_reason(trio, None, full) is None


@pytest.mark.parametrize("contender", ["call_later-asyncio", "aiowheel-asyncio"])
def test_a_probe_never_sleeps_past_its_window(contender: str) -> None:
    # A rate this low has its next arrival days away: the probe waited for it (1/rate
    # seconds), past its window's end, for ever. Every wait now ends by the window's end.
    spec = next(c for c in CONTENDERS if c.name == contender)
    seconds = 0.05
    settings = Settings(workloads=["kafka"], kafka_max_rate=1.0, kafka_probe=seconds)
    pools = Kafka().pools(settings)
    waits: list[float] = []

    async def body() -> ProbeResult:
        async with open_env(spec) as env:
            real_sleep = env.sleep

            async def sleep(delay: float) -> None:
                waits.append(delay)
                assert delay <= seconds, f"slept {delay:g} s in a {seconds:g} s window"
                await real_sleep(delay)

            env.sleep = sleep
            return await run_probe(env, 1e-6, seconds, "high", pools, 0.05)

    result: ProbeResult = run_fresh("asyncio", body)
    assert waits
    assert result.arrivals == 0
    assert result.seconds == seconds


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--kafka-targets", "0.000001"],
            "--kafka-targets: 1e-06 req/s expects fewer than one request in its 3 s window "
            "(--kafka-target-seconds): give at least 1 req/s",
        ),
        (
            ["--kafka-rates", "0.000001,0.000001"],
            "--kafka-rates: 1e-06 req/s expects fewer than one request in its 1 s window "
            "(--kafka-probe): give at least 1 req/s",
        ),
        (
            ["--kafka-targets", "25000,1", "--kafka-target-seconds", "0.1"],
            "--kafka-targets: 1 req/s expects fewer than one request in its 0.1 s window "
            "(--kafka-target-seconds): give at least 10 req/s",
        ),
        (
            ["--quick", "--kafka-rates", "2,4"],
            "--kafka-rates: 2 req/s expects fewer than one request in its 0.3 s window "
            "(--kafka-probe): give at least 4 req/s",
        ),
    ],
)
def test_a_rate_with_no_request_in_its_window_is_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["-w", "kafka", *args]) == 2
    assert capsys.readouterr().err == f"aiowheel bench: error: {message}\n"


def test_a_low_rate_with_a_request_in_its_window_runs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["-w", "kafka", "-c", "call_later-asyncio", "--kafka-rates", "20,20"]
    args += ["--kafka-probe", "0.1", "--kafka-seconds", "0.1", "--kafka-targets", "none"]
    assert cli.main([*args, "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-1]["type"] == "end"
    probes = next(r for r in lines if r["type"] == "result")["params"]["probes"]
    assert {p["rate"] for p in probes} == {20}
