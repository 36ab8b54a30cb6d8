"""Where a real server's request goes, per event loop: the `server` workload's uvicorn
app (aiowheel/bench/_serve.py) profiled on each loop, to tell the timers' share of a
request from the rest (docs/loop.md, "Why a server gains little").

    python tools/server_profile.py                       # instructions (valgrind)
    python tools/server_profile.py --measure cpu -n 2000 # CPU time, no valgrind
    python tools/server_profile.py --guard middleware    # IdleTimeoutMiddleware's cost

One server process per loop serves three paths, each driven by one keep-alive client
connection, one request at a time, after a warm-up:

* ``/``: the trivial app;
* ``/a``: the same app after five awaits of an operation that completes on the next
  loop iteration (the timeout-heavy app without its timeouts);
* ``/t``: the timeout-heavy app (the five awaits, three under ``asyncio.timeout(10)``
  and two under ``asyncio.wait_for(..., 10)``).

``--measure instructions`` (the default) runs the server under ``valgrind
--tool=callgrind``, zeroes its counters before each path and dumps them after
(``callgrind_control``): instructions per request, which do not depend on the
machine's load, and the inclusive instructions of the loop's timer entry points
(uvloop's ``call_at``, ``call_later`` and ``TimerHandle.cancel``; the drop-in loop's
compiled ones), where those are C functions callgrind can name (plain asyncio's are
Python, so its line says "-"). ``--measure cpu`` reads the server's own CPU time
(``/__stats``) before and after each path instead: µs per request, noisy on a shared
machine. ``--measure load`` reads it around the ``server`` workload's own load (wrk
where it is installed, 64 connections, ``--seconds`` per path): the CPU per request
of a loaded server, kernel time included, which callgrind does not count; ``--rounds``
rounds, the loops interleaved, medians.

``--loops`` may also name ``stub-asyncio`` and ``stub-uvloop``: the plain loop with its
timers 5 s or more ahead stubbed out (the app's timeouts and uvicorn's keep-alive
timer cost a Python call and nothing else), what a request costs when its timers
cost nothing: the floor of any loop's timers (docs/loop.md, "Why a server gains
little").
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from aiowheel.bench.server import _measure as measure_under_load

PATHS = ("/", "/a", "/t")
GUARDS = ("uvicorn", "protocol", "middleware")
LOOPS = ("asyncio", "loop-asyncio", "uvloop", "loop-uvloop")
#: The plain loops with their long timers stubbed out (``--loops stub-asyncio,...``):
#: what a request costs when its timers cost nothing, the floor no loop's timers
#: can go below.
STUB_LOOPS = ("stub-asyncio", "stub-uvloop")

#: callgrind symbols of each loop's timer entry points (inclusive costs add up: the
#: outermost entry points only).
TIMER_SYMBOLS = {
    "uvloop": (
        r"__pyx_pw_6uvloop_4loop_4Loop_\d+call_later$",
        r"__pyx_pw_6uvloop_4loop_4Loop_\d+call_at$",
        r"__pyx_pw_6uvloop_4loop_11TimerHandle_\d+cancel$",
    ),
    "drop-in": (
        r"CPyPy__loophandle___call_later$",
        r"CPyPy__loophandle___call_at$",
        r"CPyPy__loophandle___LoopTimerHandle___cancel$",
    ),
}

# The server: the bench's app, plus ``/a``. Run as ``python -c SERVER LOOP``.
SERVER = """
import sys
import aiowheel.bench._serve as serve

bench_app = serve.app


