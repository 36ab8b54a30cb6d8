"""The ``tracing`` workload (aiowheel/bench/tracing.py): a traced and an untraced timer
in one event loop. Tiny sizes; no speed is asserted (tests/bench/bench_support.py)."""

from __future__ import annotations

import pytest
from bench_support import TINY, results_of, run_json

from aiowheel.bench.contenders import CONTENDERS, Contender
from aiowheel.bench.registry import DEFAULT_WORKLOADS, WORKLOADS
from aiowheel.bench.settings import Settings
from aiowheel.bench.tracing import Tracing


def _contender(name: str) -> Contender:
    return next(c for c in CONTENDERS if c.name == name)


@pytest.mark.parametrize("name", ["aiowheel-asyncio", "aiowheel-trio"])
def test_a_repetition_times_both_timers_on_the_same_operations(name: str) -> None:
    tracing = WORKLOADS["tracing"]
    assert isinstance(tracing, Tracing)
    settings = Settings(workloads=["tracing"], ops=2_500)
    data = tracing.prepare(200, 0, settings)
    # Batches of 1,000 pairs and bursts of at most 5,000 timers, the last one short.
    assert [len(batch) for batch in data.pairs] == [1_000, 1_000, 500]
    assert [len(burst) for burst in data.bursts] == [2_500]
    assert all(0.0 <= offset <= 0.020 for offset in data.bursts[0])
    values = tracing.repetition(_contender(name), 200, data, settings, {})
    # The traced timer wrote a row per cancelled pair, per firing and per timer its
    # close cancelled; the untraced one none (it has no recorder).
    assert values["_rows"] == 2_500 + 2_500 + 200
    for figure in ("pair", "fire"):
        assert values[f"{figure}_ns"] > 0
        assert values[f"traced_{figure}_ns"] > 0
        added = values[f"traced_{figure}_ns"] - values[f"{figure}_ns"]
        assert values[f"{figure}_added_ns"] == pytest.approx(added)


def test_it_is_opt_in_and_for_untraced_aiowheel_only() -> None:
    tracing = WORKLOADS["tracing"]
    assert "tracing" not in DEFAULT_WORKLOADS
    assert not tracing.traced  # --trace adds no run: it traces a timer of its own
    runs = {c.name for c in CONTENDERS if tracing.applies_to(c)}
    assert {"aiowheel-asyncio", "aiowheel-uvloop", "aiowheel-trio"} <= runs
    assert not {c.name for c in CONTENDERS if not c.is_aiowheel or c.kind == "loop"} & runs
    settings = Settings(workloads=["tracing"])
    assert tracing.skip_reason(_contender("aiowheel-asyncio-traced"), 300, settings)
    assert tracing.skip_reason(_contender("aiowheel-trio-sampled"), 300, settings)
    assert tracing.skip_reason(_contender("aiowheel-asyncio"), 300, settings) is None


def test_the_command_line_reports_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_json(capsys, "-w", "tracing", "-c", "aiowheel-asyncio", *TINY)
    results = results_of(lines)
    assert {row["metric"] for row in results} == {m.key for m in WORKLOADS["tracing"].metrics}
    for row in results:
        assert row["contender"] == "aiowheel-asyncio"
        assert row["skipped"] is None
        assert len(row["samples"]) == 2
        assert row["params"]["clock"] == "the event loop thread's CPU time"
