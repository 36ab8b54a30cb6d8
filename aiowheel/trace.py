"""Timer traces: one Parquet row per timer when it ends (fired or cancelled).

Attach a recorder to a timer::

    from aiowheel import Timer
    from aiowheel.trace import ParquetRecorder

    async with Timer(recorder=ParquetRecorder("traces/")) as timer:
        ...

and analyse the files with ``aiowheel report traces/ --out report/`` (see
docs/analytics.md). ``recording(path, **kw)`` is the same as
``ParquetRecorder(path, **kw)``.

Sampling for production: ``ParquetRecorder(path, every=k)`` traces one timer in k,
chosen when it is scheduled (the 1st, the k+1-th...); the others are plain handles
that pay nothing for tracing. The rate is in the file's footer (``SAMPLE_EVERY_KEY``)
and ``aiowheel report`` states it.

How the work is split, so that the event loop never waits for the disk:

* A timer does not call ``record()``: its compiled core (``aiowheel._tracing``)
  stores each row in seven preallocated column lists, the trace's own columns, and,
  every ``batch_rows`` rows, hands them whole to ``take_columns()``, which queues
  them (or drops and counts them when the queue is full) and hands back written
  lists to fill again. The writer turns each list into an Arrow array with one call
  (``struct.pack``, about 10 ns per value, or ``pa.array``), holding the GIL, and
  empties the lists before handing them back (so the loop never frees a cold
  value). It makes one Arrow kernel call per batch: each releases the GIL, and a
  writer thread wins it back from a busy event loop only after a switch interval
  (5 ms), so a dozen of them per batch left it far behind a busy loop; and when
  the writer is behind, the loop gives it the GIL for one stint (``_hand_over``).
  Measured with
  ``aiowheel bench -c aiowheel-asyncio,aiowheel-asyncio-traced`` and in CPU time
  (docs/analytics.md, "Benchmarks of the pipeline itself"): the event loop's cost
  per traced timer is about half of what one ``record()`` call per row cost.
* ``record()`` (the protocol's call, for rows from elsewhere: the benchmarks'
  ``call_later`` and trio baselines) runs on the event loop, once per timer. It
  packs the row's numbers into the next 48-byte slot of a preallocated buffer (one
  ``struct.pack_into``: no Python object outlives the call), puts the label in a
  preallocated list and, when the chunk is full, hands the chunk to a bounded
  queue. That is all it does.
* A writer thread takes chunks off the queue and turns each into an Arrow record
  batch (one row group) without going through Python objects: the buffer is viewed
  as Arrow arrays and the columns are taken out of it by Arrow's own kernels; only
  the labels are converted from Python. It appends the batch to the Parquet file
  (zstd).
* When the queue is full (the writer cannot keep up, or the disk stalls), the chunk
  is dropped and counted in ``dropped``: memory stays bounded by
  ``(max_queued_batches + 2) * batch_rows`` rows, whatever happens to the writer.

Why a packed buffer, measured on CPython 3.11 with a probe since replaced by the
bench's ``tracing`` workload (docs/bench-workloads.md) and timeit (a shared 2-core VM:
minimums of repeated runs, single figures move by tens of percent). Per row, on the
loop / on the writer holding the GIL / buffered:

* a flat list of the row's seven objects (the previous design): ~100-180 ns above
  a bare call / ~170-210 ns (strided slices, then ``pa.array`` per column) / ~190
  bytes, since every float stays alive until the writer converts it;
* one typed ``array`` per column: ~320 ns (seven item stores, each unboxing) /
  ~25 ns / 57 bytes;
* one ``pack_into`` per row (this design): ~200-300 ns / ~20 ns for the labels,
  plus Arrow kernels that release the GIL (~70 ns per row in all) / 56 bytes.

So record() itself costs ~100 ns more than the flat list did; counted in GIL time,
the loop gets that back from the writer, whose GIL-holding work per row fell from ~190
to ~20 ns; CPU per row over both threads fell ~15%, buffered memory ~70%. Whether
a timer run gets faster depends on how much the writer runs while the loop does:
in the churn and fire workloads the difference was within the machine's noise.

The file is written under a hidden temporary name in the same directory and renamed
to its final name by ``close()``, so a reader scanning a directory of traces never
sees a half-written file.

pyarrow is imported when a recorder is built, never by ``import aiowheel``: the core
package depends on anyio only.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

__all__ = [
    "DROPPED_ROWS_KEY",
    "NULLABLE_COLUMNS",
    "RUN_ID_KEY",
    "SAMPLE_EVERY_KEY",
    "TRACE_COLUMNS",
    "ParquetRecorder",
    "TraceRecorder",
    "dropped_rows",
    "recording",
    "sample_every",
    "trace_schema",
]

logger = logging.getLogger("aiowheel.trace")

#: Key, in a trace file's Parquet footer metadata, of how many rows of the run the
#: recorder dropped (its writer could not keep up). A trace without the key was
#: written before the count existed, so its count is unknown, not zero.
DROPPED_ROWS_KEY: Final = "aiowheel.dropped_rows"
#: Key, in the same footer metadata, of the run the dropped rows belong to.
RUN_ID_KEY: Final = "aiowheel.run_id"
#: Key, in the same footer metadata, of the sampling rate. The trace keeps one timer
#: in this many (``ParquetRecorder(path, every=k)``), "1" when it kept every timer.
#: A trace without the key was written before sampling existed, and kept every timer.
SAMPLE_EVERY_KEY: Final = "aiowheel.sample_every"


def sample_every(metadata: dict[bytes, bytes] | None) -> int:
    """How many timers the trace keeps one of, read from a trace file's footer
    metadata (``pyarrow``'s ``FileMetaData.metadata``): 1 when the file does not say
    (written before sampling existed, or not by ``ParquetRecorder``)."""
    raw = (metadata or {}).get(SAMPLE_EVERY_KEY.encode())
    if raw is None:
        return 1
    try:
        every = int(raw)
    except ValueError:
        return 1
    return every if every >= 1 else 1


def dropped_rows(metadata: dict[bytes, bytes] | None) -> int | None:
    """The dropped-row count in a trace file's footer metadata (``pyarrow``'s
    ``FileMetaData.metadata``), or None when the file does not say."""
    if not metadata:
        return None
    raw = metadata.get(DROPPED_ROWS_KEY.encode())
    if raw is None:
        return None
    try:
        count = int(raw)
    except ValueError:
        return None
    return count if count >= 0 else None


class TraceRecorder(Protocol):
    """What a timer calls when it has a recorder (``Timer(recorder=...)``).

    The timer calls ``record`` on the event loop, so it must not block; an exception
    from it is logged and the timer goes on.

    A recorder may also have an ``every`` attribute, an int of at least 1: the timer
    then traces one timer in ``every`` (the 1st, the ``every + 1``-th... in the order
    they are scheduled) and calls ``record`` for those only; the others are plain
    handles that cost nothing. ``ParquetRecorder(path, every=k)`` has one.
    """

    def open(self, *, backend: str, clock: float) -> None:
        """The timer started; ``clock`` is its loop time now."""

    def record(
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        fired_at: float | None,
        cancelled_at: float | None,
    ) -> None:
        """One timer ended (fired or cancelled). Must not block."""

    def close(self) -> None:
        """Flush and close; called once, from a worker thread, when the timer closes."""


#: The trace schema, each column name mapped to its Arrow type name (``str(pyarrow type)``).
#: Timestamps are float64 seconds on the recording loop's clock (asyncio
#: ``loop.time()``, ``trio.current_time()``): the clock the timer's deadlines are on,
#: kept as is, so no precision is invented or lost. ``clock_anchor`` and
#: ``wall_anchor`` were taken at the same instant when the run started, so the Unix
#: time of any timestamp ``t`` is ``wall_anchor + (t - clock_anchor)``; that is how
#: traces of many processes and hosts are aligned.
TRACE_COLUMNS: Final[dict[str, str]] = {
    "run_id": "string",  # one recorder = one run
    "implementation": "string",  # "aiowheel", or a baseline such as "call_later"
    "backend": "string",  # "asyncio", "uvloop" or "trio"
    "host": "string",  # socket.gethostname() of the recording process
    "pid": "int32",  # its process id
    "timer_id": "int64",  # unique within the run; a handle re-armed after it ended
    # records one row per period, with the same timer_id
    "label": "string",  # the schedule(..., label=...) argument, null when not given
    "level": "int8",  # wheel level the timer was filed in (0 = lowest); -1: no wheel
    "scheduled_at": "double",  # loop clock, seconds
    "deadline": "double",  # loop clock, seconds
    "fired_at": "double",  # loop clock, seconds; null when cancelled
    "cancelled_at": "double",  # loop clock, seconds; null when fired
    "lateness": "double",  # fired_at - deadline, seconds; null when cancelled
    "clock_anchor": "double",  # loop clock when the run started, seconds
    "wall_anchor": "double",  # time.time() at that same instant, seconds since the epoch
}

#: Columns that may hold nulls; every other column is always set.
NULLABLE_COLUMNS: Final[frozenset[str]] = frozenset(
    {"label", "fired_at", "cancelled_at", "lateness"}
)

_PYARROW_MISSING = (
    "aiowheel.trace needs pyarrow to write Parquet traces: "
    "pip install 'aiowheel[analytics]' (from a checkout: pip install '.[analytics]'; "
    "or pip install pyarrow)"
)


def _import_pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow
        import pyarrow.compute  # type: ignore[import-untyped]
        import pyarrow.parquet
    except ImportError as exc:
        raise ImportError(_PYARROW_MISSING) from exc
    return pyarrow, pyarrow.parquet


_converted_once = False


def _import_converters(pa: Any) -> None:
    """Have pyarrow finish the imports it defers to its first conversion of Python
    objects: ``pa.array`` and ``pa.scalar`` import pandas, when it is installed, on
    their first call in a process (~0.2 s of CPU on an idle interpreter).

    Called by ``ParquetRecorder()``, in the thread that builds it, before any timer
    runs. Left to the writer thread, whose first act is such a conversion, those
    imports (352 modules) ran while the event loop was busy, the two threads passing
    the GIL back and forth for seconds: in a fresh process, the first trace of a
    churn with 1,000,000 pending (one timer in 100) still had its writer importing
    pandas during the timed schedule + cancel pairs, 143 ms of CPU there (perf;
    docs/benchmark-history.md, "Tracing and the report's own costs")."""
    global _converted_once
    if not _converted_once:
        pa.array([None], pa.string())
        _converted_once = True


def trace_schema() -> pa.Schema:
    """The trace schema as a ``pyarrow.Schema`` (imports pyarrow)."""
    pa, _ = _import_pyarrow()
    return pa.schema(
        [
            pa.field(name, pa.type_for_alias(type_name), nullable=name in NULLABLE_COLUMNS)
            for name, type_name in TRACE_COLUMNS.items()
        ]
    )


# One row's numbers, packed by record() into a slot of a chunk's buffer: timer_id,
# scheduled_at, deadline, fired_at, cancelled_at (NaN for None), level, padding. Native
# byte order and sizes (Arrow's), 48 bytes so that every 8-byte field stays aligned.
_ROW: Final = struct.Struct("=qddddb7x")
_ROW_DOUBLES: Final = _ROW.size // 8  # the stride of the buffer seen as 8-byte values
_ROW_LEVEL_OFFSET: Final = 40  # the level's byte within a slot
_NAN: Final = float("nan")
_NO_CHUNK: Final = object()  # the writer thread has not taken a chunk yet
# Columns that are constant within a run, in schema order (the first five).
_RUN_COLUMNS: Final = ("run_id", "implementation", "backend", "host", "pid")
_DOUBLE_COLUMNS: Final = ("scheduled_at", "deadline", "fired_at", "cancelled_at", "lateness")
_STATISTICS_COLUMNS: Final = ("timer_id", "scheduled_at", "deadline")
_STOP: Final = None  # the writer thread's end-of-input marker
#: How long the event loop waits for a writer that is behind to start a stint on the
#: GIL (ParquetRecorder._hand_over): a thread waiting for the GIL wakes well within it.
_TAKE_WAIT: Final = 0.002
#: ...or, when the queue is full, to finish encoding and start one (about 8 ms per
#: 32,768 rows) before the batch is dropped...
_FULL_TAKE_WAIT: Final = 0.02
#: ...and, once it has, at most for the stint to end: about 6 ms per 32,768 rows.
_STINT_WAIT: Final = 0.05
#: Batches smaller than this are never handed over (ParquetRecorder._hand_in).
_HAND_OVER_ROWS: Final = 4096
#: After a full queue's offer the writer did not take, how long a full queue drops at
#: once.
_HELD_UP: Final = 1.0
_clock = time.monotonic  # a test's to patch

#: A chunk handed to the writer by ``record()``: its buffer (``_ROW`` slots), its
#: labels, its row count.
_Chunk = tuple[bytearray, list[Any], int]
#: A batch handed to the writer by a timer (``take_columns``): seven lists (timer ids,
#: labels, scheduled_at, deadline, fired_at, cancelled_at, level; NaN where a
#: time does not apply) and the count of rows filled.
_Columns = tuple[list[list[Any]], int]


class ParquetRecorder:
    """Writes a timer's trace to a Parquet file; implements ``aiowheel.TraceRecorder``.

    ``path``: the Parquet file to write, or an existing directory, in which case the
    file is ``<path>/<run_id>.parquet`` (one file per run: point ``aiowheel report`` at
    the directory). ``run_id``: names the run in every row (default: start time, pid
    and a random suffix, unique across a fleet). ``implementation``: what produced the
    timers (``"aiowheel"``; benchmarks record their ``call_later`` baselines under
    other names). ``batch_rows``: rows per batch handed to the writer thread (and per
    Parquet row group). ``max_queued_batches``: batches waiting for the writer before
    new ones are dropped. ``compression``: Parquet codec. ``every``: trace one timer in
    this many, for production (see below); 1, the default, traces every timer.

    Sampling: with ``every=k`` the timer traces the 1st timer scheduled, the
    ``k + 1``-th, the ``2k + 1``-th... (``every()`` timers count as one each, traced or
    not for their whole life); the others are plain handles and pay nothing for
    tracing. A sampled timer's ``timer_id`` is its number in that order, so the ids
    also say how many timers the run scheduled. The rate goes into the file's footer
    (``SAMPLE_EVERY_KEY``), and ``aiowheel report`` states it: counts and rates in a
    sampled trace are about ``1/k`` of the run's, lateness and lifetimes are those of
    the sample.

    One recorder serves one timer run: ``open`` once, ``record`` any number of times,
    ``close`` once. ``record`` must be called from one thread (the event loop's).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        implementation: str = "aiowheel",
        batch_rows: int = 32_768,
        max_queued_batches: int = 8,
        compression: str = "zstd",
        every: int = 1,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a str or os.PathLike, got {path!r}")
        if run_id is None:
            run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        for name, value in (("run_id", run_id), ("implementation", implementation)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {value!r}")
            if not value:
                raise ValueError(f"{name} must not be empty")
        for name, number in (
            ("batch_rows", batch_rows),
            ("max_queued_batches", max_queued_batches),
            ("every", every),
        ):
            if isinstance(number, bool) or not isinstance(number, int):
                raise TypeError(f"{name} must be an int, got {number!r}")
            if number < 1:
                raise ValueError(f"{name} must be at least 1, got {number!r}")
        # Fail here, at the call that configured tracing, not later in the writer.
        self._pa, self._pq = _import_pyarrow()
        _import_converters(self._pa)
        if compression not in ("zstd", "snappy", "gzip", "brotli", "lz4", "none"):
            raise ValueError(f"unknown Parquet compression {compression!r}")
        target = Path(path)
        if target.is_dir():
            target = target / f"{run_id}.parquet"
        elif not target.parent.is_dir():
            raise FileNotFoundError(f"the directory for the trace does not exist: {target.parent}")
        self.path: Final[Path] = target
        self.run_id: Final[str] = run_id
        self.implementation: Final[str] = implementation
        self.batch_rows: Final[int] = batch_rows
        self.max_queued_batches: Final[int] = max_queued_batches
        #: The trace keeps one timer in this many, 1 when it keeps every timer.
        self.every: Final[int] = every
        self._compression = compression
        self._partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")

        self.backend = ""
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.clock_anchor = 0.0
        self.wall_anchor = 0.0
        #: The first error the writer hit (rows after it are dropped and counted).
        self.error: BaseException | None = None

        self._state = "new"
        self._queue: queue.Queue[_Chunk | _Columns | None] = queue.Queue(max_queued_batches)
        # Full chunks' buffers and label lists, given back once written (or dropped)
        # for the loop to fill again: a fresh 1.5 MB bytearray costs page faults.
        self._spare: collections.deque[tuple[bytearray, list[Any]]] = collections.deque()
        # The same for the timer's column lists (take_columns).
        self._spare_columns: collections.deque[list[list[Any]]] = collections.deque()
        self._last_columns: list[_Columns] = []  # partial batches, for close()
        self._take_chunk: Callable[[], _Chunk | None] = _nothing  # see _make_record
        self._thread: threading.Thread | None = None
        # Set by the writer when a stint holding the GIL starts, and when it ends
        # (_hand_over).
        self._took = threading.Event()
        self._handed = threading.Event()
        # Whether batches are handed over at all, and until when on _clock a full
        # queue drops at once (_hand_in).
        self._handing = batch_rows >= _HAND_OVER_ROWS
        self._held_up_until = 0.0
        self._dropped_full = 0  # written by the loop thread only
        # The writer thread's side: its state is written by that thread only.
        self._writer = _TraceWriter(self)
        self._bind_record(self._record_unopened)

    # -- the TraceRecorder protocol --------------------------------------------------

    def open(self, *, backend: str, clock: float) -> None:
        """The timer started on ``backend``; ``clock`` is its loop time now."""
        if self._state != "new":
            raise RuntimeError("a ParquetRecorder records one run: open() was already called")
        # Taken together, so wall_anchor + (t - clock_anchor) maps the loop clock to
        # Unix time (to the few microseconds between the two reads).
        self.wall_anchor = time.time()
        self.clock_anchor = float(clock)
        self.backend = backend
        self._state = "open"
        self._thread = threading.Thread(
            target=self._writer.run, name=f"aiowheel-trace-{self.run_id}", daemon=True
        )
        self._thread.start()
        self._bind_record(self._make_record())

    def record(  # replaced per instance (see open and _make_record)
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        fired_at: float | None,
        cancelled_at: float | None,
    ) -> None:
        """One timer ended (``fired_at`` or ``cancelled_at`` set). Never waits for
        the disk (a writer that is behind gets one stint on the GIL, as in
        ``take_columns``)."""
        raise AssertionError("unreachable: __init__ binds record per instance")  # pragma: no cover

    def close(self) -> None:
        """Write what is buffered, wait for the writer and give the file its name.

        Called once, from a worker thread, when the timer closes. A writer error is
        logged (and kept in ``error``) rather than raised, so that tracing never turns
        a timer's clean shutdown into a failure.
        """
        if self._state == "closed":
            return
        was_open = self._state == "open"
        self._state = "closed"
        self._bind_record(self._record_closed)
        if not was_open:
            return
        assert self._thread is not None
        # The timer calls close() after its last record(), so the loop thread no longer
        # touches the chunk this takes.
        chunk = self._take_chunk()
        if chunk is not None:
            self._queue.put(chunk)  # blocking: nothing is dropped at the end
        for columns in self._last_columns:
            self._queue.put(columns)  # the same for the timer's last batch
        self._last_columns.clear()
        self._queue.put(_STOP)
        self._thread.join()
        if self.error is not None:
            logger.error(
                "trace %s is incomplete: %d rows dropped after a writer error",
                self.path,
                self.dropped,
                exc_info=self.error,
            )
        if self._dropped_full:
            logger.warning(
                "trace %s: the writer could not keep up, %d rows were dropped",
                self.path,
                self._dropped_full,
            )

    def take_columns(self, columns: list[list[Any]], count: int) -> list[list[Any]] | None:
        """A timer hands over a batch of rows as columns (``aiowheel._tracing``):
        seven lists, timer ids, labels, scheduled_at, deadline, fired_at,
        cancelled_at (NaN where it does not apply) and level, the first ``count``
        slots filled. Returns lists to fill next (written ones, given back), or None.
        Never waits for the disk: when the writer is ``max_queued_batches`` behind,
        the batch is dropped and counted, and its lists come back to be filled
        again. When the writer is behind and waiting for the GIL, it first gets the
        GIL for one stint (``_hand_in``: about 6 ms per 32,768 rows). A partial
        batch (``count`` below ``batch_rows``: the last one, as the timer closes) is
        kept for ``close()``, which queues it however far behind the writer is.
        Called on the event loop."""
        if self._state != "open":
            raise RuntimeError(f"ParquetRecorder.take_columns() called while {self._state}")
        if count < self.batch_rows:
            # A partial batch: the timer's last, handed over as it closes. close()
            # queues it, waiting for room: nothing is dropped at the end.
            self._last_columns.append((columns, count))
            return None
        if not self._hand_in((columns, count)):
            self._dropped_full += count
            return columns
        try:
            return self._spare_columns.pop()
        except IndexError:
            return None

    def _hand_in(self, batch: _Chunk | _Columns) -> bool:
        # Called on the event loop: queue a full batch for the writer; False when it
        # had to be dropped. A writer that keeps up lags by one batch at most and is
        # never waited for (a loop that waits in select() now and then, as a
        # server's does, never waits here). One that is behind gets the GIL for one
        # stint (_hand_over); when the queue is full, the loop offers it longer first
        # and tries again, so that a burst (aclose() cancelling a million timers)
        # does not outrun a writer that is merely busy encoding. Two bounds keep the
        # loop's waits small: batches under _HAND_OVER_ROWS are never handed over (a
        # wake-up per few rows would cost more than the rows; on a busy loop what the
        # writer cannot keep is dropped, as before), and after a full queue's offer
        # that the writer did not take (held up by its disk), batches that find the
        # queue full are dropped at once for _HELD_UP seconds.
        put = self._queue.put_nowait
        handing = self._handing
        try:
            put(batch)
        except queue.Full:
            if not handing or _clock() < self._held_up_until:
                return False
            if not self._hand_over(_FULL_TAKE_WAIT):
                self._held_up_until = _clock() + _HELD_UP
            try:
                put(batch)
            except queue.Full:
                return False
        else:
            if handing and len(self._queue.queue) > 1:  # a batch was waiting: behind
                self._hand_over(_TAKE_WAIT)
        return True

    def _hand_over(self, take_wait: float) -> bool:
        # Give a writer that is behind the GIL for one whole stint, now. A thread
        # waiting for the GIL asks its holder to drop it only after a switch interval
        # (5 ms) in which the GIL did not change hands, and a busy asyncio loop hands
        # it over and takes it back around every zero-timeout select(), too fast for
        # the waiting thread to win: measured, the writer waited seconds and dropped
        # most rows of a churn. And a stint longer than the switch interval was cut
        # short by the loop's own request for the GIL. So the loop waits here, off
        # the GIL: first for the writer to start a stint (_took), which a writer
        # waiting for the GIL does at once, then for the stint to end (_handed: a
        # batch converted, about to be encoded without the GIL). A writer busy
        # without the GIL (encoding, or held up by a slow disk) does not start one
        # within take_wait, and the loop goes on (False).
        took = self._took
        handed = self._handed
        took.clear()
        handed.clear()
        if not took.wait(take_wait):
            return False
        handed.wait(_STINT_WAIT)
        return True

    # -- counters ---------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """How many rows were dropped, because the writer could not keep up or failed."""
        return self._dropped_full + self._writer.dropped_failed

    @property
    def written(self) -> int:
        """Rows written to the file so far."""
        return self._writer.written

    def __repr__(self) -> str:
        return (
            f"<ParquetRecorder {self._state} {str(self.path)!r} run_id={self.run_id!r} "
            f"written={self.written} dropped={self.dropped}>"
        )

    # -- the loop side ----------------------------------------------------------------

    def _bind_record(self, record: Callable[..., None]) -> None:
        # An instance attribute shadows the class's `record` (a plain function is a
        # non-data descriptor), so `recorder.record(...)` calls the closure directly.
        self.__dict__["record"] = record

    def _make_record(self) -> Callable[..., None]:
        # A closure, not a method: cell loads are cheaper than attribute loads, and
        # this runs once per timer on the event loop.
        #
        # The numbers go into a preallocated bytearray, one _ROW slot per row, in one
        # pack_into call: no object is allocated that outlives the call (the floats
        # the timer passes are freed with its handle, and no object piles up for the
        # cyclic GC to walk), and the writer reads the buffer without the GIL.
        rows = self.batch_rows
        size = _ROW.size
        pack = _ROW.pack_into
        error = struct.error
        spare = self._spare.pop
        hand_in = self._hand_in
        nan = _NAN
        buffer = bytearray(rows * size)
        labels: list[Any] = [None] * rows
        count = 0

        def record(
            timer_id: int,
            label: str | None,
            scheduled_at: float,
            deadline: float,
            level: int,
            fired_at: float | None,
            cancelled_at: float | None,
        ) -> None:
            nonlocal buffer, labels, count
            try:
                pack(
                    buffer,
                    count * size,
                    timer_id,
                    scheduled_at,
                    deadline,
                    nan if fired_at is None else fired_at,
                    nan if cancelled_at is None else cancelled_at,
                    level,
                )
            except error as exc:
                # Nothing was stored (count did not move): the row is refused whole.
                raise _bad_row(
                    timer_id, scheduled_at, deadline, level, fired_at, cancelled_at, exc
                ) from None
            labels[count] = label
            count += 1
            if count == rows:
                count = 0
                if not hand_in((buffer, labels, rows)):
                    # Dropped: refill the same buffer. (So a new one is made only when
                    # the queue took this one: at most max_queued_batches + 2 exist.)
                    self._dropped_full += rows
                    return
                try:
                    buffer, labels = spare()
                except IndexError:
                    buffer, labels = bytearray(rows * size), [None] * rows

        def take_chunk() -> _Chunk | None:
            # close(): what record() has buffered, if anything.
            nonlocal buffer, labels, count
            if not count:
                return None
            chunk = (buffer, labels, count)
            buffer, labels, count = bytearray(0), [], 0
            return chunk

        self._take_chunk = take_chunk
        return record

    def _record_unopened(self, *row: Any) -> None:
        raise RuntimeError("ParquetRecorder.record() called before open()")

    def _record_closed(self, *row: Any) -> None:
        raise RuntimeError("ParquetRecorder.record() called after close()")

    # -- the writer thread ------------------------------------------------------------


class _TraceWriter:
    """The writer thread's side of a ``ParquetRecorder``.

    The recorder is two rooms that meet at its bounded queue: the loop's side
    (``ParquetRecorder``: ``record``, ``take_columns``, the hand-over) and this one,
    which runs on the writer thread. Everything here is written by the writer thread
    only: the cached Arrow pieces and packers, and the counts of rows written and of
    rows lost to a failure (the loop reads the counts, through
    ``ParquetRecorder.written`` and ``dropped``). Of the recorder's state it writes
    only ``error`` and the two events that hand the GIL over (``_took``, ``_handed``),
    and it gives written buffers back through the spare deques.
    """

    def __init__(self, recorder: ParquetRecorder) -> None:
        self.recorder = recorder
        self.written = 0
        self.dropped_failed = 0
        self._packers: dict[tuple[str, int], struct.Struct] = {}
        self._nones: list[None] = []  # to empty written columns
        self._repeats: dict[int, tuple[list[pa.Array], list[pa.Array]]] = {}
        self._null_labels: dict[int, pa.Array] = {}  # _no_labels
        self._constants: dict[str, Any] = {}  # typed Arrow scalars
        self._indices: tuple[pa.Array, pa.Array] | None = None  # _strides

    def run(self) -> None:
        recorder = self.recorder
        writer: pq.ParquetWriter | None = None
        get = recorder._queue.get
        chunk: object = _NO_CHUNK
        try:
            schema = trace_schema()
            self._constants = {
                name: recorder._pa.scalar(getattr(recorder, name), schema.field(name).type)
                for name in (*_RUN_COLUMNS, "clock_anchor", "wall_anchor")
            }
            writer = recorder._pq.ParquetWriter(
                recorder._partial,
                schema,
                compression=recorder._compression,
                # Dictionary pages pay off for the repetitive strings only: on the
                # float columns (all distinct) building them cost ~0.5 us per row
                # before the writer gave up on them.
                use_dictionary=[*_RUN_COLUMNS[:-1], "label"],
                # The writer's CPU competes with the loop on a busy machine. Measured
                # on 32k-row batches of clustered times: min/max statistics on every
                # column cost ~60 ns per row (kept where a reader filters: ids and
                # times), and byte-stream-split doubles compress 15% smaller and
                # ~30 ns per row faster under zstd.
                write_statistics=list(_STATISTICS_COLUMNS),
                column_encoding=dict.fromkeys(_DOUBLE_COLUMNS, "BYTE_STREAM_SPLIT"),
            )
            took = recorder._took.set
            while (chunk := get()) is not _STOP:
                took()  # a stint starts (_hand_over)
                assert isinstance(chunk, tuple)
                if len(chunk) == 2:
                    columns, count = chunk
                    self.write_columns(writer, columns, count)
                    took()  # the GIL again, after the encoding: the next stint
                    self.written += count
                    if count == recorder.batch_rows:
                        # Emptied here, where the values were just read: freeing them
                        # on the loop, as it overwrites each slot a batch later,
                        # touched one cold object per value (+35% on the churn's
                        # traced cancels, measured with a writer that drops batches).
                        nones = self._nones
                        if len(nones) != count:
                            nones = self._nones = [None] * count
                        for column in columns:
                            column[:] = nones
                        recorder._spare_columns.append(columns)
                    continue
                recorder._handed.set()  # record()'s chunks: kernels release the GIL anyway
                self.write_batch(writer, chunk)
                took()
                self.written += chunk[2]
                if chunk[2] == recorder.batch_rows:
                    # Written: the arrays viewing the buffer are gone (pc.take copies).
                    recorder._spare.append((chunk[0], chunk[1]))
            # The trace says itself whether it is complete: the rows dropped because
            # the writer could not keep up go into the file's footer (close() put the
            # last chunk and the stop after the loop's last record(), so the count is
            # final here). ``aiowheel report`` states them (docs/analytics.md).
            writer.add_key_value_metadata(
                {
                    DROPPED_ROWS_KEY: str(recorder._dropped_full),
                    RUN_ID_KEY: recorder.run_id,
                    SAMPLE_EVERY_KEY: str(recorder.every),
                }
            )
            writer.close()
            writer = None
            os.replace(recorder._partial, recorder.path)
        except BaseException as exc:
            recorder.error = exc
            if isinstance(chunk, tuple):
                self.dropped_failed += chunk[-1]
            # Keep consuming until close() says stop, so the loop side never blocks on
            # a dead writer (this includes a writer that failed before its first get).
            if chunk is not _STOP:
                while (chunk := get()) is not _STOP:
                    recorder._took.set()
                    recorder._handed.set()
                    self.dropped_failed += chunk[-1]
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.close()
            with contextlib.suppress(OSError):
                os.unlink(recorder._partial)

    def write_batch(self, writer: pq.ParquetWriter, chunk: _Chunk) -> None:
        # Runs on the writer thread. The buffer becomes Arrow arrays without a copy
        # (the bytearray, viewed as float64, int64 and int8 values) and the columns
        # are taken out of it with strided takes: Arrow kernels, not Python objects.
        # Only the labels are converted from Python objects, holding the GIL (~20 ns
        # per row). Each kernel call releases the GIL and must win it back from a
        # busy loop, so the calls are few: one take for the five 8-byte fields, one
        # for the level, one comparison per nullable column. Constant columns repeat
        # a typed Arrow scalar: repeating a Python str goes through Python per
        # element and cost 0.7 us per row.
        pa = self.recorder._pa
        pc = pa.compute
        buffer, labels, n = chunk
        data = pa.py_buffer(buffer)
        values = n * _ROW_DOUBLES
        f64 = pa.float64()
        doubles = pa.Array.from_buffers(f64, values, [None, data])
        int64s = pa.Array.from_buffers(pa.int64(), values, [None, data])
        int8s = pa.Array.from_buffers(pa.int8(), n * _ROW.size, [None, data])
        rows, in_bytes = self._strides(n)
        span = values - _ROW_DOUBLES + 1  # from a row's field to the last row's
        fields = pc.take(
            pa.RecordBatch.from_arrays(
                [int64s.slice(0, span), *(doubles.slice(i, span) for i in range(1, 5))],
                names=["timer_id", "scheduled_at", "deadline", "fired_at", "cancelled_at"],
            ),
            rows,
        )

        def nullable(name: str) -> Any:
            # NaN stands for None: valid where the value equals itself.
            column = fields.column(name)
            valid = pc.equal(column, column)
            return pa.Array.from_buffers(f64, n, [valid.buffers()[1], column.buffers()[1]])

        deadline = fields.column("deadline")
        fired_at = nullable("fired_at")
        run, anchors = self._repeated(n)
        columns = [
            *run,
            fields.column("timer_id"),
            _labels(pa, labels if len(labels) == n else labels[:n]),
            pc.take(int8s.slice(_ROW_LEVEL_OFFSET, span * 8 - 7), in_bytes),  # level
            fields.column("scheduled_at"),
            deadline,
            fired_at,
            nullable("cancelled_at"),
            pc.subtract(fired_at, deadline),  # lateness
            *anchors,
        ]
        writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=writer.schema))

    def write_columns(self, writer: pq.ParquetWriter, columns: list[list[Any]], n: int) -> None:
        # Runs on the writer thread: one stint holding the GIL (the event loop
        # waits off it when the writer is behind: ParquetRecorder._hand_in), then
        # the Parquet encoding without the GIL while the loop runs. The timer wrote the trace's own
        # columns (aiowheel/_tracing.py), so each becomes an Arrow array in one call:
        # struct.pack for the numbers (~10 ns per value), pa.array where NaN stands
        # for null (~20 ns); the lateness is one Arrow kernel (which gets the GIL
        # straight back when the loop is waiting off it). Labels that are all None
        # (no label given) cost one list count and a cached array.
        pa = self.recorder._pa
        if n != len(columns[0]):
            columns = [column[:n] for column in columns]
        ids, labels, scheduled, deadlines, fired, cancelled, levels = columns
        f64 = pa.float64()

        def packed(fmt: str, values: list[Any], type_: Any) -> Any:
            packer = self._packers.get((fmt, n))
            if packer is None:
                packer = self._packers[(fmt, n)] = struct.Struct(f"={n}{fmt}")
            return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(packer.pack(*values))])

        run, anchors = self._repeated(n)
        deadline = packed("d", deadlines, f64)
        fired_at = pa.array(fired, f64, from_pandas=True)
        batch = [
            *run,
            packed("q", ids, pa.int64()),
            self._no_labels(n) if labels.count(None) == n else _labels(pa, labels),
            packed("b", levels, pa.int8()),
            packed("d", scheduled, f64),
            deadline,
            fired_at,
            pa.array(cancelled, f64, from_pandas=True),
            pa.compute.subtract(fired_at, deadline),  # lateness
            *anchors,
        ]
        record_batch = pa.RecordBatch.from_arrays(batch, schema=writer.schema)
        self.recorder._handed.set()  # the stint ends: the loop may go on (_hand_over)
        writer.write_batch(record_batch)

    def _no_labels(self, n: int) -> pa.Array:
        # A label column of n nulls, built once per batch size (pa.nulls releases the
        # GIL: see write_columns).
        cached = self._null_labels.get(n)
        if cached is None:
            pa = self.recorder._pa
            cached = self._null_labels[n] = pa.nulls(n, pa.string())
        return cached

    def _repeated(self, n: int) -> tuple[list[pa.Array], list[pa.Array]]:
        # The columns that are constant within the run (the run's five, then the two
        # anchors), n rows long: built once per batch size and reused (Arrow arrays
        # are immutable); repeating the strings cost ~40 ns per row and batch.
        cached = self._repeats.get(n)
        if cached is None:
            pa = self.recorder._pa
            constant = self._constants
            cached = self._repeats[n] = (
                [pa.repeat(constant[name], n) for name in _RUN_COLUMNS],
                [pa.repeat(constant[name], n) for name in ("clock_anchor", "wall_anchor")],
            )
        return cached

    def _strides(self, n: int) -> tuple[pa.Array, pa.Array]:
        # The indices of the first field of each of n rows, in 8-byte values and in
        # bytes; built once per chunk size (every chunk but the last is full).
        if self._indices is None or len(self._indices[0]) != n:
            pa = self.recorder._pa
            rows = pa.array(range(0, n * _ROW_DOUBLES, _ROW_DOUBLES), pa.int64())
            self._indices = (rows, pa.compute.multiply(rows, 8))
        return self._indices


