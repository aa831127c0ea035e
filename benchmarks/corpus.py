"""The corpus benchmark: pytree_kit against its peers, on trees drawn at random
and on six named ones, and the page of its figures on every Python.

    python benchmarks/corpus.py                      # full run, about 3-4 minutes
    python benchmarks/corpus.py --quick              # smoke mode, well under a minute
    python benchmarks/corpus.py --seed 7             # other trees
    python benchmarks/corpus.py --families wide,chain
    python benchmarks/corpus.py --only optree        # pytree_kit and the peers named
    python benchmarks/corpus.py --out /tmp/c         # write the outputs elsewhere
    python benchmarks/corpus.py --record             # into benchmarks/results/ (published)
    python benchmarks/corpus.py compare              # the six named trees, a few minutes
    python benchmarks/corpus.py compare --quick      # smoke mode (CI), well under a minute
    python benchmarks/corpus.py versions --record    # benchmarks/results/versions.md

**The corpus** (no command). Six fixed trees are trees an engine could be tuned
to; these are drawn instead, from families of the shapes met in practice, at
several sizes each, from a seed (``--seed``; the same seed draws the same trees):

- ``state_dict``: flat dicts of 10 to 5,000 str keys named as real models name
  their parameters (``model.layers.3.self_attn.q_proj.weight``, a GPT-2, BERT or
  ResNet naming drawn at random), in the model's order (not sorted), tensors as
  values; one of them an ``OrderedDict`` (what ``module.state_dict()`` returns);
- ``optimizer``: torch's Adam ``state_dict()``: ``{"state": {int: {"step",
  "exp_avg", "exp_avg_sq"}}, "param_groups": [{hyperparameters, "params": [ints]}]}``
  (its ``foreach`` and ``fused`` are None);
- ``config``: nested dicts of str keys, each section 2 to 5 deep, leaves int,
  float, str, bool and short lists, and None (a node, not a leaf);
- ``records``: lists of dicts that share their keys (10 to 10,000 records);
- ``chain``: lists and dicts nested alternately, 10 to 200 deep;
- ``wide``: one list of 100 to 100,000 leaves;
- ``dataclass``, ``attrs``, ``namedtuple``: batches of records of each kind
  (plain, frozen and slotted classes mixed; attrs only where it is importable);
- ``modeloutput``: transformers-style outputs, a dataclass that is also an
  ``OrderedDict`` (loss, logits, past_key_values, hidden_states, attentions, some
  of them None), 2 to 48 layers;
- ``none``: lists of step outputs with None among the values;
- ``mixed_keys``: dicts keyed by ints and floats together, and by tuples (every
  library sorts these), and one tree with int and str keys in one dict (which
  jax and dm-tree cannot sort: they drop out of that tree);
- ``named``: the six named trees (below).

Leaves are torch tensors where torch is installed, numpy arrays where only numpy
is, else strings (every library takes each as a leaf), and the Python ints, floats,
strs and bools of the families that have them; drawing needs no torch.

The report goes to stdout and ``OUT/corpus.md``, its figures to
``OUT/corpus.json``. ``OUT`` defaults to ``build/benchmarks/python3.X/`` of the
running Python; ``--record`` writes into ``benchmarks/results/python3.X/``, the
published figures.

How it measures, in one process, with ``_peers.py``'s libraries and timing
(``load_libraries``, ``_calls_checked``, ``measure_many``): each tree is first run
once through every library, and a library that sees a different number of leaves
than pytree_kit's pure engine, or errors, or does not round-trip, takes no part
in that tree (n/a; the report lists each such library and tree, with the cause
where it is known). Then, for each operation, every library's zero-argument call
is warmed up, calibrated to loops of at least ``--min-time`` and timed in
``--repeats`` interleaved rounds; a cell is the median time per call. The
pytree_kit engine timed is the active one (``pk.ENGINE``: the C one when it is
built), through the public API: ``pk.flatten(tree)``, ``pk.unflatten(spec,
leaves)``, ``pk.leaves(tree)``, ``pk.tree_map(f, tree)`` (f the identity) and
``spec.flatten_up_to(tree)``. flatten_up_to is timed for pytree_kit only, in the
same interleaved rounds as its own flatten, and reported as flatten's time /
flatten_up_to's (the peers' flatten_up_to is not timed: no target reads it).

Ratios: for flatten, unflatten, leaves and tree_map, speedup = (median of the
fastest peer on that tree and operation) / (pytree_kit's median), above 1 being
faster than every peer. Per family and operation the report gives the worst and
the median speedup over the family's trees, and names the tree (its size) and the
peer of the worst. The targets (met only when the family's worst reaches them):
flatten >= 2x, unflatten >= 1.5x, tree_map >= 1.5x, leaves >= 2.5x the fastest
peer, and flatten_up_to >= 1.5x pytree_kit's own flatten.

**compare**: the six named trees, through every pytree_kit engine that can be
imported (the pure engine, and the C engine when it is built; the one the
public API does not reach in this process is called directly, tree_map as
``pk.tree_map`` does it) and every peer, each operation timed for every
library (flatten_up_to too), each cell ``median µs (speedup x)`` with the same
speedup (``1.00 x`` marks the fastest peer itself). Then leaves() against the
floor (copying as many references into a new list, timed in the same rounds:
``leaves() time / floor time``, lower is better), pytree_kit's flatten_up_to
against its flatten in the same rounds, the named trees' speed targets on the C engine,
and the cost per leaf of flatten and leaves from 10^3 to 10^6 leaves. The
report goes to ``OUT/compare.md``, the C engine's figures to
``OUT/compare.json``, the charts to ``OUT/compare.png`` (speedups per tree and
operation) and ``OUT/scaling.png`` (ns per leaf); ``OUT`` defaults to
``build/benchmarks/``, ``--record`` writes into ``benchmarks/results/`` (each
``benchmarks/results/python3.X/`` holds a run made with that Python, ``--out``
pointing there, ``--no-plot``).

**versions**: one page of the C engine's speedups on every supported Python,
from the recorded runs (``benchmarks/results/python3.*/compare.json``, whatever
``--out`` says): one table per version, every tree and operation where the C
engine is slower than the fastest peer (speedup below 1x) and, from the
``corpus.json`` beside them, each family's worst speedup per operation on each
version. It writes ``versions.md`` into ``build/benchmarks/`` (``--record``:
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import gc
import json
import math
import platform
import random
import re
import statistics
import sys
import time
import traceback
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import _output
from _peers import (
    FLOOR,
    OPS,
    OPTREE_NS,
    SAME_ROUNDS,
    Lib,
    Settings,
    X,
    _calls_checked,
    _fmt_us,
    _git_revision,
    _initial,
    _table,
    best_peer,
    load_libraries,
    machine_lines,
    measure_many,
    settings_for,
)

import pytree_kit as pk
from pytree_kit import _pure

try:
    import attrs
except ImportError:  # the attrs family is skipped, with a note
    attrs = None

# the test trees' ModelOutput behaviour, its one copy (no other module on the path has the name)
sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts" / "corpus"))
from model_output import ModelOutputBase

DEFAULT_SEED = 21
PEER_OPS: tuple[str, ...] = ("flatten", "unflatten", "leaves", "tree_map")
#: The corpus's speed targets: each operation's worst ratio over a family's trees.
TARGETS: dict[str, float] = {
    "flatten": 2.0,
    "unflatten": 1.5,
    "leaves": 2.5,
    "tree_map": 1.5,
    "flatten_up_to": 1.5,
}
#: Full-run timing: a little shorter than compare's (0.05 s, 7 repeats), for
#: ~50 trees in 3-4 minutes; the interleaving is what keeps the ratios steady.
FULL_MIN_TIME = 0.015
FULL_REPEATS = 5


# --------------------------------------------------------------------------
# Leaves


@functools.cache
def leaf_pool() -> tuple[str, tuple[Any, ...]]:
    """(what the leaves are, 16 distinct leaves): tensors, else arrays, else strs."""
    shapes = [(8,), (4, 4), (16,), (3, 8, 8), (2,), (1,), (32,), (8, 8)] * 2
    try:
        import torch

        out = [torch.zeros(s) for s in shapes[:12]]
        out += [torch.zeros(s, dtype=torch.int64) for s in shapes[12:14]]
        out += [torch.zeros(s, dtype=torch.bool) for s in shapes[14:]]
        return f"torch.Tensor (torch {torch.__version__})", tuple(out)
    except ImportError:
        pass
    try:
        import numpy as np

        return f"numpy.ndarray (numpy {np.__version__})", tuple(np.zeros(s) for s in shapes)
    except ImportError:
        return "str (stand-ins: no torch, no numpy)", tuple(f"tensor{i}" for i in range(16))


def tensor(rng: random.Random) -> Any:
    return rng.choice(leaf_pool()[1])


# --------------------------------------------------------------------------
# The six named trees (the named family, and compare's trees)


@dataclasses.dataclass
class Meta:
    epoch: Any
    step: Any
    lr: Any
    seed: Any


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any
    masks: Any


@dataclasses.dataclass
class Batch:
    images: Any
    targets: Any
    meta: Any


NAMED_DATACLASSES: tuple[type, ...] = (Meta, Target, Batch)


@functools.cache
def _tensors() -> dict[str, Any]:
    """A few small tensors, reused as leaves (torch when present, else stand-ins)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a bench dependency
        return {"image": "image", "boxes": "boxes", "labels": "labels", "masks": "masks"}
    return {
        "image": torch.zeros(3, 8, 8),
        "boxes": torch.zeros(5, 4),
        "labels": torch.zeros(5, dtype=torch.int64),
        "masks": torch.zeros(5, 8, 8, dtype=torch.bool),
    }


