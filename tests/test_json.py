"""TreeSpec.to_json / TreeSpec.from_json: round trips, allow=, hostile documents, pickle.

Every class used here is defined at module level so that pickle (and ``allow=``)
can name it. The file is self-contained: it does not rely on other test helpers.
"""

from __future__ import annotations

import builtins
import collections
import copy
import dataclasses
import enum
import functools
import importlib
import json
import math
import os
import pickle
import re
import sys
import time
from collections import OrderedDict, defaultdict, deque
from typing import Any, Callable

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from pytree_kit import TreeSpec
from scripts.corpus.json_cases import (
    _A,
    _C,
    _D,
    _MEMBER_NAMES,
    _OK_LIST,
    _P,
    _S,
    _SPECIAL,
    _W,
    ALL_CLASSES,
    CASES,
    HOSTILE_ALLOW,
    OPAQUE_MAP_RULE,
    OPAQUE_RULE,
    RICH_AUX,
    RULES,
    STAT,
    VALID_BASES,
    AttrsFrozen,
    AttrsPoint,
    Color,
    DictOut,
    Empty,
    EntriesBox,
    Frozen,
    InitFalse,
    MapBox,
    Opaque,
    OpaqueEntries,
    OpaqueMap,
    Outer,
    Pair,
    Perm,
    Plain,
    Point,
    Recorder,
    SeqBox,
    StrSub,
    WithStatic,
    _dict_keys,
    _doc,
    _head,
    _opaque_flatten,
    _opaque_unflatten,
    _positions,
    _Unwritable,
    make_zero,
    ref,
)

# --------------------------------------------------------------------------
# exact comparison of trees (types, dict insertion order, factories, maxlen, ...)


def _is_structseq(x: Any) -> bool:
    t = type(x)
    return isinstance(x, tuple) and hasattr(t, "n_sequence_fields") and hasattr(t, "n_fields")


def assert_same_tree(got: Any, want: Any) -> None:
    stack = [(got, want, "tree")]
    while stack:
        x, y, path = stack.pop()
        assert type(x) is type(y), f"{path}: {type(x).__name__} != {type(y).__name__}"
        t = type(x)
        if isinstance(x, dict) and not dataclasses.is_dataclass(x):
            kx, ky = list(x), list(y)
            assert [type(k) for k in kx] == [type(k) for k in ky], f"{path}: key types"
            assert kx == ky, f"{path}: keys (insertion order) {kx!r} != {ky!r}"
            if t is defaultdict:
                assert x.default_factory == y.default_factory, f"{path}: default_factory"
            stack.extend((x[a], y[b], f"{path}[{a!r}]") for a, b in zip(kx, ky))
        elif t is deque:
            assert x.maxlen == y.maxlen, f"{path}: maxlen"
            assert len(x) == len(y), f"{path}: len"
            stack.extend((a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(x, y)))
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), f"{path}: len"
            if _is_structseq(x):
                # rebuilt from its sequence fields alone: the fields outside
                # the sequence are what the class makes of those (None)
                alone = t(tuple(y)).__reduce__()[1][1]
                assert x.__reduce__()[1][1] == alone, f"{path}: hidden fields"
            stack.extend((a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(x, y)))
        elif dataclasses.is_dataclass(x) or attrs.has(t):
            names = (
                [f.name for f in dataclasses.fields(x)]
                if dataclasses.is_dataclass(x)
                else [a.name for a in attrs.fields(t)]
            )
            for name in names:
                hx, hy = hasattr(x, name), hasattr(y, name)
                assert hx == hy, f"{path}.{name}: set on one side only"
                if hx:
                    stack.append((getattr(x, name), getattr(y, name), f"{path}.{name}"))
            if isinstance(x, dict):
                assert list(dict.items(x)) == list(dict.items(y)), f"{path}: dict view"
        elif t in (SeqBox, MapBox, EntriesBox, Opaque, OpaqueMap, OpaqueEntries, Recorder):
            vx, vy = vars(x), vars(y)
            assert list(vx) == list(vy), f"{path}: attributes"
            stack.extend((vx[k], vy[k], f"{path}.{k}") for k in vx)
        else:
            assert x == y, f"{path}: {x!r} != {y!r}"


def check_round_trip(tree: Any, allow: Any = (), rules: Any = None) -> tuple[TreeSpec, str]:
    """The full round-trip contract for one tree; returns (decoded spec, text)."""
    leaves, spec = pk.flatten(tree, rules=rules)
    text = spec.to_json()
    assert type(text) is str
    assert spec.to_json() == text  # deterministic
    doc = json.loads(text)
    assert doc["format"] == "pytree_kit.TreeSpec"
    assert doc["version"] == 1
    assert doc["num_leaves"] == len(leaves) == spec.num_leaves
    assert len(doc["nodes"]) == spec.num_nodes

    back = TreeSpec.from_json(text, allow=allow, rules=rules)
    assert type(back) is TreeSpec
    assert back == spec
    assert not (back != spec)
    assert hash(back) == hash(spec)
    assert back.num_leaves == spec.num_leaves
    assert back.num_nodes == spec.num_nodes
    repr(back)
    assert back.to_json() == text  # stable: the same text again
    assert TreeSpec.from_json(text.encode("utf-8"), allow=allow, rules=rules) == spec
    assert TreeSpec.from_json(bytearray(text, "utf-8"), allow=allow, rules=rules) == spec

    rebuilt = back.unflatten(leaves)
    assert_same_tree(rebuilt, tree)
    assert back.flatten_up_to(tree) == leaves
    return back, text


def _spec_text(tree: Any, rules: Any = None) -> str:
    return pk.structure(tree, rules=rules).to_json()


# --------------------------------------------------------------------------
# 1. round trips, every node kind

CASE_PARAMS = [pytest.param(make, allow, rules, id=name) for name, make, allow, rules in CASES]


@pytest.mark.parametrize(("make", "allow", "rules"), CASE_PARAMS)
def test_round_trip(make: Callable[[], Any], allow: Any, rules: Any) -> None:
    check_round_trip(make(), allow=allow, rules=rules)


@pytest.mark.parametrize(("make", "allow", "rules"), CASE_PARAMS)
def test_round_trip_with_everything_allowed(
    make: Callable[[], Any], allow: Any, rules: Any
) -> None:
    # Extra allowed classes that the document does not mention change nothing.
    check_round_trip(make(), allow=ALL_CLASSES, rules=RULES)


def test_exact_document_text() -> None:
    spec = pk.structure({"b": [1, (2, None)], "a": 0})
    assert spec.to_json() == (
        '{"format": "pytree_kit.TreeSpec", "version": 1, "num_leaves": 3, "nodes": [\n'
        '{"kind": "dict", "keys": ["a", "b"], "order": ["b", "a"]},\n'
        '"*",\n'
        '{"kind": "list", "arity": 2},\n'
        '"*",\n'
        '{"kind": "tuple", "arity": 2},\n'
        '"*",\n'
        "null\n"
        "]}\n"
    )


def test_document_references_classes_by_module_and_qualname() -> None:
    tree = [Point(1, 2), Plain(1), AttrsPoint(1, 2), SeqBox([]), STAT, Opaque(1, 2)]
    tree.append(defaultdict(make_zero))
    doc = json.loads(_spec_text(tree, rules=RULES))
    classes = [n["class"] for n in doc["nodes"] if isinstance(n, dict) and "class" in n]
    assert classes == [
        ref(Point),
        ref(Plain),
        ref(AttrsPoint),
        ref(SeqBox),
        "os:stat_result",
        ref(Opaque),
    ]
    factories = [
        n["default_factory"] for n in doc["nodes"] if isinstance(n, dict) and "default_factory" in n
    ]
    assert factories == [{"ref": ref(make_zero)}]
    # A nested class keeps its dotted qualname.
    nested = json.loads(_spec_text(Outer.Inner(1)))["nodes"][0]["class"]
    assert nested == f"{Outer.__module__}:Outer.Inner"


