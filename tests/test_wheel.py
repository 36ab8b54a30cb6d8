"""Unit tests of the pure wheel (``aiowheel._wheel``): no event loop, no timer.

The wheel is driven here the way the timer drives it: ``advance(now)`` hands back
detached buckets; the caller walks a snapshot of each one, skips entries that no longer
point at it (cancelled or re-filed by an earlier "callback"), marks the others fired
(``_bucket = None``) and clears the bucket.

Most tests use ``tick=1.0`` and ``origin=0.0`` so that deadlines are exact tick counts
and "fires at the first tick at or after its deadline" can be asserted with ``==``;
one class repeats the key checks with a millisecond tick on a non-zero origin, where
float rounding is what can make a wheel fire early.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import COUNTS_FILINGS, Entry

from aiowheel._wheel import Wheel, level_for


def flush(wheel: Wheel, now: float) -> list[Entry]:
    """``advance(now)`` and fire what it returns, as the timer's dispatcher does."""
    fired: list[Entry] = []
    for bucket in wheel.advance(now):
        # Pop one at a time, as the timer does: a "callback" may unlink later entries.
        entry = bucket.pop_first()
        while entry is not None:
            fired.append(entry)  # type: ignore[arg-type]
            entry = bucket.pop_first()
    return fired


def drive(wheel: Wheel, until: float = math.inf) -> list[tuple[float, Entry]]:
    """Advance only to ``next_expiry()``, as the driver does, until the wheel is empty
    (or the next expiry is past ``until``). Returns ``(now, entry)`` per firing."""
    fired: list[tuple[float, Entry]] = []
    while True:
        when = wheel.next_expiry()
        if when is None or when > until:
            return fired
        if when == -math.inf:
            when = wheel.tick_time(wheel._now)
        fired.extend((when, entry) for entry in flush(wheel, when))


def add(wheel: Wheel, deadlines: Iterable[float]) -> list[Entry]:
    entries = []
    for deadline in deadlines:
        entry = Entry(deadline)
        wheel.insert(entry, deadline)
        entries.append(entry)
    return entries


def due(deadline: float, tick: float = 1.0, origin: float = 0.0) -> float:
    """When a deadline fires: the first tick boundary at or after it."""
    return origin + math.ceil((deadline - origin) / tick) * tick


# -- construction -------------------------------------------------------------------


@pytest.mark.parametrize("tick", [0.0, -1.0, math.nan, math.inf])
def test_bad_tick_is_a_value_error(tick: float) -> None:
    with pytest.raises(ValueError, match="tick"):
        Wheel(tick, 8, 0.0)


@pytest.mark.parametrize("size", [1, 0, -4])
def test_bad_wheel_size_is_a_value_error(size: int) -> None:
    with pytest.raises(ValueError, match="wheel_size"):
        Wheel(1.0, size, 0.0)


def test_new_wheel_is_empty_with_one_level() -> None:
    wheel = Wheel(0.001, 64, 1000.0)
    assert len(wheel) == 0
    assert wheel.levels == 1
    assert wheel.next_expiry() is None
    assert wheel.advance(2000.0) == []


# -- levels and boundaries ----------------------------------------------------------

