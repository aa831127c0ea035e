"""Eight threads flatten, unflatten, map and match shared trees at once.

The switch interval is cut to a microsecond, so threads change places inside
every callback (``__tree_flatten__``, rules, is_leaf, dataclass fields); one
thread keeps changing a class (which bumps its type version, the key of the
C engine's per-type cache) while the others flatten its instances, and new
classes keep appearing. Every result is checked against the one computed
before the threads start. (The suite runs once per engine.)
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections import OrderedDict, defaultdict, deque, namedtuple
from typing import Any, Callable

import pytest

import pytree_kit as pk
from scripts.corpus.trees import (
    DC,
    RULES,
    AttrsCls,
    Leaf,
    ModelOutput,
    Node,
    Opaque,
    Point,
    Record,
    SlotsDC,
    assert_same_tree,
)

THREADS = 8
# Rounds per thread; scripts/long_runs.sh raises it.
ROUNDS = int(os.environ.get("PYTREE_KIT_THREAD_ROUNDS", "300"))


@dataclasses.dataclass
class Churned:
    """A dataclass whose class attributes a thread keeps changing."""

    a: Any
    b: Any = None


def shared_trees() -> list:
    leaf = Leaf(1)
    return [
        {"x": [leaf, (leaf, None)], "y": Node(Leaf(2), [Leaf(3)]), 3: "three"},
        [Point(Leaf(4), DC(Leaf(5), {"k": Leaf(6)})), OrderedDict(b=1, a=Leaf(7))],
        {"batch": Record(img=[Leaf(8)] * 3, meta={"id": 9}), "o": Opaque([Leaf(10)], 2)},
        defaultdict(list, {"d": deque([Leaf(11), Leaf(12)], maxlen=4)}),
        [AttrsCls(Leaf(13), SlotsDC(1, 2)), ModelOutput(logits=Leaf(14), loss=Leaf(15))],
        [Churned(Leaf(16), [Churned(Leaf(17))]) for _ in range(5)],
        {f"k{i:03d}": [i, (i, Leaf(i))] for i in range(200)},
    ]


def run_threads(work: Callable[[int], None], n: int = THREADS) -> None:
    """Run ``work(i)`` in n threads started together; re-raise the first error."""
    errors: list = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as e:  # collected and re-raised in the main thread
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120 + ROUNDS / 10)
        assert not any(t.is_alive() for t in threads), "a thread hung"
    finally:
        sys.setswitchinterval(old)
    if errors:
        raise errors[0]


def test_eight_threads_on_shared_trees_give_the_single_thread_results() -> None:
    trees = shared_trees()
    expected = [pk.flatten(t, rules=RULES) for t in trees]
    paths = [pk.flatten_with_path(t, rules=RULES)[0] for t in trees]
    texts = [spec.to_json() if i not in (2,) else None for i, (_, spec) in enumerate(expected)]

    def work(i: int) -> None:
        for r in range(ROUNDS):
            k = (i + r) % len(trees)
            tree = trees[k]
            leaves, spec = pk.flatten(tree, rules=RULES)
            want_leaves, want_spec = expected[k]
            assert len(leaves) == len(want_leaves)
            assert all(a is b for a, b in zip(leaves, want_leaves))
            assert spec == want_spec and hash(spec) == hash(want_spec)
            assert_same_tree(spec.unflatten(leaves), tree)
            assert all(a is b for a, b in zip(spec.flatten_up_to(tree), want_leaves))
            assert pk.leaves(tree, rules=RULES) == leaves
            got_paths = pk.flatten_with_path(tree, rules=RULES)[0]
            assert [p for p, _ in got_paths] == [p for p, _ in paths[k]]
            pairs = pk.leaves(
                pk.tree_map(lambda x: (x, x), tree, rules=RULES),
                rules=RULES,
                is_leaf=lambda x: type(x) is tuple and len(x) == 2 and x[0] is x[1],
            )
            assert len(pairs) == len(leaves) and all(p[0] is x for p, x in zip(pairs, leaves))
            if texts[k] is not None and r % 10 == 0:
                assert spec.to_json() == texts[k]

    run_threads(work)


def test_a_class_changing_under_flattening_threads() -> None:
    """Type versions change while other threads flatten: results stay exact."""
    tree = [Churned(Leaf(i), {"n": i}) for i in range(20)]
    want_leaves, want_spec = pk.flatten(tree)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            Churned.extra = i  # type: ignore[attr-defined]  # bumps the type version
            i += 1
            time.sleep(0)

    churner = threading.Thread(target=churn)
    churner.start()
    try:

        def work(i: int) -> None:
            for _ in range(ROUNDS):
                leaves, spec = pk.flatten(tree)
                assert spec == want_spec
                assert all(a is b for a, b in zip(leaves, want_leaves))
                assert_same_tree(spec.unflatten(leaves), tree)

        run_threads(work, THREADS - 1)
    finally:
        stop.set()
        churner.join()
        del Churned.extra  # type: ignore[attr-defined]


def test_new_classes_appear_while_threads_flatten() -> None:
    """Each thread makes its own dataclasses and protocol classes as it goes."""

    def work(i: int) -> None:
        for r in range(60):
            C = dataclasses.make_dataclass(f"C{i}_{r}", ["p", "q"])

            class P:
                def __init__(self, kids: list) -> None:
                    self.kids = kids

                def __tree_flatten__(self, aux: tuple = (i, r)) -> tuple:
                    time.sleep(0)
                    return self.kids, aux

                @classmethod
                def __tree_unflatten__(cls, aux: Any, children: tuple) -> Any:
                    return cls(list(children))

            tree = {"c": C(Leaf(r), P([Leaf(i), Leaf(r)])), "n": [C(1, 2)] * 3}
            leaves, spec = pk.flatten(tree)
            assert [x.n if isinstance(x, Leaf) else x for x in leaves] == [
                r,
                i,
                r,
                1,
                2,
                1,
                2,
                1,
                2,
            ]
            back = spec.unflatten(leaves)
            assert type(back["c"]) is C and type(back["c"].q) is P
            assert back["c"].q.kids == tree["c"].q.kids
            assert spec.flatten_up_to(back) == leaves

    run_threads(work)


def test_threads_mutating_a_shared_tree_never_crash() -> None:
    """Half the threads change a tree the others flatten: each call gives a
    consistent answer or a clean exception (no crash, no corrupted spec)."""
    tree: dict = {"a": [Leaf(i) for i in range(50)], "b": {"c": [1, 2, 3]}}

    def work(i: int) -> None:
        for r in range(ROUNDS):
            if i % 2:
                lst = tree["a"]
                if r % 3 == 0:
                    lst.append(Leaf(r))
                else:
                    try:  # another mutator may empty it first (no GIL between test and pop)
                        lst.pop()
                    except IndexError:
                        pass
                tree["b"] = {"c": [r] * (r % 5)} if r % 2 else [r]
                continue
            # An is_leaf that yields to the other threads in the middle of the walk.
            is_leaf = (lambda x: time.sleep(0) or False) if r % 2 else None
            try:
                leaves, spec = pk.flatten(tree, is_leaf=is_leaf)
            except RuntimeError:  # "dictionary changed size during iteration" is fine
                continue
            assert spec.num_leaves == len(leaves)
            rebuilt = spec.unflatten(leaves)
            assert pk.structure(rebuilt) == spec
            assert all(a is b for a, b in zip(pk.leaves(rebuilt), leaves))

    run_threads(work)


# -- free-threaded CPython --------------------------------------------------------


@pytest.mark.parametrize(
    ("gil", "setting", "engine"),
    [
        ("False", None, "c"),  # free-threaded, GIL off: the C engine, as anywhere
        ("False", "0", "c"),
        ("False", "1", "python"),
        ("True", None, "c"),  # free-threaded build with the GIL on
        (None, None, "c"),  # an ordinary build (no sys._is_gil_enabled)
    ],
)
def test_engine_choice_on_free_threaded_builds(gil: Any, setting: Any, engine: str) -> None:
    """Simulated here (this CPython has a GIL) by defining sys._is_gil_enabled."""
    import subprocess

    pytest.importorskip("pytree_kit._speedups")
    env = {k: v for k, v in os.environ.items() if k != "PYTREE_KIT_PURE"}
    if setting is not None:
        env["PYTREE_KIT_PURE"] = setting
    patch = f"sys._is_gil_enabled = lambda: {gil}; " if gil is not None else ""
    code = f"import sys; {patch}import pytree_kit as pk; print(pk.ENGINE)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == engine


_Pair = namedtuple("_Pair", "x y")


def test_a_spec_made_in_a_thread_that_ends_is_whole_in_another() -> None:
    """A spec, and a leaf iterator begun, in a thread that then ends: both work
    in the main thread and equal what the main thread makes. (On a
    free-threaded build with the C engine each thread's specs hold a leaf node
    of that thread's own, kept in its thread state, which goes with it.)"""
    import pickle

    from pytree_kit import _kinds

    tree = {"a": [1, 2, (3, None)], "b": {"c": 4.5, "d": [6] * 40}, "e": _Pair(7, 8)}
    made: dict = {}

    def work() -> None:
        made["flat"] = pk.flatten(tree)
        made["iter"] = pk.tree_iter(tree)
        made["first"] = next(made["iter"])

    t = threading.Thread(target=work)
    t.start()
    t.join()
    leaves, spec = made.pop("flat")
    want_leaves, want_spec = pk.flatten(tree)
    assert leaves == want_leaves and spec == want_spec and hash(spec) == hash(want_spec)
    assert spec.unflatten(leaves) == tree
    assert spec.flatten_up_to(tree) == leaves
    assert spec.to_json() == want_spec.to_json()
    assert pickle.loads(pickle.dumps(spec)) == want_spec
    assert [made["first"], *made.pop("iter")] == want_leaves
    assert sum(n == _kinds.LEAF_NODE for n in spec._nodes) == len(leaves)
    threads_own = [n for n in spec._nodes if n == _kinds.LEAF_NODE and n is not _kinds.LEAF_NODE]
    if pk.ENGINE == "c" and pk.engine_info()["free_threaded"]:
        assert len(threads_own) == len(leaves)  # the ended thread's own leaf node
    else:
        assert threads_own == []
