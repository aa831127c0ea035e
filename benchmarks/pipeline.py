"""The whole input pipeline, and each of its parts, against torch's own.

    python benchmarks/pipeline.py [--quick] [--workers N] [--rounds R] [--out DIR | --record]

It writes ``pipeline.md`` into ``build/benchmarks/`` (``--record``: into
``benchmarks/results/``; with CUDA, into ``benchmarks/results/gpu_<name>/``).

**Workloads.**

- *tokenizer*: 20,000 samples, each ``input_ids`` and ``attention_mask``
  (int64[128]), a ``label`` (a 0-d tensor) and a nested dict of two 0-d
  float tensors; batches of 64.
- *detection*: 2,000 samples, each a uint8 image [3, 128, 128] and a
  dataclass target of ``boxes`` float32[n, 4] and ``labels`` int64[n], n from
  1 to 7; batches of 16. torch's ``default_collate`` cannot batch a
  dataclass: its pipeline takes the custom collate a user writes (images
  stacked, targets kept as a list) and moves each target's fields by hand.

**Pipelines**, each with the same ``DataLoader`` workers and a tiny model
(an embedding bag or a small conv, forward, backward, step), the second
epoch timed, samples per second, the best of ``--rounds`` rounds (3) that
each run every pipeline once, in turn (one pipeline's epochs move by a
quarter from one to the next on a loaded 2-core machine):

- *torch*: a list dataset, ``DataLoader(pin_memory=True)`` with
  ``default_collate`` (or the custom one), and ``tree_map(lambda t:
  t.to(device, non_blocking=True))`` (by hand for the targets);
- *pytree_kit as the docs advise*: a ``PackedList`` dataset,
  ``pkt.collate(..., consolidate=True)`` (docs/loading.md advises it with
  workers: a worker then sends one shared-memory segment a batch, not one a
  field or a tensor), ``PinnedLoader`` and ``to_device(...,
  non_blocking=True)``, the others at their defaults; and *the same, collate
  at its defaults* (``consolidate=False``);
- each part of ours alone in torch's pipeline: ``PackedList`` (in place of
  the list), ``pkt.collate`` (of ``default_collate``), ``PinnedLoader`` (of
  the DataLoader's pinning), ``to_device`` (of ``tree_map``).

**Parts**, in this process, best of interleaved rounds, per batch:
``pkt.collate`` against ``default_collate`` (and the custom collate) on the
samples of each workload, in this process and as in a worker (where a
DataLoader collates: ``get_worker_info()`` answers, and the batch's storages
then go into shared memory, as its pickling puts them); ``to_device``
against ``tree_map(.to)``; and the dataset read, ``PackedList.__getitems__``
against a list's. Timed with collate in this process, interleaved: what a
collate that reads the samples' structure cannot avoid, the stacks alone
and the least walk of the batch with pytree_kit's own calls, so the most
ours can reach against torch's (``collate_floor``).

On a machine with no accelerator neither torch's loader nor ``PinnedLoader``
can pin (both warn once and pass batches through), and the device is the
CPU, where a tensor is already: the figures are the host work of loading,
collating and the loops, with moving a no-op for both.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import platform
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _output

import pytree_kit as pk
import pytree_kit.torch as pkt


@dataclasses.dataclass
class Target:
    boxes: torch.Tensor
    labels: torch.Tensor


def tokenizer_samples(n: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(0, 1000, (128,), generator=g),
            "attention_mask": torch.ones(128, dtype=torch.int64),
            "label": torch.tensor(i % 2),
            "meta": {"a": torch.tensor(float(i)), "b": torch.tensor(0.5)},
        }
        for i in range(n)
    ]


def detection_samples(n: int) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        k = 1 + i % 7
        image = torch.randint(0, 255, (3, 128, 128), dtype=torch.uint8, generator=g)
        out.append((image, Target(torch.rand(k, 4, generator=g), torch.randint(0, 9, (k,)))))
    return out


def detection_collate(samples: list) -> tuple:
    """What a user writes for torch's DataLoader: default_collate refuses the dataclass."""
    return torch.stack([s[0] for s in samples]), [s[1] for s in samples]


