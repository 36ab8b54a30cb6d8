"""The purgatory of delayed operations (Kafka's DelayedOperationPurgatory).

Scenarios from Kafka's ``DelayedOperationTest`` (anchors.md §1.4, items 11-17) and the
purgatory behaviours 54-64 of anchors.md (c), on asyncio (looptime), uvloop (real
time, small delays) and trio (MockClock). Tests that assert exact instants are marked
``virtual_time``; the others await the operations themselves.
"""

from __future__ import annotations

import copy
import datetime
import gc
import pickle
import random
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

import anyio
import numpy
import pytest
from support import at_next_collection

from aiowheel import Timer, TimerCancelled, TimerClosed, TimerFull, TimerHandle
from aiowheel.purgatory import DelayedOperation, Purgatory

pytestmark = pytest.mark.anyio

TICK = 0.001


class Op(DelayedOperation):
    """Completes once ``ready`` is set; records what happened to it, and when."""

    def __init__(self, timeout: float, *, ready: bool = False, clock: Timer | None = None):
        super().__init__(timeout)
        self.ready = ready
        self.clock = clock
        self.tries = 0
        self.events: list[str] = []
        self.completed_at: float | None = None

    def try_complete(self) -> bool:
        self.tries += 1
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.events.append("complete")
        if self.clock is not None:
            self.completed_at = self.clock.time()

    def on_expiration(self) -> None:
        self.events.append("expire")


# -- Kafka's DelayedOperationTest ------------------------------------------------------


async def test_check_without_watchers_completes_nothing() -> None:
    # Kafka: testRequestSatisfaction, first assertion; behaviour 54.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        assert purgatory.check_and_complete("test1") == 0
        assert purgatory.check_and_complete(("topic", 0)) == 0
        assert purgatory.delayed() == purgatory.watched() == len(purgatory) == 0


async def test_request_satisfaction() -> None:
    # Kafka: testRequestSatisfaction; behaviour 56.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        r1, r2 = Op(100_000), Op(100_000)
        assert not purgatory.try_complete_else_watch(r1, ["test1"])
        assert purgatory.check_and_complete("test1") == 0
        assert not purgatory.try_complete_else_watch(r2, ["test2"])
        assert purgatory.check_and_complete("test2") == 0
        assert purgatory.delayed() == 2
        r1.ready = True
        assert purgatory.check_and_complete("test1") == 1
        assert purgatory.check_and_complete("test1") == 0
        assert r1.events == ["complete"]
        assert r1.is_completed()
        r2.ready = True
        assert purgatory.check_and_complete("test2") == 1
        assert purgatory.check_and_complete("test2") == 0
        assert r2.events == ["complete"]
        assert purgatory.delayed() == purgatory.watched() == 0
        # Both timeouts left the wheel the moment their operations completed.
        assert len(timer) == 0


async def test_request_expiry(virtual: bool) -> None:
    # Kafka: testRequestExpiry; behaviour 57. Never before the timeout, on_complete
    # then on_expiration, each once; the long operation is untouched.
    async with Timer(tick=TICK) as timer:
        purgatory = Purgatory(timer)
        r1 = Op(0.020, clock=timer)
        r2 = Op(200.0, clock=timer)
        start = timer.time()
        assert not purgatory.try_complete_else_watch(r1, ["test1"])
        assert not purgatory.try_complete_else_watch(r2, ["test2"])
        await r1.wait()
        assert r1.completed_at is not None
        assert r1.completed_at >= start + 0.020
        if virtual:
            assert r1.completed_at <= start + 0.020 + TICK + 1e-9
        assert r1.events == ["complete", "expire"]
        assert not r2.is_completed()
        assert r2.events == []
        assert purgatory.delayed() == 1
        # r1 expired, so nobody checked "test1": its entry stays until a check or purge.
        assert purgatory.watched() == 2
        assert purgatory.check_and_complete("test1") == 0
        assert purgatory.watched() == 1
        assert len(timer) == 1


async def test_completes_right_away_without_watching_or_timing() -> None:
    # Behaviour 55: an operation whose condition holds is neither watched nor timed.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(10.0, ready=True)
        assert purgatory.try_complete_else_watch(op, ["a", "b"])
        assert op.events == ["complete"]
        assert op.tries == 1
        assert purgatory.delayed() == purgatory.watched() == 0
        assert len(timer) == 0
        assert timer.stats().scheduled == 0
        await op.wait()  # already completed: returns at once


async def test_purge_accounting_r1_r2_r3() -> None:
    # Kafka: testRequestPurge; behaviour 59.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        r1, r2, r3 = Op(100_000), Op(100_000), Op(100_000)
        purgatory.try_complete_else_watch(r1, ["test1"])
        purgatory.try_complete_else_watch(r2, ["test1", "test2"])
        purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
        assert purgatory.delayed() == len(purgatory) == 3
        assert purgatory.watched() == 6
        assert len(timer) == 3

        # Completed directly: delayed() drops at once and the timeout leaves the wheel
        # at once; the watch lists keep the entries until their keys are checked.
        assert r2.force_complete()
        assert purgatory.delayed() == 2
        assert len(timer) == 2
        assert r3.force_complete()
        assert purgatory.delayed() == 1
        assert len(timer) == 1
        assert purgatory.watched() == 6

        assert purgatory.check_and_complete("test1") == 0
        assert purgatory.watched() == 4
        assert purgatory.check_and_complete("test2") == 0
        assert purgatory.watched() == 2
        assert purgatory.check_and_complete("test3") == 0
        assert purgatory.watched() == 1
        assert not r1.is_completed()


async def test_cancel_for_key() -> None:
    # Kafka: testCancelForKeyReturningCancelledOperations; behaviour 60.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        ops = [Op(10_000), Op(10_000), Op(10_000)]
        purgatory.try_complete_else_watch(ops[0], ["key"])
        purgatory.try_complete_else_watch(ops[1], ["key"])
        purgatory.try_complete_else_watch(ops[2], ["key2"])
        cancelled = purgatory.cancel_for_key("key")
        assert cancelled == ops[:2]
        assert purgatory.delayed() == 1
        assert purgatory.watched() == 1
        assert len(timer) == 1  # both timeouts were cancelled
        for op in ops[:2]:
            assert not op.is_completed()
            assert op.is_cancelled()
            assert op.events == []  # neither on_complete nor on_expiration
            assert not op.force_complete()  # a cancelled operation stays cancelled
            with pytest.raises(TimerCancelled):
                await op.wait()
        assert purgatory.check_and_complete("key") == 0


async def test_cancel_for_unknown_key() -> None:
    # Kafka: testCancelForKeyReturningEmptyList.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        assert purgatory.cancel_for_key("key") == []
        purgatory.try_complete_else_watch(Op(10), ["other"])
        assert purgatory.cancel_for_key("key") == []
        assert purgatory.delayed() == 1


