"""The purgatory's core, compiled with the timer (``MODULES`` in ``_compiled.py``).

``aiowheel.purgatory`` is the public module and explains the design; this one holds
what runs per request: the operation's state and logic (``_DelayedOperation``), one
key's watch list (``Watchers``) and the purgatory's (``_Purgatory``). The public
``DelayedOperation`` and ``Purgatory`` are subclasses defined there, not here: the
compiler cannot give a compiled class a safe ``__weakref__`` (tests/test_parity.py),
and a plain class defined in a compiled module may not inherit from a compiled one.
Both cores run the same classes, so they answer copy, pickle and weak references alike.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable, Hashable, Iterable
from types import TracebackType
from typing import Any, Final, Self, SupportsFloat, SupportsIndex, TypeVar

import anyio

from ._awaits import quiet
from ._checks import seconds
from ._exceptions import TimerCancelled, TimerClosed
from ._handle import TimerHandle
from ._timer import Timer

__all__ = ["Watchers"]

_C = TypeVar("_C")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # not a runtime dependency: the pure core only needs a no-op

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_C], _C]:
        return lambda cls: cls


# Operation states. An operation moves forward only: NEW -> WATCHED -> COMPLETED or
# CANCELLED, or NEW -> COMPLETED (completed before or instead of being watched).
# "Finished" means COMPLETED or CANCELLED: nothing will happen to it any more.
# Final: compiled, a plain module global is a dict look-up at every use.
_NEW: Final = 0
_WATCHED: Final = 1
_COMPLETED: Final = 2
_CANCELLED: Final = 3


_NOT_INITIALISED = (
    "{!r} has no operation state: a DelayedOperation subclass must call "
    "super().__init__(timeout) from its __init__"
)


def _state_of(op: object) -> int:
    """``op``'s state, or the ``TypeError`` for what is not an initialised operation."""
    if not isinstance(op, _DelayedOperation):
        raise TypeError(f"op must be a DelayedOperation, got {op!r}")
    try:
        return op._state
    except AttributeError:
        raise TypeError(_NOT_INITIALISED.format(op)) from None


#: The fields of ``_DelayedOperation`` (its ``__slots__`` on the pure core).
_FIELDS = (
    "_entries",
    "_event",
    "_handle",
    "_watch_list",
    "_watch_more",
    "_watch_next",
    "_watch_prev",
    "_purgatory",
    "_stale_next",
    "_stale_prev",
    "_state",
    "_timeout",
)


#: The fields of ``_Purgatory``.
_PURGATORY_FIELDS = (
    "_closed",
    "_delayed",
    "_name",
    "_purge_interval",
    "_stale",
    "_stale_head",
    "_timer",
    "_walking",
    "_watched",
    "_watchers",
)


def _restore_blank(cls: type[object]) -> object:
    """Unpickle and copy: an object without state; ``__setstate__`` fills it in."""
    return cls.__new__(cls)


def _state(obj: object, fields: tuple[str, ...]) -> tuple[dict[str, object] | None, dict[str, Any]]:
    """``obj``'s state for copy and pickle: its instance ``__dict__`` (a subclass's),
    and the compiled base's ``fields`` (kept out of any ``__dict__``) with the
    subclasses' slots."""
    slots: dict[str, object] = {name: getattr(obj, name) for name in fields if hasattr(obj, name)}
    for name in copyreg._slotnames(type(obj)):  # type: ignore[attr-defined]
        if name not in slots and name != "__weakref__" and hasattr(obj, name):
            slots[name] = getattr(obj, name)
    return getattr(obj, "__dict__", None), slots


def _set_state(obj: object, state: tuple[dict[str, object] | None, dict[str, object]]) -> None:
    instance_dict, slots = state
    if instance_dict:
        vars(obj).update(instance_dict)
    for name, value in slots.items():
        setattr(obj, name, value)


