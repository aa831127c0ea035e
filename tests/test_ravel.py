"""pk.ravel: a tree of arrays to one flat vector and back (jax's ravel_pytree,
torch's parameters_to_vector / vector_to_parameters), on both engines.

Property tests draw trees of every container kind (scripts/corpus/trees.py) holding
numpy arrays, numpy scalars, torch tensors and Python numbers of every dtype
and shape (0-d and empty included), with values every dtype holds exactly,
and check: the vector's length, dtype (numpy's ``result_type`` of the leaves
themselves, Python numbers weak) and values, piece by piece; that unravel
gives back the same containers and each leaf's type, shape, dtype and
values; that the vector never shares memory with a leaf, and that the leaves
unravel returns never share memory with the vector given. Beside them:
jax's ``ravel_pytree`` (x64) on the dtype families where jax and numpy
promote alike, torch's ``parameters_to_vector`` and ``vector_to_parameters``
on a real model, gradcheck, the lifecycle, and every error message.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import pickle
import subprocess
import sys
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk
import pytree_kit.testing as pkt
from scripts.corpus.trees import EXTRA_KINDS, RULES

np = pytest.importorskip("numpy")
hnp = pytest.importorskip("hypothesis.extra.numpy")

# hypothesis describes the array strategies that flatmap makes from drawn
# dtypes with a long repr (and warns); the tests' failures print the trees
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")

# -- strategies ---------------------------------------------------------------


def trees(leaves: Any) -> Any:
    """Trees of every container kind pytree_kit understands (scripts/corpus/trees.py's;
    its Opaque needs RULES), kept small: a leaf is an array."""
    return pkt.trees(leaves, max_depth=3, max_width=3, containers=EXTRA_KINDS).filter(
        # a ModelOutput the strategy cannot build as asked holds an opaque Leaf
        lambda t: not any(isinstance(x, pkt.Leaf) for x in pk.leaves(t, rules=RULES))
    )


SIGNED = ["int8", "int16", "int32", "int64"]
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "float32", "float64"]
COMPLEX = ["complex64", "complex128"]
NP_DTYPES = ["bool", *SIGNED, *UNSIGNED, *FLOATS, *COMPLEX]

# values every dtype of their kind holds exactly (float16 and bfloat16 too),
# so that a round trip through any promoted dtype gives them back exactly
exact_floats = st.integers(-255, 255).map(lambda k: k / 4) | st.sampled_from(
    [math.inf, -math.inf, math.nan]
)


def elements(dtype: str) -> Any:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return st.booleans()
    if kind == "i":
        return st.integers(-100, 100)
    if kind == "u":
        return st.integers(0, 200)
    if kind == "f":
        return exact_floats
    return st.builds(complex, exact_floats, exact_floats)


shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)


def np_arrays(dtypes: list[str]) -> Any:
    return st.sampled_from(dtypes).flatmap(
        lambda dt: hnp.arrays(np.dtype(dt), shapes, elements=elements(dt))
    )


# Python numbers: weak. Ints in [0, 100] fit every integer dtype (a negative
# one does not fit uint8: tested on its own).
numbers = st.one_of(
    st.booleans(),
    st.integers(0, 100),
    exact_floats,
    st.builds(complex, exact_floats, exact_floats),
)
np_scalars = np_arrays(NP_DTYPES).filter(lambda a: a.ndim == 0).map(lambda a: a[()])
numpy_leaves = st.one_of(np_arrays(NP_DTYPES), np_scalars, numbers)
numpy_trees = trees(numpy_leaves)

TORCH_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


@st.composite
def tensors(draw: Any, dtypes: list[str] = TORCH_DTYPES) -> Any:
    import torch

    name = draw(st.sampled_from(dtypes))
    source = "float32" if name == "bfloat16" else name
    a = draw(hnp.arrays(np.dtype(source), shapes, elements=elements(source)))
    t = torch.from_numpy(a).to(getattr(torch, name))
    if t.dtype.is_floating_point and draw(st.booleans()):
        t.requires_grad_()
    return t


# torch trees: at least one tensor (the root's first child), with numpy leaves
# and Python numbers among them
# (numpy's uint16, uint32 and uint64 become torch dtypes that promote with no other)
TORCH_NUMPY = ["bool", *SIGNED, "uint8", *FLOATS, *COMPLEX]
torch_trees = st.tuples(
    tensors(), trees(st.one_of(tensors(), tensors(), np_arrays(TORCH_NUMPY), numbers))
)


# -- oracles --------------------------------------------------------------------


def is_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic)


def np_same(a: Any, b: Any) -> bool:
    """Same dtype, shape and values (NaN equal to NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def np_cast(x: Any, dtype: Any) -> Any:
    """x as an array of dtype, as C would cast it (complex to real: the real part)."""
    a = np.asarray(x)
    if a.dtype.kind == "c" and np.dtype(dtype).kind not in "cb":
        a = a.real
    return a.astype(dtype)


def t_same(a: Any, b: Any) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    a, b = a.detach(), b.detach()
    if a.dtype.is_complex:
        a = torch.view_as_real(a.to(torch.complex128))
        b = torch.view_as_real(b.to(torch.complex128))
    elif a.dtype.is_floating_point:
        a, b = a.double(), b.double()
    else:
        return bool(torch.equal(a, b))
    # NaN equal to NaN (inf becomes the largest float on both sides)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def torch_dtype_of(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.dtype
    return torch.from_numpy(np.asarray(x).reshape(-1)[:0]).dtype


def torch_promoted(leaves: list) -> Any:
    """torch's promotion of the leaves: dimension-blind for arrays, Python numbers weak."""
    import torch

    strong = [torch_dtype_of(x) for x in leaves if not is_number(x)]
    out = functools.reduce(torch.promote_types, strong)
    for x in leaves:
        if is_number(x):
            out = torch.result_type(torch.zeros(1, dtype=out), x)
    return out


def snapshot(tree: Any, rules: Any = None) -> list:
    """Copies of the leaves, to show the tree was not changed."""
    out = []
    for x in pk.leaves(tree, rules=rules):
        if HAS_TORCH:
            import torch

            if isinstance(x, torch.Tensor):
                out.append(x.detach().clone())
                continue
        out.append(np.array(x, copy=True) if not is_number(x) else x)
    return out


def same_snapshot(before: list, tree: Any, rules: Any = None) -> bool:
    after = pk.leaves(tree, rules=rules)
    if len(before) != len(after):
        return False
    for b, a in zip(before, after):
        if is_number(a):
            if not (a == b or (a != a and b != b)):
                return False
        elif HAS_TORCH and type(b).__module__.startswith("torch"):
            if not t_same(b, a):
                return False
        elif not np_same(b, a):
            return False
    return True


# -- numpy: properties --------------------------------------------------------------


@given(numpy_trees)
def test_numpy_round_trip_dtype_values_and_aliasing(tree: Any) -> None:
    leaves, spec = pk.flatten(tree, rules=RULES)
    before = snapshot(tree, RULES)
    flat, unravel = pk.ravel(tree, rules=RULES)
    assert type(flat) is np.ndarray and flat.ndim == 1
    assert len(flat) == sum(np.size(x) for x in leaves)
    if not leaves:
        assert flat.dtype == np.float64
        assert pk.structure(unravel(flat), rules=RULES) == spec
        return
    # the dtype: numpy's promotion of the leaves themselves, Python numbers weak
    dtype = np.result_type(*leaves)
    assert flat.dtype == dtype
    # each leaf's piece, in leaves order, flattened in C order
    at = 0
    for x in leaves:
        n = np.size(x)
        assert np_same(flat[at : at + n], np_cast(x, dtype).reshape(-1)), (x, flat[at : at + n])
        at += n
    # never a view of a leaf
    for x in leaves:
        if isinstance(x, np.ndarray):
            assert not np.shares_memory(flat, x)
    back = unravel(flat)
    assert pk.structure(back, rules=RULES) == spec and (spec.is_leaf() or type(back) is type(tree))
    for x, y in zip(leaves, pk.leaves(back, rules=RULES)):
        assert type(y) is np.ndarray and y.shape == np.shape(x)
        if is_number(x):
            assert np_same(y, np.asarray(x, dtype=dtype))  # a number takes the vector's dtype
            assert y == x or (x != x and y != y)
        else:
            assert np_same(y, np.asarray(x))  # its own dtype and values, exactly
        assert not np.shares_memory(y, flat)
    assert same_snapshot(before, tree, RULES)
    # changing the vector changes neither the tree nor what unravel gave
    kept = snapshot(back, RULES)
    flat[...] = 7
    assert same_snapshot(before, tree, RULES)
    assert same_snapshot(kept, back, RULES)


@given(numpy_trees, st.data())
def test_numpy_unravel_of_any_vector(tree: Any, data: Any) -> None:
    """unravel of a fresh vector of the raveled dtype: each leaf is its piece, cast back."""
    flat, unravel = pk.ravel(tree, rules=RULES)
    vector = data.draw(hnp.arrays(flat.dtype, flat.shape, elements=elements(flat.dtype.name)))
    with np.errstate(invalid="ignore"):  # NaN or inf to an int: numpy's value, both sides
        back = unravel(vector)
    at = 0
    for x, y in zip(pk.leaves(tree, rules=RULES), pk.leaves(back, rules=RULES)):
        n = np.size(x)
        want = vector[at : at + n].reshape(np.shape(x))
        with np.errstate(invalid="ignore"):
            expected = want if is_number(x) else np_cast(want, np.asarray(x).dtype)
        assert np_same(y, expected)
        at += n


# -- numpy: against jax ----------------------------------------------------------


def x64(on: bool) -> Any:
    """jax's 64-bit mode on or off within a ``with`` block (jax.enable_x64 from
    jax 0.7; jax.experimental's before)."""
    jax = pytest.importorskip("jax")
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(on)
    import jax.experimental

    return jax.experimental.enable_x64() if on else jax.experimental.disable_x64()


# dtype families in which jax (with x64) and numpy promote alike: jax differs
# on int with float (int64 and float32: jax float32, numpy float64) and reads
# a Python float as float64 under x64, so neither is drawn here
FAMILIES = [
    ["bool", *SIGNED],
    ["bool", *UNSIGNED],
    ["uint8", "int8", "int16"],
    ["bool", *FLOATS],
    ["bool", "float32", "float64", *COMPLEX],
]


@st.composite
def jax_trees(draw: Any) -> Any:
    """Trees of the containers jax knows unregistered (lists, tuples, dicts
    with str keys, None) of one family's arrays and numpy scalars."""
    family = draw(st.sampled_from(FAMILIES))
    arrays = np_arrays(family)
    leaves = arrays | arrays.filter(lambda a: a.ndim == 0).map(lambda a: a[()]) | st.none()
    return draw(
        st.recursive(
            leaves,
            lambda c: (
                st.lists(c, max_size=4)
                | st.tuples(c, c)
                | st.dictionaries(st.text("abc", max_size=2), c, max_size=4)
            ),
            max_leaves=12,
        )
    )


@settings(max_examples=60)
@given(jax_trees())
def test_against_jax_ravel_pytree(tree: Any) -> None:
    pytest.importorskip("jax")
    from jax.flatten_util import ravel_pytree

    flat, unravel = pk.ravel(tree)
    with x64(True):
        if not pk.leaves(tree):
            jflat, _ = ravel_pytree(tree)
            assert jflat.shape == (0,) and flat.shape == (0,)  # jax: float32, here float64
            return
        jflat, junravel = ravel_pytree(tree)
        assert flat.dtype == np.dtype(jflat.dtype)
        assert np_same(flat, np.asarray(jflat))
        mine, theirs = pk.leaves(unravel(flat)), pk.leaves(junravel(jflat))
        assert [(y.dtype, y.shape) for y in mine] == [(y.dtype, y.shape) for y in theirs]
        assert all(np_same(a, np.asarray(b)) for a, b in zip(mine, theirs))


def test_where_jax_differs() -> None:
    """The differences the docstring states, shown against jax."""
    pytest.importorskip("jax")
    from jax.flatten_util import ravel_pytree

    f32, i64 = np.zeros(2, np.float32), np.zeros(2, np.int64)
    with x64(True):
        # a Python float: weak here, float64 in jax with x64
        assert pk.ravel([f32, 0.5])[0].dtype == np.float32
        assert ravel_pytree([f32, 0.5])[0].dtype == np.float64
        # an int with a float: numpy's float64 here, the float's dtype in jax
        assert pk.ravel([f32, i64])[0].dtype == np.float64
        assert ravel_pytree([f32, i64])[0].dtype == np.float32
        # no leaf: float64 here, float32 in jax
        assert pk.ravel({})[0].dtype == np.float64
        assert ravel_pytree({})[0].dtype == np.float32
    # without x64, jax narrows 64-bit dtypes; here they stay
    with x64(False):
        assert ravel_pytree([i64])[0].dtype == np.int32
        assert ravel_pytree([f32, 0.5])[0].dtype == np.float32
    assert pk.ravel([i64])[0].dtype == np.int64


def test_unravel_dtype_rules_as_jax() -> None:
    """One dtype: unravel takes any dtype and the leaves take it. Several:
    the vector must have the raveled dtype (TypeError), and each leaf is cast
    back, complex to real dropping the imaginary part silently."""
    pytest.importorskip("jax")
    from jax.flatten_util import ravel_pytree

    one = {"a": np.ones(2, np.float32), "b": np.zeros((), np.float32)}
    several = [np.ones(2, np.float32), np.ones(1, np.complex64)]
    with x64(True):
        _, unravel = pk.ravel(one)
        _, junravel = ravel_pytree(one)
        v = np.arange(3, dtype=np.float64)
        assert unravel(v)["a"].dtype == junravel(v)["a"].dtype == np.float64
        _, unravel = pk.ravel(several)
        _, junravel = ravel_pytree(several)
        with pytest.raises(TypeError, match="unravel: the vector is float64, but the tree's"):
            unravel(np.zeros(3, np.float64))
        with pytest.raises(TypeError):
            junravel(np.zeros(3, np.float64))
        v = np.array([1 + 2j, 3 + 4j, 5 + 6j], np.complex64)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            back = unravel(v)
        assert np_same(back[0], np.array([1, 3], np.float32))
        assert np_same(back[0], np.asarray(junravel(v)[0]))


# -- numpy: cases -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("leaves", "dtype"),
    [
        ([np.zeros(2, np.float32), 0.5], "float32"),  # a Python float is weak
        ([np.zeros(2, np.int32), 0.5], "float64"),  # a higher kind: numpy's default float
        ([np.zeros(2, np.uint8), 7], "uint8"),
        ([np.zeros(2, np.bool_), 1], "int64"),
        ([np.zeros(2, np.float32), 1j], "complex64"),
        ([np.zeros(2, np.float32), np.float64(1)], "float64"),  # a numpy scalar is strong
        ([np.zeros(2, np.int64), np.zeros(1, np.uint64)], "float64"),
        ([np.zeros(2, np.float16), np.zeros(1, np.int32)], "float64"),
        ([True, False], "bool"),
        ([1, 2.5], "float64"),  # numbers only: numpy's defaults
        ([3], "int64"),
    ],
)
def test_numpy_promotion_cases(leaves: list, dtype: str) -> None:
    flat, unravel = pk.ravel(leaves)
    assert flat.dtype == np.dtype(dtype)
    back = unravel(flat)
    for x, y in zip(leaves, back):
        assert y.dtype == (flat.dtype if is_number(x) else np.asarray(x).dtype)


