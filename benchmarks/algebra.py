"""The tree algebra against its peers: each function of pytree_kit that a peer
also has (tree_iter, tree_map_only, tree_any/all, the reductions, tree_transpose,
tree_broadcast_prefix, tree_partition, tree_replace_nones,
flatten_one_level, keystr and the spec algebra, tree_get,
assert_same_structure) timed beside that peer's equivalent, in one process,
interleaved as the corpus benchmark does (``_peers.measure_many``), on trees of ints
that every library reads alike.

    python benchmarks/algebra.py            # build/benchmarks/pythonX.Y/algebra.md
    python benchmarks/algebra.py --record   # benchmarks/results/pythonX.Y/algebra.md
    python benchmarks/algebra.py --quick    # smoke mode (CI): two trees, rough
    python benchmarks/algebra.py --only tree_any   # some functions, printed only

A cell reads ``median µs (speedup x)`` with speedup = (the fastest peer's
median) / (this median), as in corpus.py's reports: above 1 is faster than every peer.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import operator
import platform
import sys
from typing import Any, Callable, Optional

import _output
from _peers import measure_many  # the same timing: warm-up, calibration, interleaving
from corpus import tree_chain as chain  # tree (d)

import pytree_kit as pk
from pytree_kit._engine import impl as engine_impl


def _peer(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# -- trees of ints: every library reads them alike ------------------------------------


def state_dict() -> Any:
    return {f"layer{i // 4}.{('weight', 'bias', 'scale', 'shift')[i % 4]}": i for i in range(500)}


def config() -> Any:
    def level(depth: int, base: int) -> Any:
        if depth == 0:
            return base
        return {f"k{j}": level(depth - 1, base * 6 + j) for j in range(6)}

    return level(3, 1)


def records() -> Any:
    return [{"x": i, "y": i + 1, "z": i + 2} for i in range(1000)]


TREES: dict[str, tuple[str, Callable[[], Any]]] = {
    "sd": ("state_dict, 500 str keys", state_dict),
    "cfg": ("nested dicts, 6 wide, 3 deep", config),
    "rec": ("1000 dicts x 3", records),
    "chain": ("depth-50 chain", chain),
}


def _cut(tree: Any) -> Any:
    """``tree`` with its first child's subtree made one leaf: a strict prefix."""
    children, spec = pk.flatten_one_level(tree)
    return spec.unflatten([0, *children[1:]])


