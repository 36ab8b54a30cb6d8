"""Shutdown: how an engine closes, for good (compiled with the core).

A started timer's engine (``_engine.py``) ends here, one way or another:

* ``close_engine``: ``aclose()`` (through ``Timer.aclose``), ``loop.close()`` of the
  drop-in loop, or an internal error. After it nothing is pending and nobody waits:
  ``cancel_everything`` cancels what the wheel and the run queue hold, stops the
  periodic timers, settles the running async callbacks as cancelled-while-running,
  tells the guards of ``sleep()``/``timeout()`` blocks, and writes the last trace rows;
* ``break_engine``: the wheel itself raised (a bug; ``_pass.fire_due`` calls it): the
  same close, and every later call says why (``Engine.broken``, ``Engine.stranded``);
* ``abort_start``: ``Timer.__aenter__`` failed after its engine started (the recorder
  did not open), with nothing scheduled yet.

The engine (``_engine.py``) owns what these change (``closed``, ``broken``,
``stranded``, the counters): they change it through its methods
(``Engine.close_for_good``, ``Engine.mark_broken``,
``Engine.count_closed``), through a reference typed as ``Engine``
(compiled, native calls), as ``Periodics`` and the worker pool do. None is on a hot
path: each runs once per timer.

Re-entrancy (docs/design.md, "Re-entrancy"): every handle is settled before any user
code runs; the queued awaitables are closed (their ``finally`` blocks) last.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from ._dispatch import close_awaitable
from ._exceptions import TimerCancelled
from ._handle import _CANCELLED, TimerHandle, TracedHandle, _Failure, forget_snapshot, release
from ._loophandle import drop_all
from ._timeout import Guard
from ._wheel import deadline_of

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["abort_start", "break_engine", "cancel_everything", "close_engine"]

logger: Final = logging.getLogger("aiowheel")


def close_engine(engine: Engine) -> list[TimerHandle[Any]]:
    """Close for good: after it, nothing is pending and nobody waits. Returns the
    cancelled handles in deadline order."""
    # Closed before anything is taken: user code run during the close (a finalizer of
    # what it drops, a gc.callbacks hook while it allocates) that calls the loop's
    # call_at is refused, instead of filing into a wheel the close has already walked.
    engine.close_for_good()
    dropped: list[Any] | None = None
    if engine.loop_timers:
        dropped = drop_all(engine)  # the loop's handles: dropped, not cancelled
    engine._on_close()  # the owner stops accepting timers first
    engine.driver.stop()
    try:
        cancelled = cancel_everything(engine)
    finally:
        engine.pool.close()
        engine.waiters.wake_all()
        forget_snapshot()  # no context outlives a closed timer or loop through it
        # The dropped handles (their callbacks' and arguments' finalizers) go last,
        # once the close is complete (compiled, a local dies at its last use: release()
        # is that use).
        release(dropped)
    return cancelled


def cancel_everything(engine: Engine) -> list[TimerHandle[Any]]:
    handles: list[TimerHandle[Any]] = engine.wheel.clear()
    pool = engine.pool
    handles.extend(pool.take_queue())
    handles.sort(key=deadline_of)
    now = engine.clock()
    # The queued awaitables are closed (user code) and released at the very end.
    olds: list[Any] = []
    for handle in handles:
        olds.append(handle._become_cancelled())
        engine.waiters.settle(handle, _CANCELLED)
    # Every periodic timer stops: the filed and queued ones are among the handles;
    # one whose run is in progress gives back its reserved period, cancelled too.
    given_back = engine.periodics.stop_all()
    engine.count_closed(len(handles) + len(given_back))
    # A task in sleep() or a timeout() block whose timer this was learns it now
    # (its guard will never fire): it raises TimerClosed.
    for handle in handles:
        callback = handle._callback
        if isinstance(callback, Guard):
            callback.timer_closed()
    current = pool.current()
    for handle in pool.running:
        if handle is current:
            continue  # the callback that called aclose() runs to its end
        # It started, so it stays fired(); its wait() raises TimerCancelled.
        outcome = _Failure(TimerCancelled(f"{handle!r} was cancelled by aclose() while running"))
        handle._settle(outcome)
        engine.waiters.settle(handle, outcome)
    # The trace rows last: everything above is settled whatever a recorder raises
    # (even SystemExit, which the tracer lets through); then the last batch goes
    # to the recorder, which aclose() closes next.
    try:
        for handle in (*handles, *given_back):
            if isinstance(handle, TracedHandle):
                handle._trace_cancelled(now)
        if engine.tracing is not None:
            engine.tracing.close()
    finally:
        for old in olds:
            close_awaitable(old)
        olds.clear()
    return handles


def break_engine(engine: Engine, exc: BaseException) -> None:
    """The wheel raised: a bug, and its state cannot be trusted. Close rather than
    stay stuck, and make every later call say why."""
    logger.critical("aiowheel timer stopped by an internal error", exc_info=exc)
    if engine.closed:
        return
    engine.mark_broken(exc)
    # Whoever waits on a handle learns why, and does not wait for ever.
    engine.waiters.fail_all(engine._closed_error)
    try:
        # Every handle it held (the wheel, the buckets a pass had taken, the run
        # queue) is cancelled, and its wait() raises TimerClosed from `exc`.
        engine.stranded.update(close_engine(engine))
    except Exception:
        logger.exception("while closing the broken timer")


def abort_start(engine: Engine) -> None:
    """Take down what a start that failed had started (the engine, its driver, its
    pool, the supervisor waiting on ``closing``), with nothing scheduled yet: no trace
    rows, and the owner closed (``Engine._on_close``)."""
    engine.drop_trace()
    engine.close_for_good()
    engine._on_close()
    engine.driver.stop()
    engine.pool.close()
    engine.closing.set()
