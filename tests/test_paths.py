"""The way through the house, counted: the frames and the files of the core that a
timer crosses from the call that files it to the bucket, and from the wake-up to its
callback (docs/design.md, "Module map"), on the timer's own path and on the drop-in
loop's ``call_later``.

The pure core is profiled (``sys.setprofile`` sees Python frames; compiled functions
have none) in a child process, so that the core it imports is the pure one whatever
this run uses. The counts are ceilings: lower them when the path gets shorter.
CPython's own loop, for scale: ``call_at`` files with one call below it (``heappush``,
in C), and ``_run_once`` calls ``Handle._run``, which calls the callback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

import aiowheel

#: (frames of the core from the filing call down to ``Bucket.add``, inclusive;
#: frames of the core above the callback from the wake-up on)
TIMER_FRAMES: Final = (4, 2)  # schedule_nowait, insert, _file, add; fire_due, run_due
LOOP_FRAMES: Final = (5, 4)  # call_later, file_loop, insert, _file, add; + run_in_pass, _run
#: the core's modules either path crosses, filing and firing together
TIMER_FILES: Final = {"_timer", "_affinity", "_handle", "_wheel", "_driver", "_pass"}
LOOP_FILES: Final = {"_loophandle", "_handle", "_wheel", "_engine", "_driver", "_loop", "_pass"}

_PROBE: Final = r'''
import asyncio, json, os, sys
import aiowheel

PACKAGE = os.path.dirname(aiowheel.__file__)
calls = []


def depth(frame):
    n = 0
    while frame is not None:
        n, frame = n + 1, frame.f_back
    return n


def profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        calls.append([code.co_filename, code.co_qualname, depth(frame)])


def core(segment):
    """The segment's frames of the core: (module, qualified name, depth)."""
    return [
        [os.path.basename(f).removesuffix(".py"), q, d]
        for f, q, d in segment
        if os.path.dirname(f) == PACKAGE
    ]


def callback_seen():
    calls.append(["CALLBACK", "callback", depth(sys._getframe(1))])


async def measure(file, fire):
    """Profile ``file()`` (which files one timer whose callback calls
    ``callback_seen``), then the wake-up that runs it (``fire`` awaits it)."""
    calls.clear()
    sys.setprofile(profile)
    file()
    sys.setprofile(None)
    filing = core(calls)
    calls.clear()
    sys.setprofile(profile)
    await fire()
    sys.setprofile(None)
    start = next(i for i, c in enumerate(calls) if c[1] == "fire_due")
    end = next(i for i, c in enumerate(calls) if c[0] == "CALLBACK")
    base = calls[start][2]
    above = [c for c in core(calls[start:end]) if c[2] < calls[end][2]]
    # the frames still open when the callback runs: one per depth, the last seen
    open_frames = {d: [m, q] for m, q, d in above}
    return {
        "filing": filing,
        "to_bucket": next(d for _, q, d in filing if q == "Bucket.add") - filing[0][2] + 1,
        "to_callback": [open_frames[d] for d in sorted(open_frames) if d >= base],
        "firing": core(calls[start:end]),
    }


async def timer_path():
    async with aiowheel.Timer(tick=0.001) as timer:
        timer.schedule_nowait(0.05, lambda: None)  # the levels exist
        fired = asyncio.Event()

        def cb():
            callback_seen()
            fired.set()

        return await measure(lambda: timer.schedule_nowait(0.002, cb), fired.wait)


async def loop_path():
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, lambda: None)
    fired = asyncio.Event()

    def cb():
        callback_seen()
        fired.set()

    return await measure(lambda: loop.call_later(0.002, cb), fired.wait)


result = {"timer": asyncio.run(timer_path())}
loop = aiowheel.new_event_loop()
try:
    result["loop"] = loop.run_until_complete(loop_path())
finally:
    loop.close()
print(json.dumps(result))
'''


@pytest.fixture(scope="module")
def paths() -> dict[str, Any]:
    env = {**os.environ, "AIOWHEEL_PURE": "1"}
    # The package as this run imports it (a checkout, or nox's installed copy).
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(aiowheel.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def _files(path: dict[str, Any]) -> set[str]:
    return {m for m, _, _ in path["filing"]} | {m for m, _, _ in path["firing"]}


def test_a_timer_is_filed_and_fired_in_few_frames(paths: dict[str, Any]) -> None:
    timer = paths["timer"]
    assert timer["to_bucket"] <= TIMER_FRAMES[0], timer["filing"]
    assert len(timer["to_callback"]) <= TIMER_FRAMES[1], timer["to_callback"]
    assert [q for _, q in timer["to_callback"]][:1] == ["fire_due"]


def test_a_drop_in_loop_handle_is_filed_and_fired_in_few_frames(paths: dict[str, Any]) -> None:
    loop = paths["loop"]
    assert loop["to_bucket"] <= LOOP_FRAMES[0], loop["filing"]
    assert len(loop["to_callback"]) <= LOOP_FRAMES[1], loop["to_callback"]


def test_the_paths_cross_few_files(paths: dict[str, Any]) -> None:
    """As Kafka's timer (about six classes from ``add`` to the task's ``run``) and
    tokio's time driver (about six files)."""
    assert _files(paths["timer"]) <= TIMER_FILES
    assert _files(paths["loop"]) <= LOOP_FILES
