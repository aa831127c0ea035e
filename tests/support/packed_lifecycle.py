"""A PackedList's life in a training run, run by tests/torch/test_packed.py in a fresh
process (no jax threads to fork). Prints one JSON line.

    python tests/support/packed_lifecycle.py loader CONTEXT SAMPLES   # fork | spawn | forkserver
    python tests/support/packed_lifecycle.py paths SAMPLES            # queue, pickler, copies
    python tests/support/packed_lifecycle.py mapped SAMPLES DIR       # a file-backed list in spawn workers

Every sample is made from its number (``sample(i)``), so reading all of them
back is checked against ``check(i, got)`` without keeping the originals. After
each epoch, and after each way a list travels, the main process reads every
sample of the list it kept (the original the workers were sent) and of what
came back. A reading of freed memory shows as a wrong value, a ValueError
("the data is corrupt") or a crash.
"""

from __future__ import annotations

import copy
import io
import json
import os
import sys
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader

from pytree_kit.torch import PackedList
from tests.support.process_use import fds, settled, shm


def sample(i: int) -> dict:
    k = i % 4  # images with no annotations among them
    out = {
        "file": f"img{i:07d}.jpg",
        "size": (480 + i % 2 * 160, 640),
        "ann": [{"bbox": [float(i), 1.0, 2.0, float(j)], "cat": (i + j) % 80} for j in range(k)],
        "boxes": [float(i)] * (4 * k),  # a list of numbers: one leaf of any length
        "crowd": i % 10 == 0,
    }
    if i % 50 == 0:  # a tensor leaf now and then: another layout, and a tensor buffer
        out["mask"] = torch.full((k + 1, 2), float(i))
    return out


def check(i: int, got: dict) -> None:
    k = i % 4
    ok = (
        got["file"] == f"img{i:07d}.jpg"
        and got["size"] == (480 + i % 2 * 160, 640)
        and len(got["ann"]) == k
        and all(a["bbox"] == [float(i), 1.0, 2.0, float(j)] for j, a in enumerate(got["ann"]))
        and got["boxes"] == [float(i)] * (4 * k)
        and got["crowd"] == (i % 10 == 0)
        and (
            "mask" not in got
            if i % 50
            else tuple(got["mask"].shape) == (k + 1, 2) and float(got["mask"][-1, -1]) == float(i)
        )
    )
    if not ok:
        raise AssertionError(f"sample {i} reads wrong: {got!r}")


def read_all(packed: PackedList, numbers: list) -> int:
    """Read every sample of ``packed`` (whose samples are ``numbers``); how many."""
    assert len(packed) == len(numbers)
    for j, i in enumerate(numbers):
        check(i, packed[j])
    return len(numbers)


def numbers_of(got: dict) -> int:
    return int(got["file"][3:10])


def worker_sum(batch: list) -> list:
    """What a worker sends back: each sample's number, after checking it."""
    out = []
    for got in batch:
        i = numbers_of(got)
        check(i, got)
        out.append(i)
    return out


def where_mapped(batch: list) -> list:
    info = torch.utils.data.get_worker_info()
    file = info.dataset._store.file
    return [(file.path if file is not None else None, numbers_of(s)) for s in batch]


