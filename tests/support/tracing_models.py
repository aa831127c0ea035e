"""Small real models with nested inputs and outputs, for tests/torch/test_tracing.py.

Importable by a fresh process (the load-in-a-subprocess test), so every class
here is module-level. ``CASES[name]()`` gives ``(model, example, other, allow)``:
the example ``(args, kwargs)`` to trace with, another ``(args, kwargs)`` of the
same structure and constants with other tensors, and the classes load() needs.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional

import torch
from torch import nn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


# -- a dataclass in, a dataclass out, an int field and a None kwarg -------------


@dataclasses.dataclass
class Batch:
    images: torch.Tensor
    boxes: list
    num_classes: int


@dataclasses.dataclass
class Detections:
    scores: torch.Tensor
    boxes: list
    num_classes: int
    extra: Optional[torch.Tensor] = None


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(4, 3)

    def forward(self, batch: Batch, mask: Optional[torch.Tensor] = None) -> Detections:
        scores = self.head(batch.images).softmax(-1)[:, : batch.num_classes]
        if mask is not None:
            scores = scores * mask
        return Detections(
            scores=scores,
            boxes=[b * 2 for b in batch.boxes],
            num_classes=batch.num_classes,
        )


def _detector_inputs(seed: int) -> tuple:
    batch = Batch(_randn(seed, 2, 4), [_randn(seed + 1, 1, 4), _randn(seed + 2, 3, 4)], 2)
    return (batch,), {"mask": None}


# -- a namedtuple input --------------------------------------------------------

Pair = collections.namedtuple("Pair", "query key")


class Similarity(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.proj = nn.Linear(4, 4)

    def forward(self, pair: Pair) -> torch.Tensor:
        return self.proj(pair.query) @ self.proj(pair.key).T


def _pair_inputs(seed: int) -> tuple:
    return (Pair(_randn(seed, 2, 4), _randn(seed + 1, 3, 4)),), {}


# -- a dict of lists in, a nested output ---------------------------------------


class Pooler(nn.Module):
    def forward(self, features: dict, scale: float = 1.0) -> Any:
        pooled = {k: torch.stack(v).mean(0) * scale for k, v in features.items()}
        return {"pooled": pooled, "stats": ([p.max() for p in pooled.values()], scale)}


def _pooler_inputs(seed: int) -> tuple:
    features = {
        "audio": [_randn(seed, 3), _randn(seed + 1, 3)],
        "video": [_randn(seed + 2, 2, 2), _randn(seed + 3, 2, 2), _randn(seed + 4, 2, 2)],
    }
    return (features,), {"scale": 0.5}


# -- a torch.return_types output ----------------------------------------------


class TopClass(nn.Module):
    def forward(self, logits: torch.Tensor) -> Any:
        return torch.max(logits, dim=-1)


def _top_inputs(seed: int) -> tuple:
    return (_randn(seed, 3, 5),), {}


# -- a transformer-style model whose output is a dataclass and an OrderedDict --


class ModelOutput(collections.OrderedDict):
    """transformers' ModelOutput, in small: the fields that are set are also the
    dict's entries, in field order. (Not scripts/corpus/model_output.py's
    ModelOutputBase: its __setitem__ and __setattr__ are not yet run under
    dynamo on the oldest torch CI tests these models on.)"""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


@dataclasses.dataclass
class EncoderOutput(ModelOutput):
    last_hidden_state: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None
    attentions: Optional[tuple] = None


class Block(nn.Module):
    """One pre-norm self-attention block with a padding mask. (Written out:
    torch.jit.trace's own check fails on nn.TransformerEncoderLayer in torch
    2.13, whose fast path traces differently each time.)"""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple:
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(mask[:, None, :] == 0, float("-inf"))
        attention = scores.softmax(-1)
        h = h + attention @ v
        return h + self.mlp(h), attention


class TinyEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.embed = nn.Embedding(11, 8)
        self.layers = nn.ModuleList(Block(8) for _ in range(2))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_hidden_states: bool
    ) -> EncoderOutput:
        h = self.embed(input_ids)
        states = [h]
        attentions = []
        for layer in self.layers:
            h, attention = layer(h, attention_mask)
            states.append(h)
            attentions.append(attention)
        return EncoderOutput(
            last_hidden_state=h,
            hidden_states=tuple(states) if output_hidden_states else None,
            attentions=tuple(attentions),
        )


def _encoder_inputs(seed: int) -> tuple:
    ids = torch.randint(0, 11, (2, 5), generator=_gen(seed))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    return (ids,), {"attention_mask": mask, "output_hidden_states": True}


def _case(model: Callable[[], nn.Module], inputs: Callable, allow: list) -> Callable:
    return lambda: (model().eval(), inputs(0), inputs(100), allow)


CASES: dict = {
    "dataclass": _case(Detector, _detector_inputs, [Batch, Detections]),
    "namedtuple": _case(Similarity, _pair_inputs, [Pair]),
    "dict_of_lists": _case(Pooler, _pooler_inputs, []),
    "return_types": _case(TopClass, _top_inputs, []),
    "transformer": _case(TinyEncoder, _encoder_inputs, [EncoderOutput]),
}
