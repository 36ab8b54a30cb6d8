"""Every public type answers copy, deepcopy, pickle and weakref the same on both cores.

Issue 20, section 4: ``copy``/``pickle`` of ``timer.stats()`` raised
``FrozenInstanceError`` on the compiled core only, ``weakref.ref(timer)`` was a
``TypeError`` on the compiled core only and ``weakref.ref(handle)`` on the pure core
only. The table below is the one answer; CI runs this file on both cores. Timers and
handles refuse copy and pickle by design (docs/design.md): a copy would share the
original's place on the wheel.

Weak references to timers and handles work on both cores. The installed mypyc gives a
compiled class a ``__weakref__`` slot only through a Python base class (``TimerHandle``
has one through ``Generic``), and treats it as an owned reference: its ``tp_dealloc``
cleared it with ``Py_CLEAR`` instead of ``PyObject_ClearWeakRefs``, so a weak
reference that outlived a compiled handle was a use-after-free and the process
crashed. ``setup.py`` (``weakref_safe``) fixes the generated C at build time and gives
``Timer`` the slot; the pure core's handles have ``__weakref__`` in their slots.
``test_a_weak_reference_outlives_its_object`` runs in a subprocess, where a crash is
an exit status rather than the end of the test run.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aiowheel
from aiowheel import (
    DelayedOperation,
    PeriodicHandle,
    Purgatory,
    Timeout,
    Timer,
    TimerCancelled,
    TimerClosed,
    TimerError,
    TimerFull,
    TimerHandle,
    TimerStats,
)

pytestmark = pytest.mark.anyio

OK, REFUSED = "ok", "TypeError"

#: type name -> (copy, deepcopy, pickle, weakref)
EXPECTED: dict[str, tuple[str, str, str, str]] = {
    "Timer": (REFUSED, REFUSED, REFUSED, OK),
    "TimerHandle": (REFUSED, REFUSED, REFUSED, OK),
    "PeriodicHandle": (REFUSED, REFUSED, REFUSED, OK),
    "TimerStats": (OK, OK, OK, REFUSED),
    "Timeout": (REFUSED, REFUSED, REFUSED, REFUSED),
    "DelayedOperation (new)": (OK, OK, OK, OK),
    "DelayedOperation (watched)": (REFUSED, REFUSED, REFUSED, OK),
    "Purgatory": (OK, REFUSED, REFUSED, OK),
    "TimerError": (OK, OK, OK, OK),
    "TimerFull": (OK, OK, OK, OK),
    "TimerClosed": (OK, OK, OK, OK),
    "TimerCancelled": (OK, OK, OK, OK),
}


def noop() -> None:
    pass


def _outcome(action: Callable[[], object]) -> str:
    try:
        action()
    except TypeError:
        return REFUSED
    except Exception as exc:  # any other answer is a disagreement worth seeing
        return f"{type(exc).__name__}: {exc}"
    return OK


def _answers(obj: object) -> tuple[str, str, str, str]:
    def pickled() -> object:
        return pickle.loads(pickle.dumps(obj))

    return (
        _outcome(lambda: copy.copy(obj)),
        _outcome(lambda: copy.deepcopy(obj)),
        _outcome(pickled),
        _outcome(lambda: weakref.ref(obj)),
    )


async def test_every_public_type_answers_the_same_on_both_cores() -> None:
    async with Timer() as timer:
        purgatory = Purgatory(timer)
        watched = DelayedOperation(100.0)
        assert not purgatory.try_complete_else_watch(watched, ["k"])
        handle = timer.schedule_nowait(100.0, noop)
        periodic = timer.every(100.0, noop)
        objects: dict[str, Any] = {
            "Timer": timer,
            "TimerHandle": handle,
            "PeriodicHandle": periodic,
            "TimerStats": timer.stats(),
            "Timeout": timer.timeout(100.0),
            "DelayedOperation (new)": DelayedOperation(1.0),
            "DelayedOperation (watched)": watched,
            "Purgatory": purgatory,
            "TimerError": TimerError("x"),
            "TimerFull": TimerFull("x"),
            "TimerClosed": TimerClosed("x"),
            "TimerCancelled": TimerCancelled("x"),
        }
        assert isinstance(handle, TimerHandle)
        assert isinstance(periodic, PeriodicHandle)
        assert isinstance(objects["Timeout"], Timeout)
        answers = {name: _answers(obj) for name, obj in objects.items()}
        purgatory.close()
        periodic.cancel()
        handle.cancel()
    assert answers == EXPECTED, f"compiled={aiowheel.COMPILED}"


PROBE = """
import gc, weakref, anyio, aiowheel
async def main():
    handles = weakref.WeakValueDictionary()
    timers = weakref.WeakKeyDictionary()
    async with aiowheel.Timer() as timer:
        timers[timer] = "t"
        handle = timer.schedule_nowait(0, lambda: None)
        periodic = timer.every(1.0, lambda: None)
        handles["h"], handles["p"] = handle, periodic
        refs = [weakref.ref(handle), weakref.ref(periodic)]
        await handle.wait()
        periodic.cancel()
        del handle, periodic
        gc.collect()
        assert [ref() for ref in refs] == [None, None], refs
        assert len(handles) == 0
        for _ in range(10_000):  # many deallocs with live weak references
            h = timer.schedule_nowait(1.0, lambda: None)
            ref = weakref.ref(h)
            h.cancel()
            del h
            assert ref() is None
    ref = weakref.ref(timer)
    del timer
    gc.collect()
    assert ref() is None and len(timers) == 0
    print("ok")
anyio.run(main)
"""


def test_a_weak_reference_outlives_its_object() -> None:
    """Handles and timers freed while weak references to them live (by refcount and
    by the collector): the references die with them, on both cores (the compiled core
    crashed here before setup.py's weakref_safe)."""
    root = Path(aiowheel.__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == b"ok"


async def test_a_stats_copy_equals_the_snapshot() -> None:
    async with Timer() as timer:
        timer.schedule_nowait(1.0, noop).cancel()
        stats = timer.stats()
        assert copy.copy(stats) == copy.deepcopy(stats) == pickle.loads(pickle.dumps(stats))
        assert copy.copy(stats) == stats
        assert isinstance(copy.copy(stats), TimerStats)
