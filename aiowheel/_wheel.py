"""The hierarchical timing wheel: a pure data structure, no I/O, no ``async``.

Owns ``Wheel`` (the levels, the heap of occupied buckets, the due and far buckets,
filing, and the pass over them with its recovery record), ``Bucket`` (an intrusive
list), ``WheelEntry`` (what a bucket links), ``level_for`` (the level rule, which
``Wheel._file`` copies inline) and hiding linked entries from the garbage collector.
It is told "now" and hands back what expired; its caller decides what to do with it.
How the wheel works and who calls it: docs/design.md, "Module map", then "Ticks:
never early" to "Finding the next wake-up".
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Callable, Iterator
from fractions import Fraction
from types import FunctionType
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

if TYPE_CHECKING:
    from mypy_extensions import u8  # compiled: a one-byte field; a plain int otherwise

_T = TypeVar("_T")

try:  # mypyc reads its class options from this decorator (aiowheel/_compiled.py)
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy installed: the decorator does nothing

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls


__all__ = [
    "DUE_LEVEL",
    "FAR_LEVEL",
    "HORIZON",
    "QUEUE_LEVEL",
    "Bucket",
    "Wheel",
    "WheelEntry",
    "deadline_of",
    "level_for",
]

# Final: compiled, these are C constants, not module-dict lookups; and math.ceil and
# math.floor are called directly, which mypyc turns into C (docs/design.md, "Compiled
# core").
_INF: Final = math.inf
_NAN: Final = math.nan
_heappush: Final = heapq.heappush
_heappop: Final = heapq.heappop

#: Ticks ahead of the wheel's clock past which entries are filed at the horizon.
HORIZON: Final = 1 << 48
#: The far bucket's key in the heap, beside each level's ``-level``. Buckets due at one
#: tick are taken coarsest first (their entries were filed before the ties filed on a
#: finer level since), and the far bucket is the coarsest of all: its key is below any
#: ``-level`` (a wheel never has as many levels as HORIZON has bits). It must differ
#: from every level's key: the heap compares (tick, key, time) and would otherwise
#: compare two buckets themselves, which have no order (TypeError).
_FAR_KEY: Final = -(1 << 16)


# A bucket's level: 0, 1, ... for the wheels of growing tick widths, and these tags
# for the buckets that are in no wheel.
DUE_LEVEL: Final = -1  # entries already due when filed (Wheel._due, and its chunks)
QUEUE_LEVEL: Final = -2  # the worker pool's run queue (aiowheel/_dispatch.py, RunQueue)
FAR_LEVEL: Final = -3  # entries past the horizon (Wheel._far)
#: A bucket's ``tick`` while it is not scheduled (a scheduled bucket's tick is later
#: than the wheel's clock, which starts at 0): an int, not None, so that compiled,
#: ``bucket.tick != start`` in ``_file`` compares two machine integers instead of
#: boxing ``start`` for a rich comparison (about 150 instructions of a schedule).
UNSCHEDULED: Final = -1


# -- hidden from the collector while linked (compiled core only) ----------------------
# Docs: docs/design.md, "Pending timers and the garbage collector".
#
# The compiled core keeps pending entries out of the cyclic garbage collector's lists,
# so that no collection walks them, however many are pending. An entry's ``_gc`` says
# where it stands:
#
#   GC_TRACKED  the collector sees it, and it is in no bucket;
#   GC_YOUNG    the collector sees it, and it is linked in a bucket (linked since the
#               last collection started);
#   GC_HIDDEN   the collector does not see it, and it is linked in a bucket;
#   GC_OFF      never hidden: the pure core, or no aiowheel._gcutil.
#
# A bucket that links a new entry makes it GC_YOUNG and counts it (``_young``); the
# first one since the last collection puts the bucket in _DIRTY. At the start of every
# collection (gc.callbacks) ``hide_young`` walks each dirty bucket from its end, where
# ``add`` puts new entries, and hides its young ones. An entry that leaves its bucket
# for good (``Bucket.remove``, ``take_all``: fired, cancelled, or handed back by
# ``clear`` when its timer or loop closes) becomes GC_TRACKED again, and a hidden one
# is shown to the collector at once. A move between buckets (a cascade, a re-file,
# ``extend``: ``Bucket.move_out``) moves its count with it. So a timer cancelled or
# fired before the next collection, most of a server's, costs a few stores and no C
# call, and one that lives longer, one C call to hide it and one to show it.
#
# The invariant: **an entry the collector does not see is linked in a bucket, or is
# being moved between two (``Wheel._moving``, ``Wheel._held``: ``clear`` takes those
# back too); a bucket's ``_young`` counts its GC_YOUNG entries, and a bucket with any
# is in _DIRTY.** So a collection never meets a hidden entry that has left its wheel,
# and a cycle through a fired or cancelled handle (a callback that re-arms it) is
# freed as before; nothing is held for later (the timer keeps no reference to a
# cancelled or fired handle: docs/design.md, guarantee 7). A pending entry is reachable
# from its bucket anyway, and what it holds (callback, arguments, context) must stay
# alive through it.
#
# No code that links or unlinks allocates between the link (or unlink) and its step
# here (the re-entrancy rule, docs/design.md), so a collection, which may start at any
# allocation and runs hide_young, never finds a count half-changed; and none of it
# runs Python code, so no other thread can.
GC_TRACKED: Final = 0
GC_YOUNG: Final = 1
GC_HIDDEN: Final = 2
GC_OFF: Final = 3
#: Dirty buckets that start a hide_young without a collection (a process that
#: disabled the collector still makes buckets: the due chunks of every pass).
_DIRTY_LIMIT: Final = 4096
_DIRTY: Final[list[Bucket]] = []


def _absent(obj: object, /) -> None:
    """Stands for aiowheel._gcutil's functions where it is not built: never called
    then, since no entry is ever hidden (GC_OFF)."""


try:
    from ._gcutil import track as _c_track
    from ._gcutil import untrack as _c_untrack
except ImportError:  # a pure install
    _c_track = _c_untrack = _absent
    _FOUND = False
else:
    _FOUND = True

# Final: compiled, a C static each, called without a module-dict lookup.
_show: Final = _c_track
_hide: Final = _c_untrack
#: Whether the core runs compiled: compiled, this module's functions are not Python
#: functions. The pure core (AIOWHEEL_PURE=1) runs the .py beside the C modules that
#: may be there (aiowheel/_gcutil.c, aiowheel/_ctxutil.c) and keeps its behaviour
#: without them: nothing hidden here, and context copies in aiowheel/_handle.py.
CORE_COMPILED: Final = type(_absent) is not FunctionType
HIDES: Final = _FOUND and CORE_COMPILED

#: The ``_gc`` a new entry starts with.
GC_START: Final = GC_TRACKED if HIDES else GC_OFF


def _dirty(bucket: Bucket) -> None:
    """``bucket`` holds young entries: list it for the next hide_young."""
    bucket._dirty = True
    _DIRTY.append(bucket)
    if len(_DIRTY) >= _DIRTY_LIMIT:
        hide_young()


def _left(entry: WheelEntry) -> None:
    """``entry`` left its bucket for good (its count is moved out already): the
    collector sees it, as before."""
    state = entry._gc
    if state == GC_YOUNG:
        entry._gc = GC_TRACKED
    elif state == GC_HIDDEN:
        entry._gc = GC_TRACKED
        _show(entry)


def hide_young() -> None:
    """Take the young entries of every dirty bucket out of the collector's lists.
    Allocates nothing and runs no Python code (the entries stay alive: their buckets
    hold them)."""
    dirty = _DIRTY
    for bucket in dirty:
        bucket._dirty = False
        n = bucket._young
        bucket._young = 0
        entry = bucket._last
        while n > 0 and entry is not None:
            if entry._gc == GC_YOUNG:
                entry._gc = GC_HIDDEN
                _hide(entry)
                n -= 1
            entry = entry._prev
    dirty.clear()


def _on_collection(phase: str, info: dict[str, int]) -> None:
    """gc.callbacks: before every collection, hide the entries linked since the last
    one, so that it walks none."""
    if phase == "start":
        hide_young()


if HIDES:
    gc.callbacks.append(_on_collection)


def level_for(now: int, e: int, size: int) -> int:
    """The level an entry due at tick ``e`` (later than ``now``) is filed on while the
    wheel's clock is at tick ``now``: the lowest whose window holds ``e`` (tokio's
    ``level_for``). Level ``k``'s buckets are ``size**k`` ticks wide, and its window
    is ``size`` buckets from ``now`` rounded down to a bucket's width.

    ``Wheel._file`` keeps an inline copy over the windows it keeps up to date
    (``_limit0``, each ``Level``'s ``limit``: the hot path of every schedule
    computes no power);
    tests/test_wheel.py checks that the two agree."""
    level = 0
    width = 1
    while e >= now - now % width + width * size:
        level += 1
        width *= size
    return level


def deadline_of(entry: WheelEntry) -> float:
    """Sort key: an entry's deadline."""
    return entry._deadline


