"""``torch_rules``: rules read from ``torch.utils._pytree``'s registrations.

transformers, tensordict and others register their classes with torch's pytree
(for ``torch.export``); ``torch_rules`` turns those registrations into
:class:`pytree_kit.Rule` values to pass as ``rules=``. Nothing is registered
anywhere. The shared machinery (equal rules from equal calls, hashable
contexts, named children, and the calls into torch's registry, which a spec
unpickled in another process needs before anything imports this module) is in
``pytree_kit._bridge``.
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as torch_pytree

from .. import _bridge
from .._kinds import Rule

__all__ = ["torch_rules"]


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
        "torch", types, lambda t: _bridge.torch_node(t) is not None, native=_native
    )
