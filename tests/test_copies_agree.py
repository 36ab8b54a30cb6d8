"""The inline copies agree with the rules they copy.

The core keeps a few rules twice on its hot paths: the method that states the rule,
and an inline copy where a call would cost too much, each copy tagged with a comment
``inline copy of <the method>`` (the middleware's ``<Class.method>, inline``).
tests/test_module_map.py checks that a tag names a method; this file checks that the
copy does what the method does.

For every tagged copy, a hypothesis property test drives two timers with the same
program (schedule, cancel, reset, advance the clock; callbacks that return a value,
raise, return an awaitable, or cancel and re-arm other handles of their own timer):
timer A through the copy, timer B through the original, and after every operation
compares what can be seen of them: ``len()``, ``stats()``, each handle's state,
outcome and deadline, what the callbacks saw and what the driver was asked to arm.
Where the original is reachable only as a private method, B calls it:

* the pass (``_pass.run_due``): B's pass is ``fire_due``'s steps spelled with the
  originals, ``count_ran``, ``note_lateness`` and ``run_one`` (``_original_pass``);
* ``Timer.schedule_nowait``: B schedules through ``schedule_at_nowait``, which calls
  ``_live_on_owner_loop``, ``admit`` and ``file`` (``reserve_slot``,
  ``arm_if_earlier``, the closed-while-filing check);
* ``TimerLifecycle._cancel``: B cancels through ``_live_on_owner_loop`` and
  ``Engine.cancel``;
* ``TimerHandle.reset``'s lazy touch: B re-arms with a float subclass (the path
  through ``TimerLifecycle._is_owner_loop``) or through ``TimerLifecycle._reset``;
* ``Wheel._file``'s level: ``level_for`` on the tick the entry was filed for;
* the middleware's ``_RequestWatch``: ``IdleControl._init_idle`` and
  ``IdleControl.stop`` called on a twin.

The timers are started by hand, as tests/test_engine.py starts an engine: a driver
that only records what it is asked, a clock the test moves, and the pass called by
the test when the armed wake-up is reached. So each program is exact on asyncio and
trio alike, and A and B see the same instants. Operations run now and then from
another thread too: the owner check's copies must refuse exactly what the original
refuses, and change nothing.

What the copies may do differently, by design: the pass adds up ``fired`` and
``lateness_max`` in locals and writes them at the end (aiowheel/_state.py,
``count_ran``), so a callback sees ``len(timer)`` agree mid-pass but not
``stats().fired``; the callbacks here record ``len(timer)`` only.

``test_every_inline_copy_has_a_property_test`` lists every tag in the package and
fails when one has no test in ``COPY_TESTS`` (or an entry there has no tag).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import math
import re
import tokenize
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.to_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import RecordingDriver

import aiowheel
from aiowheel import Timer, TimerClosed, TimerHandle
from aiowheel._dispatch import WorkerPool
from aiowheel._driver import backend_name, make_backend
from aiowheel._engine import Engine
from aiowheel._handle import _CANCELLED, _PENDING, _RUNNING, _Failure
from aiowheel._pass import fire_due, run_one
from aiowheel._shutdown import close_engine
from aiowheel._wheel import HORIZON, Wheel, WheelEntry, level_for
from aiowheel.middleware._asgi import _RequestWatch
from aiowheel.middleware._shared import IdleControl

PACKAGE: Final = Path(aiowheel.__file__).parent
TICK: Final = 0.001
SIZE: Final = 8  # a small wheel: programs reach the overflow levels and cascades
ORIGIN: Final = 1000.0
MAX_REENTRIES: Final = 2
BACKENDS: Final = ["asyncio", "trio"]
#: Examples per property test and backend (a program runs in a few milliseconds).
EXAMPLES: Final = 300
_INF: Final = math.inf

# == the tags ===========================================================================

#: (module, the function holding the copy, the method it copies) -> the test that
#: drives the copy and the original with the same operations.
COPY_TESTS: Final[dict[tuple[str, str, str], str]] = {
    ("_pass", "run_due", "run_one"): "test_the_pass_agrees_with_run_one",
    ("_pass", "run_due", "TimerHandle._settle"): "test_the_pass_agrees_with_run_one",
    ("_pass", "run_due", "Engine.count_ran"): "test_the_pass_agrees_with_run_one",
    ("_pass", "run_due", "note_lateness"): "test_the_pass_agrees_with_run_one",
    ("_pass", "run_due", "Engine.note_lateness"): ("test_the_pass_agrees_with_run_one"),
    ("_timer", "Timer.schedule_nowait", "Affinity.here"): (
        "test_schedule_nowait_agrees_with_schedule_at_nowait"
    ),
    ("_timer", "Timer.schedule_nowait", "Engine.admit"): (
        "test_schedule_nowait_agrees_with_schedule_at_nowait"
    ),
    ("_timer", "Timer.schedule_nowait", "Engine.file"): (
        "test_schedule_nowait_agrees_with_schedule_at_nowait"
    ),
    ("_timer", "Timer.schedule_nowait", "Engine.reserve_slot"): (
        "test_schedule_nowait_agrees_with_schedule_at_nowait"
    ),
    ("_timer", "Timer.schedule_nowait", "Engine.arm_if_earlier"): (
        "test_schedule_nowait_agrees_with_schedule_at_nowait"
    ),
    ("_lifecycle", "TimerLifecycle._cancel", "Engine.cancel"): (
        "test_cancel_agrees_with_engine_cancel"
    ),
    ("_lifecycle", "TimerLifecycle._cancel", "Affinity.here"): (
        "test_cancel_agrees_with_engine_cancel"
    ),
    ("_lifecycle", "TimerLifecycle._cancel", "TimerHandle._become_cancelled"): (
        "test_cancel_agrees_with_engine_cancel"
    ),
    ("_lifecycle", "TimerLifecycle._cancel", "Engine.count_cancelled"): (
        "test_cancel_agrees_with_engine_cancel"
    ),
    ("_handle", "TimerHandle.reset", "TimerLifecycle._is_owner_loop"): (
        "test_the_inline_reset_agrees_with_the_timers_reset"
    ),
    ("_wheel", "Wheel._file", "level_for"): "test_the_filing_level_agrees_with_level_for",
    ("middleware._asgi", "_RequestWatch.__init__", "IdleControl._init_idle"): (
        "test_request_watch_init_agrees_with_init_idle"
    ),
    ("middleware._asgi", "_RequestWatch.stop", "IdleControl.stop"): (
        "test_request_watch_stop_agrees_with_idle_control_stop"
    ),
}

_TAG: Final = re.compile(r"inline copy of (.*)", re.IGNORECASE)
# The middleware spells a copy "# Class.method, inline".
_MIDDLEWARE_TAG: Final = re.compile(r"#\s*([A-Z]\w*\.\w+), inline\b")
_NAME: Final = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _named(text: str) -> str | None:
    """The method a tag's text names: its first dotted or underscored name."""
    for match in _NAME.finditer(text):
        if "." in match.group() or "_" in match.group():
            return match.group()
    return None


