"""The public functions' fast calls (pytree_kit/_fastcall.c).

With the C engine, the pytree_kit.api functions marked ``@c_fast_call`` are
``_speedups.FastCall`` objects: the common calls are made in C, every other
call goes to the def they wrap, whose body is their specification. These
tests hold a FastCall to its def: the same outcome for every shape of call,
on the differential corpus (``scripts/corpus/trees.py``), against the def's body run
on the same engine and on the pure one; the def's name, docstring and
signature; and the behaviour of a function (binding, pickling, weak
references, garbage collection). Under the pure engine (PYTREE_KIT_PURE=1)
the public functions are the defs themselves, and the FastCalls made here
from the defs compare the C engine's fast calls against the pure engine's
defs. Which calls a FastCall takes
comes from its def's signature (``_engine.call_shape``): a changed def
changes them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import inspect
import pickle
import sys
import typing
import weakref
from typing import Any, Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from pytree_kit import _engine, _interface, _pure, api
from pytree_kit._spec import TreeSpec
from scripts.corpus.trees import RULES, assert_same_tree, trees

try:
    from pytree_kit import _speedups
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _speedups = None

pytestmark = pytest.mark.skipif(_speedups is None, reason="the C engine is not built")

#: the name FastCall knows each def by, and the def
DEFS: dict[str, Callable[..., Any]] = {
    name: inspect.unwrap(getattr(api, name))
    for name in (
        "flatten",
        "leaves",
        "flatten_with_path",
        "structure",
        "unflatten",
        "tree_map",
        "tree_flatten",
        "tree_leaves",
        "tree_structure",
        "tree_unflatten",
    )
}

#: the operation each def makes (what api.py gives ``c_fast_call``)
OPS = {
    **{name: name for name in DEFS},
    "tree_flatten": "flatten",
    "tree_leaves": "leaves",
    "tree_structure": "structure",
    "tree_unflatten": "unflatten",
}


def make(func: Callable[..., Any], op: str) -> Any:
    """A FastCall of ``func`` making ``op``, as ``_engine.c_fast_call`` makes one."""
    assert _speedups is not None
    return _speedups.FastCall(func, op, TreeSpec, **_engine.call_shape(func))


def fast(name: str) -> Any:
    """A FastCall of the def ``name`` (made here, so under either engine)."""
    return make(DEFS[name], OPS[name])


def public(name: str) -> Any:
    return getattr(api, name)


@contextlib.contextmanager
def on_engine(engine: Any) -> Iterator[None]:
    """Every module calls ``engine`` (read at call time from ``_interface``)."""
    before = _interface.engine
    _interface.use(engine)
    try:
        yield
    finally:
        _interface.use(before)


def test_public_functions_are_fast_calls_with_the_c_engine() -> None:
    # every def marked @c_fast_call is here, with the op it is marked with
    assert _engine.FAST_CALLS == {f"pytree_kit.api.{name}": OPS[name] for name in DEFS}
    for name, fn in DEFS.items():
        got = public(name)
        if pk.ENGINE == "c":
            assert type(got) is _speedups.FastCall, name
            assert got.__wrapped__ is fn
        else:
            assert got is fn, name
        assert inspect.isfunction(fn)
    # TreeSpec's methods are the defs of its class body, on either engine
    for method in ("unflatten", "flatten_up_to"):
        assert inspect.isfunction(TreeSpec.__dict__[method])


@pytest.mark.parametrize("name", sorted(DEFS))
def test_a_fast_call_has_its_defs_name_docstring_and_signature(name: str) -> None:
    fn, fc = DEFS[name], fast(name)
    functools.update_wrapper(fc, fn)
    for attr in ("__name__", "__qualname__", "__module__", "__doc__", "__annotations__"):
        assert getattr(fc, attr) == getattr(fn, attr), attr
    assert ">>>" in fc.__doc__
    assert inspect.signature(fc) == inspect.signature(fn)
    assert typing.get_type_hints(fc) == typing.get_type_hints(fn)
    assert inspect.isroutine(fc)
    assert repr(fn) in repr(fc)
    # the public one too (a FastCall with the C engine)
    pub = public(name)
    assert pub.__doc__ == fn.__doc__ and inspect.signature(pub) == inspect.signature(fn)


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as e:
        return ("raise", type(e), str(e))


def same(name: str, a: Any, b: Any) -> None:
    """The same result of ``name``: leaves by identity, equal specs, alike trees."""
    name = name.replace("tree_", "")
    if name in ("flatten", "flatten_with_path"):
        assert type(a) is type(b) is tuple and len(a) == len(b) == 2
        same("structure", a[1], b[1])
        same("pairs" if name == "flatten_with_path" else "leaves", a[0], b[0])
    elif name == "structure":
        assert type(a) is type(b) is TreeSpec and a == b and hash(a) == hash(b)
    elif name == "pairs":
        assert [p for p, _ in a] == [p for p, _ in b]
        assert [id(x) for _, x in a] == [id(x) for _, x in b]
    elif name in ("leaves", "flatten_up_to"):
        assert type(a) is type(b) is list
        assert [id(x) for x in a] == [id(x) for x in b]
    else:
        assert name in ("unflatten", "map"), name
        assert_same_tree(a, b)


def is_list(x: Any) -> bool:
    return isinstance(x, list)


def identity(x: Any) -> Any:
    return x


def add(x: Any, y: Any) -> Any:
    return (x, y)


def calls(tree: Any) -> list[tuple[str, tuple, dict]]:
    """Calls of every shape, each as (name, args, kwargs): the shapes a FastCall
    makes itself and the ones it hands to the def, right and wrong."""
    spec = pk.structure(tree)
    leaves = pk.leaves(tree)
    out: list[tuple[str, tuple, dict]] = []
    for name in ("flatten", "leaves", "flatten_with_path", "structure"):
        out += [
            (name, (tree,), {}),
            (name, (tree,), {"is_leaf": is_list}),
            (name, (tree,), {"is_leaf": None}),
            (name, (tree,), {"rules": None}),
            (name, (tree,), {"rules": None, "is_leaf": is_list}),
            (name, (tree,), {"rules": {}}),
            (name, (tree,), {"rules": RULES}),
            (name, (tree,), {"rules": [1]}),
            (name, (tree, is_list), {}),
            (name, (), {}),
            (name, (), {"tree": tree}),
            (name, (tree,), {"bogus": 1}),
        ]
    for name in ("tree_flatten", "tree_leaves", "tree_structure"):
        out += [
            (name, (tree,), {}),
            (name, (tree, is_list), {}),
            (name, (tree, None), {}),
            (name, (tree,), {"is_leaf": is_list}),
            (name, (tree, is_list), {"is_leaf": is_list}),
            (name, (tree,), {"rules": None}),
            (name, (tree, None, None), {}),
            (name, (), {"tree": tree}),
        ]
    for name in ("unflatten", "tree_unflatten"):
        out += [
            (name, (spec, leaves), {}),
            (name, (spec, iter(leaves)), {}),
            (name, (spec, leaves[:-1]), {}),
            (name, (spec, [*leaves, 0]), {}),
            (name, ("spec", leaves), {}),
            (name, (spec,), {}),
            (name, (spec, leaves), {"is_leaf": None}),
            (name, (spec,), {"leaves": leaves}),
        ]
    out += [
        ("tree_map", (identity, tree), {}),
        ("tree_map", (identity, tree), {"is_leaf": is_list}),
        ("tree_map", (identity, tree), {"rules": None}),
        ("tree_map", (identity, tree), {"rules": RULES}),
        ("tree_map", (add, tree, tree), {}),
        ("tree_map", (add, tree, [tree]), {}),
        ("tree_map", (identity,), {}),
        ("tree_map", (identity, tree), {"bogus": None}),
    ]
    return out


def fresh(args: tuple) -> list:
    """``args``, with a copy of each iterator (a call reads it)."""
    return [copy.copy(a) if hasattr(a, "__next__") else a for a in args]


@settings(max_examples=40, deadline=None)
@given(trees())
def test_a_fast_call_does_what_its_def_does(tree: Any) -> None:
    """The C path and the def's body, on this engine and on the pure one
    (the specification): the same results, and the same errors."""
    for name, args, kwargs in calls(tree):
        got = outcome(fast(name), *fresh(args), **kwargs)
        want = outcome(DEFS[name], *fresh(args), **kwargs)
        with on_engine(_pure):
            spec = outcome(DEFS[name], *fresh(args), **kwargs)
        for other in (want, spec):
            assert got[0] == other[0], (name, args, kwargs, got, other)
            if got[0] == "raise":
                assert got[1:] == other[1:], (name, kwargs)
            else:
                same(name, other[1], got[1])


def test_the_public_functions_do_what_their_defs_do() -> None:
    tree = {"targets": [{"boxes": 1, "labels": [2, 3]}], "meta": (None, 4.0)}
    for name, args, kwargs in calls(tree):
        copies = [copy.copy(a) if hasattr(a, "__next__") else a for a in args]
        got = outcome(public(name), *args, **kwargs)
        want = outcome(DEFS[name], *copies, **kwargs)
        assert got[0] == want[0], (name, kwargs)
        if got[0] == "raise":
            assert got[1:] == want[1:]
        else:
            same(name, want[1], got[1])


def test_tree_map_calls_fn_in_leaf_order_and_stops_at_its_error() -> None:
    class Boom(Exception):
        pass

    a, b, c = object(), object(), object()
    tree = {"z": [a, b], "a": c}
    seen: list[Any] = []

    def fn(x: Any) -> Any:
        seen.append(x)
        if x is b:
            raise Boom("at b")
        return x

    before = [sys.getrefcount(x) for x in (a, b, c)]
    for _ in range(50):
        with pytest.raises(Boom, match="at b"):
            fast("tree_map")(fn, tree)
    assert seen == [c, a, b] * 50
    seen.clear()
    assert [sys.getrefcount(x) for x in (a, b, c)] == before
    assert fast("tree_map")(lambda x: [x], tree) == {"z": [[a], [b]], "a": [c]}


def test_tree_maps_result_list_is_never_seen_half_filled() -> None:
    """fn runs while the mapped list is being filled; the GC must not hand it out."""
    tree = [1, (2, 3), {"k": 4}]

    def fn(x: Any) -> Any:
        for o in gc.get_objects():
            if type(o) is list and len(o) == 4:
                list(o)  # reads every slot
        return x * 10

    assert fast("tree_map")(fn, tree) == [10, (20, 30), {"k": 40}]


def test_a_fast_call_binds_like_a_function() -> None:
    spec = pk.structure({"a": 0, "b": [0]})
    fc = make(TreeSpec.unflatten, "unflatten")
    assert fc.__get__(None, TreeSpec) is fc
    bound = fc.__get__(spec, TreeSpec)
    assert bound.__self__ is spec and bound.__func__ is fc
    assert fc.__get__(spec)([1, 2]) == {"a": 1, "b": [2]}
    assert spec.unflatten([7, 8]) == {"a": 7, "b": [8]}
    assert spec.flatten_up_to({"b": [5], "a": 4}) == [4, 5]

    class Holder:
        leaves = fast("leaves")

    h = Holder()
    assert Holder.leaves is Holder.__dict__["leaves"]
    # bound, the instance is the tree (as it would be for the def)
    with pytest.raises(TypeError):
        h.leaves(1)
    assert h.leaves() == [h]
    bound = h.leaves
    assert bound.__self__ is h and bound.__func__ is Holder.leaves


def test_a_fast_call_pickles_copies_and_is_weakly_referenced() -> None:
    for name in DEFS:
        fn = public(name)
        assert pickle.loads(pickle.dumps(fn)) is fn
        assert copy.copy(fn) is fn and copy.deepcopy(fn) is fn
        r = weakref.ref(fn)
        assert r() is fn


def test_a_fast_call_in_a_cycle_is_collected() -> None:
    fc = fast("leaves")
    fc.me = fc  # a cycle through its __dict__
    fc.__wrapped__ = fc
    r = weakref.ref(fc)
    del fc
    gc.collect()
    assert r() is None


def test_fast_call_arguments_are_checked() -> None:
    assert _speedups is not None
    shape = _engine.call_shape(DEFS["leaves"])
    with pytest.raises(TypeError, match="callable"):
        _speedups.FastCall(1, "leaves", TreeSpec, **shape)
    with pytest.raises(ValueError, match="no fast call for nope"):
        _speedups.FastCall(print, "nope", TreeSpec, **shape)
    with pytest.raises(TypeError):
        _speedups.FastCall(print, "leaves", "TreeSpec", **shape)
    with pytest.raises(TypeError):  # the shape is required
        _speedups.FastCall(print, "leaves", TreeSpec)
    with pytest.raises(ValueError, match="is_leaf_at"):
        _speedups.FastCall(print, "leaves", TreeSpec, **{**shape, "is_leaf_at": -2})
    with pytest.raises(ValueError, match="requires 2 positional arguments, but leaves takes 1"):
        _speedups.FastCall(print, "leaves", TreeSpec, **{**shape, "npos": 2})


def test_the_defs_give_the_shapes_of_call() -> None:
    """What each public def's signature lets a FastCall take (the table
    _fastcall.c held before the defs became the one place)."""
    want = {
        "flatten": (1, True, -1, True),
        "leaves": (1, True, -1, True),
        "flatten_with_path": (1, True, -1, True),
        "structure": (1, True, -1, True),
        "unflatten": (2, False, -1, False),
        "tree_map": (2, True, -1, True),
        "tree_flatten": (1, True, 1, False),
        "tree_leaves": (1, True, 1, False),
        "tree_structure": (1, True, 1, False),
        "tree_unflatten": (2, False, -1, False),
    }
    got = {name: tuple(_engine.call_shape(fn).values()) for name, fn in DEFS.items()}
    assert got == want


class Recorded:
    """Stands for a def (its signature, its calls), counting the calls it gets."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.__signature__ = inspect.signature(func)
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.func(*args, **kwargs)