SIZES = [2, 3, 4, 8, 64]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("delta", [-1, -0.5, 0, 0.5, 1])
def test_level_boundaries(size: int, k: int, delta: float) -> None:
    """A deadline of ``size**k + delta`` ticks lives on level k (k-1 just below the
    boundary), fires exactly at its rounded-up tick and is filed at most levels-1
    more times on the way down."""
    wheel = Wheel(1.0, size, 0.0)
    deadline = size**k + delta
    (entry,) = add(wheel, [deadline])
    expected_level = k if math.ceil(deadline) >= size**k else k - 1
    assert wheel.levels == expected_level + 1
    assert entry._bucket is not None
    assert entry._bucket.level == expected_level
    # Just before its due tick: still pending.
    assert flush(wheel, due(deadline) - 0.5) == []
    assert entry._bucket is not None
    assert len(wheel) == 1
    assert flush(wheel, due(deadline)) == [entry]
    assert len(wheel) == 0
    assert entry.moves <= wheel.levels - 1 or not COUNTS_FILINGS


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_driver_walk_across_boundaries(size: int, k: int) -> None:
    """Advancing only to ``next_expiry`` fires every timer around ``size**k`` at its
    exact due tick, in deadline order, with a handful of advances, not one per tick."""
    wheel = Wheel(1.0, size, 0.0)
    deadlines = [size**k + d for d in (-1, -0.5, 0, 0.5, 1, 2)]
    entries = add(wheel, reversed(deadlines))
    levels = wheel.levels
    walked = drive(wheel)
    assert {entry for _, entry in walked} == set(entries)
    # Deadline order across ticks (within one tick no order is promised).
    assert [now for now, _ in walked] == sorted(now for now, _ in walked)
    for now, entry in walked:
        assert now == due(entry._deadline)
        assert entry.moves <= levels - 1 or not COUNTS_FILINGS
    advances = len({now for now, _ in walked})
    assert advances <= len(deadlines)


def test_levels_created_on_demand() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    assert wheel.levels == 1
    add(wheel, [3])
    assert wheel.levels == 1
    add(wheel, [4])
    assert wheel.levels == 2
    add(wheel, [4**5])
    assert wheel.levels == 6
    # Levels never shrink: the hierarchy is kept for later timers.
    drive(wheel)
    assert wheel.levels == 6
    assert len(wheel) == 0


def test_every_tick_fires_exactly_what_is_due() -> None:
    """Deadlines 0..N-1 ticks, processed at every tick t: exactly those <= t fired."""
    n = 300
    wheel = Wheel(1.0, 4, 0.0)
    entries = add(wheel, random.Random(1).sample(range(n), n))
    fired: set[Entry] = set()
    for t in range(n):
        fired.update(flush(wheel, t))
        assert fired == {e for e in entries if e._deadline <= t}
        assert len(wheel) == n - len(fired)


def test_kafka_batch_on_tiny_wheel() -> None:
    """Kafka's test: delays 0..4, pairs at 10..99, singles at 100..499 on a wheel of
    size 3, advanced until idle: every one fires exactly once, duplicates included."""
    wheel = Wheel(1.0, 3, 0.0)
    deadlines = [*range(5), *range(10, 100), *range(10, 100), *range(100, 500)]
    entries = add(wheel, deadlines)
    walked = drive(wheel)
    assert sorted(e.name for _, e in walked) == sorted(deadlines)  # type: ignore[type-var]
    assert len({id(e) for _, e in walked}) == len(entries)
    assert all(now == due(e._deadline) for now, e in walked)


def test_timer_at_193_processed_at_62_and_192_twice() -> None:
    """tokio's test: a timer at 193 is not fired by processing at 62, 192, 192."""
    wheel = Wheel(1.0, 64, 0.0)
    (entry,) = add(wheel, [193])
    for now in (62, 192, 192):
        assert flush(wheel, now) == []
    assert flush(wheel, 193) == [entry]


# -- cascades -----------------------------------------------------------------------


@pytest.mark.skipif(not COUNTS_FILINGS, reason="counts filings: on the pure core only")
@pytest.mark.parametrize("size", [2, 3, 4])
def test_each_entry_moves_at_most_levels_minus_one_times(size: int) -> None:
    rng = random.Random(size)
    wheel = Wheel(1.0, size, 0.0)
    entries = add(wheel, [rng.uniform(0, size**7) for _ in range(500)])
    levels = wheel.levels
    assert levels >= 7
    walked = drive(wheel)
    assert len(walked) == len(entries)
    assert max(e.moves for e in entries) <= levels - 1
    # Cascades really happened: the deepest entries moved more than once.
    assert max(e.moves for e in entries) >= 2


