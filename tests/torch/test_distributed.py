"""pytree_kit.torch distributed adapters: DistributedDataParallel and tree collectives.

Two kinds of tests:

- Multi-process runs on gloo (2 ranks, 127.0.0.1, a free port, a timeout):
  every DDP mode x output type x loss over all outputs or some, against the
  average of single-process gradients, and every collective against a
  per-tensor reference. The ranks run tests/support/dist_worker.py.
- In-process checks in a one-rank group (a HashStore, no network): the DDP
  interface (module, state_dict, no_grad, inputs, rules, errors) and the
  bucketing.

The CUDA/NCCL checks skip cleanly without a GPU.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import types
from typing import Any, NamedTuple, Optional

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import pytree_kit as pk  # noqa: E402
import pytree_kit.torch as pkt  # noqa: E402
from pytree_kit.torch import _distributed  # noqa: E402
from tests.support import dist_worker  # noqa: E402
from tests.support.distributed import run_ranks  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")

# --------------------------------------------------------------------------
# Two ranks


def _expect_all_ok(results: list[list[dict]], expected_cases: int) -> list[dict]:
    names = [[c["case"] for c in rank] for rank in results]
    assert all(n == names[0] for n in names), names
    assert len(names[0]) == expected_cases, names[0]
    bad = [
        (r, c["case"], c["detail"]) for r, rank in enumerate(results) for c in rank if not c["ok"]
    ]
    assert not bad, "\n\n".join(f"rank {r} {case}:\n{detail}" for r, case, detail in bad)
    return results[0]


N_DDP_CASES = len(dist_worker.OUTPUTS) * len(dist_worker.LOSSES) + 1


@pytest.mark.parametrize("mode", sorted(dist_worker.MODES))
def test_ddp_two_ranks(mode: str) -> None:
    extra = {"static": 1, "default": 1}.get(mode, 0)  # torch's control case; no_sync
    report = _expect_all_ok(run_ranks(f"ddp-{mode}"), N_DDP_CASES + extra)
    outcomes = {c["case"]: c["detail"] for c in report}
    for out_kind in dist_worker.OUTPUTS:
        assert outcomes[f"{mode}-{out_kind}-all"].startswith("3 steps match")
        some = outcomes[f"{mode}-{out_kind}-some"]
        if mode in ("default", "bucket_view"):
            # torch's DDP needs find_unused_parameters or static_graph here;
            # ours says so at the backward that would leave gradients unsynced.
            assert some.startswith("raised at iteration 0"), some
        else:
            assert some.startswith("3 steps match"), some


def test_collectives_two_ranks() -> None:
    report = _expect_all_ok(run_ranks("collectives"), 14)
    details = {c["case"]: c["detail"] for c in report}
    assert details["all_reduce-sum"] == "3 collectives for 68 leaves"


def test_bridged_caches_and_tensordict_two_ranks() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("tensordict")
    report = _expect_all_ok(run_ranks("bridges"), 3)
    details = {c["case"]: c["detail"] for c in report}
    assert details["gpt2-dynamic-cache"].startswith("2 steps match")


# --------------------------------------------------------------------------
# One rank, in this process


@pytest.fixture(scope="module")
def group() -> Any:
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    labels: collections.defaultdict
    n: int


class Foreign:
    """A class pytree_kit cannot read by structure; rules= explain it."""

    def __init__(self, value: torch.Tensor, tag: str) -> None:
        self.value, self.tag = value, tag


FOREIGN_RULES = {
    Foreign: pk.Rule(lambda f: ((f.value,), f.tag), lambda tag, ch: Foreign(ch[0], tag))
}


class Echo(torch.nn.Module):
    """Returns a nested output built from a nested input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, batch: Batch, *, extra: Optional[torch.Tensor] = None) -> Any:
        y = self.lin(batch.x)
        return {
            "y": y,
            "labels": batch.labels,
            "n": batch.n,
            "none": None,
            "foreign": Foreign(y.sum(), "sum"),
            "extra": extra,
        }