def tree_dict10() -> Any:
    return {f"k{i}": i for i in range(10)}


def tree_detection() -> Any:
    t = _tensors()
    return {
        "images": [t["image"] for _ in range(8)],
        "targets": [
            {"boxes": t["boxes"], "labels": t["labels"], "masks": t["masks"]} for _ in range(8)
        ],
        "meta": {"epoch": 3, "step": 1200, "ids": (11, 12, 13, 14, 15, 16)},
    }


def tree_records() -> Any:
    return [{"x": i, "y": i + 1, "z": i + 2} for i in range(1000)]


def tree_chain() -> Any:
    t: Any = 0
    for i in range(1, 50):
        t = [t, i] if i % 2 else {"child": t, "v": i}
    return t


def tree_dataclass() -> Any:
    t = _tensors()
    return Batch(
        images=[t["image"] for _ in range(4)],
        targets=[Target(t["boxes"], t["labels"], t["masks"]) for _ in range(4)],
        meta=Meta(epoch=3, step=1200, lr=0.1, seed=7),
    )


def tree_wide() -> Any:
    return {name: list(range(25_000)) for name in ("a", "b", "c", "d")}


@dataclasses.dataclass(frozen=True)
class TreeCase:
    key: str
    label: str
    make: Callable[[], Any]
    big: bool = False


TREES: tuple[TreeCase, ...] = (
    TreeCase("a", "(a) dict of 10", tree_dict10),
    TreeCase("b", "(b) detection batch", tree_detection),
    TreeCase("c", "(c) 1000 dicts x 3", tree_records),
    TreeCase("d", "(d) depth-50 chain", tree_chain),
    TreeCase("e", "(e) dataclass batch", tree_dataclass),
    TreeCase("f", "(f) wide, 100,000", tree_wide, big=True),
)

TREE_DESCRIPTIONS: dict[str, str] = {
    "a": "`{'k0': 0, ..., 'k9': 9}`",
    "b": "`images`: 8 tensors; `targets`: 8 dicts of boxes/labels/masks tensors; "
    "`meta`: epoch, step and a tuple of 6 ids",
    "c": "a list of 1000 dicts `{'x', 'y', 'z'}` of ints",
    "d": "nested 49 deep, alternating `[child, i]` and `{'child': ..., 'v': i}`",
    "e": "`Batch(images=[4 tensors], targets=[4 Target(boxes, labels, masks)], "
    "meta=Meta(epoch, step, lr, seed))`, dataclasses",
    "f": "a dict of 4 lists of 25,000 ints",
}


# --------------------------------------------------------------------------
# The record classes of the dataclass, attrs, namedtuple and modeloutput families


@dataclasses.dataclass
class DCItem:
    image: Any
    label: Any
    weight: Any


@dataclasses.dataclass(frozen=True)
class DCBoxes:
    boxes: Any
    labels: Any
    scores: Any
    masks: Any


@dataclasses.dataclass(slots=True)
class DCTokens:
    input_ids: Any
    attention_mask: Any


@dataclasses.dataclass
class DCMeta:
    epoch: Any
    step: Any
    lr: Any
    ids: Any


@dataclasses.dataclass
class DCBatch:
    items: Any
    meta: Any
    extras: Any


NTItem = collections.namedtuple("NTItem", "image label weight")
NTBoxes = collections.namedtuple("NTBoxes", "boxes labels scores masks")


class NTTokens(typing.NamedTuple):
    input_ids: Any
    attention_mask: Any


class NTMeta(typing.NamedTuple):
    epoch: Any
    step: Any
    lr: Any
    ids: Any


class NTBatch(typing.NamedTuple):
    items: Any
    meta: Any
    extras: Any


if attrs is not None:

    @attrs.define
    class ATItem:
        image: Any
        label: Any
        weight: Any

    @attrs.frozen
    class ATBoxes:
        boxes: Any
        labels: Any
        scores: Any
        masks: Any

    @attrs.define(slots=False)
    class ATTokens:
        input_ids: Any
        attention_mask: Any

    @attrs.define
    class ATMeta:
        epoch: Any
        step: Any
        lr: Any
        ids: Any

    @attrs.define
    class ATBatch:
        items: Any
        meta: Any
        extras: Any

    ATTRS_CLASSES: tuple[type, ...] = (ATItem, ATBoxes, ATTokens, ATMeta, ATBatch)
else:  # pragma: no cover - attrs is a bench dependency
    ATTRS_CLASSES = ()


@dataclasses.dataclass
class CausalLMOutput(ModelOutputBase):
    """Shaped like transformers' CausalLMOutputWithPast (its ModelOutput
    behaviour from ``scripts/corpus/model_output.py``)."""

    loss: Any = None
    logits: Any = None
    past_key_values: Any = None
    hidden_states: Any = None
    attentions: Any = None


DATACLASSES: tuple[type, ...] = (DCItem, DCBoxes, DCTokens, DCMeta, DCBatch)


# --------------------------------------------------------------------------
# The families

SD_TAILS = {
    "llama": ["model.norm.weight", "lm_head.weight"],
    "gpt2": ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"],
    "bert": ["pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"],
    "resnet": ["fc.weight", "fc.bias"],
}


