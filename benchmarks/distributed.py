"""all_reduce_tree against one all_reduce per tensor, 2 ranks on gloo (CPU).

    python benchmarks/distributed.py [--quick] [--out DIR | --record]
    python benchmarks/distributed.py --backend nccl --world 1   # on a GPU machine

The script starts its own ranks (fresh processes joined over 127.0.0.1 on a
free port) and rank 0 writes ``distributed.md`` into ``build/benchmarks/``
(``--out DIR``: into DIR; ``--record``: into ``benchmarks/results/``, the
published figures). For each tree (N small tensors, N = 10, 100, 1,000,
10,000; and 1,000 tensors of three dtypes) it times, in the same processes:

- ``all_reduce_tree(tree)``: flatten, the cross-rank structure check, one
  collective per bucket (dtype, device, at most 25 MB), unpack;
- per tensor: ``dist.all_reduce(t)`` on every tensor in turn, the way metrics
  are usually reduced;
- per tensor, async: every ``all_reduce(t, async_op=True)`` issued, then all
  waited on;
- floor: one ``all_reduce`` of a buffer already holding every tensor (what a
  single collective costs, with no packing).

Times are the median of the repeats (30, fewer for the largest trees) after a
warm-up, with a barrier before
each repeat. The target is ``all_reduce_tree`` at least 10x faster than the
per-tensor loop at 1,000 tensors.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import _output

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET = 10.0
TARGET_N = 1000


def trees(quick: bool, device: str) -> dict[str, Any]:
    import torch

    sizes = [10, 1000] if quick else [10, 100, 1000, 10_000]
    out: dict[str, Any] = {}
    for n in sizes:
        out[f"{n:,} x float32[8]"] = {"metrics": [torch.randn(8, device=device) for _ in range(n)]}
    dtypes = [torch.float32, torch.float64, torch.int64]
    out["1,000 x 3 dtypes"] = {
        "per_class": [(torch.rand(4, device=device) * 10).to(dtypes[i % 3]) for i in range(1000)]
    }
    return out


def timed(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    import torch.distributed as dist

    fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(tree: Any, repeats: int, sync: Callable[[], None]) -> tuple:
    """(tensors, all_reduce_tree, per tensor, per tensor async, floor), in seconds."""
    import torch
    import torch.distributed as dist

    import pytree_kit as pk
    from pytree_kit.torch import all_reduce_tree

    tensors = pk.leaves(tree)

    def per_tensor() -> None:
        for t in tensors:
            dist.all_reduce(t)

    def per_tensor_async() -> None:
        for w in [dist.all_reduce(t, async_op=True) for t in tensors]:
            w.wait()

    floor_buf = torch.cat([t.reshape(-1).double() for t in tensors])

    def floor() -> None:
        dist.all_reduce(floor_buf)

    # correctness, in the same run: the tree's sums equal the loop's
    want = [t.clone() for t in tensors]
    for t in want:
        dist.all_reduce(t)
    for a, b in zip(pk.leaves(all_reduce_tree(tree)), want):
        torch.testing.assert_close(a, b)

    ours = timed(lambda: all_reduce_tree(tree), repeats, sync)
    return (
        len(tensors),
        ours,
        timed(per_tensor, repeats, sync),
        timed(per_tensor_async, repeats, sync),
        timed(floor, repeats, sync),
    )


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import pytree_kit as pk

    dist.init_process_group(
        args.backend,
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=120),
    )
    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(args.rank)
        device = f"cuda:{args.rank}"

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    repeats = 3 if args.quick else 30
    rows = []
    for label, tree in trees(args.quick, device).items():
        n = len(pk.leaves(tree))
        # fewer repeats where one per-tensor loop takes seconds
        rows.append((label, *measure(tree, max(min(repeats, 5), min(repeats, 30_000 // n)), sync)))
    if args.rank == 0:
        write_report(args, rows)
    dist.destroy_process_group()


def write_report(args: argparse.Namespace, rows: list) -> None:
    import torch

    def ms(s: float) -> str:
        return f"{s * 1e3:,.3f}"

    lines = [
        "# all_reduce_tree vs one all_reduce per tensor",
        "",
        f"Backend {args.backend}, {args.world} rank(s) on one machine; "
        f"{'quick run' if args.quick else 'full run'}. "
        "Median milliseconds per call after a warm-up; speedup = per-tensor loop ÷ "
        "all_reduce_tree. Produced by `python benchmarks/distributed.py`.",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    target_row = next(r for r in rows if r[1] == TARGET_N)
    speedup = target_row[3] / target_row[2]
    met = "yes" if speedup >= TARGET else "MISSED"
    lines.append(
        f"| all_reduce_tree ≥ {TARGET:g}x faster than {TARGET_N:,} all_reduce calls "
        f"| {speedup:,.1f}x | {met} |"
    )
    lines += [
        "",
        "## Times",
        "",
        "| tree | tensors | all_reduce_tree | per tensor | per tensor, async | "
        "floor (1 collective) | speedup vs per tensor | vs async |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, n, ours, loop, loop_async, one in rows:
        lines.append(
            f"| {label} | {n:,} | {ms(ours)} | {ms(loop)} | {ms(loop_async)} | {ms(one)} "
            f"| {loop / ours:,.1f}x | {loop_async / ours:,.1f}x |"
        )
    lines += [
        "",
        "## Machine",
        "",
        f"- Python {platform.python_version()}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}",
        f"- {platform.platform()}",
    ]
    if args.backend == "nccl":
        lines.append(f"- GPU: {torch.cuda.get_device_name(0)}")
    # launch() passed the folder it chose as --out
    _output.write_report(args, "distributed.md", "\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: argparse.Namespace) -> int:
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    base = [sys.executable, __file__, "--port", str(port), "--world", str(args.world)]
    base += ["--backend", args.backend, "--out", str(_output.folder(args))]
    if args.quick:
        base.append("--quick")
    procs = [subprocess.Popen([*base, "--rank", str(r)], env=env) for r in range(args.world)]
    try:
        codes = [p.wait(timeout=args.timeout) for p in procs]
    except subprocess.TimeoutExpired:
        print(f"timed out after {args.timeout} s", file=sys.stderr)
        codes = [1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return max(codes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    _output.add_arguments(parser)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is None:
        return launch(args)
    rank_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
