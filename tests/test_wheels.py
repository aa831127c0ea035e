"""scripts/wheels.py's parts that need no build: the arm64 header rule and
Debian's header wrapper. (CI's wheel job runs the script itself, for 3.11
x86_64; the release runs every wheel.)"""

from __future__ import annotations

import doctest
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# scripts/wheels.py's parts: the same on every engine and Python (once: 3.11's
# C-engine job runs them)
pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def wheels() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("wheels", ROOT / "scripts" / "wheels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the lines configure finds differently on arm64 (SOABI_PLATFORM from 3.15), and
# lines it does not
X86 = """\
#define HAVE_GCC_ASM_FOR_X64 1
#define HAVE_GCC_ASM_FOR_X87 1
#define HAVE_GETRANDOM 1
/* #undef HAVE_USABLE_WCHAR_T */
#define PY_SUPPORT_TIER 1
#define SIZEOF_LONG 8
#define SOABI_PLATFORM "x86_64-linux-gnu"
#define _Py_HACL_CAN_COMPILE_VEC128 1
#define _Py_HACL_CAN_COMPILE_VEC256 1
"""
ARM64 = """\
/* #undef HAVE_GCC_ASM_FOR_X64 */
/* #undef HAVE_GCC_ASM_FOR_X87 */
#define HAVE_GETRANDOM 1
#define HAVE_USABLE_WCHAR_T 1
#define PY_SUPPORT_TIER 2
#define SIZEOF_LONG 8
#define SOABI_PLATFORM "aarch64-linux-gnu"
/* #undef _Py_HACL_CAN_COMPILE_VEC128 */
/* #undef _Py_HACL_CAN_COMPILE_VEC256 */
"""


def test_the_arm64_rule_changes_what_differs_and_nothing_else(wheels: Any) -> None:
    assert wheels.arm64_pyconfig(X86) == ARM64
    assert wheels.arm64_pyconfig(ARM64) == ARM64
    # a name that only contains one of them is left alone
    kept = "#define HAVE_GCC_ASM_FOR_X87_EXTRA 1\n#define PY_SUPPORT_TIER 10\n"
    assert wheels.arm64_pyconfig(kept) == kept


def test_debians_pyconfig_wrapper_is_followed(wheels: Any, tmp_path: Path) -> None:
    include = tmp_path / "usr" / "include" / "python3.13"
    include.mkdir(parents=True)
    real = tmp_path / "usr" / "include" / "x86_64-linux-gnu" / "python3.13"
    real.mkdir(parents=True)
    (real / "pyconfig.h").write_text(X86)
    (include / "pyconfig.h").write_text(
        "#if defined(__x86_64__)\n#  include <x86_64-linux-gnu/python3.13/pyconfig.h>\n#endif\n"
    )
    assert wheels.real_pyconfig(include) == X86
    # as scripts/python314.sh rewrites it: a path relative to the header
    (include / "pyconfig.h").write_text('#include "../x86_64-linux-gnu/python3.13/pyconfig.h"\n')
    assert wheels.real_pyconfig(include) == X86
    (include / "pyconfig.h").write_text(ARM64)  # pyenv's: the header itself
    assert wheels.real_pyconfig(include) == ARM64


def test_the_release_script_covers_every_declared_python(wheels: Any, ci: Any) -> None:
    assert wheels.VERSIONS == ci.VERSIONS
    assert set(wheels.ARCHES) == {"x86_64", "aarch64"}
    # the emulated tests are a subset of the core suite the x86_64 wheels run
    assert set(wheels.QEMU_TESTS) <= set(ci.ENGINE_TESTS)


def test_the_release_scripts_examples_run(wheels: Any) -> None:
    result = doctest.testmod(wheels)
    assert result.attempted > 0 and result.failed == 0


def _wheel(path: Path, head: list, body: str, licenses: bool = True) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pytree_kit-0.1.0.dist-info/METADATA", "\n".join(head) + "\n\n" + body)
        if licenses:
            z.writestr("pytree_kit-0.1.0.dist-info/licenses/LICENSE", "Apache")
    return path


def test_a_wheels_metadata_is_checked_for_what_an_index_shows(wheels: Any, tmp_path: Path) -> None:
    head = [
        "Metadata-Version: 2.4",
        "Name: pytree_kit",
        "License-Expression: Apache-2.0",
        "Requires-Python: >=3.10",
        "Description-Content-Type: text/markdown",
        *(f"Classifier: Programming Language :: Python :: {v}" for v in wheels.VERSIONS),
    ]
    ok = _wheel(tmp_path / "ok.whl", head, "# pytree_kit\n")
    assert wheels.check_metadata(ok, "# pytree_kit\n") == []
    assert wheels.check_metadata(ok, "# another README\n") == ["the README as its description"]
    no_314 = _wheel(tmp_path / "a.whl", head[:-1], "# pytree_kit\n", licenses=False)
    assert wheels.check_metadata(no_314, "# pytree_kit\n") == [
        f"Classifier: Programming Language :: Python :: {wheels.VERSIONS[-1]}",
        "the LICENSE file",
    ]


def test_a_wheel_that_is_not_a_release_build_is_named(wheels: Any, tmp_path: Path) -> None:
    import zipfile

    def wheel(name: str, so: bytes) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("pytree_kit/_speedups.cpython-311-x86_64-linux-gnu.so", so)
            z.writestr("pytree_kit/__init__.py", "__assert_fail")  # not an extension
        return path

    assert wheels.check_release_build(wheel("ok.whl", b"\x7fELF...PyInit__speedups")) == []
    debug = wheel("debug.whl", b"\x7fELF...__assert_fail...__ubsan_handle_add_overflow")
    assert wheels.check_release_build(debug) == [
        "pytree_kit/_speedups.cpython-311-x86_64-linux-gnu.so has __assert_fail",
        "pytree_kit/_speedups.cpython-311-x86_64-linux-gnu.so has __ubsan_handle",
    ]


def test_each_test_the_wheel_run_leaves_out_is_a_test_of_the_core_suite(wheels: Any) -> None:
    """NEEDS_CHECKOUT names tests that exist, in the files the wheel's run
    takes (ENGINE_TESTS): a renamed one would run there, and fail."""
    import ast

    for test in wheels.NEEDS_CHECKOUT:
        path, name = test.split("::")
        assert path in wheels.ENGINE_TESTS, test
        tree = ast.parse((ROOT / path).read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name in names, test


def test_the_free_threaded_header_rule_defines_py_gil_disabled_alone(wheels: Any) -> None:
    """ft_pyconfig turns a GIL build's pyconfig.h into the free-threaded one
    (configure's one difference, checked by --check-ft-rule), and refuses a
    header that has no undefined Py_GIL_DISABLED to define."""
    gil = "#define HAVE_GETRANDOM 1\n/* #undef Py_GIL_DISABLED */\n#define SIZEOF_LONG 8\n"
    ft = wheels.ft_pyconfig(gil)
    assert ft == "#define HAVE_GETRANDOM 1\n#define Py_GIL_DISABLED 1\n#define SIZEOF_LONG 8\n"
    with pytest.raises(SystemExit, match="Py_GIL_DISABLED"):
        wheels.ft_pyconfig(ft)  # already free-threaded: nothing to define
    assert set(wheels.FREE_THREADED_WHEELS) >= {"3.13t", "3.14t", "3.15t"}


def test_a_free_threaded_wheel_is_retagged_whole(wheels: Any, tmp_path: Path) -> None:
    """retag_free_threaded gives the cp3XYt name and WHEEL tag, RECORD's line
    of WHEEL made again (its hash and size those of the new bytes), and every
    other entry unchanged."""
    import base64
    import hashlib
    import zipfile

    info = "pytree_kit-0.1.0.dist-info"
    so = b"\x7fELF extension bytes"
    wheel_text = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp314-cp314-linux_x86_64\n"
    src = tmp_path / "pytree_kit-0.1.0-cp314-cp314-linux_x86_64.whl"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("pytree_kit/_speedups.cpython-314t-x86_64-linux-gnu.so", so)
        z.writestr(f"{info}/WHEEL", wheel_text)
        z.writestr(
            f"{info}/RECORD",
            f"pytree_kit/_speedups.cpython-314t-x86_64-linux-gnu.so,sha256=x,{len(so)}\n"
            f"{info}/WHEEL,sha256=old,{len(wheel_text)}\n{info}/RECORD,,\n",
        )
    out = wheels.retag_free_threaded(src, "314")
    assert out.name == "pytree_kit-0.1.0-cp314-cp314t-linux_x86_64.whl"
    assert not src.exists()
    with zipfile.ZipFile(out) as z:
        new_wheel = z.read(f"{info}/WHEEL")
        assert b"Tag: cp314-cp314t-linux_x86_64\n" in new_wheel
        assert b"cp314-cp314-" not in new_wheel
        assert z.read("pytree_kit/_speedups.cpython-314t-x86_64-linux-gnu.so") == so
        record = z.read(f"{info}/RECORD").decode().splitlines()
    digest = base64.urlsafe_b64encode(hashlib.sha256(new_wheel).digest()).rstrip(b"=").decode()
    assert f"{info}/WHEEL,sha256={digest},{len(new_wheel)}" in record
    assert record[0].endswith(f",sha256=x,{len(so)}") and record[-1] == f"{info}/RECORD,,"
    with pytest.raises(SystemExit, match="no cp313-cp313 wheel"):
        wheels.retag_free_threaded(out, "313")
