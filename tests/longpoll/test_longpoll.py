"""End-to-end tests of the long-poll example (examples/longpoll/server.py).

The server runs in the test's own event loop on 127.0.0.1 port 0: uvicorn on asyncio
(looptime's virtual clock) and uvloop (real time), hypercorn on trio (MockClock). Both
parking modes run on asyncio and uvloop; the ``wait_for`` baseline is asyncio-only.
Functional requests go through httpx; many concurrent polls and dropped connections
use a few lines of raw HTTP/1.1 over anyio streams (httpx's pool is not made for a
thousand requests in flight); tests/longpoll/longpoll_helpers.py has both. The limits that keep
a hostile client from exhausting the server are tested in test_longpoll_limits.py and
test_longpoll_memory.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import longpoll_helpers as helpers
import pytest
from longpoll_helpers import EXAMPLE, running, server, until

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["purgatory", "wait_for"])
def mode(request: pytest.FixtureRequest, backend: str) -> str:
    if request.param == "wait_for" and backend == "trio":
        pytest.skip("the wait_for baseline parks on asyncio.wait_for")
    return str(request.param)


# -- the behaviour of a poll ---------------------------------------------------------------


async def test_available_message_returns_at_once(mode: str) -> None:
    async with running(mode) as s:
        assert await s.publish("orders", "hello") == 0
        assert await s.publish("orders", "world") == 1
        start = anyio.current_time()
        r = await s.http.get("/topics/orders", params={"offset": 0, "max_wait_ms": 30000})
        elapsed = anyio.current_time() - start
        assert r.status_code == 200
        assert r.json() == {"messages": ["hello", "world"], "next_offset": 2}
        assert elapsed < 1.0  # nowhere near max_wait_ms
        r = await s.http.get("/topics/orders", params={"offset": 1, "max_wait_ms": 30000})
        assert r.json() == {"messages": ["world"], "next_offset": 2}
        stats = (await s.http.get("/stats")).json()
        assert stats["immediate"] == 2
        assert stats["parked"] == stats["completed"] == stats["expired"] == 0


async def test_empty_poll_returns_after_max_wait_never_before(
    mode: str, virtual: bool, backend: str
) -> None:
    tick = 0.001
    max_wait = 0.250 if virtual else 0.050
    # Virtual clocks: nothing but the timer moves time, so the bound is one tick. Real
    # time (uvloop): the HTTP round trip and a shared machine come on top.
    slack = 1e-6 if virtual else 0.5
    async with running(mode, tick=tick) as s:
        await s.publish("t", "old")
        for _ in range(3):
            start = anyio.current_time()
            r = await s.http.get(
                "/topics/t", params={"offset": 1, "max_wait_ms": int(max_wait * 1000)}
            )
            end = anyio.current_time()
            elapsed = end - start
            assert r.json() == {"messages": [], "next_offset": 1}
            # Never early, compared as the server does (clock >= now + max_wait), not
            # by a difference: on uvloop's whole-millisecond clock an exact 50 ms reads
            # 0.04999999999927 as end - start.
            assert end >= start + max_wait, elapsed
            assert elapsed <= max_wait + tick + slack, elapsed
        stats = (await s.http.get("/stats")).json()
        assert stats["expired"] == 3
        assert stats["parked"] == 0


async def test_max_wait_zero_answers_at_once(mode: str) -> None:
    async with running(mode) as s:
        r = await s.http.get("/topics/t", params={"offset": 0, "max_wait_ms": 0})
        assert r.json() == {"messages": [], "next_offset": 0}


async def test_publish_wakes_every_poll_on_its_topic_and_no_other(mode: str) -> None:
    async with running(mode) as s:
        results: dict[str, list[Any]] = {"a": [], "b": []}

        async def poll(topic: str) -> None:
            status, body = await s.raw(f"/topics/{topic}?offset=0&max_wait_ms=30000")
            assert status == 200
            results[topic].append(body)

        async with anyio.create_task_group() as tg:
            for topic in "ab" * 20:
                tg.start_soon(poll, topic)
            await until(lambda: s.parked() == 40)
            await s.publish("a", "for a")
            await until(lambda: len(results["a"]) == 20)
            assert results["a"] == [{"messages": ["for a"], "next_offset": 1}] * 20
            assert results["b"] == []
            assert s.parked() == 20
            await s.publish("b", "for b")
        assert results["b"] == [{"messages": ["for b"], "next_offset": 1}] * 20
        stats = (await s.http.get("/stats")).json()
        assert stats["completed"] == 40
        assert stats["expired"] == stats["parked"] == 0


async def test_min_bytes_waits_for_enough_data(mode: str) -> None:
    async with running(mode) as s:
        answer: list[Any] = []

        async def poll() -> None:
            answer.append(await s.raw("/topics/t?offset=0&max_wait_ms=30000&min_bytes=10"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await until(lambda: s.parked() == 1)
            await s.publish("t", "12345")  # 5 bytes: not enough
            await s.publish("other", "0123456789")  # another topic's data does not count
            assert s.parked() == 1
            assert answer == []
            await s.publish("t", "é6789")  # 6 bytes (é is 2 in UTF-8): 11 in all
        assert answer == [(200, {"messages": ["12345", "é6789"], "next_offset": 2})]


async def test_thousand_concurrent_polls_are_all_answered(mode: str) -> None:
    n, topics = 1000, 10
    async with running(mode) as s:
        answers: list[Any] = []

        async def poll(topic: int) -> None:
            answers.append(await s.raw(f"/topics/t{topic}?offset=0&max_wait_ms=30000"))

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(poll, i % topics)
            await until(lambda: s.parked() == n, limit=60)
            for topic in range(topics):
                await s.publish(f"t{topic}", f"message {topic}")
        assert len(answers) == n
        assert sorted(body["messages"][0] for _, body in answers) == sorted(
            f"message {i % topics}" for i in range(n)
        )
        assert all(status == 200 for status, _ in answers)
        stats = (await s.http.get("/stats")).json()
        assert stats["completed"] == n
        assert stats["parked"] == 0


async def test_dropped_poll_leaves_the_purgatory_at_once(mode: str, virtual: bool) -> None:
    async with running(mode) as s:
        stream = await anyio.connect_tcp(s.host, s.port)
        await stream.send(b"GET /topics/t?offset=0&max_wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\r\n")
        await until(lambda: s.parked() == 1)
        if mode == "purgatory":
            purgatory = s.service.purgatory
            assert purgatory.delayed() == 1
            assert len(purgatory.timer) == 1
        dropped = anyio.current_time()
        await stream.aclose()
        await until(lambda: s.parked() == 0)
        elapsed = anyio.current_time() - dropped
        assert elapsed < 1.0  # not the 30 s of max_wait_ms
        if virtual:
            assert elapsed < 0.05
        stats = (await s.http.get("/stats")).json()
        assert stats["disconnected"] == 1
        assert stats["expired"] == stats["completed"] == 0
        if mode == "purgatory":
            assert purgatory.delayed() == 0
            assert len(purgatory.timer) == 0  # its timeout left the wheel too
        # The server goes on serving.
        await s.publish("t", "still here")
        r = await s.http.get("/topics/t", params={"offset": 0})
        assert r.json()["messages"] == ["still here"]


async def test_consumer_follows_next_offset_in_batches() -> None:
    async with running(max_messages=2) as s:
        for i in range(5):
            await s.publish("t", f"m{i}")
        seen: list[str] = []
        offset = 0
        while offset < 5:
            body = (await s.http.get("/topics/t", params={"offset": offset})).json()
            assert len(body["messages"]) <= 2
            seen += body["messages"]
            offset = body["next_offset"]
        assert seen == [f"m{i}" for i in range(5)]


async def test_offset_no_longer_retained_is_410() -> None:
    async with running(retention=2) as s:
        for i in range(5):
            await s.publish("t", f"m{i}")
        r = await s.http.get("/topics/t", params={"offset": 0})
        assert r.status_code == 410
        assert r.json()["parameter"] == "offset"
        earliest = r.json()["earliest"]
        r = await s.http.get("/topics/t", params={"offset": earliest})
        assert r.json()["messages"] == [f"m{i}" for i in range(earliest, 5)]


# -- bad input ---------------------------------------------------------------------------

BAD_POLLS = [
    ("/topics/t?offset=abc", 400, "offset"),
    ("/topics/t?offset=-1", 400, "offset"),
    ("/topics/t?offset=1.5", 400, "offset"),
    ("/topics/t?offset=", 400, "offset"),
    ("/topics/t?offset=%EF%BC%91", 400, "offset"),  # a full-width digit
    ("/topics/t?offset=99999999999999999999999", 400, "offset"),
    ("/topics/t?offset=1&offset=2", 400, "offset"),
    ("/topics/t?max_wait_ms=30001", 400, "max_wait_ms"),
    ("/topics/t?max_wait_ms=-5", 400, "max_wait_ms"),
    ("/topics/t?max_wait_ms=soon", 400, "max_wait_ms"),
    ("/topics/t?min_bytes=-1", 400, "min_bytes"),
    ("/topics/t?min_bytes=x", 400, "min_bytes"),
    ("/topics/t?offset=0&partition=3", 400, "partition"),
    ("/topics/t?maxWaitMs=5", 400, "maxWaitMs"),
    ("/topics/", 400, "topic"),
    ("/topics", 400, "topic"),
    ("/topics/a%20b", 400, "topic"),
    ("/topics/a/b", 400, "topic"),
    ("/topics/" + "x" * 250, 400, "topic"),
]


async def test_bad_polls_get_400_naming_the_parameter() -> None:
    async with running() as s:
        for target, status, parameter in BAD_POLLS:
            r = await s.http.get(target)
            assert r.status_code == status, (target, r.text)
            assert r.json()["parameter"] == parameter, (target, r.text)
            assert r.json()["error"]
        # The limits themselves are fine.
        r = await s.http.get("/topics/t?offset=0&max_wait_ms=0&min_bytes=0")
        assert r.status_code == 200
        assert s.parked() == 0


async def test_bad_publishes() -> None:
    limit = 64
    async with running(max_body_bytes=limit) as s:
        cases: list[tuple[str, Any, int, str]] = [
            ("/topics/t", b"x" * (limit + 1), 413, "body"),
            ("/topics/t", b"", 400, "body"),
            ("/topics/t", b"\xff\xfe", 400, "body"),
            ("/topics/", b"m", 400, "topic"),
            ("/topics", b"m", 400, "topic"),
            ("/topics/t?offset=1", b"m", 400, "offset"),
        ]
        for target, body, status, parameter in cases:
            r = await s.http.post(target, content=body)
            assert r.status_code == status, (target, r.text)
            assert r.json()["parameter"] == parameter

        # A chunked body (no Content-Length) over the limit: read to its end, refused.
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"y" * 16

        r = await s.http.post("/topics/t", content=chunks())
        assert r.status_code == 413
        assert r.json()["parameter"] == "body"
        # A declared length far beyond the limit is refused without reading the body.
        async with await anyio.connect_tcp(s.host, s.port) as stream:
            await stream.send(
                b"POST /topics/t HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000\r\n\r\n"
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            assert head.startswith(b"HTTP/1.1 413")
        # Exactly at the limit is accepted; nothing above was appended.
        r = await s.http.post("/topics/t", content=b"z" * limit)
        assert r.json() == {"offset": 0}
        assert (await s.http.put("/topics/t", content=b"m")).status_code == 405


# -- the command line and the load client --------------------------------------------------


def test_command_line_refuses_wait_for_on_trio(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        server.main(["--mode", "wait_for", "--backend", "trio"])
    assert exit_info.value.code == 2
    assert "wait_for" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["aiowheel", "aiowheel-uvloop"])
def test_the_command_line_serves_on_the_drop_in_loop(backend: str) -> None:
    # `--backend aiowheel` runs uvicorn on aiowheel's drop-in loop (on asyncio's base,
    # or uvloop's): a poll parks, a publish answers it, SIGTERM stops it quietly.
    import signal
    import threading

    import httpx

    command = [sys.executable, str(EXAMPLE / "server.py"), "--port=0", f"--backend={backend}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        answers: list[httpx.Response] = []
        with httpx.Client(base_url=url, timeout=10) as http:
            poller = threading.Thread(
                target=lambda: answers.append(
                    http.get("/topics/t", params={"offset": 0, "max_wait_ms": 10_000})
                )
            )
            poller.start()
            for _ in range(1000):  # the poll parks: the server says so
                stats = http.get("/stats").json()
                if stats["parked"] == 1:
                    break
            assert stats["parked"] == 1
            assert stats["backend"] == backend
            assert http.post("/topics/t", content=b"hello").json() == {"offset": 0}
            poller.join(10)
            assert [answer.json() for answer in answers] == [
                {"messages": ["hello"], "next_offset": 1}
            ]
            assert http.get("/stats").json()["completed"] == 1
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "Traceback" not in errors, errors
    assert "ERROR" not in errors, errors


def test_the_examples_listen_on_loopback_by_default() -> None:
    assert server.build_parser().parse_args([]).host == "127.0.0.1"
    assert server.serving.__wrapped__.__defaults__[0] == "127.0.0.1"


def test_the_load_client_says_when_no_poll_expired() -> None:
    # Issue 39: a window in which every poll got data printed "nan" for the overshoot.
    load = helpers.load("load")
    window = load.Window(start=0.0, end=1.0, polls=3, latencies=[0.002, 0.003, 0.004])
    stats = {"answered": 0, "cpu_time": 0.0, "timer_lateness_max_ms": None}
    row = load.summary("purgatory", window, stats, {**stats, "answered": 3})
    assert row["overshoot p50 ms"] == row["overshoot p99 ms"] == "n/a (no poll expired)"
    assert row["delivery p50 ms"] == "3.0"
    assert not any("nan" in value for value in row.values()), row
    empty = load.Window(start=0.0, end=1.0)
    row = load.summary("purgatory", empty, stats, stats)
    assert row["delivery p99 ms"] == "n/a (nothing delivered)"
    with pytest.raises(ValueError, match="no values"):
        load.percentile([], 0.5)


def test_service_validation() -> None:
    with pytest.raises(ValueError, match="mode"):
        server.create_app("sleep")
    with pytest.raises(ValueError, match="max_body_bytes"):
        server.create_app(max_body_bytes=0)


@pytest.mark.slow
def test_load_client_runs_both_modes_side_by_side() -> None:
    # A short run of the real tool: two server processes, one after the other.
    command = [
        sys.executable,
        str(EXAMPLE / "load.py"),
        "--consumers=20",
        "--topics=4",
        "--rate=40",
        "--duration=0.5",
        "--warmup=0.1",
        "--max-wait-ms=100",
        "--server-backend=asyncio",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["server", "purgatory", "wait_for"] in rows
    assert ["errors", "0", "0"] in rows
    polls = next(row for row in rows if row[0] == "polls/s")
    assert all(float(value.replace(",", "")) > 0 for value in polls[1:])
