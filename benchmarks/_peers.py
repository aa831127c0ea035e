"""The peers and the timing of the corpus benchmark, which other benchmarks share.

- :class:`Lib` and :func:`load_libraries`: pytree_kit's engines (the active one
  through the public API, the other called directly) and each peer that can be
  imported (jax.tree_util, optree, torch.utils._pytree, torch.utils._cxx_pytree,
  dm-tree), each operation a zero-argument ``functools.partial`` straight onto
  the library's own function, so every library pays the same calling overhead.
  The classes a benchmark's trees hold are its own to register
  (``corpus.register_with_peers``); pytree_kit needs nothing.
- :func:`measure_many`: the timing. Each call is made once as a warm-up, then a
  loop of ``number`` calls is grown (1, 2, 5, 10, 20, ...) until it runs for at
  least ``min_time``; then the calls take turns, one loop of each a round (the
  order rotating), ``repeats`` rounds, and each gets the median time per call
  over its loops. Interleaving spreads any burst of load from elsewhere on the
  machine over every library alike. The garbage collector stays enabled, as in
  real use (``timeit`` would disable it); what is alive is moved out of its way
  (``gc.freeze()``), and ``gc.collect()`` runs before each loop so that one
  loop's garbage is not collected on another's clock.
- :func:`_calls_checked`: a library's calls on a tree, each run once and checked
  to give pytree_kit's leaves, so that nothing not comparable is timed.
- the report's shared lines: :func:`machine_lines`, :func:`best_peer`,
  :func:`_table`, :func:`_fmt_us`, :func:`_initial`.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib
import importlib.metadata
import itertools
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

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


def _peer_lib(name: str, version: str, mod: Any, leaves_first: bool = False, **kw: Any) -> Lib:
    """A peer whose module has tree_flatten, tree_unflatten (``leaves_first``:
    torch's order, leaves then spec), tree_leaves, tree_map and tree_structure,
    each but tree_unflatten given ``kw`` (optree's namespace)."""

    def calls(tree: Any, spec: Any, leaves: list) -> dict[str, Call | str]:
        up_to = getattr(spec, "flatten_up_to", None)
        return {
            "flatten": functools.partial(mod.tree_flatten, tree, **kw),
            "unflatten": functools.partial(
                mod.tree_unflatten, *((leaves, spec) if leaves_first else (spec, leaves))
            ),
            "leaves": functools.partial(mod.tree_leaves, tree, **kw),
            "tree_map": functools.partial(mod.tree_map, identity, tree, **kw),
            "flatten_up_to": (
                functools.partial(up_to, tree) if up_to is not None else "n/a (no flatten_up_to)"
            ),
        }

    leaves = functools.partial(mod.tree_leaves, **kw)
    return Lib(name, True, version, leaves, functools.partial(mod.tree_structure, **kw), calls)


def _jax_lib() -> Lib:
    import jax
    import jax.tree_util as jtu

    return _peer_lib("jax.tree_util", jax.__version__, jtu)


def _optree_lib() -> Lib:
    import optree

    return _peer_lib("optree", optree.__version__, optree, namespace=OPTREE_NS)


def _torch_lib(module: str) -> Lib:
    import torch

    return _peer_lib(module, torch.__version__, importlib.import_module(module), leaves_first=True)


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


def _initial(name: str) -> str:
    """A peer's initial in the reports' cells (any other name as it is)."""
    return {
        "jax.tree_util": "j",
        "optree": "o",
        "torch.utils._pytree": "t",
        "torch.utils._cxx_pytree": "c",
        "dm-tree": "d",
    }.get(name, name)
