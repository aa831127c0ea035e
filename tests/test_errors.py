"""Every error: a clear exception naming the place in the tree, never a crash or
a hang, and user exceptions passed through unchanged."""

from __future__ import annotations

import dataclasses
import itertools
import re
import types
from collections import OrderedDict, defaultdict, deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import pytree_kit as pk
from scripts.corpus.trees import RULES, ModelOutput, Opaque, snapshot, trees


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any = None


@dataclasses.dataclass
class Static:
    x: Any
    tag: Any = dataclasses.field(default="a", metadata={"static": True})


# -- StructureError: one class both camps catch --------------------------------


def _structure_mismatches() -> list:
    """(name, call, message start) for every public function that compares
    two structures, each given two that differ."""
    spec = pk.structure({"a": [0, 0]})
    return [
        ("flatten_up_to", lambda: spec.flatten_up_to({"a": [1, 2, 3]}),
         "tree['a']: structure mismatch: the spec has a list of 2, the tree has a list of 3"),
        ("TreeSpec.columns", lambda: spec.columns([{"a": [1, 2]}, {"a": (1, 2)}]),
         "tree['a']: structure mismatch: the spec has a list of 2, the tree has a tuple of 2"),
        ("tree_map", lambda: pk.tree_map(lambda x, y: x, {"a": 1}, {"b": 1}),
         "tree: structure mismatch: the first tree has a dict with keys ['a'], rest[0] has"),
        ("tree_map_with_path", lambda: pk.tree_map_with_path(lambda p, x, y: x, [1], [1, 2]),
         "tree: structure mismatch: the first tree has a list of 1, rest[0] has a list of 2"),
        ("assert_same_structure", lambda: pk.assert_same_structure([1, (2,)], [1, [2]]),
         "tree[1]: structure mismatch: the first tree has a tuple of 1, the second tree has"),
        ("tree_broadcast_prefix", lambda: pk.tree_broadcast_prefix([1, 2], [1, 2, 3]),
         "tree: structure mismatch: the prefix tree has a list of 2, the full tree has"),
        ("tree_transpose", lambda: pk.tree_transpose(pk.structure([0, 0]), pk.structure((0,)), [1, 2]),
         "tree_transpose: tree[0]: structure mismatch: outer_spec.compose(inner_spec) has"),
        ("tree_combine", lambda: pk.tree_combine({"a": 1}, {"a": [1]}),
         "tree_combine: tree['a']: structure mismatch: trees[0] has a leaf, trees[1] has"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "call", "start"), _structure_mismatches(), ids=[m[0] for m in _structure_mismatches()]
)
def test_every_structure_mismatch_is_a_structure_error_both_camps_catch(name, call, start):
    """jax's and optree's ``except ValueError`` and dm-tree's ``except
    TypeError`` both catch it; the message is the one it always was."""
    with pytest.raises(pk.StructureError) as e:
        call()
    assert type(e.value) is pk.StructureError
    assert str(e.value).startswith(start), (name, str(e.value))
    for camp in (ValueError, TypeError):
        try:
            call()
        except camp:
            pass
    assert pk.StructureError.__mro__[1:3] == (ValueError, TypeError)
    assert pk.StructureError.__module__ == "pytree_kit"


_SIDES = re.compile(
    r"^(?P<path>tree\S*): structure mismatch: (?P<a>.+?) has (?P<x>.+), (?P<b>[^,]+?) has (?P<y>.+)$"
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), trees())
def test_a_mismatch_message_always_names_a_difference(a: Any, b: Any) -> None:
    """For any two trees of different structures (every node kind, with
    rules), the message names the path and two descriptions that differ:
    never "X has a, Y has a"."""
    sa, sb = pk.structure(a, rules=RULES), pk.structure(b, rules=RULES)
    if sa == sb:
        pk.assert_same_structure(a, b, rules=RULES)
        return
    for call, labels in (
        (
            lambda: pk.assert_same_structure(a, b, rules=RULES),
            ("the first tree", "the second tree"),
        ),
        (lambda: sa.flatten_up_to(b), ("the spec", "the tree")),
    ):
        try:
            call()
        except pk.StructureError as e:
            found = _SIDES.match(str(e))
            assert found is not None, str(e)
            assert (found["a"], found["b"]) == labels, str(e)
            assert found["x"] != found["y"], str(e)
        else:  # flatten_up_to takes a subtree where the spec has a leaf
            assert call is not None and sa.is_prefix(sb), (sa, sb)


