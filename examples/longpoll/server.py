"""A Kafka-style long-poll message log over HTTP, parked in aiowheel's purgatory.

Endpoints:

* ``POST /topics/{topic}`` appends the request body as one message and answers
  ``{"offset": n}``.
* ``GET /topics/{topic}?offset=o&max_wait_ms=w&min_bytes=b&max_bytes=m`` answers
  ``{"messages": [...], "next_offset": n}`` as soon as at least ``min_bytes`` bytes of
  messages at or after ``offset`` exist, or after ``max_wait_ms`` with whatever is
  there (possibly nothing), at most ``max_bytes`` of messages (but always at least one
  message when there is one). This is Kafka's fetch with ``fetch.max.wait.ms``,
  ``fetch.min.bytes`` and ``max.partition.fetch.bytes``.
* ``GET /stats``: parked, completed, expired and disconnected polls, what the log
  retains, the limits, and the server's CPU time (``time.process_time()``), which the
  load client turns into CPU per poll.

No client can make the server hold more than its limits allow (docs/longpoll.md has
the table and the memory bound): a message size limit (413), retention by bytes per
topic and for the whole server (oldest messages first, the log start offset
advances), a topic count limit (429 for a new topic), idle empty topics dropped on an
aiowheel timer, a bound on parked polls (503) and on request bodies being received at
once, and a deadline for receiving a body (408).

Two ways to park a poll (``--mode``):

* ``purgatory`` (default): each waiting poll is a ``DelayedOperation`` watched on its
  topic, its timeout a timer on the wheel; a publish calls
  ``purgatory.check_and_complete(topic)``, which completes exactly the polls whose
  ``min_bytes`` are now met, without waking the others. Runs on asyncio, uvloop,
  aiowheel's drop-in loop on either (uvicorn) and trio (hypercorn).
* ``wait_for``: the baseline most asyncio code would write: every poll waits with
  ``asyncio.wait_for(topic_event.wait(), remaining)``; a publish sets the topic's
  event, every waiter wakes, re-checks its ``min_bytes`` and parks again with the time
  it has left. asyncio loops only (not trio).

Run it::

    python examples/longpoll/server.py --host 127.0.0.1 --port 8080
    python examples/longpoll/server.py --backend trio --port 8080
    python examples/longpoll/server.py --mode wait_for --backend uvloop --port 8081
    python examples/longpoll/server.py --backend aiowheel --port 8082

``--backend aiowheel`` serves on aiowheel's drop-in event loop
(``aiowheel.new_event_loop``, docs/loop.md), on which every ``call_later`` and
``asyncio.timeout`` of uvicorn and Starlette is on a timing wheel as well;
``--backend aiowheel-uvloop`` is the same loop on uvloop's base.

``--port 0`` picks a free port; the first line on stdout is always
``listening on http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import math
import re
import socket
import sys
import time
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, fields
from functools import partial
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aiowheel import Timeout, Timer, TimerHandle, loop_base
from aiowheel.purgatory import DelayedOperation, Purgatory

__all__ = ["Limits", "LongPollService", "MessageLog", "create_app", "main", "serving"]

MAX_WAIT_MS_LIMIT = 30_000  # below common proxy idle timeouts (nginx: 60 s)
DEFAULT_MAX_WAIT_MS = 500  # Kafka's fetch.max.wait.ms
DEFAULT_MIN_BYTES = 1  # Kafka's fetch.min.bytes
MIN_BYTES_LIMIT = 2**31 - 1
MAX_OFFSET = 2**63 - 1  # Kafka's offsets are signed 64-bit integers
# Kafka's legal topic names: 1 to 249 of these characters, and neither "." nor "..".
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
POLL_PARAMETERS = ("offset", "max_wait_ms", "min_bytes", "max_bytes")
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII digits only; int() would take "٣" or " 3"

# What retention charges for one message on top of its body: the Python objects that
# hold it (the bytes object's header, its list slot, its cumulative size, its entry in
# the server-wide age queue, the slots of dropped messages not compacted yet). The
# tests measure the real cost with tracemalloc and check that it stays below this.
RECORD_OVERHEAD = 128
# What one topic costs while it exists, messages aside (its object, its name, its dict
# entry, its idle timer); measured the same way. Not charged to retention: the topic
# count limit bounds it.
TOPIC_OVERHEAD = 1024
# The rest of the memory bound (docs/longpoll.md says how these were measured): a
# parked poll (its connection, request, task and operation: about 18 KiB on uvicorn,
# 27 KiB on hypercorn); an open connection besides, for what the HTTP server buffers
# of a body we are not reading yet (64 KiB) or of an answer its client is not reading
# (two pieces and the write buffer, 75 to 110 KiB); and what a fresh server grows by
# when it starts serving (allocator arenas, caches), whatever the limits.
WAITER_OVERHEAD = 32 << 10
CONNECTION_BUFFER = 192 << 10
FIXED_OVERHEAD = 32 << 20


class BadRequest(Exception):
    """A client error, answered as ``{"error": message, "parameter": name}``."""

    def __init__(
        self,
        status: int,
        parameter: str | None,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.parameter = parameter
        self.message = message
        self.headers = headers
        self.extra = extra

    def response(self) -> JSONResponse:
        body = {"error": self.message, "parameter": self.parameter, **self.extra}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _shown(name: str) -> str:
    # A client's string in an error message: quoted, escaped, and not too long.
    return repr(name if len(name) <= 60 else name[:60] + "...")


# -- the limits ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Every bound the server keeps, with its default. docs/longpoll.md has the table;
    the command line has a flag for each (``--max-body-bytes`` for ``max_body_bytes``).
    A value that is not a positive int, or limits that contradict each other, raise
    ``ValueError``."""

    max_body_bytes: int = 1 << 20
    retention_bytes: int = 16 << 20
    total_retention_bytes: int = 128 << 20
    retention: int = 100_000
    max_topics: int = 10_000
    topic_idle_ms: int = 60_000
    max_fetch_bytes: int = 1 << 20
    max_messages: int = 1000
    max_waiters: int = 5000
    max_inflight_bytes: int = 32 << 20
    # What the bodies of one client (peer address) may hold of max_inflight_bytes.
    max_client_inflight_bytes: int = 4 << 20
    body_timeout_ms: int = 30_000
    # uvicorn (asyncio, uvloop): a request head must be complete within this of its
    # first byte (slowloris), and a connection that sends nothing is closed after it.
    header_timeout_ms: int = 10_000
    # A body that holds its reservation must keep pace: it loses it (408) once it is
    # this far behind a steady arrival over body_timeout_ms (see IncomingBody).
    body_stall_ms: int = 2_000

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be a positive int, got {value!r}")
        # Retention never has to drop the message it is appending: it always keeps a
        # topic's newest message (as Kafka never deletes the active segment).
        if self.retention_bytes < self.max_body_bytes + RECORD_OVERHEAD:
            raise ValueError(
                f"retention_bytes ({self.retention_bytes}) must hold one message of "
                f"max_body_bytes ({self.max_body_bytes}) plus {RECORD_OVERHEAD} bytes "
                "of overhead"
            )
        if self.total_retention_bytes < self.retention_bytes:
            raise ValueError(
                f"total_retention_bytes ({self.total_retention_bytes}) must be at least "
                f"retention_bytes ({self.retention_bytes})"
            )
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_inflight_bytes ({self.max_inflight_bytes}) must be at least "
                f"max_body_bytes ({self.max_body_bytes})"
            )
        # One client can always send one body of max_body_bytes. Its share is at most
        # the whole budget: a larger one (the default with a small max_inflight_bytes)
        # means the whole budget.
        if self.max_client_inflight_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_client_inflight_bytes ({self.max_client_inflight_bytes}) must be at "
                f"least max_body_bytes ({self.max_body_bytes})"
            )
        if self.max_client_inflight_bytes > self.max_inflight_bytes:
            object.__setattr__(self, "max_client_inflight_bytes", self.max_inflight_bytes)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def max_answer_bytes(self) -> int:
        """The most an answer holds of the log's messages: ``max_fetch_bytes``, or one
        message of up to ``max_body_bytes`` (an answer has at least one)."""
        return max(self.max_fetch_bytes, self.max_body_bytes)

    def memory_bound(self, connections: int = 0) -> int:
        """How much the server's memory (RSS) can grow, in bytes, whatever its clients
        send, with ``connections`` connections open besides the parked polls (a
        parked poll that is answered counts as one of them from then on):
        docs/longpoll.md, "The memory bound".

        Each such connection may be writing an answer whose messages retention has
        dropped meanwhile: the answer keeps them alive (``max_answer_bytes``) until
        its client has read it, or has gone (issue 28: 1,000 clients that asked for
        a 1 MiB message each and never read grew the server by 1.1 GiB)."""
        return (
            self.total_retention_bytes
            + self.max_topics * TOPIC_OVERHEAD
            + 2 * self.max_inflight_bytes
            + self.max_waiters * WAITER_OVERHEAD
            + connections * (CONNECTION_BUFFER + self.max_answer_bytes)
            + FIXED_OVERHEAD
        )