@mypyc_attr(allow_interpreted_subclasses=True)
class _Link:
    """A node of one key's watch list (``Watchers``), a doubly linked list.

    An operation is the node of the first list it is watched in (no allocation for an
    operation watched on one key, the common case); each further key gets an
    ``_Entry``. Removing a node is an unlink: O(1), no search and no hashing (the lists
    used to be dicts keyed by ``id(op)``: an int allocated per entry, and addresses
    hash to a few dict slots, as they are all multiples of 16).
    """

    __slots__ = ("_watch_list", "_watch_next", "_watch_prev")

    _watch_list: Watchers | None  # the list this node is in, None once unlinked
    _watch_prev: _Link | None
    _watch_next: _Link | None


class _Entry(_Link):
    """The node of an operation in the watch list of a key other than its first."""

    __slots__ = ("op",)

    def __init__(self, op: _DelayedOperation) -> None:
        self.op = op
        self._watch_list = None
        self._watch_prev = None
        self._watch_next = None


@mypyc_attr(allow_interpreted_subclasses=True)
class _DelayedOperation(_Link):
    """The state and the logic of ``DelayedOperation`` (documented there).

    A native class on the compiled core, so that the purgatory reads and writes an
    operation's state as C struct fields; ``DelayedOperation`` below is the public,
    subclassable face, a plain class that adds weak-reference support (the compiled
    core cannot give a native class a safe ``__weakref__``; tests/test_parity.py).
    """

    # The state lives in slots on the pure core (the compiler ignores __slots__ and
    # makes them struct fields); subclasses are free to have a ``__dict__``.
    __slots__ = (
        "_entries",
        "_event",
        "_handle",
        "_purgatory",
        "_stale_next",
        "_stale_prev",
        "_state",
        "_timeout",
        "_watch_more",
    )

    def __init__(self, timeout: SupportsFloat) -> None:
        # The timer's one rule for times (aiowheel/_checks.py: finite, no bool), plus
        # ">= 0". A float takes the inline path, as in Timer.schedule_nowait.
        if type(timeout) is float and timeout - timeout == 0.0:
            seconds_: float = timeout
        else:
            seconds_ = seconds(timeout, "timeout")
        if seconds_ < 0:
            raise ValueError(f"timeout must be a finite number >= 0, got {timeout!r}")
        self._timeout = seconds_
        self._state = _NEW
        # The timeout on the wheel, while the operation is watched and not finished.
        self._handle: TimerHandle[Any] | None = None
        # The purgatory this operation was handed to (never reset: an operation is
        # watched at most once).
        self._purgatory: _Purgatory | None = None
        # How many watch lists hold this operation (see Purgatory). The operation is
        # the node of its first list (_Link's fields); _watch_more holds its nodes in
        # the others, so a purge visits only the lists it is in.
        self._entries = 0
        self._watch_list = None
        self._watch_prev = None
        self._watch_next = None
        self._watch_more: list[_Entry] | None = None
        # Its place in its purgatory's list of finished operations still watched.
        self._stale_prev: _DelayedOperation | None = None
        self._stale_next: _DelayedOperation | None = None
        # Created by the first wait(): an operation nobody waits for costs no event.
        self._event: anyio.Event | None = None

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        # copy.copy, copy.deepcopy and pickle all come here. A copy of an operation
        # already handed to a purgatory would share its timeout handle and its watch
        # entries: completing the copy would cancel the original's timeout, and the
        # original, still watched, would never expire. A new operation copies as usual.
        if self._state != _NEW:
            raise TypeError(
                f"{type(self).__name__} cannot be copied or pickled once handed to a "
                "purgatory: it is one operation, watched and timed there"
            )
        # The compiled base keeps its fields out of any __dict__, so the copy is
        # spelled out: the base's fields, the subclasses' slots and their __dict__.
        return _restore_blank, (type(self),), _state(self, _FIELDS)

    def __setstate__(self, state: tuple[dict[str, object] | None, dict[str, object]]) -> None:
        _set_state(self, state)

    # -- to override -------------------------------------------------------------------

    def try_complete(self) -> bool:
        """Check the condition; if it holds, ``return self.force_complete()``."""
        return False

    def on_complete(self) -> None:
        """Runs exactly once, when the operation completes (by condition or timeout)."""

    def on_expiration(self) -> None:
        """Runs after ``on_complete`` when the operation completed by its timeout."""

    # -- state -------------------------------------------------------------------------

    @property
    def timeout(self) -> float:
        """The timeout in seconds, as given."""
        return self._timeout

    def is_completed(self) -> bool:
        """True once the operation completed (by its condition, by ``force_complete``
        or by its timeout). An operation removed by ``cancel_for_key`` is not
        completed."""
        return self._state == _COMPLETED

    def is_cancelled(self) -> bool:
        """True once ``Purgatory.cancel_for_key`` (or ``Purgatory.close``) removed the
        operation without completing it."""
        return self._state == _CANCELLED

    def __repr__(self) -> str:
        try:
            state = ("new", "watched", "completed", "cancelled")[self._state]
            timeout: object = self._timeout
        except AttributeError:  # a subclass that did not call super().__init__
            state, timeout = "new", "?"
        return f"<{type(self).__name__} {state} timeout={timeout}>"

    # -- completion --------------------------------------------------------------------

    def force_complete(self) -> bool:
        """Complete the operation now. The first caller wins and gets ``True``: the
        timeout is cancelled (O(1), the wheel releases it at once), the purgatory stops
        counting the operation as delayed, ``on_complete()`` runs and waiters are woken.
        Every later call, and any call on a cancelled operation, returns ``False``.
        Once handed to a purgatory, the operation belongs to its timer's loop: a call
        from elsewhere raises ``RuntimeError`` and changes nothing."""
        return _complete(self)

    async def wait(self) -> None:
        """Return once the operation completed, by any path. Any number of tasks may
        wait. Works whether or not the operation is watched (an operation never
        handed to a purgatory completes by ``force_complete``). Raises
        ``aiowheel.TimerCancelled`` if ``cancel_for_key`` removed it, ``RuntimeError``
        from outside its purgatory's loop."""
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._timer._require_owner_loop_running()
        if self._state < _COMPLETED:
            event = self._event
            if event is None:
                event = self._event = anyio.Event()
            await quiet(event.wait())
        else:
            await quiet(anyio.lowlevel.checkpoint())
        if self._state == _CANCELLED:
            raise TimerCancelled(f"{self!r} was cancelled by its purgatory")


