"""The compiled core and the pure one (aiowheel/_compiled.py, docs/design.md "Compiled
core"): ``aiowheel.COMPILED`` tells the truth, ``AIOWHEEL_PURE=1`` wins, and a stale or
incomplete build falls back to the sources with a warning, never runs old code.

CI runs the whole suite twice, on the compiled core with ``AIOWHEEL_REQUIRE_COMPILED=1``
(then ``COMPILED`` must be True) and with ``AIOWHEEL_PURE=1`` (.ci/run).
"""

from __future__ import annotations

import importlib.machinery
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import aiowheel
from aiowheel import _compiled
from aiowheel._wheel import Wheel

PACKAGE_DIR = Path(aiowheel.__file__).parent
CORE = [sys.modules[f"aiowheel.{name}"] for name in _compiled.MODULES]


def is_extension(module: object) -> bool:
    origin = getattr(module, "__file__", None) or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) and isinstance(
        getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader
    )


def test_compiled_matches_the_environment() -> None:
    if _compiled.pure_requested():
        assert aiowheel.COMPILED is False
        assert _compiled.REASON == "AIOWHEEL_PURE is set"
    if os.environ.get("AIOWHEEL_REQUIRE_COMPILED", "") not in ("", "0") and (
        not _compiled.pure_requested()
    ):
        assert aiowheel.COMPILED, _compiled.REASON
    assert (_compiled.REASON == "") is aiowheel.COMPILED


def test_the_core_modules_are_what_compiled_says() -> None:
    assert _compiled.MODULES  # the one list (setup.py builds it)
    for module in CORE:
        assert is_extension(module) is aiowheel.COMPILED, module
        if not aiowheel.COMPILED:
            assert module.__file__ == str(PACKAGE_DIR / f"{module.__name__.split('.')[-1]}.py")
    # A compiled method is a builtin, not a Python function.
    assert inspect.isfunction(Wheel.insert) is not aiowheel.COMPILED


def test_python_subclasses_of_the_wheel_entry_work() -> None:
    """TimerHandle and the tests' entries subclass WheelEntry (it allows interpreted
    subclasses when compiled), and the wheel files them."""
    from aiowheel._wheel import WheelEntry

    class Mine(WheelEntry):
        __slots__ = ("extra",)

    wheel = Wheel(1.0, 8, 0.0)
    entry = Mine()
    entry.extra = 1
    wheel.insert(entry, 3.0)
    assert len(wheel) == 1
    assert wheel.remove(entry)
    assert entry._bucket is None


# -- choosing the core: in a subprocess, on a copy of the package --------------------------


