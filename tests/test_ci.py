"""scripts/ci.py, the README's test command: it finds the interpreters as people
do, fails under CI=true when one is missing, and totals every pytest run."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.once  # about the repository's CI, not an engine


def _fake_pythons(tmp_path: Path, version: str) -> dict[str, str]:
    """A PATH whose python<version> is a pyenv-style shim that fails, and a
    pyenv root whose versions/<version>.99 has this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / f"python{version}"
    shim.write_text(f"#!/bin/sh\necho 'pyenv: python{version}: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    real = tmp_path / "pyenv" / "versions" / f"{version}.99" / "bin"
    real.mkdir(parents=True)
    (real / f"python{version}").symlink_to(sys.executable)
    return {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "PYENV_ROOT": str(tmp_path / "pyenv"),
    }


def test_a_failing_shim_on_path_falls_back_to_pyenv(
    tmp_path: Path, monkeypatch: Any, ci: Any
) -> None:
    here = "{}.{}".format(*sys.version_info[:2])
    for k, v in _fake_pythons(tmp_path, here).items():
        monkeypatch.setenv(k, v)
    assert ci.find_python(here) == str(
        tmp_path / "pyenv" / "versions" / f"{here}.99" / "bin" / f"python{here}"
    )
    assert ci.find_python("3.99") is None


@pytest.mark.parametrize("version", ["3.14", "3.15"])
def test_a_debian_python_is_found_where_its_script_makes_it(
    tmp_path: Path, monkeypatch: Any, ci: Any, version: str
) -> None:
    """Last of 3.14's and 3.15's candidates: scripts/python_debian.sh's prefix
    for that version (PYTREE_KIT_PY314_PREFIX, PYTREE_KIT_PY315_PREFIX), whose
    bin/python3.X is the interpreter."""
    assert version in ci.DEBIAN_PYTHONS
    tag = version.replace(".", "")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(f"PYTREE_KIT_PY{tag}_PREFIX", str(tmp_path / "prefix"))
    made = tmp_path / "prefix" / "bin" / f"python{version}"
    # (this interpreter stands for a 3.14 or 3.15 one)
    monkeypatch.setattr(ci, "_version_of", lambda p: version if Path(p).exists() else None)
    assert ci.find_python(version) is None
    made.parent.mkdir(parents=True)
    made.symlink_to(sys.executable)
    assert ci.find_python(version) == str(made)
    # the other version's variable does not move this one's prefix
    other = "3.15" if version == "3.14" else "3.14"
    assert ci.debian_prefix(other) == tmp_path / ".cache" / "pytree_kit" / f"python{other}"
    monkeypatch.delenv(f"PYTREE_KIT_PY{tag}_PREFIX")
    assert ci.debian_prefix(version) == tmp_path / ".cache" / "pytree_kit" / f"python{version}"
    assert ci.find_python(version) is None
    # a version that is not made from Debian's packages has no such candidate
    assert "3.13" not in ci.DEBIAN_PYTHONS
    monkeypatch.setenv("PYTREE_KIT_PY313_PREFIX", str(tmp_path / "prefix"))
    (tmp_path / "prefix" / "bin" / "python3.13").symlink_to(sys.executable)
    monkeypatch.setattr(ci, "_version_of", lambda p: "3.13" if Path(p).exists() else None)
    assert ci.find_python("3.13") is None


def test_a_debian_python_is_made_with_its_script(tmp_path: Path, monkeypatch: Any, ci: Any) -> None:
    """make_python, for 3.14 or 3.15, runs scripts/python_debian.sh with the
    version and takes its last line; a script that fails, or gives another version's
    interpreter, gives None."""
    script = tmp_path / "scripts" / "python_debian.sh"
    script.parent.mkdir()
    script.write_text(
        f'echo "making $1" >&2\necho "$1" > {tmp_path / "asked"}\n'
        f"echo something\necho {sys.executable}\n"
    )
    monkeypatch.setattr(ci, "ROOT", tmp_path)
    monkeypatch.setattr(ci, "_version_of", lambda p: "3.15" if p == sys.executable else None)
    assert ci.make_python("3.15") == sys.executable
    assert (tmp_path / "asked").read_text().strip() == "3.15"
    # the interpreter it printed is 3.15's, not 3.14's
    assert ci.make_python("3.14") is None
    assert (tmp_path / "asked").read_text().strip() == "3.14"
    script.write_text("echo 'no mirror' >&2\nexit 3\n")
    assert ci.make_python("3.15") is None


def _script_of_versions() -> tuple:
    """The versions scripts/python_debian.sh knows (its SUPPORTED=(...) line)."""
    text = (ROOT / "scripts" / "python_debian.sh").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("SUPPORTED=(")]
    return tuple(line[len("SUPPORTED=(") : line.index(")")].split())