def torch_move(batch: Any, device: Any) -> Any:
    """torch's tree_map(.to); by hand for the dataclass targets it cannot see into."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and not isinstance(batch[1], dict):
        images, targets = batch
        return images.to(device, non_blocking=True), [
            Target(t.boxes.to(device, non_blocking=True), t.labels.to(device, non_blocking=True))
            for t in targets
        ]
    return tree_map(lambda t: t.to(device, non_blocking=True), batch)


def pk_move(batch: Any, device: Any) -> Any:
    return pkt.to_device(batch, device, non_blocking=True)


class TextModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(1000, 16)
        self.head = torch.nn.Linear(16 + 2, 2)

    def forward(self, batch: Any) -> torch.Tensor:
        x = self.embed(batch["input_ids"])
        meta = torch.stack([batch["meta"]["a"], batch["meta"]["b"]], 1)
        logits = self.head(torch.cat([x, meta * 1e-3], 1))
        return torch.nn.functional.cross_entropy(logits, batch["label"])


class BoxModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 5, stride=8)
        self.head = torch.nn.Linear(4, 4)

    def forward(self, batch: Any) -> torch.Tensor:
        images, targets = batch
        feats = self.conv(images.float() / 255).mean((2, 3))
        boxes = self.head(feats)
        wanted = torch.stack([t.boxes.mean(0) for t in targets])
        return torch.nn.functional.mse_loss(boxes, wanted)


@dataclasses.dataclass
class Setup:
    dataset: Any
    collate: Callable[[list], Any]
    torch_pin: bool
    pinned_loader: bool
    move: Callable[[Any, Any], Any]


def epoch_rate(
    setup: Setup,
    model: torch.nn.Module,
    batch_size: int,
    workers: int,
    device: Any,
    sync: Callable[[], None],
) -> tuple[float, Optional[float]]:
    """Samples per second over the second of two epochs, and the CPU
    milliseconds a batch took in that epoch, in this process (all its
    threads) and the workers together (None where that cannot be read)."""
    loader: Any = DataLoader(
        setup.dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        collate_fn=setup.collate,
        pin_memory=setup.torch_pin,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(0),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rate, cpu = 0.0, None
    for _ in range(2):
        source = pkt.PinnedLoader(loader) if setup.pinned_loader else loader
        cpu_start = cpu_seconds(loader)  # (the second epoch's workers are the first's)
        start = time.perf_counter()
        n = batches = 0
        for batch in source:
            batch = setup.move(batch, device)
            loss = model(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += len(batch[0]) if isinstance(batch, tuple) else len(batch["label"])
            batches += 1
        sync()
        rate = n / (time.perf_counter() - start)
        cpu_end = cpu_seconds(loader)
        cpu = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    return rate, None if cpu is None else cpu / max(1, batches) * 1e3


def cpu_seconds(loader: Any) -> Optional[float]:
    """The CPU time so far of this process (all its threads) and of the
    loader's persistent workers, read from ``/proc``; None where it cannot be
    read (no ``/proc``, or a worker gone)."""
    total = time.process_time()
    iterator = getattr(loader, "_iterator", None)
    for worker in getattr(iterator, "_workers", ()):
        try:
            with open(f"/proc/{worker.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def our_collate(workload: str, consolidate: bool = False) -> Callable[[list], Any]:
    """pkt.collate for the workload: each sample's target kept whole, in a
    list; ``consolidate=True`` as the docs advise with workers."""
    if workload == "tokenizer":
        return functools.partial(pkt.collate, consolidate=consolidate)
    return functools.partial(pkt.collate, ragged={"[1]": "list"}, consolidate=consolidate)


def torch_collate_of(workload: str) -> tuple[Callable[[list], Any], str]:
    """torch's collate for the workload, and its name in the tables."""
    if workload == "tokenizer":
        return default_collate, "default_collate"
    return detection_collate, "custom collate"