async def test_cancel_for_key_skips_completed_and_keeps_other_keys_consistent() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        done, live, wide = Op(10), Op(10), Op(10)
        purgatory.try_complete_else_watch(done, ["k"])
        purgatory.try_complete_else_watch(live, ["k"])
        purgatory.try_complete_else_watch(wide, ["k", "j"])
        done.force_complete()
        assert purgatory.cancel_for_key("k") == [live, wide]
        assert purgatory.delayed() == 0
        # wide's entry under "j" lingers until "j" is checked, like a completed one.
        assert purgatory.watched() == 1
        assert purgatory.check_and_complete("j") == 0
        assert purgatory.watched() == 0
        assert len(timer) == 0


# -- completion racing expiry (behaviour 58) ------------------------------------------


async def test_expiry_and_completion_in_the_same_timer_pass() -> None:
    # Two operations with the same deadline share a bucket: the first to expire
    # force-completes the other from its on_expiration, in the middle of the pass that
    # is about to expire it. Exactly one path wins for each.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        forced: list[bool] = []

        class Killer(Op):
            def on_expiration(self) -> None:
                super().on_expiration()
                forced.append(victim.force_complete())

        killer, victim = Killer(0.005), Op(0.005)
        purgatory.try_complete_else_watch(killer, ["k"])
        purgatory.try_complete_else_watch(victim, ["k"])
        await killer.wait()
        await victim.wait()
        assert killer.events.count("complete") == victim.events.count("complete") == 1
        if forced == [True]:
            assert victim.events == ["complete"]  # the force won, the expiry never ran
        else:
            assert forced == [False]
            assert victim.events == ["complete", "expire"]
        assert purgatory.delayed() == 0
        assert len(timer) == 0
        stats = timer.stats()
        assert stats.fired + stats.cancelled == 2


async def test_force_complete_at_the_deadline_races_the_timeout() -> None:
    # A task wakes at the operation's deadline and force-completes it while the
    # timeout is due too: exactly one wins, on_complete runs once.
    for _ in range(5):
        async with Timer() as timer:
            purgatory = Purgatory(timer)
            op = Op(0.010)
            purgatory.try_complete_else_watch(op, ["k"])
            deadline = timer.time() + 0.010
            results: list[bool] = []

            async def rival(
                op: Op = op, deadline: float = deadline, results: list[bool] = results
            ) -> None:
                await anyio.sleep(deadline - anyio.current_time())
                results.append(op.force_complete())

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(rival)
                await op.wait()
            assert op.events.count("complete") == 1
            expired = op.events == ["complete", "expire"]
            assert results.count(True) == (0 if expired else 1)
            assert len(results) == 3


async def test_force_complete_first_caller_wins_and_releases_the_timer() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(0.005, clock=timer)
        purgatory.try_complete_else_watch(op, ["k"])
        assert len(timer) == 1
        assert op.force_complete()
        assert len(timer) == 0
        assert timer.stats().cancelled == 1
        assert [op.force_complete() for _ in range(3)] == [False] * 3
        # Past the old deadline nothing else happens: the timeout is gone.
        await anyio.sleep(0.02)
        assert op.events == ["complete"]
        assert timer.stats().fired == 0


async def test_force_complete_from_inside_on_complete_returns_false() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        inner: list[bool] = []

        class Reentrant(Op):
            def on_complete(self) -> None:
                super().on_complete()
                inner.append(self.force_complete())

        op = Reentrant(10)
        purgatory.try_complete_else_watch(op, ["k"])
        assert op.force_complete()
        assert inner == [False]
        assert op.events == ["complete"]


async def test_expired_operation_cannot_be_forced() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(0.002)
        purgatory.try_complete_else_watch(op, ["k"])
        await op.wait()
        assert op.events == ["complete", "expire"]
        assert not op.force_complete()
        op.ready = True
        assert purgatory.check_and_complete("k") == 0


# -- timing --------------------------------------------------------------------------


@pytest.mark.virtual_time
async def test_timeout_counts_from_watch_and_is_never_early() -> None:
    async with Timer(tick=TICK) as timer:
        purgatory = Purgatory(timer)
        ops = [Op(t, clock=timer) for t in (0.0, 0.0015, 0.010, 0.0637, 1.0, 65.5)]
        await anyio.sleep(3.0)  # created long before they are watched
        start = timer.time()
        for op in ops:
            purgatory.try_complete_else_watch(op, ["k"])
        assert not any(op.is_completed() for op in ops)  # timeout 0 included
        for op in ops:
            await op.wait()
            assert op.completed_at is not None
            deadline = start + op.timeout
            assert deadline <= op.completed_at <= deadline + TICK + 1e-9, op
            assert op.events == ["complete", "expire"]
        assert purgatory.delayed() == 0


async def test_zero_timeout_expires_on_the_next_pass_not_inside_the_call() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(0)
        assert not purgatory.try_complete_else_watch(op, ["k"])
        assert op.events == []
        assert purgatory.delayed() == 1
        await op.wait()
        assert op.events == ["complete", "expire"]
        assert purgatory.delayed() == 0


async def test_delayed_is_exact_through_expiry() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        ops = [Op(0.001 * (i + 1)) for i in range(20)]
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [i % 3])
        for i, op in enumerate(ops):
            await op.wait()
            still = sum(not o.is_completed() for o in ops)
            assert purgatory.delayed() == still == len(timer)
            assert still <= 19 - i


# -- wait() --------------------------------------------------------------------------


async def test_many_tasks_wait_for_one_operation() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(60)
        purgatory.try_complete_else_watch(op, ["k"])
        woken: list[int] = []

        async def waiter(i: int) -> None:
            await op.wait()
            woken.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(waiter, i)
            await anyio.wait_all_tasks_blocked()
            assert woken == []
            op.ready = True
            assert purgatory.check_and_complete("k") == 1
        assert sorted(woken) == list(range(50))


