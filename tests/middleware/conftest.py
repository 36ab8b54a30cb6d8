"""What the middleware tests share: a count of idle expiries.

An idle timer's handle fires once per timeout even for a connection that talks all the
time (activity stores the deadline and the firing re-files the handle for what is
left, aiowheel/middleware/_shared.py: IdleControl), so ``timer.stats().fired`` is not
"how many connections expired". ``expiries`` counts that, at the one place each
integration decides it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import Expiries

from aiowheel.middleware import _asgi, _streams, _uvicorn


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