# -- the log -------------------------------------------------------------------------------


class Topic:
    """One topic's retained messages, with cumulative sizes so that "how many bytes at
    or after offset o" is O(1) (the question every poll's ``try_complete`` asks) and
    "how many messages fit in max_bytes" is a bisection.

    ``messages[:skip]`` were dropped by retention (``None``, their memory released);
    the list is compacted once they are half of it.
    """

    __slots__ = ("base", "idle", "messages", "name", "sizes", "skip", "stale")

    def __init__(self, name: str) -> None:
        self.name = name
        self.base = 0  # offset of messages[0]
        self.skip = 0
        self.messages: list[bytes | None] = []
        # sizes[i] = body bytes in messages[:i]; len(sizes) == len(messages) + 1. An
        # array of machine integers: 8 bytes a message, no int object each.
        self.sizes = array("q", [0])
        # Entries of this topic at the front of the log's age queue whose messages
        # per-topic retention already dropped (see MessageLog).
        self.stale = 0
        self.idle: TimerHandle[Any] | None = None

    @property
    def start(self) -> int:
        """The log start offset: the oldest retained message's."""
        return self.base + self.skip

    @property
    def end(self) -> int:
        """The offset the next message will get."""
        return self.base + len(self.messages)

    @property
    def count(self) -> int:
        return len(self.messages) - self.skip

    @property
    def payload(self) -> int:
        return self.sizes[-1] - self.sizes[self.skip]

    @property
    def charged(self) -> int:
        """What retention counts for this topic: bodies plus overhead."""
        return self.payload + self.count * RECORD_OVERHEAD

    def append(self, body: bytes) -> int:
        offset = self.end
        self.messages.append(body)
        self.sizes.append(self.sizes[-1] + len(body))
        return offset

    def drop_oldest(self) -> int:
        """Drop the oldest retained message; returns what retention charged for it."""
        index = self.skip
        size = self.sizes[index + 1] - self.sizes[index]
        self.messages[index] = None
        self.skip = index + 1
        if self.skip > 16 and 2 * self.skip > len(self.messages):
            # Compact: O(len) every len/2 drops.
            skip = self.skip
            del self.messages[:skip]
            dropped = self.sizes[skip]
            self.sizes = array("q", [s - dropped for s in self.sizes[skip:]])
            self.base += skip
            self.skip = 0
        return size + RECORD_OVERHEAD

    def bytes_from(self, offset: int) -> int:
        index = offset - self.base
        if index >= len(self.messages):
            return 0
        return self.sizes[-1] - self.sizes[max(index, self.skip)]

    def read(self, offset: int, max_bytes: int, max_messages: int) -> tuple[list[bytes], int]:
        """Messages from ``offset`` (retained, at most ``end``): as many as fit in
        ``max_bytes`` and ``max_messages``, but at least one if there is one."""
        index = offset - self.base
        count = len(self.messages)
        if index >= count:
            return [], offset
        sizes = self.sizes
        high = min(count, index + max_messages)
        stop = bisect_right(sizes, sizes[index] + max_bytes, index + 1, high + 1) - 1
        stop = max(stop, index + 1)
        batch = self.messages[index:stop]
        return batch, self.base + stop  # type: ignore[return-value]  # no None past skip