def test_a_changed_signature_changes_the_calls_a_fast_call_takes() -> None:
    """Each def below is a public def with its signature changed; its FastCall
    takes the calls that fit the new signature and sends the others to the
    def, with the def's outcome either way."""
    tree = {"b": [1, 2], "a": (3,)}

    def leaves_no_is_leaf(tree: Any, *, rules: Any = None) -> Any:
        return DEFS["leaves"](tree, rules=rules)

    def leaves_jax(tree: Any, is_leaf: Any = None) -> Any:
        return DEFS["leaves"](tree, is_leaf=is_leaf)

    def leaves_keyword_only_is_leaf(tree: Any, *, is_leaf: Any = None) -> Any:
        return DEFS["leaves"](tree, is_leaf=is_leaf)

    def tree_map_one_tree(fn: Any, tree: Any, *, is_leaf: Any = None) -> Any:
        return DEFS["tree_map"](fn, tree, is_leaf=is_leaf)

    cases: list[tuple[Callable[..., Any], str, tuple, dict, bool]] = [
        # (def, op, args, kwargs, taken in C)
        (leaves_no_is_leaf, "leaves", (tree,), {}, True),
        (leaves_no_is_leaf, "leaves", (tree,), {"rules": None}, True),
        (leaves_no_is_leaf, "leaves", (tree,), {"is_leaf": is_list}, False),
        (leaves_no_is_leaf, "leaves", (tree, is_list), {}, False),
        (leaves_jax, "leaves", (tree, is_list), {}, True),
        (leaves_jax, "leaves", (tree,), {"is_leaf": is_list}, True),
        (leaves_jax, "leaves", (tree,), {"rules": None}, False),
        (leaves_keyword_only_is_leaf, "leaves", (tree, is_list), {}, False),
        (leaves_keyword_only_is_leaf, "leaves", (tree,), {"is_leaf": is_list}, True),
        (leaves_keyword_only_is_leaf, "leaves", (tree,), {"rules": None}, False),
        (tree_map_one_tree, "tree_map", (identity, tree), {}, True),
        (tree_map_one_tree, "tree_map", (add, tree, tree), {}, False),
        (tree_map_one_tree, "tree_map", (identity, tree), {"rules": None}, False),
    ]
    for func, op, args, kwargs, in_c in cases:
        recorded = Recorded(func)
        got = outcome(make(recorded, op), *args, **kwargs)
        assert recorded.calls == (0 if in_c else 1), (func.__name__, args, kwargs)
        assert got == outcome(func, *args, **kwargs), (func.__name__, args, kwargs)
        assert got[0] == "ok" or not in_c