def test_other_errors_are_not_structure_errors():
    """A wrong leaf count, a bad argument, a cycle: not a structure mismatch."""
    spec = pk.structure([0, 0])
    cycle: list = []
    cycle.append(cycle)
    for call, cls in (
        (lambda: spec.unflatten([1]), ValueError),
        (lambda: pk.unflatten("not a spec", [1]), TypeError),
        (lambda: pk.flatten(cycle), ValueError),
    ):
        with pytest.raises(cls) as e:
            call()
        assert not isinstance(e.value, pk.StructureError), e.value


# -- leaves given as a str, bytes or mapping --------------------------------


@pytest.mark.parametrize(
    "value",
    ["xyz", b"xyz", bytearray(b"xyz"), {"x": 1, "y": 2, "z": 3}, types.MappingProxyType({"x": 1})],
    ids=["str", "bytes", "bytearray", "dict", "mappingproxy"],
)
def test_a_str_bytes_or_mapping_given_as_leaves_or_trees_is_a_type_error(value: Any) -> None:
    """Every way in refuses it, naming what was passed (dm-tree raises too);
    given inside a list it is one leaf, or one tree, as ever."""
    spec = pk.structure([0, 0, 0])
    name = type(value).__name__
    before = snapshot(value)
    for call in (pk.unflatten, pk.tree_unflatten, lambda s, v: s.unflatten(v)):
        with pytest.raises(
            TypeError, match=f"^unflatten: the leaves must be a list .*, not {name}: "
        ):
            call(spec, value)
    with pytest.raises(
        TypeError, match=f"^TreeSpec.columns: the trees must be a list .*, not {name}: "
    ):
        spec.columns(value)
    assert snapshot(value) == before
    assert pk.unflatten(pk.structure([0]), [value]) == [value]
    assert pk.structure([0]).columns([[value]]) == [[value]]
    # an iterator over it is the caller's own choice: its items, one by one
    assert pk.unflatten(pk.structure([0] * len(value)), iter(value)) == list(value)


# -- unflatten counts ---------------------------------------------------------


@pytest.mark.parametrize(
    ("tree", "given", "message"),
    [
        ([1, (2, 3)], 0, "unflatten: the spec has 3 leaves, but 0 were given"),
        ([1, (2, 3)], 1, "unflatten: the spec has 3 leaves, but 1 was given"),
        ([1, (2, 3)], 4, "unflatten: the spec has 3 leaves, but 4 were given"),
        ([1], 2, "unflatten: the spec has 1 leaf, but 2 were given"),
    ],
)
def test_unflatten_with_the_wrong_number_of_leaves_gives_both_counts(tree, given, message):
    spec = pk.structure(tree)
    with pytest.raises(ValueError) as e:
        spec.unflatten(range(given))
    assert str(e.value) == message


def test_unflatten_counts_a_sized_iterable():
    spec = pk.structure([1, 2])
    with pytest.raises(ValueError, match="but 5 were given"):
        pk.unflatten(spec, range(5))
    with pytest.raises(ValueError, match="but 1 was given"):
        pk.unflatten(spec, {"only"})  # a set: sized, read whole


def test_unflatten_reads_an_iterator_one_leaf_past_the_spec_and_no_further():
    spec = pk.structure([1, 2])
    gen = iter(range(5))
    with pytest.raises(ValueError) as e:
        pk.unflatten(spec, gen)
    assert str(e.value) == "unflatten: the spec has 2 leaves, but more than 2 were given"
    assert next(gen) == 3  # three were read: two leaves and the one too many
    with pytest.raises(ValueError, match="but more than 2 were given"):
        pk.unflatten(spec, itertools.count())  # endless: an error, not a hang
    with pytest.raises(ValueError, match="but 1 was given"):
        pk.unflatten(spec, iter([0]))
    assert pk.unflatten(spec, (i for i in "ab")) == ["a", "b"]


