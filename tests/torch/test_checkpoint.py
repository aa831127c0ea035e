"""pytree_kit.torch.checkpoint: nested training state on torch's DCP.

One process without a process group (a TrainState of a model, AdamW, a
namedtuple, tuples of tensors, a step counter, per-rank RNG state and plain
values, over several save/load rounds), the errors, corrupt checkpoints, and
two gloo ranks with DTensor leaves saving for one and loaded by two
(tests/support/checkpoint_worker.py), beside what DCP alone does to the same state.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
np = pytest.importorskip("numpy")

import pytree_kit as pk  # noqa: E402
from pytree_kit.torch import checkpoint  # noqa: E402
from pytree_kit.torch.checkpoint import CheckpointMismatch, PerRank  # noqa: E402
from tests.support import checkpoint_worker as W  # noqa: E402
from tests.support.distributed import run_ranks  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "support" / "checkpoint_worker.py"

Sched = collections.namedtuple("Sched", "lr warmup")


@dataclasses.dataclass
class TrainState:
    model: Any
    opt: Any
    sched: Sched
    ema: tuple
    step: int
    rng: PerRank
    misc: dict


def train_state(seed: int) -> TrainState:
    model, opt = W.model_and_optimizer(seed)
    return TrainState(
        model=model,
        opt=opt,
        sched=Sched(torch.tensor(0.5), 3),
        ema=(torch.zeros(2), torch.full((3,), float(seed))),
        step=0,
        rng=PerRank(torch.get_rng_state()),
        misc={
            "a.b": 1.5,  # a dot in a key
            "a": {"b": 2.5},  # would be "a.b" to DCP too
            3: "int key",
            "3": "str key",
            "arr": np.arange(4.0) + seed,
            "scalar": np.float32(seed),
            "none": None,
            "bytes": b"\x00\xff",
            "nan": float("nan"),
            "big": 2**70,
            "z": complex(1, -2),
        },
    )


def train_step(st: TrainState) -> float:
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    loss = (st.model(x) - y).pow(2).mean() * st.sched.lr
    st.opt.zero_grad()
    loss.backward()
    st.opt.step()
    st.step += 1
    with torch.no_grad():
        st.ema = tuple(e * 0.9 for e in st.ema)
    return float(loss.detach())


def same_misc(a: dict, b: dict) -> bool:
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray) or isinstance(x, np.generic):
            if type(x) is not type(y) or x.dtype != y.dtype or not np.array_equal(x, y):
                return False
        elif isinstance(x, float) and math.isnan(x):
            if not (isinstance(y, float) and math.isnan(y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return list(a) == list(b)


def test_a_restored_train_state_gives_a_bit_identical_next_step(tmp_path: Path) -> None:
    st = train_state(0)
    for rnd in range(3):  # several epochs, each saved and restored into a fresh state
        for _ in range(2):
            train_step(st)
        st.rng = PerRank(torch.get_rng_state())
        st.misc["big"] += 1
        checkpoint.save(st, tmp_path / f"ck{rnd}")
        expected = train_step(st)  # the next step, from the live state
        saved_step = st.step - 1

        fresh = train_state(rnd + 1)  # other weights, other values
        template_ema = fresh.ema
        weight = fresh.model[0].weight
        restored = checkpoint.load(fresh, tmp_path / f"ck{rnd}", allow=[TrainState, Sched])
        assert type(restored) is TrainState and type(restored.sched) is Sched
        assert restored.model is fresh.model and restored.opt is fresh.opt
        assert restored.model[0].weight is weight  # loaded in place
        assert restored.ema is not template_ema  # a tuple is made anew
        assert restored.step == saved_step
        assert same_misc(restored.misc, {**st.misc})
        assert type(next(k for k in restored.misc if k == 3)) is int
        torch.set_rng_state(restored.rng.value)
        assert train_step(restored) == expected  # bit-identical: same float
        # the state carries on from the restored one
        st = restored


def test_loading_reads_nothing_it_was_not_told_of(tmp_path: Path) -> None:
    st = train_state(0)
    train_step(st)
    checkpoint.save({"s": st}, tmp_path)
    # the template's classes resolve; a class the template lacks needs allow=
    out = checkpoint.load({"s": train_state(1)}, tmp_path)
    assert out["s"].step == 1
    other = {"s": Sched(torch.tensor(0.0), 0)}
    with pytest.raises(ValueError, match=r"TrainState is not allowed; pass it in allow="):
        checkpoint.load(other, tmp_path)
    with pytest.raises(pk.StructureError, match=r"tree\['s'\]: structure mismatch"):
        checkpoint.load(other, tmp_path, allow=[TrainState])


def test_plain_values_numpy_and_keys_round_trip(tmp_path: Path) -> None:
    state = {
        "a.b": torch.ones(2),
        "a": {"b": torch.zeros(2)},
        1: torch.full((2,), 1.0),
        "1": torch.full((2,), 2.0),
        (1, "x"): torch.full((2,), 3.0),
        "tree['a']": torch.full((2,), 4.0),  # a key that looks like a path
        "vals": [None, True, 7, -0.0, float("inf"), "s", b"b", 1j],
        "np": (np.arange(6, dtype=np.int16).reshape(2, 3), np.bool_(True)),
    }
    checkpoint.save(state, tmp_path)
    template = {
        "a.b": torch.empty(2),
        "a": {"b": torch.empty(2)},
        1: torch.empty(2),
        "1": torch.empty(2),
        (1, "x"): torch.empty(2),
        "tree['a']": torch.empty(2),
        "vals": [None] + [0] * 7,  # None is an empty node, as in jax: not a leaf
        "np": (np.zeros((2, 3), np.int16), np.bool_(False)),
    }
    out = checkpoint.load(template, tmp_path)
    for k in ("a.b", 1, "1", (1, "x"), "tree['a']"):
        assert torch.equal(out[k], state[k]), k
    assert torch.equal(out["a"]["b"], state["a"]["b"])
    assert out["vals"] == state["vals"] and [type(v) for v in out["vals"]] == [
        type(v) for v in state["vals"]
    ]
    assert math.copysign(1, out["vals"][3]) == -1
    arr, flag = out["np"]
    assert arr.dtype == np.int16 and np.array_equal(arr, state["np"][0])
    assert type(flag) is np.bool_ and bool(flag)
    assert template["vals"] == [None] + [0] * 7  # the template's list is not changed
    # DCP alone joins keys with dots: the same tensors are refused
    tensors = {k: v for k, v in state.items() if k in ("a.b", "a")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(dcp.CheckpointException, match="duplicated flatten key"):
            dcp.save(tensors, checkpoint_id=tmp_path / "dcp")


class Opaque:
    def __init__(self, v: int) -> None:
        self.v = v


def test_per_rank_compares_its_value_as_a_tree() -> None:
    assert PerRank({"g": torch.ones(3)}) == PerRank({"g": torch.ones(3)})
    assert PerRank({"g": torch.ones(3)}) != PerRank({"g": torch.zeros(3)})
    assert PerRank(1) != 1 and repr(PerRank(2)) == "PerRank(2)"


def test_other_leaves_are_refused_by_path_unless_pickled(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"tree\['f'\]: cannot pickle"):
        checkpoint.save({"f": lambda: 0}, tmp_path / "d", fallback="pickle")
    state = {"cfg": [1, Opaque(3)]}
    with pytest.raises(TypeError, match=r"tree\['cfg'\]\[1\]: a leaf of type .*Opaque"):
        checkpoint.save(state, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    with pytest.raises(TypeError, match=r"\['np'\]: .*numpy.ndarray"):
        checkpoint.save({"np": np.array(["x"], dtype=object)}, tmp_path / "b")
    checkpoint.save(state, tmp_path / "c", fallback="pickle")
    with pytest.raises(ValueError, match=r"tree\['cfg'\]\[1\]: the checkpoint pickled"):
        checkpoint.load(state, tmp_path / "c")
    out = checkpoint.load({"cfg": [0, 0]}, tmp_path / "c", fallback="pickle")
    assert out["cfg"][1].v == 3


def test_a_differing_template_names_the_first_difference(tmp_path: Path) -> None:
    state = {"w": torch.ones(3), "layers": [torch.zeros(2), torch.zeros(2)], "step": 4}
    checkpoint.save(state, tmp_path)
    short = {"w": torch.empty(3), "layers": [torch.empty(2)], "step": 0}
    with pytest.raises(pk.StructureError, match=r"tree\['layers'\]: structure mismatch"):
        checkpoint.load(short, tmp_path)
    with pytest.raises(ValueError, match=r"tree\['w'\]: .*shape \(3,\).*shape \(4,\)"):
        checkpoint.load({**state, "w": torch.empty(4)}, tmp_path)
    with pytest.raises(ValueError, match=r"tree\['w'\]: .*float32.*float64"):
        checkpoint.load({**state, "w": torch.empty(3, dtype=torch.float64)}, tmp_path)
    with pytest.raises(ValueError, match=r"tree\['step'\]: the checkpoint has a plain value"):
        checkpoint.load({**state, "step": torch.empty(())}, tmp_path)
    # strict=False: the intersection, and both sides reported
    loose = {"w": torch.empty(3), "layers": [torch.empty(2)], "extra": torch.full((1,), 5.0)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = checkpoint.load(loose, tmp_path, strict=False)
    (w,) = [c.message for c in caught if isinstance(c.message, CheckpointMismatch)]
    assert w.missing == ["tree['extra']"]
    assert sorted(w.unexpected) == ["tree['layers'][1]", "tree['step']"]
    assert torch.equal(out["w"], torch.ones(3)) and torch.equal(out["extra"], torch.full((1,), 5.0))


class Counter:
    """Stateful, not a container: saved through state_dict, loaded in place."""

    def __init__(self) -> None:
        self.n = 0
        self.hist = torch.zeros(3)

    def state_dict(self) -> dict:
        return {"n": self.n, "hist": self.hist}

    def load_state_dict(self, sd: dict) -> None:
        self.n = sd["n"]
        self.hist.copy_(sd["hist"])


def test_stateful_objects_anywhere_are_saved_through_their_state_dict(tmp_path: Path) -> None:
    c = Counter()
    c.n, c.hist = 5, torch.tensor([1.0, 2.0, 3.0])
    checkpoint.save({"parts": [1, (c,)]}, tmp_path)
    fresh = Counter()
    out = checkpoint.load({"parts": [0, (fresh,)]}, tmp_path)
    assert out["parts"][1][0] is fresh and fresh.n == 5
    assert torch.equal(fresh.hist, torch.tensor([1.0, 2.0, 3.0]))


def test_an_optimizer_without_its_model_is_named(tmp_path: Path) -> None:
    _, opt = W.model_and_optimizer()
    with pytest.raises(TypeError, match=r"tree\['opt'\]: an optimizer whose model is not"):
        checkpoint.save({"opt": opt}, tmp_path)


def test_async_save_writes_the_state_as_it_was(tmp_path: Path) -> None:
    state = {"w": torch.arange(1000.0), "step": 1}
    future = checkpoint.async_save(state, tmp_path)
    state["w"].add_(1)  # after it returns: not in the checkpoint
    future.result(timeout=60)
    out = checkpoint.load({"w": torch.empty(1000), "step": 0}, tmp_path)
    assert torch.equal(out["w"], torch.arange(1000.0)) and out["step"] == 1


# -- corrupt checkpoints --------------------------------------------------------------------


def _saved(tmp_path: Path) -> tuple[Path, dict]:
    state = {"w": torch.randn(256), "meta": {"step": 3, "name": "x"}}
    d = tmp_path / "ck"
    checkpoint.save(state, d)
    return d, {"w": torch.zeros(256), "meta": {"step": 0, "name": ""}}


def _data_file(d: Path) -> Path:
    (f,) = [p for p in d.iterdir() if p.suffix == ".distcp"]
    return f


@pytest.mark.parametrize(
    "damage",
    ["truncate data", "truncate metadata", "garbage metadata", "remove data", "corrupt document"],
)
def test_truncated_and_corrupt_checkpoints_raise_value_error(tmp_path: Path, damage: str) -> None:
    d, template = _saved(tmp_path)
    data, meta = _data_file(d), d / ".metadata"
    if damage == "truncate data":
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "truncate metadata":
        meta.write_bytes(meta.read_bytes()[:40])
    elif damage == "garbage metadata":
        meta.write_bytes(b"\x00" * 64)
    elif damage == "remove data":
        data.unlink()
    else:  # the JSON document stored in the data file
        raw = bytearray(data.read_bytes())
        at = raw.find(b'{"format"')
        assert at >= 0
        raw[at : at + 9] = b"#########"
        data.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        checkpoint.load(template, d)
    # the document is read first: a damaged checkpoint leaves the template as it was
    assert torch.equal(template["w"], torch.zeros(256))


def test_a_checkpoint_pytree_kit_did_not_write_is_refused(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(2)}, checkpoint_id=tmp_path)
    with pytest.raises(ValueError, match=r"not one pytree_kit\.torch\.checkpoint\.save wrote"):
        checkpoint.load({"w": torch.empty(2)}, tmp_path)
    with pytest.raises(FileNotFoundError):
        checkpoint.load({"w": torch.empty(2)}, tmp_path / "nothing")


# -- two ranks --------------------------------------------------------------------------------


def _ok(results: list[list[dict]]) -> list[list[str]]:
    bad = [
        (r, c["case"], c["detail"]) for r, rank in enumerate(results) for c in rank if not c["ok"]
    ]
    assert not bad, "\n\n".join(f"rank {r} {case}:\n{detail}" for r, case, detail in bad)
    return [[c["detail"] for c in rank] for rank in results]


_SAVED: dict[str, list[list[str]]] = {}


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory: Any) -> Path:
    d = tmp_path_factory.mktemp("two_ranks")
    _SAVED["details"] = _ok(run_ranks("save", 2, timeout=180, worker=WORKER, args=(str(d),)))
    return d


@pytest.mark.timeout(240)
def test_two_ranks_save_one_loads_value_by_value(two_rank_checkpoint: Path) -> None:
    values = W.full_tensors()
    template = W.plain_state({k: torch.zeros_like(v) for k, v in values.items()}, 0)
    out = checkpoint.load(template, two_rank_checkpoint, allow=[W.Sharded, W.Pair])
    assert torch.equal(out.weight, values["weight"]) and out.weight is template.weight
    assert torch.equal(out.pair.left, values["left"]) and torch.equal(
        out.pair.right, values["right"]
    )
    assert (out.step, out.name) == (7, "run-7")
    assert torch.equal(out.rng.value, W.rank_value(0))  # rank 0's own, not rank 1's


@pytest.mark.timeout(240)
def test_dcp_alone_pickles_the_dataclass_and_loses_the_other_shards(
    two_rank_checkpoint: Path,
) -> None:
    values = W.full_tensors()
    template = W.plain_state({k: torch.zeros_like(v) for k, v in values.items()}, 0)
    state = {"state": template}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=two_rank_checkpoint / "plain")
    got = state["state"]
    assert got is not template  # replaced by the unpickled object, not loaded in place
    assert torch.equal(template.weight, torch.zeros(12, 4))
    # one rank's shard of the DTensor, deduplicated: the other rank's rows are gone
    assert type(got.weight).__name__ == "DTensor"
    assert tuple(got.weight.to_local().shape) == (6, 4)
    assert torch.equal(got.weight.to_local(), values["weight"][:6])


@pytest.mark.timeout(240)
def test_a_ddp_model_and_optimizer_load_into_a_plain_model(two_rank_checkpoint: Path) -> None:
    model, opt = W.model_and_optimizer(seed=5)
    out = checkpoint.load({"model": model, "opt": opt, "epoch": 0}, two_rank_checkpoint / "ddp")
    expected = torch.load(two_rank_checkpoint / "ddp_expected_0.pt")
    assert out["epoch"] == 2 and out["model"] is model
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert opt.state_dict()["state"][0]["step"].item() == 2


@pytest.mark.timeout(240)
def test_one_rank_saves_two_load_resharded(tmp_path: Path, two_rank_checkpoint: Path) -> None:
    values = W.full_tensors()
    checkpoint.save(W.plain_state(values, 7, rank=0), tmp_path)
    # strict=False: rank 1 finds no per-rank value of its own and keeps its template's
    details = _ok(run_ranks("load", 2, timeout=180, worker=WORKER, args=(str(tmp_path),)))
    assert [d[0] for d in details] == ["rng [0, 1, 2, 3]", "rng [0, 0, 0, 0]"]
    # strict: rank 1 has no value of its own and raises; rank 0 hears of it and
    # raises too instead of waiting in DCP's collective
    assert details[0][1].startswith("ValueError: pytree_kit.torch.checkpoint.load: rank 1 f")
    assert details[1][1].startswith("ValueError: pytree_kit.torch.checkpoint.load: tree.rng[")
    # two ranks save, two load: each rank gets back its own per-rank value
    details = _ok(
        run_ranks("load", 2, timeout=180, worker=WORKER, args=(str(two_rank_checkpoint),))
    )
    assert details == [["rng [0, 1, 2, 3]", "loaded"], ["rng [100, 101, 102, 103]", "loaded"]]


@pytest.mark.timeout(240)
def test_a_leaf_one_rank_cannot_save_fails_every_rank(two_rank_checkpoint: Path) -> None:
    details = _SAVED["details"]
    assert details[1][3].startswith("TypeError: pytree_kit.torch.checkpoint.save: tree['x']")
    assert details[0][3].startswith("ValueError: pytree_kit.torch.checkpoint.save: rank 1 failed")


def test_save_and_load_without_numpy(tmp_path: Path) -> None:
    """The torch extra installs torch alone: with numpy not importable, a
    checkpoint of tensors and plain values saves and loads (the document is
    read from its tensor's bytes, not through Tensor.numpy())."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['numpy'] = None\n"  # import numpy raises
        "import warnings; warnings.simplefilter('ignore')\n"
        "import torch, pytree_kit as pk\n"
        "from pytree_kit.torch import checkpoint\n"
        "state = {'w': torch.arange(6.0).reshape(2, 3), 'step': 7, 'names': ('a', None)}\n"
        "for epoch in range(2):\n"
        f"    path = {str(tmp_path)!r} + f'/ckpt{{epoch}}'\n"
        "    checkpoint.save(state, path)\n"
        "    fresh = {'w': torch.zeros(2, 3), 'step': 0, 'names': ('b', None)}\n"
        "    got = checkpoint.load(fresh, path)\n"
        "    assert pk.tree_equal(got, state), got\n"
        "    state = pk.tree_map(lambda x: x + 1 if isinstance(x, torch.Tensor) else x, state)\n"
        "try:\n    import numpy\nexcept ImportError:\n    print('no numpy')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "no numpy"
