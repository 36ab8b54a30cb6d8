"""The long-poll example's memory under the attack of issue 10, measured as the
operating system sees it: the server's resident set (VmRSS in /proc/PID/status).

Before the limits, four hundred 1 MiB publishes to one topic took the server from 65
to 478 MB, and every new topic stayed for good. Here the server runs as its own
process (examples/longpoll/server.py, the command line an operator would use) with
small limits, and the attack comes over 16 keep-alive connections:

1. 400 publishes of 1 MiB to one topic (retention by bytes per topic);
2. 64 publishes of 1 MiB to 64 topics (retention by bytes for the whole server);
3. 64 polls for a 1 MiB message of control characters (a 6 MiB answer once JSON
   escapes it) on connections that never read their answer, left open;
4. 2,500 publishes to distinct topics (the topic count limit; the rest get 429).

The growth of VmRSS from the warmed-up server to the end must stay within the bound
docs/longpoll.md states, ``Limits.memory_bound(connections)``: total retention, the
topics' overhead, twice the bodies received at once, the parked polls' overhead,
192 KiB plus the messages of one answer per other open connection, and a fixed 32 MiB.
The last test here shows why the messages of an answer count: unread answers keep
the messages retention dropped (issue 28).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from longpoll_helpers import EXAMPLE, server

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc"
)

MiB = 1 << 20
LIMITS = {
    "max_body_bytes": MiB,
    "retention_bytes": 4 * MiB,
    "total_retention_bytes": 16 * MiB,
    "max_topics": 1000,
    "max_inflight_bytes": 8 * MiB,
    "max_waiters": 100,
}
CONNECTIONS = 16
UNREAD = 64  # polls whose answer is never read


def rss(pid: int) -> int:
    """The resident set of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


async def _publisher(
    host: str, port: int, requests: list[tuple[str, bytes]], statuses: dict[int, int]
) -> None:
    # One keep-alive connection, one request after the other: HTTP/1.1 by hand,
    # cheaper than any client library at this rate.
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for target, body in requests:
            head = f"POST {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode())
            writer.write(body)
            await writer.drain()
            header = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            lines = header.split("\r\n")
            length = next(
                int(line.partition(":")[2]) for line in lines if line.startswith("content-length:")
            )
            await reader.readexactly(length)
            status = int(lines[0].split()[1])
            statuses[status] = statuses.get(status, 0) + 1
            assert "connection: close" not in header, lines[0]
    finally:
        writer.close()
        await writer.wait_closed()


async def publish_all(host: str, port: int, requests: list[tuple[str, bytes]]) -> dict[int, int]:
    """Send ``requests`` over CONNECTIONS connections; how many answers had each status."""
    statuses: dict[int, int] = {}
    await asyncio.gather(
        *(_publisher(host, port, requests[i::CONNECTIONS], statuses) for i in range(CONNECTIONS))
    )
    return statuses


