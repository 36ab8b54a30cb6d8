"""An error message shows a bad value cut to a readable length: ``10**400`` as a delay
made a 447-character message (aiowheel/_checks.py, ``shown``)."""

from __future__ import annotations

import pytest

from aiowheel import Timer
from aiowheel._checks import shown

pytestmark = pytest.mark.anyio


def test_a_short_value_is_its_repr() -> None:
    assert shown(1.5) == "1.5"
    assert shown("x") == "'x'"


def test_a_long_value_is_cut_and_says_how_long_it_was() -> None:
    text = shown(10**400)
    assert len(text) < 90
    assert text.startswith("1000")
    assert text.endswith("(401 characters)")


def test_a_value_whose_repr_raises_is_named_by_its_type() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert shown(Hostile()) == "<a Hostile whose repr raised>"


@pytest.mark.parametrize("bad", [10**400, -(10**400), "x" * 5000, b"y" * 5000])
async def test_bad_times_raise_short_messages(bad: object) -> None:
    async with Timer() as timer:
        pending = timer.schedule_nowait(10, lambda: None)
        with pytest.raises((ValueError, TypeError)) as raised:
            timer.schedule_nowait(bad, lambda: None)  # type: ignore[arg-type]
        assert len(str(raised.value)) < 150
        with pytest.raises((ValueError, TypeError)) as raised:
            pending.reset(bad)  # type: ignore[arg-type]
        assert len(str(raised.value)) < 150
        with pytest.raises((ValueError, TypeError)) as raised:
            timer.timeout(bad)  # type: ignore[arg-type]
        assert len(str(raised.value)) < 150
        assert pending.pending()  # nothing pending is lost


async def test_a_long_non_callable_is_cut() -> None:
    async with Timer() as timer:
        with pytest.raises(TypeError, match="characters") as raised:
            timer.schedule_nowait(1, "z" * 5000)  # type: ignore[arg-type]
        assert len(str(raised.value)) < 150
