"""Moving a nested batch: pytree_kit's ``to_device`` against what users call
now, accelerate's ``send_to_device``, Lightning's ``move_data_to_device`` and
``tree_map(lambda t: t.to(device))`` over torch's own pytree.

    python benchmarks/transfer_peers.py [--quick] [--thresholds] [--out DIR | --record]

It writes ``transfer_peers.md`` into ``build/benchmarks/`` (``--record``:
into ``benchmarks/results/``; with CUDA, into ``benchmarks/results/gpu_<name>/``).

**The ways**, each called as a user calls it, blocking (``non_blocking``
left at its default): torch's ``tree_map``, accelerate, Lightning, and
``pkt.to_device`` three ways: the default (``coalesce=None``: it picks per
batch), ``coalesce=True`` and ``coalesce=False``.

**Host-side mode** (on a machine with no GPU, or ``--host``). Every way's
target is the ``meta`` device, and ``torch.Tensor.to`` is replaced, for all
of them alike, by a function that makes a copy on the CPU (``clone``) where
a tensor would go to ``meta``. So each call does its whole host work (the
walk, the checks, packing, making the tensors) and really copies every byte
once, with the copy made on the CPU, not over a bus. glibc's malloc is told
to keep freed memory (``mallopt``), as CUDA's caching allocator does on the
device; otherwise every large copy would time the kernel's page faults.
torch runs on one thread: on a 2-core machine a copy of a few MB split over
two threads takes several times longer than on one. What it does not show
is a GPU's cost per copy (a synchronising ``cudaMemcpy`` of pageable memory
takes several microseconds), which makes a copy each dearer on a GPU than
here.

**With CUDA** (the default where it is available): the target is ``cuda``,
and a call is timed to a ``torch.cuda.synchronize()`` after it.

**Batches**: five common ones (a tokenizer's dict; 1,000 small tensors
in 500 dicts; 256 namedtuples; 16 images with dataclass targets; 10 large
tensors), and mixed ones: six dtypes and shapes, 0-d tensors, views of one
storage, empty tensors, a bare tensor, and a tokenizer batch with a nested
dict of 0-d tensors (the pipeline's batch); and the tokenizer's tensors in
two dict subclasses that keep attributes of their own: a transformers
``BatchEncoding`` (with the 32 encodings of a real fast tokenizer, built here
with a vocabulary of its own; accelerate moves it by its own ``.to()``, in
place), and a dict subclass with one attribute.

**Figures**: best of interleaved rounds (the ways in a new order each
round), ms per call. For each batch and
way, the tensors *left behind* (an output tensor that is the input's own,
or shares its memory: not moved) and *not own* (an output tensor that is a
view of another, so an in-place change to one would bump the other's
version counter). Targets: the default is at least as fast as the
fastest peer that leaves nothing behind (ratio >= 1.0; a peer that skips a
dataclass's tensors does less work, so the table gives the ratio against the
fastest peer of all beside it) and within 10 % of pytree_kit's best explicit
option, leaving nothing behind.

``--thresholds`` also sweeps the number of small tensors in a batch and
times ``coalesce=True`` against ``coalesce=False`` at each: the smallest
count from which packing pays is ``NO_DMA_COALESCE_MIN``'s measurement in
host-side mode (``COALESCE_MIN``'s on a GPU), and the size up to which it
pays ``NO_DMA_STAGE_LIMIT``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _output

import pytree_kit as pk
from pytree_kit.torch import (
    _staging,
    _transfer,
    to_device,
)

META = torch.device("meta")


class Pair(NamedTuple):
    ids: Any
    mask: Any


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any


def batches() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(0, 1000, shape, generator=g)

    big = torch.randn(64, 1024, generator=g)
    return {
        "tokenizer batch: 4 x int64[32, 512] in a dict": {
            k: ints(32, 512) for k in ("input_ids", "attention_mask", "token_type_ids", "labels")
        },
        "1,000 small tensors in 500 dicts": [
            {"x": torch.randn(16, generator=g), "y": ints(8)} for _ in range(500)
        ],
        "256 namedtuples of 2 x int64[128]": [Pair(ints(128), ints(128)) for _ in range(256)],
        "16 uint8 images [3, 480, 640] + dataclass targets": {
            "images": [torch.randint(0, 255, (3, 480, 640), dtype=torch.uint8) for _ in range(16)],
            "targets": [Target(torch.rand(n, 4, generator=g), ints(n)) for n in [3, 1, 7, 2] * 4],
        },
        "16 uint8 images [3, 480, 640] + dict targets (every peer moves them)": {
            "images": [torch.randint(0, 255, (3, 480, 640), dtype=torch.uint8) for _ in range(16)],
            "targets": [
                {"boxes": torch.rand(n, 4, generator=g), "labels": ints(n)}
                for n in [3, 1, 7, 2] * 4
            ],
        },
        "10 x float32[1M]": [torch.randn(1 << 20, generator=g) for _ in range(10)],
        "mixed: 60 tensors of 6 dtypes and shapes": {
            f"f{i}": torch.ones(*[1 + (i * k) % 5 for k in range(1 + i % 3)]).to(dtype)
            for i, dtype in enumerate(
                [torch.float32, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8]
                * 10
            )
        },
        "40 0-d tensors (metrics)": {f"m{i}": torch.tensor(float(i)) for i in range(40)},
        "32 views of one storage": [big[i : i + 2] for i in range(0, 64, 2)],
        "20 empty tensors among 20": [torch.zeros(0, 3) for _ in range(20)]
        + [torch.ones(5, 3) for _ in range(20)],
        "a bare tensor: float32[256, 1024]": torch.randn(256, 1024, generator=g),
        "tokenizer batch + nested dict of 0-d": {
            "input_ids": ints(64, 128),
            "attention_mask": ints(64, 128),
            "label": ints(64),
            "meta": {"a": torch.rand(64, generator=g), "b": torch.rand(64, generator=g)},
        },
        **_subclass_batches(ints),
    }


class Features(dict):
    """A user's dict subclass, with an attribute of its own."""


