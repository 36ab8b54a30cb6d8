"""How late a timer fires on the drop-in loop: ``loop.timer`` against a ``Timer()``.

Usage: ``python tools/loop_lateness_probe.py [--base asyncio|uvloop] [--timers 150]``.

Schedules ``--timers`` timers of random delays from 1 to 20 ms (the same delays for
each contender), one at a time, and prints the median and p90 of their lateness (the
callback's ``loop.time()`` minus the handle's deadline, ms) for:

* ``loop.timer`` on the drop-in loop (half of its timers before the ``Timer()`` below
  runs, half after, so that both see the same stretch of machine load);
* a ``Timer()`` started on the drop-in loop (its wake-up armed on the base loop, as
  ``loop.timer``'s is: one rounding up to its tick, not two);
* a ``Timer()`` on the plain base loop.

docs/loop.md ("``loop.timer``") quotes it. Real time: the figures move with the
machine's load; compare contenders of one run. It changes nothing in aiowheel.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics

import aiowheel


async def _measure(timer: aiowheel.Timer, count: int, seed: int) -> list[float]:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    lateness: list[float] = []

    def fire(fired: asyncio.Future[float]) -> None:
        fired.set_result(loop.time())

    for _ in range(count):
        fired: asyncio.Future[float] = loop.create_future()
        handle = timer.schedule_nowait(rng.uniform(0.001, 0.02), fire, fired)
        lateness.append((await fired - handle.deadline) * 1000)
    return lateness


async def _on_the_drop_in_loop(count: int) -> tuple[list[float], list[float]]:
    timer = aiowheel.loop_timer()
    assert timer is not None
    first = await _measure(timer, count // 2, 1)
    async with aiowheel.Timer() as own:
        theirs = await _measure(own, count, 2)
    second = await _measure(timer, count - count // 2, 3)
    return first + second, theirs


async def _on_the_plain_loop(count: int) -> list[float]:
    async with aiowheel.Timer() as own:
        lateness = await _measure(own, count, 2)
    return lateness


def _summary(lateness: list[float]) -> str:
    ordered = sorted(lateness)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered):.2f} ms, p90 {p90:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--timers", type=int, default=150)
    args = parser.parse_args()
    if args.timers < 2:
        parser.error("--timers must be at least 2")
    loop_timer, on_loop = aiowheel.run(_on_the_drop_in_loop(args.timers), base=args.base)
    if args.base == "uvloop":
        import uvloop

        plain = uvloop.run(_on_the_plain_loop(args.timers))
    else:
        plain = asyncio.run(_on_the_plain_loop(args.timers))
    print(f"loop.timer, drop-in loop ({args.base}):  {_summary(loop_timer)}")
    print(f"Timer(), drop-in loop ({args.base}):     {_summary(on_loop)}")
    print(f"Timer(), plain {args.base}:{' ' * (20 - len(args.base))}{_summary(plain)}")


if __name__ == "__main__":
    main()
