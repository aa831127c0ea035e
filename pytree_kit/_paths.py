"""Paths into a tree: read and replace what stands at a path, select places
with a function (``tree_at``), and paths as text both ways (``parse_keystr``,
``flatten_keystr``).

A path is a tuple of :class:`DictKey`, :class:`SequenceKey` and
:class:`GetAttrKey`, as ``flatten_with_path`` gives them; every function here
takes one, or its text as :func:`keystr` writes it. A child is found the way
the engines flatten, so every kind of node works, ``rules=`` included, and a
class reached through ``__tree_flatten__`` is read through it.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable, Mapping, Optional, Union

from . import _interface
from ._keys import Accessor, DictKey, GetAttrKey, SequenceKey, accessor, keystr
from ._keys import where as _place
from ._kinds import check_rules
from ._messages import describe_node
from ._pure import check_path, child_at
from ._spec import TreeSpec, _subtree_end, child_key

__all__ = [
    "flatten_keystr",
    "flatten_with_accessor",
    "parse_keystr",
    "tree_at",
    "tree_get",
    "tree_set",
    "unflatten_keystr",
]

IsLeaf = Optional[Callable[[Any], bool]]
PathLike = Union[tuple, list, str]


# -- text -> path ------------------------------------------------------------

# a number as repr writes an int or a float (inf and nan are spelled out)
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?(?:[0-9]+\.[0-9]*(?:e[+-]?[0-9]+)?|[0-9]+e[+-]?[0-9]+|inf|nan)")
_WORDS = {"True": True, "False": False, "None": None}


def parse_keystr(text: str, *, spec: Optional[TreeSpec] = None) -> tuple:
    """The path that :func:`keystr` wrote as ``text``: its inverse.

    ``parse_keystr(keystr(p)) == p`` for every path whose mapping keys are
    str, bytes, bool, None, int or float. An int key is written as a position
    in a sequence is (``[3]``), as in jax, so it reads back as a
    :class:`SequenceKey`; given the ``spec`` the path belongs to, each ``[3]``
    becomes what that spec has there, so every path of the spec reads back
    exactly, and a path the spec does not have raises ValueError.

    Only these literals are read (``ast.literal_eval`` of one string literal
    at most): no text is ever evaluated as code. Anything else raises
    ValueError naming the position.

    Examples:
        >>> import pytree_kit as pk
        >>> path = pk.parse_keystr("['targets'][3].boxes")
        >>> path
        (DictKey(key='targets'), SequenceKey(idx=3), GetAttrKey(name='boxes'))
        >>> pk.keystr(path)
        "['targets'][3].boxes"
        >>> spec = pk.structure({3: {"a.b]": 0}})
        >>> pk.parse_keystr("[3]['a.b]']", spec=spec)
        (DictKey(key=3), DictKey(key='a.b]'))
    """
    if type(text) is not str:
        raise TypeError(f"parse_keystr expects a str, got {type(text).__name__}")
    path = _parse(text)
    if spec is not None:
        if type(spec) is not TreeSpec:
            raise TypeError(f"parse_keystr: spec must be a TreeSpec, got {type(spec).__name__}")
        path = _resolve_in_spec(path, spec, text)
    return path


def _bad(text: str, at: int, what: str) -> ValueError:
    return ValueError(f"parse_keystr: {what} at position {at} of {text!r}")


def _parse(text: str) -> tuple:
    keys: list = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == ".":
            j = i + 1
            while j < n and text[j] not in ".[":
                j += 1
            name = text[i + 1 : j]
            if not name.isidentifier():
                raise _bad(text, i + 1, f"an attribute name expected, got {name!r}")
            keys.append(GetAttrKey(name))
            i = j
        elif c == "[":
            key, i = _bracket(text, i + 1)
            keys.append(key)
        else:
            raise _bad(text, i, f"'.' or '[' expected, got {c!r}")
    return tuple(keys)


def _bracket(text: str, i: int) -> tuple:
    """The key written from text[i] up to its ']', and the index past it."""
    n = len(text)
    start = i
    if i < n and text[i] in "bB" and i + 1 < n and text[i + 1] in "'\"":
        i += 1
    if i < n and text[i] in "'\"":
        quote = text[i]
        j = i + 1
        while j < n and text[j] != quote:
            j += 2 if text[j] == "\\" else 1
        if j >= n:
            raise _bad(text, start, "an unterminated string")
        token = text[start : j + 1]
        try:
            value = ast.literal_eval(token)  # one string literal: never code
        except (SyntaxError, ValueError) as e:
            raise _bad(text, start, f"a malformed string ({e})") from None
        if j + 1 >= n or text[j + 1] != "]":
            raise _bad(text, j + 1, "']' expected")
        return DictKey(value), j + 2
    end = text.find("]", i)
    if end < 0:
        raise _bad(text, start - 1, "an unclosed '['")
    token = text[i:end]
    if _INT.fullmatch(token):
        return SequenceKey(int(token)), end + 1
    if token in _WORDS:
        return DictKey(_WORDS[token]), end + 1
    if _FLOAT.fullmatch(token):
        return DictKey(float(token)), end + 1
    raise _bad(
        text,
        i,
        "a key expected (a position, or a str, bytes, bool, None, int or float "
        f"literal), got {token!r}",
    )


def _resolve_in_spec(path: tuple, spec: TreeSpec, text: str) -> tuple:
    """The path with each ``[int]`` read as the spec's node has it."""
    nodes = spec._nodes
    at = 0  # the index of the node the path has reached
    out: list = []
    for key in path:
        node = nodes[at]
        child = at + 1
        for i in range(node[2]):
            k = child_key(node, i)
            if k == key or (type(key) is SequenceKey and k == DictKey(key.idx)):
                out.append(k)
                at = child
                break
            child = _subtree_end(nodes, child)
        else:
            raise ValueError(
                f"parse_keystr: {text!r} is not a path of the spec: "
                f"{_place(out)} is {describe_node(node)}, which has no {key}"
            )
    return tuple(out)


