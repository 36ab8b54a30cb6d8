"""``idle_timeout``: an idle timeout for ``asyncio.start_server`` connection handlers.

The wrapper hands the handler a reader and a writer whose reads that return, writes
and completed ``drain()`` calls count as activity (a stored deadline:
``IdleControl.touch`` in ``_shared.py``). With no read or write for ``timeout``
seconds the connection is aborted with a reset (``SO_LINGER`` 0, then
``transport.abort()``: a peer that reads nothing can neither stall a graceful close
nor keep the unsent output in the kernel) and the handler's pending and later reads,
writes and drains raise ``IdleTimeoutError``; the wrapper swallows that error when it
ends the handler, since an idle connection closing is a normal outcome. The timer
handle is cancelled when the handler returns or raises, whatever the reason.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, SupportsIndex

from .. import Timer
from ._shared import (
    IdleControl,
    IdleTimeoutError,
    abort_with_reset,
    check_timeout,
    check_timer,
    get_shared_timer,
    running_clock,
)

if TYPE_CHECKING:
    from asyncio.streams import _ReaduntilBuffer  # typeshed's name for what it accepts

__all__ = ["IdleStreamReader", "IdleStreamWriter", "idle_timeout"]

ClientConnected = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _StreamWatch(IdleControl):
    """The idle timer of one stream connection (shared by its reader and writer)."""

    __slots__ = ("_reader", "_transport", "error")

    def __init__(
        self,
        timer: Timer,
        timeout: float,
        reader: asyncio.StreamReader,
        transport: asyncio.WriteTransport,
    ) -> None:
        self._init_idle(timer, running_clock(), timeout)
        self._reader = reader
        self._transport = transport
        self.error: IdleTimeoutError | None = None
        self.arm()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _timing(self) -> bool:
        return self.error is None

    def _on_due(self, now: float) -> None:
        if now >= self._deadline:
            self._expire()

    def _expire(self) -> None:
        self.stop()
        error = self.error = IdleTimeoutError(
            f"connection idle (no read or write) for more than {self._timeout} s"
        )
        # Wake a pending read with the error first: abort() then only feeds EOF, and
        # the reader keeps reporting the error rather than a bare EOF.
        self._reader.set_exception(error)
        abort_with_reset(self._transport)


class IdleStreamReader(asyncio.StreamReader):
    """A ``StreamReader`` whose reads re-arm the connection's idle timer.

    It delegates to the server's reader, so it shares its buffer and limit; it is a
    subclass only so that it can be passed wherever a ``StreamReader`` is expected.
    """

    def __init__(self, reader: asyncio.StreamReader, watch: _StreamWatch) -> None:
        # Deliberately no super().__init__(): every public method delegates.
        self._inner = reader
        self._aiowheel_idle = watch

    @property
    def idle_deadline(self) -> float | None:
        """When the connection is dropped unless there is activity first (loop clock);
        ``None`` when no idle timeout is running."""
        return self._aiowheel_idle.deadline

    def __repr__(self) -> str:
        return f"<IdleStreamReader {self._inner!r}>"

    def exception(self) -> Exception | None:
        return self._inner.exception()

    def set_exception(self, exc: Exception) -> None:
        self._inner.set_exception(exc)

    def set_transport(self, transport: asyncio.BaseTransport) -> None:
        self._inner.set_transport(transport)

    def feed_eof(self) -> None:
        self._inner.feed_eof()

    def at_eof(self) -> bool:
        return self._inner.at_eof()

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        self._inner.feed_data(data)

    async def read(self, n: int = -1) -> bytes:
        data = await self._inner.read(n)
        self._aiowheel_idle.touch()
        return data

    async def readline(self) -> bytes:
        data = await self._inner.readline()
        self._aiowheel_idle.touch()
        return data

    async def readexactly(self, n: int) -> bytes:
        data = await self._inner.readexactly(n)
        self._aiowheel_idle.touch()
        return data

    async def readuntil(self, separator: _ReaduntilBuffer = b"\n") -> bytes:
        data = await self._inner.readuntil(separator)
        self._aiowheel_idle.touch()
        return data

    def __aiter__(self) -> IdleStreamReader:
        return self

    async def __anext__(self) -> bytes:
        line = await self.readline()
        if line == b"":
            raise StopAsyncIteration
        return line


class IdleStreamWriter(asyncio.StreamWriter):
    """A ``StreamWriter`` whose writes and completed drains re-arm the idle timer."""

    def __init__(self, writer: asyncio.StreamWriter, watch: _StreamWatch) -> None:
        # Deliberately no super().__init__(): every public method delegates.
        self._inner = writer
        self._aiowheel_idle = watch

    def __del__(self) -> None:
        # StreamWriter.__del__ inspects state this proxy does not have; the inner
        # writer does its own unclosed-transport check.
        pass

    @property
    def idle_deadline(self) -> float | None:
        """See ``IdleStreamReader.idle_deadline``."""
        return self._aiowheel_idle.deadline

    def __repr__(self) -> str:
        return f"<IdleStreamWriter {self._inner!r}>"

    @property
    def transport(self) -> asyncio.WriteTransport:
        return self._inner.transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._aiowheel_idle.check()
        self._inner.write(data)
        self._aiowheel_idle.touch()

    def writelines(self, data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._aiowheel_idle.check()
        self._inner.writelines(data)
        self._aiowheel_idle.touch()

    def write_eof(self) -> None:
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def close(self) -> None:
        self._inner.close()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    async def wait_closed(self) -> None:
        await self._inner.wait_closed()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    async def drain(self) -> None:
        watch = self._aiowheel_idle
        watch.check()
        try:
            await self._inner.drain()
        except ConnectionError:
            watch.check()  # lost because we aborted it: say why
            raise
        # An abort wakes a blocked drain() without an error: say why it returned.
        watch.check()
        watch.touch()

    async def start_tls(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.start_tls(*args, **kwargs)


def idle_timeout(
    client_connected_cb: ClientConnected,
    *,
    timeout: float,
    timer: Timer | None = None,
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]:
    """Wrap an ``asyncio.start_server`` handler with a connection idle timeout.

    ``await asyncio.start_server(idle_timeout(handle, timeout=30), host, port)``: each
    connection is aborted after ``timeout`` seconds with no read or write by the
    handler (see the module docstring). ``timer``: a running aiowheel ``Timer``;
    default: the event loop's shared timer. Bad arguments raise here.
    """
    if not callable(client_connected_cb):
        raise TypeError(f"client_connected_cb must be callable, got {client_connected_cb!r}")
    timeout = check_timeout(timeout)
    check_timer(timer)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        used = timer if timer is not None else await get_shared_timer()
        watch = _StreamWatch(used, timeout, reader, writer.transport)
        try:
            await client_connected_cb(
                IdleStreamReader(reader, watch), IdleStreamWriter(writer, watch)
            )
        except (IdleTimeoutError, ConnectionError) as exc:
            # Our own expiry (or a write failing because we aborted the connection) is
            # how idle connections end; anything else is the handler's business.
            ours = watch.error is not None and (
                exc is watch.error or not isinstance(exc, IdleTimeoutError)
            )
            if not ours:
                raise
        finally:
            watch.stop()

    functools.update_wrapper(handler, client_connected_cb)
    return handler
