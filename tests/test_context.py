"""Callbacks run in the context (``contextvars``) captured when they were scheduled,
as ``loop.call_later`` does (docs/usage.md, "Context variables")."""

from __future__ import annotations

import contextvars
import threading

import anyio
import anyio.lowlevel
import pytest

import aiowheel
from aiowheel import Timer

pytestmark = pytest.mark.anyio

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def test_each_callback_sees_the_context_of_its_scheduler() -> None:
    seen: dict[str, str] = {}
    async with Timer(tick=0.001) as timer:

        async def handler(name: str, delay: float) -> None:
            request_id.set(name)
            handle = timer.schedule_nowait(delay, lambda: seen.setdefault(name, request_id.get()))
            await handle.wait()

        async with anyio.create_task_group() as tg:
            # B arms the driver last for the earliest bucket: before, every callback
            # ran in B's context.
            tg.start_soon(handler, "A", 0.03)
            tg.start_soon(handler, "B", 0.01)
            tg.start_soon(handler, "C", 0.02)
    assert seen == {"A": "A", "B": "B", "C": "C"}


async def test_a_callback_setting_a_variable_changes_nobody_else() -> None:
    seen: list[str] = []
    async with Timer(tick=0.001) as timer:
        request_id.set("outer")

        def first() -> None:
            request_id.set("changed by first")

        timer.schedule_nowait(0.01, first)
        last = timer.schedule_nowait(0.02, lambda: seen.append(request_id.get()))
        await last.wait()
        assert request_id.get() == "outer"
    assert seen == ["outer"]


async def test_handles_scheduled_in_an_unchanged_context_share_one_snapshot() -> None:
    # A context per pending timer was a third of a handle's memory (docs/usage.md,
    # "Context variables"): handles scheduled while no variable changed share one.
    async with Timer(tick=0.001) as timer:
        request_id.set("one")
        first = timer.schedule_nowait(10, lambda: None)
        second = timer.schedule_nowait(10, lambda: None)
        request_id.set("two")
        third = timer.schedule_nowait(10, lambda: None)
        assert first._context is second._context
        assert third._context is not first._context
        assert first._context[request_id] == "one"
        assert third._context[request_id] == "two"
        for handle in (first, second, third):
            handle.cancel()


async def test_a_snapshot_is_shared_only_for_the_very_same_objects() -> None:
    # Equal is not enough (Context == Context compares values with ==): 1 == True,
    # and two equal dicts are two requests' states; each callback must get the
    # object its scheduler had.
    state: contextvars.ContextVar[object] = contextvars.ContextVar("state")
    got: list[object] = []
    async with Timer(tick=0.001) as timer:
        first_state: dict[str, int] = {}
        second_state: dict[str, int] = {}
        assert first_state == second_state
        state.set(first_state)
        a = timer.schedule_nowait(0.01, lambda: got.append(state.get()))
        state.set(second_state)
        b = timer.schedule_nowait(0.01, lambda: got.append(state.get()))
        state.set(1)
        c = timer.schedule_nowait(0.01, lambda: got.append(state.get()))
        state.set(True)
        d = timer.schedule_nowait(0.01, lambda: got.append(state.get()))
        assert len({id(h._context) for h in (a, b, c, d)}) == 4
        await d.wait()
    assert got[0] is first_state
    assert got[1] is second_state
    assert got[2] == 1
    assert got[2] is not True
    assert got[3] is True


async def test_each_run_of_a_re_armed_handle_starts_from_its_snapshot() -> None:
    seen: list[str] = []
    async with Timer(tick=0.001) as timer:
        request_id.set("scheduled")

        def run() -> None:
            seen.append(request_id.get())
            request_id.set("set by a run")

        handle = timer.schedule_nowait(0.005, run)
        await handle.wait()
        handle.reset(0.005)
        await handle.wait()
    assert seen == ["scheduled", "scheduled"]


async def test_a_context_of_many_variables_is_copied_per_handle_not_walked() -> None:
    # Asking whether two contexts hold the same objects walks every variable, on
    # every schedule: past _SHARE_LIMIT variables, a copy per handle (the old rule).
    from aiowheel._handle import _SHARE_LIMIT

    many = [contextvars.ContextVar(f"v{i}") for i in range(_SHARE_LIMIT + 1)]
    async with Timer(tick=0.001) as timer:
        for var in many:  # up to _SHARE_LIMIT in all, with what the runner set
            if len(contextvars.copy_context()) == _SHARE_LIMIT:
                break
            var.set(1)
        assert len(contextvars.copy_context()) == _SHARE_LIMIT
        at_limit = [timer.schedule_nowait(10, lambda: None) for _ in range(2)]
        many[-1].set(1)
        past = [timer.schedule_nowait(10, lambda: None) for _ in range(2)]
        assert at_limit[0]._context is at_limit[1]._context
        # Not walked past the limit: shared only where the compiled core asks, without
        # a walk, whether the context holds the very mapping (aiowheel/_ctxutil.c).
        assert (past[0]._context is past[1]._context) is _asks_without_a_copy()
        assert past[0]._context[many[-1]] == 1
        for handle in (*at_limit, *past):
            handle.cancel()