class Bucket:
    """The entries filed for one slot of one wheel: an intrusive doubly-linked list
    (Kafka's ``TimerTaskList``), oldest first.

    Each entry holds its own ``_prev``/``_next`` links, so filing and removing are a
    few pointer writes, with no allocation and no hashing, and a pending entry costs
    two pointers instead of a dict slot and its share of a hash table
    (docs/design.md, "Data structures, compiled").

    ``tick`` is the tick at which the bucket comes due in its current revolution
    (``UNSCHEDULED`` while it is empty and unscheduled, or once it has been detached
    from the wheel for firing); ``time`` is the same instant on the loop clock;
    ``level`` is the wheel the bucket belongs to, or a tag for a bucket in no wheel
    (``DUE_LEVEL``, ``QUEUE_LEVEL``, ``FAR_LEVEL``).

    Invariant: ``entry._bucket is self`` exactly for the entries linked here, and an
    entry in no bucket has ``_prev`` and ``_next`` ``None`` (a handle a user keeps must
    not keep its old neighbours alive).

    Ties (equal deadlines) are in filing order, across levels too: the entries a
    cascade brings down (``add_cascaded``) are a prefix of the list, ``_cascaded``
    its last entry. For one deadline the level the wheel picks only moves down as
    its clock moves on, so an entry that comes down from a coarser level was filed
    before every entry filed here directly, and after those of earlier cascades
    (coarser buckets cascade first: ``Wheel.advance``).
    """

    __slots__ = ("_cascaded", "_dirty", "_first", "_last", "_young", "level", "tick", "time")

    def __init__(self, level: int = 0) -> None:
        self._first: WheelEntry | None = None
        self._last: WheelEntry | None = None
        self._cascaded: WheelEntry | None = None
        # Its GC_YOUNG entries, and whether it is in _DIRTY (the collector, above).
        self._young = 0
        self._dirty = False
        self.level = level
        self.tick = UNSCHEDULED
        self.time = _INF

    def add(self, entry: WheelEntry) -> None:
        """Link ``entry`` (in no bucket) at the end.

        An entry that is already linked is refused: linking it twice would make a
        cycle (a self-linked list that ``advance`` walks for ever). The timer never
        asks for that; this check keeps a re-entrancy bug from corrupting the list
        (docs/design.md, "Re-entrancy")."""
        if entry._bucket is not None:
            raise RuntimeError(f"{entry!r} is already filed in {entry._bucket!r}")
        last = self._last
        entry._prev = last
        if last is None:
            self._first = entry
        else:
            last._next = entry
        self._last = entry
        entry._bucket = self
        if entry._gc <= GC_YOUNG:  # new here, or moved here young: count it
            entry._gc = GC_YOUNG
            self._young += 1
            if not self._dirty:
                _dirty(self)

    def add_cascaded(self, entry: WheelEntry) -> None:
        """Link ``entry`` (in no bucket) at the end of the cascaded prefix: after the
        entries earlier cascades brought, before those filed here directly."""
        if entry._bucket is not None:
            raise RuntimeError(f"{entry!r} is already filed in {entry._bucket!r}")
        before = self._cascaded
        after = self._first if before is None else before._next
        entry._prev = before
        entry._next = after
        if before is None:
            self._first = entry
        else:
            before._next = entry
        if after is None:
            self._last = entry
        else:
            after._prev = entry
        self._cascaded = entry
        entry._bucket = self
        if entry._gc <= GC_YOUNG:  # new here, or moved here young: count it
            entry._gc = GC_YOUNG
            self._young += 1
            if not self._dirty:
                _dirty(self)

    def remove(self, entry: WheelEntry) -> None:
        """Unlink ``entry``, which is in this bucket, for good: it leaves the wheel."""
        self.move_out(entry)
        if entry._gc != GC_OFF:
            _left(entry)

    def move_out(self, entry: WheelEntry) -> None:
        """Unlink ``entry``, which is in this bucket, to link it in another: the
        wheel's moves (a cascade, a re-file, ``Wheel.extend``), which keep it hidden
        from the collector."""
        before = entry._prev
        after = entry._next
        if entry is self._cascaded:
            self._cascaded = before  # the prefix ends one entry earlier
        if before is None:
            self._first = after
        else:
            before._next = after
            entry._prev = None
        if after is None:
            self._last = before
        else:
            after._prev = before
            entry._next = None
        entry._bucket = None
        if entry._gc == GC_YOUNG:
            self._young -= 1

    def pop_first(self) -> WheelEntry | None:
        """Unlink and return the oldest entry; ``None`` when empty."""
        entry = self._first
        if entry is not None:
            self.remove(entry)
        return entry

    def take_all(self) -> list[WheelEntry]:
        """Unlink every entry; return them, oldest first."""
        entries: list[WheelEntry] = []
        entry = self._first
        while entry is not None:
            after = entry._next
            entry._prev = entry._next = None
            entry._bucket = None
            if entry._gc != GC_OFF:
                _left(entry)
            entries.append(entry)
            entry = after
        self._first = self._last = self._cascaded = None
        self._young = 0
        return entries

    def empty(self) -> bool:
        return self._first is None

    def __iter__(self) -> Iterator[WheelEntry]:
        """The entries, oldest first (not safe against moving the one yielded)."""
        entry = self._first
        while entry is not None:
            after = entry._next
            yield entry
            entry = after

    def __len__(self) -> int:
        """O(n): for introspection and tests, not for the hot paths."""
        count = 0
        entry = self._first
        while entry is not None:
            count += 1
            entry = entry._next
        return count

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, WheelEntry) and entry._bucket is self

    def __repr__(self) -> str:
        return f"<Bucket level={self.level} tick={self.tick} entries={len(self)}>"


