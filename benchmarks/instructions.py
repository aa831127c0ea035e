"""The C engine's cost in instructions, against a baseline checkout's.

Counts callgrind's instructions per call of flatten, unflatten, leaves,
tree_map, flatten_up_to, flatten_with_path and ``list(tree_iter(...))`` on
corpus.py's six named trees and a 500-key ``state_dict``, with this checkout's C
engine and with a baseline checkout's (``--baseline DIR``: a checkout of the
commit to compare with, its extension built in place for the same Python).
A noisy machine does not move the counts, so this is the check that a change
meant to cost nothing (a refactor, a split of files) costs nothing, and the
profile to read before optimising.

Each case runs in its own process under ``valgrind --tool=callgrind``, which
counts only inside ``functools.reduce`` (``--toggle-collect``): the N calls
run there, after the tree is built and one warm call is made. The hash seed
is fixed. Leaves are small stand-in objects, not tensors, so torch is not
imported.

    python benchmarks/instructions.py --baseline /tmp/base          # build/benchmarks/pythonX.Y/
    python benchmarks/instructions.py --baseline /tmp/base --record # benchmarks/results/...
    python benchmarks/instructions.py --baseline /tmp/base --n 20 --out /tmp/x
    python benchmarks/instructions.py --baseline /tmp/base --title "The split"
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import _output
from _callgrind import REDUCE, count_in_checkout

ROOT = Path(__file__).resolve().parent.parent
OPS = (
    "flatten",
    "unflatten",
    "leaves",
    "tree_map",
    "flatten_up_to",
    "flatten_with_path",
    "tree_iter",
)


class Leaf:
    """A leaf of a type the engine classifies once per call, as a tensor."""

    __slots__ = ()


def _stand_ins() -> dict[str, Any]:
    return {name: Leaf() for name in ("image", "boxes", "labels", "masks")}


def state_dict() -> dict[str, Any]:
    """A 500-key state_dict: its insertion order is not its sorted order."""
    names = ("attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.fc1.weight", "mlp.fc2.bias")
    return {f"layers.{i}.{name}": Leaf() for i in range(100) for name in names}


def trees() -> dict[str, Callable[[], Any]]:
    import corpus

    corpus._tensors = _stand_ins  # no torch in the counted processes
    made: dict[str, Callable[[], Any]] = {case.label: case.make for case in corpus.TREES}
    made["state_dict of 500"] = state_dict
    return made


def op(tree: str, name: str, n: int) -> None:
    """What one process under callgrind runs: the tree built and one warm
    call, then ``n`` calls, counted."""
    import pytree_kit as pk

    assert pk.ENGINE == "c", pk.engine_info()
    assert Path(pk.__file__).resolve().parent.parent == Path.cwd().resolve(), pk.__file__
    t = trees()[tree]()
    leaves, spec = pk.flatten(t)
    calls: dict[str, Callable[[], Any]] = {
        "flatten": lambda: pk.flatten(t),
        "unflatten": lambda: pk.unflatten(spec, leaves),
        "leaves": lambda: pk.leaves(t),
        "tree_map": lambda: pk.tree_map(id, t),
        "flatten_up_to": lambda: spec.flatten_up_to(t),
        "flatten_with_path": lambda: pk.flatten_with_path(t),
        "tree_iter": lambda: list(pk.tree_iter(t)),
    }
    call = calls[name]
    call()  # plans made, caches filled
    # only what runs inside functools.reduce is counted
    functools.reduce(lambda _, __: call(), range(n), None)


def instructions(checkout: Path, case: tuple[str, str], n: int, work: Path) -> int:
    tree, name = case
    out = work / f"{abs(hash((str(checkout), case)))}.out"
    args = ["--op", tree, name, str(n)]
    return count_in_checkout(__file__, args, checkout, toggles=REDUCE, out=out)


def calls_for(tree: str, n: int) -> int:
    return max(2, n // 20) if tree.startswith("(f)") else n


def measure(baseline: Path, n: int, only: list[str], only_trees: list[str]) -> list[dict]:
    cases = [
        (tree, name)
        for tree in trees()
        for name in OPS
        if (not only or name in only) and (not only_trees or any(t in tree for t in only_trees))
    ]
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {
            (where, case): pool.submit(instructions, where, case, calls_for(case[0], n), Path(tmp))
            for where in (ROOT, baseline)
            for case in cases
        }
        return [
            {
                "case": case,
                "now": runs[(ROOT, case)].result() / calls_for(case[0], n),
                "before": runs[(baseline, case)].result() / calls_for(case[0], n),
            }
            for case in cases
        ]


def commit(where: Path) -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True
    )
    return found.stdout.strip() or "?"


def report(rows: list[dict], n: int, baseline: Path, title: str) -> str:
    lines = [
        f"# {title}",
        "",
        f"Machine: {platform.machine()}; Python {platform.python_version()}.",
        "",
        f"Made by `python benchmarks/instructions.py --n {n}`: callgrind's instruction "
        f"counts of one call with the C engine of {commit(ROOT)} (now; its working tree) "
        f"and of {commit(baseline)} (before). Tree (f) is counted over {calls_for('(f)', n)} "
        "calls, the others over "
        f"{n}.",
        "",
        "| tree | op | before Ir | now Ir | now / before |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        tree, name = r["case"]
        lines.append(
            f"| {tree} | {name} | {r['before']:,.0f} | {r['now']:,.0f} | "
            f"{r['now'] / r['before']:.3f} |"
        )
    ratios = [r["now"] / r["before"] for r in rows]
    lines += ["", f"Ratios from {min(ratios):.3f} to {max(ratios):.3f}."]
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout built in place to compare with")
    parser.add_argument("--n", type=int, default=40, help="calls counted per process")
    _output.add_arguments(parser, sub=_output.PYTHON)
    parser.add_argument("--only", action="append", default=[], choices=OPS, help="these ops")
    parser.add_argument(
        "--tree", action="append", default=[], help="the trees whose label has this text"
    )
    parser.add_argument("--title", default="The C engine in instructions, now and before")
    parser.add_argument("--name", default="instructions.md", help="the report's file name")
    parser.add_argument("--op", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.op:
        tree, name, n = args.op
        op(tree, name, int(n))
        return 0
    if args.baseline is None:
        parser.error("--baseline is required")
    # this checkout's pytree_kit, whatever the environment has installed
    sys.path.insert(0, str(ROOT))
    base = args.baseline.resolve()
    text = report(measure(base, args.n, args.only, args.tree), args.n, base, args.title)
    print(text)
    out = _output.folder(args, sub=_output.PYTHON)
    (out / args.name).write_text(text, encoding="utf-8")
    _output.wrote(out / args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
