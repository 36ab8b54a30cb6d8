"""Argument checks shared by every entry point.

One rule for times (docs/usage.md, "Times and bad input"), applied by ``seconds`` at
every call that takes a delay, a deadline or an interval, so that ``schedule``,
``reset``, ``sleep``, ``timeout`` and ``every`` cannot disagree about what a time is:

* a real number: ``int``, ``float``, any ``numbers.Real`` (``fractions.Fraction``,
  NumPy scalars) or a ``decimal.Decimal``, converted with ``float()``;
* ``bool`` is refused (``True`` is not "one second"), and so is ``timedelta`` (the
  message says to pass ``td.total_seconds()``): ``TypeError``, like any other type;
* NaN and infinities, after conversion, are a ``ValueError``.

The hot paths (``schedule_nowait``, ``reset``) test ``type(x) is float`` inline and
call ``aiowheel._handle.to_seconds`` for anything else: it converts an int, and any
type ``seconds`` has already accepted once, with ``float()`` alone, and hands
everything else to ``seconds``, so the rule costs a real number almost nothing.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

import numbers
import operator
from datetime import timedelta
from decimal import Decimal
from typing import NoReturn, SupportsIndex, cast

from ._exceptions import TimerClosed, TimerFull

#: How much of a bad value an error message shows (``shown``).
_SHOWN = 60


def shown(value: object) -> str:
    """``repr(value)`` for an error message, cut to its first and last characters
    when long (``10**400`` made a 447-character message): ``'1000…0000' (401
    characters)``. A repr that raises shows the type instead."""
    try:
        text = repr(value)
    except Exception:
        return f"<a {type(value).__name__} whose repr raised>"
    if len(text) <= _SHOWN:
        return text
    half = _SHOWN // 2 - 2
    return f"{text[:half]}\u2026{text[-half:]} ({len(text):,} characters)"


__all__ = [
    "check_callable",
    "check_int",
    "check_label",
    "closed",
    "full",
    "not_copyable",
    "seconds",
    "shown",
    "too_far",
]


def seconds(value: object, what: str = "delay") -> float:
    """``value`` as a finite float number of seconds, or the documented exception."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number of seconds, not a bool ({shown(value)})")
    if isinstance(value, numbers.Real | Decimal):
        try:
            result = float(value)
        except (ValueError, OverflowError, ArithmeticError):
            # Decimal('sNaN') refuses float(); an int past 1e308 overflows it.
            raise ValueError(
                f"{what} must be a finite number of seconds, got {shown(value)}"
            ) from None
        if result - result != 0.0:  # NaN or an infinity
            raise ValueError(f"{what} must be finite, got {shown(value)}")
        return result
    if isinstance(value, timedelta):
        raise TypeError(
            f"{what} must be a number of seconds, got a timedelta ({shown(value)}): "
            "pass td.total_seconds()"
        )
    raise TypeError(f"{what} must be a number of seconds, got {shown(value)}")


def too_far(what: str, value: float) -> NoReturn:
    """A finite delay whose deadline does not fit in a float."""
    raise ValueError(f"{what} {shown(value)} puts the deadline past the largest float")


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an ``int`` (anything with ``__index__`` but a bool) in bounds."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {shown(value)}")
    value = operator.index(cast("SupportsIndex", value))
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {shown(value)}")
    return value


def check_label(label: object) -> None:
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label must be a str or None, got {shown(label)}")


def check_callable(callback: object) -> None:
    if not callable(callback):
        raise TypeError(f"callback must be callable, got {shown(callback)}")


def not_copyable(obj: object, why: str) -> NoReturn:
    """What ``copy.copy``, ``copy.deepcopy`` and ``pickle`` of a timer or a handle raise."""
    raise TypeError(f"{type(obj).__name__} objects cannot be copied or pickled: {why}")


def full(pending: int, limit: int) -> TimerFull:
    """The ``TimerFull`` every admission check raises."""
    return TimerFull(f"{pending} timers pending (max_pending={limit})")


def closed(state: str, broken: BaseException | None) -> TimerClosed:
    """The ``TimerClosed`` every call refused by a timer that does not accept timers
    raises, saying why: its state (``Timer._state``'s value: ``"new"``, ``"draining"``,
    ``"closed"``) and, after an internal error, what broke it (also the cause)."""
    if state == "new":
        reason = "the timer is not started: use `async with Timer() as timer:`"
    elif state == "draining":
        reason = "the timer is draining (aclose(drain=True)): no new periodic timers"
    elif broken is not None:
        reason = f"the timer stopped after an internal error: {broken!r}"
    else:
        reason = "the timer is closed"
    error = TimerClosed(reason)
    error.__cause__ = broken
    return error
