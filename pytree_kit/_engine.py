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
    try:  # the C engine of a later release; absent for now
        from . import _speedups  # type: ignore[attr-defined]
    except ImportError:
        impl = _pure
    else:  # pragma: no cover - no C engine yet
        impl = _speedups

ENGINE: str = impl.NAME
_spec._impl = impl
