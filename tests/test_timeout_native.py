"""Issue 19, "timer.timeout(), native per backend": the contract of ``asyncio.timeout``.

On asyncio and uvloop the deadline cancels the task and leaving the block takes the
request back (``task.uncancel()``), as ``asyncio.timeout`` does; on trio it is a trio
cancel scope that the timer cancels. These tests hold on all three backends: nested
scopes unwind one at a time, the outermost expired scope raises, a cancellation from
outside wins over the deadline, and a timeout whose block ends leaves the task as it
found it. The plain-asyncio tests run the same scenarios with ``asyncio.timeout`` and
``timer.timeout`` side by side and require the same outcome.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import uvloop

import aiowheel
from aiowheel import Timer

pytestmark = pytest.mark.anyio


@pytest.fixture
def unit(virtual: bool) -> float:
    """One "second" of a test: 1 s on virtual clocks, 20 ms on uvloop's real clock."""
    return 1.0 if virtual else 0.02


async def test_a_timeout_that_expires_raises_timeout_error_and_leaves_no_timer(
    unit: float,
) -> None:
    async with Timer() as timer:
        with pytest.raises(TimeoutError), timer.timeout(unit) as t:
            await anyio.sleep(100 * unit)
        assert t.expired()
        assert len(timer) == 0
        await anyio.lowlevel.checkpoint()  # the task is not left cancelled
        await anyio.sleep(unit / 10)


async def test_nested_the_inner_deadline_first(unit: float) -> None:
    async with Timer() as timer:
        with timer.timeout(100 * unit) as outer:
            with pytest.raises(TimeoutError), timer.timeout(unit) as inner:
                await anyio.sleep(50 * unit)
            assert inner.expired()
            await anyio.sleep(unit / 10)  # the outer block goes on, not cancelled
        assert not outer.expired()
        assert len(timer) == 0


async def test_nested_the_outer_deadline_first(unit: float) -> None:
    async with Timer() as timer:
        raised_inside: list[BaseException] = []
        with pytest.raises(TimeoutError), timer.timeout(unit) as outer:  # noqa: PT012
            try:
                with timer.timeout(100 * unit) as inner:
                    await anyio.sleep(50 * unit)
            except BaseException as exc:
                raised_inside.append(exc)
                raise
        # The inner scope let the cancellation through; the outer one turned it into
        # TimeoutError.
        assert len(raised_inside) == 1
        assert not isinstance(raised_inside[0], TimeoutError)
        assert outer.expired()
        assert not inner.expired()
        assert len(timer) == 0


@pytest.mark.virtual_time
async def test_nested_both_deadlines_in_one_pass_the_outer_scope_raises() -> None:
    async with Timer() as timer:
        raised_inside: list[BaseException] = []
        with pytest.raises(TimeoutError), timer.timeout(1.0) as outer:  # noqa: PT012
            try:
                with timer.timeout(1.0) as inner:
                    await anyio.sleep(50)
            except BaseException as exc:
                raised_inside.append(exc)
                raise
        assert not isinstance(raised_inside[0], TimeoutError)
        assert outer.expired()
        assert inner.expired()


async def test_a_cancellation_from_outside_wins_over_the_deadline(
    unit: float, virtual: bool
) -> None:
    async with Timer() as timer:
        with anyio.CancelScope() as outside:
            # Filed first, due with the deadline: the same pass cancels from outside
            # and then expires the timeout.
            timer.schedule_nowait(unit, outside.cancel)
            with timer.timeout(unit) as t:
                await anyio.sleep(100 * unit)
        assert outside.cancelled_caught  # a cancellation, not a TimeoutError, came out
        if virtual:
            assert t.expired()
        assert len(timer) == 0


async def test_an_outside_cancellation_before_the_deadline_passes_through(
    unit: float,
) -> None:
    async with Timer() as timer:
        with anyio.move_on_after(unit) as outside, timer.timeout(100 * unit) as t:
            await anyio.sleep(50 * unit)
        assert outside.cancelled_caught
        assert not t.expired()
        assert len(timer) == 0