# -- reading and replacing at a path -------------------------------------------


def _as_path(path: PathLike) -> tuple:
    if type(path) is str:
        return _parse(path)
    if type(path) is Accessor:
        return tuple(path)  # its keys were checked when it was made
    if type(path) is not tuple and type(path) is not list:
        raise TypeError(f"a path is a tuple of keys or its keystr text, got {type(path).__name__}")
    return check_path(tuple(path))


def tree_get(tree: Any, path: PathLike, *, is_leaf: IsLeaf = None, rules: Any = None) -> Any:
    """What stands at ``path`` in ``tree``: a leaf or a subtree.

    ``path`` is a tuple of keys (as ``flatten_with_path`` gives) or its
    :func:`keystr` text. A path that is not in the tree raises KeyError (or
    IndexError, for a position) naming the part of the path that exists and
    what stands there.

    Examples:
        >>> import pytree_kit as pk
        >>> tree = {"targets": [{"boxes": 1}, {"boxes": 2}]}
        >>> pk.tree_get(tree, "['targets'][1]['boxes']")
        2
        >>> pk.tree_get(tree, "['targets'][5]")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        IndexError: tree_get: tree['targets'] is a list of 2, which has no [5]
    """
    if type(path) is not tuple:
        path = _as_path(path)  # a tuple's keys are checked as the engine reads them
    return _interface.engine.tree_get(tree, path, is_leaf, rules)


def flatten_with_accessor(
    tree: Any, *, is_leaf: IsLeaf = None, rules: Any = None
) -> tuple[list[tuple[Accessor, Any]], TreeSpec]:
    """Like :func:`pytree_kit.flatten_with_path`, with each path an
    :class:`~pytree_kit.Accessor`: a path that fetches its leaf from a tree
    of the same structure (optree's ``tree_flatten_with_accessor``, which
    gives ``(accessors, leaves, treespec)`` instead of pairs).

    ``spec.accessors()`` gives the same accessors from a spec.

    Examples:
        >>> import pytree_kit as pk
        >>> pairs, spec = pk.flatten_with_accessor({"b": (2, [3]), "a": 1})
        >>> pairs
        [(Accessor(['a']), 1), (Accessor(['b'][0]), 2), (Accessor(['b'][1][0]), 3)]
        >>> fresh = spec.unflatten(["x", "y", "z"])
        >>> [acc(fresh) for acc, _ in pairs]
        ['x', 'y', 'z']
    """
    pairs, spec = _interface.engine.flatten_with_path(tree, is_leaf, check_rules(rules))
    return [(accessor(p), x) for p, x in pairs], spec