def pipelines(workload: str, samples: list) -> dict[str, Setup]:
    torch_collate, _ = torch_collate_of(workload)
    ours = our_collate(workload)
    packed = pkt.PackedList(samples)
    consolidated = our_collate(workload, consolidate=True)
    return {
        "torch": Setup(samples, torch_collate, True, False, torch_move),
        "pytree_kit as the docs advise": Setup(packed, consolidated, False, True, pk_move),
        "the same, collate at its defaults": Setup(packed, ours, False, True, pk_move),
        "torch, with PackedList": Setup(packed, torch_collate, True, False, torch_move),
        "torch, with pkt.collate": Setup(samples, ours, True, False, torch_move),
        "torch, with PinnedLoader": Setup(samples, torch_collate, False, True, torch_move),
        "torch, with to_device": Setup(samples, torch_collate, True, False, pk_move),
    }


def best_of(fns: dict[str, Callable[[], Any]], rounds: int, number: int) -> dict[str, float]:
    """Best ms per call of each, over interleaved rounds."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best[k] = min(best[k], (time.perf_counter() - start) / number * 1e3)
    return best


@contextlib.contextmanager
def as_worker() -> Iterator[None]:
    """This process taken for a DataLoader worker (``get_worker_info()`` answers),
    as collate functions see it there, on one thread, as torch's worker loop
    sets it (a stack into fresh shared memory on 16 threads is no worker's)."""
    from torch.utils.data._utils import worker

    before, threads = worker._worker_info, torch.get_num_threads()
    worker._worker_info = worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None)  # type: ignore[arg-type]
    torch.set_num_threads(1)
    try:
        yield
    finally:
        worker._worker_info = before
        torch.set_num_threads(threads)


def sent(batch: Any) -> Any:
    """What a worker does to a batch before it leaves: its pickling moves each
    storage not yet in shared memory there (``default_collate`` and
    ``pkt.collate`` stack into shared memory in a worker; a custom collate's
    ``torch.stack`` does not, so its batch is copied once more here)."""
    for t in pk.leaves(batch):
        if isinstance(t, torch.Tensor):
            t.share_memory_()
    return batch


#: the parts held to the target (collate where a DataLoader runs it, in a
#: worker; reading has no torch equivalent that does work, and collate in
#: this process is shown for comparison)
WORKER_PART = "collate in a worker, and the batch into shared memory"
MOVE_PART = "to_device"


def parts(
    workload: str,
    samples: list,
    batch_size: int,
    rounds: int,
    device: Any,
    sync: Callable[[], None],
) -> tuple[list[str], dict[str, float], float, str]:
    chunk = samples[:batch_size]
    packed = pkt.PackedList(samples)
    torch_collate, torch_collate_name = torch_collate_of(workload)
    ours = our_collate(workload)
    collate_t = best_of(  # with what any collate pays here, interleaved with both
        {"torch": lambda: torch_collate(chunk), "ours": lambda: ours(chunk)}
        | collate_floor(workload, chunk),
        rounds,
        20,
    )
    with as_worker():
        worker_t = best_of(
            {"torch": lambda: sent(torch_collate(chunk)), "ours": lambda: sent(ours(chunk))},
            rounds,
            20,
        )
    batch = torch_collate(chunk)
    ours_batch = ours(chunk)
    if device.type == "cuda":  # pinned first, as each pipeline's loader pins it
        from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

        batch, ours_batch = torch_pin(batch), pkt.pin_memory(ours_batch)
    move_t = best_of(
        {
            "torch": lambda: (torch_move(batch, device), sync()),
            "ours": lambda: (pk_move(ours_batch, device), sync()),
        },
        rounds,
        50,
    )
    at = random.Random(0).sample(range(len(samples)), batch_size)  # a shuffled batch
    read_t = best_of(  # as a DataLoader's fetcher reads: __getitems__ where there is one
        {
            "torch": lambda: [samples[i] for i in at],
            "ours": lambda: packed.__getitems__(at),
        },
        rounds,
        20,
    )
    floor = (collate_t["stacks"], collate_t["walk"])
    bound = collate_t["torch"] / sum(floor)
    rows = []
    for name, t, torch_name in (
        ("collate, in this process", collate_t, torch_collate_name),
        (WORKER_PART, worker_t, torch_collate_name),
        (f"{MOVE_PART} (to {device.type})", move_t, "tree_map(.to)"),
        (f"reading {batch_size} samples", read_t, "a list"),
    ):
        rows.append(
            f"| {workload} | {name} | {torch_name} | {t['torch']:.3f} | {t['ours']:.3f} "
            f"| **{t['torch'] / t['ours']:.2f}x** |"
        )
    ratios = {WORKER_PART: worker_t, MOVE_PART: move_t}
    added = read_t["ours"] - read_t["torch"]
    least = (
        f"{workload}: the stacks {floor[0]:.3f} ms, the walk {floor[1]:.3f} ms, "
        f"so at most **{bound:.2f}x** ({collate_t['torch'] / collate_t['ours']:.2f}x measured)"
    )
    return rows, {k: t["torch"] / t["ours"] for k, t in ratios.items()}, added, least


