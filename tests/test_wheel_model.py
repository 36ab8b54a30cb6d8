"""The wheel against a plain model (Kafka's MockTimer as an oracle), driven by hypothesis.

Random insert / remove / extend / advance sequences run on a real ``Wheel`` with a
tiny ``wheel_size`` (2-4: many levels, many cascades) and on a model that only keeps
each pending entry's deadline in a dict (a heap would answer the same questions, and
the dict keeps the model obviously right). After every advance:

* the set fired is exactly the set of pending entries whose due instant (the first
  tick boundary at or after the deadline) is at or before ``now``: so nothing fires
  early, nothing is more than one tick late, nothing fires twice, nothing is lost;
* the firing order follows the due ticks (deadline order across ticks);
* an entry never re-armed was filed at most ``levels - 1`` times after its insert.

Ticks and origins are powers of two apart (1.0 or 0.25 s, origins 0, 1000, -3.5) so
that "the first tick boundary at or after d" is exact in floating point and the model
can demand exact sets; ``tests/test_wheel.py`` covers float millisecond ticks.

Runtime is kept to ~10-20 s by the settings below; set ``AIOWHEEL_MODEL_EXAMPLES`` to
run longer (for example 2000 in a nightly job).
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)
from support import COUNTS_FILINGS
from support import Entry as CountingEntry

from aiowheel._wheel import Wheel


class Entry(CountingEntry):
    """A counting entry (tests/support.py) that also remembers a re-arm."""

    __slots__ = ("rearmed",)

    def __init__(self, name: int) -> None:
        super().__init__(name)
        self.rearmed = False

    def __repr__(self) -> str:
        return f"Entry({self.name})"


# Offsets from "now", in ticks: around the level boundaries of wheels of size 2-4
# (4**6 = 4096 ticks spans six levels of a size-4 wheel, twelve of a size-2 one),
# already-due ones, and off-tick fractions.
offsets = st.one_of(
    st.integers(min_value=-3, max_value=4**6),
    st.sampled_from([0, 1, 2, 3, 4, 8, 9, 16, 27, 63, 64, 65, 81, 256, 1023, 1024, 1025]),
    st.floats(min_value=-2.0, max_value=4.0**7, allow_nan=False, allow_infinity=False),
)
steps = st.one_of(
    st.integers(min_value=0, max_value=70),
    st.integers(min_value=0, max_value=4**6),
    st.floats(min_value=0.0, max_value=300.0, allow_nan=False, allow_infinity=False),
)


class WheelModel(RuleBasedStateMachine):
    entries = Bundle("entries")

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[Entry, float] = {}
        self.count = 0
        self.fired_total = 0

    @initialize(
        target=entries,
        size=st.integers(min_value=2, max_value=4),
        tick=st.sampled_from([1.0, 0.25]),
        origin=st.sampled_from([0.0, 1000.0, -3.5]),
        offset=offsets,
    )
    def start(self, size: int, tick: float, origin: float, offset: float) -> Entry:
        self.wheel = Wheel(tick, size, origin)
        self.tick = tick
        self.origin = origin
        self.now = origin
        # One entry from the start, so that rules taking an entry are never starved.
        return self.new_entry(offset)

    def due_time(self, deadline: float) -> float:
        return self.origin + math.ceil((deadline - self.origin) / self.tick) * self.tick

    # -- operations ------------------------------------------------------------------

    @rule(target=entries, offset=offsets)
    def insert(self, offset: float) -> Entry:
        return self.new_entry(offset)

    def new_entry(self, offset: float) -> Entry:
        self.count += 1
        entry = Entry(self.count)
        deadline = self.now + offset * self.tick
        self.wheel.insert(entry, deadline)
        self.model[entry] = deadline
        return entry

    @rule(target=entries, far=st.sampled_from([2.0**43, 2.0**60, 1e300]))
    def insert_far(self, far: float) -> Entry:
        """Past the horizon: filed at it and re-filed from there (never early)."""
        entry = self.new_entry(far)
        entry.rearmed = True  # re-filed at the horizon: more filings than levels
        return entry

    @rule(entry=entries)
    def remove(self, entry: Entry) -> None:
        assert self.wheel.remove(entry) is (entry in self.model)
        self.model.pop(entry, None)
        assert entry._bucket is None

    @rule(entry=consumes(entries))
    def forget(self, entry: Entry) -> None:
        """Drop an entry from the bundle so that later rules pick live ones more often."""
        if entry not in self.model:
            return
        self.remove(entry)

    @rule(entry=entries, offset=offsets)
    def extend(self, entry: Entry, offset: float) -> None:
        """Re-arm: later (lazy), earlier, into the past; fired or removed entries too."""
        deadline = self.now + offset * self.tick
        self.wheel.extend(entry, deadline)
        self.model[entry] = deadline
        entry.rearmed = True

    @rule(step=steps, data=st.data())
    def advance(self, step: float, data: st.DataObject) -> None:
        self.flush(self.now + step * self.tick, data)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def advance_to_next_expiry(self, data: st.DataObject) -> None:
        """What the driver does: sleep until the earliest occupied bucket."""
        when = self.wheel.next_expiry()
        assert when is not None
        self.flush(max(when, self.now), data)

    def flush(self, now: float, data: st.DataObject) -> None:
        expected = {e for e, d in self.model.items() if self.due_time(d) <= now}
        levels_before = self.wheel.levels
        buckets = self.wheel.advance(now)
        self.now = now
        fired: list[Entry] = []
        for bucket in buckets:
            # Pop one at a time, as the timer does: a "callback" may unlink later ones.
            while (entry := bucket.pop_first()) is not None:
                assert isinstance(entry, Entry)
                assert entry._prev is None
                assert entry._next is None
                fired.append(entry)
                deadline = self.model.pop(entry)
                # Never early; the exact set check below bounds lateness.
                assert deadline <= now, (entry, deadline, now)
                # A "callback" cancels another entry, sometimes one of this very flush.
                cancel = data.draw(st.booleans(), label="cancel in callback")
                if cancel and self.model:
                    victim = data.draw(st.sampled_from(sorted(self.model, key=_name)))
                    assert self.wheel.remove(victim)
                    del self.model[victim]
                    expected.discard(victim)
        assert set(fired) == expected
        assert len(fired) == len(set(fired))
        self.fired_total += len(fired)
        # Deadline order across ticks.
        due = [self.due_time(e._deadline) for e in fired]
        assert due == sorted(due)
        levels = max(levels_before, self.wheel.levels)
        for entry in fired:
            if COUNTS_FILINGS and not entry.rearmed:
                assert entry.filings - 1 <= levels - 1, (entry, entry.filings, levels)
            entry.filings = 0
            entry.rearmed = False

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def wheel_invariants_hold(self) -> None:
        if hasattr(self, "wheel"):
            self.wheel._check()

    @invariant()
    def counts_are_exact(self) -> None:
        if hasattr(self, "wheel"):
            assert len(self.wheel) == len(self.model)

    @invariant()
    def pending_flags_match(self) -> None:
        for entry in self.model:
            assert entry._bucket is not None
            assert entry in entry._bucket

    @invariant()
    def next_expiry_is_sound(self) -> None:
        if not hasattr(self, "wheel"):
            return
        when = self.wheel.next_expiry()
        if not self.model:
            assert when is None
            return
        earliest = min(self.due_time(d) for d in self.model.values())
        assert when is not None
        # Never later than the earliest due entry (a cascade point may come first);
        # "already due" only when something is.
        assert when <= earliest
        if when == -math.inf:
            assert earliest <= self.now + self.tick


def _name(entry: Entry) -> int:
    return entry.name


# A named profile, applied to this machine only (not loaded globally, so other
# hypothesis tests keep theirs): ~10 s on the 2-core CI box.
settings.register_profile(
    "aiowheel-wheel-model",
    max_examples=int(os.environ.get("AIOWHEEL_MODEL_EXAMPLES", "500")),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
WheelModel.TestCase.settings = settings.get_profile("aiowheel-wheel-model")
TestWheelModel = WheelModel.TestCase