def test_dict_insertion_order_is_restored() -> None:
    tree = {"c": 1, "a": {"y": 2, "x": 3}, "b": defaultdict(list, {"q": 4, "p": 5})}
    back, text = check_round_trip(tree)
    rebuilt = back.unflatten([10, 20, 30, 40, 50])
    assert list(rebuilt) == ["c", "a", "b"]
    assert list(rebuilt["a"]) == ["y", "x"]
    assert list(rebuilt["b"]) == ["q", "p"]
    # Leaves are in sorted-key order, the rebuilt dict in insertion order.
    assert rebuilt == {"a": {"x": 10, "y": 20}, "b": {"p": 30, "q": 40}, "c": 50}
    assert '"order": ["c", "a", "b"]' in text


def test_sorted_dict_writes_no_order() -> None:
    text = _spec_text({"a": 1, "b": 2})
    assert "order" not in text


def test_mixed_key_dict_keeps_insertion_order_without_order_field() -> None:
    tree = {"a": 1, 1: 2, None: 3}
    back, text = check_round_trip(tree)
    assert json.loads(text)["nodes"][0] == {"kind": "dict", "keys": ["a", 1, None]}
    assert list(back.unflatten(["x", "y", "z"])) == ["a", 1, None]


def test_key_encodings_are_distinct() -> None:
    # Values that are equal across types must keep their type through JSON.
    tree = {True: 1, "1": 2, 1.5: 3, (1,): 4, b"1": 5}
    back, _ = check_round_trip(tree)
    rebuilt = back.unflatten(range(5))
    assert [type(k) for k in rebuilt] == [type(k) for k in tree]


def test_equal_specs_from_different_trees_have_equal_text() -> None:
    # The document depends on the structure only, not on the leaves.
    a = pk.structure({"x": [1, 2], "y": Plain(3)})
    b = pk.structure({"y": Plain("q"), "x": ["r", "s"]})
    assert a == b
    text_a, text_b = a.to_json(), b.to_json()
    # Only the insertion order (not part of equality) may differ.
    da, db = json.loads(text_a), json.loads(text_b)
    for node in da["nodes"] + db["nodes"]:
        if isinstance(node, dict):
            node.pop("order", None)
    assert da == db


def test_deep_spec_round_trip() -> None:
    # from_json, to_json and unflatten are not limited by the recursion limit.
    depth = 5000
    tree: Any = 0
    for _ in range(depth):
        tree = [tree]
    spec = pk.structure(tree)
    text = spec.to_json()
    back = TreeSpec.from_json(text)
    assert back == spec
    assert hash(back) == hash(spec)
    assert back.to_json() == text
    rebuilt = back.unflatten(["leaf"])
    for _ in range(depth):
        assert type(rebuilt) is list and len(rebuilt) == 1
        rebuilt = rebuilt[0]
    assert rebuilt == "leaf"


def test_wide_spec_round_trip() -> None:
    tree = {f"k{i:05d}": [i, (i,)] for i in range(3000)}
    back, _ = check_round_trip(tree)
    assert back.num_leaves == 6000


def test_nan_key_text_is_stable_and_rebuilds_a_nan_key() -> None:
    spec = pk.structure({math.nan: 1, "a": 2})
    text = spec.to_json()
    assert '{"float": "nan"}' in text
    back = TreeSpec.from_json(text)
    assert back.to_json() == text
    rebuilt = back.unflatten([1, 2])
    keys = list(rebuilt)
    assert len(keys) == 2 and isinstance(keys[0], float) and math.isnan(keys[0])
    assert keys[1] == "a"


# A NaN key is kept as is, and NaN equals only itself: a spec with the caller's NaN
# key is not equal to its JSON round trip, whose NaN is another object. Decoding is
# deterministic (one shared NaN object), which the next test checks.


def test_same_nan_document_decodes_to_equal_specs() -> None:
    text = pk.structure({math.nan: 1}).to_json()
    assert TreeSpec.from_json(text) == TreeSpec.from_json(text)


def test_defaultdict_function_factory_round_trip() -> None:
    check_round_trip(defaultdict(make_zero, {"b": 1, "a": 2}), allow=[make_zero])


@pytest.mark.parametrize("key", [Perm.R | Perm.W, Perm(0)], ids=["composite", "zero"])
def test_flag_pseudo_member_key_round_trip(key: Perm) -> None:
    check_round_trip({key: 1}, allow=[Perm])


def test_rule_spec_needs_the_rule_and_uses_it() -> None:
    tree = [Opaque(1, 2)]
    text = _spec_text(tree, rules=RULES)
    back = TreeSpec.from_json(text, rules={Opaque: OPAQUE_RULE})
    assert back == pk.structure(tree, rules=RULES)
    rebuilt = back.unflatten(["p", "q"])
    assert type(rebuilt[0]) is Opaque and (rebuilt[0].a, rebuilt[0].b) == ("p", "q")


def test_protocol_class_is_not_called_by_from_json() -> None:
    text = _spec_text([Recorder([1, 2])])
    Recorder.calls.clear()
    back = TreeSpec.from_json(text, allow=[Recorder])
    assert Recorder.calls == []
    rebuilt = back.unflatten([3, 4])
    assert Recorder.calls == ["__tree_unflatten__", "__init__"]
    assert rebuilt[0].items == [3, 4]


# -- hypothesis: generated nested trees --------------------------------------

_keys = st.one_of(
    st.integers(-3, 3),
    st.text(max_size=3),
    st.floats(allow_nan=False),
    st.none(),
    st.booleans(),
    st.binary(max_size=2),
    st.tuples(st.integers(0, 2), st.text(max_size=1)),
    st.frozensets(st.integers(0, 3), max_size=2),
    st.sampled_from(list(Color)),
    st.complex_numbers(allow_nan=False, max_magnitude=1e6),
)
_FACTORIES = [None, list, int, dict, OrderedDict]


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    small = st.lists(children, max_size=4)
    mapping = st.dictionaries(_keys, children, max_size=4)
    return st.one_of(
        small,
        small.map(tuple),
        mapping,
        # some dicts with one key type only, so that their keys sort
        st.dictionaries(st.text(max_size=2), children, max_size=4),
        mapping.map(OrderedDict),
        st.builds(defaultdict, st.sampled_from(_FACTORIES), mapping),
        st.builds(
            lambda items, extra: deque(items, None if extra is None else len(items) + extra),
            small,
            st.none() | st.integers(0, 3),
        ),
        st.builds(Point, children, children),
        st.builds(Pair, children, children),
    )


trees = st.recursive(st.none() | st.integers(), _extend, max_leaves=25)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_round_trip_generated_trees(tree: Any) -> None:
    back, text = check_round_trip(tree, allow=[Point, Pair, Color])
    # pickling the decoded spec keeps it too
    again = pickle.loads(pickle.dumps(back))
    assert again == back and hash(again) == hash(back)
    assert again.to_json() == text


def _unmemoized(spec: TreeSpec) -> str:
    """The document written node by node, as nodes_to_json did before it kept
    the lines of equal nodes."""
    from pytree_kit import _json

    by_index = dict(spec._orders)
    lines = [
        json.dumps(_json._node_json(node, by_index.get(i))) for i, node in enumerate(spec._nodes)
    ]
    head = json.dumps(
        {"format": _json.FORMAT, "version": _json.VERSION, "num_leaves": spec.num_leaves}
    )
    return head[:-1] + ', "nodes": [\n' + ",\n".join(lines) + "\n]}\n"


# keys that are equal (and hash alike) but write differently
_ALIKE = st.sampled_from([1, 1.0, True, (1,), (1.0,), (True,), "1", 0, 0.0, -0.0, False])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(trees, st.lists(st.dictionaries(_ALIKE, st.integers(), max_size=3), max_size=6)))
def test_equal_nodes_share_a_line_only_where_they_write_alike(tree: Any) -> None:
    spec = pk.structure(tree)
    assert spec.to_json() == _unmemoized(spec)


# --------------------------------------------------------------------------
# 2. allow= semantics

NEEDS_ALLOW = [
    ("namedtuple", lambda: [Point(1, 2)], Point),
    ("typing-namedtuple", lambda: Pair(1, 2), Pair),
    ("structseq-stat", lambda: STAT, os.stat_result),
    ("structseq-struct_time", lambda: time.gmtime(0), time.struct_time),
    ("dataclass", lambda: {"d": Plain(1)}, Plain),
    ("dataclass-dict", lambda: DictOut(loss=1), DictOut),
    ("attrs", lambda: AttrsPoint(1, 2), AttrsPoint),
    ("protocol-seq", lambda: SeqBox([1]), SeqBox),
    ("protocol-dict", lambda: MapBox({"a": 1}), MapBox),
    ("defaultdict-factory-function", lambda: defaultdict(make_zero, {"a": 1}), make_zero),
    ("enum-key", lambda: {Color.RED: 1}, Color),
    ("enum-static-field", lambda: WithStatic(1), Color, WithStatic),
    ("enum-in-protocol-aux", lambda: SeqBox([1], (Color.GREEN,)), Color, SeqBox),
    ("class-key", lambda: {Plain: 1}, Plain),
    ("class-in-aux", lambda: SeqBox([1], Point), Point, SeqBox),
]