def test_unflatten_needs_a_spec():
    with pytest.raises(TypeError, match="expects a TreeSpec"):
        pk.unflatten([1, 2], [1, 2])


# -- cycles --------------------------------------------------------------------


def test_self_referencing_dict_names_the_path_where_the_cycle_closes():
    d: dict = {"x": 1}
    d["self"] = d
    with pytest.raises(ValueError, match=re.escape("tree['self']: cycle")):
        pk.flatten(d)


def test_deeper_cycle_names_both_places():
    inner: list = [0]
    outer = {"targets": [Target(boxes=inner)]}
    inner.append(outer["targets"])
    msg = "tree['targets'][0].boxes[1]: cycle: this container is the one at tree['targets']"
    for fn in (pk.flatten, pk.leaves, pk.flatten_with_path, pk.structure):
        with pytest.raises(ValueError, match=re.escape(msg)):
            fn(outer)
    with pytest.raises(ValueError, match="cycle"):
        pk.tree_map(lambda x: x, outer)


@pytest.mark.parametrize("depth", [3, 8, 9, 63, 64, 65, 120, 255, 256, 257, 700])
def test_a_cycle_is_found_at_every_depth_and_every_ancestor(depth):
    """The C engine answers "is this container on the stack" with a scan, then
    counts by address (more of them from depth 64), then a set (from 256): a
    cycle closing onto any ancestor is found at each of those depths, and
    containers that are not ancestors are never taken for one."""
    levels: list = []
    t: Any = [0]
    for i in range(depth):
        t = [t, i] if i % 2 else {"child": t, "k": i}
        levels.append(t)
    root = levels[-1]
    bottom = levels[0]  # a dict: {"child": [0], "k": 0}

    def path_to(j: int) -> str:
        return "tree" + "".join(
            "['child']" if i % 2 == 0 else "[0]" for i in range(depth - 1, j, -1)
        )

    for target in sorted({0, 1, depth // 2, depth - 2, depth - 1} & set(range(depth))):
        bottom["back"] = levels[target]
        # found where it first closes, not a lap later
        msg = f"{path_to(0)}['back']: cycle: this container is the one at {path_to(target)}, "
        for fn in (pk.flatten, pk.leaves):
            with pytest.raises(ValueError, match=re.escape(msg) + "which holds itself$"):
                fn(root)
    del bottom["back"]
    assert len(pk.leaves(root)) == depth + 1  # and no false cycle


def test_cycle_through_the_protocol_is_detected():
    class Loop:
        def __tree_flatten__(self):
            return [self], None

        @classmethod
        def __tree_unflatten__(cls, aux, children):
            return cls()

    with pytest.raises(ValueError, match=re.escape("tree[0]: cycle")):
        pk.flatten(Loop())


def test_cycle_through_a_rule_is_detected():
    o = Opaque([], 0)
    o.items.append(o)
    with pytest.raises(ValueError, match=re.escape("tree[0]: cycle")):
        pk.flatten(o, rules=RULES)


# -- structure mismatches -------------------------------------------------------


def test_tree_map_mismatch_names_the_first_differing_path_and_both_kinds():
    a = {"targets": [Target([1, 2]), Target([3])]}
    b = {"targets": [Target([1, 2]), Target((3,))]}
    with pytest.raises(ValueError) as e:
        pk.tree_map(lambda x, y: x, a, b)
    assert str(e.value) == (
        "tree['targets'][1].boxes: structure mismatch: the first tree has a list of 1, "
        "rest[0] has a tuple of 1"
    )


def test_tree_map_mismatch_in_the_second_rest_tree():
    with pytest.raises(ValueError, match=re.escape("tree: structure mismatch: the first tree has a dict with keys ['a'], rest[1] has a dict with keys ['b']")):  # fmt: skip
        pk.tree_map(lambda *xs: 0, {"a": 1}, {"a": 2}, {"b": 3})


def test_tree_map_with_path_mismatch():
    with pytest.raises(ValueError, match=re.escape("tree[0]: structure mismatch")):
        pk.tree_map_with_path(lambda p, x, y: x, [[1]], [None])


@pytest.mark.parametrize(
    ("spec_tree", "tree", "expected"),
    [
        ([1, 2], [1], "tree: structure mismatch: the spec has a list of 2, the tree has a list of 1"),
        ({"a": 1}, {"b": 1}, "the spec has a dict with keys ['a'], the tree has a dict with keys ['b']"),
        ({"a": [1]}, {"a": 1}, "tree['a']: structure mismatch: the spec has a list of 1, the tree has a leaf of type int"),
        ((None,), (1,), "tree[0]: structure mismatch: the spec has None, the tree has a leaf of type int"),
        (OrderedDict(a=1, b=2), OrderedDict(b=1, a=2), "an OrderedDict with keys ['a', 'b'], the tree has an OrderedDict with keys ['b', 'a']"),
        (defaultdict(list, a=1), defaultdict(set, a=1), "a defaultdict(list) with keys ['a'], the tree has a defaultdict(set)"),
        (deque([1], maxlen=2), deque([1]), "a deque of 1 (maxlen=2), the tree has a deque of 1 (maxlen=None)"),
        (Target(1), {"boxes": 1, "labels": None}, "the spec has dataclass Target, the tree has a dict with keys"),
        (Static(1, "a"), Static(1, "b"), "the spec has dataclass Static (static tag='a'), the tree has dataclass Static (static tag='b')"),
        (ModelOutput(logits=1, loss=2), ModelOutput(logits=1, hidden=2), "tree: structure mismatch: the spec has dataclass ModelOutput (entries ['logits', 'loss']), the tree has dataclass ModelOutput (entries ['logits', 'hidden'])"),
        ({"t": [Target(1)]}, {"t": [Target((1, 2))]}, None),
    ],
)  # fmt: skip
def test_flatten_up_to_mismatch_names_the_path(spec_tree, tree, expected):
    spec = pk.structure(spec_tree)
    if expected is None:  # a leaf of the spec takes a whole subtree
        assert spec.flatten_up_to(tree) == [(1, 2)]
        return
    with pytest.raises(ValueError, match=re.escape(expected)):
        spec.flatten_up_to(tree)


def test_flatten_up_to_protocol_and_rule_aux_mismatch():
    class P:
        def __init__(self, x, aux):
            self.x, self.aux = x, aux

        def __tree_flatten__(self):
            return (self.x,), self.aux

        @classmethod
        def __tree_unflatten__(cls, aux, children):
            return cls(children[0], aux)

    spec = pk.structure([P(1, "a")])
    with pytest.raises(ValueError, match=r"tree\[0\]: structure mismatch: the spec has \S*P \(by __tree_flatten__, aux='a'\) with 1 child, the tree has \S*P \(by __tree_flatten__, aux='b'\) with 1 child$"):  # fmt: skip
        spec.flatten_up_to([P(1, "b")])
    spec = pk.structure(Opaque([1], 0), rules=RULES)
    with pytest.raises(ValueError, match=re.escape("tree: structure mismatch: the spec has Opaque (by a rule, aux=0) with 1 child, the tree has Opaque (by a rule, aux=1) with 1 child")):  # fmt: skip
        spec.flatten_up_to(Opaque([1], 1))


# -- aux data and the protocol ---------------------------------------------------


def test_unhashable_aux_from_the_protocol_is_a_type_error_naming_the_path():
    class Bad:
        def __tree_flatten__(self):
            return (1,), ["unhashable"]

        @classmethod
        def __tree_unflatten__(cls, aux, children):
            return cls()

    msg = r"tree\['k'\]\[0\]: the aux data of \S*Bad\.__tree_flatten__ must be hashable"
    with pytest.raises(TypeError, match=msg):
        pk.flatten({"k": [Bad()]})


def test_unhashable_static_field_is_a_type_error():
    with pytest.raises(TypeError, match=re.escape("tree[1]: the aux data of Static (its static fields)")):  # fmt: skip
        pk.flatten([0, Static(1, tag=["list"])])


def test_unhashable_rule_aux_is_a_type_error():
    rules = {Opaque: pk.Rule(lambda o: ((), {}), lambda a, c: None)}
    with pytest.raises(TypeError, match="the rule for Opaque must be hashable"):
        pk.flatten(Opaque([], 0), rules=rules)


SHAPE = "must return a (children, aux) pair or a (children, aux, entries) triple, got "


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (None, SHAPE + "NoneType"),
        (((1,),), SHAPE + "a tuple of 1"),
        (((1,), None, (), 4), SHAPE + "a tuple of 4"),
        ([(1,), None], SHAPE + "list"),
        ((iter([1]), None), "must return children as a list, tuple or dict, got list_iterator"),
        ((5, None), "must return children as a list, tuple or dict, got int"),
        # optree's triple
        (({"a": 1}, None, ("a",)), "must return children as a list or tuple, got dict"),
        (((1, 2), None, ("a",)), "returned 1 entry for 2 children"),
        (((1,), None, ("a", "b")), "returned 2 entries for 1 child"),
        (((1, 2), None, "ab"), "must return entries as an iterable of keys, got str"),
        (((1, 2), None, 7), "must return entries as an iterable of keys, got int"),
    ],
)
def test_protocol_returning_the_wrong_shape_is_a_type_error(returned, message):
    class Wrong:
        def __tree_flatten__(self):
            return returned

        @classmethod
        def __tree_unflatten__(cls, aux, children):
            return cls()

    pattern = r"tree\['w'\]: \S*Wrong\.__tree_flatten__ " + re.escape(message)
    with pytest.raises(TypeError, match=pattern):
        pk.flatten({"w": Wrong()})


