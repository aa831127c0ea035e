"""torch_rules: rules read from torch.utils._pytree's registrations. The
transformers caches (DynamicCache, EncoderDecoderCache) run in fresh processes
(tests/support/bridge_worker.py): flatten, to_device, trace against eager, save, and
load in another fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
torch_pytree = pytest.importorskip("torch.utils._pytree")

import pytree_kit as pk  # noqa: E402
import pytree_kit.torch as pkt  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "support" / "bridge_worker.py"


class KeyedCache:
    """Registered with torch with keys, as transformers' DynamicCache is."""

    def __init__(self, keys: list, values: list, layout: list) -> None:
        self.keys, self.values, self.layout = list(keys), list(values), list(layout)


class PlainCache:
    """Registered with torch without keys."""

    def __init__(self, k: Any, v: Any) -> None:
        self.k, self.v = k, v


class Unregistered:
    def __init__(self, k: Any) -> None:
        self.k = k


def _keyed_flatten(c: KeyedCache) -> tuple[list, Any]:
    return [c.keys, c.values], [["keys", "values"], c.layout]


def _keyed_flatten_with_keys(c: KeyedCache) -> tuple[list, Any]:
    children, context = _keyed_flatten(c)
    keys = [torch_pytree.MappingKey("keys"), torch_pytree.MappingKey("values")]
    return list(zip(keys, children)), context


def _keyed_unflatten(children: list, context: Any) -> KeyedCache:
    return KeyedCache(children[0], children[1], context[1])


torch_pytree.register_pytree_node(
    KeyedCache, _keyed_flatten, _keyed_unflatten, flatten_with_keys_fn=_keyed_flatten_with_keys
)
torch_pytree.register_pytree_node(
    PlainCache, lambda c: ([c.k, c.v], None), lambda ch, _: PlainCache(*ch)
)


def keyed(n: int = 2) -> KeyedCache:
    return KeyedCache(
        [torch.full((1, 2), float(i)) for i in range(n)],
        [torch.full((1, 2), -float(i)) for i in range(n)],
        [None] * n,
    )


def test_paths_use_torchs_keys_and_the_context_is_kept():
    rules = pkt.torch_rules(KeyedCache, PlainCache)
    tree = {"cache": keyed(), "plain": PlainCache(torch.ones(1), None)}
    pairs, spec = pk.flatten_with_path(tree, rules=rules)
    assert [pk.keystr(p) for p, _ in pairs] == [
        "['cache']['keys'][0]",
        "['cache']['keys'][1]",
        "['cache']['values'][0]",
        "['cache']['values'][1]",
        "['plain'][0]",
    ]
    rebuilt = spec.unflatten([x for _, x in pairs])
    assert type(rebuilt["cache"]) is KeyedCache and rebuilt["cache"].layout == [None, None]
    assert rebuilt["cache"].values[1] is tree["cache"].values[1] and rebuilt["plain"].v is None
    # equal calls, equal rules, equal specs; the (list) context takes part in equality
    assert pk.structure(tree, rules=pkt.torch_rules(KeyedCache, PlainCache)) == spec
    other = {
        "cache": KeyedCache(tree["cache"].keys, tree["cache"].values, [4, None]),
        "plain": tree["plain"],
    }
    assert pk.structure(other, rules=rules) != spec


def test_to_device_moves_a_registered_cache_with_its_rule():
    tree = {"cache": keyed(), "x": torch.ones(1)}
    with pytest.raises(TypeError, match=r"tree\['cache'\] is a .*KeyedCache holding tensors") as e:
        pkt.to_device(tree, "meta")
    assert "rules=pytree_kit.torch.torch_rules(KeyedCache) (it is registered" in str(e.value)
    moved = pkt.to_device(tree, "meta", rules=pkt.torch_rules(KeyedCache))
    assert type(moved["cache"]) is KeyedCache
    assert all(t.is_meta for t in moved["cache"].keys + moved["cache"].values)
    assert all(not t.is_meta for t in tree["cache"].keys)  # the input is untouched