def test_cascade_keeps_deadline_order_within_a_coarse_bucket() -> None:
    """Entries sharing a level-2 bucket still fire in deadline order, one tick apart."""
    wheel = Wheel(1.0, 4, 0.0)
    deadlines = list(range(32, 48))  # one level-2 bucket (width 16)
    entries = add(wheel, reversed(deadlines))
    assert {e._bucket.level for e in entries if e._bucket is not None} == {2}
    assert all(e._bucket is not None for e in entries)
    walked = drive(wheel)
    assert [e._deadline for _, e in walked] == deadlines
    assert all(now == e._deadline for now, e in walked)


# -- a stalled clock: one advance over many ticks --------------------------------------


@pytest.mark.parametrize("size", [2, 4, 64])
def test_long_stall_fires_everything_once_in_deadline_order(size: int) -> None:
    """The loop was blocked: one ``advance`` far past many buckets on every level
    returns every due entry once, in deadline order across ticks, and nothing more."""
    rng = random.Random(size)
    wheel = Wheel(1.0, size, 0.0)
    deadlines = [rng.uniform(0, 5000) for _ in range(2000)]
    entries = add(wheel, deadlines)
    fired = flush(wheel, 3000)
    assert set(fired) == {e for e in entries if due(e._deadline) <= 3000}
    assert len(fired) == len(set(fired))
    ticks = [math.ceil(e._deadline) for e in fired]
    assert ticks == sorted(ticks)
    # What is left still fires on time, not a revolution late.
    rest = drive(wheel)
    assert {e for _, e in rest} == set(entries) - set(fired)
    assert all(now == due(e._deadline) for now, e in rest)


# -- cancel -------------------------------------------------------------------------


def test_remove_pending_entry() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    a, b = add(wheel, [5, 50])
    assert wheel.remove(a) is True
    assert a._bucket is None
    assert len(wheel) == 1
    assert wheel.remove(a) is False  # second cancel is a no-op
    assert wheel.remove(Entry()) is False  # never filed
    assert drive(wheel) == [(50.0, b)]
    assert wheel.remove(b) is False  # already fired


def test_cancel_during_flush() -> None:
    """An earlier "callback" removes entries of the bucket being walked and of a later
    returned bucket: they never fire, and the count ends at exactly zero."""
    wheel = Wheel(1.0, 4, 0.0)
    same = add(wheel, [3, 3, 3])
    later = add(wheel, [5, 6])
    buckets = wheel.advance(10)
    assert len(buckets) >= 2
    fired = []
    for bucket in buckets:
        entry = bucket.pop_first()
        while entry is not None:
            fired.append(entry)
            if entry is same[0]:
                assert wheel.remove(same[2]) is True
                assert wheel.remove(later[1]) is True
                assert wheel.remove(same[2]) is False
            entry = bucket.pop_first()
    assert fired == [same[0], same[1], later[0]]
    assert len(wheel) == 0
    assert wheel.next_expiry() is None


def test_insert_during_flush_does_not_land_in_a_returned_bucket() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    add(wheel, [2, 3])
    buckets = wheel.advance(3)
    new_due, new_future = Entry("due"), Entry("future")
    wheel.insert(new_due, 3)  # due now: the next advance, not this flush
    wheel.insert(new_future, 7)
    for bucket in buckets:
        assert new_due not in bucket
        assert new_future not in bucket
        bucket.take_all()
    assert flush(wheel, 3) == [new_due]
    assert drive(wheel) == [(7.0, new_future)]


def test_next_expiry_skips_buckets_emptied_by_remove() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    a, b, c = add(wheel, [2, 9, 40])
    assert wheel.next_expiry() == 2
    wheel.remove(a)
    assert wheel.next_expiry() == 8  # b's level-1 bucket [8, 12)
    wheel.remove(b)
    assert wheel.next_expiry() == 32  # c's level-2 bucket [32, 48)
    wheel.remove(c)
    assert wheel.next_expiry() is None
    assert wheel.advance(100) == []


# -- extend (reset) -----------------------------------------------------------------


