"""transformers' ``ModelOutput`` test of torch's pytree, on pytree_kit: the
test calls ``torch.utils._pytree``, which the torch shim puts pytree_kit
behind (``docs/migration/torch.md``), with torch's leaves and the classes
registered with torch bridged (transformers registers each ``ModelOutput``
class as it is made; pytree_kit reads a bare ``ModelOutput`` by what it is, a
mapping).
"""

from __future__ import annotations

import types

from peer_shims import torch_shim


def install() -> None:
    import transformers.utils  # noqa: F401  (its registrations: the user's setup)

    torch_shim.install()


def patched_modules() -> list[types.ModuleType]:
    return torch_shim.patched_modules()