async def unread_poll(host: str, port: int, target: str) -> asyncio.StreamWriter:
    """A poll whose client reads nothing of the answer (and has a small receive
    buffer): the server has to hold what it cannot send."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.setblocking(False)
    _, writer = await asyncio.open_connection(sock=sock)
    writer.transport.pause_reading()
    writer.write(f"GET {target} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    await writer.drain()
    return writer


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


async def attack(pid: int, url: str) -> tuple[int, int]:
    """The attack; VmRSS of the warmed-up server, and at the end."""
    host, _, port_text = url.removeprefix("http://").rpartition(":")
    port = int(port_text)
    # Warm up: every code path the attack takes, once, on every connection.
    warm = [("/topics/warm", b"w" * 1000)] * (4 * CONNECTIONS)
    assert await publish_all(host, port, warm) == {200: len(warm)}
    before = rss(pid)

    body = b"x" * MiB
    assert await publish_all(host, port, [("/topics/big", body)] * 400) == {200: 400}
    wide = [(f"/topics/wide{i}", body) for i in range(64)]
    assert await publish_all(host, port, wide) == {200: 64}
    controls = [("/topics/big", b"\x01" * MiB)]
    assert await publish_all(host, port, controls) == {200: 1}
    readers = [await unread_poll(host, port, "/topics/big?offset=400") for _ in range(UNREAD)]
    try:
        topics = LIMITS["max_topics"]
        existing = 2 + len(wide)
        many = [(f"/topics/t{i}", b"m" * 100) for i in range(2500)]
        statuses = await publish_all(host, port, many)
        assert statuses == {200: topics - existing, 429: len(many) - topics + existing}
        after = rss(pid)
    finally:
        for writer in readers:
            writer.transport.abort()
    return before, after


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_rss_under_attack_stays_within_the_documented_bound(backend: str) -> None:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in LIMITS.items()]
    command = [sys.executable, str(EXAMPLE / "server.py"), "--port=0", f"--backend={backend}"]
    process = subprocess.Popen(
        [*command, *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://"), line
        url = line.split()[-1]
        before, after = asyncio.run(asyncio.wait_for(attack(process.pid, url), 120))
        stats = get_json(f"{url}/stats")
    finally:
        process.terminate()
        process.communicate(timeout=30)  # and closes its stdout

    assert stats["topics"] == LIMITS["max_topics"]
    assert stats["retained_bytes"] <= LIMITS["total_retention_bytes"]
    assert stats["inflight_bytes"] == 0
    bound = server.Limits(**LIMITS).memory_bound(connections=CONNECTIONS + UNREAD)
    growth = after - before
    print(
        f"{backend}: VmRSS {before / MiB:.1f} MiB after warm-up, grew by "
        f"{growth / MiB:.1f} MiB; the bound is {bound / MiB:.1f} MiB"
    )
    assert growth <= bound, (growth / MiB, bound / MiB)


# Issue 20: answers kept after they were sent. 8 rounds of 25 polls of 1 MiB answers:
# 200 MiB kept before the fix, against a bound of about 80 MiB for these limits.
ROUNDS = 8
POLLS = 25


async def _get(host: str, port: int, target: str) -> tuple[int, int]:
    """One GET on its own connection, the answer read to the end: (status, bytes)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        data = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(data.split(None, 2)[1]), len(data)


async def answered_polls(pid: int, url: str, expire: bool) -> tuple[int, int]:
    """Rounds of POLLS polls answered with a 1 MiB message each: completed by a
    publish on a fresh topic each, or (``expire``) expired short of a ``min_bytes``
    they can never meet, with the message in their answer. VmRSS after a warm-up
    round, and at the end."""
    host, _, port_text = url.removeprefix("http://").rpartition(":")
    port = int(port_text)
    body = b"x" * MiB

    async def one_round(name: str) -> None:
        topics = [f"{name}-{i}" for i in range(POLLS)]
        if expire:
            # 8 topics at a time: 8 MiB, so that server-wide retention (16 MiB)
            # keeps each message until its poll has expired with it.
            answers = []
            query = f"offset=0&max_wait_ms=50&min_bytes={2 * MiB}"
            for first in range(0, POLLS, 8):
                group = topics[first : first + 8]
                published = await publish_all(host, port, [(f"/topics/{t}", body) for t in group])
                assert published == {200: len(group)}
                answers += await asyncio.gather(
                    *(_get(host, port, f"/topics/{t}?{query}") for t in group)
                )
        else:
            query = "offset=0&max_wait_ms=30000"
            polls = [
                asyncio.ensure_future(_get(host, port, f"/topics/{t}?{query}")) for t in topics
            ]
            # The server's own counter says when the polls are parked; it has no event
            # a client could await.
            while get_json(f"{url}/stats")["parked"] < POLLS:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
            published = await publish_all(host, port, [(f"/topics/{t}", body) for t in topics])
            assert published == {200: POLLS}
            answers = await asyncio.gather(*polls)
        assert all(status == 200 and size > MiB for status, size in answers), answers

    await one_round("warm")
    before = rss(pid)
    for r in range(ROUNDS):
        await one_round(f"r{r}")
    return before, rss(pid)