async def test_wait_on_an_operation_that_was_never_watched() -> None:
    op = Op(1.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(op.wait)
        await anyio.wait_all_tasks_blocked()
        assert op.force_complete()
    await op.wait()
    assert op.events == ["complete"]


async def test_wait_after_cancel_raises_for_every_waiter() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(60)
        purgatory.try_complete_else_watch(op, ["k"])
        outcomes: list[str] = []

        async def waiter() -> None:
            try:
                await op.wait()
            except TimerCancelled:
                outcomes.append("cancelled")

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert purgatory.cancel_for_key("k") == [op]
        assert outcomes == ["cancelled"] * 5


async def test_a_cancelled_waiter_does_not_disturb_the_others() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(60)
        purgatory.try_complete_else_watch(op, ["k"])
        with anyio.move_on_after(0.001):
            await op.wait()
        assert not op.is_completed()
        async with anyio.create_task_group() as tg:
            tg.start_soon(op.wait)
            await anyio.wait_all_tasks_blocked()
            op.force_complete()


# -- purging (behaviour 61) and memory -------------------------------------------------


async def test_purge_once_more_than_purge_interval_completed_are_watched() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer, purge_interval=10)
        live = [Op(100) for _ in range(4)]
        done = [Op(100) for _ in range(11)]
        for op in live + done:
            purgatory.try_complete_else_watch(op, ["a", "b"])
        assert purgatory.watched() == 30
        for op in done[:10]:
            op.force_complete()
        # Ten completed operations still watched: not more than purge_interval.
        assert purgatory.watched() == 30
        assert purgatory.delayed() == 5
        done[10].force_complete()
        # The eleventh tips it over: every list is purged of completed operations.
        assert purgatory.watched() == 2 * len(live)
        assert purgatory.delayed() == 4


async def test_purge_counts_operations_not_entries_and_not_checked_ones() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer, purge_interval=3)
        ops = [Op(100) for _ in range(6)]
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [f"own{i}", "shared", "x"])
        for op in ops[:3]:
            op.force_complete()
        assert purgatory.watched() == 18  # 3 completed ops (9 entries): no purge yet
        # Checking their own keys takes 3 entries out, but all three are still
        # referenced by "shared" and "x", so they still count.
        for i in range(3):
            assert purgatory.check_and_complete(f"own{i}") == 0
        assert purgatory.watched() == 15
        # Checking "shared" and "x" unwatches them entirely: the count drops to 0, so
        # the next three completions do not trigger a purge either.
        purgatory.check_and_complete("shared")
        purgatory.check_and_complete("x")
        assert purgatory.watched() == 9
        for op in ops[3:]:
            op.force_complete()
        assert purgatory.watched() == 9
        purgatory.try_complete_else_watch(extra := Op(100), ["y"])
        extra.force_complete()  # the fourth completed-and-watched: purge
        assert purgatory.watched() == 0


async def _watch_and_complete(n: int, label: str) -> None:
    """n operations watched on fresh keys and on a shared key, completed directly, their
    keys never checked again: the purge keeps the watch lists at most purge_interval
    completed operations deep, and completed operations are released (not retained by
    any list)."""
    interval = 1000
    async with Timer() as timer:
        purgatory = Purgatory(timer, purge_interval=interval)
        # One long-lived operation with the earliest deadline keeps the timer's driver
        # armed for it, so the loop below measures the purgatory, not driver re-arms.
        sentinel = Op(3600)
        purgatory.try_complete_else_watch(sentinel, ["sentinel"])
        early: list[weakref.ref[DelayedOperation]] = []
        most = 0
        started = time.perf_counter()
        for i in range(n):
            op = DelayedOperation(7200)
            purgatory.try_complete_else_watch(op, (i, "shared"))
            op.force_complete()
            if i % 997 == 0:
                most = max(most, purgatory.watched())
            if i < 100:
                early.append(weakref.ref(op))
        elapsed = time.perf_counter() - started
        print(f"\n{label}: {n:,} watch+complete in {elapsed:.2f} s ({elapsed / n * 1e9:.0f} ns/op)")
        assert most <= 2 * (interval + 1) + 1
        assert purgatory.watched() <= 2 * (interval + 1) + 1
        assert purgatory.delayed() == 1
        assert len(timer) == 1
        gc.collect()
        assert all(ref() is None for ref in early)
        assert not sentinel.is_completed()


async def test_memory_stays_bounded_on_keys_never_checked_again(backend: str) -> None:
    # 100,000 operations: a hundred purges. The loop is synchronous, so the backend only
    # changes the timer's driver.
    await _watch_and_complete(100_000, backend)


@pytest.mark.slow
def test_a_million_operations_on_keys_never_checked_again() -> None:
    # The million of docs/purgatory.md, once, on asyncio (~4-6 s; CI runs it on the
    # compiled core).
    anyio.run(_watch_and_complete, 1_000_000, "asyncio", backend="asyncio")


@pytest.mark.virtual_time
async def test_memory_stays_bounded_when_operations_expire() -> None:
    # The same with completion by timeout: expired operations linger on their
    # (never checked) keys only until the purge.
    async with Timer() as timer:
        purgatory = Purgatory(timer, purge_interval=100)
        most = 0
        for round_ in range(50):
            for i in range(500):
                purgatory.try_complete_else_watch(Op(0.001 * (i % 7)), [(round_, i), "all"])
            await anyio.sleep(0.01)
            assert purgatory.delayed() == 0
            most = max(most, purgatory.watched())
        assert most <= 2 * 101


# -- futures (behaviour 62) and concurrent checkers (behaviour 63) ---------------------


class Slot:
    """A minimal future-like value, watched through the purgatory."""

    def __init__(self, purgatory: Purgatory, key: Hashable) -> None:
        self.purgatory = purgatory
        self.key = key
        self.value: int | None = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.value is not None or self.error is not None

    def set(self, value: int) -> None:
        self.value = value
        self.purgatory.check_and_complete(self.key)


class AllOf(DelayedOperation):
    """Kafka's DelayedFuture: completes when every slot is done; on timeout the slots
    still pending fail with TimeoutError and the callback sees the values there are."""

    def __init__(self, timeout: float, slots: list[Slot]) -> None:
        super().__init__(timeout)
        self.slots = slots
        self.result: int | None = None

    def try_complete(self) -> bool:
        return all(s.done() for s in self.slots) and self.force_complete()

    def on_complete(self) -> None:
        for slot in self.slots:
            if not slot.done():
                slot.error = TimeoutError()
        self.result = sum(s.value for s in self.slots if s.value is not None)


async def test_delayed_futures() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)

        # (a) every future already done: completes at once.
        a = [Slot(purgatory, "a1"), Slot(purgatory, "a2")]
        a[0].value, a[1].value = 10, 11
        op_a = AllOf(60, a)
        assert purgatory.try_complete_else_watch(op_a, ["a1", "a2"])
        assert op_a.result == 21

        # (b) both pending: incomplete until both are done.
        b = [Slot(purgatory, "b1"), Slot(purgatory, "b2")]
        op_b = AllOf(60, b)
        assert not purgatory.try_complete_else_watch(op_b, ["b1", "b2"])
        b[0].set(20)
        assert not op_b.is_completed()
        b[1].set(21)
        assert op_b.is_completed()
        assert op_b.result == 41

        # (c) one pending, one done: completes with the pending one.
        c = [Slot(purgatory, "c1"), Slot(purgatory, "c2")]
        c[1].value = 30
        op_c = AllOf(60, c)
        assert not purgatory.try_complete_else_watch(op_c, ["c1", "c2"])
        c[0].set(31)
        assert op_c.result == 61

        # (d) one never completes: on timeout it fails, the other keeps its value.
        d = [Slot(purgatory, "d1"), Slot(purgatory, "d2")]
        op_d = AllOf(0.02, d)
        start = timer.time()
        assert not purgatory.try_complete_else_watch(op_d, ["d1", "d2"])
        d[0].set(40)
        await op_d.wait()
        assert timer.time() >= start + 0.02
        assert op_d.result == 40
        assert isinstance(d[1].error, TimeoutError)
        assert d[0].error is None
        assert purgatory.delayed() == 0


