#!/usr/bin/env python3
"""The torch matrix: pytree_kit's torch adapters on every supported torch.

    python3 scripts/torch_matrix.py                      # the whole matrix (hours, ~5 GB a venv)
    python3 scripts/torch_matrix.py --torch 2.9 --torch 2.15
    python3 scripts/torch_matrix.py --python 3.13 --torch 2.15
    python3 scripts/torch_matrix.py --table              # the docs table from the recorded results

For each cell (a Python, a torch minor) it makes a virtual environment in a
temporary folder, installs that torch from the package registry with the test
dependencies (``PIP_CONSTRAINT=/dev/null``: the machine's own pip constraint
caps torch at its local CPU wheel; pip's cache is kept, so a second run
downloads nothing), builds pytree_kit's C engine in a copy of the checkout
(``PYTREE_KIT_REQUIRE_C=1``, ``-Werror``), runs the torch test files there
(``TEST_FILES``) with ``--junitxml``, counts each test under its feature
(``feature_of``), records the cell in ``benchmarks/results/torch_matrix.json``
and deletes the venv. Then it writes the table (``render``) into
``docs/compatibility.md`` between its markers; ``tests/test_torch_matrix.py``
checks that the page is what the recorded results give.

Run it after any change to code torch.compile traces (``_pure``, ``_spec``,
``_kinds``, ``_dynamo``) or to the torch adapters (docs/development.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from ci import VERSIONS, copy_checkout, find_python  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "torch_matrix.json"
PAGE = ROOT / "docs" / "compatibility.md"
BEGIN, END = "<!-- torch-matrix:begin -->", "<!-- torch-matrix:end -->"

#: every supported torch minor and the release of it the matrix installs
TORCH = {
    "2.9": "2.9.1",
    "2.10": "2.10.0",
    "2.11": "2.11.0",
    "2.12": "2.12.1",
    "2.13": "2.13.0",
    "2.14": "2.14.1",
    "2.15": "2.15.0",
}
#: the cells of a full run: every minor on 3.11, the newest on 3.13
DEFAULT_CELLS = [("3.11", minor) for minor in TORCH] + [("3.13", "2.15")]
TEST_FILES = (
    "tests/test_dynamo.py",
    "tests/torch/test_tracing.py",
    "tests/torch/test_loading.py",
    "tests/torch/test_collate.py",
    "tests/torch/test_transfer.py",
    "tests/torch/test_packed.py",
    "tests/torch/test_distributed.py",
    "tests/torch/test_checkpoint.py",
)
FEATURES = (
    "torch.compile",
    "torch.export",
    "jit.trace",
    "collate, pin_memory, to_device",
    "PackedList with workers",
    "DDP and tree collectives",
    "checkpoint",
)
#: the test dependencies a cell installs beside torch (tensordict and
#: transformers at the newest release that takes that torch)
DEPENDENCIES = ("pytest", "pytest-timeout", "hypothesis", "attrs", "numpy", "optree",
                "transformers", "tensordict", "setuptools>=77")  # fmt: skip


def feature_of(nodeid: str) -> str:
    """The feature a test of ``TEST_FILES`` counts under.

    Examples:
        >>> feature_of("tests/torch/test_tracing.py::test_export_strict_mode")
        'torch.export'
        >>> feature_of("tests/torch/test_tracing.py::test_program_matches_eager")
        'jit.trace'
        >>> feature_of("tests/torch/test_collate.py::test_x[a]")
        'collate, pin_memory, to_device'
    """
    path, _, name = nodeid.partition("::")
    by_file = {
        "tests/test_dynamo.py": "torch.compile",
        "tests/torch/test_loading.py": "collate, pin_memory, to_device",
        "tests/torch/test_collate.py": "collate, pin_memory, to_device",
        "tests/torch/test_transfer.py": "collate, pin_memory, to_device",
        "tests/torch/test_packed.py": "PackedList with workers",
        "tests/torch/test_distributed.py": "DDP and tree collectives",
        "tests/torch/test_checkpoint.py": "checkpoint",
    }
    if path == "tests/torch/test_tracing.py":
        return "torch.export" if "export" in name else "jit.trace"
    if path not in by_file:
        raise ValueError(f"{nodeid}: not a test of the matrix's files")
    return by_file[path]


def read_junit(xml_text: str) -> dict:
    """``{feature: {"passed", "failed", "skipped", "failures": [nodeid, ...]}}``
    from pytest's junit XML (an error counts as a failure)."""
    out: dict = {f: {"passed": 0, "failed": 0, "skipped": 0, "failures": []} for f in FEATURES}
    for case in ET.fromstring(xml_text).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        nodeid = f"{module}.py::{case.get('name')}"
        cell = out[feature_of(nodeid)]
        if case.find("failure") is not None or case.find("error") is not None:
            cell["failed"] += 1
            cell["failures"].append(nodeid)
        elif case.find("skipped") is not None:
            cell["skipped"] += 1
        else:
            cell["passed"] += 1
    return out


