"""The ``-pure`` contenders' child processes: aiowheel's pure core beside the compiled one.

The core is chosen once per process, at ``import aiowheel`` (aiowheel/_compiled.py),
so a process running the compiled core cannot also run the pure one. Each ``-pure``
contender (``contenders.py``) therefore runs in a child process of its own,
``python -m aiowheel.bench._childmain`` (``main`` below), started with
``AIOWHEEL_PURE=1``, the parent's environment and the parent's aiowheel first on
``PYTHONPATH``. It is started on first use and ends with the run. The parent hands it
one unit of work at a time, when the runner's order comes to it (repetitions stay
interleaved, A B C A B C..., with the contenders measured in the parent; while the
child measures, the parent waits), and the child answers with what it measured,
which the parent reports like any other contender's figures.

The protocol, one JSON object per line: requests on the child's stdin, answers on its
stdout (the child's ``sys.stdout`` goes to stderr, so that nothing else reaches it).

* first, unasked, the child says which core it runs and which aiowheel: ``{"compiled":
  false, "reason": "AIOWHEEL_PURE is set", "package": <aiowheel's directory>}``, and
  every answer says the core again; the parent checks that the child runs the pure
  core of the same aiowheel;
* ``{"op": "repeat", "workload", "contender", "settings", "n", "rep", "state"}``: one
  repetition of a repeated workload on the data its ``prepare(n, rep)`` draws (from
  the run's seed: the same data as in the parent), answered ``{"values": {...},
  "state": {...}}``;
* ``{"op": "probe", "workload", "contender", "settings", "rate", "seconds", "case"}``:
  one probe of the kafka workload, answered with the ``ProbeResult``'s fields;
* a failure is answered ``{"error": "<one line>"}``; the end of stdin ends the child.

Any failure (an error answer, the child exiting, an unexpected core) stops the run
with ``ChildError``: one line naming the contender and the child's last words.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import aiowheel
from aiowheel import _compiled
from aiowheel._compiled import PURE_ENV

from .contenders import CONTENDERS, Contender
from .settings import Settings

__all__ = ["ChildError", "PureChildren", "main", "settings_from_json", "settings_to_json"]

#: Settings a child does not need: what to run and how to print are the parent's.
_PARENT_ONLY = frozenset(
    {"workloads", "contenders", "unavailable", "json", "trace_dir", "progress"}
)


class ChildError(Exception):
    """A ``-pure`` contender's child process failed: one line for the command line."""


def settings_to_json(settings: Settings) -> dict[str, Any]:
    """What a child needs of the run's settings (sizes, windows, seed...)."""
    return {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if f.name not in _PARENT_ONLY
    }


def settings_from_json(fields: dict[str, Any]) -> Settings:
    settings = Settings(workloads=[], contenders=[], **fields, progress=False)
    settings.kafka_cases = tuple(settings.kafka_cases)
    return settings


def _package() -> str:
    return str(Path(aiowheel.__file__).resolve().parent)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


#: Seconds a child has to answer one request (the longest repetition of a full run
#: takes well under a minute).
ANSWER_TIMEOUT = 600.0


