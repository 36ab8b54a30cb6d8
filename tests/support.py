"""What the test modules share, one section per room.

* The wheel (tests/test_wheel.py, tests/test_wheel_model.py): ``Entry``, a wheel entry
  that counts how often the wheel files it (when the wheel runs as Python:
  ``COUNTS_FILINGS``).
* The Timer API tests (tests/test_timer.py, tests/test_handle.py,
  tests/test_timeout.py, tests/test_checks.py, the first section of
  tests/test_dispatch.py): ``Probe``, a callback that records when it ran, the
  "never early, at most one tick late" assertions, ``arm`` through the four
  scheduling entry points, and the tick those timers use (``TIMER_TICK``; the
  ``unit`` fixture is in tests/conftest.py).
* The idle-timeout end-to-end tests (tests/middleware/): real servers, real sockets,
  real time. They cannot use the virtual clocks of conftest.py: a real server and a
  real client exchange bytes, so time is the wall clock and the timing assertions are
  windows, strict on the lower side (never dropped before the timeout) and generous on
  the upper side (loaded CI machines).
* Re-entrancy (tests/test_fault_finalizers.py, tests/test_purgatory.py,
  tests/test_reentrancy.py):
  ``at_next_collection``, user code run by the garbage collector at the next
  allocation, as a finalizer would.
* The engine's own tests (tests/test_engine.py, tests/test_copies_agree.py):
  ``RecordingDriver``, a driver that wakes nobody and keeps what it is asked.
"""

from __future__ import annotations

import asyncio
import gc
import math
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio

import aiowheel
from aiowheel import Timer, TimerHandle
from aiowheel._wheel import Bucket, WheelEntry

# -- the wheel's counting entry ----------------------------------------------------------

#: Whether ``Entry.filings`` counts. A compiled wheel (aiowheel/_compiled.py) stores
#: into the ``_bucket`` slot directly, past the property below, so the move counts,
#: a property of the algorithm, are asserted on the pure core only; CI runs the suite
#: on both cores.
COUNTS_FILINGS = not aiowheel.COMPILED

# The slot descriptor of WheelEntry._bucket, to read and write the real slot.
_BUCKET_SLOT: Any = WheelEntry.__dict__["_bucket"]


class Entry(WheelEntry):
    """A wheel entry that counts how often the wheel files it.

    ``_bucket`` shadows the slot of ``WheelEntry`` with a property so that every
    assignment the wheel makes is seen: the first non-``None`` one is the insert,
    each later one is a move (a cascade, or a re-file of an early entry).
    """

    __slots__ = ("filings", "name", "was_due")

    def __init__(self, name: object = None) -> None:
        self.was_due = False  # its last bucket was a due one (level -1)
        super().__init__()
        self.name = name
        self.filings = 0

    def _get_bucket(self) -> Bucket | None:
        bucket: Bucket | None = _BUCKET_SLOT.__get__(self, WheelEntry)
        return bucket

    def _set_bucket(self, bucket: Bucket | None) -> None:
        if bucket is not None:
            # The wheel re-links already-due entries into a sorted copy of the due
            # bucket (level -1) to hand them back in deadline order: not a move.
            if not (self.was_due and bucket.level == -1):
                self.filings += 1
            self.was_due = bucket.level == -1
        _BUCKET_SLOT.__set__(self, bucket)

    # Shadows WheelEntry's `_bucket` slot: every assignment the wheel makes is seen.
    _bucket = property(_get_bucket, _set_bucket)

    @property
    def moves(self) -> int:
        return self.filings - 1

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, deadline={self._deadline})"


# -- the Timer API tests ----------------------------------------------------------------

#: The tick of the timers these tests use (the test modules import it as ``TICK``).
TIMER_TICK = 0.001
# Slack for "at most one tick late" on virtual clocks: looptime counts whole
# microseconds (the asyncio driver rounds its wake-up up to one), and float sums of
# deadlines are off by ulps.
EPS = 2e-6


def assert_on_time(
    fired_at: float, deadline: float, virtual: bool, tick: float = TIMER_TICK
) -> None:
    """docs/design.md, guarantees 1 and 2: never early; on a virtual clock at most one tick late."""
    assert fired_at >= deadline, f"fired {deadline - fired_at:.9f} s early"
    if virtual:
        assert fired_at - deadline <= tick + EPS, f"fired {fired_at - deadline:.9f} s late"