def _sd_layer(arch: str, i: int, bias: bool) -> list[str]:
    if arch == "llama":
        p = f"model.layers.{i}."
        out = []
        for m in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append(f"{p}self_attn.{m}.weight")
            if bias and m != "o_proj":
                out.append(f"{p}self_attn.{m}.bias")
        out += [f"{p}mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")]
        return [*out, f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
    if arch == "gpt2":
        p = f"transformer.h.{i}."
        mods = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
        return [f"{p}{m}.{w}" for m in mods for w in ("weight", "bias")]
    if arch == "bert":
        p = f"bert.encoder.layer.{i}."
        mods = (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "attention.output.LayerNorm",
            "intermediate.dense",
            "output.dense",
            "output.LayerNorm",
        )
        return [f"{p}{m}.{w}" for m in mods for w in ("weight", "bias")]
    # resnet: block i of the 4 stages (3, 4, 6, then as many as it takes)
    stage, block = (
        (1, i) if i < 3 else (2, i - 3) if i < 7 else (3, i - 7) if i < 13 else (4, i - 13)
    )
    p = f"layer{stage}.{block}."
    out = []
    for k in (1, 2, 3):
        out.append(f"{p}conv{k}.weight")
        out += [
            f"{p}bn{k}.{w}"
            for w in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
        ]
    if block == 0:
        out.append(f"{p}downsample.0.weight")
        out += [
            f"{p}downsample.1.{w}"
            for w in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
        ]
    return out


def draw_state_dict(rng: random.Random, n: int, ordered: bool = False) -> Any:
    arch = rng.choice(sorted(SD_TAILS))
    bias = rng.random() < 0.5
    head = {
        "llama": ["model.embed_tokens.weight"],
        "gpt2": ["transformer.wte.weight", "transformer.wpe.weight"],
        "bert": [
            "bert.embeddings.word_embeddings.weight",
            "bert.embeddings.position_embeddings.weight",
            "bert.embeddings.token_type_embeddings.weight",
            "bert.embeddings.LayerNorm.weight",
            "bert.embeddings.LayerNorm.bias",
        ],
        "resnet": ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean"],
    }[arch]
    tail = SD_TAILS[arch]
    names = list(head)
    i = 0
    while len(names) + len(tail) < n:
        names += _sd_layer(arch, i, bias)
        i += 1
    names = (names[: max(n - len(tail), 0)] + tail)[:n]
    items = [(name, tensor(rng)) for name in names]
    return collections.OrderedDict(items) if ordered else dict(items)


def draw_optimizer(rng: random.Random, n: int) -> Any:
    state: dict[int, Any] = {}
    for i in range(n):
        if n >= 100 and rng.random() < 0.05:
            continue  # a parameter that got no gradient has no state
        state[i] = {"step": tensor(rng), "exp_avg": tensor(rng), "exp_avg_sq": tensor(rng)}
    ids = list(range(n))
    groups = []
    cuts = sorted(rng.sample(range(1, n), k=min(rng.randint(0, 2), n - 1))) if n > 1 else []
    for lo, hi in zip([0, *cuts], [*cuts, n]):
        groups.append(
            {
                "lr": rng.choice([1e-3, 3e-4, 1e-4]),
                "betas": (0.9, rng.choice([0.999, 0.95])),
                "eps": 1e-8,
                "weight_decay": rng.choice([0.0, 0.01, 0.1]),
                "amsgrad": False,
                "foreach": None,
                "maximize": False,
                "capturable": False,
                "differentiable": False,
                "fused": None,
                "decoupled_weight_decay": False,
                "params": ids[lo:hi],
            }
        )
    return {"state": state, "param_groups": groups}


CONFIG_KEYS = (
    "model encoder decoder optimizer scheduler data train eval logging checkpoint augment "
    "loss name lr weight_decay betas warmup_steps max_steps batch_size num_workers seed "
    "dropout hidden_size num_layers num_heads vocab_size activation precision path enabled "
    "every keep_last project tags resume_from gradient_clip label_smoothing mixup cutmix "
    "interpolation mean std milestones gamma type pretrained freeze ema decay device"
).split()


def _config_value(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.25:
        return rng.choice([0, 1, 2, 8, 16, 64, 512, 768, 1000, 50_000])
    if r < 0.50:
        return rng.choice([0.0, 0.1, 0.5, 1e-4, 3e-4, 0.9, 0.999])
    if r < 0.70:
        return rng.choice(["adamw", "cosine", "bf16", "gelu", "/data/train", "imagenet", "cuda"])
    if r < 0.85:
        return rng.random() < 0.5
    if r < 0.95:
        return None
    return [rng.randint(1, 100) for _ in range(rng.randint(2, 4))]


def _config_dict(rng: random.Random, budget: list[int], depth: int, max_depth: int) -> Any:
    d: dict[str, Any] = {}
    for _ in range(rng.randint(2, 8)):
        if budget[0] <= 0:
            break
        key = rng.choice(CONFIG_KEYS)
        while key in d:
            key = f"{rng.choice(CONFIG_KEYS)}_{len(d)}"
        if depth < max_depth and rng.random() < 0.4:
            d[key] = _config_dict(rng, budget, depth + 1, max_depth)
        else:
            d[key] = v = _config_value(rng)
            budget[0] -= len(v) if isinstance(v, list) else 1
    return d


def draw_config(rng: random.Random, n: int) -> Any:
    """About ``n`` values (None included) in sections each 2 to 5 deep."""
    budget = [n]
    top: dict[str, Any] = {}
    while budget[0] > 0:
        key = rng.choice(CONFIG_KEYS)
        while key in top:
            key = f"{rng.choice(CONFIG_KEYS)}_{len(top)}"
        top[key] = _config_dict(rng, budget, 2, rng.randint(2, 5))
    return top


RECORD_KEYS = (
    "id text label score input_ids attention_mask image path width height bbox split source weight"
).split()


def draw_records(rng: random.Random, n: int) -> Any:
    keys = rng.sample(RECORD_KEYS, rng.randint(3, 8))
    kinds = {k: rng.choice(["tensor", "tensor", "int", "float", "str", "bool"]) for k in keys}

    def value(kind: str) -> Any:
        if kind == "tensor":
            return tensor(rng)
        if kind == "int":
            return rng.randrange(100_000)
        if kind == "float":
            return rng.random()
        if kind == "str":
            return rng.choice(["train", "val", "a cat", "img_0001.jpg"])
        return rng.random() < 0.5

    return [{k: value(kinds[k]) for k in keys} for _ in range(n)]


def draw_chain(rng: random.Random, depth: int) -> Any:
    t: Any = tensor(rng)
    for i in range(depth):
        extra = [rng.choice([tensor(rng), i, 0.5]) for _ in range(rng.randint(1, 3))]
        if i % 2:
            t = [t, *extra] if rng.random() < 0.5 else [*extra, t]
        else:
            keys = rng.sample(RECORD_KEYS, len(extra))
            items = [("child", t), *zip(keys, extra)]
            rng.shuffle(items)
            t = dict(items)
    return t


def draw_wide(rng: random.Random, n: int) -> Any:
    out: list[Any] = []
    for _ in range(n):
        r = rng.random()
        out.append(tensor(rng) if r < 0.5 else rng.random() if r < 0.75 else rng.randrange(1000))
    return out


def _batch(
    rng: random.Random, n: int, item_classes: tuple[type, ...], meta: type, batch: type
) -> Any:
    items = []
    for _ in range(n):
        cls = rng.choice(item_classes)
        nfields = len(getattr(cls, "_fields", None) or _record_fields(cls))
        items.append(cls(*[tensor(rng) for _ in range(nfields)]))
    ids = tuple(rng.randrange(10_000) for _ in range(rng.randint(1, 8)))
    m = meta(rng.randrange(100), rng.randrange(100_000), rng.choice([0.1, 1e-3]), ids)
    extras = {"sizes": [rng.randrange(512) for _ in range(min(n, 16))], "split": "train"}
    return batch(items, m, extras)


def _record_fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return _fields_of(cls)
    return [a.name for a in cls.__attrs_attrs__]  # type: ignore[attr-defined]


def draw_dataclass(rng: random.Random, n: int) -> Any:
    return _batch(rng, n, (DCItem, DCBoxes, DCTokens), DCMeta, DCBatch)


def draw_attrs(rng: random.Random, n: int) -> Any:
    return _batch(rng, n, ATTRS_CLASSES[:3], ATTRS_CLASSES[3], ATTRS_CLASSES[4])


def draw_namedtuple(rng: random.Random, n: int) -> Any:
    return _batch(rng, n, (NTItem, NTBoxes, NTTokens), NTMeta, NTBatch)


def draw_modeloutput(rng: random.Random, layers: int) -> Any:
    def maybe(p: float, make: Callable[[], Any]) -> Any:
        return make() if rng.random() < p else None

    # generate()'s default use_cache=True: past_key_values is always there
    return CausalLMOutput(
        loss=maybe(0.5, lambda: tensor(rng)),
        logits=tensor(rng),
        past_key_values=tuple((tensor(rng), tensor(rng)) for _ in range(layers)),
        hidden_states=maybe(0.5, lambda: tuple(tensor(rng) for _ in range(layers + 1))),
        attentions=maybe(0.3, lambda: tuple(tensor(rng) for _ in range(layers))),
    )


def draw_none(rng: random.Random, n: int) -> Any:
    def step() -> Any:
        return {
            "loss": tensor(rng),
            "aux_loss": tensor(rng) if rng.random() < 0.3 else None,
            "logits": tensor(rng),
            "past": None,
            "metrics": {"acc": rng.random(), "f1": None if rng.random() < 0.5 else rng.random()},
            "pair": (tensor(rng), None),
        }

    return [step() for _ in range(n)]


def draw_mixed_keys(rng: random.Random, n: int, unsortable: bool = False) -> Any:
    classes = list(range(n))
    rng.shuffle(classes)  # the order a set or a counter gives them: not sorted
    per_class: dict[Any, Any] = {
        c: {"precision": rng.random(), "recall": rng.random(), "support": rng.randrange(500)}
        for c in classes
    }
    if unsortable:  # sklearn's classification_report(output_dict=True), int labels
        for name in ("macro avg", "weighted avg"):
            per_class[name] = {"precision": rng.random(), "recall": rng.random()}
        per_class["accuracy"] = rng.random()
    thresholds: dict[Any, Any] = {t: tensor(rng) for t in (0.25, 0.5, 1, 0.75, 2, 1.5)}
    pairs = [(i, j) for i in range(min(n, 32)) for j in range(min(n, 32)) if rng.random() < 0.2]
    confusion = {p: rng.randrange(100) for p in pairs}
    return {"per_class": per_class, "thresholds": thresholds, "confusion": confusion}


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    unit: str  # what the size counts
    what: str
    #: (size, variant label or ""): one tree each; the first ``quick`` make --quick
    points: tuple[tuple[int, str], ...]
    quick: int
    draw: Callable[..., Any]  # draw(rng, size, variant) -> tree
    requires: Optional[str] = None  # a module the family needs


def _named_draw(rng: random.Random, size: int, variant: str) -> Any:
    return next(c for c in TREES if c.key == variant).make()


FAMILIES: tuple[Family, ...] = (
    Family(
        "state_dict",
        "keys",
        "a flat dict of tensors named as a model names its parameters, in model order",
        ((10, ""), (100, ""), (1000, ""), (1000, "OrderedDict"), (5000, "")),
        2,
        lambda rng, n, v: draw_state_dict(rng, n, ordered=v == "OrderedDict"),
    ),
    Family(
        "optimizer",
        "params",
        "torch's Adam state_dict(): state {int: {step, exp_avg, exp_avg_sq}}, "
        "1-3 param_groups with their hyperparameters and param ids",
        ((10, ""), (100, ""), (1000, "")),
        1,
        lambda rng, n, v: draw_optimizer(rng, n),
    ),
    Family(
        "config",
        "values",
        "nested dicts of str keys, sections 2-5 deep; int, float, str, bool, None, lists",
        ((20, ""), (200, ""), (2000, "")),
        1,
        lambda rng, n, v: draw_config(rng, n),
    ),
    Family(
        "records",
        "records",
        "a list of dicts with the same 3-8 keys (tensors, ints, floats, strs, bools)",
        ((10, ""), (100, ""), (1000, ""), (10000, "")),
        1,
        lambda rng, n, v: draw_records(rng, n),
    ),
    Family(
        "chain",
        "deep",
        "lists and dicts nested alternately, 1-3 leaves beside each level's child",
        ((10, ""), (50, ""), (200, "")),
        1,
        lambda rng, n, v: draw_chain(rng, n),
    ),
    Family(
        "wide",
        "leaves",
        "one list of leaves: tensors, floats, ints",
        ((100, ""), (1000, ""), (10000, ""), (100000, "")),
        2,
        lambda rng, n, v: draw_wide(rng, n),
    ),
    Family(
        "dataclass",
        "items",
        "a dataclass batch: items of three dataclasses (plain, frozen, slots), "
        "a meta dataclass, a dict of extras",
        ((4, ""), (64, ""), (512, "")),
        1,
        lambda rng, n, v: draw_dataclass(rng, n),
    ),
    Family(
        "attrs",
        "items",
        "the dataclass family's batch made of attrs classes (define, frozen, dict-based)",
        ((4, ""), (64, ""), (512, "")),
        1,
        lambda rng, n, v: draw_attrs(rng, n),
        requires="attrs",
    ),
    Family(
        "namedtuple",
        "items",
        "the dataclass family's batch made of namedtuples (collections and typing)",
        ((4, ""), (64, ""), (512, "")),
        1,
        lambda rng, n, v: draw_namedtuple(rng, n),
    ),
    Family(
        "modeloutput",
        "layers",
        "a transformers-style ModelOutput (a dataclass that is an OrderedDict): loss, "
        "logits, past_key_values, hidden_states, attentions, some None",
        ((2, ""), (12, ""), (48, "")),
        1,
        lambda rng, n, v: draw_modeloutput(rng, n),
    ),
    Family(
        "none",
        "steps",
        "a list of step outputs (dicts) with None among the values, and (tensor, None) pairs",
        ((10, ""), (100, ""), (1000, "")),
        1,
        lambda rng, n, v: draw_none(rng, n),
    ),
    Family(
        "mixed_keys",
        "classes",
        "per-class metrics keyed by int (shuffled), thresholds keyed by ints and floats, "
        "a confusion dict keyed by tuples; one tree adds str keys to the int ones",
        ((10, ""), (100, ""), (100, "int+str keys"), (1000, "")),
        1,
        lambda rng, n, v: draw_mixed_keys(rng, n, unsortable=bool(v)),
    ),
    Family(
        "named",
        "leaves",
        "the six trees of `corpus.py compare`, as they are (not drawn)",
        tuple((0, c.key) for c in TREES),
        5,
        lambda rng, n, v: _named_draw(rng, n, v),
    ),
)

#: Known causes of a library's leaving a family's trees (the cell is n/a).
KNOWN_CAUSES: dict[tuple[str, str], str] = {}
for _fam in ("config", "optimizer", "none"):
    for _peer in ("torch.utils._pytree", "torch.utils._cxx_pytree", "dm-tree"):
        KNOWN_CAUSES[_peer, _fam] = (
            "None is a leaf there (in pytree_kit, jax and optree it is a node with no children)"
        )
KNOWN_CAUSES["dm-tree", "dataclass"] = "dm-tree has no registration: a dataclass is one leaf"
KNOWN_CAUSES["dm-tree", "named"] = "dm-tree has no registration: a dataclass is one leaf"
for _peer in ("jax.tree_util", "dm-tree"):
    KNOWN_CAUSES[_peer, "mixed_keys"] = (
        "it cannot sort a dict's int and str keys together and raises (pytree_kit falls "
        "back to insertion order, optree to its total order, torch never sorts)"
    )


@dataclasses.dataclass
class Drawn:
    family: str
    size: int
    variant: str
    unit: str
    tree: Any

    @property
    def tree_id(self) -> str:
        return f"{self.family}:{self.size}:{self.variant}"

    @property
    def label(self) -> str:
        if self.family == "named":
            return next(c.label for c in TREES if c.key == self.variant)
        text = f"{self.size:,} {self.unit}"
        return f"{text}, {self.variant}" if self.variant else text


def corpus_points(families: list[Family], quick: bool) -> list[tuple[Family, int, str]]:
    """The (family, size, variant) points to draw; each tree is drawn when timed."""
    out = []
    for fam in families:
        points = fam.points[: fam.quick] if quick else fam.points
        for size, variant in points:
            if fam.name == "named" and quick:
                if next(c for c in TREES if c.key == variant).big:
                    continue
            out.append((fam, size, variant))
    return out


def draw_one(fam: Family, size: int, variant: str, seed: int) -> Drawn:
    rng = random.Random(f"{seed}:{fam.name}:{size}:{variant}")
    tree = fam.draw(rng, size, variant)
    if fam.name == "named":
        size = len(_pure.leaves(tree, None, None))
    return Drawn(fam.name, size, variant, fam.unit, tree)


# --------------------------------------------------------------------------
# Registering the record classes with the peers (pytree_kit needs nothing)


def _fields_of(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _dc_flatten(obj: Any) -> tuple[list, Any]:
    return [getattr(obj, n) for n in _fields_of(type(obj))], None


def _dc_unflatten_aux_first(cls: type, aux: Any, children: Any) -> Any:
    return cls(*children)


def _dc_unflatten_children_first(cls: type, children: Any, aux: Any) -> Any:
    return cls(*children)


def _attrs_flatten(obj: Any) -> tuple[list, Any]:
    return [getattr(obj, a.name) for a in type(obj).__attrs_attrs__], None


def _mo_flatten(obj: Any) -> tuple[list, Any]:
    """The set fields (the dict's entries), as transformers registers ModelOutput."""
    return list(obj.values()), list(obj.keys())


def _mo_flatten_optree(obj: Any) -> tuple[list, Any]:
    return list(obj.values()), tuple(obj.keys())


def _mo_unflatten_aux_first(cls: type, keys: Any, children: Any) -> Any:
    return cls(**dict(zip(keys, children)))


def _mo_unflatten_children_first(cls: type, children: Any, keys: Any) -> Any:
    return cls(**dict(zip(keys, children)))


def register_with_peers(libs: list[Lib]) -> None:
    """Registers the named trees' dataclasses and this corpus's dataclasses,
    attrs classes and ModelOutput class with every peer loaded: jax
    ``register_dataclass`` (the ModelOutput class with ``register_pytree_node``),
    optree ``register_pytree_node`` in a namespace of its own (``OPTREE_NS``),
    torch ``register_pytree_node``, which also registers the class with
    ``_cxx_pytree`` (in optree's ``torch`` namespace) when that module has been
    imported, so it is imported first. The ModelOutput class flattens to its set
    fields, as transformers registers it with torch. dm-tree has no registration."""
    names = {lib.name for lib in libs if lib.peer}
    dcs = NAMED_DATACLASSES + DATACLASSES
    records = [(cls, _fields_of(cls), _dc_flatten) for cls in dcs]
    records += [(cls, _record_fields(cls), _attrs_flatten) for cls in ATTRS_CLASSES]
    mo = CausalLMOutput
    if "jax.tree_util" in names:
        import jax.tree_util as jtu

        for cls, fields, _ in records:
            jtu.register_dataclass(cls, data_fields=fields, meta_fields=[])
        jtu.register_pytree_node(
            mo, _mo_flatten_optree, functools.partial(_mo_unflatten_aux_first, mo)
        )
    if "optree" in names:
        import optree

        for cls, _, flat in records:
            optree.register_pytree_node(
                cls, flat, functools.partial(_dc_unflatten_aux_first, cls), namespace=OPTREE_NS
            )
        optree.register_pytree_node(
            mo,
            _mo_flatten_optree,
            functools.partial(_mo_unflatten_aux_first, mo),
            namespace=OPTREE_NS,
        )
    if names & {"torch.utils._pytree", "torch.utils._cxx_pytree"}:
        import torch.utils._pytree as tp

        try:
            import torch.utils._cxx_pytree  # noqa: F401
        except Exception:
            pass
        for cls, _, flat in records:
            tp.register_pytree_node(cls, flat, functools.partial(_dc_unflatten_children_first, cls))
        tp.register_pytree_node(
            mo, _mo_flatten, functools.partial(_mo_unflatten_children_first, mo)
        )


# --------------------------------------------------------------------------
# Timing (the corpus and compare alike)


Cells = dict[tuple[str, str, str], Any]


def checked_calls(
    libs: list[Lib], tree: Any, na: dict[str, str], failed: str
) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    """(the tree's leaves by pytree_kit's pure engine, each library's calls on
    it, the libraries that take no part): a library named in ``na`` (its cells
    are the reason) or that fails :func:`_calls_checked` (its cells are
    ``failed``; the exception is kept) takes no part, in library order."""
    expected = len(_pure.leaves(tree, None, None))
    calls: dict[str, dict[str, Any]] = {}
    left_out: dict[str, Any] = {}
    for lib in libs:
        if lib.name in na:
            calls[lib.name] = dict.fromkeys(OPS, na[lib.name])
            left_out[lib.name] = na[lib.name]
            continue
        try:
            calls[lib.name] = _calls_checked(lib, tree, expected)
        except Exception as exc:
            calls[lib.name] = dict.fromkeys(OPS, failed)
            left_out[lib.name] = exc
    return expected, calls, left_out


def time_calls(
    libs: list[Lib],
    calls: dict[str, dict[str, Any]],
    tid: str,
    where: str,
    min_time: float,
    repeats: int,
    cells: Cells,
    notes: list[str],
    every_up_to: bool = False,
    floor_of: int = 0,
) -> Any:
    """Times each operation of one tree (``tid``), every library's call in the
    same interleaved rounds, into ``cells[library, tid, op]``; a call that fails
    there gets a note (on ``where``). flatten_up_to is timed for pytree_kit's
    engines only (``every_up_to``: every library), each one's flatten again in
    its rounds (cells of the op ``SAME_ROUNDS``). ``floor_of``: the floor, a copy
    of a list of as many references, timed in the rounds of leaves() and
    returned (else None)."""
    floor = None
    prebuilt = list(range(floor_of))
    for op in OPS:
        timed = libs if every_up_to or op != "flatten_up_to" else [x for x in libs if not x.peer]
        fns: dict[str, Callable[[], Any]] = {}
        for lib in timed:
            fn = calls[lib.name][op]
            if isinstance(fn, str):
                cells[lib.name, tid, op] = fn
            else:
                fns[lib.name] = fn
        if op == "leaves" and floor_of:
            fns[FLOOR] = prebuilt.copy
        again: dict[str, str] = {}
        if op == "flatten_up_to":
            for lib in libs:
                flat = calls[lib.name]["flatten"]
                if not lib.peer and not isinstance(flat, str):
                    again[f"{lib.name}: {SAME_ROUNDS}"] = lib.name
                    fns[f"{lib.name}: {SAME_ROUNDS}"] = flat
        for name, v in measure_many(fns, min_time, repeats).items():
            if name == FLOOR:
                floor = v
            elif name in again:
                cells[again[name], tid, SAME_ROUNDS] = v
            else:
                cells[name, tid, op] = v
                if isinstance(v, str):
                    notes.append(f"**{name}** {op} on {where}: {v}")
    return floor


def _drop(name: str, drawn: Drawn, why: Any) -> dict[str, Any]:
    return {
        "library": name,
        "family": drawn.family,
        "tree": drawn.label,
        "reason": why if isinstance(why, str) else f"{type(why).__name__}: {why}",
        "cause": KNOWN_CAUSES.get((name, drawn.family)),
    }


# --------------------------------------------------------------------------
# The corpus's figures


def op_figures(libs: list[Lib], ours: Lib, cells: Cells, tid: str, ops: Any) -> dict[str, Any]:
    """``ours``' figures on one tree: per op, its µs, the fastest peer's and the speedup."""
    out: dict[str, Any] = {}
    for op in ops:
        v = cells.get((ours.name, tid, op))
        best = best_peer(libs, cells, tid, op)
        if isinstance(v, float) and best is not None:
            out[op] = {
                "us": v * 1e6,
                "fastest_peer": best[0],
                "peer_us": best[1] * 1e6,
                "speedup": best[1] / v,
            }
    return out


def tree_figures(libs: list[Lib], ours: Lib, cells: Cells, tid: str) -> dict[str, Any]:
    """pytree_kit's figures on one tree: per op, its µs, the fastest peer and the
    speedup; flatten_up_to against its own flatten in the same rounds."""
    out = op_figures(libs, ours, cells, tid, PEER_OPS)
    up = cells.get((ours.name, tid, "flatten_up_to"))
    flat = cells.get((ours.name, tid, SAME_ROUNDS))
    if isinstance(up, float) and isinstance(flat, float):
        out["flatten_up_to"] = {"us": up * 1e6, "flatten_us": flat * 1e6, "speedup": flat / up}
    return out


def family_figures(trees: list[dict[str, Any]], family: str) -> dict[str, Any]:
    """Per op: the worst and the median speedup over the family's trees, and the worst's tree."""
    out: dict[str, Any] = {}
    mine = [t for t in trees if t["family"] == family]
    for op in OPS:
        cells = [(t["ops"][op]["speedup"], t) for t in mine if op in t["ops"]]
        if not cells:
            out[op] = None
            continue
        worst, tree = min(cells, key=lambda c: c[0])
        out[op] = {
            "worst": worst,
            "worst_tree": tree["label"],
            "worst_size": tree["size"],
            "worst_peer": tree["ops"][op].get("fastest_peer"),
            "median": statistics.median(c[0] for c in cells),
            "trees": len(cells),
            "target": TARGETS[op],
            "met": worst >= TARGETS[op],
        }
    return out


# --------------------------------------------------------------------------
# The report


@dataclasses.dataclass
class Run:
    """What every report of a run says: its command's arguments, libraries,
    timing, notes, pytree_kit's revision and how long it took."""

    argv: list[str]
    libs: list[Lib]
    settings: Settings
    notes: list[str]
    revision: str
    elapsed: float = 0.0

    def head(self, title: str, command: str, what: str, quick: str) -> list[str]:
        """The report's title, command, run line and machine lines."""
        return [
            f"# pytree_kit: {title}",
            "",
            "`" + " ".join([f"python benchmarks/{command}", *self.argv]) + "`",
            f"run on {time.strftime('%Y-%m-%d %H:%M')}, in one process, "
            f"{self.elapsed:.0f} s in all{what}"
            + (
                f" (**--quick**: smoke mode, {quick}numbers are rough)"
                if self.settings.quick
                else ""
            )
            + ".",
            "",
            "## Machine and versions",
            "",
            *machine_lines(self.libs, self.revision),
        ]

    def info(self, engine: Optional[str]) -> dict[str, Any]:
        """The figures' first entries: the Python, pytree_kit and the peers."""
        return {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "pytree_kit": self.revision,
            "engine": engine,
            "engine_info": pk.engine_info(),
            "peers": {x.name: x.version for x in self.libs if x.peer},
        }


def _worst_cell(fig: Optional[dict[str, Any]], with_judgement: bool = True) -> str:
    if fig is None:
        return "-"
    peer = f"{_initial(fig['worst_peer'])}, " if fig["worst_peer"] else ""
    text = f"{fig['worst']:.2f}{X} ({peer}{fig['worst_tree']})"
    if with_judgement:
        text += " met" if fig["met"] else " **MISSED**"
    return text


def render(
    run: Run,
    ours: Lib,
    seed: int,
    families: list[Family],
    figures: dict[str, Any],
    trees: list[dict[str, Any]],
    dropped: list[dict[str, Any]],
) -> str:
    settings = run.settings
    peers = [lib for lib in run.libs if lib.peer]
    legend = ", ".join(f"{_initial(p.name)} {p.name}" for p in peers) or "none"
    what = f", seed {seed}, {len(trees)} trees"
    lines = [
        *run.head("corpus speed benchmark", "corpus.py", what, "the smallest sizes only; "),
        f"- Leaves: {leaf_pool()[0]}, 16 distinct ones shared across the trees, and the "
        "Python ints, floats, strs and bools of the families that have them.",
        f"- Timing: median of {settings.repeats} interleaved loops per cell, each of at "
        f"least {settings.min_time * 1e3:g} ms after a warm-up call (`_peers.py`'s "
        "`measure_many`); gc enabled, `gc.freeze()` after the imports.",
        "",
        "## How to read",
        "",
        f"speedup = the fastest peer's median / **{ours.name}**'s median, through the "
        f"public API (`pk.ENGINE` = `{pk.ENGINE}`), on one tree and operation: above "
        f"1{X} is faster than every peer. flatten_up_to is pytree_kit's own flatten time "
        "/ its flatten_up_to time, timed in the same rounds. A family's **worst** cell names "
        "the fastest peer's initial and the tree; its targets are met when the worst "
        f"reaches them. Peers: {legend}. A library that sees another number of leaves "
        "than pytree_kit, or errors, takes no part in that tree (see *Libraries left out*).",
        "",
        "Targets: "
        + ", ".join(
            f"{op} >= {goal:g}{X}" + (" own flatten" if op == "flatten_up_to" else " fastest peer")
            for op, goal in TARGETS.items()
        )
        + ".",
        "",
        "## Worst ratio per family",
        "",
    ]
    rows = []
    met = total = 0
    for fam in families:
        if fam.name not in figures:
            continue
        row = [fam.name]
        for op in OPS:
            fig = figures[fam.name].get(op)
            row.append(_worst_cell(fig))
            if fig is not None:
                total += 1
                met += fig["met"]
        rows.append(row)
    lines += _table(["family", *OPS], rows)
    lines += ["", f"Targets met on {met} of {total} family and operation cells.", ""]
    lines += ["## Median ratio per family", ""]
    rows = []
    for fam in families:
        if fam.name not in figures:
            continue
        row = [fam.name]
        for op in OPS:
            fig = figures[fam.name].get(op)
            row.append("-" if fig is None else f"{fig['median']:.2f}{X} of {fig['trees']}")
        rows.append(row)
    lines += _table(["family", *OPS], rows)
    lines += ["", "## Per tree", ""]
    lines += [
        "Each cell: speedup and the fastest peer's initial; flatten_up_to: against "
        "pytree_kit's own flatten. *left out*: the peers that took no part in that tree.",
        "",
    ]
    rows = []
    for t in trees:
        row = [t["family"], t["label"], f"{t['leaves']:,}"]
        for op in OPS:
            fig = t["ops"].get(op)
            if fig is None:
                row.append("-")
            elif op == "flatten_up_to":
                row.append(f"{fig['speedup']:.2f}{X}")
            else:
                row.append(f"{fig['speedup']:.2f}{X} {_initial(fig['fastest_peer'])}")
        row.append(", ".join(_initial(n) for n in t["left_out"]) or "-")
        rows.append(row)
    lines += _table(["family", "size", "leaves", *OPS, "left out"], rows)
    lines += ["", "## Families", ""]
    rows = []
    for fam in families:
        sizes = [Drawn(fam.name, s, v, fam.unit, None).label for s, v in fam.points]
        if fam.name == "named":
            sizes = [c.label.split(" ")[0] for c in TREES]
        rows.append([fam.name, fam.what, "; ".join(sizes)])
    lines += _table(["family", "what", "sizes (--quick: the first)"], rows)
    lines += ["", "## Libraries left out", ""]
    if dropped:
        # one row per family and cause (an unexplained one per message)
        groups: dict[tuple[str, str], dict[str, Any]] = {}
        for d in dropped:
            cause = d["cause"] or "**unexplained**: " + d["reason"]
            group = groups.setdefault((d["family"], cause), {"libs": {}, "trees": {}})
            group["libs"][d["library"]] = None
            group["trees"].setdefault(d["tree"], d["reason"])
        rows = []
        for (family, cause), group in groups.items():
            first, reason = next(iter(group["trees"].items()))
            rows.append(
                [
                    family,
                    ", ".join(group["libs"]),
                    "; ".join(group["trees"]),
                    f"{first}: {reason}".replace("|", "/"),
                    cause,
                ]
            )
        lines += _table(["family", "left out", "trees", "what happened, first tree", "cause"], rows)
    else:
        lines.append("None: every library took part in every tree.")
    lines.append("")
    if run.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in run.notes], ""]
    return "\n".join(lines).rstrip() + "\n"


def summary(
    run: Run,
    ours: Lib,
    seed: int,
    figures: dict[str, Any],
    trees: list[dict[str, Any]],
    dropped: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        **run.info(ours.name),
        "seed": seed,
        "quick": run.settings.quick,
        "min_time": run.settings.min_time,
        "repeats": run.settings.repeats,
        "leaves": leaf_pool()[0],
        "elapsed_s": run.elapsed,
        "targets": TARGETS,
        "families": figures,
        "trees": trees,
        "left_out": dropped,
        "notes": run.notes,
    }


# --------------------------------------------------------------------------
# compare: the six named trees through every engine and peer, the floor, scaling


def run_compare(
    libs: list[Lib], settings: Settings, notes: list[str], log: Callable[[str], None]
) -> tuple[Cells, dict[str, int], dict[str, float]]:
    """Times every (library, named tree, operation); returns the cells, leaf counts
    and floors (each tree's floor timed in the same rounds as leaves(), and
    pytree_kit's flatten again in those of flatten_up_to)."""
    cells: Cells = {}
    counts: dict[str, int] = {}
    floor: dict[str, float] = {}
    for case in TREES:
        if case.big and settings.quick:
            for lib in libs:
                for op in OPS:
                    cells[lib.name, case.key, op] = "skipped (--quick)"
            continue
        na = {lib.name: lib.na[case.key] for lib in libs if case.key in lib.na}
        n, calls, left_out = checked_calls(libs, case.make(), na, "error")
        counts[case.key] = n
        for name, why in left_out.items():
            if not isinstance(why, str):
                notes.append(f"**{name}** on {case.label}: {why!r}; not timed.")
        repeats = settings.big_repeats if case.big else settings.repeats
        floor[case.key] = time_calls(
            libs, calls, case.key, case.label, settings.min_time, repeats, cells, notes, True, n
        )
        log(f"{case.label} done")
    return cells, counts, floor


def scaling_tree(n: int) -> Any:
    """``n`` leaves as a list of ``n // 10`` dicts of 10 ints."""
    return [{f"k{j}": j for j in range(10)} for _ in range(n // 10)]


def run_scaling(
    libs: list[Lib], settings: Settings, log: Callable[[str], None]
) -> dict[tuple[str, str, int], float]:
    """Nanoseconds per leaf of flatten and leaves at each size (and the list-copy floor)."""
    keep = [lib for lib in libs if not lib.peer or lib.name in ("jax.tree_util", "optree")]
    out: dict[tuple[str, str, int], float] = {}
    for n in settings.scaling_sizes:
        tree = scaling_tree(n)
        prebuilt = list(range(n))
        repeats = settings.scaling_repeats if n >= 10**5 else settings.repeats
        fns: dict[tuple[str, str], Callable[[], Any]] = {}
        for lib in keep:
            calls = lib.calls(tree, lib.structure(tree), [])
            for op in ("flatten", "leaves"):
                fn = calls[op]
                if not isinstance(fn, str):
                    fns[lib.name, op] = fn
        fns[FLOOR, "leaves"] = prebuilt.copy
        for (name, op), v in measure_many(fns, settings.min_time, repeats).items():
            if isinstance(v, float):
                out[name, op, n] = v * 1e9 / n
        del tree, prebuilt, fns, calls
        log(f"scaling 10^{len(str(n)) - 1} done")
    return out


def op_table(libs: list[Lib], cells: dict[tuple[str, str, str], Any], op: str) -> list[str]:
    header = ["tree", *[lib.name for lib in libs], "fastest peer"]
    rows = []
    for case in TREES:
        best = best_peer(libs, cells, case.key, op)
        row = [case.label]
        for lib in libs:
            v = cells[lib.name, case.key, op]
            if isinstance(v, float):
                text = _fmt_us(v)
                if best is not None:
                    text += f" ({best[1] / v:.2f}{X})"
                row.append(text)
            else:
                row.append(v)
        row.append(best[0] if best else "-")
        rows.append(row)
    return _table(header, rows)


def floor_table(
    libs: list[Lib],
    cells: dict[tuple[str, str, str], Any],
    counts: dict[str, int],
    floor: dict[str, float],
) -> list[str]:
    header = ["tree", "leaves", "floor µs", *[lib.name for lib in libs]]
    rows = []
    for case in TREES:
        if case.key not in floor:
            rows.append([case.label, "-", "skipped (--quick)", *["-" for _ in libs]])
            continue
        row = [case.label, f"{counts[case.key]:,}", _fmt_us(floor[case.key])]
        for lib in libs:
            v = cells[lib.name, case.key, "leaves"]
            row.append(f"{v / floor[case.key]:.1f}{X}" if isinstance(v, float) else v)
        rows.append(row)
    return _table(header, rows)


def up_to_table(libs: list[Lib], cells: dict[tuple[str, str, str], Any]) -> list[str]:
    ours = [lib for lib in libs if not lib.peer]
    rows = []
    for case in TREES:
        row = [case.label]
        for lib in ours:
            up = cells.get((lib.name, case.key, "flatten_up_to"))
            flat = cells.get((lib.name, case.key, SAME_ROUNDS))
            if isinstance(up, float) and isinstance(flat, float):
                row.append(f"{_fmt_us(up)} / {_fmt_us(flat)} ({flat / up:.2f}{X})")
            else:
                row.append("-")
        rows.append(row)
    return _table(["tree", *[lib.name for lib in ours]], rows)


#: The named trees' speed targets, checked on the C engine (the pure one where no C is built).
COMPARE_TARGETS = (
    ("flatten", "speedup", 2.0),
    ("unflatten", "speedup", 1.5),
    ("tree_map", "speedup", 1.5),
    ("leaves", "floor", 1.3),
    ("flatten_up_to", "vs flatten", 1.5),
)


def targets_table(
    libs: list[Lib], cells: dict[tuple[str, str, str], Any], floor: dict[str, float]
) -> list[str]:
    """Each target, per tree, for the fastest pytree_kit engine: met or missed."""
    lib = _fastest_engine(libs)
    if lib is None:
        return ["No pytree_kit engine was timed."]
    header = ["target", *[c.label for c in TREES]]
    rows = []
    for op, kind, goal in COMPARE_TARGETS:
        if kind == "speedup":
            label = f"{op}: at least {goal:g}{X} faster than the fastest peer"
        elif kind == "floor":
            label = f"leaves(): within {goal:g}{X} of the list-copy floor"
        else:
            label = f"flatten_up_to: at least {goal:g}{X} faster than flatten"
        row = [label]
        for case in TREES:
            v = cells.get((lib.name, case.key, op))
            if not isinstance(v, float):
                row.append("-")
                continue
            if kind == "speedup":
                best = best_peer(libs, cells, case.key, op)
                ratio = best[1] / v if best else None
                ok = ratio is not None and ratio >= goal
            elif kind == "floor":
                ratio = v / floor[case.key] if case.key in floor else None
                ok = ratio is not None and ratio <= goal
            else:
                flat = cells.get((lib.name, case.key, SAME_ROUNDS))
                ratio = flat / v if isinstance(flat, float) else None
                ok = ratio is not None and ratio >= goal
            row.append("-" if ratio is None else f"{ratio:.2f}{X} {'met' if ok else 'MISSED'}")
        rows.append(row)
    return [
        f"For **{lib.name}**, from the tables above. The flatten_up_to row divides by "
        "pytree_kit's flatten timed again in the same interleaved rounds as flatten_up_to "
        "(as leaves() and its floor share rounds), so that a drift of the machine's speed "
        "between the two operations' rounds does not decide it.",
        "",
        *_table(header, rows),
    ]


def scaling_tables(scaling: dict[tuple[str, str, int], float], sizes: tuple[int, ...]) -> list[str]:
    out: list[str] = []
    for op in ("flatten", "leaves"):
        names = list(dict.fromkeys(name for name, o, _ in scaling if o == op))
        out.append(f"**{op}**, ns per leaf:")
        out.append("")
        rows = []
        for n in sizes:
            row = [f"{n:,}"]
            for name in names:
                v = scaling.get((name, op, n))
                row.append(f"{v:.1f}" if v is not None else "-")
            rows.append(row)
        out += _table(["leaves", *names], rows)
        out.append("")
    return out


def render_compare(
    run: Run,
    cells: Cells,
    counts: dict[str, int],
    floor: dict[str, float],
    scaling: dict[tuple[str, str, int], float],
) -> str:
    libs, settings = run.libs, run.settings
    peers = [lib.name for lib in libs if lib.peer]
    lines = [
        *run.head("side-by-side speed benchmark", "corpus.py compare", "", ""),
        f"- Timing: median of {settings.repeats} repeats ({settings.big_repeats} for tree (f)); "
        f"each repeat loops the call for at least {settings.min_time * 1e3:g} ms "
        "(autorange 1, 2, 5, 10, ...), after a warm-up call; the libraries' loops "
        "interleaved round by round; gc enabled, with `gc.freeze()` after the imports "
        "and `gc.collect()` before each loop.",
        "",
        "## How to read",
        "",
        f"Each cell is `median µs per call (speedup{X})`, with **speedup = fastest peer's "
        f"median / this median** for that tree and operation: above 1{X} is faster than the "
        f"best peer, 1.00{X} is that best peer, 0.50{X} takes twice its time. "
        f"Peers: {', '.join(peers) if peers else 'none'}. The active pytree_kit engine "
        f"(`{pk.ENGINE}`) is timed through the public API (`pk.flatten(tree)`, "
        "`pk.unflatten(spec, leaves)`, `pk.leaves(tree)`, `pk.tree_map(f, tree)`, "
        "`spec.flatten_up_to(tree)`), as users call it; the other engine is called directly.",
        "",
        "Not comparable, so not timed: dm-tree has no spec object (its `flatten` is the "
        "`leaves` row; its `unflatten` is `unflatten_as(tree, leaves)` and its "
        "`flatten_up_to` is `flatten_up_to(tree, tree)`), and it has no registration, so "
        "it treats the dataclasses of (e) as single leaves. The peers get the dataclasses "
        "registered (jax `register_dataclass`, optree `register_pytree_node` in a "
        "namespace, torch `register_pytree_node`, which also registers with _cxx_pytree); "
        "pytree_kit needs nothing.",
        "",
        "## Trees",
        "",
        *_table(
            ["tree", "leaves", "what"],
            [
                [
                    c.label,
                    f"{counts[c.key]:,}" if c.key in counts else "skipped (--quick)",
                    TREE_DESCRIPTIONS[c.key],
                ]
                for c in TREES
            ],
        ),
        "",
    ]
    lines += ["## Targets", "", *targets_table(libs, cells, floor), ""]
    for op in OPS:
        lines += [f"## {op}", "", *op_table(libs, cells, op), ""]
    lines += [
        "## flatten_up_to against flatten",
        "",
        "pytree_kit's flatten_up_to and its flatten timed again in the same interleaved "
        f"rounds: each cell is `flatten_up_to µs / flatten µs (speedup{X})`, with "
        "speedup = flatten's time / flatten_up_to's (higher is better).",
        "",
        *up_to_table(libs, cells),
        "",
        "## leaves() against the floor",
        "",
        "The floor is the time to copy as many references into a new list "
        "(`prebuilt_list.copy()`, len = the number of leaves); each cell is "
        f"**leaves() time / floor** (lower is better, 1{X} is the floor).",
        "",
        *floor_table(libs, cells, counts, floor),
        "",
        "## Scaling",
        "",
        "A list of n/10 dicts of 10 ints; nanoseconds per leaf of one call (median of "
        f"{settings.repeats} loops, {settings.scaling_repeats} from 10^5 leaves up; "
        "the libraries interleaved as above). "
        "`list copy (floor)` is the floor above at that size.",
        "",
        *scaling_tables(scaling, settings.scaling_sizes),
    ]
    if run.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in run.notes], ""]
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------
# The charts


def _colors(libs: list[Lib]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {lib.name: cmap(i % 10) for i, lib in enumerate(libs)}


def _tick_label(v: float, _pos: Any) -> str:
    """Log-axis tick labels as plain numbers, only at 1, 2 and 5 of each decade."""
    if v <= 0:
        return ""
    lead = round(v / 10 ** math.floor(math.log10(v) + 1e-9))
    return f"{v:g}" if lead in (1, 2, 5) else ""


def _log_y(ax: Any) -> None:
    """A log y axis, its ticks labelled as plain numbers (:func:`_tick_label`)."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_tick_label))
    ax.yaxis.set_minor_formatter(FuncFormatter(_tick_label))
    ax.tick_params(axis="y", which="both", labelsize=7)


def plot_compare(
    libs: list[Lib],
    cells: dict[tuple[str, str, str], Any],
    counts: dict[str, int],
    floor: dict[str, float],
    path: Path,
) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = _colors(libs)
    trees = [c for c in TREES if c.key in counts]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    width = 0.8 / max(len(libs), 1)
    panels: list[tuple[str, str]] = [(op, op) for op in OPS]
    panels.append(("floor", "leaves: multiple of the list-copy floor (lower is better)"))
    for ax, (op, title) in zip(axes.flat, panels):
        for i, lib in enumerate(libs):
            xs, ys = [], []
            for j, case in enumerate(trees):
                v = cells[lib.name, case.key, "leaves" if op == "floor" else op]
                if not isinstance(v, float):
                    continue
                if op == "floor":
                    ys.append(v / floor[case.key])
                else:
                    best = best_peer(libs, cells, case.key, op)
                    if best is None:
                        continue
                    ys.append(best[1] / v)
                xs.append(j + (i - (len(libs) - 1) / 2) * width)
            ax.bar(xs, ys, width, color=colors[lib.name], label=lib.name)
        _log_y(ax)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(trees)))
        ax.set_xticklabels([c.label.split(")")[0] + ")" for c in trees])
        ax.set_title(title if op == "floor" else f"{title}: speedup vs fastest peer")
        ax.grid(axis="y", which="both", alpha=0.3)
    handles = [Patch(color=colors[lib.name], label=lib.name) for lib in libs]
    fig.legend(handles=handles, loc="lower center", ncol=len(libs), fontsize=9)
    fig.suptitle(
        "pytree_kit vs peers: speedup = fastest peer time / time (>1 is faster); "
        + ", ".join(c.label for c in trees),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_scaling(
    libs: list[Lib], scaling: dict[tuple[str, str, int], float], sizes: tuple[int, ...], path: Path
) -> None:
    import matplotlib.pyplot as plt

    colors = _colors(libs)
    colors[FLOOR] = "gray"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, op in zip(axes, ("flatten", "leaves")):
        names = list(dict.fromkeys(name for name, o, _ in scaling if o == op))
        for name in names:
            pts = [(n, scaling[name, op, n]) for n in sizes if (name, op, n) in scaling]
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                color=colors.get(name),
                linestyle="--" if name.startswith("list copy") else "-",
                label=name,
            )
        ax.set_xscale("log")
        _log_y(ax)
        ax.set_xlabel("leaves (a list of dicts of 10)")
        ax.set_ylabel("ns per leaf")
        ax.set_title(f"{op}: ns per leaf")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _fastest_engine(libs: list[Lib]) -> Optional[Lib]:
    """pytree_kit's C engine where it is built, else its pure one."""
    ours = [lib for lib in libs if not lib.peer]
    return next((x for x in ours if x.name.endswith("(c)")), ours[0] if ours else None)


def compare_summary(run: Run, cells: Cells, floor: dict[str, float]) -> Any:
    """The figures of the fastest pytree_kit engine, for compare.json: per
    operation and tree, its µs, the fastest peer and its µs, and the speedup;
    leaves() against its floor; flatten_up_to against flatten in the same rounds."""
    libs = run.libs
    lib = _fastest_engine(libs)
    out: dict[str, Any] = {
        **run.info(lib.name if lib else None),
        "trees": {c.key: c.label for c in TREES},
        "ops": {},
        "leaves_floor": {},
        "flatten_up_to_vs_flatten": {},
    }
    if lib is None:
        return out
    figures = {c.key: op_figures(libs, lib, cells, c.key, OPS) for c in TREES}
    out["ops"] = {op: {k: f[op] for k, f in figures.items() if op in f} for op in OPS}
    for case in TREES:
        v = cells.get((lib.name, case.key, "leaves"))
        if isinstance(v, float) and case.key in floor:
            out["leaves_floor"][case.key] = v / floor[case.key]
        up = cells.get((lib.name, case.key, "flatten_up_to"))
        flat = cells.get((lib.name, case.key, SAME_ROUNDS))
        if isinstance(up, float) and isinstance(flat, float):
            out["flatten_up_to_vs_flatten"][case.key] = flat / up
    return out


# --------------------------------------------------------------------------
# versions: the recorded runs of every Python on one page


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.name))