def test_a_def_whose_signature_no_operation_fits_is_refused() -> None:
    """A def with another number of required positional arguments than its
    operation reads is refused when it is wrapped, not called wrongly."""

    def flatten_with_extra(tree: Any, extra: Any, *, is_leaf: Any = None, rules: Any = None) -> Any:
        return DEFS["flatten"](tree, is_leaf=is_leaf, rules=rules)

    def unflatten_one(spec: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(ValueError, match="requires 2 positional arguments, but flatten takes 1"):
        make(flatten_with_extra, "flatten")
    with pytest.raises(ValueError, match="requires 1 positional arguments, but unflatten takes 2"):
        make(unflatten_one, "unflatten")
    if pk.ENGINE == "c":
        with pytest.raises(ValueError, match="requires 2 positional arguments"):
            _engine.c_fast_call("flatten")(flatten_with_extra)


def test_call_shape_refuses_what_a_call_in_c_would_get_wrong() -> None:
    def required_keyword(tree: Any, *, depth: int) -> Any:  # pragma: no cover
        return tree

    def is_leaf_default(tree: Any, *, is_leaf: Any = is_list) -> Any:  # pragma: no cover
        return tree

    def rules_default(tree: Any, *, rules: Any = ()) -> Any:  # pragma: no cover
        return tree

    with pytest.raises(ValueError, match="required keyword-only argument"):
        _engine.call_shape(required_keyword)
    for func in (is_leaf_default, rules_default):
        with pytest.raises(ValueError, match="must default to None"):
            _engine.call_shape(func)
        with pytest.raises(ValueError, match="must default to None"):
            _engine.c_fast_call("leaves")(func)  # on either engine


@given(st.lists(st.integers(), max_size=5))
def test_tree_map_with_is_leaf_by_keyword(xs: list[int]) -> None:
    tree = (xs, {"k": xs})
    got = fast("tree_map")(len, tree, is_leaf=is_list)
    assert got == DEFS["tree_map"](len, tree, is_leaf=is_list) == (len(xs), {"k": len(xs)})
