"""``aiowheel --version`` and ``python -m aiowheel --version`` (issue 20, section 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import aiowheel
from aiowheel.__main__ import main

ROOT = Path(aiowheel.__file__).parent.parent


def expected_line() -> str:
    core = "compiled core" if aiowheel.COMPILED else "pure-Python core"
    return f"aiowheel {aiowheel.__version__} ({core}"


def test_version_prints_the_version_and_the_core(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(expected_line()), out
    assert out.count("\n") == 1


def test_python_m_aiowheel_version() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aiowheel", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(expected_line()), done.stdout


def test_a_command_is_still_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert "COMMAND" in capsys.readouterr().err
