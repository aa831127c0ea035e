"""Threads that change the containers of a tree while eight threads read it.

One thread keeps changing one container of a shared tree (a dict, a
defaultdict, an OrderedDict, a deque, a list, a record's ``__dict__``) by
known single steps; seven flatten, ``tree_map`` and ``flatten_up_to`` the
tree at once, and every result is checked against the states the container
passed through (``scripts/thread_race.py``): ``unflatten(spec, leaves)``
rebuilds a tree whose container is one of them, key order and values
included, or the call raised the documented ``RuntimeError`` at the
container's path. Each run is bounded in time (``PYTREE_KIT_RACE_SECONDS``
per case, 2.5 s by default) and says whether the GIL was on.

They run on whichever engine the suite runs with (``PYTREE_KIT_PURE=1`` for
the pure one), with the GIL or, on a free-threaded CPython, without it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from typing import Any

import pytest

import pytree_kit as pk
from scripts import thread_race
from scripts.thread_race import KINDS, describe_interpreter, failures, gil_enabled, race

SECONDS = float(os.environ.get("PYTREE_KIT_RACE_SECONDS", "2.5"))
#: at most this many calls per case (they take about SECONDS on 2 cores)
TRIES = int(os.environ.get("PYTREE_KIT_RACE_TRIES", "200000"))


def _report(kind: str, n: int, counts: Any, examples: list) -> str:
    detail = ", ".join(f"{k}: {v}" for k, v in counts.most_common())
    lines = [f"{describe_interpreter()}; {kind}: {n} calls ({detail})"]
    lines += [f"  e.g. {e}" for e in examples]
    return "\n".join(lines)


#: CPython 3.13's OrderedDict is not itself thread-safe without the GIL: with
#: one thread changing it and others reading it, its own ``pop`` of a key it
#: holds raises KeyError, and reads crash (python/cpython#125996, made safe in
#: 3.14 by python/cpython#133734); whatever the engine, there is nothing to check
_ODICT_UNSAFE = bool(sysconfig.get_config_var("Py_GIL_DISABLED")) and sys.version_info < (3, 14)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(
            k,
            marks=pytest.mark.skipif(
                k == "ordereddict" and _ODICT_UNSAFE,
                reason="CPython 3.13t's OrderedDict is not thread-safe (python/cpython#125996)",
            ),
        )
        for k in KINDS
    ],
)
def test_a_container_changing_while_eight_threads_read_the_tree(
    kind: str, record_property: Any
) -> None:
    n, counts, examples = race(kind, TRIES, SECONDS)
    text = _report(kind, n, counts, examples)
    record_property("race", text)
    print(text)
    assert n > 100, text  # the threads ran
    assert counts["ok"] > n // 2, text  # mostly answers, not errors
    assert failures(counts) == 0, text


def test_the_race_catches_an_order_read_twice(monkeypatch: Any) -> None:
    """The check can fail: with the insertion order read from the dict a
    second time (as before: ``dict_order_differs`` after ``classify``'s read,
    unchecked), specs that their leaves cannot rebuild are caught."""
    from pytree_kit import _pure

    if pk.ENGINE != "python":
        pytest.skip("a break of the pure engine's walk")

    def reread(node: tuple, obj: dict, cache: dict) -> Any:
        cache.pop(_pure._ORDER, None)
        order = _pure._key_order(obj)
        keys = node[3] if node[0] == _pure.DICT else node[3][1]
        return None if order == keys else order

    monkeypatch.setattr(_pure, "dict_order", reread)
    n, counts, examples = race("dict", TRIES, 4 * SECONDS, ops=[0, 1], stop_after=3)
    text = _report("dict, order read twice", n, counts, examples)
    print(text)
    assert failures(counts) > 0, text


def test_a_fresh_specs_first_unflattens_raced_by_eight_threads() -> None:
    """Eight threads released at once unflatten a spec that none has
    unflattened before, three times each (the first call notes the spec, the
    second makes the plan it keeps, where the engine keeps one), and map the
    tree: each gets the tree back, its leaves the very objects given."""
    rounds = 0
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline or rounds < 20:
        _race_a_fresh_spec(2 + rounds % 9)
        rounds += 1
    print(f"{describe_interpreter()}: {rounds} fresh specs")


def _race_a_fresh_spec(n: int) -> None:
    """8 threads at a barrier: a spec no call has seen, unflattened 3 times
    each, and its tree mapped, all rebuilding the same tree."""
    tree = {
        "xs": [object() for _ in range(n)],
        "d": {f"k{n - i}": (i, None, [float(i)]) for i in range(n)},
        "big": {i: object() for i in range(40 + n)},
        # over 32 keys, in an insertion order not their sorted one: its
        # template and the places of its values in the recipe
        "big_ordered": {f"b{40 + n - i}": [i] for i in range(40 + n)},
    }
    import pickle

    leaves, spec = pk.flatten(tree)
    spec = pickle.loads(pickle.dumps(spec))  # a spec object no call has seen
    barrier = threading.Barrier(8)
    results: list = [None] * 8
    errors: list = []

    def go(i: int) -> None:
        try:
            barrier.wait(60)
            got = [pk.unflatten(spec, leaves) for _ in range(3)]
            got.append(pk.tree_map(lambda x: x, tree))
            results[i] = got
        except Exception as e:  # collected, reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, f"{describe_interpreter()}: {errors[0]!r}"
    for got in results:
        for back in got:
            assert back == tree
            for name in ("d", "big_ordered"):  # the insertion order too
                assert list(back[name]) == list(tree[name])
            assert all(a is b for a, b in zip(pk.leaves(back), leaves, strict=True))


def test_a_class_gaining_and_losing_its_tree_flatten() -> None:
    """One thread adds and removes ``__tree_flatten__`` on a class while seven
    flatten and map a list of its instances: each instance comes back as a
    leaf (the class without the method) or as a node of its children (with
    it), never anything else, and never an error."""

    class P:
        def __init__(self, kids: list) -> None:
            self.kids = kids

        @classmethod
        def __tree_unflatten__(cls, aux: Any, children: tuple) -> Any:
            return cls(list(children))

    def tree_flatten(self: P) -> tuple:
        return self.kids, None

    kids = [[object(), object()] for _ in range(20)]
    tree = [P(k) for k in kids]
    stop = threading.Event()
    errors: list = []
    counts = {"leaf": 0, "node": 0}

    def toggle() -> None:
        while not stop.is_set():
            P.__tree_flatten__ = tree_flatten  # type: ignore[attr-defined]
            time.sleep(0)
            del P.__tree_flatten__  # type: ignore[attr-defined]
            time.sleep(0)

    def check(i: int) -> None:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            try:
                if i % 2:
                    leaves, spec = pk.flatten(tree)
                    back = pk.unflatten(spec, leaves)
                else:
                    back = pk.tree_map(lambda x: x, tree)
                for p, q in zip(tree, back, strict=True):
                    if q is p:
                        counts["leaf"] += 1
                    elif type(q) is P and q.kids == p.kids and q.kids is not p.kids:
                        assert all(a is b for a, b in zip(q.kids, p.kids))
                        counts["node"] += 1
                    else:
                        raise AssertionError(f"neither answer: {q!r}")
            except Exception as e:  # collected, reported below
                errors.append(e)
                return

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=check, args=(i,)) for i in range(7)]
        toggler = threading.Thread(target=toggle)
        toggler.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 60)
    finally:
        stop.set()
        toggler.join(60)
        sys.setswitchinterval(old)
        if "__tree_flatten__" in P.__dict__:
            del P.__tree_flatten__  # type: ignore[attr-defined]
    print(f"{describe_interpreter()}: {counts}")
    assert not errors, f"{describe_interpreter()}: {errors[0]!r}"
    assert counts["leaf"] and counts["node"], counts  # both answers were seen


def test_the_engine_without_the_gil() -> None:
    """On a free-threaded CPython running without the GIL, the C engine runs
    (unless ``PYTREE_KIT_PURE=1`` asks for the pure one), and importing and
    using it leaves the GIL off: its module declares it needs none."""
    if not hasattr(sys, "_is_gil_enabled") or sys._is_gil_enabled():
        pytest.skip(f"the GIL is on ({describe_interpreter()})")
    wanted = "python" if os.environ.get("PYTREE_KIT_PURE") not in (None, "", "0") else "c"
    assert pk.ENGINE == wanted
    assert ("pytree_kit._speedups" in sys.modules) is (wanted == "c")
    tree = {"a": [1, (2, 3)], "b": {"c": None}}
    leaves, spec = pk.flatten(tree)
    assert pk.unflatten(spec, leaves) == tree
    assert pk.tree_map(lambda x: x, tree) == tree
    assert not gil_enabled()
    assert pk.engine_info()["gil_enabled"] is False


def test_the_race_says_whether_the_gil_is_on() -> None:
    text = describe_interpreter()
    assert f"GIL {'on' if gil_enabled() else 'off'}" in text and pk.ENGINE in text
    assert thread_race.gil_enabled() is (
        sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    )