def test_a_spec_with_a_bridged_rule_round_trips_through_json_and_pickle():
    import pickle

    rules = pkt.torch_rules(KeyedCache)
    leaves, spec = pk.flatten({"cache": keyed()}, rules=rules)
    back = pk.TreeSpec.from_json(spec.to_json(), rules=rules)
    assert back == spec and type(back.unflatten(leaves)["cache"]) is KeyedCache
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_a_bridged_rule_runs_where_pytree_kit_torch_was_never_imported():
    # a spec unpickled in another process (a DataLoader worker) holds rules whose
    # halves live in the core module: the calls into torch's registry are there too
    probe = (
        "import sys\n"
        "import pytree_kit._bridge as b\n"
        "assert 'pytree_kit.torch' not in sys.modules\n"
        "assert 'torch' in b.LIBRARIES\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    from pytree_kit import _bridge

    kids, (context, names) = _bridge.BridgeFlatten("torch", KeyedCache)(keyed(1))
    assert names == ("keys", "values") and list(kids) == ["keys", "values"]
    assert context == _bridge.Foreign([["keys", "values"], [None]])


def test_with_no_types_every_registration_but_the_native_ones():
    rules = pkt.torch_rules()
    assert KeyedCache in rules and PlainCache in rules
    assert not {tuple, list, dict, torch.Size} & set(rules)
    assert not any(t.__module__ == "torch.return_types" for t in rules)
    assert all(isinstance(t, type) for t in rules)


def test_torch_rules_errors_are_clear():
    with pytest.raises(TypeError, match="Unregistered is not registered with torch"):
        pkt.torch_rules(Unregistered)
    with pytest.raises(TypeError, match="Size is a container pytree_kit reads by itself"):
        pkt.torch_rules(torch.Size)
    rules = pkt.torch_rules(PlainCache)
    node = torch_pytree.SUPPORTED_NODES.pop(PlainCache)
    try:
        with pytest.raises(TypeError, match="no longer registered"):
            pk.flatten(PlainCache(1, 2), rules=rules)
    finally:
        torch_pytree.SUPPORTED_NODES[PlainCache] = node


def test_trace_with_a_bridged_cache_matches_eager():
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: Any) -> Any:
            y = self.lin(x)
            return {"y": y, "cache": KeyedCache([y * 2], [y * 3], [None])}

    model = Model().eval()
    rules = pkt.torch_rules(KeyedCache)
    x = torch.ones(1, 2)
    with torch.no_grad():
        traced = pkt.trace(model, (x,), rules=rules)
        got, want = traced(x * 2), model(x * 2)
    assert type(got["cache"]) is KeyedCache
    assert torch.equal(got["cache"].values[0], want["cache"].values[0])
    assert "KeyedCache" in repr(traced.output_spec)