class MessageLog:
    """Topics by name, created by their first message, and retention.

    Retention drops a topic's oldest messages while it holds more than ``retention``
    messages or ``retention_bytes`` bytes, and the server's oldest messages (whatever
    their topic) while all topics together hold more than ``total_retention_bytes``.
    Bytes are bodies plus ``RECORD_OVERHEAD`` per message.

    The server-wide age order is a queue with one entry (the topic) per appended
    message. Per-topic retention drops a topic's oldest messages without touching the
    queue: it counts them in ``topic.stale`` instead, and the queue skips that many of
    the topic's entries (its oldest ones, the dropped messages') when it meets them.
    When skipped entries outnumber live ones, the queue is rebuilt without them:
    amortised O(1) per message, and the queue never holds more than twice the
    retained messages.

    A topic with no messages, no parked polls and no activity (publish or poll) for
    ``topic_idle_ms`` is dropped: a timer per topic on ``timer``, re-armed with
    ``handle.reset`` on every activity.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.topics: dict[str, Topic] = {}
        self.timer: Timer | None = None  # set while the server runs
        self.waiting: dict[str, int] = {}  # topic name -> parked polls
        self._queue: deque[Topic] = deque()
        self._stale = 0  # skipped entries in the queue
        self.retained_bytes = 0
        self.retained_messages = 0
        self.evicted = 0  # messages dropped by retention
        self.dropped_topics = 0

    # -- writing --

    def append(self, name: str, body: bytes) -> tuple[int, list[Topic]]:
        """Append ``body`` to topic ``name`` (created if new). Returns the message's
        offset and the other topics whose log start offset moved."""
        limits = self.limits
        topic = self.topics.get(name)
        if topic is None:
            if len(self.topics) >= limits.max_topics:
                raise BadRequest(
                    429,
                    "topic",
                    f"the server holds its maximum of {limits.max_topics} topics: "
                    f"topic {_shown(name)} is not created (idle empty topics are dropped "
                    f"after {limits.topic_idle_ms} ms)",
                    max_topics=limits.max_topics,
                )
            topic = self.topics[name] = Topic(name)
            timer = self.timer
            if timer is not None and not timer.closed:
                topic.idle = timer.schedule_nowait(
                    limits.topic_idle_ms / 1000, self._idle, topic, label="topic-idle"
                )
        else:
            self.touch(topic)
        offset = topic.append(body)
        self._queue.append(topic)
        self.retained_bytes += len(body) + RECORD_OVERHEAD
        self.retained_messages += 1
        # This topic's retention: never its newest message (Limits guarantees it fits).
        while topic.count > limits.retention or topic.charged > limits.retention_bytes:
            self._drop(topic)
            topic.stale += 1
            self._stale += 1
        # The server's: the oldest messages first, whatever their topic.
        moved: list[Topic] = []
        queue = self._queue
        while self.retained_bytes > limits.total_retention_bytes:
            victim = queue.popleft()
            if victim.stale:
                victim.stale -= 1
                self._stale -= 1
                continue
            self._drop(victim)
            if victim is not topic and (not moved or moved[-1] is not victim):
                moved.append(victim)
            if not victim.count:
                self.touch(victim)  # empty now: idle from now on
        if self._stale > max(self.retained_messages, 1024):
            self._rebuild_queue()
        return offset, moved

    def _drop(self, topic: Topic) -> None:
        self.retained_bytes -= topic.drop_oldest()
        self.retained_messages -= 1
        self.evicted += 1

    def _rebuild_queue(self) -> None:
        # Each topic's stale entries are its oldest ones: skip that many, in order.
        fresh: deque[Topic] = deque()
        for topic in self._queue:
            if topic.stale:
                topic.stale -= 1
            else:
                fresh.append(topic)
        self._queue = fresh
        self._stale = 0

    # -- idle topics --

    def touch(self, topic: Topic) -> None:
        """Activity on ``topic``: its idle time starts again (O(1) on the wheel)."""
        handle = topic.idle
        timer = self.timer
        if handle is not None and timer is not None and not timer.closed:
            handle.reset(self.limits.topic_idle_ms / 1000)

    def touch_name(self, name: str) -> None:
        topic = self.topics.get(name)
        if topic is not None:
            self.touch(topic)

    def _idle(self, topic: Topic) -> None:
        # The topic's idle timer fired: nothing happened on it for topic_idle_ms.
        if self.topics.get(topic.name) is not topic:
            return
        if topic.count or self.waiting.get(topic.name):
            return  # re-armed when it empties or its last poll leaves
        del self.topics[topic.name]
        topic.idle = None
        self.dropped_topics += 1

    def park(self, name: str) -> None:
        self.waiting[name] = self.waiting.get(name, 0) + 1

    def unpark(self, name: str) -> None:
        left = self.waiting[name] - 1
        if left:
            self.waiting[name] = left
        else:
            del self.waiting[name]
            self.touch_name(name)

    # -- reading --

    def bounds(self, name: str) -> tuple[int, int]:
        """``(log start offset, log end offset)``; ``(0, 0)`` for an unknown topic."""
        topic = self.topics.get(name)
        return (0, 0) if topic is None else (topic.start, topic.end)

    def check_offset(self, name: str, offset: int) -> None:
        """410 below the log start offset, 409 past the log end offset."""
        start, end = self.bounds(name)
        if offset < start:
            raise BadRequest(
                410,
                "offset",
                f"offset {offset} of topic {_shown(name)} is no longer retained; "
                f"the earliest is {start}",
                earliest=start,
                latest=end,
            )
        if offset > end:
            raise BadRequest(
                409,
                "offset",
                f"offset {offset} is past the end of topic {_shown(name)}; "
                f"the next message will get {end}",
                earliest=start,
                latest=end,
            )

    def ready(self, name: str, offset: int, min_bytes: int) -> bool:
        """Can a poll be answered now: ``min_bytes`` are there, or its offset is no
        longer retained (answered 410)?"""
        topic = self.topics.get(name)
        if topic is None:
            return min_bytes <= 0
        return offset < topic.start or topic.bytes_from(offset) >= min_bytes

    def read(self, name: str, offset: int, max_bytes: int) -> tuple[list[bytes], int]:
        self.check_offset(name, offset)
        topic = self.topics.get(name)
        if topic is None:
            return [], offset
        return topic.read(offset, max_bytes, self.limits.max_messages)


# -- bodies being received -----------------------------------------------------------------


# The most clients ByteBudget remembers as fallen behind (about 150 bytes each).
MAX_BEHIND = 10_000


class ByteBudget:
    """At most ``limit`` bytes of request bodies held at once, and at most
    ``client_limit`` of them by one client (peer address): Kafka's
    ``queued.max.request.bytes``, per connection's peer as well.

    A body is reserved when its first bytes arrive (IncomingBody), never before: a
    client that opens a body and sends nothing holds nothing (issue 20: 33 silent
    chunked uploads each held 1 MiB of the 32 MiB until their deadline). A body that
    arrives whole with its first bytes is not reserved at all: nothing of it is left
    to receive, so it never waits here, behind however many bodies under way. A
    request that waits is not read, so the server reads no more of its body than the
    HTTP server's own buffer. A body that holds a reservation must keep pace with it
    or lose it (IncomingBody's pace rule, --body-stall-ms): one byte and silence
    holds a reservation for the stall time only.

    Waiters are granted in arrival order, but those of a client whose last body fell
    behind (``fell_behind``: it ended, unfinished, behind a steady pace) wait behind
    everyone else's for ``memory`` seconds: bodies that stall and come back, however
    many, do not stay ahead of the bodies of clients that keep pace. A waiter blocked
    by its own client's share does not block the others (only its own client's
    releases can unblock it); one that does not fit the whole budget blocks those
    behind it, so that smaller ones cannot starve it.
    Invariants: ``used == sum(clients.values())``, ``clients[c] <= client_limit``,
    ``used <= limit``; no client has a zero entry.
    """

    def __init__(
        self,
        limit: int,
        client_limit: int | None = None,
        *,
        memory: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.client_limit = limit if client_limit is None else client_limit
        self.used = 0
        self.clients: dict[str, int] = {}
        # Waiters: [client, size, event], in arrival order.
        self._queue: deque[list[Any]] = deque()
        # Clients whose last body fell behind -> until when their bodies wait behind
        # the others'; in the order they expire (each is memory after its marking).
        self.behind: dict[str, float] = {}
        self.memory = memory
        self.clock = clock

    def fell_behind(self, client: str) -> None:
        """A body of ``client`` ended unfinished, behind a steady pace: its client's
        bodies wait behind everyone else's for ``memory`` seconds from now. At most
        ``MAX_BEHIND`` clients are remembered, the most recent ones."""
        now = self.clock()
        behind = self.behind
        behind.pop(client, None)
        behind[client] = now + self.memory
        self._forget(now)
        while len(behind) > MAX_BEHIND:
            del behind[next(iter(behind))]
        self._grant()

    def _forget(self, now: float) -> None:
        # The marks that expired: the oldest first (each is memory after its marking).
        behind = self.behind
        while behind:
            client = next(iter(behind))
            if behind[client] > now:
                return
            del behind[client]

    def _take(self, client: str, size: int) -> None:
        self.used += size
        self.clients[client] = self.clients.get(client, 0) + size

    async def acquire(self, client: str, size: int) -> None:
        """Reserve ``size`` bytes for ``client``; waits until they fit."""
        if size > self.client_limit:
            raise ValueError(f"cannot reserve {size} of {self.client_limit} bytes")
        if size <= 0:
            return
        entry: list[Any] = [client, size, anyio.Event()]
        queue = self._queue
        queue.append(entry)
        self._grant()  # at once if nobody before it waits for the whole budget
        if entry[2].is_set():
            return
        try:
            await entry[2].wait()
        except BaseException:
            if entry[2].is_set():
                self.release(client, size)  # granted as we were cancelled
            else:
                queue.remove(entry)
                self._grant()  # the ones behind it may fit now
            raise

    def release(self, client: str, size: int) -> None:
        if size <= 0:
            return
        self.used -= size
        left = self.clients[client] - size
        if left:
            self.clients[client] = left
        else:
            del self.clients[client]
        self._grant()

    def _grant(self) -> None:
        # In order, first the clients that keep pace, then those that fell behind; a
        # waiter over its client's share is passed over, one that does not fit the
        # whole budget stops the walk (so later, smaller ones cannot starve it).
        queue = self._queue
        if not queue:
            return
        behind = self.behind
        if behind:
            self._forget(self.clock())
        for last in (False, True):
            for entry in list(queue):
                client, size, event = entry
                if (client in behind) is not last:
                    continue
                if self.used + size > self.limit:
                    return
                if self.clients.get(client, 0) + size > self.client_limit:
                    continue
                queue.remove(entry)
                self._take(client, size)
                event.set()

    def waiting(self, client: str | None = None) -> int:
        """How many bodies wait for a reservation (of ``client``'s, if given)."""
        if client is None:
            return len(self._queue)
        return sum(entry[0] == client for entry in self._queue)


# How much of an oversized body we still read (and drop) before answering 413.
DRAIN_BYTES = 1 << 20


class IncomingBody:
    """Receives one request body within the limits: ``async with
    IncomingBody(request, limit, budget).receive() as body``.

    The body is streamed: never more than ``limit`` bytes of it are kept. When its
    first bytes arrive, the body is reserved in ``budget`` for the request's peer
    address (its Content-Length, or ``limit`` when chunked) until the block ends,
    unless those first bytes are the whole body: then there is nothing left to
    receive, and nothing is reserved.
    A 413 is raised as soon as the body is known to exceed ``limit``: at once when
    Content-Length says so, or when the streamed size passes it.

    Given its ``deadline`` (the ``timer.timeout`` the body is received under), a body
    that holds its reservation must keep pace with it: the deadline is brought
    forward to ``stall`` after the grant plus the share of ``window`` that the bytes
    received are of the bytes reserved (``_keep_pace``); ``stalled`` says that this,
    not the overall deadline, ended it.

    An answer sent while the client is still sending its body is often lost: the
    server closes a connection that has unread data, the kernel resets it, and the
    client's kernel drops the answer the client has not read yet ("server disconnected
    without sending a response"). So the rest of a body that is only moderately too
    large (up to ``DRAIN_BYTES`` more) is read and dropped, not kept, before the 413
    goes out; beyond that we answer at once and let the connection go. ``oversized``
    tells the caller that a deadline which cut the reading short cut that drain: the
    answer is still 413.
    """

    __slots__ = (
        "budget",
        "deadline",
        "limit",
        "oversized",
        "request",
        "stall",
        "stalled",
        "timer",
        "window",
    )

    def __init__(
        self,
        request: Request,
        limit: int,
        budget: ByteBudget,
        deadline: Timeout | None = None,
        timer: Timer | None = None,
        stall: float = 0.0,
        window: float = 0.0,
    ) -> None:
        self.request = request
        self.limit = limit
        self.budget = budget
        self.oversized = False
        # The body's deadline (a timer.timeout around the receiving), which the pace
        # rule may bring forward: see receive().
        self.deadline = deadline
        self.timer = timer
        self.stall = stall
        self.window = window
        self.stalled = False  # the pace rule, not the overall deadline, cut it off

    def too_large(self) -> BadRequest:
        # Connection: close, as the rest of the body may still be on its way.
        return BadRequest(
            413,
            "body",
            f"the body exceeds {self.limit} bytes",
            headers={"Connection": "close"},
        )

    @asynccontextmanager
    async def receive(self) -> AsyncIterator[bytes]:
        limit = self.limit
        header = self.request.headers.get("content-length")
        declared = int(header) if header and header.isascii() and header.isdigit() else None
        if declared is not None and declared > limit:
            self.oversized = True
            if declared <= limit + DRAIN_BYTES:
                async for _ in self.request.stream():
                    pass  # dropped as it comes
            raise self.too_large()
        client = self.request.client
        peer = client.host if client is not None else ""
        budget = self.budget
        held = 0  # reserved in budget for this body: 0 until its first bytes arrive
        deadline = self.deadline if self.timer is not None else None
        end = deadline.deadline if deadline is not None else math.inf
        granted = 0.0
        arrived = False  # the whole body arrived and was handed over
        size = 0
        try:
            chunks: list[bytes] = []
            more = True
            while more:
                chunk, more = await self._next_piece()
                if not chunk:
                    continue
                size += len(chunk)
                if size <= limit:
                    if held and deadline is not None:
                        self._keep_pace(deadline, end, granted, size, held)
                    # All of it is here with its first bytes (its Content-Length,
                    # or the HTTP server saw its end): nothing is left to receive,
                    # so nothing to reserve or to wait for. What it holds, the HTTP
                    # server has read already (one read, at most its buffer), and it
                    # is published at once: a small publish never queues behind
                    # bodies under way, however many an attacker keeps there.
                    whole = not more or size == declared
                    if not held and not whole:
                        # The first bytes arrived: reserve the whole body now (its
                        # Content-Length, or the limit when chunked), not before, so
                        # a client that sends nothing holds nothing. Once reserved, a
                        # body never waits again: reserving chunk by chunk would let
                        # bodies under way each hold part of the budget and wait for
                        # the rest, all of them, until their deadline. While we wait
                        # here the HTTP server stops reading this connection.
                        claim = declared if declared is not None else limit
                        await budget.acquire(peer, claim)
                        held = claim
                        if deadline is not None:
                            granted = self._now()
                            self._keep_pace(deadline, end, granted, size, held)
                    chunks.append(chunk)
                    continue
                self.oversized = True
                chunks.clear()  # chunked and too large: keep nothing
                budget.release(peer, held)
                held = 0
                if size > limit + DRAIN_BYTES:
                    break
            if self.oversized:
                raise self.too_large()
            if deadline is not None:
                deadline.reset(max(end - self._now(), 0.0))  # the pace is over
            body = b"".join(chunks)
            chunks.clear()
            arrived = True
            yield body
        finally:
            if held and not arrived and self._behind(granted, size, held):
                # It ends unfinished (cut off, or its client left), behind a steady
                # pace: its client's bodies wait behind those of clients that keep
                # pace for a while. Fillers that send a byte and come back, leaving
                # before or when the stall rule cuts them off, no longer stay ahead
                # of every honest body in the queue, however many they are.
                budget.fell_behind(peer)
            budget.release(peer, held)

    async def _next_piece(self) -> tuple[bytes, bool]:
        """The next piece of the body, and whether more follows. The ASGI messages
        themselves, not ``request.stream()``: ``more_body`` tells a body that has
        arrived whole from one still on its way."""
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            if message["type"] == "http.request":
                return message.get("body", b""), bool(message.get("more_body", False))

    def _behind(self, granted: float, received: int, claim: int) -> bool:
        # Behind a steady pace over the window since the grant, without the stall's
        # slack: one byte of 100 after a tenth of the window is.
        if self.timer is None or not self.window:
            return False
        return received / claim < (self._now() - granted) / self.window

    def _keep_pace(
        self, deadline: Timeout, end: float, granted: float, received: int, claim: int
    ) -> None:
        # The pace rule (issue 28): a body that holds a reservation of `claim` bytes,
        # granted at `granted`, must have received its share by then: the deadline is
        # granted + stall + window * received / claim, never later than the overall
        # one (`end`). One byte and silence holds a 1 MiB reservation for `stall`, not
        # for the whole body timeout, as a body that never sent a byte holds nothing;
        # a steady upload stays ahead of it; one that sent half holds on for half the
        # window. Each piece moves it later: an O(1) reset on the wheel.
        pace = granted + self.stall + self.window * received / claim
        self.stalled = pace < end
        deadline.reset(max(min(pace, end) - self._now(), 0.0))

    def _now(self) -> float:
        assert self.timer is not None
        return self.timer.time()


# -- a poll in the purgatory ---------------------------------------------------------------


class Fetch(DelayedOperation):
    """One waiting poll: Kafka's DelayedFetch.

    ``on_complete`` builds the answer (like Kafka's ``onComplete`` building the fetch
    response) and cancels the scope in which the request handler waits, which wakes
    the handler. The handler waits by reading ``receive()``, so a client that goes
    away wakes it too: one task per poll, nothing spawned to watch the connection.
    """

    __slots__ = (
        "abandoned",
        "expired",
        "log",
        "max_bytes",
        "min_bytes",
        "offset",
        "result",
        "scope",
        "service",
        "topic",
    )

    def __init__(
        self,
        service: LongPollService,
        topic: str,
        offset: int,
        min_bytes: int,
        max_bytes: int,
        timeout: float,
    ) -> None:
        super().__init__(timeout)
        self.service = service
        self.log = service.log
        self.topic = topic
        self.offset = offset
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.result: Response | None = None
        self.scope: anyio.CancelScope | None = None
        self.abandoned = False  # the client went away: nothing to build
        self.expired = False

    def try_complete(self) -> bool:
        if self.log.ready(self.topic, self.offset, self.min_bytes):
            return self.force_complete()
        if self.service.closing:  # the server is stopping: answer with what there is
            self.expired = True
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        if self.abandoned:
            return
        self.result = self.service.answer(self.topic, self.offset, self.max_bytes)
        if self.scope is not None:
            self.scope.cancel()

    def on_expiration(self) -> None:
        self.expired = True

    def take_result(self) -> Response:
        """The answer, which the operation lets go of: the purgatory may keep a
        completed operation in a watch list until its topic is checked again or the
        lists are purged (up to purge_interval of them), and it must not keep a
        1 MiB answer alive there after the answer was sent (issue 20)."""
        result = self.result
        assert result is not None
        self.result = None
        return result


# -- the service --------------------------------------------------------------------------


class LongPollService:
    """The message log, the parking strategy, the limits and the counters behind
    ``/stats``."""

    def __init__(
        self,
        mode: str = "purgatory",
        *,
        limits: Limits | None = None,
        tick: float = 0.001,
    ) -> None:
        if mode not in ("purgatory", "wait_for"):
            raise ValueError(f"mode must be 'purgatory' or 'wait_for', got {mode!r}")
        if not (isinstance(tick, (int, float)) and tick > 0 and math.isfinite(tick)):
            raise ValueError(f"tick must be a positive number of seconds, got {tick!r}")
        self.mode = mode
        self.limits = limits if limits is not None else Limits()
        self.tick = tick
        self.log = MessageLog(self.limits)
        self.inflight = ByteBudget(
            self.limits.max_inflight_bytes,
            self.limits.max_client_inflight_bytes,
            memory=self.limits.body_timeout_ms / 1000,
            clock=self._time,
        )
        self.timer: Timer | None = None
        self.purgatory: Purgatory | None = None
        self.backend = ""
        # wait_for mode: one event per topic with waiters, replaced on each publish.
        self._events: dict[str, asyncio.Event] = {}
        self._waiting = 0  # wait_for mode's parked polls
        self.immediate = 0  # answered without parking
        self.completed = 0  # parked, answered because data arrived
        self.expired = 0  # parked, answered empty-handed or short at max_wait_ms
        self.disconnected = 0  # parked, client went away first
        self.publishes_disconnected = 0  # the client left before its body arrived
        self.published = 0
        self.refused: dict[int, int] = {}  # status -> requests refused by a limit
        # The server is stopping (shut_down): parked polls are answered at once, bodies
        # still arriving are cut off, so that no request is left for the server to
        # cancel (a traceback in its log, an empty reply for its client).
        self.closing = False
        self._bodies: set[Timeout] = set()  # the deadline of each body being received
        # HTTP requests in the app, their answers being sent included (RequestCounter):
        # what a stopping server waits for (see _uvicorn_server).
        self.requests = 0

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes

    def _time(self) -> float:
        # The clock of the bodies' deadlines: the service's timer while it runs.
        timer = self.timer
        return timer.time() if timer is not None and not timer.closed else time.monotonic()

    @property
    def max_messages(self) -> int:
        return self.limits.max_messages

    # -- lifecycle (the app's lifespan) --

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self.backend = current_backend()
        if self.mode == "wait_for" and self.backend == "trio":
            raise RuntimeError("--mode wait_for parks polls on asyncio.wait_for: not on trio")
        from aiowheel.middleware import shared_timer

        async with AsyncExitStack() as stack:
            # The connections' idle timer (uvicorn_protocol uses the loop's shared
            # timer) lives as long as the server too: a wheel of its own, with a 10 ms
            # tick (connection timeouts are seconds long). Unless this loop has one
            # already (another server in it), which its connections share then.
            try:
                await stack.enter_async_context(shared_timer())
            except RuntimeError:
                pass
            # One timer for the polls' timeouts (purgatory mode), the topics' idle
            # times and the body deadlines.
            timer = await stack.enter_async_context(Timer(tick=self.tick))
            self.timer = self.log.timer = timer
            self.closing = False
            try:
                if self.mode == "wait_for":
                    yield
                    return
                with Purgatory(timer, name="fetch") as purgatory:
                    self.purgatory = purgatory
                    try:
                        yield
                    finally:
                        self.purgatory = None
            finally:
                self.log.timer = None

    def shut_down(self) -> None:
        """The HTTP server is stopping: answer every parked poll now with what there
        is, as at its ``max_wait_ms``, and end the bodies still being received (503).
        Idempotent. Called by the server's connections as the server begins its
        graceful shutdown (see ``_uvicorn_config``)."""
        if self.closing:
            return
        self.closing = True
        purgatory = self.purgatory
        if purgatory is not None:
            for topic in list(self.log.waiting):
                purgatory.check_and_complete(topic)  # Fetch.try_complete: closing
        events, self._events = self._events, {}
        for event in events.values():  # wait_for mode: every waiter re-checks
            event.set()
        for deadline in list(self._bodies):
            deadline.reset(0)

    @contextmanager
    def receiving(self, deadline: Timeout) -> Iterator[None]:
        """A body is being received under ``deadline`` (a ``timer.timeout``), which
        ``shut_down`` moves to now."""
        if self.closing:
            deadline.reset(0)
        self._bodies.add(deadline)
        try:
            yield
        finally:
            self._bodies.discard(deadline)

    # -- counters --

    def parked(self) -> int:
        if self.purgatory is not None:
            return self.purgatory.delayed()
        return self._waiting

    def refuse(self, error: BadRequest) -> Response:
        self.refused[error.status] = self.refused.get(error.status, 0) + 1
        return error.response()

    def stats(self) -> dict[str, Any]:
        answered = self.immediate + self.completed + self.expired
        log = self.log
        return {
            "mode": self.mode,
            "backend": self.backend,
            "parked": self.parked(),
            "immediate": self.immediate,
            "completed": self.completed,
            "expired": self.expired,
            "disconnected": self.disconnected,
            "publishes_disconnected": self.publishes_disconnected,
            "answered": answered,
            "published": self.published,
            "refused": {str(status): n for status, n in sorted(self.refused.items())},
            "watched": self.purgatory.watched() if self.purgatory is not None else None,
            # How late the wheel fired expiries at worst: tells server-side lateness
            # from the HTTP round trip and the scheduling of a busy machine.
            "timer_lateness_max_ms": (
                self.timer.stats().lateness_max * 1000 if self.timer is not None else None
            ),
            "topics": len(log.topics),
            "retained_bytes": log.retained_bytes,
            "retained_messages": log.retained_messages,
            "evicted_messages": log.evicted,
            "dropped_topics": log.dropped_topics,
            "inflight_bytes": self.inflight.used,
            "inflight_waiting": self.inflight.waiting(),
            "inflight_clients": len(self.inflight.clients),
            # Clients whose last body fell behind a steady pace: theirs wait last.
            "inflight_behind": len(self.inflight.behind),
            "limits": self.limits.as_dict(),
            "cpu_time": time.process_time(),
        }

    # -- publishing --

    def publish(self, topic: str, body: bytes) -> int:
        offset, moved = self.log.append(topic, body)
        self.published += 1
        self._wake(topic)
        # Polls parked below a log start offset that just moved: answer them (410) now.
        for other in moved:
            if other.name in self.log.waiting:
                self._wake(other.name)
        return offset

    def _wake(self, topic: str) -> None:
        if self.purgatory is not None:
            self.purgatory.check_and_complete(topic)
        else:
            event = self._events.pop(topic, None)
            if event is not None:
                event.set()

    # -- polling --

    def answer(self, topic: str, offset: int, max_bytes: int) -> Response:
        try:
            messages, next_offset = self.log.read(topic, offset, max_bytes)
        except BadRequest as error:
            return error.response()
        return answer_messages(messages, next_offset)

    def admit(self, topic: str, offset: int, max_wait_ms: int, min_bytes: int) -> None:
        """Refuse (503) a poll that would park while ``max_waiters`` polls are parked."""
        if self.parked() < self.limits.max_waiters:
            return
        if max_wait_ms == 0 or self.log.ready(topic, offset, min_bytes):
            return  # answered without parking
        raise BadRequest(
            503,
            None,
            f"the server has {self.limits.max_waiters} polls waiting already; retry later",
            headers={"Retry-After": "1"},
        )

    async def poll(
        self,
        request: Request,
        topic: str,
        offset: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
    ) -> Response:
        self.log.touch_name(topic)
        if self.mode == "purgatory":
            return await self.poll_purgatory(
                request, topic, offset, max_wait_ms, min_bytes, max_bytes
            )
        return await self.poll_wait_for(request, topic, offset, max_wait_ms, min_bytes, max_bytes)

    async def poll_purgatory(
        self,
        request: Request,
        topic: str,
        offset: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
    ) -> Response:
        purgatory = self.purgatory
        assert purgatory is not None
        op = Fetch(self, topic, offset, min_bytes, max_bytes, max_wait_ms / 1000)
        if purgatory.try_complete_else_watch(op, (topic,)):
            self.immediate += 1
            return op.take_result()
        # Parked. Wait for whichever comes first: the operation completes (on_complete
        # cancels this scope) or the client disconnects (receive() says so). Reading
        # receive() ourselves is what lets a dropped poll leave the purgatory at once.
        self.log.park(topic)
        try:
            with anyio.CancelScope() as scope:
                op.scope = scope
                receive = request.receive
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        break
        finally:
            if not op.is_completed():
                # Disconnected, or this handler is being cancelled (server shutdown):
                # take the poll out now rather than leave it parked until its timeout.
                op.abandoned = True
                if op.force_complete():
                    self.disconnected += 1
            op.scope = None
            self.log.unpark(topic)
        if op.abandoned:
            return Response(status_code=204)  # nobody is listening
        if op.expired:
            self.expired += 1
        else:
            self.completed += 1
        return op.take_result()

    async def poll_wait_for(
        self,
        request: Request,
        topic: str,
        offset: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
    ) -> Response:
        log = self.log
        if log.ready(topic, offset, min_bytes):
            self.immediate += 1
            return self.answer(topic, offset, max_bytes)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch_disconnect() -> None:
            nonlocal gone
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    task.cancel()
                    return

        watcher = loop.create_task(watch_disconnect())
        self._waiting += 1
        log.park(topic)
        expired = False
        try:
            expired = await self._wait_until_ready(topic, offset, min_bytes, deadline)
        except asyncio.CancelledError:
            if not gone:
                raise
        finally:
            self._waiting -= 1
            log.unpark(topic)
            if topic not in log.waiting:
                self._events.pop(topic, None)  # nobody waits on it any more
            watcher.cancel()
            if gone and task.cancelling():
                task.uncancel()  # our own cancellation, from watch_disconnect
        if gone:
            self.disconnected += 1
            return Response(status_code=204)
        if expired:
            self.expired += 1
        else:
            self.completed += 1
        return self.answer(topic, offset, max_bytes)

    async def _wait_until_ready(
        self, topic: str, offset: int, min_bytes: int, deadline: float
    ) -> bool:
        """``wait_for`` mode: wait until ``min_bytes`` are there, re-checking after
        each publish on the topic; True if ``deadline`` (loop time) came first, or the
        server is stopping (answered with what there is)."""
        log = self.log
        loop = asyncio.get_running_loop()
        while not log.ready(topic, offset, min_bytes):
            remaining = deadline - loop.time()
            if self.closing or remaining <= 0:
                return True
            event = self._events.get(topic)
            if event is None:
                event = self._events[topic] = asyncio.Event()
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return True
        return False


def current_backend() -> str:
    """The event loop running this code: ``"asyncio"``, ``"uvloop"``, ``"trio"``, or
    aiowheel's drop-in loop, ``"aiowheel"`` (on asyncio's loop) or
    ``"aiowheel-uvloop"`` (on uvloop's)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return "trio"  # anyio runs us on asyncio or trio; not asyncio, so trio
    base = loop_base(loop)
    if base is not None:
        return "aiowheel" if base == "asyncio" else f"aiowheel-{base}"
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def _json(body: Any, status: int = 200) -> Response:
    # Compact separators: smaller answers, and the same encoding in both modes.
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(data, status_code=status, media_type="application/json")


# -- answers -------------------------------------------------------------------------------

# Bytes JSON writes as they are (ensure_ascii=False): all but '"', '\\' and the C0
# controls. A UTF-8 body's escaped length follows from the bytes JSON escapes.
_PLAIN_BYTES = bytes(b for b in range(0x20, 0x100) if b not in b'"\\')
_SHORT_ESCAPES = tuple(bytes([b]) for b in b'"\\\b\f\n\r\t')  # 2 bytes each; others 6
# Answers larger than ANSWER_PIECE bytes are written in pieces of about that size: a
# piece is complete once it reaches ANSWER_PIECE, after escaping up to ANSWER_SLICE
# more bytes of a message (at most 6 bytes each), so no piece exceeds 40 KiB.
ANSWER_PIECE = 16 << 10
ANSWER_SLICE = 4 << 10


def escaped_length(body: bytes) -> int:
    """``len(json.dumps(body.decode(), ensure_ascii=False).encode())``, without
    building it (two passes in C over ``body``)."""
    special = body.translate(None, _PLAIN_BYTES)
    short = sum(special.count(escape) for escape in _SHORT_ESCAPES)
    return len(body) + 2 + short + 5 * (len(special) - short)


def answer_messages(messages: list[bytes], next_offset: int) -> Response:
    """``{"messages": [...], "next_offset": n}``: built at once when small, else
    written in pieces of about ``ANSWER_PIECE`` bytes (``StreamedAnswer``)."""
    size = (
        len('{"messages":[],"next_offset":}')
        + len(str(next_offset))
        + sum(escaped_length(message) for message in messages)
        + max(len(messages) - 1, 0)
    )
    if size <= ANSWER_PIECE:
        texts = [message.decode() for message in messages]
        return _json({"messages": texts, "next_offset": next_offset})
    return StreamedAnswer(messages, next_offset, size)


class StreamedAnswer(Response):
    """A large answer, written piece by piece with its exact Content-Length.

    The HTTP server waits before each piece while the client is not reading (uvicorn
    and hypercorn apply flow control to every ``send``), so a client that never reads
    its answer makes the server hold two pieces of it and its own write buffer (64 KiB
    on asyncio), not the whole escaped answer: JSON writes a control character as six
    bytes, so a 1 MiB message of them would be a 6 MiB answer per connection. The
    messages themselves are the log's own objects, not copies.
    """

    def __init__(self, messages: list[bytes], next_offset: int, size: int) -> None:
        # Not Response.__init__: it would render a body.
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = [
            (b"content-length", str(size).encode()),
            (b"content-type", b"application/json"),
        ]
        self.messages = messages
        self.next_offset = next_offset
        self.size = size

    def pieces(self) -> Iterator[bytes]:
        buffer = bytearray(b'{"messages":[')
        for index, message in enumerate(self.messages):
            buffer += b',"' if index else b'"'
            decoder = codecs.getincrementaldecoder("utf-8")()
            view = memoryview(message)
            for start in range(0, len(view), ANSWER_SLICE):
                end = start + ANSWER_SLICE
                text = decoder.decode(view[start:end], final=end >= len(view))
                buffer += json.dumps(text, ensure_ascii=False)[1:-1].encode()
                if len(buffer) >= ANSWER_PIECE:
                    yield bytes(buffer)
                    buffer.clear()
            buffer += b'"'
        buffer += b'],"next_offset":%d}' % self.next_offset
        yield bytes(buffer)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            for piece in self.pieces():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            # Sent (or abandoned): the messages are the log's, and retention may have
            # dropped them meanwhile; nothing here keeps them alive any longer.
            self.messages = []


# -- request parsing ------------------------------------------------------------------------


def route_path(request: Request) -> str:
    """The request's path below the app's root path, as the server decoded it."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path


def check_topic_name(name: str) -> str:
    """Kafka's rule: 1 to 249 of ``A-Z a-z 0-9 . _ -``, and neither ``.`` nor ``..``."""
    if not name:
        raise BadRequest(400, "topic", "the topic name must not be empty")
    if name in (".", ".."):
        raise BadRequest(400, "topic", f"{name!r} is not a topic name")
    if not TOPIC_NAME.fullmatch(name):
        raise BadRequest(
            400,
            "topic",
            "a topic name is 1 to 249 characters from A-Z, a-z, 0-9, '.', '_' and '-', "
            f"got {_shown(name)}",
        )
    return name


def parse_topic(request: Request) -> str:
    # The decoded path, not the route's path parameter: the router's pattern ends in
    # "$", which also matches before a final newline, so "/topics/t%0A" would come out
    # as "t". The name is checked as sent, never normalised.
    path = route_path(request)
    name = path.removeprefix("/topics").removeprefix("/")
    return check_topic_name(name)


def _integer(parameter: str, raw: str | None, default: int | None, low: int, high: int) -> int:
    if raw is None:
        if default is None:
            raise BadRequest(400, parameter, f"{parameter} is required")
        return default
    if not _DIGITS.fullmatch(raw):
        if raw.startswith("-") and _DIGITS.fullmatch(raw[1:]):
            raise BadRequest(400, parameter, f"{parameter} must not be negative, got {raw!r}")
        if raw.isascii() and raw.isdigit():  # too many digits
            raise BadRequest(
                400, parameter, f"{parameter} must be between {low} and {high}, got {raw}"
            )
        raise BadRequest(400, parameter, f"{parameter} must be an integer, got {_shown(raw)}")
    value = int(raw)
    if not low <= value <= high:
        raise BadRequest(
            400, parameter, f"{parameter} must be between {low} and {high}, got {value}"
        )
    return value


def parse_poll(request: Request, max_fetch_bytes: int) -> tuple[int, int, int, int]:
    """``(offset, max_wait_ms, min_bytes, max_bytes)`` from the query string, validated
    by hand so that every error names its parameter."""
    seen: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name not in POLL_PARAMETERS:
            raise BadRequest(400, name, f"unknown query parameter {_shown(name)}")
        if name in seen:
            raise BadRequest(400, name, f"query parameter {name!r} given more than once")
        seen[name] = value
    offset = _integer("offset", seen.get("offset"), 0, 0, MAX_OFFSET)
    max_wait_ms = _integer(
        "max_wait_ms", seen.get("max_wait_ms"), DEFAULT_MAX_WAIT_MS, 0, MAX_WAIT_MS_LIMIT
    )
    min_bytes = _integer("min_bytes", seen.get("min_bytes"), DEFAULT_MIN_BYTES, 0, MIN_BYTES_LIMIT)
    max_bytes = _integer("max_bytes", seen.get("max_bytes"), max_fetch_bytes, 1, max_fetch_bytes)
    return offset, max_wait_ms, min_bytes, max_bytes


async def publish_message(service: LongPollService, request: Request) -> Response:
    """``POST /topics/{topic}``: the body, received within the limits, appended."""
    limits = service.limits
    timer = service.timer
    assert timer is not None
    try:
        topic = parse_topic(request)
        for name, _ in request.query_params.multi_items():
            raise BadRequest(400, name, f"unknown query parameter {_shown(name)}")
        window = limits.body_timeout_ms / 1000
        incoming = None
        try:
            # The whole body (waiting for the in-flight budget included) within
            # body_timeout_ms, and once it holds a reservation at a steady pace: a
            # client that trickles or stalls cannot keep one.
            with (
                timer.timeout(window) as deadline,
                service.receiving(deadline),
            ):
                incoming = IncomingBody(
                    request,
                    limits.max_body_bytes,
                    service.inflight,
                    deadline,
                    timer,
                    limits.body_stall_ms / 1000,
                    window,
                )
                async with incoming.receive() as body:
                    check_message(body)
                    offset = service.publish(topic, body)
        except TimeoutError:
            raise body_cut_off(service, incoming) from None
    except BadRequest as error:
        return service.refuse(error)
    except ClientDisconnect:
        # The client left before its body arrived (while it waited for the
        # in-flight budget, say): normal, not an error. Nobody reads this answer.
        service.publishes_disconnected += 1
        return Response(status_code=204)
    return _json({"offset": offset})


def check_message(body: bytes) -> None:
    """400 for a message that is empty or not UTF-8."""
    if not body:
        raise BadRequest(400, "body", "the message (request body) must not be empty")
    try:
        body.decode()
    except UnicodeDecodeError:
        raise BadRequest(400, "body", "the message must be UTF-8 text") from None


def body_cut_off(service: LongPollService, incoming: IncomingBody | None) -> BadRequest:
    """Why the deadline of a body being received ended it: too large (413, once the
    drain was cut short), the server stopping (503), or too slow (408)."""
    limits = service.limits
    if incoming is not None and incoming.oversized:
        return incoming.too_large()
    if service.closing:
        return BadRequest(
            503,
            None,
            "the server is shutting down",
            headers={"Connection": "close", "Retry-After": "1"},
        )
    if incoming is not None and incoming.stalled:
        message = (
            f"the body fell more than {limits.body_stall_ms} ms behind a "
            f"steady pace over {limits.body_timeout_ms} ms"
        )
    else:
        message = f"the body did not arrive within {limits.body_timeout_ms} ms"
    # Connection: close, as the rest of it may still come.
    return BadRequest(408, "body", message, headers={"Connection": "close"})


# -- the app ----------------------------------------------------------------------------------


def create_app(
    mode: str = "purgatory",
    *,
    limits: Limits | None = None,
    tick: float = 0.001,
    **limit_options: int,
) -> Starlette:
    """The ASGI app. ``app.state.longpoll`` is its ``LongPollService``.

    The limits come as a ``Limits`` or as its keyword arguments
    (``create_app(max_topics=10)``), not both.
    """
    if limits is not None and limit_options:
        raise TypeError("pass limits=Limits(...) or the limits as keywords, not both")
    if limits is None:
        limits = Limits(**limit_options)
    service = LongPollService(mode, limits=limits, tick=tick)

    async def poll(request: Request) -> Response:
        try:
            topic = parse_topic(request)
            offset, max_wait_ms, min_bytes, max_bytes = parse_poll(request, limits.max_fetch_bytes)
            service.log.check_offset(topic, offset)
            service.admit(topic, offset, max_wait_ms, min_bytes)
        except BadRequest as error:
            return service.refuse(error)
        return await service.poll(request, topic, offset, max_wait_ms, min_bytes, max_bytes)

    async def publish(request: Request) -> Response:
        return await publish_message(service, request)

    async def stats(request: Request) -> Response:
        return _json(service.stats())

    async def not_found(request: Request, exc: Exception) -> Response:
        # A path under /topics that the routes do not match (a newline inside the
        # name): a bad topic name, not a missing page.
        if route_path(request).startswith("/topics/"):
            try:
                parse_topic(request)
            except BadRequest as error:
                return service.refuse(error)
        return JSONResponse({"error": "not found", "parameter": None}, status_code=404)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service.running():
            yield

    routes = [
        Route("/topics/{topic:path}", poll, methods=["GET"]),
        Route("/topics/{topic:path}", publish, methods=["POST"]),
        # "/topics" alone: the empty topic name, answered like "/topics/".
        Route("/topics", poll, methods=["GET"]),
        Route("/topics", publish, methods=["POST"]),
        Route("/stats", stats, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found},
        middleware=[Middleware(RequestCounter, service=service)],
    )
    app.state.longpoll = service
    return app


class RequestCounter:
    """ASGI middleware: counts the HTTP requests in the app, from their start until
    their answer has been sent (or their client is gone), in ``service.requests``."""

    def __init__(self, app: Any, service: LongPollService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.service.requests += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.service.requests -= 1


# -- serving ------------------------------------------------------------------------------------


@asynccontextmanager
async def serving(app: Starlette, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` in this event loop while the block runs; yields the base URL.

    uvicorn on asyncio and uvloop, hypercorn on trio. For tests and embedding: the
    command line (``main``) lets each server own the process and its signals.
    """
    if current_backend() == "trio":
        import hypercorn.config
        import hypercorn.trio
        import trio

        config = hypercorn.config.Config()
        config.bind = [f"{host}:{port}"]
        config.backlog = 2048
        config.graceful_timeout = 1.0
        config.accesslog = None
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(
                    hypercorn.trio.serve,
                    _asgi(app),
                    config,
                    shutdown_trigger=partial(_stop_hypercorn, app, stop.wait, 1.0),
                )
            )
            try:
                yield str(binds[0])
            finally:
                stop.set()
        return

    sock = _listening_socket(host, port)
    # log_config=None: uvicorn leaves the logging of the program it is embedded in
    # alone (its own configuration removes the handlers already on its loggers).
    server = _uvicorn_server(app, "none", log_config=None)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # startup failed: raise its error
                raise RuntimeError("uvicorn exited during startup")
            await asyncio.sleep(0.001)
        yield _url(sock)
    finally:
        server.should_exit = True
        await task


async def _signalled() -> None:
    """Returns on SIGINT or SIGTERM (trio): what stops the command line's hypercorn."""
    import signal

    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


async def _stop_hypercorn(app: Starlette, wait: Callable[[], Any], grace: float) -> None:
    """hypercorn's ``shutdown_trigger``: once ``wait()`` returns, answer every parked
    poll and cut off every body (``shut_down``), as on uvicorn, and wait until the
    requests have ended (each does at once now) before hypercorn starts its graceful
    shutdown, which cancels what is left after its ``graceful_timeout``. Only a
    client that does not take its answer within ``grace`` is left to it."""
    import trio

    service: LongPollService = app.state.longpoll
    await wait()
    service.shut_down()
    with trio.move_on_after(grace):
        while service.requests:  # noqa: ASYNC110 - the service has no event to await
            await trio.sleep(0.01)


def _asgi(app: Starlette) -> Any:
    # Starlette's and hypercorn's ASGI type declarations differ in detail only.
    return app


def _listening_socket(host: str, port: int) -> socket.socket:
    # proto=IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets
    # whose proto says TCP. Without it, Nagle holds the body of an answer back until
    # the client's delayed ACK of the headers arrives (~40 ms on Linux).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_config(app: Starlette, loop: str, **options: Any) -> Any:
    import uvicorn

    from aiowheel.middleware import uvicorn_protocol

    service: LongPollService = app.state.longpoll
    seconds = service.limits.header_timeout_ms / 1000
    # uvicorn alone waits for a request head for ever (slowloris, issue 28): its
    # connections get aiowheel's connection-level idle timeout, on the loop's shared
    # timer (the service registers its own timer as that one while it runs).
    base: Any = uvicorn_protocol(timeout=seconds, header_timeout=seconds, base="h11")

    class LongPollHTTP(base):  # type: ignore[misc]
        def shutdown(self) -> None:
            # uvicorn calls this on every connection as its graceful shutdown begins,
            # before it waits for requests in flight (and cancels what is left):
            # answer the parked polls now, with what there is.
            service.shut_down()
            super().shutdown()

    return uvicorn.Config(
        app,
        loop=loop,
        http=LongPollHTTP,
        lifespan="on",
        log_level="warning",
        access_log=False,
        backlog=2048,
        timeout_graceful_shutdown=1,
        **options,
    )


# --backend: uvicorn's loop setting for each asyncio backend (trio is hypercorn's). The
# drop-in loop by the import string of its factory, as docs/loop.md says uvicorn takes it.
UVICORN_LOOPS = {
    "asyncio": "asyncio",
    "uvloop": "uvloop",
    "aiowheel": "aiowheel:new_event_loop",
    "aiowheel-uvloop": "aiowheel:new_uvloop_event_loop",
}
BACKENDS = (*UVICORN_LOOPS, "trio")


def _uvicorn_server(app: Starlette, loop: str, **options: Any) -> Any:
    """A ``uvicorn.Server`` for ``app`` whose graceful shutdown never cancels a request.

    uvicorn's own gives the requests in flight a grace period of wall-clock time
    (``timeout_graceful_shutdown``) and then cancels what is left: a CancelledError
    traceback each in the log and an ERROR line, and no answer for the client. Whether
    a request was left depended on how soon its task ran and how soon its client read
    its answer: under load, now and then, one was. Here the server stops accepting,
    ends every request of the service (``shut_down``: parked polls answered, bodies
    cut off with 503), and waits for them until they have ended, as each does at once.
    The only thing that can keep one going is a client that does not take its answer:
    once it has had the grace period, its connection is dropped (its request then
    ends, quietly, as for any client gone away), never its request cancelled. Then
    uvicorn's own shutdown has nothing left to cancel."""
    import uvicorn

    service: LongPollService = app.state.longpoll
    config = _uvicorn_config(app, loop, **options)
    grace = float(config.timeout_graceful_shutdown or 0)

    class LongPollServer(uvicorn.Server):
        def _unsent(self) -> list[Any]:
            # The connections holding output their client has not taken yet.
            return [
                connection
                for connection in list(self.server_state.connections)
                if connection.transport.get_write_buffer_size()
            ]

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            for server in self.servers:
                server.close()  # no new connections
            # No new requests either: an idle connection is closed, one with a request
            # in flight after its answer (uvicorn's own first step, which it repeats).
            # LongPollHTTP.shutdown tells the service.
            for connection in list(self.server_state.connections):
                connection.shutdown()
            service.shut_down()
            loop = asyncio.get_running_loop()
            while service.requests or self._unsent():
                end = loop.time() + grace
                # Polled as uvicorn polls: neither it nor the transports tell.
                while (service.requests or self._unsent()) and loop.time() < end:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                for connection in self._unsent():
                    connection.transport.abort()  # its client does not read its answer
            await super().shutdown(sockets)

    return LongPollServer(config)


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1, or a one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def _positive_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


# (flag, Limits field, help). The defaults are Limits' own.
LIMIT_FLAGS = (
    ("--max-body-bytes", "max_body_bytes", "largest message; larger publishes get 413"),
    ("--retention-bytes", "retention_bytes", "bytes retained per topic, oldest dropped first"),
    (
        "--total-retention-bytes",
        "total_retention_bytes",
        "bytes retained by all topics together, oldest dropped first",
    ),
    ("--retention", "retention", "messages retained per topic"),
    ("--max-topics", "max_topics", "topics at once; a publish creating one more gets 429"),
    ("--topic-idle-ms", "topic_idle_ms", "an empty topic with no polls is dropped after this"),
    (
        "--max-fetch-bytes",
        "max_fetch_bytes",
        "largest max_bytes a poll may ask for, and its default",
    ),
    ("--max-messages", "max_messages", "messages per answer"),
    ("--max-waiters", "max_waiters", "parked polls at once; more get 503"),
    ("--max-inflight-bytes", "max_inflight_bytes", "request bodies being received at once"),
    (
        "--max-client-inflight-bytes",
        "max_client_inflight_bytes",
        "of those, what one client (peer address) may hold",
    ),
    ("--body-timeout-ms", "body_timeout_ms", "time to receive a body; slower clients get 408"),
    (
        "--body-stall-ms",
        "body_stall_ms",
        "how far a reserved body may fall behind a steady pace; then 408",
    ),
    (
        "--header-timeout-ms",
        "header_timeout_ms",
        "time to receive a request head, and to send one at all (uvicorn; slowloris)",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_port, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="asyncio",
        help="the event loop: aiowheel is aiowheel's drop-in loop on asyncio's, "
        "aiowheel-uvloop the same on uvloop's",
    )
    parser.add_argument("--mode", choices=("purgatory", "wait_for"), default="purgatory")
    defaults = Limits()
    for flag, field, text in LIMIT_FLAGS:
        parser.add_argument(flag, type=_positive_int, default=getattr(defaults, field), help=text)
    parser.add_argument("--tick-ms", type=_positive_ms, default=1.0, help="the timer's tick")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mode == "wait_for" and args.backend == "trio":
        parser.error(
            "--mode wait_for uses asyncio.wait_for: choose an asyncio --backend "
            f"({', '.join(UVICORN_LOOPS)})"
        )
    try:
        limits = Limits(**{field: getattr(args, field) for _, field, _ in LIMIT_FLAGS})
    except ValueError as error:
        # The limits that depend on each other, in the flags' words.
        flags = {field: flag for flag, field, _ in LIMIT_FLAGS}
        names = "|".join(sorted(flags, key=len, reverse=True))
        parser.error(re.sub(rf"\b({names})\b", lambda m: flags[m[1]], str(error)))
    app = create_app(args.mode, limits=limits, tick=args.tick_ms / 1000)
    try:
        sock = _listening_socket(args.host, args.port)
    except OSError as error:
        parser.error(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}")
    announce: Callable[[], None] = lambda: print(f"listening on {_url(sock)}", flush=True)  # noqa: E731
    if args.backend == "trio":
        import hypercorn.config
        import hypercorn.trio
        import trio

        config = hypercorn.config.Config()
        config.accesslog = None
        config.graceful_timeout = 1.0
        # hypercorn binds its own socket: hand it ours by file descriptor.
        config.bind = [f"fd://{sock.fileno()}"]
        announce()
        trio.run(
            partial(
                hypercorn.trio.serve,
                _asgi(app),
                config,
                shutdown_trigger=partial(_stop_hypercorn, app, _signalled, config.graceful_timeout),
            )
        )
        return
    announce()
    try:
        _uvicorn_server(app, UVICORN_LOOPS[args.backend]).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the SIGINT it handled, once it has shut down


if __name__ == "__main__":
    main(sys.argv[1:])
