"""``server``: a real uvicorn server on 127.0.0.1, loaded from another process.

Each contender's event loop serves one ASGI app under uvicorn in a process of its own
(``_serve.py``); a load generator in another process drives it (``wrk`` when it is on
PATH, else ``_load.py``: keep-alive connections, each sending its next request when
its previous response is in). Every load run is bounded in time and in requests,
every read by a timeout; every process it starts is stopped before it returns.

Variants (each a phase of one server process per contender and round):

``trivial``     ``GET /``: a handler that answers two bytes.
``timeouts``    ``GET /t``: each request awaits three short operations under
                ``asyncio.timeout(10)`` and two under ``asyncio.wait_for(..., 10)``, as
                database and HTTP clients do: each timeout is armed, then cancelled
                when the operation completes.
``idle N=...``  N idle keep-alive connections held open (one request each, then
                silent) by a third process, beside the trivial load: also the
                server's RSS per idle connection, one full collection's pause
                (``gc.collect()`` in the server, timed) with them held, and the
                collector's longest pause (``gc.callbacks`` in the server) while it
                served the load beside them.
``protocol``    the trivial app with ``aiowheel.middleware.uvicorn_protocol`` closing
                idle connections instead of uvicorn's own keep-alive timeout
                (the plain loops only: that is where users run it; not in a quick
                run, the main job's).
``middleware``  the same, and ``IdleTimeoutMiddleware`` around the app.

Figures: requests/s, latency p50 and p99 (as the load generator sees them), server
CPU per request (the server process's ``time.process_time()`` over the load run /
requests), and for the guarded variants their requests/s as a fraction of the same
contender's ``trivial`` in the same round (``vs_uvicorn``; the tables print it as
the cost it is, a percentage).

At least 3 rounds (``--reps`` sets them), alternating between contenders (A B C,
B C A, C A B): a figure is the median over the rounds, shown with their min-max;
the ``idle`` variant runs in the first round only in a quick run. The ratio columns
compare a plain loop with the drop-in loop on its own base (``call_later-uvloop``
with ``loop-uvloop``); a ratio whose range over the rounds holds 1x is printed as
"no difference measured". The load generator shares the machine with the server:
on 2 cores, requests/s is bounded by both; CPU per request is the server's own.

A server that fails (does not start, stops answering: every request the bench makes
has a timeout) is recorded as failed with the reason and its last log line (its
stderr goes to a file: a pipe read only at the end fills up and blocks the server's
next log write), and the run goes on. rloop sits out under wrk (``_wrk_problem``).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, ClassVar

from .child import ChildError
from .contenders import Contender, install_hint
from .results import Result
from .settings import Settings
from .workload import Metric, Progress, Remote, SearchedWorkload, Trace, failure_reason

__all__ = ["Server", "ServerError", "parse_wrk"]

#: Keep-alive connections of the load generator.
CONNECTIONS = 50
#: At most this many requests per load run (the time bound ends it first here).
MAX_REQUESTS = 2_000_000
#: Seconds a server may take to print its port, a holder to open its connections.
START_TIMEOUT = 30.0
#: Seconds past its window a load run may take before it is killed.
GRACE = 15.0
#: Seconds the server has to answer one of the bench's own requests (``/__stats``).
REQUEST_TIMEOUT = 10.0

_GUARDED = ("protocol", "middleware")


class ServerError(ChildError):
    """A server or a load generator did not do its part (said with its stderr): one
    line for the command line, as a failed child process's."""


@dataclass(frozen=True)
class _Figures:
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float


def _uvicorn_installed() -> bool:
    try:
        importlib.import_module("uvicorn")
    except ImportError:
        return False
    return True


def _http_implementation() -> str:
    """The HTTP parser uvicorn's ``http="auto"`` picks: httptools when installed."""
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def _wrk_problem(contender: Contender) -> str | None:
    """Why ``contender`` cannot be measured under wrk (None: it can).

    rloop (0.5): wrk ends its run by closing its connections with responses still in
    flight. rloop then calls the protocol's ``connection_lost`` from inside
    ``transport.write`` (asyncio and uvloop report it later, from the loop), so
    uvicorn's HTTP cycle fails in the middle of its response, once per connection,
    and rloop never closes those sockets (they stay in CLOSE-WAIT, about 30 a run).
    The load generator of this package waits for each response before it closes a
    connection, and measures rloop."""
    if contender.backend != "rloop" or shutil.which("wrk") is None:
        return None
    try:
        version = f"rloop {importlib.metadata.version('rloop')}"
    except importlib.metadata.PackageNotFoundError:
        version = "rloop"
    return (
        f"{version} under wrk: a connection closed with a response in flight makes rloop call "
        "connection_lost from inside transport.write (an error in uvicorn each) and leaves the "
        "socket open (CLOSE-WAIT); without wrk on PATH it is measured with the bench's own "
        "load generator"
    )


