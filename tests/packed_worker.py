"""Run by tests/test_packed.py in a fresh process: one epoch of a DataLoader
with 4 forked workers over a PackedList, then over the same samples as a list
of dicts, reading each worker's private memory (USS, /proc/<pid>/smaps_rollup)
after its first batch and after the last. Prints ``name=value`` pairs in MiB.

    python tests/packed_worker.py SAMPLES packed|list
    python tests/packed_worker.py SAMPLES check   # forked workers give every sample back

Each store is measured in its own process: what one left freed in the heap
would be reused, and so copied, by the workers of the next.
"""

from __future__ import annotations

import gc
import random
import sys
import warnings
from typing import Any

import torch

from pytree_kit.torch import PackedList


def samples(n: int) -> list:
    rng = random.Random(0)
    out = []
    for i in range(n):
        anns = [
            {
                "bbox": [rng.uniform(0, 600) for _ in range(4)],
                "category_id": rng.randint(1, 80),
                "segmentation": [[rng.uniform(0, 600) for _ in range(2 * rng.randint(4, 12))]],
            }
            for _ in range(rng.randint(1, 12))
        ]
        out.append({"file_name": f"{i:012d}.jpg", "height": 480, "annotations": anns})
    return out


def uss(pid: int) -> float:
    """Private memory of process ``pid`` in MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1])
    return (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024


def as_is(batch: list) -> list:
    return batch


def growth(dataset: Any) -> float:
    """The largest growth of a worker's private memory over one epoch, in MiB."""
    gc.collect()
    gc.freeze()  # the collector's own writes to old objects are not the dataset's
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=32,
        num_workers=4,
        collate_fn=as_is,
        multiprocessing_context="fork",
        persistent_workers=True,  # alive after the epoch, to be measured
    )
    it = iter(loader)
    next(it)
    pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    start = {pid: uss(pid) for pid in pids}
    for _ in it:
        pass
    end = {pid: uss(pid) for pid in pids}
    del it, loader
    gc.unfreeze()
    return max(end[p] - start[p] for p in pids)


def main() -> None:
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    n, store = int(sys.argv[1]), sys.argv[2]
    data = samples(n)
    packed = PackedList(data)
    report = {"packed_mb": packed.nbytes / 2**20}
    if store == "check":
        loader = torch.utils.data.DataLoader(
            packed, batch_size=7, num_workers=2, collate_fn=as_is, multiprocessing_context="fork"
        )
        got = [x for batch in loader for x in batch]
        assert got == data, "a forked worker's samples differ"
        print(f"checked={len(got)}")
        return
    if store == "packed":
        del data
        report["growth_mb"] = growth(packed)
    else:
        del packed
        report["growth_mb"] = growth(data)
    print(" ".join(f"{k}={v:.2f}" for k, v in report.items()))


if __name__ == "__main__":
    main()