def tree_set(
    tree: Any, path: PathLike, value: Any, *, is_leaf: IsLeaf = None, rules: Any = None
) -> Any:
    """A new tree with ``value`` at ``path``; ``tree`` itself is not changed.

    Every node on the path is rebuilt (frozen dataclasses and namedtuples
    too, as ``unflatten`` rebuilds them: dict orders, static fields and aux
    data kept); every subtree off the path is shared with ``tree``, not
    copied. A path that is not in the tree raises as :func:`tree_get` does.

    Examples:
        >>> import pytree_kit as pk
        >>> tree = {"a": [1, 2], "b": {"c": 3}}
        >>> new = pk.tree_set(tree, "['a'][1]", 20)
        >>> new, tree
        ({'a': [1, 20], 'b': {'c': 3}}, {'a': [1, 2], 'b': {'c': 3}})
        >>> new["b"] is tree["b"]
        True
    """
    keys = _as_path(path)
    rules = check_rules(rules)
    chain = []
    node = tree
    for depth in range(len(keys)):
        children, spec, i = child_at("tree_set", node, keys, depth, is_leaf, rules)
        chain.append((children, spec, i))
        node = children[i]
    for children, spec, i in reversed(chain):
        if spec is None and type(children) is dict:
            new: Any = dict(children)  # insertion order and key objects kept
            new[i] = value
        elif spec is None and type(children) is tuple:
            new = (*children[:i], value, *children[i + 1 :])
        else:
            new = list(children)
            new[i] = value
            if spec is not None:
                new = _interface.engine.unflatten(spec, new)
        value = new
    return value


