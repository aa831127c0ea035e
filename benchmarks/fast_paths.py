"""What each layout-reading fast path buys over the portable core, in instructions.

The C engine's core reads through CPython's public API; each fast path that
reads CPython's own layouts (``pk.engine_info()["fast_paths"]``) is an add-on,
kept only where it buys at least 10 % on some family of the corpus
(``KEEP``) on the Python it runs on. This script measures that: it builds this
checkout's C engine once as it is and once without each fast path that is on
here (``PYTREE_KIT_WITHOUT=name``, in copies of the checkout), then counts
callgrind's instructions per call of the operations the path serves, on the
corpus's trees (seed 0, the first ``--sizes`` sizes of each family but the
named trees, stand-in leaves), with and without it. One process under
callgrind counts every case of a build, each between callgrind's client
requests (a small extension built for the run, ``CG_CTL``), after a
collection: it needs no symbol of the interpreter's, so a stripped one
(Debian's 3.14 and 3.15) counts as one with symbols does.

For each path the report gives, per family, the largest ratio of the build
without it to the build with it (above 1: the path saves that much), with the
tree and operation, and the verdict: kept (at least ``KEEP`` on some family)
or not.

    python benchmarks/fast_paths.py                      # build/benchmarks/python3.X/
    python benchmarks/fast_paths.py --paths dict_tables  # that path alone
    python benchmarks/fast_paths.py --record             # benchmarks/results/python3.X/
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _callgrind
import _output

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: a path is kept where it buys at least this on some family
KEEP = 1.10
#: the operations each path serves (what reads or makes what it reads)
SERVES: dict[str, tuple[str, ...]] = {
    "type_version_tags": ("flatten", "flatten_up_to"),
    "dict_reads": ("flatten", "flatten_up_to"),
    "dict_tables": ("unflatten",),
    "split_values": ("flatten", "flatten_up_to"),
    "odict_links": ("flatten", "flatten_up_to"),
}


def build(dest: Path, without: str) -> Path:
    """A copy of the checkout in dest, its C engine built in place without the
    named fast path ("" for none)."""
    sys.path.append(str(ROOT / "scripts"))  # after benchmarks/: its corpus.py, not scripts/corpus
    from ci import copy_checkout  # the tracked files and the untracked ones git does not ignore

    copy_checkout(dest)
    env = dict(os.environ, PYTREE_KIT_REQUIRE_C="1", PYTREE_KIT_WITHOUT=without)
    subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "-q"],
        cwd=dest,
        env=env,
        check=True,
        capture_output=True,
    )
    return dest


def fast_paths_on(checkout: Path) -> dict[str, bool]:
    code = "import pytree_kit as pk; print(pk.engine_info()['fast_paths'])"
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return eval(out.stdout)  # a dict of str and bool


#: a tiny extension for the counted process: callgrind's client requests,
#: so that one process counts every tree and operation of a build, each in a
#: dump of its own (a process under callgrind takes ~50 times longer to start)
CG_CTL = r"""
#include <Python.h>
#include <valgrind/callgrind.h>
static PyObject *zero(PyObject *m, PyObject *a) { CALLGRIND_ZERO_STATS; Py_RETURN_NONE; }
static PyObject *dump(PyObject *m, PyObject *name) {
    CALLGRIND_DUMP_STATS_AT(PyUnicode_AsUTF8(name)); Py_RETURN_NONE; }
static PyMethodDef M[] = {{"zero", zero, METH_NOARGS, ""}, {"dump", dump, METH_O, ""}, {0}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "cg_ctl", 0, -1, M};
PyMODINIT_FUNC PyInit_cg_ctl(void) { return PyModule_Create(&D); }
"""


def make_cg_ctl(where: Path) -> None:
    """Builds cg_ctl (CG_CTL) into where, with this Python."""
    (where / "cg_ctl.c").write_text(CG_CTL)
    (where / "setup_cg_ctl.py").write_text(
        "from setuptools import setup, Extension\n"
        "setup(name='cg_ctl', ext_modules=[Extension('cg_ctl', ['cg_ctl.c'])])\n"
    )
    subprocess.run(
        [sys.executable, "setup_cg_ctl.py", "-q", "build_ext", "--inplace"],
        cwd=where,
        check=True,
        capture_output=True,
    )


def child(pts: list, ops: list) -> None:
    """What the counted process runs: for each tree and operation, a warm
    call, a collection, then the stats zeroed, n calls, and a dump named by
    the case."""
    import gc

    import cg_ctl  # type: ignore[import-not-found]

    sys.path.insert(0, str(HERE))
    import instructions

    for family, size, variant in pts:
        for op in ops:
            tree = f"{family}:{size}:{variant}"
            n = instructions.calls_for("corpus", tree, 0)
            call, inputs = instructions.warm_call("corpus", tree, op, False, n)  # drawn, warmed
            # every build's window starts with the collector's counts at zero:
            # builds that measure other operations first would otherwise meet
            # a collection in other windows (one of the whole heap, in a
            # window of a few calls, made a path look 95x)
            gc.collect()
            cg_ctl.zero()
            for t in inputs:
                call(t)
            cg_ctl.dump(f"{family}|{size}|{variant}|{op}|{n}")


def count_all(checkout: Path, pts: list, ops: list, work: Path) -> dict:
    """Instructions per call of each (tree, op) with checkout's engine."""
    out = work / f"cg-{checkout.name}"
    out.mkdir()
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(checkout), str(work)]),
        PYTHONHASHSEED="0",
        FAST_PATHS_CASES=repr((pts, ops)),
    )
    script = checkout / "benchmarks" / "fast_paths.py"
    _callgrind.run(_callgrind.command(script, ["--child"], f"{out}/cg.%p"), env, checkout)
    got = {}
    for dump in out.iterdir():
        text = dump.read_text()
        desc = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.MULTILINE)
        total = _callgrind.TOTAL.search(text)
        if desc is None or total is None:
            continue
        family, size, variant, op, n = desc.group(1).split("|")
        got[((family, int(size), variant), op)] = int(total.group(1)) / int(n)
    return got


