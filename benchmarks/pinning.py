"""Moving nested batches to a device: the host-side work on any machine, and
pinned host-to-device transfer where CUDA is present.

    python benchmarks/pinning.py [--quick] [--instructions N] [--out DIR | --record]

It writes ``pinning.md`` into ``build/benchmarks/`` (``--record``: into
``benchmarks/results/``, the published figures).

**Host side (every run, on the CPU).** For 1,000 small tensors (float32[64]),
1,000 of three dtypes (float32[64], int64[32], bool[128]), 333 detection
targets (boxes float32[n, 4], scores float32[n], labels int64[n], n from 1 to
7; as a list of dicts, and as a dict of lists) and 10 large tensors
(float32[1M]), ``to_device(batch, device, coalesce=True)`` is timed part by
part, each part alone in a loop:

- flatten: ``pytree_kit.flatten``;
- pack: grouping the tensors and copying each group into the staging buffer
  with one ``torch.cat`` (``_staging.plan`` + ``_staging.write``, and
  ``_staging.refine`` where a dtype's tensors differ in shape);
- copy: the staging buffer's one copy, here to the CPU (``clone``);
- rebuild: cutting the tensors from the copy, one ``unsafe_split`` per group;
- unflatten.

Then the whole call, end to end: with the copy sent to the CPU, and to the
``meta`` device (the copy stubbed: host work alone), beside ``to_device`` tensor
by tensor to the meta device, and ``pin_memory(coalesce=True)``'s packing (what
``PinnedLoader``'s thread does). Best of interleaved rounds, milliseconds.
Target: the coalesced call's host work at most 1.5 ms per 1,000
small tensors.

``--instructions N`` also counts, under callgrind, the instructions of N whole
calls and of N floors (see the table's legend) per small batch: the figures a
noisy machine does not move (about five minutes).

**With CUDA**, for the same three batches, pin + host-to-device copy,
CUDA-event ms from before pinning to after the copies, median of the repeats
after a warm-up:

- coalesced: ``to_device(batch, "cuda", non_blocking=True, coalesce=True)``: the
  batch staged in one reused pinned buffer, one copy (tensors over
  ``STAGE_LIMIT`` through the same buffer, a copy each, packing the next while
  the one before moves);
- pinned, then coalesced: ``pin_memory(coalesce=True)`` (``PinnedLoader``'s
  thread), then ``to_device(..., non_blocking=True, coalesce=True)``, as the
  docs advise;
- pinned coalesced, moved by storage: the same without ``coalesce`` in
  ``to_device``: one copy of the pinned buffer, the tensors rebuilt one by one;
- per tensor: ``pin_memory(batch)`` then ``to_device(..., non_blocking=True)``;
- per tensor, unpinned: ``to_device(..., non_blocking=True)`` from ordinary
  memory (the driver stages each copy);
- consolidated: a batch made by ``consolidate`` beforehand (one storage, as a
  DataLoader worker makes it), then ``pin_memory`` and ``to_device``;
- torch: the DataLoader's own pinning (``torch.utils.data._utils.pin_memory``)
  of an equivalent dict batch, then ``.to(device, non_blocking=True)`` per tensor.

Host allocations are the change in ``torch.cuda.host_memory_stats()`` over the
timed repeats. Targets: coalesced at least 6x per tensor for
1,000 x float32[64], at least 1.0x for 10 x float32[1M].
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable

import _output
import torch
from batches import best_of  # seconds per call, best of interleaved rounds

import pytree_kit as pk
from pytree_kit.torch import PinnedPool, _staging, consolidate, pin_memory, to_device

HOST_TARGET_MS = 1.5  # per 1,000 small tensors
DEVICE = "cuda"  # where the GPU section moves batches


def batches() -> dict[str, Any]:
    mixed = [torch.randn(64), torch.arange(32), torch.ones(128, dtype=torch.bool)]
    g = torch.Generator().manual_seed(0)
    samples = [  # detection targets: one dtype in two shapes past the first dimension
        {
            "boxes": torch.randn(n, 4, generator=g),
            "scores": torch.rand(n, generator=g),
            "labels": torch.randint(0, 91, (n,), generator=g),
        }
        for n in torch.randint(1, 8, (333,), generator=g).tolist()
    ]
    return {
        "1,000 x float32[64]": {"x": [torch.randn(64) for _ in range(1000)]},
        "1,000 of 3 dtypes": {"x": [mixed[i % 3].clone() for i in range(1000)]},
        "333 detection targets, by sample": samples,
        "333 detection targets, by field": {k: [s[k] for s in samples] for k in samples[0]},
        "10 x float32[1M]": {"x": [torch.randn(1 << 20) for _ in range(10)]},
    }


_device_memory: list[torch.Tensor] = [torch.empty(0, dtype=torch.uint8)]


def to_cpu(flat: torch.Tensor, device: Any, non_blocking: bool) -> torch.Tensor:
    """The staging buffer's copy, made on the CPU into memory kept from call to
    call, as a device's caching allocator keeps it (a fresh 256 KB allocation
    each call would time the C library's mmap and page faults instead)."""
    if _device_memory[0].numel() < flat.numel():
        _device_memory[0] = torch.empty(flat.numel(), dtype=torch.uint8)
    return _device_memory[0][: flat.numel()].copy_(flat)


