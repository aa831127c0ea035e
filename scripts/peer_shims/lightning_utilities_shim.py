"""lightning-utilities' ``apply_to_collection`` and ``apply_to_collections``
on pytree_kit, as ``docs/migration/accelerate_lightning.md`` maps them:
``pk.tree_map``, with ``is_leaf`` stopping at the values of ``dtype`` (which
may be containers: ``dtype=dict`` gives ``function`` each dict whole).

``include_none=False`` (drop the entries ``function`` turned into None) has
no counterpart: ``tree_map`` keeps the structure it is given, so a call that
passes it is not applicable. ``allow_frozen`` is taken and has no effect:
pytree_kit rebuilds a frozen dataclass, where lightning-utilities raises
without it. Every module of lightning-utilities, Lightning and torchmetrics
that imported the functions by name is patched.
"""

from __future__ import annotations

import types
from typing import Any, Callable

from peer_shims import mapped, missing, replace_everywhere, taken_view

import pytree_kit as pk

_include_none = missing(
    "apply_to_collection(include_none=False)", "tree_map keeps the structure it is given"
)


def _matches(dtype: Any, wrong_dtype: Any) -> Callable[[Any], bool]:
    def match(x: Any) -> bool:
        return isinstance(x, dtype) and (wrong_dtype is None or not isinstance(x, wrong_dtype))

    return match


def apply_to_collection(
    data: Any,
    dtype: Any,
    function: Callable,
    *args: Any,
    wrong_dtype: Any = None,
    include_none: bool = True,
    allow_frozen: bool = False,
    **kwargs: Any,
) -> Any:
    if not include_none:
        _include_none()
    match = _matches(dtype, wrong_dtype)
    return pk.tree_map(
        lambda x: function(x, *args, **kwargs) if match(x) else x, data, is_leaf=match
    )


def apply_to_collections(
    data1: Any,
    data2: Any,
    dtype: Any,
    function: Callable,
    *args: Any,
    wrong_dtype: Any = None,
    **kwargs: Any,
) -> Any:
    if data1 is None or data2 is None:  # one collection: as apply_to_collection
        if data1 is None and data2 is None:
            return None
        one = data2 if data1 is None else data1
        return apply_to_collection(one, dtype, function, *args, wrong_dtype=wrong_dtype, **kwargs)
    match = _matches(dtype, wrong_dtype)
    return pk.tree_map(
        lambda a, b: function(a, b, *args, **kwargs) if match(a) else a, data1, data2, is_leaf=match
    )


TAKEN: dict[str, Any] = {}


def install() -> None:
    import lightning_utilities.core.apply_func as apply_func

    try:  # the modules that imported the functions by name
        import lightning.fabric  # noqa: F401
        import torchmetrics  # noqa: F401
    except ImportError:
        pass
    for fn in (apply_to_collection, apply_to_collections):
        original = getattr(apply_func, fn.__name__)
        TAKEN[fn.__name__] = mapped(fn)
        replace_everywhere(
            original, TAKEN[fn.__name__], ("lightning_utilities", "lightning", "torchmetrics")
        )


def patched_modules() -> list[types.ModuleType]:
    """The functions ``install`` took over, as lightning-utilities' apply_func
    module now holds them."""
    import lightning_utilities.core.apply_func as apply_func

    return [taken_view(apply_func.__name__, {n: getattr(apply_func, n) for n in TAKEN})]
