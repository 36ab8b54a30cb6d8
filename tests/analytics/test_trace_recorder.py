"""ParquetRecorder: schema, batching, dropping when the writer falls behind, errors,
and real Timer runs recorded on asyncio, uvloop and trio."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from aiowheel import Timer
from aiowheel.trace import (
    _FULL_TAKE_WAIT,
    _HAND_OVER_ROWS,
    _HELD_UP,
    _TAKE_WAIT,
    NULLABLE_COLUMNS,
    SAMPLE_EVERY_KEY,
    TRACE_COLUMNS,
    ParquetRecorder,
    _TraceWriter,
    dropped_rows,
    recording,
    sample_every,
    trace_schema,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _read(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def _blocking_writer(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> tuple[threading.Event, threading.Event]:
    """Make the writer thread's ``method`` (``write_batch`` or ``write_columns``)
    set the first event and wait for the second before it writes."""
    writing = threading.Event()
    release = threading.Event()
    real_write = getattr(_TraceWriter, method)

    def slow_write(self: _TraceWriter, writer: Any, *batch: Any) -> None:
        writing.set()
        assert release.wait(10)
        real_write(self, writer, *batch)

    monkeypatch.setattr(_TraceWriter, method, slow_write)
    return writing, release


def _opened(tmp_path: Path, **kwargs: Any) -> ParquetRecorder:
    recorder = ParquetRecorder(tmp_path / "t.parquet", run_id="r1", **kwargs)
    recorder.open(backend="asyncio", clock=50.0)
    return recorder


def test_schema_matches_the_documented_columns() -> None:
    schema = trace_schema()
    assert schema.names == list(TRACE_COLUMNS)
    for field in schema:
        assert str(field.type) == TRACE_COLUMNS[field.name]
        assert field.nullable == (field.name in NULLABLE_COLUMNS)


def test_rows_hold_what_record_was_given(tmp_path: Path) -> None:
    recorder = ParquetRecorder(tmp_path / "t.parquet", run_id="r1", implementation="call_later")
    recorder.open(backend="trio", clock=50.0)
    recorder.record(1, "req", 50.5, 51.0, 2, 51.25, None)
    recorder.record(2, None, 50.6, 60.0, 0, None, 55.0)
    recorder.close()
    assert pq.read_schema(recorder.path).equals(trace_schema())
    fired, cancelled = _read(recorder.path)
    assert fired["timer_id"] == 1
    assert cancelled["timer_id"] == 2
    assert fired["label"] == "req"
    assert cancelled["label"] is None
    assert fired["lateness"] == 0.25
    assert cancelled["lateness"] is None
    assert (fired["fired_at"], fired["cancelled_at"]) == (51.25, None)
    assert (cancelled["fired_at"], cancelled["cancelled_at"]) == (None, 55.0)
    assert (fired["scheduled_at"], fired["deadline"], fired["level"]) == (50.5, 51.0, 2)
    for row in (fired, cancelled):
        assert row["run_id"] == "r1"
        assert row["implementation"] == "call_later"
        assert row["backend"] == "trio"
        assert row["host"] == recorder.host
        assert row["pid"] == recorder.pid
        assert row["clock_anchor"] == 50.0
        assert row["wall_anchor"] == recorder.wall_anchor > 1e9
    assert (recorder.written, recorder.dropped) == (2, 0)


def test_batches_become_row_groups(tmp_path: Path) -> None:
    recorder = _opened(tmp_path, batch_rows=3)
    for i in range(7):
        recorder.record(i, None, 1.0, 2.0, 0, 2.5, None)
    recorder.close()
    metadata = pq.read_metadata(recorder.path)
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sizes == [3, 3, 1]  # two full batches, then what close() found buffered
    assert [row["timer_id"] for row in _read(recorder.path)] == list(range(7))


def test_many_batches_keep_every_row_in_order(tmp_path: Path) -> None:
    # Chunks' buffers are filled again once written: no row may leak into another.
    recorder = _opened(tmp_path, batch_rows=7, max_queued_batches=1000)
    expected = []
    for i in range(1000):
        label = f"l{i % 13}" if i % 3 else None
        fired = (100.0 + i, None) if i % 2 else (None, 50.0 + i)
        recorder.record(i, label, float(i), 100.0 + i, i % 5, *fired)
        expected.append((i, label, float(i), 100.0 + i, i % 5, *fired))
    recorder.close()
    columns = ("timer_id", "label", "scheduled_at", "deadline", "level", "fired_at", "cancelled_at")
    assert [tuple(row[c] for c in columns) for row in _read(recorder.path)] == expected
    assert (recorder.written, recorder.dropped) == (1000, 0)


def test_a_full_queue_drops_whole_batches_and_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing, release = _blocking_writer(monkeypatch, "write_batch")
    recorder = _opened(tmp_path, batch_rows=2, max_queued_batches=1)
    row = (None, 1.0, 2.0, 0, 2.5, None)
    recorder.record(1, *row)
    recorder.record(2, *row)  # batch 1: the writer takes it and blocks
    assert writing.wait(10)
    recorder.record(3, *row)
    recorder.record(4, *row)  # batch 2: waits in the queue (1 slot)
    recorder.record(5, *row)
    recorder.record(6, *row)  # batch 3: no room, dropped without blocking
    assert recorder.dropped == 2
    recorder.record(7, *row)  # buffered: close() writes it
    release.set()
    recorder.close()
    assert [r["timer_id"] for r in _read(recorder.path)] == [1, 2, 3, 4, 7]
    assert (recorder.written, recorder.dropped) == (5, 2)
    # The trace itself says it is incomplete, and by how much (issue 19).
    footer = pq.read_metadata(recorder.path).metadata
    assert dropped_rows(footer) == 2
    assert footer[b"aiowheel.run_id"] == recorder.run_id.encode()


def test_a_complete_trace_says_so_and_an_old_one_says_nothing(tmp_path: Path) -> None:
    recorder = _opened(tmp_path, batch_rows=3)
    for i in range(7):
        recorder.record(i, None, 1.0, 2.0, 0, 2.5, None)
    recorder.close()
    assert dropped_rows(pq.read_metadata(recorder.path).metadata) == 0
    old = tmp_path / "old.parquet"
    pq.write_table(pq.read_table(recorder.path).replace_schema_metadata(None), old)
    assert dropped_rows(pq.read_metadata(old).metadata) is None
    assert dropped_rows({b"aiowheel.dropped_rows": b"x"}) is None


def test_the_file_appears_only_when_closed(tmp_path: Path) -> None:
    recorder = _opened(tmp_path, batch_rows=1)
    recorder.record(1, None, 1.0, 2.0, 0, 2.5, None)
    assert not recorder.path.exists()
    recorder.close()
    assert recorder.path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]  # no partial left


def test_a_directory_gets_one_file_per_run(tmp_path: Path) -> None:
    recorder = recording(tmp_path, run_id="run-7")
    assert recorder.path == tmp_path / "run-7.parquet"
    recorder.open(backend="asyncio", clock=0.0)
    recorder.close()
    assert pq.read_metadata(recorder.path).num_rows == 0


def test_default_run_ids_are_unique(tmp_path: Path) -> None:
    ids = {ParquetRecorder(tmp_path).run_id for _ in range(20)}
    assert len(ids) == 20


def test_lifecycle_errors(tmp_path: Path) -> None:
    recorder = ParquetRecorder(tmp_path / "t.parquet")
    with pytest.raises(RuntimeError, match="before open"):
        recorder.record(1, None, 1.0, 2.0, 0, 2.5, None)
    recorder.open(backend="asyncio", clock=0.0)
    with pytest.raises(RuntimeError, match="already"):
        recorder.open(backend="asyncio", clock=0.0)
    recorder.close()
    recorder.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        recorder.record(1, None, 1.0, 2.0, 0, 2.5, None)


def test_close_without_open_writes_nothing(tmp_path: Path) -> None:
    recorder = ParquetRecorder(tmp_path / "t.parquet")
    recorder.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_rows": 0}, ValueError, "batch_rows"),
        ({"batch_rows": 1.5}, TypeError, "batch_rows"),
        ({"max_queued_batches": 0}, ValueError, "max_queued_batches"),
        ({"run_id": ""}, ValueError, "run_id"),
        ({"run_id": 3}, TypeError, "run_id"),
        ({"implementation": ""}, ValueError, "implementation"),
        ({"compression": "zip"}, ValueError, "compression"),
        ({"every": 0}, ValueError, "every"),
        ({"every": 0.5}, TypeError, "every"),
        ({"every": True}, TypeError, "every"),
    ],
)
def test_bad_arguments(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ParquetRecorder(tmp_path / "t.parquet", **kwargs)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="path"):
        ParquetRecorder(42)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ParquetRecorder(tmp_path / "missing" / "t.parquet")


def test_a_label_that_is_not_a_string_is_kept_as_its_str(tmp_path: Path) -> None:
    class Named:
        def __str__(self) -> str:
            return "named"

    recorder = _opened(tmp_path)
    recorder.record(1, 404, 1.0, 2.0, 0, 2.5, None)  # type: ignore[arg-type]
    recorder.record(2, Named(), 1.0, 2.0, 0, 2.5, None)  # type: ignore[arg-type]
    recorder.close()
    assert [row["label"] for row in _read(recorder.path)] == ["404", "named"]


def test_huge_labels_and_edge_values_round_trip(tmp_path: Path) -> None:
    huge = "x" * 5_000_000
    recorder = _opened(tmp_path, batch_rows=2)
    recorder.record(2**63 - 1, huge, 1, 2, True, float("inf"), None)  # ints and a bool
    recorder.record(-(2**63), "\u00e9\u2603", -1e300, 0.0, -128, None, 0.0)
    recorder.record(3, None, 1.0, 2.0, 127, float("nan"), None)  # NaN is written as null
    recorder.close()
    first, second, third = _read(recorder.path)
    assert (first["timer_id"], first["label"], first["level"]) == (2**63 - 1, huge, 1)
    assert (first["scheduled_at"], first["deadline"], first["fired_at"]) == (1.0, 2.0, float("inf"))
    assert (second["timer_id"], second["label"], second["level"]) == (
        -(2**63),
        "\u00e9\u2603",
        -128,
    )
    assert (second["scheduled_at"], second["fired_at"], second["cancelled_at"]) == (
        -1e300,
        None,
        0.0,
    )
    assert (third["level"], third["fired_at"], third["lateness"]) == (127, None, None)


@pytest.mark.parametrize(
    ("row", "error", "match"),
    [
        (("7", None, 1.0, 2.0, 0, 2.5, None), TypeError, "timer_id must be an int"),
        ((7, None, 1.0, 2.0, 1.5, 2.5, None), TypeError, "level must be an int"),
        ((7, None, "soon", 2.0, 0, 2.5, None), TypeError, "scheduled_at must be a float"),
        ((7, None, 1.0, None, 0, 2.5, None), TypeError, "deadline must be a float"),
        ((7, None, 1.0, 2.0, 0, "late", None), TypeError, "fired_at must be a float"),
        ((7, None, 1.0, 2.0, 200, 2.5, None), ValueError, "out of range"),
        ((2**63, None, 1.0, 2.0, 0, 2.5, None), ValueError, "out of range"),
    ],
)
def test_a_bad_row_is_refused_at_the_call_and_the_rest_is_kept(
    tmp_path: Path, row: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    recorder = _opened(tmp_path, batch_rows=2)
    recorder.record(1, None, 1.0, 2.0, 0, 2.5, None)
    with pytest.raises(error, match=match):
        recorder.record(*row)
    recorder.record(2, "after", 1.0, 2.0, 0, None, 1.5)
    recorder.close()
    assert recorder.error is None
    assert [(r["timer_id"], r["label"]) for r in _read(recorder.path)] == [(1, None), (2, "after")]


def test_a_failing_writer_drops_rows_logs_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: _TraceWriter, writer: Any, chunk: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(_TraceWriter, "write_batch", broken)
    recorder = _opened(tmp_path, batch_rows=2)
    for i in range(5):
        recorder.record(i, None, 1.0, 2.0, 0, 2.5, None)
    with caplog.at_level(logging.ERROR, logger="aiowheel.trace"):
        recorder.close()  # does not raise: tracing never breaks a timer's shutdown
    assert isinstance(recorder.error, OSError)
    assert recorder.dropped == 5
    assert recorder.written == 0
    assert "incomplete" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_a_writer_that_cannot_open_its_file_does_not_block_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The writer fails before it takes its first chunk, while record() fills the
    # queue: close() must still return (it puts the last chunk and the stop marker).
    directory = tmp_path / "gone"
    directory.mkdir()
    recorder = ParquetRecorder(directory / "t.parquet", batch_rows=1, max_queued_batches=1)
    directory.rmdir()
    recorder.open(backend="asyncio", clock=0.0)
    for i in range(10):
        recorder.record(i, None, 1.0, 2.0, 0, 2.5, None)
    closing = threading.Thread(target=recorder.close, daemon=True)
    with caplog.at_level(logging.ERROR, logger="aiowheel.trace"):
        closing.start()
        closing.join(30)
    assert not closing.is_alive()
    assert isinstance(recorder.error, FileNotFoundError)
    assert (recorder.written, recorder.dropped) == (0, 10)
    assert "incomplete" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_missing_pyarrow_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"pip install 'aiowheel\[analytics\]'"):
        ParquetRecorder(tmp_path / "t.parquet")


def test_importing_aiowheel_and_its_trace_module_does_not_import_pyarrow() -> None:
    code = (
        "import sys, aiowheel, aiowheel.trace, aiowheel.analytics.report; "
        "print(sorted(m for m in ('pyarrow', 'pyspark', 'pandas', 'matplotlib') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_the_writer_thread_imports_nothing(tmp_path: Path) -> None:
    # pyarrow imports pandas (when installed) on its first conversion of Python
    # objects; the recorder has it done where it is built, not on its writer thread,
    # where those imports fought a busy event loop for the GIL for seconds. In a fresh
    # interpreter: no module appears between open() and close().
    code = (
        "import sys\n"
        "from aiowheel.trace import ParquetRecorder\n"
        f"r = ParquetRecorder({str(tmp_path)!r}, run_id='fresh')\n"
        "before = set(sys.modules)\n"
        "r.open(backend='asyncio', clock=0.0)\n"
        "r.take_columns([[1, 2], ['a', None], [0.5, 0.5], [1.0, 2.0], [1.0, None],"
        " [None, 1.5], [0, 0]], 2)\n"
        "r.close()\n"
        "print(r.written, sorted(set(sys.modules) - before))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "2 []"


# -- real timer runs -------------------------------------------------------------------


def _noop() -> None:
    pass


@pytest.mark.anyio
async def test_a_timer_run_is_recorded(tmp_path: Path, backend: str) -> None:
    recorder = ParquetRecorder(tmp_path, run_id="live", batch_rows=16)
    async with Timer(recorder=recorder) as timer:
        start = timer.time()
        fired = [timer.schedule_nowait(0.001 * (1 + i % 5), _noop, label="fire") for i in range(40)]
        doomed = [timer.schedule_nowait(5.0, _noop, label="cancel") for _ in range(10)]
        for handle in doomed:
            assert handle.cancel()
        far = timer.schedule_nowait(3600.0, _noop)  # cancelled by aclose(), recorded too
        for handle in fired:
            await handle.wait()
        rearmed = fired[0]
        rearmed.reset(0.002)  # a second period of the same handle: a second row
        await rearmed.wait()
        assert far.pending()
    assert recorder.written == 52
    assert recorder.dropped == 0
    rows = _read(recorder.path)
    assert len(rows) == 52
    assert {row["backend"] for row in rows} == {backend}
    assert {row["run_id"] for row in rows} == {"live"}
    assert all(row["clock_anchor"] <= row["scheduled_at"] for row in rows)
    assert rows[0]["clock_anchor"] == pytest.approx(start, abs=1.0)
    by_label: dict[str | None, list[dict[str, Any]]] = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row)
    assert len(by_label["fire"]) == 41
    assert len(by_label["cancel"]) == 10
    for row in by_label["fire"]:
        assert row["cancelled_at"] is None
        assert row["fired_at"] >= row["deadline"]  # never early
        assert row["lateness"] == pytest.approx(row["fired_at"] - row["deadline"])
        assert row["level"] >= 0
    for row in by_label["cancel"]:
        assert row["fired_at"] is None
        assert row["lateness"] is None
        assert row["scheduled_at"] <= row["cancelled_at"] < row["deadline"]
    (at_close,) = by_label[None]
    assert at_close["cancelled_at"] is not None
    assert at_close["deadline"] > at_close["cancelled_at"]
    # The re-armed handle kept its id: one id has two rows (two periods).
    periods = Counter(row["timer_id"] for row in by_label["fire"])
    assert sorted(periods.values()) == [1] * 39 + [2]


@pytest.mark.anyio
async def test_a_loop_that_never_waits_still_gets_every_row_written(
    tmp_path: Path, backend: str
) -> None:
    # The writer thread needs the GIL for each batch. A loop that never waits hands
    # the GIL over and takes it back around each zero-timeout select(), before a
    # waiting thread wakes; the writer used to be starved for seconds and most rows
    # of a run like this were dropped. Each batch handed over now gives the writer
    # its stint (ParquetRecorder._hand_in).
    recorder = ParquetRecorder(tmp_path, run_id="busy", batch_rows=8192)
    async with Timer(recorder=recorder) as timer:
        schedule = timer.schedule_nowait
        for _ in range(200):
            for _ in range(1000):
                schedule(60.0, _noop).cancel()
            await anyio.lowlevel.checkpoint()
    assert (recorder.written, recorder.dropped) == (200_000, 0)
    assert len(_read(recorder.path)) == 200_000


@pytest.mark.anyio
async def test_levels_are_written_as_filed_the_deepest_wheel_included(
    tmp_path: Path, virtual: bool
) -> None:
    # A wheel of two buckets has its most levels (up to the horizon, 2**48 ticks:
    # 48), and a deadline past the horizon goes to the far bucket (level -3): every
    # level fits the trace's int8 column as it is.
    from aiowheel._wheel import level_for

    recorder = ParquetRecorder(tmp_path, run_id="deep")
    async with Timer(tick=0.001, wheel_size=2, recorder=recorder) as timer:
        wheel = timer._live.wheel  # type: ignore[attr-defined]
        now = wheel._now
        handles = [timer.schedule_nowait(delay, _noop) for delay in (1.0, 1e10, 1e200)]
        assert wheel._now == now  # filing does not move the wheel's clock
        levels = [handle._bucket.level for handle in handles]  # type: ignore[attr-defined]
        # The level a deadline gets depends on where the wheel's clock is within a
        # bucket (the tick phase: 1.0 s is level 9 or 10 on a real clock), so the
        # expected levels are computed from the wheel's own clock and origin.
        filed = [
            level_for(now, wheel.due_tick_of(handle._deadline), 2)  # type: ignore[attr-defined]
            for handle in handles[:2]
        ]
        assert all(handle.cancel() for handle in handles)
    assert levels == [*filed, -3]
    assert 9 <= levels[0] <= 10  # 2**10 > 1,000 ticks
    assert 43 <= levels[1] <= 44  # 2**44 > 1e13 ticks
    if virtual:
        # A virtual clock starts at a known time: the phase, and so the levels, are fixed.
        assert levels == [9, 43, -3]
    rows = sorted(_read(recorder.path), key=lambda row: row["deadline"])
    assert [row["level"] for row in rows] == levels
    assert all(row["fired_at"] is None and row["cancelled_at"] is not None for row in rows)


@pytest.mark.anyio
async def test_async_callbacks_are_recorded_when_they_start(tmp_path: Path) -> None:
    recorder = ParquetRecorder(tmp_path, run_id="async")
    ran = anyio.Event()

    async def callback() -> None:
        ran.set()

    async with Timer(recorder=recorder) as timer:
        handle = timer.schedule_nowait(0.001, callback, label="async")
        await handle.wait()
        assert ran.is_set()
    (row,) = _read(recorder.path)
    assert row["label"] == "async"
    assert row["fired_at"] >= row["deadline"]


@pytest.mark.anyio
async def test_a_sampled_run_round_trips_with_its_rate(tmp_path: Path, backend: str) -> None:
    from aiowheel.analytics.inputs import find_traces, sampling_lines

    recorder = ParquetRecorder(tmp_path, run_id="sampled", every=4, batch_rows=4)
    assert recorder.every == 4
    async with Timer(recorder=recorder) as timer:
        handles = [timer.schedule_nowait(0.001 * (i % 3), _noop, label="s") for i in range(40)]
        doomed = [timer.schedule_nowait(60.0, _noop) for _ in range(9)]
        for handle in doomed[:5]:
            assert handle.cancel()
        for handle in handles:
            await handle.wait()
    rows = _read(recorder.path)
    # Timers 1, 5, 9...: 10 of the 40 that fire, 3 of the 9 that are cancelled (41,
    # 45 by cancel(), 49 by aclose()).
    assert sorted(row["timer_id"] for row in rows) == list(range(1, 50, 4))
    fired = [row for row in rows if row["fired_at"] is not None]
    assert len(fired) == 10
    assert all(row["label"] == "s" and row["fired_at"] >= row["deadline"] for row in fired)
    assert all(row["cancelled_at"] is not None for row in rows if row["fired_at"] is None)
    assert (recorder.written, recorder.dropped) == (13, 0)
    footer = pq.read_metadata(recorder.path).metadata
    assert footer[SAMPLE_EVERY_KEY.encode()] == b"4"
    assert sample_every(footer) == 4
    # The report's inputs know it is sampled, and say so.
    (completeness,) = find_traces([str(tmp_path)]).completeness
    assert (completeness.sample_every, completeness.rows, completeness.dropped) == (4, 13, 0)
    (line,) = sampling_lines(find_traces([str(tmp_path)]))
    assert "one timer in 4" in line
    assert "run `sampled`" in line


def test_a_full_trace_says_every_one_and_an_old_one_reads_as_full(tmp_path: Path) -> None:
    recorder = _opened(tmp_path)
    recorder.record(1, None, 1.0, 2.0, 0, 2.5, None)
    recorder.close()
    footer = pq.read_metadata(recorder.path).metadata
    assert footer[SAMPLE_EVERY_KEY.encode()] == b"1"
    assert sample_every(footer) == 1
    assert sample_every(None) == 1  # written before sampling existed: every timer
    assert sample_every({SAMPLE_EVERY_KEY.encode(): b"junk"}) == 1


def test_column_batches_round_trip_and_a_full_queue_drops_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The timer's columns (aiowheel._tracing): what take_columns gets is what is
    # written, and a batch the queue has no room for is dropped and counted.
    writing, release = _blocking_writer(monkeypatch, "write_columns")
    recorder = _opened(tmp_path, batch_rows=2, max_queued_batches=1)

    def batch(first: int) -> list[list[Any]]:
        # ids, labels, scheduled_at, deadline, fired_at, cancelled_at, level
        return [
            [first, first + 1],
            ["a", None],
            [1.0, 1.5],
            [2.0, 9.0],
            [2.25, None],
            [None, 3.0],
            [0, -1],
        ]

    recorder.take_columns(batch(1), 2)  # the writer takes it and blocks
    assert writing.wait(10)
    recorder.take_columns(batch(3), 2)  # waits in the queue
    dropped = batch(5)
    assert recorder.take_columns(dropped, 2) is dropped  # no room: back to be refilled
    assert recorder.dropped == 2
    recorder.take_columns(batch(7), 1)  # a last, partial batch
    release.set()
    recorder.close()
    rows = _read(recorder.path)
    assert [row["timer_id"] for row in rows] == [1, 2, 3, 4, 7]
    first, second = rows[:2]
    assert (first["label"], first["level"], first["fired_at"], first["cancelled_at"]) == (
        "a",
        0,
        2.25,
        None,
    )
    assert first["lateness"] == pytest.approx(0.25)
    assert (second["label"], second["level"], second["fired_at"]) == (None, -1, None)
    assert second["cancelled_at"] == 3.0
    assert second["lateness"] is None
    assert (recorder.written, recorder.dropped) == (5, 2)
    assert dropped_rows(pq.read_metadata(recorder.path).metadata) == 2


def _rows(first: int, n: int = _HAND_OVER_ROWS) -> list[list[Any]]:
    """A timer's batch of ``n`` cancelled rows (aiowheel/_tracing.py's seven columns),
    timer ids from ``first``."""
    return [
        list(range(first, first + n)),
        [None] * n,
        [1.0] * n,
        [2.0] * n,
        [math.nan] * n,
        [1.5] * n,
        [0] * n,
    ]


def _ids(path: Path) -> list[int]:
    ids = pq.read_table(path, columns=["timer_id"]).column("timer_id").to_pylist()
    return sorted({i - i % _HAND_OVER_ROWS for i in ids})


def test_the_loop_hands_the_gil_over_only_to_a_writer_that_is_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer that keeps up lags by one batch at most and is not waited for (a
    # server's loop, which waits in select() now and then, never waits here); one
    # with a batch already waiting, or a full queue, gets the GIL handed over.
    writing, release = _blocking_writer(monkeypatch, "write_columns")
    hand_overs: list[float] = []

    def hand_over(self: ParquetRecorder, take_wait: float) -> bool:
        hand_overs.append(take_wait)
        return True

    monkeypatch.setattr(ParquetRecorder, "_hand_over", hand_over)
    rows = _HAND_OVER_ROWS
    recorder = _opened(tmp_path, batch_rows=rows, max_queued_batches=2)
    recorder.take_columns(_rows(0), rows)  # the writer takes it and blocks
    assert writing.wait(10)
    recorder.take_columns(_rows(rows), rows)  # the only one waiting: it keeps up
    assert hand_overs == []
    recorder.take_columns(_rows(2 * rows), rows)  # one was waiting already: behind
    assert hand_overs == [_TAKE_WAIT]
    recorder.take_columns(_rows(3 * rows), rows)  # full: offered longer, then dropped
    assert hand_overs == [_TAKE_WAIT, _FULL_TAKE_WAIT]
    assert recorder.dropped == rows
    release.set()
    recorder.close()
    assert _ids(recorder.path) == [0, rows, 2 * rows]


def test_a_writer_held_up_without_the_gil_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer that is behind but busy without the GIL (here blocked, as on a stalled
    # disk) does not start a stint when the loop offers one: the loop goes on after
    # the short wait for it and never waits for a stint to end; after a full queue's
    # offer it did not take, a full queue drops at once for a while.
    from aiowheel import trace

    now = [100.0]
    monkeypatch.setattr(trace, "_clock", lambda: now[0])
    writing, release = _blocking_writer(monkeypatch, "write_columns")
    rows = _HAND_OVER_ROWS
    recorder = _opened(tmp_path, batch_rows=rows, max_queued_batches=2)
    took: list[float | None] = []
    stint_waits: list[float | None] = []

    class Spy:
        def __init__(self, event: threading.Event, waits: list[float | None]) -> None:
            self.event, self.waits = event, waits

        def clear(self) -> None:
            self.event.clear()

        def set(self) -> None:
            self.event.set()

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            return self.event.wait(timeout)

    recorder._took = Spy(recorder._took, took)  # type: ignore[assignment]
    recorder._handed = Spy(recorder._handed, stint_waits)  # type: ignore[assignment]
    recorder.take_columns(_rows(0), rows)  # the writer takes it and is held up
    assert writing.wait(10)
    recorder.take_columns(_rows(rows), rows)
    recorder.take_columns(_rows(2 * rows), rows)  # behind: a stint offered, not taken
    assert took == [_TAKE_WAIT]
    recorder.take_columns(_rows(3 * rows), rows)  # full: offered longer, not taken
    assert took == [_TAKE_WAIT, _FULL_TAKE_WAIT]
    recorder.take_columns(_rows(4 * rows), rows)  # full, held up: dropped at once
    assert took == [_TAKE_WAIT, _FULL_TAKE_WAIT]
    now[0] += _HELD_UP
    recorder.take_columns(_rows(5 * rows), rows)  # a second later: offered again
    assert took == [_TAKE_WAIT, _FULL_TAKE_WAIT, _FULL_TAKE_WAIT]
    assert stint_waits == []
    assert recorder.dropped == 3 * rows
    release.set()
    recorder.close()
    assert _ids(recorder.path) == [0, rows, 2 * rows]


def test_small_batches_are_never_handed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wake-up per few rows would cost the loop more than the rows: below
    # _HAND_OVER_ROWS a batch is queued or, the queue full, dropped, never waited on.
    monkeypatch.setattr(
        ParquetRecorder, "_hand_over", lambda self, take_wait: pytest.fail("handed over")
    )
    writing, release = _blocking_writer(monkeypatch, "write_columns")
    recorder = _opened(tmp_path, batch_rows=1, max_queued_batches=2)
    recorder.take_columns(_rows(1, 1), 1)  # the writer takes it and is held up
    assert writing.wait(10)
    for timer_id in range(2, 6):  # 2 and 3 queued, 4 and 5 dropped
        recorder.take_columns(_rows(timer_id, 1), 1)
    assert recorder.dropped == 2
    release.set()
    recorder.close()
    assert [row["timer_id"] for row in _read(recorder.path)] == [1, 2, 3]
