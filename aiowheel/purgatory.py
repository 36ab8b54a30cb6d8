"""Kafka's purgatory of delayed operations, on the event loop.

A *delayed operation* is a request that cannot be answered yet: a fetch waiting for
``min_bytes`` of data, a produce waiting for replicas, a long poll. It completes
exactly once, either

* by its condition: somebody changed a *key* the operation watches and called
  ``purgatory.check_and_complete(key)``, which calls ``op.try_complete()``; or
* by its timeout, a timer on the timing wheel: then ``on_complete`` runs, followed by
  ``on_expiration``.

Kafka's ``DelayedOperationPurgatory`` keeps a watch list per key and puts each
operation's timeout on its ``SystemTimer``. This module keeps the same shape and the
same accounting, with what the event loop changes:

* No locks. Kafka takes the operation's lock around ``tryComplete`` and shards the
  watch lists so that request threads do not contend. Here only one piece of code runs
  at a time and none of these methods awaits, so each method is atomic by
  construction. What is left to get right is *re-entrancy*: ``try_complete``,
  ``on_complete`` and ``on_expiration`` are user code and may call back into the
  purgatory (watch a new operation, check the same key, cancel a key) while a walk
  over a watch list is in progress. The walks below are written for that.
* No second ``try_complete`` in ``try_complete_else_watch``. Kafka tries, registers
  the watchers, then tries again, because another thread may have changed the key
  between its first try and the registration. Here nothing else can run between them.
* No reaper. Kafka's reaper thread advances the timer and, every 200 ms, purges the
  watch lists if too many completed operations are still in them. The timing wheel has
  its own driver, and the purge check is a comparison we make at the one moment the
  count of completed-but-still-watched operations grows (an operation completing).
  Doing the purge right there costs the same work a task would do, bounds memory at
  every moment instead of every 200 ms, and needs no wake-ups.
* An exact purge trigger. Kafka *estimates* the number of completed operations still
  watched (operations watched since the last purge minus operations still delayed),
  because counting exactly across threads would need synchronisation on every
  removal. Single-threaded, the exact count costs an integer update per removal, and it
  spares the purges that Kafka runs when checks had already emptied the lists.
"""

from __future__ import annotations

from collections.abc import Hashable

from ._purgatory import Watchers, _DelayedOperation, _Purgatory
from ._timer import Timer

__all__ = ["DelayedOperation", "Purgatory", "Watchers"]


class DelayedOperation(_DelayedOperation):
    """An operation that completes once: by its condition, or by its timeout.

    Subclass it and override

    * ``try_complete()``: check the condition; if it holds, ``return
      self.force_complete()``; otherwise return ``False``. The default never completes,
      for operations that only a timeout or an explicit ``force_complete()`` ends;
    * ``on_complete()``: runs exactly once, whichever way the operation completed
      (build the response here);
    * ``on_expiration()``: runs right after ``on_complete()`` when the timeout won.

    ``timeout`` (seconds, a finite number >= 0) counts from the moment the operation
    is handed to ``Purgatory.try_complete_else_watch``.

    An exception raised by ``try_complete``, ``on_complete`` or ``on_expiration``
    propagates to whoever triggered it: the caller of ``check_and_complete``,
    ``force_complete`` or ``try_complete_else_watch``, or, for an expiry, the timer's
    ``on_error``. The operation stays completed either way and its waiters are woken.
    """

    __slots__ = ("__weakref__",)


class Purgatory(_Purgatory):
    """Delayed operations watched on keys and timed on a ``Timer``.

    ``timer`` is a started ``aiowheel.Timer`` (one timer can serve many purgatories).
    ``purge_interval`` is Kafka's: once more than that many completed operations are
    still referenced by watch lists, every watch list is purged of them.

    Accounting, kept exact at every moment:

    * ``delayed()`` (and ``len()``) counts operations watched and not yet finished;
    * ``watched()`` counts watch-list entries: an operation watched on *k* keys counts
      *k*, and a completed operation stays in the lists of keys that have not been
      checked since, until a purge.

    Keys are any hashable values (a topic, a ``(topic, partition)`` tuple, ...).
    """

    # The compiled base does the work; these restate its signatures with the public
    # types (its own take ``object`` so that its messages, not the compiler's
    # argument check, answer bad input). None of them is on a request's path.

    def __init__(
        self, timer: Timer, *, name: str = "purgatory", purge_interval: int = 1000
    ) -> None:
        super().__init__(timer, name=name, purge_interval=purge_interval)

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation]:
        """Remove every operation watched on ``key`` that has not completed: each is
        unwatched, its timeout is cancelled, it is *not* completed (neither
        ``on_complete`` nor ``on_expiration`` runs) and its ``wait()`` raises
        ``aiowheel.TimerCancelled``. Returns them in watch order; ``[]`` for an
        unknown key. Entries the operations have under other keys are dropped when
        those keys are checked or purged, like those of completed operations."""
        return super().cancel_for_key(key)

    def close(self) -> list[DelayedOperation]:
        """Cancel every delayed operation (as ``cancel_for_key`` does) and refuse new
        ones. None of the cancelled operations completes or expires afterwards.
        Returns them. Idempotent. Close the purgatory before its timer: a timer closed
        under delayed operations drops their timeouts, and they would wait forever."""
        return super().close()