def test_single_leaf_vector_is_a_copy() -> None:
    a = np.arange(6.0).reshape(2, 3)
    flat, unravel = pk.ravel(a)
    assert not np.shares_memory(flat, a)
    flat[0] = 100
    assert a[0, 0] == 0
    back = unravel(flat)
    flat[1] = 100
    assert back[0, 1] == 1
    # a non-contiguous leaf is read in C order
    t = a.T
    assert np_same(pk.ravel(t)[0], t.reshape(-1))


def test_empty_and_numbers_only() -> None:
    flat, unravel = pk.ravel({"a": [], "b": None})
    assert flat.dtype == np.float64 and flat.shape == (0,)
    assert unravel(np.zeros(0, np.int8)) == {"a": [], "b": None}
    with pytest.raises(ValueError, match="the vector has 1 elements, but the tree has 0"):
        unravel(np.zeros(1))
    flat, unravel = pk.ravel({"lr": 0.1, "step": 3, "on": True})
    assert flat.dtype == np.float64 and list(flat) == [0.1, 1.0, 3.0]
    back = unravel(flat * 2)
    assert back == {"lr": 0.2, "step": 6.0, "on": 2.0}
    assert all(type(v) is np.ndarray and v.shape == () for v in back.values())


def test_unravel_reads_the_vector_once_into_a_private_copy() -> None:
    tree = {"w": np.ones((2, 2)), "b": np.zeros(2)}
    flat, unravel = pk.ravel(tree)
    v = np.arange(6.0)
    back = unravel(v)
    v[:] = -1
    assert list(back["b"]) == [0.0, 1.0] and back["w"].tolist() == [[2, 3], [4, 5]]
    # the leaves share one base: writing one leaves the other alone
    back["b"][0] = 9
    assert back["w"].tolist() == [[2, 3], [4, 5]]