def _nothing() -> None:
    return None


def _bad_row(
    timer_id: Any,
    scheduled_at: Any,
    deadline: Any,
    level: Any,
    fired_at: Any,
    cancelled_at: Any,
    exc: Exception,
) -> Exception:
    # record() refused a row (off the hot path): say which value and why.
    fields = {
        "timer_id": timer_id,
        "scheduled_at": scheduled_at,
        "deadline": deadline,
        "level": level,
        "fired_at": fired_at,
        "cancelled_at": cancelled_at,
    }
    row = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    for name in ("timer_id", "level"):
        if isinstance(fields[name], bool) or not hasattr(fields[name], "__index__"):
            return TypeError(f"ParquetRecorder.record(): {name} must be an int ({row})")
    for name in ("scheduled_at", "deadline", "fired_at", "cancelled_at"):
        value = fields[name]
        if not (value is None and name in NULLABLE_COLUMNS) and not hasattr(value, "__float__"):
            return TypeError(f"ParquetRecorder.record(): {name} must be a float ({row})")
    return ValueError(f"ParquetRecorder.record(): a value is out of range: {exc} ({row})")


def _labels(pa: Any, labels: list[Any]) -> pa.Array:
    try:
        return pa.array(labels, pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        # A label that is not a str (the timer does not check): keep its str().
        return pa.array([None if x is None else str(x) for x in labels], pa.string())


def recording(path: str | os.PathLike[str], **kwargs: Any) -> ParquetRecorder:
    """A recorder for ``Timer(recorder=...)``: ``ParquetRecorder(path, **kwargs)``."""
    return ParquetRecorder(path, **kwargs)