def render(results: dict) -> str:
    """The compatibility table: a row per cell, a column per feature, each
    ``passed / run`` (run: passed and failed; skips are counted apart)."""
    cells = sorted(results.values(), key=lambda r: (r["python"], _minor_key(r["torch"])))
    head = "| Python | torch | " + " | ".join(FEATURES) + " |"
    lines = [head, "|" + "---|" * (len(FEATURES) + 2)]
    for r in cells:
        row = [r["python"], r["torch"]]
        for f in FEATURES:
            c = r["features"][f]
            run = c["passed"] + c["failed"]
            mark = "" if c["failed"] == 0 and run else " ✗"
            row.append(f"{c['passed']} / {run}{mark}")
        lines.append("| " + " | ".join(row) + " |")
    skipped = {f"{r['python']}/{r['torch']}": sum(c["skipped"] for c in r["features"].values())
               for r in cells}  # fmt: skip
    lines.append("")
    lines.append(
        "Skipped tests (CUDA-only checks on a machine without a GPU, and the like), per row: "
        + ", ".join(f"{k} {v}" for k, v in skipped.items())
        + "."
    )
    return "\n".join(lines)


def render_grid(results: dict) -> str:
    """The versions table of the install sections: a row per supported
    Python, a column per torch minor, ✓ where every test passed, ✗ where one
    failed, · where the matrix has not run that pair."""
    seen: dict = {}
    for r in results.values():
        py = ".".join(r["python"].split(".")[:2])
        minor = ".".join(r["torch"].split(".")[:2])
        failed = sum(c["failed"] for c in r["features"].values())
        run = sum(c["passed"] + c["failed"] for c in r["features"].values())
        seen[(py, minor)] = "✗" if failed or not run else "✓"
    lines = ["| Python | " + " | ".join(f"torch {m}" for m in TORCH) + " |"]
    lines.append("|---|" + ":-:|" * len(TORCH))
    for py in VERSIONS:
        lines.append(f"| {py} | " + " | ".join(seen.get((py, m), "·") for m in TORCH) + " |")
    lines.append("")
    lines.append(
        "✓ every torch test passed, ✗ some failed, · not run by the matrix yet "
        "([Compatibility](COMPAT) has the tests per feature). The core needs no "
        "torch and is tested on every Python listed."
    )
    return "\n".join(lines)


