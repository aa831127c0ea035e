"""One rank of a multi-process gloo run of pytree_kit.torch.checkpoint;
tests/torch/test_checkpoint.py starts them through tests/support/distributed.py.

Usage: ``python tests/support/checkpoint_worker.py SCENARIO RANK WORLD PORT OUT DIR``.
The rank joins a gloo group, makes a one-dimensional CPU device mesh of the
world, runs SCENARIO's cases against the checkpoint directory DIR and writes
``[{"case", "ok", "detail"}, ...]`` to OUT, as tests/support/dist_worker.py does.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

from pytree_kit.torch import checkpoint

Pair = collections.namedtuple("Pair", "left right")


@dataclasses.dataclass
class Sharded:
    """Training state with DTensor leaves inside a dataclass and a namedtuple."""

    weight: Any  # 12 x 4, sharded by rows
    pair: Pair  # a sharded vector and a replicated one
    step: int
    name: str
    rng: checkpoint.PerRank


def full_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """The unsharded tensors every test compares with."""
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(12, 4, generator=g),
        "left": torch.randn(10, generator=g),  # 10 rows on 2 ranks: 5 + 5, on 1: 10
        "right": torch.randn(3, generator=g),
    }


def rank_value(rank: int) -> torch.Tensor:
    return torch.arange(4) + 100 * rank


def sharded_state(mesh: Any, rank: int, values: dict[str, torch.Tensor], step: int) -> Sharded:
    return Sharded(
        weight=distribute_tensor(values["weight"], mesh, [Shard(0)]),
        pair=Pair(distribute_tensor(values["left"], mesh, [Shard(0)]), values["right"].clone()),
        step=step,
        name=f"run-{step}",
        rng=checkpoint.PerRank(rank_value(rank) if step else torch.zeros(4, dtype=torch.int64)),
    )


def plain_state(values: dict[str, torch.Tensor], step: int, rank: int = 0) -> Sharded:
    """The same state in one process: plain tensors."""
    return Sharded(
        weight=values["weight"].clone(),
        pair=Pair(values["left"].clone(), values["right"].clone()),
        step=step,
        name=f"run-{step}",
        rng=checkpoint.PerRank(rank_value(rank) if step else torch.zeros(4, dtype=torch.int64)),
    )


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def scenario_save(ckdir: str, rank: int, world: int, mesh: Any) -> dict[str, Callable[[], str]]:
    def ours() -> str:
        checkpoint.save(sharded_state(mesh, rank, full_tensors(), step=7), ckdir)
        return "saved"

    def plain_dcp() -> str:
        # the same state through DCP alone: the dataclass is one pickled blob
        import torch.distributed.checkpoint as dcp

        state = sharded_state(mesh, rank, full_tensors(), step=7)
        dcp.save({"state": state}, checkpoint_id=os.path.join(ckdir, "plain"))
        return "saved"

    def ddp_model() -> str:
        # a DDP model and its optimizer after two steps: saved by their names in
        # the model (no "module." prefix), so a plain model loads them
        model, opt = model_and_optimizer()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for it in range(2):
            g = torch.Generator().manual_seed(10 * rank + it)
            loss = ddp(torch.randn(8, 4, generator=g)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        checkpoint.save({"model": ddp, "opt": opt, "epoch": 2}, os.path.join(ckdir, "ddp"))
        torch.save(
            {k: v.clone() for k, v in model.state_dict().items()},
            os.path.join(ckdir, f"ddp_expected_{rank}.pt"),
        )
        return "saved"

    def one_rank_refuses() -> str:
        # a leaf only rank 1 cannot save: every rank raises, none waits in DCP
        state: dict = {"w": torch.ones(2), "x": object() if rank == 1 else 1}
        try:
            checkpoint.save(state, os.path.join(ckdir, "refused"))
        except (TypeError, ValueError) as e:
            return f"{type(e).__name__}: {str(e)[:60]}"
        return "saved"

    return {"ours": ours, "plain dcp": plain_dcp, "ddp": ddp_model, "refused": one_rank_refuses}


def model_and_optimizer(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def scenario_load(ckdir: str, rank: int, world: int, mesh: Any) -> dict[str, Callable[[], str]]:
    def ours() -> str:
        values = full_tensors()
        zeros = {k: torch.zeros_like(v) for k, v in values.items()}
        template = sharded_state(mesh, rank, zeros, step=0)
        weight, left = template.weight, template.pair.left
        out = checkpoint.load(template, ckdir, allow=[Sharded, Pair], strict=False)
        check(out.weight is weight and out.pair.left is left, "not loaded in place")
        check(torch.equal(out.weight.full_tensor(), values["weight"]), "weight differs")
        check(torch.equal(out.pair.left.full_tensor(), values["left"]), "left differs")
        check(torch.equal(out.pair.right, values["right"]), "right differs")
        mine = weight.to_local()
        rows = 12 // world
        check(torch.equal(mine, values["weight"][rank * rows : (rank + 1) * rows]), "shard")
        check(out.step == 7 and out.name == "run-7", f"plain values {out.step} {out.name}")
        return f"rng {out.rng.value.tolist()}"

    def strict() -> str:
        # strict: a rank with no per-rank value of its own raises, and so does
        # every other rank (none is left waiting in DCP's load)
        template = sharded_state(mesh, rank, full_tensors(), step=0)
        try:
            checkpoint.load(template, ckdir, allow=[Sharded, Pair])
        except ValueError as e:
            return f"ValueError: {str(e)[:60]}"
        return "loaded"

    return {"ours": ours, "strict": strict}


def main() -> None:
    scenario, rank_s, world_s, port, out, ckdir = sys.argv[1:7]
    rank, world = int(rank_s), int(world_s)
    # the classes as tests.support.checkpoint_worker's, not __main__'s: the spec names them
    from tests.support import checkpoint_worker as me
    from tests.support.dist_worker import join, report

    join(rank, world, port)
    mesh = init_device_mesh("cpu", (world,))
    scenarios = {"save": me.scenario_save, "load": me.scenario_load}
    report(scenarios[scenario](ckdir, rank, world, mesh), out)


if __name__ == "__main__":
    main()