def collate_floor(workload: str, chunk: list) -> dict[str, Callable[[], Any]]:
    """What a collate that reads the samples' structure must pay here, to
    time: its stacks alone (the columns taken out beforehand), and the
    least walk of the batch with pytree_kit's own calls (sample 0's
    structure, the columns, the batch rebuilt), nothing stacked. torch's
    collate over their sum is the most that ours can reach."""
    from pytree_kit.torch._collate import _resolved

    ragged = our_collate(workload).keywords.get("ragged")
    spec = pk.structure(chunk[0])
    if ragged is not None:  # (a cached lookup of a few hundred ns in ours: left out)
        spec = _resolved(ragged, spec, chunk, None)[0]
    columns = spec.columns(chunk)
    tensors = [c for c in columns if isinstance(c[0], torch.Tensor)]
    results = [torch.stack(c) if isinstance(c[0], torch.Tensor) else c for c in columns]

    def walk() -> Any:
        pk.structure(chunk[0])
        spec.columns(chunk)
        return spec.unflatten(results)

    return {"stacks": lambda: [torch.stack(c) for c in tensors], "walk": walk}


class _Timed:
    """A loader whose iterator adds the time each ``next()`` takes to ``spent``."""

    def __init__(self, loader: Any, spent: list) -> None:
        self.loader, self.spent = loader, spent

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        it = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.spent.append(time.perf_counter() - start)
            yield batch


