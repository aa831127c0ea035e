"""Both engines against the one declaration of what an engine provides,
``pytree_kit/_interface.py``: every member is there, and every operation
takes the positional arguments declared, required and optional. For the C
engine the signatures are read from its functions' text signatures, and a
call with one argument too many or too few must be refused with a message
that gives the declared count (the signatures are docstrings; this keeps
them true)."""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path
from typing import Any

import pytest

from pytree_kit import _interface, _pure
from pytree_kit._interface import CONSTANTS, OPERATIONS, TRACED, Engine

# runs the engines side by side, not through the public API: the same whichever
# engine that uses, so the pure-engine jobs leave it out (scripts/ci.py)
pytestmark = pytest.mark.side_by_side

P = inspect.Parameter
POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)


def engines() -> list[Any]:
    found = [pytest.param(_pure, id="python")]
    try:
        from pytree_kit import _speedups
    except ImportError:  # not built: the pure engine alone
        return found
    return [*found, pytest.param(_speedups, id="c")]


def arity(fn: Any, method: bool = False) -> tuple[int, float]:
    """(required positional arguments, all positional ones: inf with *args)."""
    params = list(inspect.signature(fn).parameters.values())[1 if method else 0 :]
    if any(p.kind is P.VAR_POSITIONAL for p in params):
        return sum(1 for p in params if p.kind in POSITIONAL and p.default is P.empty), float("inf")
    positional = [p for p in params if p.kind in POSITIONAL]
    return sum(1 for p in positional if p.default is P.empty), len(positional)


def problems(engine: Any) -> list[str]:
    """What ``engine`` lacks, or takes differently from ``Engine``."""
    found = []
    for name in CONSTANTS:
        if not hasattr(engine, name):
            found.append(f"{name}: missing")
    for name in OPERATIONS:
        fn = getattr(engine, name, None)
        if fn is None or not callable(fn):
            found.append(f"{name}: missing")
            continue
        want = arity(getattr(Engine, name), method=True)
        try:
            got = arity(fn)
        except ValueError:  # a C function with no text signature
            found.append(f"{name}: no signature")
            continue
        if got != want:
            found.append(f"{name}: takes {got}, declared {want} (required, all)")
    return found


STUB = Path(_interface.__file__).with_name("_speedups.pyi")


def test_operations_are_the_protocols_methods() -> None:
    declared = [
        n for n, v in vars(Engine).items() if inspect.isfunction(v) and not n.startswith("_")
    ]
    assert tuple(declared) == OPERATIONS and len(OPERATIONS) >= 19
    assert set(CONSTANTS) == set(Engine.__annotations__) == {"NAME"}
    # the traced ones, marked @traced, are a part of them, and dynamo's
    assert set(TRACED) < set(OPERATIONS) and {"flatten", "unflatten"} <= set(TRACED)
    assert "first_reaching" not in TRACED and "packed_sample" not in TRACED
    from pytree_kit import _dynamo

    assert _dynamo._NAMES == TRACED
    assert all(inspect.isfunction(getattr(_pure, n)) for n in TRACED)


