"""The worker pool: where expired async callbacks run (Kafka's ``taskExecutor``).

Kafka hands expired tasks to a fixed thread pool. Here a callback that returns an
awaitable is queued in a FIFO run queue and awaited by one of at most
``max_concurrency`` long-lived worker tasks. Workers are spawned on demand, park on an
event when the queue is empty, and are cancelled when the timer closes.

The pool owns the queue, the workers and what it takes to run one job whatever it
raises; its host, the engine's state (``_state.Engine``), owns the accounting:
counters, waiters, traces. The host is typed as that class, not a protocol, so that
compiled, the four calls per job are native calls, not calls by name.

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

import logging
from collections.abc import Awaitable, Coroutine, Generator
from contextvars import Context
from typing import TYPE_CHECKING, Any, Final, cast

import anyio

from ._awaits import quiet
from ._handle import TimerHandle, _Failure, without_frame
from ._wheel import QUEUE_LEVEL, Bucket

if TYPE_CHECKING:
    from ._driver import Backend
    from ._engine import Engine

__all__ = ["InContext", "RunQueue", "WorkerPool"]

_EXIT: Final = (SystemExit, KeyboardInterrupt)
logger: Final = logging.getLogger("aiowheel")


class RunQueue(Bucket):
    """Expired async callbacks waiting for a worker, oldest first.

    It is a bucket (a linked list: ``add`` at the end, ``pop_first``, ``remove`` in
    O(1)) and the container (``handle._bucket``) of the handles it holds; it is never
    scheduled (``tick`` is ``UNSCHEDULED``), as a detached bucket, so the handle's lazy re-arm
    check treats it as "not in the wheel"."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(QUEUE_LEVEL)


class _Worker:
    """One worker task: its cancel scope, the handle whose job it runs, and an event
    set when it has returned (what ``join`` waits for on trio)."""

    __slots__ = ("done", "handle", "scope")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.handle: TimerHandle[Any] | None = None
        self.done = anyio.Event()