def _link_of(op: _DelayedOperation, watch_list: Watchers) -> _Link | None:
    """``op``'s node in ``watch_list``, or None."""
    if op._watch_list is watch_list:
        return op
    more = op._watch_more
    if more is not None:
        for entry in more:
            if entry._watch_list is watch_list:
                return entry
    return None


class Watchers:
    """One key's watch list (Kafka's ``Watchers``): the operations watched on ``key``,
    in watch order.

    A doubly linked list whose nodes are the operations themselves (``_Link``; an
    ``_Entry`` for an operation's second and further keys): watching and removing
    are O(1) and allocate nothing for an operation watched on one key, iteration is in
    watch order, and nothing relies on the operation's own ``__hash__``/``__eq__`` (a
    dataclass subclass defines ``__eq__`` and so has no ``__hash__``). The purgatory
    keeps one per key that has entries, and drops it when it empties.
    """

    __slots__ = ("_head", "_len", "_live", "_tail", "key")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self._head: _Link | None = None
        self._tail: _Link | None = None
        self._len = 0
        # In the purgatory's map: False once a path took it out (a walk that emptied it,
        # cancel_for_key, a purge). try_complete_else_watch reads it after user code may
        # have run, to know that the lists it looked up are still the keys' lists.
        self._live = True

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"<Watchers {self.key!r} ops={self._len}>"

    def link(self, link: _Link) -> None:
        """Add ``link`` (an operation, or one of its ``_Entry`` nodes) at the end. It
        allocates nothing and runs no user code: ``try_complete_else_watch`` calls it
        inside its change (the nodes are made before)."""
        link._watch_list = self
        tail = self._tail
        link._watch_prev = tail
        link._watch_next = None
        if tail is None:
            self._head = link
        else:
            tail._watch_next = link
        self._tail = link
        self._len += 1

    def remove(self, op: _DelayedOperation) -> bool:
        """Remove ``op``'s entry; False when this list does not hold it."""
        link = _link_of(op, self)
        if link is None:
            return False
        self._unlink(link)
        return True

    def _unlink(self, link: _Link) -> None:
        prev = link._watch_prev
        next_ = link._watch_next
        if prev is None:
            self._head = next_
        else:
            prev._watch_next = next_
        if next_ is None:
            self._tail = prev
        else:
            next_._watch_prev = prev
        link._watch_prev = None
        link._watch_next = None
        link._watch_list = None
        self._len -= 1

    def snapshot(self) -> list[_DelayedOperation]:
        """The operations, in watch order, as a list the caller may walk while user
        code changes this one."""
        ops: list[_DelayedOperation] = []
        link = self._head
        while link is not None:
            if isinstance(link, _Entry):
                ops.append(link.op)
            else:
                assert isinstance(link, _DelayedOperation)
                ops.append(link)
            link = link._watch_next
        return ops


