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
from scripts.corpus.trees import Batch, Encoded, Items, Mirrored, Row  # noqa: E402
from tests.support.tracing_models import EncoderOutput  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: the trees of the mapping and sequence kinds whose instances keep
#: attributes in their __dict__, which a rebuild keeps: dynamo reads an
#: instance's __dict__ from torch 2.12 on, and on an older torch a compiled
#: walk refuses them with a clear error (pytree_kit/_tracer.py)
WITH_INSTANCE_DICTS = ("bare_model_output", "dict_subclass", "sequence", "userdict")
REFUSED = "torch.compile on this torch \\(older than 2.12\\) cannot read the attributes"


def _refused_here(name: str) -> bool:
    """Whether this torch's tracer refuses the tree named name (see
    WITH_INSTANCE_DICTS)."""
    from pytree_kit import _tracer

    torch._dynamo  # noqa: B018  (imported: _tracer knows this torch's tracer)
    return name in WITH_INSTANCE_DICTS and not _tracer.reads_instance_dicts


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
        "dict_subclass": _with(Batch(b=t, a=[t + 1]), tag="train"),
        "userdict": _with(Encoded(input_ids=t, mask=[t]), _n=1),
        "bare_model_output": _mirrored(t, t + 1),
        "sequence": Row(t, Items([t + 1, None])),
    }


def _with(obj, **attributes):
    """``obj`` given these attributes."""
    for name, value in attributes.items():
        setattr(obj, name, value)
    return obj


def _mirrored(z, y):
    """Like transformers' ModelOutput built bare: each item also an attribute."""
    out = Mirrored()
    out["z"], out["y"] = z, y
    return out


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
    if _refused_here(name):
        with pytest.raises(Exception, match=REFUSED):
            compiled(tree)
        return
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


@pytest.mark.parametrize("name", sorted(_trees()))
def test_without_fullgraph_nothing_falls_back_to_eager(name):
    """A plain torch.compile (no fullgraph) on a supported torch: one graph
    and no graph break, so no part of the call quietly runs eagerly."""
    tree = _trees()[name]
    if _refused_here(name):
        pytest.skip(
            "this torch's tracer cannot read an instance's __dict__: refused (tested above)"
        )
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_double)(tree)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


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


# -- one graph per structure ----------------------------------------------------
#
# A compiled function is called with a fresh batch every step, as a training
# loop calls it: the graph dynamo made for the first batch must serve every
# batch of the same structure. Each test calls a compiled function with at
# least 10 new trees, counts the graphs, and checks every result against the
# eager call; then a tree of another structure must compile once more (a
# guard, not a stale graph) and give its own right result.

import attrs  # noqa: E402

from pytree_kit import _dynamo, _pure, _traced, _tracer  # noqa: E402


@dataclasses.dataclass
class Target:
    boxes: torch.Tensor
    labels: torch.Tensor
    split: str = dataclasses.field(default="train", metadata={"static": True})


@attrs.define
class AttrsPair:
    x: torch.Tensor
    y: object = None


@attrs.define(slots=False)
class AttrsDict:
    x: torch.Tensor
    y: object = None


class Proto:
    """A class that flattens itself (the protocol), with an aux that names its kind."""

    def __init__(self, a, b, kind="p"):
        self.a, self.b, self.kind = a, b, kind

    def __tree_flatten__(self):
        return [self.a, self.b], self.kind

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        return cls(*children, kind=aux)


class Foreign:
    """A class the caller cannot edit, flattened by a rule."""

    def __init__(self, a, b):
        self.a, self.b = a, b


RULES = {Foreign: pk.Rule(lambda o: ([o.a, o.b], None), lambda aux, ch: Foreign(*ch))}


def _r(*shape):
    return torch.randn(*(shape or (2,)))


