"""Calls from other threads: ``Timer.call_threadsafe`` and ``schedule_threadsafe``.

A timer belongs to its event loop's thread (the owner check, ``_affinity.py``); any
other thread reaches it through the loop's thread-safe call (the backend's,
``_driver.py``), and gets a ``concurrent.futures.Future`` of the result. ``Timer``
(``_timer.py``) keeps the public methods (their signatures, overloads and docstrings
are the API) and hands their bodies to the functions here, with what they need of
it: the backend while the timer is open (else None), the error a closed timer
raises, and its ``schedule_nowait``. Nothing here is hot: interpreted on both cores.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, SupportsFloat, TypeVar

from ._checks import check_callable, seconds
from ._handle import TimerHandle

if TYPE_CHECKING:
    from ._driver import Backend

__all__ = ["call_threadsafe", "schedule_threadsafe"]

T = TypeVar("T")
_EXIT: Final = (SystemExit, KeyboardInterrupt)


def call_threadsafe(
    backend: Backend | None,
    closed_error: Callable[[], BaseException],
    fn: Callable[..., T],
    args: tuple[Any, ...],
) -> concurrent.futures.Future[T]:
    """``Timer.call_threadsafe``: ``fn(*args)`` on the timer's loop, from any thread
    (``backend``: the open timer's; None once it is closed)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    if backend is None:
        future.set_exception(closed_error())
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
        backend.call_soon_threadsafe(run)
    except Exception as exc:  # the loop is closed, or trio's run has finished
        error = closed_error()
        error.__cause__ = exc
        future.set_exception(error)
    return future


def schedule_threadsafe(
    backend: Backend | None,
    closed_error: Callable[[], BaseException],
    schedule_nowait: Callable[..., TimerHandle[Any]],
    delay: SupportsFloat,
    callback: Callable[..., Any],
    args: tuple[Any, ...],
    label: str | None,
) -> concurrent.futures.Future[TimerHandle[Any]]:
    """``Timer.schedule_threadsafe``: the arguments are checked in the calling thread,
    the timer is scheduled on the loop (the delay counts from then)."""
    seconds(delay)
    check_callable(callback)
    return call_threadsafe(
        backend, closed_error, _schedule_labelled, (schedule_nowait, delay, callback, label, args)
    )


def _schedule_labelled(
    schedule_nowait: Callable[..., TimerHandle[Any]],
    delay: SupportsFloat,
    callback: Callable[..., Any],
    label: str | None,
    args: tuple[Any, ...],
) -> TimerHandle[Any]:
    return schedule_nowait(delay, callback, *args, label=label)
