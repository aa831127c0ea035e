"""Checkpointing nested training state on torch's distributed checkpoint engine.

``torch.distributed.checkpoint`` (DCP) saves each rank's shards in parallel and
reshards on load, but it walks only dicts and lists: a tuple, namedtuple,
dataclass or any other object is one opaque value, pickled with
``torch.save``, read back with ``torch.load(weights_only=False)`` (which runs
code) and replaced rather than loaded in place, and a DTensor inside one is
not treated as a shard. :func:`save` and :func:`load` hand DCP the state as
pytree_kit reads it instead: one flat ``{key: tensor}`` dict, so every
tensor and DTensor of any container is chunked, sharded, deduplicated and
resharded by DCP itself, and the structure and the plain values beside it
are written as JSON data.

The format, per checkpoint (a DCP checkpoint directory):

- a tensor leaf at path ``p`` is stored under the key ``"tree" + keystr(p)``
  (``tree.opt['state']['0.weight']['exp_avg']``); a leaf under
  :class:`PerRank` under ``"rank<r>:" + that``. keystr writes each key as
  Python indexes with it (strings quoted, dots and brackets inside them
  kept), so ``"a.b"`` and ``a`` then ``b`` differ, and so do ``1`` and
  ``"1"`` (two keys that still write alike, objects of one repr, are
  refused, naming both paths). A key is never parsed back: the spec says
  where each leaf goes;
- each rank writes one ``uint8`` tensor under ``"pytree_kit:meta:rank<r>"``:
  a JSON document with the spec (``TreeSpec.to_json``), each leaf's kind in
  order (``t`` a tensor, ``n`` a numpy array, stored as a tensor, ``v`` a plain
  value: None, bool, int, float, str, bytes or complex, ``p`` a pickle, only
  with ``fallback="pickle"``), and the values of the leaves that are not
  tensors. The keys are not stored: the spec gives them again.

Loading reads classes only from the template's own spec, ``allow=`` and
``rules=`` (as :meth:`TreeSpec.from_json`), and never unpickles a leaf
unless asked to (``fallback="pickle"``). DCP's own ``.metadata`` file is
still a pickle that DCP writes and reads: load checkpoints you trust.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pickle
import sys
import warnings
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from .. import api
from .._compare import first_difference, mismatch_text, tree_equal
from .._errors import StructureError
from .._jsonvalues import Malformed, decode, encode, resolver
from .._keys import keystr, where
from .._kinds import Rule
from .._spec import TreeSpec, node_paths

__all__ = ["CheckpointMismatch", "PerRank", "async_save", "load", "save"]

Rules = Optional[Mapping[type, Rule]]
PathLike = Union[str, "os.PathLike[str]"]

FORMAT = "pytree_kit.checkpoint"
VERSION = 1
_META = "pytree_kit:meta:rank"
_VALUES = (type(None), bool, int, float, str, bytes, complex)


class PerRank:
    """Marks a subtree whose values differ by rank (an RNG state, a data
    loader's position), so that each rank's is saved under keys of its own
    instead of being deduplicated to one rank's copy as DCP does with plain
    tensors. On load, each rank gets back the values its own rank saved.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch.checkpoint import PerRank
        >>> state = {"step": 3, "rng": PerRank(torch.get_rng_state())}
        >>> state["rng"].value.dtype
        torch.uint8
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __tree_flatten__(self) -> tuple[dict, None]:
        return {"value": self.value}, None

    @classmethod
    def __tree_unflatten__(cls, aux: None, children: Any) -> PerRank:
        return cls(children["value"])

    def __repr__(self) -> str:
        return f"PerRank({self.value!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is PerRank and tree_equal(self.value, other.value)

    __hash__ = None  # type: ignore[assignment]


class CheckpointMismatch(UserWarning):
    """What ``load(..., strict=False)`` could not match: ``missing``, the paths
    of the template that the file has no value for (they keep the template's
    value), and ``unexpected``, the file's leaf keys the template has no place
    for (ignored)."""

    def __init__(self, missing: list[str], unexpected: list[str]) -> None:
        self.missing = missing
        self.unexpected = unexpected
        super().__init__(
            f"pytree_kit.torch.checkpoint.load: {len(missing)} leaves of the template not in "
            f"the checkpoint (kept): {missing[:5]}; {len(unexpected)} leaves of the "
            f"checkpoint not in the template (ignored): {unexpected[:5]}"
        )


# --------------------------------------------------------------------------
# the state as DCP sees it


_NOT_STATEFUL = frozenset({dict, list, tuple, str, bytes, int, float, bool, type(None)})


def _is_stateful(x: Any) -> bool:
    """DCP's ``Stateful``: ``state_dict`` and ``load_state_dict`` methods (read
    on the class: an ``isinstance`` check of the protocol costs ~15 us)."""
    t = type(x)
    if t in _NOT_STATEFUL or isinstance(x, torch.Tensor):
        return False
    return callable(getattr(t, "state_dict", None)) and callable(
        getattr(t, "load_state_dict", None)
    )


def _rank_world(process_group: Any) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(process_group), dist.get_world_size(process_group)
    return 0, 1


class _Flat:
    """A state flattened for DCP: the stateful objects found (modules,
    optimizers, anything with ``state_dict``/``load_state_dict``), the tree
    with each of them replaced by its state dict, and that tree's leaves,
    paths, spec and keys."""

    def __init__(self, state: Any, rules: Rules, rank: int, what: str) -> None:
        outer, self.outer_spec = api.flatten_with_path(state, is_leaf=_is_stateful, rules=rules)
        self.stateful: dict[int, Any] = {i: x for i, (_, x) in enumerate(outer) if _is_stateful(x)}
        if self.stateful:
            modules = [x for x in self.stateful.values() if isinstance(x, torch.nn.Module)]
            expanded = [x for _, x in outer]
            for i, x in self.stateful.items():
                expanded[i] = _state_dict_of(x, modules, outer[i][0], what)
            self.tree = self.outer_spec.unflatten(expanded)
            pairs, self.spec = api.flatten_with_path(self.tree, rules=rules)
        else:  # no stateful object: the first flatten was the whole one
            self.tree, pairs, self.spec = state, outer, self.outer_spec
        self.paths = [p for p, _ in pairs]
        self.leaves = [x for _, x in pairs]
        self.keys = _keys(self.spec, self.paths, rank, what)

    def rebuild(self, leaves: list) -> Any:
        """The state with ``leaves`` in place of the flat leaves, each stateful
        object loaded from its part and put back where it was."""
        tree = self.spec.unflatten(leaves)
        if not self.stateful:
            return tree
        parts = self.outer_spec.flatten_up_to(tree)
        modules = [x for x in self.stateful.values() if isinstance(x, torch.nn.Module)]
        for i, obj in self.stateful.items():
            _load_state_dict(obj, parts[i], modules)
            parts[i] = obj
        return self.outer_spec.unflatten(parts)


def _state_dict_of(x: Any, modules: list, path: tuple, what: str) -> Any:
    from torch.distributed.checkpoint import state_dict as sd

    if isinstance(x, torch.nn.Module):
        return sd.get_model_state_dict(x)
    if isinstance(x, torch.optim.Optimizer):
        return sd.get_optimizer_state_dict(_model_of(x, modules, path, what), x)
    return x.state_dict()


def _load_state_dict(x: Any, part: Any, modules: list) -> None:
    from torch.distributed.checkpoint import state_dict as sd

    if isinstance(x, torch.nn.Module):
        sd.set_model_state_dict(x, part)
    elif isinstance(x, torch.optim.Optimizer):
        sd.set_optimizer_state_dict(_model_of(x, modules, (), "load"), x, part)
    else:
        x.load_state_dict(part)


def _model_of(optim: Any, modules: list, path: tuple, what: str) -> Any:
    """The module of the state whose parameters ``optim`` updates: DCP's
    optimizer state dict names parameters by their names in the model."""
    params = {id(p) for group in optim.param_groups for p in group["params"]}
    for m in modules:
        if any(id(p) in params for p in m.parameters()):
            return m
    raise TypeError(
        f"pytree_kit.torch.checkpoint.{what}: {where(path)}: an optimizer whose model is "
        "not in the state; put the model (or the module that holds its parameters) in "
        "the state too, so its parameters can be named"
    )


def _keys(spec: TreeSpec, paths: list, rank: int, what: str) -> list[str]:
    """Each leaf's DCP key: its path as keystr writes it, after "tree", and
    after "rank<r>:" too under a PerRank."""
    marked = set()
    if any(node[1] is PerRank for node in spec._nodes):
        marked = {tuple(keys) for node, keys in node_paths(spec._nodes) if node[1] is PerRank}
    keys = []
    for path in paths:
        key = "tree" + keystr(path)
        if marked and any(path[:k] in marked for k in range(len(path))):
            key = f"rank{rank}:{key}"
        keys.append(key)
    if len(set(keys)) != len(keys):
        seen: dict[str, tuple] = {}
        for key, path in zip(keys, paths):
            if key in seen:
                raise ValueError(
                    f"pytree_kit.torch.checkpoint.{what}: {where(seen[key])} and {where(path)} "
                    f"are written alike ({key!r}); give one of their keys another value"
                )
            seen[key] = path
    return keys


def _numpy() -> Any:
    return sys.modules.get("numpy")  # only an array already made needs it


def _entry(x: Any, path: tuple, fallback: Optional[str]) -> tuple[str, Any, Any]:
    """What one leaf is (``t``ensor, plain ``v``alue, ``n``umpy array,
    ``p``ickle), what the document keeps of it, and the tensor DCP writes."""
    if isinstance(x, torch.Tensor):
        return "t", None, x
    t = type(x)
    if t in _VALUES:
        return "v", encode(x), None
    np = _numpy()
    if np is not None and isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            arr = np.ascontiguousarray(arr).copy()
        try:
            tensor = torch.from_numpy(arr)
        except TypeError:
            tensor = None  # a dtype torch has not: objects, strings, dates
        if tensor is not None:
            return "n", [arr.dtype.str, isinstance(x, np.generic)], tensor
    if fallback == "pickle":
        try:
            blob = pickle.dumps(x, protocol=4)
        except Exception as e:
            raise TypeError(
                f"pytree_kit.torch.checkpoint.save: {where(path)}: cannot pickle a leaf of "
                f"type {t.__module__}.{t.__qualname__}: {e}"
            ) from e
        return "p", blob.hex(), None
    raise TypeError(
        f"pytree_kit.torch.checkpoint.save: {where(path)}: a leaf of type "
        f"{t.__module__}.{t.__qualname__} is not a tensor, numpy array or plain value "
        "(None, bool, int, float, str, bytes, complex); pass rules= for its class so "
        "its parts are saved, or fallback='pickle' to pickle it"
    )


def _prepare(
    state: Any, rules: Rules, fallback: Optional[str], process_group: Any
) -> dict[str, Any]:
    """The flat ``{key: tensor}`` dict DCP saves: the state's tensors, and
    this rank's document (the spec, each leaf's kind, the values)."""
    if fallback not in (None, "pickle"):
        raise ValueError(f"fallback must be None or 'pickle', got {fallback!r}")
    rank, world = _rank_world(process_group)
    flat = _Flat(state, rules, rank, "save")
    kinds = []
    values = []
    out: dict[str, Any] = {}
    for key, path, x in zip(flat.keys, flat.paths, flat.leaves):
        kind, kept, tensor = _entry(x, path, fallback)
        kinds.append(kind)
        if kind != "t":
            values.append(kept)
        if tensor is not None:
            out[key] = tensor
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "rank": rank,
        "world": world,
        "spec": flat.spec.to_json(),
        "kinds": "".join(kinds),
        "values": values,
    }
    blob = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    out[f"{_META}{rank}"] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return out