#: name -> make(variant): variant 0 is one structure (a new tree each call),
#: variant 1 another structure of the same kind
STRUCTURES = {
    "dict": lambda v: {"b": _r(), "a": {"c": _r(), **({"d": _r()} if v else {})}},
    "list": lambda v: [_r(), [_r() for _ in range(2 + v)]],
    "tuple": lambda v: (_r(), (_r(),) * (1 + v)),
    "namedtuple": lambda v: Point(_r(), {"z": _r()} if v == 0 else [_r()]),
    "dataclass": lambda v: [Target(_r(), _r(1)), Target(_r(), _r(1), "val" if v else "train")],
    "attrs": lambda v: [AttrsPair(_r(), [_r()] * (1 + v)), AttrsDict(_r())],
    "protocol": lambda v: Proto(_r(), {"q": _r()}, kind="p" if v == 0 else "q"),
    "rules": lambda v: {"f": Foreign(_r(), _r() if v == 0 else (_r(), _r()))},
    "none_leaves": lambda v: {"a": None, "b": [_r(), None if v == 0 else _r()]},
    "model_output": lambda v: EncoderOutput(
        last_hidden_state=_r(), hidden_states=(_r(), _r())[: 2 - v]
    ),
    "ordereddict": lambda v: collections.OrderedDict([("z", _r()), ("a", [_r()])][:: 1 - 2 * v]),
    "structseq": lambda v: (torch.max, torch.min)[v](torch.randn(2, 3), dim=1),
    # the mapping and sequence kinds, with attributes that stay the same
    "dict_subclass": lambda v: _with(Batch(b=_r(), a=[_r()] * (1 + v)), tag="train"),
    "userdict": lambda v: _with(Encoded({"ids": _r(), **({"mask": _r()} if v else {})}), _n=1),
    "sequence": lambda v: [Row(_r(), _r()), Items([_r()] * (1 + v))],
}


def _bump(x):
    return x + 1 if isinstance(x, torch.Tensor) else x


def _functions(rules):
    """Every public function documented to work under torch.compile."""

    def flatten_unflatten(tree):
        leaves, spec = pk.flatten(tree, rules=rules)
        return pk.unflatten(spec, [_bump(x) for x in leaves])

    def tree_map(tree):
        return pk.tree_map(_bump, tree, rules=rules)

    def tree_map_two(tree):  # the second tree is read by flatten_up_to
        return pk.tree_map(
            lambda x, y: x + y if isinstance(x, torch.Tensor) else x, tree, tree, rules=rules
        )

    def leaves(tree):
        return [_bump(x) for x in pk.leaves(tree, rules=rules)]

    def structure(tree):
        spec = pk.structure(tree, rules=rules)
        return spec.unflatten([_bump(x) for x in pk.leaves(tree, rules=rules)]), spec.num_leaves

    def flatten_with_path(tree):
        pairs, spec = pk.flatten_with_path(tree, rules=rules)
        return {pk.keystr(p): _bump(x) for p, x in pairs}, spec

    def flatten_up_to(tree):
        return [_bump(x) for x in pk.structure(tree, rules=rules).flatten_up_to(tree)]

    return {
        f.__name__: f
        for f in (
            flatten_unflatten,
            tree_map,
            tree_map_two,
            leaves,
            structure,
            flatten_with_path,
            flatten_up_to,
        )
    }


def _assert_same(got, want):
    """Two results: the same structure (pytree_kit's spec) and equal leaves."""
    got_leaves, got_spec = pk.flatten(got, rules=RULES)
    want_leaves, want_spec = pk.flatten(want, rules=RULES)
    assert got_spec == want_spec
    for a, b in zip(got_leaves, want_leaves):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b


def _run_fresh(compiled, fn, make, variant, count):
    for _ in range(count):
        tree = make(variant)
        _assert_same(compiled(tree), fn(tree))


