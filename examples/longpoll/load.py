"""Load client for the long-poll example: the purgatory server against the baseline.

For each server mode (``purgatory``, then ``wait_for``) it starts
``server.py --port 0`` as a subprocess on 127.0.0.1, opens ``--consumers`` concurrent
long-polls spread over ``--topics`` topics (each consumer follows its topic from
offset 0, like a Kafka consumer), publishes ``--rate`` messages per second for
``--duration`` seconds, stops the server, and prints per mode:

* polls/s answered during the measured window;
* delivery latency, publish to delivery, p50 and p99 (every consumer of the topic
  counts: one message yields topics/consumers samples);
* empty-poll overshoot p99: return time minus ``max_wait_ms`` for polls that came
  back with nothing (how late the server's timeout fired, plus HTTP); "n/a (no poll
  expired)" when every poll got data;
* server CPU time per answered poll (``time.process_time()`` from ``/stats`` at the
  window's edges, divided by the polls the server answered in between).

The consumers and the publisher run in ``--client-procs`` processes (default 1), each
with its share of the consumers and of the topics to publish to.

The client is aiohttp (httpx's pool collapses at this concurrency). The client and
the server share the machine: on 2 cores the client is usually the first to saturate,
so compare the modes side by side in one run rather than across runs.

    python examples/longpoll/load.py --consumers 2000 --duration 10
    python examples/longpoll/load.py --server-backend aiowheel   # the drop-in loop
    python examples/longpoll/load.py --url http://127.0.0.1:8080   # one running server
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

SERVER = Path(__file__).with_name("server.py")
# server.py --backend: uvicorn on asyncio, uvloop or aiowheel's drop-in loop (on either
# base), hypercorn on trio.
SERVER_BACKENDS = ("asyncio", "uvloop", "aiowheel", "aiowheel-uvloop", "trio")
# What a percentile cell says when the window has no sample for it.
NO_POLL_EXPIRED = "n/a (no poll expired)"
NOTHING_DELIVERED = "n/a (nothing delivered)"


@dataclass
class Window:
    """What one client process measured between ``start`` and ``end`` (perf_counter
    instants, the same clock in every process on one machine)."""

    start: float
    end: float
    polls: int = 0
    empty_polls: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds
    overshoots: list[float] = field(default_factory=list)  # seconds
    errors: int = 0
    published: int = 0
    client_cpu: float = 0.0  # CPU seconds the client process(es) used in the window

    def measuring(self, now: float) -> bool:
        return self.start <= now < self.end

    def merge(self, other: Window) -> None:
        self.polls += other.polls
        self.empty_polls += other.empty_polls
        self.latencies += other.latencies
        self.overshoots += other.overshoots
        self.errors += other.errors
        self.published += other.published
        self.client_cpu += other.client_cpu


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``, which must not be empty."""
    if not values:
        raise ValueError("no values to take a percentile of")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def milliseconds(values: Sequence[float], q: float, none: str) -> str:
    """The ``q`` quantile of ``values`` (seconds) in ms, or ``none`` when there are
    none: a window in which no poll expired has no overshoot to show, not a NaN."""
    return f"{percentile(values, q) * 1e3:.1f}" if values else none


async def consumer(
    session: aiohttp.ClientSession,
    url: str,
    max_wait_ms: int,
    min_bytes: int,
    window: Window,
) -> None:
    offset = 0
    max_wait = max_wait_ms / 1000
    perf = time.perf_counter
    # Start at a random moment within one max_wait: consumers that all start together
    # would expire together every max_wait, and the burst of answers and new polls would
    # be measured instead of the server.
    await asyncio.sleep(random.random() * max_wait)
    while True:
        sent = perf()
        params = {"offset": offset, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes}
        try:
            async with session.get(url, params=params) as response:
                if response.status in (409, 410):
                    # The offset is out of range (retention dropped it, or the topic was
                    # dropped and started again): carry on from the earliest retained,
                    # as a Kafka consumer with auto.offset.reset=earliest does.
                    offset = (await response.json())["earliest"]
                    window.errors += 1
                    continue
                if response.status != 200:
                    window.errors += 1
                    await response.read()
                    await asyncio.sleep(0.1)
                    continue
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError):
            window.errors += 1
            await asyncio.sleep(0.1)
            continue
        now = perf()
        messages = body["messages"]
        offset = body["next_offset"]
        if not window.measuring(now):
            continue
        window.polls += 1
        if messages:
            for message in messages:
                stamp = float(message.partition(" ")[0])
                if stamp >= window.start:
                    window.latencies.append(now - stamp)
        else:
            window.empty_polls += 1
            window.overshoots.append(now - sent - max_wait)


