"""The package's modules are in layers: each imports only modules in layers
below its own, inside functions too, so there is no import cycle.

``LAYERS`` below is the order, bottom first. A new module goes in the lowest
layer above everything it imports; one that needs something higher needs
that thing moved down, or, where a lower module must reach a higher one at
run time (the engine), to read it from a bottom module that the higher one
hands it to through a function (``_interface.use``).

The graph is read from the source with ``ast``: every ``import`` and
``from ... import`` of a pytree_kit module (at the top of a module, inside a
function, under ``if``), and ``importlib.import_module("pytree_kit....")``.
The C engine, ``_speedups``, is a module of its own: it imports what its C
files name in ``PyImport_ImportModule("pytree_kit....")`` when it loads.

Three more rules keep the joins between the layers in plain sight:

* Nothing changes TreeSpec after its class body: no module sets or deletes
  an attribute of TreeSpec.
* No module sets a name in another pytree_kit module. What a lower module
  must learn at run time it is told through a function of its own
  (``_interface.use``, ``_tracer.learn``).
* The engine is found in one place: every module reads it at call time as
  ``_interface.engine``, which only ``_engine`` sets (``_interface.use``);
  no other module reads ``_engine.impl``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the same on every engine and Python
pytestmark = pytest.mark.once

#: The layers, bottom first; a module imports only modules of lower layers.
#: Names are paths in pytree_kit/ without ``.py``; ``_speedups`` is the C engine.
LAYERS: list[list[str]] = [
    # imports nothing of pytree_kit: the engine interface (and the engine in
    # use, read at call time), what torch.compile's tracer can follow
    ["_version", "_errors", "_interface", "_tracer", "_kinds", "_reach", "_rows", "typing"],
    # path keys (keystr and an accessor's call go to the engine in use)
    ["_keys"],
    # the text of the errors both engines raise
    ["_messages"],
    # the walks' steps while torch.compile traces them
    ["_traced"],
    # other libraries' containers (jax, optree, torch) as rules
    ["_bridge"],
    # values and class references in JSON documents (TreeSpec's and torch's)
    ["_jsonvalues"],
    # a spec's nodes to JSON and back
    ["_json"],
    # TreeSpec; its methods call the engine in use (_interface.engine)
    ["_spec"],
    # the pure engine, which is the specification
    ["_pure"],
    # the C engine (it reads _pure, _messages, _spec, _keys and _kinds when it
    # loads: _interface.C_BINDINGS);
    # torch.compile's stand-ins for it
    ["_speedups", "_dynamo"],
    # chooses the engine; accelerate (FastCalls)
    ["_engine"],
    # the public functions; api makes TreeSpec's methods FastCalls
    ["api", "_reduce"],
    ["_paths", "testing", "_predicates", "_ravel"],
    ["_compare"],
    ["_restructure"],
    ["__init__"],
    # pytree_kit.torch, on top of the core
    ["torch/_bridge", "torch/_pool", "torch/_storage", "torch/_testing"],
    ["torch/_staging", "torch/_hidden"],
    # a batch goes one way: transfer drives staging, staging the pool
    ["torch/_transfer", "torch/_collate", "torch/_flatspec", "torch/_packed"],
    ["torch/_loader", "torch/_distributed", "torch/_arguments"],
    ["torch/_tracing", "torch/checkpoint"],
    ["torch/__init__"],
]

#: the one module that hands the engine to the rest (``_interface.use``)
ENGINE_SETTERS = {"_engine"}

_C_IMPORT = re.compile(r'PyImport_ImportModule\(\s*"pytree_kit\.([\w.]+)"\s*\)')


def _name(path: Path, package: Path) -> str:
    return path.relative_to(package).with_suffix("").as_posix()


def _dotted(name: str) -> str:
    """``torch/_transfer`` -> ``pytree_kit.torch._transfer``; ``torch/__init__`` -> ``pytree_kit.torch``."""
    parts = ["pytree_kit", *name.split("/")]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path) -> dict[str, Path]:
    """Every Python module of the package, by name."""
    return {_name(p, package): p for p in sorted(package.rglob("*.py"))}


def _source(name: str, node: ast.ImportFrom) -> str:
    """The dotted module a ``from ... import`` in module ``name`` reads from."""
    if not node.level:
        return node.module or ""
    here = _dotted(name).split(".")
    if not name.endswith("__init__"):
        here.pop()  # a module's package (a package's __init__ is its package)
    base = here[: len(here) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(name: str, node: ast.AST, by_dotted: dict[str, str]) -> Iterator[str]:
    """The package's modules an import statement or call names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in by_dotted:
                yield by_dotted[alias.name]
    elif isinstance(node, ast.ImportFrom):
        source = _source(name, node)
        for alias in node.names:
            if f"{source}.{alias.name}" in by_dotted:  # from . import _spec
                yield by_dotted[f"{source}.{alias.name}"]
            elif source in by_dotted:  # from ._spec import TreeSpec
                yield by_dotted[source]
    elif isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called in ("import_module", "__import__") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and arg.value in by_dotted:
                yield by_dotted[arg.value]


