"""Fixtures for the trace and analytics tests.

* ``spark``: ONE SparkSession for the whole test session (a JVM start costs 5-10 s):
  local[1], UI off, one shuffle partition, and the C1-only JIT with the serial GC,
  which roughly halve the cold start for jobs this small.
* Tests marked ``spark`` are skipped, with the reason, when pyspark is not importable
  or no Java runtime Spark can use is found; the rest of this directory (the
  recorder, bad inputs) needs neither.
* ``make_trace``: writes a small trace with known values (pyarrow only).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aiowheel.trace import trace_schema

WALL_ANCHOR = 1_700_000_000.0  # a whole Unix second: window edges are easy to reason about
CLOCK_ANCHOR = 100.0


@functools.cache
def _spark_unavailable() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    from aiowheel.analytics.report import java_problem

    return java_problem()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("spark") is not None]
    if not marked:
        return
    reason = _spark_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs Spark: {reason}")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = _spark_unavailable()
    if reason is not None:
        pytest.skip(f"needs Spark: {reason}")
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master("local[1]")
        .appName("aiowheel-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


Row = dict[str, Any]


def trace_row(
    timer_id: int,
    *,
    scheduled_at: float,
    deadline: float,
    fired_at: float | None = None,
    cancelled_at: float | None = None,
    label: str | None = None,
    level: int = 0,
    run_id: str = "run-a",
    implementation: str = "aiowheel",
    backend: str = "asyncio",
    host: str = "test-host",
    pid: int = 4242,
    clock_anchor: float = CLOCK_ANCHOR,
    wall_anchor: float = WALL_ANCHOR,
) -> Row:
    """One trace row, as ParquetRecorder writes it (lateness derived)."""
    return {
        "run_id": run_id,
        "implementation": implementation,
        "backend": backend,
        "host": host,
        "pid": pid,
        "timer_id": timer_id,
        "label": label,
        "level": level,
        "scheduled_at": scheduled_at,
        "deadline": deadline,
        "fired_at": fired_at,
        "cancelled_at": cancelled_at,
        "lateness": None if fired_at is None else fired_at - deadline,
        "clock_anchor": clock_anchor,
        "wall_anchor": wall_anchor,
    }


def write_rows(path: Path, rows: Sequence[Row]) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.Table.from_pylist(list(rows), schema=trace_schema())
    pq.write_table(table, path, compression="zstd")
    return path


@pytest.fixture(scope="session")
def tracegen() -> SimpleNamespace:
    """Helpers for tests (no import of this conftest needed): ``tracegen.row(...)``,
    ``tracegen.write(path, rows)``, ``tracegen.WALL_ANCHOR``, ``tracegen.CLOCK_ANCHOR``."""
    return SimpleNamespace(
        row=trace_row, write=write_rows, WALL_ANCHOR=WALL_ANCHOR, CLOCK_ANCHOR=CLOCK_ANCHOR
    )


@pytest.fixture
def make_trace(tmp_path: Path) -> Callable[..., Path]:
    """``make_trace(rows, name="trace.parquet")`` writes rows under tmp_path/traces."""
    folder = tmp_path / "traces"
    folder.mkdir(exist_ok=True)

    def make(rows: Sequence[Row], name: str = "trace.parquet") -> Path:
        return write_rows(folder / name, rows)

    return make
