"""The contenders: aiowheel on each backend and what a user would use instead.

A contender is a *kind* of timer on a *backend*:

============================  =======  ============================================================
name                          backend  what a timer is
============================  =======  ============================================================
``aiowheel-asyncio``          asyncio  ``aiowheel.Timer`` on the default asyncio loop
``aiowheel-uvloop``           uvloop   ``aiowheel.Timer`` on uvloop
``aiowheel-trio``             trio     ``aiowheel.Timer`` on trio (through anyio)
``call_later-asyncio``        asyncio  ``loop.call_later``/``call_at`` (a heap of TimerHandles)
``call_later-uvloop``         uvloop   ``loop.call_later``/``call_at`` (libuv's timer heap)
``trio-native``               trio     a task per timer sleeping in a ``CancelScope`` whose
                                       deadline is the timer's deadline (``trio.sleep_until``)
``deadline-asyncio``          asyncio  ``idle`` only: aiohttp's stored deadline, one
                                       ``call_at`` per connection re-checked when it fires
``deadline-uvloop``           uvloop   the same on uvloop
``loop-asyncio``              asyncio  ``loop.call_later``/``call_at`` on aiowheel's drop-in loop
``loop-uvloop``               uvloop   (``aiowheel.new_event_loop(base=...)``): the wheel's timers
``call_later-rloop``          rloop    ``loop.call_later``/``call_at`` on rloop (a Rust event loop)
``aiowheel-asyncio-pure``     asyncio  ``aiowheel-asyncio`` on the pure-Python core, in a child
``aiowheel-uvloop-pure``      uvloop   process started with ``AIOWHEEL_PURE=1`` (``child.py``);
``aiowheel-trio-pure``        trio     opt-in: only by name (or ``pure``), never by default
``aiowheel-asyncio-traced``   asyncio  ``aiowheel-<backend>`` recording a Parquet trace of every
``aiowheel-uvloop-traced``    uvloop   timer (``ParquetRecorder``) in every measured repetition;
``aiowheel-trio-traced``      trio     opt-in: only by name (or ``traced``)
``aiowheel-asyncio-sampled``  asyncio  the same, tracing one timer in ``SAMPLE_EVERY``
``aiowheel-uvloop-sampled``   uvloop   (``ParquetRecorder(..., every=SAMPLE_EVERY)``); opt-in:
``aiowheel-trio-sampled``     trio     only by name (or ``traced``)
============================  =======  ============================================================

The ``-traced`` and ``-sampled`` contenders measure what tracing costs: their ratio
columns compare them with the untraced ``aiowheel-<backend>`` of the same run (a
ratio of 1.5 on a time is +50%), and the untraced contenders' ratios against peers
leave them out. Their traces go to a temporary directory, removed after each
repetition.

uvloop, trio and rloop are extras: ``select`` keeps the contenders whose event loop is
installed. How a contender runs inside its loop is in ``env.py``.

The ``loop-*`` contenders (kind ``loop``) and ``call_later-rloop`` run only the drop-in
loop's workloads (``loop_workloads.py``, and ``server.py``'s real server, whose peers
are the plain loops: ``call_later-asyncio``, ``call_later-uvloop``,
``call_later-rloop``); no other workload
applies to them (``Workload.kinds`` and ``Workload.backends``), so they cost the
default run nothing. A ``loop-*`` contender is aiowheel (``is_aiowheel``): its timers are
on aiowheel's wheel, and its figures are the ones the peers' ratios are against.

Every aiowheel contender is labelled by the core it runs (``Contender.core``): the
parent process's (``aiowheel.COMPILED``) for ``aiowheel-<backend>``, always the pure
one for ``aiowheel-<backend>-pure``: the core is chosen at ``import aiowheel``, once
per process, so only a child process can run the other one.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiowheel
from aiowheel import _compiled

__all__ = [
    "CONTENDERS",
    "PURE_REASON",
    "SAMPLE_EVERY",
    "Contender",
    "Selection",
    "missing_backend",
    "select",
]

#: Why a ``-pure`` contender runs the pure core (``aiowheel._compiled.REASON`` in its
#: child process, which checks it: see ``child.py``).
PURE_REASON = f"{_compiled.PURE_ENV} is set"

#: The ``-sampled`` contenders trace one timer in this many.
SAMPLE_EVERY = 100


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "aiowheel" | "loop" | "call_later" | "deadline" | "trio"
    backend: str  # "asyncio" | "uvloop" | "trio" | "rloop"
    #: Runs aiowheel's pure-Python core in a child process (``child.py``).
    pure: bool = False
    #: Traces one timer in this many in every measured repetition (1: every timer;
    #: 0: no tracing, the default).
    trace_every: int = 0

    @property
    def is_aiowheel(self) -> bool:
        """Its timers are aiowheel's: a ``Timer`` (kind ``aiowheel``) or the drop-in
        loop's wheel (kind ``loop``)."""
        return self.kind in ("aiowheel", "loop")

    @property
    def baseline(self) -> bool:
        """An aiowheel contender peers are compared with: untraced."""
        return self.is_aiowheel and not self.trace_every

    @property
    def core(self) -> str | None:
        """``"compiled"`` or ``"pure"``: the aiowheel core it runs (None: not aiowheel)."""
        if not self.is_aiowheel:
            return None
        return "pure" if self.pure or not aiowheel.COMPILED else "compiled"

    @property
    def core_reason(self) -> str | None:
        """Why it runs the pure core (None when it does not)."""
        if self.core != "pure":
            return None
        return PURE_REASON if self.pure else _compiled.REASON

    @property
    def label(self) -> str:
        """Its name for people: ``aiowheel-asyncio [compiled]``, ``call_later-asyncio``."""
        return f"{self.name} [{self.core}]" if self.core else self.name


