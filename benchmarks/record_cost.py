"""The cost of the C engine's check that a record keeps no state outside its fields.

Counts callgrind's instructions for flatten, leaves, tree_map and
flatten_up_to on trees of dataclass and attrs records, with this checkout's
C engine and with a baseline checkout's (``--baseline DIR``: a checkout of
the commit to compare with, its extension built in place for the same
Python). A noisy machine does not move the counts. Each case runs in its own
process under ``valgrind --tool=callgrind``, which counts only inside
``functools.reduce`` (``--toggle-collect``): the N calls run there, after the
trees are built and one warm call is made. The hash seed is fixed.

"Same" trees are flattened again and again, as a benchmark does; "fresh"
ones are new instances each call, as batches from a loader are (on 3.12 and
3.13 the engine makes each one's ``__dict__``, as ``vars()`` would, the
first time it reads it).

    python benchmarks/record_cost.py --baseline /tmp/base   # build/benchmarks/pythonX.Y/
    python benchmarks/record_cost.py --baseline /tmp/base --record   # benchmarks/results/...
    python benchmarks/record_cost.py --baseline /tmp/base --n 20 --out /tmp/x
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _output
import attrs
from _callgrind import REDUCE, count_in_checkout
from corpus import Batch, Meta, Target  # tree (e)'s classes

ROOT = Path(__file__).resolve().parent.parent
OPS = ("flatten", "leaves", "tree_map", "flatten_up_to")


class Tensor:
    """A leaf of a type the engine classifies once per call, as a tensor."""

    __slots__ = ()


@dataclasses.dataclass(slots=True)
class SlotRecord:
    x: Any
    y: Any
    z: Any


@attrs.define
class AttrsRecord:
    x: Any
    y: Any
    z: Any


@dataclasses.dataclass
class WithDefaults:
    x: Any
    mask: Any = None
    weight: Any = 1.0


def batch() -> Any:
    """The named tree (e) (corpus.py), with stand-in tensors."""
    return Batch(
        images=[Tensor() for _ in range(4)],
        targets=[Target(Tensor(), Tensor(), Tensor()) for _ in range(4)],
        meta=Meta(epoch=3, step=1200, lr=0.1, seed=7),
    )


TREES = {
    "dataclass batch (corpus.py's (e))": batch,
    "100 dataclass records": lambda: [Target(Tensor(), i, None) for i in range(100)],
    "100 dataclass records with None defaults": lambda: [
        WithDefaults(Tensor()) for _ in range(100)
    ],
    "100 slotted dataclass records": lambda: [SlotRecord(Tensor(), i, None) for i in range(100)],
    "100 attrs records (slotted)": lambda: [AttrsRecord(Tensor(), i, None) for i in range(100)],
}


def op(tree: str, name: str, fresh: bool, n: int) -> None:
    """What one process under callgrind runs: the trees built and one warm
    call, then ``n`` calls (each on its own tree when fresh), counted."""
    import pytree_kit as pk

    assert pk.ENGINE == "c", pk.engine_info()
    assert Path(pk.__file__).resolve().parent.parent == Path.cwd().resolve(), pk.__file__
    make = TREES[tree]
    trees = [make() for _ in range(n + 1)] if fresh else [make()] * (n + 1)
    spec = pk.structure(make())
    calls = {
        "flatten": pk.flatten,
        "leaves": pk.leaves,
        "tree_map": lambda t: pk.tree_map(id, t),
        "flatten_up_to": spec.flatten_up_to,
    }
    call = calls[name]
    call(trees[0])  # plans made, caches filled
    # only what runs inside functools.reduce is counted
    functools.reduce(lambda _, t: call(t), trees[1:], None)


def instructions(checkout: Path, case: tuple, n: int, work: Path) -> int:
    tree, name, fresh = case
    out = work / f"{abs(hash((str(checkout), case)))}.out"
    args = ["--op", tree, name, "fresh" if fresh else "same", str(n)]
    return count_in_checkout(__file__, args, checkout, toggles=REDUCE, out=out)


def measure(baseline: Path, n: int) -> list[dict]:
    cases = [(tree, name, fresh) for tree in TREES for name in OPS for fresh in (False, True)]
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {
            (where, case): pool.submit(instructions, where, case, n, Path(tmp))
            for where in (ROOT, baseline)
            for case in cases
        }
        return [
            {
                "case": case,
                "now": runs[(ROOT, case)].result() / n,
                "before": runs[(baseline, case)].result() / n,
            }
            for case in cases
        ]


def commit(where: Path) -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True
    )
    return found.stdout.strip() or "?"


def report(rows: list[dict], n: int, baseline: Path) -> str:
    lines = [
        "# The check for state outside a record's fields, in instructions",
        "",
        f"Machine: {platform.machine()}; Python {platform.python_version()}.",
        "",
        f"Made by `python benchmarks/record_cost.py --n {n}`: callgrind's instruction counts "
        f"of one call with the C engine of {commit(ROOT)} (now; its working tree) and of "
        f"{commit(baseline)} (before). Same: one tree, again and again; fresh: new "
        "instances each call.",
        "",
        "| tree | op | trees | before Ir | now Ir | ratio |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        tree, name, fresh = r["case"]
        ratio = r["now"] / r["before"]
        lines.append(
            f"| {tree} | {name} | {'fresh' if fresh else 'same'} | {r['before']:,.0f} | "
            f"{r['now']:,.0f} | {ratio:.3f} |"
        )
    ratios = [r["now"] / r["before"] for r in rows]
    lines += ["", f"Ratios from {min(ratios):.3f} to {max(ratios):.3f}."]
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout built in place to compare with")
    parser.add_argument("--n", type=int, default=50, help="calls counted per process")
    _output.add_arguments(parser, sub=_output.PYTHON)
    parser.add_argument("--op", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.op:
        tree, name, fresh, n = args.op
        op(tree, name, fresh == "fresh", int(n))
        return 0
    if args.baseline is None:
        parser.error("--baseline is required")
    text = report(measure(args.baseline.resolve(), args.n), args.n, args.baseline.resolve())
    print(text)
    out = _output.folder(args, sub=_output.PYTHON)
    (out / "record_cost.md").write_text(text, encoding="utf-8")
    _output.wrote(out / "record_cost.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
