"""Threads that change containers inside a tree while other threads flatten it.

One thread (the mutator) keeps changing one container of a shared tree by a
fixed, cyclic sequence of single steps (a key inserted, a key deleted, an
item appended or popped, an attribute deleted and set again), so every state
the container can be in is known in advance (:meth:`Race.states`). The other
threads flatten the tree, ``tree_map`` it or match it against a spec
(``flatten_up_to``), and each result is checked:

- flatten: ``unflatten(spec, leaves)`` rebuilds a tree whose container is one
  of those states (its keys, in their insertion order, and each value the
  very object) and whose rest is the tree's; the rebuilt tree flattens to
  the same leaves and an equal spec;
- tree_map: the result's container is one of the states, likewise;
- flatten_up_to against the spec of one state: that state's leaves, or a
  ``StructureError`` (the container was in another state);
- or the call raised the documented ``RuntimeError``: the container changed
  while it was read, at its path (``tree['d']: dictionary changed size
  during iteration``).

Anything else is a failure, counted by what it was. Used by
``tests/test_thread_race.py`` (which bounds each run's time) and as a
command that prints the counts:

    python scripts/thread_race.py --seconds 10 --kind dict
    PYTREE_KIT_PURE=1 PYTHON_GIL=0 python3.13t scripts/thread_race.py --tries 160000
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time
from collections import Counter, OrderedDict, defaultdict, deque
from typing import Any

import pytree_kit as pk

THREADS = 8


class Leaf:
    """An opaque leaf, compared by identity."""

    __slots__ = ("n",)

    def __init__(self, n: Any) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Leaf({self.n!r})"


#: the fields of Rec
REC_FIELDS = tuple(f"f{i:02d}" for i in range(12))

#: A record whose ``__dict__`` the mutator changes: its last field unset and
#: set again, so that the ``__dict__`` holds the fields in their order (read
#: in one pass, ``_pure._record_fields``) or all but the last.
Rec = dataclasses.make_dataclass("Rec", REC_FIELDS)
Rec.__module__ = __name__


def gil_enabled() -> bool:
    """Whether the GIL is on (always, on a CPython without ``sys._is_gil_enabled``)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def describe_interpreter() -> str:
    return (
        f"Python {sys.version.split()[0]}, GIL {'on' if gil_enabled() else 'off'}, "
        f"engine {pk.ENGINE}"
    )


# -- what the mutated container can be ------------------------------------------

_UNSET = object()


def _state(obj: Any) -> Any:
    """A comparable picture of a container: its keys in order with the
    identities of their values, or its items' identities, or a record's
    fields (``_UNSET`` for an unset one)."""
    if isinstance(obj, dict):
        return tuple((k, id(v)) for k, v in obj.items())
    if isinstance(obj, (list, deque)):
        return tuple(id(v) for v in obj)
    if isinstance(obj, Rec):
        return tuple(id(getattr(obj, n, _UNSET)) for n in REC_FIELDS)
    raise TypeError(type(obj))


@dataclasses.dataclass
class Race:
    """A tree, its container ``tree[key]`` and the mutator's cycle of steps."""

    kind: str
    tree: dict
    key: str
    steps: list  # callables, each changing the container by one step
    values: list  # objects the steps insert: kept alive, so ids stay unique

    @property
    def target(self) -> Any:
        return self.tree[self.key]

    def states(self) -> frozenset:
        """Every state the cycle of steps passes through, found by running it
        (three times: a cycle may move a key to the end once, then repeat)."""
        start = _copy(self.target)
        seen = {_state(self.target)}
        for _ in range(3):
            for step in self.steps:
                step()
                seen.add(_state(self.target))
        self.tree[self.key] = start  # the start again, as a new object
        self.steps = _steps(self.kind, start, self.values)
        return frozenset(seen)


def _copy(obj: Any) -> Any:
    if isinstance(obj, Rec):
        new = Rec.__new__(Rec)
        new.__dict__.update(obj.__dict__)
        return new
    if type(obj) is defaultdict:
        return defaultdict(obj.default_factory, obj)
    return type(obj)(obj) if not isinstance(obj, deque) else deque(obj, obj.maxlen)


