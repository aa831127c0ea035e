"""pk.ravel and its unravel against torch's parameters_to_vector /
vector_to_parameters and jax's ravel_pytree, on the parameters of real
models.

    python benchmarks/ravel.py            # build/benchmarks/ravel.md
    python benchmarks/ravel.py --record   # benchmarks/results/ravel.md (published)
    python benchmarks/ravel.py --quick    # smoke mode (CI): two models, rough

The trees are the parameter lists of four models (torch.nn modules with their
initial random weights):

- an MLP: 5 Linear(512, 512), 10 tensors;
- a CNN: 25 Conv2d(64, 64, 3) + BatchNorm2d(64), 100 tensors;
- a transformer: 84 TransformerEncoderLayer(64, 4, 256), its first 1,000 tensors;
- 1,000 biases of 64 float32 (the per-tensor cost alone).

torch: ``pk.ravel(params)`` against ``parameters_to_vector(params)`` (both
build the autograd graph: the parameters require grad), and
``unravel(vector)`` against ``vector_to_parameters(vector, params)``. They do
different things: vector_to_parameters points each parameter's ``.data`` into
the vector (no copy, the parameters alias it), unravel returns new tensors
from one private copy of the vector; the copy alone (``vector.clone()``) is
timed beside them.

numpy and jax: the same tensors as numpy arrays; ``pk.ravel`` gives a numpy
array, jax's ``ravel_pytree`` a jax array (it converts each array to a jax
array first; timed to ``block_until_ready``, on jax's CPU backend, 32-bit
default). ``np.concatenate`` of the reshaped arrays is the bound.

Each cell is the median of interleaved rounds (benchmarks/_peers.py's
``measure_many``), in µs; the ratio is the peer's time over pytree_kit's
(above 1: pytree_kit is faster).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from typing import Any, Callable, Optional

import _output
import numpy as np
import torch
from _peers import measure_many  # warm-up, calibration, interleaving
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import pytree_kit as pk

X = "\N{MULTIPLICATION SIGN}"


def mlp() -> list:
    layers = [torch.nn.Linear(512, 512) for _ in range(5)]
    return list(torch.nn.Sequential(*layers).parameters())


def cnn() -> list:
    blocks = []
    for _ in range(25):
        blocks += [torch.nn.Conv2d(64, 64, 3), torch.nn.BatchNorm2d(64)]
    return list(torch.nn.Sequential(*blocks).parameters())


def transformer() -> list:
    layers = [torch.nn.TransformerEncoderLayer(64, 4, 256) for _ in range(84)]
    return list(torch.nn.Sequential(*layers).parameters())[:1000]


def biases() -> list:
    return [torch.nn.Parameter(torch.randn(64)) for _ in range(1000)]


MODELS: dict[str, Callable[[], list]] = {
    "MLP, 10 tensors": mlp,
    "CNN, 100 tensors": cnn,
    "transformer, 1,000 tensors": transformer,
    "1,000 biases of 64": biases,
}


def _jax() -> Any:
    try:
        from jax.flatten_util import ravel_pytree
    except ImportError:
        return None
    return ravel_pytree


def check(params: list, arrays: list) -> None:
    """Every timed call gives the same values as the others before it is timed."""
    flat, unravel = pk.ravel(params)
    assert torch.equal(flat, parameters_to_vector(params))
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    v = torch.randn(len(flat))
    vector_to_parameters(v, copies)
    assert all(torch.equal(a, b) for a, b in zip(unravel(v), copies))
    nflat, nunravel = pk.ravel(arrays)
    assert np.array_equal(nflat, flat.detach().numpy())
    ravel_pytree = _jax()
    if ravel_pytree is not None:
        jflat, junravel = ravel_pytree(arrays)
        assert np.array_equal(np.asarray(jflat), nflat)
        assert all(
            np.array_equal(a, np.asarray(b)) for a, b in zip(nunravel(nflat), junravel(jflat))
        )


def cases(params: list, arrays: list) -> dict[str, dict[str, Callable[[], Any]]]:
    """Per operation: pytree_kit's call first, then its peers and bounds."""
    flat, unravel = pk.ravel(params)
    vector = flat.detach().clone()
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    sizes = [p.numel() for p in params]
    out: dict[str, dict[str, Callable[[], Any]]] = {
        "ravel (torch)": {
            "pk.ravel": lambda: pk.ravel(params),
            "parameters_to_vector": lambda: parameters_to_vector(params),
        },
        "unravel (torch)": {
            "unravel": lambda: unravel(vector),
            "vector_to_parameters": lambda: vector_to_parameters(vector, copies),
            "vector.clone() alone": vector.clone,
            "torch.split alone": lambda: torch.split(vector, sizes),
        },
    }
    nflat, nunravel = pk.ravel(arrays)
    ravel_pytree = _jax()
    numpy_ravel: dict[str, Callable[[], Any]] = {
        "pk.ravel": lambda: pk.ravel(arrays),
        "np.concatenate alone": lambda: np.concatenate([a.reshape(-1) for a in arrays]),
    }
    numpy_unravel: dict[str, Callable[[], Any]] = {"unravel": lambda: nunravel(nflat)}
    if ravel_pytree is not None:
        import jax

        jflat, junravel = ravel_pytree(arrays)
        numpy_ravel["jax ravel_pytree"] = lambda: ravel_pytree(arrays)[0].block_until_ready()
        numpy_unravel["jax unravel"] = lambda: jax.block_until_ready(junravel(jflat))
    out["ravel (numpy)"] = numpy_ravel
    out["unravel (numpy)"] = numpy_unravel
    return out


