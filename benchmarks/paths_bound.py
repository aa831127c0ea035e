"""spec.paths() against optree's, in instructions: the first call on a spec,
the later ones, and the bound on the first.

A path names each step with a key object (``DictKey``, ``SequenceKey``,
``GetAttrKey``: pytree_kit/_keys.py), where optree's paths hold the raw keys.
The first ``paths()`` of a spec makes those objects, one per distinct step
(a dict node's keys once per tuple of names, ``SequenceKey(i)`` once per i
and call), and the caller frees them with the paths; later calls copy the
list the spec keeps. This script counts, with callgrind, per leaf:

- optree's ``TreeSpec.paths()``, whole;
- pytree_kit's first call (what ``paths()`` runs on a spec on which it was
  never called: the engine's ``spec_paths``);
- of that, making and freeing the key objects alone (``pk_key`` and
  ``subtype_dealloc``, counted by themselves in a run of n calls less one of
  none);
- pytree_kit's later calls.

The garbage collector is off while counting (for every variant alike), so
that no collection's cost lands in whichever allocation happened to start it.

Where the key objects alone cost more than optree's whole call, no first call
can match optree's: that is the bound. Trees are benchmarks/algebra.py's.

    python benchmarks/paths_bound.py            # build/benchmarks/pythonX.Y/paths_bound.md
    python benchmarks/paths_bound.py --record   # benchmarks/results/pythonX.Y/paths_bound.md
    python benchmarks/paths_bound.py --n 20 --out /tmp/x
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import gc
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _output
from instructions import ROOT, count_instructions

TREES = ("sd", "cfg", "rec", "chain")
WHICH = ("optree", "first", "later")
KEYS = ("pk_key", "subtype_dealloc")


def op(which: str, tree: str, n: int) -> None:
    """What one process under callgrind runs: one warm call, then n calls."""
    import algebra

    import pytree_kit as pk

    assert pk.ENGINE == "c", pk.engine_info()
    t = algebra.TREES[tree][1]()
    spec = pk.structure(t)
    call: Callable[[], Any]
    if which == "optree":
        import optree

        call = optree.tree_structure(t, none_is_leaf=False).paths
    elif which == "first":
        # what paths() runs on a spec it has not been called on
        from pytree_kit._engine import impl

        call = functools.partial(impl.spec_paths, spec._nodes)
    else:
        call = spec.paths
    call()
    # no collection inside the count, for every variant: where one starts
    # depends on what else was allocated before, and the key objects' share
    # would take the whole of one that starts in their allocation
    gc.collect()
    gc.disable()
    functools.reduce(lambda _, __: call(), range(n), None)


def count(which: str, tree: str, n: int, work: Path, toggles: tuple[str, ...] = ()) -> int:
    out = work / f"{which}-{tree}-{n}-{len(toggles)}.out"
    args = ["--op", which, tree, str(n)]
    if toggles:
        return count_instructions(__file__, args, ROOT, out, toggles)
    return count_instructions(__file__, args, ROOT, out)


def measure(n: int) -> list[dict]:
    import algebra

    import pytree_kit as pk

    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        work = Path(tmp)
        runs = {
            (which, tree): pool.submit(count, which, tree, n, work)
            for tree in TREES
            for which in WHICH
        }
        keys = {
            (tree, k): pool.submit(count, "first", tree, k, work, KEYS)
            for tree in TREES
            for k in (0, n)
        }
        rows = []
        for tree in TREES:
            leaves = pk.structure(algebra.TREES[tree][1]()).num_leaves
            per = {which: runs[(which, tree)].result() / n / leaves for which in WHICH}
            per["keys"] = (keys[(tree, n)].result() - keys[(tree, 0)].result()) / n / leaves
            rows.append({"tree": algebra.TREES[tree][0], "leaves": leaves, **per})
        return rows


def report(rows: list[dict], n: int) -> str:
    lines = [
        "# spec.paths() against optree, in instructions",
        "",
        f"Machine: {platform.machine()}; Python {platform.python_version()}.",
        "",
        f"Made by `python benchmarks/paths_bound.py --n {n}`: callgrind's instructions per "
        'leaf, over n calls (see the script\'s docstring). "keys" is the part of the first '
        "call spent making and freeing the key objects; the bound is optree's whole call "
        "over that part: no first call that makes them can be faster than optree by more.",
        "",
        "| tree | leaves | optree | first call | of which keys | later calls | "
        "first: optree / ours | bound: optree / keys | later: optree / ours |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tree']} | {r['leaves']} | {r['optree']:,.0f} | {r['first']:,.0f} | "
            f"{r['keys']:,.0f} | {r['later']:,.0f} | {r['optree'] / r['first']:.2f} | "
            f"{r['optree'] / r['keys']:.2f} | {r['optree'] / r['later']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="calls counted per process")
    _output.add_arguments(parser, sub=_output.PYTHON)
    parser.add_argument("--op", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.op:
        which, tree, n = args.op
        op(which, tree, int(n))
        return 0
    text = report(measure(args.n), args.n)
    out = _output.folder(args, sub=_output.PYTHON)
    (out / "paths_bound.md").write_text(text)
    print(text)
    _output.wrote(out / "paths_bound.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