def _set_of_a_list_says() -> str:
    """What Python says of a list put in a set (3.14 says it in more words)."""
    try:
        set([[]])
    except TypeError as e:
        return str(e)
    raise AssertionError("a list is hashable")


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (("a", "a"), "the entries of {} must be distinct, got ['a', 'a']"),
        (([], "b"), f"the entries of {{}} must be hashable ({_set_of_a_list_says()})"),
    ],
)
@pytest.mark.parametrize("by_rule", [False, True])
def test_bad_entries_name_the_path(entries, message, by_rule):
    class Entries:
        def __tree_flatten__(self):
            return (1, 2), None, entries

        @classmethod
        def __tree_unflatten__(cls, aux, children):
            return cls()

    rules = None
    what = "Entries.__tree_flatten__"
    if by_rule:
        rules = {Entries: pk.Rule(lambda o: ((1, 2), None, entries), lambda a, c: None)}
        what = "the rule for Entries"
    pattern = r"tree\[1\]\.boxes: " + re.escape(message.format(what)).replace(
        "Entries", r"\S*Entries"
    )
    with pytest.raises(TypeError, match=pattern):
        pk.flatten([0, Target(Entries())], rules=rules)


def test_protocol_without_unflatten_is_a_type_error():
    class Half:
        def __tree_flatten__(self):
            return (), None

    with pytest.raises(TypeError, match="defines __tree_flatten__ but no classmethod __tree_unflatten__"):  # fmt: skip
        pk.flatten(Half())