# Traced, both engines are the pure engine (dynamo's stand-in), so the graph
# count of this matrix is the same on either: it runs once, in the C-engine job
# (where eager calls are the C engine's), not again in the pure-engine job (56 s).
# The pure-engine job still counts graphs in the tests below it.
@pytest.mark.once
@pytest.mark.parametrize("kind", sorted(STRUCTURES))
@pytest.mark.parametrize("function", sorted(_functions(None)))
def test_one_graph_per_structure(function, kind):
    fn = _functions(RULES if kind == "rules" else None)[function]
    make = STRUCTURES[kind]
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    if _refused_here(kind):
        with pytest.raises(Exception, match=REFUSED):
            compiled(make(0))
        return
    _run_fresh(compiled, fn, make, 0, 10)
    assert backend.graphs == 1, f"{backend.graphs} graphs for 10 trees of one structure"
    _run_fresh(compiled, fn, make, 1, 3)  # another structure: one graph more, its own result
    assert backend.graphs == 2
    _run_fresh(compiled, fn, make, 0, 2)  # the first structure's graph is still there
    assert backend.graphs == 2


def test_a_mapping_keeps_its_attributes_under_compile_in_one_graph():
    """A tokenizer's batch, as transformers' BatchEncoding is (a UserDict with
    its encodings and a __getattr__ that reads its data): each batch's result
    keeps that batch's own attributes (the very objects), one graph for all."""

    def batch(i):
        out = Encoded({"input_ids": _r(4, 3), "attention_mask": _r(4, 3)})
        out._encodings = [object() for _ in range(4)]  # one per sample, new each batch
        out._n_sequences = 1
        return out

    fn = _functions(None)["tree_map"]
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    if _refused_here("userdict"):
        with pytest.raises(Exception, match=REFUSED):
            compiled(batch(0))
        return
    for i in range(10):
        b = batch(i)
        got = compiled(b)
        assert type(got) is Encoded and got is not b
        assert got._encodings is b._encodings and got._n_sequences == 1
        assert list(vars(got)) == ["data", "_encodings", "_n_sequences"]
        torch.testing.assert_close(got.input_ids, b.input_ids + 1)
    assert backend.graphs == 1


def test_twenty_batches_under_fullgraph_stay_under_the_recompile_limit():
    """With the default recompile limit (8): a recompile per batch made
    fullgraph=True raise FailOnRecompileLimitHit at the 9th batch."""
    fn = _functions(None)["tree_map"]
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for _ in range(20):
        batch = {"images": _r(3), "targets": [Target(_r(2, 4), _r(1)) for _ in range(4)]}
        _assert_same(compiled(batch), fn(batch))
    assert backend.graphs == 1


def test_a_tree_built_anew_with_new_containers_each_step_is_one_graph():
    """Nothing of one step's tree survives to the next (the containers, the
    records and the tensors are all new), as a DataLoader hands them over."""
    fn = _functions(None)["flatten_unflatten"]
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    kept = []
    for _ in range(12):
        tree = {k: [Target(_r(), _r(1)), (_r(), None)] for k in ("a", "b")}
        _assert_same(compiled(tree), fn(tree))
        kept.append(tree)  # alive together: ids are never reused between steps
    assert backend.graphs == 1


@pytest.mark.parametrize("container", [dict, collections.OrderedDict])
def test_a_dict_whose_keys_come_in_another_order_compiles_anew(container):
    """The keys' insertion order is part of what a call gives back (a dict
    rebuilt in its order; an OrderedDict's node): a dict of the same keys in
    another order must not reuse the first graph (torch 2.15 guards no key
    order for ``tuple(d)``, and gave the first order back)."""
    fns = _functions(None)
    for name in ("flatten_unflatten", "tree_map", "structure"):
        fn = fns[name]
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, backend="eager")
        for keys in (("z", "a", "m"), ("a", "m", "z"), ("z", "a", "m")):
            tree = {"d": container((k, _r()) for k in keys)}
            got, want = compiled(tree), fn(tree)
            if name == "structure":
                got, want = got[0], want[0]
            _assert_same(got, want)
            assert list(got["d"]) == list(want["d"]) == list(keys), (name, keys)