@pytest.mark.parametrize(
    ("make", "cls", "also"),
    [pytest.param(m, c, rest, id=name) for name, m, c, *rest in NEEDS_ALLOW],
)
def test_class_missing_from_allow_is_refused(make: Callable[[], Any], cls: Any, also: list) -> None:
    # ``also``: the other classes the document needs (so that ``cls`` is what is missing)
    text = _spec_text(make())
    everything_else = [c for c in ALL_CLASSES if c is not cls]
    for allow in (also, [*also, Empty], everything_else):
        with pytest.raises(ValueError, match=re.escape(ref(cls))):
            TreeSpec.from_json(text, allow=allow)
    if cls is not make_zero:  # a function factory is refused even when allowed (bug, above)
        assert TreeSpec.from_json(text, allow=[*everything_else, cls]) == pk.structure(make())


def test_allow_accepts_any_iterable() -> None:
    text = _spec_text([Point(1, 2), Plain(3)])
    want = pk.structure([Point(0, 0), Plain(0)])
    assert TreeSpec.from_json(text, allow=(Point, Plain)) == want
    assert TreeSpec.from_json(text, allow={Point, Plain}) == want
    assert TreeSpec.from_json(text, allow=iter([Point, Plain])) == want
    assert TreeSpec.from_json(text, allow={Point: 1, Plain: 2}) == want


def test_rule_class_needs_its_rule() -> None:
    text = _spec_text({"o": Opaque(1, 2)}, rules=RULES)
    for kwargs in ({}, {"allow": [Opaque]}, {"rules": {OpaqueMap: OPAQUE_MAP_RULE}}):
        with pytest.raises(ValueError, match=re.escape(ref(Opaque))) as info:
            TreeSpec.from_json(text, **kwargs)
        if kwargs.get("allow"):
            assert "rules=" in str(info.value)
    assert TreeSpec.from_json(text, rules={Opaque: OPAQUE_RULE}) == pk.structure(
        {"o": Opaque(0, 0)}, rules=RULES
    )


def test_rule_value_must_be_a_rule() -> None:
    text = _spec_text([Opaque(1, 2)], rules=RULES)
    with pytest.raises(ValueError, match=re.escape(ref(Opaque))):
        TreeSpec.from_json(text, rules={Opaque: _opaque_flatten})


def test_builtin_and_collections_types_resolve_without_allow() -> None:
    tree = {
        "f": defaultdict(collections.Counter, {"x": 1}),
        "g": defaultdict(set),
        "k": {int: 1, bytes: 2, collections.deque: 3, collections.OrderedDict: 4},
    }
    check_round_trip(tree)
    text = _spec_text(SeqBox([], (int, collections.ChainMap, collections.defaultdict)))
    back = TreeSpec.from_json(text, allow=[SeqBox])
    assert back.unflatten([]).aux == (int, collections.ChainMap, collections.defaultdict)


def _ref_docs(name: str) -> list:
    """Documents that make from_json resolve ``name`` in every place a reference can be."""
    return [
        _doc([{"kind": "defaultdict", "default_factory": {"ref": name}, "keys": []}]),
        _doc([{"kind": "namedtuple", "class": name, "fields": []}]),
        _doc([{"kind": "structseq", "class": name, "arity": 0}]),
        _doc([{"kind": "dataclass", "class": name, "fields": []}]),
        _doc([{"kind": "attrs", "class": name, "fields": []}]),
        _doc([{"kind": "custom", "class": name, "arity": 0, "aux": None}]),
        _doc([{"kind": "rule", "class": name, "arity": 0, "aux": None}]),
        _doc([{"kind": "custom", "class": ref(SeqBox), "arity": 0, "aux": {"ref": name}}]),
        _doc([{"kind": "dict", "keys": [{"ref": name}]}, "*"]),
        _doc([{"kind": "dict", "keys": [{"enum": name, "name": "RED"}]}, "*"]),
        _doc(
            [
                {
                    "kind": "dataclass",
                    "class": ref(WithStatic),
                    "fields": ["w"],
                    "static": [["name", {"ref": name}]],
                    "unset": ["dims", "act"],
                },
                "*",
            ]
        ),
    ]


FORBIDDEN_REFS = [
    "some_module_that_does_not_exist:Thing",
    "some_module_that_does_not_exist.sub:Thing",
    "os.path:join",
    "os:system",
    "subprocess:Popen",
    "importlib:import_module",
    "pickle:loads",
    "builtins:eval",
    "builtins:exec",
    "builtins:__import__",
    "builtins:open",
    "builtins:print",
    "builtins:getattr",
    "builtins:compile",
    "builtins:breakpoint",
    "builtins:int.__subclasses__",
    "builtins:object.__subclasses__",
    "builtins:__builtins__",
    "builtins:__loader__",
    "collections:namedtuple",
    "collections:abc",
    "collections:_collections_abc",
    "collections.abc:Mapping",
    "typing:NamedTuple",
    "enum:Enum",
    "dataclasses:dataclass",
    "builtins",
    "builtins:",
    ":eval",
    "builtins:eval:x",
    "builtins.eval",
]


def _from_json_recording_imports(text: str, **kwargs: Any) -> tuple[Any, list]:
    calls: list = []
    real_import = builtins.__import__
    real_import_module = importlib.import_module

    def spy_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        # a relative import inside pytree_kit of its own submodules would not be an
        # import of a named module (TreeSpec.from_json makes none).
        package = (globals or {}).get("__package__")
        if not (level > 0 and package == "pytree_kit"):
            calls.append(name)
        return real_import(name, globals, locals, fromlist, level)

    def spy_import_module(name: str, package: Any = None) -> Any:
        calls.append(name)
        return real_import_module(name, package)

    before = set(sys.modules)
    builtins.__import__ = spy_import
    importlib.import_module = spy_import_module  # type: ignore[assignment]
    try:
        try:
            result: Any = TreeSpec.from_json(text, **kwargs)
        except Exception as e:
            result = e
    finally:
        builtins.__import__ = real_import
        importlib.import_module = real_import_module
    assert set(sys.modules) == before, "from_json imported a module"
    return result, calls


@pytest.mark.parametrize("name", FORBIDDEN_REFS)
def test_forbidden_reference_is_refused_without_importing(name: str) -> None:
    for text in _ref_docs(name):
        result, calls = _from_json_recording_imports(text, allow=[SeqBox, WithStatic, Color])
        assert type(result) is ValueError, (text, result)
        assert calls == [], f"from_json imported {calls} for {text}"
        assert "some_module_that_does_not_exist" not in sys.modules


def test_forbidden_reference_message_names_it() -> None:
    for name in ("some_module_that_does_not_exist:Thing", "os.path:join", "builtins:eval"):
        text = _doc([{"kind": "namedtuple", "class": name, "fields": []}])
        with pytest.raises(ValueError, match=re.escape(name)):
            TreeSpec.from_json(text)


