"""Every public type answers copy, deepcopy, pickle and weakref the same on both cores.

Issue 20, section 4: ``copy``/``pickle`` of ``timer.stats()`` raised
``FrozenInstanceError`` on the compiled core only, ``weakref.ref(timer)`` was a
``TypeError`` on the compiled core only and ``weakref.ref(handle)`` on the pure core
only. The table below is the one answer; CI runs this file on both cores. Timers and
handles refuse copy and pickle by design (docs/design.md): a copy would share the
original's place on the wheel.

Weak references to timers and handles are NOT the same yet (``WEAKREF_DIVERGES``): the
installed mypyc gives a compiled class a ``__weakref__`` slot only through a Python
base class (``TimerHandle`` has one through ``Generic``), and its ``tp_dealloc`` then
clears that slot with ``Py_CLEAR`` instead of ``PyObject_ClearWeakRefs``: a weak
reference that outlives a compiled handle is a use-after-free, and the process
crashes (``test_a_weak_reference_outliving_a_handle``, run in a subprocess, shows it).
Until mypyc clears weak references (``@mypyc_attr(supports_weakrefs=True)`` in later
releases), the weakref column of those rows is what each core does today.
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

#: What weakref.ref does today on each core, for the rows that differ (see above).
WEAKREF_DIVERGES: dict[str, str] = {
    "Timer": OK if not aiowheel.COMPILED else REFUSED,
    "TimerHandle": REFUSED if not aiowheel.COMPILED else OK,
    "PeriodicHandle": REFUSED if not aiowheel.COMPILED else OK,
}

#: type name -> (copy, deepcopy, pickle, weakref)
EXPECTED: dict[str, tuple[str, str, str, str]] = {
    "Timer": (REFUSED, REFUSED, REFUSED, WEAKREF_DIVERGES["Timer"]),
    "TimerHandle": (REFUSED, REFUSED, REFUSED, WEAKREF_DIVERGES["TimerHandle"]),
    "PeriodicHandle": (REFUSED, REFUSED, REFUSED, WEAKREF_DIVERGES["PeriodicHandle"]),
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
import weakref, anyio, aiowheel
async def main():
    async with aiowheel.Timer() as timer:
        handle = timer.schedule_nowait(0, lambda: None)
        ref = weakref.ref(handle)
        await handle.wait()
        del handle
        assert ref() is None
anyio.run(main)
"""


@pytest.mark.xfail(
    aiowheel.COMPILED,
    reason="mypyc's dealloc does not clear weak references: a use-after-free (see above)",
    strict=True,
)
def test_a_weak_reference_outliving_a_handle() -> None:
    """Should pass on both cores; on the pure core a handle refuses weak references
    (a TypeError, exit 1), on the compiled one the process crashes (SIGSEGV)."""
    root = Path(aiowheel.__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    if not aiowheel.COMPILED:
        assert done.returncode == 1
        assert b"cannot create weak reference" in done.stderr
        return
    assert done.returncode == 0, done.returncode


async def test_a_stats_copy_equals_the_snapshot() -> None:
    async with Timer() as timer:
        timer.schedule_nowait(1.0, noop).cancel()
        stats = timer.stats()
        assert copy.copy(stats) == copy.deepcopy(stats) == pickle.loads(pickle.dumps(stats))
        assert copy.copy(stats) == stats
        assert isinstance(copy.copy(stats), TimerStats)