# the peer each operation is judged against (its ratio column)
PEER = {
    "ravel (torch)": "parameters_to_vector",
    "unravel (torch)": "vector_to_parameters",
    "ravel (numpy)": "jax ravel_pytree",
    "unravel (numpy)": "jax unravel",
}


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(quick: bool) -> str:
    torch.manual_seed(0)
    # one thread: every call here is a copy or less, and a pool of threads
    # stalls whenever the machine has other work (the ratios hold either way)
    torch.set_num_threads(1)
    min_time, repeats = (0.002, 2) if quick else (0.05, 9)
    chosen = list(MODELS)[:2] if quick else list(MODELS)
    rows: list[str] = []
    summary: list[str] = []
    for label in chosen:
        params = MODELS[label]()
        arrays = [p.detach().numpy().copy() for p in params]
        check(params, arrays)
        n = sum(p.numel() for p in params)
        for op, calls in cases(params, arrays).items():
            times = measure_many(calls, min_time, repeats)
            mine = times[next(iter(calls))]
            cells = []
            for name, t in times.items():
                cells.append(f"{name} {t * 1e6:,.0f}" if not isinstance(t, str) else f"{name} {t}")
            peer = times.get(PEER[op])
            ratio = f"{peer / mine:.2f}{X}" if isinstance(peer, float) else "-"
            rows.append(f"| {label} ({n / 1e6:.2f} M) | {op} | {'; '.join(cells)} | {ratio} |")
            if isinstance(peer, float):
                summary.append(f"| {label} | {op} | {PEER[op]} | {peer / mine:.2f} |")
    head = [
        "# pk.ravel against parameters_to_vector and jax's ravel_pytree"
        + (" (--quick: rough)" if quick else ""),
        "",
        f"- CPU: {_cpu()}; {os.cpu_count()} logical cores; Python {platform.python_version()}; "
        f"engine {pk.ENGINE}",
        "- " + ", ".join(f"{n} {_version(n)}" for n in ("torch", "numpy", "jax", "pytree_kit")),
        "- `python benchmarks/ravel.py`: median µs per call of interleaved rounds "
        f"({repeats} rounds of at least {min_time * 1e3:g} ms each; "
        "benchmarks/_peers.py's measure_many). float32 parameters of models with their "
        "initial weights; M: millions of elements. The ratio is the peer's time over "
        "pytree_kit's (above 1: pytree_kit is faster).",
        "",
        "## Ratio per model and operation",
        "",
        "| model | operation | against | ratio |",
        "|---|---|---|---:|",
        *summary,
        "",
        "## Every cell",
        "",
        "| model (elements) | operation | µs (pytree_kit first, then peers and bounds) | ratio |",
        "|---|---|---|---:|",
    ]
    notes = [
        "",
        "vector_to_parameters points each parameter's `.data` into the vector (no copy: "
        "the parameters then alias it); unravel returns new tensors cut from one private "
        "copy of the vector, so `vector.clone() alone` is most of its time on large models. "
        "jax's ravel_pytree first converts each numpy array to a jax array.",
    ]
    return "\n".join(head + rows + notes) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: two models, rough")
    _output.add_arguments(ap)
    args = ap.parse_args(argv)
    text = run(args.quick)
    _output.write_report(args, "ravel.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
