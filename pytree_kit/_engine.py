"""Chooses the engine: the C extension when importable, else the pure one.

``PYTREE_KIT_PURE=1`` in the environment forces the pure engine.
"""

from __future__ import annotations

import os
from typing import Any

from . import _pure, _spec

impl: Any = _pure
if os.environ.get("PYTREE_KIT_PURE", "") not in ("", "0"):
    impl = _pure
else:
    try:
        from . import _speedups
    except ImportError:  # not built (no compiler, or not CPython)
        impl = _pure
    else:
        impl = _speedups

ENGINE: str = impl.NAME
_spec._impl = impl