async def app(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/a":
        for _ in range(5):
            await serve._short()
        await send({"type": "http.response.start", "status": 200, "headers": serve._HEADERS})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await bench_app(scope, receive, send)


serve.app = app
loop_name = sys.argv[1]
if loop_name.startswith("stub-"):
    # The plain loop, its timers 5 s or more ahead stubbed out: the app's 10 s
    # timeouts and uvicorn's keep-alive timer cost a Python call and nothing else
    # (uvicorn's own short sleeps stay real).
    loop_name = loop_name.removeprefix("stub-")
    make_loop = serve.new_loop

    class Stub:
        __slots__ = ()

        def cancel(self):
            pass

    STUB = Stub()

    def new_loop(name):
        loop = make_loop(name)
        call_at, call_later, time = loop.call_at, loop.call_later, loop.time

        def stub_call_at(when, callback, *args, context=None):
            if when - time() >= 5.0:
                return STUB
            return call_at(when, callback, *args, context=context)

        def stub_call_later(delay, callback, *args, context=None):
            if delay >= 5.0:
                return STUB
            return call_later(delay, callback, *args, context=context)

        loop.call_at = stub_call_at
        loop.call_later = stub_call_later
        return loop

    serve.new_loop = new_loop
sys.exit(serve.main([loop_name, sys.argv[2]]))
"""


def _get(connection: http.client.HTTPConnection, path: str) -> bytes:
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: {response.status}")
    return body


def _timer_instructions(dump: str, loop: str) -> int | None:
    """The inclusive instructions of the loop's timer entry points in one dump."""
    patterns = TIMER_SYMBOLS.get("drop-in" if loop.startswith("loop-") else loop)
    if patterns is None:
        return None
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = 0
    # callgrind_annotate may list a function twice (its table by file:function, then
    # again with the object's name): count each file:function once.
    seen: set[tuple[str, str]] = set()
    for line in annotated.splitlines():
        match = re.match(r"\s*([\d,]+) .*?(\S+):(\S+)( \[.*\])?$", line)
        if match and any(re.search(p, match.group(3)) for p in patterns):
            key = (os.path.basename(match.group(2)), match.group(3))
            if key not in seen:
                seen.add(key)
                total += int(match.group(1).replace(",", ""))
    return total


def profile(
    loop: str,
    requests: int,
    warm_up: int,
    measure: str,
    guard: str = "uvicorn",
    seconds: float = 3.0,
) -> dict[str, dict[str, float]]:
    """Per path: instructions (or CPU µs) per request, and the timers' share."""
    scratch = tempfile.mkdtemp(prefix="server-profile-")
    out = os.path.join(scratch, "callgrind.out")
    command = [sys.executable, "-c", SERVER, loop, guard]
    if measure == "instructions":
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command]
    server = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert server.stdout is not None
    assert server.stdin is not None
    figures: dict[str, dict[str, float]] = {}
    try:
        port = int(server.stdout.readline())
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for path in PATHS:
            for _ in range(warm_up):
                _get(connection, path)
        for path in PATHS:
            if measure == "load":
                figures[path] = {"cpu_us": measure_under_load(port, path, seconds).cpu_us}
                continue
            if measure == "instructions":
                pid = str(server.pid)
                subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
            else:
                before = json.loads(_get(connection, "/__stats"))["cpu"]
            for _ in range(requests):
                _get(connection, path)
            if measure == "instructions":
                label = path.strip("/") or "root"
                subprocess.run(
                    ["callgrind_control", "-d", label, pid], check=True, capture_output=True
                )
            else:
                after = json.loads(_get(connection, "/__stats"))["cpu"]
                figures[path] = {"cpu_us": (after - before) * 1e6 / requests}
        connection.close()
    finally:
        server.stdin.close()
        server.wait(timeout=300)
        server.stdout.close()
    if measure == "instructions":
        for name in sorted(glob.glob(out + ".*")):
            text = Path(name).read_text()
            trigger = re.search(r"^desc: Trigger: dump (\S+)", text, re.M)
            total = re.search(r"^summary: (\d+)", text, re.M)
            if trigger and total:
                path = "/" if trigger.group(1) == "root" else "/" + trigger.group(1)
                timers = _timer_instructions(name, loop)
                figures[path] = {
                    "instructions": int(total.group(1)) / requests,
                    "timers": -1.0 if timers is None else timers / requests,
                }
    shutil.rmtree(scratch, ignore_errors=True)
    return figures


def _medians(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each path's figures, the median over the rounds."""
    return {
        path: {key: statistics.median(r[path][key] for r in rounds) for key in figures}
        for path, figures in rounds[0].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--measure", choices=("instructions", "cpu", "load"), default="instructions"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="--measure load: per path")
    parser.add_argument("--rounds", type=int, default=3, help="--measure load: rounds")
    parser.add_argument("-n", "--requests", type=int, default=1000, help="requests per path")
    parser.add_argument("--warm-up", type=int, default=300, help="requests per path first")
    parser.add_argument("--loops", default=",".join(LOOPS), help="comma-separated")
    parser.add_argument(
        "--guard",
        choices=GUARDS,
        default="uvicorn",
        help="what closes idle connections (aiowheel/bench/_serve.py): uvicorn's "
        "keep-alive timeout, uvicorn_protocol, or IdleTimeoutMiddleware with it",
    )
    args = parser.parse_args()
    if args.measure == "instructions" and shutil.which("valgrind") is None:
        parser.error("--measure instructions needs valgrind on PATH (or --measure cpu)")
    if args.requests < 1 or args.warm_up < 0 or args.rounds < 1 or not args.seconds > 0:
        parser.error("-n and --rounds must be at least 1, --warm-up at least 0, --seconds > 0")
    loops = args.loops.split(",")
    unknown = set(loops) - set(LOOPS) - set(STUB_LOOPS)
    if unknown:
        known = ", ".join(LOOPS + STUB_LOOPS)
        parser.error(f"unknown loops {sorted(unknown)}; choose from {known}")
    unit = "instructions" if args.measure == "instructions" else "cpu_us"
    rounds = args.rounds if args.measure == "load" else 1
    runs: dict[str, list[dict[str, dict[str, float]]]] = {loop: [] for loop in loops}
    for _ in range(rounds):
        for loop in loops:
            runs[loop].append(
                profile(loop, args.requests, args.warm_up, args.measure, args.guard, args.seconds)
            )
    results = {loop: _medians(figures) for loop, figures in runs.items()}
    how = (
        f"{args.seconds:g} s of load per path, medians of {rounds} rounds"
        if args.measure == "load"
        else f"{args.requests} requests per path, one connection"
    )
    print(f"per request ({unit}), {how}, idle connections closed by {args.guard}")
    print(f"{'loop':<14}{'/':>12}{'/a':>12}{'/t':>12}{'/t - /a':>12}{'timers in /t':>14}")
    for loop, figures in results.items():
        cells = [figures[path][unit] for path in PATHS]
        timers = figures["/t"].get("timers", -1.0)
        shown = "-" if timers < 0 else f"{timers:,.0f}"
        print(
            f"{loop:<14}"
            + "".join(f"{cell:>12,.1f}" for cell in cells)
            + f"{cells[2] - cells[1]:>12,.1f}{shown:>14}"
        )
    for base in ("asyncio", "uvloop"):
        if base in results and f"loop-{base}" in results:
            plain, drop_in = results[base]["/t"][unit], results[f"loop-{base}"]["/t"][unit]
            print(f"drop-in / plain {base}, /t: {drop_in / plain:.3f}")
        if base in results and f"stub-{base}" in results:
            plain, stub = results[base]["/t"][unit], results[f"stub-{base}"]["/t"][unit]
            print(f"timers stubbed / plain {base}, /t: {stub / plain:.3f} (the floor)")


if __name__ == "__main__":
    main()
