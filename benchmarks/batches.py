"""Batches: collate against default_collate, consolidate against tensordict, a
DataLoader's throughput with plain and consolidated batches, and the cost of
the check for leaves that hold tensors.

    python benchmarks/batches.py            # full run, writes build/benchmarks/batches.md
    python benchmarks/batches.py --record   # the same, into benchmarks/results/batches.md
    python benchmarks/batches.py --quick    # a smoke run (CI), writes nothing unless --out DIR

tensordict's ``consolidate()`` is compared when tensordict is installed
(``pip install -c constraints.txt tensordict``).

Every comparison runs in one process, in interleaved rounds; each figure is the
best of its rounds (the least disturbed by a noisy machine), and each ratio is
ours / theirs for times (below 1 is faster) or ours / theirs for throughput.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from typing import Any, Callable, NamedTuple

import _output
import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

import pytree_kit as pk
from pytree_kit.torch import collate, consolidate, to_device


def best_of(fns: dict[str, Callable[[], Any]], rounds: int, number: int) -> dict[str, float]:
    """Seconds per call of each function: the best of ``rounds`` interleaved rounds."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / number)
    return best


def microseconds(
    ours: Callable[[], Any], theirs: Callable[[], Any], rounds: int, number: int
) -> tuple[float, float]:
    """Microseconds per call of ``ours`` and ``theirs``, timed in the same interleaved rounds."""
    t = best_of({"ours": ours, "theirs": theirs}, rounds, number)
    return t["ours"] * 1e6, t["theirs"] * 1e6


# -- the inputs ------------------------------------------------------------------


@dataclasses.dataclass
class Record:
    image: torch.Tensor
    boxes: torch.Tensor
    label: int


class RecordNT(NamedTuple):
    image: torch.Tensor
    boxes: torch.Tensor
    label: int


class RecordP:
    """A protocol class (``__tree_flatten__``) with the same three fields."""

    def __init__(self, image: Any, boxes: Any, label: Any) -> None:
        self.image, self.boxes, self.label = image, boxes, label

    def __tree_flatten__(self) -> tuple:
        return (self.image, self.boxes, self.label), None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> RecordP:
        return cls(*children)


class RecordD(RecordP):
    """The same, with its children as a dict (named paths)."""

    def __tree_flatten__(self) -> tuple:
        return {"image": self.image, "boxes": self.boxes, "label": self.label}, None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> RecordD:
        return cls(**children)


def record(i: int, side: int = 8) -> dict:
    return {"image": torch.rand(3, side, side), "boxes": torch.rand(2, 4), "label": i}


def inputs(n: int) -> dict[str, tuple[list, list]]:
    """name -> (samples for collate, the equivalent samples for default_collate)."""
    dicts = [record(i) for i in range(n)]
    out: dict[str, tuple[list, list]] = {
        f"dict: image 3x8x8, boxes 2x4, label int (x{n})": (dicts, dicts),
        f"tensors 3x8x8 (x{n})": ([d["image"] for d in dicts],) * 2,
        f"tensors 2x4 (x{n})": ([d["boxes"] for d in dicts],) * 2,
        f"tuples (3x8x8, 2x4) (x{n})": ([(d["image"], d["boxes"]) for d in dicts],) * 2,
        f"dict of numbers: int, float, bool (x{n})": (
            [{"i": i, "f": i / 3, "b": i % 2 == 0} for i in range(n)],
        )
        * 2,
        f"dict of numpy arrays 3x8x8, 2x4 (x{n})": (
            [{"image": d["image"].numpy(), "boxes": d["boxes"].numpy()} for d in dicts],
        )
        * 2,
        f"dict of numpy scalars: int64, float32 (x{n})": (
            [{"i": np.int64(i), "f": np.float32(i / 3)} for i in range(n)],
        )
        * 2,
        f"dict: image 3x8x8, name str (x{n})": (
            [{"image": d["image"], "name": f"img{i}"} for i, d in enumerate(dicts)],
        )
        * 2,
        f"nested dicts, 6 tensors (x{n})": (
            [
                {
                    "a": {"x": d["boxes"], "y": d["boxes"]},
                    "b": {"z": d["image"], "w": d["boxes"]},
                    "c": [d["boxes"], d["boxes"]],
                }
                for d in dicts
            ],
        )
        * 2,
        "dict: image 3x224x224, boxes, label (x64)": ([record(i, 224) for i in range(64)],) * 2,
        "dict: image 3x8x8, boxes, label (x8)": (dicts[:8], dicts[:8]),
        f"dataclass vs the same dicts (x{n})": ([Record(**d) for d in dicts], dicts),
        f"namedtuple vs the same dicts (x{n})": ([RecordNT(**d) for d in dicts], dicts),
        f"protocol class vs the same dicts (x{n})": ([RecordP(**d) for d in dicts], dicts),
        f"protocol class, dict children, vs the same dicts (x{n})": (
            [RecordD(**d) for d in dicts],
            dicts,
        ),
    }
    return out


