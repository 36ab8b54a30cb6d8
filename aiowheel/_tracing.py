"""Tracing: which timers a trace records, and their rows, kept on the event loop.

A timer with a recorder (``Timer(recorder=...)``) has one ``Tracer``. It decides, when
a timer is scheduled, whether that timer is traced (``pick``: one timer in
``every``, counted in scheduling order: the 1st, the ``every + 1``-th...), and a
traced timer gets a ``TracedHandle`` that points back to it. Only such a handle ever
writes a row, so an untraced timer of a sampled trace is a plain ``TimerHandle`` and
pays for tracing one count at schedule time, nothing else.

A row is written when a traced timer ends (fired or cancelled). With a recorder that
takes columns (``ParquetRecorder``: its ``take_columns``), the row goes into the next
slot of seven preallocated lists, one per column, with no call out of compiled code:
timer ids, labels, scheduled_at, deadline, fired_at, cancelled_at (NaN in the one
that does not apply) and the level. They are the trace's own columns, so the writer
thread converts each with one call that holds the GIL, and a batch needs one Arrow
kernel (the lateness) where it needed a dozen: each kernel releases the GIL, and
winning it back from a busy event loop takes a switch interval (5 ms), so the writer
fell behind and dropped most rows (``docs/analytics.md``, "What recording costs"). Every
``batch_rows`` rows, the lists are handed to the recorder whole and it hands back
lists to fill again. Any other recorder gets one
``record()`` call per row, as the ``TraceRecorder`` protocol says.

A recorder only observes: if handing it rows raises, tracing stops for the rest of the
run (one error logged) and no timer is affected (docs/design.md, "Failure
containment").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, SupportsFloat, cast, final

if TYPE_CHECKING:
    from .trace import TraceRecorder

__all__ = ["Tracer", "sample_every"]

logger: Final = logging.getLogger("aiowheel")

_EXIT: Final = (SystemExit, KeyboardInterrupt)
#: Rows per batch for a columns recorder that does not say (``batch_rows``).
_DEFAULT_ROWS: Final = 32_768

#: A columns recorder's intake: ``take(columns, count)`` gets the seven lists (the
#: first ``count`` slots filled) and returns seven lists of the same length to fill
#: next, or None (then new ones are made).
Take = Callable[[list[list[Any]], int], "list[list[Any]] | None"]


def sample_every(recorder: object) -> int:
    """How many timers a recorder's trace keeps one of: its ``every`` attribute (an
    int of at least 1; ``ParquetRecorder(path, every=k)``), 1 when it has none."""
    every = getattr(recorder, "every", 1)
    if isinstance(every, bool) or not isinstance(every, int):
        raise TypeError(f"a recorder's `every` must be an int, got {every!r}")
    if every < 1:
        raise ValueError(f"a recorder's `every` must be at least 1, got {every!r}")
    return every


@final  # compiled: calls from the engine, the timer and the handles are direct
class Tracer:
    """The trace state of one started timer (see the module docstring)."""

    def __init__(self, recorder: TraceRecorder, clock: Callable[[], float]) -> None:
        self.recorder = recorder
        # Typed as returning an object: a cancel's time goes into a column as the
        # float object the clock returned, not unboxed and boxed again.
        self.clock: Callable[[], object] = clock
        self.every = sample_every(recorder)
        # Countdown to the next traced timer: the first one scheduled is traced.
        self.left = 1
        # Timers scheduled so far, traced or not: a traced timer's id is its number in
        # that order, so ids say how many timers a sampled trace stands for.
        self.seen = 0
        # False once the recorder failed (or the timer closed): no more rows.
        self.active = True
        take: Take | None = getattr(recorder, "take_columns", None)
        self.take = take
        rows = getattr(recorder, "batch_rows", _DEFAULT_ROWS) if take is not None else 1
        self.rows: int = rows if isinstance(rows, int) and rows >= 1 else _DEFAULT_ROWS
        self.count = 0
        self.columns: list[list[Any]] = []
        self.ids: list[int] = []
        self.labels: list[str | None] = []
        self.scheduled: list[float] = []
        self.deadlines: list[float] = []
        self.fired_at: list[object] = []
        self.cancelled: list[object] = []
        self.levels: list[int] = []
        if take is not None:
            self.use(None)
        # The pass writes many rows with the same fired time: boxed once.
        self.now = float("nan")
        self.now_box: object = self.now
        # The time a row does not have (a fired timer's cancelled_at, a cancelled
        # one's fired_at): one NaN object, typed object so it is stored, not boxed
        # per row. The writer reads NaN as null.
        self.missing: object = float("nan")

    # -- choosing -----------------------------------------------------------------

    def pick(self) -> bool:
        """A timer is being scheduled: True when it is to be traced."""
        self.seen += 1
        left = self.left - 1
        if left:
            self.left = left
            return False
        self.left = self.every
        return self.active

    # -- rows (written by the handle, with its own fields: TracedHandle._trace_fired,
    # _trace_cancelled; the pass reads them before a callback runs, _trace_row) ------

    def fired(
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        now: float,
    ) -> None:
        """A traced timer fired at ``now``."""
        if not self.active:
            return
        if self.take is None:
            self.one(timer_id, label, scheduled_at, deadline, level, now, None)
            return
        if now != self.now:
            self.now = now
            self.now_box = now
        self.append(timer_id, label, scheduled_at, deadline, level, self.now_box, self.missing)

    def cancelled_at(
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        now: object,
    ) -> None:
        """A traced timer was cancelled at ``now`` (a float, typed as an object so that
        the clock's own float goes into the column, not unboxed and boxed again)."""
        if not self.active:
            return
        if self.take is None:
            self.one(
                timer_id,
                label,
                scheduled_at,
                deadline,
                level,
                None,
                float(cast("SupportsFloat", now)),
            )
            return
        self.append(timer_id, label, scheduled_at, deadline, level, self.missing, now)

    def append(
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        fired_at: object,
        cancelled_at: object,
    ) -> None:
        # One row into the batch's columns (fired or cancelled: the other is NaN, the
        # one boxed float ``missing``); a full batch goes to the recorder.
        i = self.count
        self.ids[i] = timer_id
        self.labels[i] = label
        self.scheduled[i] = scheduled_at
        self.deadlines[i] = deadline
        self.fired_at[i] = fired_at
        self.cancelled[i] = cancelled_at
        self.levels[i] = level
        i += 1
        self.count = i
        if i == self.rows:
            self.flush()

    def one(
        self,
        timer_id: int,
        label: str | None,
        scheduled_at: float,
        deadline: float,
        level: int,
        fired_at: float | None,
        cancelled_at: float | None,
    ) -> None:
        # A recorder that takes rows one at a time (the TraceRecorder protocol).
        try:
            self.recorder.record(
                timer_id, label, scheduled_at, deadline, level, fired_at, cancelled_at
            )
        except _EXIT:
            raise
        except BaseException as exc:
            self.failed(exc)

    def flush(self) -> None:
        """Hand the rows buffered so far to the recorder (a full batch, or the last
        one when the timer closes)."""
        count = self.count
        if not count:
            return
        self.count = 0
        take = self.take
        if take is None or not self.active:
            return
        try:
            fresh = take(self.columns, count)
        except _EXIT:
            raise
        except BaseException as exc:
            self.failed(exc)
            return
        self.use(fresh)

    def use(self, columns: list[list[Any]] | None) -> None:
        # The lists the next rows go into: those the recorder handed back, or new ones.
        rows = self.rows
        if columns is None or len(columns) != 7 or any(len(c) != rows for c in columns):
            columns = [[None] * rows for _ in range(7)]
        self.columns = columns
        self.ids = columns[0]
        self.labels = columns[1]
        self.scheduled = columns[2]
        self.deadlines = columns[3]
        self.fired_at = columns[4]
        self.cancelled = columns[5]
        self.levels = columns[6]

    def close(self) -> None:
        """The timer closed: the last rows go to the recorder; no row after this."""
        self.flush()
        self.active = False

    def failed(self, exc: BaseException) -> None:
        # A recorder's failure must cost no timer anything: tracing stops here, with
        # one error logged, not one per row; aclose() still closes the recorder.
        if not self.active:
            return
        self.active = False
        self.count = 0
        logger.error(
            "aiowheel: the trace recorder failed; this timer records no more rows",
            exc_info=exc,
        )
