"""Pinned host memory and host-to-device transfer, four ways (needs CUDA).

    python benchmarks/pinning.py [--quick] [--out benchmarks/results]

For two batches, 1,000 small tensors (float32[64]) and 10 large ones
(float32[1M]), it times pin + host-to-device copy:

- coalesced: ``pin_memory(batch, coalesce=True)`` then ``to_device(...,
  non_blocking=True)``: one pinned buffer and one copy per dtype;
- per tensor: ``pin_memory(batch)`` then ``to_device(..., non_blocking=True)``;
- consolidated: a batch made by ``consolidate`` beforehand (one storage for all
  its tensors, as a DataLoader worker makes it), then ``pin_memory`` and
  ``to_device``: one pinned allocation and one copy in all;
- torch: the DataLoader's own pinning (``torch.utils.data._utils.pin_memory``)
  of an equivalent dict batch, then ``.to(device, non_blocking=True)`` per tensor.

Times are CUDA-event milliseconds from before pinning to after the copies,
median of the repeats after a warm-up; host allocations are the change in
``torch.cuda.host_memory_stats()`` over the timed repeats. Without CUDA it
says so and measures nothing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

import pytree_kit as pk
from pytree_kit.torch import PinnedPool, consolidate, pin_memory, to_device


def batches() -> dict[str, dict]:
    return {
        "1,000 x float32[64]": {"x": [torch.randn(64) for _ in range(1000)]},
        "10 x float32[1M]": {"x": [torch.randn(1 << 20) for _ in range(10)]},
    }


def host_allocs() -> dict[str, float]:
    stats = torch.cuda.host_memory_stats()
    return {k: float(v) for k, v in stats.items() if "alloc" in k and isinstance(v, (int, float))}


def measure(fn: Callable[[], Any], repeats: int) -> tuple[float, dict[str, float]]:
    fn()  # warm-up
    torch.cuda.synchronize()
    before = host_allocs()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        del out
    after = host_allocs()
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    return statistics.median(times), delta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke run)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("pinning benchmark: no CUDA device here, so nothing was measured")
        return 0
    repeats = 3 if args.quick else 30
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

    pool = PinnedPool()
    lines = [
        "# Pinned memory and host-to-device transfer",
        "",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, "
        f"Python {platform.python_version()}; median of {repeats} repeats after a warm-up, "
        "CUDA-event ms from before pinning to after the copies.",
        "",
        "| batch | way | ms | speedup vs per tensor | host allocation counters (change) |",
        "|---|---|---|---|---|",
    ]
    for label, batch in batches().items():
        # made beforehand, as a DataLoader worker does (collate(consolidate=True))
        whole = consolidate(batch)
        ways: dict[str, Callable[[], Any]] = {
            "coalesced": lambda b=batch: to_device(
                pin_memory(b, coalesce=True, pool=pool), "cuda", non_blocking=True, pool=pool
            ),
            "per tensor": lambda b=batch: to_device(pin_memory(b), "cuda", non_blocking=True),
            "consolidated (beforehand)": lambda b=whole: to_device(
                pin_memory(b), "cuda", non_blocking=True
            ),
            "torch DataLoader pinning": lambda b=batch: [
                t.to("cuda", non_blocking=True) for t in pk.leaves(torch_pin(b))
            ],
        }
        results = {name: measure(fn, repeats) for name, fn in ways.items()}
        base = results["per tensor"][0]
        for name, (ms, allocs) in results.items():
            shown = ", ".join(f"{k} {v:+.0f}" for k, v in sorted(allocs.items()) if v)
            lines.append(f"| {label} | {name} | {ms:.3f} | {base / ms:.2f}x | {shown or 'none'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pinning.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
