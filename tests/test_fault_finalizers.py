"""Finalizer-driven re-entrancy, as a matrix, with ``Timer._check()`` after every step.

Issue 20, section 1 asks the fault model to include user code that runs when the
timer drops a reference: a ``__del__`` (the old result of a re-armed handle, or of a
periodic run) and a ``gc.callbacks`` hook (any allocation may run the collector).
tests/test_reentrancy.py holds the issue's reproductions; this file runs every
action (``reset``, ``cancel``, ``schedule``, ``aclose``) from both sources against a
one-shot and a periodic handle, on the three backends, and checks the timer's own
accounting (docs/design.md, "Accounting": scheduled == fired + cancelled + pending,
pending == filed + queued + periodic runs) and the wheel's invariants after each step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support import at_next_collection

from aiowheel import PeriodicHandle, Timer, TimerClosed, TimerHandle

pytestmark = pytest.mark.anyio

TICK = 0.001
ACTIONS = ["reset", "cancel", "schedule", "aclose"]
# A finalizer can only close the timer by stepping aclose() itself (it cannot await).
# On trio that parks the current task in trio's own wait, which then resumes the
# wrong task ("Should never have been rescheduled"): not something a program can do.
TRIO_NO_ACLOSE = "a finalizer cannot step aclose() on trio (see ACTIONS)"


def noop() -> None:
    pass


class OnDel:
    """Calls ``action`` once, when it is freed."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.action = action

    def __del__(self) -> None:
        action, self.action = self.action, noop
        action()


class Scene:
    """One timer, one target handle and what the finalizer does to it."""

    def __init__(self, timer: Timer, action: str) -> None:
        self.timer = timer
        self.action = action
        self.target: TimerHandle[Any] | None = None
        self.extra: list[TimerHandle[Any]] = []
        self.closers: list[Any] = []
        self.acted = 0
        self.acted_event = anyio.Event()

    def act(self) -> None:
        self.acted += 1
        self.acted_event.set()
        target = self.target
        assert target is not None
        if self.timer.closed:
            return
        if self.action == "reset":
            target.reset(0.02)
        elif self.action == "cancel":
            target.cancel()
        elif self.action == "schedule":
            self.extra.append(self.timer.schedule_nowait(0.01, noop))
        else:
            # aclose() stepped synchronously: its first part closes the timer.
            coro = self.timer.aclose()
            self.closers.append(coro)
            try:
                coro.send(None)
            except StopIteration:
                pass

    def check(self) -> None:
        self.timer._check()
        if not self.timer.closed:
            live = self.timer._live
            assert live is not None
            live.wheel._check()

    def finish(self) -> None:
        for coro in self.closers:
            coro.close()


@pytest.mark.parametrize("target", ["one-shot", "periodic"])
@pytest.mark.parametrize("source", ["__del__", "gc.callbacks"])
@pytest.mark.parametrize("action", ACTIONS)
async def test_finalizer_re_entrancy_keeps_the_accounting(
    action: str, source: str, target: str, backend: str
) -> None:
    if action == "aclose" and backend == "trio":
        pytest.skip(TRIO_NO_ACLOSE)
    async with Timer(tick=TICK) as timer:
        scene = Scene(timer, action)
        runs: list[int] = []
        ran = anyio.Event()

        def callback() -> object:
            runs.append(1)
            ran.set()
            if source == "__del__" and len(runs) == 1:
                return OnDel(scene.act)
            return None

        if target == "one-shot":
            handle = timer.schedule_nowait(0.01, callback)
            scene.target = handle
            scene.check()
            with anyio.fail_after(5):
                await handle.wait()
            scene.check()
            if source == "__del__":
                handle.reset(0.01)  # drops the old result: its finalizer re-enters
            else:
                with at_next_collection(scene.act):
                    try:
                        handle.reset(100.0)  # creates levels: the collector runs
                    except TimerClosed:
                        assert action == "aclose"  # the timer closed during the call
            scene.check()
            if timer.closed:
                assert not handle.pending()
        else:
            periodic: PeriodicHandle = timer.every(0.01, callback)
            scene.target = periodic
            scene.check()
            if source == "__del__":
                with anyio.fail_after(5):
                    await ran.wait()
                    # The pass drops the result after the run: its finalizer acts then.
                    await scene.acted_event.wait()
            else:
                with at_next_collection(scene.act), anyio.fail_after(5):
                    await scene.acted_event.wait()
            scene.check()
        assert scene.acted == 1 or timer.closed
        with anyio.fail_after(5):
            await anyio.sleep(0.05)  # whatever was re-armed or scheduled runs
        scene.check()
        if target == "periodic" and not timer.closed and scene.action != "cancel":
            assert isinstance(scene.target, PeriodicHandle)
            assert scene.target.active()
        if action == "aclose":
            assert timer.closed
            assert len(timer) == 0
        await timer.aclose()
        scene.check()
        scene.finish()


ENTRIES: dict[str, Callable[[Timer, TimerHandle[Any]], object]] = {
    "schedule_nowait": lambda timer, fired: timer.schedule_nowait(100.0, noop),
    "schedule_at_nowait": lambda timer, fired: timer.schedule_at_nowait(timer.time() + 100.0, noop),
    "every": lambda timer, fired: timer.every(100.0, noop),
    "reset": lambda timer, fired: fired.reset(100.0),
    "reset_at": lambda timer, fired: fired.reset_at(timer.time() + 100.0),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
async def test_the_collector_closes_the_timer_during_a_call(entry: str, backend: str) -> None:
    """A gc.callbacks hook steps aclose() at the first collection inside a call that
    files a timer (a 100 s deadline creates levels on a fresh timer): the call raises
    TimerClosed or returns, and either way nothing is left pending on the closed timer."""
    if backend == "trio":
        pytest.skip(TRIO_NO_ACLOSE)
    async with Timer(tick=TICK) as timer:
        fired = timer.schedule_nowait(0, noop)
        with anyio.fail_after(5):
            await fired.wait()
        scene = Scene(timer, "aclose")
        scene.target = fired
        result: object = None
        with at_next_collection(scene.act):
            try:
                result = ENTRIES[entry](timer, fired)
            except TimerClosed:
                pass
        assert scene.acted == 1
        assert timer.closed
        scene.check()
        assert len(timer) == 0
        assert not fired.pending()
        if isinstance(result, TimerHandle):
            assert not result.pending()
        scene.finish()