# -- lifecycle --------------------------------------------------------------------


@dataclasses.dataclass
class Layer:
    w: Any
    b: Any


def test_one_unravel_for_many_vectors_and_reused() -> None:
    tree = {"layers": [Layer(np.ones((3, 2), np.float32), np.zeros(2, np.float32))] * 2}
    flat, unravel = pk.ravel(tree)
    rng = np.random.default_rng(0)
    results = []
    for _ in range(100):
        v = rng.standard_normal(len(flat)).astype(np.float32)
        back = unravel(v)
        results.append((v, back))
        assert type(back["layers"][1]) is Layer and back["layers"][1].w.shape == (3, 2)
    for v, back in results:  # each result kept its own values
        assert np_same(pk.ravel(back)[0], v)
    first = unravel(flat)
    for _ in range(1000):
        again = unravel(flat)
    assert pk.tree_equal(first, again) and pk.tree_equal(first, tree)
    # fresh trees of the same structure through the same unravel
    for k in range(20):
        other = pk.tree_map(lambda x, k=k: x + k, tree)
        assert pk.tree_equal(unravel(pk.ravel(other)[0]), other)


def test_unravel_pickles_as_jax_does() -> None:
    tree = {"w": np.ones((2, 2), np.float32), "n": np.int8(3), "lr": 0.5}
    flat, unravel = pk.ravel(tree)
    again = pickle.loads(pickle.dumps(unravel))
    assert pk.tree_equal(again(flat), unravel(flat))
    assert repr(again) == repr(unravel)
    assert repr(unravel).startswith("Unravel(numpy, 6 elements of float32, 3 leaves: TreeSpec(")


