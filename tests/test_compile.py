"""pk.flatten / pk.unflatten inside torch.compile(fullgraph=True): no graph break.

Dynamo cannot read the C engine, so pytree_kit registers the pure engine as
its stand-in when torch._dynamo is imported (pytree_kit/_dynamo.py). These
tests compile with fullgraph=True, which turns any graph break into an error,
and count the graphs with a backend of their own.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import pytree_kit as pk  # noqa: E402

from .tracing_models import EncoderOutput  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: int
    extra: object = None


@dataclasses.dataclass(frozen=True)
class FrozenSample:  # dataclasses wrote its __setattr__: a plain record
    image: torch.Tensor
    label: int


Point = collections.namedtuple("Point", "x y")


def _trees():
    t = torch.arange(3.0)
    return {
        "dict": {"b": t, "a": [t + 1, (t + 2, None)]},
        "dataclass": [Sample(t, 3), Sample(t + 1, 4, {"k": t})],
        "frozen_dataclass": FrozenSample(t, 2),
        "namedtuple": Point(t, {"z": t * 2}),
        "ordereddict": collections.OrderedDict(z=t, a=[t]),
        "return_types": torch.max(torch.ones(2, 3), dim=1),
        "model_output": EncoderOutput(last_hidden_state=t, hidden_states=(t, t + 1)),
    }


class CountingBackend:
    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _double(tree):
    leaves, spec = pk.flatten(tree)
    doubled = pk.unflatten(spec, [x * 2 if isinstance(x, torch.Tensor) else x for x in leaves])
    mapped = pk.tree_map(lambda x: x + 1 if isinstance(x, torch.Tensor) else x, tree)
    same = spec.flatten_up_to(tree)
    paths = [pk.keystr(p) for p, _ in pk.flatten_with_path(tree)[0]]
    return doubled, mapped, pk.leaves(tree), same, paths, pk.structure(tree) == spec, spec


@pytest.mark.parametrize("name", sorted(_trees()))
def test_flatten_and_unflatten_compile_with_no_graph_break(name):
    tree = _trees()[name]
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(_double, fullgraph=True, backend=backend)
    got = compiled(tree)
    want = _double(tree)
    assert backend.graphs == 1
    got_leaves, got_spec = pk.flatten(got[:-1])
    want_leaves, want_spec = pk.flatten(want[:-1])
    assert got_spec == want_spec
    assert got[-1] == want[-1] and hash(got[-1]) == hash(want[-1])
    for a, b in zip(got_leaves, want_leaves):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b
    assert type(got[0]) is type(tree)


def test_compiled_model_with_nested_batch_matches_eager():
    layer = torch.nn.Linear(3, 2)

    def step(batch):
        leaves, spec = pk.flatten(batch)
        outs = [layer(x) for x in leaves if isinstance(x, torch.Tensor)]
        return pk.unflatten(pk.structure(outs), outs), spec.num_leaves

    batch = {"samples": [Sample(torch.randn(4, 3), 1), Sample(torch.randn(4, 3), 2)]}
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, n = compiled(batch)
    want, n_eager = step(batch)
    assert n == n_eager == 4
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


_FRESH = """
import sys, dataclasses
import pytree_kit as pk   # before torch, as isort orders them
import torch
assert "torch._dynamo" not in sys.modules

@dataclasses.dataclass
class B:
    x: torch.Tensor
    n: int

def f(tree):
    leaves, spec = pk.flatten(tree)
    return pk.unflatten(spec, [v * 2 if isinstance(v, torch.Tensor) else v for v in leaves])

out = torch.compile(f, fullgraph=True, backend="eager")({"b": B(torch.ones(2), 3)})
assert out["b"].n == 3 and out["b"].x.tolist() == [2.0, 2.0], out
from pytree_kit import _dynamo
assert _dynamo._finder not in sys.meta_path
assert type(torch._dynamo.__loader__).__module__ != "pytree_kit._dynamo"
assert torch._dynamo.__spec__.loader is torch._dynamo.__loader__
print(pk.ENGINE, _dynamo._registered)
"""


def test_fresh_process_importing_pytree_kit_before_torch():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    engine, registered = proc.stdout.split()[-2:]
    assert engine == pk.ENGINE
    assert registered == str(engine == "c")


_DYNAMO_FIRST = """
import sys, warnings
warnings.simplefilter("error")
import torch, torch._dynamo   # before pytree_kit: it registers as it is imported
import pytree_kit as pk
from pytree_kit import _dynamo

def f(tree):
    leaves, spec = pk.flatten(tree)
    out = pk.tree_map(lambda v: v + 1, tree)
    return pk.unflatten(spec, [v * 2 for v in leaves]), spec.flatten_up_to(out), out

got = torch.compile(f, fullgraph=True, backend="eager")({"b": [torch.ones(2)]})
assert got[0]["b"][0].tolist() == [2.0, 2.0] and got[1][0].tolist() == [2.0, 2.0], got
methods = [type(pk.TreeSpec.__dict__[n]).__name__ for n in ("unflatten", "flatten_up_to")]
print(pk.ENGINE, _dynamo._registered, type(pk.flatten).__name__, *methods)
"""


def test_fresh_process_importing_torch_dynamo_before_pytree_kit():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _DYNAMO_FIRST], capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    engine, registered, flatten, *methods = proc.stdout.split()[-5:]
    assert engine == pk.ENGINE
    assert registered == str(engine == "c")
    assert flatten == ("FastCall" if engine == "c" else "function")
    assert methods == ["function", "function"]


def test_registration_is_idempotent():
    from pytree_kit import _dynamo

    if pk.ENGINE != "c":
        pytest.skip("only the C engine needs stand-ins")
    import torch._dynamo  # noqa: F401

    assert _dynamo.register() and _dynamo.register()
