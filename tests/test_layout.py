"""Where a module's tests are: the tests mirror the package.

* ``tests/test_X.py`` tests ``pytree_kit/X.py`` or ``pytree_kit/_X.py`` (or the
  C file ``pytree_kit/_X.c``); ``tests/torch/test_X.py`` tests
  ``pytree_kit/torch/X.py`` or ``_X.py``. A subpackage's tests are the folder
  of its name.
* Every public module has the test module of its name.
* A module without a test module of its own is in ``COVERED_BY``, with the
  test modules that test it; a module that has one is not.
* A test module named after no module tests a script (``scripts/X.py``), a
  benchmark (``benchmarks/X.py``), or is one of the ``TOPICS``: checks across
  modules, each with what it checks.
* Helpers and worker scripts are in ``tests/support/``; what the tests share
  with ``scripts/`` (the tree corpus, the hostile trees, the leak workload, the
  JSON cases) is in ``scripts/corpus/``. Nothing in ``scripts/``,
  ``benchmarks/`` or the package imports ``tests``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PACKAGE = ROOT / "pytree_kit"

# the same on every engine and Python
pytestmark = pytest.mark.once

#: modules without a test module of their own: the test modules that test them
COVERED_BY: dict[str, tuple[str, ...]] = {
    "pytree_kit/_engine.py": ("tests/test_engines.py", "tests/test_interface.py"),
    "pytree_kit/_jsonvalues.py": ("tests/test_json.py", "tests/test_fuzz_json.py"),
    "pytree_kit/_messages.py": ("tests/test_errors.py", "tests/test_interface.py"),
    "pytree_kit/_pure.py": ("tests/test_engines.py", "tests/test_kinds.py"),
    "pytree_kit/_traced.py": ("tests/test_dynamo.py", "tests/test_layering.py"),
    "pytree_kit/_tracer.py": ("tests/test_dynamo.py", "tests/test_layering.py"),
    "pytree_kit/_version.py": ("tests/test_packaging.py",),
    "pytree_kit/torch/_arguments.py": ("tests/torch/test_tracing.py",),
    "pytree_kit/torch/_flatspec.py": ("tests/torch/test_tracing.py",),
    "pytree_kit/torch/_loader.py": ("tests/torch/test_loading.py",),
    "pytree_kit/torch/_pool.py": ("tests/torch/test_loading.py", "tests/torch/test_transfer.py"),
    "pytree_kit/torch/_staging.py": ("tests/torch/test_loading.py", "tests/torch/test_transfer.py"),
    "pytree_kit/torch/_storage.py": ("tests/torch/test_collate.py", "tests/torch/test_loading.py"),
    "pytree_kit/torch/_testing.py": ("tests/test_compare.py",),
}

#: test modules named after no module: what each checks, across modules
TOPICS: dict[str, str] = {
    "tests/test_engines.py": "the C engine against the pure one, operation by operation",
    "tests/test_subclasses.py": "subclasses of the builtin containers: the mapping and "
    "sequence kinds and their rebuild",
    "tests/torch/test_real_batches.py": "the batches users have (a tokenizer's, a dict "
    "subclass, an object with .to()) through every torch adapter",
    "tests/test_depth.py": "every traversal at depths the peers cannot reach",
    "tests/test_threads.py": "eight threads on shared trees",
    "tests/test_iter.py": "tree_iter: the C engine's iterator and the pure engine's generator",
    "tests/test_peers.py": "pytree_kit against jax, optree, torch and dm-tree",
    "tests/test_public_objects.py": "both engines' results as objects (weakref, pickle, repr)",
    "tests/test_versions.py": "what each Python gets: the engine and its fast paths",
    "tests/test_c_layout.py": "the C engine's files: each compiles alone",
    "tests/test_layering.py": "the package's import layers",
    "tests/test_layout.py": "where code and its tests live",
    "tests/test_lint.py": "ruff and mypy",
    "tests/test_packaging.py": "the package as users install it",
    "tests/test_readme.py": "the README's example and test command",
    "tests/test_docs_examples.py": "every docs page's examples",
    "tests/test_docs_site.py": "the docs site in a browser",
    "tests/test_benchmark_smoke.py": "every benchmark script's quick run",
    "tests/test_benchmark_output.py": "benchmarks write no tracked file",
    "tests/torch/test_loading.py": "docs/loading.md: collate, pin_memory, to_device, PinnedLoader",
    "tests/torch/test_training_run.py": "the torch adapters together over a training run",
    "tests/torch/test_recipes.py": "docs/loading.md's recipes with Lightning, accelerate",
}

#: test modules of what a script of scripts/ does (its fast subset, or its parts)
SCRIPT_TESTS = {"test_leaks.py": "leaks.py", "test_fuzz_json.py": "fuzz_json.py"}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def modules() -> list[Path]:
    """The package's Python modules (not __init__), and its C files."""
    found = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    found += PACKAGE.glob("_*.c")
    return sorted(found)


