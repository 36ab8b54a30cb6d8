"""What the middleware tests share: a count of idle expiries.

An idle timer's handle fires once per timeout even for a connection that talks all the
time (activity stores the deadline and the firing re-files the handle for what is
left, aiowheel/middleware/_shared.py: IdleControl), so ``timer.stats().fired`` is not
"how many connections expired". ``expiries`` counts that, at the one place each
integration decides it.

A request arms nothing of its own: a connection's filing times it, or a spare filing
the middleware keeps for the next request (``SpareHolder`` in
aiowheel/middleware/_shared.py), so "the timer holds nothing once the request is
over" reads: whatever is still pending is a spare filing that holds no request
(``nothing_held``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import Expiries

from aiowheel import Timer
from aiowheel.middleware import IdleTimeoutMiddleware, _asgi, _streams, _uvicorn


@pytest.fixture
def expiries(monkeypatch: pytest.MonkeyPatch) -> Expiries:
    seen = Expiries()
    for cls, name in (
        (_asgi._RequestWatch, "_expire"),
        (_asgi._RequestWatch, "_body_expire"),
        (_streams._StreamWatch, "_expire"),
        (_uvicorn._ConnectionWatch, "_expire"),
    ):
        original: Callable[[Any], None] = getattr(cls, name)

        def counted(self: Any, original: Callable[[Any], None] = original) -> None:
            seen.count += 1
            original(self)

        monkeypatch.setattr(cls, name, counted)
    return seen


NothingHeld = Callable[..., None]


def _assert_nothing_held(timer: Timer, *middlewares: IdleTimeoutMiddleware) -> None:
    spares = [
        spare
        for middleware in middlewares
        if middleware._cached is not None
        for spare in middleware._cached.spare
    ]
    assert all(spare._request is None for spare in spares)
    # Every pending handle is a spare's (each filed at most once): none times a request.
    assert len(timer) == sum(spare._handle is not None for spare in spares)


@pytest.fixture
def nothing_held() -> NothingHeld:
    """``nothing_held(timer, *middlewares)``: the timer's pending handles are the
    middlewares' spare filings, none of them holding a request."""
    return _assert_nothing_held