def render_versions(runs: list[dict]) -> str:
    """The page of compare's recorded runs, one table per version."""
    lines = [
        "# The C engine on every supported Python",
        "",
        "`python benchmarks/corpus.py versions`, from the runs of `corpus.py compare` in",
        "`benchmarks/results/python3.X/` (each one's `compare.md` has every library's",
        "µs, the machine and the peers' versions). Each cell is the speedup of pytree_kit's",
        "C engine against the fastest peer on that tree and operation, with that peer's",
        "initial (j jax.tree_util, o optree, t torch.utils._pytree, c torch.utils._cxx_pytree,",
        f"d dm-tree); below 1{X} is slower than it.",
        "torch is installed for 3.11 only on this machine, so the other versions have",
        "no torch columns.",
        "",
    ]
    rows = []
    for op in PEER_OPS:
        row = [op]
        for run in runs:
            cells = run["ops"].get(op, {})
            if not cells:
                row.append("-")
                continue
            key = min(cells, key=lambda k: cells[k]["speedup"])
            row.append(f"{cells[key]['speedup']:.2f}{X} {run['trees'][key].split(' ')[0]}")
        rows.append(row)
    header = ["worst speedup over the trees", *(f"Python {r['python']}" for r in runs)]
    lines += ["## Worst case per operation", "", *_table(header, rows), ""]
    behind = []
    for run in runs:
        info = run["engine_info"]
        on = [k for k, v in info["fast_paths"].items() if v] or ["none"]
        peers = ", ".join(f"{k} {v}" for k, v in run["peers"].items())
        lines += [
            f"## Python {run['python']}",
            "",
            f"pytree_kit {run['pytree_kit']}, engine `{info['engine']}`, fast paths on: "
            f"{', '.join(on)}. Peers: {peers}.",
            "",
        ]
        trees = run["trees"]
        rows = []
        for op in PEER_OPS:
            row = [op]
            for key in trees:
                cell = run["ops"].get(op, {}).get(key)
                if cell is None:
                    row.append("-")
                    continue
                row.append(f"{cell['speedup']:.2f}{X} ({_initial(cell['fastest_peer'])})")
                if cell["speedup"] < 1.0:
                    behind.append(
                        f"Python {run['python']}, {op} on {trees[key]}: "
                        f"{cell['speedup']:.2f}{X} ({cell['us']:.3g} µs against "
                        f"{cell['fastest_peer']}'s {cell['peer_us']:.3g} µs)"
                    )
            rows.append(row)
        vs = run["flatten_up_to_vs_flatten"]
        rows.append(
            ["flatten_up_to / flatten", *(f"{vs[k]:.2f}{X}" if k in vs else "-" for k in trees)]
        )
        lines += [*_table(["op", *trees.values()], rows), ""]
    lines += ["## Where the C engine is behind the fastest peer", ""]
    lines += [f"- {b}" for b in behind] or [f"Nowhere: every cell above is at least 1{X}."]
    return "\n".join(lines) + "\n"