def test_forbidden_functions_are_never_called(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list = []

    def trap(*args: Any, **kwargs: Any) -> Any:
        called.append(args)
        raise AssertionError("called")

    for name in ("eval", "exec", "open", "print", "compile"):
        monkeypatch.setattr(builtins, name, trap)
    monkeypatch.setattr(os, "system", trap)
    for name in ("builtins:eval", "builtins:exec", "builtins:open", "os:system"):
        for text in _ref_docs(name):
            with pytest.raises(ValueError):
                TreeSpec.from_json(text)
    monkeypatch.undo()
    assert called == []


def test_allowed_documents_import_nothing_they_name() -> None:
    tree = [Point(1, 2), Plain(1), AttrsPoint(1, 2), SeqBox([1], RICH_AUX), STAT, {Color.RED: 1}]
    text = _spec_text(tree)
    result, calls = _from_json_recording_imports(text, allow=ALL_CLASSES)
    assert result == pk.structure(tree)
    named = {Point.__module__, "os", "time", "collections", "builtins"}
    assert not (set(calls) & named), calls


def _impostor(make: Callable[[], Any], like: Any) -> Any:
    """A fresh class with the same module:qualname as ``like``."""
    new = make()
    new.__module__ = like.__module__
    new.__qualname__ = like.__qualname__
    assert ref(new) == ref(like) and new is not like
    return new


STALE = [
    (
        "dataclass-other-fields",
        lambda: Plain(1),
        lambda: _impostor(lambda: dataclasses.make_dataclass("Plain", ["a", "zzz"]), Plain),
    ),
    (
        "dataclass-fewer-fields",
        lambda: Plain(1),
        lambda: _impostor(lambda: dataclasses.make_dataclass("Plain", ["a"]), Plain),
    ),
    (
        "dataclass-more-fields",
        lambda: Plain(1),
        lambda: _impostor(lambda: dataclasses.make_dataclass("Plain", ["a", "b", "c"]), Plain),
    ),
    (
        "dataclass-field-became-static",
        lambda: Plain(1),
        lambda: _impostor(
            lambda: dataclasses.make_dataclass(
                "Plain",
                ["a", ("b", Any, dataclasses.field(default=0, metadata={"static": True}))],
            ),
            Plain,
        ),
    ),
    (
        "dataclass-static-became-field",
        lambda: WithStatic(1),
        lambda: _impostor(
            lambda: dataclasses.make_dataclass("WithStatic", ["w", "name", "dims", "act"]),
            WithStatic,
        ),
    ),
    (
        "dataclass-now-a-plain-class",
        lambda: Plain(1),
        lambda: _impostor(lambda: type("Plain", (), {}), Plain),
    ),
    (
        "dataclass-now-attrs",
        lambda: Plain(1),
        lambda: _impostor(lambda: attrs.make_class("Plain", ["a", "b"]), Plain),
    ),
    (
        "attrs-other-fields",
        lambda: AttrsPoint(1, 2),
        lambda: _impostor(lambda: attrs.make_class("AttrsPoint", ["x", "z"]), AttrsPoint),
    ),
    (
        "attrs-now-dataclass",
        lambda: AttrsPoint(1, 2),
        lambda: _impostor(lambda: dataclasses.make_dataclass("AttrsPoint", ["x", "y"]), AttrsPoint),
    ),
    (
        "namedtuple-other-fields",
        lambda: Point(1, 2),
        lambda: _impostor(lambda: collections.namedtuple("Point", ["x", "z"]), Point),
    ),
    (
        "namedtuple-more-fields",
        lambda: Point(1, 2),
        lambda: _impostor(lambda: collections.namedtuple("Point", ["x", "y", "z"]), Point),
    ),
    (
        "namedtuple-now-a-plain-tuple-subclass",
        lambda: Point(1, 2),
        lambda: _impostor(lambda: type("Point", (tuple,), {}), Point),
    ),
    (
        "namedtuple-now-not-a-tuple",
        lambda: Point(1, 2),
        lambda: _impostor(lambda: type("Point", (), {"_fields": ("x", "y")}), Point),
    ),
    (
        "structseq-now-namedtuple",
        lambda: STAT,
        lambda: _impostor(lambda: collections.namedtuple("stat_result", "a b"), os.stat_result),
    ),
    (
        "structseq-other-arity",
        lambda: STAT,
        lambda: _impostor(
            lambda: type("stat_result", (tuple,), {"n_sequence_fields": 9, "n_fields": 9}),
            os.stat_result,
        ),
    ),
    (
        "protocol-lost-unflatten",
        lambda: SeqBox([1]),
        lambda: _impostor(lambda: type("SeqBox", (), {}), SeqBox),
    ),
    (
        "protocol-unflatten-not-callable",
        lambda: SeqBox([1]),
        lambda: _impostor(lambda: type("SeqBox", (), {"__tree_unflatten__": 3}), SeqBox),
    ),
    (
        "enum-member-gone",
        lambda: {Color.GREEN: 1},
        lambda: _impostor(lambda: enum.Enum("Color", ["RED", "BLUE"]), Color),
    ),
    (
        "enum-now-a-plain-class",
        lambda: {Color.GREEN: 1},
        lambda: _impostor(lambda: type("Color", (), {"GREEN": 2}), Color),
    ),
]


@pytest.mark.parametrize(
    ("make", "make_impostor"), [pytest.param(m, i, id=name) for name, m, i in STALE]
)
def test_stale_allow_entry_is_refused(make: Callable, make_impostor: Callable) -> None:
    text = _spec_text(make())
    impostor = make_impostor()
    with pytest.raises(ValueError):
        TreeSpec.from_json(
            text, allow=[impostor, *(c for c in ALL_CLASSES if ref(c) != ref(impostor))]
        )


def test_impostor_with_matching_fields_is_accepted() -> None:
    # What is checked is the shape, not the identity: a class with the same
    # name and the same fields reads, and builds instances of itself.
    impostor = _impostor(lambda: dataclasses.make_dataclass("Plain", ["a", "b"]), Plain)
    back = TreeSpec.from_json(_spec_text(Plain(1, 2)), allow=[impostor])
    rebuilt = back.unflatten([3, 4])
    assert type(rebuilt) is impostor and (rebuilt.a, rebuilt.b) == (3, 4)


def test_from_json_rejects_non_text_with_type_error() -> None:
    for bad in (None, 1, 1.5, ["{}"], {"format": "pytree_kit.TreeSpec"}, memoryview(b"{}")):
        with pytest.raises(TypeError):
            TreeSpec.from_json(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# 3. to_json of aux that cannot be written

UNWRITABLE = [
    ("protocol-aux-object", lambda: SeqBox([1], _Unwritable())),
    ("protocol-aux-nested-object", lambda: SeqBox([1], ("ok", (1, _Unwritable())))),
    ("protocol-aux-in-frozenset", lambda: MapBox({"a": 1}, frozenset({_Unwritable()}))),
    ("protocol-aux-str-subclass", lambda: SeqBox([], StrSub("x"))),
    ("protocol-aux-partial", lambda: SeqBox([], functools.partial(int))),
    ("dataclass-static-object", lambda: WithStatic(1, name=_Unwritable())),  # type: ignore[arg-type]
    ("attrs-static-object", lambda: AttrsFrozen(1, tag=_Unwritable())),  # type: ignore[arg-type]
    ("dict-key-object", lambda: {_Unwritable(): 1}),
    ("dict-key-str-subclass", lambda: {StrSub("a"): 1}),
    ("ordereddict-key-object", lambda: OrderedDict([(_Unwritable(), 1)])),
    ("defaultdict-factory-partial", lambda: defaultdict(functools.partial(list), {"a": 1})),
    ("rule-aux-object", lambda: Opaque(1, 2)),
]


@pytest.mark.parametrize("make", [pytest.param(m, id=name) for name, m in UNWRITABLE])
def test_unwritable_aux_raises_type_error(make: Callable[[], Any]) -> None:
    rules = {Opaque: pk.Rule(lambda o: ((o.a,), _Unwritable()), _opaque_unflatten)}
    spec = pk.structure(make(), rules=rules)
    with pytest.raises(TypeError, match="JSON"):
        spec.to_json()


def test_huge_int_key_to_json_raises_type_error() -> None:
    spec = pk.structure({10**5000: 1})
    with pytest.raises(TypeError):
        spec.to_json()


# --------------------------------------------------------------------------
# 4. hostile documents

VALID = _doc(_OK_LIST)


HOSTILE: list = [
    # -- not a document at all
    ("empty", ""),
    ("blank", "   \n"),
    ("json-null", "null"),
    ("json-list", "[]"),
    ("json-number", "42"),
    ("json-string", '"pytree_kit.TreeSpec"'),
    ("json-true", "true"),
    ("empty-object", "{}"),
    ("python-repr", repr(_head(_OK_LIST))),
    ("single-quotes", VALID.replace('"', "'")),
    ("trailing-garbage", VALID + "x"),
    ("two-documents", VALID + VALID),
    ("trailing-comma", VALID[:-1] + ",}"),
    ("comment", "// c\n" + VALID),
    ("nul-byte", VALID[:5] + "\x00" + VALID[5:]),
    ("bom-in-text", "\ufeff" + VALID),
    # -- header
    ("format-missing", json.dumps({k: v for k, v in _head(_OK_LIST).items() if k != "format"})),
    ("format-wrong", _doc(_OK_LIST, format="pytree_kit.Spec")),
    ("format-case", _doc(_OK_LIST, format="PYTREE_KIT.TREESPEC")),
    ("format-null", _doc(_OK_LIST, format=None)),
    ("version-missing", json.dumps({k: v for k, v in _head(_OK_LIST).items() if k != "version"})),
    ("version-2", _doc(_OK_LIST, version=2)),
    ("version-0", _doc(_OK_LIST, version=0)),
    ("version-negative", _doc(_OK_LIST, version=-1)),
    ("version-string", _doc(_OK_LIST, version="1")),
    ("version-float", _doc(_OK_LIST, version=1.0)),
    ("version-true", _doc(_OK_LIST, version=True)),
    ("version-null", _doc(_OK_LIST, version=None)),
    ("version-list", _doc(_OK_LIST, version=[1])),
    ("version-huge", _doc(_OK_LIST, version=10**40)),
    ("nodes-missing", json.dumps({k: v for k, v in _head(_OK_LIST).items() if k != "nodes"})),
    ("nodes-empty", _doc([], num_leaves=0)),
    ("nodes-object", _doc(_OK_LIST, nodes={"0": "*"})),
    ("nodes-string", _doc(_OK_LIST, nodes="*")),
    ("nodes-null", _doc(_OK_LIST, nodes=None)),
    (
        "num-leaves-missing",
        json.dumps({k: v for k, v in _head(_OK_LIST).items() if k != "num_leaves"}),
    ),
    ("num-leaves-lie-more", _doc(_OK_LIST, num_leaves=3)),
    ("num-leaves-lie-less", _doc(_OK_LIST, num_leaves=1)),
    ("num-leaves-zero", _doc(_OK_LIST, num_leaves=0)),
    ("num-leaves-negative", _doc(_OK_LIST, num_leaves=-2)),
    ("num-leaves-string", _doc(_OK_LIST, num_leaves="2")),
    ("num-leaves-float", _doc(_OK_LIST, num_leaves=2.0)),
    ("num-leaves-true", _doc(["*"], num_leaves=True)),
    ("num-leaves-nan", _doc(_OK_LIST).replace('"num_leaves": 2', '"num_leaves": NaN')),
    ("num-leaves-infinity", _doc(_OK_LIST).replace('"num_leaves": 2', '"num_leaves": Infinity')),
    (
        "num-leaves-5000-digits",
        _doc(_OK_LIST).replace('"num_leaves": 2', '"num_leaves": ' + "9" * 5000),
    ),
    # -- node shapes and counts
    ("two-trees", _doc(["*", "*"])),
    ("two-trees-after-list", _doc([*_OK_LIST, "*"])),
    ("leaf-then-container", _doc(["*", {"kind": "list", "arity": 2}, "*"])),
    ("none-then-container", _doc([None, {"kind": "tuple", "arity": 1}, "*"])),
    ("leaf-typo", _doc(["**"], num_leaves=1)),
    ("leaf-empty-string", _doc([""], num_leaves=0)),
    ("node-number", _doc([1], num_leaves=0)),
    ("node-true", _doc([True], num_leaves=0)),
    ("node-list", _doc([["*"]], num_leaves=0)),
    ("node-no-kind", _doc([{"arity": 0}])),
    ("kind-leaf-object", _doc([{"kind": "leaf"}])),
    ("kind-none-object", _doc([{"kind": "none"}])),
    ("kind-unknown", _doc([{"kind": "set", "arity": 0}])),
    ("kind-uppercase", _doc([{"kind": "LIST", "arity": 0}])),
    ("kind-number", _doc([{"kind": 3, "arity": 0}])),
    ("kind-null", _doc([{"kind": None, "arity": 0}])),
    ("kind-proto", _doc([{"kind": "__class__", "arity": 0}])),
    ("arity-missing", _doc([{"kind": "list"}])),
    ("arity-null", _doc([{"kind": "tuple", "arity": None}])),
    ("arity-string", _doc([{"kind": "list", "arity": "2"}, "*", "*"])),
    ("arity-float", _doc([{"kind": "list", "arity": 2.0}, "*", "*"])),
    ("arity-true", _doc([{"kind": "list", "arity": True}, "*"])),
    ("arity-negative", _doc([{"kind": "list", "arity": -1}, "*", "*"])),
    ("arity-too-big", _doc([{"kind": "list", "arity": 3}, "*", "*"])),
    ("arity-too-small", _doc([{"kind": "list", "arity": 1}, "*", "*"])),
    ("arity-huge", _doc([{"kind": "tuple", "arity": 10**18}, "*"])),
    ("arity-nested-lie", _doc([{"kind": "list", "arity": 2}, {"kind": "tuple", "arity": 2}, "*"])),
    ("deque-arity-missing", _doc([{"kind": "deque", "maxlen": None}])),
    ("deque-maxlen-negative", _doc([{"kind": "deque", "arity": 0, "maxlen": -1}])),
    ("deque-maxlen-string", _doc([{"kind": "deque", "arity": 0, "maxlen": "3"}])),
    ("deque-maxlen-float", _doc([{"kind": "deque", "arity": 0, "maxlen": 1.5}])),
    # -- dict keys
    ("dict-keys-missing", _doc([{"kind": "dict"}])),
    ("dict-keys-null", _doc([{"kind": "dict", "keys": None}])),
    ("dict-keys-string", _doc([{"kind": "dict", "keys": "ab"}, "*", "*"])),
    ("dict-keys-object", _doc([{"kind": "dict", "keys": {"a": 1}}, "*"])),
    ("dict-too-few-children", _doc([{"kind": "dict", "keys": ["a", "b"]}, "*"])),
    ("dict-too-many-children", _doc([{"kind": "dict", "keys": ["a"]}, "*", "*"])),
    ("duplicate-keys", _dict_keys("a", "a")),
    ("duplicate-keys-int-bool", _dict_keys(1, True)),
    ("duplicate-keys-int-float", _dict_keys(0, 0.0)),
    ("duplicate-keys-zero-signs", _dict_keys(0.0, -0.0)),
    ("duplicate-keys-tagged", _dict_keys({"tuple": [1]}, {"tuple": [1]})),
    ("duplicate-keys-frozenset", _dict_keys({"frozenset": [1, 2]}, {"frozenset": [2, 1]})),
    ("duplicate-ordereddict-keys", _doc([{"kind": "ordereddict", "keys": ["a", "a"]}, "*", "*"])),
    (
        "duplicate-defaultdict-keys",
        _doc([{"kind": "defaultdict", "default_factory": None, "keys": ["a", "a"]}, "*", "*"]),
    ),
    ("key-list", _dict_keys([1])),
    ("key-empty-object", _dict_keys({})),
    ("key-unknown-tag", _dict_keys({"set": [1]})),
    ("key-two-tags", _dict_keys({"tuple": [], "bytes": ""})),
    ("key-float-finite-string", _dict_keys({"float": "1.5"})),
    ("key-float-nan-case", _dict_keys({"float": "NaN"})),
    ("key-float-number", _dict_keys({"float": 1.5})),
    ("key-tuple-string", _dict_keys({"tuple": "ab"})),
    ("key-tuple-holding-list", _dict_keys({"tuple": [[1]]})),
    ("key-frozenset-object", _dict_keys({"frozenset": {"a": 1}})),
    ("key-frozenset-holding-list", _dict_keys({"frozenset": [[]]})),
    ("key-bytes-not-hex", _dict_keys({"bytes": "zz"})),
    ("key-bytes-odd-hex", _dict_keys({"bytes": "abc"})),
    ("key-bytes-number", _dict_keys({"bytes": 12})),
    ("key-complex-one-part", _dict_keys({"complex": [1]})),
    ("key-complex-three-parts", _dict_keys({"complex": [1, 2, 3]})),
    ("key-complex-strings", _dict_keys({"complex": ["1", 2]})),
    ("key-complex-bool", _dict_keys({"complex": [True, 2]})),
    ("key-complex-nested", _dict_keys({"complex": [{"complex": [1, 2]}, 2]})),
    ("key-ref-eval", _dict_keys({"ref": "builtins:eval"})),
    ("key-ref-number", _dict_keys({"ref": 1})),
    ("key-ref-not-allowed", _dict_keys({"ref": ref(Frozen)})),
    ("key-enum-not-enum", _dict_keys({"enum": "builtins:int", "name": "real"})),
    ("key-enum-no-member", _dict_keys({"enum": _C, "name": "BLUE"})),
    ("key-enum-name-number", _dict_keys({"enum": _C, "name": 1})),
    ("key-enum-private-name", _dict_keys({"enum": _C, "name": "__class__"})),
    ("key-enum-extra-field", _dict_keys({"enum": _C, "name": "RED", "x": 1})),
    ("key-enum-missing-name", _dict_keys({"enum": _C})),
    # -- dict insertion orders
    (
        "order-not-a-permutation",
        _doc([{"kind": "dict", "keys": ["a", "b"], "order": ["a"]}, "*", "*"]),
    ),
    (
        "order-extra-key",
        _doc([{"kind": "dict", "keys": ["a", "b"], "order": ["b", "a", "c"]}, "*", "*"]),
    ),
    (
        "order-duplicate",
        _doc([{"kind": "dict", "keys": ["a", "b"], "order": ["b", "b"]}, "*", "*"]),
    ),
    (
        "order-same-as-keys",
        _doc([{"kind": "dict", "keys": ["a", "b"], "order": ["a", "b"]}, "*", "*"]),
    ),
    ("order-not-a-list", _doc([{"kind": "dict", "keys": ["a", "b"], "order": "ba"}, "*", "*"])),
    ("order-null", _doc([{"kind": "dict", "keys": ["a", "b"], "order": None}, "*", "*"])),
    # -- defaultdict factories
    (
        "factory-eval",
        _doc([{"kind": "defaultdict", "default_factory": {"ref": "builtins:eval"}, "keys": []}]),
    ),
    (
        "factory-bare-string",
        _doc([{"kind": "defaultdict", "default_factory": "builtins:list", "keys": []}]),
    ),
    ("factory-number", _doc([{"kind": "defaultdict", "default_factory": 5, "keys": []}])),
    (
        "factory-tuple",
        _doc([{"kind": "defaultdict", "default_factory": {"tuple": []}, "keys": []}]),
    ),
    (
        "factory-enum",
        _doc([{"kind": "defaultdict", "default_factory": {"enum": _C, "name": "RED"}, "keys": []}]),
    ),
    (
        "factory-not-allowed",
        _doc([{"kind": "defaultdict", "default_factory": {"ref": ref(make_zero)}, "keys": []}]),
    ),
    # -- namedtuples and structseqs
    ("namedtuple-class-missing", _doc([{"kind": "namedtuple", "fields": ["x", "y"]}, "*", "*"])),
    (
        "namedtuple-class-number",
        _doc([{"kind": "namedtuple", "class": 1, "fields": ["x", "y"]}, "*", "*"]),
    ),
    ("namedtuple-fields-missing", _doc([{"kind": "namedtuple", "class": _P}, "*", "*"])),
    (
        "namedtuple-fields-wrong",
        _doc([{"kind": "namedtuple", "class": _P, "fields": ["y", "x"]}, "*", "*"]),
    ),
    ("namedtuple-fields-short", _doc([{"kind": "namedtuple", "class": _P, "fields": ["x"]}, "*"])),
    (
        "namedtuple-fields-numbers",
        _doc([{"kind": "namedtuple", "class": _P, "fields": [0, 1]}, "*", "*"]),
    ),
    (
        "namedtuple-fields-string",
        _doc([{"kind": "namedtuple", "class": _P, "fields": "xy"}, "*", "*"]),
    ),
    (
        "namedtuple-builtin-tuple",
        _doc([{"kind": "namedtuple", "class": "builtins:tuple", "fields": []}]),
    ),
    (
        "namedtuple-is-a-dataclass",
        _doc([{"kind": "namedtuple", "class": _D, "fields": ["a", "b"]}, "*", "*"]),
    ),
    (
        "structseq-wrong-arity",
        _doc([{"kind": "structseq", "class": "os:stat_result", "arity": 2}, "*", "*"]),
    ),
    ("structseq-is-namedtuple", _doc([{"kind": "structseq", "class": _P, "arity": 2}, "*", "*"])),
    (
        "structseq-hidden-string",
        _doc(
            [{"kind": "structseq", "class": "time:struct_time", "arity": 9, "hidden": "x"}]
            + ["*"] * 9
        ),
    ),
    (
        "structseq-hidden-bad-pair",
        _doc(
            [
                {
                    "kind": "structseq",
                    "class": "time:struct_time",
                    "arity": 9,
                    "hidden": [["tm_zone"]],
                }
            ]
            + ["*"] * 9
        ),
    ),
    (
        "structseq-hidden-number-name",
        _doc(
            [{"kind": "structseq", "class": "time:struct_time", "arity": 9, "hidden": [[1, 2]]}]
            + ["*"] * 9
        ),
    ),
    (
        "structseq-hidden-bad-value",
        _doc(
            [
                {
                    "kind": "structseq",
                    "class": "time:struct_time",
                    "arity": 9,
                    "hidden": [["tm_zone", [1]]],
                }
            ]
            + ["*"] * 9
        ),
    ),
    # -- dataclasses and attrs classes
    ("dataclass-fields-missing", _doc([{"kind": "dataclass", "class": _D}, "*", "*"])),
    ("dataclass-fields-null", _doc([{"kind": "dataclass", "class": _D, "fields": None}, "*", "*"])),
    (
        "dataclass-unknown-field",
        _doc([{"kind": "dataclass", "class": _D, "fields": ["a", "c"]}, "*", "*"]),
    ),
    ("dataclass-missing-field", _doc([{"kind": "dataclass", "class": _D, "fields": ["a"]}, "*"])),
    (
        "dataclass-field-twice",
        _doc([{"kind": "dataclass", "class": _D, "fields": ["a", "a", "b"]}, "*", "*", "*"]),
    ),
    (
        "dataclass-field-child-and-unset",
        _doc([{"kind": "dataclass", "class": _D, "fields": ["a", "b"], "unset": ["b"]}, "*", "*"]),
    ),
    (
        "dataclass-unset-string",
        _doc([{"kind": "dataclass", "class": _D, "fields": ["a"], "unset": "b"}, "*"]),
    ),
    (
        "dataclass-static-not-static",
        _doc([{"kind": "dataclass", "class": _D, "fields": ["a"], "static": [["b", 1]]}, "*"]),
    ),
    (
        "dataclass-static-field-as-child",
        _doc(
            [
                {"kind": "dataclass", "class": _W, "fields": ["w", "name", "dims", "act"]},
                "*",
                "*",
                "*",
                "*",
            ]
        ),
    ),
    (
        "dataclass-static-bad-pairs",
        _doc([{"kind": "dataclass", "class": _W, "fields": ["w"], "static": [["name"]]}, "*"]),
    ),
    (
        "dataclass-static-bad-value",
        _doc(
            [
                {
                    "kind": "dataclass",
                    "class": _W,
                    "fields": ["w"],
                    "static": [["name", [1]]],
                    "unset": ["dims", "act"],
                },
                "*",
            ]
        ),
    ),
    (
        "dataclass-static-object",
        _doc([{"kind": "dataclass", "class": _W, "fields": ["w"], "static": {"name": "x"}}, "*"]),
    ),
    (
        "dataclass-dict-keys-not-fields",
        _doc(
            [
                {
                    "kind": "dataclass",
                    "class": ref(DictOut),
                    "fields": ["loss", "logits"],
                    "dict_keys": ["zzz"],
                },
                "*",
                "*",
            ]
        ),
    ),
    (
        "dataclass-dict-keys-string",
        _doc(
            [
                {
                    "kind": "dataclass",
                    "class": ref(DictOut),
                    "fields": ["loss", "logits"],
                    "dict_keys": "loss",
                },
                "*",
                "*",
            ]
        ),
    ),
    (
        "dataclass-is-attrs",
        _doc([{"kind": "dataclass", "class": _A, "fields": ["x", "y"]}, "*", "*"]),
    ),
    ("attrs-is-dataclass", _doc([{"kind": "attrs", "class": _D, "fields": ["a", "b"]}, "*", "*"])),
    (
        "dataclass-is-namedtuple",
        _doc([{"kind": "dataclass", "class": _P, "fields": ["x", "y"]}, "*", "*"]),
    ),
    ("dataclass-is-builtin", _doc([{"kind": "dataclass", "class": "builtins:dict", "fields": []}])),
    ("dataclass-is-enum-module", _doc([{"kind": "dataclass", "class": "enum:Enum", "fields": []}])),
    # -- protocol classes and rules
    ("custom-arity-missing", _doc([{"kind": "custom", "class": _S, "aux": None}])),
    (
        "custom-keys-arity-mismatch",
        _doc([{"kind": "custom", "class": _S, "arity": 2, "keys": ["a"], "aux": None}, "*", "*"]),
    ),
    (
        "custom-keys-duplicate",
        _doc(
            [{"kind": "custom", "class": _S, "arity": 2, "keys": ["a", "a"], "aux": None}, "*", "*"]
        ),
    ),
    (
        "custom-entries-arity-mismatch",
        _doc(
            [{"kind": "custom", "class": _S, "arity": 2, "entries": ["a"], "aux": None}, "*", "*"]
        ),
    ),
    (
        "custom-entries-duplicate",
        _doc(
            [{"kind": "custom", "class": _S, "arity": 2, "entries": [1, 1], "aux": None}, "*", "*"]
        ),
    ),
    (
        "custom-entries-and-keys",
        _doc(
            [
                {
                    "kind": "custom",
                    "class": _S,
                    "arity": 1,
                    "keys": ["a"],
                    "entries": ["a"],
                    "aux": None,
                },
                "*",
            ]
        ),
    ),
    (
        "custom-entries-not-a-list",
        _doc([{"kind": "custom", "class": _S, "arity": 0, "entries": {}, "aux": None}]),
    ),
    (
        "custom-keys-string",
        _doc([{"kind": "custom", "class": _S, "arity": 2, "keys": "ab", "aux": None}, "*", "*"]),
    ),
    ("custom-aux-list", _doc([{"kind": "custom", "class": _S, "arity": 0, "aux": [1, 2]}])),
    ("custom-aux-object", _doc([{"kind": "custom", "class": _S, "arity": 0, "aux": {"a": 1}}])),
    (
        "custom-aux-ref-eval",
        _doc([{"kind": "custom", "class": _S, "arity": 0, "aux": {"ref": "builtins:eval"}}]),
    ),
    ("custom-no-unflatten", _doc([{"kind": "custom", "class": _D, "arity": 0, "aux": None}])),
    (
        "custom-builtin-class",
        _doc([{"kind": "custom", "class": "builtins:list", "arity": 0, "aux": None}]),
    ),
    ("custom-class-missing", _doc([{"kind": "custom", "arity": 0, "aux": None}])),
    ("rule-without-rules", _doc([{"kind": "rule", "class": ref(Opaque), "arity": 0, "aux": None}])),
    (
        "rule-for-builtin",
        _doc([{"kind": "rule", "class": "builtins:int", "arity": 0, "aux": None}]),
    ),
    # -- class references
    ("ref-eval", _doc([{"kind": "custom", "class": "builtins:eval", "arity": 0, "aux": None}])),
    (
        "ref-import",
        _doc([{"kind": "custom", "class": "builtins:__import__", "arity": 0, "aux": None}]),
    ),
    ("ref-os-system", _doc([{"kind": "namedtuple", "class": "os:system", "fields": []}])),
    (
        "ref-unknown-module",
        _doc([{"kind": "namedtuple", "class": "nope_nope:Thing", "fields": []}]),
    ),
    ("ref-no-colon", _doc([{"kind": "namedtuple", "class": "os.stat_result", "fields": []}])),
    ("ref-two-colons", _doc([{"kind": "namedtuple", "class": "a:b:c", "fields": []}])),
    ("ref-list", _doc([{"kind": "namedtuple", "class": ["os", "stat_result"], "fields": []}])),
    (
        "ref-not-allowed-structseq",
        _doc([{"kind": "structseq", "class": "os:terminal_size", "arity": 2}, "*", "*"]),
    ),
    # -- deep nesting
    ("deep-arrays", "[" * 100_000),
    ("deep-arrays-closed", "[" * 100_000 + "]" * 100_000),
    ("deep-objects", '{"a":' * 100_000),
    ("deep-objects-closed", '{"a":' * 100_000 + "1" + "}" * 100_000),
    ("deep-in-nodes", _doc(["*"])[:-2] + ", " + "[" * 100_000 + "]" * 100_000 + "]}"),
    ("deep-tuple-key", _dict_keys("K").replace('"K"', '{"tuple": [' * 50_000 + "]}" * 50_000)),
    (
        "deep-frozenset-key",
        _dict_keys("K").replace('"K"', '{"frozenset": [' * 50_000 + "]}" * 50_000),
    ),
]


def test_hostile_list_is_long_and_unique() -> None:
    names = [name for name, _ in HOSTILE]
    assert len(names) >= 30
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("text", [pytest.param(t, id=name) for name, t in HOSTILE])
def test_hostile_document_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        TreeSpec.from_json(text, allow=HOSTILE_ALLOW)
    with pytest.raises(ValueError):
        TreeSpec.from_json(text.encode("utf-8", "surrogatepass"), allow=HOSTILE_ALLOW)


@pytest.mark.parametrize("text", VALID_BASES)
def test_valid_base_documents_are_accepted(text: str) -> None:
    spec = TreeSpec.from_json(text, allow=HOSTILE_ALLOW)
    assert type(spec) is TreeSpec
    assert spec.num_leaves == json.loads(text)["num_leaves"]
    again = spec.to_json()
    assert TreeSpec.from_json(again, allow=HOSTILE_ALLOW).to_json() == again


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\xff\xfe", id="ff-fe"),
        pytest.param(b"\x80", id="lone-continuation"),
        pytest.param(b'{"format": "\xff"}', id="bad-byte-in-string"),
        pytest.param(VALID.encode()[:10] + b"\xc3" + VALID.encode()[10:], id="truncated-sequence"),
        pytest.param(b"\xed\xa0\x80", id="utf8-surrogate"),
        pytest.param(b"\xc0\xaf", id="overlong"),
        pytest.param(VALID.encode("utf-16"), id="utf-16"),
        pytest.param(VALID.encode("utf-32"), id="utf-32"),
        pytest.param(b"\xef\xbb\xbf" + VALID.encode(), id="utf8-bom"),
        pytest.param(VALID.encode("latin-1").replace(b'"*"', b'"\xe9"'), id="latin-1"),
        pytest.param(bytearray(b"\xff" + VALID.encode()), id="bytearray"),
    ],
)
def test_non_utf8_bytes_raise_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        TreeSpec.from_json(data)


