"""Prototype for docs/design.md "Compiled core": dict buckets + heap of occupied buckets
(the current design, stripped to what tools/compiled_core/bench_wheel.py measures)."""

from __future__ import annotations

import heapq
import math
from typing import Final

from mypy_extensions import mypyc_attr

_INF: Final = math.inf


class Bucket(dict["WheelEntry", None]):
    __slots__ = ("level", "tick", "time")

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level
        self.tick: int | None = None
        self.time = _INF

    __hash__ = object.__hash__  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return self is other


@mypyc_attr(allow_interpreted_subclasses=True)
class WheelEntry:
    __slots__ = ("_bucket", "_deadline")

    def __init__(self, deadline: float = 0.0) -> None:
        self._deadline = deadline
        self._bucket: Bucket | None = None


class Wheel:
    def __init__(self, tick: float, wheel_size: int, origin: float) -> None:
        self.tick = tick
        self.origin = origin
        self._size = wheel_size
        self._now = 0
        self._levels: list[list[Bucket]] = [[Bucket(0) for _ in range(wheel_size)]]
        self._widths: list[int] = [1]
        self._limits: list[int] = [wheel_size]
        self._heap: list[tuple[int, int, float, Bucket]] = []
        self._due = Bucket(-1)

    @property
    def now_tick(self) -> int:
        return self._now

    def tick_time(self, tick: int) -> float:
        return self.origin + tick * self.tick

    def _set_now(self, now: int) -> None:
        self._now = now
        size = self._size
        for level, width in enumerate(self._widths):
            self._limits[level] = now - now % width + width * size

    def _add_level(self) -> None:
        width = self._widths[-1] * self._size
        self._levels.append([Bucket(len(self._levels)) for _ in range(self._size)])
        self._widths.append(width)
        self._limits.append(self._now - self._now % width + width * self._size)

    def insert(self, entry: WheelEntry, deadline: float) -> float:
        entry._deadline = deadline
        return self._file(entry, math.ceil((deadline - self.origin) / self.tick))

    def _file(self, entry: WheelEntry, e: int) -> float:
        if e <= self._now:
            bucket = self._due
            bucket[entry] = None
            entry._bucket = bucket
            return -_INF
        level = 0
        limits = self._limits
        while level < len(limits) and e >= limits[level]:
            level += 1
        if level == len(limits):
            self._add_level()
            return self._file(entry, e)
        width = self._widths[level]
        number = e // width
        bucket = self._levels[level][number % self._size]
        start = number * width
        bucket[entry] = None
        entry._bucket = bucket
        if bucket.tick != start:
            when = self.origin + start * self.tick
            bucket.tick = start
            bucket.time = when
            heapq.heappush(self._heap, (start, level, when, bucket))
            return when
        return _INF

    def remove(self, entry: WheelEntry) -> bool:
        bucket = entry._bucket
        if bucket is None:
            return False
        del bucket[entry]
        entry._bucket = None
        return True

    def extend(self, entry: WheelEntry, deadline: float) -> float:
        bucket = entry._bucket
        if bucket is not None and bucket.tick is not None and deadline >= bucket.time:
            entry._deadline = deadline
            return _INF
        if bucket is not None:
            del bucket[entry]
        return self.insert(entry, deadline)

    def next_expiry(self) -> float | None:
        if self._due:
            return -_INF
        heap = self._heap
        while heap:
            start, _level, when, bucket = heap[0]
            if bucket and bucket.tick == start:
                return when
            heapq.heappop(heap)
            if bucket.tick == start:
                bucket.tick = None
                bucket.time = _INF
        return None

    def advance(self, now: float) -> list[Bucket]:
        fired: list[Bucket] = []
        if self._due:
            fired.append(self._due)
            self._due = Bucket(-1)
        heap = self._heap
        size = self._size
        while heap and heap[0][2] <= now:
            start, level, when, bucket = heapq.heappop(heap)
            if bucket.tick != start:
                continue
            bucket.tick = None
            bucket.time = _INF
            if not bucket:
                continue
            self._levels[level][(start // self._widths[level]) % size] = Bucket(level)
            if start > self._now:
                self._set_now(start)
            if level == 0:
                late = [entry for entry in bucket if entry._deadline > when]
                for entry in late:
                    del bucket[entry]
                    e = math.ceil((entry._deadline - self.origin) / self.tick)
                    self._file(entry, e if e > start else start + 1)
                if bucket:
                    fired.append(bucket)
            else:
                for entry in bucket:
                    self._file(entry, math.ceil((entry._deadline - self.origin) / self.tick))
                bucket.clear()
                if self._due:
                    fired.append(self._due)
                    self._due = Bucket(-1)
        target = math.floor((now - self.origin) / self.tick)
        if target > self._now:
            self._set_now(target)
        return fired


def drain_bucket(bucket: Bucket) -> int:
    """What the timer's dispatch does with a returned bucket (minus the callbacks)."""
    n = 0
    for entry in bucket:
        entry._bucket = None
        n += 1
    bucket.clear()
    return n