def stub_problems(text: str) -> list[str]:
    """What the C engine's stub (its text) lacks of ``Engine``, or declares
    otherwise: its public functions are the operations, each taking the
    positional arguments declared, and it has the constants."""
    members: dict[str, ast.AST] = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            members[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members[node.target.id] = node
    found = [f"{n}: missing" for n in CONSTANTS if n not in members]
    functions = {n: v for n, v in members.items() if isinstance(v, ast.FunctionDef) and n[0] != "_"}
    found += [f"{n}: not an operation" for n in sorted(set(functions) - set(OPERATIONS))]
    for name in OPERATIONS:
        fn = functions.get(name)
        if fn is None:
            found.append(f"{name}: missing")
            continue
        params = [*fn.args.posonlyargs, *fn.args.args]
        got = (len(params) - len(fn.args.defaults), float("inf") if fn.args.vararg else len(params))
        want = arity(getattr(Engine, name), method=True)
        if got != want:
            found.append(f"{name}: takes {got}, declared {want} (required, all)")
    return found


def test_the_c_engines_stub_declares_the_interface() -> None:
    assert stub_problems(STUB.read_text(encoding="utf-8")) == []


def test_a_stub_that_drifted_is_found() -> None:
    text = STUB.read_text(encoding="utf-8")
    broken = re.sub(r"def leaf_codes\(.*\n", "", text)
    broken = broken.replace(
        "def keystr(path: Iterable[Any], /)", "def keystr(path: Any, x: Any, /)"
    )
    broken += "def spare_op(x: Any, /) -> Any: ...\n"
    assert stub_problems(broken) == [
        "spare_op: not an operation",
        "keystr: takes (2, 2), declared (1, 1) (required, all)",
        "leaf_codes: missing",
    ]


def test_the_c_engine_has_nothing_public_the_stub_lacks() -> None:
    c = pytest.importorskip("pytree_kit._speedups")
    stub = {
        getattr(node, "name", None) or getattr(getattr(node, "target", None), "id", None)
        for node in ast.parse(STUB.read_text(encoding="utf-8")).body
    }
    public = {n for n in dir(c) if not n.startswith("_")}
    assert public - stub == set()
    # and no public function of its method table that Engine does not declare
    functions = {n for n in public if isinstance(getattr(c, n), types.BuiltinFunctionType)}
    assert functions <= set(OPERATIONS)


@pytest.mark.parametrize("engine", engines())
def test_each_engine_provides_the_interface(engine: Any) -> None:
    assert problems(engine) == []


def test_a_missing_or_misshapen_member_is_found() -> None:
    fake = types.SimpleNamespace(**{n: getattr(_pure, n) for n in (*OPERATIONS, *CONSTANTS)})
    assert problems(fake) == []
    del fake.keystr
    fake.unflatten = lambda spec, leaves, extra: None
    fake.flatten = lambda tree, *rest: None
    assert problems(fake) == [
        "flatten: takes (1, inf), declared (1, 3) (required, all)",
        "keystr: missing",
        "unflatten: takes (3, 3), declared (2, 2) (required, all)",
    ]


def _counts(message: str) -> set[int]:
    words = {"one": 1, "two": 2}
    return {int(n) for n in re.findall(r"\d+", message)} | {
        v for k, v in words.items() if re.search(rf"\b{k}\b", message)
    }


def test_the_c_engine_refuses_the_calls_its_signatures_refuse() -> None:
    c = pytest.importorskip("pytree_kit._speedups")
    for name in OPERATIONS:
        if inspect.isfunction(getattr(c, name)):
            # the specification's own def, which the C engine serves as it is
            # (tree_get): Python checks its arguments
            assert getattr(c, name) is getattr(_pure, name)
            continue
        required, total = arity(getattr(c, name))
        for count, said in ((int(total) + 1, total), (required - 1, required)):
            if count < 0:
                continue
            with pytest.raises(TypeError) as info:
                getattr(c, name)(*[None] * count)
            assert said in _counts(str(info.value)), (name, count, str(info.value))


def test_the_interface_module_imports_nothing_of_pytree_kit() -> None:
    source = inspect.getsource(_interface)
    imports = re.findall(r"^\s*(?:from|import)\s+(\S+)", source, re.M)
    assert [m for m in imports if m.startswith(".") or m.startswith("pytree_kit")] == []


#: ``get_attr(pure, "classify")`` and the like in the C engine's init: the
#: module variable it reads from, and the name
C_READ = re.compile(r'get_attr\((pure|messages), "(\w+)"\)')
C_MODULES = {"pure": "_pure", "messages": "_messages"}


def c_bindings(text: str) -> dict[str, tuple[str, ...]]:
    """What ``_speedups.c`` reads of pytree_kit's Python modules, by module."""
    found: dict[str, tuple[str, ...]] = {}
    for var, name in C_READ.findall(text):
        found[C_MODULES[var]] = (*found.get(C_MODULES[var], ()), name)
    return found


def test_the_c_engines_bindings_are_the_ones_listed() -> None:
    """``_interface.C_BINDINGS`` is the one list of the Python functions the
    C engine calls: the names ``_speedups.c`` reads, each one there."""
    import importlib

    text = STUB.with_name("_speedups.c").read_text(encoding="utf-8")
    found = c_bindings(text)
    assert {m: sorted(v) for m, v in found.items()} == {
        m: sorted(v) for m, v in _interface.C_BINDINGS.items()
    }
    for module, names in _interface.C_BINDINGS.items():
        mod = importlib.import_module(f"pytree_kit.{module}")
        assert [n for n in names if not callable(getattr(mod, n, None))] == [], module


def test_a_binding_left_off_the_list_is_found() -> None:
    text = STUB.with_name("_speedups.c").read_text(encoding="utf-8")
    drifted = text.replace('get_attr(messages, "cycle_error")', 'get_attr(pure, "_cycle_error")')
    assert c_bindings(drifted) != c_bindings(text)
    assert "_cycle_error" in c_bindings(drifted)["_pure"]