def _functions(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function, innermost last."""
    found: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, f"{name}.")

    visit(tree, "")
    return found


def tags_in(path: Path, module: str) -> Iterator[tuple[tuple[str, str, str], int]]:
    """Each tagged copy in ``path``: ((module, function, method copied), line). Only
    comments count: a docstring that mentions a copy is not one."""
    source = path.read_text()
    functions = _functions(ast.parse(source, str(path)))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        named: str | None = None
        match = _TAG.search(token.string)
        if match is not None:
            named = _named(match.group(1))
        elif module.startswith("middleware."):
            middleware = _MIDDLEWARE_TAG.search(token.string)
            named = middleware.group(1) if middleware is not None else None
        if named is None:
            continue
        holders = [name for first, last, name in functions if first <= line <= last]
        assert holders, f"{module}.py:{line}: a tagged copy outside any function"
        yield (module, holders[-1], named), line


def all_tags() -> dict[tuple[str, str, str], list[int]]:
    found: dict[tuple[str, str, str], list[int]] = {}
    paths = [(path, path.stem) for path in sorted(PACKAGE.glob("*.py"))]
    paths += [(path, f"middleware.{path.stem}") for path in sorted(PACKAGE.glob("middleware/*.py"))]
    for path, module in paths:
        for key, line in tags_in(path, module):
            found.setdefault(key, []).append(line)
    return found


def test_every_inline_copy_has_a_property_test() -> None:
    """Every tagged copy in the package has its property test here, and every entry of
    ``COPY_TESTS`` is a tag that still exists (a stale entry would hide a new copy)."""
    found = all_tags()
    untested = sorted(key for key in found if key not in COPY_TESTS)
    assert untested == [], f"tagged inline copies without a property test: {untested}"
    stale = sorted(key for key in COPY_TESTS if key not in found)
    assert stale == [], f"COPY_TESTS names copies that are no longer tagged: {stale}"
    for name in set(COPY_TESTS.values()):
        assert callable(globals().get(name)), name


def test_each_tag_names_a_method_of_the_package() -> None:
    """What a tag names exists: ``Class.method`` a method of a class of the package, a
    bare name a function or method of it."""
    defined: set[str] = set()
    for path in [*PACKAGE.glob("*.py"), *PACKAGE.glob("middleware/*.py")]:
        for _first, _last, name in _functions(ast.parse(path.read_text(), str(path))):
            parts = name.split(".")
            defined.add(parts[-1])
            if len(parts) >= 2:
                defined.add(".".join(parts[-2:]))
    for (_module, _function, method), _lines in all_tags().items():
        assert method in defined, method


def test_the_tag_scan_sees_a_copy_in_a_function(tmp_path: Path) -> None:
    """The scan above finds a tag in a comment, names its function and method, and
    skips a docstring's mention; the middleware's spelling counts in its modules."""
    path = tmp_path / "probe.py"
    path.write_text(
        'class C:\n    def f(self):\n        """An inline copy of Nothing.here."""\n'
        "        x = 1  # inline copy of the owner check (Owner.check)\n"
        "        y = 2  # Control.stop, inline\n"
    )
    assert list(tags_in(path, "_probe")) == [(("_probe", "C.f", "Owner.check"), 4)]
    assert list(tags_in(path, "middleware._probe")) == [
        (("middleware._probe", "C.f", "Owner.check"), 4),
        (("middleware._probe", "C.f", "Control.stop"), 5),
    ]


# == two timers, started by hand ========================================================


class Seconds(float):
    """A float that is not ``float``: ``TimerHandle.reset`` takes it past its inline
    owner check, through ``TimerLifecycle._is_owner_loop``."""

    __slots__ = ()


@dataclass
class Side:
    """One of the two timers, with its handles and what its callbacks saw."""

    timer: Timer
    live: Engine
    driver: RecordingDriver
    now: float = ORIGIN
    handles: list[TimerHandle[Any]] = field(default_factory=list)
    log: list[tuple[Any, ...]] = field(default_factory=list)
    # How this side schedules, cancels, re-arms and runs a pass: the copy or the
    # original (set by each test).
    schedule: Callable[[Side, float, Callable[..., Any]], TimerHandle[Any]] = field(
        default=lambda side, delay, callback: side.timer.schedule_nowait(delay, callback)
    )
    cancel: Callable[[Side, TimerHandle[Any]], bool] = field(
        default=lambda side, handle: handle.cancel()
    )
    reset: Callable[[Side, TimerHandle[Any], float], None] = field(
        default=lambda side, handle, delay: handle.reset(delay)
    )
    fire: Callable[[Side], None] = field(default=lambda side: fire_due(side.live))
    # The original may create wheel levels the copy does not (see _timer_reset_side):
    # then stats().levels is left out of the comparison.
    same_levels: bool = True

    def clock(self) -> float:
        return self.now


@asynccontextmanager
async def started(limit: int | None) -> AsyncIterator[Side]:
    """A started ``Timer`` on a recording driver and a clock the test moves (the wheel
    built again on that clock, so that two sides share their ticks)."""
    errors: list[tuple[Any, ...]] = []  # on_error's reports, then the callbacks'
    timer = Timer(tick=TICK, wheel_size=SIZE, max_pending=limit, on_error=_on_error(errors))
    async with anyio.create_task_group() as tg:
        backend = make_backend(backend_name(), tg)
        live = timer._new_engine(backend)
        driver = RecordingDriver()
        side = Side(timer, live, driver, log=errors)
        live.driver = driver
        live.clock = side.clock
        live.wheel = Wheel(TICK, SIZE, ORIGIN)
        live.pool = WorkerPool(live, 4, backend)
        timer._started(live)
        try:
            yield side
        finally:
            if not live.closed:
                close_engine(live)
            await live.pool.join()


def _on_error(log: list[Any]) -> Callable[[TimerHandle[Any], BaseException], None]:
    def on_error(handle: TimerHandle[Any], exc: BaseException) -> None:
        log.append(("error", type(exc).__name__, str(exc)))

    return on_error


def outcome(handle: TimerHandle[Any]) -> object:
    """A handle's ``_result``, comparable across two timers."""
    result = handle._result
    if result is _PENDING:
        return "pending"
    if result is _CANCELLED:
        return "cancelled"
    if result is _RUNNING:
        return "running"
    if type(result) is _Failure:
        return ("failure", type(result.exc).__name__, str(result.exc))
    if hasattr(type(result), "__await__"):
        return "queued"
    return ("value", result)


def observe(side: Side) -> tuple[Any, ...]:
    """Everything the two sides must agree on."""
    stats = side.timer.stats()
    if not side.same_levels:
        stats = dataclasses.replace(stats, levels=-1)
    handles = [
        (h.pending(), h.fired(), h.cancelled(), h.deadline, outcome(h)) for h in side.handles
    ]
    return (
        len(side.timer),
        stats,
        handles,
        list(side.log),
        list(side.driver.armed),
        side.driver.disarmed,
        side.live.wake_at,
        side.live.closed,
    )


# -- the program ---------------------------------------------------------------------

# No positive delay so small that now + delay == now: schedule_nowait files such a
# timer for the next tick (its delay is positive), schedule_at_nowait at that deadline
# as due now (the deadline is not in the future). Both are never early; they are two
# rules, not a copy and its original.
DELAYS: Final = st.one_of(
    st.sampled_from([-0.5, -0.001, 0.0, 0.0005, 0.001, 0.0015, 0.0079, 0.008, 0.064]),
    st.sampled_from([0.0021, 0.0105, 0.07, 0.3, 0.512, 4.0, 5e3, 1e7]),
    st.floats(-0.01, 2.0, allow_nan=False).filter(lambda delay: delay <= 0 or delay >= 1e-9),
)
STEPS: Final = st.one_of(
    st.sampled_from([0.0, 0.0004, 0.001, 0.0025, 0.008, 0.05, 0.6, 4.1]),
    st.floats(0.0, 1.0, allow_nan=False),
)
KINDS: Final = st.sampled_from(["value", "raise", "async", "cancel_other", "reset_other"])


@dataclass(frozen=True)
class Schedule:
    delay: float
    kind: str
    other: int  # the handle a re-entrant callback cancels or re-arms
    other_delay: float
    foreign: bool  # called from another thread


@dataclass(frozen=True)
class Cancel:
    index: int
    foreign: bool


@dataclass(frozen=True)
class Reset:
    index: int
    delay: float
    foreign: bool


@dataclass(frozen=True)
class Advance:
    step: float


@dataclass(frozen=True)
class CloseWhileFiling:
    """Schedule, while a garbage collection on the way closes the timer."""

    delay: float


FOREIGN: Final = st.sampled_from([False] * 9 + [True])
SCHEDULE: Final = st.builds(Schedule, DELAYS, KINDS, st.integers(0, 30), DELAYS, FOREIGN)
CANCEL: Final = st.builds(Cancel, st.integers(0, 30), FOREIGN)
RESET: Final = st.builds(Reset, st.integers(0, 30), DELAYS, FOREIGN)
ADVANCE: Final = st.builds(Advance, STEPS)
Op = Schedule | Cancel | Reset | Advance | CloseWhileFiling
PROGRAMS: Final = st.lists(
    st.one_of(SCHEDULE, SCHEDULE, CANCEL, RESET, ADVANCE), min_size=6, max_size=40
)
LIMITS: Final = st.sampled_from([None, 2, 4, 8])


def callback_for(side: Side, index: int, op: Schedule) -> Callable[..., Any]:
    """The callback of the ``index``-th handle: what it does is ``op.kind``; it records
    when it ran and ``len(timer)`` then."""

    def seen() -> None:
        side.log.append(("ran", index, side.now, len(side.timer)))

    def other() -> TimerHandle[Any] | None:
        return side.handles[op.other % len(side.handles)] if side.handles else None

    if op.kind == "async":

        async def run_async() -> int:
            seen()
            return index

        return run_async

    runs: list[int] = []

    def run() -> int:
        seen()
        if op.kind == "raise":
            raise ValueError(index)
        runs.append(1)
        # A callback that re-arms itself as due runs again in the next pass: the
        # re-entrant part runs MAX_REENTRIES times, so that every program ends.
        handle = other() if len(runs) <= MAX_REENTRIES else None
        if op.kind == "cancel_other" and handle is not None:
            side.log.append(("cancelled", side.cancel(side, handle)))
        elif op.kind == "reset_other" and handle is not None:
            _attempt(side, lambda: side.reset(side, handle, op.other_delay))
        return index

    return run


def _attempt(side: Side, call: Callable[[], object]) -> object:
    """Run ``call``; an exception is logged (type and message) and returned as None."""
    try:
        result = call()
    except (RuntimeError, ValueError, TimerClosed, aiowheel.TimerFull) as exc:
        side.log.append(("raised", type(exc).__name__, str(exc)))
        return None
    side.log.append(("returned", result if isinstance(result, bool) else None))
    return result


async def _call(side: Side, call: Callable[[], object], foreign: bool) -> object:
    if foreign:
        return await anyio.to_thread.run_sync(_attempt, side, call)
    return _attempt(side, call)


async def apply(side: Side, op: Op) -> None:
    """Run one operation on one side, then what the real driver would do: the deferred
    re-checks, the pass once the armed wake-up is reached, the workers' steps."""
    if isinstance(op, Schedule):
        callback = callback_for(side, len(side.handles), op)
        handle = await _call(side, lambda: side.schedule(side, op.delay, callback), op.foreign)
        if isinstance(handle, TimerHandle):
            side.handles.append(handle)
    elif isinstance(op, CloseWhileFiling) and not aiowheel.COMPILED:
        callback = callback_for(side, len(side.handles), Schedule(op.delay, "value", 0, 0, False))
        with closing_on_insert(partial(close_engine, side.live)):
            handle = _attempt(side, lambda: side.schedule(side, op.delay, callback))
        if isinstance(handle, TimerHandle):
            side.handles.append(handle)
    elif isinstance(op, Cancel) and side.handles:
        target = side.handles[op.index % len(side.handles)]
        await _call(side, lambda: side.cancel(side, target), op.foreign)
    elif isinstance(op, Reset) and side.handles:
        target = side.handles[op.index % len(side.handles)]
        await _call(side, lambda: side.reset(side, target, op.delay), op.foreign)
    elif isinstance(op, Advance):
        side.now += op.step
    await settle(side)


@contextmanager
def closing_on_insert(close: Callable[[], object]) -> Iterator[None]:
    """The next filing closes the timer on its way in, as a finalizer run by a
    collection at one of its allocations would (docs/design.md, "Re-entrancy"). The
    pure core's ``Wheel`` only: a compiled class's methods cannot be replaced."""
    originals = {name: getattr(Wheel, name) for name in ("insert", "insert_due")}
    closed: list[int] = []

    def closing(name: str) -> Callable[..., float]:
        def filing(wheel: Wheel, entry: WheelEntry, deadline: float) -> float:
            if not closed:
                closed.append(1)
                close()
            result: float = originals[name](wheel, entry, deadline)
            return result

        return filing

    for name in originals:
        setattr(Wheel, name, closing(name))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(Wheel, name, method)


async def settle(side: Side) -> None:
    live = side.live
    for _ in range(100):
        rechecks, side.driver.rechecks = side.driver.rechecks, []
        for check in rechecks:
            check()
        if not live.closed and live.wake_at <= side.now:
            side.fire(side)
        await anyio.wait_all_tasks_blocked()
        if live.closed or (not side.driver.rechecks and live.wake_at > side.now):
            return
    raise AssertionError("the timer did not settle in 100 passes")


async def run_twins(
    copy: Callable[[Side], None],
    original: Callable[[Side], None],
    program: list[Op],
    limit: int | None,
) -> None:
    async with started(limit) as a, started(limit) as b:
        copy(a)
        original(b)
        a.same_levels = b.same_levels
        for step, op in enumerate(program):
            await apply(a, op)
            await apply(b, op)
            assert observe(a) == observe(b), (step, op)
            if not a.live.closed:
                a.timer._check()
                b.timer._check()
        if not a.live.closed:
            closed_a = [a.handles.index(h) for h in close_engine(a.live)]
            closed_b = [b.handles.index(h) for h in close_engine(b.live)]
            assert closed_a == closed_b
        assert observe(a) == observe(b)


def check_twins(
    backend: str,
    copy: Callable[[Side], None],
    original: Callable[[Side], None],
    program: list[Op],
    limit: int | None,
) -> None:
    try:
        anyio.run(run_twins, copy, original, program, limit, backend=backend)
    except BaseExceptionGroup as group:
        # The task groups wrap what failed: one failure is shown as itself (what
        # hypothesis then shrinks and reports).
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found


PROPERTY: Final = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
ON_BACKENDS: Final = pytest.mark.parametrize("backend", BACKENDS)


def _as_is(side: Side) -> None:
    """The public paths, through the copies."""


# -- the pass: _pass.run_due's copies of run_one, _settle, count_ran, note_lateness ----


def _original_pass(side: Side) -> None:
    """``_pass.fire_due`` with its ``run_due`` spelled with the originals: per handle
    ``count_ran``, ``note_lateness`` and ``run_one`` (which settles through
    ``TimerHandle._settle``). No fault handling: the programs here raise nothing past
    ``on_error``."""
    live = side.live
    if live.closed:
        return
    live.wake_at = -_INF
    live.passing = True
    live.wakeups += 1
    try:
        now = live.clock()
        for bucket in live.wheel.advance(now):
            while True:
                handle = bucket.pop_first()
                if handle is None:
                    break
                assert isinstance(handle, TimerHandle)
                live.count_ran()
                live.note_lateness(handle, now)
                run_one(live, handle, now)
    finally:
        live.wake_at = _INF
        live.passing = False
        if not live.closed:
            live.wheel.release()
            live.sync_wakeup()
        live.pending_fell()


def _original_pass_side(side: Side) -> None:
    side.fire = _original_pass


@ON_BACKENDS
@PROPERTY
@given(program=PROGRAMS, limit=LIMITS)
def test_the_pass_agrees_with_run_one(backend: str, program: list[Op], limit: int | None) -> None:
    """The pass's inline *run one* (``_pass.run_due``: the count, the lateness, the
    call, the settling) does what ``count_ran``, ``note_lateness`` and ``run_one`` do."""
    check_twins(backend, _as_is, _original_pass_side, program, limit)


# -- Timer.schedule_nowait's copies: the owner check, admission, filing, the wake-up ----


def _schedule_at(side: Side, delay: float, callback: Callable[..., Any]) -> TimerHandle[Any]:
    # The clock schedule_nowait reads (timer.time() also wants a running loop, which a
    # foreign thread has not).
    return side.timer.schedule_at_nowait(side.timer._now() + delay, callback)


def _schedule_at_side(side: Side) -> None:
    side.schedule = _schedule_at


CLOSE_WHILE_FILING: Final = st.builds(CloseWhileFiling, DELAYS)
SCHEDULING_PROGRAMS: Final = st.lists(
    st.one_of(SCHEDULE, SCHEDULE, SCHEDULE, CANCEL, ADVANCE, CLOSE_WHILE_FILING),
    min_size=6,
    max_size=40,
)


@ON_BACKENDS
@PROPERTY
@given(program=SCHEDULING_PROGRAMS, limit=LIMITS)
def test_schedule_nowait_agrees_with_schedule_at_nowait(
    backend: str, program: list[Op], limit: int | None
) -> None:
    """``schedule_nowait``'s inline owner check, admission, closed-while-filing check,
    count and arm-if-earlier do what ``schedule_at_nowait`` does through
    ``_live_on_owner_loop``, ``admit`` and ``file`` (the timer full, a foreign thread,
    the timer closed by a collection while filing included)."""
    check_twins(backend, _as_is, _schedule_at_side, program, limit)


# -- TimerLifecycle._cancel's copies: the owner check, the cancel, its count ------------


def _engine_cancel(side: Side, handle: TimerHandle[Any]) -> bool:
    if handle._bucket is None:  # TimerHandle.cancel's own test, before the timer's
        side.timer._require_owner_loop()  # nothing to stop: the owner check alone
        return False
    live = side.timer._live
    if live is None:
        return False
    return side.timer._live_on_owner_loop().cancel(handle)


def _engine_cancel_side(side: Side) -> None:
    side.cancel = _engine_cancel


@ON_BACKENDS
@PROPERTY
@given(program=PROGRAMS, limit=LIMITS)
def test_cancel_agrees_with_engine_cancel(
    backend: str, program: list[Op], limit: int | None
) -> None:
    """``TimerLifecycle._cancel``'s inline owner check and cancel (``_become_cancelled``,
    ``count_cancelled``) do what ``_live_on_owner_loop`` and ``Engine.cancel``
    do, callbacks that cancel other handles mid-pass and queued async callbacks
    included."""
    check_twins(backend, _as_is, _engine_cancel_side, program, limit)


# -- TimerHandle.reset's lazy touch and its copy of the owner check --------------------


def _reset_through_owner_loop(side: Side, handle: TimerHandle[Any], delay: float) -> None:
    handle.reset(Seconds(delay))


def _reset_through_timer(side: Side, handle: TimerHandle[Any], delay: float) -> None:
    side.timer._reset(handle, delay)


def _owner_loop_side(side: Side) -> None:
    side.reset = _reset_through_owner_loop


def _timer_reset_side(side: Side) -> None:
    side.reset = _reset_through_timer
    # The one difference, by construction: _reset goes through Engine.rearm, which
    # creates the levels a deadline needs (Wheel.reserve) before it finds the lazy
    # case; the inline touch creates none (the wheel does when the entry is re-filed).
    # test_a_lazy_touch_creates_no_level pins it.
    side.same_levels = False


RESET_PROGRAMS: Final = st.lists(
    st.one_of(SCHEDULE, RESET, RESET, RESET, CANCEL, ADVANCE), min_size=6, max_size=40
)


@ON_BACKENDS
@pytest.mark.parametrize(
    "original", [_owner_loop_side, _timer_reset_side], ids=["_is_owner_loop", "_reset"]
)
@PROPERTY
@given(program=RESET_PROGRAMS, limit=LIMITS)
def test_the_inline_reset_agrees_with_the_timers_reset(
    backend: str, original: Callable[[Side], None], program: list[Op], limit: int | None
) -> None:
    """``TimerHandle.reset`` with a float (the lazy touch and its inline owner check)
    does what it does with another real number (through
    ``TimerLifecycle._is_owner_loop``) and what ``TimerLifecycle._reset`` does
    (``_live_on_owner_loop``, ``Engine.rearm``, ``Wheel.extend``'s lazy case),
    from a foreign thread too."""
    check_twins(backend, _as_is, original, program, limit)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Engine.rearm reserves the deadline's levels before the lazy case; the "
    "inline touch does not (a disagreement of the copy, reported, not fixed here)",
)
@ON_BACKENDS
def test_a_lazy_touch_and_reset_agree_on_the_levels(backend: str) -> None:
    """The lazy touch and ``TimerLifecycle._reset`` leave ``stats().levels`` alike (the
    smallest program hypothesis found where they do not)."""
    program: list[Op] = [
        Schedule(0.3, "value", 0, 0.0, False),
        Reset(0, 0.512, False),
    ]

    def _all_levels(side: Side) -> None:
        _timer_reset_side(side)
        side.same_levels = True

    check_twins(backend, _as_is, _all_levels, program, None)


