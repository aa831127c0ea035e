"""Chooses the engine: the C extension when importable, else the pure one.

``PYTREE_KIT_PURE=1`` in the environment forces the pure engine.

On a free-threaded CPython (PEP 703) running without the GIL, the pure engine
is chosen too: the C engine relies on the GIL (its per-type cache and its
reads of the caller's lists are not guarded by locks), so CPython would turn
the GIL back on for the whole process when it is imported. ``PYTREE_KIT_PURE=0``
asks for the C engine anyway, and with it the GIL. See docs/reliability.md.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional, TypeVar

from . import _pure, _spec


def wants_c(setting: Optional[str], gil_enabled: Optional[Callable[[], bool]]) -> bool:
    """Whether to use the C engine, given ``PYTREE_KIT_PURE`` (None when unset)
    and ``sys._is_gil_enabled`` (None before Python 3.13).

    Examples:
        >>> wants_c(None, None), wants_c("1", None), wants_c("0", None)
        (True, False, True)
        >>> wants_c(None, lambda: False), wants_c("0", lambda: False)
        (False, True)
    """
    if setting not in (None, "", "0"):
        return False
    if setting == "0":
        return True
    return gil_enabled is None or gil_enabled()


impl: Any = _pure
if wants_c(os.environ.get("PYTREE_KIT_PURE"), getattr(sys, "_is_gil_enabled", None)):
    try:
        from . import _speedups
    except ImportError:  # not built (no compiler, or not CPython)
        impl = _pure
    else:
        impl = _speedups

ENGINE: str = impl.NAME
_spec._impl = impl

F = TypeVar("F", bound=Callable[..., Any])


def accelerate(name: str) -> Callable[[F], F]:
    """Decorator for a public function (``name`` as ``_fastcall.c``'s table has it).

    With the C engine, the def is wrapped in a ``_speedups.FastCall``, which
    makes the common calls (required arguments, ``is_leaf``, ``rules=None``)
    in C and hands every other call to the def; ``functools.wraps`` gives it
    the def's name, docstring, signature and ``__wrapped__``. With the pure
    engine the def is returned as it is.
    """

    def wrap(func: F) -> F:
        if impl is _pure:
            return func
        fast: Any = functools.update_wrapper(impl.FastCall(func, name, _spec.TreeSpec), func)
        # torch.compile's dynamo cannot read C; it traces the def of a wrapper
        # marked this way (torch's own convention, from torch.jit's
        # _script_if_tracing). Nothing here imports torch.
        fast.__original_fn = func
        fast.__script_if_tracing_wrapper = True
        return fast  # type: ignore[no-any-return]

    return wrap


#: TreeSpec's methods that ``accelerate`` wraps (``_dynamo`` puts the defs back)
SPEC_METHODS = ("unflatten", "flatten_up_to")
for _name in SPEC_METHODS:
    setattr(
        _spec.TreeSpec,
        _name,
        accelerate(f"TreeSpec.{_name}")(_spec.TreeSpec.__dict__[_name]),
    )

if impl is not _pure:
    from . import _dynamo

    _dynamo.install()
