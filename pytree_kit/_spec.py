"""TreeSpec: the immutable, flat description of a tree's structure.

A spec is a tuple of nodes in pre-order. Each node is a 4-tuple
``(kind, type, arity, aux)`` (see ``_kinds`` and ``docs/design.md``). Beside
the nodes a spec keeps ``orders``: for each dict whose insertion order differs
from its leaf order, ``(node index, keys in insertion order)``. Orders are used
to rebuild dicts as they were; equality and hashing ignore them.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, Iterator, Optional

from . import _interface, _tracer
from . import _kinds as kinds
from ._json import Unwritable, nodes_from_json, nodes_to_json
from ._keys import Accessor, DictKey, GetAttrKey, SequenceKey, accessor, where
from ._kinds import check_rules, user_tail

__all__ = ["TreeSpec"]


def same_nodes(a: tuple, b: tuple) -> bool:
    """``a == b`` for two specs' node tuples, as torch.compile's tracer can
    follow it: dynamo 2.9-2.11 compares two classes with ``==`` by calling
    the class's own ``__eq__`` (a dataclass's, which fails), and cannot
    compare two distinct tuples with ``is``. A class whose metaclass is
    ``type`` equals only itself, so it is compared with ``is``; every other
    item as tuple comparison does (identity, then ``==``).

    Examples:
        >>> import pytree_kit as pk
        >>> a, b = pk.structure({"x": [1, 2]}), pk.structure({"x": [3, 4]})
        >>> same_nodes(a._nodes, b._nodes), a._nodes == b._nodes
        (True, True)
    """
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if len(x) != len(y):
            return False
        for u, v in zip(x, y):
            if type(u) is type:
                if u is not v:
                    return False
            elif type(u) is tuple:
                if not u == v:
                    return False
            elif not (u is v or u == v):
                return False
    return True


class TreeSpec:
    """The structure of a tree: every container with its type and aux data, and
    where the leaves go. Immutable, hashable, picklable and JSON-serialisable.

    Specs come from :func:`pytree_kit.flatten` or :func:`pytree_kit.structure`.

    Examples:
        >>> import pytree_kit as pk
        >>> spec = pk.structure({"b": [1, 2], "a": 0})
        >>> spec
        TreeSpec({'a': *, 'b': [*, *]})
        >>> spec.num_leaves, spec.num_nodes
        (3, 5)
        >>> spec.unflatten(["x", "y", "z"])
        {'b': ['y', 'z'], 'a': 'x'}
        >>> spec == pk.structure({"a": 7, "b": [8, 9]})
        True
    """

    __slots__ = ("_hash", "_nodes", "_num_leaves", "_orders", "_paths", "_recipe")
    _nodes: tuple
    _orders: tuple
    _num_leaves: int
    _hash: Any
    #: None, or the list paths() made, kept for the next call (never handed out)
    _paths: Optional[list]
    #: the C engine's: None; False once unflattened; then its unflatten recipe
    #: (or True where it makes none). Never handed out, not part of the value.
    _recipe: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "TreeSpec is not built directly: use pytree_kit.structure(tree), "
            "pytree_kit.flatten(tree) or TreeSpec.from_json(text)"
        )

    @classmethod
    def _make(cls, nodes: tuple, orders: tuple, num_leaves: int) -> TreeSpec:
        # object.__setattr__ goes around TreeSpec.__setattr__; torch.compile's
        # tracer (dynamo) follows it (not slot setters), so compiled code can build specs.
        self = object.__new__(cls)
        object.__setattr__(self, "_nodes", nodes)
        object.__setattr__(self, "_orders", orders)
        object.__setattr__(self, "_num_leaves", num_leaves)
        object.__setattr__(self, "_hash", None)
        object.__setattr__(self, "_paths", None)
        object.__setattr__(self, "_recipe", None)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TreeSpec is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("TreeSpec is immutable")

    # -- value semantics ---------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not TreeSpec:
            return NotImplemented
        if self._num_leaves != other._num_leaves:
            return False
        if _tracer.compiling():
            return same_nodes(self._nodes, other._nodes)
        return self._nodes == other._nodes

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((TreeSpec, self._nodes))
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_state, (self._nodes, self._orders))

    def __copy__(self) -> TreeSpec:
        return self

    def __deepcopy__(self, memo: Any) -> TreeSpec:
        return self

    # -- properties --------------------------------------------------------

    @property
    def num_leaves(self) -> int:
        """How many leaves a tree of this structure has."""
        return self._num_leaves

    @property
    def num_nodes(self) -> int:
        """How many nodes: containers (None included) plus leaves, as jax and optree count."""
        return len(self._nodes)

    def __len__(self) -> int:
        """The number of leaves (``num_leaves``), as ``len`` of an optree spec.

        A spec is true even with no leaves (``bool`` does not follow ``len``
        here, as it does for optree's), so ``if spec:`` means "a spec".

        Examples:
            >>> import pytree_kit as pk
            >>> len(pk.structure({"a": [1, 2], "b": None})), bool(pk.structure(None))
            (2, True)
        """
        return self._num_leaves

    def __bool__(self) -> bool:
        return True

    def is_leaf(self, *, strict: bool = True) -> bool:
        """True when this spec is a single leaf; with ``strict=False``, when
        it is a single node: a leaf, ``None`` or an empty container (optree's
        ``PyTreeSpec.is_leaf``).

        Examples:
            >>> import pytree_kit as pk
            >>> pk.structure(1.0).is_leaf(), pk.structure([1.0]).is_leaf()
            (True, False)
            >>> pk.structure([]).is_leaf(), pk.structure([]).is_leaf(strict=False)
            (False, True)
        """
        if strict:
            return self._nodes[0][0] == kinds.LEAF
        return len(self._nodes) == 1

    @property
    def num_children(self) -> int:
        """How many children the root has (0 for a leaf and for None).

        Examples:
            >>> import pytree_kit as pk
            >>> pk.structure({"a": 1, "b": (2, 3)}).num_children
            2
        """
        return int(self._nodes[0][2])

    @property
    def type(self) -> Any:
        """The class of the root node, or None for a leaf, as optree's
        ``PyTreeSpec.type`` (``type(None)`` for None).

        Examples:
            >>> import pytree_kit as pk
            >>> pk.structure({"a": 1}).type, pk.structure(1).type
            (<class 'dict'>, None)
        """
        node = self._nodes[0]
        if node[0] == kinds.LEAF:
            return None
        builtin = _BUILTIN_TYPES.get(node[0])
        return builtin if builtin is not None else node[1]

    @property
    def kind(self) -> str:
        """The kind of the root node, as ``to_json`` names it: ``"leaf"``,
        ``"none"``, ``"tuple"``, ``"list"``, ``"dict"``, ``"ordereddict"``,
        ``"defaultdict"``, ``"deque"``, ``"namedtuple"``, ``"structseq"``,
        ``"dataclass"``, ``"attrs"``, ``"custom"`` (the protocol), ``"rule"``,
        ``"mapping"`` (a dict subclass or ``UserDict``) or ``"sequence"`` (a
        tuple or list subclass or ``UserList``) (optree gives an enum of its
        own kinds instead).

        Examples:
            >>> import pytree_kit as pk
            >>> pk.structure([1]).kind, pk.structure(None).kind, pk.structure(1).kind
            ('list', 'none', 'leaf')
        """
        return kinds.KIND_NAMES[self._nodes[0][0]]

    def entries(self) -> list:
        """What names each child of the root in a path, in leaf order: a
        dict's keys, a sequence's indices, the field names of a namedtuple,
        dataclass, attrs class or named structseq, a protocol class's keys or
        entries. Empty for a leaf and for None. (optree gives indices for a
        namedtuple's and a structseq's children.)

        Examples:
            >>> import pytree_kit as pk
            >>> pk.structure({"b": 1, "a": 2}).entries(), pk.structure((5, 6)).entries()
            (['a', 'b'], [0, 1])
        """
        node = self._nodes[0]
        out = []
        for i in range(node[2]):
            key = child_key(node, i)
            t = type(key)
            out.append(key.key if t is DictKey else key.idx if t is SequenceKey else key.name)
        return out

    @classmethod
    def leaf(cls) -> TreeSpec:
        """The spec of a single leaf, as ``structure(x)`` gives for a leaf ``x``.

        Examples:
            >>> import pytree_kit as pk
            >>> pk.TreeSpec.leaf() == pk.structure(1.0)
            True
        """
        return _LEAF_SPEC

    @classmethod
    def from_collection(cls, obj: Any, *, rules: Any = None) -> TreeSpec:
        """One spec from a container whose leaves are TreeSpecs: the container
        is the top of the new spec, and each TreeSpec is the subtree at its place.

        Any leaf that is not a TreeSpec raises TypeError naming its path.

        Examples:
            >>> import pytree_kit as pk
            >>> inner = pk.structure((0, 0))
            >>> pk.TreeSpec.from_collection({"a": inner, "b": pk.TreeSpec.leaf()})
            TreeSpec({'a': (*, *), 'b': *})
        """
        pairs, outer = _interface.engine.flatten_with_path(obj, _is_spec, check_rules(rules))
        for path, leaf in pairs:
            if type(leaf) is not TreeSpec:
                raise TypeError(
                    f"TreeSpec.from_collection: tree{''.join(map(str, path))} is "
                    f"{type(leaf).__qualname__}, not a TreeSpec"
                )
        return _substitute(outer, [leaf for _, leaf in pairs])

    def compose(self, inner: TreeSpec) -> TreeSpec:
        """The spec of a tree of this structure whose every leaf is a tree of
        ``inner``'s structure.

        Examples:
            >>> import pytree_kit as pk
            >>> outer, inner = pk.structure([0, 0]), pk.structure({"x": 0, "y": None})
            >>> outer.compose(inner)
            TreeSpec([{'x': *, 'y': None}, {'x': *, 'y': None}])
            >>> outer.compose(inner).num_leaves == outer.num_leaves * inner.num_leaves
            True
        """
        if type(inner) is not TreeSpec:
            raise TypeError(f"compose expects a TreeSpec, got {type(inner).__name__}")
        nodes, orders = _interface.engine.spec_compose(
            self._nodes, self._orders, inner._nodes, inner._orders
        )
        return TreeSpec._make(nodes, orders, self._num_leaves * inner._num_leaves)

    def is_prefix(self, other: TreeSpec, strict: bool = False) -> bool:
        """Whether ``other`` is this structure with some leaves replaced by
        subtrees (any structure is a prefix of itself unless ``strict``).

        ``a < b`` is ``a.is_prefix(b, strict=True)``, and ``a <= b`` is
        ``a.is_prefix(b)``, as in optree: a partial order consistent with ``==``.

        Examples:
            >>> import pytree_kit as pk
            >>> a, b = pk.structure([0, 0]), pk.structure([0, (0, 0)])
            >>> a.is_prefix(b), b.is_prefix(a), a.is_prefix(a, strict=True)
            (True, False, False)
            >>> a < b, a <= a, pk.TreeSpec.leaf() <= b
            (True, True, True)
        """
        if type(other) is not TreeSpec:
            raise TypeError(f"is_prefix expects a TreeSpec, got {type(other).__name__}")
        mine, theirs = self._nodes, other._nodes
        return bool(_interface.engine.spec_is_prefix(mine, theirs)) and not (
            strict and mine == theirs
        )

    def is_suffix(self, other: TreeSpec, strict: bool = False) -> bool:
        """Whether this structure is ``other`` with some leaves replaced by
        subtrees: ``a.is_suffix(b)`` is ``b.is_prefix(a)``, as optree defines
        it (any structure is a suffix of itself unless ``strict``).

        ``a > b`` is ``a.is_suffix(b, strict=True)``, and ``a >= b`` is
        ``a.is_suffix(b)``.

        Examples:
            >>> import pytree_kit as pk
            >>> a, b = pk.structure([0, 0]), pk.structure([0, (0, 0)])
            >>> b.is_suffix(a), a.is_suffix(b), b.is_suffix(b, strict=True)
            (True, False, False)
            >>> b > a, b >= b, b >= pk.TreeSpec.leaf()
            (True, True, True)
        """
        if type(other) is not TreeSpec:
            raise TypeError(f"is_suffix expects a TreeSpec, got {type(other).__name__}")
        return other.is_prefix(self, strict)

    def transform(
        self,
        f_node: Optional[Callable[[TreeSpec], TreeSpec]] = None,
        f_leaf: Optional[Callable[[TreeSpec], TreeSpec]] = None,
    ) -> TreeSpec:
        """A new spec made node by node, as optree's ``PyTreeSpec.transform``.

        ``f_node`` is called on the one-level spec of each node that is not a
        leaf (the node over a leaf per child: ``{'a': *, 'b': *}``, and
        ``None``, ``()`` for nodes with no children) and returns the node
        that takes its place: a one-level spec with as many children, whose
        children are the transformed subtrees, in leaf order. ``f_leaf`` is
        called on ``TreeSpec.leaf()`` for each leaf and returns any spec, the
        subtree that takes its place. A function left out keeps what it would
        be given. Calls are made children first, leaves left to right (as
        optree's): the root's node last.

        A result that is not a TreeSpec raises TypeError; an ``f_node`` result
        that is not a one-level spec of the same arity raises ValueError; both
        name the place in the spec, as ``tree[...]``.

        Examples:
            >>> import pytree_kit as pk
            >>> spec = pk.structure({"a": (1, 2), "b": [3, None]})
            >>> spec.transform(f_leaf=lambda leaf: pk.structure([0, 0]))
            TreeSpec({'a': ([*, *], [*, *]), 'b': [[*, *], None]})
            >>> def as_list(node):
            ...     if node.kind != "tuple":
            ...         return node
            ...     return pk.structure([0] * node.num_children)
            >>> spec.transform(as_list)
            TreeSpec({'a': [*, *], 'b': [*, None]})
            >>> spec.transform(lambda node: pk.structure([0]))  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: TreeSpec.transform: f_node returned TreeSpec([*]) for ... at tree['a']: ...
        """
        if f_node is None and f_leaf is None:
            return self
        nodes, orders = self._nodes, dict(self._orders)
        # children first: each node's replacement (a spec), by node index
        done: list = [None] * len(nodes)
        frames: list = []  # [node index, children left]
        for i, node in enumerate(nodes):
            if node[2]:
                frames.append([i, node[2]])
                continue
            done[i] = _transformed(nodes, orders, i, frames, f_node, f_leaf)
            while frames:
                top = frames[-1]
                top[1] -= 1
                if top[1]:
                    break
                frames.pop()
                j = top[0]
                done[j] = _transformed(nodes, orders, j, frames, f_node, f_leaf)
        out: list = []
        out_orders: list = []
        num_leaves = 0
        for i, node in enumerate(nodes):
            new = done[i]
            out_orders.extend((len(out) + j, o) for j, o in new._orders)
            if node[0] == kinds.LEAF:
                out.extend(new._nodes)
                num_leaves += new._num_leaves
            else:
                out.append(new._nodes[0])
        return TreeSpec._make(tuple(out), tuple(out_orders), num_leaves)

    def __le__(self, other: object) -> bool:
        if type(other) is not TreeSpec:
            return NotImplemented
        return self.is_prefix(other)

    def __lt__(self, other: object) -> bool:
        if type(other) is not TreeSpec:
            return NotImplemented
        return self.is_prefix(other, strict=True)

    def __ge__(self, other: object) -> bool:
        if type(other) is not TreeSpec:
            return NotImplemented
        return other.is_prefix(self)

    def __gt__(self, other: object) -> bool:
        if type(other) is not TreeSpec:
            return NotImplemented
        return other.is_prefix(self, strict=True)

    def paths(self) -> list[tuple]:
        """The path of each leaf, in leaf order, from the spec alone: what
        ``flatten_with_path`` pairs with the leaves of a tree of this structure.

        A new list each call. The paths (tuples of immutable keys) are made on
        the first call and kept with the spec, which is immutable: later calls
        copy the list (a tuple and its keys per leaf stay alive as long as the
        spec does, once ``paths()`` has been called).

        Examples:
            >>> import pytree_kit as pk
            >>> spec = pk.structure({"b": [0, 0], "a": 0})
            >>> [pk.keystr(p) for p in spec.paths()]
            ["['a']", "['b'][0]", "['b'][1]"]
            >>> spec.paths() == spec.paths() and spec.paths() is not spec.paths()
            True
        """
        return self._path_list().copy()

    def accessors(self) -> list[Accessor]:
        """An :class:`~pytree_kit.Accessor` per leaf, in leaf order: its path
        (equal to ``paths()[k]``), which fetches leaf ``k`` from a tree of
        this structure. optree's ``PyTreeSpec.accessors()``.

        Examples:
            >>> import pytree_kit as pk
            >>> spec = pk.structure({"b": [0, 0], "a": 0})
            >>> spec.accessors()
            [Accessor(['a']), Accessor(['b'][0]), Accessor(['b'][1])]
            >>> tree = {"a": 1, "b": [2, 3]}
            >>> [acc(tree) for acc in spec.accessors()] == spec.flatten_up_to(tree)
            True
        """
        return [accessor(p) for p in self._path_list()]

    def _path_list(self) -> list[tuple]:
        """The paths of the leaves, computed on the first call and kept (the
        list itself: ``paths()`` and ``accessors()`` hand out copies)."""
        paths = self._paths
        if paths is None:
            paths = _interface.engine.spec_paths(self._nodes)
            object.__setattr__(self, "_paths", paths)
        return paths

    def children(self) -> list[TreeSpec]:
        """The specs of the root's children, in leaf order.

        Examples:
            >>> import pytree_kit as pk
            >>> pk.structure({"a": 1, "b": (2, 3)}).children()
            [TreeSpec(*), TreeSpec((*, *))]
        """
        nodes = self._nodes
        out = []
        start = 1
        for _ in range(nodes[0][2]):
            end = _subtree_end(nodes, start)
            out.append(self._slice(start, end))
            start = end
        return out

    def _slice(self, start: int, end: int) -> TreeSpec:
        nodes = self._nodes[start:end]
        orders = tuple((i - start, o) for i, o in self._orders if start <= i < end)
        return TreeSpec._make(nodes, orders, sum(1 for n in nodes if n[0] == kinds.LEAF))

    # -- operations --------------------------------------------------------

    def unflatten(self, leaves: Iterable[Any]) -> Any:
        """Build a tree of this structure from leaves (any iterable but a
        str, bytes or mapping: see :func:`pytree_kit.unflatten`).

        Examples:
            >>> import pytree_kit as pk
            >>> pk.structure((1, [2, 3])).unflatten(["a", "b", "c"])
            ('a', ['b', 'c'])
        """
        return _interface.engine.unflatten(self, leaves)

    def flatten_up_to(self, tree: Any) -> list[Any]:
        """The leaves of ``tree``, which must have this structure.

        This is the fast path where the structure repeats, such as a training
        loop. Where the spec has a leaf, any value is taken whole (so the tree
        may hold a subtree there, as in jax). Raises ValueError naming the path
        of the first difference.

        Examples:
            >>> import pytree_kit as pk
            >>> spec = pk.structure({"x": 0, "y": [0, 0]})
            >>> spec.flatten_up_to({"y": [2, 3], "x": 1})
            [1, 2, 3]
            >>> spec.flatten_up_to({"x": 1, "y": (2, 3)})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            pytree_kit.StructureError: tree['y']: structure mismatch: the spec has a list of 2, ...
        """
        return _interface.engine.flatten_up_to(self, tree)

    def columns(self, trees: Iterable[Any]) -> list[list[Any]]:
        """The leaves of many trees of this structure, column by column:
        ``spec.columns(trees)[j][k]`` is leaf ``j`` of ``trees[k]``.

        It is ``flatten_up_to`` of each tree, transposed, in one call: a tree
        whose structure differs raises flatten_up_to's ValueError. Batching
        code (``collate``) uses it.

        Examples:
            >>> import pytree_kit as pk
            >>> spec = pk.structure({"x": 0, "y": 0})
            >>> spec.columns([{"x": 1, "y": 2}, {"x": 3, "y": 4}])
            [[1, 3], [2, 4]]
        """
        return _interface.engine.flatten_up_to_columns(self, trees)  # type: ignore[no-any-return]

    def to_json(self) -> str:
        """A stable, readable JSON document for this spec (see ``from_json``).

        Examples:
            >>> import pytree_kit as pk
            >>> spec = pk.structure({"a": [1, 2]})
            >>> pk.TreeSpec.from_json(spec.to_json()) == spec
            True
        """
        if type(self) is not TreeSpec:  # TreeSpec.to_json(x) with x not a spec
            raise TypeError(f"TreeSpec.to_json: expected a TreeSpec, got {type(self).__qualname__}")
        try:
            return nodes_to_json(self._nodes, self._orders, self._num_leaves)
        except Unwritable as e:
            path = next(tuple(k) for i, (_n, k) in enumerate(node_paths(self._nodes)) if i == e.at)
            raise TypeError(f"TreeSpec.to_json: the node at {where(path)}: {e}") from None

    @classmethod
    def from_json(
        cls, text: str | bytes, *, allow: Iterable[Any] = (), rules: Any = None
    ) -> TreeSpec:
        """Read a spec written by :meth:`to_json`.

        Never imports a module and never calls anything it was not allowed to:
        builtin and ``collections`` types always resolve; any other class (a
        namedtuple, a dataclass, a protocol class, a ``default_factory``) only
        when it is passed in ``allow``; a class flattened by a rule needs that
        rule in ``rules``. Anything else, and any malformed document, raises
        ValueError.

        Examples:
            >>> import collections, pytree_kit as pk
            >>> Point = collections.namedtuple("Point", "x y")
            >>> text = pk.structure([Point(1, 2), {"k": None}]).to_json()
            >>> pk.TreeSpec.from_json(text, allow=[Point])
            TreeSpec([Point(x=*, y=*), {'k': None}])
            >>> pk.TreeSpec.from_json(text)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: TreeSpec.from_json: class ...Point is not allowed; pass it in allow= ...
        """
        return TreeSpec._make(*nodes_from_json(text, allow=allow, rules=rules))

    # -- repr --------------------------------------------------------------

    def __repr__(self) -> str:
        return f"TreeSpec({_render(self._nodes, dict(self._orders))})"


def _is_spec(x: Any) -> bool:
    return type(x) is TreeSpec


def _transformed(
    nodes: tuple, orders: dict, i: int, frames: list, f_node: Any, f_leaf: Any
) -> TreeSpec:
    """What ``transform``'s function makes of node ``i``, checked (``frames``:
    ``[node index, children left]`` of each node above it, for the path)."""
    node = nodes[i]
    arity = node[2]
    leaf = node[0] == kinds.LEAF
    given = _LEAF_SPEC if leaf else _one_level(node, orders.get(i))
    func = f_leaf if leaf else f_node
    if func is None:
        return given
    new = func(given)
    if type(new) is TreeSpec and (
        leaf
        or (new._nodes[0][2] == arity and len(new._nodes) == arity + 1 and new._num_leaves == arity)
    ):
        return new
    path = [child_key(nodes[j], nodes[j][2] - left) for j, left in frames]
    place = f"the leaf at {where(path)}" if leaf else f"the node {given!r} at {where(path)}"
    if type(new) is not TreeSpec:
        raise TypeError(
            f"TreeSpec.transform: {'f_leaf' if leaf else 'f_node'} returned "
            f"{type(new).__qualname__} for {place}: it must return a TreeSpec"
        )
    raise ValueError(
        f"TreeSpec.transform: f_node returned {new!r} for {place}: it must return a "
        f"one-level spec of {arity} {'child' if arity == 1 else 'children'} "
        "(a node over a leaf per child)"
    )


def _one_level(node: tuple, order: Any) -> TreeSpec:
    """The spec of one node over a leaf per child (its insertion order kept)."""
    arity = node[2]
    orders = () if order is None else ((0, order),)
    return TreeSpec._make((node,) + (kinds.LEAF_NODE,) * arity, orders, arity)


def node_paths(nodes: tuple) -> Iterator[tuple[tuple, list]]:
    """Each node of a pre-order node tuple, with the keys of the path to it:
    a list the walk goes on changing (copy it to keep it)."""
    keys: list = []
    frames: list = []  # [node, children done]
    for node in nodes:
        if frames:
            fr = frames[-1]
            keys.append(child_key(fr[0], fr[1]))
            fr[1] += 1
        yield node, keys
        if node[2]:
            frames.append([node, 0])
            continue
        # this node is done: so is every frame whose last child it was
        if frames:
            keys.pop()
        while frames and frames[-1][1] == frames[-1][0][2]:
            frames.pop()
            if frames:
                keys.pop()


def child_key(node: tuple, i: int) -> Any:
    """The path key of child ``i`` of a container node, as the engines name it."""
    kind, aux = node[0], node[3]
    if kind == kinds.DICT or kind == kinds.ORDEREDDICT:
        return DictKey(aux[i])
    if kind == kinds.DEFAULTDICT:
        return DictKey(aux[1][i])
    if kind == kinds.MAPPING:
        return DictKey(aux[1][i])
    if kind == kinds.NAMEDTUPLE:
        return GetAttrKey(aux[i])
    if kind == kinds.DATACLASS or kind == kinds.ATTRS:
        return GetAttrKey(aux[0][i])
    if kind == kinds.CUSTOM or kind == kinds.RULE:
        tail = user_tail(kind, aux)
        keys = tail[2] if len(tail) == 3 else tail[1]
        return SequenceKey(i) if keys is None else DictKey(keys[i])
    if kind == kinds.STRUCTSEQ:
        # named when every item has a name (as _pure._structseq_node decides)
        t = node[1]
        names = getattr(t, "__match_args__", ())
        if t.n_unnamed_fields == 0 and len(names) == node[2]:
            return GetAttrKey(names[i])
    return SequenceKey(i)  # tuple, list, deque, sequence, other structseqs


def _substitute(outer: TreeSpec, inners: list) -> TreeSpec:
    """``outer`` with its leaf number k replaced by the spec ``inners[k]``."""
    nodes: list = []
    orders: list = []
    outer_orders = dict(outer._orders)
    k = 0
    for i, node in enumerate(outer._nodes):
        if node[0] == kinds.LEAF:
            inner = inners[k]
            k += 1
            orders.extend((len(nodes) + j, o) for j, o in inner._orders)
            nodes.extend(inner._nodes)
            continue
        if i in outer_orders:
            orders.append((len(nodes), outer_orders[i]))
        nodes.append(node)
    return TreeSpec._make(tuple(nodes), tuple(orders), sum(inner._num_leaves for inner in inners))


def _from_state(nodes: tuple, orders: tuple) -> TreeSpec:
    """The spec a pickle holds. A structseq node pickled when the values
    outside its sequence were in the spec (a non-empty aux) reads as a
    structseq node of today, aux ``()``, as from_json reads such a node."""
    if any(n[0] == kinds.STRUCTSEQ and n[3] for n in nodes):
        nodes = tuple((n[0], n[1], n[2], ()) if n[0] == kinds.STRUCTSEQ else n for n in nodes)
    return TreeSpec._make(nodes, orders, sum(1 for n in nodes if n[0] == kinds.LEAF))


def _subtree_end(nodes: tuple, start: int) -> int:
    """The index just past the subtree whose root is nodes[start]."""
    need = 1
    i = start
    while need:
        need += nodes[i][2] - 1
        i += 1
    return i


def _name(t: Any) -> str:
    return getattr(t, "__name__", None) or repr(t)


def _parts(node: tuple, order: Any) -> tuple[str, str, list | None]:
    """(opening text, closing text, per-child prefixes) of a container node."""
    kind, t, arity, aux = node
    if kind == kinds.TUPLE:
        return "(", ",)" if arity == 1 else ")", None
    if kind == kinds.LIST:
        return "[", "]", None
    if kind == kinds.DICT:
        return "{", "}", [f"{k!r}: " for k in aux]
    if kind == kinds.ORDEREDDICT:
        return "OrderedDict({", "})", [f"{k!r}: " for k in aux]
    if kind == kinds.DEFAULTDICT:
        return (
            f"defaultdict({_name(aux[0]) if aux[0] else None}, {{",
            "})",
            [f"{k!r}: " for k in aux[1]],
        )
    if kind == kinds.DEQUE:
        return "deque([", "])" if aux is None else f"], maxlen={aux})", None
    if kind == kinds.MAPPING:
        factory = f"{_name(aux[2]) if aux[2] else None}, " if aux[0] == "defaultdict" else ""
        return f"{_name(t)}({factory}{{", "})", [f"{k!r}: " for k in aux[1]]
    if kind == kinds.SEQUENCE:
        return f"{_name(t)}([", "])", None
    if kind == kinds.NAMEDTUPLE:
        return f"{_name(t)}(", ")", [f"{f}=" for f in aux]
    if kind == kinds.STRUCTSEQ:
        names = getattr(t, "__match_args__", ())
        label = f"{getattr(t, '__module__', '')}.{_name(t)}".lstrip(".")
        if t.n_unnamed_fields == 0 and len(names) == arity:
            return f"{label}(", ")", [f"{f}=" for f in names]
        return f"{label}(", ")", None
    if kind == kinds.DATACLASS or kind == kinds.ATTRS:
        names, static, _absent, _dk = aux
        tail = "".join(f", {n}={v!r}" for n, v in static)
        if not names:
            tail = tail[2:]
        return f"{_name(t)}(", tail + ")", [f"{n}=" for n in names]
    if kind == kinds.CUSTOM or kind == kinds.RULE:
        given = user_tail(kind, aux)
        user_aux, keys = given[0], given[1]
        end = f"aux={user_aux!r})"
        if len(given) == 3:  # entries: named children, unflattened as a tuple
            return f"{_name(t)}(", ", " + end, [f"[{k!r}]=" for k in given[2]]
        if keys is not None:
            return f"{_name(t)}({{", "}, " + end, [f"{k!r}: " for k in keys]
        return f"{_name(t)}(", (", " if arity else "") + end, None
    raise ValueError(f"unknown node kind {kind!r}")  # pragma: no cover


def render(spec: TreeSpec, leaves: Iterable[str]) -> str:
    """The spec's structure as its repr writes it, with ``leaves`` (one text per
    leaf, in order) in place of the ``*`` marks. Reads the spec alone: no
    container is rebuilt, so no ``__tree_unflatten__`` or rule runs."""
    texts = list(leaves)
    if len(texts) != spec.num_leaves:
        raise ValueError(f"render: {len(texts)} leaf texts for a spec of {spec.num_leaves} leaves")
    return _render(spec._nodes, dict(spec._orders), texts)


def _render(nodes: tuple, orders: dict, leaves: list | None = None) -> str:
    """Pre-order rendering with an explicit stack: linear in the spec's size."""
    out: list = []
    leaf = 0
    frames: list = []  # [arity, children done, closing text, prefixes]
    for idx, node in enumerate(nodes):
        if frames:
            fr = frames[-1]
            if fr[1]:
                out.append(", ")
            if fr[3] is not None:
                out.append(fr[3][fr[1]])
            fr[1] += 1
        kind = node[0]
        if kind == kinds.LEAF:
            out.append("*" if leaves is None else leaves[leaf])
            leaf += 1
        elif kind == kinds.NONE:
            out.append("None")
        else:
            opening, closing, prefixes = _parts(node, orders.get(idx))
            out.append(opening)
            if node[2]:
                frames.append([node[2], 0, closing, prefixes])
                continue
            out.append(closing)
        while frames and frames[-1][1] == frames[-1][0]:
            out.append(frames.pop()[2])
    return "".join(out)


_LEAF_SPEC = TreeSpec._make((kinds.LEAF_NODE,), (), 1)

#: the class of each builtin kind's node, which the node does not keep
_BUILTIN_TYPES = {
    kinds.NONE: type(None),
    kinds.TUPLE: tuple,
    kinds.LIST: list,
    kinds.DICT: dict,
    kinds.ORDEREDDICT: collections.OrderedDict,
    kinds.DEFAULTDICT: collections.defaultdict,
    kinds.DEQUE: collections.deque,
}