async def test_no_lost_wakeups_with_many_concurrent_checkers(virtual: bool) -> None:
    # Kafka: testDelayedOperationLock's successor, behaviour 63: 100 operations on
    # distinct keys, 20 randomly delayed checks each; an operation becomes completable
    # only on its last check. Every operation must end completed.
    rng = random.Random(63)
    rounds = 20
    scale = 1.0 if virtual else 0.005  # real time on uvloop: keep it short
    async with Timer() as timer:
        purgatory = Purgatory(timer)

        class Countdown(DelayedOperation):
            def __init__(self) -> None:
                super().__init__(3600)
                self.left = rounds
                self.completions = 0

            def try_complete(self) -> bool:
                return self.left == 0 and self.force_complete()

            def on_complete(self) -> None:
                self.completions += 1

        ops = [Countdown() for _ in range(100)]
        for i, op in enumerate(ops):
            assert not purgatory.try_complete_else_watch(op, [i])

        async def checker(i: int, delay: float) -> None:
            await anyio.sleep(delay)
            ops[i].left -= 1
            purgatory.check_and_complete(i)

        async with anyio.create_task_group() as tg:
            for i in range(len(ops)):
                for _ in range(rounds):
                    tg.start_soon(checker, i, rng.random() * scale)
        assert all(op.completions == 1 for op in ops)
        assert purgatory.delayed() == purgatory.watched() == 0


# -- shutdown (behaviour 64) -----------------------------------------------------------


async def test_close_cancels_delayed_operations_and_refuses_new_ones() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        ops = [Op(0.005), Op(0.005), Op(60)]
        purgatory.try_complete_else_watch(ops[0], ["a"])
        purgatory.try_complete_else_watch(ops[1], ["a", "b"])
        purgatory.try_complete_else_watch(ops[2], ["c"])
        ops[0].force_complete()
        assert purgatory.close() == ops[1:]
        assert purgatory.closed
        assert purgatory.delayed() == purgatory.watched() == 0
        assert len(timer) == 0
        await anyio.sleep(0.02)  # past every timeout: nothing completes or expires
        assert ops[1].events == ops[2].events == []
        for op in ops[1:]:
            with pytest.raises(TimerCancelled):
                await op.wait()
        with pytest.raises(TimerClosed, match="closed"):
            purgatory.try_complete_else_watch(Op(1), ["a"])
        assert purgatory.close() == []  # idempotent
        assert purgatory.check_and_complete("a") == 0


async def test_purgatory_as_context_manager_closes() -> None:
    async with Timer() as timer:
        with Purgatory(timer) as purgatory:
            op = Op(60)
            purgatory.try_complete_else_watch(op, ["k"])
        assert op.is_cancelled()
        assert len(timer) == 0


# -- re-entrancy: callbacks that call back into the purgatory -------------------------


async def test_on_complete_watches_a_new_operation_on_the_key_being_checked() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        follow_ups: list[Op] = []

        class Repark(Op):
            def on_complete(self) -> None:
                super().on_complete()
                nxt = Op(60)
                follow_ups.append(nxt)
                assert not purgatory.try_complete_else_watch(nxt, ["k"])

        ops = [Repark(60) for _ in range(3)]
        for op in ops:
            purgatory.try_complete_else_watch(op, ["k"])
        for op in ops:
            op.ready = True
        assert purgatory.check_and_complete("k") == 3
        assert len(follow_ups) == 3
        assert not any(o.is_completed() for o in follow_ups)
        assert purgatory.delayed() == 3
        assert purgatory.watched() == 3
        for follow_up in follow_ups:
            follow_up.ready = True
        assert purgatory.check_and_complete("k") == 3
        assert purgatory.delayed() == purgatory.watched() == 0


async def test_nested_check_of_the_same_key_loses_no_wakeup() -> None:
    # a is checked first and is not ready; completing b makes a ready and checks the
    # key again from b's on_complete: a must complete.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        a = Op(60)

        class B(Op):
            def on_complete(self) -> None:
                super().on_complete()
                a.ready = True
                nested.append(purgatory.check_and_complete("k"))

        nested: list[int] = []
        b = B(60)
        purgatory.try_complete_else_watch(a, ["k"])
        purgatory.try_complete_else_watch(b, ["k"])
        b.ready = True
        assert purgatory.check_and_complete("k") == 1
        assert nested == [1]
        assert a.events == b.events == ["complete"]
        assert purgatory.delayed() == purgatory.watched() == 0


async def test_cancel_for_key_during_a_check_of_that_key() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        cancelled: list[DelayedOperation] = []

        class Canceller(Op):
            def on_complete(self) -> None:
                super().on_complete()
                cancelled.extend(purgatory.cancel_for_key("k"))

        first = Canceller(60)
        rest = [Op(60) for _ in range(3)]
        purgatory.try_complete_else_watch(first, ["k"])
        for op in rest:
            purgatory.try_complete_else_watch(op, ["k", "other"])
        for op in [first, *rest]:
            op.ready = True
        assert purgatory.check_and_complete("k") == 1
        assert cancelled == rest
        assert all(op.events == [] for op in rest)
        assert purgatory.delayed() == 0
        assert purgatory.watched() == 3  # their "other" entries
        assert purgatory.check_and_complete("other") == 0
        assert purgatory.watched() == 0
        assert len(timer) == 0


async def test_purge_triggered_during_a_check_is_deferred_and_consistent() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer, purge_interval=0)
        ops = [Op(60, ready=True) for _ in range(5)]
        for i, op in enumerate(ops):
            op.ready = False
            purgatory.try_complete_else_watch(op, ["k", f"own{i}"])
            op.ready = True
        assert purgatory.check_and_complete("k") == 5
        # purge_interval=0: the completions purged every other list right after.
        assert purgatory.watched() == 0
        assert purgatory.delayed() == 0


