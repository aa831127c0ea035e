"""What is a node: one test per row of the table in docs/design.md."""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import importlib.util
import os
import pickle
import re
import subprocess
import sys
import time
import typing
from collections import OrderedDict, defaultdict, deque
from typing import Any

import attrs
import pytest

import pytree_kit as pk
from scripts.corpus.trees import RULES, ModelOutput, Opaque, assert_same_tree


def round_trip(tree: Any, **kw: Any) -> tuple[list, pk.TreeSpec, Any]:
    leaves, spec = pk.flatten(tree, **kw)
    rebuilt = pk.unflatten(spec, leaves)
    assert_same_tree(rebuilt, tree)
    return leaves, spec, rebuilt


# -- builtins -----------------------------------------------------------------


def test_tuple_and_list_are_positional_and_keep_their_type():
    leaves, spec, rebuilt = round_trip((1, [2, 3], ()))
    assert leaves == [1, 2, 3]
    assert type(rebuilt) is tuple and type(rebuilt[1]) is list and rebuilt[2] == ()
    assert pk.structure((1,)) != pk.structure([1])


def test_dict_leaves_are_sorted_and_insertion_order_is_restored():
    tree = {"b": 1, "a": 2, "c": 3}
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [2, 1, 3]
    assert list(rebuilt) == ["b", "a", "c"]
    # spec equality ignores insertion order ...
    other = pk.structure({"a": 0, "c": 0, "b": 0})
    assert spec == other and hash(spec) == hash(other)
    # ... and each spec rebuilds its own order
    assert list(other.unflatten([1, 2, 3])) == ["a", "c", "b"]


def test_dict_with_keys_that_do_not_order_keeps_insertion_order():
    tree = {1: "int", "s": "str", (2,): "tuple"}
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == ["int", "str", "tuple"]
    assert list(rebuilt) == [1, "s", (2,)]
    # leaf order differs, so these specs differ
    assert pk.structure({"s": 0, 1: 0, (2,): 0}) != spec


def test_dict_whose_key_comparison_raises_falls_back_to_insertion_order():
    class Key:
        def __init__(self, n):
            self.n = n

        def __hash__(self):
            return self.n

        def __lt__(self, other):
            raise RuntimeError("no order")

    a, b = Key(1), Key(2)
    leaves, _, _ = round_trip({b: "b", a: "a"})
    assert leaves == ["b", "a"]


def test_ordereddict_keeps_insertion_order_and_its_spec_is_order_sensitive():
    tree = OrderedDict([("b", 1), ("a", 2)])
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [1, 2] and type(rebuilt) is OrderedDict
    assert spec != pk.structure(OrderedDict([("a", 1), ("b", 2)]))
    assert spec != pk.structure({"b": 1, "a": 2})


def test_defaultdict_keeps_its_default_factory():
    tree = defaultdict(list, {"y": 1, "x": 2})
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [2, 1]
    assert rebuilt.default_factory is list and list(rebuilt) == ["y", "x"]
    assert spec != pk.structure(defaultdict(set, {"y": 1, "x": 2}))
    assert spec != pk.structure({"y": 1, "x": 2})


def test_deque_keeps_maxlen():
    leaves, spec, rebuilt = round_trip(deque([1, 2], maxlen=5))
    assert leaves == [1, 2] and rebuilt.maxlen == 5
    assert spec != pk.structure(deque([1, 2]))


def test_none_is_a_node_with_no_leaf():
    leaves, spec, rebuilt = round_trip([None, 1, {"a": None}])
    assert leaves == [1]
    assert spec.num_leaves == 1 and spec.num_nodes == 5
    assert pk.leaves(None) == [] and pk.unflatten(pk.structure(None), []) is None


def test_subclasses_of_builtin_containers_are_nodes_of_their_class():
    # the mapping and sequence kinds (tests/test_subclasses.py has their rules)
    class MyDict(dict):
        pass

    class MyList(list):
        pass

    class MyTuple(tuple):
        pass

    class MyDeque(deque):  # a deque subclass stays a leaf
        pass

    tree = [MyDict(a=1), MyList([2]), MyTuple((3,)), collections.UserDict(b=4), MyDeque([5])]
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [1, 2, 3, 4, tree[4]]
    assert [c.kind for c in spec.children()] == [
        "mapping",
        "sequence",
        "sequence",
        "mapping",
        "leaf",
    ]
    assert [type(x) for x in rebuilt] == [type(x) for x in tree]