def _loop_name(contender: Contender) -> str:
    """``_serve.py``'s name for the contender's event loop."""
    return f"loop-{contender.backend}" if contender.kind == "loop" else contender.backend


def _serve_args(contender: Contender, guard: str) -> list[str]:
    """The Python command line of ``contender``'s server (``_serve.py``)."""
    return ["-m", "aiowheel.bench._serve", _loop_name(contender), guard]


def _raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit (children inherit it) towards ``wanted``;
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft


def idle_connections(settings: Settings) -> int:
    """How many idle connections the ``idle`` variant holds (``--n``; 300 quick,
    10,000 with ``--full``), capped by what the open-file limit allows (each takes
    a descriptor in the holder and one in the server)."""
    wanted = settings.n[0] if settings.n else (300 if settings.quick else 10_000)
    limit = _raise_fd_limit(wanted + 1_000)
    return max(1, min(wanted, limit - 200))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The children import this very package (a checkout on PYTHONPATH, an install).
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class _Child:
    """A child process of the workload and its stderr, kept in a file: a pipe nobody
    reads while the child runs fills up (64 KiB on Linux) and then blocks the child's
    next write to it, a server's log line included: the server stops answering."""

    proc: subprocess.Popen[str]
    log: IO[str]
    what: str

    def last_error(self) -> str:
        """The last line the child wrote to stderr (cut to 200 characters), or ''."""
        with contextlib.suppress(OSError, ValueError):
            self.log.flush()
            self.log.seek(0)
            lines = [line.strip() for line in self.log.read().splitlines() if line.strip()]
            if lines:
                return _cut(lines[-1])
        return ""


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _process(args: list[str], what: str) -> Iterator[_Child]:
    """A child process, stopped on the way out whatever happens: stdin closed (the
    server and the holder stop on it), then SIGTERM, then SIGKILL."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=_env(),
        )
        try:
            yield _Child(proc, log, what)
        finally:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _first_line(child: _Child) -> str:
    """The child's first line of stdout, within ``START_TIMEOUT`` (its stderr if none)."""
    proc = child.proc
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(START_TIMEOUT):
            line = proc.stdout.readline().strip()
            if line:
                return line
    proc.kill()
    proc.wait()
    raise ServerError(f"{child.what} did not start: {child.last_error() or 'no output'}")


def _stats(port: int, *, full_gc: bool = False, reset: bool = False) -> dict[str, Any]:
    query = "&".join(q for q, on in (("gc=1", full_gc), ("reset=1", reset)) if on)
    path = "/__stats" + (f"?{query}" if query else "")
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=REQUEST_TIMEOUT
        ) as response:
            stats: dict[str, Any] = json.load(response)
    except TimeoutError:
        raise ServerError(
            f"GET {path}: no answer within {REQUEST_TIMEOUT:g} s (the server stopped answering)"
        ) from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ServerError(f"GET {path} failed: {_cut(str(reason) or type(exc).__name__)}") from None
    return stats


_WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def parse_wrk(text: str) -> dict[str, float]:
    """requests, seconds, p50_ms, p99_ms from ``wrk --latency``'s output."""
    done = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", text)
    if done is None:
        raise ServerError(f"cannot read wrk's output: {text[-200:]!r}")
    seconds = float(done.group(2)) * _WRK_UNITS[done.group(3)] / 1e3
    out = {"requests": float(done.group(1)), "seconds": seconds}
    for q, key in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s*{q}(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.MULTILINE)
        if m is None:
            raise ServerError(f"wrk printed no {q}% latency (--latency): {text[-200:]!r}")
        out[key] = float(m.group(1)) * _WRK_UNITS[m.group(2)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: .*", text)
    out["errors"] = 1.0 if errors else 0.0
    return out


def _load(port: int, path: str, seconds: float) -> dict[str, float]:
    """One bounded load run against the server; the load generator's figures."""
    wrk = shutil.which("wrk")
    if wrk is not None:
        duration = max(1, round(seconds))
        args = [wrk, "-t1", f"-c{CONNECTIONS}", f"-d{duration}s", "--latency"]
        args += [f"--timeout={int(GRACE)}s", f"http://127.0.0.1:{port}{path}"]
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=duration + GRACE, check=False
            )
        except subprocess.TimeoutExpired:
            raise ServerError(f"wrk did not finish within {duration + GRACE:g} s") from None
        if done.returncode != 0:
            raise ServerError(f"wrk failed: {_cut(done.stderr.strip())}")
        return parse_wrk(done.stdout)
    args = [sys.executable, "-m", "aiowheel.bench._load", "load", str(port), path]
    args += [str(CONNECTIONS), repr(seconds), str(MAX_REQUESTS)]
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=seconds + GRACE, env=_env(), check=False
        )
    except subprocess.TimeoutExpired:
        raise ServerError(
            f"the load generator did not finish within {seconds + GRACE:g} s"
        ) from None
    if done.returncode != 0 or not done.stdout.strip():
        err = done.stderr.strip().splitlines()
        raise ServerError(f"the load generator failed: {err[-1] if err else done.returncode}")
    result: dict[str, float] = json.loads(done.stdout)
    return result


