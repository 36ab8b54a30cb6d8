"""Ties in scheduling order, across the wheel's levels (issue 28, finding 9).

docs/loop.md promises that timers due in the same pass run in ``when`` order, ties in
the order they were scheduled: a plain loop's order of ``(when, seq)``. A timer filed
on a coarse level and brought down by a cascade was scheduled before the ties filed
directly on the finer level (the level the wheel picks for one deadline only moves
down as its clock moves on): it ran after them (``B0 B1 A B2``).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aiowheel
from aiowheel._wheel import Wheel, WheelEntry

BASES = ["asyncio", "uvloop"]


class Entry(WheelEntry):
    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.seq = seq


def _fire(wheel: Wheel, now: float) -> list[Entry]:
    """One pass as the drop-in loop's engine makes it: advance, then in_order."""
    out: list[Entry] = []
    buckets = wheel.advance(now)
    if buckets:
        for bucket in wheel.in_order(buckets):
            while (entry := bucket.pop_first()) is not None:
                assert isinstance(entry, Entry)
                out.append(entry)
    wheel.release()
    return out


def _names(entries: list[Entry]) -> list[int]:
    return [entry.seq for entry in entries]


def test_a_cascaded_timer_runs_before_the_ties_filed_after_it() -> None:
    # Size 4, tick 1: deadline 6 is in level 1's bucket [4, 8) until the clock reaches
    # 4; level 0 holds it once the clock passes 2.
    wheel = Wheel(1.0, 4, 0.0)
    a, b0, b1, b2 = (Entry(i) for i in range(4))
    wheel.insert(a, 6.0)  # level 1
    assert _fire(wheel, 3.0) == []
    wheel.insert(b0, 6.0)  # level 0, directly
    wheel.insert(b1, 6.0)
    assert _fire(wheel, 4.0) == []  # a cascades into b0's bucket
    wheel.insert(b2, 6.0)
    assert _names(_fire(wheel, 6.0)) == [0, 1, 2, 3]  # was B0 B1 A B2
    wheel._check()


def test_a_coarse_bucket_due_at_the_same_tick_cascades_first() -> None:
    # Deadline 4 is the start of level 1's bucket [4, 8): both buckets come due at
    # tick 4; the coarse one's entry (filed first) goes out first.
    wheel = Wheel(1.0, 4, 0.0)
    a, b0, b1 = (Entry(i) for i in range(3))
    wheel.insert(a, 4.0)  # level 1
    assert _fire(wheel, 1.0) == []
    wheel.insert(b0, 4.0)  # level 0
    wheel.insert(b1, 4.0)
    assert _names(_fire(wheel, 4.0)) == [0, 1, 2]  # was B0 B1 A
    wheel._check()


def test_a_cancel_inside_the_cascaded_prefix_keeps_the_order() -> None:
    wheel = Wheel(1.0, 4, 0.0)
    entries = [Entry(i) for i in range(6)]
    wheel.insert(entries[0], 6.0)
    wheel.insert(entries[1], 6.0)  # both level 1
    assert _fire(wheel, 3.0) == []
    wheel.insert(entries[2], 6.0)  # level 0
    assert _fire(wheel, 4.0) == []  # 0 and 1 cascade ahead of 2
    wheel.remove(entries[1])  # the end of the cascaded prefix
    wheel.insert(entries[3], 6.0)
    wheel._check()
    assert _names(_fire(wheel, 6.0)) == [0, 2, 3]


@settings(max_examples=500, deadline=None)
@given(
    size=st.sampled_from([2, 3, 4, 8]),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("insert"), st.integers(min_value=0, max_value=12)),
            st.tuples(st.just("advance"), st.integers(min_value=1, max_value=4)),
            st.tuples(st.just("cancel"), st.integers(min_value=0, max_value=50)),
        ),
        max_size=60,
    ),
)
def test_every_pass_runs_in_the_order_of_when_then_seq(
    size: int, steps: list[tuple[str, int]]
) -> None:
    """A differential test against the plain loops' rule: each pass hands out what is
    due (deadline at or before now: integer deadlines on a tick of 1), in the order of
    (when, scheduling sequence) — what a plain loop's order of ``(when, seq)`` is."""
    wheel = Wheel(1.0, size, 0.0)
    now = 0
    pending: dict[int, Entry] = {}
    seq = 0
    for op, arg in steps:
        if op == "insert":
            entry = Entry(seq)
            seq += 1
            # Absolute deadlines on a coarse grid, so that ties are common and one
            # deadline is filed at several levels as the clock moves on.
            deadline = 2 * arg
            wheel.insert(entry, float(deadline))
            pending[entry.seq] = entry
        elif op == "cancel":
            if pending:
                victim = sorted(pending)[arg % len(pending)]
                wheel.remove(pending.pop(victim))
        else:
            now += arg
            fired = _fire(wheel, float(now))
            expected = sorted(
                (e for e in pending.values() if e._deadline <= now),
                key=lambda e: (e._deadline, e.seq),
            )
            assert _names(fired) == _names(expected)
            for entry in fired:
                del pending[entry.seq]
        wheel._check()


@pytest.mark.parametrize("base", BASES)
def test_the_loop_runs_ties_in_scheduling_order_across_levels(base: str) -> None:
    """On the loop: A is filed on level 1; B0 and B1 on level 0 before A's bucket
    cascades; B2 after. All four at the same ``when``: they run A B0 B1 B2."""
    tick = 0.01  # level 0 spans 64 ticks: 0.64 s; level 1's buckets are 0.64 s wide

    async def main() -> list[str]:
        loop: Any = asyncio.get_running_loop()
        wheel = loop._engine.wheel
        size = len(wheel._wheel0)
        ran: list[str] = []
        done = loop.create_future()

        def record(name: str) -> None:
            ran.append(name)
            if len(ran) == 4:
                done.set_result(None)

        e = math.ceil((loop.time() - wheel.origin) / tick) + 2 * size
        e += (size // 2 - e % size) % size  # mid-bucket on level 1: it cascades at e - 32
        when = wheel.origin + e * tick
        loop.call_at(when, record, "A")  # on level 1 (2 * 64 ticks out)
        await asyncio.sleep(when - size * tick * 0.75 - loop.time())
        assert wheel._now < e - size // 2  # A's bucket has not cascaded yet
        loop.call_at(when, record, "B0")  # on level 0
        loop.call_at(when, record, "B1")
        await asyncio.sleep(when - size * tick * 0.25 - loop.time())
        assert wheel._now >= e - size // 2  # it has now: A is on level 0
        loop.call_at(when, record, "B2")
        await done
        return ran

    loop = aiowheel.new_event_loop(base=base, tick=tick)
    try:
        assert loop.run_until_complete(main()) == ["A", "B0", "B1", "B2"]
    finally:
        loop.close()
