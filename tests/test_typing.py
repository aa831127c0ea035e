"""pytree_kit.typing.PyTree under mypy: the project's examples type-check,
and each wrong leaf is reported on its line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pytree_kit as pk
from pytree_kit.typing import PyTree

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "tests" / "support" / "typing_examples"
pytestmark = pytest.mark.once  # about the annotations, not an engine


def _mypy(path: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            str(path),
            "--strict",
            "--follow-imports=silent",
            "--python-version",
            "3.10",
            "--no-error-summary",
            "--hide-error-context",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_the_examples_type_check() -> None:
    proc = _mypy(EXAMPLES / "good.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_each_wrong_leaf_is_reported_on_its_line() -> None:
    path = EXAMPLES / "bad.py"
    wanted = {
        i for i, line in enumerate(path.read_text().splitlines(), 1) if line.endswith("# error")
    }
    proc = _mypy(path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reported = {int(m) for m in re.findall(r"bad\.py:(\d+): error", proc.stdout)}
    assert reported == wanted, proc.stdout


def test_it_is_a_plain_alias_at_run_time() -> None:
    alias = PyTree[int]
    assert int in alias.__args__ and type(None) in alias.__args__
    assert pk.leaves({"a": [1, 2]}) == [1, 2]  # annotations change nothing
