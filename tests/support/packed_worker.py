"""Run by tests/torch/test_packed.py in a fresh process (no jax threads to fork): a
DataLoader with 2 forked workers over a PackedList gives back every sample,
equal to the one packed. Prints ``checked=N``.

    python tests/support/packed_worker.py SAMPLES
"""

from __future__ import annotations

import random
import sys

import torch

from pytree_kit.torch import PackedList


def samples(n: int) -> list:
    rng = random.Random(0)
    return [
        {
            "file_name": f"{i:012d}.jpg",
            "size": (rng.choice([480, 640]), 640),
            "annotations": [
                {"bbox": [rng.uniform(0, 600) for _ in range(4)], "label": rng.randint(1, 80)}
                for _ in range(rng.randint(0, 5))
            ],
            "crowd": rng.random() < 0.1,
        }
        for i in range(n)
    ]


def as_is(batch: list) -> list:
    return batch


def main() -> None:
    data = samples(int(sys.argv[1]))
    loader = torch.utils.data.DataLoader(
        PackedList(data), batch_size=7, num_workers=2, collate_fn=as_is,
        multiprocessing_context="fork",
    )  # fmt: skip
    got = [x for batch in loader for x in batch]
    assert got == data, "a forked worker's samples differ"
    print(f"checked={len(got)}")


if __name__ == "__main__":
    main()
