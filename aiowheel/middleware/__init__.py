"""Idle timeouts for servers, on aiowheel's O(1) re-arm.

* ``IdleTimeoutMiddleware``: a plain ASGI middleware (uvicorn, hypercorn, Starlette,
  FastAPI; asyncio, uvloop and trio) for stalled request bodies, stalled responses and
  idle websockets.
* ``uvicorn_protocol``: a uvicorn protocol class for what happens between requests
  (silent connections, keep-alive gaps, slowloris request heads).
* ``idle_timeout``: the same for ``asyncio.start_server`` handlers.
* ``set_idle_timeout``: an endpoint or handler changes or drops its own timeout
  (long-poll).
* ``shared_timer`` / ``get_shared_timer``: the one timer per event loop they share.

See docs/idle-timeouts.md.
"""

from ._asgi import IdleTimeoutMiddleware
from ._shared import (
    DEFAULT_TICK,
    SCOPE_KEY,
    IdleTimeoutError,
    get_shared_timer,
    set_idle_timeout,
    shared_timer,
)
from ._streams import IdleStreamReader, IdleStreamWriter, idle_timeout
from ._uvicorn import uvicorn_protocol

__all__ = [
    "DEFAULT_TICK",
    "SCOPE_KEY",
    "IdleStreamReader",
    "IdleStreamWriter",
    "IdleTimeoutError",
    "IdleTimeoutMiddleware",
    "get_shared_timer",
    "idle_timeout",
    "set_idle_timeout",
    "shared_timer",
    "uvicorn_protocol",
]
