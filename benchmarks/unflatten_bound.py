"""How fast can any unflatten() be? A measured lower bound, against the peers.

Issue 21 asks for unflatten at least 1.5x faster than the fastest peer on
every tree. On a tree of small containers most of the time goes to making
and freeing the containers, which every unflatten must do. This script times,
in the same interleaved rounds:

- the bound: ``benchmarks/bound/unflatten_bound.c``, compiled here, building
  the tree from a plan compiled ahead into a flat C array (no spec to read,
  no checks, no key sorting), each dict made the cheapest of three ways (by
  insertion; as a copy of a template's table; as a split table sharing one
  keys table, as the C engine's plans make them on 3.10 to 3.12; see the C
  file's header);
- ``pk.unflatten`` (the public function, on the active engine);
- ``jax.tree_util.tree_unflatten`` and ``optree.tree_unflatten`` where they
  are installed, set up and called as ``compare.py`` does.

For each tree it prints the fastest peer's time over the bound's: the most any
unflatten that makes its containers in one of these ways can reach on that
tree, with this interpreter on this machine. Where that is under 1.5, no such
unflatten meets the target there.

    python benchmarks/unflatten_bound.py                # a minute or two
    python benchmarks/unflatten_bound.py --quick        # smoke mode
    python benchmarks/unflatten_bound.py --out /tmp/b   # write OUT/unflatten_bound.md
    python benchmarks/unflatten_bound.py --record       # benchmarks/results/python3.X/

By default it writes ``build/benchmarks/python3.X/unflatten_bound.md``; ``--record``
writes the published figures, one per Python, which ``benchmarks/report.py`` reads.

Needs a C compiler (the one Python was built with, from ``sysconfig``).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _output  # noqa: E402
import compare  # noqa: E402
import corpus  # noqa: E402
import leaves_bound  # noqa: E402

import pytree_kit as pk  # noqa: E402

X = compare.X  # the multiplication sign
SOURCE = HERE / "bound" / "unflatten_bound.c"
TARGET = 1.5
LEAF, LIST, TUPLE, DICT = range(4)  # as unflatten_bound.c's enum
BUILDS = ("build0", "build1", "build2")  # its three ways of making dicts
PEERS = ("jax.tree_util", "optree")  # compare.py's peers timed here, where installed

#: (family, size, variant) of the corpus, drawn with its default seed; the
#: trees of exact lists, tuples and dicts only (the bound knows no others)
TREES = (
    ("named", 0, "a"),
    ("named", 0, "c"),
    ("named", 0, "d"),
    ("chain", 10, ""),
    ("chain", 50, ""),
    ("chain", 200, ""),
    ("state_dict", 10, ""),
    ("state_dict", 1000, ""),
    ("records", 10, ""),
    ("records", 1000, ""),
    ("wide", 1000, ""),
)


def build(workdir: Path) -> Any:
    """Compile unflatten_bound.c into workdir and import it."""
    return leaves_bound.build(workdir, SOURCE)


def plan_of(tree: Any) -> tuple[tuple[tuple[int, int, Any], ...], list[Any]]:
    """The tree's nodes in post-order, as unflatten_bound.compile takes them,
    and its leaves in that order (dicts in insertion order). Iterative."""
    plan: list[tuple[int, int, Any]] = []
    leaves: list[Any] = []
    todo: list[tuple[Any, bool]] = [(tree, False)]
    while todo:
        node, done = todo.pop()
        kind = {list: LIST, tuple: TUPLE, dict: DICT}.get(type(node), LEAF)
        if kind == LEAF:
            plan.append((LEAF, 0, None))
            leaves.append(node)
        elif done:
            plan.append((kind, len(node), tuple(node) if kind == DICT else None))
            if kind == DICT:
                plan[-1] += (split_table(tuple(node)),)
        else:
            todo.append((node, True))
            children = list(node.values()) if kind == DICT else list(node)
            todo.extend((c, False) for c in reversed(children))
    return tuple(plan), leaves


def split_table(keys: tuple[Any, ...]) -> Any:
    """(instance, its __dict__) of a class made for these keys, its attributes
    set in their order: a split table of them, as the bound's build2 shares on
    3.13 (on 3.10-3.12 build2 makes its own, of the template's table);
    None where CPython would not make one (keys that are not distinct strs,
    more than a class's shared keys hold, none)."""
    if not keys or len(keys) > 30 or len(set(keys)) != len(keys):
        return None
    if not all(type(k) is str for k in keys):
        return None
    obj = type("SplitKeys", (), {})()
    for k in keys:
        setattr(obj, k, None)
    return obj, vars(obj)


def same(a: Any, b: Any) -> bool:
    """Equal, dict order included, leaves by identity. Iterative."""
    todo = [(a, b)]
    while todo:
        x, y = todo.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if list(x) != list(y):
                return False
            todo.extend(zip(x.values(), y.values()))
        elif isinstance(x, (list, tuple)):
            if len(x) != len(y):
                return False
            todo.extend(zip(x, y))
        elif x is not y:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke mode: tiny loops")
    _output.add_arguments(parser, sub=_output.PYTHON)
    args = parser.parse_args(argv)
    min_time, repeats = (0.002, 3) if args.quick else (0.05, 9)
    families = {f.name: f for f in corpus.FAMILIES}
    notes: list[str] = []
    # compare.py's peers, those installed: their unflatten as compare.py times it
    peers = [lib for lib in compare.load_libraries(list(PEERS), notes) if lib.peer]
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bound = build(Path(tmp))
        for name, size, variant in TREES:
            drawn = corpus.draw_one(families[name], size, variant, corpus.DEFAULT_SEED)
            tree = drawn.tree
            plan, bleaves = plan_of(tree)
            compiled = bound.compile(plan)
            bound.use(compiled)
            makers = [bound.build0] + ([bound.build1] if bound.table_copy_ok(compiled) else [])
            makers += [bound.build2] if bound.split_ok(compiled) else []
            for make in makers:
                # the bound builds the very tree (order included), so it is one
                assert same(make(bleaves), tree), (name, size, make.__name__)
            leaves, spec = pk.flatten(tree)
            assert len(leaves) == len(bleaves), (name, size)
            fns: dict[str, Callable[[], Any]] = {
                make.__name__: (lambda make=make, bl=bleaves: make(bl)) for make in makers
            }
            fns["pk"] = lambda s=spec, lv=leaves: pk.unflatten(s, lv)
            for lib in peers:
                shape = lib.structure(tree)
                fns[lib.name] = lib.calls(tree, shape, lib.leaves(tree))["unflatten"]
            times = compare.measure_many(fns, min_time, repeats)
            label = f"{name} {variant}" if name == "named" else f"{name} {size:,}"
            rows.append((label, len(leaves), times))
            del tree, drawn, fns

    names = [lib.name for lib in peers]
    lines = [
        "# unflatten(): a measured lower bound against the peers",
        "",
        f"`python benchmarks/unflatten_bound.py{' --quick' if args.quick else ''}`, "
        f"{time.perf_counter() - started:.0f} s; Python {sys.version.split()[0]} "
        f"({platform.machine()}), pytree_kit engine `{pk.ENGINE}`; median of {repeats} "
        f"interleaved loops of at least {min_time * 1000:g} ms each; µs per call.",
        "",
        "**bound** is `benchmarks/bound/unflatten_bound.c`: the tree built from a plan "
        "compiled ahead into a flat C array, with no spec, no checks and no key sorting, "
        "each dict made the cheapest of three ways: by insertion (**build0**), as a copy of "
        "a template's table (**build1**), or as a split table sharing one keys table "
        "(**build2**, str keys: on 3.10-3.12 a copy of the template's table made a split "
        "table, as the C engine's plans make them there; on 3.13 a class's shared keys). "
        "**bound** is the fastest of them; no real unflatten does less. **most** is the "
        "fastest peer's time over the bound's: the most any "
        f"unflatten can reach on that tree here (the target is {TARGET:g}{X}; bold: under "
        "it). **pk** is ours, the same way.",
        "",
        "| tree | leaves | build0 | build1 | build2 | bound | pk | "
        + " | ".join(names)
        + f" | most | pk{X} |",
        "|---|---|---|---|---|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for label, n, times in rows:
        b = min(v for k, v in times.items() if k.startswith("build"))
        best = min((times[k] for k in names if isinstance(times[k], float)), default=None)
        cells = [f"{t * 1e6:.3g}" if isinstance(t, float) else t for t in map(times.get, names)]
        most = f"{best / b:.2f}{X}" if best else "n/a"
        ours = f"{best / times['pk']:.2f}{X}" if best else "n/a"
        if best and best / b < TARGET:
            most = f"**{most}**"
        if times["pk"] < b:
            # a real unflatten under the bound: the timing's noise (the rows of
            # one run move by up to 10% on a busy machine), or a cheaper way
            most += " (pk under the bound)"
        ways = [f"{times[w] * 1e6:.3g}" if w in times else "n/a" for w in BUILDS]
        lines.append(
            f"| {label} | {n:,} | "
            + " | ".join(ways)
            + f" | {b * 1e6:.3g} | {times['pk'] * 1e6:.3g} | "
            + " | ".join(cells)
            + f" | {most} | {ours} |"
        )
    lines += [""] + [f"- {note}" for note in notes] if notes else []
    report = "\n".join(lines) + "\n"
    print(report)
    out = _output.folder(args, sub=_output.PYTHON)
    (out / "unflatten_bound.md").write_text(report, encoding="utf-8")
    _output.wrote(out / "unflatten_bound.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