async def test_exception_in_on_complete_propagates_and_leaves_state_consistent() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)

        class Boom(Op):
            def on_complete(self) -> None:
                super().on_complete()
                raise RuntimeError("boom")

        boom, later = Boom(60), Op(60)
        purgatory.try_complete_else_watch(boom, ["k"])
        purgatory.try_complete_else_watch(later, ["k"])
        boom.ready = later.ready = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(boom.wait)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(RuntimeError, match="boom"):
                purgatory.check_and_complete("k")
        # boom completed (and its waiter woke); the walk stopped before `later`.
        assert boom.is_completed()
        assert not later.is_completed()
        assert purgatory.delayed() == 1
        assert len(timer) == 1
        assert purgatory.check_and_complete("k") == 1
        assert purgatory.delayed() == purgatory.watched() == 0


async def test_exception_on_expiry_goes_to_the_timers_on_error() -> None:
    errors: list[BaseException] = []

    def on_error(handle: TimerHandle[Any], exc: BaseException) -> None:
        errors.append(exc)

    async with Timer(on_error=on_error) as timer:
        purgatory = Purgatory(timer)

        class Boom(Op):
            def on_expiration(self) -> None:
                super().on_expiration()
                raise ValueError("late")

        op, other = Boom(0.002), Op(0.002)
        purgatory.try_complete_else_watch(op, ["k"])
        purgatory.try_complete_else_watch(other, ["k"])
        await op.wait()
        await other.wait()
        assert [type(e) for e in errors] == [ValueError]
        assert op.events == other.events == ["complete", "expire"]
        assert purgatory.delayed() == 0


# -- several purgatories, one timer ---------------------------------------------------


async def test_purgatories_share_a_timer() -> None:
    async with Timer() as timer:
        fetch = Purgatory(timer, name="fetch")
        produce = Purgatory(timer, name="produce")
        f, p = Op(60), Op(0.002)
        fetch.try_complete_else_watch(f, ["t"])
        produce.try_complete_else_watch(p, ["t"])
        assert len(timer) == 2
        await p.wait()
        assert fetch.delayed() == 1
        assert produce.delayed() == 0
        f.ready = True
        assert produce.check_and_complete("t") == 0
        assert fetch.check_and_complete("t") == 1
        with pytest.raises(RuntimeError, match="already handed"):
            produce.try_complete_else_watch(f, ["t"])
        assert "fetch" in repr(fetch)


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["1", None, True, [1], 1j])
def test_timeout_of_wrong_type(bad: Any) -> None:
    with pytest.raises(TypeError, match="timeout"):
        DelayedOperation(bad)


@pytest.mark.parametrize("bad", [-0.001, -1, float("nan"), float("inf"), float("-inf")])
def test_timeout_out_of_range(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        DelayedOperation(bad)


def test_timeout_accepts_ints_and_zero() -> None:
    assert DelayedOperation(0).timeout == 0.0
    assert DelayedOperation(5).timeout == 5.0
    assert "new" in repr(DelayedOperation(1.5))


@pytest.mark.parametrize(
    "value", [Fraction(1, 4), Decimal("0.25"), numpy.float32(0.25), numpy.int64(0)]
)
def test_timeout_follows_the_timers_rule_for_times(value: Any) -> None:
    # The same values as Timer.schedule (docs/usage.md, "Times and bad input").
    assert DelayedOperation(value).timeout == float(value)


def test_a_timedelta_timeout_says_what_to_pass() -> None:
    with pytest.raises(TypeError, match="total_seconds"):
        DelayedOperation(datetime.timedelta(seconds=1))  # type: ignore[arg-type]


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps])
async def test_a_watched_operation_cannot_be_copied_and_still_expires(
    copier: Callable[[object], object],
) -> None:
    # A copy would share the original's timeout: completing it would cancel that
    # timeout, and the original, still watched, would never expire.
    async with Timer(tick=TICK) as timer:
        purgatory = Purgatory(timer)
        op = Op(1.0, clock=timer)
        start = timer.time()
        assert not purgatory.try_complete_else_watch(op, ["k"])
        with pytest.raises(TypeError, match="cannot be copied or pickled once handed"):
            copier(op)
        await op.wait()
        assert op.events == ["complete", "expire"]
        assert op.completed_at is not None
        assert op.completed_at >= start + 1.0
        with pytest.raises(TypeError, match="once handed"):
            copy.copy(op)  # completed: still the one operation


def test_a_new_operation_copies_as_usual() -> None:
    op = Op(2.5, ready=True)
    twin = copy.copy(op)
    assert twin is not op
    assert twin.timeout == 2.5
    assert twin.ready
    assert copy.deepcopy(op).events == []


