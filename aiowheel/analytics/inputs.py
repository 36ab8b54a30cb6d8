"""Finding and checking trace files before Spark starts.

Every check here reads Parquet footers only (pyarrow), so a bad input is reported in
a fraction of a second, with the file's name, instead of as a JVM stack trace after a
10-second Spark start. Paths with a URI scheme (``hdfs://``, ``s3a://``...) cannot be
listed from here; they go to Spark unchecked and the job checks their schema there.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..trace import RUN_ID_KEY, TRACE_COLUMNS, dropped_rows, sample_every
from .schema import SUMMARY_PARQUET, WINDOWS_PARQUET

__all__ = [
    "Completeness",
    "TraceFiles",
    "TraceInputError",
    "check_trace_file",
    "completeness_lines",
    "completeness_of",
    "find_traces",
    "is_remote",
    "not_regular",
    "sampling_lines",
    "schema_problem",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

_REPORT_TABLES = (SUMMARY_PARQUET, WINDOWS_PARQUET)

# Arrow types that Parquet stores identically, so Spark reads them the same way.
_SAME_IN_PARQUET = {"large_string": "string", "large_utf8": "string", "utf8": "string"}


class TraceInputError(Exception):
    """A bad input: the message is one line that names the file and what is wrong."""


@dataclass(frozen=True)
class Completeness:
    """What one trace file says about itself: its run, the rows it holds, how many
    rows its recorder dropped (None: the file does not say, written before the count
    existed or by another writer), and the sampling: the trace keeps one timer in
    ``sample_every`` (1: every timer; also when the file does not say)."""

    file: str
    run_id: str | None
    rows: int
    dropped: int | None
    sample_every: int = 1


@dataclass(frozen=True)
class TraceFiles:
    """What the job will read: checked local files, and remote paths left to Spark."""

    local: tuple[str, ...]
    remote: tuple[str, ...]
    rows: int  #: rows in the local files (remote ones are counted by Spark)
    #: One ``Completeness`` per local file, in ``local``'s order: what its footer says
    #: about rows its recorder dropped.
    completeness: tuple[Completeness, ...] = ()

    @property
    def paths(self) -> list[str]:
        return [*self.local, *self.remote]


def is_remote(path: str) -> bool:
    """A URI Spark resolves itself (``hdfs://``, ``s3a://``...); ``file://`` is local."""
    return bool(_SCHEME.match(path)) and not path.startswith("file://")


def find_traces(paths: Sequence[str]) -> TraceFiles:
    """Expand directories to the ``*.parquet`` files below them and check each file.

    Hidden files and those starting with ``_`` are skipped, as Spark skips them (a
    recorder writes under a hidden name until it closes). Raises ``TraceInputError``.
    """
    if not paths:
        raise TraceInputError("no trace files given")
    local: dict[str, None] = {}  # ordered set: a file named twice is read once
    remote: dict[str, None] = {}
    for raw in paths:
        if is_remote(raw):
            remote[raw] = None
            continue
        path = Path(raw.removeprefix("file://"))
        if path.is_dir():
            found = sorted(_parquet_files(path))
            if not found:
                raise TraceInputError(f"{raw}: no Parquet files (*.parquet) in this directory")
            for file in found:
                problem = not_regular(file)  # named as found, not as what it links to
                if problem:
                    raise TraceInputError(f"{file}: {problem}")
                local[str(file.resolve())] = None
        else:
            problem = not_regular(path)
            if problem:
                raise TraceInputError(f"{raw}: {problem}")
            local[str(path.resolve())] = None
    completeness = tuple(completeness_of(file, check_trace_file(file)) for file in local)
    rows = sum(c.rows for c in completeness)
    return TraceFiles(tuple(local), tuple(remote), rows, completeness)


def completeness_of(file: str, rows: int) -> Completeness:
    """What the footer of ``file`` (a checked trace of ``rows`` rows) says about rows
    its recorder dropped (``aiowheel.trace.DROPPED_ROWS_KEY``) and its sampling
    (``aiowheel.trace.SAMPLE_EVERY_KEY``)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    metadata = pq.read_metadata(file).metadata
    run = (metadata or {}).get(RUN_ID_KEY.encode())
    run_id = run.decode("utf-8", "replace") if run is not None else None
    return Completeness(file, run_id, rows, dropped_rows(metadata), sample_every(metadata))


def _backticked(text: str) -> str:
    return f"`{text}`"


def completeness_lines(
    files: TraceFiles, *, unknown: bool = True, code: Callable[[str], str] = _backticked
) -> list[str]:
    """One line per run whose trace is incomplete or (``unknown``) does not say; empty
    when every trace says it is complete. ``aiowheel report`` prints the incomplete
    ones as warnings; report.md lists them all (``code`` quotes a run id or a file:
    report.md's escapes what Markdown would read)."""
    lines = []
    for c in files.completeness:
        run = f"run {code(c.run_id)}" if c.run_id else code(str(c.file))
        if c.dropped is None:
            if not unknown:
                continue
            lines.append(f"{run}: the trace does not say whether rows were dropped")
        elif c.dropped:
            share = c.dropped / (c.rows + c.dropped)
            traced = "traced timers" if c.sample_every > 1 else "timers"
            lines.append(
                f"{run}: {c.dropped:,} rows dropped ({share:.1%} of its {traced}; {c.rows:,} kept)"
            )
    return lines


def sampling_lines(files: TraceFiles, code: Callable[[str], str] = _backticked) -> list[str]:
    """One line per run whose trace is sampled (keeps one timer in k, k > 1); empty
    when every trace keeps every timer. ``aiowheel report`` prints them as notes and
    report.md lists them at the top, so that no count is read as the run's whole."""
    lines = []
    for c in files.completeness:
        if c.sample_every > 1:
            run = f"run {code(c.run_id)}" if c.run_id else code(str(c.file))
            lines.append(
                f"{run}: sampled, one timer in {c.sample_every:,} "
                f"({c.rows:,} rows stand for about {c.rows * c.sample_every:,} timers)"
            )
    return lines


def _parquet_files(root: Path) -> Iterable[Path]:
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith((".", "_"))]
        for name in files:
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                yield Path(directory, name)


def not_regular(path: Path) -> str | None:
    """Why ``path`` cannot be a trace file before it is opened, or None.

    Opening a FIFO would wait for a writer for ever, and a device may never end: only
    regular files (or symbolic links to them) are opened.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return "a symbolic link to nothing"
        return "no such file or directory"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "not a regular file (a FIFO)"
    if stat.S_ISSOCK(mode):
        return "not a regular file (a socket)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "not a regular file (a device)"
    return "not a file or directory"


def check_trace_file(file: str) -> int:
    """The number of rows of a trace file; ``TraceInputError`` if it is not one."""
    import pyarrow.parquet as pq

    problem = not_regular(Path(file))
    if problem:
        raise TraceInputError(f"{file}: {problem}")
    if not os.access(file, os.R_OK):
        raise TraceInputError(f"{file}: cannot be read (permission denied)")
    try:
        metadata = pq.read_metadata(file)
        schema = pq.read_schema(file)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError...: all mean "not Parquet"
        raise TraceInputError(f"{file}: not a Parquet file ({first_line(exc)})") from None
    problem = schema_problem({field.name: str(field.type) for field in schema})
    if problem:
        hint = ""
        if Path(file).name in _REPORT_TABLES and "run_id" in schema.names:
            hint = " (it looks like a report's own table: keep reports out of trace directories)"
        raise TraceInputError(f"{file}: not an aiowheel trace: {problem}{hint}")
    rows: int = metadata.num_rows
    if rows == 0:
        raise TraceInputError(f"{file}: empty trace (no rows)")
    return rows


def schema_problem(types: dict[str, str]) -> str | None:
    """What is wrong with a schema (column -> Arrow type name), or None if it is a trace."""
    missing = [name for name in TRACE_COLUMNS if name not in types]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        return f"missing column{plural} {', '.join(missing)}"
    for name, expected in TRACE_COLUMNS.items():
        found = _SAME_IN_PARQUET.get(types[name], types[name])
        if found != expected:
            return f"column {name} is {types[name]}, expected {expected}"
    return None


def first_line(exc: BaseException) -> str:
    """An exception's message in one line, for the one-line errors of the report."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