def test_rules_and_is_leaf() -> None:
    class Pair:
        def __init__(self, a: Any, b: Any) -> None:
            self.a, self.b = a, b

    rule = pk.Rule(lambda p: ((p.a, p.b), None), lambda aux, ch: Pair(*ch))
    flat, unravel = pk.ravel([Pair(np.ones(2), 3.0)], rules={Pair: rule})
    assert list(flat) == [1.0, 1.0, 3.0]
    back = unravel(flat)
    assert type(back[0]) is Pair and back[0].b == 3.0
    # is_leaf stops at a value, which must then be one ravel takes
    with pytest.raises(TypeError, match=r"^tree\[0\]: ravel takes"):
        pk.ravel([[1.0]], is_leaf=lambda x: isinstance(x, list) and x == [1.0])


# -- errors --------------------------------------------------------------------


def test_errors_name_the_path() -> None:
    tree = {"a": [Layer(np.ones(2), "relu")], "b": 1.0}
    with pytest.raises(TypeError) as e:
        pk.ravel(tree)
    assert str(e.value) == (
        "tree['a'][0].b: ravel takes torch tensors, jax arrays, numpy arrays and Python "
        "numbers (bool, int, float, complex), not a str"
    )
    with pytest.raises(TypeError, match=r"^tree\['x'\]\[1\]: ravel takes arrays of booleans"):
        pk.ravel({"x": [np.ones(1), np.array(["a"])]})
    with pytest.raises(TypeError, match=r"^tree: ravel takes .* not a object"):
        pk.ravel(object())
    with pytest.raises(OverflowError, match=r"^tree\[1\]: 300 does not fit the vector's uint8"):
        pk.ravel([np.zeros(1, np.uint8), 300])
    with pytest.raises(OverflowError, match=r"^tree\[1\]: -1 does not fit"):
        pk.ravel([np.zeros(1, np.uint8), -1])
    with pytest.raises(OverflowError, match=r"^tree\[0\]: 1180591620717411303424 does not fit"):
        pk.ravel([2**70])


