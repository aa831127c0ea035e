"""A whole training run, as a user writes it, run by tests/torch/test_training_run.py
in fresh processes (no jax threads to fork). Prints or writes one JSON report.

    python tests/support/training_run.py CONTEXT                   # fork | spawn | forkserver
    python tests/support/training_run.py ddp RANK WORLD PORT OUT   # one gloo rank (fork workers)

The parts, together over 3 epochs:

- a ``PackedList`` of COCO-like samples, a quarter of the images with no
  annotations;
- a DataLoader with 2 workers of the start method named, shuffling (forked
  workers new each epoch, spawned and forkserver ones persistent);
- ``collate`` with ``ragged=``: the annotations a list per image, the boxes
  padded; ``PinnedLoader`` and a device transfer where CUDA is present;
- a compiled model wrapper that flattens its nested batch (``pk.flatten`` and
  ``pk.unflatten`` of a dict holding a dataclass), its graphs counted;
  in the DDP variant, ``pytree_kit.torch.DistributedDataParallel`` (not
  compiled) on 2 gloo ranks, each with a ``DistributedSampler``;
- backward and an SGD step.

The report holds the graphs compiled, each epoch's mean loss, and after each
epoch the samples seen, the samples read back right in the main process, and
the open file descriptors and bytes in /dev/shm.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import pytree_kit as pk
import pytree_kit.torch as pkt
from tests.support.process_use import fds, settled, shm

N, BATCH, EPOCHS, FEATURES = 384, 16, 3, 16
W_TRUE = torch.linspace(-1.0, 1.0, FEATURES)


def sample(i: int) -> dict:
    x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(i))
    k = i % 4  # a quarter of the images have no annotations
    return {
        "id": i,
        "image": x,
        "score": float(x @ W_TRUE),
        "file": f"img{i:05d}.jpg",
        "ann": [{"bbox": [float(i), 0.0, 1.0, float(j)], "cat": (i + j) % 80} for j in range(k)],
        "boxes": torch.full((k, 4), float(i)),
    }


def read_all(dataset: pkt.PackedList) -> int:
    """Read every sample in this process, each checked against the one made."""
    for i in range(len(dataset)):
        got, want = dataset[i], sample(i)
        ok = (
            got["id"] == i
            and got["file"] == want["file"]
            and got["ann"] == want["ann"]
            and torch.equal(got["image"], want["image"])
            and torch.equal(got["boxes"], want["boxes"])
            and got["score"] == want["score"]
        )
        if not ok:
            raise AssertionError(f"sample {i} reads wrong in the main process: {got!r}")
    return len(dataset)


@dataclasses.dataclass
class Target:
    score: torch.Tensor
    n_boxes: torch.Tensor


class Wrapper(nn.Module):
    """A model wrapper that flattens its nested batch (the flat list of tensors
    is what tracers, collectives and pinned copies want) and rebuilds it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(FEATURES, 1)

    def forward(self, batch: dict) -> torch.Tensor:
        leaves, spec = pk.flatten(batch)
        batch = pk.unflatten(spec, [t.float() for t in leaves])
        pred = self.net(batch["x"]).squeeze(-1)
        return ((pred - batch["target"].score) ** 2).mean() + 0.0 * batch["target"].n_boxes.sum()


class Counting:
    """A torch.compile backend that counts graphs and compiles each with aot_eager."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: object, example_inputs: object) -> object:
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs += 1
        return lookup_backend("aot_eager")(gm, example_inputs)


collate_fn = functools.partial(pkt.collate, ragged={"['ann']": "list", "boxes": "pad"})


def model_input(batch: dict, device: torch.device) -> dict:
    """What the wrapper is given: the tensors of the batch, in a dict and a dataclass."""
    assert type(batch["ann"]) is pkt.SampleList and len(batch["ann"]) == len(batch["id"])
    assert batch["boxes"].lengths.tolist() == [i % 4 for i in batch["id"].tolist()]
    tree = {"x": batch["image"], "target": Target(batch["score"], batch["boxes"].lengths)}
    return pkt.to_device(tree, device) if device.type != "cpu" else tree


def train(
    loader: DataLoader,
    dataset: pkt.PackedList,
    step: nn.Module,
    params: list,
    sampler: object = None,
) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = pkt.PinnedLoader(loader) if device.type == "cuda" else loader
    opt = torch.optim.SGD(params, lr=0.05)
    report: dict = {"losses": [], "seen": [], "read": [], "fds": [], "shm": []}
    report["pinned"] = device.type == "cuda"
    for epoch in range(EPOCHS):
        if sampler is not None:
            sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        ids: list = []
        losses = []
        for batch in batches:
            ids += batch["id"].tolist()
            loss = step(model_input(batch, device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        report["losses"].append(sum(losses) / len(losses))
        report["seen"].append(sorted(ids))
        report["read"].append(read_all(dataset))
        gc.collect()
        report["fds"].append(settled(fds))
        report["shm"].append(settled(shm))
    return report


def single(context: str) -> dict:
    dataset = pkt.PackedList(sample(i) for i in range(N))
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        collate_fn=collate_fn,
        multiprocessing_context=context,
        persistent_workers=context != "fork",  # both ways; per method in tests/torch/test_packed.py
        generator=torch.Generator().manual_seed(0),
    )
    model = Wrapper()
    backend = Counting()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    report = train(loader, dataset, compiled, list(model.parameters()))
    report["graphs"] = backend.graphs
    report["seen"] = [s == list(range(N)) for s in report["seen"]]
    return report


def ddp(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    dataset = pkt.PackedList(sample(i) for i in range(N))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=2,
        collate_fn=collate_fn,
        multiprocessing_context="fork",
    )
    model = pkt.DistributedDataParallel(Wrapper())
    report = train(loader, dataset, model, list(model.parameters()), sampler)
    every: list = [None] * world
    gathered = []  # each epoch's samples over the ranks: every sample once
    for e in range(EPOCHS):
        dist.all_gather_object(every, report["seen"][e])
        gathered.append(sorted(i for ids in every for i in ids) == list(range(N)))
    report["seen"] = gathered
    weights = [p.detach().clone() for p in model.parameters()]
    dist.broadcast(weights[0], 0)
    report["in_step"] = bool(torch.equal(weights[0], next(model.parameters()).detach()))
    report["graphs"] = None
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    gc.collect()
    sys.stdout.flush()
    os._exit(0)  # as tests/support/dist_worker.py: torch's teardown at exit sometimes aborts


def main() -> None:
    if sys.argv[1] == "ddp":
        rank, world, port = (int(a) for a in sys.argv[2:5])
        ddp(rank, world, port, sys.argv[5])
        return
    print(json.dumps(single(sys.argv[1])))


if __name__ == "__main__":
    main()