@pytest.mark.slow
@pytest.mark.parametrize("expire", [False, True], ids=["completed", "expired"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_rss_of_answered_polls_stays_within_the_documented_bound(
    backend: str, expire: bool
) -> None:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in LIMITS.items()]
    command = [sys.executable, str(EXAMPLE / "server.py"), "--port=0", f"--backend={backend}"]
    process = subprocess.Popen(
        [*command, *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://"), line
        url = line.split()[-1]
        before, after = asyncio.run(asyncio.wait_for(answered_polls(process.pid, url, expire), 120))
        stats = get_json(f"{url}/stats")
    finally:
        process.terminate()
        process.communicate(timeout=30)  # and closes its stdout

    polls = (ROUNDS + 1) * POLLS
    assert stats["expired" if expire else "completed"] == polls
    assert stats["parked"] == 0
    assert stats["retained_bytes"] <= LIMITS["total_retention_bytes"]
    # Connections: the publishers', and one poll's each.
    bound = server.Limits(**LIMITS).memory_bound(connections=CONNECTIONS + POLLS)
    growth = after - before
    print(
        f"{backend}, {'expired' if expire else 'completed'}: {polls} polls of 1 MiB answers, "
        f"VmRSS grew by {growth / MiB:.1f} MiB; the bound is {bound / MiB:.1f} MiB"
    )
    assert growth <= bound, (growth / MiB, bound / MiB)


# Issue 28, finding 14: answers that keep messages retention dropped. Each client asks
# for the 1 MiB message just published and never reads; retention (4 MiB a topic)
# drops each message four publishes later, but its answer keeps it alive.
PINNED = 150


async def pinned_answers(pid: int, url: str) -> tuple[int, int]:
    host, _, port_text = url.removeprefix("http://").rpartition(":")
    port = int(port_text)
    warm = [("/topics/warm", b"w" * 1000)] * (4 * CONNECTIONS)
    assert await publish_all(host, port, warm) == {200: len(warm)}
    before = rss(pid)
    # Control characters: a 6 MiB answer once JSON escapes them, more than the
    # kernel's socket buffers take in, so the answer is still being written.
    body = b"\x01" * MiB
    readers = []
    try:
        for offset in range(PINNED):
            assert await publish_all(host, port, [("/topics/pin", body)]) == {200: 1}
            readers.append(await unread_poll(host, port, f"/topics/pin?offset={offset}"))
            # Answered (and being written) before the next publish drops its message;
            # the server's counter says so, there is no event a client could await.
            while get_json(f"{url}/stats")["immediate"] <= offset:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        stats = get_json(f"{url}/stats")
        assert stats["evicted_messages"] >= PINNED - 4  # dropped, but still held
        after = rss(pid)
    finally:
        for writer in readers:
            writer.transport.abort()
    return before, after


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_rss_of_unread_answers_of_dropped_messages_stays_within_the_bound(backend: str) -> None:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in LIMITS.items()]
    command = [sys.executable, str(EXAMPLE / "server.py"), "--port=0", f"--backend={backend}"]
    process = subprocess.Popen(
        [*command, *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://"), line
        url = line.split()[-1]
        before, after = asyncio.run(asyncio.wait_for(pinned_answers(process.pid, url), 120))
    finally:
        process.terminate()
        process.communicate(timeout=30)  # and closes its stdout
    bound = server.Limits(**LIMITS).memory_bound(connections=CONNECTIONS + PINNED)
    growth = after - before
    print(
        f"{backend}: {PINNED} unread answers of dropped 1 MiB messages, VmRSS grew by "
        f"{growth / MiB:.1f} MiB; the bound is {bound / MiB:.1f} MiB"
    )
    # Each unread answer held its message: the bound has to count them.
    assert growth > PINNED * MiB * 3 // 4, growth / MiB
    assert growth <= bound, (growth / MiB, bound / MiB)
