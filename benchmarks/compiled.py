"""Inside torch.compile: pytree_kit against torch.utils._pytree and optree.

    python benchmarks/compiled.py           # full run, writes build/benchmarks/compiled.md
    python benchmarks/compiled.py --record  # the same, into benchmarks/results/compiled.md
    python benchmarks/compiled.py --quick   # a smoke run (CI), writes nothing unless --out DIR
    python benchmarks/compiled.py --instructions  # adds each call's instructions (callgrind)

A wrapper flattens a nested batch of 100 tensor leaves (an image and 33
``Target`` dataclasses of three tensors each, in a dict and a list), adds 1 to
one leaf and unflattens: a one-op graph, so what is measured is what the
pytree library costs a compiled function, not the graph's arithmetic. Each
library flattens the same batch; ``Target`` is registered with torch
(``register_dataclass``) and with optree (in a namespace of its own), as their
users must; pytree_kit reads it with nothing registered.

For each library, in one process:

- **compile**: the first call's time after ``torch._dynamo.reset()`` (dynamo
  tracing and guard building; backend ``eager``, so no code generation is in
  it), best of the rounds, the libraries interleaved in each round, after one
  untimed compile (dynamo's first in a process sets itself up);
- **call**: the steady-state time of a compiled call on a batch it has not
  seen (guard evaluation, the graph, rebuilding the output), best of the rounds,
  the libraries interleaved in each round;
- **eager**: the wrapper's time without torch.compile, for scale;
- **guards**: the leaf guards of the compiled code (dynamo's guard tree,
  walked), and **graphs**: how many graphs 20 fresh batches compiled.

Ratios are pytree_kit / torch.utils._pytree (at most 1.0 is the target).

On a busy machine the call times mislead; ``--instructions`` also counts
the instructions of a compiled call under valgrind's callgrind, which other
processes do not change: each library in a child process, which compiles
its wrapper, warms it on 5 batches, then makes ``CALLGRIND_CALLS`` calls on
fresh batches from inside ``sorted`` (callgrind collects only inside
CPython's ``builtin_sorted``: ``--toggle-collect``). Several minutes per
library: torch's import and dynamo run under valgrind too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from typing import Any, Callable

import _callgrind
import _output
import torch
import torch.utils._pytree as torch_pytree

import pytree_kit as pk


@dataclasses.dataclass
class Target:
    boxes: torch.Tensor
    labels: torch.Tensor
    area: torch.Tensor


def make_batch(n_targets: int = 33) -> dict:
    """A fresh batch of ``1 + 3 * n_targets`` tensors (100 by default)."""
    return {
        "image": torch.randn(2, 3),
        "targets": [
            Target(torch.randn(2, 4), torch.randint(0, 5, (2,)), torch.randn(2))
            for _ in range(n_targets)
        ],
    }


# -- the libraries ---------------------------------------------------------------


def _bump(leaves: list) -> list:
    return [*leaves[:-1], leaves[-1] + 1]


def wrapper_pk() -> Callable[[Any], Any]:
    def step(batch: Any) -> Any:
        leaves, spec = pk.flatten(batch)
        return pk.unflatten(spec, _bump(leaves))

    return step


def wrapper_torch() -> Callable[[Any], Any]:
    if Target not in torch_pytree.SUPPORTED_NODES:
        torch_pytree.register_dataclass(Target)

    def step(batch: Any) -> Any:
        leaves, spec = torch_pytree.tree_flatten(batch)
        return torch_pytree.tree_unflatten([*leaves[:-1], leaves[-1] + 1], spec)

    return step


def wrapper_optree() -> Any:
    try:
        import optree
    except ImportError:
        return None
    namespace = "pytree_kit.benchmarks"
    try:
        optree.register_pytree_node(
            Target,
            lambda t: ((t.boxes, t.labels, t.area), None, ("boxes", "labels", "area")),
            lambda _, children: Target(*children),
            namespace=namespace,
        )
    except ValueError:  # registered already (a second run in one process)
        pass

    def step(batch: Any) -> Any:
        leaves, spec = optree.tree_flatten(batch, namespace=namespace)
        return optree.tree_unflatten(spec, [*leaves[:-1], leaves[-1] + 1])

    return step


LIBRARIES: dict[str, Callable[[], Any]] = {
    "pytree_kit": wrapper_pk,
    "torch.utils._pytree": wrapper_torch,
    "optree": wrapper_optree,
}


# -- measuring -------------------------------------------------------------------


class CountingBackend:
    """A torch.compile backend that counts the graphs it is given and runs them as they are."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward


