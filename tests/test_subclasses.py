"""Subclasses of the builtin containers: the ``mapping`` kind (dict,
OrderedDict, defaultdict and Counter subclasses, ``UserDict`` and its
subclasses) and the ``sequence`` kind (tuple and list subclasses that are no
namedtuples, ``UserList``), as docs/design.md's rebuild rule has them: the
items are the children, the class is in the spec, and the rebuild is the
class's builtin base's ``__new__``, the instance's own attributes, then the
items through the base's own ``__setitem__``: never the class's ``__new__``,
``__init__`` or ``__setitem__``.

The suite runs on both engines (``PYTREE_KIT_PURE=1``); tests/test_engines.py
compares them on generated trees of these kinds (scripts/corpus/trees.py)."""

from __future__ import annotations

import collections
import collections.abc
import copy
import enum
import functools
import pickle
from collections import Counter, OrderedDict, UserDict, UserList, deque
from typing import Any

import pytest

import pytree_kit as pk
from scripts.corpus.trees import (
    Batch,
    Counts,
    Encoded,
    Items,
    Mirrored,
    Ordered,
    Row,
    Rows,
    SlotDict,
    assert_same_tree,
    snapshot,
)


def round_trip(tree: Any, **kw: Any) -> tuple[list, pk.TreeSpec, Any]:
    before = snapshot(tree)
    leaves, spec = pk.flatten(tree, **kw)
    rebuilt = pk.unflatten(spec, leaves)
    assert_same_tree(rebuilt, tree)
    assert snapshot(tree) == before  # nothing the caller passed is mutated
    return leaves, spec, rebuilt


def batch(**items: Any) -> Batch:
    out = Batch(items)
    out.tag = "train"
    return out


# -- dict subclasses ------------------------------------------------------------


def test_a_dict_subclass_is_a_mapping_of_its_items_in_dict_order():
    tree = batch(b=1, a=2, c=3)
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [2, 1, 3]  # sorted keys, as a dict's
    assert spec.kind == "mapping" and spec.type is Batch and spec.entries() == ["a", "b", "c"]
    assert type(rebuilt) is Batch and rebuilt is not tree
    assert list(rebuilt) == ["b", "a", "c"]  # its insertion order
    assert rebuilt.tag == "train"
    paths = [pk.keystr(p) for p, _ in pk.flatten_with_path({"batch": tree})[0]]
    assert paths == ["['batch']['a']", "['batch']['b']", "['batch']['c']"]
    assert repr(spec) == "TreeSpec(Batch({'a': *, 'b': *, 'c': *}))"


def test_specs_compare_by_structure_not_by_what_an_instance_carries():
    one, other = batch(a=1, b=2), batch(b=5, a=6)
    other.tag = "eval"
    other.extra = [1, 2]
    s1, s2 = pk.structure(one), pk.structure(other)
    # equal (attributes and insertion order are no structure), with equal hashes ...
    assert s1 == s2 and hash(s1) == hash(s2)
    # ... and each rebuilds its own instance's attributes and order
    assert vars(s1.unflatten([0, 0])) == {"tag": "train"}
    rebuilt = s2.unflatten([0, 0])
    assert list(rebuilt) == ["b", "a"] and rebuilt.extra is other.extra
    # the class and the keys are structure
    assert pk.structure(batch(a=1)) != pk.structure(batch(a=1, b=2))
    assert pk.structure(batch(a=1)) != pk.structure({"a": 1})
    assert pk.structure(Batch(a=1)) != pk.structure(Items([1]))


def test_the_rebuild_calls_neither_new_init_nor_setitem():
    calls = []

    class Strict(dict):
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            calls.append("new")
            return super().__new__(cls)

        def __init__(self, data: dict, name: str) -> None:  # a required argument
            calls.append("init")
            super().__init__(data)
            self.name = name

    tree = Strict({"x": 1, "y": 2}, "s")
    calls.clear()
    rebuilt = pk.tree_map(lambda v: v * 10, tree)
    assert calls == []
    assert type(rebuilt) is Strict and rebuilt == {"x": 10, "y": 20} and rebuilt.name == "s"
    # leaves need not satisfy the class: a validating __setitem__ is not asked
    shapes = pk.tree_map(str, batch(a=1))
    assert shapes == {"a": "1"}