def _warm_up(port: int, requests: int = 200) -> None:
    """A few hundred requests on one keep-alive connection (imports, first
    allocations) before the first measured load, within ``REQUEST_TIMEOUT``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
    try:
        for _ in range(requests):
            connection.request("GET", "/")
            connection.getresponse().read()
    except TimeoutError:
        raise ServerError(
            f"GET /: no answer within {REQUEST_TIMEOUT:g} s (the server stopped answering)"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise ServerError(f"GET / failed: {_cut(str(exc) or type(exc).__name__)}") from None
    finally:
        connection.close()


def _measure(port: int, path: str, seconds: float) -> _Figures:
    before = _stats(port)
    load = _load(port, path, seconds)
    after = _stats(port)
    requests = load["requests"]
    if not requests or load.get("errors"):
        raise ServerError(
            f"GET {path}: {requests:.0f} responses, {load.get('errors', 0):.0f} errors"
        )
    return _Figures(
        rps=requests / load["seconds"],
        p50_ms=load["p50_ms"],
        p99_ms=load["p99_ms"],
        cpu_us=(after["cpu"] - before["cpu"]) / requests * 1e6,
    )


class Server(SearchedWorkload):
    name = "server"
    title = "uvicorn on 127.0.0.1, loaded from another process"
    metrics = (
        Metric("rps", "requests/s", "1/s", "higher"),
        Metric("p50_ms", "latency p50", "ms", "lower"),
        Metric("p99_ms", "latency p99", "ms", "lower"),
        Metric("cpu_us", "server CPU per request", "us", "lower"),
        Metric("rss_per_conn", "server RSS per idle connection", "B", "lower"),
        Metric("gc_full_ms", "a full collection, idle connections held", "ms", "lower"),
        Metric("gc_max_ms", "longest collector pause under load, idle held", "ms", "lower"),
        Metric(
            "vs_uvicorn",
            "requests/s vs uvicorn's keep-alive (same loop)",
            "x",
            "higher",
            ratio=False,
        ),
    )
    kinds: ClassVar[frozenset[str]] = frozenset({"loop", "call_later"})
    backends: ClassVar[frozenset[str]] = frozenset({"asyncio", "uvloop", "rloop"})
    traced = False
    default = False

    def skip_reason(self, contender: Contender, n: int | None, settings: Settings) -> str | None:
        return _wrk_problem(contender)

    def _seconds(self, settings: Settings) -> float:
        return settings.server_seconds or (0.5 if settings.quick else 2.0)

    def _rounds(self, settings: Settings) -> int:
        # Alternating rounds (A B C, B C A, ...), at least 3 (the quick variant's and
        # the main job's too): a figure is their median and shows their min-max, and a
        # ratio whose range crosses 1x says "no difference measured". One round's
        # ratios flip from run to run. --reps, when given, is the number of rounds.
        if settings.server_rounds is not None:
            return settings.server_rounds
        return max(3, settings.reps)

    def _idle_variant(self, settings: Settings) -> str:
        return f"idle N={idle_connections(settings):,}"

    def variants(self, settings: Settings) -> list[str]:
        return ["trivial", "timeouts", self._idle_variant(settings), *self._guards(settings)]

    @staticmethod
    def _guards(settings: Settings) -> tuple[str, ...]:
        """The guarded variants run: a quick run (the main job's) has the middleware,
        which is ``uvicorn_protocol`` and ``IdleTimeoutMiddleware``, what users run;
        the protocol alone, a server more per round, in the others."""
        return ("middleware",) if settings.quick else _GUARDED

    @staticmethod
    def guarded(contender: Contender) -> bool:
        """The idle-timeout middleware runs on the plain asyncio and uvloop loops."""
        return contender.kind == "call_later" and contender.backend in ("asyncio", "uvloop")

    def step_seconds(self, settings: Settings) -> float:
        """A server's start (about 1 s), its load runs and, one round in three
        (quick) or every round, the idle connections' holder; the guarded servers'
        steps have one load run: the mean over a round of a plain and a guarded loop."""
        load = self._load_seconds(settings)
        idle = (1.0 / self._rounds(settings) if settings.quick else 1.0) * (load + 1.0)
        plain = 1.0 + 2 * load + idle
        guarded = 1.0 + load
        guards = len(self._guards(settings))
        return (plain + guards * guarded) / (1 + guards)

    def _load_seconds(self, settings: Settings) -> float:
        """How long one load run takes (wrk counts whole seconds, at least one)."""
        seconds = self._seconds(settings)
        return max(1.0, round(seconds)) if shutil.which("wrk") else seconds

    def planned_steps(self, settings: Settings, contenders: list[Contender]) -> int:
        guards = len(self._guards(settings))
        per_round = len(contenders) + sum(guards for c in contenders if self.guarded(c))
        return per_round * self._rounds(settings)

    def params(self, settings: Settings) -> dict[str, Any]:
        return {
            "server": f"uvicorn ({_http_implementation()}), one process, 127.0.0.1",
            "load": "wrk" if shutil.which("wrk") else "aiowheel.bench._load (asyncio)",
            "connections": CONNECTIONS,
            "seconds": self._seconds(settings),
            "rounds": self._rounds(settings),
            "timeouts_app": "3 x asyncio.timeout(10) + 2 x asyncio.wait_for(..., 10) "
            "around operations that complete at once",
            "guard_timeout": 30.0,
        }

    def _one_server(
        self, contender: Contender, guard: str, settings: Settings, idle: int | None
    ) -> dict[str, dict[str, float]]:
        """One server process for ``contender``: its phases' figures by variant (the
        ``idle`` variant only when ``idle`` connections are given)."""
        what = f"the {contender.name} server"
        with _process(_serve_args(contender, guard), what) as server:
            try:
                return self._phases(server, guard, settings, idle)
            except ServerError as exc:
                log = server.last_error()
                if not log or log in str(exc):
                    raise
                raise ServerError(f"{exc}; {what}'s last log line: {log}") from None

    def _phases(
        self, server: _Child, guard: str, settings: Settings, idle: int | None
    ) -> dict[str, dict[str, float]]:
        seconds = self._seconds(settings)
        out: dict[str, dict[str, float]] = {}
        port = int(_first_line(server))
        _warm_up(port)
        trivial = _measure(port, "/", seconds)
        if guard != "uvicorn":
            return {guard: vars(trivial)}
        out["trivial"] = vars(trivial)
        out["timeouts"] = vars(_measure(port, "/t", seconds))
        if idle is None:
            return out
        before = _stats(port, full_gc=True)
        hold = ["-m", "aiowheel.bench._load", "hold", str(port), str(idle)]
        with _process(hold, "the idle connections' holder") as holder:
            held = int(_first_line(holder).split()[-1])
            if held < idle:
                raise ServerError(f"only {held:,} of {idle:,} idle connections opened")
            during = _stats(port, full_gc=True, reset=True)
            figures = vars(_measure(port, "/", seconds))
            # The collector's longest pause (gc.callbacks in the server) while it
            # served the load beside the idle connections.
            under_load = _stats(port)["gc_longest"]
        rss = (during["rss"] - before["rss"]) / idle if during["rss"] else None
        out[self._idle_variant(settings)] = {
            **figures,
            **({"rss_per_conn": rss} if rss is not None else {}),
            "gc_full_ms": during["gc_full"] * 1e3,
            "gc_max_ms": under_load * 1e3,
        }
        return out

    def _variants_of(self, contender: Contender, settings: Settings) -> list[str]:
        variants = ["trivial", "timeouts", self._idle_variant(settings)]
        return [*variants, *(self._guards(settings) if self.guarded(contender) else ())]

    @staticmethod
    def _guards_of(variant: str) -> tuple[str, ...]:
        """The servers a variant's figures come from (the guarded variants' ratio to
        uvicorn's keep-alive needs both)."""
        return ("uvicorn", variant) if variant in _GUARDED else ("uvicorn",)

    def measure(
        self,
        settings: Settings,
        contenders: list[Contender],
        progress: Progress,
        trace: Trace,
        remote: Remote,
    ) -> list[Result]:
        params = self.params(settings)
        if not _uvicorn_installed():
            # A partial install: the main job still runs the rest, and says why not this.
            reason = f"uvicorn is not installed ({install_hint('bench')})"
            return [
                self.result(metric, c, [], variant="trivial", n=None, params=params, skipped=reason)
                for metric in self.metrics[:1]
                for c in contenders
            ]
        idle = idle_connections(settings)
        rounds = self._rounds(settings)
        samples: dict[tuple[str, str, str], list[float]] = {}
        #: (contender name, guard) -> why its server failed (it runs no further round;
        #: the contender's other servers run on).
        failed: dict[tuple[str, str], str] = {}
        for round_ in range(rounds):
            # Alternating rounds, each starting with the next contender: drift and
            # other work on the machine hit every contender alike.
            shift = round_ % len(contenders) if contenders else 0
            for contender in [*contenders[shift:], *contenders[:shift]]:
                guards = self._guards(settings) if self.guarded(contender) else ()
                for guard in ["uvicorn", *guards]:
                    step = f"server round {round_ + 1}/{rounds}: {contender.name} ({guard})"
                    if (contender.name, guard) in failed:
                        progress(f"{step}: not run, it failed")
                        continue
                    progress(step)
                    try:
                        held = idle if self._idle_round(round_, settings) else None
                        phases = self._one_server(contender, guard, settings, held)
                    except Exception as exc:  # a contender that fails: said, the run goes on
                        why = failure_reason(exc, contender)
                        failed[(contender.name, guard)] = (
                            f"round {round_ + 1}/{rounds}, {guard}: {why}"
                        )
                        continue
                    for variant, values in phases.items():
                        for key, value in values.items():
                            samples.setdefault((variant, contender.name, key), []).append(value)
        samples = {
            k: v
            for k, v in samples.items()
            if not any((k[1], guard) in failed for guard in self._guards_of(k[0]))
        }
        # The guarded variants as a fraction of the same loop's trivial, round by round.
        for contender in contenders:
            base = samples.get(("trivial", contender.name, "rps"), [])
            for guard in _GUARDED:
                guarded = samples.get((guard, contender.name, "rps"))
                if guarded and base:
                    samples[(guard, contender.name, "vs_uvicorn")] = [
                        g / b for g, b in zip(guarded, base, strict=True)
                    ]
        results: list[Result] = []
        for variant in self.variants(settings):
            variant_params = {**params, "idle": idle} if variant.startswith("idle") else params
            for metric in self.metrics:
                for contender in contenders:
                    measured = samples.get((variant, contender.name, metric.key))
                    if measured:
                        results.append(
                            self.result(
                                metric,
                                contender,
                                measured,
                                variant=variant,
                                n=None,
                                params=variant_params,
                            )
                        )
            for (name, guard), reason in failed.items():
                contender = next(c for c in contenders if c.name == name)
                if guard in self._guards_of(variant) and variant in self._variants_of(
                    contender, settings
                ):
                    results.append(
                        self.result(
                            self.metrics[0],
                            contender,
                            [],
                            variant=variant,
                            n=None,
                            params=variant_params,
                            failed=reason,
                        )
                    )
        return results

    @staticmethod
    def _idle_round(round_: int, settings: Settings) -> bool:
        """The idle variant (a holder of idle connections beside the load) runs in the
        first round only in a quick run (the main job's time), in every round else."""
        return round_ == 0 or not settings.quick