def views(packed: PackedList, n: int) -> list:
    """(the list, a slice, an index list, a bool mask) with their samples' numbers."""
    picked = [n - 1, 0, n // 2, 1, n // 3][: min(n, 5)]
    mask = torch.tensor([i % 5 == 0 for i in range(n)])
    return [
        (packed, list(range(n))),
        (packed[1::3], list(range(1, n, 3))),
        (packed[picked], picked),
        (packed[mask], [i for i in range(n) if i % 5 == 0]),
    ]


class Views(torch.utils.data.Dataset):
    """The samples of several PackedLists of one store (the list, a slice, an
    index list, a mask) as one dataset: each worker is sent all of them."""

    def __init__(self, parts: list) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __getitem__(self, i: int) -> dict:
        for p in self.parts:
            if i < len(p):
                return p[i]
            i -= len(p)
        raise IndexError(i)


def loader(context: str, n: int) -> dict:
    packed = PackedList(sample(i) for i in range(n))
    parts = views(packed, n)
    data = Views([p for p, _ in parts])
    want = sorted(i for _, numbers in parts for i in numbers)
    report: dict = {"epochs": 0, "read": 0, "fds": [], "shm": []}
    for persistent in (False, True):
        dl = DataLoader(
            data,
            batch_size=max(1, len(data) // 16),
            num_workers=2,
            collate_fn=worker_sum,
            multiprocessing_context=context,
            persistent_workers=persistent,
        )
        for _ in range(3):
            seen = sorted(i for batch in dl for i in batch)
            assert seen == want, "an epoch did not see every sample once"
            report["epochs"] += 1
            # the main process reads every list it kept (which the workers were sent)
            report["read"] += sum(read_all(p, numbers) for p, numbers in parts)
            report["fds"].append(settled(fds))
            report["shm"].append(settled(shm))
        del dl
    return report


def _child(inbox: tmp.Queue, outbox: tmp.Queue) -> None:
    packed, numbers = inbox.get()
    outbox.put((read_all(packed, numbers), packed))
    inbox.get()  # a sender lives until its shared memory is received (torch.multiprocessing)


def paths(n: int) -> dict:
    packed = PackedList(sample(i) for i in range(n))
    report: dict = {}
    ctx = tmp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(inbox, outbox))
    child.start()
    for k, (data, numbers) in enumerate(views(packed, n)):
        if k == 0:  # an mp.Queue round trip: to a spawned process, read there, and back
            inbox.put((data, numbers))
            count, back = outbox.get(timeout=300)
            inbox.put("received")
            assert count == len(numbers)
            report["queue"] = read_all(back, numbers) + read_all(data, numbers)
        # ForkingPickler (what a spawn DataLoader does to its dataset), then memory churn
        buf = io.BytesIO()
        ForkingPickler(buf).dump(data)
        junk = [bytes(1 << 20) for _ in range(200)]
        got = ForkingPickler.loads(buf.getvalue())
        del junk
        report[f"pickler{k}"] = read_all(data, numbers) + read_all(got, numbers)
        # copy.deepcopy, torch.save and torch.load, a caller's own share_memory_()
        deep = copy.deepcopy(data)
        report[f"deepcopy{k}"] = read_all(deep, numbers) + read_all(data, numbers)
        saved = io.BytesIO()
        torch.save(data, saved)
        saved.seek(0)
        loaded = torch.load(saved, weights_only=False)
        report[f"torch.save{k}"] = read_all(loaded, numbers) + read_all(data, numbers)
        for t in [data._index, *data._store.tensors.values(), *data._store.data.values()]:
            t.share_memory_()
        junk = [bytes(1 << 20) for _ in range(200)]
        del junk
        report[f"share_memory_{k}"] = read_all(data, numbers)
    child.join(timeout=120)
    assert child.exitcode == 0, child.exitcode
    report["original"] = read_all(packed, list(range(n)))
    return report


def mapped(n: int, folder: str) -> dict:
    path = os.path.join(folder, "store.pk")
    PackedList(sample(i) for i in range(n)).save(path)
    packed = PackedList.load(path)
    size = os.path.getsize(path)
    before = shm()
    dl = DataLoader(
        packed, batch_size=max(1, n // 8), num_workers=2, collate_fn=where_mapped,
        multiprocessing_context="spawn",
    )  # fmt: skip
    grew = 0
    for _ in range(2):
        seen = [x for batch in dl for x in batch]
        grew = max(grew, shm() - before)
        assert sorted(i for _, i in seen) == list(range(n))
        assert {p for p, _ in seen} == {os.path.abspath(path)}, "a worker did not map the file"
    # a slice of it travels by its path too, its own index by value
    part = packed[::2]
    got = ForkingPickler.loads(bytes(ForkingPickler.dumps(part)))
    assert got._store.file is not None and got._store.file.path == os.path.abspath(path)
    return {
        "read": read_all(packed, list(range(n))) + read_all(got, list(range(0, n, 2))),
        "file_bytes": size,
        "shm_growth": grew,
    }


def main() -> None:
    what = sys.argv[1]
    if what == "loader":
        out = loader(sys.argv[2], int(sys.argv[3]))
    elif what == "paths":
        out = paths(int(sys.argv[2]))
    else:
        out = mapped(int(sys.argv[2]), sys.argv[3])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
