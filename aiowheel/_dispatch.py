"""The worker pool: where expired async callbacks run (Kafka's ``taskExecutor``).

Kafka hands expired tasks to a fixed thread pool. Here a callback that returns an
awaitable is queued in a FIFO run queue and awaited by one of at most
``max_concurrency`` long-lived worker tasks. Workers are spawned on demand, park on an
event when the queue is empty, and are cancelled when the timer closes.

The pool owns the queue, the workers and what it takes to run one job whatever it
raises; its host, the timer's engine (``_engine.Engine``), owns the accounting:
counters, waiters, traces. The host is typed as the engine itself, not a protocol, so
that compiled, the four calls per job are native calls, not calls by name.

Invariants:

* a queued handle is pending: ``handle._bucket is pool.queue`` and ``handle._result``
  holds its awaitable (so ``cancel()`` works on it like on a wheel bucket);
* ``pool.running`` counts the runs of each running handle (a handle re-armed while
  its callback runs can run twice at once), ``pool.busy`` counts all runs; the handle's
  result and waiters are settled by its last run to end;
* ``workers`` counts the worker tasks alive, parked or not; while the queue is not
  empty and the pool is open, at least one worker is alive or about to be: a worker
  that dies (``SystemExit``/``KeyboardInterrupt`` from its job) is replaced.

Every job ends: a job's exception, whatever it is, is caught and reported, so a
worker survives anything but a real cancellation (the timer closing) and the two
exceptions that must stop a program, ``SystemExit`` and ``KeyboardInterrupt``, which
settle the handle first and then propagate (docs/design.md, guarantee 5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, cast

import anyio

from ._handle import _RUNNING, TimerHandle, _Failure, without_frame
from ._wheel import Bucket

if TYPE_CHECKING:
    from ._driver import Backend
    from ._engine import Engine

__all__ = ["RunQueue", "WorkerPool", "inside"]

#: Set in the timer's own tasks (its supervisor and its workers) to its engine, so that
#: ``aclose()`` called from one of them does not wait for itself.
inside: ContextVar[object] = ContextVar("aiowheel_inside", default=None)
# The handle whose callback this worker task runs, and the worker's cancel scope.
_current: ContextVar[object] = ContextVar("aiowheel_current", default=None)
_scope: ContextVar[anyio.CancelScope | None] = ContextVar("aiowheel_worker_scope", default=None)

_EXIT: Final = (SystemExit, KeyboardInterrupt)


class RunQueue(Bucket):
    """Expired async callbacks waiting for a worker, oldest first.

    It is a bucket (a linked list: ``add`` at the end, ``pop_first``, ``remove`` in
    O(1)) and the container (``handle._bucket``) of the handles it holds; it is never
    scheduled (``tick is None``), as a detached bucket, so the handle's lazy re-arm
    check treats it as "not in the wheel"."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(-2)