def test_extend_later_fires_at_new_deadline_only() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    (entry,) = add(wheel, [5])
    wheel.extend(entry, 30)
    assert len(wheel) == 1
    walked = drive(wheel)
    assert walked == [(30.0, entry)]


def test_extend_earlier_fires_ahead_of_others() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    a, b = add(wheel, [20, 60])
    wheel.extend(b, 10)
    assert drive(wheel) == [(10.0, b), (20.0, a)]


def test_extend_to_the_past_is_due_at_once() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    (entry,) = add(wheel, [50])
    assert flush(wheel, 10) == []
    assert wheel.extend(entry, 3) == -math.inf
    assert wheel.next_expiry() == -math.inf
    assert flush(wheel, 10) == [entry]


def test_extend_sequence_only_last_counts() -> None:
    """tokio: 200 -> 50 -> 40; and interleaved one->300, two->350, one->400."""
    wheel = Wheel(1.0, 8, 0.0)
    (entry,) = add(wheel, [100])
    for deadline in (200, 50, 40):
        wheel.extend(entry, deadline)
    assert drive(wheel) == [(40.0, entry)]

    one, two = add(wheel, [100, 100])
    wheel.extend(one, 300)
    wheel.extend(two, 350)
    wheel.extend(one, 400)
    assert drive(wheel, until=310) == []
    assert drive(wheel) == [(350.0, two), (400.0, one)]


def test_extend_after_part_of_the_slot_passed() -> None:
    """tokio: at t=80, 100 -> 120 fires at 120, not at a cascade boundary."""
    wheel = Wheel(1.0, 8, 0.0)
    (entry,) = add(wheel, [100])
    assert drive(wheel, until=80) == []
    flush(wheel, 80)
    wheel.extend(entry, 120)
    walked = drive(wheel)
    assert walked == [(120.0, entry)]


def test_extend_an_entry_of_a_returned_bucket() -> None:
    """Re-arming an entry that the wheel handed back but the caller has not reached
    yet takes it out of that bucket: it fires at its new deadline instead."""
    wheel = Wheel(1.0, 4, 0.0)
    a, b = add(wheel, [2, 2])
    (bucket,) = wheel.advance(2)
    wheel.extend(b, 9)
    assert bucket.take_all() == [a]
    assert drive(wheel) == [(9.0, b)]


def test_extend_a_fired_or_removed_entry_files_it_again() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    a, b = add(wheel, [1, 2])
    assert flush(wheel, 1) == [a]
    wheel.remove(b)
    wheel.extend(a, 5)
    wheel.extend(b, 6)
    assert len(wheel) == 2
    assert drive(wheel) == [(5.0, a), (6.0, b)]


def test_lazy_extend_later_does_no_bucket_work() -> None:
    """Moving a deadline later than its bucket's due time keeps the entry where it is
    (tokio's lazy extend) and does not re-open buckets."""
    wheel = Wheel(1.0, 8, 0.0)
    (entry,) = add(wheel, [3])
    bucket = entry._bucket
    filings = entry.filings
    for deadline in range(4, 1000):
        wheel.extend(entry, deadline)
    assert entry._bucket is bucket
    assert entry.filings == filings or not COUNTS_FILINGS
    assert drive(wheel) == [(999.0, entry)]


# -- never early, at most one tick late, with float deadlines ----------------------------