def bench_collate(quick: bool) -> list[dict]:
    n = 100 if quick else 1000
    rounds, number = (3, 2) if quick else (30, 5)
    rows = []
    for name, (ours_in, theirs_in) in inputs(n).items():
        # the two give the same batch (ours keeps each container's type)
        ours_out, theirs_out = collate(ours_in), default_collate(theirs_in)
        if type(ours_in[0]) is not type(theirs_in[0]):  # records against dicts: by field
            ours_out = {k: getattr(ours_out, k) for k in theirs_out}
        for a, b in zip(pk.leaves(ours_out), pk.leaves(theirs_out)):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b.to(a.dtype)), name
        ours_us, default_us = microseconds(
            lambda ours_in=ours_in: collate(ours_in),
            lambda theirs_in=theirs_in: default_collate(theirs_in),
            rounds,
            number,
        )
        rows.append(
            {
                "input": name,
                "ours_us": ours_us,
                "default_us": default_us,
                "ratio": ours_us / default_us,
            }
        )
    return rows


def bench_consolidate(quick: bool) -> list[dict]:
    try:
        from tensordict import TensorDict
    except ImportError:
        return []
    rows = []
    rounds, number = (3, 1) if quick else (15, 3)
    for count in (100, 1000) if not quick else (100,):
        g = torch.Generator().manual_seed(0)
        tensors = {}
        for i in range(count):
            kind = i % 3
            if kind == 0:
                tensors[f"t{i}"] = torch.rand(8, 4, generator=g)
            elif kind == 1:
                tensors[f"t{i}"] = torch.randint(0, 9, (5,), generator=g)
            else:
                tensors[f"t{i}"] = torch.rand(16, generator=g) > 0.5
        td = TensorDict(tensors, batch_size=[])
        ours = consolidate(tensors)
        theirs = td.consolidate()
        for k in tensors:
            assert torch.equal(ours[k], theirs[k])
        ours_us, td_us = microseconds(
            lambda tensors=tensors: consolidate(tensors),
            lambda td=td: td.consolidate(),
            rounds,
            number,
        )
        rows.append(
            {
                "tensors": count,
                "ours_us": ours_us,
                "tensordict_us": td_us,
                "speedup": td_us / ours_us,
            }
        )
    return rows


# -- the hidden-tensor check ----------------------------------------------------------


class Meta:
    """An object leaf with no tensors: the check searches it, and finds none."""

    def __init__(self, i: int) -> None:
        self.name, self.size, self.tags = f"img{i}", (480, 640), ["a", "b"]


def bench_strict(quick: bool) -> list[dict]:
    """to_device and collate with the check (strict=True, the default) against
    without it (strict=False), on trees with no leaf that holds tensors."""
    rounds, number = (3, 5) if quick else (25, 20)
    g = torch.Generator().manual_seed(0)
    tensors = {f"layer{i}.weight": torch.rand(4, generator=g) for i in range(1000)}
    mixed = [
        {"image": torch.rand(3, 4, generator=g), "label": i, "name": f"s{i}", "mask": None}
        for i in range(250)
    ]
    objects = [{"image": torch.rand(3, 4, generator=g), "meta": Meta(i)} for i in range(250)]
    samples = [record(i) | {"name": f"s{i}"} for i in range(100 if quick else 1000)]
    cases: list[tuple[str, Callable[[bool], Any]]] = [
        ("to_device: 1,000 tensors", lambda strict: to_device(tensors, "cpu", strict=strict)),
        (
            "to_device: 250 samples of tensor, int, str, None",
            lambda strict: to_device(mixed, "cpu", strict=strict),
        ),
        (
            "to_device: 250 samples of tensor and an object without tensors",
            lambda strict: to_device(objects, "cpu", strict=strict),
        ),
        (
            f"collate: {len(samples):,} dicts of tensors, an int and a str",
            lambda strict: collate(samples, strict=strict),
        ),
    ]
    rows = []
    for name, fn in cases:
        strict_us, loose_us = microseconds(
            lambda fn=fn: fn(True), lambda fn=fn: fn(False), rounds, number
        )
        rows.append(
            {
                "input": name,
                "strict_us": strict_us,
                "loose_us": loose_us,
                "ratio": strict_us / loose_us,
            }
        )
    return rows


# -- a DataLoader with workers ------------------------------------------------------


class Ragged(torch.utils.data.Dataset):
    """Samples of ``fields`` small tensors each, of differing lengths."""

    def __init__(self, n: int, fields: int) -> None:
        self.n, self.fields = n, fields

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {
            f"f{k}": torch.rand(int(torch.randint(1, 9, (1,), generator=g)), 2, generator=g)
            for k in range(self.fields)
        }


def plain_collate(samples: list) -> Any:
    return collate(samples, ragged="list")