def own_test(module: Path) -> Path:
    """Where a module's test module is: tests/<subpackage>/test_<name without _>.py."""
    folder = TESTS.joinpath(*module.relative_to(PACKAGE).parent.parts)
    return folder / f"test_{module.stem.lstrip('_')}.py"


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "support" not in p.parts)


def test_every_python_file_of_tests_is_a_test_module_or_support() -> None:
    stray = [
        rel(p)
        for p in TESTS.rglob("*.py")
        if "support" not in p.relative_to(TESTS).parts
        and not p.name.startswith("test_")
        and p.name not in ("__init__.py", "conftest.py")
    ]
    assert not stray, f"helpers belong in tests/support/: {stray}"
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= subpackages | {"support"}, f"folders mirror no subpackage: {folders}"


def test_every_public_module_has_the_test_module_of_its_name() -> None:
    public = [p for p in PACKAGE.rglob("*.py") if not p.name.startswith("_")]
    lacking = [rel(p) for p in public if not own_test(p).exists()]
    assert not lacking, f"public modules without tests/…/test_<name>.py: {lacking}"
    for package in PACKAGE.iterdir():
        if (package / "__init__.py").exists():
            assert (TESTS / package.name / "__init__.py").exists(), package.name


def test_a_module_without_a_test_module_of_its_own_names_those_that_test_it() -> None:
    without = {rel(m) for m in modules() if m.suffix == ".py" and not own_test(m).exists()}
    assert without == set(COVERED_BY), (
        f"not in COVERED_BY: {sorted(without - set(COVERED_BY))}; "
        f"in COVERED_BY with a test module of its own (or gone): "
        f"{sorted(set(COVERED_BY) - without)}"
    )
    for module, tests in COVERED_BY.items():
        name = Path(module).stem
        for test in tests:
            assert (ROOT / test).exists(), test
            text = (ROOT / test).read_text()
            # the test module reaches the module: by its name, or by what it exports
            exported = _public_names(ROOT / module)
            assert name in text or any(n in text for n in exported), (module, test)


def _public_names(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            names.add(node.name)
    return names


def test_every_test_module_is_named_after_what_it_tests() -> None:
    named = {rel(own_test(m)) for m in modules()}
    scripts = {p.name for p in (ROOT / "scripts").glob("*.py")}
    benchmarks = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    unplaced = []
    for path in _test_modules():
        name = rel(path)
        stem = path.name[len("test_") :]
        if name in named or name in TOPICS:
            continue
        if path.parent == TESTS and (stem in scripts or stem in benchmarks):
            continue
        if path.parent == TESTS and SCRIPT_TESTS.get(path.name) in scripts:
            continue
        unplaced.append(name)
    assert not unplaced, (
        f"named after no module, script or benchmark, and not in TOPICS: {unplaced}"
    )
    for name in TOPICS:
        assert (ROOT / name).exists(), f"TOPICS names a test module that is gone: {name}"
        assert name not in named, f"{name} is named after a module: not a topic"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [("scripts", ("tests",)), ("benchmarks", ("tests",)), ("pytree_kit", ("tests", "scripts"))],
)
def test_nothing_outside_the_tests_imports_them(folder: str, forbidden: tuple) -> None:
    bad = sorted(
        f"{rel(path)} imports {name}"
        for path in (ROOT / folder).rglob("*.py")
        for name in _imports(path)
        if name.split(".")[0] in forbidden
    )
    assert not bad, bad
