"""Side-by-side speed benchmark: pytree_kit's engines against its peers.

Times flatten, unflatten, leaves, tree_map (identity) and flatten_up_to on six
trees through every pytree_kit engine that can be imported (the pure engine,
``pytree_kit._pure``, and the C engine, ``pytree_kit._speedups``, when it
is built) and through jax.tree_util, optree, torch.utils._pytree,
torch.utils._cxx_pytree and dm-tree, all in this one process. Then it times
leaves() against the floor (copying as many references into a new list) and
the cost per leaf of flatten and leaves from 10^3 to 10^6 leaves.

    python benchmarks/compare.py                 # full run, a few minutes
    python benchmarks/compare.py --quick         # smoke mode (CI), well under a minute
    python benchmarks/compare.py --out /tmp/b    # write the outputs elsewhere
    python benchmarks/compare.py --record        # into benchmarks/results/ (published)
    python benchmarks/compare.py --only optree   # pytree_kit and the peers named

The markdown report goes to stdout and to ``OUT/compare.md``, its figures for
pytree_kit's C engine to ``OUT/compare.json`` (``benchmarks/versions.py``
gathers those of several Pythons into one page); the charts to
``OUT/compare.png`` (speedups per tree and operation) and ``OUT/scaling.png``
(ns per leaf). ``OUT`` defaults to ``build/benchmarks/``; ``--record`` writes
into ``benchmarks/results/``, the published figures.

How it measures: each (library, tree, operation) is a zero-argument call
(``functools.partial`` of the library's function, so every library pays the
same calling overhead). Each call is made once as a warm-up, then a loop of
``number`` calls is grown (1, 2, 5, 10, 20, ...) until it runs for at least
``--min-time``. Then, for one tree and operation, the libraries take turns:
each round runs one loop of every library (the order rotating), ``--repeats``
rounds, and each cell is the median time per call over its loops, in
microseconds. Interleaving spreads any burst of load from elsewhere on the
machine over every library alike. The garbage collector stays enabled, as in
real use (``timeit`` would disable it); the objects the imports created are
moved out of its way once (``gc.freeze()``), and ``gc.collect()`` runs before
each loop so that one loop's garbage is not collected on another's clock.

The ratio convention: a cell reads ``median µs (speedup x)`` (the report prints
the x as a multiplication sign), where

    speedup = (median of the fastest peer on that tree and operation) / (this median)

so ``>1 x`` means faster than the best peer, ``1.00 x`` marks that best peer
itself, and ``0.50 x`` means twice the best peer's time. Peers are every library
that is not pytree_kit; a cell marked n/a takes no part. The floor table uses
the other direction: ``leaves() time / floor time``, the multiple of the
cheapest possible way to produce a list of that many references (always >= 1;
lower is better).

The active engine (``pk.ENGINE``, the C one when it is built) is timed through
the public API, as users call it: ``pk.flatten(tree)``, ``pk.unflatten(spec,
leaves)``, ``pk.leaves(tree)``, ``pk.tree_map(f, tree)`` and
``spec.flatten_up_to(tree)``. The other engine, which the public API does not
reach in this process, is called directly (``engine.flatten(tree, None, None)``
and so on; tree_map as ``pk.tree_map`` does it: ``engine.unflatten(spec, [f(x)
for x in leaves])`` after ``engine.flatten``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib
import importlib.metadata
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import _output

import pytree_kit as pk
from pytree_kit import _pure
from pytree_kit._engine import impl as _active_engine

try:  # the C engine, when it has been built; it has the pure engine's functions
    from pytree_kit import _speedups
except ImportError:
    _speedups = None

ROOT = Path(__file__).resolve().parent.parent
OPS: tuple[str, ...] = ("flatten", "unflatten", "leaves", "tree_map", "flatten_up_to")
OPTREE_NS = "pytree_kit_bench"
X = "\N{MULTIPLICATION SIGN}"  # the ratio suffix; ruff flags the literal character

# --------------------------------------------------------------------------
# The trees


@dataclasses.dataclass
class Meta:
    epoch: Any
    step: Any
    lr: Any
    seed: Any


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any
    masks: Any


@dataclasses.dataclass
class Batch:
    images: Any
    targets: Any
    meta: Any


DATACLASSES: tuple[type, ...] = (Meta, Target, Batch)


@functools.cache
def _tensors() -> dict[str, Any]:
    """A few small tensors, reused as leaves (torch when present, else stand-ins)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a bench dependency
        return {"image": "image", "boxes": "boxes", "labels": "labels", "masks": "masks"}
    return {
        "image": torch.zeros(3, 8, 8),
        "boxes": torch.zeros(5, 4),
        "labels": torch.zeros(5, dtype=torch.int64),
        "masks": torch.zeros(5, 8, 8, dtype=torch.bool),
    }


def tree_dict10() -> Any:
    return {f"k{i}": i for i in range(10)}


def tree_detection() -> Any:
    t = _tensors()
    return {
        "images": [t["image"] for _ in range(8)],
        "targets": [
            {"boxes": t["boxes"], "labels": t["labels"], "masks": t["masks"]} for _ in range(8)
        ],
        "meta": {"epoch": 3, "step": 1200, "ids": (11, 12, 13, 14, 15, 16)},
    }