def _batch() -> Batch:
    labels = collections.defaultdict(list)
    labels["a"].append(torch.arange(3))
    return Batch(torch.ones(4, 2), labels, 4)


def test_interface_matches_torch(group: Any) -> None:
    torch.manual_seed(0)
    ours = pkt.DistributedDataParallel(Echo(), rules=FOREIGN_RULES)
    torch.manual_seed(0)
    theirs = torch.nn.parallel.DistributedDataParallel(Echo())
    assert isinstance(ours, torch.nn.parallel.DistributedDataParallel)
    assert isinstance(ours.module, Echo)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert next(iter(ours.state_dict())).startswith("module.")
    ours.load_state_dict(theirs.state_dict())
    with ours.no_sync():
        assert ours.require_backward_grad_sync is False
    assert ours.require_backward_grad_sync is True


def test_nested_output_keeps_types_and_leaves(group: Any) -> None:
    ddp = pkt.DistributedDataParallel(Echo(), rules=FOREIGN_RULES)
    batch = _batch()
    out = ddp(batch, extra=torch.ones(1))
    assert out["n"] == 4 and out["none"] is None
    assert type(out["labels"]) is collections.defaultdict
    assert out["labels"]["a"][0] is batch.labels["a"][0]  # inputs pass through untouched
    assert type(out["foreign"]) is Foreign and out["foreign"].tag == "sum"
    out["foreign"].value.backward()
    assert ddp.module.lin.weight.grad is not None
    torch.testing.assert_close(ddp.module.lin.weight.grad, torch.full((2, 2), 4.0))


def test_output_may_be_modified_in_place(group: Any) -> None:
    for kwargs in ({}, {"static_graph": True}, {"find_unused_parameters": True}):
        ddp = pkt.DistributedDataParallel(torch.nn.Linear(2, 2), **kwargs)
        for _ in range(2):
            y = ddp(torch.ones(1, 2))
            y.mul_(2)
            y.sum().backward()


def test_no_grad_and_eval(group: Any) -> None:
    ddp = pkt.DistributedDataParallel(Echo(), rules=FOREIGN_RULES)
    ddp.eval()
    with torch.no_grad():
        out = ddp(_batch())
    assert out["y"].grad_fn is None and out["n"] == 4


def test_output_errors_name_the_path(group: Any) -> None:
    class Bad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> Any:
            out: dict = {"y": self.lin(x), "more": []}
            out["more"].append(out)
            return out

    ddp = pkt.DistributedDataParallel(Bad())
    with pytest.raises(ValueError, match=r"tree\['more'\]\[0\]"):
        ddp(torch.ones(1, 2))


def test_an_output_leaf_holding_tensors_is_an_error_unless_strict_is_false(group: Any) -> None:
    ddp = pkt.DistributedDataParallel(Echo())  # no rules: Foreign is an opaque leaf
    with pytest.raises(TypeError) as e:
        ddp(_batch())
    message = str(e.value)
    assert message.startswith("DistributedDataParallel: output['foreign'] is a ")
    assert "Foreign holding tensors (at output['foreign'].value)" in message
    assert "rules=" in message and "strict=False" in message
    out = pkt.DistributedDataParallel(Echo(), strict=False)(_batch())
    assert type(out["foreign"]) is Foreign


def test_signature_sees_a_leaf_holding_tensors() -> None:
    def sig(tree: Any, strict: bool = True) -> bytes:
        return _distributed._Packed(tree, None, "test", strict).signature()

    plain = sig({"a": torch.ones(2), "f": "x"})
    assert plain != sig({"a": torch.ones(2), "f": Foreign(torch.ones(1), "t")})
    assert plain == sig({"a": torch.ones(2), "f": Foreign(torch.ones(1), "t")}, strict=False)


