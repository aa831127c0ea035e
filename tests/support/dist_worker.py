"""One rank of a multi-process gloo run; tests/support/distributed.py starts them.

Usage: ``python tests/support/dist_worker.py SCENARIO RANK WORLD PORT OUT``. The rank
joins a gloo group on 127.0.0.1:PORT, runs every case of SCENARIO and writes
``[{"case": ..., "ok": ..., "detail": ...}, ...]`` as JSON to OUT. A case's
failure is recorded, not raised, so that the ranks stay in step and one run
reports every case; anything that escapes a case ends the process non-zero.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import gc
import json
import os
import sys
import traceback
from typing import Any, Callable, Iterator, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
import torch.distributed as dist
from torch import nn

import pytree_kit as pk
import pytree_kit.torch as pkt

# --------------------------------------------------------------------------
# Batches and outputs of every kind


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    scale: int
    mask: Optional[torch.Tensor] = None


@dataclasses.dataclass
class OutDC:
    first: torch.Tensor
    second: torch.Tensor
    count: int


class OutNT(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor
    count: int


class OutProto:
    def __init__(self, first: torch.Tensor, second: torch.Tensor, count: int) -> None:
        self.first, self.second, self.count = first, second, count

    def __tree_flatten__(self) -> tuple:
        return {"first": self.first, "second": self.second}, self.count

    @classmethod
    def __tree_unflatten__(cls, count: int, children: dict) -> OutProto:
        return cls(children["first"], children["second"], count)


@dataclasses.dataclass
class OutModel(collections.OrderedDict):
    """Shaped like transformers' ModelOutput: a dataclass that is an OrderedDict."""

    first: Optional[torch.Tensor] = None
    second: Optional[torch.Tensor] = None
    count: Optional[int] = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


OUTPUTS: dict[str, Callable[..., Any]] = {
    "dict": lambda first, second, count: {"first": first, "second": second, "count": count},
    "dataclass": OutDC,
    "namedtuple": OutNT,
    "protocol": OutProto,
    "modeloutput": OutModel,
}


def field(out: Any, name: str) -> Any:
    return out[name] if isinstance(out, dict) else getattr(out, name)


class Net(nn.Module):
    def __init__(self, out_kind: str, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 2)
        self.unused = nn.Linear(4, 1) if unused else None
        self.make = OUTPUTS[out_kind]

    def forward(self, batch: Batch, temperature: Optional[float] = None) -> Any:
        assert temperature is None
        h = batch.x * batch.scale
        return self.make(self.a(h), torch.tanh(self.b(h)), h.shape[0])


def make_batch(rank: int, it: int) -> Batch:
    g = torch.Generator().manual_seed(1000 * rank + it)
    return Batch(torch.randn(5, 4, generator=g), scale=2)


LOSSES: dict[str, Callable[[Any], torch.Tensor]] = {
    "all": lambda out: field(out, "first").pow(2).sum() + field(out, "second").sum(),
    "some": lambda out: field(out, "first").pow(2).sum(),
}

MODES: dict[str, dict] = {
    "default": {},
    "find_unused": {"find_unused_parameters": True},
    "static": {"static_graph": True},
    "bucket_view": {"gradient_as_bucket_view": True},
}

# --------------------------------------------------------------------------
# Helpers