def pinning_profile(
    workload: str, samples: list, batch_size: int, workers: int, model: torch.nn.Module
) -> list[str]:
    """Where PinnedLoader's thread spends a batch's time, over the second
    epoch of the advised pipeline: waiting for the DataLoader (its workers,
    and unpickling what they send), pinning (its CPU time, and the rest of
    its wall time: waiting for the GIL while the consumer runs), and handing
    the batch over (waiting for room in the queue: the consumer is behind);
    and how long the consumer waits for each batch. With no accelerator,
    pinning is a stand-in: the pool's buffers are plain memory and a
    tensor's ``pin_memory`` is a ``clone``, so the thread does the same
    packing and copying, into memory that is not pinned."""
    from pytree_kit.torch import _loader, _pool

    real_pin, real_available = _loader.pin_memory, _pool.pinning_available
    real_tensor_pin = torch.Tensor.pin_memory
    stand_in = not real_available()
    pool = None
    spent: dict[str, list] = {"next": [], "pin": [], "pin_cpu": [], "get": []}

    def pin(batch: Any, **kwargs: Any) -> Any:
        start, cpu = time.perf_counter(), time.thread_time()
        out = real_pin(batch, **kwargs)
        spent["pin_cpu"].append(time.thread_time() - cpu)
        spent["pin"].append(time.perf_counter() - start)
        return out

    if stand_in:
        pool = pkt.PinnedPool(allocator=lambda n, dtype: torch.empty(n, dtype=dtype))
        _pool.pinning_available = lambda: True  # type: ignore[assignment]
        torch.Tensor.pin_memory = lambda t, *a, **k: t.clone()  # type: ignore[method-assign]
    _loader.pin_memory = pin  # type: ignore[assignment]
    try:
        packed = pkt.PackedList(samples)
        loader = DataLoader(
            packed,
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            collate_fn=our_collate(workload, consolidate=True),
            persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(0),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        device = next(model.parameters()).device
        for _ in range(2):  # the second epoch's figures are kept
            for values in spent.values():
                values.clear()
            source = iter(pkt.PinnedLoader(_Timed(loader, spent["next"]), pool=pool))
            loop_start = time.perf_counter()
            while True:
                start = time.perf_counter()
                try:
                    batch = next(source)
                except StopIteration:
                    break
                spent["get"].append(time.perf_counter() - start)
                loss = model(pk_move(batch, device))
                opt.zero_grad()
                loss.backward()
                opt.step()
            wall = time.perf_counter() - loop_start
    finally:
        _loader.pin_memory = real_pin  # type: ignore[assignment]
        _pool.pinning_available = real_available  # type: ignore[assignment]
        torch.Tensor.pin_memory = real_tensor_pin  # type: ignore[method-assign]
    n = len(spent["pin"])
    per = {k: sum(v) / max(1, len(v)) * 1e3 for k, v in spent.items()}
    thread_busy = sum(spent["next"]) + sum(spent["pin"])
    handing = max(0.0, wall - thread_busy) / max(1, n) * 1e3  # the rest of the thread's time
    how = "stand-in pinning (a clone)" if stand_in else "pinned"
    return [
        f"| {workload} | {how} | {n} | {wall / max(1, n) * 1e3:.2f} | {per['next']:.2f} "
        f"| {per['pin_cpu']:.3f} | {per['pin'] - per['pin_cpu']:.3f} | {handing:.2f} "
        f"| {per['get']:.2f} |"
    ]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small datasets: a smoke test")
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers")
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of the whole pipelines (3; --quick 1)"
    )
    _output.add_arguments(parser)
    args = parser.parse_args(argv)
    workers = args.workers if args.workers is not None else min(4, torch.get_num_threads() * 2)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sub = _output.gpu_sub(torch.cuda.get_device_name(0)) if cuda else ""
    out = _output.folder(args, sub=sub)
    sizes = {"tokenizer": 2_000, "detection": 300} if args.quick else {}
    workloads = {
        "tokenizer": (tokenizer_samples(sizes.get("tokenizer", 20_000)), 64, TextModel),
        "detection": (detection_samples(sizes.get("detection", 2_000)), 16, BoxModel),
    }
    where = f"on {torch.cuda.get_device_name(0)}" if cuda else "CPU only (nothing is pinned)"
    text = [
        "# The input pipeline against torch's own",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
        f"{workers} DataLoader workers, engine {pk.engine_info()['engine']}; {where}.",
        "",
        "## Whole pipelines",
        "",
        f"Samples per second over the second epoch: the best of {args.rounds} rounds, each "
        "round running every pipeline of a workload once, in turn, all in one run. "
        "The last column is the spread of a pipeline's rounds, slowest to fastest: "
        "torch's own row shows how far one pipeline moves between rounds here.",
        "",
        "| workload | pipeline | samples/s | vs torch's | rounds: slowest to fastest "
        "| CPU ms a batch, all processes (least of the rounds) |",
        "|---|---|---|---|---|---|",
    ]
    met = True
    cpu_a_batch: dict[str, dict[str, list[float]]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no accelerator: "pin_memory ... no accelerator"
        for workload, (samples, batch_size, model_type) in workloads.items():
            setups = pipelines(workload, samples)
            runs: dict[str, list[float]] = {name: [] for name in setups}
            cpus: dict[str, list[float]] = {name: [] for name in setups}
            for _ in range(args.rounds):
                for name, setup in setups.items():
                    torch.manual_seed(0)
                    model = model_type().to(device)
                    rate, cpu = epoch_rate(setup, model, batch_size, workers, device, sync)
                    runs[name].append(rate)
                    if cpu is not None:
                        cpus[name].append(cpu)
            base = max(runs["torch"])
            cpu_a_batch[workload] = cpus
            for name, seen in runs.items():
                rate = max(seen)
                ratio = rate / base
                if (
                    name != "torch"
                    and ratio < 1.0
                    and not name.startswith("torch, with PackedList")
                ):
                    met = False
                if name == "torch, with PackedList" and ratio < 0.95:
                    met = False
                cpu_text = f"{min(cpus[name]):.2f}" if cpus[name] else "not read"
                text.append(
                    f"| {workload} | {name} | {rate:,.0f} | **{ratio:.2f}x** "
                    f"| {min(seen) / rate:.2f}-1.00 | {cpu_text} |"
                )
    text += [
        "",
        "## Parts, in one process",
        "",
        "Best of interleaved rounds, ms per batch.",
        "",
        "| workload | part | torch's | torch ms | ours ms | ours vs torch's |",
        "|---|---|---|---|---|---|",
    ]
    rounds = 3 if args.quick else 9
    shares: list[str] = []
    floors: list[str] = []
    for workload, (samples, batch_size, _) in workloads.items():
        rows, ratios, read_ms, least = parts(workload, samples, batch_size, rounds, device, sync)
        text += rows
        floors.append(least)
        met = met and min(ratios.values()) >= 1.0
        listed = cpu_a_batch.get(workload, {}).get("torch")
        if listed:
            shares.append(
                f"{workload}: {read_ms:.3f} ms against {min(listed):.2f} ms, "
                f"**{read_ms / min(listed):.1%}**"
            )
    text += [
        "",
        "Collate in this process, at best: a collate that reads the samples' structure "
        "pays for the stacks (the columns taken out beforehand) and for a walk of the "
        "batch (sample 0's structure, the columns, the batch rebuilt, with "
        "pytree_kit's own calls, nothing stacked); torch's collate over their sum is "
        "the most ours can reach: " + "; ".join(floors) + ".",
    ]
    if shares:
        text += [
            "",
            "What `PackedList` adds to a batch, as a share of what the list pipeline "
            "spends on it: its read of a batch's samples (above, less a list's) against "
            "the CPU time a batch takes in torch's own pipeline, all processes: "
            + "; ".join(shares)
            + ".",
        ]
    text += [
        "",
        "## Where PinnedLoader's thread spends its time",
        "",
        "The advised pipeline's second epoch, ms per batch. The thread waits for the "
        "DataLoader (its workers, and unpickling what they send), pins (its CPU time; "
        "the rest of its wall time it waits, for the GIL while the consumer runs), and "
        "hands the batch over (the rest of its time: waiting for room in the queue, "
        "the consumer being behind). The consumer waits for each batch in `next()`.",
        "",
        "| workload | pinning | batches | ms a batch (wall) | thread: waiting for the "
        "loader | thread: pinning, CPU | thread: pinning, waiting | thread: handing over "
        "| consumer: waiting for a batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for workload, (samples, batch_size, model_type) in workloads.items():
            torch.manual_seed(0)
            text += pinning_profile(workload, samples, batch_size, workers, model_type().to(device))
    text += [
        "",
        "Targets: the advised pipeline, each part of ours in torch's "
        "pipeline, and collate in a worker and to_device as parts, at least 1.0x "
        "torch's; `PackedList` within 5 % of a list (0.95x): "
        + ("**met**." if met else "**MISSED**."),
    ]
    _output.publish(out / "pipeline.md", text, gpu_measured=cuda)
    return 0


if __name__ == "__main__":
    sys.exit(main())
