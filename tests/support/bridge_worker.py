"""transformers' caches and tensordict's TensorDict through torch_rules, in a
fresh process (the registrations transformers makes with torch.utils._pytree
are global, so they stay out of the test process). Small models from
configs, random weights.

    python tests/support/bridge_worker.py trace DIR   # flatten, to_device, trace, export, save
    python tests/support/bridge_worker.py load DIR    # load both in a fresh process, compare

Prints one JSON line of findings; exits non-zero on a failed check.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import DynamicCache, EncoderDecoderCache

import pytree_kit as pk
import pytree_kit.torch as pkt

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.hf_models import gpt2, register_caches, t5


class TDNet(torch.nn.Module):
    """A model whose output is a TensorDict (nested, with a batch size)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> Any:
        from tensordict import TensorDict

        y = self.lin(x.float())
        return TensorDict({"y": y, "next": {"z": y.sum(-1)}}, batch_size=[x.shape[0]])


def cases() -> dict[str, tuple[torch.nn.Module, type, Any]]:
    """name -> (model, the class its output holds, how to reach that object)."""
    from tensordict import TensorDict

    return {
        "gpt2": (gpt2().eval(), DynamicCache, lambda out: out.past_key_values),
        "t5": (t5().eval(), EncoderDecoderCache, lambda out: out.past_key_values),
        "tensordict": (TDNet().eval(), TensorDict, lambda out: out),
    }


def register() -> None:
    register_caches()


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def same_leaves(a: Any, b: Any, rules: Any) -> bool:
    la, lb = pk.leaves(a, rules=rules), pk.leaves(b, rules=rules)
    return len(la) == len(lb) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(la, lb)
    )


def same_batch_size(got: Any, eager: Any) -> bool:
    """A TensorDict's batch size: equal to eager's and made of ints (not the
    tensors torch.jit.trace records for x.shape[0])."""
    size = getattr(got, "batch_size", None)
    if not isinstance(size, torch.Size):  # a cache's batch_size is an int
        return True
    return size == eager.batch_size and all(type(d) is int for d in size)


def trace_step(out_dir: Path) -> dict:
    register()
    found: dict = {}
    ids = torch.randint(2, 50, (1, 5), generator=torch.Generator().manual_seed(1))
    for name, (model, cls, held) in cases().items():
        rules = pkt.torch_rules(cls)
        with torch.no_grad():
            eager = model(ids)
        check(type(held(eager)) is cls, f"{name}: {type(held(eager))}")
        # without rules, the object is refused rather than skipped; one with a
        # .to() of its own (a TensorDict) is moved by it, as accelerate and
        # Lightning move it
        if callable(getattr(cls, "to", None)):
            alone = held(pkt.to_device({"out": eager}, "meta")["out"])
            own = [x for x in pk.leaves(alone, rules=rules) if isinstance(x, torch.Tensor)]
            check(type(alone) is cls and own and all(t.is_meta for t in own), f"{name}: .to()")
        else:
            try:
                pkt.to_device({"out": eager}, "meta")
            except TypeError as e:
                check("holding tensors" in str(e), str(e))
            else:
                raise AssertionError(f"{name}: to_device skipped {cls.__name__} silently")
        pairs, spec = pk.flatten_with_path(eager, rules=rules)
        tensors = [x for _, x in pairs if isinstance(x, torch.Tensor)]
        moved = pkt.to_device(eager, "meta", rules=rules)
        check(type(held(moved)) is cls, f"{name}: moved type")
        moved_tensors = [x for x in pk.leaves(moved, rules=rules) if isinstance(x, torch.Tensor)]
        check(
            len(moved_tensors) == len(tensors) and all(t.is_meta for t in moved_tensors),
            f"{name}: to_device left tensors behind",
        )
        rebuilt = spec.unflatten([x for _, x in pairs])
        check(same_leaves(rebuilt, eager, rules), f"{name}: flatten/unflatten round trip")
        with torch.no_grad():
            traced = pkt.trace(model, (ids,), rules=rules, check_trace=False)
            exported = pkt.export(model, (ids,), rules=rules)
            for kind, program in (("jit", traced), ("export", exported)):
                got = program(ids)
                check(type(held(got)) is cls, f"{name} ({kind}): output type")
                check(same_leaves(got, eager, rules), f"{name} ({kind}): differs from eager")
                check(same_batch_size(held(got), held(eager)), f"{name} ({kind}): batch size")
                pkt.save(program, out_dir / f"{name}-{kind}.pt")
        text = repr(traced)  # renders without rebuilding the cache
        torch.save({"ids": ids, "eager": [x for _, x in pairs]}, out_dir / f"{name}.expected")
        found[name] = {
            "saved": (out_dir / f"{name}-jit.pt").exists(),
            "paths": [pk.keystr(p) for p, _ in pairs][:3],
            "tensors": len(tensors),
            "repr_ok": cls.__name__ in text,
        }
    return found


def load_step(out_dir: Path) -> dict:
    register()
    found: dict = {}
    outputs = {
        "gpt2": [transformers.modeling_outputs.CausalLMOutputWithCrossAttentions],
        "t5": [transformers.modeling_outputs.Seq2SeqLMOutput],
        "tensordict": [],
    }
    for name, (_, cls, held) in cases().items():
        rules = pkt.torch_rules(cls)
        expected = torch.load(out_dir / f"{name}.expected", weights_only=False)
        found[name] = {}
        for kind in ("jit", "export"):
            if not (out_dir / f"{name}-{kind}.pt").exists():
                continue
            loaded = pkt.load(out_dir / f"{name}-{kind}.pt", allow=outputs[name], rules=rules)
            check(loaded.kind == kind, f"{name}: {loaded.kind}")
            with torch.no_grad():
                got = loaded(expected["ids"])
            check(type(held(got)) is cls, f"{name} ({kind}): loaded output type")
            if name == "tensordict":
                size = held(got).batch_size
                check(size == (1,) and type(size[0]) is int, f"{name} ({kind}): {size}")
            leaves = pk.leaves(got, rules=rules)
            check(
                len(leaves) == len(expected["eager"])
                and all(
                    torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                    for a, b in zip(leaves, expected["eager"])
                ),
                f"{name} ({kind}): loaded output differs from eager",
            )
            found[name][kind] = len(leaves)
    return found


def main() -> None:
    warnings.simplefilter("ignore")
    step, out_dir = sys.argv[1], Path(sys.argv[2])
    result = trace_step(out_dir) if step == "trace" else load_step(out_dir)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