def test_inputs_move_to_the_device_with_their_containers(group: Any) -> None:
    ddp = pkt.DistributedDataParallel(Echo())
    # device_ids is for accelerators; point the move at "meta" to check the
    # traversal on a CPU machine (the CUDA test below runs the real thing).
    ddp.device_ids, ddp.device_type = [0], "meta"
    args, kwargs = ddp._pk_move_inputs((_batch(),), {"extra": torch.ones(1)})
    assert type(args[0]) is Batch and type(args[0].labels) is collections.defaultdict
    assert args[0].labels.default_factory is list
    assert args[0].x.device.type == "meta" and args[0].labels["a"][0].device.type == "meta"
    assert kwargs["extra"].device.type == "meta" and args[0].n == 4


def test_mixed_precision_casts_floating_inputs_only(group: Any) -> None:
    ddp = pkt.DistributedDataParallel(Echo())
    ddp.mixed_precision = types.SimpleNamespace(param_dtype=torch.float16)
    (batch,), _ = ddp._pk_move_inputs((_batch(),), {})
    assert batch.x.dtype == torch.float16
    assert batch.labels["a"][0].dtype == torch.int64


def test_unused_parameter_error_names_the_fix(group: Any) -> None:
    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> Any:
            return {"a": self.a(x), "b": self.b(x)}

    ddp = pkt.DistributedDataParallel(Two())
    with pytest.raises(RuntimeError, match="find_unused_parameters=True") as info:
        ddp(torch.ones(1, 2))["a"].sum().backward()
    assert "did not synchronise the gradients" in str(info.value)


def test_gradient_penalty_is_not_an_unsynced_backward(group: Any) -> None:
    """torch.autograd.grad through the outputs, w.r.t. the input, feeds no reducer."""
    ddp = pkt.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh()))
    for _ in range(2):
        x = torch.ones(3, 2, requires_grad=True)
        out = {"y": ddp(x)}
        (gx,) = torch.autograd.grad(out["y"].sum(), x, create_graph=True)
        (out["y"].sum() + gx.pow(2).sum()).backward()
        assert all(p.grad is not None for p in ddp.parameters())


# --------------------------------------------------------------------------
# Collectives, one rank


class Pair(NamedTuple):
    a: torch.Tensor
    b: Any


def test_all_reduce_tree_returns_new_tensors(group: Any) -> None:
    w = torch.ones(3, requires_grad=True)
    tree = {"w": w * 2, "pair": Pair(torch.arange(4).view(2, 2).t(), "tag"), "none": None}
    before = tree["pair"].a.clone()
    got = pkt.all_reduce_tree(tree)
    assert got["w"] is not tree["w"] and not got["w"].requires_grad
    assert type(got["pair"]) is Pair and got["pair"].b == "tag" and got["none"] is None
    torch.testing.assert_close(got["pair"].a, before)  # values, shape kept
    assert torch.equal(tree["pair"].a, before)
    got["pair"].a.add_(1)
    assert torch.equal(tree["pair"].a, before)  # the input is never written


@pytest.mark.parametrize("cap", [0, -1.0, math.nan])
def test_bad_bucket_cap(group: Any, cap: float) -> None:
    with pytest.raises(ValueError, match="bucket_cap_mb must be positive"):
        pkt.all_reduce_tree({"a": torch.ones(1)}, bucket_cap_mb=cap)


def test_buckets_follow_dtype_device_and_cap() -> None:
    tree = [
        torch.ones(10),  # 40 bytes
        torch.ones(5, dtype=torch.float64),  # 40 bytes
        torch.ones(10),
        torch.ones(100),  # 400 bytes: alone
        torch.ones(2),
        torch.ones(3, dtype=torch.float64),
        "not a tensor",
    ]
    packed = _distributed._Packed(tree, None, "test")
    assert packed.buckets(100) == [[0, 2], [3], [4], [1, 5]]
    assert packed.buckets(None) == [[0, 2, 3, 4], [1, 5]]
    assert packed.buckets(1) == [[0], [2], [3], [4], [1], [5]]


