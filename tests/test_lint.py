"""ruff is clean on the whole repository and mypy on the package (both part of
the README's test command)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the same on every engine and Python: scripts/ci.py runs these in one job
pytestmark = pytest.mark.once


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip("ruff is not installed")


def test_ruff_check():
    proc = subprocess.run([*_ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format():
    proc = subprocess.run(
        [*_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_on_the_package():
    pytest.importorskip("mypy")
    proc = subprocess.run(
        # --python-version: the oldest Python we support
        [
            sys.executable,
            "-m",
            "mypy",
            "pytree_kit",
            "--ignore-missing-imports",
            "--python-version",
            "3.10",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
