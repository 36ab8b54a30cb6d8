"""Issue 19, "one fast conversion for every real number": ``to_seconds`` is the rule.

``aiowheel._handle.to_seconds`` converts a time value with ``float()`` alone once its
type has been accepted by ``aiowheel._checks.seconds`` (the one rule for times). These
tests pin down that the shortcut never changes what the rule says: the same float for
every accepted value, the same exception for every refused one, on the first value of a
type and on every later one; and that a re-arm by any real number is the lazy re-arm
(the deadline moves, the handle stays in its bucket), on every backend.
"""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy
import pytest

from aiowheel import Timer
from aiowheel._checks import seconds
from aiowheel._handle import to_seconds


class FloatSub(float):
    pass


class IntSub(int):
    pass


ACCEPTED: list[Any] = [
    2.5,
    3,
    -1,
    0,
    10**306,
    Fraction(5, 2),
    Decimal("2.5"),
    Decimal("-1e308"),
    numpy.float64(2.5),
    numpy.float32(2.5),
    numpy.int64(3),
    FloatSub(2.5),
    IntSub(3),
]
REFUSED: list[Any] = [
    True,
    False,
    numpy.bool_(True),
    datetime.timedelta(seconds=1),
    "1",
    None,
    numpy.array([0.01]),
    1j,
    math.nan,
    -math.inf,
    numpy.float64("nan"),
    FloatSub("inf"),
    Decimal("NaN"),
    Decimal("sNaN"),
    Decimal("1e400"),
    10**400,
    -(10**400),
    Fraction(10**400),
]


def _outcome(convert: Any, value: Any) -> tuple[str, object]:
    try:
        return ("ok", convert(value, "delay"))
    except Exception as exc:  # the exception is the outcome compared
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("value", ACCEPTED + REFUSED, ids=repr)
def test_to_seconds_says_what_the_rule_says_first_time_and_every_time(value: Any) -> None:
    expected = _outcome(seconds, value)
    # Twice: the second call of an accepted type takes the float() shortcut.
    assert _outcome(to_seconds, value) == expected
    assert _outcome(to_seconds, value) == expected


def test_a_refused_value_of_an_accepted_type_is_still_refused() -> None:
    # The type is known (float64, Decimal, int) after a good value; a bad one of the
    # same type must still raise the rule's ValueError.
    for good, bad in [
        (numpy.float64(1.0), numpy.float64("inf")),
        (Decimal("1"), Decimal("sNaN")),
        (Decimal("1"), Decimal("1e400")),
        (7, 10**400),
        (FloatSub(1.0), FloatSub("nan")),
    ]:
        assert to_seconds(good) == float(good)
        with pytest.raises(ValueError, match="delay must be"):
            to_seconds(bad)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "delay",
    [30, 30.0, Fraction(30), Decimal(30), numpy.float64(30.0), numpy.int64(30), FloatSub(30.0)],
    ids=repr,
)
async def test_a_later_reset_by_any_real_number_is_the_lazy_re_arm(delay: Any) -> None:
    async with Timer(tick=0.001) as timer:
        handle = timer.schedule_nowait(1.0, lambda: None)
        bucket = handle._bucket
        before = timer.time()
        handle.reset(delay)
        after = timer.time()
        # Lazy: the deadline moved, the handle did not (its bucket re-files it later).
        assert handle._bucket is bucket
        assert before + 30.0 <= handle.deadline <= after + 30.0
        assert handle.pending()
        assert len(timer) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("delay", [True, "30", 10**400, math.nan, Decimal("sNaN")], ids=repr)
async def test_a_refused_reset_of_a_pending_handle_changes_nothing(delay: Any) -> None:
    async with Timer(tick=0.001) as timer:
        handle = timer.schedule_nowait(1.0, lambda: None)
        bucket, deadline = handle._bucket, handle.deadline
        with pytest.raises((TypeError, ValueError)):
            handle.reset(delay)
        assert handle._bucket is bucket
        assert handle.deadline == deadline
        assert handle.pending()
        assert len(timer) == 1