# --------------------------------------------------------------------------
# saving


def save(
    state: Any,
    path: PathLike,
    *,
    process_group: Any = None,
    rules: Rules = None,
    fallback: Optional[str] = None,
) -> None:
    """Save any tree of training state as a DCP checkpoint in directory ``path``.

    Every tensor and DTensor leaf goes to ``torch.distributed.checkpoint.save``
    as itself, under its path as text, so DCP chunks, shards and deduplicates
    it; the structure and the plain values (None, bool, int, float, str,
    bytes, complex) are written as JSON, numpy arrays as tensors. A module,
    an optimizer (its model must be in the state too) and any other
    ``Stateful`` object in the tree is saved through its state dict (DCP's
    ``get_model_state_dict``/``get_optimizer_state_dict`` for the first two,
    so DDP and FSDP models work). Values that differ by rank go under
    :class:`PerRank`. Any other leaf raises TypeError naming its path, unless
    ``fallback="pickle"``.

    Call it on every rank of ``process_group`` (default: the default group;
    without one, a single process saves alone).

    Examples:
        >>> import tempfile, torch
        >>> from pytree_kit.torch import checkpoint
        >>> state = {"w": torch.ones(3), "step": 7, "name": ("run", 1)}
        >>> d = tempfile.mkdtemp()
        >>> checkpoint.save(state, d)  # no process group: one process saves alone
        >>> template = {"w": torch.zeros(3), "step": 0, "name": ("", 0)}
        >>> restored = checkpoint.load(template, d)  # w is loaded in place
        >>> restored["step"], restored["name"], restored["w"] is template["w"]
        (7, ('run', 1), True)
    """
    _dcp_save(_agreed_flat(state, rules, fallback, process_group, "save"), path, process_group)