async def test_purgatory_constructor_validation() -> None:
    timer = Timer()
    with pytest.raises(TypeError, match="Timer"):
        Purgatory(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        Purgatory(timer, name=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="purge_interval"):
        Purgatory(timer, purge_interval=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="purge_interval"):
        Purgatory(timer, purge_interval=True)
    with pytest.raises(ValueError, match="purge_interval"):
        Purgatory(timer, purge_interval=-1)
    purgatory = Purgatory(timer, name="fetch", purge_interval=0)
    assert (purgatory.name, purgatory.purge_interval, purgatory.timer) == ("fetch", 0, timer)


async def test_bad_keys() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        with pytest.raises(ValueError, match="at least one key"):
            purgatory.try_complete_else_watch(Op(1), [])
        with pytest.raises(ValueError, match="at least one key"):
            purgatory.try_complete_else_watch(Op(1), iter(()))
        with pytest.raises(TypeError, match="string"):
            purgatory.try_complete_else_watch(Op(1), "topic")
        with pytest.raises(TypeError, match="string"):
            purgatory.try_complete_else_watch(Op(1), b"topic")
        with pytest.raises(TypeError, match="unhashable"):
            purgatory.try_complete_else_watch(Op(1), ["ok", ["not", "hashable"]])  # type: ignore[list-item]
        assert purgatory.delayed() == purgatory.watched() == len(timer) == 0
        # Any iterable of hashables works; a key given twice is one entry.
        op = Op(1)
        purgatory.try_complete_else_watch(op, (k for k in ["a", ("t", 0), "a"]))
        assert purgatory.watched() == 2
        op.force_complete()


async def test_bad_operations() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        with pytest.raises(TypeError, match="DelayedOperation"):
            purgatory.try_complete_else_watch(object(), ["k"])  # type: ignore[arg-type]

        class Forgetful(DelayedOperation):
            def __init__(self) -> None:
                pass  # no super().__init__

        with pytest.raises(TypeError, match=r"super\(\).__init__"):
            purgatory.try_complete_else_watch(Forgetful(), ["k"])

        @dataclass
        class Fetch(DelayedOperation):
            # A dataclass defines __eq__ and loses __hash__: still watchable.
            topic: str
            seen: list[str] = field(default_factory=list)

            def __post_init__(self) -> None:
                super().__init__(60)

        f1, f2 = Fetch("t"), Fetch("t")
        assert f1 == f2
        purgatory.try_complete_else_watch(f1, ["t"])
        purgatory.try_complete_else_watch(f2, ["t"])
        assert purgatory.watched() == 2
        assert purgatory.delayed() == 2
        f1.force_complete()
        assert purgatory.check_and_complete("t") == 0
        assert purgatory.watched() == 1

        # Watching twice is an error, whether the operation is waiting, done or
        # cancelled; an operation completed before it was ever watched is just done.
        op = Op(60)
        purgatory.try_complete_else_watch(op, ["k"])
        with pytest.raises(RuntimeError, match="already handed"):
            purgatory.try_complete_else_watch(op, ["k"])
        op.force_complete()
        with pytest.raises(RuntimeError, match="already handed"):
            purgatory.try_complete_else_watch(op, ["k"])
        early = Op(60)
        early.force_complete()
        assert purgatory.try_complete_else_watch(early, ["k"])
        assert early.events == ["complete"]
        assert purgatory.delayed() == 1


async def test_closed_or_unstarted_timer_is_refused() -> None:
    unstarted = Purgatory(Timer())
    with pytest.raises(TimerClosed, match="not started"):
        unstarted.try_complete_else_watch(Op(1), ["k"])
    assert unstarted.delayed() == unstarted.watched() == 0

    async with Timer() as timer:
        purgatory = Purgatory(timer)
    with pytest.raises(TimerClosed, match="closed"):
        purgatory.try_complete_else_watch(Op(1), ["k"])
    with pytest.raises(TimerClosed, match="closed"):
        purgatory.try_complete_else_watch(Op(1, ready=True), ["k"])
    assert purgatory.delayed() == purgatory.watched() == 0


async def test_full_timer_is_refused_without_watching() -> None:
    async with Timer(max_pending=1) as timer:
        purgatory = Purgatory(timer)
        purgatory.try_complete_else_watch(Op(60), ["k"])
        op = Op(60)
        with pytest.raises(TimerFull):
            purgatory.try_complete_else_watch(op, ["k"])
        assert purgatory.delayed() == 1
        assert purgatory.watched() == 1
        # Not handed over: it may be watched once there is room.
        purgatory.cancel_for_key("k")
        assert not purgatory.try_complete_else_watch(op, ["k"])


# -- a seeded random walk against a model -------------------------------------------


async def test_random_operations_keep_the_accounting_exact() -> None:
    rng = random.Random(2015)
    async with Timer() as timer:
        purgatory = Purgatory(timer, purge_interval=7)
        keys = list(range(6))
        live: dict[int, tuple[Op, tuple[int, ...]]] = {}
        # Model: which finished operations each key's list may still hold.
        everything: list[Op] = []
        for _ in range(3000):
            action = rng.random()
            if action < 0.4:
                op = Op(60, ready=rng.random() < 0.1)
                watch = tuple(rng.sample(keys, rng.randint(1, 3)))
                if not purgatory.try_complete_else_watch(op, watch):
                    live[id(op)] = (op, watch)
                everything.append(op)
            elif action < 0.6 and live:
                op, _ = live[rng.choice(list(live))]
                op.ready = True
            elif action < 0.8:
                key = rng.choice(keys)
                expected = sum(1 for op, watch in live.values() if op.ready and key in watch)
                assert purgatory.check_and_complete(key) == expected
            elif action < 0.9 and live:
                op, _ = live[rng.choice(list(live))]
                assert op.force_complete()
            else:
                key = rng.choice(keys)
                expected_ops = [op for op, watch in live.values() if key in watch]
                got = purgatory.cancel_for_key(key)
                assert {id(o) for o in got} == {id(o) for o in expected_ops}
            for ident in [
                i for i, (op, _) in live.items() if op.is_completed() or op.is_cancelled()
            ]:
                del live[ident]
            assert purgatory.delayed() == len(live) == len(timer)
            live_entries = sum(len(watch) for _, watch in live.values())
            # Completed/cancelled operations may linger, but at most purge_interval of
            # them (each on at most 3 keys) once the call returned.
            assert live_entries <= purgatory.watched() <= live_entries + 3 * 7
        assert all(op.events in ([], ["complete"]) for op in everything)
        for key in keys:
            purgatory.check_and_complete(key)
        # Every list was just walked: only live operations are left in them.
        still = [(op, w) for op, w in live.values() if not op.is_completed()]
        assert all(not op.ready for op, _ in still)
        assert purgatory.watched() == sum(len(w) for _, w in still)
        assert purgatory.delayed() == len(still)


async def test_operations_completed_by_checks_are_released() -> None:
    """The purge only visits operations that finished while watched; the list of them
    must not keep operations that checks already took out of every watch list (the
    long-poll case: completed by check_and_complete, never purged)."""
    async with Timer(tick=TICK) as timer:
        purgatory = Purgatory(timer, purge_interval=10)
        refs = []
        gc.disable()
        try:
            for i in range(2_000):
                op = Op(60.0)
                refs.append(weakref.ref(op))
                assert not purgatory.try_complete_else_watch(op, [i % 7])
                op.ready = True
                assert purgatory.check_and_complete(i % 7) == 1
                del op
            assert purgatory.delayed() == 0
            assert purgatory.watched() == 0
            alive = sum(ref() is not None for ref in refs)
            assert alive <= 2 * 10 + 2  # at most the bound on the not-yet-compacted list
        finally:
            gc.enable()


# -- threads (issue 20, section 3) --------------------------------------------------------
# A call from another thread used to change state and only then reach the timer's own
# check: check_and_complete marked the operation completed and woke its waiters, but
# on_complete never ran, its timeout stayed on the wheel and delayed() stayed 1;
# cancel_for_key popped the watch list and marked the operation cancelled, then raised.


async def _in_thread(backend: str, fn: Callable[[], Any]) -> Any:
    # Virtual clocks cannot see a thread: freeze trio's autojump meanwhile (looptime
    # follows run_in_executor futures in step with real time). On asyncio, a pool of
    # the call's own, not the loop's default executor: from Python 3.12 the runner
    # joins that one under a 300 s timeout that looptime jumps over (tests/test_faults.py,
    # in_thread).
    if backend == "trio":
        import trio

        clock: Any = trio.lowlevel.current_clock()
        saved = clock.autojump_threshold
        clock.autojump_threshold = float("inf")
        try:
            return await trio.to_thread.run_sync(fn)
        finally:
            clock.autojump_threshold = saved
    import asyncio
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)


def _raised(call: Callable[[], object]) -> str:
    try:
        call()
    except RuntimeError as exc:
        return "RuntimeError" if not isinstance(exc, TimerClosed) else "TimerClosed"
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


