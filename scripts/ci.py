#!/usr/bin/env python3
"""CI: the test matrix on every Python pytree_kit declares (the README's test command).

    python3 scripts/ci.py                 # everything, two jobs at a time
    python3 scripts/ci.py --python 3.12   # one version's jobs (repeatable)
    python3 scripts/ci.py --list          # the jobs, and the interpreters found
    python3 scripts/ci.py --quick         # one Python, both engines: a few minutes

For each supported CPython (``VERSIONS``) it makes a virtual environment in
``.venvs/3.X`` with the C engine built in place (``PYTREE_KIT_REQUIRE_C=1``,
``-Werror``), then runs (FULL's setup also installs Debian's ``chromium``
with apt-get when it is missing and the run is root's, with ``CI=true`` or
``--system-packages``, or after asking at a terminal:
tests/test_docs_site.py loads every page of the docs site in it, skips
without it, and fails under ``CI=true`` without it):

- the suite on the C engine, on every version (the benchmark scripts' smoke
  runs, marked ``scripts``, on FULL and ``EDGES``), and on the pure engine
  (``PYTREE_KIT_PURE=1``) on the oldest and newest only (``EDGES``), less the
  benchmark scripts, the tests that run the engines side by side (marked
  ``side_by_side``: the same whichever engine the public API uses) and
  test_depth.py's million-level runs, with 60 examples a property test (the
  ``pure`` profile of ``tests/conftest.py``; the C-engine job, which runs the
  differential tests of both engines, runs 150).
  On ``FULL`` (3.11, the Python torch's wheel on this machine is for) that is
  the whole suite with torch, transformers, tensordict and the docs tools; on
  the others the core suite: torch is not installed there, and every torch
  test skips. Tests marked
  ``once`` (lint, types, the docs site: nothing an engine or a Python version
  changes) run only in FULL's C-engine job;
- on ``EDGES``, the engine tests against a build with every layout-reading
  fast path left out (``PYTREE_KIT_NO_FAST_PATHS=1``), in a copy of the
  repository;
- on FULL, each extra installed alone (none, ``testing``, ``torch``) into a
  fresh venv with nothing else, where ``scripts/docs_examples.py --extra``
  runs the docs pages that extra alone serves (the torch pages without
  numpy);
- on FULL's Python and build, the compile, tracing and data tests on the
  oldest supported torch (``OLDEST_TORCH``, the registry's build, pip's cache
  keeping its ~4.6 GB); ``scripts/torch_matrix.py`` runs every torch;
- on the free-threaded 3.13t (``FREE_THREADED``, built by
  ``scripts/python313t.sh`` under ``~/.cache/pytree_kit``), a venv with the
  tools pinned (``FREE_THREADED_TOOLS``, wheels only), the C engine built in
  place, and the suite on the C engine less the ``once`` tests and the
  benchmark scripts, with ``PYTHON_GIL`` unset; the GIL must be off after
  import and after the run (``GIL_STAYS_OFF``);
- ``scripts/sanitize.sh --quick`` (ASan + UBSan), on ``SANITIZED`` versions,
  with 50 examples a property test (the ``sanitize`` profile of
  ``tests/conftest.py``; the engine jobs run 150);
- the package: ``python -m build`` makes an sdist and, from it, a wheel, in a
  copy of the repository (sdists write into their source tree); the
  wheel must hold the compiled extension, and is installed into a fresh
  virtual environment outside the checkout, where ``pytree_kit.ENGINE`` must
  be ``"c"``. On FULL, instead, the release script's wheel
  (``scripts/wheels.py --python 3.11 --arch x86_64``): manylinux_2_17, built
  by zig from the sdist, checked by auditwheel, installed with no compiler
  reachable and run through the engine tests, and the sdist installed with
  no compiler (the pure engine, saying why).

Interpreters are found as people find them: ``python3.X`` on PATH, then pyenv's
``versions/3.X.*`` (``pyenv root``, ``$PYENV_ROOT`` or ``~/.pyenv``); for 3.14
and 3.15 (``DEBIAN_PYTHONS``), last, the one ``scripts/python_debian.sh 3.X``
makes from Debian's packages (``$PYTREE_KIT_PY3X_PREFIX/bin/python3.X``, that
is ``PYTREE_KIT_PY314_PREFIX`` or ``PYTREE_KIT_PY315_PREFIX``, by default
under ``~/.cache/pytree_kit``). With ``CI=true`` or ``--make-debian-pythons``
(``--make-python314``, its older name) a missing 3.14 or 3.15 is made with
that script, and a missing 3.13t with ``scripts/python313t.sh`` (~10
minutes). With ``CI=true`` a missing one fails the run; otherwise its jobs are
skipped, with a line saying so.

``--quick`` runs one Python (FULL, or the one ``--python`` names): its venv
(kept if there), then the engine tests, the tree operations, paths and the
docs' examples on the C engine and on the pure one, in a few minutes.

Each job's start and end are printed, with its time and outcome, and while
jobs run a summary line comes every minute (``HEARTBEAT``): the time so far,
each running job with its time and its pytest progress, and the counts.
Jobs run two at a time (the machine has 2 cores), with one thread for torch's
and the BLAS libraries' pools in each (``THREAD_VARS``), those with the longest work
behind them first (a setup before the suites that wait for it), each one's
output in ``build/ci-logs/<job>.log``; a failed job's log tail is printed. The
last line totals every pytest run (``ci: N passed, N failed, N skipped``). A
pytest run that collects no test exits 5, which fails its job.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("3.10", "3.11", "3.12", "3.13", "3.14", "3.15")
FULL = "3.11"
# The pure-engine, no-fast-paths and sanitizer jobs run on the oldest and the
# newest Python only (every Python runs the C engine's whole suite, with the
# differential tests of both engines): CI's 60 minutes on 2 cores. A change
# to the C engine's version-specific layouts (the _fast_*.c files) is run through
# scripts/sanitize.sh on every Python by hand (docs/development.md).
# 3.14, no longer the newest, runs the C engine's whole suite and the package
# job: its C engine is the one 3.15 compiles (the same fast paths, validated on
# both against one layout, 3.13's dicts; the C files' other version gates are
# all "from 3.14"), so 3.15's no-fast-paths and sanitizer jobs run the C code
# 3.14 runs, and its pure-engine job the same Python code.
EDGES = (VERSIONS[0], VERSIONS[-1])
SANITIZED = EDGES
LOGS = ROOT / "build" / "ci-logs"
# the engine tests (what the no-fast-paths build changes): sanitize.sh --quick's,
# less test_depth (iterative stacks, which no fast path touches), with the version
# checks and the threads (a class changing under the class memo)
ENGINE_TESTS = (
    "tests/test_engines.py",
    "tests/test_kinds.py",
    "tests/test_errors.py",
    "tests/test_api.py",
    "tests/test_fastcall.py",
    "tests/test_versions.py",
    "tests/test_threads.py",
    "tests/test_iter.py",
    "tests/test_rows.py",
)
SUMMARY = re.compile(
    r"^=*\s*((?:\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected)"
    r"(?:, )?)+) in [\d.]+s"
)


def log(message: str) -> None:
    print(f"ci: {message}", flush=True)


def job_log(job: str) -> Path:
    """Where a job's output goes: build/ci-logs/<job>.log, the name made safe."""
    return LOGS / (re.sub(r"[^\w.]+", "-", job) + ".log")


