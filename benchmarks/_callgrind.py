"""The one callgrind harness of the benchmarks that count instructions.

A benchmark that counts instructions runs a script of its own (its measured
part, behind a flag such as ``--op``) under ``valgrind --tool=callgrind``,
since a busy machine moves timings but not counts. This module runs it and
reads the count back:

- :func:`count`: one process, one count, the total of the out file
  callgrind writes (``summary:`` or ``totals:``). With ``toggles`` it counts
  only inside the functions named (``--collect-atstart=no`` and a
  ``--toggle-collect`` each: ``functools_reduce`` counts what runs inside
  ``functools.reduce``, ``builtin_sorted`` inside ``sorted``);
- :func:`count_in_checkout`: the same with a checkout's pytree_kit.

Users: ``instructions.py``,
``pinning.py``, ``check_cost.py`` and ``compiled.py``; ``fast_paths.py``,
which reads a count per client-request dump (many out files), runs its
:func:`command` with :func:`run` and reads each file's :data:`TOTAL`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

#: count only inside functools.reduce, where the benchmarks run their N calls
REDUCE = ("functools_reduce",)
TOTAL = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


def valgrind() -> str:
    """valgrind's path, or SystemExit saying it is missing."""
    found = shutil.which("valgrind")
    if found is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    return found


def command(script: Path | str, args: Sequence[str], out: str, toggles: Sequence[str] = ()) -> list:
    """The command line that runs ``python script args`` under callgrind."""
    collect = ["--collect-atstart=no", *(f"--toggle-collect={t}" for t in toggles)]
    return [
        valgrind(),
        "--tool=callgrind",
        *(collect if toggles else []),
        f"--callgrind-out-file={out}",
        sys.executable,
        str(script),
        *args,
    ]


def run(cmd: list, env: Optional[dict] = None, cwd: Optional[Path] = None) -> None:
    """Run a :func:`command`; RuntimeError with the tail of its stderr if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise RuntimeError(f"callgrind run failed (exit {proc.returncode}): {cmd}\n{tail}")


def count(
    script: Path | str,
    args: Sequence[str],
    *,
    toggles: Sequence[str] = (),
    env: Optional[dict] = None,
    cwd: Optional[Path] = None,
    out: Optional[Path] = None,
) -> int:
    """The instructions ``python script args`` ran under callgrind (only
    inside ``toggles`` when given); ``out`` keeps callgrind's file there."""
    with tempfile.TemporaryDirectory() as tmp:
        where = out or Path(tmp) / "callgrind.out"
        run(command(script, args, str(where), toggles), env, cwd)
        found = TOTAL.search(where.read_text())
    if found is None or int(found.group(1)) == 0:
        what = f"{script} {list(args)} (toggles {list(toggles)})"
        raise RuntimeError(f"callgrind counted nothing for {what}")
    return int(found.group(1))


def count_in_checkout(
    script: Path | str, args: Sequence[str], checkout: Path, *, toggles: Sequence[str], out: Path
) -> int:
    """:func:`count` with ``checkout``'s pytree_kit first on the path, run
    from it, and the hash seed fixed (a count of one build against another's)."""
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0")
    return count(script, args, toggles=toggles, env=env, cwd=checkout, out=out)