def test_the_debian_script_serves_the_versions_ci_makes_with_it(ci: Any, tmp_path: Path) -> None:
    """python_debian.sh knows the versions ci.py asks it for, and refuses any
    other (or none) with its usage, before it touches anything."""
    assert _script_of_versions() == ci.DEBIAN_PYTHONS
    # the newest declared Python is one no Debian 12 machine has
    assert ci.VERSIONS[-1] in ci.DEBIAN_PYTHONS
    env = dict(os.environ, HOME=str(tmp_path))
    for args in ([], ["3.13"], ["3.15", "3.14"], ["315"]):
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "python_debian.sh"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert "usage: bash scripts/python_debian.sh VERSION" in proc.stderr
        assert proc.stdout == ""
    assert not (tmp_path / ".cache").exists()


def test_python314_sh_is_the_debian_script_for_3_14(tmp_path: Path) -> None:
    """scripts/python314.sh, which older commands and pages name, runs
    python_debian.sh 3.14 beside it and passes on its output and status."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "python314.sh").write_text((ROOT / "scripts" / "python314.sh").read_text())
    (scripts / "python_debian.sh").write_text('echo "asked for $*"\nexit 7\n')
    proc = subprocess.run(
        ["bash", str(scripts / "python314.sh")], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (7, "asked for 3.14\n")


def test_a_missing_python_fails_under_ci_and_is_named_otherwise(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = dict(os.environ, PATH=str(tmp_path / "empty"), PYENV_ROOT=str(tmp_path / "none"))
    env["HOME"] = str(tmp_path)  # no ~/.pyenv either
    cmd = [sys.executable, str(ROOT / "scripts" / "ci.py"), "--list"]
    strict = subprocess.run(cmd, env=dict(env, CI="true"), capture_output=True, text=True)
    assert strict.returncode == 1
    assert "ci: Python 3.12 not found (python3.12 on PATH, pyenv): its jobs are skipped" in (
        strict.stdout
    )
    assert (
        "ci: FAILED: CI=true and no interpreter for Python 3.10, 3.11, 3.12, 3.13, 3.14, 3.15, 3.13t"
        in strict.stdout
    )
    # under CI=true, a missing 3.14, 3.15 and 3.13t are made (here there is no
    # bash to run the scripts that make them)
    for v in ("3.14", "3.15", "3.13t"):
        assert f"ci: cannot make Python {v}: no bash" in strict.stdout
    assert "cannot make Python 3.13:" not in strict.stdout
    # a person without the interpreters is told, and nothing is tested
    relaxed = subprocess.run(cmd, env=dict(env, CI=""), capture_output=True, text=True)
    assert relaxed.returncode == 0 and "not found" in relaxed.stdout


def test_totals_add_every_pytest_summary(ci: Any) -> None:
    a, b = ci.Job("a", 1, print), ci.Job("b", 1, print)
    lines = [
        "= 926 passed, 30 skipped, 8 deselected in 176.00s (0:02:56) =",
        "1 failed, 1062 passed, 13 skipped, 8 deselected, 19 warnings in 504.1s",
        "3 errors in 1.0s",
    ]
    a.summaries = [m.group(1) for m in map(ci.SUMMARY.match, lines[:2]) if m]
    b.summaries = [m.group(1) for m in map(ci.SUMMARY.match, lines[2:]) if m]
    assert ci.totals([a, b]) == {"passed": 1988, "failed": 4, "skipped": 43}


def test_jobs_cover_every_version_and_what_the_issue_asks(ci: Any) -> None:
    jobs = ci.make_jobs({v: sys.executable for v in ci.VERSIONS})
    names = {j.name for j in jobs}
    for v in ci.VERSIONS:
        for kind in ("setup", "C engine"):
            assert f"{v} {kind}" in names
        # FULL's package job is the release script's manylinux wheel
        assert f"{v} {'wheel' if v == ci.FULL else 'package'}" in names
    (wheel,) = [j for j in jobs if j.name == f"{ci.FULL} wheel"]
    assert wheel.run.func is ci.job_wheel
    # each extra installed alone, once
    (alone,) = [j for j in jobs if j.name.endswith(" extras alone")]
    assert alone.name == f"{ci.FULL} extras alone" and alone.run.func is ci.job_extras_alone
    assert set(ci.EXTRA_LACKS) == {"core", "testing", "torch"}
    assert "numpy" in ci.EXTRA_LACKS["torch"]
    # the pure engine, no fast paths and sanitizers on the oldest and newest
    # Python only (CI's time), the oldest torch once
    edges = (ci.VERSIONS[0], ci.VERSIONS[-1])
    for kind in ("pure engine", "no fast paths", "sanitizers"):
        assert {n for n in names if n.endswith(f" {kind}")} == {f"{v} {kind}" for v in edges}
    assert ci.EDGES == ("3.10", "3.15")
    # 3.14, between them, runs the C engine's suite and the package job, no more
    assert sorted(n for n in names if n.startswith("3.14 ")) == [
        "3.14 C engine",
        "3.14 package",
        "3.14 setup",
    ]
    assert f"torch {ci.OLDEST_TORCH}" in names
    assert ci.OLDEST_TORCH.startswith(min(ci.torch_matrix_minors(), key=ci.minor_key) + ".")
    # the setups come first: everything else waits for its version's
    prio = ci.priorities(jobs)
    assert max(prio, key=prio.get) == f"{ci.FULL} setup"


def test_the_c_engine_job_of_each_python_runs_its_whole_suite(ci: Any, monkeypatch: Any) -> None:
    """Every version's C-engine job runs the whole suite (less the once tests,
    which FULL runs); the benchmark scripts' smoke runs on FULL and EDGES."""
    ran: dict = {}
    monkeypatch.setattr(ci, "sh", lambda cmd, log_path, **kw: ran.setdefault(cmd[0], cmd))
    for v in ci.VERSIONS:
        ran.clear()
        ci.job_c_engine(v, sys.executable, Path("log"))
        (cmd,) = ran.values()
        assert cmd[0] == ci.venv_python(v) and cmd[1:3] == ["-m", "pytest"]
        marks = cmd[cmd.index("-m", 3) + 1] if "-m" in cmd[3:] else ""
        assert not [a for a in cmd[3:] if a.startswith("tests/")]  # no file chosen: all
        expected = {ci.FULL: "", "3.10": "not once", "3.15": "not once"}
        assert marks == expected.get(v, "not once and not scripts"), (v, cmd)