def _minor_key(version: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


#: the versions table's places: each page, and the link to Compatibility from it
GRID_PAGES = {
    ROOT / "README.md": "docs/compatibility.md",
    ROOT / "docs" / "index.md": "compatibility.md",
    PAGE: "#what-runs-where",
}
GRID_BEGIN, GRID_END = "<!-- torch-grid:begin -->", "<!-- torch-grid:end -->"


def between(text: str, begin: str, end: str, body: str) -> str:
    """text with what lies between the markers begin and end replaced by body."""
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + body + "\n" + text[stop:]


def pages_for(results: dict) -> dict:
    """{page: the text it should have}: the table on the compatibility page,
    the versions table on each of GRID_PAGES."""
    out = {PAGE: between(PAGE.read_text(), BEGIN, END, render(results))}
    for page, link in GRID_PAGES.items():
        text = out.get(page, page.read_text())
        grid = render_grid(results).replace("(COMPAT)", f"({link})")
        out[page] = between(text, GRID_BEGIN, GRID_END, grid)
    return out


def write_page(results: dict) -> bool:
    """Put the tables into their pages between their markers; whether one changed."""
    changed = False
    for page, new in pages_for(results).items():
        if new != page.read_text():
            page.write_text(new)
            changed = True
    return changed


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def save(results: dict) -> None:
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def sh(cmd: list, log, **kw) -> None:
    log.write(f"\n$ {' '.join(map(str, cmd))}\n")
    log.flush()
    proc = subprocess.run([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, **kw)
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} ... exited with {proc.returncode}")


def checkout_commit() -> str:
    """HEAD's short hash, with "-dirty" when the copied files differ from it
    (other than in what this script writes: the results and the page)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    ours = [f":!{p.relative_to(ROOT)}" for p in (RESULTS, PAGE, *GRID_PAGES)]
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", ".", *ours], capture_output=True, text=True
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_cell(python_version: str, minor: str, logdir: Path) -> Optional[dict]:
    """One cell: a venv, that torch, the tests. The venv is deleted after."""
    python = find_python(python_version)
    if python is None:
        print(f"torch_matrix: no Python {python_version}; cell skipped", flush=True)
        return None
    release = TORCH[minor]
    logp = logdir / f"py{python_version}-torch{minor}.log"
    print(f"torch_matrix: Python {python_version}, torch {release} (log: {logp})", flush=True)
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix=f"torch-matrix-{minor}-") as tmp,
        open(logp, "w") as log,
    ):
        venv, src = Path(tmp) / "venv", Path(tmp) / "src"
        copy_checkout(src)
        commit = checkout_commit()
        sh([python, "-m", "venv", venv], log)
        py = venv / "bin" / "python"
        env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}
        sh([py, "-m", "pip", "install", "-q", f"torch=={release}", *DEPENDENCIES], log, env=env)
        build = {**os.environ, "PYTREE_KIT_REQUIRE_C": "1", "PYTREE_KIT_CFLAGS": "-Werror"}
        sh([py, "setup.py", "-q", "build_ext", "--inplace"], log, env=build, cwd=src)
        versions = subprocess.run(
            [py, "-c", "import torch, pytree_kit as pk, platform; "
             "print(torch.__version__, pk.ENGINE, platform.python_version())"],
            capture_output=True, text=True, cwd=src, check=True,
        ).stdout.split()  # fmt: skip
        junit = Path(tmp) / "junit.xml"
        test_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.run(
            [py, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
             "-o", "addopts=-ra --strict-markers", *TEST_FILES],
            cwd=src, env=test_env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        if not junit.exists():
            raise RuntimeError(f"pytest exited with {proc.returncode} and wrote no report")
        features = read_junit(junit.read_text())
    cell = {
        "python": versions[2],
        "torch": versions[0].split("+")[0],
        "torch_build": versions[0],
        "engine": versions[1],
        "commit": commit,
        "seconds": round(time.monotonic() - t0),
        "features": features,
    }
    failed = sum(c["failed"] for c in features.values())
    print(f"torch_matrix:   {failed} failed, {cell['seconds']} s", flush=True)
    return cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", action="append", choices=list(TORCH), help="only these minors")
    parser.add_argument("--python", action="append", help="only these Pythons (3.X)")
    parser.add_argument("--table", action="store_true", help="only rewrite the docs table")
    args = parser.parse_args()
    results = load()
    if not args.table:
        cells = [
            (p, m)
            for p, m in DEFAULT_CELLS + [(p, m) for p in (args.python or []) for m in TORCH]
            if (args.torch is None or m in args.torch) and (args.python is None or p in args.python)
        ]
        logdir = ROOT / "build" / "torch-matrix"
        logdir.mkdir(parents=True, exist_ok=True)
        for p, m in dict.fromkeys(cells):
            cell = run_cell(p, m, logdir)
            if cell is not None:
                results[f"{p}/{m}"] = cell
                save(results)
    changed = write_page(results)
    print(f"torch_matrix: {PAGE.relative_to(ROOT)} {'rewritten' if changed else 'unchanged'}")
    bad = [k for k, r in results.items() if any(c["failed"] for c in r["features"].values())]
    if bad:
        print(f"torch_matrix: failures in {', '.join(sorted(bad))}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
