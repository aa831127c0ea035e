"""Corpus speed benchmark: pytree_kit against its peers on trees drawn at random.

compare.py times six fixed trees, which an engine could be tuned to. This script
draws its trees instead, from families of the shapes met in practice, at several
sizes each, from a seed (``--seed``; the same seed draws the same trees):

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
- ``named``: compare.py's six trees.

Leaves are torch tensors where torch is installed, numpy arrays where only numpy
is, else strings (every library takes each as a leaf), and the Python ints, floats,
strs and bools of the families that have them; drawing needs no torch.

    python benchmarks/corpus.py                      # full run, about 3-4 minutes
    python benchmarks/corpus.py --quick              # smoke mode, well under a minute
    python benchmarks/corpus.py --seed 7             # other trees
    python benchmarks/corpus.py --families wide,chain
    python benchmarks/corpus.py --only optree        # pytree_kit and the peers named
    python benchmarks/corpus.py --out /tmp/c         # write the outputs elsewhere
    python benchmarks/corpus.py --record             # into benchmarks/results/ (published)

The report goes to stdout and ``OUT/corpus.md``, its figures to
``OUT/corpus.json`` (``benchmarks/versions.py`` gathers those of several
Pythons). ``OUT`` defaults to ``build/benchmarks/python3.X/`` of the running
Python; ``--record`` writes into ``benchmarks/results/python3.X/``, the published
figures, beside compare.py's per-version runs.

How it measures: as compare.py does, with its machinery (``Lib``,
``load_libraries``, ``_calls_checked``, ``measure_many``, ``settings_for``,
``best_peer``, ``machine_lines``), in one process. Each tree is first run once
through every library, and a library that sees a different number of leaves
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
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import gc
import json
import platform
import random
import statistics
import sys
import time
import types
import typing
from typing import Any, Callable, Optional

import _output
import compare
from compare import (
    OPS,
    OPTREE_NS,
    SAME_ROUNDS,
    TREES,
    Lib,
    Settings,
    X,
    _calls_checked,
    _dc_flatten,
    _dc_unflatten_aux_first,
    _dc_unflatten_children_first,
    _fields_of,
    _git_revision,
    _table,
    best_peer,
    load_libraries,
    machine_lines,
    measure_many,
    settings_for,
)
from versions import _initial

import pytree_kit as pk
from pytree_kit import _pure

try:
    import attrs
except ImportError:  # the attrs family is skipped, with a note
    attrs = None

#: The seed of the draw unless --seed says otherwise.
DEFAULT_SEED = 21
PEER_OPS: tuple[str, ...] = ("flatten", "unflatten", "leaves", "tree_map")
#: The targets of issue 21, judged on each family's worst tree.
TARGETS: dict[str, float] = {
    "flatten": 2.0,
    "unflatten": 1.5,
    "leaves": 2.5,
    "tree_map": 1.5,
    "flatten_up_to": 1.5,
}
#: Full-run timing: a little shorter than compare.py's (0.05 s, 7 repeats), for
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
class CausalLMOutput(collections.OrderedDict):
    """Shaped like transformers' ModelOutput: a dataclass that is an OrderedDict
    whose entries are its fields that are not None, in field order, kept in step
    by ``__setitem__`` and ``__setattr__``. As transformers' does, it also takes
    (key, value) pairs as its first argument, which is how dm-tree rebuilds a
    mapping (``type(m)((k, v) for ...)``)."""

    loss: Any = None
    logits: Any = None
    past_key_values: Any = None
    hidden_states: Any = None
    attentions: Any = None

    def __post_init__(self) -> None:
        fields = dataclasses.fields(self)
        first = getattr(self, fields[0].name)
        others_none = all(getattr(self, f.name) is None for f in fields[1:])
        if others_none and isinstance(first, (dict, list, tuple, types.GeneratorType)):
            items = first.items() if isinstance(first, dict) else first
            for i, element in enumerate(items):
                if not (
                    isinstance(element, (list, tuple))
                    and len(element) == 2
                    and isinstance(element[0], str)
                ):
                    if i == 0:  # a plain first field after all
                        self[fields[0].name] = first
                        return
                    raise ValueError(f"cannot set key/value for {element!r}")
                setattr(self, element[0], element[1])
                if element[1] is not None:
                    self[element[0]] = element[1]
            return
        for f in fields:
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)


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
        "compare.py's six trees, as they are (not drawn)",
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


def register_with_peers(libs: list[Lib], notes: list[str]) -> None:
    """Registers this corpus's dataclasses, attrs classes and ModelOutput class with
    every peer loaded, as compare.py registers its own: jax ``register_dataclass``
    (the ModelOutput class with ``register_pytree_node``), optree
    ``register_pytree_node`` in compare.py's namespace, torch
    ``register_pytree_node`` (which serves _cxx_pytree too). The ModelOutput class
    flattens to its set fields, as transformers registers it with torch."""
    names = {lib.name for lib in libs if lib.peer}
    records = [(cls, _fields_of(cls), _dc_flatten) for cls in DATACLASSES]
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

        compare._torch_register()  # imports _cxx_pytree first, so that it gets them too
        for cls, _, flat in records:
            tp.register_pytree_node(cls, flat, functools.partial(_dc_unflatten_children_first, cls))
        tp.register_pytree_node(
            mo, _mo_flatten, functools.partial(_mo_unflatten_children_first, mo)
        )
    if "dm-tree" in names:
        notes.append(
            "dm-tree has no registration: it reads attrs classes and mappings (so the "
            "ModelOutput class) itself, and takes a dataclass for one leaf (n/a on the "
            "dataclass family and tree (e))."
        )


# --------------------------------------------------------------------------
# Timing


Cells = dict[tuple[str, str, str], Any]


def time_tree(
    libs: list[Lib],
    ours: Lib,
    drawn: Drawn,
    settings: Settings,
    cells: Cells,
    dropped: list[dict[str, Any]],
    notes: list[str],
) -> int:
    """Times every library on one tree; returns its number of leaves (pure engine's)."""
    tree = drawn.tree
    tid = drawn.tree_id
    expected = len(_pure.leaves(tree, None, None))
    calls: dict[str, dict[str, Any]] = {}
    for lib in libs:
        named_na = lib.na.get(drawn.variant) if drawn.family == "named" else None
        if named_na is not None:
            calls[lib.name] = dict.fromkeys(OPS, named_na)
            dropped.append(_drop(lib, drawn, named_na))
            continue
        try:
            calls[lib.name] = _calls_checked(lib, tree, expected)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            calls[lib.name] = dict.fromkeys(OPS, "n/a")
            dropped.append(_drop(lib, drawn, reason))
    for op in OPS:
        fns: dict[str, Callable[[], Any]] = {}
        timed = [ours] if op == "flatten_up_to" else libs
        for lib in timed:
            fn = calls[lib.name][op]
            if isinstance(fn, str):
                cells[lib.name, tid, op] = fn
            else:
                fns[lib.name] = fn
        if op == "flatten_up_to":
            flat = calls[ours.name]["flatten"]
            if not isinstance(flat, str) and fns:
                fns[SAME_ROUNDS] = flat
        for name, v in measure_many(fns, settings.min_time, settings.repeats).items():
            if name == SAME_ROUNDS:
                cells[ours.name, tid, SAME_ROUNDS] = v
            else:
                cells[name, tid, op] = v
                if isinstance(v, str):
                    notes.append(f"**{name}** {op} on {drawn.family} {drawn.label}: {v}")
    return expected


def _drop(lib: Lib, drawn: Drawn, reason: str) -> dict[str, Any]:
    return {
        "library": lib.name,
        "family": drawn.family,
        "tree": drawn.label,
        "reason": reason,
        "cause": KNOWN_CAUSES.get((lib.name, drawn.family)),
    }


# --------------------------------------------------------------------------
# The figures


def tree_figures(libs: list[Lib], ours: Lib, cells: Cells, tid: str) -> dict[str, Any]:
    """pytree_kit's figures on one tree: per op, its µs, the fastest peer and the speedup."""
    out: dict[str, Any] = {}
    for op in PEER_OPS:
        v = cells.get((ours.name, tid, op))
        best = best_peer(libs, cells, tid, op)
        if isinstance(v, float) and best is not None:
            out[op] = {
                "us": v * 1e6,
                "fastest_peer": best[0],
                "peer_us": best[1] * 1e6,
                "speedup": best[1] / v,
            }
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


def _worst_cell(fig: Optional[dict[str, Any]], with_judgement: bool = True) -> str:
    if fig is None:
        return "-"
    peer = f"{_initial(fig['worst_peer'])}, " if fig["worst_peer"] else ""
    text = f"{fig['worst']:.2f}{X} ({peer}{fig['worst_tree']})"
    if with_judgement:
        text += " met" if fig["met"] else " **MISSED**"
    return text


def render(
    argv: list[str],
    libs: list[Lib],
    ours: Lib,
    settings: Settings,
    seed: int,
    families: list[Family],
    figures: dict[str, Any],
    trees: list[dict[str, Any]],
    dropped: list[dict[str, Any]],
    notes: list[str],
    elapsed: float,
    revision: str,
) -> str:
    peers = [lib for lib in libs if lib.peer]
    legend = ", ".join(f"{_initial(p.name)} {p.name}" for p in peers) or "none"
    lines = [
        "# pytree_kit: corpus speed benchmark",
        "",
        "`" + " ".join(["python benchmarks/corpus.py", *argv]) + "`",
        f"run on {time.strftime('%Y-%m-%d %H:%M')}, in one process, {elapsed:.0f} s in all, "
        f"seed {seed}, {len(trees)} trees"
        + (
            " (**--quick**: smoke mode, the smallest sizes only; numbers are rough)"
            if settings.quick
            else ""
        )
        + ".",
        "",
        "## Machine and versions",
        "",
        *machine_lines(libs, revision),
        f"- Leaves: {leaf_pool()[0]}, 16 distinct ones shared across the trees, and the "
        "Python ints, floats, strs and bools of the families that have them.",
        f"- Timing: median of {settings.repeats} interleaved loops per cell, each of at "
        f"least {settings.min_time * 1e3:g} ms after a warm-up call (compare.py's "
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
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines).rstrip() + "\n"


def summary(
    libs: list[Lib],
    ours: Lib,
    settings: Settings,
    seed: int,
    figures: dict[str, Any],
    trees: list[dict[str, Any]],
    dropped: list[dict[str, Any]],
    notes: list[str],
    elapsed: float,
    revision: str,
) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "pytree_kit": revision,
        "engine": ours.name,
        "engine_info": pk.engine_info(),
        "peers": {x.name: x.version for x in libs if x.peer},
        "seed": seed,
        "quick": settings.quick,
        "min_time": settings.min_time,
        "repeats": settings.repeats,
        "leaves": leaf_pool()[0],
        "elapsed_s": elapsed,
        "targets": TARGETS,
        "families": figures,
        "trees": trees,
        "left_out": dropped,
        "notes": notes,
    }


