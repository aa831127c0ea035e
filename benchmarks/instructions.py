"""The C engine's cost in instructions, this checkout's against a baseline's, on three tree sets.

Counts callgrind's instructions per call, which a noisy machine does not
move: the check that a change meant to cost nothing (a refactor, a split of
files) costs nothing, and the profile to read before optimising. With
``--baseline DIR`` (a checkout of the commit to compare with, its extension
built in place for the same Python) each case is counted in both. The sets
(``--trees``):

- ``named`` (the default): flatten, unflatten, leaves, tree_map,
  flatten_up_to, flatten_with_path and ``list(tree_iter(...))`` on corpus.py's
  six named trees and a 500-key ``state_dict``; ``instructions.md``;
- ``records``: flatten, leaves, tree_map and flatten_up_to on trees of
  dataclass and attrs records, the cost of the check that a record keeps no
  state outside its fields. "Same" trees are flattened again and again, as a
  benchmark does; "fresh" ones are new instances each call, as batches from a
  loader are (on 3.12 and 3.13 the engine makes each one's ``__dict__``, as
  ``vars()`` would, the first time it reads it); ``record_cost.md``;
- ``corpus``: every tree of ``benchmarks/corpus.py`` (seed 0; ``--family``
  picks some), 3 calls for trees of 1,000 or more units and the named tree
  (f), 10 for the others. Without ``--only``: flatten_up_to against our own
  flatten (its target: 1.5 times flatten), now and, with a baseline, before
  (``instructions_up_to.md``); with ``--only OP`` and a baseline, that one
  operation before and now (``instructions_OP.md``).

Each case runs in its own process under ``valgrind --tool=callgrind``, which
counts only inside ``functools.reduce`` (``--toggle-collect``): the calls run
there, after the tree is built and one warm call is made. The hash seed is
fixed. Leaves are small stand-in objects, not tensors, so torch is not
imported.

    python benchmarks/instructions.py --baseline /tmp/base          # build/benchmarks/pythonX.Y/
    python benchmarks/instructions.py --baseline /tmp/base --record # benchmarks/results/...
    python benchmarks/instructions.py --baseline /tmp/base --n 20 --out /tmp/x
    python benchmarks/instructions.py --baseline /tmp/base --title "The split"
    python benchmarks/instructions.py --baseline /tmp/base --trees records --record
    python benchmarks/instructions.py --trees corpus --family none --family dataclass
    python benchmarks/instructions.py --trees corpus --baseline /tmp/base --only unflatten
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
from typing import Any, Callable, Optional

import _output
from _callgrind import REDUCE, count_in_checkout

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OPS = (
    "flatten",
    "unflatten",
    "leaves",
    "tree_map",
    "flatten_up_to",
    "flatten_with_path",
    "tree_iter",
)
#: the operations each set counts (corpus: without --only)
SET_OPS = {
    "named": OPS,
    "records": ("flatten", "leaves", "tree_map", "flatten_up_to"),
    "corpus": ("flatten", "flatten_up_to"),
}
#: the operations --only may name on the corpus
CORPUS_OPS = ("flatten", "unflatten", "leaves", "tree_map", "flatten_up_to")
UP_TO_TARGET = 1.5


class Leaf:
    """A leaf of a type the engine classifies once per call, as a tensor."""

    __slots__ = ()


# -- the trees --------------------------------------------------------------


def _corpus() -> Any:
    """benchmarks/corpus.py, its leaves stand-ins (no torch in the counted processes)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import corpus

    stand_ins = tuple(Leaf() for _ in range(16))
    corpus.leaf_pool = lambda: ("stand-in", stand_ins)
    corpus._tensors = lambda: {n: Leaf() for n in ("image", "boxes", "labels", "masks")}
    return corpus


def state_dict() -> dict[str, Any]:
    """A 500-key state_dict: its insertion order is not its sorted order."""
    names = ("attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.fc1.weight", "mlp.fc2.bias")
    return {f"layers.{i}.{name}": Leaf() for i in range(100) for name in names}


def named_trees() -> dict[str, Callable[[], Any]]:
    made: dict[str, Callable[[], Any]] = {case.label: case.make for case in _corpus().TREES}
    made["state_dict of 500"] = state_dict
    return made