async def test_every_mutation_from_another_thread_raises_and_changes_nothing(
    backend: str,
) -> None:
    import asyncio

    async with Timer(tick=TICK) as timer:
        purgatory = Purgatory(timer)
        watched = Op(100.0)
        other = Op(100.0)
        assert not purgatory.try_complete_else_watch(watched, ["a", "b"])
        assert not purgatory.try_complete_else_watch(other, ["b"])
        watched.ready = True  # a check would complete it
        fresh = Op(100.0, ready=True)
        tries = (watched.tries, other.tries, fresh.tries)

        def wait_in_its_own_loop() -> None:
            asyncio.run(watched.wait())

        calls: dict[str, Callable[[], object]] = {
            "try_complete_else_watch": lambda: purgatory.try_complete_else_watch(fresh, ["c"]),
            "check_and_complete": lambda: purgatory.check_and_complete("a"),
            "cancel_for_key": lambda: purgatory.cancel_for_key("b"),
            "close": purgatory.close,
            "__exit__": lambda: purgatory.__exit__(None, None, None),
            "force_complete": watched.force_complete,
            "wait": wait_in_its_own_loop,
        }

        def from_thread() -> dict[str, str]:
            return {name: _raised(call) for name, call in calls.items()}

        outcomes = await _in_thread(backend, from_thread)
        assert outcomes == dict.fromkeys(calls, "RuntimeError"), outcomes
        # Nothing changed: counts, states, the timeouts on the wheel, no user code ran.
        assert (purgatory.delayed(), purgatory.watched(), len(timer)) == (2, 3, 2)
        assert not purgatory.closed
        assert not any(op.is_completed() or op.is_cancelled() for op in (watched, other, fresh))
        assert (watched.tries, other.tries, fresh.tries) == tries
        assert watched.events == other.events == fresh.events == []
        # And the loop's own calls work on the untouched state.
        assert purgatory.check_and_complete("a") == 1
        assert watched.events == ["complete"]
        assert (purgatory.delayed(), len(timer)) == (1, 1)
        assert purgatory.cancel_for_key("b") == [other]
        assert (purgatory.delayed(), purgatory.watched(), len(timer)) == (0, 0, 0)


async def test_a_thread_goes_through_call_threadsafe(backend: str) -> None:
    async with Timer(tick=TICK) as timer:
        purgatory = Purgatory(timer)
        op = Op(100.0)
        assert not purgatory.try_complete_else_watch(op, ["k"])
        op.ready = True

        def from_thread() -> int:
            return timer.call_threadsafe(purgatory.check_and_complete, "k").result(timeout=10)

        assert await _in_thread(backend, from_thread) == 1
        assert op.is_completed()
        assert op.events == ["complete"]
        assert (purgatory.delayed(), len(timer)) == (0, 0)


async def test_an_operation_never_handed_to_a_purgatory_has_no_owner(backend: str) -> None:
    op = Op(1.0)
    assert await _in_thread(backend, op.force_complete) is True
    assert op.events == ["complete"]
    await op.wait()


async def test_an_operation_that_left_its_watch_lists_is_not_kept_alive() -> None:
    # Issue 20: operations that finished while watched and then left their lists
    # through a check stayed referenced by the purgatory's purge bookkeeping for up to
    # 2 * purge_interval more completions, with whatever they held (the long-poll
    # example's 1 MiB answers: 2 GB after 2,100 polls).
    async with Timer(tick=TICK) as timer:
        with Purgatory(timer, purge_interval=1000) as purgatory:
            refs = []
            for i in range(50):
                op = Op(30.0)
                assert not purgatory.try_complete_else_watch(op, (f"k{i}",))
                op.ready = True
                assert purgatory.check_and_complete(f"k{i}") == 1
                refs.append(weakref.ref(op))
                del op
            assert purgatory.watched() == 0
            gc.collect()
            assert [ref for ref in refs if ref() is not None] == []
            # Still watched on another key: kept (the purge needs it) until that key
            # is checked, then released.
            op = Op(30.0)
            assert not purgatory.try_complete_else_watch(op, ("a", "b"))
            op.ready = True
            assert purgatory.check_and_complete("a") == 1
            ref = weakref.ref(op)
            del op
            gc.collect()
            assert ref() is not None
            assert purgatory.check_and_complete("b") == 0
            gc.collect()
            assert ref() is None


# -- the compiled core (issue 19): interpreted subclasses of the compiled base -----------


class Grandchild(Op):
    """A subclass of a subclass, overriding again: every level's override must run."""

    def on_complete(self) -> None:
        super().on_complete()
        self.events.append("grandchild complete")

    def on_expiration(self) -> None:
        super().on_expiration()
        self.events.append("grandchild expire")


@pytest.mark.virtual_time
async def test_overrides_of_an_interpreted_subclass_are_called() -> None:
    """The purgatory calls the user's try_complete, on_complete and on_expiration (on
    the compiled core, through the interpreted subclass, not the compiled base's)."""
    async with Timer(tick=TICK) as timer:
        with Purgatory(timer) as purgatory:
            by_condition = Grandchild(10.0)
            assert not purgatory.try_complete_else_watch(by_condition, ["k"])
            assert by_condition.tries == 1  # the first try, at watch time
            by_condition.ready = True
            assert purgatory.check_and_complete("k") == 1
            assert by_condition.tries == 2
            assert by_condition.events == ["complete", "grandchild complete"]

            by_timeout = Grandchild(0.05)
            assert not purgatory.try_complete_else_watch(by_timeout, ["k"])
            await by_timeout.wait()
            assert by_timeout.events == [
                "complete",
                "grandchild complete",
                "expire",
                "grandchild expire",
            ]
            forced = Grandchild(10.0)
            assert not purgatory.try_complete_else_watch(forced, ["k"])
            assert forced.force_complete()
            assert forced.events == ["complete", "grandchild complete"]


async def test_a_subclass_without_slots_keeps_its_dict_and_weak_references() -> None:
    class Plain(DelayedOperation):
        pass

    op = Plain(1.0)
    op.anything = 1  # type: ignore[attr-defined]
    assert weakref.ref(op)() is op
    twin = copy.deepcopy(op)
    assert twin.anything == 1  # type: ignore[attr-defined]
    assert twin.timeout == 1.0
    assert not twin.is_completed()


async def test_one_watchers_object_per_key() -> None:
    """One key's watch list is a ``Watchers`` (Kafka's): watch order, one entry per
    operation, gone once empty."""
    from aiowheel.purgatory import Watchers

    async with Timer(tick=TICK) as timer:
        with Purgatory(timer) as purgatory:
            ops = [Op(10.0) for _ in range(3)]
            for op in ops:
                purgatory.try_complete_else_watch(op, ["k", "k"])  # one entry
            watchers = purgatory._watchers["k"]
            assert isinstance(watchers, Watchers)
            assert watchers.key == "k"
            assert watchers.snapshot() == ops
            assert len(watchers) == purgatory.watched() == 3
            for op in ops:
                op.ready = True
            assert purgatory.check_and_complete("k") == 3
            assert "k" not in purgatory._watchers