def points(sizes: int) -> list[tuple[str, int, str]]:
    sys.path.insert(0, str(HERE))
    import corpus

    out = []
    # (not the named trees: corpus.py makes them with real tensors where torch
    # is installed, whose lazy set-up ran in some builds' windows and not
    # others', 9,355 instructions a call in a fresh process against 1,064,631
    # here)
    for fam in corpus.FAMILIES:
        if fam.name == "named":
            continue
        for size, variant in fam.points[:sizes]:
            out.append((fam.name, size, variant))
    return out


def measure(paths: list[str], sizes: int, tmp: Path) -> tuple[dict, list]:
    full = build(tmp / "full", "")
    on = fast_paths_on(full)
    chosen = [p for p in paths if on.get(p)]
    builds = {p: build(tmp / p, p) for p in chosen}
    make_cg_ctl(tmp)
    pts = points(sizes)
    ops = sorted({op for p in chosen for op in SERVES[p]})
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = {"full": pool.submit(count_all, full, pts, ops, tmp)}
        for p in chosen:
            jobs[p] = pool.submit(count_all, builds[p], pts, list(SERVES[p]), tmp)
        got = {key: job.result() for key, job in jobs.items()}
    results = {}
    for p in chosen:
        rows: dict = {}
        for pt in pts:
            for op in SERVES[p]:
                without, with_ = got[p][(pt, op)], got["full"][(pt, op)]
                ratio = without / with_
                best = rows.get(pt[0])
                if best is None or ratio > best[0]:
                    rows[pt[0]] = (ratio, pt, op, without, with_)
        results[p] = rows
    off = [p for p in paths if not on.get(p)]
    return results, off


def _label(pt: tuple[str, int, str]) -> str:
    family, size, variant = pt
    return variant if family == "named" else f"{size:,}" + (f", {variant}" if variant else "")


def report(results: dict, off: list, sizes: int) -> str:
    lines = [
        f"# What each fast path buys over the portable core (CPython {platform.python_version()})",
        "",
        "<!-- benchmarks/fast_paths.py writes this file. -->",
        "",
        f"Made by `python benchmarks/fast_paths.py` on {platform.machine()}: callgrind's "
        "instructions per call in the engine's entry points, on the corpus's trees (seed 0, "
        f"the first {sizes} sizes of each family but the named trees, stand-in leaves), "
        "built with every fast path that is on here and without one of them at a time. "
        "A cell is the largest ratio without ÷ with over the family's trees and the "
        "operations the path serves. "
        f"A path is kept where some family reaches {KEEP:.2f}.",
        "",
    ]
    for p, rows in results.items():
        best = max(rows.values(), key=lambda r: r[0]) if rows else None
        verdict = "kept" if best is not None and best[0] >= KEEP else "**not kept**"
        lines += [
            f"## {p}: {verdict}"
            + (
                f" (at most {best[0]:.2f}×, {best[1][0]} {_label(best[1])}, {best[2]})"  # noqa: RUF001
                if best
                else ""
            ),
            "",
            "| family | without ÷ with | tree | op | without | with |",
            "|---|---:|---|---|---:|---:|",
        ]
        for family, (ratio, pt, op, without, with_) in rows.items():
            lines.append(
                f"| {family} | {ratio:.2f} | {_label(pt)} | {op} | {without:,.0f} | {with_:,.0f} |"
            )
        lines.append("")
    if off:
        lines += [f"Not on here (not measured): {', '.join(off)}.", ""]
    return "\n".join(lines)


def main(argv: Any = None) -> int:
    if argv is None and sys.argv[1:] == ["--child"]:
        pts, ops = eval(os.environ["FAST_PATHS_CASES"])  # tuples of str and int
        child(pts, ops)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default=",".join(SERVES), help="the fast paths to measure")
    parser.add_argument("--sizes", type=int, default=2, help="the first N sizes of each family")
    _output.add_arguments(parser, sub=_output.PYTHON)
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in SERVES]
    if unknown:
        parser.error(f"unknown fast paths: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="pytree_kit-fast-paths-") as tmp:
        results, off = measure(paths, args.sizes, Path(tmp))
    text = report(results, off, args.sizes)
    _output.write_report(args, "fast_paths.md", text, sub=_output.PYTHON)
    return 0


if __name__ == "__main__":
    sys.exit(main())