def _steps(kind: str, c: Any, values: list) -> list:
    """The mutator's cycle of single steps on the container ``c``."""
    if kind in ("dict", "defaultdict", "ordereddict"):
        extra = [f"x{j}" for j in range(4)]
        moved = sorted(k for k in c if not k.startswith("x"))[:3]
        steps: list = []
        for j, k in enumerate(extra):
            steps.append(lambda k=k, v=values[j]: c.__setitem__(k, v))
        for k in moved:  # deleted and inserted again: it moves to the end
            steps.append(lambda k=k: c.pop(k))
            steps.append(lambda k=k, v=c[k]: c.__setitem__(k, v))
        for k in extra:
            steps.append(lambda k=k: c.pop(k))
        if kind == "ordereddict":
            steps.append(lambda: c.move_to_end(moved[0], last=False))
        return steps
    if kind in ("list", "deque"):
        steps = [lambda v=v: c.append(v) for v in values[:4]]
        steps += [c.pop for _ in range(4)]
        steps += [lambda v=values[4]: c.appendleft(v) if kind == "deque" else c.insert(0, v)]
        steps += [c.popleft if kind == "deque" else lambda: c.pop(0)]
        return steps
    if kind == "record":
        last = REC_FIELDS[-1]
        value = getattr(c, last)
        return [lambda: delattr(c, last), lambda: setattr(c, last, value)]
    raise ValueError(kind)


KINDS = ("dict", "defaultdict", "ordereddict", "deque", "list", "record")


def make_race(kind: str, size: int = 40) -> Race:
    """A tree ``{"d": container, "rest": [...], ...}`` and the steps for ``kind``.

    A dict's keys are inserted in reverse sorted order, so that its leaf
    order (sorted) differs from its insertion order and the spec records
    the latter, and sorting them takes a while (another thread can run)."""
    values = [Leaf(f"new{j}") for j in range(6)]
    keys = [f"k{i:03d}" for i in range(size)][::-1]
    if kind == "dict":
        c: Any = {k: Leaf(k) for k in keys}
    elif kind == "defaultdict":
        c = defaultdict(list, {k: Leaf(k) for k in keys})
    elif kind == "ordereddict":
        c = OrderedDict((k, Leaf(k)) for k in keys)
    elif kind == "list":
        c = [Leaf(i) for i in range(size)]
    elif kind == "deque":
        c = deque((Leaf(i) for i in range(size)), maxlen=size + 10)
    elif kind == "record":
        c = Rec(*(Leaf(n) for n in REC_FIELDS))
    else:
        raise ValueError(kind)
    tree = {"d": c, "rest": [Leaf("r0"), {"y": Leaf("r1"), "x": (Leaf("r2"), None)}]}
    return Race(kind, tree, "d", _steps(kind, c, values), values)


# -- checking one result ---------------------------------------------------------

DOCUMENTED = ("changed size during iteration", "mutated during iteration", "changed while")


def documented(e: BaseException, key: str = "d") -> bool:
    """Whether ``e`` is the documented error: a RuntimeError at the container's path."""
    text = str(e)
    return (
        type(e) is RuntimeError
        and text.startswith(f"tree[{key!r}]")
        and any(d in text for d in DOCUMENTED)
    )


