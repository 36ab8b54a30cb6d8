"""The pass: what the driver's wake-up runs, the only place callbacks are called.

The engine (``Engine``, ``_engine.py``) holds a started timer's parts and counters and
the rules that change them; its driver's callback is this module's ``fire_due``,
handed to it by its maker (``TimerLifecycle._new_engine``). That advances the wheel
to now and hands what expired to ``run_due``, a short loop over the buckets;
``run_one`` runs one callback (``run_due`` keeps an inline copy, tagged *run one*,
for a plain callback on an untraced timer), next to ``callback_failed``, where its
exception rules live (``WorkerPool._run`` applies the same rules to jobs). A drop-in
loop's handle is counted and run by ``_loophandle.run_in_pass`` (``Handle._run``'s
rules), the room that knows that handle.

Functions of the engine, not a class: the pass holds no state of its own but the
locals of one run (the counts it adds up and writes once). Compiled, a call between
them is a direct C call and ``engine``'s attributes are read as a struct's fields.
Owned here (tests/test_module_map.py, ``ENGINE_WRITERS``): ``passing`` and ``wakeups``;
the counters it changes, through copies tagged with the ``Engine`` method they copy.

Re-entrancy (docs/design.md, "Re-entrancy"): no user code, finalizers included, runs
between deciding a linked-list change and completing it; the pass releases each
handle and result between two handles, never between a pop and its count.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Final

from ._handle import TimerHandle, TracedHandle, _Failure, forget_snapshot, without_frame
from ._loophandle import run_in_pass
from ._shutdown import break_engine
from ._tracing import Tracer
from ._wheel import Bucket

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["fire_due", "run_one"]

logger: Final = logging.getLogger("aiowheel")

_INF: Final = math.inf
_EXIT: Final = (SystemExit, KeyboardInterrupt)


def fire_due(engine: Engine) -> None:
    """Advance the wheel to now and run what expired. Called by the driver.

    Raises nothing but ``SystemExit``/``KeyboardInterrupt``, and whatever it raises
    the driver is re-armed on the way out."""
    if engine.closed:
        return
    forget_snapshot()  # a finished request's context is not kept past a pass
    engine.wake_at = -_INF
    engine.passing = True
    engine.wakeups += 1
    try:
        now = engine.clock()
        buckets = engine.wheel.advance(now)
        if engine.loop_timers and buckets:
            buckets = engine.wheel.in_order(buckets)  # the loop's rule: when order
    except BaseException as exc:
        engine.wake_at = _INF
        engine.passing = False
        if isinstance(exc, _EXIT):
            # An interrupt (on the pure core it may arrive at any bytecode of
            # advance) is not a fault of the wheel: put it back together, re-arm
            # and let the interrupt go; the timer goes on if the loop does.
            wheel_interrupted(engine)
            raise
        break_engine(engine, exc)
        return
    try:
        if buckets:
            run_due(engine, buckets, now)
    finally:
        engine.wake_at = _INF
        engine.passing = False
        if not engine.closed:
            try:
                engine.wheel.release()  # what the pass did not reach: filed again
                engine.sync_wakeup()
            except _EXIT:
                wheel_interrupted(engine)  # as above
                raise
            except BaseException as exc:
                break_engine(engine, exc)
        engine.pending_fell()


def wheel_interrupted(engine: Engine) -> None:
    """``SystemExit``/``KeyboardInterrupt`` stopped the wheel half-way through a
    pass (``Wheel.recover``'s invariant lets it find every pending entry): make it
    whole, file every entry again, re-arm. Only if that fails too is the timer
    broken (``break_``)."""
    try:
        engine.wheel.recover()
        engine.sync_wakeup()
    except BaseException as exc:
        break_engine(engine, exc)


def run_due(engine: Engine, buckets: list[Bucket], now: float) -> None:
    """Run every handle of the expired ``buckets``, one at a time off the front: a
    callback may cancel or re-arm later handles of a bucket, which unlinks them."""
    # The common counts are kept in locals and written once, at the end (run_one
    # writes only the rare ones: a failure, a callback queued for a worker).
    fired = 0
    lateness_max = engine.lateness_max
    index = 0
    # A handle without a trace row to write runs in the inline copy of run_one
    # below (a call per callback is a tenth of its cost): every handle of an
    # untraced timer (for the whole pass: tracing only ever stops), and on a
    # sampled one the handles the sample left plain.
    traced = engine.tracing is not None
    # Declared here so that `finally` can drop them: a stored exception's traceback
    # keeps this frame alive, and the frame must not keep the last handle alive.
    handle: TimerHandle[Any] | None = None
    result: Any = None
    context: Any = None  # the copy a callback runs in (run_one)
    try:
        for index, bucket in enumerate(buckets):  # noqa: B007 - used after the loop
            while True:
                # Release the previous handle and result here, between two handles:
                # dropping the last reference may run a finalizer (user code), which
                # must not run between the pop below and the count (re-entrancy).
                handle = entry = result = context = None
                entry = bucket.pop_first()
                if entry is None:
                    break
                if not isinstance(entry, TimerHandle):
                    # A drop-in loop's call_at handle: its lateness counts as a
                    # timer's (stats().lateness_max).
                    lateness = run_in_pass(engine, entry, now)
                    if lateness > lateness_max:
                        lateness_max = lateness
                    continue
                handle = entry  # the timer files only these (and loop handles, above)
                engine.pending -= 1  # inline copy of Engine.count_ran
                fired += 1  # (written once, at the end)
                lateness = now - handle._deadline  # inline copy of note_lateness
                if lateness > lateness_max:
                    lateness_max = lateness
                if traced and isinstance(handle, TracedHandle):
                    run_one(engine, handle, now)
                    continue
                # Inline copy of run_one (the *run one* rule), but the trace row.
                try:
                    context = handle._run_context()  # never run in a snapshot
                    if handle._args:
                        result = context.run(handle._callback, *handle._args)
                    else:
                        result = context.run(handle._callback)
                except BaseException as exc:
                    result = callback_failed(engine, handle, exc)
                else:
                    if result is not None and hasattr(type(result), "__await__"):
                        engine.to_worker(handle, result, context)  # stepped there
                        continue
                    if handle._bucket is None:
                        handle._result = result  # inline copy of TimerHandle._settle
                if engine.waiters.handles:
                    engine.waiters.settle(handle, result)
    except BaseException as exc:
        pass_stopped(engine, buckets[index:], exc)
    finally:
        engine.fired += fired  # inline copy of Engine.count_ran
        engine.lateness_max = lateness_max  # inline copy of Engine.note_lateness
        handle = entry = result = context = None


def run_one(engine: Engine, handle: TimerHandle[Any], now: float) -> None:
    """*Run one* expired handle (popped, counted fired, no longer pending): the
    only place where the pass calls a callback (``run_due`` keeps an inline copy,
    tagged, for an untraced timer). A callback that returns an awaitable is queued
    for a worker, still pending; its exceptions go to ``callback_failed``."""
    tracer: Tracer | None = None
    if engine.tracing is not None and isinstance(handle, TracedHandle):
        tracer = handle._tracer
        if tracer is not None:
            # The trace row describes this firing: read it before the callback
            # runs, since a callback may re-arm its own handle.
            row = handle._trace_row()
    args = handle._args
    outcome: Any = None
    result: Any = None
    context: Any = None
    try:
        try:
            # In a copy of the context captured at schedule time (loop.call_later's
            # rule): that one may be a snapshot shared with other handles, never
            # run in (aiowheel/_handle.py, snapshot_context), so each run starts
            # from it and what the callback sets stays its own. A periodic
            # handle's context is its own: run in directly, so a run sees what the
            # last one set. Without arguments, no tuple is built for the call.
            context = handle._run_context()
            result = context.run(handle._callback, *args) if args else context.run(handle._callback)
        except BaseException as exc:
            outcome = callback_failed(engine, handle, exc)
        else:
            if result is not None and hasattr(type(result), "__await__"):
                # Its worker steps it in the copy its call ran in; the handle
                # keeps the context it captured (a re-arm starts from that).
                engine.to_worker(handle, result, context)
                return
            outcome = result
            handle._settle_unless_rearmed(result)
        if engine.waiters.handles:
            engine.waiters.settle(handle, outcome)
        if tracer is not None:
            tracer.fired(row[0], row[1], row[2], row[3], row[4], now)
    finally:
        # A stored exception's traceback keeps this frame alive (the callback's
        # frame links back to it), and the frame must not keep the handle, its
        # arguments or its outcome alive with it (pure Python; compiled functions
        # have no frame).
        tracer = outcome = result = context = None
        del handle, args


def callback_failed(engine: Engine, handle: TimerHandle[Any], exc: BaseException) -> _Failure:
    """The pass's exception rules, as in ``WorkerPool._run``: a callback's
    exception, ``CancelledError`` and ``GeneratorExit`` included, is its failure
    alone (reported to ``on_error``; returned, the handle's outcome);
    ``SystemExit`` and ``KeyboardInterrupt`` settle the handle and propagate."""
    engine.count_failed()
    outcome = _Failure(without_frame(exc))
    handle._settle_unless_rearmed(outcome)  # unless it re-armed itself
    if isinstance(exc, _EXIT):
        # Settle this one, then let it stop the loop (run_due re-files the rest).
        engine.waiters.settle(handle, outcome)
        raise exc
    try:
        engine.report(handle, exc)  # on_error may re-arm the handle
    except _EXIT:
        engine.waiters.settle(handle, outcome)  # on_error's SystemExit...
        raise
    return outcome


def pass_stopped(engine: Engine, rest: list[Bucket], exc: BaseException) -> None:
    """``exc`` stopped the pass (SystemExit/KeyboardInterrupt from a callback or
    on_error, or a fault): put back what it did not get to, so nothing pending is
    lost, and let an exit go on; anything else is logged, and the rest fires on
    the next pass. Called in the ``except`` block (the log has the traceback)."""
    refile(engine, rest)
    if isinstance(exc, _EXIT):
        raise exc
    logger.exception("aiowheel: the pass stopped early; the rest fires next pass")


def refile(engine: Engine, buckets: list[Bucket]) -> None:
    # One at a time: each entry stays linked (pending, findable by aclose) until
    # it is filed again.
    wheel = engine.wheel
    for bucket in buckets:
        entry = bucket.pop_first()
        while entry is not None:
            wheel.insert(entry, entry._deadline)
            entry = bucket.pop_first()
