"""``timer.timeout(delay)``: a cancel scope whose deadline lives on the wheel.

The scope is anyio's (``CancelScope``), so one implementation cancels the block on
asyncio, uvloop and trio; the deadline is an aiowheel timer, so pushing it out on
every read (``t.reset``) is the wheel's O(1) re-arm instead of a heap operation.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from ._checks import seconds

if TYPE_CHECKING:
    from ._handle import TimerHandle
    from ._timer import Timer

__all__ = ["Guard", "Timeout", "Wake"]


class Guard:
    """The callback of a timer that a task waits on (``sleep``, ``timeout``).

    When the timer closes with it pending (``aclose()``), the timer calls
    ``timer_closed()`` instead: the task must not wait for ever for a callback that
    will never run.
    """

    __slots__ = ()

    def __call__(self) -> None:
        raise NotImplementedError

    def timer_closed(self) -> None:
        raise NotImplementedError


class Wake(Guard):
    """``Timer.sleep_until``'s callback: sets the event the sleeper waits on."""

    __slots__ = ("closed", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.closed = False

    def __call__(self) -> None:
        self.event.set()

    def timer_closed(self) -> None:
        self.closed = True
        self.event.set()


class _Expire(Guard):
    """A ``Timeout``'s callback (a separate object: ``Timeout`` is not callable)."""

    __slots__ = ("timeout",)

    def __init__(self, timeout: Timeout) -> None:
        self.timeout = timeout

    def __call__(self) -> None:
        self.timeout._expire()

    def timer_closed(self) -> None:
        self.timeout._timer_closed()


class Timeout:
    """The context manager returned by ``Timer.timeout``; not reusable."""

    __slots__ = ("_closed", "_delay", "_expired", "_handle", "_scope", "_timer")

    def __init__(self, timer: Timer, delay: float) -> None:
        self._timer = timer
        self._delay = delay
        self._scope: anyio.CancelScope | None = None
        self._handle: TimerHandle[Any] | None = None
        self._expired = False
        self._closed = False  # the timer closed while the guard was pending

    def __enter__(self) -> Timeout:
        if self._scope is not None:
            raise RuntimeError("a Timeout can be entered only once")
        scope = self._scope = anyio.CancelScope()
        scope.__enter__()
        try:
            self._handle = self._timer.schedule_nowait(self._delay, _Expire(self))
        except BaseException as exc:
            scope.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._scope is not None
        assert self._handle is not None
        self._handle.cancel()
        suppressed = self._scope.__exit__(exc_type, exc, tb)
        if self._expired and self._scope.cancelled_caught:
            raise TimeoutError(f"timed out after the deadline {self.deadline:.6f}") from exc
        if self._closed and self._scope.cancelled_caught:
            # The guard is gone with its timer: the block ends rather than run
            # unguarded (aclose(drain=True) would have let the deadline come).
            raise self._timer._closed_error() from exc
        return bool(suppressed)

    def _expire(self) -> None:
        self._expired = True
        assert self._scope is not None
        self._scope.cancel()

    def _timer_closed(self) -> None:
        self._closed = True
        assert self._scope is not None
        self._scope.cancel()

    @property
    def deadline(self) -> float:
        """When the block is cancelled, on the timer's clock."""
        if self._handle is None:
            return self._timer.time() + self._delay
        return self._handle.deadline

    def expired(self) -> bool:
        """True once the deadline passed and the block was (being) cancelled."""
        return self._expired

    def reset(self, delay: float) -> None:
        """Move the deadline to ``timer.time() + delay`` (no effect once expired)."""
        delay = seconds(delay)
        if self._handle is None:
            self._delay = delay
        elif not self._expired:
            self._handle.reset(delay)
