"""The release configuration keeps its promises: the wheel's test command runs every
compiled module's own tests, and the supported Pythons are said the same way everywhere."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from aiowheel._compiled import MODULES

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

#: Each compiled module's own tests: the files that exercise it directly. A module added
#: to MODULES fails test_every_compiled_module_has_its_own_tests until it is named here.
OWN_TESTS: dict[str, tuple[str, ...]] = {
    "_wheel": ("tests/test_wheel.py", "tests/test_wheel_model.py", "tests/test_collector.py"),
    "_handle": ("tests/test_handle.py",),
    "_dispatch": ("tests/test_dispatch.py",),
    "_affinity": ("tests/test_loop_affinity.py",),
    # The waiters: handle.wait() and max_pending (test_timer), the drain (test_shutdown).
    "_waiters": ("tests/test_timer.py", "tests/test_shutdown.py"),
    "_periodic": ("tests/test_periodic.py",),
    "_pass": ("tests/test_engine.py",),
    "_engine": ("tests/test_engine.py",),
    "_shutdown": ("tests/test_shutdown.py",),
    "_lifecycle": ("tests/test_timer.py",),
    "_timer": ("tests/test_timer.py",),
    "_timeout": ("tests/test_timeout.py",),
    "_driver": ("tests/test_driver.py",),
    "_purgatory": ("tests/test_purgatory.py",),
    "_loophandle": ("tests/loop/test_loop_timer.py",),
    "_tracing": ("tests/test_tracing.py",),
}


def _wheel_test_files() -> set[str]:
    commands = CONFIG["tool"]["cibuildwheel"]["test-command"]
    return {m for c in commands for m in re.findall(r"\{project\}/(\S+\.py)", c)}


def test_every_compiled_module_has_its_own_tests() -> None:
    assert set(OWN_TESTS) == set(MODULES)
    for files in OWN_TESTS.values():
        for file in files:
            assert (ROOT / file).is_file(), file


@pytest.mark.parametrize("module", MODULES)
def test_the_wheel_test_command_runs_each_compiled_modules_tests(module: str) -> None:
    missing = set(OWN_TESTS[module]) - _wheel_test_files()
    assert not missing, f"the wheel's test-command leaves out {module}'s tests: {missing}"


def test_the_wheel_test_command_names_files_that_exist() -> None:
    for file in _wheel_test_files():
        assert (ROOT / file).is_file(), file


def test_the_release_workflow_runs_cibuildwheel() -> None:
    workflow = (ROOT / ".github" / "workflows" / "wheels.yml").read_text(encoding="utf-8")
    assert "pypa/cibuildwheel" in workflow


def test_the_supported_pythons_are_said_alike() -> None:
    """pyproject's classifiers, the wheels built, the noxfile and the README agree."""
    project = CONFIG["project"]
    versions = sorted(
        c.rsplit(":: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert versions == ["3.11", "3.12", "3.13"]
    assert project["requires-python"] == ">=3.11"
    builds = CONFIG["tool"]["cibuildwheel"]["build"]
    assert builds == [f"cp{v.replace('.', '')}-*" for v in versions]
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert f"PYTHONS = {versions!r}".replace("'", '"') in noxfile
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for version in versions:
        assert f"CPython {version}" in readme