def cases(tree: Any) -> dict[str, dict[str, Callable[[], Any]]]:
    """For each function: the zero-argument calls of pytree_kit and of its peers."""
    optree, jax = _peer("optree"), _peer("jax")
    jtu = jax.tree_util if jax else None
    tp = tcx = None
    if _peer("torch") is not None:
        tp = importlib.import_module("torch.utils._pytree")
        tcx = importlib.import_module("torch.utils._cxx_pytree")
    p = functools.partial
    spec = pk.structure(tree)
    pairs, _ = pk.flatten_with_path(tree)
    path, _leaf = pairs[len(pairs) // 2]
    prefix = _cut(tree)
    out: dict[str, dict[str, Callable[[], Any]]] = {}

    def add(name: str, mine: Callable[[], Any], **peers: Any) -> None:
        out[name] = {"pytree_kit": mine, **{k: v for k, v in peers.items() if v is not None}}

    def is_odd(x: int) -> bool:
        return x % 2 == 1

    add(
        "list(tree_iter)",
        lambda: list(pk.tree_iter(tree)),
        optree=optree and (lambda: list(optree.tree_iter(tree))),
        torch=tp and (lambda: list(tp.tree_iter(tree))),
        torch_cxx=tcx and (lambda: list(tcx.tree_iter(tree))),
    )
    add(
        "tree_map_only(int, f)",
        p(pk.tree_map_only, int, operator.neg, tree),
        torch=tp and p(tp.tree_map_only, int, operator.neg, tree),
        torch_cxx=tcx and p(tcx.tree_map_only, int, operator.neg, tree),
    )
    add(
        "tree_any",
        p(pk.tree_any, tree),
        optree=optree and p(optree.tree_any, tree),
        torch=tp and p(tp.tree_any, bool, tree),
    )
    add(
        "tree_all",
        p(pk.tree_all, tree),
        optree=optree and p(optree.tree_all, tree),
        jax=jtu and p(jtu.tree_all, tree),
        torch=tp and p(tp.tree_all, bool, tree),
    )
    add(
        "tree_any_only(int, pred)",
        p(pk.tree_any_only, int, is_odd, tree),
        torch=tp and p(tp.tree_any_only, int, is_odd, tree),
        torch_cxx=tcx and p(tcx.tree_any_only, int, is_odd, tree),
    )
    add(
        "tree_reduce(add)",
        p(pk.tree_reduce, operator.add, tree),
        optree=optree and p(optree.tree_reduce, operator.add, tree),
        jax=jtu and p(jtu.tree_reduce, operator.add, tree),
    )
    add("tree_sum", p(pk.tree_sum, tree), optree=optree and p(optree.tree_sum, tree))
    add("tree_max", p(pk.tree_max, tree), optree=optree and p(optree.tree_max, tree))
    add(
        "tree_partition",
        p(pk.tree_partition, is_odd, tree),
        optree=optree and p(optree.tree_partition, is_odd, tree),
    )
    add(
        "tree_replace_nones",
        p(pk.tree_replace_nones, 0, tree),
        optree=optree and p(optree.tree_replace_nones, 0, tree),
    )
    add(
        "tree_broadcast_prefix",
        p(pk.tree_broadcast_prefix, prefix, tree),
        optree=optree and p(optree.tree_broadcast_prefix, prefix, tree),
    )
    add(
        "flatten_one_level",
        p(pk.flatten_one_level, tree),
        optree=optree and p(optree.tree_flatten_one_level, tree),
        jax=jtu and getattr(jtu, "flatten_one_level", None) and p(jtu.flatten_one_level, tree),
    )
    if jtu is not None:
        jpaths = [jp for jp, _ in jtu.tree_flatten_with_path(tree)[0]]
        paths = [q for q, _ in pairs]
        add(
            "keystr of every path",
            lambda: [pk.keystr(q) for q in paths],
            jax=lambda: [jtu.keystr(q) for q in jpaths],
        )
    ospec = optree.tree_structure(tree) if optree else None
    add("spec.paths()", spec.paths, optree=ospec and ospec.paths)
    add(
        "spec.paths(), first call",
        # what paths() runs on a spec it has not been called on: the engine
        # makes the paths (spec._make's own Python cost left out)
        p(engine_impl.spec_paths, spec._nodes),
        optree=ospec and ospec.paths,
    )
    pspec = pk.structure(prefix)
    oprefix = optree.tree_structure(prefix) if optree else None
    add(
        "spec.is_prefix(other)",
        p(pspec.is_prefix, spec),
        optree=oprefix and p(oprefix.is_prefix, ospec),
    )
    inner = pk.structure((0, 0))
    add(
        "spec.compose(inner)",
        p(spec.compose, inner),
        optree=optree and p(ospec.compose, optree.tree_structure((0, 0))),
        jax=jtu and p(jtu.tree_structure(tree).compose, jtu.tree_structure((0, 0))),
    )
    if optree is not None:
        accessor = optree.tree_accessors(tree)[len(pairs) // 2]
        add("tree_get(path)", p(pk.tree_get, tree, path), optree=p(accessor, tree))
    dm = _peer("tree")
    other = pk.tree_map(operator.neg, tree)
    add(
        "assert_same_structure",
        p(pk.assert_same_structure, tree, other),
        dm_tree=dm
        and hasattr(dm, "assert_same_structure")
        and p(dm.assert_same_structure, tree, other),
    )
    return out


def transpose_cases() -> dict[str, dict[str, Callable[[], Any]]]:
    """tree_transpose of a list of 1000 dicts {x, y, z} into a dict of lists."""
    optree, jax = _peer("optree"), _peer("jax")
    rows = records()
    flat_outer = [0] * len(rows)
    outer, inner = pk.structure(flat_outer), pk.structure(rows[0])
    p = functools.partial
    calls: dict[str, Callable[[], Any]] = {"pytree_kit": p(pk.tree_transpose, outer, inner, rows)}
    if optree is not None:
        o_outer, o_inner = optree.tree_structure(flat_outer), optree.tree_structure(rows[0])
        calls["optree"] = p(optree.tree_transpose, o_outer, o_inner, rows)
    if jax is not None:
        jtu = jax.tree_util
        j_outer, j_inner = jtu.tree_structure(flat_outer), jtu.tree_structure(rows[0])
        calls["jax"] = p(jtu.tree_transpose, j_outer, j_inner, rows)
    return {"tree_transpose": calls}


def bound_cases() -> dict[str, dict[str, Callable[[], Any]]]:
    """What the misses are bounded by, timed beside the peer they miss against:
    work any implementation with pytree_kit's results has to do."""
    rows = records()
    out: dict[str, dict[str, Callable[[], Any]]] = {}
    jax = _peer("jax")
    jtu = jax.tree_util if jax else None
    # flatten_one_level returns new children and a spec; jax returns the list itself.
    # (spec.paths()'s first call is bounded in instructions: results/python3.X/paths_bound.md.)
    if jtu is not None and hasattr(jtu, "flatten_one_level"):
        out["flatten_one_level, 1000 dicts: list(records) alone"] = {
            "list(records)": lambda: list(rows),
            "jax": functools.partial(jtu.flatten_one_level, rows),
        }
    return out


def _cell(t: Any, best: Optional[float]) -> str:
    if isinstance(t, str):
        return t
    text = f"{t * 1e6:.2f}"
    return text + (f" ({best / t:.2f}x)" if best else "")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(quick: bool, only: Optional[list[str]] = None) -> str:
    min_time, repeats = (0.0005, 1) if quick else (0.02, 7)
    rows = []
    worst: dict[str, float] = {}
    chosen = ("cfg", "chain") if quick else tuple(TREES)
    blocks = [(TREES[k][0], cases(TREES[k][1]())) for k in chosen]
    blocks.append(("1000 dicts x 3 -> dict of 3 lists", transpose_cases()))
    for tree_label, by_fn in blocks:
        for fn_name, calls in by_fn.items():
            if only and not any(o in fn_name for o in only):
                continue
            times = measure_many(calls, min_time, repeats)
            peers = [t for k, t in times.items() if k != "pytree_kit" and not isinstance(t, str)]
            best = min(peers) if peers else None
            mine = times["pytree_kit"]
            ratio = best / mine if best and not isinstance(mine, str) else None
            if ratio is not None:
                worst[fn_name] = min(worst.get(fn_name, ratio), ratio)
            peer_text = ", ".join(
                f"{k} {_cell(t, None)}" for k, t in times.items() if k != "pytree_kit"
            )
            rows.append(
                f"| {fn_name} | {tree_label} | {_cell(mine, best)} | {peer_text or 'no peer'} |"
            )
    bounds = []
    if not quick and not only:
        for label, calls in bound_cases().items():
            times = measure_many(calls, min_time, repeats)
            cells = ", ".join(f"{k} {_cell(t, None)}" for k, t in times.items())
            bounds.append(f"| {label} | {cells} |")
    tail = []
    if bounds:
        tail = [
            "",
            "## Bounds: work any implementation with these results does, beside the peer",
            "",
            "| miss | µs |",
            "|---|---|",
            *bounds,
        ]
    head = [
        "# The tree algebra against its peers" + (" (--quick: rough)" if quick else ""),
        "",
        f"- Python {platform.python_version()}, {platform.platform()}; engine {pk.ENGINE}",
        "- "
        + ", ".join(
            f"{n} {_version(n)}" for n in ("optree", "jax", "torch", "dm-tree", "pytree_kit")
        ),
        "- `python benchmarks/algebra.py`: median µs per call, interleaved with the peers "
        "(benchmarks/_peers.py's measure_many); the x is the fastest peer's time over "
        "pytree_kit's (above 1: faster than every peer).",
        "",
        "## Worst ratio per function, over the trees",
        "",
        "| function | worst x |",
        "|---|---:|",
        *[f"| {k} | {v:.2f} |" for k, v in worst.items()],
        "",
        "## Every cell",
        "",
        "| function | tree | pytree_kit µs (x) | peers µs |",
        "|---|---|---|---|",
    ]
    return "\n".join(head + rows + tail) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: tiny repeats")
    _output.add_arguments(ap, sub=_output.PYTHON)
    ap.add_argument(
        "--only",
        action="append",
        help="only the functions whose name holds this text (repeatable); printed, not saved",
    )
    args = ap.parse_args(argv)
    text = run(args.quick, args.only)
    if args.only:
        print(text)
        return 0
    _output.write_report(args, "algebra.md", text, sub=_output.PYTHON)
    return 0


if __name__ == "__main__":
    sys.exit(main())