def _asks_without_a_copy() -> bool:
    from aiowheel._handle import ASKS_WITHOUT_COPY

    return ASKS_WITHOUT_COPY


def _ctxutil_works() -> bool:
    try:
        from aiowheel._ctxutil import layout_known
    except ImportError:  # a pure install
        return False
    return layout_known()


def test_the_compiled_core_asks_about_the_current_context_without_a_copy() -> None:
    # Built with the compiled core (setup.py), for the CPython versions the project
    # supports, whose context object it recognises (else it would always answer
    # False); the pure core (AIOWHEEL_PURE=1 beside a build) compares copies.
    assert _asks_without_a_copy() is aiowheel.COMPILED
    if aiowheel.COMPILED:
        assert _ctxutil_works()


@pytest.mark.skipif(not _ctxutil_works(), reason="aiowheel._ctxutil is not built")
def test_holds_current_is_true_exactly_for_the_very_same_variables() -> None:
    from aiowheel._ctxutil import holds_current

    var: contextvars.ContextVar[object] = contextvars.ContextVar("var")
    outer = contextvars.copy_context()

    def inside() -> list[bool]:
        found = [holds_current(outer)]  # a copy holds the same mapping
        var.set(object())
        found.append(holds_current(outer))  # a new binding: a new mapping
        return found

    assert holds_current(outer)
    assert outer.copy().run(inside) == [True, False]
    assert holds_current(outer)  # back in the caller's context
    # Equal variables in another mapping: False (snapshot_context then compares them).
    token = var.set(1)
    var.reset(token)
    assert not holds_current(outer)
    # A thread that has made no context yet, and a thread's own context.
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(holds_current(outer)))
    thread.start()
    thread.join()
    assert seen == [False]
    with pytest.raises(TypeError):
        holds_current()  # type: ignore[call-arg]
    assert not holds_current(object())  # type: ignore[arg-type]


async def test_a_snapshot_is_shared_after_a_variable_set_and_reset() -> None:
    # The same objects in another mapping (a reset makes a new one): still shared, by
    # comparing the variables (snapshot_context's second question).
    async with Timer(tick=0.001) as timer:
        request_id.set("one")
        first = timer.schedule_nowait(10, lambda: None)
        token = request_id.set("two")
        request_id.reset(token)
        second = timer.schedule_nowait(10, lambda: None)
        assert first._context is second._context
        assert second._context[request_id] == "one"
        for handle in (first, second):
            handle.cancel()


async def test_callbacks_sharing_a_snapshot_in_one_pass_do_not_see_each_other() -> None:
    # The shared snapshot is never run in: each callback runs in a copy of its own.
    seen: list[str] = []
    async with Timer(tick=0.001) as timer:
        request_id.set("outer")

        def first() -> None:
            seen.append(request_id.get())
            request_id.set("changed by first")

        def second() -> None:
            seen.append(request_id.get())
            request_id.set("changed by second")

        a = timer.schedule_nowait(0.01, first)
        b = timer.schedule_nowait(0.01, second)  # the same bucket, the same pass
        assert a._context is b._context
        await b.wait()
        c = timer.schedule_nowait(0, lambda: seen.append(request_id.get()))
        await c.wait()
        assert request_id.get() == "outer"
    assert seen == ["outer", "outer", "outer"]


async def test_async_bodies_sharing_a_snapshot_keep_what_they_set() -> None:
    seen: list[tuple[str, str]] = []
    async with Timer(tick=0.001) as timer:
        request_id.set("outer")

        async def job(name: str) -> None:
            before = request_id.get()
            request_id.set(name)
            await anyio.lowlevel.checkpoint()  # the other job runs meanwhile
            seen.append((before, request_id.get()))

        a = timer.schedule_nowait(0.01, job, "a")
        b = timer.schedule_nowait(0.01, job, "b")
        await a.wait()
        await b.wait()
    assert sorted(seen) == [("outer", "a"), ("outer", "b")]