def tree_records() -> Any:
    return [{"x": i, "y": i + 1, "z": i + 2} for i in range(1000)]


def tree_chain() -> Any:
    t: Any = 0
    for i in range(1, 50):
        t = [t, i] if i % 2 else {"child": t, "v": i}
    return t


def tree_dataclass() -> Any:
    t = _tensors()
    return Batch(
        images=[t["image"] for _ in range(4)],
        targets=[Target(t["boxes"], t["labels"], t["masks"]) for _ in range(4)],
        meta=Meta(epoch=3, step=1200, lr=0.1, seed=7),
    )


def tree_wide() -> Any:
    return {name: list(range(25_000)) for name in ("a", "b", "c", "d")}


@dataclasses.dataclass(frozen=True)
class TreeCase:
    key: str
    label: str
    make: Callable[[], Any]
    big: bool = False


TREES: tuple[TreeCase, ...] = (
    TreeCase("a", "(a) dict of 10", tree_dict10),
    TreeCase("b", "(b) detection batch", tree_detection),
    TreeCase("c", "(c) 1000 dicts x 3", tree_records),
    TreeCase("d", "(d) depth-50 chain", tree_chain),
    TreeCase("e", "(e) dataclass batch", tree_dataclass),
    TreeCase("f", "(f) wide, 100,000", tree_wide, big=True),
)

TREE_DESCRIPTIONS: dict[str, str] = {
    "a": "`{'k0': 0, ..., 'k9': 9}`",
    "b": "`images`: 8 tensors; `targets`: 8 dicts of boxes/labels/masks tensors; "
    "`meta`: epoch, step and a tuple of 6 ids",
    "c": "a list of 1000 dicts `{'x', 'y', 'z'}` of ints",
    "d": "nested 49 deep, alternating `[child, i]` and `{'child': ..., 'v': i}`",
    "e": "`Batch(images=[4 tensors], targets=[4 Target(boxes, labels, masks)], "
    "meta=Meta(epoch, step, lr, seed))`, dataclasses",
    "f": "a dict of 4 lists of 25,000 ints",
}


def identity(x: Any) -> Any:
    return x


# --------------------------------------------------------------------------
# The libraries

Call = Callable[[], Any]


@dataclasses.dataclass
class Lib:
    """One library: how to get leaves and a spec, and its five timed calls.

    ``calls(tree, spec, leaves)`` returns, for each operation, a zero-argument
    ``functools.partial`` straight onto the library's own function or method
    (no wrapper in between), or the reason there is none. ``spec`` is what
    ``structure(tree)`` gives (dm-tree has no spec object: it is the tree
    itself). ``na`` maps tree keys to the reason a tree is not comparable.
    """

    name: str
    peer: bool
    version: str
    leaves: Callable[[Any], list]
    structure: Callable[[Any], Any]
    calls: Callable[[Any, Any, list], dict[str, Call | str]]
    na: dict[str, str] = dataclasses.field(default_factory=dict)


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _pk_tree_map(engine: Any, fn: Callable[[Any], Any], tree: Any) -> Any:
    """What ``pk.tree_map(fn, tree)`` does with one tree, on the given engine."""
    leaves, spec = engine.flatten(tree, None, None)
    return engine.unflatten(spec, [fn(x) for x in leaves])


def _pk_lib(engine: Any, label: str) -> Lib:
    public = engine is _active_engine

    def calls(tree: Any, spec: Any, leaves: list) -> dict[str, Call | str]:
        if public:  # what users call: pk.flatten(tree), spec.flatten_up_to(tree), ...
            return {
                "flatten": functools.partial(pk.flatten, tree),
                "unflatten": functools.partial(pk.unflatten, spec, leaves),
                "leaves": functools.partial(pk.leaves, tree),
                "tree_map": functools.partial(pk.tree_map, identity, tree),
                "flatten_up_to": functools.partial(spec.flatten_up_to, tree),
            }
        return {
            "flatten": functools.partial(engine.flatten, tree, None, None),
            "unflatten": functools.partial(engine.unflatten, spec, leaves),
            "leaves": functools.partial(engine.leaves, tree, None, None),
            "tree_map": functools.partial(_pk_tree_map, engine, identity, tree),
            "flatten_up_to": functools.partial(engine.flatten_up_to, spec, tree),
        }

    return Lib(
        name=f"pytree_kit ({label})",
        peer=False,
        version=pk.__version__,
        leaves=lambda tree: engine.leaves(tree, None, None),
        structure=lambda tree: engine.flatten(tree, None, None)[1],
        calls=calls,
    )