# -- Wheel._file's level: the copy of level_for -----------------------------------------


@PROPERTY
@given(
    size=st.integers(2, 9),
    program=st.lists(
        st.one_of(
            st.tuples(st.just("file"), st.integers(-3, 10**6)),
            st.tuples(st.just("far"), st.integers(0, 2**50)),
            st.tuples(st.just("advance"), st.integers(0, 5000)),
        ),
        max_size=60,
    ),
)
def test_the_filing_level_agrees_with_level_for(size: int, program: list[tuple[str, int]]) -> None:
    """``Wheel._file`` files an entry due at tick ``e`` on ``level_for(now, e, size)``,
    over the windows the wheel keeps as its clock moves (ticks of 1.0 from origin 0:
    a deadline is its tick)."""
    wheel = Wheel(1.0, size, 0.0)
    for verb, value in program:
        if verb == "advance":
            for expired in wheel.advance(float(wheel._now + value)):
                while expired.pop_first() is not None:
                    pass
            wheel.release()
            continue
        e = wheel._now + value if verb == "file" else value
        entry = WheelEntry()
        wheel.insert(entry, float(e))
        bucket = entry._bucket
        assert bucket is not None
        if e <= wheel._now:
            assert bucket.level < 0  # due: not on a level
        elif e > wheel._now + HORIZON:
            assert bucket.level < 0  # the far bucket
        else:
            assert bucket.level == level_for(wheel._now, e, size), (e, wheel._now)