@settings(max_examples=60)
@given(jax_trees(), st.booleans(), st.booleans(), st.data())
def test_jax_arrays_as_jax_ravel_pytree(tree: Any, on: bool, numbers: bool, data: Any) -> None:
    """A tree holding jax arrays ravels to a jax array as jax's ravel_pytree
    does: the same dtype and values, with 64-bit mode on or off, numpy
    leaves and Python numbers beside the jax arrays; unravel gives jax arrays
    of the same dtypes and shapes, after a pickle too."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    with x64(on):
        leaves, spec = pk.flatten(tree)
        if not leaves:
            return
        # some leaves become jax arrays (at least one), some Python numbers
        picks = data.draw(st.lists(st.integers(0, 2), min_size=len(leaves), max_size=len(leaves)))
        picks[0] = 0
        mixed = []
        for x, pick in zip(leaves, picks):
            if pick == 0:
                mixed.append(jnp.asarray(x))
            elif pick == 1 and numbers and np.ndim(x) == 0 and np.asarray(x).dtype.kind in "bif":
                mixed.append(np.asarray(x).item())
            else:
                mixed.append(x)
        tree = spec.unflatten(mixed)
        flat, unravel = pk.ravel(tree)
        jflat, junravel = ravel_pytree(tree)
        assert isinstance(flat, jax.Array)
        assert flat.dtype == jflat.dtype and flat.shape == jflat.shape
        assert np_same(np.asarray(flat), np.asarray(jflat))
        for fn in (unravel, pickle.loads(pickle.dumps(unravel))):
            mine, theirs = pk.leaves(fn(flat)), pk.leaves(junravel(jflat))
            assert all(isinstance(y, jax.Array) for y in mine)
            assert [(y.dtype, y.shape) for y in mine] == [(y.dtype, y.shape) for y in theirs]
            assert all(np_same(np.asarray(a), np.asarray(b)) for a, b in zip(mine, theirs))
        assert pk.structure(unravel(flat)) == pk.structure(tree)


def test_unravels_of_one_structure_are_equal_and_jit_traces_once() -> None:
    """Two ravels of trees of the same structure, shapes and dtypes give equal
    unravels with equal hashes (as jax's): a jitted function taking one as a
    static argument traces once."""
    a, ua = pk.ravel({"w": np.ones((2, 2), np.float32), "b": [np.zeros(3, np.float32)]})
    b, ub = pk.ravel({"w": np.zeros((2, 2), np.float32), "b": [np.ones(3, np.float32)]})
    assert ua == ub and hash(ua) == hash(ub) and ua is not ub
    assert ua == pickle.loads(pickle.dumps(ua))
    _, other_shape = pk.ravel({"w": np.ones((4,), np.float32), "b": [np.zeros(3, np.float32)]})
    _, other_dtype = pk.ravel({"w": np.ones((2, 2)), "b": [np.zeros(3, np.float32)]})
    _, other_tree = pk.ravel([np.ones((2, 2), np.float32), np.zeros(3, np.float32)])
    assert len({ua, other_shape, other_dtype, other_tree}) == 4
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    traces = []

    def run(flat: Any, unravel: Any) -> Any:
        traces.append(1)
        return unravel(flat + 1)

    run = jax.jit(run, static_argnums=1)
    for _ in range(3):
        flat, unravel = pk.ravel((jnp.array([1, 2]), jnp.array([3, 4])))
        out = run(flat, unravel)
    assert len(traces) == 1 and [x.tolist() for x in out] == [[2, 3], [4, 5]]


def test_jax_unravel_checks_and_errors() -> None:
    pytest.importorskip("jax")
    import jax.numpy as jnp

    flat, unravel = pk.ravel({"w": jnp.ones((2, 2), jnp.float32), "n": jnp.arange(3)})
    assert flat.shape == (7,) and "Unravel(jax, 7 elements of float32" in repr(unravel)
    with pytest.raises(ValueError, match="the vector has 6 elements, but the tree has 7"):
        unravel(flat[:6])
    with pytest.raises(TypeError, match="give a float32 vector"):
        unravel(flat.astype(jnp.int32))
    with pytest.raises(TypeError, match="raveled to a jax array; got list"):
        unravel([0.0] * 7)
    back = unravel(np.arange(7, dtype=np.float32))  # a numpy vector is taken, as by jax's
    assert back["n"].dtype == jnp.arange(3).dtype and back["n"].tolist() == [0, 1, 2]
    assert back["w"].tolist() == [[3.0, 4.0], [5.0, 6.0]]  # sorted keys: "n" first
    with pytest.raises(TypeError, match=r"^tree\['x'\]: ravel takes torch tensors, jax arrays"):
        pk.ravel({"x": object(), "y": jnp.ones(1)})
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"tree\['x'\]"):
        pk.ravel({"x": jnp.ones(2), "y": torch.ones(2)})


def test_unravel_checks_its_argument() -> None:
    flat, unravel = pk.ravel([np.ones((2, 2)), np.ones(3)])
    with pytest.raises(
        ValueError, match=r"^unravel: the vector has 6 elements, but the tree has 7$"
    ):
        unravel(np.ones(6))
    with pytest.raises(
        ValueError, match=r"expected a 1-D vector of 7 elements, got shape \(7, 1\)"
    ):
        unravel(np.ones((7, 1)))
    with pytest.raises(TypeError, match="the tree raveled to a numpy array; got list"):
        unravel(list(flat))


def test_no_numpy_needed_to_refuse_and_numpy_needed_for_numbers() -> None:
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "import pytree_kit as pk\n"
        "try:\n"
        "    pk.ravel({'a': 'x'})\n"
        "except TypeError as e:\n"
        "    print(e)\n"
        "for tree in ({'a': 1.0}, []):\n"
        "    try:\n"
        "        pk.ravel(tree)\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "tree['a']: ravel takes torch tensors, jax arrays, numpy arrays and Python numbers "
        "(bool, int, float, complex), not a str",
        "ravel: a tree of Python numbers ravels to a numpy array, and numpy is not installed",
        "ravel: an empty tree ravels to a numpy array, and numpy is not installed",
    ]


def test_a_numpy_tree_does_not_import_torch() -> None:
    code = (
        "import sys, numpy as np, pytree_kit as pk\n"
        "flat, unravel = pk.ravel({'a': np.ones(2), 'b': 1.0})\n"
        "unravel(flat)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- torch -----------------------------------------------------------------------


@needs_torch
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@given(torch_trees)
def test_torch_round_trip_dtype_values_and_aliasing(tree: Any) -> None:
    import torch

    leaves, spec = pk.flatten(tree, rules=RULES)
    before = snapshot(tree, RULES)
    flat, unravel = pk.ravel(tree, rules=RULES)
    assert type(flat) is torch.Tensor and flat.ndim == 1
    assert len(flat) == sum(
        x.numel() if isinstance(x, torch.Tensor) else np.size(x) for x in leaves
    )
    dtype = torch_promoted(leaves)
    assert flat.dtype == dtype
    assert flat.requires_grad == any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in leaves
    )
    at = 0
    for x in leaves:
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        n = t.numel()
        assert t_same(flat[at : at + n], t.reshape(-1).to(dtype)), (x, flat[at : at + n])
        at += n
    # a fresh tensor: no leaf's memory
    for x in leaves:
        if isinstance(x, torch.Tensor) and x.numel():
            assert flat.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    back = unravel(flat)
    assert pk.structure(back, rules=RULES) == spec and type(back) is tuple
    for x, y in zip(leaves, pk.leaves(back, rules=RULES)):
        assert type(y) is torch.Tensor
        if is_number(x):
            assert t_same(y, torch.tensor(x, dtype=dtype))
        elif isinstance(x, torch.Tensor):
            assert t_same(y, x)
        else:  # a numpy leaf comes back as a tensor of its dtype
            assert t_same(y, torch.as_tensor(np.asarray(x)))
        if y.numel():
            assert y.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
    assert same_snapshot(before, tree, RULES)
    kept = snapshot(back, RULES)
    with torch.no_grad():
        flat.fill_(7)
    assert same_snapshot(before, tree, RULES)
    assert same_snapshot(kept, back, RULES)


@needs_torch
@pytest.mark.parametrize(
    ("leaves", "dtype"),
    [
        (["float32", 0.5], "float32"),
        (["int32", 0.5], "float32"),  # a higher kind: torch's default dtype
        (["float64", 0.5], "float64"),
        (["uint8", 7], "uint8"),
        (["bool", 1], "int64"),
        (["float32", 1j], "complex64"),
        (["float32", "float64"], "float64"),
        (["int64", "float32"], "float32"),  # torch: the float's dtype (numpy: float64)
        (["float16", "bfloat16"], "float32"),
        # a 0-d tensor promotes as any other (torch's ops would demote it)
        (["float32", "0d-float64"], "float64"),
    ],
)
def test_torch_promotion_cases(leaves: list, dtype: str) -> None:
    import torch

    def make(x: Any) -> Any:
        if not isinstance(x, str):
            return x
        if x.startswith("0d-"):
            return torch.zeros((), dtype=getattr(torch, x[3:]))
        return torch.zeros(2, dtype=getattr(torch, x))

    tree = [make(x) for x in leaves]
    flat, unravel = pk.ravel(tree)
    assert flat.dtype == getattr(torch, dtype)
    for x, y in zip(tree, unravel(flat)):
        assert y.dtype == (flat.dtype if is_number(x) else x.dtype)


@needs_torch
def test_mixed_numpy_and_torch() -> None:
    import torch

    tree = {"t": torch.ones(2, dtype=torch.float32), "a": np.arange(3, dtype=np.int64), "n": 2}
    flat, unravel = pk.ravel(tree)
    assert flat.dtype == torch.float32 and flat.tolist() == [0, 1, 2, 2, 1, 1]
    back = unravel(flat)
    assert back["a"].dtype == torch.int64 and back["a"].tolist() == [0, 1, 2]
    assert back["n"].dtype == torch.float32 and back["n"].shape == ()
    # a read-only or byte-swapped array joins without a warning
    ro = np.arange(2.0)
    ro.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat, _ = pk.ravel([torch.zeros(1), ro, np.arange(2, dtype=">f8")])
    assert flat.tolist() == [0, 0, 1, 0, 1]


@needs_torch
def test_against_parameters_to_vector_on_a_model() -> None:
    import torch
    from torch.func import functional_call
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 10),
    )
    params = list(model.parameters())
    flat, unravel = pk.ravel(params)
    assert torch.equal(flat, parameters_to_vector(params))
    assert flat.requires_grad and flat.grad_fn is not None
    # vector_to_parameters writes a vector into the parameters; unravel makes new tensors
    w = torch.randn(len(flat))
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    vector_to_parameters(w, copies)
    assert all(torch.equal(a, b) for a, b in zip(unravel(w), copies))
    # gradients flow from the vector back to the parameters
    (flat**2).sum().backward()
    assert all(torch.equal(p.grad, 2 * p.detach()) for p in params)
    # and through unravel into a vector: a model run on unravelled parameters
    named = dict(model.named_parameters())
    x = torch.randn(2, 3, 8, 8)
    model.zero_grad()
    model(x).square().sum().backward()
    flat, unravel = pk.ravel(named)
    v = flat.detach().requires_grad_()
    functional_call(model, unravel(v), (x,)).square().sum().backward()
    expected = pk.ravel({k: p.grad for k, p in named.items()})[0]
    torch.testing.assert_close(v.grad, expected)


@needs_torch
def test_gradcheck() -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    c = torch.randn((), dtype=torch.float64, generator=g, requires_grad=True)

    def ravel(a: Any, b: Any, c: Any) -> Any:
        return pk.ravel({"a": a, "b": [b, c, 0.5]})[0]

    assert torch.autograd.gradcheck(ravel, (a, b, c))
    flat, unravel = pk.ravel({"a": a, "b": [b, c, 0.5]})
    v = flat.detach().clone().requires_grad_()

    def leaves(v: Any) -> tuple:
        return tuple(pk.leaves(unravel(v)))

    assert torch.autograd.gradcheck(leaves, (v,))
    assert torch.autograd.gradgradcheck(leaves, (v,))


@needs_torch
def test_in_place_on_an_unravelled_leaf_keeps_the_backward() -> None:
    import torch

    flat, unravel = pk.ravel([torch.zeros(2), torch.zeros(3)])
    v = torch.arange(5.0, requires_grad=True)
    first, second = unravel(v)
    loss = (first * 3).sum() + (second**2).sum()
    first.mul_(10)  # an in-place change to one leaf: the other's saved tensor is intact
    loss.backward()
    assert v.grad.tolist() == [3, 3, 4, 6, 8]
    assert v.tolist() == [0, 1, 2, 3, 4]


@needs_torch
def test_torch_one_dtype_unravel_takes_any_dtype_and_several_do_not() -> None:
    import torch

    flat, unravel = pk.ravel([torch.ones(2), torch.zeros(())])
    back = unravel(torch.arange(3, dtype=torch.float64))
    assert [t.dtype for t in back] == [torch.float64] * 2
    flat, unravel = pk.ravel([torch.ones(2), torch.zeros((), dtype=torch.float64)])
    with pytest.raises(TypeError, match=r"the vector is torch\.float32, but the tree's leaves"):
        unravel(flat.float())
    with pytest.raises(TypeError, match="the tree raveled to a torch tensor; got ndarray"):
        unravel(flat.detach().numpy())
    with pytest.raises(ValueError, match="the vector has 2 elements, but the tree has 3"):
        unravel(flat[:2])
    # complex to real: the real part, no warning
    flat, unravel = pk.ravel([torch.ones(1), torch.ones(1, dtype=torch.complex64)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = unravel(torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64))
    assert back[0].dtype == torch.float32 and back[0].tolist() == [1.0]


@needs_torch
def test_torch_errors() -> None:
    import torch

    tree = {"a": torch.zeros(1), "b": [1.0, torch.zeros(1, device="meta")]}
    with pytest.raises(ValueError) as e:
        pk.ravel(tree)
    assert str(e.value) == (
        "tree['b'][1] is on meta, but tree['a'] is on cpu: ravel puts every leaf in one "
        "vector, on one device"
    )
    with pytest.raises(TypeError, match=r"^ravel: torch has no common dtype for torch.int64, "):
        pk.ravel([torch.zeros(1, dtype=torch.uint16), torch.zeros(1, dtype=torch.int64)])
    with pytest.raises(TypeError, match=r"^tree\[1\]\.w: ravel takes .* not a str"):
        pk.ravel([torch.zeros(1), Layer("w", 1)])
    with pytest.raises(TypeError, match=r"^tree\[1\]: ravel takes arrays of booleans"):
        pk.ravel([torch.zeros(1), np.array([object()])])


@needs_torch
def test_torch_lifecycle_and_pickle() -> None:
    import torch

    tree = {"w": torch.ones(3, 2), "b": torch.zeros(2, dtype=torch.float64), "n": 3}
    flat, unravel = pk.ravel(tree)
    assert flat.dtype == torch.float64
    again = pickle.loads(pickle.dumps(unravel))
    assert pk.tree_equal(again(flat), unravel(flat))
    for _ in range(1000):
        back = unravel(flat)
    assert back["w"].dtype == torch.float32 and back["n"].dtype == torch.float64
    assert pk.tree_equal(back, {"w": tree["w"], "b": tree["b"], "n": torch.tensor(3.0).double()})
    # a single tensor: still a copy
    t = torch.arange(4.0)
    flat, unravel = pk.ravel(t)
    assert flat.data_ptr() != t.data_ptr()
    out = unravel(flat)
    assert out.data_ptr() != flat.data_ptr()