class TestMillisecondTick:
    tick = 0.001
    origin = 1000.0

    def test_off_tick_deadline_rounds_up(self) -> None:
        wheel = Wheel(self.tick, 64, self.origin)
        deadline = self.origin + 0.001 + 1e-9
        (entry,) = add(wheel, [deadline])
        assert flush(wheel, self.origin + 0.001) == []
        ((now, fired),) = drive(wheel)
        assert fired is entry
        assert now == pytest.approx(self.origin + 0.002)
        assert now >= deadline

    def test_random_deadlines_never_early_at_most_one_tick_late(self) -> None:
        rng = random.Random(7)
        wheel = Wheel(self.tick, 16, self.origin)
        entries = add(wheel, [self.origin + rng.uniform(-0.01, 30.0) for _ in range(3000)])
        walked = drive(wheel)
        assert {e for _, e in walked} == set(entries)
        for now, entry in walked:
            assert now >= entry._deadline
            # Deadlines before the wheel's start were overdue when filed.
            assert now - max(entry._deadline, self.origin) <= self.tick + 1e-9

    def test_random_advances_never_early_at_most_one_tick_late(self) -> None:
        rng = random.Random(8)
        wheel = Wheel(self.tick, 4, self.origin)
        entries = set(add(wheel, [self.origin + rng.uniform(0, 5.0) for _ in range(2000)]))
        now = self.origin
        seen: set[Entry] = set()
        while entries - seen:
            now += rng.choice([1e-4, 7e-4, 0.001, 0.0173, 0.25])
            fired = flush(wheel, now)
            for entry in fired:
                assert entry._deadline <= now
            seen.update(fired)
            # At most one tick late: nothing due a full tick ago is still pending.
            assert all(e._deadline > now - self.tick for e in entries - seen)


# -- huge deadlines ---------------------------------------------------------------------


@pytest.mark.parametrize("years", [1, 10, 1000])
def test_deadline_years_out(years: int) -> None:
    tick, origin = 0.001, 1000.0
    wheel = Wheel(tick, 64, origin)
    deadline = origin + years * 365.25 * 86400
    (far,) = add(wheel, [deadline])
    near = add(wheel, [origin + 1.0, origin + 2.0])
    assert wheel.levels >= 6
    walked = drive(wheel)
    assert [e for _, e in walked] == [*near, far]
    now, _ = walked[-1]
    assert deadline <= now <= deadline + tick
    # Fewer advances than levels per timer: the driver does not walk the years.
    assert len(walked) == 3
    assert far.moves <= wheel.levels - 1 or not COUNTS_FILINGS


def test_astronomic_deadline_does_not_overflow() -> None:
    wheel = Wheel(0.001, 64, 1000.0)
    a, b = add(wheel, [1e300, 2e300])  # consecutive long timers
    assert wheel.next_expiry() is not None
    # Filed at the horizon (2**48 ticks), not on a 1000-bit tick: levels stay few.
    assert wheel.levels <= 9
    wheel._check()
    assert len(wheel) == 2
    assert wheel.remove(a)
    assert wheel.remove(b)
    assert wheel.next_expiry() is None
    assert flush(wheel, 1001.0) == []


def test_past_the_horizon_is_refiled_never_early() -> None:
    """A deadline past the horizon sits in the far bucket, which comes due when its
    earliest entry comes within the horizon; then it is re-filed (not fired), and a
    float deadline no tick count can hold is fine."""
    wheel = Wheel(1.0, 64, 0.0)
    (far,) = add(wheel, [2.0**50])
    (astronomic,) = add(wheel, [1.7e308])
    horizon = wheel.next_expiry()
    assert horizon is not None
    assert horizon == 2.0**50 - 2.0**48  # its entry is then one horizon away
    assert flush(wheel, horizon) == []  # cascaded, re-filed: nothing fires early
    wheel._check()
    assert far._bucket is not None
    assert astronomic._bucket is not None
    walked = drive(wheel, until=2.0**50 + 1)
    assert [e for _, e in walked] == [far]
    assert walked[0][0] == far._deadline
    with pytest.raises(ValueError, match="finite"):
        wheel.insert(Entry(), math.inf)


def test_new_timers_after_the_wheel_ran_for_a_long_time() -> None:
    """tokio: after time has passed the wheel's natural range (2**36 ticks), new timers
    are accepted and fire on time."""
    wheel = Wheel(1.0, 64, 0.0)
    flush(wheel, 2.0**36 + 0.5)
    entries = add(wheel, [2.0**36 + 3, 2.0**36 + 64**3])
    walked = drive(wheel)
    assert [(now, e) for now, e in walked] == [(e._deadline, e) for e in entries]