CONTENDERS: tuple[Contender, ...] = (
    Contender("aiowheel-asyncio", "aiowheel", "asyncio"),
    Contender("aiowheel-uvloop", "aiowheel", "uvloop"),
    Contender("aiowheel-trio", "aiowheel", "trio"),
    Contender("call_later-asyncio", "call_later", "asyncio"),
    Contender("call_later-uvloop", "call_later", "uvloop"),
    Contender("trio-native", "trio", "trio"),
    Contender("deadline-asyncio", "deadline", "asyncio"),
    Contender("deadline-uvloop", "deadline", "uvloop"),
    Contender("loop-asyncio", "loop", "asyncio"),
    Contender("loop-uvloop", "loop", "uvloop"),
    Contender("call_later-rloop", "call_later", "rloop"),
    Contender("aiowheel-asyncio-pure", "aiowheel", "asyncio", pure=True),
    Contender("aiowheel-uvloop-pure", "aiowheel", "uvloop", pure=True),
    Contender("aiowheel-trio-pure", "aiowheel", "trio", pure=True),
    Contender("aiowheel-asyncio-traced", "aiowheel", "asyncio", trace_every=1),
    Contender("aiowheel-uvloop-traced", "aiowheel", "uvloop", trace_every=1),
    Contender("aiowheel-trio-traced", "aiowheel", "trio", trace_every=1),
    Contender("aiowheel-asyncio-sampled", "aiowheel", "asyncio", trace_every=SAMPLE_EVERY),
    Contender("aiowheel-uvloop-sampled", "aiowheel", "uvloop", trace_every=SAMPLE_EVERY),
    Contender("aiowheel-trio-sampled", "aiowheel", "trio", trace_every=SAMPLE_EVERY),
)
_BY_NAME = {c.name: c for c in CONTENDERS}
_BACKENDS = ("asyncio", "uvloop", "trio", "rloop")
# "trio" last: it is a backend too (the usage message names it once).
_KINDS = ("aiowheel", "loop", "call_later", "deadline", "trio")
#: The extra that installs a backend's event loop, where it is not named after it.
_EXTRA = {"rloop": "bench"}
#: Selects every ``-pure`` contender (whose backend is installed).
_PURE = "pure"
#: Selects every ``-traced`` and ``-sampled`` contender (whose backend is installed).
_TRACED = "traced"


