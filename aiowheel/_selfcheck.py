"""The self-check: assert a timer's accounting against what it holds. For tests.

``check_engine`` asserts the counters (docs/design.md, "Accounting") against the wheel,
the run queue and the periodic timers (``Periodics.check``), then the wheel's own
invariants (``Wheel._check``); ``check_timer`` adds what only the ``Timer`` knows (open
exactly while its engine is, its wheel holding only its own handles).
``TimerLifecycle._check()`` calls it after every step of the fault-model tests
(tests/test_fault_model.py, tests/test_fault_finalizers.py), as they call
``Wheel._check()``.

Call them between passes, not from inside a callback: they cost O(pending).
Interpreted (not in ``_compiled.MODULES``): nothing here is on a path of the timer's;
it reads the compiled classes' attributes as any Python code does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ._handle import TimerHandle

if TYPE_CHECKING:
    from ._engine import Engine
    from ._handle import HandleOwner

__all__ = ["check_engine", "check_timer"]


def check_engine(engine: Engine) -> None:
    """Assert the counters against the wheel, the run queue and the periodic timers,
    then the wheel's own invariants."""
    pending = engine.pending
    assert engine.scheduled == engine.fired + engine.cancelled + pending, (
        f"scheduled {engine.scheduled} != fired {engine.fired} + cancelled "
        f"{engine.cancelled} + pending {pending}"
    )
    assert 0 <= engine.failed <= engine.fired
    pool = engine.pool
    assert pool.busy == sum(pool.running.values()) >= 0
    assert pool.busy <= pool.limit
    if engine.closed:
        assert pending == 0, f"closed with {pending} pending"
        assert not engine.periodics.active, "closed with active periodic timers"
        return
    engine.wheel._check()
    filed = 0
    for entry in engine.wheel:
        if not isinstance(entry, TimerHandle):
            filed += 1  # a drop-in loop's handle
            continue
        entry._check_held(None)
        filed += 1
    queued = 0
    for entry in pool.queue:
        handle = cast("TimerHandle[Any]", entry)
        handle._check_held(pool.queue)
        queued += 1
    reserved = engine.periodics.check()
    assert pending == filed + queued + reserved, (
        f"pending {pending} != filed {filed} + queued {queued} + runs {reserved}"
    )
    assert pending <= engine.limit, f"pending {pending} > max_pending {engine.limit}"


def check_timer(timer: HandleOwner, engine: Engine | None, *, open_: bool) -> None:
    """``check_engine`` on the timer's ``engine`` (None if it was never started), and
    that the timer is open (``open_``) exactly while its engine is, its wheel holding
    only its own handles. (``TimerLifecycle._check`` passes its own state: this module sits
    below the timer in the import map.)"""
    if engine is None:
        return
    check_engine(engine)
    assert open_ != engine.closed
    if open_:
        for entry in engine.wheel:
            if isinstance(entry, TimerHandle):
                assert entry._timer is timer, entry
            else:
                # A drop-in loop's call_at handle (LoopTimerHandle): filed only on its
                # loop's own timer (loop.timer), and it names that timer's engine.
                assert engine.loop_timers, entry
                assert cast("Any", entry)._engine is engine, entry