@pytest.mark.parametrize(
    "rules",
    [{"list": pk.Rule(lambda x: ((), None), lambda a, c: [])}, {list: (lambda x: x)}, 5],
)
def test_bad_rules_argument_is_a_type_error(rules):
    with pytest.raises(TypeError, match="rules"):
        pk.flatten([1], rules=rules)


def test_rule_needs_callables():
    with pytest.raises(TypeError):
        pk.Rule(1, 2)


# -- user exceptions propagate unchanged ------------------------------------------


class Boom(Exception):
    pass


def test_is_leaf_exception_propagates_unchanged():
    err = Boom("from is_leaf")

    def is_leaf(x):
        raise err

    with pytest.raises(Boom) as e:
        pk.flatten([1], is_leaf=is_leaf)
    assert e.value is err


def test_protocol_exceptions_propagate_unchanged():
    err = Boom("flatten")

    class Raises:
        def __tree_flatten__(self):
            raise err

        @classmethod
        def __tree_unflatten__(cls, aux, children):
            raise Boom("unflatten")

    with pytest.raises(Boom) as e:
        pk.leaves([Raises()])
    assert e.value is err

    class Ok(Raises):
        def __tree_flatten__(self):
            return (), None

    spec = pk.structure([Ok()])
    with pytest.raises(Boom, match="unflatten"):
        spec.unflatten([])


