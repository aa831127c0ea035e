"""assert_same_structure, tree_equal and pytree_kit.torch.assert_close: the
first differing path, on every kind of node, on whichever engine runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from scripts.corpus.trees import RULES, Node, Opaque, snapshot, trees

SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(trees())
def test_a_tree_has_its_own_structure_and_equals_its_copy(tree: Any) -> None:
    before = snapshot(tree)
    pk.assert_same_structure(tree, tree, rules=RULES)
    mapped = pk.tree_map(lambda x: object(), tree, rules=RULES)
    pk.assert_same_structure(tree, mapped, rules=RULES)
    assert pk.tree_equal(tree, tree, rules=RULES)
    leaves, spec = pk.flatten(tree, rules=RULES)
    assert pk.tree_equal(tree, spec.unflatten(list(leaves)), rules=RULES)
    assert pk.tree_equal(tree, mapped, rules=RULES) == (not leaves)
    assert snapshot(tree) == before


@SETTINGS
@given(trees(), st.data())
def test_the_first_difference_is_named(tree: Any, data: Any) -> None:
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    nodes = sorted({p[:i] for p, _ in pairs for i in range(len(p))}, key=len)
    assume(nodes)
    path = data.draw(st.sampled_from(nodes))
    cut = pk.tree_set(tree, path, 0, rules=RULES)
    with pytest.raises(ValueError) as info:
        pk.assert_same_structure(tree, cut, rules=RULES)
    node = pk.tree_get(tree, path, rules=RULES)
    assert str(info.value).startswith(
        f"tree{pk.keystr(path)}: structure mismatch: the first tree has "
    )
    assert str(info.value).endswith(", the second tree has a leaf of type int")
    assert not pk.tree_equal(tree, cut, rules=RULES)
    assert pk.structure(node, rules=RULES).num_leaves > 0
    # and the other way round
    with pytest.raises(ValueError, match="the first tree has a leaf of type int, the second"):
        pk.assert_same_structure(cut, tree, rules=RULES)


@SETTINGS
@given(trees(), st.data())
def test_a_different_leaf_breaks_equality_not_structure(tree: Any, data: Any) -> None:
    leaves, spec = pk.flatten(tree, rules=RULES)
    assume(leaves)
    k = data.draw(st.integers(0, len(leaves) - 1))
    other = spec.unflatten([object() if i == k else x for i, x in enumerate(leaves)])
    pk.assert_same_structure(tree, other, rules=RULES)
    assert not pk.tree_equal(tree, other, rules=RULES)


@dataclasses.dataclass
class Out:
    logits: Any
    loss: Any = None


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        (
            {"a": [1, (2,)]},
            {"a": [1, (2, 3)]},
            "tree['a'][1]: structure mismatch: the first tree "
            "has a tuple of 1, the second tree has a tuple of 2",
        ),
        (
            [Out(1)],
            [Out([1])],
            "tree[0].logits: structure mismatch: the first tree has a leaf of "
            "type int, the second tree has a list of 1",
        ),
        (
            {"a": 1},
            {"b": 1},
            "tree: structure mismatch: the first tree has a dict with keys "
            "['a'], the second tree has a dict with keys ['b']",
        ),
        (
            [1, None],
            [1, 2],
            "tree[1]: structure mismatch: the first tree has None, the second "
            "tree has a leaf of type int",
        ),
        (
            Out(1),
            {"logits": 1, "loss": None},
            "tree: structure mismatch: the first tree has "
            "dataclass Out, the second tree has a dict with keys ['logits', 'loss']",
        ),
        (
            [Node(1, 2, "n")],
            [Node(1, 2, "m")],
            "tree[0]: structure mismatch: the first tree has "
            "Node (by __tree_flatten__, aux='n') with 2 children, the second tree has Node (by "
            "__tree_flatten__, aux='m') with 2 children",
        ),
    ],
)
def test_assert_same_structure_messages(a: Any, b: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        pk.assert_same_structure(a, b)
    assert str(info.value) == message


def test_structure_ignores_dict_order_and_uses_rules_and_is_leaf() -> None:
    pk.assert_same_structure({"a": 1, "b": 2}, {"b": 3, "a": 4})
    pk.assert_same_structure(Opaque([1], 1), Opaque([2], 1), rules=RULES)
    with pytest.raises(ValueError, match=r"tree: structure mismatch: the first tree has Opaque"):
        pk.assert_same_structure(Opaque([1], 1), Opaque([2], 2), rules=RULES)
    pk.assert_same_structure(
        {"a": [2]}, {"a": (2, 3)}, is_leaf=lambda x: isinstance(x, (list, tuple))
    )


def test_tree_equal_on_arrays() -> None:
    np = pytest.importorskip("numpy")
    a = {"x": np.arange(3), "y": [1.0, "s"]}
    assert pk.tree_equal(a, {"x": np.arange(3), "y": [1, "s"]})
    assert not pk.tree_equal(a, {"x": np.arange(3.0), "y": [1.0, "s"]})  # dtype
    assert not pk.tree_equal(a, {"x": np.arange(4), "y": [1.0, "s"]})  # shape
    assert not pk.tree_equal(a, {"x": np.array([0, 1, 5]), "y": [1.0, "s"]})
    assert not pk.tree_equal(a, {"x": [0, 1, 2], "y": [1.0, "s"]})  # an array and a list
    assert not pk.tree_equal({"x": np.arange(3)}, {"x": 0})
    assert not pk.tree_equal([float("nan")], [float("nan")])


# -- pytree_kit.torch.assert_close -------------------------------------------------


def test_assert_close_over_dataclasses_names_the_path() -> None:
    torch = pytest.importorskip("torch")
    from pytree_kit.torch import assert_close

    expected = {"out": [Out(torch.ones(2, 3), torch.tensor(0.5))], "name": "run", "n": 3}
    actual = {"out": [Out(torch.ones(2, 3) + 1e-7, torch.tensor(0.5))], "name": "run", "n": 3}
    assert_close(actual, expected)
    bad = {"out": [Out(torch.ones(2, 3), torch.tensor(0.7))], "name": "run", "n": 3}
    with pytest.raises(AssertionError) as info:
        assert_close(bad, expected)
    assert str(info.value).startswith("tree['out'][0].loss: Scalars are not close!")
    assert_close(bad, expected, atol=0.3, rtol=0)
    with pytest.raises(AssertionError, match=r"^tree\['name'\]: 'walk' != 'run' \(compared with"):
        assert_close({**actual, "name": "walk"}, expected)
    with pytest.raises(AssertionError, match=r"^tree\['n'\]: The \(d\)types do not match"):
        assert_close({**actual, "n": 3.0}, expected)
    with pytest.raises(
        AssertionError,
        match=r"^tree\['out'\]\[0\]: structure mismatch: actual "
        r"has a dict with keys \['logits', 'loss'\], expected has dataclass Out$",
    ):
        assert_close({**actual, "out": [{"logits": 1, "loss": 2}]}, expected)
    with pytest.raises(
        AssertionError,
        match=r"^tree\['out'\]\[0\].logits: The values for "
        r"attribute 'dtype' do not match",
    ):
        assert_close({**actual, "out": [Out(torch.ones(2, 3, dtype=torch.float64), 0.5)]}, expected)
    # a keyword torch does not know is the caller's error, not a leaf mismatch
    with pytest.raises(TypeError, match="unexpected keyword"):
        assert_close(actual, expected, tolerance=1)


def test_assert_close_on_a_model_output() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pytree_kit.torch import assert_close

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 32, (1, 5))
    with torch.no_grad():
        a = model(ids, use_cache=False)
        b = model(ids, use_cache=False)
    assert_close(a, b)
    with torch.no_grad():
        c = model(ids[:, :4], use_cache=False)
    with pytest.raises(
        AssertionError,
        match=r"^tree.logits: The values for attribute "
        r"'shape' do not match",
    ):
        assert_close(c, a)