def render_versions_corpus(runs: list[dict]) -> str:
    """The page's section of the corpus's runs: family x operation, one column per version."""
    lines = [
        "",
        "## Corpus: worst ratio per family",
        "",
        "From `benchmarks/corpus.py` in the same folders (`corpus.json`; each one's",
        "`corpus.md` has every tree). Each cell is the C engine's worst speedup against",
        "the fastest peer over the family's trees, with that peer's initial and the tree;",
        "for flatten_up_to, pytree_kit's own flatten time / its flatten_up_to time.",
        "A family's targets (flatten 2, unflatten 1.5, leaves 2.5, tree_map 1.5,",
        f"flatten_up_to 1.5{X}) are judged on this worst cell: MISSED marks a miss.",
        "",
    ]
    notes = [
        f"Python {r['python']}: seed {r['seed']}, pytree_kit {r['pytree_kit']}"
        + (", **--quick**" if r.get("quick") else "")
        for r in runs
    ]
    lines += [f"- {n}" for n in notes] + [""]
    rows = []
    for family in dict.fromkeys(f for r in runs for f in r["families"]):
        for op in OPS:
            row = [family, op]
            for run in runs:
                cell = run["families"].get(family, {}).get(op)
                missed = "" if not cell or cell["met"] else " MISSED"
                row.append(_worst_cell(cell or None, with_judgement=False) + missed)
            rows.append(row)
    lines += _table(["family", "op", *(f"Python {r['python']}" for r in runs)], rows)
    return "\n".join(lines) + "\n"


