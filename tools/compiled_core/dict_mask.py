"""Prototype for docs/design.md "Compiled core": dict buckets + tokio's per-level
occupied bitmask instead of the heap."""

from __future__ import annotations

import math
from typing import Final

from mypy_extensions import mypyc_attr

_INF: Final = math.inf


class Bucket(dict["WheelEntry", None]):
    __slots__ = ("level", "slot", "tick", "time")

    def __init__(self, level: int, slot: int) -> None:
        super().__init__()
        self.level = level
        self.slot = slot
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
        self._full = (1 << wheel_size) - 1
        self._now = 0
        self._levels: list[list[Bucket]] = [[Bucket(0, i) for i in range(wheel_size)]]
        self._masks: list[int] = [0]
        self._widths: list[int] = [1]
        self._limits: list[int] = [wheel_size]
        self._due = Bucket(-1, 0)

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
        level = len(self._levels)
        self._levels.append([Bucket(level, i) for i in range(self._size)])
        self._masks.append(0)
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
        slot = number % self._size
        bucket = self._levels[level][slot]
        bucket[entry] = None
        entry._bucket = bucket
        if len(bucket) == 1:
            start = number * width
            when = self.origin + start * self.tick
            bucket.tick = start
            bucket.time = when
            self._masks[level] |= 1 << slot
            return when
        return _INF

    def remove(self, entry: WheelEntry) -> bool:
        bucket = entry._bucket
        if bucket is None:
            return False
        del bucket[entry]
        entry._bucket = None
        if not bucket and bucket.level >= 0 and bucket.tick is not None:
            # Emptied: clear its bit (a bucket handed back by advance has tick None).
            self._masks[bucket.level] &= ~(1 << bucket.slot)
            bucket.tick = None
            bucket.time = _INF
        return True

    def extend(self, entry: WheelEntry, deadline: float) -> float:
        bucket = entry._bucket
        if bucket is not None and bucket.tick is not None and deadline >= bucket.time:
            entry._deadline = deadline
            return _INF
        if bucket is not None:
            self.remove(entry)
        return self.insert(entry, deadline)

    def _next_bucket(self) -> tuple[int, int] | None:
        """(start tick, level) of the earliest occupied bucket, from the masks."""
        best = -1
        best_level = -1
        size = self._size
        full = self._full
        now = self._now
        masks = self._masks
        for level in range(len(masks)):
            mask = masks[level]
            if mask == 0:
                continue
            width = self._widths[level]
            number = now // width
            cur = number % size
            # Rotate so that the current slot is bit 0 (it can be occupied: a coarser
            # bucket starting where a finer one just came due).
            rotated = ((mask >> cur) | (mask << (size - cur))) & full
            k = (rotated & -rotated).bit_length() - 1  # distance in buckets
            start = (number + k) * width
            if best < 0 or start < best:
                best = start
                best_level = level
        if best < 0:
            return None
        return best, best_level

    def next_expiry(self) -> float | None:
        if self._due:
            return -_INF
        found = self._next_bucket()
        if found is None:
            return None
        return self.origin + found[0] * self.tick

    def advance(self, now: float) -> list[Bucket]:
        fired: list[Bucket] = []
        if self._due:
            fired.append(self._due)
            self._due = Bucket(-1, 0)
        size = self._size
        while True:
            found = self._next_bucket()
            if found is None:
                break
            start, level = found
            when = self.origin + start * self.tick
            if when > now:
                break
            width = self._widths[level]
            slot = (start // width) % size
            bucket = self._levels[level][slot]
            self._masks[level] &= ~(1 << slot)
            bucket.tick = None
            bucket.time = _INF
            self._levels[level][slot] = Bucket(level, slot)
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
                    self._due = Bucket(-1, 0)
        target = math.floor((now - self.origin) / self.tick)
        if target > self._now:
            self._set_now(target)
        return fired


def drain_bucket(bucket: Bucket) -> int:
    n = 0
    for entry in bucket:
        entry._bucket = None
        n += 1
    bucket.clear()
    return n
