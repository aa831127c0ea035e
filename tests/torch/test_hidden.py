"""No silent skips: to_device, pin_memory, collate (and, in tests/torch/test_distributed.py,
the collectives and DDP) raise TypeError on a leaf that holds tensors pytree_kit
does not see, naming its path, its type and where the tensor sits; strict=False
passes it through as before."""

from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import pytree_kit as pk  # noqa: E402
from pytree_kit.torch import collate, pin_memory, to_device  # noqa: E402
from pytree_kit.torch._hidden import LIMIT, hidden_tensor  # noqa: E402


class Layer:
    def __init__(self, k: Any, v: Any) -> None:
        self.keys, self.values = k, v


class Cache:
    """Shaped like transformers' DynamicCache: layers of key and value tensors."""

    def __init__(self, n: int = 2) -> None:
        self.layers = [Layer(torch.ones(1, 2), torch.zeros(1, 2)) for _ in range(n)]
        self.seen_tokens = 0


class Slotted:
    __slots__ = ("state",)

    def __init__(self, t: Any) -> None:
        self.state = {"m": (t,)}


class Closure:
    """Tensors reachable only through a torch.utils._pytree registration."""

    def __init__(self, t: Any) -> None:
        self.get = lambda: t


class Plain:
    def __init__(self) -> None:
        self.name, self.size, self.dtype = "x", (2, 3), torch.float32
        self.device = torch.device("cpu")


@dataclasses.dataclass
class Output:
    logits: Any
    past: Any


CACHE_RULES = {
    Cache: pk.Rule(
        lambda c: ([(x.keys, x.values) for x in c.layers], c.seen_tokens),
        lambda aux, ch: _cache(ch, aux),
    )
}


def _cache(children: list, seen: int) -> Cache:
    c = Cache(0)
    c.layers = [Layer(k, v) for k, v in children]
    c.seen_tokens = seen
    return c


def test_to_device_names_the_path_the_type_and_where_the_tensor_is():
    out = Output(torch.ones(2), Cache())
    with pytest.raises(TypeError) as e:
        to_device({"out": out}, "meta")
    message = str(e.value)
    assert message.startswith("to_device: tree['out'].past is a ")
    assert f"{__name__}.Cache holding tensors (at tree['out'].past.layers" in message
    assert "rules={Cache: pytree_kit.Rule(flatten, unflatten)}" in message
    assert "strict=False" in message
    assert out.logits.device.type == "cpu"  # nothing the caller passed was touched


def test_strict_false_passes_the_leaf_through_and_rules_move_its_tensors():
    out = Output(torch.ones(2), Cache())
    moved = to_device(out, "meta", strict=False)
    assert moved.past is out.past and moved.logits.device.type == "meta"
    moved = to_device(out, "meta", rules=CACHE_RULES)
    assert type(moved.past) is Cache and moved.past.layers[1].values.device.type == "meta"
    assert out.past.layers[1].values.device.type == "cpu"


@pytest.mark.parametrize(
    ("leaf", "where"),
    [
        (Cache(), ".layers[0].keys"),
        (Slotted(torch.ones(1)), ".state['m'][0]"),
        ({"k": [Layer(None, torch.ones(1))]}, "['k'][0].values"),
        (int, None),  # a class: opaque
        (Plain(), None),
        (torch.nn.Linear(1, 1), "._parameters['weight']"),
    ],
    ids=["dict", "slots", "containers", "class", "plain", "module"],
)
def test_the_search_finds_the_nearest_tensor_through_dicts_slots_and_containers(leaf, where):
    assert hidden_tensor(leaf) == where