def callables(batch: Any, pool: PinnedPool) -> tuple[dict[str, Callable[[], Any]], list[str]]:
    """The parts of a coalesced to_device, the floor's parts and the whole
    calls, by name; and the names of the parts."""
    leaves, spec = pk.flatten(batch)
    idx, _ = _staging.tensors_in(leaves)
    groups, total = _staging.plan(leaves, idx, exact=True)  # as packing ends
    buf = torch.empty(total, dtype=torch.uint8)
    copy = buf.clone()
    out = list(leaves)
    real_copy = _staging._copy

    def whole_cpu() -> Any:
        _staging._copy = to_cpu
        try:
            return to_device(batch, "meta", coalesce=True, pool=pool)
        finally:
            _staging._copy = real_copy

    def pin_packing() -> Any:
        leaves = pk.flatten(batch)[0]
        out = list(leaves)
        _staging.stage(leaves, _staging.tensors_in(leaves)[0], out, pool)
        return spec.unflatten(out)

    parts = {
        "flatten": lambda: pk.flatten(batch),
        "pack": lambda: pack(leaves, idx, buf),
        "copy": buf.clone,
        "rebuild": lambda: _staging.read(groups, copy, out),
        "unflatten": lambda: spec.unflatten(out),
    }
    # the floor: the three things any implementation that gives back 1,000
    # tensors of 1,000 must do, each in the fewest torch calls and nothing
    # else: read each tensor's dtype and size (its element count: an int, where
    # a shape is a torch.Size the garbage collector tracks), copy them (one cat per dtype
    # and shape), and make (and, for the previous batch, free) the tensors on
    # the copy (one unsafe_split per group)
    dtype = attrgetter("dtype")
    regions = [g.region(copy) for g in groups]
    made: list = [None] * len(groups)

    def make_tensors() -> None:
        for k, (g, region) in enumerate(zip(groups, regions)):
            made[k] = _staging.split(region, g.sizes)

    bound: dict[str, Callable[[], Any]] = {}
    if all(g.rest is not None for g in groups):
        bound = {
            "read sizes": lambda: (list(map(dtype, leaves)), list(map(torch.Tensor.numel, leaves))),
            "one cat": lambda: [torch.cat(g.members, out=r) for g, r in zip(groups, regions)],
            "make tensors": make_tensors,
        }
    wholes = {
        "cpu": whole_cpu,
        "meta": lambda: to_device(batch, "meta", coalesce=True, pool=pool),
        "per tensor": lambda: to_device(batch, "meta", coalesce=False),
        "pin packing": pin_packing,
    }
    return {**parts, **bound, **wholes}, list(parts)


def pack(leaves: list, idx: list[int], buf: torch.Tensor) -> None:
    """Packing as ``to_device`` does it: plan, write, and split up a group
    whose tensors ``cat`` refused (``buf`` is large enough)."""
    groups, _ = _staging.plan(leaves, idx)
    k = _staging.write(groups, buf)
    while k < len(groups):
        groups, _ = _staging.refine(groups, k)
        k = _staging.write(groups, buf, k)


def _plain_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The host-side pool's buffers: plain memory (a CPU build cannot pin)."""
    return torch.empty(numel, dtype=dtype)