def _agreed_flat(state: Any, rules: Rules, fallback: Optional[str], group: Any, who: str) -> dict:
    """What :func:`save` and :func:`async_save` hand DCP: ``state`` flat, once
    every rank of ``group`` has prepared its own."""
    return _agreed(lambda: _prepare(state, rules, fallback, group), group, who)


def _dcp_save(flat: dict, path: PathLike, process_group: Any) -> None:
    with _one_process():
        dcp.save(flat, checkpoint_id=path, process_group=process_group)


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """Without a process group DCP warns on every call that it assumes one
    process: that is what these functions document, so the warning goes."""
    if dist.is_available() and dist.is_initialized():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def async_save(
    state: Any,
    path: PathLike,
    *,
    process_group: Any = None,
    rules: Rules = None,
    fallback: Optional[str] = None,
) -> Future:
    """:func:`save` on ``torch.distributed.checkpoint.async_save``: the tensors
    are staged (copied) before it returns, and the writing goes on in the
    background. Returns DCP's future; call ``.result()`` before relying on
    the checkpoint. Changing the state after this returns does not change
    what is written."""
    flat = _agreed_flat(state, rules, fallback, process_group, "async_save")
    with _one_process():
        future = dcp.async_save(flat, checkpoint_id=path, process_group=process_group)
    done: Any = getattr(future, "upload_completion", None)  # an AsyncSaveResponse's
    return done if done is not None else future  # type: ignore[return-value]