def import_graph(package: Path) -> dict[str, dict[str, int | str]]:
    """``{module: {imported module: where (a line, or a C file)}}``, every
    import in the package's source, and the C engine's."""
    mods = modules(package)
    names = [*mods, "_speedups"]
    by_dotted = {_dotted(n): n for n in names}
    graph: dict[str, dict[str, int | str]] = {n: {} for n in names}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)):
                for target in _targets(name, node, by_dotted):
                    graph[name].setdefault(target, node.lineno)
    for source in sorted([*package.glob("*.c"), *package.glob("*.h")]):
        for match in _C_IMPORT.finditer(source.read_text()):
            target = by_dotted.get(f"pytree_kit.{match.group(1)}")
            if target is not None:
                graph["_speedups"].setdefault(target, source.name)
    return graph


def cycles(graph: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One cycle (a path back to its first module) per strongly connected
    group of modules that import one another (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, {}):
                found.append(_cycle_in(graph, group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_in(graph: dict[str, dict[str, Any]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                return [*paths[v], start]
            if w in group and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError("not a cycle")  # pragma: no cover


def _show(graph: dict[str, dict[str, Any]], cycle: list[str]) -> str:
    return " -> ".join(
        f"{a} ({_where(graph[a][b])})" if i < len(cycle) - 1 else a
        for i, (a, b) in enumerate(zip(cycle, [*cycle[1:], cycle[0]]))
    )


def _where(at: int | str) -> str:
    return f"line {at}" if isinstance(at, int) else str(at)


def _module_aliases(name: str, tree: ast.AST, by_dotted: dict[str, str]) -> dict[str, str]:
    """The local names bound to a pytree_kit module in module ``name``."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _source(name, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in by_dotted:
                    out[alias.asname or alias.name] = by_dotted[f"{source}.{alias.name}"]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in by_dotted:
                    out[alias.asname] = by_dotted[alias.name]
    return out


def _written(node: ast.AST) -> Iterator[tuple[ast.expr, str]]:
    """(object, attribute name) of each attribute this statement or call
    sets or deletes: ``x.a = ...``, ``del x.a``, ``setattr(x, "a", ...)``."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called in ("setattr", "delattr", "__setattr__", "__delattr__") and node.args:
            args = list(node.args)
            if isinstance(func, ast.Attribute) and not (
                isinstance(func.value, ast.Name) and func.value.id in ("type", "object")
            ):
                args.insert(0, func.value)  # obj.__setattr__(name, value)
            # setattr(obj, name, value), type.__setattr__(obj, name, value)
            attr = args[1] if len(args) > 1 else None
            yield args[0], str(attr.value if isinstance(attr, ast.Constant) else "<computed>")
        return
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets.extend(t.elts)
        elif isinstance(t, ast.Attribute):
            yield t.value, t.attr


def _is_treespec(expr: ast.expr, aliases: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in aliases
    return isinstance(expr, ast.Attribute) and expr.attr == "TreeSpec"


def attribute_writes(package: Path) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Where a module changes TreeSpec (``module:line: text``), and which
    names each module sets in other pytree_kit modules ((module, module, name))."""
    mods = modules(package)
    by_dotted = {_dotted(n): n for n in [*mods, "_speedups"]}
    spec_writes: list[tuple[str, int, str]] = []
    module_writes: list[tuple[str, str, str]] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        spec_names = {"TreeSpec"} | {
            a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            for a in n.names if a.name == "TreeSpec" and a.asname
        }  # fmt: skip
        module_names = _module_aliases(name, tree, by_dotted)
        for node in ast.walk(tree):
            for obj, attr in _written(node):
                if _is_treespec(obj, spec_names):
                    spec_writes.append((name, node.lineno, ast.unparse(node)[:80]))
                elif isinstance(obj, ast.Name) and obj.id in module_names:
                    if module_names[obj.id] != name:
                        module_writes.append((name, module_names[obj.id], attr))
    return [f"{m}:{line}: {text}" for m, line, text in sorted(spec_writes)], module_writes


def engine_reads(package: Path) -> dict[str, Any]:
    """``sets``: the modules that call ``_interface.use``; ``reads``: those
    that read ``_interface.engine``; ``impl``: each read of ``_engine.impl``
    outside ``_engine`` (``module:line``)."""
    mods = modules(package)
    by_dotted = {_dotted(n): n for n in [*mods, "_speedups"]}
    found: dict[str, Any] = {"sets": set(), "reads": set(), "impl": []}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = _module_aliases(name, tree, by_dotted)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _source(name, node) == "pytree_kit._engine":
                if any(a.name == "impl" for a in node.names):
                    found["impl"].append(f"{name}:{node.lineno}")
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            module = aliases.get(node.value.id)
            if module == "_interface" and node.attr == "use":
                found["sets"].add(name)
            elif module == "_interface" and node.attr == "engine":
                found["reads"].add(name)
            elif module == "_engine" and node.attr == "impl" and name != "_engine":
                found["impl"].append(f"{name}:{node.lineno}")
    return found


# --------------------------------------------------------------------------
# the package


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(ROOT / "pytree_kit")
    assert graph["_speedups"], "the C engine's imports were not found"
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_show(graph, c) for c in found)


def test_each_module_imports_only_lower_layers() -> None:
    graph = import_graph(ROOT / "pytree_kit")
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    listed = [name for names in LAYERS for name in names]
    assert len(listed) == len(set(listed)), "a module is in two layers"
    assert set(graph) - set(layer) == set(), "add these modules to LAYERS"
    assert set(layer) - set(graph) == set(), "these modules of LAYERS do not exist"
    upward = [
        f"{name} (layer {layer[name]}) imports {target} (layer {layer[target]}) at {_where(at)}"
        for name, targets in sorted(graph.items())
        for target, at in targets.items()
        if layer[target] >= layer[name]
    ]
    assert not upward, "\n".join(upward)


def test_nothing_changes_treespec_after_its_class_body() -> None:
    spec_writes, _ = attribute_writes(ROOT / "pytree_kit")
    assert not spec_writes, "\n".join(spec_writes)


def test_no_module_sets_a_name_in_another() -> None:
    _, module_writes = attribute_writes(ROOT / "pytree_kit")
    assert not module_writes, module_writes


def test_the_engine_is_found_in_one_place() -> None:
    found = engine_reads(ROOT / "pytree_kit")
    assert found["sets"] == ENGINE_SETTERS, found
    assert found["impl"] == [], found["impl"]
    # and the modules that call an engine do read it there
    assert {"_spec", "_keys", "api", "_paths", "torch/_packed"} <= found["reads"]


#: The specification's three jobs, each in a module of its own: the rules
#: (``_pure``), the text of the errors (``_messages``) and the steps that
#: differ while torch.compile traces (``_traced``). Only these modules read
#: ``_tracer``, the facts of the installed torch's tracer, among the engine's.
TRACER_READERS = {"_traced", "_dynamo", "_spec"}


def spec_jobs(package: Path) -> list[str]:
    """Where the specification does another module's job: ``_pure`` reading
    ``_tracer`` (its traced steps are ``_traced``'s), ``_messages`` or
    ``_traced`` importing ``_pure`` (they are below it), or a module outside
    ``TRACER_READERS`` importing ``_tracer``."""
    graph = import_graph(package)
    found = [f"{name} imports _tracer" for name in graph if "_tracer" in graph[name]]
    found = [f for f in found if f.split()[0] not in TRACER_READERS]
    found += [
        f"{name} imports _pure"
        for name in ("_messages", "_traced")
        if "_pure" in graph.get(name, {})
    ]
    return found


def test_the_specifications_three_jobs_are_apart() -> None:
    assert spec_jobs(ROOT / "pytree_kit") == []


def test_a_traced_step_back_in_the_specification_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "_tracer.py": "",
            "_traced.py": "from . import _tracer\n",
            "_messages.py": "",
            "_pure.py": "from . import _tracer, _traced, _messages\n",
        },
    )
    assert spec_jobs(package) == ["_pure imports _tracer"]


# --------------------------------------------------------------------------
# the checks catch what they are for (a small package written here)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "pytree_kit"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "from .api import f\n",
            "_low.py": "def g():\n    from .api import f  # lazily, upwards\n    return f\n",
            "api.py": "from . import _low\n\ndef f():\n    return _low\n",
            "sub/__init__.py": "",
            "sub/_a.py": "from .. import api\nfrom ._b import x\n",
            "sub/_b.py": "import importlib\nx = importlib.import_module('pytree_kit.sub._a')\n",
            "_engine.c": 'PyImport_ImportModule("pytree_kit.api");\n',
        },
    )
    graph = import_graph(package)
    assert graph["_low"] == {"api": 2}
    assert graph["api"] == {"_low": 1}
    assert graph["sub/_a"] == {"api": 1, "sub/_b": 2}
    assert graph["_speedups"] == {"api": "_engine.c"}
    assert sorted(cycles(graph)) == [["_low", "api", "_low"], ["sub/_a", "sub/_b", "sub/_a"]]
    assert _show(graph, ["_low", "api", "_low"]) == "_low (line 2) -> api (line 1) -> _low"


def test_a_change_of_treespec_outside_api_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "_spec.py": "class TreeSpec:\n    pass\n",
            "_engine.py": (
                "from . import _spec\n"
                "from . import _keys\n"
                "from ._spec import TreeSpec as Spec\n"
                "_spec.TreeSpec.a = 1\n"
                "def f():\n"
                "    setattr(Spec, 'b', 2)\n"
                "    type.__setattr__(_spec.TreeSpec, 'c', 3)\n"
                "    del Spec.a\n"
                "_spec._impl = None\n"
                "_keys._fast = None\n"
                "_spec.TreeSpec._make(1)  # a call, not a write\n"
            ),
            "_keys.py": "",
            "api.py": "from ._spec import TreeSpec\nTreeSpec.unflatten = None\n",
        },
    )
    spec_writes, module_writes = attribute_writes(package)
    assert [w.split(": ")[0] for w in spec_writes if not w.startswith("api:")] == [
        "_engine:4",
        "_engine:6",
        "_engine:7",
        "_engine:8",
    ]
    assert "api:2: TreeSpec.unflatten = None" in spec_writes
    assert set(module_writes) == {("_engine", "_spec", "_impl"), ("_engine", "_keys", "_fast")}


def test_an_engine_found_elsewhere_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "_interface.py": "engine = None\ndef use(e):\n    global engine\n    engine = e\n",
            "_engine.py": "from . import _interface\nimpl = 1\n_interface.use(impl)\n",
            "api.py": "from . import _interface as i\ndef f():\n    return i.engine.flatten\n",
            "_paths.py": "from ._engine import impl\n",
            "_reduce.py": "from . import _engine, _interface\nx = _engine.impl\n_interface.use(x)\n",
        },
    )
    found = engine_reads(package)
    assert found == {
        "sets": {"_engine", "_reduce"},
        "reads": {"api"},
        "impl": ["_paths:1", "_reduce:2"],
    }