# -- re-entrancy during try_complete_else_watch (docs/purgatory.md, "Re-entrancy") -----


class _CollidingKey:
    """A key whose ``__eq__`` (run when a dict compares it with another key of the
    same hash) calls ``hook`` once: user code in the middle of a look-up."""

    def __init__(self, name: str, hook: Callable[[], object] | None = None) -> None:
        self.name = name
        self.hook = hook

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self is other

    def __repr__(self) -> str:
        return self.name


def _assert_consistent(purgatory: Purgatory, timer: Timer) -> None:
    # The purgatory's counts against its lists, every list live and non-empty, each
    # watched operation in exactly _entries lists, and the timer's own invariants.
    lists = list(purgatory._watchers.values())
    assert all(wl._live and len(wl) > 0 for wl in lists)
    assert purgatory.watched() == sum(len(wl) for wl in lists)
    ops = [op for wl in lists for op in wl.snapshot()]
    watched = {id(op): op for op in ops if op._state == 1}
    assert purgatory.delayed() == len(watched) == len(timer)
    for op in watched.values():
        assert op._entries == sum(1 for other in ops if other is op)
        assert op._purgatory is purgatory
        assert op._handle is not None
    timer._check()


@pytest.mark.parametrize("source", ["key __eq__", "finalizer"])
@pytest.mark.parametrize("action", ["force_complete", "close", "cancel_for_key", "check_key"])
async def test_user_code_during_try_complete_else_watch_leaves_nothing_half_done(
    source: str, action: str
) -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        base = _CollidingKey("base")
        first = Op(60)
        assert not purgatory.try_complete_else_watch(first, [base])
        op = Op(60)
        fresh = _CollidingKey("fresh")  # no list yet: made by the call
        acted: list[object] = []

        def act() -> None:
            if action == "force_complete":
                acted.append(op.force_complete())
            elif action == "close":
                acted.append(purgatory.close())
            elif action == "cancel_for_key":
                acted.append(purgatory.cancel_for_key("x"))
            else:
                acted.append(purgatory.check_and_complete("x"))

        if source == "key __eq__":
            # Runs when `fresh` is looked up (same hash as `base`): after the call made
            # the list of "x", which cancel_for_key and check_and_complete take out.
            base.hook = act
            outcome: object = None
            try:
                outcome = purgatory.try_complete_else_watch(op, ["x", fresh])
            except TimerClosed as exc:
                outcome = exc
        else:
            # The collector runs at the call's first allocation (the list of "x",
            # before it is in the map); its hook acts.
            with at_next_collection(act):
                try:
                    outcome = purgatory.try_complete_else_watch(op, ["x", fresh])
                except TimerClosed as exc:
                    outcome = exc
        assert acted, "the user code ran"
        if action == "force_complete":
            assert outcome is True
            assert op.is_completed()
            assert op.events == ["complete"]
            assert op._entries == 0
            assert op._handle is None
        elif action == "close":
            assert isinstance(outcome, TimerClosed)
            assert not purgatory._watchers
            assert first.is_cancelled()
            assert op._state == 0
            assert op._entries == 0
        else:
            # Parked on both keys; through the key's __eq__, the list of "x" the call
            # had made was taken out under it, and it prepared again.
            assert outcome is False
            assert op._state == 1
            assert op._entries == 2
            assert [o is op for o in purgatory._watchers[fresh].snapshot()] == [True]
            assert [o is op for o in purgatory._watchers["x"].snapshot()] == [True]
        _assert_consistent(purgatory, timer)
        for key in ("x", fresh, base):
            purgatory.check_and_complete(key)
        _assert_consistent(purgatory, timer)
        purgatory.close()
        _assert_consistent(purgatory, timer)


async def test_a_key_that_keeps_re_entering_gets_a_clear_error() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        base = _CollidingKey("base")
        assert not purgatory.try_complete_else_watch(Op(60), [base])
        fresh = _CollidingKey("fresh")
        op = Op(60)

        class Again:
            # Every look-up of `fresh` takes out the list of "x" the call just made.
            def __call__(self) -> None:
                purgatory.cancel_for_key("x")
                base.hook = self

        base.hook = Again()
        with pytest.raises(RuntimeError, match="changed under try_complete_else_watch"):
            purgatory.try_complete_else_watch(op, ["x", fresh])
        base.hook = None
        assert op._state == 0
        assert op._entries == 0
        assert op._handle is None
        _assert_consistent(purgatory, timer)


class _FlakyHashKey:
    # Hashable the first time (try_complete_else_watch's up-front check), then raises.
    def __init__(self) -> None:
        self.hashed = 0

    def __hash__(self) -> int:
        self.hashed += 1
        if self.hashed > 1:
            raise TypeError("flaky hash")
        return 1


async def test_a_key_whose_look_up_raises_leaves_no_empty_list() -> None:
    # The look-up of the second key raises (its __hash__, user code) after the list of
    # the first was made: the call raises, and that empty list leaves the map (it
    # stayed, keeping its key alive until the key was checked).
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        op = Op(60)
        with pytest.raises(TypeError, match="flaky hash"):
            purgatory.try_complete_else_watch(op, ["x", _FlakyHashKey()])
        assert not purgatory._watchers
        assert op._state == 0
        _assert_consistent(purgatory, timer)
        assert not purgatory.try_complete_else_watch(op, ["x"])
        _assert_consistent(purgatory, timer)
        purgatory.close()


async def test_a_watch_from_a_keys_eq_while_its_emptied_list_is_dropped_is_kept() -> None:
    # check_and_complete empties the list of `fresh`, then looks it up to drop it: the
    # look-up runs `base`'s __eq__ (same hash), which watches a new operation on
    # `fresh`. That operation must stay findable under `fresh`.
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        base = _CollidingKey("base")
        assert not purgatory.try_complete_else_watch(Op(60), [base])
        fresh = _CollidingKey("fresh")
        first = Op(60)
        assert not purgatory.try_complete_else_watch(first, [fresh])
        first.ready = True
        late = Op(60)
        parked: list[bool] = []

        def watch_late() -> None:
            parked.append(purgatory.try_complete_else_watch(late, [fresh]))

        def skip_the_first_look_up() -> None:
            base.hook = watch_late  # the look-up that drops the emptied list

        base.hook = skip_the_first_look_up
        assert purgatory.check_and_complete(fresh) == 1
        assert parked == [False]
        assert [op is late for op in purgatory._watchers[fresh].snapshot()] == [True]
        _assert_consistent(purgatory, timer)
        late.ready = True
        assert purgatory.check_and_complete(fresh) == 1
        _assert_consistent(purgatory, timer)
