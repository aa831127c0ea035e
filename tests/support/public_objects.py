"""What every public function gives back, checked object by object: run as
``python -m tests.support.public_objects`` under one engine, it prints, as JSON, for
every object in every result (the result, and what its lists, tuples and
dicts hold), whether a weak reference to it can be made, what pickling it
gives, whether it iterates and what, and its repr. ``test_public_objects``
runs it under both engines and compares: an object the pure engine gives
back must behave as the C engine's does (``weakref.ref`` of ``tree_iter``'s
iterator once worked on one engine only).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pickle
import weakref
from collections import OrderedDict, namedtuple
from typing import Any, Callable

import pytree_kit as pk

Point = namedtuple("Point", "x y")


@dataclasses.dataclass
class Box:
    lo: Any
    hi: Any


def tree() -> Any:
    """A fresh tree of each kind of node."""
    return {
        "a": [1, (2.5, None)],
        "p": Point(3, "s"),
        "b": Box(lo=[4], hi=OrderedDict(k=5)),
    }


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def calls() -> dict[str, Callable[[], Any]]:
    """Each public function (and TreeSpec method) called on a fresh tree; not
    ``engine_info`` (it names the engine) nor ``jax_rules`` (it needs jax),
    and ``optree_rules`` only where optree is installed (it imports it)."""
    spec = pk.structure(tree())
    path = pk.flatten_with_path(tree())[0][1][0]
    inc = lambda x: x + 1 if isinstance(x, int) else x  # noqa: E731
    return {
        "flatten": lambda: pk.flatten(tree()),
        "tree_flatten": lambda: pk.tree_flatten(tree()),
        "structure": lambda: pk.structure(tree()),
        "tree_structure": lambda: pk.tree_structure(tree()),
        "leaves": lambda: pk.leaves(tree()),
        "tree_leaves": lambda: pk.tree_leaves(tree()),
        "tree_iter": lambda: pk.tree_iter(tree()),
        "flatten_with_path": lambda: pk.flatten_with_path(tree()),
        "flatten_with_accessor": lambda: pk.flatten_with_accessor(tree()),
        "flatten_keystr": lambda: pk.flatten_keystr(tree()),
        "flatten_one_level": lambda: pk.flatten_one_level(tree()),
        "unflatten": lambda: pk.unflatten(spec, list(range(spec.num_leaves))),
        "tree_unflatten": lambda: pk.tree_unflatten(spec, list(range(spec.num_leaves))),
        "unflatten_keystr": lambda: pk.unflatten_keystr(spec, pk.flatten_keystr(tree())),
        "tree_map": lambda: pk.tree_map(inc, tree()),
        "tree_map_with_path": lambda: pk.tree_map_with_path(lambda p, x: len(p), tree()),
        "tree_map_only": lambda: pk.tree_map_only(int, inc, tree()),
        "tree_partition": lambda: pk.tree_partition(lambda x: isinstance(x, int), tree()),
        "tree_replace_nones": lambda: pk.tree_replace_nones(0, tree()),
        "tree_broadcast_prefix": lambda: pk.tree_broadcast_prefix({"a": 0, "p": 1, "b": 2}, tree()),
        "tree_transpose": lambda: pk.tree_transpose(
            pk.structure([0, 0]), pk.structure({"x": 0}), [{"x": 1}, {"x": 2}]
        ),
        "tree_equal": lambda: pk.tree_equal(tree(), tree()),
        "tree_get": lambda: pk.tree_get(tree(), path),
        "tree_set": lambda: pk.tree_set(tree(), path, 9),
        "tree_at": lambda: pk.tree_at(lambda t: t["a"][0], tree(), 7),
        "tree_reduce": lambda: pk.tree_reduce(lambda a, b: f"{a}{b}", tree(), ""),
        "tree_sum": lambda: pk.tree_sum(pk.tree_map(str, tree()), start=""),
        "tree_max": lambda: pk.tree_max(tree(), key=str),
        "tree_any": lambda: pk.tree_any(tree()),
        "tree_all_only": lambda: pk.tree_all_only(int, bool, tree()),
        "tree_min": lambda: pk.tree_min(tree(), key=str),
        "tree_all": lambda: pk.tree_all(tree()),
        "tree_any_only": lambda: pk.tree_any_only(int, bool, tree()),
        "tree_combine": lambda: pk.tree_combine(tree(), tree()),
        "traverse": lambda: pk.traverse(lambda x: None, tree()),
        "traverse bottom-up": lambda: pk.traverse(
            lambda x: pk.MAP_TO_NONE if x == 1 else None, tree(), top_down=False
        ),
        "assert_same_structure": lambda: pk.assert_same_structure(tree(), tree()),
        **({"optree_rules": lambda: pk.optree_rules()} if _has("optree") else {}),
        "keystr": lambda: pk.keystr(path),
        "parse_keystr": lambda: pk.parse_keystr(pk.keystr(path)),
        "TreeSpec.children": lambda: pk.structure(tree()).children(),
        "TreeSpec.paths": lambda: pk.structure(tree()).paths(),
        "TreeSpec.accessors": lambda: pk.structure(tree()).accessors(),
        "Accessor": lambda: pk.structure(tree()).accessors()[0](tree()),
        "TreeSpec.is_suffix": lambda: pk.structure(tree()).is_suffix(pk.structure([0, 0, 0])),
        "TreeSpec.transform": lambda: pk.structure(tree()).transform(
            lambda n: n, lambda x: pk.structure((0, None))
        ),
        "TreeSpec.unflatten": lambda: pk.structure(tree()).unflatten(range(spec.num_leaves)),
        "TreeSpec.flatten_up_to": lambda: pk.structure(tree()).flatten_up_to(tree()),
        "TreeSpec.compose": lambda: pk.structure([0, 0]).compose(pk.structure(tree())),
        "TreeSpec.columns": lambda: pk.structure(tree()).columns([tree(), tree()]),
        "TreeSpec.to_json": lambda: pk.structure(tree()).to_json(),
        "TreeSpec.from_json": lambda: pk.TreeSpec.from_json(pk.structure([1, (2,)]).to_json()),
        "TreeSpec.leaf": lambda: pk.TreeSpec.leaf(),
        "TreeSpec.from_collection": lambda: pk.TreeSpec.from_collection(
            [pk.TreeSpec.leaf(), pk.structure({"x": 0})]
        ),
    }


def objects(x: Any, found: list) -> list:
    """x, then what its lists, tuples and dicts hold, depth first."""
    found.append(x)
    if type(x) in (list, tuple):
        for y in x:
            objects(y, found)
    elif type(x) is dict:
        for y in x.values():
            objects(y, found)
    return found


def outcome(fn: Callable[[], Any]) -> list:
    try:
        return ["ok", fn()]
    except Exception as exc:
        return ["raise", type(exc).__name__]


def check(x: Any) -> dict:
    """What one object does, as comparable values."""

    def pickled() -> Any:
        back = pickle.loads(pickle.dumps(x))
        return repr(back) == repr(x)

    def iterated() -> Any:
        return [repr(y) for y in iter(x)]

    return {
        "type": type(x).__name__,
        "weakref": outcome(lambda: weakref.ref(x)() is x),
        "pickle": outcome(pickled),
        "iter": outcome(iterated),
        "repr": repr(x),
    }


def main() -> None:
    report = {}
    for name, call in calls().items():
        count = len(objects(call(), []))
        # a fresh result for each object and each check: iterating consumes
        report[name] = [check(objects(call(), [])[k]) for k in range(count)]
    print(json.dumps({"engine": pk.ENGINE, "report": report}))


if __name__ == "__main__":
    main()