def test_attributes_are_kept_by_reference_and_cached_properties_are_recomputed():
    class Cached(dict):
        @functools.cached_property
        def total(self) -> int:
            return sum(self.values())

    tree = Cached(a=1, b=2)
    tree.meta = {"source": "disk"}
    assert tree.total == 3  # cached in the instance's __dict__
    rebuilt = pk.tree_map(lambda v: v * 10, tree)
    assert rebuilt.meta is tree.meta  # as copy.copy keeps it
    assert "total" not in vars(rebuilt) and rebuilt.total == 30
    assert list(vars(tree)) == ["meta", "total"]


def test_an_ordereddict_subclass_keeps_its_order_as_structure():
    tree = Ordered([("b", 1), ("a", 2)])
    tree.move_to_end("b")  # its linked order, not its dict's
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [2, 1] and list(rebuilt) == ["a", "b"]
    assert spec != pk.structure(Ordered([("b", 0), ("a", 0)]))
    assert pk.structure(Ordered(a=1)) != pk.structure(OrderedDict(a=1))


def test_a_defaultdict_subclass_keeps_its_factory():
    tree = Counts(list, {"b": [1], "a": [2]})
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [2, 1] and rebuilt.default_factory is list
    assert rebuilt["new"] == [] and "new" not in tree
    assert spec != pk.structure(Counts(set, {"b": [1], "a": [2]}))
    with pytest.raises(TypeError, match=r"Counts \(its default_factory\)"):
        pk.flatten(Counts(_Unhashable(), {"a": 1}))


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __call__(self) -> Any:
        return 0


class _Liar(dict):
    """A dict whose own reading methods disagree with what it stores."""

    def __iter__(self) -> Any:
        return iter(["ghost"])

    def keys(self) -> Any:
        return ["ghost"]

    def values(self) -> Any:
        return [0]

    def items(self) -> Any:
        return [("ghost", 0)]

    def __getitem__(self, key: Any) -> Any:
        return 0

    def __len__(self) -> int:
        return 1


class _OrderedLiar(collections.OrderedDict):
    def items(self) -> Any:
        return [("ghost", 0)]

    def keys(self) -> Any:
        return ["ghost"]


def test_the_items_are_read_from_the_storage_whatever_the_class_says():
    for tree in (_Liar(b=1, a=2), _OrderedLiar([("b", 1), ("a", 2)])):
        leaves, spec = pk.flatten(tree)
        assert sorted(leaves) == [1, 2] and sorted(spec.entries()) == ["a", "b"], type(tree)
        rebuilt = pk.tree_map(lambda v: v * 10, tree)
        assert sorted(dict.items(rebuilt)) == [("a", 20), ("b", 10)]
        assert pk.structure(tree).flatten_up_to(tree) == leaves


class _Plain(collections.abc.MutableMapping):
    """A mapping of the layout of UserDict's, which is no UserDict."""

    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __delitem__(self, key: Any) -> None:
        pass

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_a_class_whose_bases_change_is_read_anew():
    class Changing(UserDict):
        pass

    tree = Changing({"a": 1})
    assert pk.leaves([tree]) == [1]
    Changing.__bases__ = (_Plain,)  # no longer a UserDict: a leaf
    assert pk.leaves([tree]) == [tree]


def test_a_counter_is_a_mapping_of_its_counts():
    counts = Counter("abca")
    leaves, spec, rebuilt = round_trip(counts)
    assert leaves == [2, 1, 1] and type(rebuilt) is Counter
    assert pk.tree_map(lambda n: n * 2, counts) == Counter({"a": 4, "b": 2, "c": 2})


def test_a_userdict_is_a_mapping_of_its_data():
    tree = Encoded({"input_ids": [1, 2], "mask": [1, 1]})
    tree._n = 1
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [1, 2, 1, 1]
    assert type(rebuilt) is Encoded and rebuilt._n == 1 and rebuilt.data is not tree.data
    assert list(vars(rebuilt)) == ["data", "_n"]  # its data where it was
    assert rebuilt.input_ids == [1, 2]  # the class's own __getattr__ still reads it
    plain = UserDict({"x": 1})
    assert pk.tree_map(lambda v: v + 1, plain).data == {"x": 2}
    assert pk.leaves([plain]) == [1]


@pytest.mark.parametrize("data", ["absent", OrderedDict(a=1), [1]])
def test_a_userdict_whose_data_is_no_dict_is_refused(data: Any):
    class Odd(UserDict):
        pass

    tree = Odd()
    if data == "absent":
        del tree.data
    else:
        tree.data = data
    with pytest.raises(TypeError) as e:
        pk.flatten({"x": [tree]})
    held = "no data" if data == "absent" else f"data of type {type(data).__qualname__}"
    assert str(e.value).startswith(
        f"tree['x'][0]: {Odd.__qualname__} is a UserDict with {held}, not a dict, so "
        "pytree_kit cannot read or rebuild its items (it does not guess); pass rules={"
    )
    assert ": pytree_kit.Rule.LEAF} to keep it whole" in str(e.value)


