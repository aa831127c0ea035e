"""Side-by-side demo: the same nested batches through pytree_kit and its peers.

Prints, as a markdown table, what each library does with each case. Each
library runs in a child process of its own: a failure in one (jax's on a
self-referencing dict leaves its interpreter unusable) cannot colour the
others' results. A peer that is not installed is shown as such. The timed
comparison benchmark comes with the C engine; this shows behaviour.

    python benchmarks/demo.py
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import platform
import subprocess
import sys
from typing import Any, Callable

import pytree_kit as pk


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any


@dataclasses.dataclass
class Batch:
    images: Any
    targets: Any
    meta: Any = None


def make_batch() -> Batch:
    return Batch(
        images=["img0", "img1"],
        targets=[Target("boxes0", "labels0"), Target("boxes1", "labels1")],
        meta={"epoch": 3, "ids": (7, 8)},
    )


def deep(n: int) -> Any:
    t: Any = "leaf"
    for _ in range(n):
        t = [t]
    return t


def cyclic() -> dict:
    d: dict = {"x": 1}
    d["self"] = d
    return d


CASES: list[tuple[str, Callable[[], Any]]] = [
    ("dataclass batch of 9 leaves", make_batch),
    ("{1: 'a', 'b': 2}", lambda: {1: "a", "b": 2}),
    ("[None, 1]", lambda: [None, 1]),
    ("depth 10,000", lambda: deep(10_000)),
    ("self-referencing dict", cyclic),
]


LIBRARIES = {
    "pytree_kit": ("pytree_kit", "leaves"),
    "jax.tree_util": ("jax.tree_util", "tree_leaves"),
    "optree": ("optree", "tree_leaves"),
    "torch.utils._pytree": ("torch.utils._pytree", "tree_leaves"),
    "dm-tree": ("tree", "flatten"),
}


def outcome(fn: Callable[[Any], list], make: Callable[[], Any]) -> str:
    value = make()
    try:
        leaves = fn(value)
    except BaseException as e:  # peers raise anything here
        cause = e.__cause__ or e.__context__
        text = type(e).__name__
        if isinstance(cause, RecursionError) and not isinstance(e, RecursionError):
            text += " (from RecursionError)"
        return text
    if len(leaves) == 1 and leaves[0] is value:
        return "1 leaf: the whole object"
    return "1 leaf" if len(leaves) == 1 else f"{len(leaves)} leaves"


def column(library: str) -> list[str]:
    """Run every case through one library, in a child process of its own."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import demo; demo.run_column(sys.argv[2])"
    here = str(__import__("pathlib").Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", code, here, library], capture_output=True, text=True, timeout=300
    )
    results: dict[int, str] = {}
    alive: set[int] = set()
    for line in proc.stdout.splitlines():
        if line.startswith("["):
            i, what = json.loads(line)
            if what == "<alive>":
                alive.add(i)
            else:
                results[i] = what
    out = []
    for i in range(len(CASES)):
        if i not in results:
            out.append("interpreter left unusable" if i > 0 and i - 1 in alive else "-")
        elif i not in alive:
            out.append(results[i] + "; interpreter left unusable")
        else:
            out.append(results[i])
    return out


def _depth(n: int) -> int:
    return 0 if n == 0 else 1 + _depth(n - 1)


def run_column(library: str) -> None:
    """Print each case's outcome, then whether the interpreter still works."""
    module, attr = LIBRARIES[library]
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception:
        fn = None
    # The self-referencing dict comes last: a library may not survive it.
    for i, (_, make) in enumerate(CASES):
        print(json.dumps([i, "not installed" if fn is None else outcome(fn, make)]), flush=True)
        _depth(50)
        print(json.dumps([i, "<alive>"]), flush=True)


def main() -> None:
    print(f"Python {platform.python_version()}, pytree_kit {pk.__version__} ({pk.ENGINE} engine)")
    print()
    columns = {name: column(name) for name in LIBRARIES}
    print("| case | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for i, (label, _) in enumerate(CASES):
        print(f"| {label} | " + " | ".join(c[i] for c in columns.values()) + " |")
    print()
    spec = pk.structure(make_batch())
    print("pytree_kit on the dataclass batch, with no registration:")
    for path, leaf in pk.flatten_with_path(make_batch())[0]:
        print(f"  tree{pk.keystr(path):<24} {leaf!r}")
    print(f"  spec: {spec}")
    try:
        pk.flatten(cyclic())
    except ValueError as e:
        print(f"  cycle: ValueError: {e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