async def publisher(
    session: aiohttp.ClientSession,
    base: str,
    topics: list[int],
    rate: float,
    size: int,
    window: Window,
) -> None:
    perf = time.perf_counter
    started = perf()
    k = 0
    padding = "x" * size
    while True:
        delay = started + k / rate - perf()
        if delay > 0:
            await asyncio.sleep(delay)
        stamp = perf()
        body = f"{stamp:.9f} {padding}"[: max(size, 18)]
        try:
            async with session.post(f"{base}/topics/t{topics[k % len(topics)]}", data=body) as r:
                await r.read()
                if r.status == 200 and window.measuring(stamp):
                    window.published += 1
                elif r.status != 200:
                    window.errors += 1
        except aiohttp.ClientError:
            window.errors += 1
        k += 1


async def run_client(base: str, share: dict[str, Any]) -> Window:
    """One client process's part: its consumers and its share of the publishing."""
    window = Window(share["start"], share["end"])
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=share["max_wait_ms"] / 1000 + 30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [
            asyncio.create_task(
                consumer(
                    session,
                    f"{base}/topics/t{topic}",
                    share["max_wait_ms"],
                    share["min_bytes"],
                    window,
                )
            )
            for topic in share["consumers"]
        ]
        if share["rate"] > 0 and share["topics"]:
            tasks.append(
                asyncio.create_task(
                    publisher(
                        session,
                        base,
                        share["topics"],
                        share["rate"],
                        share["message_bytes"],
                        window,
                    )
                )
            )
        await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
        cpu = time.process_time()
        await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
        window.client_cpu = time.process_time() - cpu
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return window


def client_process(base: str, share: dict[str, Any], results: Any) -> None:
    """Entry point of a client worker process: report the window through ``results``."""
    loop_factory = None
    if share["client_loop"] == "uvloop":
        import uvloop

        loop_factory = uvloop.new_event_loop

    async def bounded() -> Window:
        # Never hang: the whole run is bounded.
        async with asyncio.timeout(share["end"] - time.perf_counter() + 30):
            return await run_client(base, share)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        # A plain dict: the class lives in __main__, which differs between processes.
        results.put(dataclasses.asdict(runner.run(bounded())))


def get_stats(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}/stats", timeout=30) as response:
        result: dict[str, Any] = json.load(response)
        return result


def run_load(base: str, args: argparse.Namespace) -> tuple[Window, dict[str, Any], dict[str, Any]]:
    """Start the client processes, read the server's /stats at the window's edges,
    gather what the clients measured."""
    procs = args.client_procs
    # Every consumer connects and parks at least once before the window opens (the
    # extra second covers the processes' start-up).
    warmup = max(args.warmup, args.max_wait_ms / 1000 + 0.5) + 1.0
    start = time.perf_counter() + warmup
    end = start + args.duration
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = []
    for index in range(procs):
        share = {
            "start": start,
            "end": end,
            "consumers": [i % args.topics for i in range(index, args.consumers, procs)],
            "topics": list(range(index, args.topics, procs)),
            "rate": args.rate * len(range(index, args.topics, procs)) / args.topics,
            "max_wait_ms": args.max_wait_ms,
            "min_bytes": args.min_bytes,
            "message_bytes": args.message_bytes,
            "client_loop": args.client_loop,
        }
        worker = context.Process(target=client_process, args=(base, share, results))
        worker.start()
        workers.append(worker)
    time.sleep(max(0.0, start - time.perf_counter()))
    before = get_stats(base)
    time.sleep(max(0.0, end - time.perf_counter()))
    after = get_stats(base)
    window = Window(start, end)
    for _ in workers:
        window.merge(Window(**results.get(timeout=60)))
    for worker in workers:
        worker.join(30)
    return window, before, after


