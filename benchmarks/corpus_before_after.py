"""pytree_kit's speed on the corpus before and after a change, timed in one run.

``corpus.py`` times pytree_kit against its peers. To see whether a change to
pytree_kit itself (a refactoring that should cost nothing) moved its speed,
this script times two checkouts of pytree_kit on the same trees: ``--baseline
DIR`` (another commit, its C engine built in place for the same Python) and
this checkout. Each round runs one process per checkout, the order
alternating from round to round, so that a change in the machine's load
between them falls on both alike; each process draws corpus.py's trees (the
same seed, this checkout's drawing code) and times the active engine's
flatten, unflatten, leaves, tree_map and flatten_up_to on each, with
corpus.py's machinery (warm-up, calibrated loops, interleaved repeats,
median). A cell is the median over the rounds; the ratio is before ÷ after
(above 1: faster now). One process can run a whole build's calls 40 % slower
than the next (where its memory lands), so it takes rounds to see past that;
the report gives the run's own noise beside the ratios: each checkout
against itself, the median of its even rounds over that of its odd ones.

    python benchmarks/corpus_before_after.py --baseline /tmp/base --out /tmp/x
    python benchmarks/corpus_before_after.py --baseline /tmp/base --families records,chain
    python benchmarks/corpus_before_after.py --baseline /tmp/base --record   # python3.X/

The report (``corpus_before_after.md``) and its figures (``.json``) go to
``--out DIR`` (default ``build/benchmarks/python3.X/``) or, with ``--record``,
``benchmarks/results/python3.X/``. The child processes take their pytree_kit
from ``PYTHONPATH``; each checks that the one it imported is the checkout it
was given, and which engine it runs (the C engine on both, or the run fails).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import _output
from _peers import OPS

ROOT = Path(__file__).resolve().parent.parent


def child(families: list[str], seed: int, quick: bool, out: Path) -> None:
    """Times this process's pytree_kit on the corpus; writes {tree: {op: s}}."""
    import _peers
    import corpus

    import pytree_kit as pk

    settings = _peers.settings_for(
        quick,
        None if quick else corpus.FULL_MIN_TIME,
        None if quick else corpus.FULL_REPEATS,
    )
    notes: list[str] = []
    ours = next(
        lib
        for lib in _peers.load_libraries(["(no peer)"], notes)
        if lib.name == f"pytree_kit ({pk.ENGINE})"
    )
    fams = [f for f in corpus.FAMILIES if not families or f.name in families]
    fams = [f for f in fams if f.requires != "attrs" or corpus.attrs is not None]
    corpus.leaf_pool()
    cells: dict[str, Any] = {}
    for fam, size, variant in corpus.corpus_points(fams, quick):
        drawn = corpus.draw_one(fam, size, variant, seed)
        expected = len(pk._pure.leaves(drawn.tree, None, None))
        calls = _peers._calls_checked(ours, drawn.tree, expected)
        timed = _peers.measure_many(
            {op: calls[op] for op in OPS if not isinstance(calls[op], str)},
            settings.min_time,
            settings.repeats,
        )
        cells[drawn.tree_id] = {
            "family": drawn.family,
            "label": drawn.label,
            "leaves": expected,
            "s": timed,
        }
    info = {"file": pk.__file__, "engine": pk.ENGINE, "trees": cells}
    out.write_text(json.dumps(info))


def run_child(checkout: Path, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", str(out), "--seed", str(args.seed)]
    cmd += ["--families", args.families] if args.families else []
    cmd += ["--quick"] if args.quick else []
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run(cmd, check=True, env=env, cwd=tempfile.gettempdir())
    got = json.loads(out.read_text())
    if not Path(got["file"]).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"the child imported {got['file']}, not the checkout {checkout}")
    if got["engine"] != "c":
        raise SystemExit(f"{checkout}: the C engine is not built there ({got['engine']})")
    return got["trees"]


def combine(rounds: list[dict]) -> dict:
    """{tree: {op: median seconds over the rounds}}, with the tree's family and label."""
    out: dict = {}
    for tid, first in rounds[0].items():
        ops = {}
        for op in first["s"]:
            values = [r[tid]["s"][op] for r in rounds if isinstance(r[tid]["s"].get(op), float)]
            if values:
                ops[op] = statistics.median(values)
        out[tid] = {"family": first["family"], "label": first["label"], "s": ops}
    return out


def ratios_of(num: dict, den: dict) -> dict:
    """{(family, op): [num ÷ den of each tree]}."""
    out: dict = {}
    for tid, d in den.items():
        for op in OPS:
            if op in d["s"] and op in num[tid]["s"]:
                out.setdefault((d["family"], op), []).append(num[tid]["s"][op] / d["s"][op])
    return out


def _cell(rs: Optional[list]) -> str:
    return f"{statistics.geometric_mean(rs):.2f} ({min(rs):.2f} to {max(rs):.2f})" if rs else "n/a"


