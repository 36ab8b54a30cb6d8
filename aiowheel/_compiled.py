"""Which core runs: the compiled extension modules, or the pure-Python sources.

The hot modules listed in ``MODULES`` are compiled by ``setup.py`` (mypyc) from the
very same ``.py`` files, which stay in the package. A compiled module is an extension
module of the *same name* (``aiowheel/_wheel.cpython-311-x86_64-linux-gnu.so`` next to
``aiowheel/_wheel.py``), and Python's import system prefers an extension to a source
file in the same directory. So choosing the pure core is done here, in
``aiowheel/__init__.py`` before any core module is imported, by putting a finder in
front of ``sys.meta_path`` that loads each module of ``MODULES`` from its ``.py`` file.

The choice is all or nothing: compiled modules call each other directly in C and a
compiled class cannot inherit from an interpreted one, so the core never mixes the
two. The pure core is chosen when

* ``AIOWHEEL_PURE`` is set to anything but ``""`` or ``"0"`` (silently: it was asked);
* no extension was built: run from a source tree, or the build fell back to pure
  Python (no C compiler...): the build said why in one line, which pip shows only
  with ``-v``, so the first import says it again, as a warning;
* the build is incomplete or stale: a module of ``MODULES`` has no extension, or its
  ``.py`` no longer matches the digest the build recorded in ``_compiled.json``
  (an editable install whose sources were edited since ``pip install -e .``): the
  source is the truth, so it runs, and a warning says to rebuild;
* an extension fails to import (a warning says why).

This module runs in ``setup.py`` too (``MODULES``, ``source_digest``), before the
package can be imported: it must import nothing but the standard library.

Where it stands among the modules: docs/design.md, "Module map".
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["MANIFEST", "MODULES", "PURE_ENV", "REASON", "select_core", "source_digest"]

#: The modules of the compiled core, by name inside the package: the one list, read by
#: ``setup.py`` to build them and here to choose them.
MODULES: tuple[str, ...] = (
    "_wheel",
    "_handle",
    "_dispatch",
    "_affinity",
    "_waiters",
    "_periodic",
    "_pass",
    "_engine",
    "_shutdown",
    "_lifecycle",
    "_timer",
    "_timeout",
    "_purgatory",
    "_loophandle",
    "_tracing",
    "_driver",
)

#: The environment variable that forces the pure-Python core (at build and at import).
PURE_ENV = "AIOWHEEL_PURE"

#: Written next to the extensions by a successful build: ``{"modules": {name: digest}}``.
MANIFEST = "_compiled.json"

#: Why the pure core runs (empty when the compiled one does).
REASON = ""

# The two reasons that need no warning: nothing was built (run from a source tree), or
# the pure core was asked for.
_NOT_BUILT = "no compiled extension was built"
_ASKED = f"{PURE_ENV} is set"
_FAILED = "the compiled core failed to build"


def pure_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``AIOWHEEL_PURE`` asks for the pure-Python core."""
    return environ.get(PURE_ENV, "") not in ("", "0")


def source_digest(path: str | os.PathLike[str]) -> str:
    """The digest the build records for a module's source, and the import checks."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class _PureFinder(importlib.abc.MetaPathFinder):
    """Finds the core modules as their ``.py`` sources, ahead of the extensions."""

    def __init__(self, package: str, directory: Path, modules: Sequence[str]) -> None:
        self.sources = {f"{package}.{name}": directory / f"{name}.py" for name in modules}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _extension(directory: Path, name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{name}{suffix}"
        if path.exists():
            return path
    return None


def _manifest(directory: Path) -> dict[str, object] | None:
    try:
        content = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def _build_problem(directory: Path) -> tuple[str, bool] | None:
    """Why the compiled core in ``directory`` must not be used, and whether that
    deserves a warning; None if it may be used."""
    manifest = _manifest(directory)
    built = [name for name in MODULES if _extension(directory, name) is not None]
    if not built:
        if manifest is None:
            return _NOT_BUILT, False
        if manifest.get("compiled") is False:
            return f"{_FAILED} ({manifest.get('reason')})", True
        return "the compiled core was built for another Python", True
    missing = [name for name in MODULES if name not in built]
    if missing:
        return f"the compiled core is incomplete (no extension for {', '.join(missing)})", True
    recorded = manifest.get("modules") if manifest is not None else None
    if not isinstance(recorded, dict):
        return f"the compiled core has no valid {MANIFEST}", True
    for name in MODULES:
        source = directory / f"{name}.py"
        if source.exists() and recorded.get(name) != source_digest(source):
            return f"the compiled core is stale: {name}.py changed since it was built", True
    return None


def _use_pure(package: str, directory: Path) -> None:
    for loaded in [n for n in sys.modules if n.startswith(package + ".")]:
        if loaded.removeprefix(package + ".") in MODULES or loaded.endswith("__mypyc"):
            del sys.modules[loaded]
    if not any(isinstance(f, _PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PureFinder(package, directory, MODULES))


def select_core(package: str, directory: Path) -> bool:
    """Choose the core of ``package`` (in ``directory``) before its modules are imported.

    Returns True when the compiled core was chosen and imports; otherwise arranges for
    the ``.py`` sources to be imported and records why in ``REASON``."""
    global REASON
    problem = (_ASKED, False) if pure_requested() else _build_problem(directory)
    if problem is None:
        try:
            for name in MODULES:
                importlib.import_module(f"{package}.{name}")
        except ImportError as exc:
            problem = f"the compiled core does not import ({exc})", True
    if problem is None:
        REASON = ""
        return True
    REASON, warn = problem
    if warn and REASON.startswith(_FAILED):
        # A build without a C compiler stays that way until the next install, and
        # every command (``aiowheel --help`` too) imports the package: said once per
        # install, by the first import (then recorded in the manifest; if the
        # install is read-only, once per process).
        warn = _first_time(directory)
    if warn:
        advice = (
            "install a C compiler and reinstall aiowheel"
            if REASON.startswith(_FAILED)
            else "rebuild it with `pip install .` (or `pip install -e .`)"
        )
        _warn(
            f"aiowheel: running the pure-Python core: {REASON}; for the compiled one, "
            f"{advice}; to run pure Python without this warning, set {PURE_ENV}=1"
        )
    _use_pure(package, directory)
    return False


def _first_time(directory: Path) -> bool:
    """True unless the failed build's warning was shown before (``"warned"`` in the
    manifest); records that it now is."""
    manifest = _manifest(directory)
    if manifest is None or manifest.get("warned"):
        return manifest is None
    try:
        (directory / MANIFEST).write_text(
            json.dumps({**manifest, "warned": True}, indent=1, sort_keys=True),
            encoding="utf-8",
        )
    except OSError:
        pass  # a read-only install: warned once per process instead
    return True


def _warn(message: str) -> None:
    """Warn about the core, never so that the import fails: under ``-W error`` (or a
    filter that turns warnings into errors) the warning is written to stderr instead,
    since a slower core is no reason for ``import aiowheel`` to raise."""
    try:
        # stacklevel 4: the warning points at the ``import aiowheel`` that chose the
        # core (this function, select_core, aiowheel/__init__.py, the importer).
        warnings.warn(message, stacklevel=4)
    except Warning:
        print(f"warning: {message}", file=sys.stderr, flush=True)