# --------------------------------------------------------------------------
# loading


def load(
    state: Any,
    path: PathLike,
    *,
    allow: Iterable[Any] = (),
    rules: Rules = None,
    strict: bool = True,
    process_group: Any = None,
    fallback: Optional[str] = None,
) -> Any:
    """Load a checkpoint :func:`save` wrote into ``state``, a live template:
    the same tree, with the tensors (and DTensors) laid out as they are now.

    Tensors are loaded in place, resharded by DCP from whatever world size
    wrote the file; modules, optimizers and other ``Stateful`` objects get
    ``load_state_dict`` (or DCP's ``set_*_state_dict``). Returns the state
    rebuilt: the same tensor and stateful objects, containers made anew,
    plain values and numpy arrays from the file.

    The file's classes resolve only to the template's own, to those in
    ``allow`` and to ``rules`` (as :meth:`TreeSpec.from_json`). A structure
    that differs from the file's raises ValueError naming the first
    differing path; so does a tensor of another shape or dtype. With
    ``strict=False`` the leaves both have (by key) are loaded, the others
    keep the template's values, and a :class:`CheckpointMismatch` warning
    lists both sides. A leaf the file pickled is read only with
    ``fallback="pickle"``. A truncated or corrupt checkpoint raises
    ValueError.
    """
    if fallback not in (None, "pickle"):
        raise ValueError(f"fallback must be None or 'pickle', got {fallback!r}")
    rank, _ = _rank_world(process_group)
    where_ = os.fspath(path)

    def find() -> tuple:
        flat = _Flat(state, rules, rank, "load")
        reader, metadata = _read_metadata(path)
        return (flat, reader, metadata, *_document_target(path, metadata, rank))

    flat, reader, metadata, key, blob, meta_rank = _agreed(find, process_group, "load")
    _dcp_load({key: blob}, reader, path, process_group)

    def plan() -> tuple:
        meta = _parse_document(blob, path)
        entries = _entries(meta, where_)
        if strict:
            plan = _strict_plan(flat, meta["spec"], entries, meta_rank, rank, allow, rules, where_)
            unexpected: list[str] = []
        else:
            plan, unexpected = _loose_plan(
                flat, meta, entries, meta_rank, rank, allow, rules, where_
            )
        return (*_targets(flat, plan, metadata, allow, rules, fallback, where_), unexpected)

    wanted, leaves, missing, unexpected = _agreed(plan, process_group, "load")
    _dcp_load(wanted, reader, path, process_group)
    for i, value in leaves.items():
        if type(value) is _Numpy:
            leaves[i] = value.array()
    new = [leaves[i] if i in leaves else x for i, x in enumerate(flat.leaves)]
    if not strict and (missing or unexpected):
        warnings.warn(CheckpointMismatch(missing, unexpected), stacklevel=2)
    return flat.rebuild(new)


