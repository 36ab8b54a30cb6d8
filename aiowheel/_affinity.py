"""Loop affinity, the *owner check*: a timer belongs to the event loop that started it.

Every call that changes a timer compares the calling thread with the owner's
(``_thread.get_ident()``, about 45 ns here) and asks ``elsewhere()`` whether, in that
thread, another event loop runs (docs/design.md, "Loop affinity"). The calls that
wait or set things up also compare the running loop (``check``). A foreign caller gets
``foreign()``'s ``RuntimeError``; threads go through ``call_threadsafe``.

The hot paths (``Timer.schedule_nowait``, ``TimerLifecycle._cancel`` and the handle's
inline ``reset``, through ``TimerLifecycle._is_owner_loop``) keep an inline copy of
``here``, tagged.
"""

from __future__ import annotations

import asyncio
from _thread import get_ident
from collections.abc import Callable
from typing import Final, final

__all__ = ["Affinity", "affinity_for"]

_get_running_loop: Final = asyncio._get_running_loop


class Affinity:
    """The owner's thread and event loop (None on trio), and how to ask them.

    Which test ``elsewhere()`` makes depends on the loop, and is chosen once, when the
    timer starts (``affinity_for``): this class is the one for trio, where there is no
    asyncio loop to compare; ``_AsyncioAffinity`` and ``_LoopAffinity`` are the ones
    for asyncio's own loop and for any other (uvloop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, backend: str) -> None:
        # Built in the owner's thread, by the engine that the owner starts there.
        self.thread = get_ident()
        self.loop = loop
        self.backend = backend  # its name, for the error

    def elsewhere(self) -> bool:
        """True when, in the owner's thread (checked first by the caller), the event
        loop that runs is not the timer's: a second loop in the same thread (the
        *owner check*'s second half). Cheap enough for every call that changes the
        timer.

        On trio, the only other loop that can run in its thread is an asyncio one
        nested in it, and ``asyncio._get_running_loop()`` answers None without a
        system call when no asyncio loop runs (the getpid() it makes otherwise is what
        makes it too slow for the asyncio case)."""
        return _get_running_loop() is not None

    def here(self) -> bool:
        """The owner check: the owner's thread, and no other loop running in it."""
        return get_ident() == self.thread and not self.elsewhere()

    def check(self) -> None:
        """The owner check and the running loop (for the calls that wait or set things
        up; ``asyncio._get_running_loop()`` costs a system call): else ``foreign()``."""
        loop = self.loop
        if get_ident() != self.thread or (loop is not None and _get_running_loop() is not loop):
            raise self.foreign()
        if self.elsewhere():  # trio: an asyncio loop nested in its thread
            raise self.foreign()

    def foreign(self) -> RuntimeError:
        return RuntimeError(
            f"this Timer belongs to the {self.backend} event loop that started it; call it "
            "from that loop, or from another thread use timer.call_threadsafe() or "
            "timer.schedule_threadsafe()"
        )


@final
class _AsyncioAffinity(Affinity):
    """asyncio's own loop (looptime's too), which keeps the thread that runs it as
    ``_thread_id`` (None while it is stopped)."""

    def elsewhere(self) -> bool:
        # The owner loop runs in the owner's thread (it started the timer there), and
        # asyncio runs one loop per thread: in that thread, another loop runs only
        # while the owner's is stopped (None), all that is left to catch. Read as an
        # attribute, never through vars(loop): on CPython 3.11+ asking for an object's
        # __dict__ materialises it, and every attribute access of the loop's own
        # methods then takes the slower dict path (task steps 1.1x slower on any
        # asyncio loop a Timer ran on; `aiowheel bench -w loop-steps`, docs/loop.md,
        # "Figures"; tests/test_loop_affinity.py).
        return getattr(self.loop, "_thread_id", None) is None


@final
class _LoopAffinity(Affinity):
    """Any other asyncio loop (uvloop): its ``is_running()``, one C call, bound once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, backend: str) -> None:
        super().__init__(loop, backend)
        self._running: Callable[[], bool] = loop.is_running

    def elsewhere(self) -> bool:
        return not self._running()


def affinity_for(loop: asyncio.AbstractEventLoop | None, backend: str) -> Affinity:
    """The owner check for a timer started now, in this thread, on ``loop`` (None on
    trio): the test ``elsewhere()`` makes is chosen here, once."""
    if loop is None:
        return Affinity(None, backend)
    if isinstance(loop, asyncio.BaseEventLoop):
        return _AsyncioAffinity(loop, backend)
    return _LoopAffinity(loop, backend)