class WorkerPool:
    """At most ``max_concurrency`` worker tasks awaiting queued jobs, FIFO."""

    __slots__ = (
        "_backend",
        "_closed",
        "_host",
        "_parked",
        "_scopes",
        "busy",
        "limit",
        "queue",
        "running",
        "workers",
    )

    def __init__(self, host: Engine, max_concurrency: int, backend: Backend) -> None:
        self._host = host
        self.limit = max_concurrency
        self.queue = RunQueue()
        self.running: dict[TimerHandle[Any], int] = {}
        self.busy = 0
        self.workers = 0
        self._parked: list[anyio.Event] = []
        self._scopes: set[anyio.CancelScope] = set()
        self._closed = False
        # How workers start, are joined and tell their own cancellation apart is
        # the backend's (aiowheel/_driver.py, AsyncioBackend and TrioBackend).
        self._backend = backend

    # -- the timer's side ---------------------------------------------------------------

    def submit(self, handle: TimerHandle[Any], awaitable: Awaitable[Any]) -> None:
        """Queue an expired async callback (the host counts it pending again)."""
        handle._result = awaitable
        self.queue.add(handle)
        if self._parked:
            self._parked.pop().set()
        elif self.workers < self.limit:
            self._spawn()

    def take_queue(self) -> list[TimerHandle[Any]]:
        """Empty the queue (the timer is closing): the handles. The caller closes their
        jobs (``close_awaitable``) once its accounting is done: a coroutine's close()
        runs user code (docs/design.md, "Re-entrancy")."""
        return [_as_handle(entry) for entry in self.queue.take_all()]

    def current(self) -> object:
        """The handle whose job runs in the calling task, if it is one of ours."""
        return _current.get()

    def close(self) -> None:
        """Cancel every worker but the calling one; parked workers return."""
        self._closed = True
        own = _scope.get()
        for scope in self._scopes:
            if scope is not own:
                scope.cancel()
        for parked in self._parked:
            parked.set()

    async def join(self) -> None:
        """Wait for the workers (but the calling one) to end."""
        await self._backend.join()

    # -- workers ------------------------------------------------------------------------

    def _spawn(self) -> None:
        self.workers += 1
        self._backend.spawn(self._worker)

    async def _worker(self) -> None:
        inside.set(self._host)
        scope = anyio.CancelScope()
        _scope.set(scope)
        self._scopes.add(scope)
        try:
            with scope:
                await self._work(scope)
        finally:
            self._scopes.discard(scope)
            self.workers -= 1
            if not self.queue.empty() and not self._closed and not self._parked:
                # Died of SystemExit/KeyboardInterrupt with jobs still queued: if the
                # loop goes on, they must not wait for the next submit.
                self._spawn()

    async def _work(self, scope: anyio.CancelScope) -> None:
        # One worker's loop: take the oldest job and run it. Each job runs in its own
        # frame (_run), so a parked worker keeps no reference to its last handle,
        # awaitable or result: memory is released at once.
        queue = self.queue
        while not self._closed:
            entry = queue.pop_first()
            if entry is not None:
                await self._run(_as_handle(entry), scope)
                continue
            parked = anyio.Event()
            self._parked.append(parked)
            try:
                await parked.wait()
            finally:
                if parked in self._parked:
                    self._parked.remove(parked)

    async def _run(self, handle: TimerHandle[Any], scope: anyio.CancelScope) -> None:
        host = self._host
        awaitable: Any = handle._result
        handle._result = _RUNNING
        self.running[handle] = self.running.get(handle, 0) + 1
        self.busy += 1
        _current.set(handle)
        host._job_started(handle)
        outcome: Any = None
        failure: BaseException | None = None
        try:
            outcome = await awaitable
        except anyio.get_cancelled_exc_class() as exc:
            if self._really_cancelled(scope):
                self._leave(handle)
                host._job_stopped(handle)
                raise
            # asyncio.CancelledError raised by the callback itself, its worker not
            # being cancelled: a failure like any other (asyncio's Handle does so).
            failure = exc
        except _EXIT as exc:
            host._job_ended(handle, _Failure(without_frame(exc)), last=self._leave(handle))
            raise
        except BaseException as exc:
            failure = exc
        finally:
            _current.set(None)
        try:
            if failure is not None:
                outcome = _Failure(without_frame(failure))
                host._job_failed(handle, failure)  # on_error may raise SystemExit...
        finally:
            # ...and the job is settled all the same.
            host._job_ended(handle, outcome, last=self._leave(handle))
            # A failed job's traceback may keep this frame alive (as Python code): it
            # must not keep the awaitable or the result. (``del`` would be the natural
            # spelling, but mypyc keeps a coroutine's locals as attributes, which it
            # cannot delete.)
            awaitable = outcome = failure = None

    def _leave(self, handle: TimerHandle[Any]) -> bool:
        """One run of ``handle`` ended; True when it was its last."""
        self.busy -= 1
        runs = self.running.pop(handle, 1) - 1
        if runs:
            self.running[handle] = runs
        return not runs

    def _really_cancelled(self, scope: anyio.CancelScope) -> bool:
        return self._backend.cancelled_by_us(scope)


def close_awaitable(awaitable: object) -> None:
    """A queued async callback that will never run: close it, so Python does not warn
    that a coroutine was never awaited."""
    if isinstance(awaitable, Coroutine):
        awaitable.close()


def _as_handle(entry: object) -> TimerHandle[Any]:
    """A queued entry is always a handle: only ``submit`` queues."""
    return cast("TimerHandle[Any]", entry)