@contextlib.contextmanager
def server_process(mode: str, backend: str, tick_ms: float) -> Any:
    command = [
        sys.executable,
        str(SERVER),
        "--port",
        "0",
        "--mode",
        mode,
        "--backend",
        backend,
        "--tick-ms",
        str(tick_ms),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"server did not start: {line!r}")
        yield line.removeprefix("listening on ")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def summary(
    name: str, window: Window, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, str]:
    elapsed = window.end - window.start
    answered = after["answered"] - before["answered"]
    cpu = after["cpu_time"] - before["cpu_time"]
    return {
        "server": name,
        "polls/s": f"{window.polls / elapsed:,.0f}",
        "server answered/s": f"{answered / elapsed:,.0f}",
        "published/s": f"{window.published / elapsed:,.0f}",
        "delivery p50 ms": milliseconds(window.latencies, 0.50, NOTHING_DELIVERED),
        "delivery p99 ms": milliseconds(window.latencies, 0.99, NOTHING_DELIVERED),
        "deliveries": f"{len(window.latencies):,}",
        "empty polls": f"{window.empty_polls:,}",
        "overshoot p50 ms": milliseconds(window.overshoots, 0.50, NO_POLL_EXPIRED),
        "overshoot p99 ms": milliseconds(window.overshoots, 0.99, NO_POLL_EXPIRED),
        "server timer late max ms": (
            f"{after['timer_lateness_max_ms']:.1f}"
            if after.get("timer_lateness_max_ms") is not None
            else "-"
        ),
        "server CPU us/poll": f"{cpu / answered * 1e6:.0f}" if answered else "-",
        "server CPU %": f"{cpu / elapsed * 100:.0f}",
        "client CPU %": f"{window.client_cpu / elapsed * 100:.0f}",
        "errors": str(window.errors),
    }


def print_table(rows: list[dict[str, str]]) -> None:
    keys = list(rows[0])
    width = max(len(k) for k in keys)
    columns = [max(len(r[k]) for k in keys) for r in rows]
    for key in keys:
        cells = "  ".join(r[key].rjust(c) for r, c in zip(rows, columns, strict=True))
        print(f"{key.ljust(width)}  {cells}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="load this running server instead of starting them")
    parser.add_argument("--modes", default="purgatory,wait_for", help="server modes to compare")
    parser.add_argument("--server-backend", choices=SERVER_BACKENDS, default="uvloop")
    parser.add_argument("--client-loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument(
        "--client-procs", type=int, default=1, help="client processes sharing the consumers"
    )
    parser.add_argument("--consumers", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100.0, help="messages published per s")
    parser.add_argument("--message-bytes", type=int, default=100)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--max-wait-ms", type=int, default=1000)
    parser.add_argument("--min-bytes", type=int, default=1)
    parser.add_argument("--tick-ms", type=float, default=1.0, help="the purgatory's tick")
    args = parser.parse_args(argv)

    print(
        f"{args.consumers} consumers on {args.topics} topics, {args.rate:g} msg/s of "
        f"{args.message_bytes} B, max_wait_ms={args.max_wait_ms}, min_bytes={args.min_bytes}, "
        f"{args.duration:g} s measured after {args.warmup:g} s warm-up; "
        f"server on {args.server_backend}, {args.client_procs} client process(es) on "
        f"{args.client_loop}; "
        f"load average before: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows = []
    if args.url:
        rows.append(summary(args.url, *run_load(args.url.rstrip("/"), args)))
    else:
        for mode in args.modes.split(","):
            with server_process(mode, args.server_backend, args.tick_ms) as base:
                measured = run_load(base, args)
            rows.append(summary(mode, *measured))
            print(f"  {mode}: done (load average now {os.getloadavg()[0]:.2f})", flush=True)
    print_table(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