async def test_a_periodic_run_sees_what_the_previous_run_set() -> None:
    # docs/usage.md: every run of a periodic timer uses the context of every(), so a
    # variable a run sets is seen by the next run, as in a task that loops.
    counter: contextvars.ContextVar[int] = contextvars.ContextVar("counter", default=0)
    seen: list[int] = []
    async with Timer(tick=0.001) as timer:
        done = anyio.Event()

        def tick() -> None:
            seen.append(counter.get())
            counter.set(counter.get() + 1)
            if len(seen) == 3:
                done.set()

        handle = timer.every(0.005, tick)  # a context of its own, run in directly
        sibling = timer.schedule_nowait(10, lambda: None)
        await done.wait()
        handle.cancel()
        assert counter.get() == 0
        assert counter not in sibling._context  # the shared snapshot was never run in
        sibling.cancel()
    assert seen == [0, 1, 2]


async def test_async_callback_is_created_in_the_scheduler_context() -> None:
    seen: list[str] = []
    async with Timer(tick=0.001) as timer:
        request_id.set("scheduler")

        def make() -> object:
            seen.append(request_id.get())  # called in the pass: the captured context

            async def job() -> None:
                pass

            return job()

        handle = timer.schedule_nowait(0.01, make)
        await handle.wait()
    assert seen == ["scheduler"]


async def test_periodic_runs_in_the_context_of_every() -> None:
    seen: list[str] = []
    async with Timer(tick=0.001) as timer:
        done = anyio.Event()

        def tick() -> None:
            seen.append(request_id.get())
            if len(seen) == 3:
                done.set()

        async def owner() -> None:
            request_id.set("periodic owner")
            timer.every(0.01, tick)

        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
        request_id.set("someone else")
        timer.schedule_nowait(0.005, lambda: None)  # another context arms the driver
        await done.wait()
    assert seen == ["periodic owner"] * 3


# -- the body of an async callback ---------------------------------------------------------


async def test_async_body_runs_in_the_scheduler_context_across_awaits() -> None:
    """Each body sees its own scheduler's value before and after an await, on one
    worker (max_concurrency=1) that runs the three jobs one after the other."""
    seen: dict[str, list[str]] = {}
    async with Timer(tick=0.001, max_concurrency=1) as timer:

        async def job(name: str) -> None:
            seen[name] = [request_id.get()]
            await anyio.sleep(0.01)
            seen[name].append(request_id.get())
            request_id.set(f"changed by {name}")
            await anyio.lowlevel.checkpoint()
            seen[name].append(request_id.get())

        async def handler(name: str, delay: float) -> None:
            request_id.set(name)
            handle = timer.schedule_nowait(delay, job, name)
            await handle.wait()
            assert request_id.get() == name  # what the body set stays in its copy

        async with anyio.create_task_group() as tg:
            tg.start_soon(handler, "A", 0.03)
            tg.start_soon(handler, "B", 0.01)
            tg.start_soon(handler, "C", 0.02)
    assert seen == {name: [name, name, f"changed by {name}"] for name in "ABC"}


async def test_async_periodic_body_runs_in_the_context_of_every() -> None:
    seen: list[tuple[str, str]] = []
    async with Timer(tick=0.001) as timer:
        done = anyio.Event()

        async def tick() -> None:
            before = request_id.get()
            await anyio.sleep(0.001)
            seen.append((before, request_id.get()))
            if len(seen) == 3:
                done.set()

        async def owner() -> None:
            request_id.set("periodic owner")
            timer.every(0.01, tick)

        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
        request_id.set("someone else")
        timer.schedule_nowait(0.005, lambda: None)  # another context arms the driver
        await done.wait()
    assert seen == [("periodic owner", "periodic owner")] * 3


async def test_a_task_started_by_an_async_body_inherits_its_context() -> None:
    seen: list[str] = []
    async with Timer(tick=0.001) as timer:

        async def child() -> None:
            await anyio.lowlevel.checkpoint()
            seen.append(request_id.get())

        async def job() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)

        request_id.set("scheduler")
        handle = timer.schedule_nowait(0.01, job)
        request_id.set("later")
        await handle.wait()
    assert seen == ["scheduler"]


async def test_an_async_body_that_fails_or_is_cancelled_in_its_context() -> None:
    """Exceptions and the cancellation of aclose() reach the body through the context
    it runs in; what it reads in its except/finally is still its own value."""
    seen: list[str] = []
    reported: list[BaseException] = []
    async with Timer(tick=0.001, on_error=lambda h, e: reported.append(e)) as timer:
        started = anyio.Event()

        async def failing() -> None:
            await anyio.sleep(0.001)
            raise KeyError(request_id.get())

        async def long() -> None:
            started.set()
            try:
                await anyio.sleep(100)
            finally:
                seen.append(request_id.get())

        request_id.set("failing")
        failed = timer.schedule_nowait(0.01, failing)
        request_id.set("long")
        timer.schedule_nowait(0.01, long)
        request_id.set("closer")
        with pytest.raises(KeyError, match="failing"):
            await failed.wait()
        await started.wait()
        await timer.aclose()
    assert seen == ["long"]
    assert [type(e) for e in reported] == [KeyError]