# -- the middleware's _RequestWatch: copies of IdleControl's _init_idle and stop ----------

_IDLE_SLOTS: Final = IdleControl.__slots__


def _idle_state(control: IdleControl) -> dict[str, object]:
    return {name: getattr(control, name, "<unset>") for name in _IDLE_SLOTS}


def _new_watch(timeout: float | None) -> _RequestWatch:
    return _RequestWatch(
        None,  # type: ignore[arg-type]  # a timer is stored, not used, here
        _clock,
        timeout,
        _Target(),  # what expiry cancels: not reached here
        None,
        _receive,
        _send,
    )


def _clock() -> float:
    return ORIGIN


class _Target:
    def cancel(self) -> None:  # pragma: no cover - never called
        pass


async def _receive() -> MutableMapping[str, Any]:  # pragma: no cover - never called
    return {}


async def _send(message: MutableMapping[str, Any]) -> None:  # pragma: no cover - never called
    pass


@PROPERTY
@given(timeout=st.one_of(st.none(), st.floats(0.0, 1e9, allow_nan=False)))
def test_request_watch_init_agrees_with_init_idle(timeout: float | None) -> None:
    """``_RequestWatch.__init__`` sets IdleControl's slots as ``_init_idle`` does."""
    copy = _new_watch(timeout)
    original = _new_watch(timeout)
    for name in _IDLE_SLOTS:
        object.__setattr__(original, name, "stale")
    IdleControl._init_idle(original, None, _clock, timeout)
    assert _idle_state(copy) == _idle_state(original)