def test_items_mirrored_as_attributes_follow_the_new_items():
    tree = Mirrored()
    tree["z"] = 1
    tree["y"] = 2
    assert vars(tree) == {"z": 1, "y": 2}
    rebuilt = pk.tree_map(lambda v: v * 100, tree)
    assert list(rebuilt) == ["z", "y"] and vars(rebuilt) == {"z": 100, "y": 200}
    # an attribute of an item's name that is another object is kept as it is
    other = Batch(a=1)
    other.a = "not the item"
    assert pk.tree_map(lambda v: v + 1, other).a == "not the item"


def test_slots_are_kept_and_an_unset_slot_stays_unset():
    tree = SlotDict(k=1)
    assert not hasattr(pk.tree_map(lambda v: v, tree), "meta")
    tree.meta = ("m",)
    rebuilt = pk.tree_map(lambda v: v + 1, tree)
    assert rebuilt == {"k": 2} and rebuilt.meta is tree.meta


def test_a_class_that_sets_its_items_its_own_way_and_keeps_attributes_is_refused():
    class Indexed(dict):
        """Keeps an index of its keys that its own __setitem__ maintains."""

        def __init__(self, **items: Any) -> None:
            super().__init__()
            self.index: list = []
            for k, v in items.items():
                self[k] = v

        def __setitem__(self, key: Any, value: Any) -> None:
            if key not in self:
                self.index.append(key)
            super().__setitem__(key, value)

    tree = Indexed(a=1)
    for call in (pk.flatten, pk.leaves, lambda t: pk.tree_map(str, t)):
        with pytest.raises(TypeError) as e:
            call([tree])
        assert str(e.value).startswith(
            f"tree[0]: {Indexed.__qualname__} is a dict whose class defines its own "
            "__setitem__ and whose instance keeps attributes beside its items ('index'), "
            "which may follow the items"
        )
    # the way out the message gives
    rule = pk.Rule(lambda d: (dict(d), None), lambda _, ch: Indexed(**ch))
    rebuilt = pk.tree_map(lambda v: v + 1, tree, rules={Indexed: rule})
    assert rebuilt == {"a": 2} and rebuilt.index == ["a"]

    # with no attributes (an immutable dict), or its own __setitem__ only, it is a node
    class Frozen(dict):
        def __setitem__(self, key: Any, value: Any) -> None:
            raise TypeError("frozen")

    assert pk.tree_map(lambda v: v + 1, Frozen(a=1)) == {"a": 2}


def test_is_leaf_keeps_any_of_them_whole_and_a_rule_for_the_class_wins():
    tree = batch(a=1, b=2)
    assert pk.leaves([tree], is_leaf=lambda x: type(x) is Batch) == [tree]
    # a rule for the exact class flattens it as the rule says (here: its "a" alone)
    only_a = pk.Rule(lambda b: ([b["a"]], b["b"]), lambda b, ch: Batch(a=ch[0], b=b))
    leaves, spec = pk.flatten([tree], rules={Batch: only_a})
    assert leaves == [1] and spec.children()[0].kind == "rule"
    assert spec.unflatten([5])[0] == {"a": 5, "b": 2}

    # the protocol wins as well
    class Own(dict):
        def __tree_flatten__(self) -> tuple:
            return (), None

        @classmethod
        def __tree_unflatten__(cls, aux: Any, children: Any) -> Own:
            return cls()

    assert pk.structure(Own(a=1)).kind == "custom"


# -- sequences --------------------------------------------------------------------


def test_a_tuple_subclass_is_a_sequence_rebuilt_without_its_new():
    tree = Row(1, 2)
    tree.tag = "r"
    leaves, spec, rebuilt = round_trip(tree)
    assert leaves == [1, 2] and spec.kind == "sequence" and spec.entries() == [0, 1]
    assert type(rebuilt) is Row and rebuilt.tag == "r"
    assert [pk.keystr(p) for p, _ in pk.flatten_with_path(tree)[0]] == ["[0]", "[1]"]
    assert pk.structure(Row(1, 2)) != pk.structure((1, 2))
    assert pk.structure(Row(1, 2)) != pk.structure(Row(1, 2, 3))


