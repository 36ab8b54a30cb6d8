"""The Spark job behind ``aiowheel report``: aggregations over timer traces.

Runs three ways, with the same command line (see ``aiowheel report --help``):

* ``aiowheel report TRACES... --out DIR [--master URL]`` (local[*] by default);
* ``python -m aiowheel.analytics.job TRACES... --out DIR``;
* ``spark-submit --master local[2] .../aiowheel/analytics/job.py TRACES... --out DIR``,
  or any cluster master: ``spark-submit`` (or ``--master``) decides where it runs,
  nothing here calls ``.master()`` on its own.

Only built-in Spark SQL functions are used, no Python UDFs, so executors need nothing
but Spark: Python runs on the driver only, which collects the (small) aggregates and
writes every output file itself.

Definitions (documented in docs/analytics.md):

* lateness = fired_at - deadline, for fired timers only;
* lifetime = (fired_at or cancelled_at) - scheduled_at;
* percentile p of a group = the smallest value v such that at least a fraction p of
  the group's values are <= v (nearest rank), computed with ``percentile_approx`` at a
  relative rank error of 1/accuracy: exact on groups of up to accuracy/2 values;
* per-second windows are Unix seconds (UTC), from ``wall_anchor + (t - clock_anchor)``
  so that runs of different processes and hosts line up.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aiowheel.analytics.inputs import TraceFiles, TraceInputError, schema_problem
from aiowheel.trace import TRACE_COLUMNS

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "ACCURACY",
    "CDF_QUANTILES",
    "RUN_KEYS",
    "SUMMARY_KEYS",
    "SUMMARY_QUANTILES",
    "JobResult",
    "collect_summary",
    "collect_windows",
    "read_traces",
    "run_job",
    "summary_frame",
    "windows_frame",
]

#: A run is one recorder: these columns are constant within it.
RUN_KEYS: Final = ("run_id", "implementation", "backend", "host")
#: The summary has one row per run and label.
SUMMARY_KEYS: Final = (*RUN_KEYS, "label")
#: Lateness percentiles in the summary: column suffix -> quantile.
SUMMARY_QUANTILES: Final = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
#: Lifetime percentiles in the summary.
LIFETIME_QUANTILES: Final = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
#: Points of the lateness CDF plot: fine where the tail is (p99 and beyond).
CDF_QUANTILES: Final[tuple[float, ...]] = tuple(
    sorted(
        {round(i / 100, 6) for i in range(101)}
        | {round(0.99 + i / 1000, 6) for i in range(10)}
        | {round(0.999 + i / 10_000, 6) for i in range(10)}
        | {round(0.9999 + i / 100_000, 6) for i in range(10)}
        | set(SUMMARY_QUANTILES.values())
    )
)
#: percentile_approx's default accuracy: relative rank error 1e-4 (exact on groups of
#: up to 5,000 values). `aiowheel report --accuracy 100000` trades time for 1e-5
#: (measured on 10M rows: about 2.5x the summary's time).
ACCURACY: Final = 10_000
#: Per-second lateness p99.
WINDOW_ACCURACY: Final = 10_000

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


def summary_frame(traces: DataFrame, accuracy: int = ACCURACY) -> DataFrame:
    """Per run and label: counts, cancel ratio, lateness and lifetime percentiles."""
    from pyspark.sql import functions as F

    lifetime = _ended_at() - F.col("scheduled_at")
    grouped = traces.groupBy(*SUMMARY_KEYS).agg(
        F.count(F.lit(1)).alias("scheduled"),
        F.count("fired_at").alias("fired"),
        F.count("cancelled_at").alias("cancelled"),
        F.percentile_approx("lateness", list(CDF_QUANTILES), accuracy).alias("lateness_cdf"),
        F.max("lateness").alias("lateness_max"),
        F.avg("lateness").alias("lateness_mean"),
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
        F.percentile_approx("lateness", 0.99, WINDOW_ACCURACY).alias("lateness_p99"),
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


def run_job(spark: SparkSession, files: TraceFiles, accuracy: int = ACCURACY) -> JobResult:
    """Everything the report needs, as pandas frames (no progress, no files)."""
    traces = read_traces(spark, files)
    summary = collect_summary(traces, accuracy)
    windows = collect_windows(traces)
    return JobResult(summary, windows, int(summary["scheduled"].sum()))


def _main() -> int:
    # spark-submit runs this file as __main__: the command line is report's.
    from aiowheel.analytics.report import main

    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(_main())
