"""Threads: how much more work two threads do than one, each on its own trees.

On a free-threaded CPython (3.13t) running without the GIL, threads that call
pytree_kit at once should run side by side: nothing the engine shares between
calls (the class plans, under a mutex) should make them wait for each other.
This script measures it, in one process: ``--threads`` counts (1 and 2 by
default) in interleaved rounds of ``--seconds`` each, every thread flattening
and unflattening its own copies of six trees (a nested config, records of
dicts, dataclasses, namedtuples, a list of lists, a ModelOutput-like dataclass)
in a loop; a round's figure is the calls made by all its threads, and the
report gives each count's median over ``--repeats`` rounds, and its ratio to
one thread's (the target on 2 cores: 1.8 or more). With the GIL the ratio is
about 1: threads take turns.

    python benchmarks/threads.py              # 5 rounds of 2 s per count
    python benchmarks/threads.py --quick      # smoke mode
    python benchmarks/threads.py --record     # into benchmarks/results/python3.Xt/

The report goes to stdout and ``OUT/threads.md`` (``OUT``: ``_output.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _output

import pytree_kit as pk

Point = namedtuple("Point", "x y z")


@dataclasses.dataclass
class Sample:
    image: Any
    label: Any
    boxes: list
    meta: dict


@dataclasses.dataclass
class Output:
    loss: Any
    logits: Any
    hidden_states: tuple
    attentions: Any = None


def make_trees(seed: int) -> list:
    """Six trees of the usual shapes, with fresh leaves (objects of their own)."""

    def leaf(i: int) -> Any:
        return f"leaf{seed}.{i}"

    config = {
        f"section{i}": {
            "lr": 0.1 * i,
            "layers": [leaf(i), leaf(i + 1), {"width": i, "act": "gelu"}],
            "opt": {"betas": (0.9, 0.99), "eps": 1e-8, "name": leaf(i + 2)},
        }
        for i in range(8)
    }
    records = [{"id": i, "x": leaf(i), "y": [leaf(i), leaf(i + 1)]} for i in range(50)]
    samples = [Sample(leaf(i), i, [leaf(i), leaf(i)], {"path": leaf(i)}) for i in range(30)]
    points = [Point(leaf(i), i, (leaf(i), None)) for i in range(60)]
    nested = [[leaf(i * 10 + j) for j in range(10)] for i in range(20)]
    output = Output(leaf(0), leaf(1), tuple(leaf(i) for i in range(12)))
    return [config, records, samples, points, nested, output]


def work(trees: list, stop: threading.Event, counts: list, slot: int) -> None:
    """Flatten and unflatten each tree in turn until stop is set, counting calls."""
    n = 0
    flatten, unflatten = pk.flatten, pk.unflatten
    while not stop.is_set():
        for tree in trees:
            leaves, spec = flatten(tree)
            unflatten(spec, leaves)
        n += 2 * len(trees)
    counts[slot] = n


def one_round(threads: int, seconds: float, trees: list) -> int:
    """Calls made in ``seconds`` by ``threads`` threads, each on its own trees."""
    stop = threading.Event()
    counts = [0] * threads
    workers = [
        threading.Thread(target=work, args=(trees[i], stop, counts, i)) for i in range(threads)
    ]
    for t in workers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in workers:
        t.join()
    return sum(counts)


def gil_enabled() -> bool:
    return bool(getattr(sys, "_is_gil_enabled", lambda: True)())


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--seconds", type=float, default=2.0, help="per round (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per count (default 5)")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 0.3 s: a smoke run")
    _output.add_arguments(ap, sub=_output.PYTHON)
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats = 0.3, 2
    counts = [int(x) for x in args.threads.split(",")]
    trees = [make_trees(i) for i in range(max(counts))]
    for per_thread in trees:  # warm: each class's plan made, each path taken
        for tree in per_thread:
            leaves, spec = pk.flatten(tree)
            assert pk.unflatten(spec, leaves) == tree
    rates: dict = {n: [] for n in counts}
    for _ in range(args.repeats):
        for n in counts:
            rates[n].append(one_round(n, args.seconds, trees) / args.seconds)
    base = statistics.median(rates[counts[0]])
    info = pk.engine_info()
    lines = [
        "# Threads, each flattening and unflattening its own trees",
        "",
        f"- `python benchmarks/threads.py --seconds {args.seconds} --repeats {args.repeats}`",
        f"- Python {sys.version.split()[0]}"
        f"{' (free-threaded)' if info['free_threaded'] else ''}, "
        f"GIL {'on' if gil_enabled() else 'off'}, engine {pk.ENGINE}",
        f"- {len(trees[0])} trees a thread (config, records, dataclasses, namedtuples, "
        "lists, an output record); a call: one flatten or one unflatten",
        "",
        f"| threads | calls/s (median of {args.repeats}) | × {counts[0]} thread's | rounds |",  # noqa: RUF001
        "|--:|--:|--:|---|",
    ]
    for n in counts:
        med = statistics.median(rates[n])
        each = ", ".join(f"{r:,.0f}" for r in rates[n])
        lines.append(f"| {n} | {med:,.0f} | {med / base:.2f} | {each} |")
    text = "\n".join(lines) + "\n"
    _output.write_report(args, "threads.md", text, sub=_output.PYTHON)
    return 0


if __name__ == "__main__":
    sys.exit(main())