def _corrupt(path: Any, error: BaseException) -> ValueError:
    return ValueError(
        f"pytree_kit.torch.checkpoint.load: {os.fspath(path)!r} is not a complete checkpoint "
        f"(truncated or corrupt): {type(error).__name__}: {error}"
    )


class _Reader(dcp.FileSystemReader):
    """DCP's file reader, reading the checkpoint's ``.metadata`` once for the
    three times a load needs it (to size the document, and in each of the two
    ``dcp.load`` calls): it is a pickle of an entry per tensor."""

    def __init__(self, path: PathLike) -> None:
        super().__init__(path)
        self._read: dict[Any, Any] = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        rank = kwargs.get("rank")
        metadata = self._read.get(rank)
        if metadata is None:
            metadata = self._read[rank] = super().read_metadata(*args, **kwargs)
        elif getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id  # as a fresh read sets it
        return metadata


def _read_metadata(path: PathLike) -> tuple[_Reader, Any]:
    if not os.path.isdir(os.fspath(path)):
        raise FileNotFoundError(f"pytree_kit.torch.checkpoint.load: no checkpoint at {path!r}")
    reader = _Reader(path)
    try:
        return reader, reader.read_metadata()
    except Exception as e:  # DCP's .metadata is a pickle: anything can go wrong reading it
        raise _corrupt(path, e) from e


def _dcp_load(wanted: dict, reader: _Reader, path: PathLike, process_group: Any) -> None:
    try:
        with _one_process():
            dcp.load(wanted, checkpoint_id=path, storage_reader=reader, process_group=process_group)
    except (Exception, dcp.CheckpointException) as e:  # the latter is a BaseException
        raise _corrupt(path, e) from e


def _document_target(path: PathLike, metadata: Any, rank: int) -> tuple[str, torch.Tensor, int]:
    """The key of this rank's document (rank 0's where this rank wrote none:
    the checkpoint was written by fewer ranks), a tensor to load it into, and
    the rank that wrote it."""
    items = metadata.state_dict_metadata
    meta_rank = rank if f"{_META}{rank}" in items else 0
    key = f"{_META}{meta_rank}"
    info = items.get(key)
    if type(info) is not TensorStorageMetadata or len(info.size) != 1:
        raise ValueError(
            f"pytree_kit.torch.checkpoint.load: {os.fspath(path)!r} is a DCP checkpoint, "
            "but not one pytree_kit.torch.checkpoint.save wrote (no metadata document)"
        )
    return key, torch.empty(info.size[0], dtype=torch.uint8), meta_rank


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """A CPU tensor's bytes, without numpy (the ``torch`` extra does not
    install it, and ``Tensor.numpy()`` raises where it is missing).

    Examples:
        >>> _tensor_bytes(torch.frombuffer(bytearray(b'{"a": 1}'), dtype=torch.uint8))
        b'{"a": 1}'
    """
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _parse_document(blob: torch.Tensor, path: PathLike) -> dict:
    try:
        meta = json.loads(_tensor_bytes(blob))
        if type(meta) is not dict or meta.get("format") != FORMAT:
            raise ValueError("not a pytree_kit checkpoint document")
        if meta.get("version") != VERSION:
            raise ValueError(f"format version {meta.get('version')!r}, expected {VERSION}")
        if type(meta.get("spec")) is not str or type(meta.get("kinds")) is not str:
            raise ValueError("no spec or kinds")
        if type(meta.get("values")) is not list:
            raise ValueError("no values")
    except (ValueError, UnicodeDecodeError) as e:
        raise _corrupt(path, e) from e
    return meta


