"""accelerate's tree functions on pytree_kit, as
``docs/migration/accelerate_lightning.md`` maps them: ``send_to_device`` is
``pytree_kit.torch.to_device``, ``recursively_apply`` is ``pk.tree_map`` (with
``is_leaf`` stopping at what ``test_type`` accepts), ``is_namedtuple`` is
``pk.is_namedtuple``.

accelerate's other functions (``gather``, ``pad_across_processes``,
``convert_to_fp32``, its hooks and its DataLoader) stay its own: they call the
shim's functions where they called accelerate's, as every module of
accelerate that imported them by name is patched. ``send_to_device``'s
``skip_keys`` (keys of a dict left where they are) and ``recursively_apply``'s
``error_on_other_type`` (a TypeError for a leaf ``test_type`` refuses) have no
counterpart: a call that passes them is not applicable.
"""

from __future__ import annotations

import types
from typing import Any

from peer_shims import mapped, missing, replace_everywhere, taken_view

import pytree_kit as pk
import pytree_kit.torch as pkt

_skip_keys = missing("send_to_device(skip_keys=...)", "to_device moves every tensor of a batch")
_other_type = missing(
    "recursively_apply(error_on_other_type=True)", "tree_map keeps every other leaf as it is"
)


def send_to_device(
    tensor: Any, device: Any, non_blocking: bool = False, skip_keys: Any = None
) -> Any:
    if skip_keys:
        _skip_keys()
    return pkt.to_device(tensor, device, non_blocking=non_blocking)


def recursively_apply(
    func: Any, data: Any, *args: Any, test_type: Any = None, error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:  # fmt: skip
    if error_on_other_type:
        _other_type()
    if test_type is None:
        import accelerate.utils.operations as operations

        test_type = operations.is_torch_tensor
    return pk.tree_map(
        lambda x: func(x, *args, **kwargs) if test_type(x) else x, data, is_leaf=test_type
    )


def is_namedtuple(data: Any) -> bool:
    return pk.is_namedtuple(data)


TAKEN: dict[str, Any] = {}


def install() -> None:
    import accelerate
    import accelerate.data_loader
    import accelerate.hooks  # noqa: F401
    import accelerate.utils.operations as operations

    for fn in (send_to_device, recursively_apply, is_namedtuple):
        original = getattr(operations, fn.__name__)
        TAKEN[fn.__name__] = mapped(fn)
        replace_everywhere(original, TAKEN[fn.__name__], ("accelerate",))


def patched_modules() -> list[types.ModuleType]:
    """The functions ``install`` took over, as accelerate's operations module
    now holds them (its other functions are accelerate's own machinery)."""
    import accelerate.utils.operations as operations

    return [taken_view(operations.__name__, {n: getattr(operations, n) for n in TAKEN})]