# -- bugs: hostile documents that are accepted --------------------------------


def test_deque_arity_above_maxlen_is_refused() -> None:
    text = _doc([{"kind": "deque", "arity": 3, "maxlen": 1}, "*", "*", "*"])
    with pytest.raises(ValueError):
        TreeSpec.from_json(text)


def test_dict_keys_on_non_dict_dataclass_is_refused() -> None:
    text = _doc(
        [{"kind": "dataclass", "class": _D, "fields": ["a", "b"], "dict_keys": ["a"]}, "*", "*"]
    )
    with pytest.raises(ValueError):
        TreeSpec.from_json(text, allow=[Plain])


@pytest.mark.parametrize(
    "text",
    [
        VALID.replace('"version": 1', '"version": 7, "version": 1'),
        VALID.replace('"num_leaves": 2', '"num_leaves": 99, "num_leaves": 2'),
        VALID.replace('"arity": 2', '"arity": 5, "arity": 2'),
    ],
    ids=["version", "num_leaves", "arity"],
)
def test_duplicate_member_names_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        TreeSpec.from_json(text)


# -- truncation ---------------------------------------------------------------


def _medium_tree() -> Any:
    return {
        "z": [Point(1, 2), Pair(None, (3,))],
        "a": OrderedDict([("q", deque([4, 5], maxlen=3)), ("p", 6)]),
        "m": defaultdict(list, {"y": Plain(7, WithStatic(8)), "x": AttrsPoint(9, 10)}),
        "s": SeqBox([MapBox({"k": 11}, 2)], RICH_AUX),
        "t": time.gmtime(0),
        "e": {Color.RED: InitFalse(14), 2: DictOut(loss=15), "\u00e9": "\u2603"},
    }


