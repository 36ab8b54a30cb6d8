"""How a contender runs: its timer operations inside a fresh event loop of its backend.

Every repetition runs in a fresh event loop (``asyncio.new_event_loop()``,
``uvloop.new_event_loop()``, ``rloop.new_event_loop()``,
``aiowheel.new_event_loop(base=...)`` for the ``loop-*`` contenders, or a new
``trio.run``) after a full ``gc.collect()``.

The ``Env`` handed to a workload gives it each contender's timer operations as plain
bound callables, so the timed loops call the contender's own API with no adapter
layer in between: for aiowheel ``schedule`` *is* ``timer.schedule_nowait``, for
``call_later`` it *is* ``loop.call_later``. Only in a traced repetition (``--trace``)
are the ``call_later`` and trio callables wrapped, to record each timer as it ends;
traced repetitions are never measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import math
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiowheel

from .contenders import Contender

__all__ = [
    "Env",
    "GcClock",
    "TraceFactory",
    "TrioNativeTimers",
    "open_env",
    "parquet_recorder",
    "percentile",
    "run_fresh",
]


class GcClock:
    """Time spent in the cyclic garbage collector while installed (``gc.callbacks``:
    from each collection's start to its stop), and how many collections ran."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._start = 0.0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1


def run_fresh(
    backend: str, fn: Callable[[], Coroutine[Any, Any, Any]], *, drop_in: bool = False
) -> Any:
    """Run ``fn()`` to completion in a brand-new event loop of ``backend``
    (``drop_in``: aiowheel's drop-in loop on that base, ``aiowheel.new_event_loop``)."""
    gc.collect()
    if backend == "trio":
        import trio

        try:
            return trio.run(fn)
        except BaseExceptionGroup as group:
            # Ctrl-C inside a nursery (trio-native's timers, aiowheel's driver) comes
            # out wrapped in a group: a plain KeyboardInterrupt, so that the command
            # ends in its one line, not the group's traceback.
            if group.subgroup(KeyboardInterrupt) is not None:
                raise KeyboardInterrupt from None
            raise
    loop: asyncio.AbstractEventLoop
    if drop_in:
        loop = aiowheel.new_event_loop(base=backend)
    elif backend == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    elif backend == "rloop":
        # Imported by name: rloop ships no type information.
        loop = importlib.import_module("rloop").new_event_loop()
        _own_self_pipe(loop)
    elif backend == "asyncio":
        loop = asyncio.new_event_loop()
    else:
        raise ValueError(f"unknown backend {backend!r}")
    task = loop.create_task(fn())
    try:
        return loop.run_until_complete(task)
    except KeyboardInterrupt:
        # Ctrl-C: the command ends in one line (cli.run). When the signal landed
        # outside the workload's task (in the selector, in a timer callback), the task
        # is left half-way: cancel it and let it unwind here, in its own task, or its
        # async context managers are closed at exit from another one (anyio:
        # "Attempted to exit cancel scope in a different task"; "generator didn't stop
        # after athrow()"), with tracebacks under that line. Nothing of it is news.
        loop.set_exception_handler(_quiet)
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        raise
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _own_self_pipe(loop: Any) -> None:
    """rloop (0.5) closes the descriptors of its self-pipe (a socket pair made anew by
    each ``run_forever``) when the run ends, in its Rust core, and drops the Python
    sockets that still hold them: each then warns "unclosed socket" when collected and
    closes its number again, by then perhaps another file's. Detach them once their
    descriptors are closed."""
    stop = loop._ssock_stop

    def ssock_stop() -> None:
        pair = (loop._ssock_r, loop._ssock_w)
        stop()
        for sock in pair:
            if sock is not None:
                sock.detach()

    loop._ssock_stop = ssock_stop


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """An exception handler for a loop being given up after Ctrl-C."""


# -- tracing ------------------------------------------------------------------------


class TraceFactory(Protocol):
    """Builds the recorder of one traced repetition (``aiowheel.trace.ParquetRecorder``
    by default; tests pass a stand-in)."""

    def __call__(
        self, path: str, *, run_id: str, implementation: str
    ) -> aiowheel.TraceRecorder: ...


def parquet_recorder(path: str, *, run_id: str, implementation: str) -> aiowheel.TraceRecorder:
    # Imported here: pyarrow is needed only when tracing.
    from aiowheel.trace import ParquetRecorder

    return ParquetRecorder(path, run_id=run_id, implementation=implementation)


def measured_recorder(directory: str, every: int) -> aiowheel.TraceRecorder:
    """The recorder of a measured repetition of a ``-traced`` (``every`` 1) or
    ``-sampled`` contender: a ``ParquetRecorder`` into ``directory``."""
    from aiowheel.trace import ParquetRecorder

    return ParquetRecorder(directory, run_id="measured", every=every)


class _TracedCall:
    """A ``call_later`` timer in a traced repetition: records itself when it ends."""

    __slots__ = ("args", "callback", "deadline", "done", "handle", "id", "scheduled_at", "tracer")

    def __init__(
        self, tracer: _CallLaterTracer, callback: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self.tracer = tracer
        self.callback = callback
        self.args = args
        self.done = False
        self.id = 0
        self.scheduled_at = 0.0
        self.deadline = 0.0
        self.handle: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        if self.done:
            return
        self.done = True
        assert self.handle is not None
        self.handle.cancel()
        self.tracer.ended(self, None, self.tracer.clock())


class _CallLaterTracer:
    """Wraps ``loop.call_later``/``call_at`` to record each timer as it ends (level -1:
    no wheel)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, recorder: aiowheel.TraceRecorder) -> None:
        self.loop = loop
        self.recorder = recorder
        self.clock = loop.time
        self.live: dict[int, _TracedCall] = {}
        self.next_id = 1

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> _TracedCall:
        call = _TracedCall(self, callback, args)
        call.id = self.next_id
        self.next_id += 1
        call.scheduled_at = self.clock()
        call.deadline = when
        call.handle = self.loop.call_at(when, self._fire, call)
        self.live[call.id] = call
        return call

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _TracedCall:
        return self.call_at(self.clock() + delay, callback, *args)

    def _fire(self, call: _TracedCall) -> None:
        call.done = True
        self.ended(call, self.clock(), None)
        call.callback(*call.args)

    def ended(self, call: _TracedCall, fired_at: float | None, cancelled_at: float | None) -> None:
        del self.live[call.id]
        self.recorder.record(
            call.id, None, call.scheduled_at, call.deadline, -1, fired_at, cancelled_at
        )

    def finish(self) -> None:
        # Timers still pending when the repetition ends are cancelled, as aiowheel's
        # aclose() cancels (and records) its pending timers.
        for call in list(self.live.values()):
            call.cancel()


# -- trio's native timers ---------------------------------------------------------------


class TrioTimer:
    """One trio-native timer: a task sleeping in a ``CancelScope`` with the deadline.

    ``cancel()`` cancels the scope (the task wakes and exits without calling back);
    ``reset(delay)`` assigns ``scope.deadline``, which is how trio re-arms (lazily:
    the old heap entry is skipped when it surfaces).
    """

    __slots__ = ("args", "callback", "cancelled", "id", "owner", "scheduled_at", "scope")

    def __init__(
        self,
        owner: TrioNativeTimers,
        deadline: float,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> None:
        import trio

        self.owner = owner
        self.scope = trio.CancelScope(deadline=deadline)
        self.callback = callback
        self.args = args
        self.cancelled = False
        self.id = 0
        self.scheduled_at = 0.0

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.scope.cancel()

    def reset(self, delay: float) -> None:
        # Once trio has delivered the deadline's cancellation (``cancel_called``) the
        # task wakes and the timer fires whatever the deadline says now: a re-arm
        # then comes too late, and is not written. (Written, the trace recorded the
        # new deadline with the old firing: 17 re-armed timers 30 s *early*.)
        if not self.scope.cancel_called:
            self.scope.deadline = self.owner.clock() + delay

    @property
    def deadline(self) -> float:
        return self.scope.deadline


class TrioNativeTimers:
    """Schedules trio-native timers (a task each) in one nursery."""

    def __init__(self, nursery: Any, recorder: aiowheel.TraceRecorder | None = None) -> None:
        import trio

        self.nursery = nursery
        self.clock = trio.current_time
        self.recorder = recorder
        self._spawn = nursery.start_soon
        self._next_id = 1
        self._sleep_forever = trio.sleep_forever
        self.live = 0

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> TrioTimer:
        timer = TrioTimer(self, when, callback, args)
        if self.recorder is not None:
            timer.id = self._next_id
            self._next_id += 1
            timer.scheduled_at = self.clock()
        self.live += 1
        self._spawn(self._run, timer)
        return timer

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TrioTimer:
        return self.call_at(self.clock() + delay, callback, *args)

    async def _run(self, timer: TrioTimer) -> None:
        try:
            with timer.scope:
                await self._sleep_forever()
        finally:
            self.live -= 1
            if self.recorder is not None:
                now = self.clock()
                fired = not timer.cancelled and timer.scope.cancelled_caught
                self.recorder.record(
                    timer.id,
                    None,
                    timer.scheduled_at,
                    timer.scope.deadline,
                    -1,
                    now if fired else None,
                    None if fired else now,
                )
        if not timer.cancelled:
            timer.callback(*timer.args)


# -- the environment a workload runs in -------------------------------------------------


@dataclass
class Env:
    """One contender's timer operations inside a running event loop.

    ``call_later(delay, cb, *args)`` and ``call_at(when, cb, *args)`` return a handle
    with ``cancel()``; aiowheel and trio handles also have ``reset(delay)``.
    ``time()`` is the clock deadlines are on; ``now()`` reads the same clock fresh
    (uvloop's ``loop.time()`` is cached once per loop iteration, at ms resolution, so
    on uvloop ``now`` is ``time.monotonic``, the clock it caches); ``iteration_clock``
    is uvloop's cached clock (used to count loop iterations, see ``wakeups``).
    """

    contender: Contender
    call_later: Callable[..., Any]
    call_at: Callable[..., Any]
    time: Callable[[], float]
    now: Callable[[], float]
    checkpoint: Callable[[], Awaitable[None]]
    sleep: Callable[[float], Awaitable[Any]]
    timer: aiowheel.Timer | None = None
    #: Timers are traced: a workload re-arms through the handles' ``reset`` (the
    #: traced repetition is not measured), never by writing a trio scope's deadline.
    traced: bool = False
    iteration_clock: Callable[[], float] = field(default=lambda: 0.0)
    _loop_iterations: list[int] = field(default_factory=lambda: [0])

    def loop_iterations(self) -> int:
        """Event-loop iterations so far, where we can count them (asyncio: selector
        ``select`` calls; trio: ``before_io_wait`` instrument calls); -1 on uvloop."""
        return self._loop_iterations[0]

    def new_event(self) -> _Event:
        if self.contender.backend == "trio":
            import trio

            return trio.Event()
        return asyncio.Event()


class _Event(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...


def _count_selects(loop: asyncio.AbstractEventLoop, counter: list[int]) -> None:
    # The pure-Python loop calls its selector's select() once per iteration; shadowing
    # the bound method on the selector instance counts iterations at ~0.1 us each.
    selector = getattr(loop, "_selector", None)
    if selector is None:
        counter[0] = -1
        return
    select = selector.select

    def counting_select(timeout: float | None = None) -> Any:
        counter[0] += 1
        return select(timeout)

    selector.select = counting_select


async def _trio_checkpoint() -> None:
    import trio.lowlevel

    await trio.lowlevel.checkpoint()


async def _asyncio_checkpoint() -> None:
    await asyncio.sleep(0)


@asynccontextmanager
async def open_env(
    contender: Contender,
    recorder: aiowheel.TraceRecorder | None = None,
    *,
    count_iterations: bool = False,
) -> AsyncIterator[Env]:
    """Set up ``contender`` in the running loop (which must be of its backend).

    With a ``recorder`` every timer is traced (aiowheel: ``Timer(recorder=...)``;
    the others: wrapped callables, recording at the end of the block what is still
    pending as cancelled, then closing the recorder).
    """
    backend = contender.backend
    if contender.kind == "aiowheel" and recorder is None and contender.trace_every:
        # A -traced or -sampled contender: every measured repetition records its
        # trace, into a directory of its own that goes with the repetition.
        scratch = tempfile.mkdtemp(prefix="aiowheel-bench-trace-")
        try:
            async with open_env(
                contender,
                measured_recorder(scratch, contender.trace_every),
                count_iterations=count_iterations,
            ) as env:
                yield env
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    if contender.kind == "aiowheel":
        timer = aiowheel.Timer(recorder=recorder)
        async with timer:
            iterations = [0]
            if backend == "trio":
                import trio

                env = Env(
                    contender,
                    timer.schedule_nowait,
                    timer.schedule_at_nowait,
                    timer.time,
                    trio.current_time,
                    _trio_checkpoint,
                    trio.sleep,
                    timer=timer,
                    _loop_iterations=iterations,
                )
                if count_iterations:
                    trio.lowlevel.add_instrument(_trio_iterations(iterations))
            else:
                loop = asyncio.get_running_loop()
                env = Env(
                    contender,
                    timer.schedule_nowait,
                    timer.schedule_at_nowait,
                    timer.time,
                    time.monotonic,
                    _asyncio_checkpoint,
                    asyncio.sleep,
                    timer=timer,
                    iteration_clock=loop.time,
                    _loop_iterations=iterations,
                )
                if count_iterations:
                    _count_selects(loop, iterations)
            yield env
        return

    if contender.kind in ("call_later", "deadline", "loop"):
        # "loop": the drop-in loop, whose own call_later/call_at are the contender.
        loop = asyncio.get_running_loop()
        iterations = [0]
        if count_iterations:
            _count_selects(loop, iterations)
        tracer: _CallLaterTracer | None = None
        call_later: Callable[..., Any] = loop.call_later
        call_at: Callable[..., Any] = loop.call_at
        if recorder is not None:
            tracer = _CallLaterTracer(loop, recorder)
            recorder.open(backend=backend, clock=loop.time())
            call_later, call_at = tracer.call_later, tracer.call_at
        try:
            yield Env(
                contender,
                call_later,
                call_at,
                loop.time,
                time.monotonic,
                _asyncio_checkpoint,
                asyncio.sleep,
                iteration_clock=loop.time,
                _loop_iterations=iterations,
            )
        finally:
            if tracer is not None and recorder is not None:
                tracer.finish()
                await asyncio.to_thread(recorder.close)
        return

    if contender.kind == "trio":
        import trio

        iterations = [0]
        if count_iterations:
            trio.lowlevel.add_instrument(_trio_iterations(iterations))
        if recorder is not None:
            recorder.open(backend="trio", clock=trio.current_time())
        try:
            async with trio.open_nursery() as nursery:
                timers = TrioNativeTimers(nursery, recorder)
                yield Env(
                    contender,
                    timers.call_later,
                    timers.call_at,
                    trio.current_time,
                    trio.current_time,
                    _trio_checkpoint,
                    trio.sleep,
                    traced=recorder is not None,
                    _loop_iterations=iterations,
                )
                # Whatever is still pending is cancelled (and, traced, recorded so).
                nursery.cancel_scope.cancel()
        finally:
            if recorder is not None:
                await trio.to_thread.run_sync(recorder.close)
        return

    raise ValueError(f"unknown contender kind {contender.kind!r}")


def _trio_iterations(counter: list[int]) -> Any:
    """A trio instrument counting run-loop iterations (one I/O wait each)."""
    import trio

    class Iterations(trio.abc.Instrument):
        def before_io_wait(self, timeout: float) -> None:
            counter[0] += 1

    return Iterations()


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest-rank."""
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]