def _agreed(step: Callable[[], Any], process_group: Any, what: str) -> Any:
    """``step()``, the work a rank does alone before a DCP collective; with
    several ranks, every rank learns whether any raised, and raises too, so
    that none waits in the collective for a rank that has left."""
    try:
        out, error = step(), None
    except Exception as e:
        out, error = None, e
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size(process_group)
        if world > 1:
            said = None if error is None else f"{type(error).__name__}: {error}"
            heard: list = [None] * world
            dist.all_gather_object(heard, said, group=process_group)
            failed = [r for r, m in enumerate(heard) if m is not None]
            if error is None and failed:
                raise ValueError(
                    f"pytree_kit.torch.checkpoint.{what}: rank {failed[0]} failed: "
                    f"{heard[failed[0]]}"
                )
    if error is not None:
        raise error
    return out


def _entries(meta: dict, where_: str) -> list[tuple[str, Any]]:
    """Each leaf of the document: its kind and what the document keeps."""
    kinds, values = meta["kinds"], meta["values"]
    if set(kinds) - set("tvnp") or len(kinds) - kinds.count("t") != len(values):
        raise _corrupt(where_, ValueError("the leaf kinds do not match the values"))
    it = iter(values)
    return [(k, None if k == "t" else next(it)) for k in kinds]


def _strict_plan(
    flat: _Flat,
    file_spec_text: str,
    entries: list,
    meta_rank: int,
    rank: int,
    allow: Iterable[Any],
    rules: Rules,
    where_: str,
) -> list[tuple[int, str, Any, str]]:
    """Every leaf, as ``(position, kind, kept, key)``: the template must have
    the file's structure, and the file this rank's per-rank values."""
    if flat.spec.to_json() != file_spec_text:
        file_spec = _file_spec(flat, file_spec_text, allow, rules, where_)
        found = first_difference(file_spec, flat.spec)
        if found is not None:
            raise StructureError(
                "pytree_kit.torch.checkpoint.load: "
                + mismatch_text(found, "the checkpoint", "the template")
            )
    if len(entries) != len(flat.leaves):
        raise _corrupt(where_, ValueError("the leaf kinds do not match the spec"))
    plan = []
    for i, ((kind, kept), key) in enumerate(zip(entries, flat.keys)):
        if meta_rank != rank and key.startswith("rank"):
            raise ValueError(
                f"pytree_kit.torch.checkpoint.load: {where(flat.paths[i])}: the checkpoint has "
                f"no per-rank value for rank {rank} (it was written by fewer ranks); pass "
                "strict=False to keep the template's"
            )
        plan.append((i, kind, kept, key))
    return plan


def _file_spec(flat: _Flat, text: str, allow: Iterable[Any], rules: Rules, where_: str) -> TreeSpec:
    """The file's spec, its classes resolved to the template's own and to
    ``allow`` and ``rules``."""
    classes = {n[1] for n in flat.spec._nodes if isinstance(n[1], type)}
    try:
        return TreeSpec.from_json(text, allow=[*allow, *classes, PerRank], rules=rules)
    except ValueError as e:
        raise ValueError(f"pytree_kit.torch.checkpoint.load: {where_!r}: {e}") from e