def test_every_truncation_raises_value_error() -> None:
    text = _spec_text(_medium_tree())
    full = text.rstrip()
    assert len(full) > 500
    assert TreeSpec.from_json(full, allow=ALL_CLASSES) == pk.structure(_medium_tree())
    for n in range(len(full)):
        with pytest.raises(ValueError):
            TreeSpec.from_json(full[:n], allow=ALL_CLASSES)


def test_every_byte_truncation_raises_value_error() -> None:
    data = _spec_text(_medium_tree()).rstrip().encode("utf-8")
    for n in range(len(data)):
        with pytest.raises(ValueError):
            TreeSpec.from_json(data[:n], allow=ALL_CLASSES)


def test_dropping_a_leaf_line_raises_value_error() -> None:
    text = _spec_text(_medium_tree())
    lines = text.split("\n")
    leaf_lines = [i for i, line in enumerate(lines) if line in ('"*",', '"*"')]
    assert leaf_lines
    for i in leaf_lines:
        mutated = "\n".join(lines[:i] + lines[i + 1 :])
        with pytest.raises(ValueError):
            TreeSpec.from_json(mutated, allow=ALL_CLASSES)


def test_moderately_deep_aux_gives_spec_or_value_error() -> None:
    # Deep enough to stress the recursive aux decoder, shallow enough for json.
    for depth in (50, 200, 400, 900):
        key = '{"tuple": [' * depth + "1" + "]}" * depth
        text = _dict_keys("K").replace('"K"', key)
        try:
            spec = TreeSpec.from_json(text)
        except ValueError:
            continue
        assert type(spec) is TreeSpec and spec.num_leaves == 1


