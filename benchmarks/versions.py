"""One page of the C engine's speedups on every supported Python.

    python benchmarks/versions.py            # reads benchmarks/results/python3.*/compare.json
    python benchmarks/versions.py --record   # and writes benchmarks/results/versions.md

Each ``benchmarks/results/python3.X/`` holds a full run of
``benchmarks/compare.py`` made with that Python (``--out`` pointing there).
This page puts their figures side by side, one table per version, and lists
every tree and operation where the C engine is slower than the fastest peer
(speedup below 1x). Where a version's folder also holds a run of
``benchmarks/corpus.py`` (``corpus.json``), a last section gives, for each family
of its trees and each operation, the worst speedup on each version. It reads
the recorded runs (``benchmarks/results/``) and writes ``versions.md`` into
``build/benchmarks/``; ``--record`` writes it into ``benchmarks/results/``, the
published figures, and ``--out DIR`` into DIR.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import _output

ROOT = Path(__file__).resolve().parent.parent
RESULTS = _output.RECORDED  # what it reads: the recorded runs, whatever --out says
X = "\N{MULTIPLICATION SIGN}"
OPS = ("flatten", "unflatten", "leaves", "tree_map")


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.name))


def render(runs: list[dict]) -> str:
    lines = [
        "# The C engine on every supported Python",
        "",
        "`python benchmarks/versions.py`, from the runs of `benchmarks/compare.py` in",
        "`benchmarks/results/python3.X/` (each one's `compare.md` has every library's",
        "µs, the machine and the peers' versions). Each cell is the speedup of pytree_kit's",
        "C engine against the fastest peer on that tree and operation, with that peer's",
        "initial (j jax.tree_util, o optree, t torch.utils._pytree, c torch.utils._cxx_pytree,",
        f"d dm-tree); below 1{X} is slower than it.",
        "torch is installed for 3.11 only on this machine, so the other versions have",
        "no torch columns.",
        "",
    ]
    header = ["worst speedup over the trees", *(f"Python {r['python']}" for r in runs)]
    lines += ["## Worst case per operation", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    for op in OPS:
        row = [op]
        for run in runs:
            cells = run["ops"].get(op, {})
            if not cells:
                row.append("-")
                continue
            key = min(cells, key=lambda k: cells[k]["speedup"])
            row.append(f"{cells[key]['speedup']:.2f}{X} {run['trees'][key].split(' ')[0]}")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    behind = []
    for run in runs:
        info = run["engine_info"]
        on = [k for k, v in info["fast_paths"].items() if v] or ["none"]
        peers = ", ".join(f"{k} {v}" for k, v in run["peers"].items())
        lines += [
            f"## Python {run['python']}",
            "",
            f"pytree_kit {run['pytree_kit']}, engine `{info['engine']}`, fast paths on: "
            f"{', '.join(on)}. Peers: {peers}.",
            "",
        ]
        trees = run["trees"]
        header = ["op", *trees.values()]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for op in OPS:
            row = [op]
            for key in trees:
                cell = run["ops"].get(op, {}).get(key)
                if cell is None:
                    row.append("-")
                    continue
                initial = _initial(cell["fastest_peer"])
                row.append(f"{cell['speedup']:.2f}{X} ({initial})")
                if cell["speedup"] < 1.0:
                    behind.append(
                        f"Python {run['python']}, {op} on {trees[key]}: "
                        f"{cell['speedup']:.2f}{X} ({cell['us']:.3g} µs against "
                        f"{cell['fastest_peer']}'s {cell['peer_us']:.3g} µs)"
                    )
            lines.append("| " + " | ".join(row) + " |")
        row = ["flatten_up_to / flatten"]
        row += [
            f"{run['flatten_up_to_vs_flatten'][k]:.2f}{X}"
            if k in run["flatten_up_to_vs_flatten"]
            else "-"
            for k in trees
        ]
        lines += ["| " + " | ".join(row) + " |", ""]
    lines += ["## Where the C engine is behind the fastest peer", ""]
    lines += [f"- {b}" for b in behind] or [f"Nowhere: every cell above is at least 1{X}."]
    return "\n".join(lines) + "\n"


CORPUS_OPS = ("flatten", "unflatten", "leaves", "tree_map", "flatten_up_to")


def render_corpus(runs: list[dict]) -> str:
    """The section of corpus.py's runs: family x operation, one column per version."""
    lines = [
        "",
        "## Corpus: worst ratio per family",
        "",
        "From `benchmarks/corpus.py` in the same folders (`corpus.json`; each one's",
        "`corpus.md` has every tree). Each cell is the C engine's worst speedup against",
        "the fastest peer over the family's trees, with that peer's initial and the tree;",
        "for flatten_up_to, pytree_kit's own flatten time / its flatten_up_to time.",
        "A family's targets (flatten 2, unflatten 1.5, leaves 2.5, tree_map 1.5,",
        f"flatten_up_to 1.5{X}) are judged on this worst cell: MISSED marks a miss.",
        "",
    ]
    notes = [
        f"Python {r['python']}: seed {r['seed']}, pytree_kit {r['pytree_kit']}"
        + (", **--quick**" if r.get("quick") else "")
        for r in runs
    ]
    lines += [f"- {n}" for n in notes] + [""]
    header = ["family", "op", *(f"Python {r['python']}" for r in runs)]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    families = list(dict.fromkeys(f for r in runs for f in r["families"]))
    for family in families:
        for op in CORPUS_OPS:
            row = [family, op]
            for run in runs:
                cell = run["families"].get(family, {}).get(op)
                if not cell:
                    row.append("-")
                    continue
                peer = f"{_initial(cell['worst_peer'])}, " if cell.get("worst_peer") else ""
                text = f"{cell['worst']:.2f}{X} ({peer}{cell['worst_tree']})"
                row.append(text if cell["met"] else f"{text} MISSED")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _initial(name: str) -> str:
    return {
        "jax.tree_util": "j",
        "optree": "o",
        "torch.utils._pytree": "t",
        "torch.utils._cxx_pytree": "c",
        "dm-tree": "d",
    }.get(name, name)


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _output.add_arguments(parser)
    args = parser.parse_args(argv)
    paths = sorted(RESULTS.glob("python3.*/compare.json"), key=_version_key)
    if not paths:
        print("no benchmarks/results/python3.*/compare.json: run compare.py --out first")
        return 1
    runs = [json.loads(p.read_text()) for p in paths]
    page = render(runs)
    corpus_paths = sorted(RESULTS.glob("python3.*/corpus.json"), key=_version_key)
    if corpus_paths:
        page += render_corpus([json.loads(p.read_text()) for p in corpus_paths])
    out = _output.folder(args)
    (out / "versions.md").write_text(page, encoding="utf-8")
    print(page)
    _output.wrote(out / "versions.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