class Failure(Exception):
    """A result that is none of the documented answers."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail[:300]}")
        self.what = what


def _rest_is_kept(race: Race, got: dict, rest: Any) -> None:
    want = pk.leaves(rest)
    have = pk.leaves(got["rest"])
    if len(want) != len(have) or any(a is not b for a, b in zip(want, have)):
        raise Failure("rest changed", repr(have))


def check_flatten(race: Race, states: frozenset, leaves: list, spec: Any) -> None:
    try:
        rebuilt = pk.unflatten(spec, leaves)
    except Exception as e:
        raise Failure(f"unflatten raised {type(e).__name__}", repr(e)) from None
    got = rebuilt[race.key]
    if _state(got) not in states:
        raise Failure("not a state that existed", f"{_state(got)!r:.200}")
    _rest_is_kept(race, rebuilt, race.tree["rest"])
    again, spec2 = pk.flatten(rebuilt)
    if spec2 != spec or len(again) != len(leaves) or any(a is not b for a, b in zip(again, leaves)):
        raise Failure("rebuilt tree flattens differently", f"{spec2} != {spec}")


def check_map(race: Race, states: frozenset, out: Any) -> None:
    if _state(out[race.key]) not in states:
        raise Failure("tree_map: not a state that existed", f"{_state(out[race.key])!r:.200}")
    _rest_is_kept(race, out, race.tree["rest"])


def work_items(race: Race, states: frozenset) -> list:
    """The operations a flattening thread cycles through, each a callable
    that runs one and checks its result (raising Failure)."""
    spec0 = pk.structure(race.tree)  # of the start state
    want0 = pk.leaves(race.tree)
    yields = lambda x: time.sleep(0) or False  # noqa: E731  # a switch mid-walk

    def do_flatten() -> None:
        leaves, spec = pk.flatten(race.tree)
        check_flatten(race, states, leaves, spec)

    def do_flatten_is_leaf() -> None:
        leaves, spec = pk.flatten(race.tree, is_leaf=yields)
        check_flatten(race, states, leaves, spec)

    def do_map() -> None:
        check_map(race, states, pk.tree_map(lambda x: x, race.tree))

    def do_up_to() -> None:
        try:
            got = spec0.flatten_up_to(race.tree)
        except pk.StructureError:
            return  # the container was in another state than the spec's
        if len(got) != len(want0) or any(a is not b for a, b in zip(got, want0)):
            raise Failure("flatten_up_to: not the spec's state", f"{len(got)} leaves")

    return [do_flatten, do_flatten_is_leaf, do_map, do_up_to]


# -- running -----------------------------------------------------------------------


def race(
    kind: str,
    tries: int,
    seconds: float,
    threads: int = THREADS,
    size: int = 40,
    ops: Any = None,
    stop_after: Any = None,
) -> tuple[int, Counter, list]:
    """Run ``threads - 1`` checking threads against one mutator until
    ``tries`` calls were checked or ``seconds`` passed (or, with
    ``stop_after``, that many failures were seen). ``ops``: the indexes of
    the operations of :func:`work_items` to run (default all). Returns
    (calls checked, Counter of outcomes: "ok", "RuntimeError" (documented)
    and each failure, examples of failures (at most 5))."""
    r = make_race(kind, size)
    states = r.states()
    items = work_items(r, states)
    if ops is not None:
        items = [items[i] for i in ops]
    counts: Counter = Counter()
    examples: list = []
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + seconds
    per_thread = max(1, tries // max(1, threads - 1))
    barrier = threading.Barrier(threads)
    seen = [0]  # failures so far, for stop_after

    def failed(what: str, example: str) -> None:
        with lock:
            if len(examples) < 5:
                examples.append(example)
            seen[0] += 1
            if stop_after is not None and seen[0] >= stop_after:
                done.set()

    done = threading.Event()

    def mutate() -> None:
        barrier.wait()
        steps = r.steps
        while not stop.is_set():
            for step in steps:
                step()

    def check(i: int) -> None:
        local: Counter = Counter()
        barrier.wait()
        try:
            for n in range(per_thread):
                if (n % 64 == 0 and time.monotonic() > deadline) or done.is_set():
                    break
                try:
                    items[(i + n) % len(items)]()
                    local["ok"] += 1
                except Failure as f:
                    local[f.what] += 1
                    failed(f.what, str(f))
                except RuntimeError as e:
                    if documented(e, r.key):
                        local["RuntimeError"] += 1
                    else:
                        what = f"RuntimeError not documented: {e}"[:120]
                        local[what] += 1
                        failed(what, what)
                except Exception as e:  # any other error is a failure, counted by type
                    local[f"raised {type(e).__name__}"] += 1
                    failed(type(e).__name__, f"{type(e).__name__}: {e}"[:300])
        finally:
            with lock:
                counts.update(local)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=check, args=(i,)) for i in range(threads - 1)]
        mutator = threading.Thread(target=mutate)
        for t in [mutator, *workers]:
            t.start()
        for t in workers:
            t.join(timeout=seconds + 120)
        stop.set()
        mutator.join(timeout=60)
        if any(t.is_alive() for t in [mutator, *workers]):
            counts["hung"] += 1
    finally:
        sys.setswitchinterval(old)
    return sum(counts.values()), counts, examples


def failures(counts: Counter) -> int:
    return sum(n for what, n in counts.items() if what not in ("ok", "RuntimeError"))


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", action="append", choices=KINDS, help="default: every kind")
    ap.add_argument("--tries", type=int, default=20_000, help="calls per kind (all threads)")
    ap.add_argument("--seconds", type=float, default=60.0, help="at most, per kind")
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument(
        "--ops", default=None, help="e.g. 0,1: flatten, flatten with is_leaf, map, up_to"
    )
    args = ap.parse_args(argv)
    ops = None if args.ops is None else [int(x) for x in args.ops.split(",")]
    print(describe_interpreter())
    bad = 0
    for kind in args.kind or KINDS:
        t0 = time.perf_counter()
        n, counts, examples = race(kind, args.tries, args.seconds, args.threads, ops=ops)
        f = failures(counts)
        bad += f
        detail = ", ".join(f"{k}: {v}" for k, v in counts.most_common())
        print(
            f"{kind:12s} {n:8d} calls, {f:6d} failures ({time.perf_counter() - t0:.1f} s): {detail}"
        )
        for e in examples:
            print(f"    e.g. {e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