def _subclass_batches(ints: Callable[..., torch.Tensor]) -> dict[str, Any]:
    """The tokenizer batch's tensors in a transformers BatchEncoding (when
    transformers is installed: the ecosystem extra) and in a dict subclass."""
    keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
    features = Features({k: ints(32, 512) for k in keys})
    features.split = "train"
    out: dict[str, Any] = {}
    encoding = _batch_encoding()
    if encoding is not None:
        cls, encodings = encoding
        out["a tokenizer's BatchEncoding: 4 x int64[32, 512]"] = cls(
            {k: ints(32, 512) for k in keys}, encoding=encodings
        )
    out["a dict subclass: 4 x int64[32, 512]"] = features
    return out


def _batch_encoding() -> Optional[tuple[Any, list]]:
    """transformers' BatchEncoding and the encodings of 32 texts of 512 tokens,
    from a real fast tokenizer built here (nothing is downloaded), or None."""
    try:
        import tokenizers
        import transformers
    except ImportError:  # pragma: no cover - the ecosystem extra has them
        return None
    words = ["[PAD]", "[UNK]", "the", "cat", "sat", "on", "mat"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]"
    )
    texts = [" ".join(words[2:] * (i + 1)) for i in range(32)]
    enc = tokenizer(texts, padding="max_length", max_length=512, truncation=True)
    return transformers.BatchEncoding, enc.encodings


def tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor of a batch, dataclass fields included (what a user means to move)."""
    return [x for x in pk.leaves(tree) if isinstance(x, torch.Tensor)]


def left_behind(before: list[torch.Tensor], out: Any) -> tuple[int, int]:
    """(tensors of out that are, or share memory with, one of ``before`` (the
    input's tensors, read before the call: a way that moves a batch in place,
    as a BatchEncoding's .to() does, changes them); tensors of out that are
    views of another tensor)."""
    inputs = {id(t) for t in before}
    memory = {
        t.untyped_storage().data_ptr() for t in before if t.device.type == "cpu" and t.numel()
    }
    after = tensors(out)
    if len(after) != len(before):
        raise AssertionError("a way changed the batch's structure")
    behind = 0
    for t in after:
        if id(t) in inputs:
            behind += 1
        elif t.device.type == "cpu" and t.numel() and t.untyped_storage().data_ptr() in memory:
            behind += 1  # (an empty tensor has no memory to share)
    not_own = sum(1 for t in after if t._base is not None)
    return behind, not_own


def peers() -> dict[str, Callable[[Any, Any], Any]]:
    """The other ways, those whose library is installed."""
    from torch.utils._pytree import tree_map

    ways: dict[str, Callable[[Any, Any], Any]] = {
        "torch tree_map(.to)": lambda b, d: tree_map(
            lambda t: t.to(d) if isinstance(t, torch.Tensor) else t, b
        )
    }
    try:
        from accelerate.utils import send_to_device  # type: ignore[import-untyped]

        ways["accelerate send_to_device"] = send_to_device
    except ImportError:  # pragma: no cover - the bench extra has it
        pass
    try:
        from lightning.fabric.utilities.apply_func import move_data_to_device

        ways["Lightning move_data_to_device"] = move_data_to_device
    except ImportError:  # pragma: no cover - the bench extra has it
        pass
    return ways


OURS = {
    "pkt.to_device (default)": lambda b, d: to_device(b, d),
    "coalesce=True": lambda b, d: to_device(b, d, coalesce=True),
    "coalesce=False": lambda b, d: to_device(b, d, coalesce=False),
}


def _is_meta(target: Any) -> bool:
    if isinstance(target, torch.device):
        return target.type == "meta"
    return isinstance(target, str) and target == "meta"


def reuse_freed_memory() -> None:
    """Have glibc's malloc serve large blocks from its heap and keep freed ones
    (as CUDA's caching allocator keeps device memory), instead of mapping
    fresh pages for each large copy and faulting them in: otherwise a host-side
    run times the kernel's page faults, in an order that depends on which way
    ran before."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None or platform.system() != "Linux":
        return
    libc = ctypes.CDLL(name)
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's most: larger blocks are still mapped
    libc.mallopt(m_trim_threshold, 1 << 30)


class HostCopies:
    """While active, ``Tensor.to(meta)`` makes a copy on the CPU instead."""

    def __enter__(self) -> HostCopies:
        self.real = real = torch.Tensor.to

        def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if (args and _is_meta(args[0])) or _is_meta(kwargs.get("device")):
                return self.clone()  # (a BatchEncoding's .to passes device=)
            return real(self, *args, **kwargs)

        torch.Tensor.to = to  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.Tensor.to = self.real  # type: ignore[method-assign]


def timed(fn: Callable[[], Any], number: int, sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
        sync()
    return (time.perf_counter() - start) / number * 1e3


def measure(
    ways: dict[str, Callable[[Any, Any], Any]],
    batch: Any,
    device: Any,
    rounds: int,
    sync: Callable[[], None],
    budget: float = 0.02,
) -> dict[str, float]:
    """Best ms per call of each way over interleaved rounds."""
    calls = {name: (lambda f=f: f(batch, device)) for name, f in ways.items()}
    numbers = {}
    for name, fn in calls.items():  # warm up, and size each round to ~budget s
        fn()
        t = timed(fn, 1, sync) / 1e3
        numbers[name] = max(1, min(200, int(budget / max(t, 1e-7))))
    if min(numbers.values()) < 5:  # calls of milliseconds: the best single call, of more
        numbers = dict.fromkeys(calls, 1)
        rounds *= 5
    best = {name: float("inf") for name in calls}
    order = list(calls)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)  # no way always runs after the same other (caches, allocator)
        for name in order:
            best[name] = min(best[name], timed(calls[name], numbers[name], sync))
    return best


def environment(device: Any, host: bool) -> str:
    where = (
        "host-side mode: the copy made on the CPU (`clone`), no GPU"
        if host
        else f"on {torch.cuda.get_device_name(0)}"
    )
    import importlib.metadata as md

    versions = []
    for name in ("accelerate", "lightning"):
        try:
            versions.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            versions.append(f"{name} not installed")
    return (
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {', '.join(versions)}, engine {pk.engine_info()['engine']}; "
        f"{where}"
    )


def comparison(device: Any, host: bool, rounds: int, sync: Callable[[], None]) -> tuple[str, bool]:
    ways = {**peers(), **OURS}
    names = list(ways)
    lines = [
        "| batch | " + " | ".join(names) + " | default vs fastest peer that moves all | "
        "default vs fastest peer | default vs best of ours | left behind (per way) |",
        "|---" * (len(names) + 5) + "|",
    ]
    met = True
    for label, batch in batches().items():
        best = measure(ways, batch, device, rounds, sync)
        behind = []
        moves_all = set()
        for name in names:
            with HostCopies() if host else _Nothing():
                before = tensors(batch)
                n, not_own = left_behind(before, ways[name](batch, device))
            if name in OURS and (n or not_own):
                met = False
            if not n:
                moves_all.add(name)
            behind.append(f"{n}" + (f" ({not_own} views)" if not_own else ""))
        peer_names = [n for n in names if n not in OURS]
        fastest_peer = min(best[n] for n in peer_names)
        full = [best[n] for n in peer_names if n in moves_all]
        ours = min(best["coalesce=True"], best["coalesce=False"])
        default = best["pkt.to_device (default)"]
        vs_full = min(full) / default if full else float("inf")
        vs_peer, vs_ours = fastest_peer / default, ours / default
        met = met and vs_full >= 1.0 and vs_ours >= 1 / 1.1
        cells = [f"{best[n]:.3f}" for n in names]
        lines.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | **{vs_full:.2f}x** | {vs_peer:.2f}x | {vs_ours:.2f}x | {' / '.join(behind)} |"
        )
    total = sum(len(tensors(b)) for b in batches().values())
    lines += [
        "",
        f"Left behind: output tensors that are the input's own or share its memory, "
        f"per way in the column order ({total} tensors in all batches); views: output "
        "tensors that are views of another. The target compares the default with the "
        "fastest peer that leaves nothing behind: a peer that skips a dataclass's tensors "
        "does less work (the same tensors in dicts: the row after it).",
    ]
    return "\n".join(lines), met


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _packed_over_each(batch: Any, device: Any, rounds: int, sync: Callable[[], None]) -> tuple:
    """ms per call staged, and by tensor as the default moves a few (a ``.to``
    each: the counts it stages from set out of reach meanwhile), and their ratio."""
    real = _transfer.COALESCE_MIN, _transfer.NO_DMA_COALESCE_MIN
    _transfer.COALESCE_MIN = _transfer.NO_DMA_COALESCE_MIN = 1 << 30
    try:
        best = measure(
            {
                "packed": lambda b, d: to_device(b, d, coalesce=True),
                "each": lambda b, d: to_device(b, d),
            },
            batch,
            device,
            rounds,
            sync,
            budget=0.01,
        )
    finally:
        _transfer.COALESCE_MIN, _transfer.NO_DMA_COALESCE_MIN = real
    return best["packed"], best["each"], best["packed"] / best["each"]


def _first_paying(keys: list, ratios: list[float]) -> Any:
    """The first key from which packing is no slower, at every later key too."""
    return next((keys[i] for i in range(len(keys)) if all(r <= 1.0 for r in ratios[i:])), None)


def _last_paying(keys: list, ratios: list[float]) -> Any:
    """The last key up to which packing is no slower, at every earlier key too."""
    last = None
    for key, r in zip(keys, ratios):
        if r > 1.0:
            break
        last = key
    return last


def thresholds(
    device: Any, rounds: int, sync: Callable[[], None], dma: bool = False
) -> tuple[str, Any, Any]:
    """coalesce=True against coalesce=False: over the number of tensors of
    128 bytes (``COALESCE_MIN`` to a DMA device, ``NO_DMA_COALESCE_MIN`` to
    another), then over their size, 64 of them (up to ``STAGE_LIMIT``, or
    ``NO_DMA_STAGE_LIMIT``)."""
    counts = [2, 4, 8, 12, 16, 20, 24, 32, 48, 64, 128]
    lines = ["| tensors of 128 B | packed ms | a copy each ms | ratio |", "|---|---|---|---|"]
    ratios = []
    for n in counts:
        batch = {f"t{i}": torch.arange(16) + i for i in range(n)}
        packed, each, ratio = _packed_over_each(batch, device, rounds, sync)
        ratios.append(ratio)
        lines.append(f"| {n} | {packed:.4f} | {each:.4f} | {ratio:.2f} |")
    count = _first_paying(counts, ratios)
    sizes = [128, 512, 1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10]
    if dma:  # staged up to STAGE_LIMIT there: measure that far
        sizes += [128 << 10, 256 << 10, 512 << 10, _transfer.STAGE_LIMIT]
    lines += ["", "| 64 tensors of | packed ms | a copy each ms | ratio |", "|---|---|---|---|"]
    ratios = []
    for nbytes in sizes:
        batch = {f"t{i}": torch.arange(nbytes // 8) + i for i in range(64)}
        packed, each, ratio = _packed_over_each(batch, device, rounds, sync)
        ratios.append(ratio)
        lines.append(f"| {nbytes:,} B | {packed:.4f} | {each:.4f} | {ratio:.2f} |")
    size = _last_paying(sizes, ratios)
    if dma:
        lines += ["", *_pinned_sweep(device, rounds, sync)]
    if dma:
        count_name, count_now = "COALESCE_MIN", _transfer.COALESCE_MIN
        size_name, size_now = "STAGE_LIMIT", _transfer.STAGE_LIMIT
        where = "to a device with a DMA engine, such as this run's"
    else:
        count_name, count_now = "NO_DMA_COALESCE_MIN", _transfer.NO_DMA_COALESCE_MIN
        size_name, size_now = "NO_DMA_STAGE_LIMIT", _transfer.NO_DMA_STAGE_LIMIT
        where = "to a device without a DMA engine, such as this run's"
    lines += [
        "",
        f"Packing pays from {count or 'no count measured'} tensors of 128 B "
        f"(`{count_name}` is {count_now}), and for 64 tensors up to "
        f"{size if size is None else f'{size:,} B'} each "
        f"(`{size_name}` is {size_now:,} B: larger tensors get a copy each, {where}).",
    ]
    return "\n".join(lines), count, size


def _pinned_sweep(device: Any, rounds: int, sync: Callable[[], None]) -> list[str]:
    """One pinned tensor of each size (a batch's images, pinned by torch's
    loader) among 32 small ones, blocking and not: packed with them, against
    a copy of its own (``PINNED_OWN``'s measurement). ``PINNED_OWN`` is set
    just under the pinned tensor's size for its own copy, so that only it is
    asked whether it is pinned, as the rule asks only tensors over it."""
    lines = [
        "| a pinned tensor of, with 32 small ones | blocking: packed with them ms "
        "| blocking: its own copy ms | ratio | non-blocking: packed ms | non-blocking: own ms "
        "| ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    sizes = [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]
    ratios: dict[bool, list[float]] = {False: [], True: []}
    real = _staging.PINNED_OWN
    for nbytes in sizes:
        batch = {
            "images": torch.arange(nbytes // 8).pin_memory(),
            "targets": [torch.arange(4) + i for i in range(32)],
        }
        cells = []
        for non_blocking in (False, True):
            best = {}
            for name, own in (("packed", 1 << 40), ("own", nbytes - 1)):
                _staging.PINNED_OWN = own
                try:
                    best[name] = measure(
                        {name: lambda b, d, nb=non_blocking: to_device(b, d, non_blocking=nb)},
                        batch,
                        device,
                        rounds,
                        sync,
                        0.01,
                    )[name]
                finally:
                    _staging.PINNED_OWN = real
            ratios[non_blocking].append(best["own"] / best["packed"])
            cells += [
                f"{best['packed']:.4f}",
                f"{best['own']:.4f}",
                f"{ratios[non_blocking][-1]:.2f}",
            ]
        lines.append(f"| {nbytes:,} B | " + " | ".join(cells) + " |")
    lines.append("")
    for non_blocking, name in ((False, "blocking"), (True, "non-blocking")):
        paying = _first_paying(sizes, ratios[non_blocking])
        lines.append(
            f"A copy of its own pays for a pinned tensor, {name}, from "
            + ("no size measured" if paying is None else f"{paying:,} B")
            + f" (`PINNED_OWN` is {real:,} B: a pinned tensor over it is not packed)."
        )
    return lines


def bound(device: Any, rounds: int, sync: Callable[[], None]) -> list[str]:
    """What a blocking move of a few tensors can reach: the raw torch calls
    with no tree walk, beside to_device and Lightning (whose copies are
    queued and waited for by no one in the call: the timing's synchronize
    waits for them)."""
    tok = batches()["tokenizer batch: 4 x int64[32, 512] in a dict"]
    bare = batches()["a bare tensor: float32[256, 1024]"]
    ts = list(tok.values())
    stream = torch.cuda.current_stream()
    move = peers().get("Lightning move_data_to_device")

    def queued_then_stream() -> Any:
        out = [t.to(device, non_blocking=True) for t in ts]
        stream.synchronize()
        return out

    ways: dict[str, Callable[[], Any]] = {
        "pkt.to_device (default)": lambda: to_device(tok, device),
        "raw: a blocking .to each": lambda: [t.to(device) for t in ts],
        "raw: queued, the last blocking": lambda: [
            t.to(device, non_blocking=i < len(ts) - 1) for i, t in enumerate(ts)
        ],
        "raw: queued, then the stream synchronized": queued_then_stream,
        "raw: queued, no wait in the call (as Lightning)": lambda: [
            t.to(device, non_blocking=True) for t in ts
        ],
        "bare: pkt.to_device": lambda: to_device(bare, device),
        "bare: raw blocking .to": lambda: bare.to(device),
        "bare: raw queued .to, no wait in the call": lambda: bare.to(device, non_blocking=True),
    }
    if move is not None:
        ways["Lightning move_data_to_device"] = lambda: move(tok, device)
        ways["bare: Lightning"] = lambda: move(bare, device)
    best = {k: float("inf") for k in ways}
    order = list(ways)
    for f in ways.values():
        f()
        sync()
    for r in range(rounds):
        random.Random(r).shuffle(order)
        for k in order:
            best[k] = min(best[k], timed(ways[k], 40, sync))
    return [
        f"Best of {rounds} interleaved rounds of 40 calls, each call then "
        "`torch.cuda.synchronize()`; ms per call. The tokenizer batch of the table "
        "(4 x int64[32, 512]) unless marked bare (float32[256, 1024]).",
        "",
        "| way | ms |",
        "|---|---|",
        *(f"| {k} | {best[k]:.4f} |" for k in ways),
    ]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few rounds: a smoke test")
    parser.add_argument("--host", action="store_true", help="host-side mode even with CUDA")
    parser.add_argument("--thresholds", action="store_true", help="also measure the thresholds")
    parser.add_argument(
        "--bound", action="store_true", help="with CUDA: also what a blocking call can reach"
    )
    _output.add_arguments(parser)
    args = parser.parse_args(argv)
    host = args.host or not torch.cuda.is_available()
    rounds = 2 if args.quick else 30
    if host:
        reuse_freed_memory()
        # one thread: a copy of a few MB split over two threads of a 2-core
        # machine takes 5-10x longer than on one (the copy a GPU would make
        # takes no CPU thread at all)
        torch.set_num_threads(1)
        device: Any = META
        sync: Callable[[], None] = lambda: None  # noqa: E731
        sub = ""
    else:
        device = torch.device("cuda")
        sync = torch.cuda.synchronize
        sub = _output.gpu_sub(torch.cuda.get_device_name(0))
    out = _output.folder(args, sub=sub)
    text = [
        "# Moving a nested batch: pytree_kit against accelerate, Lightning and torch",
        "",
        environment(device, host) + f"; best of {rounds} interleaved rounds, ms per call.",
        "",
    ]
    with HostCopies() if host else _Nothing():
        table, met = comparison(device, host, rounds, sync)
        text += [table, ""]
        text.append(
            "Targets: the default at least as fast as the fastest peer that "
            "moves every tensor, "
            "within 10 % of our best explicit option, nothing left behind: "
            + ("**met**." if met else "**MISSED**.")
        )
        if args.thresholds:
            sweep, _, _ = thresholds(device, max(3, rounds // 2), sync, dma=not host)
            text += ["", "## How many tensors packing pays for", "", sweep]
    if args.bound and not host:
        text += ["", "## What a blocking call can reach", "", *bound(device, max(3, rounds), sync)]
    _output.publish(out / "transfer_peers.md", text, gpu_measured=not host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
