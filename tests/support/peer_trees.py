"""The trees every peer knows (dicts, lists, tuples, namedtuples, OrderedDict,
defaultdict, deque), as a hypothesis strategy, the peers imported lazily (a
missing one skips only its tests), and the comparisons the differential tests
against the peers make: tests/test_peers.py, and the operations' own tests."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque, namedtuple
from typing import Any

import pytest
from hypothesis import strategies as st


def _jtu() -> Any:
    jax = pytest.importorskip("jax")
    return jax.tree_util


def _optree() -> Any:
    return pytest.importorskip("optree")


def _torch_pytree() -> Any:
    pytest.importorskip("torch")
    import torch.utils._pytree as tp

    return tp


def _dmtree() -> Any:
    # dm-tree installs the top-level module ``tree``.
    mod = pytest.importorskip("tree")
    if not hasattr(mod, "unflatten_as"):
        pytest.skip("the module 'tree' here is not dm-tree")
    return mod


Pair = namedtuple("Pair", "x y")


Single = namedtuple("Single", "value")


Empty = namedtuple("Empty", "")


_NAMEDTUPLES = (Pair, Single, Empty)


_KINDS = ("dict", "list", "tuple", "namedtuple", "ordereddict", "defaultdict", "deque")


def _unique_leaf(kind: int, counter: list) -> Any:
    """A fresh leaf object, distinct (by identity and value) from all others."""
    counter[0] += 1
    n = counter[0]
    if kind == 0:
        return 1_000_000 + n * 7  # computed at run time: never a cached small int
    if kind == 1:
        return n + 0.25
    return "".join(["leaf", str(n)])  # built at run time, not interned


@st.composite
def trees(draw: Any, with_deque: bool = False, max_depth: int = 4) -> Any:
    counter = [0]
    kinds = [k for k in _KINDS if with_deque or k != "deque"]

    def keys(n: int) -> list:
        if draw(st.booleans()):
            return draw(st.lists(st.text(max_size=3), min_size=n, max_size=n, unique=True))
        return draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n, unique=True))

    def build(depth: int) -> Any:
        choice = draw(st.integers(0, 9 if depth > 0 else 3))
        if choice <= 2:
            return _unique_leaf(choice, counter)
        if choice == 3:
            return None
        kind = draw(st.sampled_from(kinds))
        if kind == "namedtuple":
            cls = draw(st.sampled_from(_NAMEDTUPLES))
            return cls(*[build(depth - 1) for _ in cls._fields])
        n = draw(st.integers(0, 4))
        if kind in ("list", "tuple", "deque"):
            items = [build(depth - 1) for _ in range(n)]
            if kind == "list":
                return items
            if kind == "tuple":
                return tuple(items)
            maxlen = draw(st.sampled_from([None, n, n + 2]))
            return deque(items, maxlen)
        ks = keys(n)
        items = [(k, build(depth - 1)) for k in ks]
        if kind == "dict":
            return dict(items)
        if kind == "ordereddict":
            return OrderedDict(items)
        dd: defaultdict = defaultdict(list)
        dd.update(items)
        return dd

    return build(max_depth)


def _same_objects(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _same_tree(a: Any, b: Any, *, dict_order: bool) -> bool:
    """Equal trees, with exact container types; dict order checked when asked."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        if isinstance(a, defaultdict) and a.default_factory is not b.default_factory:
            return False
        if set(a) != set(b):
            return False
        if (dict_order or type(a) is OrderedDict) and list(a) != list(b):
            return False
        return all(_same_tree(a[k], b[k], dict_order=dict_order) for k in a)
    if isinstance(a, (list, tuple, deque)):
        if isinstance(a, deque) and a.maxlen != b.maxlen:
            return False
        return len(a) == len(b) and all(
            _same_tree(x, y, dict_order=dict_order) for x, y in zip(a, b)
        )
    return a == b


def _wrap(x: Any) -> Any:
    return ("mapped", x)


def _nodes_of(tree: Any) -> list:
    """Every container of a tree the strategy makes."""
    out, todo = [], [tree]
    while todo:
        t = todo.pop()
        if isinstance(t, dict):
            out.append(t)
            todo.extend(t.values())
        elif isinstance(t, (list, tuple, deque)):
            out.append(t)
            todo.extend(t)
    return out


def _as_dicts(tree: Any) -> Any:
    """The tree with every OrderedDict and defaultdict made a dict."""
    if isinstance(tree, dict):
        return {k: _as_dicts(v) for k, v in tree.items()}
    if type(tree) is list:
        return [_as_dicts(x) for x in tree]
    if type(tree) is tuple:
        return tuple(_as_dicts(x) for x in tree)
    if type(tree) in _NAMEDTUPLES:
        return type(tree)(*[_as_dicts(x) for x in tree])
    if type(tree) is deque:
        return deque([_as_dicts(x) for x in tree], tree.maxlen)
    return tree
