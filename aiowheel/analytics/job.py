"""The Spark pipeline behind ``aiowheel report``: aggregations over timer traces.

``run_job`` is the pipeline, as the command line (``aiowheel.analytics.report``) and
the tests run it: read the traces, the summary per run and label, the counts per
second, collected to the driver as pandas frames. It writes no file and prints
nothing. ``spark-submit`` runs the command line through ``aiowheel/analytics/submit.py``.

Only built-in Spark SQL functions are used, no Python UDFs, so executors need nothing
but Spark: Python runs on the driver only, which collects the (small) aggregates.

Definitions (documented in docs/analytics.md):

* lateness = fired_at - deadline, for fired timers only; a timer with lateness < 0
  fired early (counted as ``early``);
* an impossible row (ended before it was scheduled, or fired more than
  ``IMPOSSIBLY_EARLY_S`` early: a recording bug) is counted as ``impossible`` and left
  out of the lateness and lifetime figures;
* lifetime = (fired_at or cancelled_at) - scheduled_at;
* percentile p of a group = the smallest value v such that at least a fraction p of
  the group's values are <= v (nearest rank), computed with ``percentile_approx`` at a
  relative rank error of 1/accuracy: exact on groups of up to accuracy/2 values;
* per-second windows are Unix seconds (UTC), from ``wall_anchor + (t - clock_anchor)``
  so that runs of different processes and hosts line up;
* a run's ``contender`` and ``workload`` are named by ``schema.contender_name`` and
  ``schema.workload_names``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aiowheel.trace import TRACE_COLUMNS

from .inputs import TraceFiles, TraceInputError, schema_problem
from .schema import (
    ACCURACY,
    CDF_QUANTILES,
    IMPOSSIBLY_EARLY_S,
    LIFETIME_QUANTILES,
    RUN_KEYS,
    SUMMARY_KEYS,
    SUMMARY_QUANTILES,
    WINDOW_ACCURACY,
    contender_name,
    contender_order,
    workload_names,
)

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "JobResult",
    "Step",
    "collect_summary",
    "collect_windows",
    "name_runs",
    "read_traces",
    "run_job",
    "summary_frame",
    "trace_ddl",
    "windows_frame",
]

#: ``step(description)``: a context around each stage of the job (progress display).
Step = Callable[[str], AbstractContextManager[None]]

_SPARK_TYPES: Final = {
    "string": "string",
    "int8": "tinyint",
    "int32": "int",
    "int64": "bigint",
    "double": "double",
}
_ARROW_NAMES: Final = {
    "string": "string",
    "tinyint": "int8",
    "int": "int32",
    "bigint": "int64",
    "double": "double",
}


def trace_ddl() -> str:
    """The trace schema as a Spark DDL string."""
    return ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind in TRACE_COLUMNS.items())


@dataclass(frozen=True)
class JobResult:
    """The collected aggregates."""

    summary: pd.DataFrame  #: one row per (run, label); ``lateness_cdf`` holds CDF_QUANTILES
    windows: pd.DataFrame  #: one row per (run, second), gaps filled with zero counts
    rows: int  #: trace rows read


def read_traces(spark: SparkSession, files: TraceFiles) -> DataFrame:
    """All traces as one DataFrame with exactly the trace columns."""
    frames: list[DataFrame] = []
    if files.local:
        # Checked already (inputs.find_traces), so the schema is given, not inferred:
        # no footer is read twice. file:// URIs: on a cluster whose default file
        # system is HDFS, a bare path would mean an HDFS path.
        uris = [_file_uri(path) for path in files.local]
        frames.append(spark.read.schema(trace_ddl()).parquet(*uris))
    for path in files.remote:
        frame = spark.read.parquet(path)
        types = {f.name: _ARROW_NAMES.get(f.dataType.simpleString(), "?") for f in frame.schema}
        problem = schema_problem(types)
        if problem:
            raise TraceInputError(f"{path}: not an aiowheel trace: {problem}")
        frames.append(frame.select(*TRACE_COLUMNS))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _file_uri(path: str) -> str:
    from pathlib import Path

    return Path(path).absolute().as_uri()


def _ended_at() -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.col("fired_at"), F.col("cancelled_at"))


def _to_unix(column: Column) -> Column:
    from pyspark.sql import functions as F

    return column + (F.col("wall_anchor") - F.col("clock_anchor"))


def _impossible() -> Column:
    """A row no timer can have made: ended before it was scheduled, or fired more than
    IMPOSSIBLY_EARLY_S before its deadline (a recording bug; event loops fire at most a
    clock tick early, 1 ms on uvloop)."""
    from pyspark.sql import functions as F

    return F.coalesce(
        (_ended_at() < F.col("scheduled_at")) | (F.col("lateness") < -IMPOSSIBLY_EARLY_S),
        F.lit(False),
    )


def _lateness() -> Column:
    """The lateness of a fired timer, null on an impossible row (counted, not drawn)."""
    from pyspark.sql import functions as F

    return F.when(~_impossible(), F.col("lateness"))


def summary_frame(traces: DataFrame, accuracy: int = ACCURACY) -> DataFrame:
    """Per run and label: counts (early and impossible rows too), cancel ratio,
    lateness and lifetime percentiles (impossible rows left out of these)."""
    from pyspark.sql import functions as F

    lifetime = F.when(~_impossible(), _ended_at() - F.col("scheduled_at"))
    lateness = _lateness()
    grouped = traces.groupBy(*SUMMARY_KEYS).agg(
        F.count(F.lit(1)).alias("scheduled"),
        F.count("fired_at").alias("fired"),
        F.count("cancelled_at").alias("cancelled"),
        F.count(F.when(lateness < 0, 1)).alias("early"),
        F.count(F.when(_impossible(), 1)).alias("impossible"),
        F.percentile_approx(lateness, list(CDF_QUANTILES), accuracy).alias("lateness_cdf"),
        F.max(lateness).alias("lateness_max"),
        F.avg(lateness).alias("lateness_mean"),
        F.percentile_approx(lifetime, list(LIFETIME_QUANTILES.values()), accuracy).alias(
            "lifetime_q"
        ),
        F.max(lifetime).alias("lifetime_max"),
        F.avg(lifetime).alias("lifetime_mean"),
        F.min(_to_unix(F.col("scheduled_at"))).alias("first_scheduled"),
        F.max(_to_unix(_ended_at())).alias("last_ended"),
    )
    ms = 1000.0
    columns: list[Column | str] = [
        *SUMMARY_KEYS,
        "scheduled",
        "fired",
        "cancelled",
        "early",
        "impossible",
        (F.col("cancelled") / F.col("scheduled")).alias("cancel_ratio"),
    ]
    for name, q in SUMMARY_QUANTILES.items():
        index = CDF_QUANTILES.index(q)
        columns.append((F.col("lateness_cdf")[index] * ms).alias(f"lateness_{name}_ms"))
    columns += [
        (F.col("lateness_max") * ms).alias("lateness_max_ms"),
        (F.col("lateness_mean") * ms).alias("lateness_mean_ms"),
    ]
    for i, name in enumerate(LIFETIME_QUANTILES):
        columns.append(F.col("lifetime_q")[i].alias(f"lifetime_{name}_s"))
    columns += [
        F.col("lifetime_max").alias("lifetime_max_s"),
        F.col("lifetime_mean").alias("lifetime_mean_s"),
        F.col("first_scheduled").alias("start_unix"),
        (F.col("last_ended") - F.col("first_scheduled")).alias("duration_s"),
        "lateness_cdf",
    ]
    return grouped.select(*columns)


def windows_frame(traces: DataFrame) -> DataFrame:
    """Per run and Unix second: timers scheduled, fired and cancelled, lateness p99.

    A timer counts as scheduled in the second of its ``scheduled_at`` and as fired or
    cancelled in the second it ended, so the two sides are grouped separately and
    joined on (run, second).
    """
    from pyspark.sql import functions as F

    run: list[Column | str] = [*RUN_KEYS, F.floor("wall_anchor").alias("run_start")]
    scheduled = traces.groupBy(*run, F.floor(_to_unix(F.col("scheduled_at"))).alias("epoch_s")).agg(
        F.count(F.lit(1)).alias("scheduled")
    )
    ended = traces.groupBy(*run, F.floor(_to_unix(_ended_at())).alias("epoch_s")).agg(
        F.count("fired_at").alias("fired"),
        F.count("cancelled_at").alias("cancelled"),
        F.percentile_approx(_lateness(), 0.99, WINDOW_ACCURACY).alias("lateness_p99"),
    )
    keys = [*RUN_KEYS, "run_start", "epoch_s"]
    joined: DataFrame = scheduled.join(ended, keys, "full_outer").na.fill(
        0, ["scheduled", "fired", "cancelled"]
    )
    return joined.select(
        *RUN_KEYS,
        "run_start",
        "epoch_s",
        "scheduled",
        "fired",
        "cancelled",
        (F.col("lateness_p99") * 1000.0).alias("lateness_p99_ms"),
    )


def collect_summary(traces: DataFrame, accuracy: int = ACCURACY) -> pd.DataFrame:
    """Run the summary aggregation and bring it to the driver, sorted."""
    frame = _to_pandas(summary_frame(traces, accuracy))
    frame = frame.sort_values(
        ["implementation", "backend", "run_id", "label"], na_position="first", kind="stable"
    )
    return frame.reset_index(drop=True)


def collect_windows(traces: DataFrame) -> pd.DataFrame:
    """Run the per-second aggregation and bring it to the driver.

    Seconds of a run in which nothing happened are filled in (zero counts, no
    lateness), so that plots and sums over a time range need no special case.
    """
    import pandas as pd

    frame = _to_pandas(windows_frame(traces))
    columns = [*RUN_KEYS, "second", "elapsed_s", "scheduled", "fired", "cancelled"]
    parts = []
    for _, group in frame.groupby([*RUN_KEYS, "run_start"], sort=True, dropna=False):
        first, last = int(group["epoch_s"].min()), int(group["epoch_s"].max())
        filled = group.set_index("epoch_s").reindex(range(first, last + 1))
        for key in (*RUN_KEYS, "run_start"):
            filled[key] = group[key].iloc[0]
        for count in ("scheduled", "fired", "cancelled"):
            filled[count] = filled[count].fillna(0)
        parts.append(filled.reset_index(names="epoch_s"))
    if not parts:
        return pd.DataFrame(columns=[*columns, "lateness_p99_ms"])
    out = pd.concat(parts, ignore_index=True)
    out["second"] = pd.to_datetime(out["epoch_s"], unit="s", utc=True)
    out["elapsed_s"] = out["epoch_s"] - out["run_start"]
    for count in ("elapsed_s", "scheduled", "fired", "cancelled"):
        out[count] = out[count].astype("int64")
    return out[[*columns, "lateness_p99_ms"]]


def _to_pandas(frame: DataFrame) -> pd.DataFrame:
    return frame.toPandas()


def name_runs(summary: pd.DataFrame, windows: pd.DataFrame) -> None:
    """Add ``contender`` and ``workload`` columns to both frames (in place), named once
    for all runs so that the two frames agree."""
    for frame in (summary, windows):
        pairs = zip(frame["implementation"], frame["backend"], strict=True)
        frame.insert(0, "contender", [contender_name(i, b) for i, b in pairs])
    runs = dict(zip(summary["run_id"], summary["contender"], strict=True))
    runs.update(zip(windows["run_id"], windows["contender"], strict=True))
    workloads = workload_names(runs.items())
    for frame in (summary, windows):
        frame.insert(0, "workload", [workloads[run] for run in frame["run_id"]])


def _by_workload(frame: pd.DataFrame) -> pd.DataFrame:
    """Sorted by workload, then the contenders in the bench's order, run and label."""
    rank = {name: i for i, name in enumerate(contender_order(frame["contender"]))}
    keys = ["workload", "contender", "run_id", "label" if "label" in frame else "elapsed_s"]
    ordered = frame.sort_values(
        keys,
        key=lambda column: column.map(rank) if column.name == "contender" else column,
        na_position="first",
        kind="stable",
    )
    return ordered.reset_index(drop=True)


def _no_step(description: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def run_job(
    spark: SparkSession, files: TraceFiles, accuracy: int = ACCURACY, step: Step = _no_step
) -> JobResult:
    """The whole pipeline: everything the report needs, as pandas frames.

    Raises ``TraceInputError`` for a remote path that is not a trace and for traces
    without rows; Spark's own exceptions otherwise.
    """
    with step("reading traces"):
        traces = read_traces(spark, files)
    with step("summary per run and label"):
        summary = collect_summary(traces, accuracy)
    rows = int(summary["scheduled"].sum())
    if rows == 0:
        raise TraceInputError(f"{', '.join(files.paths)}: empty trace (no rows)")
    with step("timers per second"):
        windows = collect_windows(traces)
    name_runs(summary, windows)
    return JobResult(_by_workload(summary), _by_workload(windows), rows)