class _Mark:
    """What stands for a leaf in the tree ``tree_at`` hands to ``where``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<leaf {self.index} of the tree>"


_NOTHING: Any = object()


def tree_at(
    where: Callable[[Any], Any],
    tree: Any,
    replace: Any = _NOTHING,
    replace_fn: Any = _NOTHING,
    *,
    is_leaf: IsLeaf = None,
    rules: Any = None,
) -> Any:
    """A new tree with the places that ``where`` selects replaced, as
    equinox's ``tree_at``; ``tree`` itself is not changed.

    ``where(t)`` is called on a copy of the tree's structure and returns one
    node or leaf of it (``lambda t: t.layers[0].weight``), or a tuple or list
    of them. Each is replaced by ``replace`` (a sequence of as many values,
    when ``where`` returns a sequence) or by ``replace_fn(old)``; pass exactly
    one of the two. Subtrees off the replaced paths are shared, as in
    :func:`tree_set`.

    A selection that is not in the tree, is given twice, lies inside another,
    or cannot be told apart (None, or an empty tuple, standing at several
    places: pass ``is_leaf=lambda x: x is None`` to select None leaves)
    raises ValueError.

    Examples:
        >>> import pytree_kit as pk
        >>> tree = {"w": [1, 2], "b": (3, 4)}
        >>> pk.tree_at(lambda t: t["w"][0], tree, 10)
        {'w': [10, 2], 'b': (3, 4)}
        >>> pk.tree_at(lambda t: (t["w"], t["b"][1]), tree, replace_fn=lambda x: x * 2)
        {'w': [1, 2, 1, 2], 'b': (3, 8)}
    """
    if (replace is _NOTHING) == (replace_fn is _NOTHING):
        raise ValueError("tree_at: pass exactly one of replace and replace_fn")
    rules = check_rules(rules)
    leaves, spec = _interface.engine.flatten(tree, is_leaf, rules)
    shadow = _interface.engine.unflatten(spec, [_Mark(i) for i in range(len(leaves))])

    def stop_at_marks(x: Any) -> bool:
        return type(x) is _Mark or (is_leaf is not None and bool(is_leaf(x)))

    chosen = where(shadow)
    paths = _places(shadow, [chosen], stop_at_marks, rules, spec)
    if paths[0] is not None:
        selected, values = [paths[0]], [replace]
    elif type(chosen) is tuple or type(chosen) is list:
        found = _places(shadow, list(chosen), stop_at_marks, rules, spec)
        for obj, p in zip(chosen, found):
            if p is None:
                raise _not_in_tree(obj, found, shadow, stop_at_marks, rules)
        selected = found  # type: ignore[assignment]
        if replace is _NOTHING:
            values = [_NOTHING] * len(selected)
        else:
            values = list(replace)
            if len(values) != len(selected):
                raise ValueError(
                    f"tree_at: where selected {len(selected)} places, "
                    f"but replace has {len(values)} values"
                )
    else:
        raise _not_in_tree(chosen, [], shadow, stop_at_marks, rules)
    out = tree
    for p, v in zip(selected, values):
        if replace_fn is not _NOTHING:
            v = replace_fn(tree_get(tree, p, is_leaf=is_leaf, rules=rules))
        out = tree_set(out, p, v, is_leaf=is_leaf, rules=rules)
    return out


def _places(
    shadow: Any, objs: list, stop: Callable[[Any], bool], rules: Any, spec: TreeSpec
) -> list:
    """The path of each of ``objs`` in ``shadow`` (found by identity), or None."""
    wanted: dict = {}
    for k, obj in enumerate(objs):
        if obj is None:
            raise ValueError(
                "tree_at: where selected None; to select a None of the tree, "
                "pass is_leaf=lambda x: x is None"
            )
        if id(obj) in wanted:
            raise ValueError(f"tree_at: where selected {_what(obj, spec)} twice")
        wanted[id(obj)] = k

    def stop_here(x: Any) -> bool:
        return id(x) in wanted or stop(x)

    pairs, _ = _interface.engine.flatten_with_path(shadow, stop_here, rules)
    out: list = [None] * len(objs)
    for path, leaf in pairs:
        at = wanted.get(id(leaf))
        if at is None:
            continue
        if out[at] is not None:
            raise ValueError(
                f"tree_at: where selected {_what(leaf)}, which stands at "
                f"{_place(out[at])} and at {_place(path)}: it cannot be told which is meant"
            )
        out[at] = path
    return out


def _what(obj: Any, spec: Optional[TreeSpec] = None) -> str:
    if type(obj) is _Mark:
        return f"the leaf at {_place(spec.paths()[obj.index])}" if spec else "a leaf"
    if obj is None:
        return "None"
    name = type(obj).__qualname__
    return f"{'an' if name[:1] in 'aeiouAEIOU' else 'a'} {name}"


def _not_in_tree(
    obj: Any, found: list, shadow: Any, stop: Callable[[Any], bool], rules: Any
) -> ValueError:
    for p in found:
        if p is None:
            continue
        pairs, _ = _interface.engine.flatten_with_path(
            tree_get(shadow, p, rules=rules), lambda x: x is obj or stop(x), rules
        )
        for rest, x in pairs:
            if x is obj:
                return ValueError(
                    f"tree_at: where selected {_place(p)} and {_place(p + rest)} "
                    "inside it; select one or the other"
                )
    return ValueError(
        f"tree_at: where returned {_what(obj)}, which is not a node or leaf of the tree "
        "(where must return parts of the tree it is given, or a tuple or list of them)"
    )


# -- a flat dict keyed by keystr -------------------------------------------------


def flatten_keystr(tree: Any, *, is_leaf: IsLeaf = None, rules: Any = None) -> dict[str, Any]:
    """The leaves of ``tree`` in a dict keyed by the :func:`keystr` of their
    paths, in leaf order: a flat view for checkpoints and loggers.

    :func:`unflatten_keystr` with the tree's spec turns it back. Keys holding
    dots and brackets are quoted, so they read back unchanged. Two leaves
    whose paths write the same text (keys of your own types with equal
    reprs) raise ValueError rather than losing one.

    Examples:
        >>> import pytree_kit as pk
        >>> flat = pk.flatten_keystr({"enc.layer": [1, 2], "head": {"w[0]": 3}})
        >>> flat
        {"['enc.layer'][0]": 1, "['enc.layer'][1]": 2, "['head']['w[0]']": 3}
        >>> spec = pk.structure({"enc.layer": [0, 0], "head": {"w[0]": 0}})
        >>> pk.unflatten_keystr(spec, flat)
        {'enc.layer': [1, 2], 'head': {'w[0]': 3}}
    """
    pairs, _ = _interface.engine.flatten_with_path(tree, is_leaf, check_rules(rules))
    out: dict = {}
    for path, leaf in pairs:
        text = keystr(path)
        if text in out:
            raise ValueError(f"flatten_keystr: two leaves have the path text {text!r}")
        out[text] = leaf
    return out


def unflatten_keystr(spec: TreeSpec, mapping: Mapping[str, Any]) -> Any:
    """The tree of ``spec``'s structure whose leaves ``mapping`` holds under
    the :func:`keystr` of their paths: the inverse of :func:`flatten_keystr`.

    A missing key raises KeyError, and a key the spec has no leaf for raises
    ValueError, each naming the keys.

    Examples:
        >>> import pytree_kit as pk
        >>> spec = pk.structure({"a": [0, 0]})
        >>> pk.unflatten_keystr(spec, {"['a'][1]": "y", "['a'][0]": "x"})
        {'a': ['x', 'y']}
    """
    if type(spec) is not TreeSpec:
        raise TypeError(f"unflatten_keystr expects a TreeSpec, got {type(spec).__name__}")
    names = [keystr(p) for p in spec.paths()]
    if len(set(names)) != len(names):
        raise ValueError("unflatten_keystr: two leaves of the spec have the same path text")
    missing = [n for n in names if n not in mapping]
    if missing:
        raise KeyError(f"unflatten_keystr: no value for {_listed(missing)}")
    if len(mapping) != len(names):
        known = set(names)
        extra = [k for k in mapping if k not in known]
        raise ValueError(f"unflatten_keystr: the spec has no leaf at {_listed(extra)}")
    return _interface.engine.unflatten(spec, [mapping[n] for n in names])


def _listed(texts: list) -> str:
    shown = ", ".join(map(repr, texts[:5]))
    return shown + (f" and {len(texts) - 5} more" if len(texts) > 5 else "")