@mypyc_attr(allow_interpreted_subclasses=True)
class _Purgatory:
    """The state and the logic of ``Purgatory`` (documented there), compiled; the
    public class adds what a compiled class cannot have safely (weak references)."""

    def __init__(
        self, timer: Timer, *, name: object = "purgatory", purge_interval: object = 1000
    ) -> None:
        # name and purge_interval are typed object so that the compiled core's own
        # argument check does not pre-empt the messages below (timer's says "Timer").
        if not isinstance(timer, Timer):
            raise TypeError(f"timer must be an aiowheel.Timer, got {timer!r}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if isinstance(purge_interval, bool) or not isinstance(purge_interval, int):
            raise TypeError(f"purge_interval must be an int, got {purge_interval!r}")
        if purge_interval < 0:
            raise ValueError(f"purge_interval must be >= 0, got {purge_interval!r}")
        self._timer = timer
        self._name = name
        self._purge_interval = purge_interval
        # key -> its watch list (Watchers).
        # Invariants: every list in the map is non-empty after each public call
        # returns; op._entries == the number of lists holding op.
        self._watchers: dict[Hashable, Watchers] = {}
        self._delayed = 0  # watched operations not finished
        self._watched = 0  # entries in all watch lists
        self._stale = 0  # finished operations with _entries > 0
        # The finished operations still in a watch list, linked through their
        # _stale_prev/_stale_next: exactly the _stale ones. An operation leaves it
        # when its last entry goes (_drop_entry), not at the next purge: one that left its
        # lists must not be kept alive here, with whatever it holds (a long-poll's
        # 1 MiB answer, issue 20), for up to 2 * purge_interval more completions.
        self._stale_head: _DelayedOperation | None = None
        self._walking = 0  # check_and_complete walks in progress (re-entrancy depth)
        self._closed = False

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # What copy and pickle did with the plain class: its fields as its state (a
        # shallow copy shares the watch lists; deepcopy and pickle stop at the Timer,
        # which refuses both).
        return _restore_blank, (type(self),), _state(self, _PURGATORY_FIELDS)

    def __setstate__(self, state: tuple[dict[str, object] | None, dict[str, object]]) -> None:
        _set_state(self, state)

    # -- introspection -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def timer(self) -> Timer:
        return self._timer

    @property
    def purge_interval(self) -> int:
        return self._purge_interval

    @property
    def closed(self) -> bool:
        return self._closed

    def delayed(self) -> int:
        """Operations watched and not yet completed (or cancelled)."""
        return self._delayed

    def watched(self) -> int:
        """Watch-list entries, completed operations included until their key is
        checked or the lists are purged."""
        return self._watched

    def __len__(self) -> int:
        return self._delayed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<Purgatory {self._name!r} {state} delayed={self._delayed} "
            f"watched={self._watched} keys={len(self._watchers)}>"
        )

    # -- operations --------------------------------------------------------------------

    def try_complete_else_watch(self, op: _DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if it can be; otherwise watch it on every key and start
        its timeout. Returns ``True`` when it completed right away (then it is neither
        watched nor timed), ``False`` when it was parked.

        Raises ``ValueError`` for an empty key list, ``TypeError`` for a key that is
        not hashable (or a ``str``/``bytes`` passed instead of a list of keys),
        ``RuntimeError`` for an operation already handed to a purgatory, and
        ``aiowheel.TimerClosed`` when the purgatory or its timer is closed (or the
        timer is not started), ``RuntimeError`` from outside the timer's loop.
        """
        self._timer._require_owner_loop()
        state = _state_of(op)
        if type(keys) is tuple:
            watched: tuple[Hashable, ...] = keys
        elif isinstance(keys, (str, bytes)):
            raise TypeError(f"keys must be a collection of keys, got the string {keys!r}")
        else:
            watched = tuple(keys)
        if not watched:
            raise ValueError("an operation must be watched on at least one key")
        for key in watched:
            hash(key)  # TypeError for an unhashable key, before anything changes
        if op._purgatory is not None:
            raise RuntimeError(f"{op!r} was already handed to {op._purgatory!r}")
        if state != _NEW:
            return True  # completed by force_complete() before it was ever watched
        if self._closed:
            raise TimerClosed(f"purgatory {self._name!r} is closed")
        if self._timer.closed:
            raise TimerClosed(f"the timer of purgatory {self._name!r} is closed")

        if op.try_complete():
            return True
        if op._state != _NEW:  # completed although try_complete said no
            return True
        for _ in range(_PREPARE_ATTEMPTS):
            parked = _watch(self, op, watched)
            if parked is not None:
                return not parked
        raise RuntimeError(
            f"{self!r} changed under try_complete_else_watch({op!r}) every time it was "
            "prepared (a key's __eq__ or a finalizer kept re-entering the purgatory)"
        )

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete every operation watched on ``key`` (call it after changing
        what ``key`` stands for). Completed operations found in the list leave it.
        Returns how many operations this call completed; 0 for an unknown key."""
        self._timer._require_owner_loop()
        watch_list = self._watchers.get(key)
        if watch_list is None:
            return 0
        completed = 0
        self._walking += 1
        try:
            # A snapshot: the callbacks we call may add to this list (a new operation
            # watched on the key), remove from it (a nested check of the same key, a
            # cancel_for_key), or complete operations further down the list.
            for op in watch_list.snapshot():
                if op._state == _WATCHED and op.try_complete():
                    completed += 1
                if op._state >= _COMPLETED and watch_list.remove(op):
                    _drop_entry(self, op)
        finally:
            self._walking -= 1
            if not watch_list._len:
                _forget(self._watchers, watch_list)
            if not self._walking and self._stale > self._purge_interval:
                _purge(self)
        return completed

    def cancel_for_key(self, key: Hashable) -> list[Any]:
        """Remove every operation watched on ``key`` that has not completed: each is
        unwatched, its timeout is cancelled, it is *not* completed (neither
        ``on_complete`` nor ``on_expiration`` runs) and its ``wait()`` raises
        ``aiowheel.TimerCancelled``. Returns them in watch order; ``[]`` for an
        unknown key. Entries the operations have under other keys are dropped when
        those keys are checked or purged, like those of completed operations."""
        self._timer._require_owner_loop()
        watch_list = self._watchers.pop(key, None)
        if watch_list is None:
            return []
        watch_list._live = False
        cancelled: list[Any] = []
        self._walking += 1
        try:
            for op in watch_list.snapshot():
                if op._state == _WATCHED:
                    _cancel(op)
                    cancelled.append(op)
                # _cancel wakes waiters only (no user code), so the entry is still here.
                watch_list.remove(op)
                _drop_entry(self, op)
        finally:
            self._walking -= 1
            if not self._walking and self._stale > self._purge_interval:
                _purge(self)
        return cancelled

    def close(self) -> list[Any]:
        """Cancel every delayed operation (as ``cancel_for_key`` does) and refuse new
        ones. None of the cancelled operations completes or expires afterwards.
        Returns them. Idempotent. Close the purgatory before its timer: a timer closed
        under delayed operations drops their timeouts, and they would wait forever."""
        self._timer._require_owner_loop()
        self._closed = True
        cancelled: list[Any] = []
        for key in list(self._watchers):
            cancelled.extend(self.cancel_for_key(key))
        return cancelled

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- the internals, as functions ---------------------------------------------------------
#
# On the compiled core, a method called on an instance of an interpreted subclass (every
# public DelayedOperation and Purgatory is one) goes through a Python method lookup, so
# that an override wins. The internals are not meant to be overridden: as module
# functions they are direct C calls. Only the methods users override (try_complete,
# on_complete, on_expiration) are called as methods.


#: How many times try_complete_else_watch prepares again when user code run by its
#: preparation (a key's __eq__, a finalizer) took out a watch list it had looked up.
_PREPARE_ATTEMPTS: Final = 3


def _watch(purgatory: _Purgatory, op: _DelayedOperation, keys: tuple[Hashable, ...]) -> bool | None:
    """Park ``op`` on ``keys`` (``try_complete_else_watch`` past its checks): True once
    parked, False when user code completed it meanwhile, None when it must be prepared
    again (a watch list it looked up left the map meanwhile).

    Three steps, and the re-entrancy rule is their boundary (docs/purgatory.md,
    "Re-entrancy"). *Prepare* does everything that may run user code: the keys'
    look-ups (their ``__hash__``/``__eq__``), making the lists and the nodes, and
    scheduling the timeout (any allocation may run the garbage collector and a
    finalizer). *Re-check* asks whether that user code changed what the preparation
    relied on, and undoes the preparation when it did. *Commit* (the timeout's handle,
    the state, the links) runs no user code and allocates nothing: nothing
    half-changed is ever seen.
    """
    # Prepare.
    watchers = purgatory._watchers
    first, others = _watch_lists(watchers, keys)
    more: list[_Entry] | None = None
    if others is not None:
        more = [_Entry(op) for _ in range(len(others))]
    handle = _schedule_timeout(purgatory, op, first, others)
    # Re-check (no user code from here to the end of the commit).
    if _changed_meanwhile(purgatory, op, first, others):
        return _undo(purgatory, op, handle, first, others)
    assert handle is not None
    # Commit.
    op._handle = handle
    op._state = _WATCHED
    op._purgatory = purgatory
    purgatory._delayed += 1
    op._watch_more = more
    first.link(op)
    entries = 1
    if others is not None and more is not None:
        for i in range(len(others)):
            others[i].link(more[i])
        entries += len(others)
    op._entries = entries
    purgatory._watched += entries
    return True


def _watch_lists(
    watchers: dict[Hashable, Watchers], keys: tuple[Hashable, ...]
) -> tuple[Watchers, list[Watchers] | None]:
    """Prepare: the keys' watch lists, distinct (the same key twice: one list), made
    where missing. The first, and a list of the others only for an operation watched
    on several keys (one key, the common case, allocates nothing here but a new key's
    list). Runs user code (the keys' ``__hash__``/``__eq__``)."""
    first: Watchers | None = None
    others: list[Watchers] | None = None
    try:
        for key in keys:
            watch_list = watchers.get(key)
            if watch_list is None:
                # setdefault: a nested call that made the key's list meanwhile keeps it.
                watch_list = watchers.setdefault(key, Watchers(key))
            if first is None:
                first = watch_list
            elif watch_list is not first:
                if others is None:
                    others = [watch_list]
                elif not _holds(others, watch_list):
                    others.append(watch_list)
    except BaseException:
        # A key's look-up raised (its __hash__/__eq__: user code, hashable when it was
        # checked): the lists made for the keys before it must not stay in the map
        # empty (each keeps its key alive until that key is checked).
        if first is not None:
            _forget_empty(watchers, first, others)
        raise
    assert first is not None  # keys is not empty
    return first, others


def _holds(lists: list[Watchers], watch_list: Watchers) -> bool:
    """Whether ``watch_list`` is one of ``lists`` (by identity: a key's ``__eq__`` is
    user code)."""
    return any(seen is watch_list for seen in lists)


def _schedule_timeout(
    purgatory: _Purgatory, op: _DelayedOperation, first: Watchers, others: list[Watchers] | None
) -> TimerHandle[None] | None:
    """Prepare: the operation's timeout on the wheel, unless user code already
    finished or handed it over (then None). On failure the lists made for it go."""
    handle: TimerHandle[None] | None = None
    try:
        if op._state == _NEW and op._purgatory is None and not purgatory._closed:
            handle = purgatory._timer.schedule_nowait(
                op._timeout, _expire, op, label=purgatory._name
            )
    finally:
        if handle is None:
            _forget_empty(purgatory._watchers, first, others)  # nothing was changed: undo
    return handle


def _changed_meanwhile(
    purgatory: _Purgatory, op: _DelayedOperation, first: Watchers, others: list[Watchers] | None
) -> bool:
    """Re-check: whether user code run by the preparation finished or handed over the
    operation, closed the purgatory, or took out a watch list it looked up."""
    if op._state != _NEW or op._purgatory is not None or purgatory._closed or not first._live:
        return True
    if others is not None:
        for watch_list in others:
            if not watch_list._live:
                return True
    return False


def _undo(
    purgatory: _Purgatory,
    op: _DelayedOperation,
    handle: TimerHandle[None] | None,
    first: Watchers,
    others: list[Watchers] | None,
) -> bool | None:
    """Re-check failed: take the preparation back, then say why (``_watch``'s
    answer, or the error the change would have met)."""
    if handle is not None:
        handle.cancel()
        _forget_empty(purgatory._watchers, first, others)
    if op._purgatory is not None:
        raise RuntimeError(f"{op!r} was already handed to {op._purgatory!r}")
    if op._state != _NEW:
        return False  # completed (force_complete) while it was being prepared
    if purgatory._closed:
        raise TimerClosed(f"purgatory {purgatory._name!r} is closed")
    return None


def _forget_empty(
    watchers: dict[Hashable, Watchers], first: Watchers, others: list[Watchers] | None
) -> None:
    # Undo a preparation: the lists it made that are still empty leave the map.
    if not first._len and first._live:
        _forget(watchers, first)
    if others is not None:
        for watch_list in others:
            if not watch_list._len and watch_list._live:
                _forget(watchers, watch_list)


def _complete(op: _DelayedOperation) -> bool:
    """``force_complete``: the first caller wins."""
    handle = op._handle
    if handle is not None:
        # A watched operation's timeout: its cancel() makes the owner check (the
        # timer's own, as TimerLifecycle._require_owner_loop) before anything changes,
        # so the purgatory does not make it a second time. Nothing else changed yet.
        handle.cancel()
        op._handle = None
    else:
        purgatory = op._purgatory
        if purgatory is not None:
            purgatory._timer._require_owner_loop()
    if op._state >= _COMPLETED:
        return False
    _settle(op)
    return True


def _settle(op: _DelayedOperation) -> None:
    # Complete an unfinished operation whose timeout is cancelled or has fired.
    op._state = _COMPLETED
    try:
        purgatory = op._purgatory
        if purgatory is not None:
            _finished(purgatory, op)
        op.on_complete()
    finally:
        if op._event is not None:
            _wake(op)


def _expire(op: _DelayedOperation) -> None:
    # The timer's callback, on the timer's loop (no owner check to make). The timer
    # has already let go of the handle. A pending timeout means a watched operation.
    op._handle = None
    if op._state < _COMPLETED:
        _settle(op)
        op.on_expiration()


def _cancel(op: _DelayedOperation) -> None:
    # Called by the purgatory only, on a watched operation.
    op._state = _CANCELLED
    try:
        _release(op)
    finally:
        _wake(op)


def _release(op: _DelayedOperation) -> None:
    handle = op._handle
    if handle is not None:
        op._handle = None
        handle.cancel()
    purgatory = op._purgatory
    if purgatory is not None:
        _finished(purgatory, op)


def _wake(op: _DelayedOperation) -> None:
    event = op._event
    if event is not None:
        event.set()


def _finished(purgatory: _Purgatory, op: _DelayedOperation) -> None:
    # op just completed or was cancelled (it was watched by this purgatory).
    purgatory._delayed -= 1
    if op._entries:
        purgatory._stale += 1
        head = purgatory._stale_head
        op._stale_next = head
        if head is not None:
            head._stale_prev = op
        purgatory._stale_head = op
        # Kafka's purge trigger, evaluated where the count grows. Not during a walk:
        # the walk is about to drop entries itself, and a purge would mutate the list
        # under it (the walk runs the check again when it ends).
        if purgatory._stale > purgatory._purge_interval and not purgatory._walking:
            _purge(purgatory)


def _drop_entry(purgatory: _Purgatory, op: _DelayedOperation) -> None:
    # One entry of op was just removed from a watch list.
    purgatory._watched -= 1
    op._entries -= 1
    if not op._entries and op._state >= _COMPLETED:
        purgatory._stale -= 1
        prev = op._stale_prev
        next_ = op._stale_next
        if prev is None:
            purgatory._stale_head = next_
        else:
            prev._stale_next = next_
        if next_ is not None:
            next_._stale_prev = prev
        op._stale_prev = None
        op._stale_next = None


def _purge(purgatory: _Purgatory) -> None:
    """Drop every finished operation from every watch list.

    Kafka walks all watch lists (O(watched)), because it does not know which lists a
    finished operation is in. We do (its nodes: itself and ``op._watch_more``), and we keep
    the operations that finished while still watched in a list of their own
    (``_stale_head``), so a purge visits only their entries: O(finished operations x
    their keys). What gets purged, and when, is Kafka's exactly.
    """
    watchers = purgatory._watchers
    dropped = 0
    op = purgatory._stale_head
    while op is not None:
        watch_list = op._watch_list
        if watch_list is not None:
            watch_list._unlink(op)
            dropped += 1
            if not watch_list._len:
                _forget(watchers, watch_list)
        more = op._watch_more
        if more is not None:
            for entry in more:
                watch_list = entry._watch_list
                if watch_list is not None:
                    watch_list._unlink(entry)
                    dropped += 1
                    if not watch_list._len:
                        _forget(watchers, watch_list)
            op._watch_more = None
        op._entries = 0
        next_ = op._stale_next
        op._stale_prev = None
        op._stale_next = None
        op = next_
    purgatory._stale_head = None
    purgatory._watched -= dropped
    purgatory._stale = 0


def _forget(watchers: dict[Hashable, Watchers], watch_list: Watchers) -> None:
    # An emptied list leaves the map, if it is still the key's (cancel_for_key pops it).
    # The look-ups run the key's __eq__ (user code), which may watch an operation on
    # this very list: so it is checked empty after the look-up, and marked not live
    # before it goes (a watch made from the pop's own look-up then prepares again
    # instead of linking into it); a list that replaced it meanwhile is put back.
    key = watch_list.key
    if watchers.get(key) is not watch_list or watch_list._len:
        return
    watch_list._live = False
    removed = watchers.pop(key, None)
    if removed is not None and removed is not watch_list:
        watchers[key] = removed