def consolidated_collate(samples: list) -> Any:
    return collate(samples, ragged="list", consolidate=True)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def bench_loader(quick: bool) -> list[dict]:
    batch_size, fields = 100, 10  # 1,000 small tensors a batch
    batches = 6 if quick else 60
    rows = []
    for name, fn in (("plain", plain_collate), ("consolidated", consolidated_collate)):
        best = 0.0
        for _ in range(1 if quick else 3):
            loader = DataLoader(
                Ragged(batch_size * batches, fields),
                batch_size=batch_size,
                num_workers=2,
                collate_fn=fn,
                multiprocessing_context="fork",
                prefetch_factor=2,
            )
            it = iter(loader)
            first = next(it)  # workers started and warm
            storages = len(
                {
                    t.untyped_storage().data_ptr()
                    for t in pk.leaves(first)
                    if isinstance(t, torch.Tensor)
                }
            )
            tensors = sum(isinstance(t, torch.Tensor) for t in pk.leaves(first))
            peak = _open_fds()
            t0 = time.perf_counter()
            count = 0
            for batch in it:
                count += 1
                peak = max(peak, _open_fds())
                del batch
            elapsed = time.perf_counter() - t0
            best = max(best, count / elapsed)
            del it, loader
        rows.append(
            {
                "batches": name,
                "tensors_per_batch": tensors,
                "storages_per_batch": storages,
                "batches_per_s": best,
                "peak_open_fds": peak,
            }
        )
    return rows


# -- the report ---------------------------------------------------------------------


def report(collates: list, consolidates: list, loaders: list, stricts: list) -> str:
    lines = [
        "# Batches: collate, consolidate, and a DataLoader",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python "
        f"{platform.python_version()}; torch {torch.__version__}; numpy {np.__version__}; "
        f"pytree_kit {pk.__version__} ({pk.ENGINE} engine).",
        "",
        "Made by `python benchmarks/batches.py`. Times are the best of interleaved rounds.",
        "",
        "## collate against `default_collate`",
        "",
        "Target: ratio (ours / default_collate) at most 1.2 on every input.",
        "",
        "| input | collate µs | default_collate µs | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in collates:
        lines.append(
            f"| {r['input']} | {r['ours_us']:,.0f} | {r['default_us']:,.0f} | {r['ratio']:.2f} |"
        )
    lines += [
        "",
        "## consolidate against tensordict's `consolidate()`",
        "",
        "The same tensors (a third each float 8x4, int64 5, bool 16). Target: at least 2x.",
        "",
        "| tensors | consolidate µs | TensorDict.consolidate µs | speedup |",
        "|---:|---:|---:|---:|",
    ]
    for r in consolidates:
        lines.append(
            f"| {r['tensors']:,} | {r['ours_us']:,.0f} | {r['tensordict_us']:,.0f} | "
            f"{r['speedup']:.1f}x |"
        )
    if not consolidates:
        lines.append("| (tensordict is not installed) | | | |")
    lines += [
        "",
        "## A DataLoader with 2 workers, batches of 1,000 small tensors",
        "",
        'Each batch: 100 samples of 10 tensors of 1-8 rows, `collate(ragged="list")`, '
        "against the same with `consolidate=True`. Target: at least 3x the batches per second.",
        "",
        "| batches | tensors a batch | storages (file descriptors) a batch | batches/s | "
        "peak open fds |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in loaders:
        lines.append(
            f"| {r['batches']} | {r['tensors_per_batch']:,} | "
            f"{r['storages_per_batch']:,} | {r['batches_per_s']:.1f} | "
            f"{r['peak_open_fds']} |"
        )
    if len(loaders) == 2:
        lines += [
            "",
            "Consolidated / plain: "
            f"{loaders[1]['batches_per_s'] / loaders[0]['batches_per_s']:.1f}x "
            "the batches per second.",
        ]
    lines += [
        "",
        "## The check for leaves that hold tensors",
        "",
        "The default (`strict=True`: a leaf that holds tensors pytree_kit does not see "
        "raises) against `strict=False`, on trees with no such leaf. `to_device` to the "
        "CPU the tensors are on, so the traversal and the check are all there is to time. "
        "An object leaf is searched (its `__dict__`, slots and what they hold) for tensors.",
        "",
        "| input | strict µs | strict=False µs | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in stricts:
        lines.append(
            f"| {r['input']} | {r['strict_us']:,.1f} | {r['loose_us']:,.1f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    _output.add_arguments(parser)
    parser.add_argument("--skip-loader", action="store_true")
    args = parser.parse_args(argv)
    collates = bench_collate(args.quick)
    consolidates = bench_consolidate(args.quick)
    loaders = [] if args.skip_loader else bench_loader(args.quick)
    stricts = bench_strict(args.quick)
    text = report(collates, consolidates, loaders, stricts)
    if not args.quick or args.out is not None or args.record:
        _output.write_report(args, "batches.md", text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
