"""Differential fuzz: the C engine against the pure engine on hostile input.

Each case is a seed. ``scripts/corpus/hostile.py`` builds a tree from it (twice, a
fresh copy per engine, since hostile objects keep state), runs flatten,
leaves, flatten_with_path, unflatten (often with hostile iterables) and
flatten_up_to on it, and records every result or exception type and message.
The two records must be equal; a crash kills the process, so the seed being
run is kept in ``--progress`` for the post-mortem.

    python scripts/fuzz_engines.py --cases 100000          # the long run
    python scripts/fuzz_engines.py --cases 2000 --seed 7   # a quick one

Exit status 1 if any case differs (each is printed with its seed, so
``--seed S --cases 1`` replays it).
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytree_kit import _pure  # noqa: E402
from scripts.corpus import hostile  # noqa: E402


def compare(seed: int, speedups: Any) -> tuple[list, list]:
    """The records of case ``seed`` from the pure engine and from the C engine."""
    return hostile.run_case(_pure, seed), hostile.run_case(speedups, seed)


def summary(record: list) -> str:
    """How the first flatten of a case ended: 'ok' or the exception type."""
    first = record[0][1]  # canon(("ok", result)) or canon(("raise", type, message))
    return "ok" if first[0] == "ok" else first[1]


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"step {i}:\n    pure: {str(x)[:600]}\n    C:    {str(y)[:600]}"
    return f"record lengths differ: pure {len(a)}, C {len(b)}"


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000, help="number of seeds (100,000)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (0)")
    ap.add_argument(
        "--progress",
        default=os.path.join(tempfile.gettempdir(), "fuzz_engines.progress"),
        help="file that holds the seed being run (for a crash or a hang)",
    )
    ap.add_argument("--max-failures", type=int, default=20, help="stop after this many")
    ap.add_argument(
        "--case-timeout",
        type=float,
        default=120.0,
        help="seconds one case may take; past it, the stacks are printed and the run "
        "exits 1 (a hang is a failure; --progress names the seed)",
    )
    args = ap.parse_args(argv)

    from pytree_kit import _speedups  # the fuzz is pointless without it: fail loudly

    faulthandler.enable()
    progress = os.open(args.progress, os.O_WRONLY | os.O_CREAT, 0o644)
    print(f"fuzz_engines: the seed being run is kept in {args.progress}", flush=True)
    start = time.perf_counter()
    failures = 0
    outcomes: collections.Counter = collections.Counter()
    for seed in range(args.seed, args.seed + args.cases):
        os.pwrite(progress, f"{seed:<20d}\n".encode(), 0)
        faulthandler.dump_traceback_later(args.case_timeout, exit=True)
        a, b = compare(seed, _speedups)
        faulthandler.cancel_dump_traceback_later()
        if a != b:
            failures += 1
            print(f"DIFFERENT seed={seed}: {_first_difference(a, b)}", flush=True)
            if failures >= args.max_failures:
                break
        else:
            outcomes[summary(a)] += 1
        done = seed - args.seed + 1
        if done % 10_000 == 0:
            rate = done / (time.perf_counter() - start)
            print(f"  {done} cases, {failures} different, {rate:.0f} cases/s", flush=True)
    elapsed = time.perf_counter() - start
    ran = sum(outcomes.values()) + failures
    print(
        f"fuzz_engines: {ran} cases (seeds {args.seed}..{args.seed + ran - 1}), "
        f"{failures} different, {elapsed:.1f} s; first flatten of the agreeing cases: "
        + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
