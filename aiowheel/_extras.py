"""What ``Timer`` offers around scheduling: calls from other threads, sleeping, and
introspection (``stats``, ``next_deadline``).

``Timer`` (``_timer.py``) keeps these public methods (their signatures, overloads and
docstrings are the API) and hands their bodies to the functions here, so that the
class holds validation, admission, the lifecycle, loop affinity and the hot paths
(docs/design.md, "Module map"). Nothing here is hot: interpreted on both cores.
"""

from __future__ import annotations

import concurrent.futures
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, SupportsFloat, TypeVar

from ._checks import check_callable, seconds
from ._handle import TimerHandle
from ._timeout import Wake

if TYPE_CHECKING:
    from ._timer import Timer, TimerStats

__all__ = ["call_threadsafe", "next_deadline", "schedule_threadsafe", "sleep_until", "stats"]

T = TypeVar("T")
_EXIT: Final = (SystemExit, KeyboardInterrupt)


def call_threadsafe(
    timer: Timer, fn: Callable[..., T], args: tuple[Any, ...]
) -> concurrent.futures.Future[T]:
    """``Timer.call_threadsafe``: ``fn(*args)`` on the timer's loop, from any thread."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    live = timer._live
    if live is None:
        future.set_exception(timer._closed_error())
        return future

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args)
        except BaseException as exc:
            future.set_exception(exc)
            if isinstance(exc, _EXIT):
                raise
        else:
            future.set_result(result)

    try:
        live.backend.call_soon_threadsafe(run)
    except Exception as exc:  # the loop is closed, or trio's run has finished
        error = timer._closed_error()
        error.__cause__ = exc
        future.set_exception(error)
    return future


def schedule_threadsafe(
    timer: Timer,
    delay: SupportsFloat,
    callback: Callable[..., Any],
    args: tuple[Any, ...],
    label: str | None,
) -> concurrent.futures.Future[TimerHandle[Any]]:
    """``Timer.schedule_threadsafe``: the arguments are checked in the calling thread,
    the timer is scheduled on the loop (the delay counts from then)."""
    seconds(delay)
    check_callable(callback)
    return call_threadsafe(timer, _schedule_labelled, (timer, delay, callback, label, args))


def _schedule_labelled(
    timer: Timer,
    delay: SupportsFloat,
    callback: Callable[..., Any],
    label: str | None,
    args: tuple[Any, ...],
) -> TimerHandle[Any]:
    return timer.schedule_nowait(delay, callback, *args, label=label)


async def sleep_until(timer: Timer, deadline: SupportsFloat) -> None:
    """``Timer.sleep_until``: a timer whose callback wakes this task."""
    wake = Wake()
    handle = await timer.schedule_at(deadline, wake)
    try:
        await wake.event.wait()
    finally:
        handle.cancel()
    if wake.closed:
        # aclose() cancelled it: the sleep would never end (TimerClosed, as for
        # every call on a closed timer).
        raise timer._closed_error()


def stats(timer: Timer) -> TimerStats:
    """``Timer.stats``: a snapshot of the engine's counters."""
    from ._timer import TimerStats  # (_timer imports this module)

    live = timer._live
    engine = timer._engine
    if engine is None:
        return TimerStats(0, 0, 0, 0, 0, 0, 0.0)
    return TimerStats(
        pending=engine.pending,
        scheduled=engine.scheduled,
        fired=engine.fired,
        cancelled=engine.cancelled,
        failed=engine.failed,
        levels=live.wheel.levels if live is not None else timer._levels,
        lateness_max=engine.lateness_max,
        # The pool outlives aclose() while its last jobs finish (the one that called
        # aclose() runs to its end): count what really runs.
        running=engine.pool.busy,
        workers=engine.pool.workers,
        wakeups=engine.wakeups,
    )


def next_deadline(timer: Timer) -> float | None:
    """``Timer.next_deadline``: the wheel's earliest occupied bucket (now if due)."""
    live = timer._live
    if live is None:
        return None
    when = live.wheel.next_expiry()
    if when == -math.inf:
        return live.clock()
    return when