def grads(model: nn.Module) -> list[Optional[torch.Tensor]]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def gather(obj: Any) -> list:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def same(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def expected_grads(
    ref: nn.Module, loss_fn: Callable, it: int, world: int, fill_zero: bool
) -> list[Optional[torch.Tensor]]:
    """The average of every rank's local gradients, computed in this process."""
    local = []
    for r in range(world):
        ref.zero_grad(set_to_none=True)
        loss_fn(ref(make_batch(r, it))).backward()
        local.append(grads(ref))
    out = []
    for per_rank, p in zip(zip(*local), ref.parameters()):
        if all(g is None for g in per_rank):
            out.append(torch.zeros_like(p) if fill_zero else None)
        else:
            out.append(sum(g if g is not None else torch.zeros_like(p) for g in per_rank) / world)
    return out


# --------------------------------------------------------------------------
# Scenarios


def ddp_case(
    mode: str, out_kind: str, loss_kind: str, *, unused: bool = False, cls: Any = None
) -> str:
    """Three training steps under DDP against the single-process average."""
    cls = cls or pkt.DistributedDataParallel
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net(out_kind, unused)
    torch.manual_seed(0)
    ref = Net(out_kind, unused)
    ddp = cls(model, **MODES[mode])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = LOSSES[loss_kind]
    raises = loss_kind == "some" or unused
    raises = raises and mode in ("default", "bucket_view")
    # Under static_graph, parameters behind outputs left out of the loss get
    # zero gradients (documented); a parameter no output depends on keeps None.
    fill_zero = mode == "static" and loss_kind == "some"
    for it in range(3):
        expected = expected_grads(ref, loss_fn, it, world, fill_zero)
        opt.zero_grad(set_to_none=True)
        out = ddp(make_batch(rank, it), temperature=None)
        check(type(out) is type(ref(make_batch(rank, it))), f"output type {type(out)}")
        check(field(out, "count") == 5, "non-tensor output leaf lost")
        try:
            loss_fn(out).backward()
        except RuntimeError as e:
            if raises and "did not synchronise the gradients" in str(e):
                return f"raised at iteration {it}: {str(e)[:80]}..."
            raise
        check(not raises, "expected backward to raise")
        got = grads(ddp.module)
        everyone = gather(got)
        for i, g in enumerate(got):
            check(
                all(same(g, other[i]) for other in everyone),
                f"iteration {it}: parameter {i} differs across ranks",
            )
            e = expected[i]
            check((g is None) == (e is None), f"iteration {it}: parameter {i}: {g} vs {e}")
            if g is not None:
                where = f"iteration {it} parameter {i}"
                torch.testing.assert_close(g, e, msg=lambda m, w=where: f"{w}: {m}")
        opt.step()
        for p, e in zip(ref.parameters(), expected):
            p.grad = e
        ref_opt.step()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    return "3 steps match the average of local gradients"


def torch_control() -> str:
    """torch's own DDP with a dataclass output under static_graph: never in sync.

    Shows the checks above can fail: the same case run through torch's class
    must be caught out.
    """
    try:
        ddp_case("static", "dataclass", "all", cls=torch.nn.parallel.DistributedDataParallel)
    except AssertionError as e:
        return f"caught: {str(e)[:80]}"
    raise AssertionError("torch's DDP passed a case it is known to fail")


def no_sync_case() -> str:
    """Gradients accumulate locally under no_sync(), and sync at the next backward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ddp = pkt.DistributedDataParallel(Net("dataclass"))
    torch.manual_seed(0)
    ref = Net("dataclass")
    loss_fn = LOSSES["all"]
    with ddp.no_sync():
        loss_fn(ddp(make_batch(rank, 0))).backward()
    local = grads(ddp.module)
    check(not same(gather(local)[0][0], gather(local)[1][0]), "no_sync() synchronised")
    loss_fn(ddp(make_batch(rank, 1))).backward()
    ref.zero_grad(set_to_none=True)
    for r in range(world):
        for it in range(2):
            loss_fn(ref(make_batch(r, it))).backward()
    for g, p in zip(grads(ddp.module), ref.parameters()):
        torch.testing.assert_close(g, p.grad / world)
    return "local under no_sync(), averaged after"


def scenario_ddp(mode: str) -> dict[str, Callable[[], str]]:
    cases: dict[str, Callable[[], str]] = {}
    for out_kind in OUTPUTS:
        for loss_kind in LOSSES:
            cases[f"{mode}-{out_kind}-{loss_kind}"] = lambda o=out_kind, lk=loss_kind: ddp_case(
                mode, o, lk
            )
    cases[f"{mode}-unused-parameter"] = lambda: ddp_case(mode, "dataclass", "all", unused=True)
    if mode == "static":
        cases["torch-ddp-static-dataclass-control"] = torch_control
    if mode == "default":
        cases["default-no_sync"] = no_sync_case
    return cases


def bridge_case(build: Callable[[], nn.Module], batch_of: Callable[[int], Any], rules: dict) -> str:
    """Two DDP steps of a model whose output holds a cache or a TensorDict,
    read through a bridged rule, against the average of local gradients; and
    the same model without the rule refused, not silently half-synced."""
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        pkt.DistributedDataParallel(build())(batch_of(rank))
    except TypeError as e:
        check("holding tensors" in str(e) and "torch_rules" in str(e), str(e))
    else:
        raise AssertionError("DDP passed an output leaf holding tensors through")
    ddp = pkt.DistributedDataParallel(build(), rules=rules)
    ref = build()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)

    def loss_of(out: Any) -> torch.Tensor:  # every tensor of the output, the cache's too
        return sum(t.float().pow(2).mean() for t in pk.leaves(out, rules=rules) if t.requires_grad)

    for it in range(2):
        local = []
        for r in range(world):
            ref.zero_grad(set_to_none=True)
            loss_of(ref(batch_of(r + 10 * it))).backward()
            local.append(grads(ref))
        expected = [sum(gs) / world for gs in zip(*local)]
        opt.zero_grad(set_to_none=True)
        out = ddp(batch_of(rank + 10 * it))
        loss_of(out).backward()
        for i, (g, e) in enumerate(zip(grads(ddp.module), expected)):
            torch.testing.assert_close(
                g, e, msg=lambda m, i=i, it=it: f"step {it} parameter {i}: {m}"
            )
        opt.step()
        for p, e in zip(ref.parameters(), expected):
            p.grad = e
        ref_opt.step()
    kinds = sorted({type(x).__name__ for x in pk.leaves(out, rules=rules)})
    return f"2 steps match; output leaves {kinds}"


def scenario_bridges() -> dict[str, Callable[[], str]]:
    import transformers
    from tensordict import TensorDict

    from tests.support.hf_models import gpt2, register_caches, t5

    register_caches()

    def ids(seed: int) -> torch.Tensor:
        return torch.randint(2, 50, (2, 5), generator=torch.Generator().manual_seed(seed))

    class TDNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lin = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> Any:
            y = self.lin(x)
            return TensorDict({"y": y, "next": {"z": y.sum(-1)}}, batch_size=[x.shape[0]])

    def xs(seed: int) -> torch.Tensor:
        return torch.rand(4, 3, generator=torch.Generator().manual_seed(seed))

    return {
        "gpt2-dynamic-cache": lambda: bridge_case(
            gpt2, ids, pkt.torch_rules(transformers.DynamicCache)
        ),
        "t5-encoder-decoder-cache": lambda: bridge_case(
            t5, ids, pkt.torch_rules(transformers.EncoderDecoderCache)
        ),
        "tensordict": lambda: bridge_case(TDNet, xs, pkt.torch_rules(TensorDict)),
    }


class Holder:
    """An object of a class pytree_kit does not see into, holding tensors."""

    def __init__(self, t: torch.Tensor) -> None:
        self.layers = [{"keys": t}]


def tree_of(rank: int, n: int = 60) -> dict:
    """A metrics-like tree: several dtypes, shapes, containers and non-tensor leaves."""
    g = torch.Generator().manual_seed(rank)
    return {
        "loss": torch.randn((), generator=g),
        "per_class": [torch.randn(3, generator=g) for _ in range(n)],
        "counts": OutNT(torch.randint(0, 9, (4,), generator=g), torch.arange(2) + rank, 7),
        "batch": Batch(torch.randn(2, 3, generator=g).t(), scale=rank, mask=None),
        "half": torch.randn(5, generator=g).double(),
        "note": "epoch",
    }


def reference(op: Callable[[torch.Tensor], torch.Tensor], trees: list) -> Any:
    """The expected result, leaf by leaf, from every rank's tree."""
    per_rank = [pk.flatten(t)[0] for t in trees]
    leaves, spec = pk.flatten(trees[dist.get_rank()])
    out = [
        op(torch.stack([r[i] for r in per_rank])) if isinstance(x, torch.Tensor) else x
        for i, x in enumerate(leaves)
    ]
    return spec.unflatten(out)


def assert_tree_close(got: Any, want: Any) -> None:
    g, gs = pk.flatten(got)
    w, ws = pk.flatten(want)
    check(gs == ws, f"structure {gs} != {ws}")
    for a, b in zip(g, w):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            check(a == b, f"{a!r} != {b!r}")


@contextlib.contextmanager
def counting(name: str) -> Iterator[list[int]]:
    """Count the calls of torch.distributed.NAME inside the block."""
    real = getattr(dist, name)
    calls = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(dist, name, wrapped)
    try:
        yield calls
    finally:
        setattr(dist, name, real)


def scenario_collectives() -> dict[str, Callable[[], str]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    trees = [tree_of(r) for r in range(world)]
    mine = trees[rank]

    def sum_one_bucket() -> str:
        before = pk.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, mine)
        with counting("all_reduce") as calls:
            got = pkt.all_reduce_tree(mine)
        n = calls[0]
        assert_tree_close(got, reference(lambda s: s.sum(0), trees))
        assert_tree_close(mine, before)  # the input is not modified
        check(type(got["counts"]) is OutNT and type(got["batch"]) is Batch, "types lost")
        check(got["batch"].scale == rank and got["note"] == "epoch", "non-tensor leaves")
        check(n == 3, f"{n} all_reduce calls for 3 dtypes")  # float32, int64, float64
        return f"{n} collectives for {len(pk.leaves(mine))} leaves"

    def many_buckets() -> str:
        # 60 x 3 float32 = 720 bytes + the rest; a 200-byte cap splits them up.
        with counting("all_reduce") as calls:
            got = pkt.all_reduce_tree(mine, bucket_cap_mb=200 / 2**20)
        n = calls[0]
        assert_tree_close(got, reference(lambda s: s.sum(0), trees))
        check(n > 5, f"only {n} buckets")
        return f"{n} buckets"

    def ops() -> str:
        for op, fn in [
            (dist.ReduceOp.MAX, lambda s: s.max(0).values),
            (dist.ReduceOp.MIN, lambda s: s.min(0).values),
            (dist.ReduceOp.PRODUCT, lambda s: s.prod(0)),
        ]:
            assert_tree_close(pkt.all_reduce_tree(mine, op), reference(fn, trees))
        floats = {"a": mine["per_class"], "b": mine["half"]}
        got = pkt.all_reduce_tree(floats, dist.ReduceOp.AVG)
        assert_tree_close(
            got,
            reference(lambda s: s.mean(0), [{"a": t["per_class"], "b": t["half"]} for t in trees]),
        )
        return "MAX MIN PRODUCT AVG"

    def async_handle() -> str:
        work = pkt.all_reduce_tree(mine, async_op=True, bucket_cap_mb=0.0005)
        check(isinstance(work, pkt.TreeWork), f"{type(work)}")
        got = work.wait()
        check(work.is_completed() and work.wait() is got, "wait() twice")
        assert_tree_close(got, reference(lambda s: s.sum(0), trees))
        return "wait() gives the tree"

    def broadcast() -> str:
        got = pkt.broadcast_tree(mine, src=1, bucket_cap_mb=0.001)
        want = pk.tree_map(lambda x: x, mine)
        src_leaves = pk.flatten(trees[1])[0]
        leaves, spec = pk.flatten(want)
        want = spec.unflatten(
            [s if isinstance(s, torch.Tensor) else x for x, s in zip(leaves, src_leaves)]
        )
        assert_tree_close(got, want)
        return "rank 1's tensors everywhere"

    def gather_all() -> str:
        got = pkt.all_gather_tree(mine)
        check(len(got) == world, "one tree per rank")
        for r in range(world):
            leaves, spec = pk.flatten(mine)
            theirs = pk.flatten(trees[r])[0]
            want = spec.unflatten(
                [t if isinstance(x, torch.Tensor) else x for x, t in zip(leaves, theirs)]
            )
            assert_tree_close(got[r], want)
        return f"{world} trees"

    def mismatch_structure() -> str:
        tree = {"a": torch.ones(2)} if rank == 0 else {"a": torch.ones(2), "b": torch.ones(1)}
        return expect_value_error(
            lambda: pkt.all_reduce_tree(tree),
            "different structures: leaf 1 is nothing on rank 0 but tree['b'] on rank 1",
            pk.StructureError,
        )

    def mismatch_container() -> str:
        tree = {"a": [torch.ones(2)] if rank == 0 else (torch.ones(2),)}
        return expect_value_error(
            lambda: pkt.all_reduce_tree(tree),
            "rank 0 has TreeSpec({'a': [*]}), rank 1 has TreeSpec({'a': (*,)})",
            pk.StructureError,
        )

    def mismatch_shape() -> str:
        tree = {"a": [torch.ones(2), torch.ones(3 + rank)]}
        return expect_value_error(
            lambda: pkt.broadcast_tree(tree, src=0), "tree['a'][1] differs between ranks"
        )

    def mismatch_dtype() -> str:
        tree = {"a": torch.ones(2, dtype=torch.float32 if rank == 0 else torch.float64)}
        return expect_value_error(lambda: pkt.all_gather_tree(tree), "tree['a'] differs")

    def avg_int() -> str:
        try:
            pkt.all_reduce_tree({"n": [torch.ones(2, dtype=torch.int64)]}, dist.ReduceOp.AVG)
        except TypeError as e:
            check("tree['n'][0]" in str(e), str(e))
            return str(e)
        raise AssertionError("no TypeError")

    def empty() -> str:
        got = pkt.all_reduce_tree({"a": None, "b": 3})
        check(got == {"a": None, "b": 3}, repr(got))
        return repr(got)

    def hidden_everywhere() -> str:
        tree = {"x": torch.ones(2), "cache": Holder(torch.ones(3))}
        try:
            pkt.all_reduce_tree(tree)
        except TypeError as e:
            check("tree['cache']" in str(e) and "Holder" in str(e), str(e))
            check("tree['cache'].layers[0]" in str(e), str(e))
        else:
            raise AssertionError("no TypeError")
        got = pkt.all_reduce_tree(tree, strict=False)
        check(
            got["cache"] is tree["cache"] and torch.equal(got["x"], world * tree["x"]),
            "strict=False",
        )
        return "TypeError on every rank; strict=False passes it through"

    def hidden_on_one_rank() -> str:
        # the ranks compare before any raises: no rank is left waiting
        leaf = Holder(torch.ones(3)) if rank == 1 else "plain"
        return expect_value_error(
            lambda: pkt.broadcast_tree({"x": torch.ones(2), "cache": leaf}, src=0),
            "a leaf that holds tensors",
        )

    return {
        "hidden-tensors": hidden_everywhere,
        "hidden-tensors-one-rank": hidden_on_one_rank,
        "all_reduce-sum": sum_one_bucket,
        "all_reduce-buckets": many_buckets,
        "all_reduce-ops": ops,
        "all_reduce-async": async_handle,
        "all_reduce-avg-int": avg_int,
        "all_reduce-no-tensors": empty,
        "broadcast": broadcast,
        "all_gather": gather_all,
        "mismatch-structure": mismatch_structure,
        "mismatch-container": mismatch_container,
        "mismatch-shape": mismatch_shape,
        "mismatch-dtype": mismatch_dtype,
    }


def expect_value_error(fn: Callable[[], Any], text: str, cls: type = ValueError) -> str:
    try:
        fn()
    except ValueError as e:
        check(text in str(e), f"message {str(e)!r} lacks {text!r}")
        check(isinstance(e, cls), f"{type(e).__name__} is not a {cls.__name__}")
        return str(e)
    raise AssertionError("no ValueError")


# --------------------------------------------------------------------------
# CUDA: one rank on NCCL (tests/torch/test_distributed.py runs it in a spawned process)


def nccl_one_rank(out: str) -> None:
    """all_reduce_tree on NCCL, and DDP moving a dataclass + defaultdict batch to the GPU."""
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        tree = {"x": [torch.arange(5, device="cuda"), torch.ones(3, 3, device="cuda")], "k": 3}
        got = pkt.all_reduce_tree(tree)
        check(got["x"][0].device.type == "cuda", "left the GPU")
        check(torch.equal(got["x"][1], tree["x"][1]) and got["k"] == 3, "values")
        avg = pkt.all_reduce_tree({"a": torch.ones(4, device="cuda")}, dist.ReduceOp.AVG)
        check(torch.equal(avg["a"], torch.ones(4, device="cuda")), "AVG")
        torch.manual_seed(0)
        model = Net("dataclass").cuda()
        ddp = pkt.DistributedDataParallel(model, device_ids=[0])
        batch = pkt.pin_memory(make_batch(0, 0), coalesce=True)
        seen = {}

        def hook(_module: Any, args: tuple, kwargs: dict) -> None:
            seen["device"] = args[0].x.device.type

        model.register_forward_pre_hook(hook, with_kwargs=True)
        out_ = ddp(batch)
        LOSSES["all"](out_).backward()
        check(seen["device"] == "cuda", f"input on {seen}")
        check(all(p.grad is not None for p in model.parameters()), "grads")
        with open(out, "w", encoding="utf-8") as f:
            f.write("ok")
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------


def join(rank: int, world: int, port: str) -> None:
    """Join the gloo group of the run on 127.0.0.1:PORT."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )


def main() -> None:
    scenario, rank, world, port, out = sys.argv[1:6]
    join(int(rank), int(world), port)
    if scenario.startswith("ddp-"):
        cases = scenario_ddp(scenario[4:])
    elif scenario == "collectives":
        cases = scenario_collectives()
    elif scenario == "bridges":
        cases = scenario_bridges()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    report(cases, out)


def report(cases: dict[str, Callable[[], str]], out: str) -> None:
    """Run every case, the ranks in step, write the results to OUT and leave
    the process (see below for why it leaves with os._exit)."""
    results = []
    for name, case in cases.items():
        try:
            results.append({"case": name, "ok": True, "detail": case()})
        except Exception:
            results.append({"case": name, "ok": False, "detail": traceback.format_exc()})
        dist.barrier()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f)
    dist.destroy_process_group()
    # torch 2.13's own teardown at interpreter exit, after everything above
    # has returned, sometimes aborts ("terminate called without an active
    # exception", no Python frame): 5 runs in 320 of ddp-default on 2 busy
    # cores, on either rank. Our objects are freed while the interpreter is
    # whole; then the rank leaves without running C++ static destructors.
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