def report(got: dict, args: argparse.Namespace, base_rev: str) -> tuple:
    """The report's lines and figures from {"before": [rounds], "after": [rounds]}.

    Beside before ÷ after, the same run gives its own noise: each checkout
    against itself, the median of its even rounds over that of its odd ones
    (with half the rounds each, so a wider spread than the full medians')."""
    before, after = combine(got["before"]), combine(got["after"])
    ratios = ratios_of(before, after)
    halves = {
        name: ratios_of(combine(got[name][0::2]), combine(got[name][1::2]))
        for name in ("before", "after")
    }
    lines = [
        "# pytree_kit on the corpus, before and after",
        "",
        f"Python {sys.version.split()[0]}; before: `{base_rev}` ({args.baseline}); "
        f"after: `{_revision(ROOT)}` (this checkout); the C engine on both; seed "
        f"{args.seed}; {args.rounds} rounds, each one process per checkout, the order "
        f"alternating; a cell is the median over the rounds; ratio = before ÷ after "
        f"(above 1: faster now). Made by `benchmarks/corpus_before_after.py`.",
        "",
    ]
    everything = [r for rs in ratios.values() for r in rs]
    noise = {name: [r for rs in h.values() for r in rs] for name, h in halves.items()}
    lines += [
        "## Summary",
        "",
        f"before ÷ after, {len(everything)} cells: geometric mean "
        f"**{statistics.geometric_mean(everything):.3f}**, range {min(everything):.2f} to "
        f"{max(everything):.2f}.",
        "",
        "The noise of this run: each checkout against itself (its even rounds ÷ its "
        "odd ones): "
        + ", ".join(
            f"{name} {statistics.geometric_mean(rs):.3f} ({min(rs):.2f} to {max(rs):.2f})"
            for name, rs in noise.items()
        )
        + ".",
        "",
        "| family | op | before ÷ after | before ÷ before | after ÷ after |",
        "|---|---|---|---|---|",
    ]
    families = list(dict.fromkeys(a["family"] for a in after.values()))
    for fam in families:
        for op in OPS:
            key = (fam, op)
            lines.append(
                f"| {fam} | {op} | {_cell(ratios.get(key))} | "
                f"{_cell(halves['before'].get(key))} | {_cell(halves['after'].get(key))} |"
            )
    rows = []
    for tid, a in after.items():
        cells = []
        for op in OPS:
            b = before[tid]["s"].get(op)
            cells.append(
                f"{a['s'][op] * 1e6:.3g} / {b / a['s'][op]:.2f}" if b and op in a["s"] else "n/a"
            )
        rows.append(f"| {a['family']} | {a['label']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each cell: the geometric mean of the family's ratios (their range).",
        "",
        "## Every tree",
        "",
        "Each cell: µs a call now / ratio before ÷ after.",
        "",
        "| family | tree | " + " | ".join(OPS) + " |",
        "|---|---|" + "---|" * len(OPS),
        *rows,
        "",
    ]
    data = {
        "python": sys.version.split()[0],
        "before": base_rev,
        "after": _revision(ROOT),
        "rounds": args.rounds,
        "seed": args.seed,
        "before_s": before,
        "after_s": after,
        "gmean": statistics.geometric_mean(everything),
        "noise_gmean": {name: statistics.geometric_mean(rs) for name, rs in noise.items()},
    }
    return lines, data


def _revision(where: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, help="a checkout built in place to compare with")
    p.add_argument("--rounds", type=int, default=8, help="processes per checkout (8)")
    p.add_argument("--families", default="", help="comma-separated families (default: all)")
    p.add_argument("--seed", type=int, default=21, help="the seed of the draw (corpus.py's)")
    p.add_argument("--quick", action="store_true", help="the smallest sizes, short loops")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    _output.add_arguments(p, sub=_output.PYTHON)
    args = p.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    if args.child:
        child(families, args.seed, args.quick, args.child)
        return 0
    if args.baseline is None:
        p.error("--baseline DIR is needed")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        got: dict[str, list] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = [("before", args.baseline), ("after", ROOT)]
            for name, where in order if r % 2 == 0 else order[::-1]:
                print(f"round {r + 1}: {name} ({where})", file=sys.stderr, flush=True)
                got[name].append(run_child(where, args, Path(tmp) / f"{name}{r}.json"))
    lines, data = report(got, args, _revision(args.baseline))
    lines.insert(3, f"Took {time.perf_counter() - start:.0f} s.")
    print("\n".join(lines))
    folder = _output.folder(args, _output.PYTHON)
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / "corpus_before_after.md", folder / "corpus_before_after.json"
    md.write_text("\n".join(lines))
    js.write_text(json.dumps(data, indent=1))
    _output.wrote(md, js)
    return 0


if __name__ == "__main__":
    sys.exit(main())
