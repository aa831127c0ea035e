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
# CI's sanitizer jobs (scripts/ci.py): the engine tests run ~3x slower under
# ASan, and their property tests' logic is checked at full size in every
# engine job; here they are a sample that sends varied trees through the
# instrumented C engine (scripts/long_runs.sh runs the whole suite sanitized)
settings.register_profile("sanitize", max_examples=50, derandomize=True, **_common)
# CI's pure-engine jobs: the pure engine is the specification, and the C-engine
# job of the same Python already runs every differential test (both engines,
# 150 examples); here every test still runs, on a smaller sample
settings.register_profile("pure", max_examples=60, derandomize=True, **_common)
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


def pytest_report_header(config: Any) -> str:
    """Which engine runs, and (on a free-threaded CPython) whether the GIL is on."""
    import pytree_kit as pk

    gil = getattr(sys, "_is_gil_enabled", None)
    state = "on (no free-threaded build)" if gil is None else ("on" if gil() else "off")
    return f"pytree_kit: engine {pk.ENGINE}, GIL {state}"