async def test_reset_deadline_and_expired(unit: float) -> None:
    async with Timer() as timer:
        scope = timer.timeout(unit)
        scope.reset(2 * unit)  # before entering: the delay the block will get
        with pytest.raises(TimeoutError), scope:  # noqa: PT012
            start = timer.time()
            assert start + 2 * unit - 0.01 <= scope.deadline <= start + 2 * unit
            scope.reset(3 * unit)
            assert timer.time() + 3 * unit - 0.01 <= scope.deadline <= timer.time() + 3 * unit
            await anyio.sleep(100 * unit)
        assert scope.expired()
        deadline = scope.deadline
        scope.reset(10 * unit)  # after the block: no effect, and no timer left behind
        assert scope.deadline == deadline
        assert len(timer) == 0
        with pytest.raises(RuntimeError, match="only once"), scope:
            pass


async def test_a_timeout_is_one_block_and_refuses_copies() -> None:
    async with Timer() as timer:
        scope = timer.timeout(1.0)
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.copy(scope)


# == plain asyncio: the same outcome as asyncio.timeout =====================================

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
RUNNERS = [pytest.param(asyncio.run, id="asyncio"), pytest.param(uvloop.run, id="uvloop")]
Factory = Callable[[aiowheel.Timer, float], Any]


def _stdlib(timer: aiowheel.Timer, delay: float) -> Any:
    return _Sync(asyncio.timeout(delay))


def _wheel(timer: aiowheel.Timer, delay: float) -> Any:
    return _Sync(timer.timeout(delay))


class _Sync:
    """Either timeout behind one ``async with``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __aenter__(self) -> Any:
        if isinstance(self.inner, aiowheel.Timeout):
            return self.inner.__enter__()
        return await self.inner.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        if isinstance(self.inner, aiowheel.Timeout):
            return self.inner.__exit__(*exc)
        return await self.inner.__aexit__(*exc)


async def _scenario(name: str, factory: Factory) -> tuple[str, bool, int]:
    """What comes out of the block, whether it expired, the task's cancel count."""
    async with aiowheel.Timer() as timer:
        task = asyncio.current_task()
        assert task is not None
        outcome = "nothing"
        scope: Any = None
        try:
            if name == "deadline":
                async with factory(timer, 0.01) as scope:
                    await asyncio.sleep(5)
            elif name == "outside-cancel-with-deadline":
                async with factory(timer, 0.0) as scope:
                    task.cancel()  # someone else's request, in flight with the deadline
                    await asyncio.sleep(5)
            elif name == "body-swallows":
                async with factory(timer, 0.01) as scope:
                    try:
                        await asyncio.sleep(5)
                    except asyncio.CancelledError:
                        pass
                await asyncio.sleep(0.001)  # not cancelled afterwards
            elif name == "nested-outer-first":
                async with factory(timer, 0.01) as scope, factory(timer, 5.0):
                    await asyncio.sleep(5)
            elif name == "nested-inner-first":
                async with factory(timer, 5.0) as scope:
                    try:
                        async with factory(timer, 0.01):
                            await asyncio.sleep(5)
                    except TimeoutError:
                        outcome = "inner TimeoutError"
                    await asyncio.sleep(0.001)
        except TimeoutError:
            outcome = "TimeoutError"
        except asyncio.CancelledError:
            outcome = "CancelledError"
            task.uncancel()
        expired = scope.expired()
        return outcome, expired, task.cancelling()


SCENARIOS = [
    ("deadline", ("TimeoutError", True, 0)),
    ("outside-cancel-with-deadline", ("CancelledError", True, 0)),
    ("body-swallows", ("nothing", True, 0)),
    ("nested-outer-first", ("TimeoutError", True, 0)),
    ("nested-inner-first", ("inner TimeoutError", False, 0)),
]


@pytest.mark.parametrize("run", RUNNERS)
@pytest.mark.parametrize(("name", "expected"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_the_same_outcome_as_asyncio_timeout(
    run: Runner, name: str, expected: tuple[str, bool, int]
) -> None:
    assert run(_scenario(name, _stdlib)) == expected
    assert run(_scenario(name, _wheel)) == expected


@pytest.mark.parametrize("run", RUNNERS)
def test_outside_a_task_is_refused(run: Runner) -> None:
    async def main() -> None:
        async with aiowheel.Timer() as timer:
            errors: list[BaseException] = []

            def in_a_callback() -> None:
                try:
                    with timer.timeout(1.0):
                        pass
                except RuntimeError as exc:
                    errors.append(exc)

            timer.schedule_nowait(0, in_a_callback)
            await asyncio.sleep(0.01)
            assert len(errors) == 1
            assert "inside a task" in str(errors[0])
            assert len(timer) == 0

    run(main())
