"""The host: the tasks a ``Timer`` started with ``async with`` runs in.

The engine (``_engine.py``) needs no task group: a driver calls its pass. ``async with
Timer()`` gives it one, and that is this room. ``Host.start`` (from
``Timer.__aenter__``) enters an outer task group in the task of the ``async with``;
its one child, the supervisor, owns the inner task group that the driver (on trio) and
the workers run in, builds the engine there (``Timer._new_engine``) and waits on the
engine's ``closing``; then the trace recorder is opened. ``Host.join`` waits for the
workers and the supervisor (``aclose()``), ``Host.close_recorder`` closes the recorder
(``aclose()``), ``Host.exit`` leaves the outer task group (``Timer.__aexit__``).

``Timer`` keeps the lifecycle itself: its states, what each call may do in each, and
the order of the steps; the host does the steps that need tasks. The drop-in event
loop (``_loop.py``) needs no host: the loop drives its timer's engine and spawns its
workers (``TimerLifecycle._open_for_loop``).

Interpreted (not in ``_compiled.MODULES``), like ``_driver.py``: each method runs once
per timer.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, final

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ._driver import Backend, backend_name, make_backend
from ._shutdown import abort_start

if TYPE_CHECKING:
    from ._engine import Engine
    from .trace import TraceRecorder

__all__ = ["Host"]

logger: Final = logging.getLogger("aiowheel")


@final
class Host:
    """The task groups of one ``Timer`` started with ``async with``, and its recorder's
    opening and closing."""

    def __init__(
        self, new_engine: Callable[[Backend], Engine], recorder: TraceRecorder | None
    ) -> None:
        self._new_engine = new_engine
        self._recorder = recorder
        self._outer: TaskGroup | None = None

    async def start(self) -> Engine:
        """Start the supervisor and its engine, then open the recorder. If it raises,
        nothing it started is left running."""
        backend = backend_name()
        outer = anyio.create_task_group()
        await outer.__aenter__()
        self._outer = outer
        try:
            live: Engine = await outer.start(self._supervise, backend)
        except BaseException:
            await outer.__aexit__(*sys.exc_info())
            raise
        if self._recorder is not None:
            try:
                self._recorder.open(backend=backend, clock=live.clock())
            except BaseException:
                # Nothing is scheduled yet: take down what this call started, so that
                # a recorder that cannot open leaves no task running behind the error.
                abort_start(live)
                await outer.__aexit__(None, None, None)  # the supervisor returns
                raise
        return live

    async def _supervise(self, backend: str, *, task_status: TaskStatus[Engine]) -> None:
        # The driver (on trio) and the workers (on trio) live in this inner task
        # group; the host task of ``async with`` is never cancelled by us. aclose()
        # stops the driver and cancels each worker's own scope (not the group's, so
        # that an async callback that calls aclose() is not cancelled by its own call),
        # then sets `closing`, and the group ends once every child has returned.
        stopped: anyio.Event | None = None
        try:
            async with anyio.create_task_group() as tg:
                live = self._new_engine(make_backend(backend, tg))
                stopped = live.stopped
                await live.driver.start(tg)
                task_status.started(live)
                await live.closing.wait()
        finally:
            if stopped is not None:
                stopped.set()

    async def join(self, engine: Engine) -> None:
        """Wait until the closed ``engine``'s workers have returned, and its supervisor
        too, but the calling worker when a job calls (it would wait for itself)."""
        if not engine.pool.inside():
            await engine.stopped.wait()
        await engine.pool.join()

    async def close_recorder(self) -> None:
        """Close the recorder (a file, in a thread), once the last rows are written."""
        if self._recorder is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(self._recorder.close)
                except Exception:
                    # The timer is closed whatever the recorder says (ParquetRecorder
                    # itself logs rather than raises, for the same reason).
                    logger.exception("aiowheel: the trace recorder failed to close")

    async def exit(self, engine: Engine | None) -> None:
        """``async with``'s end, after ``aclose()``: the block does not end before every
        worker has (``aclose()`` called by one of the timer's own jobs did not wait for
        its own worker), then the outer task group is left."""
        if engine is not None and not engine.pool.inside():
            with anyio.CancelScope(shield=True):
                await self.join(engine)
        outer = self._outer
        if outer is not None:
            # Our tasks are finished, so the task group has nothing to wrap: the
            # body's exception, if any, propagates as itself, not in an ExceptionGroup.
            await outer.__aexit__(None, None, None)
