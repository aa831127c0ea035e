"""Collection settings for the whole repository (tests/ and the doctests in pytree_kit/).

The docstring examples of pytree_kit/torch/_distributed.py start and destroy gloo
process groups. In a long pytest session torch 2.13 can deadlock there: the last
reference to a ProcessGroupGloo is dropped with the GIL held, its destructor joins
the worker threads, and a worker that is still releasing a Python object kept in
its thread-local state waits for the GIL (seen once in CI, in the doctest's global
cleanup). pytest-timeout cannot interrupt that join. So those examples are not
collected here; tests/torch/test_distributed.py runs them with doctest in a fresh
process, under a timeout (as tests/test_docs_examples.py runs a docs page that
starts a process group).
"""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

# tests/support/bridge_worker.py is a script run in fresh processes (it imports
# transformers, whose registrations are global): never imported here; nor are
# tests/support/typing_examples, which mypy reads (tests/test_typing.py).
collect_ignore = [
    "pytree_kit/torch/_distributed.py",
    "tests/support/bridge_worker.py",
    "tests/support/typing_examples",
]

# Without torch (every Python but the one its wheel is for), the modules that
# import torch at the top are not collected: pytree_kit.torch's doctests and
# the helper modules of the torch tests (tests/support/), which are
# not tests themselves but --doctest-modules imports them. They are found by
# reading their imports, so a new helper cannot be forgotten here (one was:
# CI failed collecting tests/support/packed_lifecycle.py on 3.10, 3.12 and 3.13). The
# torch tests skip on their own (pytest.importorskip).
_IMPORTS_TORCH = re.compile(r"^(import|from) torch\b", re.MULTILINE)


def _helpers_importing_torch() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(
        f"tests/support/{path.name}"
        for path in (here / "tests" / "support").glob("*.py")
        if _IMPORTS_TORCH.search(path.read_text())
    )


if importlib.util.find_spec("torch") is None:
    collect_ignore += ["pytree_kit/torch", *_helpers_importing_torch()]


# A docstring example that imports a peer (jax_rules' imports jax, ravel's
# numpy) skips where that peer is not installed, with the reason, as the tests
# that need one do (pytest.importorskip): the test extra installs every peer
# that has a wheel for the Python (dm-tree has none for 3.15), and a user's
# venv may hold none. Only the peers named here: an example importing any
# other missing module fails, as it should.
PEERS = ("attrs", "jax", "numpy", "optree", "tensordict", "torch", "transformers", "tree")


def _imported_tops(source: str) -> set[str]:
    """The top-level packages an example's source imports."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a continuation line of an example; doctest says so
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def missing_peers(examples: list) -> list[str]:
    """The PEERS the examples import that are not installed, sorted."""
    wanted = set().union(*(_imported_tops(e.source) for e in examples)) & set(PEERS)
    return sorted(m for m in wanted if importlib.util.find_spec(m) is None)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        dtest = getattr(item, "dtest", None)  # a docstring example (DoctestItem)
        if dtest is None:
            continue
        missing = missing_peers(dtest.examples)
        if missing:
            reason = f"its examples import {' and '.join(missing)}: not installed"
            item.add_marker(pytest.mark.skip(reason=reason))