def test_a_far_deadline_takes_a_few_passes_however_far_the_clock_jumps() -> None:
    """Issue 20: a deadline past the horizon walked one horizon per pass (35,000
    wake-ups to reach 1e16 s with a 1 ms tick; 350,000 hops inside one advance when
    the clock jumped 1e17 s with a timer at 1e300). A pass is bounded by what is due."""
    wheel = Wheel(0.001, 64, 1000.0)
    (target,) = add(wheel, [1e16])
    (astronomic,) = add(wheel, [1e300])
    walked = drive(wheel, until=2e16)
    assert [e for _, e in walked] == [target]
    assert walked[0][0] >= target._deadline  # never early
    wheel._check()
    # A jump of 1e17 s: the astronomic entry is not touched at all.
    assert flush(wheel, 1e17) == []
    wheel._check()
    assert astronomic._bucket is wheel._far


def test_driving_to_a_far_deadline_takes_few_wake_ups() -> None:
    wheel = Wheel(0.001, 64, 0.0)
    (target,) = add(wheel, [1e16])
    wakeups = 0
    fired: list[Entry] = []
    while not fired:
        when = wheel.next_expiry()
        assert when is not None
        wakeups += 1
        assert wakeups < 20, "walking the horizon"
        fired = flush(wheel, when)
        wheel._check()
    assert fired == [target]
    assert wheel.tick_time(wheel._now) >= target._deadline


def test_an_entry_extended_to_the_far_buckets_own_time_fires_then() -> None:
    """Issue 28, found by tests/test_wheel_model.py: an entry in the far bucket moved
    later than that bucket's time (a lazy extend: it stays there) is due when the far
    bucket comes due. The pass filed it as due and returned without it, so the
    advance to its deadline fired nothing."""
    wheel = Wheel(1.0, 3, 0.0)
    (far,) = add(wheel, [2.0**60])
    when = wheel.next_expiry()
    assert when == 2.0**60 - 2.0**48
    wheel.extend(far, when)  # no earlier than the bucket's time: lazy, stays there
    assert far._bucket is wheel._far
    wheel._check()
    assert flush(wheel, when) == [far]
    wheel._check()
    assert wheel.next_expiry() is None


def test_far_entries_due_at_the_far_tick_come_out_in_deadline_order() -> None:
    """The same pass, with entries filed as due before it: these go out first, then
    the far bucket's, then a level bucket due later in the same pass."""
    wheel = Wheel(1.0, 3, 0.0)
    (far,) = add(wheel, [2.0**49])  # small enough for whole seconds to be exact
    when = wheel.next_expiry()
    assert when == 2.0**48
    flush(wheel, when - 10.0)
    wheel.extend(far, when)
    early = Entry(0)
    wheel.insert_due(early, when - 10.0)
    (later,) = add(wheel, [when + 1.0])
    assert flush(wheel, when + 1.0) == [early, far, later]
    wheel._check()


def test_a_lazy_extend_past_2_53_ticks_keeps_the_invariants() -> None:
    """Found by tests/test_wheel_model.py: past 2**53 ticks a bucket's time is its start
    rounded (possibly down), so a deadline extended to "now" can pass extend's float
    test (deadline >= bucket.time) with a due tick below the bucket's start. Never
    early all the same; Wheel._check must accept it."""
    wheel = Wheel(1.0, 3, 0.0)
    first = Entry(0)
    wheel.insert(first, 0.0)
    assert flush(wheel, 0.0) == [first]
    far = Entry(1)
    wheel.insert(far, 2.0**60)
    wheel.insert(Entry(3), 0.0)
    now = 0.0
    for _ in range(10):
        when = wheel.next_expiry()
        assert when is not None
        now = max(when, now)
        flush(wheel, now)
        wheel._check()
    now += 193.0
    flush(wheel, now)
    moved = Entry(2)
    wheel.insert(moved, now + 193.0)
    wheel.extend(moved, now)
    wheel._check()
    assert flush(wheel, now + 512.0) == [moved]
    wheel._check()
    assert [(at >= 2.0**60, entry) for at, entry in drive(wheel)] == [(True, far)]


