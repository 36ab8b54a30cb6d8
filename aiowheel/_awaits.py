"""``quiet(awaitable)``: an await point of the compiled core that warns on no Python.

A coroutine compiled by mypyc forwards an exception thrown into it (a task's
cancellation) to what it awaits with the old three-argument form,
``throw(type, value, traceback)``. CPython 3.12 deprecated that form for its own
generators, coroutines and futures: a cancelled task awaiting ``timer.sleep()`` or
``handle.wait()`` on the compiled core emitted ``DeprecationWarning``, and under
``-W error`` ended with that warning instead of ``CancelledError``. The pure core, whose
``await`` is the interpreter's, never did.

So every await of the compiled core on an awaitable that is not compiled itself (an
anyio ``Event.wait()``, a coroutine of an interpreted module such as ``_host.py``) goes
through ``quiet``: its ``throw`` takes the three-argument form from mypyc and passes the
exception on in the one-argument form. This module is interpreted (it is not one of
``aiowheel/_compiled.py``'s ``MODULES``): nothing in it is hot, and a compiled awaitable
needs no wrapper. tests/test_warnings.py cancels every such await point with warnings
as errors, on both cores (docs/design.md, "Rules for compiled modules").
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from types import TracebackType
from typing import Any, Generic, TypeVar

__all__ = ["quiet"]

T = TypeVar("T")


class quiet(Generic[T]):
    """``await quiet(awaitable)`` is ``await awaitable``; a thrown exception is passed
    on with ``throw(exc)``, whatever form it arrived in."""

    __slots__ = ("_inner",)

    def __init__(self, awaitable: Awaitable[T]) -> None:
        self._inner: Any = awaitable.__await__()

    def __await__(self) -> Generator[Any, Any, T]:
        return self  # type: ignore[return-value]

    def __iter__(self) -> quiet[T]:
        return self

    def __next__(self) -> Any:
        return next(self._inner)

    def send(self, value: Any) -> Any:
        return self._inner.send(value)

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        value: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> Any:
        exc = value if value is not None else typ if isinstance(typ, BaseException) else typ()
        if tb is not None and exc.__traceback__ is not tb:
            exc = exc.with_traceback(tb)
        throw = getattr(self._inner, "throw", None)
        if throw is None:  # a plain iterator: the exception is raised here
            raise exc
        return throw(exc)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()