class _Child:
    """One ``-pure`` contender's child process."""

    #: How to start it (tests start stand-ins that fail).
    command: tuple[str, ...] = (sys.executable, "-m", "aiowheel.bench._childmain")

    def __init__(self, contender: Contender) -> None:
        self.contender = contender
        root = str(Path(_package()).parent)
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        # Read only if it fails (its last line says why); closed by close().
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                env={**os.environ, PURE_ENV: "1", "PYTHONPATH": path},
                text=True,
                encoding="utf-8",
            )
        except OSError as exc:
            self.stderr.close()
            raise ChildError(f"{contender.name}: cannot start its child process: {exc}") from None
        try:
            hello = self._answer()
            if hello.get("package") != _package():
                raise self._error(f"it imported another aiowheel ({hello.get('package')})")
        except BaseException:
            # A child refused at its hello (it died, ran the compiled core, imported
            # another aiowheel) is not kept: its pipes are closed and it is waited for
            # (or killed), not left running behind the error.
            self.close()
            raise

    def _error(self, why: str) -> ChildError:
        return ChildError(f"{self.contender.name}: child process failed: {why}")

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(ANSWER_TIMEOUT):
                # A child that hangs does not hang the run: stopped, and said.
                self.process.kill()
                self.process.wait()
                raise self._error(f"no answer within {ANSWER_TIMEOUT:g} s (stopped)")
        line = self.process.stdout.readline()
        if not line:
            status = self.process.wait()
            self.stderr.seek(0)
            words = _last_line(self.stderr.read().decode("utf-8", "replace"))
            self.stderr.close()
            how = f"exit status {status}" if status >= 0 else f"killed by signal {-status}"
            raise self._error(f"{how}: {words}")
        try:
            answer: dict[str, Any] = json.loads(line)
        except ValueError:
            raise self._error(f"unexpected output: {line.strip()[:100]!r}") from None
        if "error" in answer:
            raise self._error(str(answer["error"]))
        if answer.get("compiled") is not False:
            raise self._error(f"it ran the compiled core although {PURE_ENV}=1")
        return answer

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died: _answer says how
        return self._answer()

    def close(self) -> None:
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.stderr.close()  # a second close does nothing


class PureChildren:
    """The run's ``-pure`` contenders' child processes, each started on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings_to_json(settings)
        self._children: dict[Contender, _Child] = {}

    def __call__(self, contender: Contender, request: dict[str, Any]) -> dict[str, Any]:
        """Run ``request`` in ``contender``'s child process; returns its answer."""
        assert contender.pure, contender
        child = self._children.get(contender)
        if child is None:
            child = self._children[contender] = _Child(contender)
        try:
            return child.call({**request, "contender": contender.name, "settings": self.settings})
        except ChildError:
            del self._children[contender]
            child.close()
            raise

    def close(self) -> None:
        children, self._children = list(self._children.values()), {}
        for child in children:
            child.close()


# -- the child ------------------------------------------------------------------------


class _Worker:
    def __init__(self) -> None:
        self._data: tuple[tuple[Any, ...], Any] | None = None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        # Imported here: the registry imports the workloads, which import this module's
        # package siblings; the parent never needs them from here.
        from .kafka import Kafka
        from .registry import WORKLOADS
        from .workload import RepeatedWorkload

        settings = settings_from_json(request["settings"])
        contender = {c.name: c for c in CONTENDERS}[request["contender"]]
        workload = WORKLOADS[request["workload"]]
        if request["op"] == "repeat" and isinstance(workload, RepeatedWorkload):
            n, rep = int(request["n"]), int(request["rep"])
            key = (workload.name, n, rep, json.dumps(request["settings"], sort_keys=True))
            if self._data is None or self._data[0] != key:
                self._data = None  # one repetition's data at a time
                self._data = (key, workload.prepare(n, rep, settings))
            state: dict[str, float] = request["state"]
            values = workload.repetition(contender, n, self._data[1], settings, state)
            return {"values": values, "state": state}
        if request["op"] == "probe" and isinstance(workload, Kafka):
            result = workload.probe_once(
                contender,
                float(request["rate"]),
                float(request["seconds"]),
                str(request["case"]),
                settings,
            )
            return dataclasses.asdict(result)
        raise ValueError(f"cannot {request['op']} workload {workload.name}")


def main() -> int:
    """The child: answer the parent's requests until its stdin ends."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr

    def answer(obj: dict[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    core = {"compiled": aiowheel.COMPILED, "reason": _compiled.REASON}
    answer({**core, "package": _package()})
    worker = _Worker()
    for line in sys.stdin:
        try:
            reply = {**worker.handle(json.loads(line)), **core}
        except Exception as exc:
            text = " ".join(str(exc).split())
            reply = {"error": f"{type(exc).__name__}: {text}" if text else type(exc).__name__}
        answer(reply)
    return 0