def test_a_list_subclass_and_a_userlist_are_sequences():
    for tree in (Items([1, [2]]), Rows([1, [2]]), UserList([1, [2]])):
        leaves, spec, rebuilt = round_trip(tree)
        assert leaves == [1, 2] and type(rebuilt) is type(tree)
    rebuilt = pk.tree_map(lambda v: v, Rows([1]))
    assert list(vars(rebuilt)) == ["data"]


def test_a_list_subclass_that_appends_its_own_way_with_attributes_is_refused():
    class Tracked(list):
        def append(self, x: Any) -> None:
            self.count += 1
            super().append(x)

    tree = Tracked([1])
    tree.count = 1
    with pytest.raises(TypeError, match=r"defines its own append and whose instance keeps"):
        pk.flatten(tree)


class Color(tuple, enum.Enum):
    RED = (1, 0, 0)


def test_what_stays_a_leaf():
    nt = collections.namedtuple("NT", "a b")

    class Longer(nt):  # a namedtuple with more items than fields
        def __new__(cls) -> Any:
            return tuple.__new__(cls, (1, 2, 3))

    class DequeSub(deque):
        pass

    for leaf in (Color.RED, Longer(), DequeSub([1])):
        assert pk.leaves([leaf])[0] is leaf
    # a subclass a C extension made is a leaf: os.stat_result is a structseq, and
    # a builtin type's subclass that no class statement made, such as torch.Size
    assert pk.structure(pk.structure([1])).is_leaf()


# -- the operations ---------------------------------------------------------------


def test_flatten_up_to_and_tree_map_of_two_trees_match_the_structure():
    one, two = batch(a=1, b=2), batch(b=20, a=10)
    assert pk.tree_map(lambda x, y: x + y, one, two) == {"a": 11, "b": 22}
    with pytest.raises(ValueError) as e:
        pk.tree_map(lambda x, y: x, {"k": one}, {"k": Batch(a=1)})
    assert str(e.value) == (
        "tree['k']: structure mismatch: the first tree has Batch (a dict) with keys "
        "['a', 'b'], rest[0] has Batch (a dict) with keys ['a']"
    )
    with pytest.raises(ValueError, match=r"has Row \(a tuple\) of 2, the tree has a tuple of 2"):
        pk.structure(Row(1, 2)).flatten_up_to((1, 2))
    assert pk.structure(Ordered(a=1, b=2)).flatten_up_to(Ordered(a=3, b=4)) == [3, 4]
    with pytest.raises(ValueError):
        pk.structure(Ordered(a=1, b=2)).flatten_up_to(Ordered(b=4, a=3))


def test_tree_get_and_flatten_one_level_read_the_items():
    tree = {"enc": Encoded({"input_ids": [5, 6]})}
    assert pk.tree_get(tree, pk.parse_keystr("['enc']['input_ids'][1]")) == 6
    children, spec = pk.flatten_one_level(batch(b=1, a=2))
    assert children == [2, 1] and spec.type is Batch


def test_specs_pickle_with_what_the_instance_carries():
    tree = batch(b=1, a=2)
    tree.extra = [1, 2]
    spec = pk.structure(tree)
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec
    rebuilt = again.unflatten([3, 4])
    assert list(rebuilt) == ["b", "a"] and rebuilt.extra == [1, 2] and rebuilt.tag == "train"
    assert copy.deepcopy(spec) == spec


def test_json_round_trips_with_allow_and_checks_the_class():
    tree = {"b": batch(b=1, a=2), "r": Row(1, 2), "c": Counts(list, {"x": 1})}
    tree["r"].tag = ("r", 1)
    spec = pk.structure(tree)
    text = spec.to_json()
    with pytest.raises(ValueError, match="is not allowed; pass it in allow="):
        pk.TreeSpec.from_json(text)
    again = pk.TreeSpec.from_json(text, allow=[Batch, Row, Counts])
    assert again == spec and again.to_json() == text
    rebuilt = again.unflatten(pk.leaves(tree))
    assert_same_tree(rebuilt, tree)
    # a class that is not what the document says is refused
    with pytest.raises(ValueError, match="is not a class statement's subclass of dict"):
        pk.TreeSpec.from_json(text, allow=[_impostor(Batch), Row, Counts])