@pytest.mark.parametrize(
    "leaf", ["text", b"bytes", 1, 2.5, True, 3j, {1, 2}, frozenset({1}), range(3), object()]
)
def test_anything_else_is_a_leaf(leaf):
    assert pk.leaves([leaf])[0] is leaf
    assert pk.structure(leaf).is_leaf()


def test_arrays_and_tensors_are_leaves():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    a, t = np.zeros(3), torch.zeros(3)
    leaves = pk.leaves({"a": a, "t": t})
    assert leaves[0] is a and leaves[1] is t


# -- namedtuples and structseqs -----------------------------------------------


def test_namedtuple_and_typing_namedtuple_are_field_ordered_nodes():
    P = collections.namedtuple("P", "y x")

    class T(typing.NamedTuple):
        b: Any
        a: Any = 0

    leaves, spec, rebuilt = round_trip([P(1, 2), T(3)])
    assert leaves == [1, 2, 3, 0]
    pairs, _ = pk.flatten_with_path(P(1, 2))
    assert [pk.keystr(p) for p, _ in pairs] == [".y", ".x"]
    assert pk.structure(P(1, 2)) != pk.structure((1, 2))


def test_namedtuple_rebuild_does_not_call_a_validating_new():
    class Box(collections.namedtuple("Box", "lo hi")):
        __slots__ = ()

        def __new__(cls, lo, hi):
            if not lo <= hi:
                raise ValueError("empty box")
            return super().__new__(cls, lo, hi)

    spec = pk.structure(Box(1, 2))
    rebuilt = spec.unflatten(["shape a", "another shape"])
    assert type(rebuilt) is Box and rebuilt.lo == "shape a"


def test_structseq_torch_return_types():
    torch = pytest.importorskip("torch")
    out = torch.max(torch.tensor([[1.0, 3.0], [4.0, 2.0]]), dim=1)
    leaves, spec, rebuilt = round_trip(out)
    assert leaves[0] is out.values and leaves[1] is out.indices
    assert type(rebuilt) is type(out)
    pairs, _ = pk.flatten_with_path(out)
    assert [pk.keystr(p) for p, _ in pairs] == [".values", ".indices"]


def test_a_structseqs_structure_is_its_class_and_its_sequence_fields():
    """As in optree and jax: the fields outside the sequence (tm_zone,
    st_mtime_ns, ...) are values, not structure. They are in no spec, so two
    structseqs of a class always match; unflatten rebuilds one from its
    sequence fields, and the others are None."""
    a, b = time.gmtime(0), time.struct_time(range(9))
    assert pk.structure(a) == pk.structure(b) and hash(pk.structure(a)) == hash(pk.structure(b))
    assert pk.structure(a).flatten_up_to(b) == list(b)
    pk.assert_same_structure(a, b)
    s1, s2 = os.stat("/"), os.stat(".")
    out = pk.tree_map(lambda x, y: (x, y), s1, s2)
    assert type(out) is os.stat_result and out[0] == (s1[0], s2[0])
    tm = time.localtime(0)
    _, spec, back = round_trip(tm)
    assert tuple(back) == tuple(tm) and back.tm_zone is None and back.tm_gmtoff is None
    _, _, st = round_trip(s1)
    assert tuple(st) == tuple(s1) and st.st_mtime_ns is None
    assert spec.to_json() == pk.structure(time.struct_time(range(9))).to_json()
    optree = pytest.importorskip("optree")
    assert optree.tree_structure(a) == optree.tree_structure(b)


# -- dataclasses ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlots:
    x: Any
    y: Any


@dataclasses.dataclass(kw_only=True)
class Kw:
    b: Any
    a: Any = 1


@dataclasses.dataclass
class Base:
    first: Any


@dataclasses.dataclass
class Derived(Base):
    second: Any
    computed: Any = dataclasses.field(init=False)

    def __post_init__(self):
        self.computed = ("derived from", self.first)


@dataclasses.dataclass
class WithStatic:
    data: Any
    mode: str = dataclasses.field(default="train", metadata={"static": True})


@dataclasses.dataclass
class Validating:
    boxes: Any

    def __post_init__(self):
        if self.boxes.ndim != 2:
            raise ValueError("boxes must be 2-d")