def _run(step: str, out: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(WORKER), step, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_caches_and_tensordict_trace_export_save_and_load_in_a_fresh_process(tmp_path: Path):
    pytest.importorskip("transformers")
    pytest.importorskip("tensordict")
    traced = _run("trace", tmp_path)
    assert traced["gpt2"]["paths"][1] == ".past_key_values['key_cache'][0]"
    assert traced["gpt2"]["tensors"] == 5  # logits + 2 layers x (keys, values)
    assert traced["t5"]["tensors"] == 10  # + cross-attention keys and values, encoder state
    assert traced["tensordict"]["paths"] == ["['y']", "['next']['z']"]
    assert all(traced[name]["repr_ok"] for name in ("gpt2", "t5", "tensordict"))
    assert all(traced[name]["saved"] for name in ("gpt2", "t5", "tensordict"))
    loaded = _run("load", tmp_path)
    assert loaded == {
        "gpt2": {"jit": 5, "export": 5},
        "t5": {"jit": 10, "export": 10},
        "tensordict": {"jit": 2, "export": 2},
    }


def test_tensordict_through_its_torch_registration():
    tensordict = pytest.importorskip("tensordict")
    td = tensordict.TensorDict(
        {"obs": torch.ones(4, 3), "next": {"reward": torch.zeros(4)}}, batch_size=[4]
    )
    # without rules: moved by its own .to() (as accelerate and Lightning move
    # it), and refused by collate, which cannot stack what it does not see
    alone = pkt.to_device({"td": td}, "meta")["td"]
    assert type(alone) is tensordict.TensorDict and alone["obs"].is_meta and td["obs"].is_cpu
    with pytest.raises(TypeError, match=r"tree\['td'\] is a .*TensorDict holding tensors"):
        pkt.collate([{"td": td}, {"td": td}])
    rules = pkt.torch_rules(tensordict.TensorDict)
    leaves, spec = pk.flatten({"td": td}, rules=rules)
    assert len(leaves) == 2 and all(isinstance(t, torch.Tensor) for t in leaves)
    rebuilt = spec.unflatten(leaves)["td"]
    assert type(rebuilt) is tensordict.TensorDict and rebuilt.batch_size == (4,)
    assert rebuilt["next", "reward"] is td["next", "reward"]
    moved = pkt.to_device({"td": td}, "meta", rules=rules)["td"]
    assert moved["next", "reward"].is_meta and not td["next", "reward"].is_meta
    batch = pkt.collate([{"td": td}, {"td": td}], rules=rules)["td"]
    assert batch["obs"].shape == (2, 4, 3)


class Stamp:
    """A context object: slots, a __dict__ and a namedtuple-free tuple state."""

    __slots__ = ("__dict__", "device", "dtype", "size")

    def __init__(self, size: Any, dtype: Any, device: Any) -> None:
        self.size, self.dtype, self.device = size, dtype, device
        self.note = {"n": [1, 2]}

    def __eq__(self, other: object) -> bool:
        return type(other) is Stamp and (self.size, self.dtype, self.device, self.note) == (
            other.size,
            other.dtype,
            other.device,
            other.note,
        )

    def __hash__(self) -> int:
        return hash((self.size, self.dtype))


class Stamped:
    """Registered with torch; its context holds a Stamp, a torch.Size, a
    dtype, a device and a function of this module."""

    def __init__(self, x: Any, stamp: Stamp) -> None:
        self.x, self.stamp = x, stamp


def _stamped_unflatten(children: list, context: Any) -> Stamped:
    return context["make"](children[0], context["stamp"])


torch_pytree.register_pytree_node(
    Stamped,
    lambda s: ([s.x], {"stamp": s.stamp, "make": Stamped, "shape": s.x.shape}),
    _stamped_unflatten,
)


def test_a_context_of_torch_values_and_module_objects_round_trips_through_json():
    rules = pkt.torch_rules(Stamped)
    x = torch.ones(2, 3, dtype=torch.float16)
    tree = [Stamped(x, Stamp(x.shape, x.dtype, x.device))]
    leaves, spec = pk.flatten(tree, rules=rules)
    text = spec.to_json()
    assert '{"ref": "torch:float16"}' in text and '"object": "torch:Size"' in text
    back = pk.TreeSpec.from_json(text, rules=rules)
    assert back == spec and hash(back) == hash(spec)
    rebuilt = back.unflatten(leaves)[0]
    assert type(rebuilt) is Stamped and rebuilt.stamp == tree[0].stamp
    assert type(rebuilt.stamp.size) is torch.Size and rebuilt.stamp.note == {"n": [1, 2]}
    # the same document names nothing else: a class from elsewhere is refused
    for bad in ("subprocess:Popen", "os:system", "builtins:eval"):
        with pytest.raises(ValueError, match=r"not allowed|not a valid"):
            pk.TreeSpec.from_json(text.replace("torch:Size", bad), rules=rules)
    # a function of the trusted module is a value, never called while reading
    called = text.replace('"object": "torch:Size"', f'"object": "{__name__}:_stamped_unflatten"')
    with pytest.raises(ValueError, match="not a valid aux value"):
        pk.TreeSpec.from_json(called, rules=rules)
    with pytest.raises(ValueError, match="is not allowed"):
        pk.TreeSpec.from_json(text)


def test_a_context_json_cannot_hold_is_refused_by_name():
    rules = pkt.torch_rules(Stamped)
    looped = Stamp((1,), torch.float32, None)
    looped.note = {"self": looped}
    with pytest.raises(TypeError, match="contains itself"):
        pk.structure([Stamped(torch.ones(1), looped)], rules=rules).to_json()
    odd = Stamp((1,), torch.float32, None)
    odd.note = {"lock": threading.Lock()}
    with pytest.raises(TypeError, match="cannot write a value of type lock"):
        pk.structure([Stamped(torch.ones(1), odd)], rules=rules).to_json()


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_jit_trace_records_the_eager_values_of_sizes_kept_in_aux():
    # under torch.jit.trace, x.shape[0] is a tensor; a rule that keeps it as aux
    # gets the eager int in the output spec, so the output and save are plain
    class Sized:
        def __init__(self, x: Any, n: Any) -> None:
            self.x, self.n = x, n

    rules = {Sized: pk.Rule(lambda s: ([s.x], s.n), lambda n, ch: Sized(ch[0], n))}
    traced = pkt.trace(lambda x: Sized(x * 2, x.shape[0]), (torch.ones(3),), rules=rules)
    aux = traced.output_spec.tree._nodes[0][3][1]
    assert aux == 3 and type(aux) is int
    out = traced(torch.ones(3))
    assert out.n == 3 and type(out.n) is int and torch.equal(out.x, torch.full((3,), 2.0))
    # inside a torch.Size, as a TensorDict's batch size keeps it
    traced = pkt.trace(
        lambda x: Sized(x * 2, ("size", torch.Size([x.shape[0]]))), (torch.ones(3),), rules=rules
    )
    size = traced.output_spec.tree._nodes[0][3][1][1]
    assert size == (3,) and type(size[0]) is int


def test_register_dataclass_classes_rebuild_with_torchs_context():
    """torch's register_dataclass gives flatten_with_keys_fn another context
    than flatten_fn's, which unflatten_fn reads: the rule keeps flatten_fn's
    (as torch's own specs do) and names the children by the keys."""
    import dataclasses

    import torch.utils._pytree as torch_pytree

    @dataclasses.dataclass
    class Batch:
        x: object
        y: object
        mask: object = None

    class Pair:
        def __init__(self, left, right):
            self.left, self.right = left, right

    torch_pytree.register_dataclass(Batch)
    torch_pytree.register_dataclass(Pair, field_names=["left", "right"])
    try:
        for tree in (
            [Batch(torch.ones(2), 3), Batch(1, 2, torch.zeros(1))],
            {"p": Pair(1, torch.arange(3))},
        ):
            rules = pkt.torch_rules(Batch, Pair)
            mine = pk.tree_map(lambda t: t * 2, tree, rules=rules)
            theirs = torch_pytree.tree_map(lambda t: t * 2, tree)
            got, want = pk.leaves(mine, rules=rules), torch_pytree.tree_leaves(theirs)
            assert len(got) == len(want) > 0
            assert all(
                torch.equal(torch.as_tensor(a), torch.as_tensor(b)) for a, b in zip(got, want)
            )
            leaves, spec = pk.flatten(tree, rules=rules)
            assert pk.tree_equal(spec.unflatten(leaves), tree, rules=rules)
        batch = Batch(torch.ones(1), 2)
        rules = pkt.torch_rules(Batch)
        paths = [pk.keystr(p) for p, _ in pk.flatten_with_path(batch, rules=rules)[0]]
        assert paths == ["['x']", "['y']"]  # mask=None: torch's context keeps it aside
        rebuilt = pk.structure(batch, rules=rules).unflatten([torch.zeros(1), 5])
        assert type(rebuilt) is Batch and rebuilt.y == 5 and rebuilt.mask is None
        pair = pk.tree_map(lambda v: v, Pair(1, 2), rules=pkt.torch_rules(Pair))
        assert (pair.left, pair.right) == (1, 2)
    finally:
        del torch_pytree.SUPPORTED_NODES[Batch], torch_pytree.SUPPORTED_NODES[Pair]