# Compiled, a class accepts Python subclasses only when told so: the tests' entries
# subclass this one.
@mypyc_attr(allow_interpreted_subclasses=True)
class WheelEntry:
    """Anything the wheel can hold: a deadline, a bucket slot and the bucket's links.

    ``_deadline`` is the entry's true deadline on the loop clock. ``_bucket`` is the
    bucket that holds the entry while it is pending (a wheel bucket, a bucket the
    wheel has handed back as expired, or the worker pool's run queue), ``None``
    otherwise; ``_prev`` and ``_next`` are its neighbours there.
    """

    __slots__ = ("_bucket", "_deadline", "_gc", "_next", "_prev")

    # Where the entry stands with the garbage collector (above). First in the compiled
    # struct: one byte in the padding after mypyc's bitmap, no more memory.
    _gc: u8

    def __init__(self, deadline: float = 0.0) -> None:
        self._gc = GC_START
        self._deadline = deadline
        self._bucket: Bucket | None = None
        self._prev: WheelEntry | None = None
        self._next: WheelEntry | None = None


@final
class Level:
    """One wheel of the hierarchy: the first due tick past its window (``limit``, kept
    by ``Wheel._set_now``), its buckets' width in ticks (``wheel_size ** level``) and
    its buckets. The one place a level's state is kept. Native fields, where a tuple
    per level made every schedule past level 0 unbox the tuple and two ints again,
    level by level."""

    __slots__ = ("buckets", "limit", "width")

    def __init__(self, limit: int, width: int, buckets: list[Bucket]) -> None:
        self.limit = limit
        self.width = width
        self.buckets = buckets