def record_trees() -> dict[str, Callable[[], Any]]:
    import attrs

    corpus = _corpus()

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

    Target = corpus.Target

    def batch() -> Any:
        return corpus.Batch(
            images=[Leaf() for _ in range(4)],
            targets=[Target(Leaf(), Leaf(), Leaf()) for _ in range(4)],
            meta=corpus.Meta(epoch=3, step=1200, lr=0.1, seed=7),
        )

    return {
        "dataclass batch (corpus.py's (e))": batch,
        "100 dataclass records": lambda: [Target(Leaf(), i, None) for i in range(100)],
        "100 dataclass records with None defaults": lambda: [
            WithDefaults(Leaf()) for _ in range(100)
        ],
        "100 slotted dataclass records": lambda: [SlotRecord(Leaf(), i, None) for i in range(100)],
        "100 attrs records (slotted)": lambda: [AttrsRecord(Leaf(), i, None) for i in range(100)],
    }


def corpus_points(families: list[str]) -> list[str]:
    """The corpus's trees, as ``family:size:variant``."""
    corpus = _corpus()
    chosen = [f for f in corpus.FAMILIES if not families or f.name in families]
    return [
        f"{f.name}:{size}:{variant}" for f, size, variant in corpus.corpus_points(chosen, False)
    ]


def _point(tree: str) -> tuple[str, int, str]:
    family, size, variant = tree.split(":")
    return family, int(size), variant


def make_tree(trees: str, tree: str) -> Callable[[], Any]:
    """A function that makes the tree named ``tree`` of the set ``trees``."""
    if trees == "named":
        return named_trees()[tree]
    if trees == "records":
        return record_trees()[tree]
    corpus = _corpus()
    family, size, variant = _point(tree)
    fam = {f.name: f for f in corpus.FAMILIES}[family]
    return lambda: corpus.draw_one(fam, size, variant, 0).tree


def calls_for(trees: str, tree: str, n: int) -> int:
    """How many calls a case counts."""
    if trees == "corpus":
        _, size, variant = _point(tree)
        return 3 if size >= 1000 or variant == "f" else 10
    return max(2, n // 20) if tree.startswith("(f)") else n


# -- the counted process ------------------------------------------------------


def warm_call(trees: str, tree: str, name: str, fresh: bool, n: int) -> tuple[Callable, list]:
    """The call of ``name`` (on one tree), warmed, and the ``n`` trees to call it
    on (one tree n times, or n fresh ones): the counted process's part, and
    benchmarks/fast_paths.py's."""
    import pytree_kit as pk

    assert pk.ENGINE == "c", pk.engine_info()
    make = make_tree(trees, tree)
    first = make()
    leaves, spec = pk.flatten(first)
    calls: dict[str, Callable[[Any], Any]] = {
        "flatten": pk.flatten,
        "unflatten": lambda t: pk.unflatten(spec, leaves),
        "leaves": pk.leaves,
        "tree_map": lambda t: pk.tree_map(id, t),
        "flatten_up_to": spec.flatten_up_to,
        "flatten_with_path": pk.flatten_with_path,
        "tree_iter": lambda t: list(pk.tree_iter(t)),
    }
    call = calls[name]
    call(first)  # plans made, caches filled
    return call, ([make() for _ in range(n)] if fresh else [first] * n)


def count_case(trees: str, tree: str, name: str, fresh: bool, n: int) -> None:
    """What one process under callgrind runs: ``n`` calls, counted (only what
    runs inside functools.reduce is)."""
    import pytree_kit as pk

    assert Path(pk.__file__).resolve().parent.parent == Path.cwd().resolve(), pk.__file__
    call, inputs = warm_call(trees, tree, name, fresh, n)
    functools.reduce(lambda _, t: call(t), inputs, None)


# -- counting -----------------------------------------------------------------

Case = tuple[str, str, bool]  # (tree, op, fresh)


def count(checkout: Path, trees: str, case: Case, n: int, work: Path) -> float:
    """Instructions per call of one case in one checkout."""
    tree, name, fresh = case
    calls = calls_for(trees, tree, n)
    out = work / f"{abs(hash((str(checkout), case)))}.out"
    args = ["--count", trees, tree, name, "fresh" if fresh else "same", str(calls)]
    return count_in_checkout(__file__, args, checkout, toggles=REDUCE, out=out) / calls


def measure(where: list[Path], trees: str, cases: list[Case], n: int) -> dict:
    """{(checkout, case): instructions per call}, two processes at a time."""
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {
            (w, case): pool.submit(count, w, trees, case, n, Path(tmp))
            for w in where
            for case in cases
        }
        return {key: f.result() for key, f in runs.items()}


def commit(where: Path) -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True
    )
    return found.stdout.strip() or "?"


