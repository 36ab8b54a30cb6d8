"""aiowheel quick start: schedule, cancel and re-arm timers on asyncio (about 1 s)."""

import asyncio

import aiowheel


async def main() -> None:
    async with aiowheel.Timer() as timer:
        start = timer.time()

        def say(what: str) -> None:
            print(f"{timer.time() - start:4.2f} s  {what}")

        timer.schedule_nowait(0.25, say, "a timer fired (scheduled for 0.25 s)")
        timer.schedule_nowait(0.5, say, "never printed: cancelled").cancel()
        idle = timer.schedule_nowait(0.5, say, "idle timeout: no activity for 0.5 s")
        for _ in range(4):
            await asyncio.sleep(0.1)  # some work on the connection
            idle.reset(0.5)  # activity: push the idle deadline out (O(1))
            say(f"activity, idle deadline moved to {idle.deadline - start:.2f} s")
        await idle.wait()
        stats = timer.stats()
        say(f"fired {stats.fired}, cancelled {stats.cancelled}, pending {len(timer)}")


asyncio.run(main())