# -- hypothesis: mutated documents --------------------------------------------

_CORPUS = [json.loads(_spec_text(make(), rules=rules)) for _, make, _, rules in CASES]
_CORPUS += [json.loads(t) for t in VALID_BASES]

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**70),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(_SPECIAL),
)
_json_values = st.recursive(
    _json_scalars,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(st.sampled_from(_MEMBER_NAMES) | st.text(max_size=4), c, max_size=3)
    ),
    max_leaves=6,
)


def _mutate(doc: Any, data: st.DataObject) -> Any:
    # Drawn values are deep-copied: _SPECIAL holds dicts that later mutations would change.
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        positions = _positions(doc)
        if not positions:
            return copy.deepcopy(data.draw(_json_values, label="new root"))
        container, key = data.draw(st.sampled_from(positions), label="position")
        op = data.draw(st.sampled_from(["replace", "delete", "insert", "dup", "tweak"]))
        if op == "replace":
            container[key] = copy.deepcopy(data.draw(_json_values, label="value"))
        elif op == "delete":
            del container[key]
        elif op == "insert":
            value = copy.deepcopy(data.draw(_json_values, label="value"))
            if isinstance(container, list):
                container.insert(key, value)
            else:
                container[data.draw(st.sampled_from(_MEMBER_NAMES), label="name")] = value
        elif op == "dup":
            if isinstance(container, list):
                container.insert(key, copy.deepcopy(container[key]))
        else:  # tweak a number by a little, or a string by a character
            value = container[key]
            if type(value) is int:
                container[key] = value + data.draw(st.sampled_from([-2, -1, 1, 2]))
            elif type(value) is str and value:
                i = data.draw(st.integers(0, len(value) - 1))
                container[key] = value[:i] + value[i + 1 :]
    return doc