def test_dataclass_frozen_slots():
    leaves, spec, rebuilt = round_trip(FrozenSlots(1, [2]))
    assert leaves == [1, 2] and type(rebuilt) is FrozenSlots


def test_dataclass_kw_only_and_field_order():
    leaves, _, rebuilt = round_trip(Kw(a=5, b=6))
    assert leaves == [6, 5] and rebuilt == Kw(a=5, b=6)


def test_dataclass_inheritance_and_init_false_fields():
    d = Derived(1, 2)
    leaves, spec, rebuilt = round_trip(d)
    assert leaves == [1, 2, "derived from", 1]
    pairs, _ = pk.flatten_with_path(d)
    assert [pk.keystr(p) for p, _ in pairs] == [".first", ".second", ".computed[0]", ".computed[1]"]


def test_dataclass_unset_field_stays_unset():
    d = Derived.__new__(Derived)
    object.__setattr__(d, "first", 1)
    object.__setattr__(d, "second", 2)
    leaves, spec, rebuilt = round_trip(d)
    assert leaves == [1, 2] and not hasattr(rebuilt, "computed")
    assert spec != pk.structure(Derived(1, 2))


def test_static_field_goes_into_the_spec_not_the_leaves():
    leaves, spec, rebuilt = round_trip(WithStatic([1, 2], mode="eval"))
    assert leaves == [1, 2] and rebuilt.mode == "eval"
    assert spec != pk.structure(WithStatic([1, 2]))
    assert "mode='eval'" in repr(spec)


def test_dataclass_rebuild_skips_init_and_post_init():
    np = pytest.importorskip("numpy")
    v = Validating(np.zeros((2, 4)))
    shapes = pk.tree_map(lambda a: a.shape, v)  # a tuple has no ndim: __post_init__ would fail
    assert type(shapes) is Validating and shapes.boxes == (2, 4)


def test_dataclass_class_object_is_a_leaf():
    assert pk.leaves([Kw]) == [Kw]


def test_model_output_style_dict_dataclass_keeps_fields_and_dict_view():
    torch = pytest.importorskip("torch")
    out = ModelOutput(logits=torch.ones(2), hidden=(torch.zeros(1),))
    leaves, spec, rebuilt = round_trip(out)
    assert len(leaves) == 2
    assert list(rebuilt.keys()) == ["logits", "hidden"] and rebuilt.loss is None
    assert rebuilt["logits"] is leaves[0] and rebuilt.hidden[0] is leaves[1]
    # non-tensor first field after tree_map: ModelOutput.__post_init__ would read it as pairs
    sizes = pk.tree_map(lambda t: list(t.shape), out)
    assert sizes.logits == [2] and list(sizes.keys()) == ["logits", "hidden"]
    assert sizes["hidden"] == ([1],)


def test_dict_dataclass_whose_dict_view_disagrees_is_an_error():
    out = ModelOutput(logits=1)
    OrderedDict.__setitem__(out, "logits", 2)  # dict view no longer matches the field
    with pytest.raises(TypeError, match=r"tree\[0\]: ModelOutput is a dict whose entry 'logits'"):
        pk.flatten([out])


# -- attrs -----------------------------------------------------------------------


@attrs.define
class AttrsPlain:
    a: Any
    b: Any = attrs.field(default=None)


@attrs.frozen
class AttrsFrozen:
    a: Any
    tag: str = attrs.field(default="x", metadata={"static": True})

    def __attrs_post_init__(self):
        if self.tag == "never":
            raise AssertionError("post-init must not run on rebuild")


def test_attrs_classes_are_attribute_ordered_nodes():
    leaves, spec, rebuilt = round_trip([AttrsPlain(1, [2]), AttrsFrozen(3, tag="y")])
    assert leaves == [1, 2, 3]
    assert rebuilt[1].tag == "y"
    pairs, _ = pk.flatten_with_path(AttrsPlain(1, 2))
    assert [pk.keystr(p) for p, _ in pairs] == [".a", ".b"]