def time_batch(
    batch: dict, pool: PinnedPool, rounds: int, number: int
) -> tuple[dict[str, float], list[str]]:
    """Milliseconds of each part of a coalesced to_device, and of the whole calls."""
    fns, parts = callables(batch, pool)
    seconds = best_of(fns, rounds, number)
    return {name: t * 1e3 for name, t in seconds.items()}, parts


def floor(t: dict[str, float]) -> str:
    """The floor's three parts and their sum."""
    if "one cat" not in t:
        return "(0-d tensors)"
    calls = (t["read sizes"], t["one cat"], t["make tensors"])
    return f"{sum(calls):.3f} ({' + '.join(f'{x:.3f}' for x in calls)})"


def host_side(quick: bool) -> tuple[list[str], bool]:
    """The host-side table, and whether every small batch met the target."""
    rounds, number = (2, 3) if quick else (15, 40)
    pool = PinnedPool(allocator=_plain_empty)
    lines = [
        "## Host side, on the CPU",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cores, engine {pk.ENGINE}; best of "
        f"{rounds} interleaved rounds of {number} calls, ms per call.",
        "",
        "| batch | flatten | pack | copy | rebuild | unflatten | parts | **whole, copy to CPU** "
        "| whole, copy stubbed (meta) | per tensor (meta) | pin_memory packing | floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    met = True
    for label, batch in batches().items():
        t, parts = time_batch(batch, pool, rounds, number)
        if label.startswith("1,000") and t["cpu"] > HOST_TARGET_MS:
            met = False
        lines.append(
            f"| {label} | "
            + " | ".join(f"{t[k]:.3f}" for k in parts)
            + f" | {sum(t[k] for k in parts):.3f} | **{t['cpu']:.3f}** | {t['meta']:.3f} "
            f"| {t['per tensor']:.3f} | {t['pin packing']:.3f} | {floor(t)} |"
        )
    lines += [
        "",
        f"Target: the whole coalesced call's host work at most {HOST_TARGET_MS} ms per 1,000 "
        f"small tensors (the copy-to-CPU column, whose copy is a 256 KB memcpy): "
        f"{'met' if met else 'MISSED'}. The meta column stubs the copy, but tensors on the "
        "meta device cost more to make than on the CPU or a GPU. *Floor*: reading every "
        "tensor's dtype and element count, one `torch.cat` per group (dtype and shape past the "
        "first dimension), and making the 1,000 tensors on the copy with one "
        "`unsafe_split` per group (freeing the previous 1,000), each alone: what any "
        "implementation that gives back separate tensors pays. The large batch's "
        "tensors are over `STAGE_LIMIT` and move one by one: its columns time the copy "
        "of 40 MB, not host work per tensor.",
    ]
    return lines, met


def op(label: str, name: str, n: int) -> None:
    """What one process under callgrind runs: ``n`` calls of one callable
    (``floor``: the floor's three parts) inside ``functools.reduce``."""
    fns, _ = callables(batches()[label], PinnedPool(allocator=_plain_empty))
    if name == "floor":
        three = [fns["read sizes"], fns["one cat"], fns["make tensors"]]
        fns["floor"] = lambda: [f() for f in three]
    call = fns[name]
    call(), call()  # warm: the pool's buffer and the copy's memory are made
    functools.reduce(lambda _, __: call(), range(n), None)


def instruction_counts(n: int) -> list[str]:
    """Callgrind's instructions per call of the whole coalesced call (copy to
    the CPU) and of the floor, for the two batches of 1,000 small tensors:
    the figures a noisy machine does not move."""
    from _callgrind import REDUCE, count_in_checkout
    from instructions import ROOT

    cases = [(label, name) for label in list(batches())[:2] for name in ("cpu", "floor")]
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(os.cpu_count()) as ex:
        counts = list(
            ex.map(
                lambda case: count_in_checkout(
                    __file__,
                    ["--op", case[0], case[1], str(n)],
                    ROOT,
                    toggles=REDUCE,
                    out=Path(work) / f"{abs(hash(case))}.out",
                ),
                cases,
            )
        )
    per_call = {case: c / n for case, c in zip(cases, counts)}
    lines = [
        "## Instructions per call (callgrind)",
        "",
        f"Made by `python benchmarks/pinning.py --instructions {n}`: {n} calls counted "
        "after two warm ones, each case in its own process.",
        "",
        "| batch | whole, copy to CPU | floor | whole / floor |",
        "|---|---|---|---|",
    ]
    for label in list(batches())[:2]:
        whole, low = per_call[(label, "cpu")], per_call[(label, "floor")]
        lines.append(f"| {label} | {whole / 1e6:.2f} M | {low / 1e6:.2f} M | {whole / low:.2f} |")
    return lines


def host_allocs() -> dict[str, float]:
    stats = torch.cuda.host_memory_stats()
    return {k: float(v) for k, v in stats.items() if "alloc" in k and isinstance(v, (int, float))}


def measure(fn: Callable[[], Any], repeats: int) -> tuple[float, float, dict[str, float]]:
    """Median CUDA-event ms, median ms the call held the host, host allocations."""
    fn()  # warm-up
    torch.cuda.synchronize()
    before = host_allocs()
    times, host = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        out = fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        del out
    after = host_allocs()
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    return statistics.median(times), statistics.median(host), delta


def on_gpu(quick: bool) -> list[str]:
    repeats = 3 if quick else 30
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

    pool = PinnedPool()
    lines = [
        "## On the GPU",
        "",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, "
        f"Python {platform.python_version()}; median of {repeats} repeats after a warm-up, "
        "CUDA-event ms from before pinning to after the copies.",
        "",
        "| batch | way | ms | host ms | vs per tensor | host allocation counters (change) |",
        "|---|---|---|---|---|---|",
    ]
    for label, batch in batches().items():
        whole = consolidate(batch)  # made beforehand, as a DataLoader worker does
        ways: dict[str, Callable[[], Any]] = {
            "coalesced": lambda b=batch: to_device(
                b, DEVICE, non_blocking=True, coalesce=True, pool=pool
            ),
            "pinned, then coalesced": lambda b=batch: to_device(
                pin_memory(b, coalesce=True, pool=pool),
                DEVICE,
                non_blocking=True,
                coalesce=True,
                pool=pool,
            ),
            "pinned coalesced, moved by storage": lambda b=batch: to_device(
                pin_memory(b, coalesce=True, pool=pool),
                DEVICE,
                non_blocking=True,
                pool=pool,
                coalesce=False,
            ),
            "per tensor": lambda b=batch: to_device(
                pin_memory(b, coalesce=False), DEVICE, non_blocking=True, coalesce=False
            ),
            "per tensor, unpinned": lambda b=batch: to_device(
                b, DEVICE, non_blocking=True, coalesce=False
            ),
            "consolidated (beforehand)": lambda b=whole: to_device(
                pin_memory(b, coalesce=False), DEVICE, non_blocking=True, coalesce=False
            ),
            "torch DataLoader pinning": lambda b=batch: [
                t.to(DEVICE, non_blocking=True) for t in pk.leaves(torch_pin(b))
            ],
        }
        results = {name: measure(fn, repeats) for name, fn in ways.items()}
        base = results["per tensor"][0]
        for name, (ms, host, allocs) in results.items():
            shown = ", ".join(f"{k} {v:+.0f}" for k, v in sorted(allocs.items()) if v)
            cells = [label, name, f"{ms:.3f}", f"{host:.3f}", f"{base / ms:.2f}x", shown or "none"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke run)")
    _output.add_arguments(parser)
    parser.add_argument(
        "--instructions", type=int, metavar="N", help="also count N calls under callgrind"
    )
    parser.add_argument("--op", nargs=3, help=argparse.SUPPRESS)  # one callgrind case
    args = parser.parse_args()
    if args.op:
        op(args.op[0], args.op[1], int(args.op[2]))
        return 0
    lines = ["# Moving nested batches to a device", ""]
    host, _ = host_side(args.quick)
    lines += [*host, ""]
    if args.instructions:
        lines += [*instruction_counts(args.instructions), ""]
    if torch.cuda.is_available():
        lines += on_gpu(args.quick)
    else:
        lines.append("No CUDA device here: the GPU ratios were not measured in this run.")
    text = "\n".join(lines) + "\n"
    _output.write_report(args, "pinning.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
