"""``timer.timeout(delay)``: a cancel scope whose deadline lives on the wheel.

Native per backend (docs/usage.md, "Timeouts that can be pushed out"), with no anyio
layer in between (the backend's ``block_cancel``, aiowheel/_driver.py):

* on asyncio and uvloop it is ``asyncio.timeout``'s own mechanism: the deadline is an
  aiowheel timer whose callback cancels the task (``task.cancel()``); leaving the block
  takes that request back (``task.uncancel()``) and turns the ``CancelledError`` into
  ``TimeoutError`` only when no other cancellation arrived meanwhile, so a cancellation
  from outside wins over the deadline, and nested scopes unwind one at a time;
* on trio it is a ``trio.CancelScope`` that the timer's callback cancels.

Either way pushing the deadline out on every read (``t.reset``) is the wheel's O(1)
lazy re-arm instead of a heap operation.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol, SupportsFloat

import anyio

from ._awaits import quiet
from ._checks import not_copyable, seconds

if TYPE_CHECKING:
    from ._driver import Backend, BlockCancel
    from ._handle import TimerHandle

__all__ = ["Guard", "Schedules", "Timeout", "Wake", "sleep_until"]


class Schedules(Protocol):
    """What a guard and a sleep use of their ``Timer``: its public API, and the error a
    call on a closed timer raises. A protocol, not the class: this module sits below
    the timer in the import map (docs/design.md, "Module map"), and a call by name
    costs nothing here that matters (one per block, not per event)."""

    def time(self) -> float: ...

    def schedule_nowait(
        self, delay: SupportsFloat, callback: Callable[[], object], /
    ) -> TimerHandle[Any]: ...

    async def schedule_at(
        self, deadline: SupportsFloat, callback: Callable[[], object], /
    ) -> TimerHandle[Any]: ...

    def _closed_error(self) -> BaseException: ...

    def _require_owner_loop(self) -> None: ...


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
        self.timeout._expire(_EXPIRED)

    def timer_closed(self) -> None:
        self.timeout._expire(_CLOSED)


# A Timeout's life (asyncio.timeouts' states): created, entered, then expired (its
# deadline came) or closed (its timer closed under it) while inside, and exited. Each
# transition asserts where it comes from.
_CREATED: Final = 0
_ENTERED: Final = 1
_EXPIRED: Final = 2
_CLOSED: Final = 3
_EXITED: Final = 4

_ONE_BLOCK: Final = "a timeout guards one block, once; call timer.timeout() again"


class Timeout:
    """The context manager returned by ``Timer.timeout``; not reusable.

    How the block is cancelled is the backend's (``Backend.block_cancel``,
    aiowheel/_driver.py: the task's cancel on asyncio and uvloop, a cancel scope on
    trio); this class keeps the deadline on the wheel and the state."""

    __slots__ = (
        "_backend",
        "_cancel",
        "_deadline",
        "_delay",
        "_ended",
        "_handle",
        "_state",
        "_timer",
    )

    def __init__(self, timer: Schedules, delay: float, backend: Backend) -> None:
        self._timer = timer
        self._delay = delay
        self._backend = backend
        self._state = _CREATED
        self._ended = _CREATED  # what it was when the block ended: expired()
        # The deadline's handle while the block runs; dropped as the block ends (the
        # handle's callback, _Expire, holds this Timeout: kept, the three would be a
        # reference cycle that only the garbage collector frees, a collection every
        # few hundred blocks), its deadline kept in _deadline.
        self._handle: TimerHandle[Any] | None = None
        self._deadline = 0.0
        self._cancel: BlockCancel | None = None

    # A copy would share the deadline's timer handle: leaving the copy's block would
    # cancel the original's deadline. A Timeout is one block's guard, so it refuses.
    def __copy__(self) -> NoReturn:
        not_copyable(self, _ONE_BLOCK)

    def __deepcopy__(self, memo: object) -> NoReturn:
        not_copyable(self, _ONE_BLOCK)

    def __reduce__(self) -> NoReturn:
        not_copyable(self, _ONE_BLOCK)

    def __enter__(self) -> Timeout:
        if self._state != _CREATED:
            raise RuntimeError("a Timeout can be entered only once")
        cancel = self._backend.block_cancel()  # outside a task on asyncio: RuntimeError
        try:
            self._handle = self._timer.schedule_nowait(self._delay, _Expire(self))
        except BaseException as exc:
            cancel.leave(False, type(exc), exc, exc.__traceback__)
            raise
        self._cancel = cancel
        self._state = _ENTERED
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        handle = self._handle
        cancel = self._cancel
        assert handle is not None, "a Timeout is left only after it was entered"
        assert cancel is not None
        handle.cancel()
        self._deadline = handle.deadline
        self._handle = None
        state = self._state
        assert state in (_ENTERED, _EXPIRED, _CLOSED), state
        self._ended = state
        self._state = _EXITED
        returned = cancel.leave(state != _ENTERED, exc_type, exc, tb)
        if returned is not None:
            return returned
        if state == _EXPIRED:
            raise TimeoutError(f"timed out after the deadline {handle.deadline:.6f}") from exc
        # The guard is gone with its timer: the block ends rather than run unguarded
        # (aclose(drain=True) would have let the deadline come).
        raise self._timer._closed_error() from exc

    def _expire(self, why: int) -> None:
        # The deadline came (_EXPIRED), or the timer closed with the guard pending
        # (_CLOSED): cancel the block, once.
        if self._state != _ENTERED:
            return
        assert why in (_EXPIRED, _CLOSED), why
        self._state = why
        cancel = self._cancel
        assert cancel is not None
        cancel.cancel()

    @property
    def deadline(self) -> float:
        """When the block is cancelled, on the timer's clock."""
        handle = self._handle
        if handle is not None:
            return handle.deadline
        if self._state == _CREATED:
            return self._timer.time() + self._delay
        return self._deadline

    def expired(self) -> bool:
        """True once the deadline passed and the block was (being) cancelled."""
        return self._state == _EXPIRED or self._ended == _EXPIRED

    def reset(self, delay: SupportsFloat) -> None:
        """Move the deadline to ``timer.time() + delay``. No effect once the deadline
        has passed, nor once the block has ended (a bad ``delay`` still raises)."""
        if self._state == _ENTERED:
            handle = self._handle
            assert handle is not None
            handle.reset(delay)
        else:
            # Not entered, or ended: another thread or loop is refused all the same.
            self._timer._require_owner_loop()
            seconds_ = seconds(delay)
            if self._state == _CREATED:
                self._delay = seconds_


