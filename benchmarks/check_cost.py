"""The cost of the check for tensors hidden in leaves, in instructions.

``to_device`` with the check (``strict=True``, the default) against without
it (``strict=False``), counted by callgrind, which a noisy machine does not
disturb: each tree runs in three processes under ``valgrind --tool=callgrind``
(setup and one warm call; then N more calls with the check; then N more
without), and a call's count is the difference from the first, over N.

    python benchmarks/check_cost.py            # writes build/benchmarks/check_cost.md
    python benchmarks/check_cost.py --record   # writes benchmarks/results/check_cost.md
    python benchmarks/check_cost.py --n 20 --out /tmp/x   # a shorter run
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import _output
from _callgrind import count

TREES = {
    "1,000 tensors": "tensors",
    "250 samples of tensor, int, str, None": "mixed",
    "250 samples of tensor and an object without tensors": "objects",
}


class Meta:
    """An object leaf with no tensors (as in batches.py): searched, nothing found."""

    def __init__(self, i: int) -> None:
        self.name, self.size, self.tags = f"img{i}", (480, 640), ["a", "b"]


def tree(name: str) -> Any:
    import torch

    g = torch.Generator().manual_seed(0)
    if name == "tensors":
        return {f"layer{i}.weight": torch.rand(4, generator=g) for i in range(1000)}
    if name == "mixed":
        return [
            {"image": torch.rand(3, 4, generator=g), "label": i, "name": f"s{i}", "mask": None}
            for i in range(250)
        ]
    return [{"image": torch.rand(3, 4, generator=g), "meta": Meta(i)} for i in range(250)]


def op(name: str, strict: bool, n: int) -> None:
    """What one process under callgrind runs."""
    from pytree_kit.torch import to_device

    t = tree(name)
    to_device(t, "cpu", strict=strict)  # plans made, caches filled
    for _ in range(n):
        to_device(t, "cpu", strict=strict)


def instructions(name: str, strict: bool, n: int, work: Path) -> int:
    args = ["--op", name, "strict" if strict else "loose", str(n)]
    return count(__file__, args, out=work / f"{name}-{strict}-{n}.out")


def measure(n: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {
            (label, strict, k): pool.submit(instructions, name, strict, k, Path(tmp))
            for label, name in TREES.items()
            for strict, k in ((True, 0), (True, n), (False, n))
        }
        for label in TREES:
            base = runs[(label, True, 0)].result()
            strict = (runs[(label, True, n)].result() - base) / n
            loose = (runs[(label, False, n)].result() - base) / n
            rows.append({"input": label, "strict": strict, "loose": loose})
    return rows


def report(rows: list[dict], n: int) -> str:
    import torch

    lines = [
        "# The check for leaves that hold tensors, in instructions",
        "",
        f"Machine: {platform.machine()}; Python {platform.python_version()}; "
        f"torch {torch.__version__}.",
        "",
        f"Made by `python benchmarks/check_cost.py --n {n}`: callgrind's instruction counts "
        "of one `to_device` call to the CPU the tensors are on, with the check "
        "(`strict=True`, the default) and without it (`strict=False`).",
        "",
        "| input | strict Ir | strict=False Ir | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r["strict"] / r["loose"]
        lines.append(f"| {r['input']} | {r['strict']:,.0f} | {r['loose']:,.0f} | {ratio:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="calls counted per process")
    _output.add_arguments(parser)
    parser.add_argument("--op", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.op:
        name, mode, n = args.op
        op(name, mode == "strict", int(n))
        return 0
    text = report(measure(args.n), args.n)
    _output.write_report(args, "check_cost.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