def _chain(depth, leaf):
    tree = leaf
    for i in range(depth):
        tree = [tree] if i % 2 else {"k": tree}
    return tree


#: whether this torch's dynamo reads containers' ids (_tracer.reads_identity)
READS_IDENTITY = _dynamo.torch_version(torch.__version__) >= (2, 13)
#: the error a traced walk raises at CYCLE_DEPTH where the tracer cannot read ids
TOO_DEEP = "containers deep, and torch.compile on this torch (older than 2.13) cannot read"


def test_a_tree_deeper_than_the_cycle_bound_compiles_right():
    """Past ``CYCLE_DEPTH`` a traced walk checks the path for cycles (by
    identity: dynamo then guards on those containers): still the right result.
    Where dynamo cannot read ids (torch 2.9-2.12), it raises a clear error
    naming the path instead of tracing on without end."""
    import torch._dynamo

    fn = _functions(None)["tree_map"]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    assert _tracer.reads_identity is READS_IDENTITY
    for _ in range(2):
        tree = _chain(_traced.CYCLE_DEPTH + 5, _r())
        if READS_IDENTITY:
            _assert_same(compiled(tree), fn(tree))
        else:
            with pytest.raises(Exception) as full:
                compiled(tree)
            assert TOO_DEEP in str(full.value.__cause__) + str(full.value)