def _loose_plan(
    flat: _Flat,
    meta: dict,
    entries: list,
    meta_rank: int,
    rank: int,
    allow: Iterable[Any],
    rules: Rules,
    where_: str,
) -> tuple[list[tuple[int, str, Any, str]], list[str]]:
    """The leaves the template and the file both have, by key, and the
    file's keys the template has no place for (another rank's per-rank
    values are neither)."""
    file_spec = _file_spec(flat, meta["spec"], allow, rules, where_)
    paths = file_spec.paths()
    if len(paths) != len(entries):
        raise _corrupt(where_, ValueError("the leaf kinds do not match the spec"))
    by_key = {}
    for key, entry in zip(_keys(file_spec, paths, meta_rank, "load"), entries):
        if meta_rank == rank or not key.startswith("rank"):
            by_key[key] = entry
    plan = []
    for i, key in enumerate(flat.keys):
        found = by_key.pop(key, None)
        if found is not None:
            plan.append((i, found[0], found[1], key))
    return plan, list(by_key)


class _Numpy:
    """A numpy leaf being loaded: the tensor DCP fills, then the array."""

    __slots__ = ("dtype", "scalar", "tensor")

    def __init__(self, tensor: torch.Tensor, kept: list) -> None:
        self.tensor = tensor
        self.dtype, self.scalar = kept

    def array(self) -> Any:
        np = _numpy()
        if np is None:  # pragma: no cover - torch imports numpy where it has it
            import numpy as np
        arr = self.tensor.numpy().view(np.dtype(self.dtype))
        return arr[()] if self.scalar else arr


def _targets(
    flat: _Flat,
    plan: list[tuple[int, str, Any, str]],
    metadata: Any,
    allow: Iterable[Any],
    rules: Rules,
    fallback: Optional[str],
    where_: str,
) -> tuple[dict, dict, list[str]]:
    """What DCP loads (key -> tensor to load into), the new leaves by
    position, and the template's keys the plan misses."""
    items = metadata.state_dict_metadata
    table = resolver(allow, rules)
    wanted: dict[str, Any] = {}
    leaves: dict[int, Any] = {}
    for i, kind, kept, key in plan:
        x = flat.leaves[i]
        if kind == "t" or kind == "n":
            info = items.get(key)
            if type(info) is not TensorStorageMetadata:
                raise _corrupt(where_, KeyError(f"no tensor {key!r}"))
            if kind == "n":
                if type(kept) is not list or len(kept) != 2 or type(kept[0]) is not str:
                    raise _corrupt(where_, ValueError(f"a numpy entry {kept!r}"))
                target = torch.empty(tuple(info.size), dtype=info.properties.dtype)
                leaves[i] = _Numpy(target, kept)
            else:
                if not isinstance(x, torch.Tensor):
                    raise ValueError(
                        f"pytree_kit.torch.checkpoint.load: {where(flat.paths[i])}: the "
                        f"checkpoint has a tensor there, the template a {type(x).__qualname__}"
                    )
                if x.shape != info.size or x.dtype != info.properties.dtype:
                    raise ValueError(
                        f"pytree_kit.torch.checkpoint.load: {where(flat.paths[i])}: the "
                        f"checkpoint has a {info.properties.dtype} tensor of shape "
                        f"{tuple(info.size)}, the template a {x.dtype} tensor of shape "
                        f"{tuple(x.shape)}"
                    )
                target = x
            wanted[key] = target
        elif kind == "v":
            if isinstance(x, torch.Tensor):
                raise ValueError(
                    f"pytree_kit.torch.checkpoint.load: {where(flat.paths[i])}: the checkpoint "
                    "has a plain value there, the template a tensor"
                )
            try:
                leaves[i] = decode(kept, table)
            except Malformed as e:
                raise _corrupt(where_, e) from e
        else:  # "p"
            if fallback != "pickle":
                raise ValueError(
                    f"pytree_kit.torch.checkpoint.load: {where(flat.paths[i])}: the checkpoint "
                    "pickled this leaf; pass fallback='pickle' to unpickle it (it runs code: "
                    "only for checkpoints you trust)"
                )
            if type(kept) is not str:
                raise _corrupt(where_, ValueError("a pickle entry that is not text"))
            leaves[i] = pickle.loads(bytes.fromhex(kept))
    loaded = {i for i, *_ in plan}
    missing = [flat.keys[i] for i in range(len(flat.keys)) if i not in loaded]
    return wanted, leaves, missing