def _accepts_or_value_error(text: Any) -> None:
    try:
        spec = TreeSpec.from_json(text, allow=ALL_CLASSES, rules=RULES)
    except ValueError:
        return
    assert type(spec) is TreeSpec
    # Whatever is accepted is a usable spec: it writes, reads back the same and renders.
    again = spec.to_json()
    back = TreeSpec.from_json(again, allow=ALL_CLASSES, rules=RULES)
    assert back.to_json() == again
    assert spec.num_leaves == sum(1 for n in json.loads(again)["nodes"] if n == "*")
    repr(spec)
    hash(spec)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_documents_give_spec_or_value_error(data: st.DataObject) -> None:
    doc = copy.deepcopy(data.draw(st.sampled_from(_CORPUS), label="document"))
    text = json.dumps(_mutate(doc, data))
    _accepts_or_value_error(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_text_edits_give_spec_or_value_error(data: st.DataObject) -> None:
    doc = data.draw(st.sampled_from(_CORPUS), label="document")
    text = json.dumps(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)), label="at")
        op = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        piece = data.draw(st.sampled_from(list('[]{}",:*0 -e.n\\')) | st.text(max_size=2))
        if op == "delete":
            text = text[:i] + text[i + 1 :]
        elif op == "insert":
            text = text[:i] + piece + text[i:]
        else:
            text = text[:i] + piece + text[i + len(piece) :]
    _accepts_or_value_error(text)
    _accepts_or_value_error(text.encode("utf-8", "surrogatepass"))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_arbitrary_input_gives_spec_or_value_error(data: Any) -> None:
    _accepts_or_value_error(data)


# --------------------------------------------------------------------------
# 5. pickle


@pytest.mark.parametrize(("make", "allow", "rules"), CASE_PARAMS)
def test_pickle_round_trip(make: Callable[[], Any], allow: Any, rules: Any) -> None:
    tree = make()
    leaves, spec = pk.flatten(tree, rules=rules)
    decoded = TreeSpec.from_json(spec.to_json(), allow=allow, rules=rules)
    for original in (spec, decoded):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(original, protocol=protocol))
            assert type(back) is TreeSpec
            assert back == spec
            assert hash(back) == hash(spec)
            assert back.num_leaves == spec.num_leaves
            assert back.to_json() == spec.to_json()
            assert_same_tree(back.unflatten(leaves), tree)


def test_pickle_keeps_dict_insertion_order() -> None:
    tree = {"b": 1, "a": {"d": 2, "c": 3}}
    spec = pk.structure(tree)
    back = pickle.loads(pickle.dumps(spec))
    rebuilt = back.unflatten([4, 5, 6])
    assert list(rebuilt) == ["b", "a"] and list(rebuilt["a"]) == ["d", "c"]


def test_to_json_of_something_not_a_spec_says_what_it_got():
    with pytest.raises(TypeError, match=r"^TreeSpec\.to_json: expected a TreeSpec, got list$"):
        pk.TreeSpec.to_json([1, 2])  # type: ignore[arg-type]


def test_a_document_with_a_structseqs_hidden_fields_reads_as_the_spec_of_today():
    """Documents written when a structseq's fields outside its sequence were
    in the spec still load; those values are checked, then dropped."""
    spec = pk.structure(time.gmtime(0))
    doc = json.loads(spec.to_json())
    assert "hidden" not in doc["nodes"][0]
    doc["nodes"][0]["hidden"] = [["tm_zone", "UTC"], ["tm_gmtoff", 0]]
    back = TreeSpec.from_json(json.dumps(doc), allow=[time.struct_time])
    assert back == spec and hash(back) == hash(spec) and back.to_json() == spec.to_json()
    doc["nodes"][0]["hidden"] = "x"
    with pytest.raises(ValueError, match="'hidden' must be a list of"):
        TreeSpec.from_json(json.dumps(doc), allow=[time.struct_time])


def test_a_pickled_spec_with_a_structseqs_hidden_fields_reads_as_the_spec_of_today():
    """A spec pickled when a structseq's node held its values outside the
    sequence: unpickled, it equals the spec a flatten gives now, and a tree
    of its structure matches it."""
    from pytree_kit._kinds import STRUCTSEQ
    from pytree_kit._spec import _from_state

    spec = pk.structure([time.gmtime(0), 1])
    old_nodes = tuple(
        (n[0], n[1], n[2], (("tm_zone", "UTC"), ("tm_gmtoff", 0))) if n[0] == STRUCTSEQ else n
        for n in spec._nodes
    )
    assert old_nodes != spec._nodes
    back = pickle.loads(pickle.dumps(_from_state(old_nodes, spec._orders)))
    assert back == spec and hash(back) == hash(spec)
    assert back.flatten_up_to([time.localtime(0), 2]) == [*time.localtime(0), 2]