def test_a_torch_registration_is_followed():
    import torch.utils._pytree as torch_pytree

    t = torch.ones(1)
    assert hidden_tensor(Closure(t)) is None  # a function's closure is not data
    torch_pytree.register_pytree_node(
        Closure,
        lambda c: ([c.get()], None),
        lambda ch, ctx: Closure(ch[0]),
    )
    try:
        assert hidden_tensor(Closure(t)) == "<child 0>"
        with pytest.raises(TypeError, match=r"tree\[0\] is a .*Closure holding tensors"):
            to_device([Closure(t)], "meta")
    finally:
        torch_pytree.SUPPORTED_NODES.pop(Closure)
        getattr(torch_pytree, "SUPPORTED_SERIALIZED_TYPES", {}).pop(Closure, None)


def test_cycles_and_huge_graphs_end():
    a = Layer(None, None)
    a.keys = a  # a cycle, and no tensor
    assert hidden_tensor(a) is None
    chain: Any = torch.ones(1)
    for _ in range(LIMIT + 10):
        node = Layer(chain, None)
        chain = node
    assert hidden_tensor(chain) is None  # past the limit: given up, not hung
    short: Any = torch.ones(1)
    for _ in range(100):
        short = Layer(short, None)
    assert hidden_tensor(short) == ".keys" * 100


def test_attribute_access_the_class_customises_is_not_called():
    class Loud:
        def __init__(self) -> None:
            object.__setattr__(self, "t", torch.ones(1))

        def __getattribute__(self, name: str) -> Any:
            raise AssertionError(f"read {name}")

    assert hidden_tensor(Loud()) == ".t"


def test_pin_memory_checks_even_without_an_accelerator():
    with pytest.raises(TypeError, match=r"^pin_memory: tree\['c'\] is a "):
        pin_memory({"c": Cache()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = {"c": Cache(), "x": torch.ones(1)}
        assert pin_memory(batch, strict=False)["c"] is batch["c"]


def test_collate_names_the_sample_and_the_path():
    samples = [{"x": torch.ones(2), "c": "no cache"}, {"x": torch.ones(2), "c": Cache()}]
    with pytest.raises(TypeError) as e:
        collate(samples)
    assert str(e.value).startswith("collate: sample 1: tree['c'] is a ")
    assert collate(samples, strict=False)["c"][1] is samples[1]["c"]
    assert collate(samples, ragged={"c": "list"})["c"][1] is samples[1]["c"]
    batch = collate([{"c": Cache()}, {"c": Cache()}], rules=CACHE_RULES)
    assert batch["c"].layers[0].keys.shape == (2, 1, 2)


def test_plain_leaves_and_numpy_pass():
    np = pytest.importorskip("numpy")
    tree = {
        "a": np.zeros(3),
        "s": np.float32(1),
        "n": [1, 2.5, True, None, "s", b"b", torch.float16, torch.device("cpu")],
        "p": Plain(),
        "e": Ellipsis,
    }
    moved = to_device(tree, "meta")
    assert moved["p"] is tree["p"] and moved["a"] is tree["a"]


class _Sneaky(collections.deque):
    """A deque subclass (a leaf to pytree_kit) whose own iteration lies."""

    def __iter__(self):
        raise RuntimeError("no")


class _SneakyList(list):
    """A list subclass (a sequence to pytree_kit) whose own iteration lies."""

    def __iter__(self):
        raise RuntimeError("no")


class _BadDict:
    @property
    def __dict__(self):  # type: ignore[override]
        raise RuntimeError("no")


def test_the_search_reads_what_objects_hold_not_what_they_say():
    sneaky = _Sneaky([torch.ones(1)])
    assert hidden_tensor(sneaky) == "[0]"
    with pytest.raises(TypeError, match=r"tree\['s'\] is a .*_Sneaky holding tensors"):
        to_device({"s": sneaky}, "meta")
    # a list subclass is a sequence: its stored items are moved, whatever it says
    moved = to_device({"s": _SneakyList([torch.ones(1)])}, "meta")
    assert type(moved["s"]) is _SneakyList and list.__getitem__(moved["s"], 0).is_meta
    assert hidden_tensor(_BadDict()) is None  # an odd class costs no crash