def run_copy(tmp_path: Path, env: dict[str, str], edit: bool = False) -> dict[str, object]:
    """Import a copy of the installed package (with its extensions, if built) in a new
    interpreter; ``edit`` changes ``_wheel.py`` first. What the import chose."""
    copy = tmp_path / "aiowheel"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        with (copy / "_wheel.py").open("a", encoding="utf-8") as f:
            f.write("\n# edited after the build\n")
    code = (
        "import json, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import aiowheel, aiowheel._wheel as w\n"
        "print(json.dumps({'compiled': aiowheel.COMPILED, 'file': w.__file__,"
        " 'reason': aiowheel._compiled.REASON,"
        " 'warnings': [str(c.message) for c in caught]}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOWHEEL_")}
    environ.update(env, PYTHONPATH=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(out.stdout)
    assert str(result["file"]).startswith(str(copy))
    return result


def test_aiowheel_pure_forces_the_sources(tmp_path: Path) -> None:
    result = run_copy(tmp_path, {"AIOWHEEL_PURE": "1"})
    assert result["compiled"] is False
    assert str(result["file"]).endswith("_wheel.py")
    assert result["warnings"] == []


def test_without_aiowheel_pure_the_build_decides(tmp_path: Path) -> None:
    built = _compiled._extension(PACKAGE_DIR, "_wheel") is not None
    result = run_copy(tmp_path, {"AIOWHEEL_PURE": "0"})
    assert result["compiled"] is built
    assert str(result["file"]).endswith("_wheel.py") is not built
    assert result["warnings"] == []


@pytest.mark.skipif(
    _compiled._extension(PACKAGE_DIR, "_wheel") is None, reason="no compiled core built"
)
def test_a_stale_build_runs_the_edited_source_and_says_so(tmp_path: Path) -> None:
    result = run_copy(tmp_path, {}, edit=True)
    assert result["compiled"] is False
    assert str(result["file"]).endswith("_wheel.py")
    assert result["reason"] == "the compiled core is stale: _wheel.py changed since it was built"
    (warning,) = result["warnings"]  # type: ignore[misc]
    assert "pure-Python core" in warning
    assert "pip install" in warning


# -- the build checks, on fake files ----------------------------------------------------


def fake_build(directory: Path, modules: list[str], built: list[str]) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    digests = {}
    for name in modules:
        (directory / f"{name}.py").write_text(f"X = {name!r}\n", encoding="utf-8")
        digests[name] = _compiled.source_digest(directory / f"{name}.py")
    for name in built:
        (directory / f"{name}{suffix}").write_bytes(b"")
    manifest = {"compiled": True, "modules": digests}
    (directory / _compiled.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def test_build_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the compiled core may not run, and whether that deserves a warning."""
    monkeypatch.setattr(_compiled, "MODULES", ("_a", "_b"))
    problem = _compiled._build_problem
    fake_build(tmp_path, ["_a", "_b"], ["_a", "_b"])
    assert problem(tmp_path) is None
    (tmp_path / "_b.py").write_text("X = 'edited'\n", encoding="utf-8")
    assert problem(tmp_path) == (
        "the compiled core is stale: _b.py changed since it was built",
        True,
    )
    (tmp_path / _compiled.MANIFEST).write_text("not json", encoding="utf-8")
    assert problem(tmp_path) == ("the compiled core has no valid _compiled.json", True)
    for stale in tmp_path.iterdir():
        stale.unlink()
    fake_build(tmp_path, ["_a", "_b"], ["_a"])
    assert problem(tmp_path) == ("the compiled core is incomplete (no extension for _b)", True)


def test_no_build_is_silent_but_a_failed_build_warns(tmp_path: Path) -> None:
    """A source tree (nothing built) runs pure quietly; a build that fell back says so
    (pip shows the build's own warning only with -v)."""
    (tmp_path / "_wheel.py").write_text("X = 1\n", encoding="utf-8")
    assert _compiled._build_problem(tmp_path) == ("no compiled extension was built", False)
    failed = {"compiled": False, "reason": "no C compiler (gcc not found)"}
    (tmp_path / _compiled.MANIFEST).write_text(json.dumps(failed), encoding="utf-8")
    assert _compiled._build_problem(tmp_path) == (
        "the compiled core failed to build (no C compiler (gcc not found))",
        True,
    )
    # Built, but the extensions are for another interpreter (an editable install built
    # by Python 3.11 and run by 3.12): no extension suffix of this one matches.
    built = {"compiled": True, "modules": {"_wheel": "..."}}
    (tmp_path / _compiled.MANIFEST).write_text(json.dumps(built), encoding="utf-8")
    (tmp_path / "_wheel.cpython-27-other.so").write_bytes(b"")
    assert _compiled._build_problem(tmp_path) == (
        "the compiled core was built for another Python",
        True,
    )


@pytest.mark.parametrize(("value", "pure"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_pure_requested(value: str, pure: bool) -> None:
    assert _compiled.pure_requested({"AIOWHEEL_PURE": value}) is pure
    assert _compiled.pure_requested({}) is False


def _failed_copy(tmp_path: Path) -> Path:
    """A copy of the package as a build without a C compiler leaves it: the sources,
    no extension, and the manifest saying why."""
    copy = tmp_path / "aiowheel"
    shutil.copytree(
        PACKAGE_DIR,
        copy,
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", _compiled.MANIFEST),
    )
    failed = {"compiler": "mypyc", "compiled": False, "reason": "no C compiler (gcc not found)"}
    (copy / _compiled.MANIFEST).write_text(json.dumps(failed), encoding="utf-8")
    return copy


def _import(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOWHEEL_")}
    environ.update(PYTHONPATH=str(tmp_path))
    return subprocess.run(
        [sys.executable, *flags, "-c", "import aiowheel; print(aiowheel.COMPILED)"],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_failed_build_warns_once_per_install(tmp_path: Path) -> None:
    """Every command imports the package (``aiowheel --help`` too): the no-compiler
    warning is said by the first import of the install, not by every one."""
    copy = _failed_copy(tmp_path)
    first = _import(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "False"
    assert "no C compiler (gcc not found)" in first.stderr
    assert json.loads((copy / _compiled.MANIFEST).read_text(encoding="utf-8"))["warned"] is True
    second = _import(tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "False"
    assert second.stderr == ""


@pytest.mark.parametrize("edit", [False, True])
def test_the_core_warning_never_fails_the_import(tmp_path: Path, edit: bool) -> None:
    """Under ``-W error`` the warning (a failed build, or a stale one) is written to
    stderr and the import goes on, on the pure core."""
    copy = _failed_copy(tmp_path)
    if edit:
        if _compiled._extension(PACKAGE_DIR, "_wheel") is None:
            pytest.skip("no compiled core built")
        shutil.rmtree(copy)
        shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
        with (copy / "_wheel.py").open("a", encoding="utf-8") as f:
            f.write("\n# edited after the build\n")
    result = _import(tmp_path, "-W", "error")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert "pure-Python core" in result.stderr
    assert "Traceback" not in result.stderr