# -- the reports --------------------------------------------------------------


def report(
    got: dict, cases: list[Case], trees: str, n: int, now: Path, before: Path, title: str
) -> str:
    """The named or records set: each case before and now, and their ratio."""
    records = trees == "records"
    made = (
        f"Made by `python benchmarks/instructions.py --trees {trees} --n {n}`: callgrind's "
        f"instruction counts of one call with the C engine of {commit(now)} (now; its working "
        f"tree) and of {commit(before)} (before). "
    )
    if records:
        made += "Same: one tree, again and again; fresh: new instances each call."
    else:
        made += f"Tree (f) is counted over {calls_for(trees, '(f)', n)} calls, the others over {n}."
    trees_col = ("trees | ", "---|") if records else ("", "")
    lines = [
        f"# {title}",
        "",
        f"Machine: {platform.machine()}; Python {platform.python_version()}.",
        "",
        made,
        "",
        f"| tree | op | {trees_col[0]}before Ir | now Ir | now / before |",
        f"|---|---|{trees_col[1]}---:|---:|---:|",
    ]
    ratios = []
    for case in cases:
        tree, name, fresh = case
        b, a = got[(before, case)], got[(now, case)]
        ratios.append(a / b)
        which = f"{'fresh' if fresh else 'same'} | " if records else ""
        lines.append(f"| {tree} | {name} | {which}{b:,.0f} | {a:,.0f} | {a / b:.3f} |")
    lines += ["", f"Ratios from {min(ratios):.3f} to {max(ratios):.3f}."]
    return "\n".join(lines) + "\n"


def _label(tree: str) -> tuple[str, str]:
    family, size, variant = _point(tree)
    if family == "named":
        return family, variant
    return family, f"{size:,}" + (f", {variant}" if variant else "")


CORPUS_MADE = (
    "callgrind's instructions per call on each tree of the corpus (seed 0) with stand-in "
    "leaves, 3 calls counted for trees of 1,000 or more units and tree (f), 10 for the others."
)


def report_one(pts: list[str], got: dict, name: str, now: Path, before: Path) -> str:
    """One operation's instructions per call on the corpus, before and now, per tree."""
    lines = [
        f"# {name}: instructions per call, before and now",
        "",
        f"Machine: {platform.machine()}; CPython {platform.python_version()}. Made by "
        f"`python benchmarks/instructions.py --trees corpus --only {name}`: {CORPUS_MADE} "
        f"Now: {commit(now)}; before: {commit(before)}.",
        "",
        "| family | size | before | now | before ÷ now |",
        "|---|---|---:|---:|---:|",
    ]
    for p in pts:
        b, a = got[(before, (p, name, False))], got[(now, (p, name, False))]
        family, label = _label(p)
        lines.append(f"| {family} | {label} | {b:,.0f} | {a:,.0f} | {b / a:.2f} |")
    return "\n".join(lines) + "\n"