def _impostor(cls: type) -> type:
    """A class of the same name that is a UserDict."""
    names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    return type(cls.__name__, (UserDict,), names)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda n: n.update(base="list"), "'base' must be one of"),
        (lambda n: n["state"].append(["a", "mirror"]), "names 'a' twice"),
        (
            lambda n: n["state"].append(["zz", "mirror"]),
            "a mirrored attribute must be one of the keys",
        ),
        (lambda n: n["state"].append(["d", "data"]), "only a UserDict or UserList has 'data'"),
        (lambda n: n["state"].append(["s", "slot", 1]), "has no slot 's'"),
        (lambda n: n["state"].append(["q", "attr"]), "a 'state' entry must be"),
        (lambda n: n.update(order=["a", "b"]), "'order' must be another order"),
        (lambda n: n.update(default_factory=None), "'default_factory' is for a defaultdict"),
    ],
)
def test_malformed_json_of_a_mapping_is_refused(change: Any, message: str):
    import json

    tree = batch(b=1, a=2)
    tree.a = 5  # (a state entry named "a")
    doc = json.loads(pk.structure(tree).to_json())
    change(doc["nodes"][0])
    with pytest.raises(ValueError, match=message):
        pk.TreeSpec.from_json(json.dumps(doc), allow=[Batch])


def test_json_refuses_an_attribute_it_cannot_hold_naming_the_node():
    tree = batch(a=1)
    tree.handle = _Unhashable().__call__  # a bound method: no reference names it
    with pytest.raises(TypeError) as e:
        pk.structure({"x": [tree]}).to_json()
    assert str(e.value).startswith(
        "TreeSpec.to_json: the node at tree['x'][0]: Batch keeps the attribute 'handle' "
        "(a method), which the JSON of a spec cannot hold"
    )
    assert "pickle the spec instead" in str(e.value)


@pytest.mark.parametrize("kind", ["dict", "UserDict", "list", "tuple", "dataclass"])
def test_rule_leaf_keeps_a_class_whole_in_the_call_that_names_it(kind: str) -> None:
    """``rules={cls: Rule.LEAF}`` makes cls's instances leaves, on either
    engine, for every operation that takes rules (the way to keep a dict
    subclass whole where a call takes no is_leaf, as to_device and collate);
    other calls still read it as a container, and the caller's tree is left
    as it was."""
    import dataclasses

    from pytree_kit import _pure

    @dataclasses.dataclass
    class Rec:
        a: Any

    made = {
        "dict": lambda: Batch({"a": 1, "b": [2]}),
        "UserDict": lambda: Encoded({"a": 1, "b": [2]}),
        "list": lambda: Rows([1, [2]]),
        "tuple": lambda: Row(1, [2]),
        "dataclass": lambda: Rec([1, 2]),
    }[kind]
    tree = {"x": [made(), made()], "y": made(), "z": 3}
    before = snapshot(tree)
    cls = type(tree["y"])
    rules = {cls: pk.Rule.LEAF}
    engines = [_pure]
    if pk.ENGINE == "c":
        from pytree_kit import _speedups

        engines.append(_speedups)
    for engine in engines:
        leaves, spec = engine.flatten(tree, None, rules)
        assert leaves == [tree["x"][0], tree["x"][1], tree["y"], 3]
        assert all(x is y for x, y in zip(leaves[:3], (tree["x"][0], tree["x"][1], tree["y"])))
        assert spec.num_leaves == 4
        assert engine.leaves(tree, None, None) == [1, 2, 1, 2, 1, 2, 3]  # no rule: a container
        rebuilt = pk.unflatten(spec, leaves)
        assert rebuilt["y"] is tree["y"]
    paths = [pk.keystr(p) for p, _ in pk.flatten_with_path(tree, rules=rules)[0]]
    assert paths == ["['x'][0]", "['x'][1]", "['y']", "['z']"]
    assert pk.tree_map(id, tree, rules=rules)["y"] == id(tree["y"])
    assert snapshot(tree) == before


def test_rule_leaf_is_checked_and_pickles_as_itself() -> None:
    with pytest.raises(TypeError, match=r"must be a pytree_kit.Rule or pytree_kit.Rule.LEAF"):
        pk.leaves([Batch()], rules={Batch: "leaf"})
    assert pickle.loads(pickle.dumps(pk.Rule.LEAF)) is pk.Rule.LEAF
    assert repr(pk.Rule.LEAF) == "pytree_kit.Rule.LEAF"
    # a spec with a rule node cannot be read back with LEAF in the rule's place
    rule = pk.Rule(lambda b: (list(b.values()), tuple(b)), lambda keys, ch: Batch(zip(keys, ch)))
    spec = pk.structure(Batch({"a": 1}), rules={Batch: rule})
    with pytest.raises(ValueError, match="was flattened by a rule"):
        pk.TreeSpec.from_json(spec.to_json(), allow=[Batch], rules={Batch: pk.Rule.LEAF})