# --------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="smoke mode: the smallest sizes, short loops"
    )
    _output.add_arguments(p, sub=_output.PYTHON)
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="LIB",
        help="benchmark only the peers whose name contains LIB (repeatable; "
        "pytree_kit is always included)",
    )
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
    p.add_argument("--min-time", type=float, default=None, help="seconds per timing loop")
    p.add_argument("--repeats", type=int, default=None, help="timing loops per cell")
    args = p.parse_args(argv)
    known = {f.name for f in FAMILIES}
    chosen = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in known]
    if unknown:
        p.error(f"unknown families: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    args.families = chosen
    return args


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.quick:
        settings = settings_for(True, args.min_time, args.repeats)
    else:
        settings = settings_for(
            False,
            FULL_MIN_TIME if args.min_time is None else args.min_time,
            FULL_REPEATS if args.repeats is None else args.repeats,
        )
    revision = _git_revision()
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    notes: list[str] = []
    families = [f for f in FAMILIES if not args.families or f.name in args.families]
    if attrs is None:
        if any(f.requires == "attrs" for f in families):
            notes.append("attrs is not installed here: the attrs family was skipped.")
        families = [f for f in families if f.requires != "attrs"]
    # pytree_kit's active engine only (the one the public API reaches), and the peers
    libs = [
        lib
        for lib in load_libraries(args.only, notes)
        if lib.peer or lib.name == f"pytree_kit ({pk.ENGINE})"
    ]
    ours = next(lib for lib in libs if not lib.peer)
    register_with_peers(libs, notes)
    leaf_pool()  # imports torch, when present, whichever peers were chosen
    gc.collect()
    gc.freeze()
    log("libraries: " + ", ".join(lib.name for lib in libs))
    cells: Cells = {}
    dropped: list[dict[str, Any]] = []
    trees: list[dict[str, Any]] = []
    for fam, size, variant in corpus_points(families, args.quick):
        drawn = draw_one(fam, size, variant, args.seed)
        before = len(dropped)
        leaves = time_tree(libs, ours, drawn, settings, cells, dropped, notes)
        trees.append(
            {
                "family": drawn.family,
                "size": drawn.size,
                "variant": drawn.variant,
                "label": drawn.label,
                "leaves": leaves,
                "ops": tree_figures(libs, ours, cells, drawn.tree_id),
                "left_out": [d["library"] for d in dropped[before:]],
            }
        )
        log(f"{drawn.family} {drawn.label}: {leaves:,} leaves done")
        del drawn
    figures = {f.name: family_figures(trees, f.name) for f in families}
    elapsed = time.perf_counter() - start
    report = render(
        argv,
        libs,
        ours,
        settings,
        args.seed,
        families,
        figures,
        trees,
        dropped,
        notes,
        elapsed,
        revision,
    )
    print(report)
    out = _output.folder(args, sub=_output.PYTHON)
    (out / "corpus.md").write_text(report, encoding="utf-8")
    data = summary(
        libs, ours, settings, args.seed, figures, trees, dropped, notes, elapsed, revision
    )
    (out / "corpus.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    _output.wrote(out / "corpus.md", out / "corpus.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
