"""Inside torch.compile: pytree_kit against torch.utils._pytree and optree.

    python benchmarks/compiled.py           # full run, writes benchmarks/results/compiled.md
    python benchmarks/compiled.py --quick   # a smoke run (CI), writes nothing unless --out DIR

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
  seen (guard evaluation, the graph, rebuilding the output), best of the rounds;
- **eager**: the wrapper's time without torch.compile, for scale;
- **guards**: the leaf guards of the compiled code (dynamo's guard tree,
  walked), and **graphs**: how many graphs 20 fresh batches compiled.

Ratios are pytree_kit / torch.utils._pytree (at most 1.0 is the target).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.utils._pytree as torch_pytree

import pytree_kit as pk

RESULTS = Path(__file__).resolve().parent / "results"


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
    """Every library's row; the compiles are timed in interleaved rounds."""
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
        row = rows[name]
        compile_time(step)
        row["guards"] = count_guards(step)
        torch._dynamo.reset()
        backend = CountingBackend()
        compiled = torch.compile(step, backend=backend, fullgraph=True)
        for b in batches[:fresh]:
            check_result(compiled(b), b)
        row["graphs"] = backend.graphs
        best_call = best_eager = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for b in batches[:calls]:
                compiled(b)
            best_call = min(best_call, (time.perf_counter() - t0) / calls)
            t0 = time.perf_counter()
            for b in batches[:calls]:
                step(b)
            best_eager = min(best_eager, (time.perf_counter() - t0) / calls)
        row["call_us"] = best_call * 1e6
        row["eager_us"] = best_eager * 1e6
    return list(rows.values())


def versions() -> str:
    parts = [f"Python {platform.python_version()}", f"torch {torch.__version__}"]
    try:
        import optree

        parts.append(f"optree {optree.__version__}")
    except ImportError:
        parts.append("optree not installed")
    parts.append(f"pytree_kit {pk.__version__} ({pk.ENGINE} engine)")
    return "; ".join(parts)


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
    parser.add_argument("--out", type=Path, default=None, help="the folder to write compiled.md in")
    args = parser.parse_args(argv)
    rounds, calls, fresh = (1, 20, 20) if args.quick else (7, 500, 20)
    rows = measure(rounds, calls, fresh)
    text = report(rows, rounds, calls, fresh)
    print(text)
    out = args.out if args.out is not None else (None if args.quick else RESULTS)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "compiled.md").write_text(text)
    ours = next(r for r in rows if r["name"] == "pytree_kit")
    return 0 if ours["graphs"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
