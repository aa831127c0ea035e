#!/usr/bin/env python3
"""Counts the tensors each way of moving a batch leaves behind, on a detection
batch whose targets are dataclasses.

    python scripts/left_behind.py

The batch: 16 uint8 images [3, 480, 640] in a list, and 16 targets, each a
dataclass holding boxes float32[n, 4] and labels int64[n]: 48 tensors, 32 of
them inside dataclasses. Each way moves it to the "meta" device, where a moved
tensor is a new object; a tensor of the output still on the CPU, the very
object of the input, was left behind. It runs twice: with plain dataclass
targets, and with frozen ones. A way that raises is shown with its exception.

The ways: ``torch.utils._pytree.tree_map`` (tensors moved, other leaves kept:
an unregistered dataclass is a leaf), accelerate's ``send_to_device``,
Lightning's ``move_data_to_device`` (``lightning.fabric.utilities.apply_func``;
Lightning's and Fabric's loaders use it) and ``pytree_kit.torch.to_device``.
A peer that is not installed is shown as such. Needs torch; nothing else but
the standard library and the peers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
import torch.utils._pytree as torch_pytree

DEVICE = torch.device("meta")
IMAGES = 16


@dataclasses.dataclass
class Target:
    boxes: torch.Tensor
    labels: torch.Tensor


@dataclasses.dataclass(frozen=True)
class FrozenTarget:
    boxes: torch.Tensor
    labels: torch.Tensor


def make_batch(target: type) -> dict[str, list[Any]]:
    """16 images, and 16 targets of 1 to 5 boxes each."""
    images = [torch.zeros(3, 480, 640, dtype=torch.uint8) for _ in range(IMAGES)]
    targets = [
        target(torch.rand(1 + i % 5, 4), torch.randint(0, 91, (1 + i % 5,))) for i in range(IMAGES)
    ]
    return {"images": images, "targets": targets}


def tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor of a tree of dicts, lists, tuples and dataclasses."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in tensors(v)]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return [t for f in dataclasses.fields(tree) for t in tensors(getattr(tree, f.name))]
    return []


def torch_tree_map(batch: Any) -> Any:
    # tree_map(lambda t: t.to(DEVICE), batch) raises AttributeError on the
    # dataclass, a leaf to torch.utils._pytree; so only tensors are moved
    return torch_pytree.tree_map(
        lambda t: t.to(DEVICE) if isinstance(t, torch.Tensor) else t, batch
    )


def ways() -> list[tuple[str, Optional[Callable[[Any], Any]]]]:
    """(name, function moving a batch to DEVICE), None for a peer not installed."""
    found: list[tuple[str, Optional[Callable[[Any], Any]]]] = [
        ("`torch.utils._pytree.tree_map`", torch_tree_map)
    ]
    try:
        from accelerate.utils import send_to_device
    except ImportError:
        found.append(("accelerate `send_to_device`", None))
    else:
        found.append(("accelerate `send_to_device`", lambda b: send_to_device(b, DEVICE)))
    try:
        from lightning.fabric.utilities.apply_func import move_data_to_device
    except ImportError:
        found.append(("Lightning `move_data_to_device`", None))
    else:
        found.append(("Lightning `move_data_to_device`", lambda b: move_data_to_device(b, DEVICE)))
    from pytree_kit.torch import to_device

    found.append(("`pytree_kit.torch.to_device`", lambda b: to_device(b, DEVICE)))
    return found


def left_behind(move: Callable[[Any], Any], batch: Any, notes: list[str]) -> str:
    """The number of the output's tensors still on the CPU, or "raises" and the
    exception's type (its message added to ``notes``)."""
    try:
        out = move(batch)
    except Exception as e:
        notes.append(f"{type(e).__name__}: {e}")
        return f"raises {type(e).__name__}"
    before = {id(t) for t in tensors(batch)}
    moved = tensors(out)
    assert len(moved) == len(before), "a way lost or added tensors"
    behind = [t for t in moved if t.device.type == "cpu"]
    # on the meta device, a tensor still on the CPU is the input's own
    assert all(id(t) in before for t in behind)
    return str(len(behind))


def table(target: type) -> str:
    batch = make_batch(target)
    total = len(tensors(batch))
    inside = sum(len(tensors(t)) for t in batch["targets"])
    rows = [
        f"{IMAGES} images and {IMAGES} `{target.__name__}` targets "
        f"({'frozen ' if target is FrozenTarget else ''}dataclasses; "
        f"{inside} of the {total} tensors are inside them), moved to {DEVICE.type!r}:",
        "",
        "| way | tensors in batch | left behind |",
        "|---|---|---|",
    ]
    notes: list[str] = []
    for name, move in ways():
        cell = "not installed" if move is None else left_behind(move, batch, notes)
        rows.append(f"| {name} | {total} | {cell} |")
    return "\n".join(rows + [""] * bool(notes) + notes)


def versions() -> str:
    found = [f"torch {torch.__version__}"]
    for module in ("accelerate", "lightning", "pytree_kit"):
        try:
            found.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            pass
    return ", ".join(found)


def main() -> None:
    print(f"Tensors left behind ({versions()})\n")
    print(table(Target))
    print()
    print(table(FrozenTarget))


if __name__ == "__main__":
    main()