def test_pytree_kit_never_imports_attrs():
    code = (
        "import sys, dataclasses, pytree_kit as pk\n"
        "@dataclasses.dataclass\nclass D:\n    x: int\n"
        "pk.flatten([D(1), {'a': (1, None)}]).__repr__()\n"
        "assert 'attrs' not in sys.modules and 'attr' not in sys.modules, sorted(sys.modules)\n"
        "assert not any(m.startswith(('torch', 'hypothesis', 'numpy', 'jax')) for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the protocol and rules --------------------------------------------------------


class Boxes:
    def __init__(self, coords, labels, fmt="xyxy"):
        self.coords, self.labels, self.fmt = coords, labels, fmt

    def __tree_flatten__(self):
        return {"coords": self.coords, "labels": self.labels}, self.fmt

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        return cls(children["coords"], children["labels"], aux)


@dataclasses.dataclass
class ProtocolWins:
    a: Any
    b: Any

    def __tree_flatten__(self):
        return (self.b,), self.a

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        return cls(aux, children[0])


def test_protocol_with_dict_children_names_the_paths():
    tree = {"targets": [Boxes([1, 2], [3])]}
    pairs, spec = pk.flatten_with_path(tree)
    assert [pk.keystr(p) for p, _ in pairs] == [
        "['targets'][0]['coords'][0]",
        "['targets'][0]['coords'][1]",
        "['targets'][0]['labels'][0]",
    ]
    rebuilt = spec.unflatten([5, 6, 7])["targets"][0]
    assert (rebuilt.coords, rebuilt.labels, rebuilt.fmt) == ([5, 6], [7], "xyxy")
    assert spec != pk.structure({"targets": [Boxes([1, 2], [3], "cxcy")]})


class Named:
    """optree's triple: (children, aux, entries); the entries may change."""

    def __init__(self, values, names, aux=None):
        self.values, self.names, self.aux = list(values), names, aux

    def __tree_flatten__(self):
        return self.values, self.aux, self.names

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        assert type(children) is tuple  # a tuple, as optree passes it
        return cls(children, ("rebuilt",) * len(children), aux)


@pytest.mark.parametrize("by_rule", [False, True])
def test_entries_name_the_paths_and_travel_in_the_spec(by_rule):
    rules = None
    if by_rule:

        def flatten(n):
            return tuple(n.values), n.aux, None if n.names is None else list(n.names)

        rules = {Named: pk.Rule(flatten, Named.__tree_unflatten__)}
    tree = {"t": [Named([1, [2]], ("lo", 0), aux="m")]}
    pairs, spec = pk.flatten_with_path(tree, rules=rules)
    assert [pk.keystr(p) for p, _ in pairs] == ["['t'][0]['lo']", "['t'][0][0][0]"]
    assert spec.paths() == [p for p, _ in pairs]
    assert pk.tree_get(tree, "['t'][0][0][0]", rules=rules) == 2
    rebuilt = spec.unflatten(["a", "b"])["t"][0]
    assert (rebuilt.values, rebuilt.aux) == (["a", ["b"]], "m")
    assert spec.flatten_up_to(tree) == [1, 2]
    # the entries are part of the spec: other entries, or none, are another structure
    for names, theirs in ((("lo", 1), "entries ['lo', 1]"), (None, "2 children")):
        other = {"t": [Named([1, [2]], names, aux="m")]}
        assert pk.structure(other, rules=rules) != spec
        how = "a rule" if by_rule else "__tree_flatten__"
        message = (
            f"tree['t'][0]: structure mismatch: the spec has Named (by {how}, aux='m') with "
            f"children with entries ['lo', 0], the tree has Named (by {how}, aux='m') with "
        )
        with pytest.raises(ValueError, match=re.escape(message) + ".*" + re.escape(theirs)):
            spec.flatten_up_to(other)


def test_protocol_takes_precedence_over_dataclass():
    leaves, spec = pk.flatten(ProtocolWins(1, 2))
    assert leaves == [2] and spec.unflatten([9]) == ProtocolWins(1, 9)


def test_rule_handles_a_class_the_caller_cannot_edit_and_travels_in_the_spec():
    tree = {"o": Opaque([1, (2, 3)], scale=4)}
    leaves, spec = pk.flatten(tree, rules=RULES)
    assert leaves == [1, 2, 3]
    rebuilt = pk.unflatten(spec, ["a", "b", "c"])  # no rules needed to unflatten
    assert rebuilt["o"].items == ["a", ("b", "c")] and rebuilt["o"].scale == 4
    assert pk.leaves(tree) == [tree["o"]]  # without the rule it is a leaf


def test_rule_applies_to_the_exact_type_and_overrides_builtins():
    class Sub(Opaque):
        pass

    assert pk.leaves([Sub([1], 0)], rules=RULES)[0].__class__ is Sub
    reverse = {list: pk.Rule(lambda x: (x[::-1], None), lambda aux, ch: list(ch[::-1]))}
    leaves, spec = pk.flatten([1, 2, 3], rules=reverse)
    assert leaves == [3, 2, 1] and spec.unflatten([3, 2, 1]) == [1, 2, 3]


def test_rules_are_local_to_a_call():
    tree = [Opaque([1], 0)]
    pk.flatten(tree, rules=RULES)
    assert pk.leaves(tree) == tree


def test_is_leaf_stops_recursion_and_is_asked_first():
    seen = []

    def is_leaf(x):
        seen.append(type(x).__name__)
        return isinstance(x, tuple)

    leaves, spec = pk.flatten({"a": (1, 2), "b": [3, None]}, is_leaf=is_leaf)
    assert leaves == [(1, 2), 3]
    assert "NoneType" in seen and "dict" in seen
    assert pk.leaves([None], is_leaf=lambda x: x is None) == [None]
    assert pk.leaves([Opaque([1], 0)], is_leaf=lambda x: isinstance(x, Opaque), rules=RULES)[
        0
    ].items == [1]


def test_shared_subtree_is_not_a_cycle():
    shared = [1, {"x": 2}]
    leaves, spec = pk.flatten({"a": shared, "b": shared, "c": (shared,)})
    assert leaves == [1, 2, 1, 2, 1, 2]


# -- no registry -----------------------------------------------------------------


def test_there_is_no_registry_and_no_register_function():
    assert not [n for n in dir(pk) if "regist" in n.lower()]


# What importing a peer and registering with its registry looks like; each runs
# where that peer is installed (torch only on the Python its wheel is for).
_REGISTER = {
    "torch": (
        "import torch.utils._pytree as tp\n"
        "tp.register_pytree_node(D, lambda d: ([], None), lambda c, a: D(0))\n"
    ),
    "optree": (
        "import optree\n"
        "optree.register_pytree_node(D, lambda d: ((), None), lambda a, c: D(0), namespace='x')\n"
    ),
    "jax": (
        "import jax\n"
        "jax.tree_util.register_pytree_node(D, lambda d: ((), None), lambda a, c: D(0))\n"
    ),
    "tree": "import tree\n",
    "attrs": "import attrs\n",
}


def _registering(modules: list) -> str:
    """A program that flattens, imports the modules (registering a class with
    each registry), and flattens again: the same structure."""
    return (
        "import dataclasses, pytree_kit as pk\n"
        "@dataclasses.dataclass\nclass D:\n    x: object\n"
        "before = pk.structure([D(1), {'a': None}])\n"
        "import json, collections  # noqa\n"
        + "".join(_REGISTER[m] for m in modules)
        + "after = pk.structure([D(1), {'a': None}])\n"
        "assert before == after and after.num_leaves == 1, (before, after)\n"
    )


@pytest.mark.parametrize("module", sorted(_REGISTER))
def test_importing_a_module_never_changes_flattening(module):
    """Each peer alone, in a fresh process; it skips where the peer is not
    installed (the test extra installs each one that has a wheel for this
    Python: optree and jax on every supported one, dm-tree up to 3.14,
    tests/test_packaging.py checks; torch only on the one its wheel is for)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{'dm-tree (tree)' if module == 'tree' else module} is not installed")
    subprocess.run([sys.executable, "-c", _registering([module])], check=True, timeout=120)


def test_importing_every_installed_peer_never_changes_flattening():
    """Every installed one in one process, each registering after the others."""
    present = [m for m in _REGISTER if importlib.util.find_spec(m) is not None]
    if not set(present) - {"attrs"}:  # attrs registers nothing: a peer is needed
        pytest.skip("none of torch, optree, jax and dm-tree is installed")
    subprocess.run([sys.executable, "-c", _registering(present)], check=True, timeout=120)


def test_engine_is_named():
    assert pk.ENGINE in ("python", "c")


def test_spec_repr_reads_like_the_tree():
    P = collections.namedtuple("P", "x y")
    spec = pk.structure(
        {
            "a": [1, (2,), None],
            "b": P(1, 2),
            "c": WithStatic(1),
            "d": deque([1], maxlen=2),
            "e": OrderedDict(z=1),
            "f": Boxes(1, 2),
        }
    )
    assert repr(spec) == (
        "TreeSpec({'a': [*, (*,), None], 'b': P(x=*, y=*), 'c': WithStatic(data=*, mode='train'), "
        "'d': deque([*], maxlen=2), 'e': OrderedDict({'z': *}), "
        "'f': Boxes({'coords': *, 'labels': *}, aux='xyxy')})"
    )


@dataclasses.dataclass
class _Delegating:
    """A dataclass whose class answers unknown attributes: not a plain record."""

    x: Any
    y: Any = 0

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


class _Fallback:
    def __getattr__(self, name: str) -> Any:
        return "from elsewhere"


@attrs.define
class _AttrsFallback(_Fallback):
    p: Any


@dataclasses.dataclass(frozen=True)
class _Frozen:  # a generated __setattr__ is fine: the rebuild does not call it
    x: Any


@pytest.mark.parametrize("call", [pk.flatten, pk.leaves, pk.flatten_with_path, pk.structure])
def test_a_record_whose_class_defines_getattr_is_refused_with_the_rule_that_fixes_it(call):
    with pytest.raises(TypeError) as e:
        call({"a": [_Delegating(1, 2)]})
    message = str(e.value)
    assert message.startswith(
        "tree['a'][0]: _Delegating is a dataclass whose class defines __getattr__"
    )
    fix = message.split("; pass ", 1)[1]
    assert fix == (
        "rules={_Delegating: pytree_kit.Rule(lambda o: ([o.x, o.y], None), "
        "lambda _, ch: _Delegating(x=ch[0], y=ch[1]))}"
    )
    # the rule the message gives works, written out
    rules = {
        _Delegating: pk.Rule(
            lambda o: ([o.x, o.y], None), lambda _, ch: _Delegating(x=ch[0], y=ch[1])
        )
    }
    leaves, spec = pk.flatten({"a": [_Delegating(1, 2)]}, rules=rules)
    assert leaves == [1, 2] and spec.unflatten([3, 4])["a"][0] == _Delegating(3, 4)


def test_an_inherited_getattr_counts_and_a_frozen_dataclass_does_not():
    with pytest.raises(TypeError, match=r"^tree: _AttrsFallback is an attrs class whose class"):
        pk.flatten(_AttrsFallback(1))
    leaves, spec = pk.flatten(_Frozen(5))
    assert leaves == [5] and spec.unflatten([6]) == _Frozen(6)


def test_a_rule_for_such_a_record_works_in_flatten_up_to():
    spec = pk.structure(_Frozen(1))
    with pytest.raises(ValueError):
        spec.flatten_up_to(_Delegating(1))  # another class: a mismatch, as before
    rules = {_Delegating: pk.Rule(lambda o: ([o.x, o.y], None), lambda _, ch: _Delegating(*ch))}
    spec = pk.structure([_Delegating(1)], rules=rules)
    assert spec.flatten_up_to([_Delegating(7)]) == [7, 0]


@attrs.define
class _AttrsGetattribute:
    """An attrs class whose own __getattribute__ answers for a field."""

    p: Any

    def __getattribute__(self, name: str) -> Any:
        v = object.__getattribute__(self, name)
        return ("seen", v) if name == "p" else v


@dataclasses.dataclass
class _Counting:
    """A dataclass whose __setattr__ keeps state a rebuild would skip."""

    x: Any

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, "writes", getattr(self, "writes", 0) + 1)
        object.__setattr__(self, name, value)


class _FrozenWithHook(_Frozen):
    """Not decorated: the __setattr__ is this class's, not dataclasses'."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class _SetattrMeta(type):
    def __setattr__(cls, name: str, value: Any) -> None:  # the class's, not instances'
        type.__setattr__(cls, name, value)


@dataclasses.dataclass
class _WithMeta(metaclass=_SetattrMeta):
    x: Any


@attrs.frozen
class _AttrsFrozen:
    p: Any


@attrs.define
class _AttrsValidated:
    """attrs writes a __setattr__ that runs the validator on assignment."""

    p: Any = attrs.field(validator=attrs.validators.instance_of(int))


@pytest.mark.parametrize(
    ("obj", "hook"),
    [
        (_AttrsGetattribute(1), "__getattribute__"),
        (_Counting(1), "__setattr__"),
        (_FrozenWithHook(1), "__setattr__"),
    ],
)
def test_a_record_whose_class_customises_attribute_access_is_refused(obj, hook):
    name = type(obj).__name__
    what = "an attrs class" if attrs.has(type(obj)) else "a dataclass"
    with pytest.raises(TypeError) as e:
        pk.leaves({"k": [obj]})
    message = str(e.value)
    assert message.startswith(f"tree['k'][0]: {name} is {what} whose class defines {hook}, ")
    field = "p" if attrs.has(type(obj)) else "x"
    assert message.endswith(
        f"pass rules={{{name}: pytree_kit.Rule(lambda o: ([o.{field}], None), "
        f"lambda _, ch: {name}({field}=ch[0]))}}"
    )
    assert "pytree_kit does not guess" in message


def test_setattr_that_dataclasses_or_attrs_wrote_is_a_plain_record():
    # frozen dataclasses and attrs classes, attrs' on_setattr hooks, a metaclass's
    # __setattr__ (for the class's own attributes), a dict dataclass (ModelOutput)
    for obj, again in [
        (_Frozen(5), _Frozen(6)),
        (_AttrsFrozen(5), _AttrsFrozen(6)),
        (_AttrsValidated(5), _AttrsValidated(6)),
        (_WithMeta(5), _WithMeta(6)),
    ]:
        leaves, spec = pk.flatten(obj)
        assert leaves == [5] and spec.unflatten([6]) == again


# -- state outside the fields ---------------------------------------------------


@dataclasses.dataclass
class _Derived:
    """Keeps a value computed in __post_init__: state outside its fields."""

    x: Any
    y: Any = 0

    def __post_init__(self) -> None:
        self.total = [self.x, self.y]


@dataclasses.dataclass
class _Cached:
    x: Any

    @functools.cached_property
    def double(self) -> Any:
        return [self.x, self.x]


@dataclasses.dataclass(slots=True)
class _SlotRecord:
    x: Any


class _MoreSlots(_SlotRecord):
    __slots__ = ("note",)


@attrs.define
class _AttrsCached:
    """attrs keeps a cached_property of a slotted class in a slot, with a
    __getattr__ it writes to compute it."""

    p: Any

    @functools.cached_property
    def twice(self) -> Any:
        return [self.p, self.p]


@attrs.define
class _AttrsCachedOwnGetattr:
    p: Any

    @functools.cached_property
    def twice(self) -> Any:
        return [self.p, self.p]

    def __getattr__(self, name: str) -> Any:  # chained by attrs' own: a real hook
        return "from elsewhere"


@dataclasses.dataclass
class _Listy(list):
    """A dataclass that is a list: the items are not fields."""

    x: Any


@dataclasses.dataclass
class _Failure(Exception):
    code: Any


@pytest.mark.parametrize(
    "call",
    [
        pk.flatten,
        pk.leaves,
        pk.flatten_with_path,
        pk.structure,
        lambda t: pk.tree_map(lambda v: v, t),
        lambda t: pk.structure({"a": [_Derived.__new__(_Derived)]}).flatten_up_to(t),
    ],
)
def test_a_record_that_keeps_state_outside_its_fields_is_refused(call):
    tree = {"a": [_Derived(1, 2)]}
    with pytest.raises(TypeError) as e:
        call(tree)
    message = str(e.value)
    assert message.startswith(
        "tree['a'][0]: _Derived is a dataclass whose instance keeps state outside its "
        "fields ('total'), which an object rebuilt from the fields would not have "
        "(pytree_kit does not guess); pass rules={_Derived: pytree_kit.Rule("
    )
    assert tree["a"][0].total == [1, 2] and list(vars(tree["a"][0])) == ["x", "y", "total"]
    # the rule it gives calls the constructor, which computes the state again
    rules = {_Derived: pk.Rule(lambda o: ([o.x, o.y], None), lambda _, ch: _Derived(*ch))}
    leaves, spec = pk.flatten(tree, rules=rules)
    assert leaves == [1, 2] and spec.unflatten([3, 4])["a"][0].total == [3, 4]


def test_state_added_to_an_instance_later_is_refused_and_fields_alone_are_not():
    plain = _Frozen(1)
    assert pk.leaves(plain) == [1]
    object.__setattr__(plain, "note", "seen")
    with pytest.raises(TypeError, match=r"^tree: _Frozen .* outside its fields \('note'\)"):
        pk.leaves(plain)
    # a field deleted and another attribute holding its class default
    d = _Derived(1)
    del d.y, d.total
    assert pk.leaves(d) == [1, 0]  # y reads the class's default
    d.other = 0
    with pytest.raises(TypeError, match=r"outside its fields \('other'\)"):
        pk.leaves(d)
    many = _Frozen(1)
    for i in range(7):
        object.__setattr__(many, f"a{i}", i)
    with pytest.raises(TypeError, match=r"\('a0', 'a1', 'a2', 'a3', 'a4', \.\.\.\)"):
        pk.leaves(many)


def test_cached_property_values_are_not_state():
    c = _Cached("v")
    assert c.double == ["v", "v"]  # now in c.__dict__
    leaves, spec = pk.flatten(c)
    assert leaves == ["v"] and spec == pk.structure(_Cached("w"))
    rebuilt = spec.unflatten([7])
    assert "double" not in vars(rebuilt) and rebuilt.double == [7, 7]
    a = _AttrsCached(2)
    assert pk.leaves(a) == [2]
    assert a.twice == [2, 2]  # now in its slot
    leaves, spec = pk.flatten(a)
    assert leaves == [2] and spec.unflatten([3]).twice == [3, 3]
    with pytest.raises(TypeError, match="whose class defines __getattr__"):
        pk.leaves(_AttrsCachedOwnGetattr(1))


def test_slots_beyond_the_fields_are_state_when_set():
    s = _MoreSlots(1)
    assert pk.leaves(s) == [1] and type(pk.structure(s).unflatten([2])) is _MoreSlots
    s.note = "kept"
    with pytest.raises(TypeError, match=r"^tree: _MoreSlots .* outside its fields \('note'\)"):
        pk.flatten([s][0])


def test_a_record_deriving_from_a_builtin_with_state_is_refused():
    with pytest.raises(
        TypeError, match=r"^tree: _Listy is a dataclass whose class derives from list"
    ):
        pk.leaves(_Listy(1))
    with pytest.raises(TypeError, match="whose class derives from Exception, whose own state"):
        pk.leaves([_Failure(3)])


@pytest.mark.parametrize(
    "again",
    [
        lambda o: copy.copy(o),
        lambda o: pickle.loads(pickle.dumps(o)),
        lambda o: (getattr(o, "__dict__", None), o)[1],  # a __dict__ made for the instance
    ],
)
def test_records_given_a_dict_by_copy_pickle_or_vars_are_still_plain(again):
    for obj in (_Frozen("v"), _Cached("v"), _AttrsFrozen("v")):
        other = again(obj)
        assert pk.leaves(other) == ["v"] and pk.structure(other) == pk.structure(obj)
    odd = again(_Derived(1))
    with pytest.raises(TypeError, match="outside its fields"):
        pk.leaves(odd)


def test_dict_dataclass_entry_that_is_an_equal_tuple_of_the_same_items_is_its_field():
    """An entry that is another tuple of the very items of its field's tuple is
    the same value (tuples are immutable): accepted, and rebuilt with the
    field's; a tuple of other items, even equal ones, is refused. torch.compile
    cannot trace ``is`` between tuples, so the check compares their items."""
    a, b = object(), [object()]
    out = ModelOutput(logits=a, hidden=(b, (a,)))
    OrderedDict.__setitem__(out, "hidden", (b, (a,)))  # a new tuple, the same items
    leaves, spec = pk.flatten([out])
    assert leaves[0] is a and leaves[1] is b[0] and leaves[2] is a
    rebuilt = pk.unflatten(spec, leaves)[0]
    assert rebuilt["hidden"] is rebuilt.hidden
    for other in ((b, (object(),)), (list(b), (a,)), (b,), (b, [a])):
        OrderedDict.__setitem__(out, "hidden", other)
        with pytest.raises(
            TypeError, match=r"tree\[0\]: ModelOutput is a dict whose entry 'hidden'"
        ):
            pk.flatten([out])