class _Holder(IdleControl):
    """A control holding another one: records ``release``."""

    __slots__ = ("released",)

    def __init__(self) -> None:
        self._init_idle(None, _clock, 1.0)
        self.released: list[IdleControl] = []

    def release(self, control: IdleControl) -> None:
        self.released.append(control)


class _Handle:
    """A filed handle: records ``cancel``."""

    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> bool:
        self.cancels += 1
        return True


@PROPERTY
@given(
    holder=st.sampled_from(["none", "self", "other"]),
    has_handle=st.booleans(),
    deadline=st.floats(0.0, 1e6, allow_nan=False),
)
def test_request_watch_stop_agrees_with_idle_control_stop(
    holder: str, has_handle: bool, deadline: float
) -> None:
    """``_RequestWatch.stop`` does to IdleControl's slots, the holder and the handle what
    ``IdleControl.stop`` does (and clears the body deadline besides)."""
    outcomes = []
    for stop in (_RequestWatch.stop, IdleControl.stop):
        watch = _new_watch(1.0)
        other = _Holder()
        handle = _Handle()
        watch._deadline = deadline
        watch._holder = {"none": None, "self": watch, "other": other}[holder]
        watch._handle = handle if has_handle else None  # type: ignore[assignment]
        stop(watch)
        state = _idle_state(watch)
        state["_holder"] = state["_holder"] is not None
        outcomes.append((state, len(other.released), handle.cancels))
    assert outcomes[0] == outcomes[1]