def versions(args: argparse.Namespace) -> int:
    results = _output.RECORDED  # what it reads: the recorded runs, whatever --out says
    paths = sorted(results.glob("python3.*/compare.json"), key=_version_key)
    if not paths:
        print("no benchmarks/results/python3.*/compare.json: run corpus.py compare --out first")
        return 1
    page = render_versions([json.loads(p.read_text()) for p in paths])
    corpus_paths = sorted(results.glob("python3.*/corpus.json"), key=_version_key)
    if corpus_paths:
        page += render_versions_corpus([json.loads(p.read_text()) for p in corpus_paths])
    _output.write_report(args, "versions.md", page)
    return 0


# --------------------------------------------------------------------------

COMMANDS = ("compare", "versions")


def parse_args(argv: list[str]) -> argparse.Namespace:
    command = argv[0] if argv[:1] and argv[0] in COMMANDS else ""
    p = argparse.ArgumentParser(
        prog=" ".join(["corpus.py", command]).strip(),
        description=__doc__.split("\n\n")[0],
        epilog="commands: compare (the six named trees, every engine, the floor, scaling),"
        " versions (the page of the recorded runs of every Python)",
    )
    if command == "versions":
        _output.add_arguments(p)
        args = p.parse_args(argv[1:])
        args.command = command
        return args
    quick = "tiny repeats, no tree (f)" if command else "the smallest sizes, short loops"
    p.add_argument("--quick", action="store_true", help=f"smoke mode: {quick}")
    _output.add_arguments(p, sub="" if command else _output.PYTHON)
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="LIB",
        help="benchmark only the peers whose name contains LIB (repeatable; "
        "pytree_kit is always included)",
    )
    p.add_argument("--min-time", type=float, default=None, help="seconds per timing loop")
    p.add_argument("--repeats", type=int, default=None, help="timing loops per cell")
    if command:
        p.add_argument("--no-plot", action="store_true", help="skip the charts")
        args = p.parse_args(argv[1:])
        args.command = command
        return args
    p.add_argument(
        "--families",
        default="",
        help="comma-separated families to draw (default: all): "
        + ",".join(f.name for f in FAMILIES),
    )
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"the seed of the draw (default {DEFAULT_SEED})",
    )
    args = p.parse_args(argv)
    known = {f.name for f in FAMILIES}
    chosen = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in known]
    if unknown:
        p.error(f"unknown families: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    args.families = chosen
    args.command = command
    return args


def _write(out: Path, name: str, report: str, figures: Any) -> list[Path]:
    """OUT/name.md and OUT/name.json."""
    (out / f"{name}.md").write_text(report, encoding="utf-8")
    (out / f"{name}.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return [out / f"{name}.md", out / f"{name}.json"]


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.command == "versions":
        return versions(args)
    if args.command or args.quick:
        settings = settings_for(args.quick, args.min_time, args.repeats)
    else:
        settings = settings_for(
            False,
            FULL_MIN_TIME if args.min_time is None else args.min_time,
            FULL_REPEATS if args.repeats is None else args.repeats,
        )
    revision = _git_revision()  # now: the code this process imported is that revision
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    notes: list[str] = []
    families = [
        f for f in FAMILIES if not args.command and (not args.families or f.name in args.families)
    ]
    if attrs is None:
        if any(f.requires == "attrs" for f in families):
            notes.append("attrs is not installed here: the attrs family was skipped.")
        families = [f for f in families if f.requires != "attrs"]
    libs = load_libraries(args.only, notes)
    if not args.command:  # pytree_kit's active engine only (the one the public API reaches)
        libs = [lib for lib in libs if lib.peer or lib.name == f"pytree_kit ({pk.ENGINE})"]
    register_with_peers(libs)
    if not args.command and any(lib.name == "dm-tree" for lib in libs):
        notes.append(
            "dm-tree has no registration: it reads attrs classes and mappings (so the "
            "ModelOutput class) itself, and takes a dataclass for one leaf (n/a on the "
            "dataclass family and tree (e))."
        )
    (_tensors if args.command else leaf_pool)()  # imports torch, when present
    # The imports leave ~200k objects (torch, jax) that a full collection would walk
    # (~0.1 s each): move them to the permanent generation. gc stays enabled.
    gc.collect()
    gc.freeze()
    log("libraries: " + ", ".join(lib.name for lib in libs))
    run = Run(argv[1:] if args.command else argv, libs, settings, notes, revision)
    if args.command == "compare":
        return compare(run, args, start, log)
    ours = next(lib for lib in libs if not lib.peer)
    cells: Cells = {}
    dropped: list[dict[str, Any]] = []
    trees: list[dict[str, Any]] = []
    for fam, size, variant in corpus_points(families, args.quick):
        drawn = draw_one(fam, size, variant, args.seed)
        na = {x.name: x.na[variant] for x in libs if fam.name == "named" and variant in x.na}
        leaves, calls, left_out = checked_calls(libs, drawn.tree, na, "n/a")
        dropped += [_drop(name, drawn, why) for name, why in left_out.items()]
        where = f"{drawn.family} {drawn.label}"
        time_calls(
            libs, calls, drawn.tree_id, where, settings.min_time, settings.repeats, cells, notes
        )
        trees.append(
            {
                "family": drawn.family,
                "size": drawn.size,
                "variant": drawn.variant,
                "label": drawn.label,
                "leaves": leaves,
                "ops": tree_figures(libs, ours, cells, drawn.tree_id),
                "left_out": list(left_out),
            }
        )
        log(f"{where}: {leaves:,} leaves done")
        del drawn, calls
    figures = {f.name: family_figures(trees, f.name) for f in families}
    run.elapsed = time.perf_counter() - start
    report = render(run, ours, args.seed, families, figures, trees, dropped)
    print(report)
    data = summary(run, ours, args.seed, figures, trees, dropped)
    _output.wrote(*_write(_output.folder(args, sub=_output.PYTHON), "corpus", report, data))
    return 0


def compare(run: Run, args: argparse.Namespace, start: float, log: Callable[[str], None]) -> int:
    """The compare command's run, report, figures and charts."""
    libs, settings = run.libs, run.settings
    cells, counts, floor = run_compare(libs, settings, run.notes, log)
    scaling = run_scaling(libs, settings, log)
    run.elapsed = time.perf_counter() - start
    report = render_compare(run, cells, counts, floor, scaling)
    print(report)
    out = _output.folder(args)
    written = _write(out, "compare", report, compare_summary(run, cells, floor))
    if not args.no_plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            plot_compare(libs, cells, counts, floor, out / "compare.png")
            plot_scaling(libs, scaling, settings.scaling_sizes, out / "scaling.png")
            written += [out / "compare.png", out / "scaling.png"]
        except ImportError:
            log("matplotlib is not installed: no charts")
        except Exception:
            traceback.print_exc()
            return 1
    _output.wrote(*written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
