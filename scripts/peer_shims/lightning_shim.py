"""Lightning's ``move_data_to_device`` (Fabric's and the Trainer's way of
moving a batch) on pytree_kit, as ``docs/migration/accelerate_lightning.md``
maps it: ``pytree_kit.torch.to_device``.

Every module of ``lightning`` that imported it by name (Fabric itself, its
strategies, its optimizer helpers) is patched. Lightning's other tree
function, ``apply_to_collection`` (lightning-utilities', which Lightning
re-exports and calls), is ``pk.tree_map``, as the lightning-utilities shim
maps it; Lightning's other functions stay its own.
"""

from __future__ import annotations

import types
from typing import Any

from peer_shims import lightning_utilities_shim, mapped, replace_everywhere, taken_view

import pytree_kit.torch as pkt


def move_data_to_device(batch: Any, device: Any) -> Any:
    if isinstance(device, int):  # Lightning takes a CUDA device index
        device = f"cuda:{device}"
    return pkt.to_device(batch, device)


TAKEN: dict[str, Any] = {}


def install() -> None:
    import lightning.fabric
    import lightning.fabric.utilities.apply_func as apply_func
    import lightning.fabric.utilities.optimizer  # noqa: F401

    lightning_utilities_shim.install()
    TAKEN["move_data_to_device"] = mapped(move_data_to_device)
    replace_everywhere(
        apply_func.move_data_to_device,
        TAKEN["move_data_to_device"],
        ("lightning", "lightning_fabric"),
    )


def patched_modules() -> list[types.ModuleType]:
    """The functions ``install`` took over, as Fabric's apply_func module now
    holds them."""
    import lightning.fabric.utilities.apply_func as apply_func

    taken = {n: getattr(apply_func, n) for n in TAKEN}
    return [taken_view(apply_func.__name__, taken), *lightning_utilities_shim.patched_modules()]