def test_rule_exceptions_propagate_unchanged():
    rules = {Opaque: pk.Rule(lambda o: (_ for _ in ()).throw(Boom("rule")), lambda a, c: None)}
    with pytest.raises(Boom, match="rule"):
        pk.flatten(Opaque([], 0), rules=rules)


def test_dataclass_init_exception_propagates_from_a_rule_unflatten():
    @dataclasses.dataclass
    class Checked:
        n: int

        def __post_init__(self):
            if self.n < 0:
                raise Boom("negative")

    class Wrapper:
        def __init__(self, n):
            self.n = n

    rules = {Wrapper: pk.Rule(lambda w: ((w.n,), None), lambda a, c: Checked(*c))}
    spec = pk.structure(Wrapper(1), rules=rules)
    with pytest.raises(Boom, match="negative"):
        spec.unflatten([-1])


def test_tree_map_function_exception_propagates_unchanged():
    err = Boom("fn")

    def fn(x):
        raise err

    with pytest.raises(Boom) as e:
        pk.tree_map(fn, {"a": 1})
    assert e.value is err


# -- immutability and nothing mutated -----------------------------------------------


def test_spec_is_immutable_and_not_built_directly():
    spec = pk.structure([1])
    with pytest.raises(AttributeError):
        spec._nodes = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        spec.anything = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        del spec._nodes
    with pytest.raises(TypeError, match="not built directly"):
        pk.TreeSpec()


def test_errors_leave_the_input_untouched():
    d: dict = {"b": [1, 2], "a": Target([3])}
    d["a"].labels = d  # a cycle
    before = snapshot(d)
    with pytest.raises(ValueError, match="cycle"):
        pk.flatten(d)
    assert snapshot(d) == before and list(d) == ["b", "a"]


def test_mismatch_messages_tell_apart_classes_of_one_name() -> None:
    """Two namedtuples (or dataclasses) of one name: the message says how they
    differ, in assert_same_structure and in flatten_up_to / tree_map alike."""
    import collections

    P1 = collections.namedtuple("P", "x y")
    P2 = collections.namedtuple("P", "x y")
    P3 = collections.namedtuple("P", "x z")
    cases = [
        (P1(1, 2), P2(1, 2), "namedtuple P, ", "namedtuple P (another class of the same name)"),
        (
            P1(1, 2),
            P3(1, 2),
            "namedtuple P with fields ('x', 'y')",
            "namedtuple P with fields ('x', 'z')",
        ),
    ]
    for a, b, first, second in cases:
        for call, args in (
            (pk.assert_same_structure, ([a], [b])),
            (pk.structure([a]).flatten_up_to, ([b],)),
            (pk.tree_map, (max, [a], [b])),
        ):
            with pytest.raises(ValueError) as info:
                call(*args)
            text = str(info.value)
            assert text.startswith("tree[0]: structure mismatch: "), text
            assert first in text and text.endswith(second), text
    # one class on both sides, or two whose names differ: as before
    with pytest.raises(ValueError, match=r"has namedtuple P, the second tree has a tuple of 2$"):
        pk.assert_same_structure(P1(1, 2), (1, 2))