class Probe:
    """A callback that records, per name, when it ran and its handle's deadline then."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.handles: dict[object, TimerHandle[Any]] = {}
        self.scheduled_at: dict[object, float] = {}
        self.runs: list[tuple[object, float, float]] = []  # (name, time(), deadline)

    def __call__(self, name: object) -> object:
        self.runs.append((name, self.timer.time(), self.handles[name].deadline))
        return name

    def schedule(self, delay: float, name: object) -> TimerHandle[Any]:
        self.scheduled_at[name] = self.timer.time()
        handle = self.timer.schedule_nowait(delay, self, name)
        self.handles[name] = handle
        return handle

    def names(self) -> list[object]:
        return [name for name, _, _ in self.runs]

    def at(self, name: object) -> float:
        (when,) = [at for n, at, _ in self.runs if n == name]
        return when

    def check(self, virtual: bool, tick: float = TIMER_TICK) -> None:
        """Every run was on time, and no name ran twice. A deadline already past when
        it was scheduled was due at once: lateness counts from then."""
        for name, fired_at, deadline in self.runs:
            assert_on_time(fired_at, deadline, virtual=False)
            due = max(deadline, self.scheduled_at.get(name, deadline))
            assert_on_time(fired_at, due, virtual, tick)
        assert len(self.names()) == len(set(self.names()))


def assert_deadline_order(deadlines_in_fire_order: list[float], tick: float = TIMER_TICK) -> None:
    """docs/design.md, guarantee 4: deadlines more than one tick apart fire in deadline order."""
    latest = -math.inf
    for deadline in deadlines_in_fire_order:
        assert deadline >= latest - tick - EPS, "a later deadline fired first"
        latest = max(latest, deadline)


async def arm(timer: Timer, variant: str, delay: float, callback: Any, *args: Any) -> Any:
    """Schedule through one of the four entry points."""
    if variant == "schedule":
        return await timer.schedule(delay, callback, *args)
    if variant == "schedule_nowait":
        return timer.schedule_nowait(delay, callback, *args)
    if variant == "schedule_at":
        return await timer.schedule_at(timer.time() + delay, callback, *args)
    assert variant == "schedule_at_nowait"
    return timer.schedule_at_nowait(timer.time() + delay, callback, *args)


VARIANTS = ["schedule", "schedule_nowait", "schedule_at", "schedule_at_nowait"]


def noop(*args: object) -> None:
    pass


# -- idle-timeout end-to-end helpers -------------------------------------------------------

T = 0.25  # the idle timeout under test
TICK = 0.01  # the tick of the timers these tests use
# Upper-side allowance. The strict bound is the lower one (never early); this one only
# says "not held for ever". In the full suite a garbage-collection pass after the
# million-operation tests can stall the process for half a second (seen in CI).
SLACK = 1.5


async def eventually(predicate: Callable[[], bool], within: float) -> None:
    """Poll ``predicate`` (state with no event to await, such as ``len(timer)``) until
    it holds; fail after ``within`` seconds."""
    deadline = anyio.current_time() + within
    while not predicate():  # no event exists for this state
        if anyio.current_time() > deadline:
            raise AssertionError(f"not true within {within} s: {predicate}")
        await anyio.sleep(0.005)


def assert_idle_window(elapsed: float, timeout: float = T) -> None:
    """Never early; late by at most a tick plus the slack."""
    # 1 ns of tolerance only absorbs float rounding: ``end - start`` may come out a hair
    # below ``timeout`` when ``end == start + timeout`` exactly (uvloop's clock ticks in
    # whole milliseconds).
    assert elapsed >= timeout - 1e-9, f"dropped {timeout - elapsed:.4f} s early"
    assert elapsed < timeout + TICK + SLACK, f"dropped {elapsed - timeout:.3f} s late"


def loopback_socket() -> socket.socket:
    """A listening-ready socket on 127.0.0.1, port 0. ``IPPROTO_TCP`` explicitly:
    asyncio sets TCP_NODELAY only on sockets that say so, and without it Nagle plus
    delayed ACKs stall small answers by about 40 ms."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def serve_uvicorn(app: Any, **config: Any) -> AsyncIterator[int]:
    """Serve ``app`` with uvicorn in the running asyncio loop; yield its port."""
    import uvicorn

    sock = loopback_socket()
    port: int = sock.getsockname()[1]
    options: dict[str, Any] = {
        "lifespan": "off",
        "log_level": "critical",
        "timeout_graceful_shutdown": 1,
    }
    options.update(config)
    server = uvicorn.Server(uvicorn.Config(app, **options))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:  # uvicorn offers a flag, not an event
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        yield port
    finally:
        server.should_exit = True
        await task


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes; ``b"<reset>"`` for a reset."""
    # Bounded: pytest-timeout's signal cannot interrupt a stuck uvloop.
    with anyio.fail_after(10):
        try:
            return await reader.read()
        except ConnectionResetError:
            return b"<reset>"


# -- re-entrancy ------------------------------------------------------------------------


@contextmanager
def at_next_collection(
    action: Callable[[], object], when: Callable[[], bool] = lambda: True
) -> Iterator[list[int]]:
    """Run ``action`` once from ``gc.callbacks``, at the first collection at which
    ``when()`` holds, the collector running at every allocation meanwhile."""
    fired: list[int] = []

    def hook(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and not fired and when():
            fired.append(1)
            action()

    threshold = gc.get_threshold()
    gc.callbacks.append(hook)
    gc.set_threshold(1, 1, 1)
    try:
        yield fired
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(hook)


class Expiries:
    """How many idle timers expired (the ``expiries`` fixture, tests/middleware/conftest.py)."""

    def __init__(self) -> None:
        self.count = 0


# -- a driver that wakes nobody (tests/test_engine.py, tests/test_copies_agree.py) ------


class RecordingDriver:
    """A driver that wakes nobody: it keeps the wake-ups it is asked for."""

    def __init__(self) -> None:
        self.armed: list[float] = []
        self.disarmed = 0
        self.rechecks: list[Callable[[], None]] = []
        self.stopped = False
        self._at: float | None = None

    async def start(self, tg: Any) -> None:
        pass

    def arm(self, when: float) -> None:
        self.armed.append(when)
        self._at = when

    def disarm(self) -> None:
        self.disarmed += 1
        self._at = None

    def armed_for(self, when: float) -> bool:
        # A driver that wakes nobody is armed for what it was last asked, if that
        # came after the last disarm.
        return self._at == when

    def clock_changed(self) -> None:
        self._at = None

    def recheck(self, check: Callable[[], None]) -> None:
        self.rechecks.append(check)

    def stop(self) -> None:
        self.stopped = True