def missing_backend(backend: str) -> str | None:
    """Why ``backend``'s event loop cannot run here (None: it can).

    asyncio always can; uvloop, trio and rloop are extras, tried by importing them.
    """
    if backend == "asyncio":
        return None
    if backend in ("uvloop", "rloop") and sys.platform == "win32":
        return f"{backend} does not run on Windows"
    try:
        importlib.import_module(backend)
    except ImportError:
        # rloop comes with the bench extra (it is a peer of the drop-in loop only).
        return f"{backend} is not installed ({install_hint(_EXTRA.get(backend, backend))})"
    return None


def install_hint(extra: str) -> str:
    """How to install ``extra``: from a checkout (a pyproject.toml next to the package)
    ``pip install ".[extra]"``, since the package may not be on any registry yet."""
    root = Path(__file__).resolve().parents[2]
    checkout = (root / "pyproject.toml").is_file() and (root / "aiowheel").is_dir()
    if checkout:
        return f'pip install ".[{extra}]" (in {root})'
    return f'pip install "aiowheel[{extra}]"'


@dataclass
class Selection:
    """The contenders that run, and those left out because their loop is missing."""

    run: list[Contender]
    #: (contender, why it cannot run), in ``CONTENDERS`` order.
    unavailable: list[tuple[Contender, str]] = field(default_factory=list)


def select(specs: list[str] | None) -> Selection:
    """``--contenders a,b --contenders c``; None: the default set, every contender
    but the ``-pure``, ``-traced`` and ``-sampled`` ones.

    A token is a contender's name, a backend (``asyncio``, ``uvloop``, ``trio``,
    ``rloop``), a kind (``aiowheel``, ``loop``, ``call_later``, ``deadline``; ``trio``
    is both), ``pure`` (the ``-pure`` contenders, which backends and kinds leave out:
    each costs a child process) or ``traced`` (the ``-traced`` and ``-sampled`` ones,
    left out likewise). What a name or a backend asks for must be installed
    (``ValueError`` otherwise). The default set, a kind, ``pure`` and ``traced`` leave
    out, in
    ``Selection.unavailable``, the contenders whose backend is missing, so that a
    partial install runs what it can.
    """
    wanted: list[tuple[Contender, bool]] = []  # (contender, asked for by name or backend)
    usual = [c for c in CONTENDERS if not c.pure and not c.trace_every]
    if specs is None:
        wanted = [(c, False) for c in usual]
    else:
        tokens = [token for spec in specs for raw in spec.split(",") if (token := raw.strip())]
        if not tokens:
            raise ValueError("no contender given")
        for token in tokens:
            if token in _BY_NAME:
                wanted.append((_BY_NAME[token], True))
            elif token in _BACKENDS:
                wanted.extend((c, True) for c in usual if token in (c.backend, c.kind))
            elif token in _KINDS:
                wanted.extend((c, False) for c in usual if c.kind == token)
            elif token == _PURE:
                wanted.extend((c, False) for c in CONTENDERS if c.pure)
            elif token == _TRACED:
                wanted.extend((c, False) for c in CONTENDERS if c.trace_every)
            else:
                choices = ", ".join([*_BY_NAME, *_BACKENDS, *_KINDS[:-1], _PURE, _TRACED])
                shown = repr(token) if len(token) <= 40 else f"{token[:20]!r}..."
                raise ValueError(f"unknown contender {shown}; choose from {choices}")
    chosen: list[Contender] = []
    left_out: dict[Contender, str] = {}
    for contender, explicit in wanted:
        reason = missing_backend(contender.backend)
        if reason is None:
            if contender not in chosen:
                chosen.append(contender)
        elif explicit:
            raise ValueError(f"contender {contender.name} cannot run: {reason}")
        else:
            left_out[contender] = reason
    unavailable = [(c, left_out[c]) for c in CONTENDERS if c in left_out]
    return Selection(chosen, unavailable)
