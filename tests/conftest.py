import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

_common = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("default", max_examples=150, **_common)
settings.register_profile("ci", max_examples=150, derandomize=True, **_common)
settings.register_profile("long", max_examples=5000, **_common)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default")
)


@pytest.fixture(scope="session")
def ci() -> Any:
    """scripts/ci.py, the README's test command, as a module."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "ci.py"
    spec = importlib.util.spec_from_file_location("_pytree_kit_ci", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
