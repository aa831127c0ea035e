"""flatten_up_to against our own flatten, in instructions, on the corpus's trees.

The corpus's flatten_up_to target (1.5 times our own flatten) is a ratio of two of
our own calls, so callgrind's instruction counts measure it without the
noise of timings on this machine. For each tree of ``benchmarks/corpus.py``
(seed 0, every family and size unless ``--family`` names some), each of
flatten and flatten_up_to runs in its own process under callgrind, counting
only inside ``functools.reduce`` (as ``instructions.py`` does): 3 calls for
trees of 1,000 or more units and the named tree (f), 10 for the others,
after one warm call. The leaves are 16 small stand-in objects in place of
tensors, so torch is not imported. With ``--baseline DIR`` (a checkout of
another commit, its extension built in place for the same Python) both are
counted, before and after.

With ``--op NAME`` (unflatten, tree_map, flatten, leaves or flatten_up_to)
and a baseline, that one operation is counted instead, before and after, and
the report (``instructions_NAME.md``) gives each tree's counts and their
ratio, before ÷ now.

The report is printed; it is written (``instructions_up_to.md`` or
``instructions_NAME.md``) only into ``--out DIR``, or with ``--record`` into
``benchmarks/results/python3.X/``, the published figures.

    python benchmarks/corpus_instructions.py --baseline /tmp/base --out /tmp/x
    python benchmarks/corpus_instructions.py --baseline /tmp/base --record
    python benchmarks/corpus_instructions.py --family none --family dataclass
    python benchmarks/corpus_instructions.py --baseline /tmp/base --op unflatten --family records
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import _output

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OPS = ("flatten", "flatten_up_to")
ONE_OPS = ("flatten", "unflatten", "leaves", "tree_map", "flatten_up_to")


def _sibling(name: str) -> Any:
    """benchmarks/<name>.py, imported (this script's folder put on the path)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(name)


class Leaf:
    """A stand-in leaf: a type the engine classifies once per call, as a tensor."""

    __slots__ = ()


def calls_for(size: int, variant: str) -> int:
    return 3 if size >= 1000 or variant == "f" else 10


def op(family: str, size: int, variant: str, name: str, n: int) -> Any:
    """What one process under callgrind runs: the tree drawn, one warm call,
    then ``n`` calls, counted; the call, for another count of the caller's
    (benchmarks/fast_paths.py)."""
    corpus = _sibling("corpus")
    stand_ins = tuple(Leaf() for _ in range(16))
    corpus.leaf_pool = lambda: ("stand-in", stand_ins)  # no torch in the counted processes
    import pytree_kit as pk

    assert pk.ENGINE == "c", pk.engine_info()
    fam = {f.name: f for f in corpus.FAMILIES}[family]
    tree = corpus.draw_one(fam, size, variant, 0).tree
    leaves, spec = pk.flatten(tree)
    call = {
        "flatten": lambda: pk.flatten(tree),
        "flatten_up_to": lambda: spec.flatten_up_to(tree),
        "unflatten": lambda: pk.unflatten(spec, leaves),
        "leaves": lambda: pk.leaves(tree),
        "tree_map": lambda: pk.tree_map(id, tree),
    }[name]
    call()
    functools.reduce(lambda _, __: call(), range(n), None)
    return call


def points(families: list[str]) -> list[tuple[str, int, str]]:
    corpus = _sibling("corpus")
    chosen = [f for f in corpus.FAMILIES if not families or f.name in families]
    return [(f.name, size, variant) for f, size, variant in corpus.corpus_points(chosen, False)]


def count(checkout: Path, point: tuple[str, int, str], name: str, work: Path) -> float:
    harness = _sibling("_callgrind")
    family, size, variant = point
    n = calls_for(size, variant)
    out = work / f"{abs(hash((str(checkout), point, name)))}.out"
    args = ["--run", family, str(size), variant, name, str(n)]
    return harness.count_in_checkout(__file__, args, checkout, toggles=harness.REDUCE, out=out) / n


def measure(where: list[Path], pts: list[tuple[str, int, str]], ops: tuple = OPS) -> dict:
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {
            (w, p, name): pool.submit(count, w, p, name, Path(tmp))
            for w in where
            for p in pts
            for name in ops
        }
        return {key: f.result() for key, f in runs.items()}


def _label(family: str, size: int, variant: str) -> str:
    return variant if family == "named" else f"{size:,}" + (f", {variant}" if variant else "")


def report_one(pts: list, got: dict, name: str, now: Path, before: Path) -> str:
    """One operation's instructions per call, before and now, per tree."""
    commit = _sibling("instructions").commit
    lines = [
        f"# {name}: instructions per call, before and now",
        "",
        f"Machine: {platform.machine()}; CPython {platform.python_version()}. Made by "
        f"`python benchmarks/corpus_instructions.py --op {name}`: callgrind's instructions "
        "per call on each tree of the corpus (seed 0) with stand-in leaves, 3 calls counted "
        "for trees of 1,000 or more units and tree (f), 10 for the others. "
        f"Now: {commit(now)}; before: {commit(before)}.",
        "",
        "| family | size | before | now | before ÷ now |",
        "|---|---|---:|---:|---:|",
    ]
    for p in pts:
        b, n = got[(before, p, name)], got[(now, p, name)]
        lines.append(f"| {p[0]} | {_label(*p)} | {b:,.0f} | {n:,.0f} | {b / n:.2f} |")
    return "\n".join(lines) + "\n"


def report(pts: list, got: dict, now: Path, before: Optional[Path]) -> str:
    commit = _sibling("instructions").commit
    cols = "| family | size | flatten | flatten_up_to | flatten ÷ flatten_up_to |"
    lines = [
        "# flatten_up_to against our own flatten, in instructions",
        "",
        f"Machine: {platform.machine()}; CPython {platform.python_version()}. Made by "
        "`python benchmarks/corpus_instructions.py`: callgrind's instructions per call on "
        "each tree of the corpus (seed 0) with stand-in leaves, 3 calls counted for trees of "
        "1,000 or more units and tree (f), 10 for the others. The target is 1.5; ✗ marks a "
        f"ratio under it. Now: {commit(now)}"
        + (f"; before: {commit(before)} (before → now in each cell)." if before else "."),
        "",
        cols,
        "|---|---|---:|---:|---:|",
    ]
    worst: dict[str, list[float]] = {}
    for p in pts:
        family, size, variant = p
        label = _label(family, size, variant)
        cells, ratios = [], []
        for w in [before, now] if before else [now]:
            f, u = got[(w, p, "flatten")], got[(w, p, "flatten_up_to")]
            cells.append((f, u))
            ratios.append(f / u)
        worst.setdefault(family, [99.0] * len(ratios))
        worst[family] = [min(a, b) for a, b in zip(worst[family], ratios)]
        mark = " ✗" if ratios[-1] < 1.5 else ""
        lines.append(
            f"| {family} | {label} | "
            + " → ".join(f"{f:,.0f}" for f, _ in cells)
            + " | "
            + " → ".join(f"{u:,.0f}" for _, u in cells)
            + " | "
            + " → ".join(f"{r:.2f}" for r in ratios)
            + f"{mark} |"
        )
    lines += ["", "Worst ratio per family" + (" (before → now)" if before else "") + ":", ""]
    lines += [
        f"- {fam}: " + " → ".join(f"{r:.2f}" for r in rs) + (" ✗" if rs[-1] < 1.5 else "")
        for fam, rs in worst.items()
    ]
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout built in place to compare with")
    parser.add_argument("--family", action="append", default=[], help="these families only")
    _output.add_arguments(parser, sub=_output.PYTHON, default=False)
    parser.add_argument(
        "--op", choices=ONE_OPS, help="this operation alone, before and now (needs --baseline)"
    )
    parser.add_argument("--run", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        family, size, variant, name, n = args.run
        op(family, int(size), variant, name, int(n))
        return 0
    pts = points(args.family)
    before = args.baseline.resolve() if args.baseline else None
    if args.op:
        if before is None:
            parser.error("--op needs --baseline")
        text = report_one(pts, measure([ROOT, before], pts, (args.op,)), args.op, ROOT, before)
        print(text)
        if args.out is not None or args.record:
            out = _output.folder(args, sub=_output.PYTHON)
            (out / f"instructions_{args.op}.md").write_text(text, encoding="utf-8")
            _output.wrote(out / f"instructions_{args.op}.md")
        return 0
    got = measure([ROOT] + ([before] if before else []), pts)
    text = report(pts, got, ROOT, before)
    print(text)
    if args.out is not None or args.record:
        out = _output.folder(args, sub=_output.PYTHON)
        (out / "instructions_up_to.md").write_text(text, encoding="utf-8")
        _output.wrote(out / "instructions_up_to.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
