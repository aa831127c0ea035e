"""Running a benchmark changes no tracked file: by default a script writes into
build/benchmarks/ (ignored by git); only --record writes benchmarks/results/,
the published figures that benchmarks/report.py reads (benchmarks/_output.py)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def _output_module() -> Any:
    spec = importlib.util.spec_from_file_location("_output", ROOT / "benchmarks" / "_output.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_folder_is_scratch_unless_recorded_or_given(monkeypatch: Any, tmp_path: Path) -> None:
    out = _output_module()
    assert out.RECORDED == ROOT / "benchmarks" / "results"
    assert out.SCRATCH == ROOT / "build" / "benchmarks"
    monkeypatch.setattr(out, "RECORDED", tmp_path / "recorded")
    monkeypatch.setattr(out, "SCRATCH", tmp_path / "scratch")
    parser = argparse.ArgumentParser()
    out.add_arguments(parser, sub=PYTHON)
    assert out.folder(parser.parse_args([]), PYTHON) == tmp_path / "scratch" / PYTHON
    assert out.folder(parser.parse_args(["--record"]), PYTHON) == tmp_path / "recorded" / PYTHON
    given = tmp_path / "given"
    assert out.folder(parser.parse_args(["--out", str(given)]), PYTHON) == given
    assert out.folder(parser.parse_args([])) == tmp_path / "scratch"
    assert all(p.is_dir() for p in (given, tmp_path / "scratch" / PYTHON))
    with pytest.raises(SystemExit):  # one or the other
        parser.parse_args(["--record", "--out", str(given)])


def _git(copy: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.once  # a script's run in a copy of the checkout: one job
@pytest.mark.scripts
def test_running_a_benchmark_changes_no_tracked_file(ci: Any, tmp_path: Path) -> None:
    """The README's benchmark (benchmarks/corpus.py), run with no --out in a
    committed copy of the checkout, leaves `git status` clean and its report in
    build/benchmarks/python3.X/; the published page still matches the results."""
    copy = tmp_path / "checkout"
    ci.copy_checkout(copy)
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-qm", "base")
    # the copy's scripts, this checkout's pytree_kit (its C engine is built in place)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "benchmarks/corpus.py", "--quick", "--families", "wide"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _git(copy, "status", "--porcelain") == ""  # no tracked file changed, none added
    scratch = copy / "build" / "benchmarks" / PYTHON
    assert (scratch / "corpus.md").is_file() and (scratch / "corpus.json").is_file()
    assert f"benchmarks: wrote build/benchmarks/{PYTHON}/corpus.md" in proc.stderr
    assert "not recorded: --record writes benchmarks/results/" in proc.stderr
    report = subprocess.run(
        [sys.executable, "benchmarks/report.py", "--check"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0 and report.stderr == "", report.stderr