# -- interpreters ---------------------------------------------------------------------


def _version_of(python: str) -> Optional[str]:
    """'3.X' for a working GIL CPython interpreter, '3.Xt' for a free-threaded
    one, else None."""
    code = (
        "import platform, sys, sysconfig; "
        "print('%d.%d' % sys.version_info[:2], platform.python_implementation(), "
        "bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) != 3 or out[1] != "CPython" or out[2] not in ("False", "True"):
        return None
    return out[0] + ("t" if out[2] == "True" else "")


def _pyenv_root() -> Optional[Path]:
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        if out:
            return Path(out)
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    return Path(root) if os.path.isdir(root) else None


#: the versions scripts/python_debian.sh makes from Debian sid's packages,
#: for a machine with none installed (Debian 12 ships 3.11)
DEBIAN_PYTHONS = ("3.14", "3.15")
#: free-threaded builds (``--disable-gil``), each made by scripts/python313t.sh
#: when it is missing, as DEBIAN_PYTHONS are: only the C-engine suite runs on
#: them (``job_free_threaded``)
FREE_THREADED = ("3.13t",)
#: a free-threaded build's test tools, by binary wheels only: the test extra's
#: newer hypothesis is built from source with Rust there, and its jax, torch and
#: dm-tree have no cp313t wheels (their tests skip)
FREE_THREADED_TOOLS = (
    "pytest==9.2.0",
    "pytest-timeout==2.4.0",
    "hypothesis==6.155.7",  # the newest that is one pure wheel
    "attrs==26.1.0",
    "numpy==2.4.6",
    "optree==0.20.0",
    "setuptools==84.2.1",
    "pytest-run-parallel==0.10.0",  # --parallel-threads: each test in threads at once
)


def debian_prefix(version: str) -> Path:
    """Where scripts/python_debian.sh makes its interpreter of version '3.X':
    ``$PYTREE_KIT_PY3X_PREFIX`` (``PYTREE_KIT_PY315_PREFIX`` for 3.15), by
    default ``~/.cache/pytree_kit/python3.X``."""
    prefix = os.environ.get(f"PYTREE_KIT_PY{version.replace('.', '').upper()}_PREFIX")
    return Path(prefix) if prefix else Path.home() / ".cache" / "pytree_kit" / f"python{version}"


def make_python(version: str) -> Optional[str]:
    """A missing 3.14 or 3.15 from Debian's packages (``scripts/python_debian.sh
    version``, unpacked under debian_prefix(version)), a 3.13t built from
    Debian's source (``scripts/python313t.sh``: ~10 minutes). The script's last
    line is the interpreter, which must be that version. None, with the reason
    logged, if it fails."""
    bash = shutil.which("bash")
    if bash is None:
        log(f"cannot make Python {version}: no bash")
        return None
    if version in FREE_THREADED:
        script, args = "python313t.sh", []
        log(f"Python {version} not found: making it with scripts/{script} (~10 minutes)")
    else:
        script, args = "python_debian.sh", [version]
        log(f"Python {version} not found: making it with scripts/{script} {version}")
    name = " ".join([f"scripts/{script}", *args])
    proc = subprocess.run(
        [bash, str(ROOT / "scripts" / script), *args], capture_output=True, text=True
    )
    lines = proc.stdout.split()
    if proc.returncode != 0 or not lines:
        log(f"{name} failed ({proc.returncode}): {proc.stderr.strip()[-1000:]}")
        return None
    if _version_of(lines[-1]) != version:
        log(f"{name} gave {lines[-1]}, not a Python {version}")
        return None
    return lines[-1]


def find_python(version: str) -> Optional[str]:
    """An interpreter for version '3.X': python3.X on PATH (a pyenv shim for a
    version that is not selected fails its check), else pyenv's newest 3.X.*,
    else, for DEBIAN_PYTHONS, the one scripts/python_debian.sh made."""
    candidates = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    root = _pyenv_root()
    if root is not None:
        found = glob.glob(str(root / "versions" / f"{version}.*" / "bin" / f"python{version}"))

        def patch(path: str) -> int:
            m = re.search(rf"/{re.escape(version)}\.(\d+)/", path)
            return int(m.group(1)) if m else -1

        candidates += sorted(found, key=patch, reverse=True)
    if version in DEBIAN_PYTHONS or version in FREE_THREADED:
        candidates.append(str(debian_prefix(version) / "bin" / f"python{version}"))
    for python in candidates:
        if _version_of(python) == version:
            return python
    return None


# -- jobs -----------------------------------------------------------------------------


@dataclass
class Job:
    name: str
    estimate: float  # seconds, for ordering (longest first)
    run: Callable[[Path], None]  # raises on failure; writes to the log at the path
    after: tuple = ()
    status: str = "waiting"  # waiting, running, passed, failed, skipped
    seconds: float = 0.0
    summaries: list = field(default_factory=list)
    detail: str = ""
    started: float = 0.0  # time.monotonic() when it started


class Failed(Exception):
    pass


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def sh(cmd: list, log_path: Path, *, env: Optional[dict] = None, cwd: Path = ROOT) -> None:
    """Runs cmd, appending its output to the log; raises Failed on a nonzero exit.
    A variable that env maps to None is removed."""
    full_env = dict(os.environ)
    # two jobs at a time on 2 cores: torch's and the BLAS libraries' thread
    # pools (a thread a core by default) in both jobs' processes, DataLoader
    # workers included, would oversubscribe the cores; one thread each
    for name in THREAD_VARS:
        full_env.setdefault(name, "1")
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    with open(log_path, "a") as f:
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        f.flush()
        proc = subprocess.run(
            [str(c) for c in cmd],
            cwd=cwd,
            env=full_env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    if proc.returncode != 0:
        raise Failed(f"{Path(str(cmd[0])).name} ... exited with {proc.returncode}")


def venv_python(version: str) -> Path:
    return ROOT / ".venvs" / version / "bin" / "python"


def copy_checkout(dest: Path) -> None:
    """The repository's files (tracked and untracked, not ignored) copied to dest."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in files:
        if not name:
            continue
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))


BUILD_ENV = {"PYTREE_KIT_REQUIRE_C": "1", "PYTREE_KIT_CFLAGS": "-Werror"}


def pytest_cmd(v: str) -> list:
    # the 25 slowest tests at the end of each job's log: where CI's time goes
    return [venv_python(v), "-m", "pytest", "-p", "no:cacheprovider", "-q", "--durations=25"]


#: whether this run may install Debian packages with apt-get (chromium):
#: CI=true, --system-packages, or a yes at the prompt (main() sets it)
SYSTEM_PACKAGES = False


def install_chromium(logp: Path) -> None:
    """Debian's chromium, for the docs site's browser test, if it is missing,
    this is root with apt-get, and SYSTEM_PACKAGES allows it; else nothing
    (that test skips, or fails under CI=true, saying to install it)."""
    if shutil.which("chromium") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    if not SYSTEM_PACKAGES:
        with open(logp, "a") as f:
            f.write("chromium is missing and --system-packages was not given: not installed\n")
        return
    sh(["apt-get", "update"], logp)
    apt = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    sh(apt, logp, env={"DEBIAN_FRONTEND": "noninteractive"})


def needs_chromium() -> bool:
    """Whether install_chromium would install it, were it allowed."""
    return not shutil.which("chromium") and os.geteuid() == 0 and bool(shutil.which("apt-get"))


def ask(question: str) -> bool:
    """A yes/no question at the terminal; no when there is none."""
    if not sys.stdin.isatty():
        log(question.rstrip("?") + ": not asked (no terminal); pass --system-packages to allow it")
        return False
    return input(f"ci: {question} [y/N] ").strip().lower() in ("y", "yes")


def job_setup(v: str, python: str, logp: Path) -> None:
    extras = "test,torch,docs,ecosystem" if v == FULL else "test"
    if v == FULL:
        install_chromium(logp)
    sh([python, "-m", "venv", "--clear", ROOT / ".venvs" / v], logp)
    install_checkout(v, extras, logp)


def install_checkout(v: str, extras: str, logp: Path) -> None:
    """The checkout, editable with extras, into v's venv, its C engine built in
    place (-Werror) and checked to be the one that runs."""
    pip = [venv_python(v), "-m", "pip", "install", "-q", "-c", "constraints.txt"]
    sh([*pip, "-e", f".[{extras}]"], logp, env=BUILD_ENV)
    sh([venv_python(v), "-c", "import pytree_kit as pk; assert pk.ENGINE == 'c'"], logp)


#: after import and use, the GIL must still be off (a module that does not
#: declare Py_MOD_GIL_NOT_USED would have turned it on, with a warning)
GIL_STAYS_OFF = (
    "import sys, warnings; warnings.simplefilter('error'); "
    "import pytree_kit as pk; from pytree_kit import _speedups; "
    "t = {'a': [1, (2, None)], 'b': {'c': 3.0}}; leaves, spec = pk.flatten(t); "
    "assert pk.unflatten(spec, leaves) == t == pk.tree_map(lambda x: x, t); "
    "info = pk.engine_info(); "
    "assert pk.ENGINE == 'c' and info['free_threaded'], info; "
    "assert not sys._is_gil_enabled() and info['gil_enabled'] is False, info; "
    "print('the C engine, the GIL off')"
)


def job_free_threaded_setup(v: str, python: str, logp: Path) -> None:
    """A free-threaded build's venv: FREE_THREADED_TOOLS (binary wheels), the
    checkout editable with no dependencies, its C engine built in place
    (-Werror), and the GIL off after import and use (GIL_STAYS_OFF)."""
    sh([python, "-m", "venv", "--clear", ROOT / ".venvs" / v], logp)
    pip = [venv_python(v), "-m", "pip", "install", "-q"]
    sh([*pip, "--only-binary=:all:", *FREE_THREADED_TOOLS], logp)
    sh([*pip, "--no-deps", "--no-build-isolation", "-e", "."], logp, env=BUILD_ENV)
    sh([venv_python(v), "-c", GIL_STAYS_OFF], logp, env={"PYTHON_GIL": None})


#: the 3.13t job's tests: the engine tests, the thread races, the C parts'
#: compile checks, reference counts and leaks, and the files that crashed
#: there before (test_bridge, test_compare). The rest of the suite is the same
#: Python code as on 3.13 (the whole of it, run there by hand: 1,436 passed);
#: it would add ~7 minutes to CI
FREE_THREADED_TESTS = (
    *ENGINE_TESTS,
    "tests/test_thread_race.py",
    "tests/test_c_layout.py",
    "tests/test_reach.py",
    "tests/test_memo.py",
    "tests/test_leaks.py",
    "tests/test_bridge.py",
    "tests/test_compare.py",
)


def job_free_threaded(v: str, python: str, logp: Path) -> None:
    """FREE_THREADED_TESTS on the C engine with the GIL off, less the tests
    marked once. PYTHON_GIL is left unset, so that an import that needs the
    GIL would turn it on: tests/test_thread_race.py's
    test_the_engine_without_the_gil, and GIL_STAYS_OFF again after the
    tests, fail then. Then PARALLEL_TESTS with each test run by 2 threads at
    once (pytest-run-parallel; a test marked thread_unsafe, which counts
    references or logs calls the threads would share, by one)."""
    env = {"PYTHON_GIL": None}
    sh([*pytest_cmd(v), *FREE_THREADED_TESTS, "-m", "not once and not scripts"], logp, env=env)
    sh([*pytest_cmd(v), "--parallel-threads=2", "-m", "not once and not scripts",
        *PARALLEL_TESTS], logp, env=env)  # fmt: skip
    sh([venv_python(v), "-c", GIL_STAYS_OFF], logp, env=env)


#: the core files the 3.13t job runs again with each test in 2 threads at once
#: (~170 s there)
PARALLEL_TESTS = (
    "tests/test_engines.py",
    "tests/test_kinds.py",
    "tests/test_errors.py",
    "tests/test_api.py",
    "tests/test_iter.py",
    "tests/test_rows.py",
)


def job_quick_setup(v: str, python: str, logp: Path) -> None:
    """--quick's setup: the venv of v kept when it is there (the full setup
    clears it), with the test extra and the C engine built in place."""
    if not venv_python(v).exists():
        sh([python, "-m", "venv", ROOT / ".venvs" / v], logp)
    install_checkout(v, "test", logp)


#: --quick's tests: the engine tests, the tree operations, paths and the docs' examples
QUICK_TESTS = (
    *ENGINE_TESTS,
    "tests/test_reduce.py",
    "tests/test_restructure.py",
    "tests/test_spec.py",
    "tests/test_keys.py",
    "tests/test_paths.py",
    "tests/test_docs_examples.py",
)


def job_quick(v: str, pure: bool, logp: Path) -> None:
    env = {"PYTREE_KIT_PURE": "1", "HYPOTHESIS_PROFILE": "pure"} if pure else {}
    sh([*pytest_cmd(v), "-m", "not once and not scripts", *QUICK_TESTS], logp, env=env)


def job_c_engine(v: str, python: str, logp: Path) -> None:
    # The benchmark scripts' smoke runs (marked scripts; 60-100 s a job) on
    # FULL and the oldest and newest Python: the scripts are the same on every
    # version, and the two ends of the range are where they could break.
    if v == FULL:
        marks: list = []
    elif v in EDGES:
        marks = ["-m", "not once"]
    else:
        marks = ["-m", "not once and not scripts"]
    sh(pytest_cmd(v) + marks, logp)


def job_pure_engine(v: str, python: str, logp: Path) -> None:
    # 60 examples a property test (tests/conftest.py's "pure" profile): the
    # C-engine job runs the differential tests, both engines, at 150. Without
    # test_depth.py's million-level runs (~95 s of 3.10's job, in the pure
    # engine's Python loops): its 100,000-level runs of every kind stay, the
    # C-engine jobs run the million (on the public API, and every C operation
    # directly in test_engines.py), and scripts/long_runs.sh runs test_depth.py
    # at a million on both engines: the pure engine's walks are the same loops
    # at 100,000 levels as at a million.
    env = {"PYTREE_KIT_PURE": "1", "HYPOTHESIS_PROFILE": "pure"}
    # Nor the tests that run the engines side by side (marked side_by_side:
    # test_engines.py, the C files' compile test, ...): they do not go through
    # the public API, so they are the same here as in the C-engine job.
    marks = "not once and not scripts and not side_by_side"
    cmd = [*pytest_cmd(v), "-m", marks, "-k", "not test_million"]
    sh(cmd, logp, env=env)


def job_no_fast_paths(v: str, python: str, logp: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=f"pytree_kit-nofast-{v}-") as tmp:
        copy = Path(tmp)
        copy_checkout(copy)
        env = dict(BUILD_ENV, PYTREE_KIT_NO_FAST_PATHS="1")
        sh([venv_python(v), "setup.py", "build_ext", "--inplace"], logp, env=env, cwd=copy)
        sh(
            [*pytest_cmd(v), "-m", "not once", *ENGINE_TESTS],
            logp,
            env={"PYTREE_KIT_NO_FAST_PATHS": "1", "PYTHONPATH": str(copy)},
            cwd=copy,
        )


def job_sanitizers(v: str, python: str, logp: Path) -> None:
    # property tests with 50 examples each, not CI's 150 (tests/conftest.py's
    # "sanitize" profile): the engine jobs run them at full size
    env = {"PYTHON": str(venv_python(v)), "HYPOTHESIS_PROFILE": "sanitize"}
    sh(["bash", "scripts/sanitize.sh", "--quick"], logp, env=env)


def job_package(v: str, python: str, logp: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=f"pytree_kit-dist-{v}-") as tmp:
        dist, env_dir, src = Path(tmp) / "dist", Path(tmp) / "venv", Path(tmp) / "src"
        # from a copy: an sdist writes its egg-info and its staging folder in the
        # source tree, and two versions' package jobs run at once
        copy_checkout(src)
        sh([venv_python(v), "-m", "build", "--outdir", dist, src], logp, env=BUILD_ENV, cwd=src)
        sdists, wheels = list(dist.glob("*.tar.gz")), list(dist.glob("*.whl"))
        if len(sdists) != 1 or len(wheels) != 1:
            raise Failed(f"expected one sdist and one wheel, got {sorted(dist.iterdir())}")
        names = zipfile.ZipFile(wheels[0]).namelist()
        tag = "cpython-" + v.replace(".", "")
        so = [n for n in names if re.fullmatch(rf"pytree_kit/_speedups\.{tag}-.*\.so", n)]
        wanted = ("pytree_kit/py.typed", "pytree_kit/_speedups.pyi")
        lacks = [w for w in wanted if w not in names]
        lacks += [] if so else ["the compiled extension"]
        lacks += [] if any(n.endswith("/LICENSE") for n in names) else ["LICENSE"]
        if lacks:
            raise Failed(f"{wheels[0].name} lacks {', '.join(lacks)}")
        sh([python, "-m", "venv", env_dir], logp)
        pip = [env_dir / "bin" / "python", "-m", "pip", "install", "-q"]
        sh([*pip, "--no-index", "--no-deps", wheels[0]], logp)
        check = (
            "import pytree_kit as pk; info = pk.engine_info(); print(info); "
            "assert pk.ENGINE == 'c', info; "
            f"assert pk.__file__.startswith({str(env_dir)!r}), pk.__file__; "
            "assert pk.unflatten(*pk.flatten({'a': [1]})[::-1]) == {'a': [1]}"
        )
        sh([env_dir / "bin" / "python", "-c", check], logp, cwd=Path(tmp))


#: what each extra, installed alone, must not bring (the torch extra is torch
#: alone: its pages, checkpoint's among them, run without numpy)
EXTRA_LACKS = {"core": ("hypothesis", "torch", "numpy"), "testing": ("torch", "numpy"),
               "torch": ("numpy", "hypothesis")}  # fmt: skip


def job_extras_alone(v: str, python: str, logp: Path) -> None:
    """Each extra installed alone into a fresh venv (the core with none,
    ``testing``, ``torch``), from a copy of the checkout, with no test
    dependency; there, scripts/docs_examples.py runs the docs pages that
    extra alone provides for, against the installed package."""
    with tempfile.TemporaryDirectory(prefix=f"pytree_kit-extras-{v}-") as tmp:
        src = Path(tmp) / "src"
        copy_checkout(src)  # pip builds a local folder in place
        for extra, lacks in EXTRA_LACKS.items():
            venv = Path(tmp) / f"venv-{extra}"
            py = venv / "bin" / "python"
            sh([python, "-m", "venv", venv], logp)
            target = str(src) if extra == "core" else f"{src}[{extra}]"
            pip = [py, "-m", "pip", "install", "-q", "-c", ROOT / "constraints.txt", target]
            sh(pip, logp, env=BUILD_ENV)
            check = (
                "import importlib.util as u, sys, pytree_kit as pk; "
                "assert pk.ENGINE == 'c'; assert pk.__file__.startswith(sys.prefix), pk.__file__; "
                f"extra = [m for m in {lacks!r} if u.find_spec(m)]; "
                f"assert not extra, f'the {extra} extra alone installs {{extra}}'; "
                f"print('{extra} alone: pytree_kit from', pk.__file__)"
            )
            sh([py, "-c", check], logp, cwd=Path(tmp))
            script = src / "scripts" / "docs_examples.py"
            sh([py, script, "--extra", extra], logp, cwd=Path(tmp))


def job_wheel(v: str, python: str, logp: Path) -> None:
    """FULL's package job: the release script's x86_64 manylinux wheel of v (zig,
    auditwheel), installed with no compiler reachable and tested, and the sdist
    installed with no compiler (scripts/wheels.py)."""
    with tempfile.TemporaryDirectory(prefix=f"pytree_kit-wheel-{v}-") as tmp:
        cmd = [venv_python(v), ROOT / "scripts" / "wheels.py", "--python", v, "--arch", "x86_64"]
        sh([*cmd, "--out", tmp], logp)


#: the oldest supported torch (docs/compatibility.md): its job runs the tests of
#: what torch.compile traces and of the data adapters on it, on FULL's Python
#: and FULL's build; scripts/torch_matrix.py runs every torch
OLDEST_TORCH = "2.9.1"
OLDEST_TORCH_TESTS = (
    "tests/test_dynamo.py",
    "tests/torch/test_tracing.py",
    "tests/torch/test_loading.py",
)


def torch_matrix_minors() -> list:
    """The torch minors scripts/torch_matrix.py runs (the supported range)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from torch_matrix import TORCH

    return list(TORCH)


def minor_key(minor: str) -> tuple:
    return tuple(int(p) for p in minor.split("."))


def cache_dir() -> Path:
    """What CI keeps between runs on one machine, as pip keeps its downloads:
    ``$PYTREE_KIT_CACHE``, by default ``~/.cache/pytree_kit`` (where
    scripts/python_debian.sh makes its 3.14 and 3.15 too)."""
    return Path(os.environ.get("PYTREE_KIT_CACHE") or Path.home() / ".cache" / "pytree_kit")


def _runs_as(py: Path, python: str) -> bool:
    """Whether the venv interpreter py runs, and is the interpreter python's release."""
    code = "import sys; print(sys.version)"
    try:
        got = [subprocess.run([p, "-c", code], capture_output=True, text=True, timeout=60)
               for p in (py, python)]  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return got[0].returncode == 0 and got[0].stdout == got[1].stdout


def job_oldest_torch(v: str, python: str, logp: Path) -> None:
    # The registry's torch (a CUDA build, ~4.6 GB with its libraries), not the
    # machine's capped local wheel, with the test dependencies at the releases
    # that take this torch. Unpacking it into a new venv took 6 of the job's
    # 10 minutes, so the venv is kept between runs in cache_dir(), as pip's
    # cache keeps the download: it holds torch and the test dependencies only
    # (pytree_kit comes from the checkout, PYTHONPATH), it is made again when
    # its interpreter no longer runs as FULL's, and pip install runs on it
    # every time (a no-op when all is there, a repair when not).
    venv = cache_dir() / "venvs" / f"torch{OLDEST_TORCH}-python{v}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    # one run at a time in the kept venv (two checkouts' CI runs on one machine)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _oldest_torch_in(venv, v, python, logp)


def _oldest_torch_in(venv: Path, v: str, python: str, logp: Path) -> None:
    py = venv / "bin" / "python"
    if _runs_as(py, python):
        with open(logp, "a") as f:
            f.write(f"reusing {venv}\n")
    else:
        sh([python, "-m", "venv", "--clear", venv], logp)
    sys.path.insert(0, str(ROOT / "scripts"))
    from torch_matrix import DEPENDENCIES

    pip = [py, "-m", "pip", "install", "-q", f"torch=={OLDEST_TORCH}", *DEPENDENCIES]
    sh(pip, logp, env={"PIP_CONSTRAINT": "/dev/null"})
    # what is installed there is consistent (a kept venv could have drifted)
    sh([py, "-m", "pip", "check"], logp)
    check = (
        "import torch, pytree_kit as pk; "
        f"assert torch.__version__.split('+')[0] == {OLDEST_TORCH!r}, torch.__version__; "
        "assert pk.ENGINE == 'c'; print('torch', torch.__version__, pk.ENGINE)"
    )
    env = {"PYTHONPATH": str(ROOT)}  # FULL's C engine, built in place by its setup
    sh([py, "-c", check], logp, env=env)
    cmd = [py, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--durations=25"]
    sh([*cmd, *OLDEST_TORCH_TESTS], logp, env=env)


def make_quick_jobs(v: str, python: str) -> list:
    """--quick: one Python, both engines, a few minutes."""
    needs = (f"{v} setup",)
    return [
        Job(f"{v} setup", 60, partial(job_quick_setup, v, python)),
        Job(f"{v} C engine (quick)", 120, partial(job_quick, v, False), needs),
        Job(f"{v} pure engine (quick)", 120, partial(job_quick, v, True), needs),
    ]


#: seconds each job took in a CI run on 2 cores (two jobs at a time), for the
#: order the jobs start in: the longest chains first, so that what is left at
#: the end is short and both cores stay busy. 3.15's are 3.14's from the last
#: whole run, when it was the newest (the same jobs on the same C engine); 3.14's
#: C engine is that less the benchmark scripts' ~60 s. (`--python 3.14 --python
#: 3.15` on a machine shared with other work took 530 s for 3.14's C engine,
#: 505, 327, 109 and 366 s for 3.15's C engine, pure engine, no fast paths and
#: sanitizers: the same order.)
ESTIMATES = {
    "setup": {FULL: 200, "": 110},
    "C engine": {"3.10": 600, FULL: 1850, "3.14": 300, "3.15": 360, "": 420},  # 3.12, 3.13: 420
    "pure engine": {"3.10": 470, "3.15": 285, "": 470},
    "no fast paths": {"3.10": 165, "3.15": 80, "": 165},
    "sanitizers": {"3.10": 440, "3.15": 240, "": 440},
    "package": {"": 60},
    "wheel": {"": 170},
    "extras alone": {"": 140},
    "torch": {"": 300},  # the tests; a new venv adds ~360 (cache_dir())
    "free-threaded setup": {"": 90},
    "free-threaded C engine": {"": 480},
}


def estimate(kind: str, v: str) -> float:
    table = ESTIMATES[kind]
    return table.get(v, table[""])


def _job(v: str, python: str, kind: str, run: Callable, after: tuple, name: str = "") -> Job:
    return Job(name or f"{v} {kind}", estimate(kind, v), partial(run, v, python), after)


def make_jobs(pythons: dict) -> list:
    """The jobs for the interpreters found ({version: path}), with each one's
    estimated seconds (``ESTIMATES``, for ordering) and what it needs."""
    jobs = []
    previous_setup: tuple = ()
    # FULL first: its jobs are the longest
    for v, python in sorted(pythons.items(), key=lambda item: item[0] != FULL):
        full = v == FULL
        needs = (f"{v} setup",)
        job = partial(_job, v, python, after=needs)
        if v in FREE_THREADED:
            jobs.append(
                _job(
                    v,
                    python,
                    "free-threaded setup",
                    job_free_threaded_setup,
                    previous_setup,
                    name=f"{v} setup",
                )
            )
            previous_setup = needs
            jobs.append(job("free-threaded C engine", job_free_threaded, name=f"{v} C engine"))
            continue
        # one build in the checkout at a time: each setup waits for the one before
        jobs.append(_job(v, python, "setup", job_setup, previous_setup))
        previous_setup = needs
        jobs.append(job("C engine", job_c_engine))
        if v in EDGES:
            jobs.append(job("pure engine", job_pure_engine))
            jobs.append(job("no fast paths", job_no_fast_paths))
            jobs.append(job("sanitizers", job_sanitizers))
        if full:
            jobs.append(job("wheel", job_wheel))
            jobs.append(job("extras alone", job_extras_alone))
            jobs.append(job("torch", job_oldest_torch, name=f"torch {OLDEST_TORCH}"))
        else:
            jobs.append(job("package", job_package))
    return jobs


# -- running ----------------------------------------------------------------------------


def priorities(jobs: list) -> dict:
    """Each job's estimate plus the longest chain of jobs waiting on it: a
    setup, which the longest jobs wait for, comes before them."""
    waiting: dict = {j.name: [] for j in jobs}
    for j in jobs:
        for a in j.after:
            waiting[a].append(j)
    out: dict = {}

    def chain(j: Job) -> float:
        if j.name not in out:
            out[j.name] = j.estimate + max((chain(d) for d in waiting[j.name]), default=0.0)
        return out[j.name]  # type: ignore[no-any-return]

    for j in jobs:
        chain(j)
    return out


#: seconds between two progress lines while jobs run (at least once a minute)
HEARTBEAT = 60.0
PERCENT = re.compile(r"\[\s*(\d+)%\]")


def progress_line(jobs: list, elapsed: float, now: float) -> str:
    """The running summary: time so far, each running job with its time and
    its pytest run's progress (the last ``[ NN%]`` in its log), and counts."""

    def clock(s: float) -> str:
        return f"{int(s) // 60}:{int(s) % 60:02d}"

    running = []
    for j in jobs:
        if j.status != "running":
            continue
        where = ""
        logp = job_log(j.name)
        try:
            with open(logp, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                found = PERCENT.findall(f.read().decode(errors="replace"))
            where = f", {found[-1]}%" if found else ""
        except OSError:
            pass
        running.append(f"{j.name} ({clock(now - j.started)}{where})")
    counts = collections.Counter(j.status for j in jobs)
    done = ", ".join(
        f"{counts[s]} {s}" for s in ("passed", "failed", "skipped", "waiting") if counts[s]
    )
    return f"... {clock(elapsed)} elapsed; running: {'; '.join(running) or 'nothing'}; {done}"


def run_jobs(jobs: list, workers: int) -> None:
    by_name = {j.name: j for j in jobs}
    priority = priorities(jobs)
    lock = threading.Condition()

    def ready(j: Job) -> bool:
        return j.status == "waiting" and all(by_name[a].status == "passed" for a in j.after)

    def doomed(j: Job) -> bool:
        return j.status == "waiting" and any(
            by_name[a].status in ("failed", "skipped") for a in j.after
        )

    def work(j: Job) -> None:
        logp = job_log(j.name)
        logp.write_text(f"# {j.name}\n")
        t0 = time.monotonic()
        try:
            j.run(logp)
            j.status = "passed"
        except Exception as exc:  # a job's failure is reported, the others go on
            j.status = "failed"
            j.detail = str(exc)
        j.seconds = time.monotonic() - t0
        text = logp.read_text(errors="replace")
        j.summaries = [m.group(1) for m in map(SUMMARY.match, text.splitlines()) if m]
        with lock:
            shown = "; ".join(j.summaries) or j.detail
            log(f"{j.status:6} {j.name} ({j.seconds:.0f} s){': ' + shown if shown else ''}")
            if j.status == "failed":
                tail = text.splitlines()[-150:]
                print("\n".join(f"ci:   | {line}" for line in tail), flush=True)
            lock.notify_all()

    running = 0
    t0 = time.monotonic()
    last_line = [t0]  # when the last progress line was printed

    with lock:
        while True:
            for j in jobs:
                if doomed(j):
                    j.status = "skipped"
                    j.detail = "a job it needs did not pass"
                    log(f"skip   {j.name}: {j.detail}")
            todo = sorted((j for j in jobs if ready(j)), key=lambda j: -priority[j.name])
            while todo and running < workers:
                j = todo.pop(0)
                j.status = "running"
                j.started = time.monotonic()
                running += 1
                log(f"start  {j.name}")

                def target(j: Job = j) -> None:
                    nonlocal running
                    try:
                        work(j)
                    finally:
                        with lock:
                            running -= 1
                            lock.notify_all()

                threading.Thread(target=target, daemon=True).start()
            if running == 0 and not any(ready(j) for j in jobs):
                break
            # until the next summary is due, whatever woke it before
            lock.wait(timeout=max(0.05, last_line[0] + HEARTBEAT - time.monotonic()))
            now = time.monotonic()
            if now - last_line[0] >= HEARTBEAT:
                log(progress_line(jobs, now - t0, now))
                last_line[0] = now


def totals(jobs: list) -> dict:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for j in jobs:
        for s in j.summaries:
            for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped)", s):
                out["failed" if what.startswith("error") else what] += int(n)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python", action="append", choices=VERSIONS + FREE_THREADED, help="only these"
    )
    parser.add_argument("--jobs", type=int, default=2, help="jobs at a time (default 2)")
    parser.add_argument("--list", action="store_true", help="list the jobs and exit")
    parser.add_argument(
        "--make-debian-pythons",
        "--make-python314",
        dest="make_debian_pythons",
        action="store_true",
        help=f"make Python {' and '.join(DEBIAN_PYTHONS)} from Debian's packages "
        "(scripts/python_debian.sh) if they are not found (as CI=true does)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"one Python ({FULL}, or --python), both engines, the engine, operation and "
        "docs tests: a few minutes",
    )
    parser.add_argument(
        "--system-packages",
        action="store_true",
        help="install missing Debian packages with apt-get (chromium, for the docs site "
        "test) without asking; CI=true implies it",
    )
    args = parser.parse_args()
    strict = os.environ.get("CI", "").lower() in ("true", "1")
    if args.quick:
        if args.python and len(args.python) > 1:
            parser.error("--quick runs one Python")
        if args.python and args.python[0] in FREE_THREADED:
            parser.error("--quick runs a Python with the GIL")
        args.python = args.python or [FULL]
    wanted = args.python or list(VERSIONS + FREE_THREADED)
    pythons, missing = {}, []
    for v in wanted:
        python = find_python(v)
        makeable = v in DEBIAN_PYTHONS or v in FREE_THREADED
        if python is None and makeable and (strict or args.make_debian_pythons):
            python = make_python(v)
        if python is None:
            missing.append(v)
            log(f"Python {v} not found (python{v} on PATH, pyenv): its jobs are skipped")
        else:
            pythons[v] = python
            log(f"Python {v}: {python}")
    if missing and strict:
        log(f"FAILED: CI=true and no interpreter for Python {', '.join(missing)}")
        return 1
    if args.quick:
        jobs = [j for v, py in pythons.items() for j in make_quick_jobs(v, py)]
    else:
        jobs = make_jobs(pythons)
    global SYSTEM_PACKAGES
    SYSTEM_PACKAGES = strict or args.system_packages
    wants_chromium = any(j.name == f"{FULL} setup" for j in jobs) and not args.quick
    if wants_chromium and not SYSTEM_PACKAGES and not args.list and needs_chromium():
        SYSTEM_PACKAGES = ask(
            "chromium (Debian's, for the docs site test) is missing: install it with "
            "apt-get update && apt-get install chromium?"
        )
    if args.list:
        for j in jobs:
            print(f"{j.name:22} after {', '.join(j.after) or '-'}")
        return 0
    if not jobs:
        log("FAILED: no interpreter found, nothing was tested")
        return 1
    LOGS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    run_jobs(jobs, max(1, args.jobs))
    bad = [j for j in jobs if j.status != "passed"]
    count = totals(jobs)
    log(f"{len(jobs) - len(bad)} of {len(jobs)} jobs passed in {time.monotonic() - t0:.0f} s")
    for j in bad:
        log(f"  {j.status}: {j.name}{': ' + j.detail if j.detail else ''}")
    if missing:
        log(f"not tested: Python {', '.join(missing)} (no interpreter)")
    if count["passed"] == 0:
        log("FAILED: no test passed")
    log(f"{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped")
    return 1 if bad or count["passed"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