def report_up_to(pts: list[str], got: dict, now: Path, before: Optional[Path]) -> str:
    """flatten against flatten_up_to on the corpus, now (and before)."""
    lines = [
        "# flatten_up_to against our own flatten, in instructions",
        "",
        f"Machine: {platform.machine()}; CPython {platform.python_version()}. Made by "
        f"`python benchmarks/instructions.py --trees corpus`: {CORPUS_MADE} The target is "
        f"{UP_TO_TARGET}; ✗ marks a ratio under it. Now: {commit(now)}"
        + (f"; before: {commit(before)} (before → now in each cell)." if before else "."),
        "",
        "| family | size | flatten | flatten_up_to | flatten ÷ flatten_up_to |",
        "|---|---|---:|---:|---:|",
    ]
    worst: dict[str, list[float]] = {}
    for p in pts:
        family, label = _label(p)
        cells = [
            (got[(w, (p, "flatten", False))], got[(w, (p, "flatten_up_to", False))])
            for w in ([before, now] if before else [now])
        ]
        ratios = [f / u for f, u in cells]
        worst[family] = [min(a, b) for a, b in zip(worst.get(family, [99.0] * 2), ratios)]
        mark = " ✗" if ratios[-1] < UP_TO_TARGET else ""
        lines.append(
            f"| {family} | {label} | "
            + " | ".join(" → ".join(f"{c[i]:,.0f}" for c in cells) for i in (0, 1))
            + " | "
            + " → ".join(f"{r:.2f}" for r in ratios)
            + f"{mark} |"
        )
    lines += ["", "Worst ratio per family" + (" (before → now)" if before else "") + ":", ""]
    lines += [
        f"- {fam}: " + " → ".join(f"{r:.2f}" for r in rs) + (" ✗" if rs[-1] < UP_TO_TARGET else "")
        for fam, rs in worst.items()
    ]
    return "\n".join(lines) + "\n"


# -- the command ----------------------------------------------------------------


def parse_args(argv: Any) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout built in place to compare with")
    parser.add_argument("--trees", choices=tuple(SET_OPS), default="named", help="the set")
    parser.add_argument("--n", type=int, default=40, help="calls counted per process")
    _output.add_arguments(parser, sub=_output.PYTHON)
    parser.add_argument("--only", action="append", default=[], choices=OPS, help="these ops")
    parser.add_argument(
        "--tree", action="append", default=[], help="the trees whose label has this text"
    )
    parser.add_argument("--family", action="append", default=[], help="corpus: these families")
    parser.add_argument("--title", help="the report's title (named, records)")
    parser.add_argument("--name", help="the report's file name")
    parser.add_argument("--count", nargs=5, help=argparse.SUPPRESS)
    return parser, parser.parse_args(argv)


def main(argv: Any = None) -> int:
    parser, args = parse_args(argv)
    if args.count:
        trees, tree, name, fresh, n = args.count
        count_case(trees, tree, name, fresh == "fresh", int(n))
        return 0
    # this checkout's pytree_kit, whatever the environment has installed
    sys.path.insert(0, str(ROOT))
    before = args.baseline.resolve() if args.baseline else None
    where = [ROOT] + ([before] if before else [])
    ops = [o for o in SET_OPS[args.trees] if not args.only or o in args.only]
    if not ops and args.trees != "corpus":
        parser.error(f"--trees {args.trees} counts {', '.join(SET_OPS[args.trees])}")
    if args.trees == "corpus":
        pts = corpus_points(args.family)
        if args.only:
            if len(args.only) != 1 or args.only[0] not in CORPUS_OPS or before is None:
                parser.error(f"--trees corpus --only takes one of {CORPUS_OPS} and --baseline")
            one = args.only[0]  # one operation, before and now
            got = measure(where, "corpus", [(p, one, False) for p in pts], args.n)
            text, name = report_one(pts, got, one, ROOT, before), f"instructions_{one}.md"
        else:
            got = measure(where, "corpus", [(p, o, False) for p in pts for o in ops], args.n)
            text, name = report_up_to(pts, got, ROOT, before), "instructions_up_to.md"
    else:
        if before is None:
            parser.error("--baseline is required")
        made = named_trees() if args.trees == "named" else record_trees()
        labels = [t for t in made if not args.tree or any(s in t for s in args.tree)]
        freshes = (False, True) if args.trees == "records" else (False,)
        cases = [(t, o, f) for t in labels for o in ops for f in freshes]
        title = args.title or (
            "The check for state outside a record's fields, in instructions"
            if args.trees == "records"
            else "The C engine in instructions, now and before"
        )
        got = measure(where, args.trees, cases, args.n)
        text = report(got, cases, args.trees, args.n, ROOT, before, title)
        name = "record_cost.md" if args.trees == "records" else "instructions.md"
    _output.write_report(args, args.name or name, text, sub=_output.PYTHON)
    return 0


if __name__ == "__main__":
    sys.exit(main())
