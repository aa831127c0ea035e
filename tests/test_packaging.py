"""The package as users install it: the declared Pythons are the tested ones,
the license, an install that cannot compile the C engine, and the test
dependencies on each declared Python (one pin each, every peer that has a
wheel; a docstring example of a peer that is missing skips).

scripts/ci.py's package job builds the sdist and wheel with ``python -m build``
on every supported Python and imports the wheel from a fresh virtual
environment; these tests cover what that job does not.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from pytree_kit import _engine

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.once  # the same on every engine; CI runs them on 3.11


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # 3.11 on
    return tomllib.loads((ROOT / "pyproject.toml").read_text())  # type: ignore[no-any-return]


def test_every_declared_python_is_a_tested_python(ci: Any) -> None:
    project = _pyproject()["project"]
    declared = tuple(
        m.group(1)
        for c in project["classifiers"]
        if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))
    )
    assert declared == ci.VERSIONS
    assert project["requires-python"] == f">={ci.VERSIONS[0]}"
    first, last = (tuple(map(int, v.split("."))) for v in (ci.VERSIONS[0], ci.VERSIONS[-1]))
    # the C engine's layout-reading fast paths were validated from the first
    # declared version on, up to the last or an earlier one (3.13: on 3.14
    # they are off, and the engine reads through the public API)
    assert _engine.VALIDATED_PYTHONS[0] == first and _engine.VALIDATED_PYTHONS[1] <= last
    assert ci.FULL in ci.VERSIONS and set(ci.SANITIZED) <= set(ci.VERSIONS)


def test_the_version_is_the_installed_one_and_semantic() -> None:
    """pytree_kit/_version.py is the one place the version is written: the
    build reads it (pyproject.toml's dynamic version), and the installed
    distribution's metadata carries it."""
    import importlib.metadata

    import pytree_kit
    from pytree_kit import _version

    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "pytree_kit._version.__version__"
    }
    assert pytree_kit.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", _version.__version__), _version.__version__
    assert importlib.metadata.version("pytree_kit") == _version.__version__


def test_the_license_is_apache_2() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]