def _fields_of(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _dc_flatten(obj: Any) -> tuple[list, Any]:
    return [getattr(obj, n) for n in _fields_of(type(obj))], None


def _dc_unflatten_aux_first(cls: type, aux: Any, children: Any) -> Any:
    return cls(*children)


def _dc_unflatten_children_first(cls: type, children: Any, aux: Any) -> Any:
    return cls(*children)


def _jax_lib() -> Lib:
    import jax
    import jax.tree_util as jtu

    for cls in DATACLASSES:
        jtu.register_dataclass(cls, data_fields=_fields_of(cls), meta_fields=[])

    def calls(tree: Any, spec: Any, leaves: list) -> dict[str, Call | str]:
        return {
            "flatten": functools.partial(jtu.tree_flatten, tree),
            "unflatten": functools.partial(jtu.tree_unflatten, spec, leaves),
            "leaves": functools.partial(jtu.tree_leaves, tree),
            "tree_map": functools.partial(jtu.tree_map, identity, tree),
            "flatten_up_to": functools.partial(spec.flatten_up_to, tree),
        }

    return Lib(
        name="jax.tree_util",
        peer=True,
        version=jax.__version__,
        leaves=jtu.tree_leaves,
        structure=jtu.tree_structure,
        calls=calls,
    )


def _optree_lib() -> Lib:
    import optree

    for cls in DATACLASSES:
        optree.register_pytree_node(
            cls,
            _dc_flatten,
            functools.partial(_dc_unflatten_aux_first, cls),
            namespace=OPTREE_NS,
        )
    ns = OPTREE_NS

    def calls(tree: Any, spec: Any, leaves: list) -> dict[str, Call | str]:
        return {
            "flatten": functools.partial(optree.tree_flatten, tree, namespace=ns),
            "unflatten": functools.partial(optree.tree_unflatten, spec, leaves),
            "leaves": functools.partial(optree.tree_leaves, tree, namespace=ns),
            "tree_map": functools.partial(optree.tree_map, identity, tree, namespace=ns),
            "flatten_up_to": functools.partial(spec.flatten_up_to, tree),
        }

    return Lib(
        name="optree",
        peer=True,
        version=optree.__version__,
        leaves=functools.partial(optree.tree_leaves, namespace=ns),
        structure=functools.partial(optree.tree_structure, namespace=ns),
        calls=calls,
    )


_TORCH_REGISTERED = False


def _torch_register() -> None:
    """Registers the dataclasses once; this serves _pytree and _cxx_pytree both.

    torch's ``register_pytree_node`` also registers the class with
    ``_cxx_pytree`` (in optree's ``torch`` namespace) when that module has been
    imported, so _cxx_pytree is imported first, when it can be.
    """
    global _TORCH_REGISTERED
    if _TORCH_REGISTERED:
        return
    import torch.utils._pytree as tp

    try:
        import torch.utils._cxx_pytree  # noqa: F401
    except Exception:
        pass
    for cls in DATACLASSES:
        tp.register_pytree_node(
            cls, _dc_flatten, functools.partial(_dc_unflatten_children_first, cls)
        )
    _TORCH_REGISTERED = True


def _torch_lib(module: str) -> Lib:
    import torch

    mod = importlib.import_module(module)
    _torch_register()

    def calls(tree: Any, spec: Any, leaves: list) -> dict[str, Call | str]:
        up_to = getattr(spec, "flatten_up_to", None)
        return {
            "flatten": functools.partial(mod.tree_flatten, tree),
            "unflatten": functools.partial(mod.tree_unflatten, leaves, spec),
            "leaves": functools.partial(mod.tree_leaves, tree),
            "tree_map": functools.partial(mod.tree_map, identity, tree),
            "flatten_up_to": (
                functools.partial(up_to, tree) if up_to is not None else "n/a (no flatten_up_to)"
            ),
        }

    return Lib(
        name=module,
        peer=True,
        version=torch.__version__,
        leaves=mod.tree_leaves,
        structure=mod.tree_structure,
        calls=calls,
    )


def _dmtree_lib() -> Lib:
    import tree as dmtree

    def calls(tree: Any, spec: Any, leaves: list) -> dict[str, Call | str]:
        return {
            "flatten": "n/a (no spec)",
            "unflatten": functools.partial(dmtree.unflatten_as, spec, leaves),
            "leaves": functools.partial(dmtree.flatten, tree),
            "tree_map": functools.partial(dmtree.map_structure, identity, tree),
            "flatten_up_to": functools.partial(dmtree.flatten_up_to, spec, tree),
        }

    return Lib(
        name="dm-tree",
        peer=True,
        version=_dist_version("dm-tree"),
        leaves=dmtree.flatten,
        structure=identity,
        calls=calls,
        na={"e": "n/a (no registration)"},
    )


PEERS: tuple[tuple[str, Callable[[], Lib]], ...] = (
    ("jax.tree_util", _jax_lib),
    ("optree", _optree_lib),
    ("torch.utils._pytree", lambda: _torch_lib("torch.utils._pytree")),
    ("torch.utils._cxx_pytree", lambda: _torch_lib("torch.utils._cxx_pytree")),
    ("dm-tree", _dmtree_lib),
)


def pk_engines() -> list[tuple[str, Any]]:
    engines: list[tuple[str, Any]] = [("python", _pure)]
    if _speedups is not None:
        engines.append(("c", _speedups))
    return engines


def load_libraries(only: list[str], notes: list[str]) -> list[Lib]:
    libs = [_pk_lib(engine, label) for label, engine in pk_engines()]
    for name, make in PEERS:
        if only and not any(o in name for o in only):
            continue
        try:
            libs.append(make())
        except Exception as exc:
            notes.append(f"**{name}** was not benchmarked: {type(exc).__name__}: {exc}")
    return libs


# --------------------------------------------------------------------------
# Timing


def _loop(fn: Callable[[], Any], number: int) -> float:
    it = itertools.repeat(None, number)
    t0 = time.perf_counter()
    for _ in it:
        fn()
    return time.perf_counter() - t0


def _calibrate(fn: Callable[[], Any], min_time: float) -> int:
    """Calls ``fn`` once (the warm-up), then finds a loop count that runs >= ``min_time``."""
    t0 = time.perf_counter()
    fn()
    if time.perf_counter() - t0 >= min_time:
        return 1
    for k in itertools.count(1):
        number = (1, 2, 5)[k % 3] * 10 ** (k // 3)
        if _loop(fn, number) >= min_time:
            return number
    raise AssertionError("unreachable")  # pragma: no cover


def measure_many(
    fns: dict[Any, Callable[[], Any]], min_time: float, repeats: int
) -> dict[Any, Any]:
    """Median seconds per call of each of ``fns`` (or the exception's name).

    Each is warmed up and calibrated first; then the repeats are interleaved (one
    loop of each in turn, the order rotating every round) so that a burst of load
    from elsewhere on the machine slows every library alike, not one cell.
    """
    # What is alive now (the imports: torch and jax leave ~200k objects; the
    # trees) goes to the permanent generation, so that the collection before
    # each loop walks only what the loops made (a full one costs ~0.2 s).
    gc.collect()
    gc.freeze()
    out: dict[Any, Any] = {}
    numbers: dict[Any, int] = {}
    for key, fn in fns.items():
        gc.collect()
        try:
            numbers[key] = _calibrate(fn, min_time)
        except Exception as exc:
            out[key] = f"error ({type(exc).__name__})"
    keys = list(numbers)
    samples: dict[Any, list[float]] = {key: [] for key in keys}
    for r in range(repeats if keys else 0):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            gc.collect()
            samples[key].append(_loop(fns[key], numbers[key]) / numbers[key])
    for key in keys:
        out[key] = statistics.median(samples[key])
    return out


@dataclasses.dataclass
class Settings:
    quick: bool
    min_time: float
    repeats: int
    big_repeats: int
    scaling_sizes: tuple[int, ...]
    scaling_repeats: int


def settings_for(quick: bool, min_time: Optional[float], repeats: Optional[int]) -> Settings:
    if quick:
        s = Settings(True, 0.002, 3, 1, (10**3, 10**4), 1)
    else:
        s = Settings(False, 0.05, 7, 5, (10**3, 10**4, 10**5, 10**6), 3)
    if min_time is not None:
        s.min_time = min_time
    if repeats is not None:
        s.repeats = repeats
    return s


# --------------------------------------------------------------------------
# The side-by-side table


def _calls_checked(lib: Lib, tree: Any, expected: int) -> dict[str, Call | str]:
    """``lib``'s calls on ``tree``, each run once and checked against pytree_kit's count.

    Raises ValueError when the library sees a different number of leaves or an
    operation does not round-trip, so that nothing not comparable is timed.
    """
    leaves = lib.leaves(tree)
    if len(leaves) != expected:
        raise ValueError(f"{len(leaves)} leaves, pytree_kit has {expected}")
    calls = lib.calls(tree, lib.structure(tree), leaves)
    for op, fn in calls.items():
        if isinstance(fn, str):
            continue
        got = fn()
        if op == "flatten":
            got = got[0]
        elif op in ("unflatten", "tree_map"):
            got = lib.leaves(got)
        if len(got) != expected or any(a is not b for a, b in zip(got, leaves)):
            raise ValueError(f"{op} does not give the leaves of leaves()")
    return calls


FLOOR = "list copy (floor)"
#: pytree_kit's flatten timed again in the flatten_up_to rounds: the target compares
#: the two, so they share rounds as leaves() and its floor do.
SAME_ROUNDS = "flatten, in the flatten_up_to rounds"


def run_table(
    libs: list[Lib], settings: Settings, notes: list[str], log: Callable[[str], None]
) -> tuple[dict[tuple[str, str, str], Any], dict[str, int], dict[str, float]]:
    """Times every (library, tree, operation); returns the cells, leaf counts and floors.

    The floor of a tree (copying a prebuilt list of as many references) is timed in
    the same interleaved rounds as leaves(), and pytree_kit's flatten again in the
    rounds of flatten_up_to (as cells of the op ``SAME_ROUNDS``).
    """
    cells: dict[tuple[str, str, str], Any] = {}
    counts: dict[str, int] = {}
    floor: dict[str, float] = {}
    for case in TREES:
        if case.big and settings.quick:
            for lib in libs:
                for op in OPS:
                    cells[lib.name, case.key, op] = "skipped (--quick)"
            continue
        tree = case.make()
        counts[case.key] = expected = len(_pure.leaves(tree, None, None))
        repeats = settings.big_repeats if case.big else settings.repeats
        calls: dict[str, dict[str, Callable[[], Any] | str]] = {}
        for lib in libs:
            if case.key in lib.na:
                calls[lib.name] = dict.fromkeys(OPS, lib.na[case.key])
                continue
            try:
                calls[lib.name] = _calls_checked(lib, tree, expected)
            except Exception as exc:
                notes.append(f"**{lib.name}** on {case.label}: {exc!r}; not timed.")
                calls[lib.name] = dict.fromkeys(OPS, "error")
        prebuilt = list(range(expected))
        for op in OPS:
            fns: dict[str, Callable[[], Any]] = {}
            for lib in libs:
                fn = calls[lib.name][op]
                if isinstance(fn, str):
                    cells[lib.name, case.key, op] = fn
                else:
                    fns[lib.name] = fn
            if op == "leaves":
                fns[FLOOR] = prebuilt.copy
            refs: dict[str, str] = {}
            if op == "flatten_up_to":
                for lib in libs:
                    flat = calls[lib.name]["flatten"]
                    if not lib.peer and not isinstance(flat, str):
                        refs[f"{lib.name}: {SAME_ROUNDS}"] = lib.name
                        fns[f"{lib.name}: {SAME_ROUNDS}"] = flat
            for name, v in measure_many(fns, settings.min_time, repeats).items():
                if name == FLOOR:
                    floor[case.key] = v
                elif name in refs:
                    cells[refs[name], case.key, SAME_ROUNDS] = v
                else:
                    cells[name, case.key, op] = v
                    if isinstance(v, str):
                        notes.append(f"**{name}** {op} on {case.label}: {v}")
            log(f"  {case.label}: {op} done")
        del tree, prebuilt, calls
    return cells, counts, floor


# --------------------------------------------------------------------------
# Scaling


def scaling_tree(n: int) -> Any:
    """``n`` leaves as a list of ``n // 10`` dicts of 10 ints."""
    return [{f"k{j}": j for j in range(10)} for _ in range(n // 10)]


def run_scaling(
    libs: list[Lib], settings: Settings, log: Callable[[str], None]
) -> dict[tuple[str, str, int], float]:
    """Nanoseconds per leaf of flatten and leaves at each size (and the list-copy floor)."""
    keep = [lib for lib in libs if not lib.peer or lib.name in ("jax.tree_util", "optree")]
    out: dict[tuple[str, str, int], float] = {}
    for n in settings.scaling_sizes:
        tree = scaling_tree(n)
        prebuilt = list(range(n))
        repeats = settings.scaling_repeats if n >= 10**5 else settings.repeats
        fns: dict[tuple[str, str], Callable[[], Any]] = {}
        for lib in keep:
            calls = lib.calls(tree, lib.structure(tree), [])
            for op in ("flatten", "leaves"):
                fn = calls[op]
                if not isinstance(fn, str):
                    fns[lib.name, op] = fn
        fns[FLOOR, "leaves"] = prebuilt.copy
        for (name, op), v in measure_many(fns, settings.min_time, repeats).items():
            if isinstance(v, float):
                out[name, op, n] = v * 1e9 / n
        del tree, prebuilt, fns, calls
        log(f"  scaling 10^{len(str(n)) - 1} done")
    return out


# --------------------------------------------------------------------------
# The report


def _git_revision() -> str:
    """The checkout's commit, and whether pytree_kit/ has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "pytree_kit"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    if not rev:
        return "?"
    return rev + (" with uncommitted changes in pytree_kit/" if dirty else "")


def machine_lines(libs: list[Lib], revision: str) -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        cpu = platform.processor() or "?"
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 0
    try:
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"
    except OSError:  # pragma: no cover - not available
        load = "?"
    engines = ", ".join(label for label, _ in pk_engines())
    lines = [
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.platform()}",
        f"- CPU: {cpu}; {os.cpu_count()} logical cores ({usable} usable by this process); "
        f"load average at the end {load}",
        f"- pytree_kit {pk.__version__} (git {revision}); engines benchmarked: {engines}; "
        f"`pk.ENGINE` (the active one) = `{pk.ENGINE}`",
    ]
    peers = [lib for lib in libs if lib.peer]
    versions = [f"{lib.name} {lib.version}" for lib in peers]
    if any(lib.name == "jax.tree_util" for lib in peers):
        versions.append(f"jaxlib {_dist_version('jaxlib')}")
    lines.append("- Peers: " + (", ".join(versions) if versions else "none"))
    return lines


def _fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    if us >= 1000:
        return f"{us:,.0f}"
    if us >= 100:
        return f"{us:.0f}"
    if us >= 10:
        return f"{us:.1f}"
    return f"{us:.2f}"


def best_peer(
    libs: list[Lib], cells: dict[tuple[str, str, str], Any], tree: str, op: str
) -> Optional[tuple[str, float]]:
    timed = [
        (cells[lib.name, tree, op], lib.name)
        for lib in libs
        if lib.peer and isinstance(cells.get((lib.name, tree, op)), float)
    ]
    if not timed:
        return None
    t, name = min(timed)
    return name, t


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def op_table(libs: list[Lib], cells: dict[tuple[str, str, str], Any], op: str) -> list[str]:
    header = ["tree", *[lib.name for lib in libs], "fastest peer"]
    rows = []
    for case in TREES:
        best = best_peer(libs, cells, case.key, op)
        row = [case.label]
        for lib in libs:
            v = cells[lib.name, case.key, op]
            if isinstance(v, float):
                text = _fmt_us(v)
                if best is not None:
                    text += f" ({best[1] / v:.2f}{X})"
                row.append(text)
            else:
                row.append(v)
        row.append(best[0] if best else "-")
        rows.append(row)
    return _table(header, rows)


def floor_table(
    libs: list[Lib],
    cells: dict[tuple[str, str, str], Any],
    counts: dict[str, int],
    floor: dict[str, float],
) -> list[str]:
    header = ["tree", "leaves", "floor µs", *[lib.name for lib in libs]]
    rows = []
    for case in TREES:
        if case.key not in floor:
            rows.append([case.label, "-", "skipped (--quick)", *["-" for _ in libs]])
            continue
        row = [case.label, f"{counts[case.key]:,}", _fmt_us(floor[case.key])]
        for lib in libs:
            v = cells[lib.name, case.key, "leaves"]
            row.append(f"{v / floor[case.key]:.1f}{X}" if isinstance(v, float) else v)
        rows.append(row)
    return _table(header, rows)


def up_to_table(libs: list[Lib], cells: dict[tuple[str, str, str], Any]) -> list[str]:
    ours = [lib for lib in libs if not lib.peer]
    rows = []
    for case in TREES:
        row = [case.label]
        for lib in ours:
            up = cells.get((lib.name, case.key, "flatten_up_to"))
            flat = cells.get((lib.name, case.key, SAME_ROUNDS))
            if isinstance(up, float) and isinstance(flat, float):
                row.append(f"{_fmt_us(up)} / {_fmt_us(flat)} ({flat / up:.2f}{X})")
            else:
                row.append("-")
        rows.append(row)
    return _table(["tree", *[lib.name for lib in ours]], rows)


#: The targets of issue 3, checked on the C engine (the pure one where no C is built).
TARGETS = (
    ("flatten", "speedup", 2.0),
    ("unflatten", "speedup", 1.5),
    ("tree_map", "speedup", 1.5),
    ("leaves", "floor", 1.3),
    ("flatten_up_to", "vs flatten", 1.5),
)


def targets_table(
    libs: list[Lib], cells: dict[tuple[str, str, str], Any], floor: dict[str, float]
) -> list[str]:
    """Each target, per tree, for the fastest pytree_kit engine: met or missed."""
    ours = [lib for lib in libs if not lib.peer]
    lib = next((x for x in ours if x.name.endswith("(c)")), ours[0] if ours else None)
    if lib is None:
        return ["No pytree_kit engine was timed."]
    header = ["target", *[c.label for c in TREES]]
    rows = []
    for op, kind, goal in TARGETS:
        if kind == "speedup":
            label = f"{op}: at least {goal:g}{X} faster than the fastest peer"
        elif kind == "floor":
            label = f"leaves(): within {goal:g}{X} of the list-copy floor"
        else:
            label = f"flatten_up_to: at least {goal:g}{X} faster than flatten"
        row = [label]
        for case in TREES:
            v = cells.get((lib.name, case.key, op))
            if not isinstance(v, float):
                row.append("-")
                continue
            if kind == "speedup":
                best = best_peer(libs, cells, case.key, op)
                ratio = best[1] / v if best else None
                ok = ratio is not None and ratio >= goal
            elif kind == "floor":
                ratio = v / floor[case.key] if case.key in floor else None
                ok = ratio is not None and ratio <= goal
            else:
                flat = cells.get((lib.name, case.key, SAME_ROUNDS))
                ratio = flat / v if isinstance(flat, float) else None
                ok = ratio is not None and ratio >= goal
            row.append("-" if ratio is None else f"{ratio:.2f}{X} {'met' if ok else 'MISSED'}")
        rows.append(row)
    return [
        f"For **{lib.name}**, from the tables above. The flatten_up_to row divides by "
        "pytree_kit's flatten timed again in the same interleaved rounds as flatten_up_to "
        "(as leaves() and its floor share rounds), so that a drift of the machine's speed "
        "between the two operations' rounds does not decide it.",
        "",
        *_table(header, rows),
    ]


def scaling_tables(scaling: dict[tuple[str, str, int], float], sizes: tuple[int, ...]) -> list[str]:
    out: list[str] = []
    for op in ("flatten", "leaves"):
        names = list(dict.fromkeys(name for name, o, _ in scaling if o == op))
        out.append(f"**{op}**, ns per leaf:")
        out.append("")
        rows = []
        for n in sizes:
            row = [f"{n:,}"]
            for name in names:
                v = scaling.get((name, op, n))
                row.append(f"{v:.1f}" if v is not None else "-")
            rows.append(row)
        out += _table(["leaves", *names], rows)
        out.append("")
    return out


def render(
    argv: list[str],
    libs: list[Lib],
    settings: Settings,
    cells: dict[tuple[str, str, str], Any],
    counts: dict[str, int],
    floor: dict[str, float],
    scaling: dict[tuple[str, str, int], float],
    notes: list[str],
    elapsed: float,
    revision: str,
) -> str:
    peers = [lib.name for lib in libs if lib.peer]
    lines = [
        "# pytree_kit: side-by-side speed benchmark",
        "",
        "`" + " ".join(["python benchmarks/compare.py", *argv]) + "`",
        f"run on {time.strftime('%Y-%m-%d %H:%M')}, in one process, {elapsed:.0f} s in all"
        + (" (**--quick**: smoke mode, numbers are rough)" if settings.quick else "")
        + ".",
        "",
        "## Machine and versions",
        "",
        *machine_lines(libs, revision),
        f"- Timing: median of {settings.repeats} repeats ({settings.big_repeats} for tree (f)); "
        f"each repeat loops the call for at least {settings.min_time * 1e3:g} ms "
        "(autorange 1, 2, 5, 10, ...), after a warm-up call; the libraries' loops "
        "interleaved round by round; gc enabled, with `gc.freeze()` after the imports "
        "and `gc.collect()` before each loop.",
        "",
        "## How to read",
        "",
        f"Each cell is `median µs per call (speedup{X})`, with **speedup = fastest peer's "
        f"median / this median** for that tree and operation: above 1{X} is faster than the "
        f"best peer, 1.00{X} is that best peer, 0.50{X} takes twice its time. "
        f"Peers: {', '.join(peers) if peers else 'none'}. The active pytree_kit engine "
        f"(`{pk.ENGINE}`) is timed through the public API (`pk.flatten(tree)`, "
        "`pk.unflatten(spec, leaves)`, `pk.leaves(tree)`, `pk.tree_map(f, tree)`, "
        "`spec.flatten_up_to(tree)`), as users call it; the other engine is called directly.",
        "",
        "Not comparable, so not timed: dm-tree has no spec object (its `flatten` is the "
        "`leaves` row; its `unflatten` is `unflatten_as(tree, leaves)` and its "
        "`flatten_up_to` is `flatten_up_to(tree, tree)`), and it has no registration, so "
        "it treats the dataclasses of (e) as single leaves. The peers get the dataclasses "
        "registered (jax `register_dataclass`, optree `register_pytree_node` in a "
        "namespace, torch `register_pytree_node`, which also registers with _cxx_pytree); "
        "pytree_kit needs nothing.",
        "",
        "## Trees",
        "",
        *_table(
            ["tree", "leaves", "what"],
            [
                [
                    c.label,
                    f"{counts[c.key]:,}" if c.key in counts else "skipped (--quick)",
                    TREE_DESCRIPTIONS[c.key],
                ]
                for c in TREES
            ],
        ),
        "",
    ]
    lines += ["## Targets", "", *targets_table(libs, cells, floor), ""]
    for op in OPS:
        lines += [f"## {op}", "", *op_table(libs, cells, op), ""]
    lines += [
        "## flatten_up_to against flatten",
        "",
        "pytree_kit's flatten_up_to and its flatten timed again in the same interleaved "
        f"rounds: each cell is `flatten_up_to µs / flatten µs (speedup{X})`, with "
        "speedup = flatten's time / flatten_up_to's (higher is better).",
        "",
        *up_to_table(libs, cells),
        "",
        "## leaves() against the floor",
        "",
        "The floor is the time to copy as many references into a new list "
        "(`prebuilt_list.copy()`, len = the number of leaves); each cell is "
        f"**leaves() time / floor** (lower is better, 1{X} is the floor).",
        "",
        *floor_table(libs, cells, counts, floor),
        "",
        "## Scaling",
        "",
        "A list of n/10 dicts of 10 ints; nanoseconds per leaf of one call (median of "
        f"{settings.repeats} loops, {settings.scaling_repeats} from 10^5 leaves up; "
        "the libraries interleaved as above). "
        "`list copy (floor)` is the floor above at that size.",
        "",
        *scaling_tables(scaling, settings.scaling_sizes),
    ]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------
# The charts


def _colors(libs: list[Lib]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {lib.name: cmap(i % 10) for i, lib in enumerate(libs)}


def _tick_label(v: float, _pos: Any) -> str:
    """Log-axis tick labels as plain numbers, only at 1, 2 and 5 of each decade."""
    if v <= 0:
        return ""
    lead = round(v / 10 ** math.floor(math.log10(v) + 1e-9))
    return f"{v:g}" if lead in (1, 2, 5) else ""


def plot_compare(
    libs: list[Lib],
    cells: dict[tuple[str, str, str], Any],
    counts: dict[str, int],
    floor: dict[str, float],
    path: Path,
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(_tick_label)
    colors = _colors(libs)
    trees = [c for c in TREES if c.key in counts]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    width = 0.8 / max(len(libs), 1)
    panels: list[tuple[str, str]] = [(op, op) for op in OPS]
    panels.append(("floor", "leaves: multiple of the list-copy floor (lower is better)"))
    for ax, (op, title) in zip(axes.flat, panels):
        for i, lib in enumerate(libs):
            xs, ys = [], []
            for j, case in enumerate(trees):
                v = cells[lib.name, case.key, "leaves" if op == "floor" else op]
                if not isinstance(v, float):
                    continue
                if op == "floor":
                    ys.append(v / floor[case.key])
                else:
                    best = best_peer(libs, cells, case.key, op)
                    if best is None:
                        continue
                    ys.append(best[1] / v)
                xs.append(j + (i - (len(libs) - 1) / 2) * width)
            ax.bar(xs, ys, width, color=colors[lib.name], label=lib.name)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(trees)))
        ax.set_xticklabels([c.label.split(")")[0] + ")" for c in trees])
        ax.set_title(title if op == "floor" else f"{title}: speedup vs fastest peer")
        ax.grid(axis="y", which="both", alpha=0.3)
    handles = [Patch(color=colors[lib.name], label=lib.name) for lib in libs]
    fig.legend(handles=handles, loc="lower center", ncol=len(libs), fontsize=9)
    fig.suptitle(
        "pytree_kit vs peers: speedup = fastest peer time / time (>1 is faster); "
        + ", ".join(c.label for c in trees),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_scaling(
    libs: list[Lib], scaling: dict[tuple[str, str, int], float], sizes: tuple[int, ...], path: Path
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    colors = _colors(libs)
    colors[FLOOR] = "gray"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, op in zip(axes, ("flatten", "leaves")):
        names = list(dict.fromkeys(name for name, o, _ in scaling if o == op))
        for name in names:
            pts = [(n, scaling[name, op, n]) for n in sizes if (name, op, n) in scaling]
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                color=colors.get(name),
                linestyle="--" if name.startswith("list copy") else "-",
                label=name,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_tick_label))
        ax.yaxis.set_minor_formatter(FuncFormatter(_tick_label))
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.set_xlabel("leaves (a list of dicts of 10)")
        ax.set_ylabel("ns per leaf")
        ax.set_title(f"{op}: ns per leaf")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# --------------------------------------------------------------------------


def summary(
    libs: list[Lib], cells: dict[tuple[str, str, str], Any], floor: dict[str, float], revision: str
) -> dict[str, Any]:
    """The figures of the fastest pytree_kit engine, for compare.json: per
    operation and tree, its µs, the fastest peer and its µs, and the speedup;
    leaves() against its floor; flatten_up_to against flatten in the same rounds."""
    ours = [lib for lib in libs if not lib.peer]
    lib = next((x for x in ours if x.name.endswith("(c)")), ours[0] if ours else None)
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "pytree_kit": revision,
        "engine": lib.name if lib else None,
        "engine_info": pk.engine_info(),
        "peers": {x.name: x.version for x in libs if x.peer},
        "trees": {c.key: c.label for c in TREES},
        "ops": {},
        "leaves_floor": {},
        "flatten_up_to_vs_flatten": {},
    }
    if lib is None:
        return out
    for op in OPS:
        per_tree: dict[str, Any] = {}
        for case in TREES:
            v = cells.get((lib.name, case.key, op))
            best = best_peer(libs, cells, case.key, op)
            if isinstance(v, float) and best is not None:
                per_tree[case.key] = {
                    "us": v * 1e6,
                    "fastest_peer": best[0],
                    "peer_us": best[1] * 1e6,
                    "speedup": best[1] / v,
                }
        out["ops"][op] = per_tree
    for case in TREES:
        v = cells.get((lib.name, case.key, "leaves"))
        if isinstance(v, float) and case.key in floor:
            out["leaves_floor"][case.key] = v / floor[case.key]
        up = cells.get((lib.name, case.key, "flatten_up_to"))
        flat = cells.get((lib.name, case.key, SAME_ROUNDS))
        if isinstance(up, float) and isinstance(flat, float):
            out["flatten_up_to_vs_flatten"][case.key] = flat / up
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke mode: tiny repeats, no tree (f)")
    _output.add_arguments(p)
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="LIB",
        help="benchmark only the peers whose name contains LIB (repeatable; "
        "pytree_kit is always included)",
    )
    p.add_argument("--min-time", type=float, default=None, help="seconds per timing loop")
    p.add_argument("--repeats", type=int, default=None, help="timing loops per cell")
    p.add_argument("--no-plot", action="store_true", help="skip the charts")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    settings = settings_for(args.quick, args.min_time, args.repeats)
    revision = _git_revision()  # now: the code this process imported is that revision
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s]{msg}", file=sys.stderr, flush=True)

    notes: list[str] = []
    libs = load_libraries(args.only, notes)
    _tensors()  # imports torch, when present, whichever peers were chosen
    # The imports leave ~200k objects (torch, jax) that a full collection would walk
    # (~0.1 s each): move them to the permanent generation. gc stays enabled.
    gc.collect()
    gc.freeze()
    log(" libraries: " + ", ".join(lib.name for lib in libs))
    cells, counts, floor = run_table(libs, settings, notes, log)
    scaling = run_scaling(libs, settings, log)
    elapsed = time.perf_counter() - start
    report = render(argv, libs, settings, cells, counts, floor, scaling, notes, elapsed, revision)
    print(report)
    out = _output.folder(args)
    written = [out / "compare.md", out / "compare.json"]
    written[0].write_text(report, encoding="utf-8")
    figures = summary(libs, cells, floor, revision)
    written[1].write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    if not args.no_plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            plot_compare(libs, cells, counts, floor, out / "compare.png")
            plot_scaling(libs, scaling, settings.scaling_sizes, out / "scaling.png")
            written += [out / "compare.png", out / "scaling.png"]
        except ImportError:
            log(" matplotlib is not installed: no charts")
        except Exception:
            traceback.print_exc()
            return 1
    _output.wrote(*written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