class Wheel:
    """A hierarchy of timing wheels over integer ticks of ``tick`` seconds (Kafka's
    ``TimingWheel`` with overflow levels made on demand, rounding up: never early).

    ``insert``/``remove``/``extend`` are O(1) (O(levels) to pick a level, and levels
    grow with the logarithm of the longest delay). ``advance(now)`` returns the
    buckets whose entries are due, in due order; everything it returns is already
    detached, so the caller may run callbacks that insert or remove entries while it
    walks them.

    Invariants (``_check`` asserts them; tests/test_wheel_model.py calls it after
    every step):

    * an entry is pending exactly while ``entry._bucket`` is not ``None``, and then it
      is linked in that bucket's list; an entry in no bucket has no links;
    * a bucket whose ``tick`` is not ``UNSCHEDULED`` is in the heap under that tick,
      and that tick is later than the wheel's current tick (``_now``);
    * a bucket's entries have due ticks inside its range, or later (a lazily extended
      entry: see ``extend``, or one past the horizon), never earlier.
    """

    __slots__ = (
        "_due",
        "_far",
        "_heap",
        "_held",
        "_levels",
        "_limit0",
        "_moving",
        "_now",
        "_out",
        "_size",
        "_wheel0",
        "origin",
        "tick",
    )

    def __init__(self, tick: float, wheel_size: int, origin: float) -> None:
        if not (tick > 0 and math.isfinite(tick)):
            raise ValueError(f"tick must be a positive finite number of seconds, got {tick!r}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size!r}")
        self.tick = float(tick)
        self.origin = float(origin)
        self._size = wheel_size
        # The wheel's clock: every bucket due at or before this tick has been flushed.
        self._now = 0
        # The levels, finest first, each a Level. Level 0's buckets and limit are
        # also kept in attributes of their own (copies _set_now keeps equal): it
        # takes most inserts, and _file reads them without indexing the list.
        self._wheel0 = [Bucket(0) for _ in range(wheel_size)]
        self._levels: list[Level] = [Level(wheel_size, 1, self._wheel0)]
        self._limit0 = wheel_size
        self._heap: list[tuple[int, int, float, Bucket]] = []
        # Entries that were already due when filed; they expire on the next advance.
        self._due = Bucket(DUE_LEVEL)
        # Entries past the horizon (see _file_far).
        self._far = Bucket(FAR_LEVEL)
        # The recovery record of a pass (see "the pass" below).
        self._out: list[Bucket] = []
        self._moving: WheelEntry | None = None
        self._held: list[WheelEntry] | None = None

    # -- clock --------------------------------------------------------------------

    def tick_time(self, tick: int) -> float:
        return self.origin + tick * self.tick

    @property
    def levels(self) -> int:
        """How many wheels exist (overflow wheels are created on demand)."""
        return len(self._levels)

    def _set_now(self, now: int) -> None:
        # Recompute each level's window for the new current tick: in place, with an
        # index rather than a `for` (whose iterator is an allocation, which may run
        # finalizers), allocating nothing.
        self._now = now
        size = self._size
        levels = self._levels
        index = 0
        while index < len(levels):
            level = levels[index]
            width = level.width
            level.limit = now - now % width + width * size
            index += 1
        self._limit0 = levels[0].limit

    def reserve(self, deadline: float) -> None:
        """Create the levels that filing at ``deadline`` needs, ahead of the filing.

        Creating a level allocates buckets, and an allocation may run the garbage
        collector, whose finalizers may re-enter the timer. The timer calls this before
        it reads the state of the handle it files, so that the filing itself allocates
        nothing but the heap's tuple (after the link: see ``_file``)."""
        e = self.due_tick_of(deadline)
        horizon = self._now + HORIZON
        if e > horizon:
            e = horizon
        while e >= self._levels[-1].limit:
            self._add_level()

    def _add_level(self) -> None:
        # Every allocation (the buckets, the Level) comes before the first append:
        # one may run the collector, whose finalizers may re-arm a timer far enough
        # to add a level themselves (issue 28, item 3). Then the level built here is
        # stale (its number, its width): build it again on top of theirs. The one
        # append then adds the whole level.
        size = self._size
        while True:
            number = len(self._levels)
            buckets = [Bucket(number) for _ in range(size)]
            width = self._levels[-1].width * size
            limit = self._now - self._now % width + width * size
            level = Level(limit, width, buckets)
            if len(self._levels) == number:
                break
        self._levels.append(level)

    # -- filing -------------------------------------------------------------------

    def insert(self, entry: WheelEntry, deadline: float) -> float:
        """File ``entry`` under ``deadline``.

        Returns the time at which the entry's bucket comes due when this insert
        opened that bucket (so the caller can move its wake-up earlier), ``-inf`` when
        the entry is already due, and ``inf`` when the bucket was already scheduled;
        NaN when it filed nothing because a finalizer, run by an allocation on the
        way, filed the entry itself (see ``_file``: that later call stands).
        """
        try:
            e = math.ceil((deadline - self.origin) / self.tick)
        except (OverflowError, ValueError):
            e = self._far_tick(deadline)  # before any change: it may raise
        entry._deadline = deadline
        return self._file(entry, e)

    def due_tick_of(self, deadline: float) -> int:
        """The first tick at or after ``deadline`` (rounded up: never early), for any
        finite deadline (past the float range of a tick number, ``_far_tick``)."""
        try:
            return math.ceil((deadline - self.origin) / self.tick)
        except (OverflowError, ValueError):
            return self._far_tick(deadline)

    def _far_tick(self, deadline: float) -> int:
        # (deadline - origin) / tick overflowed a float: the deadline is out of any
        # reach (or not a number, which the timer's checks never let through).
        if deadline - deadline != 0.0:
            raise ValueError(f"deadline must be finite, got {deadline!r}")
        if deadline < self.origin:
            return self._now
        # Exact, in integers: the far bucket (see _file_far) keeps the true tick.
        ticks = Fraction(deadline) - Fraction(self.origin)
        return math.ceil(ticks / Fraction(self.tick))

    def _file(self, entry: WheelEntry, e: int, cascaded: bool = False) -> float:
        # The hot path of every schedule: kept flat on purpose (each Python-level call
        # or attribute lookup here is a measurable share of a ~1 us schedule).
        # `cascaded`: the entry comes down from a coarser level (or the far bucket),
        # so it goes before the ties filed directly (Bucket.add_cascaded).
        # The level: inline copy of level_for, over the windows _set_now keeps.
        if e < self._limit0:
            if e <= self._now:
                if cascaded:
                    self._due.add_cascaded(entry)
                else:
                    self._due.add(entry)
                return -_INF
            bucket = self._wheel0[e % self._size]
            start = e
        else:
            # A coarser level: the lowest one whose window holds e (the limits
            # _set_now keeps up to date as the clock moves). Nothing here allocates
            # an object the collector tracks (an index, not a `for`, whose list
            # iterator is one): a collection here runs finalizers between the
            # caller's reading of the entry's state and the link (issue 28, item 3;
            # the re-check below is the backstop).
            levels = self._levels
            index = 1
            count = len(levels)
            while index < count:
                level = levels[index]
                if e < level.limit:
                    width = level.width
                    number = e // width
                    bucket = level.buckets[number % self._size]
                    start = number * width
                    break
                index += 1
            else:
                if e > self._now + HORIZON:
                    # Past the horizon: the far bucket, which comes due once its
                    # earliest entry is within the horizon. Levels stay bounded.
                    return self._file_far(entry, e)
                self._add_level()
                return self._file(entry, e, cascaded)
        if entry._bucket is not None:
            # Invariant: an entry is linked in one bucket. A finalizer re-armed this
            # very entry while the call filing it was on its way here (the garbage
            # collector ran at an allocation; issue 28, item 3: it made this link
            # raise "already filed"). That later call stands: file nothing and say
            # so (NaN), and the caller counts nothing (Engine.file).
            return _NAN
        if bucket.tick != start:
            # First entry of this bucket in this revolution: schedule the bucket.
            # Link first, allocate (the heap's tuple) last: an allocation may run the
            # garbage collector, and its finalizers may re-enter the timer; they must
            # find the entry filed, not half-filed (docs/design.md, "Re-entrancy").
            when = self.origin + start * self.tick
            bucket.tick = start
            bucket.time = when
            if cascaded:
                bucket.add_cascaded(entry)
            else:
                bucket.add(entry)
            # Keyed (tick, -level): of the buckets due at one tick, the coarser ones
            # cascade first, so their entries (filed earlier) go out ahead of ties.
            _heappush(self._heap, (start, -bucket.level, when, bucket))
            return when
        if cascaded:
            bucket.add_cascaded(entry)
        else:
            bucket.add(entry)
        return _INF

    def _file_far(self, entry: WheelEntry, e: int) -> float:
        # The far bucket holds the entries whose due tick is past the horizon. It is
        # scheduled at the tick where its earliest entry comes within the horizon,
        # and no earlier: a far deadline costs O(1) passes to reach, however far the
        # clock jumps meanwhile (it used to walk one horizon per pass). Moving that
        # tick earlier leaves the old heap item stale (tick differs): it is skipped.
        far = self._far
        start = e - HORIZON  # > _now: e is past the horizon
        if far.tick == UNSCHEDULED or start < far.tick:
            when = self._far_time(start)
            far.tick = start
            far.time = when
            far.add(entry)  # link first, then allocate (see _file)
            _heappush(self._heap, (start, _FAR_KEY, when, far))
            return when
        far.add(entry)
        return _INF

    def _far_time(self, start: int) -> float:
        # origin + start * tick, for a tick number too big for a float (a deadline
        # near the largest float with a fine tick): exactly, then rounded.
        try:
            return self.origin + start * self.tick
        except OverflowError:
            return float(Fraction(self.origin) + start * Fraction(self.tick))

    def insert_due(self, entry: WheelEntry, deadline: float) -> float:
        """File ``entry`` as due now: it comes out of the next ``advance``, whatever
        tick the wheel's clock is at. For deadlines the caller knows have passed (a
        delay <= 0), which must fire on the next pass, not at the next tick."""
        entry._deadline = deadline
        self._due.add(entry)
        return -_INF

    def remove(self, entry: WheelEntry) -> bool:
        """Take ``entry`` out of whatever bucket holds it. False if it was not pending.

        An emptied bucket stays in the heap; ``next_expiry`` skips it.
        """
        bucket = entry._bucket
        if bucket is None:
            return False
        bucket.remove(entry)
        return True

    def extend(self, entry: WheelEntry, deadline: float) -> float:
        """Move a pending entry to ``deadline``, as cheaply as possible.

        Moving an entry later than the time its bucket comes due only records the new
        deadline (tokio's lazy extend): when the bucket comes due the entry is seen to
        be early and is re-filed, by the same path as a cascade. Moving it earlier, or
        moving an entry held in a detached bucket, re-files it now. Returns what
        ``insert`` returns.
        """
        bucket = entry._bucket
        # The lazy-extend test: in a scheduled bucket, no earlier than it comes due.
        # (TimerHandle.reset keeps an inline copy of this test, for its idle touch.)
        if bucket is not None and bucket.tick != UNSCHEDULED and deadline >= bucket.time:
            entry._deadline = deadline
            return _INF
        e = self.due_tick_of(deadline)  # may raise: before any change
        if bucket is not None:
            bucket.move_out(entry)
        entry._deadline = deadline
        return self._file(entry, e)

    # -- expiry -------------------------------------------------------------------

    def next_expiry(self) -> float | None:
        """When the earliest occupied bucket comes due; ``-inf`` if entries are
        already due, ``None`` if the wheel is empty. Drops emptied buckets it meets."""
        if self._due._first is not None:
            return -_INF
        heap = self._heap
        while heap:
            start, _level, when, bucket = heap[0]
            if bucket._first is not None and bucket.tick == start:
                return when
            _heappop(heap)
            if bucket.tick == start:
                bucket.tick = UNSCHEDULED
                bucket.time = _INF
        return None

    # -- the pass -------------------------------------------------------------------
    # Kafka's advanceClock and bucket flush, tokio's poll: advance the clock, hand out
    # what expired, cascade the rest, and keep every entry findable meanwhile. What only
    # a pass holds, the recovery record (``recover`` states the invariant it keeps):
    #
    # * ``_out``: the buckets the last advance handed out, until the caller has
    #   emptied them (``release``): ``clear`` takes what is left in them;
    # * ``_moving``: the entry a pass is moving from one bucket to another, between the
    #   unlink and the link;
    # * ``_held``: the entries it is re-linking in a new order.

    def advance(self, now: float) -> list[Bucket]:
        """Move the wheel's clock to ``now`` and return what is due, in due order.

        Every returned bucket is detached from the wheel and holds only entries whose
        deadline is at or before ``now``; those entries still point at it
        (``entry._bucket``), so removing one of them before the caller gets to it
        works as usual. Buckets come due in tick order; a coarse bucket is cascaded
        against its own start tick, so after a long stall entries still come out in
        deadline order across ticks (within one tick no order is promised). Entries
        filed as due (``insert_due``) are merged into that order by deadline.

        Every entry stays linked in some bucket the whole time, and every bucket
        handed out is listed in ``_out`` (until ``release``), so that ``clear`` finds
        all of them even if this raises half-way (an interrupt, a ``MemoryError``):
        a timer that closes then settles every handle it held. Allocations (which
        may run the garbage collector, and through it user code) come before the
        change they serve, never between deciding it and completing it.
        """
        fired: list[Bucket] = []
        heap = self._heap
        # Entries filed as due before this pass, sorted; they go out ahead of any
        # overdue bucket that comes due after their deadline.
        early: Bucket | None = self._take_due(now) if self._due._first is not None else None
        while heap and heap[0][2] <= now:
            start, _key, when, bucket = heap[0]
            if bucket.tick != start or bucket.empty():
                self._drop_top(bucket, start)
            elif early is not None and early._first is not None and early._first._deadline < when:
                self._emit_before(early, when, fired)
            elif bucket.level == FAR_LEVEL:
                self._far_came_due(start, now, fired)
            elif not self._detach(bucket, start):
                pass  # the heap moved while the replacement was allocated: look again
            elif bucket.level == 0:
                self._expire(bucket, start, when, fired)
            else:
                self._cascade(bucket, now, fired)
        if early is not None and early._first is not None:
            fired.append(early)
        target = math.floor((now - self.origin) / self.tick)
        if target > self._now:
            self._set_now(target)
        return fired

    # The steps of advance, one per kind of heap top. Each runs with the top of the
    # heap being (start, ..., bucket) and takes it off, or leaves the heap for the
    # loop to look at again.

    def _drop_top(self, bucket: Bucket, start: int) -> None:
        # A stale heap item (the bucket was emptied and dropped by next_expiry, or
        # the far bucket moved earlier), or an emptied bucket: unschedule it.
        _heappop(self._heap)
        if bucket.tick == start:
            bucket.tick = UNSCHEDULED
            bucket.time = _INF

    def _far_came_due(self, start: int, now: float, fired: list[Bucket]) -> None:
        # The far bucket: not detached (its entries are not due), only re-examined
        # against the clock at its tick.
        far = self._far
        _heappop(self._heap)
        far.tick = UNSCHEDULED
        far.time = _INF
        if start > self._now:
            self._set_now(start)
        self._due_far()
        # Invariant: a pass hands out every entry due at `now`; whatever it files as
        # due (into `_due`) it takes before it returns. An entry lazily extended
        # inside the far bucket to the far bucket's own time is due right here
        # (issue 28: it used to wait in `_due` for an advance that nothing asked
        # for, and the model lost it; tests/test_wheel_model.py keeps the example).
        if self._due._first is not None:
            fired.append(self._take_due(now))

    def _due_far(self) -> None:
        # The far bucket came due (the clock is at its tick): file the entries now
        # within the horizon into the levels, and schedule it again for the rest.
        # O(far entries); far entries are rare, and each pass that comes here files
        # at least one of them.
        far = self._far
        limit = self._now + HORIZON
        earliest = -1
        node = far._first
        while node is not None:
            after = node._next
            e = self.due_tick_of(node._deadline)
            if e <= limit:
                self._moving = node
                far.move_out(node)
                self._file(node, e, True)
                self._moving = None
            elif earliest < 0 or e < earliest:
                earliest = e
            node = after
        if earliest >= 0:
            start = earliest - HORIZON
            when = self._far_time(start)
            far.tick = start
            far.time = when
            _heappush(self._heap, (start, _FAR_KEY, when, far))

    def _detach(self, bucket: Bucket, start: int) -> bool:
        # Detach the top bucket: new inserts during this pass must not land in a
        # bucket the pass returns. The replacement first: its allocation may run
        # finalizers that change the heap, so False (look again) if the top moved.
        fresh = Bucket(bucket.level)
        heap = self._heap
        # Compare the fields, not the tuple's identity: compiled, the top is an
        # unboxed tuple, and boxing it again makes a new object every time.
        if not heap or heap[0][3] is not bucket or heap[0][0] != start:
            return False
        _heappop(heap)
        bucket.tick = UNSCHEDULED
        # Listed in _out before it leaves its level: always findable (recover).
        self._out.append(bucket)
        level = self._levels[bucket.level]
        level.buckets[(start // level.width) % self._size] = fresh
        if start > self._now:
            self._set_now(start)
        return True

    def _expire(self, bucket: Bucket, start: int, when: float, fired: list[Bucket]) -> None:
        # A detached level-0 bucket: entries filed at this tick are due now; entries
        # whose deadline was moved later (extend) or that a float rounding put one tick
        # early go back into the wheel, at a tick strictly after this one.
        node: WheelEntry | None = bucket._first
        while node is not None:
            after = node._next
            if node._deadline > when:
                e = self.due_tick_of(node._deadline)
                self._moving = node  # (for recover; see `_moving`)
                bucket.move_out(node)
                self._file(node, e if e > start else start + 1)
            node = after
        self._moving = None
        if not bucket.empty():
            fired.append(bucket)

    def _cascade(self, bucket: Bucket, now: float, fired: list[Bucket]) -> None:
        # A detached coarser bucket: re-file against the bucket's start; each entry
        # moves down at least one level, or expires into the due bucket.
        cascaded = bucket._first
        while cascaded is not None:
            e = self.due_tick_of(cascaded._deadline)
            self._moving = cascaded
            bucket.move_out(cascaded)
            self._file(cascaded, e, True)
            cascaded = bucket._first
        self._moving = None
        if self._due._first is not None:
            fired.append(self._take_due(now))

    def _take_due(self, now: float) -> Bucket:
        # The due bucket itself is handed out (its entries stay linked in it), with
        # its entries in deadline order; a fresh one takes its place. An entry a float
        # rounding filed as due a hair after `now` waits for the next tick instead.
        fresh = Bucket(DUE_LEVEL)  # allocate before the change
        taken = self._due
        self._out.append(taken)  # listed before it is replaced (recover)
        self._due = fresh
        node = taken._first
        while node is not None:
            after = node._next
            if node._deadline > now:
                self._moving = node
                taken.move_out(node)
                self._file(node, self._now + 1)
            node = after
        self._moving = None
        # Entries are usually already in order (zero-delay timers, or one tick of a
        # cascade): then this is one comparison each, and no sort.
        previous = -_INF
        node = taken._first
        while node is not None:
            if node._deadline < previous:
                entries = list(taken)  # they stay linked while this allocates
                entries.sort(key=deadline_of)
                self._held = entries
                taken._first = taken._last = taken._cascaded = None
                taken._young = 0  # counted again as they are linked again
                for entry in entries:
                    entry._bucket = entry._prev = entry._next = None
                for entry in entries:
                    taken.add(entry)
                self._held = None
                break
            previous = node._deadline
            node = node._next
        return taken

    def _emit_before(self, early: Bucket, when: float, fired: list[Bucket]) -> None:
        # Hand out, as a bucket of their own, the due entries whose deadline is
        # before `when`; the rest stay in `early`.
        chunk = Bucket(DUE_LEVEL)  # allocate before the change
        self._out.append(chunk)
        while early._first is not None and early._first._deadline < when:
            entry = early._first
            self._moving = entry
            early.move_out(entry)
            chunk.add(entry)
        self._moving = None
        fired.append(chunk)

    def in_order(self, buckets: list[Bucket]) -> list[Bucket]:
        """The entries of ``buckets`` (what ``advance`` just handed out) in deadline
        order, ties in the order given: ``buckets`` itself when they already are (the
        usual case: one comparison per entry, no allocation), else one bucket holding
        them all. The drop-in loop's rule (``when`` order within a pass); ``advance``
        alone promises deadline order only between ticks.

        Allocations come first: between unlinking the entries and linking them again
        into the first bucket (in ``_out``, where ``clear`` finds them) no code runs."""
        previous = -_INF
        ordered = True
        for bucket in buckets:
            node = bucket._first
            while node is not None:
                if node._deadline < previous:
                    ordered = False
                    break
                previous = node._deadline
                node = node._next
            if not ordered:
                break
        if ordered:
            return buckets
        entries: list[WheelEntry] = []
        for bucket in buckets:
            entries.extend(bucket)
        entries.sort(key=deadline_of)  # stable
        merged = [buckets[0]]
        self._held = entries  # (for recover: unlinked below until linked again)
        for bucket in buckets:
            node = bucket._first
            while node is not None:
                after = node._next
                node._bucket = node._prev = node._next = None
                node = after
            bucket._first = bucket._last = bucket._cascaded = None
            bucket._young = 0  # counted again as they are linked again
        target = buckets[0]
        for entry in entries:
            target.add(entry)
        self._held = None
        return merged

    def release(self) -> None:
        """The caller is done with the buckets ``advance`` handed out. Normally they
        are empty; an entry the caller did not get to (it stopped half-way) is filed
        again at its own deadline, so that nothing pending is lost."""
        out = self._out
        while out:
            bucket = out[-1]
            entry = bucket._first
            if entry is None:
                out.pop()
                continue
            e = self.due_tick_of(entry._deadline)
            self._moving = entry
            bucket.move_out(entry)
            # Filed before anything filed since: ahead of those ties.
            self._file(entry, e, True)
            self._moving = None

    def recover(self) -> None:
        """Make the wheel whole again after an exception stopped it half-way through
        ``advance``, ``in_order`` or ``release`` (on the pure core a
        ``KeyboardInterrupt`` can arrive at any bytecode), and file every pending
        entry again: nothing is lost, nothing runs twice, nothing fires early.

        It relies on one invariant those methods keep at every bytecode: every
        pending entry is reachable, by its bucket's forward links (``_first``,
        ``_next``) from a level's bucket, the due or far bucket or a bucket listed in
        ``_out``, or it is ``_moving`` (between an unlink and a link) or in
        ``_held`` (being re-linked in a new order). What else a pass changes (the
        heap, bucket ticks, the levels' windows, a bucket's back links) is rebuilt
        here from scratch. O(pending entries + levels * wheel_size): rare.

        The collector is paused meanwhile (its finalizers may call the timer, and
        must not find an entry between its unlink and its filing). Run it again if
        it is itself interrupted: it starts from what it holds (``_held``)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._recover()
        finally:
            if enabled:
                gc.enable()

    def _recover(self) -> None:
        buckets: list[Bucket] = [self._due, self._far, *self._out]
        for level in self._levels:
            buckets.extend(level.buckets)
        entries: list[WheelEntry] = []
        seen: set[int] = set()
        held = self._held
        if held is not None:
            entries.extend(held)
        moving = self._moving
        if moving is not None:
            entries.append(moving)
        for entry in entries:
            seen.add(id(entry))
        for bucket in buckets:
            node = bucket._first
            walked: set[int] = set()  # (a list cut half-way is never a cycle; still)
            while node is not None and id(node) not in walked:
                walked.add(id(node))
                if id(node) not in seen:
                    seen.add(id(node))
                    entries.append(node)
                node = node._next
        # A run that this very method interrupted left its list here: keep it until
        # every entry is filed again.
        self._held = entries
        self._moving = None
        # The windows, for the clock as it stands (a level is added whole, by one
        # append: there is no half-added level to drop).
        self._set_now(self._now)
        self._out.clear()
        self._heap.clear()
        for bucket in buckets:
            bucket._first = bucket._last = bucket._cascaded = None
            bucket._young = 0  # counted again as they are linked again
            bucket.tick = UNSCHEDULED
            bucket.time = _INF
        for entry in entries:
            entry._bucket = entry._prev = entry._next = None
        for entry in entries:
            self._file(entry, self.due_tick_of(entry._deadline))
        self._held = None

    def clear(self) -> list[Any]:
        """Empty the wheel and return its entries, unlinked (``_bucket`` is None) and
        seen by the collector again: after a pass that stopped half-way too, by the
        invariant ``recover`` relies on (every pending entry is reachable from a
        bucket, or is ``_moving``, or in ``_held``)."""
        entries = self._due.take_all()
        for bucket in self._out:  # handed out by an advance that did not finish
            entries += bucket.take_all()
        self._out.clear()
        entries += self._far.take_all()
        self._far.tick = UNSCHEDULED
        self._far.time = _INF
        for level in self._levels:
            for bucket in level.buckets:
                entries += bucket.take_all()
                bucket.tick = UNSCHEDULED
                bucket.time = _INF
        self._heap.clear()
        # What no bucket reaches: the entry a pass stopped between its unlink and its
        # link, the ones it stopped re-linking. Its `_bucket` proves nothing (it may
        # still name a bucket whose list was cut), so: by identity, each once (showing
        # an entry to the collector twice would be a C error).
        stray: list[WheelEntry] = []
        if self._held is not None:
            stray.extend(self._held)
        if self._moving is not None:
            stray.append(self._moving)
        if stray:
            taken = {id(entry) for entry in entries}
            for entry in stray:
                if id(entry) not in taken:
                    taken.add(id(entry))
                    entry._bucket = entry._prev = entry._next = None
                    if entry._gc != GC_OFF:
                        _left(entry)
                    entries.append(entry)
        self._held = self._moving = None
        return entries

    # -- introspection (not on any hot path) -----------------------------------------

    def __len__(self) -> int:
        filed = sum(len(b) for level in self._levels for b in level.buckets)
        return len(self._due) + len(self._far) + filed

    def __iter__(self) -> Iterator[WheelEntry]:
        """Every entry still in the wheel (not the detached buckets), in no order."""
        yield from self._due
        yield from self._far
        for level in self._levels:
            for bucket in level.buckets:
                yield from bucket

    def _check(self) -> None:
        """Assert the invariants listed in the class docstring (for tests: O(n))."""
        scheduled = {id(b): start for start, _level, _when, b in self._heap if b.tick == start}
        _check_links(self._due)
        far = self._far
        _check_links(far)
        if far._first is not None:
            assert far.tick != UNSCHEDULED, "occupied far bucket is not scheduled"
            assert scheduled.get(id(far)) == far.tick, "the far bucket is not in the heap"
            assert far.tick > self._now, "the far bucket is due but still filed"
            for entry in far:
                # Never early (a lazily extended entry may be due before it is
                # within the horizon; it is filed when the far bucket comes due).
                assert self.due_tick_of(entry._deadline) >= far.tick, entry
        assert self._levels[0].buckets is self._wheel0
        assert self._limit0 == self._levels[0].limit
        for number, level in enumerate(self._levels):
            width = level.width
            wheel = level.buckets
            assert width == self._size**number
            assert len(wheel) == self._size
            assert level.limit == self._now - self._now % width + width * self._size
            for bucket in wheel:
                assert bucket.level == number
                _check_links(bucket)
                if bucket._first is None:
                    continue
                assert bucket.tick != UNSCHEDULED, f"occupied {bucket!r} is not scheduled"
                assert scheduled.get(id(bucket)) == bucket.tick, f"{bucket!r} not in the heap"
                assert bucket.tick > self._now, f"{bucket!r} is due but still filed"
                assert bucket.time == self.tick_time(bucket.tick)
                assert wheel[(bucket.tick // width) % self._size] is bucket
                for entry in bucket:
                    assert entry._bucket is bucket, entry
                    # Never early: an entry's due tick is in its bucket's range or
                    # later; or, lazily extended, its deadline is no earlier than the
                    # bucket's time (extend's own test, in floats: past 2**53 ticks a
                    # bucket's time is its start rounded, possibly down, so the two
                    # disagree by less than the clock can tell apart). Or it waits
                    # one tick past its due tick: _take_due found it due by the tick
                    # count but not by the clock (its deadline a rounding after the
                    # tick's time), and never runs an entry early.
                    due = self.due_tick_of(entry._deadline)
                    assert (
                        due >= bucket.tick
                        or entry._deadline >= bucket.time
                        or (bucket.tick == due + 1 and entry._deadline > self.tick_time(due))
                    ), entry
        assert len(self._levels) <= 2 + HORIZON.bit_length() // max(1, self._size.bit_length() - 1)


def _check_links(bucket: Bucket) -> None:
    """Assert that ``bucket``'s list is well linked, holds each entry once (no cycle:
    ``Bucket.add`` refuses a linked entry) and its entries point at it."""
    previous: WheelEntry | None = None
    seen: set[int] = set()
    young = 0
    entry = bucket._first
    while entry is not None:
        assert id(entry) not in seen, f"{entry!r} is linked twice in {bucket!r}"
        seen.add(id(entry))
        assert entry._bucket is bucket, entry
        assert entry._prev is previous, entry
        # Linked: young (counted) or hidden from the collector (the compiled core).
        if not HIDES:
            assert entry._gc == GC_OFF, entry
        elif entry._gc == GC_YOUNG:
            young += 1
            assert gc.is_tracked(entry), entry
        else:
            assert entry._gc == GC_HIDDEN, entry
            assert not gc.is_tracked(entry), entry
        previous = entry
        entry = entry._next
    assert bucket._last is previous, bucket
    assert bucket._young == young, f"{bucket!r}: counts {bucket._young} young, holds {young}"
    listed = False
    for other in _DIRTY:
        listed = listed or other is bucket
    assert bucket._dirty == listed, f"{bucket!r}: dirty {bucket._dirty}, listed {listed}"
    assert young == 0 or bucket._dirty, f"{bucket!r}: young entries, not listed"
    cascaded = bucket._cascaded
    assert cascaded is None or cascaded._bucket is bucket, f"{bucket!r}: stale cascaded prefix"
