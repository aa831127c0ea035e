"""transformers' caches through torch_rules, in a fresh process (the
registrations transformers makes with torch.utils._pytree are global, so they
stay out of the test process). Small models from configs, random weights.

    python tests/bridge_worker.py trace DIR   # flatten, to_device, trace, save
    python tests/bridge_worker.py load DIR    # load in a fresh process, compare

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.hf_models import gpt2, register_caches, t5


def models() -> dict[str, tuple[torch.nn.Module, type, bool]]:
    return {
        "gpt2": (gpt2().eval(), DynamicCache, False),
        "t5": (t5().eval(), EncoderDecoderCache, True),
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


def trace_step(out_dir: Path) -> dict:
    register()
    found: dict = {}
    ids = torch.randint(2, 50, (1, 5), generator=torch.Generator().manual_seed(1))
    for name, (model, cache_cls, _) in models().items():
        rules = pkt.torch_rules(cache_cls)
        with torch.no_grad():
            eager = model(ids)
        cache = eager.past_key_values
        check(type(cache) is cache_cls, f"{name}: {type(cache)}")
        # without rules, the cache is refused rather than skipped
        try:
            pkt.to_device(eager, "meta")
        except TypeError as e:
            check("past_key_values" in str(e), str(e))
        else:
            raise AssertionError(f"{name}: to_device skipped the cache silently")
        pairs, spec = pk.flatten_with_path(eager, rules=rules)
        tensors = [x for _, x in pairs if isinstance(x, torch.Tensor)]
        moved = pkt.to_device(eager, "meta", rules=rules)
        check(type(moved.past_key_values) is cache_cls, f"{name}: moved cache type")
        moved_tensors = [x for x in pk.leaves(moved, rules=rules) if isinstance(x, torch.Tensor)]
        check(
            len(moved_tensors) == len(tensors) and all(t.is_meta for t in moved_tensors),
            f"{name}: to_device left tensors behind",
        )
        rebuilt = spec.unflatten([x for _, x in pairs])
        check(same_leaves(rebuilt, eager, rules), f"{name}: flatten/unflatten round trip")
        with torch.no_grad():
            traced = pkt.trace(model, (ids,), rules=rules, check_trace=False)
            got = traced(ids)
        check(type(got.past_key_values) is cache_cls, f"{name}: traced cache type")
        check(same_leaves(got, eager, rules), f"{name}: traced output differs from eager")
        text = repr(traced)  # renders without rebuilding the cache
        pkt.save(traced, out_dir / f"{name}.pt")
        torch.save({"ids": ids, "eager": [x for _, x in pairs]}, out_dir / f"{name}.expected")
        found[name] = {
            "paths": [pk.keystr(p) for p, _ in pairs][:3],
            "tensors": len(tensors),
            "repr_ok": cache_cls.__name__ in text,
        }
    return found


def load_step(out_dir: Path) -> dict:
    register()
    found: dict = {}
    for name, (_, cache_cls, _) in models().items():
        rules = pkt.torch_rules(cache_cls)
        expected = torch.load(out_dir / f"{name}.expected", weights_only=False)
        output_cls = {
            "gpt2": transformers.modeling_outputs.CausalLMOutputWithCrossAttentions,
            "t5": transformers.modeling_outputs.Seq2SeqLMOutput,
        }[name]
        loaded = pkt.load(out_dir / f"{name}.pt", allow=[output_cls], rules=rules)
        with torch.no_grad():
            got = loaded(expected["ids"])
        check(type(got.past_key_values) is cache_cls, f"{name}: loaded cache type")
        leaves = pk.leaves(got, rules=rules)
        check(
            len(leaves) == len(expected["eager"])
            and all(
                torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                for a, b in zip(leaves, expected["eager"])
            ),
            f"{name}: loaded output differs from eager",
        )
        found[name] = {"leaves": len(leaves)}
    return found


def main() -> None:
    warnings.simplefilter("ignore")
    step, out_dir = sys.argv[1], Path(sys.argv[2])
    result = trace_step(out_dir) if step == "trace" else load_step(out_dir)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