def _cycles():
    a = [_r()]
    a.append({"k": a})
    deep = _chain(_traced.CYCLE_DEPTH + 20, _r())
    inner = deep
    for _ in range(_traced.CYCLE_DEPTH // 2):
        inner = inner[0] if type(inner) is list else inner["k"]
    inner[0] = deep  # a cycle whose container repeats only past the bound
    me = Sample(_r(), 1)
    me.extra = {"me": [me]}
    return {"list": a, "deep": deep, "record": me}


@pytest.mark.parametrize("name", sorted(_cycles()))
def test_a_cycle_under_compile_raises_the_eager_error(name):
    """No identity is read while tracing until the bound, and the error is
    the one an eager call raises (dynamo hands it on as it is without
    fullgraph, and as the cause of its own error with fullgraph=True)."""
    tree = _cycles()[name]
    with pytest.raises(ValueError) as eager:
        pk.flatten(tree)
    message = str(eager.value)
    assert "cycle: this container is the one at" in message
    if not READS_IDENTITY:
        # torch 2.9-2.12: with fullgraph=True, the clear error at the bound
        # (without it, dynamo runs the call eagerly, which raises the eager
        # error); dynamo's own walk of a cyclic input deeper than the bound
        # fails before ours gets there (docs/compatibility.md)
        fn = _functions(None)["tree_map"]
        torch._dynamo.reset()
        with pytest.raises(Exception) as full:
            torch.compile(fn, fullgraph=True, backend="eager")(tree)
        text = str(full.value.__cause__) + str(full.value)
        if name == "deep" and "RecursionError" in text:
            # dynamo's own walk of the cyclic input fails first on 2.9-2.10
            # (the matrix: 2.9 and 2.10 here, 2.11 and 2.12 reach ours)
            assert _dynamo.torch_version(torch.__version__) < (2, 11)
            return
        assert TOO_DEEP in text
        torch._dynamo.reset()
        with pytest.raises(ValueError) as compiled:
            torch.compile(fn, backend="eager")(tree)
        assert str(compiled.value) == message
        return
    fn = _functions(None)["tree_map"]
    torch._dynamo.reset()
    with pytest.raises(ValueError) as compiled:
        torch.compile(fn, backend="eager")(tree)
    assert str(compiled.value) == message
    torch._dynamo.reset()
    with pytest.raises(Exception) as full:
        torch.compile(fn, fullgraph=True, backend="eager")(tree)
    assert message in str(full.value.__cause__) or message in str(full.value)


def test_identity_is_read_only_past_the_bound_while_tracing():
    """The pure engine's walk, told that it is traced, reads no id() on a
    shallow tree (a guard on each container's identity was a recompile per
    batch), and still raises the eager error for a cycle."""
    calls = []
    real_id = id

    def counting_id(x):
        calls.append(x)
        return real_id(x)

    tree = {"a": [Target(_r(), _r(1))], "b": (_r(), {"c": None})}
    old = (_tracer.compiling, _tracer.reads_instance_dicts, _tracer.reads_identity)
    _tracer.learn(lambda: True, instance_dicts=True, identity=True)
    # the walk's identity reads: _pure's on entry, _traced's past the bound
    _pure.__dict__["id"] = _traced.__dict__["id"] = counting_id
    try:
        for mode in (0, 1, 2):
            _pure._walk(tree, None, None, mode)
        list(_pure.iter_leaves(tree))
        assert calls == []
        a = [1]
        a.append(a)
        with pytest.raises(
            ValueError, match=r"tree\[1\]: cycle: this container is the one at tree,"
        ):
            _pure.flatten(a)
        assert calls
        # where the tracer cannot read ids, the walk stops at the bound with
        # a clear error naming the path, cycle or not, and reads no id
        calls.clear()
        _tracer.learn(lambda: True, instance_dicts=True, identity=False)
        for deep in (a, _chain(_traced.CYCLE_DEPTH + 5, _r())):
            with pytest.raises(ValueError, match=r"^tree(\[\d\]|\['k'\])+: .*older than 2\.13"):
                _pure.flatten(deep)
        assert calls == []
        assert _pure.flatten(_chain(_traced.CYCLE_DEPTH - 1, _r()))[0]  # under the bound
    finally:
        del _pure.__dict__["id"], _traced.__dict__["id"]
        _tracer.learn(*old)


# -- a compiled model in a training loop, and torch.export ---------------------


class Teacher:
    """Fresh batches of a fixed linear map, as a DataLoader would hand them over."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.w = torch.randn(4, 2, generator=gen)
        self.gen = gen

    def batch(self):
        x = torch.randn(8, 4, generator=self.gen)
        targets = [Target(x[i : i + 2] @ self.w, torch.tensor([i])) for i in range(0, 8, 2)]
        return {"x": x, "targets": targets, "meta": {"note": None}}


class Wrapper(torch.nn.Module):
    """A model wrapper that flattens its nested batch: tree_map over the batch,
    then flatten and unflatten of the predictions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 2)

    def forward(self, batch):
        batch = pk.tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) else t, batch)
        pred = self.net(batch["x"])
        parts = [
            Target(pred[i : i + 2], t.labels) for i, t in zip(range(0, 8, 2), batch["targets"])
        ]
        leaves, spec = pk.flatten({"pred": parts, "targets": batch["targets"]})
        out = pk.unflatten(spec, leaves)
        loss = sum(((p.boxes - t.boxes) ** 2).mean() for p, t in zip(out["pred"], out["targets"]))
        return {"loss": loss, "pred": out["pred"]}


class CountingAot(CountingBackend):
    """Counts graphs and compiles each with aot_eager (forward and backward graphs)."""

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs += 1
        return lookup_backend("aot_eager")(gm, example_inputs)


def test_compiled_wrapper_in_a_training_loop_compiles_once():
    teacher = Teacher()
    model = Wrapper()
    eager = Wrapper()
    eager.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    torch._dynamo.reset()
    backend = CountingAot()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    losses = []
    for _ in range(30):
        batch = teacher.batch()
        out = compiled(batch)
        want = eager(batch)
        torch.testing.assert_close(out["loss"], want["loss"])
        assert type(out["pred"][0]) is Target and out["pred"][0].split == "train"
        for o, step_opt in ((out, opt), (want, eager_opt)):
            step_opt.zero_grad()
            o["loss"].backward()
            step_opt.step()
        losses.append(out["loss"].item())
    assert backend.graphs == 1
    assert losses[-1] < losses[0] / 4, losses
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q)