def test_signature_sees_structure_dtype_and_shape() -> None:
    def sig(tree: Any) -> bytes:
        return _distributed._Packed(tree, None, "test").signature()

    base = sig({"a": [torch.ones(2), 1]})
    assert base == sig({"a": [torch.zeros(2), 1]})  # values do not matter
    assert base != sig({"a": [torch.ones(3), 1]})
    assert base != sig({"a": [torch.ones(2, dtype=torch.float64), 1]})
    assert base != sig({"b": [torch.ones(2), 1]})
    assert base != sig({"a": (torch.ones(2), 1)})


def test_broadcast_and_gather_one_rank(group: Any) -> None:
    tree = {"x": [torch.arange(3), torch.ones(2, 2)], "s": "keep"}
    out = pkt.broadcast_tree(tree, src=0)
    assert out["s"] == "keep" and torch.equal(out["x"][0], torch.arange(3))
    (only,) = pkt.all_gather_tree(tree)
    assert torch.equal(only["x"][1], torch.ones(2, 2)) and only["x"][1] is not tree["x"][1]


def test_rules_reach_the_collectives(group: Any) -> None:
    got = pkt.all_reduce_tree([Foreign(torch.ones(2), "t")], rules=FOREIGN_RULES)
    assert type(got[0]) is Foreign and got[0].tag == "t"
    assert got[0].value is not None and torch.equal(got[0].value, torch.ones(2))


def test_ddp_forward_with_device_ids_set() -> None:
    """With ``device_ids`` set, torch's steps before forward index the first of
    the moved inputs: the wrapper, which moves the inputs itself, once gave
    them none, and every forward on a GPU raised IndexError (found by the NCCL
    test on an H100). torch refuses ``device_ids`` for a CPU module when DDP is
    made, so here they are set afterwards, which takes the same branch."""
    import subprocess
    import sys

    code = (
        "import dataclasses, torch, torch.distributed as dist\n"
        "import pytree_kit.torch as pkt\n"
        "@dataclasses.dataclass\n"
        "class Batch:\n"
        "    x: torch.Tensor\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(2, 1)\n"
        "    def forward(self, batch, scale=1.0):\n"
        "        return {'loss': self.lin(batch.x).sum() * scale}\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "ddp = pkt.DistributedDataParallel(Model())\n"
        "ddp.device_ids = [0]\n"
        "out = ddp(Batch(torch.ones(3, 2)), scale=2.0)\n"
        "out['loss'].backward()\n"
        "print(ddp.module.lin.weight.grad.tolist(), flush=True)\n"
        "dist.destroy_process_group()\n"
        # (no interpreter teardown: torch's worker threads, still joinable when
        # exit() runs the C++ destructors, once aborted the run after it passed)
        "import os; os._exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the last line: torch 2.9's gloo prints a line of its own to stdout
    assert proc.stdout.strip().splitlines()[-1] == "[[6.0, 6.0]]", proc.stdout


# --------------------------------------------------------------------------
# CUDA and NCCL (skipped without a GPU)


@needs_cuda
def test_nccl_one_rank(tmp_path: Any) -> None:  # pragma: no cover - needs a GPU
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    p = ctx.Process(target=dist_worker.nccl_one_rank, args=(str(tmp_path / "out.json"),))
    p.start()
    p.join(timeout=240)
    if p.is_alive():
        p.kill()
        pytest.fail("the NCCL check timed out")
    assert p.exitcode == 0
    assert "ok" in (tmp_path / "out.json").read_text()


def test_docstring_examples_run_in_a_fresh_process() -> None:
    """The examples of pytree_kit/torch/_distributed.py (not collected in-process: see
    the repository's conftest.py), each one run and checked by doctest."""
    import subprocess
    import sys

    code = (
        "import doctest, sys\n"
        "import pytree_kit.torch._distributed as m\n"
        "r = doctest.testmod(m, optionflags=doctest.ELLIPSIS)\n"
        "print(r)\n"
        "sys.exit(1 if r.failed or r.attempted < 20 else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