def _use_with(*args: object) -> NoReturn:
    # Both sides of the async protocol (``async with`` looks both up before it calls
    # either): called unbound, compiled, so ``*args`` takes the Timeout or nothing.
    raise TypeError(
        "timer.timeout() is a plain context manager: write `with timer.timeout(...):`, "
        "not `async with` (unlike asyncio.timeout, entering it needs no await)"
    )


# `async with timer.timeout(1)`, the habit from asyncio.timeout, got Python's generic
# "does not support the asynchronous context manager protocol". Set after the class,
# not defined in it: type checkers, which read the class body, still report that line
# as an error, and at run time it raises the hint above, the same on every backend
# (and on the compiled core, whose class takes attributes set on it, not conditional
# definitions in its body).
setattr(Timeout, "__aenter__", _use_with)  # noqa: B010 - hidden from type checkers
setattr(Timeout, "__aexit__", _use_with)  # noqa: B010


async def sleep_until(timer: Schedules, deadline: SupportsFloat) -> None:
    """``Timer.sleep_until``: a timer whose callback wakes this task."""
    wake = Wake()
    handle = await timer.schedule_at(deadline, wake)
    try:
        await quiet(wake.event.wait())
    finally:
        handle.cancel()
    if wake.closed:
        # aclose() cancelled it: the sleep would never end (TimerClosed, as for
        # every call on a closed timer).
        raise timer._closed_error()