class WorkerPool:
    """At most ``max_concurrency`` worker tasks awaiting queued jobs, FIFO.

    The pool knows its workers by their *task* (``_workers``), never by a context
    variable: a job runs in the context captured when its handle was scheduled, and a
    task that a job starts inherits that context, not the worker's. So ``aclose()``
    from such a task is a call from outside the pool: it cancels the job that started
    it and waits for it to end (docs/usage.md, "Shutting down")."""

    __slots__ = (
        "_backend",
        "_closed",
        "_host",
        "_loop",
        "_parked",
        "_workers",
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
        self._workers: dict[object, _Worker] = {}
        self._closed = False
        # How workers start, are joined and tell their own cancellation apart is
        # the backend's (aiowheel/_driver.py, AsyncioBackend and TrioBackend).
        self._backend = backend

    # -- the timer's side ---------------------------------------------------------------

    def submit(self, handle: TimerHandle[Any], awaitable: Awaitable[Any], context: Context) -> None:
        """Queue an expired async callback (the host counts it pending again), to be
        stepped in ``context``: the copy of the handle's context its call ran in. The
        job carries it, not the handle, whose own context is what a re-arm starts
        from (docs/usage.md, "Context variables")."""
        handle._become_queued(InContext(awaitable, context))
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

    def _me(self) -> _Worker | None:
        """The worker record of the calling task, if it is one of ours."""
        if not self._workers:
            return None
        return self._workers.get(self._backend.current_task())

    def inside(self) -> bool:
        """True when called from one of the pool's worker tasks (from a job itself)."""
        return self._me() is not None

    def current(self) -> object:
        """The handle whose job runs in the calling task, if it is one of ours."""
        me = self._me()
        return me.handle if me is not None else None

    def close(self) -> None:
        """Cancel every worker but the calling one; parked workers return."""
        self._closed = True
        me = self._me()
        for worker in self._workers.values():
            if worker is not me:
                worker.scope.cancel()
        for parked in self._parked:
            parked.set()

    async def join(self) -> None:
        """Wait until every worker but the calling one has returned: asyncio's
        workers are tasks the backend joins by hand; trio's live in the timer's task
        group, and a job that calls aclose() waits here for the others' ``done``."""
        await quiet(self._backend.join())  # asyncio's: every worker has ended after it
        me = self._backend.current_task()
        for task, worker in list(self._workers.items()):
            if task is not me:
                await quiet(worker.done.wait())

    # -- workers ------------------------------------------------------------------------

    def _spawn(self) -> None:
        # Counted before it starts (a worker's first step may come before this
        # returns, with an eager task factory), and taken back if it could not be
        # started (a task factory that refuses): a count of workers that do not exist
        # would keep the pool from ever starting another, and the queue would wait
        # for ever. The job stays queued; the next submit tries again.
        self.workers += 1
        try:
            self._backend.spawn(self._worker)
        except _EXIT:
            self.workers -= 1
            raise
        except BaseException:
            self.workers -= 1
            logger.exception(
                "aiowheel: could not start a worker task for async callbacks (%d queued);"
                " the next expired async callback tries again",
                len(self.queue),
            )

    async def _worker(self) -> None:
        task = self._backend.current_task()
        worker = _Worker()
        self._workers[task] = worker
        try:
            with worker.scope:
                await self._work(worker)
        finally:
            del self._workers[task]
            worker.done.set()
            self.workers -= 1
            if not self.queue.empty() and not self._closed and not self._parked:
                # Died of SystemExit/KeyboardInterrupt with jobs still queued: if the
                # loop goes on, they must not wait for the next submit.
                self._spawn()

    async def _work(self, worker: _Worker) -> None:
        # One worker's loop: take the oldest job and run it. Each job runs in its own
        # frame (_run), so a parked worker keeps no reference to its last handle,
        # awaitable or result: memory is released at once.
        queue = self.queue
        while not self._closed:
            entry = queue.pop_first()
            if entry is not None:
                await self._run(_as_handle(entry), worker)
                continue
            parked = anyio.Event()
            self._parked.append(parked)
            try:
                await quiet(parked.wait())
            finally:
                if parked in self._parked:
                    self._parked.remove(parked)

    async def _run(self, handle: TimerHandle[Any], worker: _Worker) -> None:
        host = self._host
        awaitable: Any = handle._become_running()
        self.running[handle] = self.running.get(handle, 0) + 1
        self.busy += 1
        worker.handle = handle
        host._job_started(handle)
        outcome: Any = None
        failure: BaseException | None = None
        try:
            # The job (an InContext: submit) runs in the copy its call ran in, on every
            # step, not in the worker's context.
            outcome = await awaitable
        except anyio.get_cancelled_exc_class() as exc:
            if self._really_cancelled(worker.scope):
                self._leave(handle)
                host._job_stopped(handle)
                raise
            # asyncio.CancelledError raised by the callback itself, its worker not
            # being cancelled: a failure like any other (asyncio's Handle does so).
            failure = exc
        except _EXIT as exc:
            host._job_ended(handle, _Failure(_without_frames(exc)), last=self._leave(handle))
            raise
        except BaseException as exc:
            failure = exc
        finally:
            worker.handle = None
        try:
            if failure is not None:
                outcome = _Failure(_without_frames(failure))
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


class InContext:
    """``await InContext(awaitable, context)`` awaits ``awaitable`` with each of its
    steps run inside ``context`` (``context.run``), whichever task awaits it.

    The worker task has its own context; an async callback's body must see the one
    its handle captured at schedule time (docs/usage.md, "Context variables"), before
    and after each ``await``, as the body of a task created with that context would.
    Everything else passes through unchanged: what the body yields to the event loop,
    what the loop sends back, exceptions thrown in (cancellation), and close()."""

    __slots__ = ("_awaitable", "_context")

    def __init__(self, awaitable: Awaitable[Any], context: Context) -> None:
        self._awaitable = awaitable
        self._context = context

    def __await__(self) -> Generator[Any, Any, Any]:
        return _stepped(self._awaitable, self._context)


def _stepped(awaitable: Awaitable[Any], context: Context) -> Generator[Any, Any, Any]:
    # What ``yield from awaitable.__await__()`` does, but with every step of the inner
    # iterator run by context.run. (A plain iterator without send()/throw() is stepped
    # with next(), and a thrown exception is raised here, as `yield from` does.)
    run = context.run
    inner: Any = awaitable.__await__()
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            if thrown is not None:
                exc = thrown
                thrown = None
                throw = getattr(inner, "throw", None)
                if throw is None:
                    raise exc
                yielded = run(throw, exc)
            elif sent is None:
                yielded = run(next, inner)
            else:
                yielded = run(inner.send, sent)
        except StopIteration as stop:
            return stop.value
        try:
            sent = yield yielded
        except GeneratorExit:
            close = getattr(inner, "close", None)
            if close is not None:
                run(close)
            raise
        except BaseException as exc:
            thrown = exc
            sent = None


def _without_frames(exc: BaseException) -> BaseException:
    """The exception without the frames of the pool (``_run``, ``_stepped``): see
    ``without_frame``; the callback's own frames are kept."""
    exc = without_frame(exc)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name in _OWN_FRAMES:
        tb = exc.__traceback__ = tb.tb_next
    return exc


_OWN_FRAMES: Final = frozenset({"_stepped"})


def close_awaitable(awaitable: object) -> None:
    """A queued async callback that will never run: close it, so Python does not warn
    that a coroutine was never awaited."""
    if isinstance(awaitable, InContext):
        awaitable = awaitable._awaitable
    if isinstance(awaitable, Coroutine):
        awaitable.close()


def _as_handle(entry: object) -> TimerHandle[Any]:
    """A queued entry is always a handle: only ``submit`` queues."""
    return cast("TimerHandle[Any]", entry)
