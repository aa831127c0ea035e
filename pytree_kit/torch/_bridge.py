"""``torch_rules``: rules read from ``torch.utils._pytree``'s registrations.

transformers, tensordict and others register their classes with torch's pytree
(for ``torch.export``); ``torch_rules`` turns those registrations into
:class:`pytree_kit.Rule` values to pass as ``rules=``. Nothing is registered
anywhere. The shared machinery (equal rules from equal calls, hashable
contexts, named children) is in ``pytree_kit._bridge``.
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as torch_pytree

from .. import _bridge
from .._kinds import Rule

__all__ = ["torch_rules"]


def _node(cls: type) -> Any:
    node = torch_pytree.SUPPORTED_NODES.get(cls)
    if node is None:
        raise TypeError(f"{cls.__qualname__} is no longer registered with torch.utils._pytree")
    return node


def _key_name(key: Any) -> Any:
    """A torch KeyEntry's name: MappingKey's str key, GetAttrKey's name."""
    if type(key) is torch_pytree.MappingKey and type(key.key) is str:
        return key.key
    if type(key) is torch_pytree.GetAttrKey:
        return key.name
    return None


def _flatten(cls: type, namespace: str, obj: Any) -> tuple[Any, Any]:
    node = _node(cls)
    if node.flatten_with_keys_fn is not None:
        pairs, context = node.flatten_with_keys_fn(obj)
        pairs = list(pairs)
        keys = [_key_name(k) for k, _ in pairs]
        kids, names = _bridge.named(keys, [c for _, c in pairs])
    else:
        children, context = node.flatten_fn(obj)
        kids, names = list(children), None
    return kids, (_bridge.Foreign(context), names)


def _unflatten(cls: type, namespace: str, aux: Any, children: Any) -> Any:
    context, keys = aux
    return _node(cls).unflatten_fn(_bridge.in_order(children, keys), context.value)


_bridge.LIBRARIES["torch"] = (_flatten, _unflatten)


def _native(t: Any) -> bool:
    """Registered with torch, but read by pytree_kit itself (or a leaf there)."""
    import torch

    return (
        not isinstance(t, type)
        or t in _bridge.NATIVE
        or t is torch.Size
        or t.__module__ == "torch.return_types"  # structseqs
    )


def torch_rules(*types: type) -> dict[type, Rule]:
    """Rules for classes registered with ``torch.utils._pytree``, to pass as ``rules=``.

    With no ``types``, a rule for every class registered there at call time,
    but those pytree_kit reads by itself (builtin containers, namedtuples,
    structseqs, ``torch.Size``). Each rule calls torch's registered functions
    when it runs; nothing is registered anywhere. Children are named by torch's
    keys (``MappingKey`` of a str, ``GetAttrKey``) where the registration gives
    them, so paths read ``cache['key_cache'][0]``; by position otherwise.

    Examples:
        >>> import torch, torch.utils._pytree as torch_pytree
        >>> import pytree_kit.torch as pkt
        >>> class Cache:  # registered with torch, as libraries do for torch.export
        ...     def __init__(self, k, v):
        ...         self.k, self.v = k, v
        >>> torch_pytree.register_pytree_node(
        ...     Cache, lambda c: ([c.k, c.v], None), lambda ch, _: Cache(*ch))
        >>> out = pkt.to_device({"cache": Cache(torch.ones(1), torch.zeros(1))}, "meta",
        ...                     rules=pkt.torch_rules(Cache))
        >>> out["cache"].v.device
        device(type='meta')
    """
    if not types:
        types = tuple(t for t in torch_pytree.SUPPORTED_NODES if not _native(t))
    return _bridge.rules_for(
        "torch", types, lambda t: t in torch_pytree.SUPPORTED_NODES, native=_native
    )
