#!/usr/bin/env python3
"""The thread tests on a ThreadSanitizer build of free-threaded CPython 3.13t.

    python3 scripts/tsan_threads.py              # the thread tests, then thread_race.py
    python3 scripts/tsan_threads.py --seconds 5  # each race case longer (default 2.5 s)

Outside CI (like ``scripts/torch_matrix.py``): it takes minutes, and the TSAN
interpreter ~40 minutes to build on 2 cores the first time.

1. The interpreter: ``scripts/python313t.sh --tsan``'s (under
   ``~/.cache/pytree_kit/python3.13t-tsan``), made when missing. Its CFLAGS
   carry ``-fsanitize=thread``, so an extension built by it is instrumented.
2. A venv beside it (``python3.13t-tsan-venv``) with setuptools (to build
   the extension), pytest, pytest-timeout,
   hypothesis and attrs, binary wheels only (no numpy, optree or other
   extension: their code is not instrumented, and TSAN would see only half of
   each of their races).
3. The repository's files copied to a temporary folder, where the extension is
   built in place, -Werror, and checked to be instrumented (its symbols name
   ``__tsan_``).
4. With the GIL off (``PYTHON_GIL`` unset: the C engine declares it needs
   none) and ``TSAN_OPTIONS`` = ``halt_on_error=1``, the suppressions file
   below and ``exitcode=66``: ``tests/test_threads.py`` and
   ``tests/test_thread_race.py`` (the race cases, the fresh spec raced by 8
   threads, a class gaining and losing ``__tree_flatten__``), then
   ``scripts/thread_race.py`` over every kind.

The suppressions are CPython's own for a free-threaded build (its
``Tools/tsan/suppressions_free_threading.txt``, copied by python313t.sh), for
races inside the interpreter that CPython's developers know of, and
``EXTRA_SUPPRESSIONS``: races inside 3.13.5 reported to CPython since, each
with its issue; none names pytree_kit, and this script refuses a file that
does. The reports go to files (``log_path``) and are printed after the step
that made them. A TSAN report anywhere
fails the run (exit 66 from the process that saw it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from ci import copy_checkout  # noqa: E402

CACHE = Path.home() / ".cache" / "pytree_kit"
PREFIX = Path(os.environ.get("PYTREE_KIT_PY313T_TSAN_PREFIX", CACHE / "python3.13t-tsan"))
PYTHON = PREFIX / "bin" / "python3.13t"
VENV = PREFIX.parent / (PREFIX.name + "-venv")
SUPPRESSIONS = PREFIX / "share" / "tsan-suppressions.txt"
TOOLS = (
    "pytest==9.2.0",
    "pytest-timeout==2.4.0",
    "hypothesis==6.155.7",
    "attrs==26.1.0",
    "setuptools==84.2.1",
)
TESTS = ("tests/test_threads.py", "tests/test_thread_race.py")
#: races inside CPython 3.13.5 that its own suppressions file lacks, each
#: with the CPython issue that reports it (none in pytree_kit's code)
EXTRA_SUPPRESSIONS = {
    # every exec() or eval() of a string writes
    # _PyRuntime.signals.unhandled_keyboard_interrupt (pythonrun.c); two
    # threads making dataclasses at once (dataclasses builds each method
    # with exec) race on it
    "race:run_eval_code_obj": "python/cpython#128130",
    # interning a new identifier (the parser, as exec() parses dataclasses'
    # methods) makes the str immortal with plain stores while another thread
    # reads it under the interned dict's lookup; fixed in 3.14 by
    # python/cpython#148886, not in 3.13.5
    "race:intern_common": "python/cpython#129701, python/cpython#113956",
}


def say(message: str) -> None:
    print(f"tsan_threads: {message}", flush=True)


def run(cmd: list, **kw: object) -> None:
    say("$ " + " ".join(map(str, cmd)))
    subprocess.run([str(c) for c in cmd], check=True, **kw)  # type: ignore[call-overload]


def interpreter() -> Path:
    if not PYTHON.exists():
        say(f"{PYTHON} missing: making it (scripts/python313t.sh --tsan, ~40 minutes)")
        run(["bash", ROOT / "scripts" / "python313t.sh", "--tsan"])
    return PYTHON


def venv(python: Path) -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        run([python, "-m", "venv", VENV])
    run([py, "-m", "pip", "install", "-q", "--only-binary=:all:", *TOOLS])
    return py


def main(argv: object = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.5, help="per race case (default 2.5)")
    args = ap.parse_args(argv)  # type: ignore[arg-type]
    py = venv(interpreter())
    text = SUPPRESSIONS.read_text()
    if "pytree_kit" in text or "_speedups" in text:
        say(f"{SUPPRESSIONS} names pytree_kit: a report of ours must be fixed, not suppressed")
        return 1
    env = dict(os.environ)
    env.pop("PYTHON_GIL", None)
    # the reports go to files (pytest's capture of stderr would lose the one
    # that halts the process), printed after a failing step
    reports = Path(tempfile.mkdtemp(prefix="pytree_kit-tsan-reports-"))
    suppressions = reports / "suppressions.txt"
    extra = "".join(f"# {why}\n{line}\n" for line, why in EXTRA_SUPPRESSIONS.items())
    suppressions.write_text(text + "\n" + extra)
    env.update(
        TSAN_OPTIONS=(
            f"halt_on_error=1 exitcode=66 suppressions={suppressions} log_path={reports}/report"
        ),
        PYTREE_KIT_REQUIRE_C="1",
        PYTREE_KIT_CFLAGS="-Werror",
        PYTREE_KIT_RACE_SECONDS=str(args.seconds),
        # a tenth of test_threads.py's rounds: TSAN runs the code 10-20 times
        # slower, and its 8 threads' join would time out on 2 cores
        PYTREE_KIT_THREAD_ROUNDS=os.environ.get("PYTREE_KIT_THREAD_ROUNDS", "30"),
    )
    env.pop("PYTREE_KIT_PURE", None)
    with tempfile.TemporaryDirectory(prefix="pytree_kit-tsan-") as tmp:
        copy = Path(tmp)
        copy_checkout(copy)
        run([py, "setup.py", "build_ext", "--inplace", "-q"], cwd=copy, env=env)
        (so,) = copy.glob("pytree_kit/_speedups*.so")
        nm = subprocess.run(["nm", "-D", so], capture_output=True, text=True).stdout
        if "__tsan_" not in nm:
            say(f"{so.name} is not instrumented (no __tsan_ symbol)")
            return 1
        env["PYTHONPATH"] = str(copy)
        # every kind but an OrderedDict: CPython 3.13t's own is not thread-safe
        # (python/cpython#125996), whatever reads it
        kinds = [
            a for k in ("dict", "defaultdict", "deque", "list", "record") for a in ("--kind", k)
        ]
        check = (
            "import sys, pytree_kit as pk, pytree_kit._speedups as s; "
            f"assert s.__file__.startswith({str(copy)!r}), s.__file__; "
            "assert pk.ENGINE == 'c' and not sys._is_gil_enabled(); "
            "print('the instrumented C engine, the GIL off')"
        )
        pytest = [py, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x"]
        race = [py, "scripts/thread_race.py", *kinds, "--tries", "20000", "--seconds", "20"]
        for step in ([py, "-c", check], [*pytest, *TESTS], race):
            try:
                run(step, cwd=copy, env=env)
            finally:
                for report in sorted(reports.glob("report*")):
                    say(f"{report.name}:\n{report.read_text()}")
                    report.unlink()
    shutil.rmtree(reports, ignore_errors=True)
    say("clean: no ThreadSanitizer report")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as e:
        say(f"failed: {e}")
        sys.exit(e.returncode or 1)
