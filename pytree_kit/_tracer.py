"""What pytree_kit knows of torch.compile's tracer (dynamo).

The pure engine is what dynamo traces in place of the C engine, and a few of
its steps differ while it is traced: what the installed torch's tracer can
follow (docs/compatibility.md). This module holds those facts, read at call
time as ``_tracer.compiling()``, ``_tracer.reads_instance_dicts`` and
``_tracer.reads_identity``. Until ``torch._dynamo`` is imported nothing can
trace, and they say so; ``_dynamo`` then tells them what it learned from
torch, once, through :func:`learn`.

This module imports nothing of pytree_kit, and nothing here imports torch.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["compiling", "learn", "reads_identity", "reads_instance_dicts"]


def _never() -> bool:
    return False


#: Whether dynamo is tracing the call (``torch.compiler.is_compiling`` once
#: ``torch._dynamo`` is imported); dynamo reads its answer as a constant.
compiling: Callable[[], bool] = _never

#: Whether the tracer can read an instance's ``__dict__`` (its keys, values
#: and length): dynamo can from torch 2.12 on. Where it cannot, a traced walk
#: reads a record's fields with ``getattr`` and cannot see state its instance
#: keeps in its ``__dict__`` outside the fields.
reads_instance_dicts = True

#: Whether the tracer can read and compare containers' identities (``id``),
#: which a traced walk whose path gets deep needs to look for cycles: dynamo
#: can from torch 2.13 on (2.9-2.11 cannot read an ``id`` of a dict or list,
#: 2.12 cannot compare two, and none compares two containers with ``is`` in
#: every case).
reads_identity = True


def learn(is_compiling: Callable[[], bool], instance_dicts: bool, identity: bool) -> None:
    """Record what the installed torch's tracer can do (``_dynamo`` calls this
    once ``torch._dynamo`` is imported; a test may call it, and puts the old
    facts back)."""
    global compiling, reads_instance_dicts, reads_identity
    compiling, reads_instance_dicts, reads_identity = is_compiling, instance_dicts, identity
