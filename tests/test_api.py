"""Laws that hold for every tree: round trips, spec equality and hashing,
serialization, paths, flatten_up_to, tree_map. Trees come from a hypothesis
strategy covering every kind of node, nested in each other."""

from __future__ import annotations

import copy
import pickle

from hypothesis import given
from hypothesis import strategies as st

import pytree_kit as pk
from scripts.corpus.trees import ALLOW, RULES, Leaf, assert_same_tree, resolve, snapshot, trees


@given(trees())
def test_round_trip_keeps_types_order_aux_and_leaf_identity(tree):
    leaves, spec = pk.flatten(tree, rules=RULES)
    rebuilt = pk.unflatten(spec, leaves)
    assert_same_tree(rebuilt, tree)
    assert spec.num_leaves == len(leaves)


@given(trees())
def test_unflatten_with_fresh_leaves_puts_each_leaf_in_place(tree):
    leaves, spec = pk.flatten(tree, rules=RULES)
    fresh = [Leaf(i) for i in range(len(leaves))]
    rebuilt = spec.unflatten(iter(fresh))
    got, spec2 = pk.flatten(rebuilt, rules=RULES)
    assert spec2 == spec
    assert all(a is b for a, b in zip(got, fresh)) and len(got) == len(fresh)


@given(trees())
def test_leaves_and_structure_agree_with_flatten(tree):
    leaves, spec = pk.flatten(tree, rules=RULES)
    only = pk.leaves(tree, rules=RULES)
    assert len(only) == len(leaves) and all(a is b for a, b in zip(only, leaves))
    assert pk.structure(tree, rules=RULES) == spec


@given(trees(), trees())
def test_spec_equality_and_hash_laws(a, b):
    sa, sb = pk.structure(a, rules=RULES), pk.structure(b, rules=RULES)
    assert sa == sa and not (sa != sa)
    assert (sa == sb) == (sb == sa)
    assert (sa == sb) != (sa != sb)
    if sa == sb:
        assert hash(sa) == hash(sb)
        assert sa.num_leaves == sb.num_leaves and sa.num_nodes == sb.num_nodes
        assert repr(sa) == repr(sb)
    # A spec equals the spec of a tree rebuilt from it.
    rebuilt = sa.unflatten([Leaf(0)] * sa.num_leaves)
    again = pk.structure(rebuilt, rules=RULES)
    assert again == sa and hash(again) == hash(sa)
    assert sa != "not a spec"


@given(trees(), trees(), trees())
def test_spec_equality_is_transitive(a, b, c):
    sa, sb, sc = (pk.structure(t, rules=RULES) for t in (a, b, c))
    if sa == sb and sb == sc:
        assert sa == sc


@given(trees())
def test_pickle_and_copy_round_trip(tree):
    leaves, spec = pk.flatten(tree, rules=RULES)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and hash(back) == hash(spec)
    assert_same_tree(back.unflatten(leaves), tree)
    assert copy.copy(spec) is spec and copy.deepcopy(spec) is spec


@given(trees())
def test_json_round_trip(tree):
    leaves, spec = pk.flatten(tree, rules=RULES)
    text = spec.to_json()
    back = pk.TreeSpec.from_json(text, allow=ALLOW, rules=RULES)
    assert back == spec and hash(back) == hash(spec)
    assert back.to_json() == text
    assert_same_tree(back.unflatten(leaves), tree)


@given(trees())
def test_paths_reach_their_leaves(tree):
    pairs, _ = pk.flatten_with_path(tree, rules=RULES)
    leaves = pk.leaves(tree, rules=RULES)
    assert len(pairs) == len(leaves)
    assert all(x is y for (_, x), y in zip(pairs, leaves))
    for path, leaf in pairs:
        assert resolve(tree, path) is leaf, pk.keystr(path)
    assert len({p for p, _ in pairs}) == len(pairs)  # paths are distinct


@given(trees())
def test_flatten_up_to_agrees_with_flatten(tree):
    leaves, spec = pk.flatten(tree, rules=RULES)
    got = spec.flatten_up_to(tree)
    assert len(got) == len(leaves) and all(a is b for a, b in zip(got, leaves))
    other = spec.unflatten([Leaf(i) for i in range(spec.num_leaves)])
    got2 = spec.flatten_up_to(other)
    assert [x.n for x in got2] == list(range(spec.num_leaves))


@given(trees())
def test_tree_map_identity_and_with_rest(tree):
    assert_same_tree(pk.tree_map(lambda x: x, tree, rules=RULES), tree)
    leaves, spec = pk.flatten(tree, rules=RULES)
    twin = spec.unflatten([Leaf(i) for i in range(len(leaves))])
    out = pk.tree_map(lambda x, y: (x, y), tree, twin, rules=RULES)
    pairs = spec.flatten_up_to(out)
    assert all(p[0] is x and p[1].n == i for i, (p, x) in enumerate(zip(pairs, leaves)))


@given(trees())
def test_tree_map_with_path_passes_the_paths_of_flatten_with_path(tree):
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    out = pk.tree_map_with_path(lambda p, x: p, tree, rules=RULES)
    assert spec.flatten_up_to(out) == [p for p, _ in pairs]


@given(trees())
def test_children_specs_match_the_children(tree):
    spec = pk.structure(tree, rules=RULES)
    children = spec.children()
    if spec.is_leaf():
        assert children == [] and spec.num_leaves == 1
        return
    assert sum(c.num_leaves for c in children) == spec.num_leaves
    assert sum(c.num_nodes for c in children) == spec.num_nodes - 1
    if isinstance(tree, (list, tuple)) and type(tree) in (list, tuple):
        assert children == [pk.structure(c, rules=RULES) for c in tree]


@given(trees())
def test_nothing_the_caller_passed_is_mutated(tree):
    before = snapshot(tree)
    leaves, spec = pk.flatten(tree, rules=RULES)
    pk.flatten_with_path(tree, rules=RULES)
    spec.flatten_up_to(tree)
    pk.tree_map(lambda x: x, tree, rules=RULES)
    pk.unflatten(spec, leaves)
    assert snapshot(tree) == before


@given(trees(), st.data())
def test_is_leaf_stops_at_the_chosen_values(tree, data):
    candidates = pk.leaves(tree, is_leaf=lambda x: False, rules=RULES)
    stop_types = data.draw(st.sets(st.sampled_from([list, tuple, dict, type(None)])))
    leaves, spec = pk.flatten(tree, is_leaf=lambda x: type(x) in stop_types, rules=RULES)
    assert_same_tree(spec.unflatten(leaves), tree)
    if not stop_types:
        assert len(leaves) == len(candidates)
    for x in leaves:
        assert type(x) in stop_types or pk.structure(x, rules=RULES).is_leaf()