def _wheel_without_compiler(ci: Any, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``pip wheel`` of a copy of the checkout with no C compiler to be found."""
    src = tmp_path / "src"
    ci.copy_checkout(src)
    full = dict(os.environ, CC=str(tmp_path / "no-such-cc"), **env)
    full.pop("PYTREE_KIT_CFLAGS", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_a_compiler_the_install_says_so_and_has_the_pure_engine(
    ci: Any, tmp_path: Path
) -> None:
    pytest.importorskip("setuptools")
    proc = _wheel_without_compiler(ci, tmp_path, PYTREE_KIT_REQUIRE_C="0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [
        line.strip()
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip().startswith("pytree_kit:")
    ]
    assert len(lines) == 1, lines
    assert lines[0].startswith("pytree_kit: the C engine could not be built (")
    assert "installing the pure-Python engine" in lines[0]
    assert "PYTREE_KIT_REQUIRE_C=1" in lines[0]
    assert "for the C engine, install a wheel" in lines[0]
    why = lines[0].split("could not be built (", 1)[1].split("); installing", 1)[0]
    assert "no-such-cc" in why
    (wheel,) = (tmp_path / "dist").glob("pytree_kit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pytree_kit/_pure.py" in names and not [n for n in names if n.endswith(".so")]
    # pip shows a build's output only with -v: the install keeps why, for the engine
    assert zipfile.ZipFile(wheel).read("pytree_kit/_speedups.not-built.txt").decode().strip() == why
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # -S: no site-packages, so nothing but the unpacked wheel provides pytree_kit
    code = (
        f"import sys; sys.path.insert(0, {str(site)!r}); import pytree_kit as pk; "
        "import pytree_kit; "  # a second import: still one warning
        "info = pk.engine_info(); print(info['engine'], '|', info['reason']); "
        "assert pk.__file__.startswith(sys.path[0]); "
        "assert pk.unflatten(*pk.flatten([1, {'a': 2}])[::-1]) == [1, {'a': 2}]"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTREE_KIT")}

    def run(**more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-S", "-c", code],
            capture_output=True,
            text=True,
            env=dict(env, **more),
            timeout=60,
        )

    out = run()
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"python | the C extension was not built at install ({why})"
    warned = [line for line in out.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1, out.stderr
    assert f"pytree_kit: the C extension was not built at install ({why})" in warned[0]
    assert "install a wheel of pytree_kit" in warned[0] and "PYTREE_KIT_PURE=1" in warned[0]
    # choosing the pure engine says so, and silences the warning
    out = run(PYTREE_KIT_PURE="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "python | PYTREE_KIT_PURE=1 is set"
    assert "Warning" not in out.stderr, out.stderr
    # with no note (an implementation the extension is not built for), no warning
    (site / "pytree_kit" / "_speedups.not-built.txt").unlink()
    out = run()
    assert out.returncode == 0 and "Warning" not in out.stderr, out.stderr
    assert out.stdout.strip() == (
        "python | the C extension is not installed (it was not built: no C compiler at install time, or not CPython)"
    )


def test_require_c_makes_a_failed_build_an_error(ci: Any, tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    proc = _wheel_without_compiler(ci, tmp_path, PYTREE_KIT_REQUIRE_C="1")
    assert proc.returncode != 0
    assert "no-such-cc" in proc.stdout + proc.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))


# -- the test dependencies on each declared Python --------------------------------


def _applies(requirement: Any, version: str) -> bool:
    """Whether a requirement (or pin) applies on CPython version '3.X' on Linux."""
    env = {"python_version": version, "python_full_version": f"{version}.0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "sys_platform": "linux", "platform_system": "Linux", "extra": ""}  # fmt: skip
    return requirement.marker is None or requirement.marker.evaluate(env)


def test_every_pin_applies_once_on_each_declared_python(ci: Any) -> None:
    """constraints.txt pins each package once on each declared Python (a
    second pin for 3.10 or 3.15 has a marker that the main one excludes): no
    Python with two pins of a package, and none without one (but where a
    package is a backport for 3.10 alone, as tomli is)."""
    requirements = pytest.importorskip("packaging.requirements")
    utils = pytest.importorskip("packaging.utils")
    pins: dict = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pin = requirements.Requirement(line)
            specs = list(pin.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", line
            pins.setdefault(utils.canonicalize_name(pin.name), []).append(pin)
    assert {"numpy", "jax", "jaxlib", "optree", "hypothesis", "attrs"} <= set(pins)
    wrong = []
    for name, those in sorted(pins.items()):
        count = {v: sum(_applies(p, v) for p in those) for v in ci.VERSIONS}
        backport = [v for v, n in count.items() if n] == [ci.VERSIONS[0]]
        wrong += [(name, v, n) for v, n in count.items() if n > 1 or (n == 0 and not backport)]
    assert not wrong, f"(package, Python, pins that apply there): {wrong}"


#: the test extra's peers (the tests that need one skip without it): every
#: declared Python gets each, but dm-tree, which has no wheel for 3.15 (its
#: sdist fetches abseil and pybind11 from the network at build time)
PEERS_NOT_ON = {"attrs": (), "numpy": (), "jax": (), "jaxlib": (), "optree": (),
                "dm-tree": ("3.15",)}  # fmt: skip


@pytest.mark.parametrize("extra", ["test", "bench"])
def test_the_test_extras_install_every_peer_that_has_a_wheel(ci: Any, extra: str) -> None:
    """The test extra (and the benchmarks') installs each peer on every declared
    Python but where it has no wheel: a peer left out by a marker by mistake
    would only make its tests skip."""
    requirements = pytest.importorskip("packaging.requirements")
    deps = _pyproject()["project"]["optional-dependencies"][extra]
    listed = {r.name: r for r in map(requirements.Requirement, deps)}
    peers = [name for name in PEERS_NOT_ON if name in listed]
    assert set(peers) >= ({*PEERS_NOT_ON} if extra == "test" else {"jax", "optree", "dm-tree"})
    for name in peers:
        not_on = [v for v in ci.VERSIONS if not _applies(listed[name], v)]
        assert not_on == list(PEERS_NOT_ON[name]), (extra, name, not_on)


def _root_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("_root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_docstring_example_names_the_missing_peers_it_imports(monkeypatch: Any) -> None:
    """The root conftest.py skips a docstring example that imports a peer that
    is not installed (jax_rules' imports jax); it reads the example's imports."""
    import doctest

    conftest = _root_conftest()
    text = (
        ">>> import jax, pytree_kit as pk\n>>> from numpy.linalg import norm\n"
        ">>> import os.path\n>>> from . import sibling\n>>> import optree as ot\n"
    )
    examples = doctest.DocTestParser().get_examples(text)
    absent = {"jax", "numpy", "os", "optree"}
    # (a stand-in for a module spec: whatever is installed here)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in absent else object()
    )
    # os is no peer: an example importing a missing module that is not a peer fails
    assert conftest.missing_peers(examples) == ["jax", "numpy", "optree"]
    absent.clear()
    assert conftest.missing_peers(examples) == []


def test_a_docstring_example_of_a_missing_peer_skips_and_of_another_module_fails(
    tmp_path: Path,
) -> None:
    """The hook end to end, in a pytest run of its own: an example importing a
    missing peer is skipped with the reason; one importing a missing module
    that is no peer fails."""
    (tmp_path / "conftest.py").write_text(
        (ROOT / "conftest.py").read_text() + "\nPEERS = (*PEERS, 'pk_absent_peer')\n"
    )
    (tmp_path / "with_peer.py").write_text('"""\n>>> import pk_absent_peer\n"""\n')
    (tmp_path / "with_typo.py").write_text('"""\n>>> import pk_absent_module\n"""\n')
    (tmp_path / "fine.py").write_text('"""\n>>> import json\n>>> json.dumps(1)\n\'1\'\n"""\n')
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
         "--doctest-modules", "-o", "addopts=", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    out = proc.stdout
    assert "its examples import pk_absent_peer: not installed" in out, out
    assert "1 failed, 1 passed, 1 skipped" in out, out
    assert "with_typo.py" in out.split("short test summary info", 1)[0], out


#: where the docs state the supported Pythons as a range: page, the words before it
RANGES = {
    "README.md": "once a release is uploaded (CPython",
    "docs/index.md": "glibc 2.17 or newer) for CPython",
    "docs/compatibility.md": "core needs nothing but Python (",
    "docs/development.md": "one per Python (",
    "docs/reliability.md": "every supported Python,",
}
#: and as a list
LISTS = ("docs/development.md", "docs/reliability.md")


def _prose(page: str) -> str:
    """A page's text as read: whitespace runs made one space, and the
    ``<!--c:NAME-->`` markers of scripts/doc_constants.py taken out."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return " ".join(re.sub(r"<!--/?c(?::\w+)?-->", "", text).split())


def test_the_docs_name_every_declared_python(ci: Any) -> None:
    """The pages that say which Pythons are supported say the declared ones:
    the range from the first to the last, and the lists of all of them."""
    first, last = ci.VERSIONS[0], ci.VERSIONS[-1]
    listed = "CPython " + ", ".join(ci.VERSIONS[:-1]) + " and " + last
    for page, before in RANGES.items():
        text = _prose(page)
        found = re.findall(re.escape(before) + r" ?(3\.\d+) to (3\.\d+)", text)
        assert found and set(found) == {(first, last)}, (page, found)
    for page in LISTS:
        text = _prose(page)
        assert listed in text, (page, listed)