def test_an_entry_due_by_its_tick_but_not_by_the_clock_waits_one_tick() -> None:
    """Found by tests/test_fault_model.py on trio: a deadline one float step after a
    tick's time (0.011000000000000001) has that tick as its due tick, but the clock
    read at 0.011 says it is not due. The pass keeps it for the next tick (never
    early), and Wheel._check accepts an entry one tick past its due tick there."""
    wheel = Wheel(0.001, 2, 0.0)
    now = 0.011
    flush(wheel, now)
    hair = Entry(0)
    deadline = math.nextafter(now, math.inf)
    assert wheel.due_tick_of(deadline) == wheel._now  # due by the tick count...
    wheel.insert(hair, deadline)
    assert flush(wheel, now) == []  # ...not by the clock
    wheel._check()
    assert flush(wheel, 0.012) == [hair]
    wheel._check()


# -- level_for: which level an entry is filed on (tokio's level_for) ------------------


@pytest.mark.parametrize(
    ("now", "e", "size", "level"),
    [
        (0, 1, 64, 0),
        (0, 63, 64, 0),  # level 0 holds [0, 64)
        (0, 64, 64, 1),
        (0, 4095, 64, 1),  # level 1 holds [0, 4096)
        (0, 4096, 64, 2),
        (100, 163, 64, 0),  # level 0: [100, 164), now itself as its start
        (100, 164, 64, 1),
        (100, 4159, 64, 1),  # level 1: from 64 (100 rounded down to 64) for 4096
        (100, 4160, 64, 2),
        (5, 7, 2, 1),  # size 2: level 0 is [5, 7), level 1 [4, 8), level 2 [4, 12)
        (5, 8, 2, 2),
        (5, 11, 2, 2),
        (5, 12, 2, 3),
    ],
)
def test_level_for_is_the_lowest_level_whose_window_holds_the_tick(
    now: int, e: int, size: int, level: int
) -> None:
    assert level_for(now, e, size) == level


@pytest.mark.parametrize("size", [2, 3, 64])
def test_the_wheel_files_on_the_level_level_for_names(size: int) -> None:
    """Wheel._file keeps an inline copy of level_for over its precomputed windows: the
    two agree, wherever the wheel's clock stands and whatever the delay."""
    rng = random.Random(size)
    for _ in range(300):
        wheel = Wheel(1.0, size, 0.0)
        flush(wheel, float(rng.randrange(0, size**4)))
        now = wheel._now
        e = now + 1 + rng.randrange(0, size ** rng.randrange(1, 7))
        entry = Entry(0)
        wheel.insert(entry, float(e))
        assert entry._bucket is not None
        assert entry._bucket.level == level_for(now, e, size), (now, e)


@settings(max_examples=300, deadline=None)
@given(
    size=st.sampled_from([2, 3, 8, 64]),
    start=st.integers(min_value=0, max_value=2**20),
    delay=st.integers(min_value=1, max_value=2**40),
    cascaded=st.booleans(),
)
def test_every_filing_lands_on_the_level_level_for_names(
    size: int, start: int, delay: int, cascaded: bool
) -> None:
    """``level_for`` is the rule: ``Wheel._file`` (schedule, re-file and cascade alike)
    is checked against it, near the window edges too (a delay of one level's span,
    plus or minus a tick), wherever the clock stands."""
    wheel = Wheel(1.0, size, 0.0)
    flush(wheel, float(start))
    now = wheel._now
    for e in {now + delay, now + min(delay, size**3), now + size, now + size + 1}:
        if e <= now:
            continue
        entry = Entry(0)
        entry._deadline = float(e)
        wheel._file(entry, e, cascaded)
        assert entry._bucket is not None
        assert entry._bucket.level == level_for(now, e, size), (now, e)