class Doubler(torch.nn.Module):
    def forward(self, batch):
        leaves, spec = pk.flatten(batch)
        return pk.unflatten(spec, [x * 2 for x in leaves])


@pytest.mark.parametrize("strict", [False, True])
def test_exported_forward_that_flattens_serves_fresh_batches(strict):
    """torch.export of a forward that flattens its input (strict: traced by
    dynamo, so by the pure engine; non-strict: run as Python): one program,
    right for any batch of the structure, and a batch of another structure
    is refused rather than read wrong."""

    def make(n=2):
        return {"x": _r(3), "parts": [(_r(2), _r(1)) for _ in range(n)]}

    program = torch.export.export(Doubler(), (make(),), strict=strict)
    module = program.module()
    for _ in range(10):
        batch = make()
        _assert_same(module(batch), Doubler()(batch))
    with pytest.raises(ValueError, match="TreeSpec"):  # torch's check of the inputs' structure
        module(make(3))


def test_pkt_export_of_a_forward_that_flattens_a_dataclass_batch():
    """pytree_kit.torch.export (nothing registered) of such a forward with
    dataclass inputs: fresh batches after the export."""
    import pytree_kit.torch as pkt

    def make():
        return {"images": _r(3), "targets": [Target(_r(2, 4), _r(2)) for _ in range(3)]}

    exported = pkt.export(Doubler(), (make(),))
    for _ in range(10):
        batch = make()
        _assert_same(exported(batch), Doubler()(batch))


@dataclasses.dataclass
class _Box:
    a: torch.Tensor
    b: torch.Tensor


def _guard_codes(fn):
    """The code of every leaf guard dynamo keeps for ``fn``'s compiled code."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    codes = []
    for entry in _debug_get_cache_entry_list(fn.__code__):
        todo = [entry.guard_manager.root]
        while todo:
            mgr = todo.pop()
            for guard in mgr.get_leaf_guards():
                codes.extend(guard.verbose_code_parts())
            todo.extend(mgr.get_child_managers())
            if hasattr(mgr, "get_key_value_managers"):
                for key_mgr, val_mgr in mgr.get_key_value_managers().values():
                    todo.extend(m for m in (key_mgr, val_mgr) if m is not None)
    return codes


def test_a_compiled_call_checks_no_class_facts_per_record():
    """Whether a class defines __tree_flatten__, is a dataclass or attrs
    class or a structseq is a fact about the class alone
    (``_pure.class_traits``): the tracer takes it as a constant, and a
    compiled call checks each record's type (a guard it needs anyway), not
    these reads of the class. Read plainly, torch 2.9 guarded them once per
    record (10 guards for 8 records here), and a compiled call over a batch
    of 33 dataclass records was slower than with torch.utils._pytree."""

    def step(batch):
        leaves, spec = pk.flatten(batch)
        return pk.unflatten(spec, [x + 1 for x in leaves])

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    batch = [_Box(torch.ones(2), torch.zeros(3)) for _ in range(8)]
    got = compiled(batch)
    assert [type(b) for b in got] == [_Box] * 8 and torch.equal(got[-1].b, torch.ones(3))
    codes = _guard_codes(step)
    assert codes, "no guards read: the walk over dynamo's guard tree is broken"
    checks = [c.split("#")[0] for c in codes]  # the check, not the source line it came from
    about_class = [c for c in checks if "__tree_flatten__" in c or "__dataclass_fields__" in c]
    assert about_class == []
    # still one graph for fresh batches of the same structure
    backend = CountingBackend()
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    for _ in range(3):
        compiled([_Box(torch.randn(2), torch.randn(3)) for _ in range(8)])
    assert backend.graphs == 1