def count_guards(fn: Callable[..., Any]) -> int:
    """The leaf guards of every cache entry dynamo keeps for ``fn``'s code."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    total = 0
    for entry in _debug_get_cache_entry_list(fn.__code__):
        todo = [entry.guard_manager.root]
        while todo:
            mgr = todo.pop()
            total += len(mgr.get_leaf_guards())
            todo.extend(mgr.get_child_managers())
            if hasattr(mgr, "get_key_value_managers"):
                for key_mgr, val_mgr in mgr.get_key_value_managers().values():
                    todo.extend(m for m in (key_mgr, val_mgr) if m is not None)
    return total


def check_result(got: Any, batch: dict) -> None:
    """``got`` is ``batch`` with 1 added to its last leaf."""
    assert type(got) is dict and len(got["targets"]) == len(batch["targets"])
    last_got, last = got["targets"][-1], batch["targets"][-1]
    assert type(last_got) is Target
    torch.testing.assert_close(last_got.area, last.area + 1)
    torch.testing.assert_close(got["image"], batch["image"])


def warm_up() -> None:
    """One compile before any is timed: dynamo's first compile in a process
    pays for imports and set-up that later ones do not."""
    torch._dynamo.reset()
    torch.compile(lambda b: b["x"] + 1, backend="eager", fullgraph=True)({"x": torch.ones(1)})


def compile_time(step: Callable[[Any], Any]) -> float:
    """Seconds of the first compiled call of ``step``, after ``torch._dynamo.reset()``."""
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    batch = make_batch()
    t0 = time.perf_counter()
    got = compiled(batch)
    elapsed = time.perf_counter() - t0
    check_result(got, batch)
    return elapsed


def measure(rounds: int, calls: int, fresh: int) -> list[dict[str, Any]]:
    """Every library's row; the compiles and the calls are timed in interleaved rounds."""
    steps = {name: make() for name, make in LIBRARIES.items()}
    rows = {name: {"name": name, "missing": step is None} for name, step in steps.items()}
    present = {name: step for name, step in steps.items() if step is not None}
    warm_up()
    for name in list(present):
        try:  # optree's C functions trace only where dynamo has stand-ins for them
            compile_time(present[name])
        except Exception as e:
            rows[name]["untraceable"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
            del present[name]
    for name in present:
        rows[name]["compile_s"] = float("inf")
    for _ in range(rounds):
        for name, step in present.items():
            rows[name]["compile_s"] = min(rows[name]["compile_s"], compile_time(step))
    batches = [make_batch() for _ in range(max(calls, fresh))]
    for name, step in present.items():
        compile_time(step)
        rows[name]["guards"] = count_guards(step)
    # Each library's step is its own code, so their compiled entries live side
    # by side after one reset; the timed rounds then interleave the libraries,
    # so that a busy machine slows each alike.
    torch._dynamo.reset()
    compiled = {}
    for name, step in present.items():
        backend = CountingBackend()
        compiled[name] = torch.compile(step, backend=backend, fullgraph=True)
        for b in batches[:fresh]:
            check_result(compiled[name](b), b)
        rows[name]["graphs"] = backend.graphs
        rows[name]["call_us"] = rows[name]["eager_us"] = float("inf")
    for _ in range(rounds):
        for name, step in present.items():
            row, fn = rows[name], compiled[name]
            t0 = time.perf_counter()
            for b in batches[:calls]:
                fn(b)
            row["call_us"] = min(row["call_us"], (time.perf_counter() - t0) / calls * 1e6)
            t0 = time.perf_counter()
            for b in batches[:calls]:
                step(b)
            row["eager_us"] = min(row["eager_us"], (time.perf_counter() - t0) / calls * 1e6)
    return list(rows.values())


CALLGRIND_CALLS = 40


def callgrind_child(name: str) -> None:
    """In the child under callgrind: compile, warm, then the counted calls."""
    step = LIBRARIES[name]()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    batches = [make_batch() for _ in range(5 + CALLGRIND_CALLS)]
    for b in batches[:5]:
        check_result(compiled(b), b)
    # Collected: only what runs inside builtin_sorted, that is these calls.
    sorted(batches[5:], key=lambda b: (compiled(b), 0)[1])


def call_instructions(name: str) -> float:
    """Instructions of one compiled call of ``name``'s wrapper (callgrind)."""
    child = ["--callgrind-child", name]
    return _callgrind.count(__file__, child, toggles=("builtin_sorted",)) / CALLGRIND_CALLS


def versions() -> str:
    parts = [f"Python {platform.python_version()}", f"torch {torch.__version__}"]
    try:
        import optree

        parts.append(f"optree {optree.__version__}")
    except ImportError:
        parts.append("optree not installed")
    parts.append(f"pytree_kit {pk.__version__} ({pk.ENGINE} engine)")
    return "; ".join(parts)


def instructions_line(rows: list[dict[str, Any]]) -> list[str]:
    """The report's line on callgrind's counts, when they were taken."""
    ours, base = rows[0], next(r for r in rows if r["name"] == "torch.utils._pytree")
    if "call_ir" not in ours:
        return []
    each = ", ".join(f"{r['name']} {r['call_ir'] / 1e6:.2f} M" for r in rows if "call_ir" in r)
    return [
        f"- a compiled call in instructions (callgrind, {CALLGRIND_CALLS} calls), "
        f"pytree_kit / torch.utils._pytree: **{ours['call_ir'] / base['call_ir']:.2f}** ({each})"
    ]


def report(rows: list[dict[str, Any]], rounds: int, calls: int, fresh: int) -> str:
    base = next(r for r in rows if r["name"] == "torch.utils._pytree")
    lines = [
        "# Inside torch.compile: pytree_kit, torch.utils._pytree, optree",
        "",
        "`python benchmarks/compiled.py`: a wrapper that flattens a 100-leaf batch "
        "(an image and 33 `Target` dataclasses of three tensors), adds 1 to one leaf "
        "and unflattens, under `torch.compile(fullgraph=True, backend='eager')`. "
        f"Compile: the first call after `torch._dynamo.reset()`, best of {rounds}; "
        f"call: a compiled call on a fresh batch, best of {rounds} rounds of {calls}; "
        f"graphs: compiled over {fresh} fresh batches; guards: dynamo's leaf guards. "
        "Ratios are pytree_kit / torch.utils._pytree (at most 1.0 is the target).",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; {versions()}.",
        "",
        "| library | compile (s) | call (µs) | eager (µs) | guards | graphs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("missing"):
            lines.append(f"| {r['name']} | not installed | | | | |")
            continue
        if r.get("untraceable"):
            lines.append(f"| {r['name']} | does not trace on this torch | | | | |")
            continue
        lines.append(
            f"| {r['name']} | {r['compile_s']:.3f} | {r['call_us']:.1f} | {r['eager_us']:.1f} "
            f"| {r['guards']} | {r['graphs']} |"
        )
    ours = next(r for r in rows if r["name"] == "pytree_kit")
    lines += [
        "",
        f"- compile time, pytree_kit / torch.utils._pytree: "
        f"**{ours['compile_s'] / base['compile_s']:.2f}**",
        f"- steady-state call, pytree_kit / torch.utils._pytree: "
        f"**{ours['call_us'] / base['call_us']:.2f}**",
        *instructions_line(rows),
        f"- guards, pytree_kit / torch.utils._pytree: {ours['guards']} / {base['guards']}",
        f"- graphs over {fresh} fresh batches: "
        + ", ".join(f"{r['name']} {r['graphs']}" for r in rows if "graphs" in r),
        "",
    ]
    lines += [f"- {r['name']} does not trace here: {r['untraceable']}" for r in rows
              if r.get("untraceable")]  # fmt: skip
    lines += [""] if lines[-1] else []
    return "\n".join(lines)


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    _output.add_arguments(parser)
    parser.add_argument(
        "--instructions", action="store_true", help="also count a call's instructions (callgrind)"
    )
    parser.add_argument("--callgrind-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.callgrind_child:
        callgrind_child(args.callgrind_child)
        return 0
    rounds, calls, fresh = (1, 20, 20) if args.quick else (7, 500, 20)
    rows = measure(rounds, calls, fresh)
    if args.instructions:
        for row in rows:
            if "call_us" in row:
                row["call_ir"] = call_instructions(row["name"])
    text = report(rows, rounds, calls, fresh)
    if not args.quick or args.out is not None or args.record:
        _output.write_report(args, "compiled.md", text)
    else:
        print(text)
    ours = next(r for r in rows if r["name"] == "pytree_kit")
    return 0 if ours["graphs"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