def test_package_jobs_build_from_their_own_copy(ci: Any, monkeypatch: Any, tmp_path: Path) -> None:
    """Two versions' package jobs run at once; an sdist writes its egg-info and
    its staging folder into the source tree, so each builds from a copy."""
    builds: list = []

    class Stop(Exception):
        pass

    def sh(cmd: list, log_path: Path, *, env: Any = None, cwd: Path = ci.ROOT) -> None:
        builds.append((Path(cmd[-1]), Path(cwd)))
        assert (Path(cmd[-1]) / "setup.py").is_file()
        raise Stop

    monkeypatch.setattr(ci, "sh", sh)
    for v in ("3.12", "3.13"):
        with pytest.raises(Stop):
            ci.job_package(v, sys.executable, tmp_path / "log")
    (a, a_cwd), (b, b_cwd) = builds
    assert a != b and ci.ROOT not in (a, b, a_cwd, b_cwd)
    assert not a.is_relative_to(ci.ROOT) and not b.is_relative_to(ci.ROOT)


def test_the_oldest_torch_venv_is_kept_and_made_again_when_it_no_longer_runs(
    ci: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    """The oldest torch's venv lives in the cache (PYTREE_KIT_CACHE): made with
    --clear when it is not there or its interpreter is not FULL's release,
    reused otherwise; pip install and pip check run on it every time."""
    monkeypatch.setenv("PYTREE_KIT_CACHE", str(tmp_path / "cache"))
    assert ci.cache_dir() == tmp_path / "cache"
    cmds: list = []

    class Stop(Exception):
        pass

    lockfile = tmp_path / "cache" / "venvs" / f"torch{ci.OLDEST_TORCH}-python3.11.lock"

    def sh(cmd: list, log_path: Path, *, env: Any = None, cwd: Path = ci.ROOT) -> None:
        cmds.append([str(c) for c in cmd])
        with open(lockfile) as other, pytest.raises(BlockingIOError):  # held by the job
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if "check" in cmds[-1]:
            raise Stop

    monkeypatch.setattr(ci, "sh", sh)
    log = tmp_path / "log"
    venv = tmp_path / "cache" / "venvs" / f"torch{ci.OLDEST_TORCH}-python3.11"
    with pytest.raises(Stop):
        ci.job_oldest_torch("3.11", sys.executable, log)
    made, install, check = cmds
    assert made[-3:] == ["venv", "--clear", str(venv)]
    assert f"torch=={ci.OLDEST_TORCH}" in install and check[-2:] == ["pip", "check"]
    # a venv whose interpreter runs as this one's is reused
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert ci._runs_as(venv / "bin" / "python", sys.executable)
    cmds.clear()
    with pytest.raises(Stop):
        ci.job_oldest_torch("3.11", sys.executable, log)
    assert [c[1:4] for c in cmds] == [["-m", "pip", "install"], ["-m", "pip", "check"]]
    assert f"reusing {venv}" in log.read_text()
    # one that no longer runs, or runs as another release, is made again
    other = tmp_path / "other-python"
    other.write_text("#!/bin/sh\necho '3.11.0 (another build)'\n")
    other.chmod(0o755)
    for target in (tmp_path / "gone", other):
        (venv / "bin" / "python").unlink()
        (venv / "bin" / "python").symlink_to(target)
        assert not ci._runs_as(venv / "bin" / "python", sys.executable)
        cmds.clear()
        with pytest.raises(Stop):
            ci.job_oldest_torch("3.11", sys.executable, log)
        assert cmds[0][-3:] == ["venv", "--clear", str(venv)]


def test_the_full_setup_installs_chromium_only_as_root_and_when_missing(
    ci: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    ran: list = []
    monkeypatch.setattr(ci, "sh", lambda cmd, log_path, **kw: ran.append((cmd, kw)))
    tools = {"apt-get": "/usr/bin/apt-get"}
    monkeypatch.setattr(ci.shutil, "which", tools.get)
    monkeypatch.setattr(ci.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(ci, "SYSTEM_PACKAGES", True)  # CI=true, or --system-packages
    ci.install_chromium(tmp_path / "log")
    assert ran == []  # not root: the browser test says what to install
    monkeypatch.setattr(ci.os, "geteuid", lambda: 0)
    ci.install_chromium(tmp_path / "log")
    assert [cmd for cmd, kw in ran] == [
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
    ]
    assert ran[1][1]["env"] == {"DEBIAN_FRONTEND": "noninteractive"}
    ran.clear()
    tools["chromium"] = "/usr/bin/chromium"
    ci.install_chromium(tmp_path / "log")
    assert ran == []


def test_the_wheel_job_runs_the_release_script_for_one_python(
    ci: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    calls: list = []
    monkeypatch.setattr(ci, "sh", lambda cmd, log_path, **kw: calls.append([str(c) for c in cmd]))
    ci.job_wheel(ci.FULL, sys.executable, tmp_path / "log")
    ((py, script, *args),) = calls
    assert Path(script) == ci.ROOT / "scripts" / "wheels.py"
    assert args[:4] == ["--python", ci.FULL, "--arch", "x86_64"]
    # the wheel goes to a folder of its own, outside the checkout, with no --no-test
    assert args[4] == "--out" and not Path(args[5]).is_relative_to(ci.ROOT)
    assert "--no-test" not in args


def test_a_running_summary_comes_while_jobs_run(
    ci: Any, monkeypatch: Any, tmp_path: Path, capsys: Any
) -> None:
    """Each job's start and end (with its time and outcome), and between them a
    line at least every HEARTBEAT seconds with each running job's progress."""
    import time as _time

    monkeypatch.setattr(ci, "LOGS", tmp_path)
    monkeypatch.setattr(ci, "HEARTBEAT", 0.2)

    def slow(logp: Path) -> None:
        logp.write_text("# slow\n........ [ 42%]\n")
        _time.sleep(1.0)

    def broken(logp: Path) -> None:
        raise ci.Failed("it broke")

    jobs = [ci.Job("slow one", 1, slow), ci.Job("broken one", 1, broken)]
    ci.run_jobs(jobs, 2)
    out = capsys.readouterr().out.splitlines()
    assert "ci: start  slow one" in out and "ci: start  broken one" in out
    assert any(line.startswith("ci: passed slow one (") for line in out), out
    assert any(line.startswith("ci: failed broken one (") for line in out), out
    summaries = [line for line in out if " elapsed; running: " in line]
    assert len(summaries) >= 2, out
    assert "slow one (0:00, 42%)" in summaries[0] and "1 failed" in summaries[0]


def test_quick_is_one_python_both_engines(ci: Any) -> None:
    jobs = ci.make_quick_jobs(ci.FULL, sys.executable)
    names = [j.name for j in jobs]
    assert names == [
        f"{ci.FULL} setup",
        f"{ci.FULL} C engine (quick)",
        f"{ci.FULL} pure engine (quick)",
    ]
    assert set(ci.ENGINE_TESTS) <= set(ci.QUICK_TESTS)


def test_system_packages_need_a_flag_or_an_answer(
    ci: Any, monkeypatch: Any, tmp_path: Path
) -> None:
    calls: list = []
    monkeypatch.setattr(ci, "sh", lambda cmd, log_path, **kw: calls.append(cmd))
    monkeypatch.setattr(ci.shutil, "which", lambda name: None if name == "chromium" else "/x")
    monkeypatch.setattr(ci.os, "geteuid", lambda: 0)
    monkeypatch.setattr(ci, "SYSTEM_PACKAGES", False)
    ci.install_chromium(tmp_path / "log")
    assert calls == [] and "not installed" in (tmp_path / "log").read_text()
    monkeypatch.setattr(ci, "SYSTEM_PACKAGES", True)
    ci.install_chromium(tmp_path / "log")
    assert [c[:2] for c in calls] == [["apt-get", "update"], ["apt-get", "install"]]
    # with no terminal, the question is not asked and the answer is no
    monkeypatch.setattr(ci.sys, "stdin", open(os.devnull))
    assert ci.ask("install it?") is False
