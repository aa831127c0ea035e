"""Batches: collate (with ragged fields), and the way back (uncollate, select).

``collate`` turns a list of samples of one structure into one batch of the
same types. Its fast path does what ``default_collate`` does and nothing more:
flatten each sample up to sample 0's spec, and stack each column. Every check
that would cost per sample runs only after the fast path fails, to say where
and why.
"""

from __future__ import annotations

import functools
import operator
import sys
from array import array
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Union

import torch
from torch.utils.data import get_worker_info

from .. import _paths, api
from .._keys import DictKey, GetAttrKey, SequenceKey, keystr, where
from .._kinds import ATTR, LEAF_NODE, MAPPING, SEQUENCE, SLOT, Carried, Rule
from .._spec import TreeSpec, _subtree_end, node_paths
from . import _storage
from ._hidden import first_hidden, hidden_message

__all__ = ["Padded", "SampleList", "collate", "select", "uncollate"]

Rules = Optional[Mapping[type, Rule]]
Ragged = Union[None, str, Mapping[Any, str], Callable[[tuple], Optional[str]]]

_NUMBERS = (bool, int, float, complex)
_Tensor = torch.Tensor
_dtype_of = operator.attrgetter("dtype")
MODES = ("list", "pad", "nested")


class SampleList(list):  # type: ignore[type-arg]
    """A list with one entry per sample: what ``collate`` makes of strings and
    other non-tensor leaves, and of fields collated with ``ragged="list"``.

    It is a ``list`` in every way, and a container to pytree_kit (its entries
    are children), so ``to_device`` and ``pin_memory`` reach the tensors in
    it; ``uncollate`` and ``select`` know it holds one entry per sample.

    Examples:
        >>> from pytree_kit.torch import SampleList
        >>> names = SampleList(["a", "b"])
        >>> names == ["a", "b"], isinstance(names, list)
        (True, True)
    """

    __slots__ = ()

    def __tree_flatten__(self) -> tuple[list, None]:
        return list(self), None

    @classmethod
    def __tree_unflatten__(cls, aux: None, children: Iterable[Any]) -> SampleList:
        return cls(children)


class Padded(NamedTuple):
    """A field of tensors of differing shapes, padded to the largest: what
    ``collate(..., ragged="pad")`` makes.

    ``data`` is the batch, ``(batch, *largest shape)``; ``sizes`` is an int64
    tensor ``(batch, ndim)`` holding each sample's own shape, so
    ``data[i][tuple(slice(0, s) for s in sizes[i])]`` is sample ``i``'s tensor.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import collate
        >>> batch = collate([{"x": torch.ones(2)}, {"x": torch.ones(3)}], ragged="pad")
        >>> batch["x"].data
        tensor([[1., 1., 0.],
                [1., 1., 1.]])
        >>> batch["x"].lengths
        tensor([2, 3])
        >>> batch["x"].mask()
        tensor([[ True,  True, False],
                [ True,  True,  True]])
    """

    data: torch.Tensor
    sizes: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        """Each sample's size in its first dimension: ``sizes[:, 0]``."""
        return self.sizes[:, 0]

    def mask(self) -> torch.Tensor:
        """A bool tensor shaped like ``data``: True where a sample's own values are."""
        data, sizes = self.data, self.sizes
        batch, ndim = sizes.shape[0], sizes.shape[1]
        mask = torch.ones(data.shape, dtype=torch.bool, device=data.device)
        for d in range(ndim):
            shape = [1] * data.dim()
            shape[d + 1] = data.shape[d + 1]
            span = torch.arange(data.shape[d + 1], device=data.device).view(shape)
            limit = sizes[:, d].to(data.device).view([batch] + [1] * (data.dim() - 1))
            mask &= span < limit
        return mask

    def unpad(self, i: int) -> torch.Tensor:
        """Sample ``i``'s tensor, as it was before padding (a view of ``data``)."""
        size = self.sizes[i].tolist()
        return self.data[i][tuple(slice(0, s) for s in size)]


# --------------------------------------------------------------------------
# ragged=: which paths get which treatment


def _key_name(key: Any) -> Any:
    if type(key) is DictKey:
        return key.key
    if type(key) is GetAttrKey:
        return key.name
    if type(key) is SequenceKey:
        return key.idx
    return key


def _selector_matches(sel: Any, path: tuple) -> bool:
    if callable(sel):
        return bool(sel(path))
    if isinstance(sel, str):
        text = sel[4:] if sel.startswith("tree") else sel
        if text.startswith(("[", ".")) or text == "":
            return keystr(path) == text
        parts = text.split(".")
        if len(parts) > len(path):
            return False
        tail = path[len(path) - len(parts) :]
        return all(str(_key_name(k)) == p for k, p in zip(tail, parts))
    if isinstance(sel, tuple):
        return len(sel) == len(path) and all(s == k or s == _key_name(k) for s, k in zip(sel, path))
    raise TypeError(
        f"collate: a ragged= selector is a keystr, a path tuple or a callable on the path, "
        f"got {type(sel).__name__}"
    )


def _check_mode(mode: Any, sel: Any) -> str:
    if mode not in MODES:
        raise ValueError(
            f"collate: ragged mode for {sel!r} must be one of {', '.join(map(repr, MODES))}, "
            f"got {mode!r}"
        )
    return str(mode)


class _Decider:
    """``ragged=``'s answer for a path: ``(mode, depth of the node it applies
    to)`` or None. Each selector is tried on every prefix of the path,
    shortest first; the first selector (in the mapping's order) that matches
    some prefix decides. A callable ``ragged`` is asked once per prefix."""

    def __init__(self, ragged: Ragged) -> None:
        self.mode: Optional[str] = None
        self.ask: Optional[Callable[[tuple], Any]] = None
        self.selectors: list = []
        self.used: set = set()
        self.asked: dict = {}
        if isinstance(ragged, str):
            self.mode = _check_mode(ragged, "every path")
        elif callable(ragged) and not isinstance(ragged, Mapping):
            self.ask = ragged
        elif isinstance(ragged, Mapping):
            self.selectors = [(sel, _check_mode(mode, sel)) for sel, mode in ragged.items()]
        else:
            raise TypeError(
                "collate: ragged= takes a mode, a mapping from paths to modes, or a callable "
                f"(path -> mode or None), got {type(ragged).__name__}"
            )

    def __call__(self, p: tuple) -> Optional[tuple[str, int]]:
        if self.mode is not None:
            return (self.mode, len(p))
        if self.ask is not None:
            for d in range(len(p) + 1):
                prefix = p[:d]
                if prefix not in self.asked:
                    asked = self.ask(prefix)
                    self.asked[prefix] = None if asked is None else _check_mode(asked, self.ask)
                if self.asked[prefix] is not None:
                    return (self.asked[prefix], d)
            return None
        for n, (sel, mode) in enumerate(self.selectors):
            for d in range(len(p) + 1):
                if _selector_matches(sel, p[:d]):
                    self.used.add(n)
                    return (mode, d)
        return None

    def unused(self) -> list:
        """The selectors (not callables) that matched no path asked so far."""
        found = enumerate(self.selectors)
        return [n for n, (sel, _) in found if n not in self.used and not callable(sel)]

    def names_a_node(self, n: int, paths: Iterable[tuple]) -> bool:
        """Whether selector ``n`` matches a prefix of one of ``paths``."""
        sel = self.selectors[n][0]
        return any(_selector_matches(sel, p[:d]) for p in paths for d in range(len(p) + 1))


def _node_paths(spec: TreeSpec) -> list[tuple]:
    """The path of every node of ``spec``, in pre-order (containers too)."""
    return [tuple(keys) for _node, keys in node_paths(spec._nodes)]


def _resolve(
    ragged: Ragged, spec: TreeSpec, samples: Any, rules: Rules
) -> tuple[TreeSpec, list[tuple], list[Optional[tuple[str, int]]]]:
    """The spec collate reads the samples with, the path of each of its leaves,
    and each leaf's ``(mode, depth)`` or None.

    The modes are decided on sample 0's nodes: each leaf's by its path; a
    ``"list"`` mode named on a container (at a leaf's path or above it, or on
    a container that holds no leaf, such as an empty list) makes that
    container one leaf of the spec, so that each sample's whole subtree there
    is one entry. A selector that names no node of sample 0 is looked for in
    every other sample (whose list there may not be empty); one that names no
    node of any sample raises ValueError.
    """
    decide = _Decider(ragged)
    nodes = spec._nodes
    all_paths = _node_paths(spec)
    leaves_after = [0] * (len(nodes) + 1)  # leaves at node index >= i
    for i in range(len(nodes) - 1, -1, -1):
        leaves_after[i] = leaves_after[i + 1] + (nodes[i][0] == LEAF_NODE[0])
    paths: list[tuple] = []
    modes: list[Optional[tuple[str, int]]] = []
    cuts: dict[int, tuple] = {}  # node index -> the path of the leaf it becomes
    ancestors: list[int] = []  # the node index of each container on the path
    for i, (node, p) in enumerate(zip(nodes, all_paths)):
        del ancestors[len(p) :]
        is_leaf = node[0] == LEAF_NODE[0]
        empty = not is_leaf and leaves_after[i] == leaves_after[_subtree_end(nodes, i)]
        if is_leaf or empty:
            m = decide(p)
            if is_leaf:
                paths.append(p)
                modes.append(m)
            if m is not None and m[0] == "list" and (m[1] < len(p) or empty):
                at = ancestors[m[1]] if m[1] < len(p) else i
                cuts.setdefault(at, p[: m[1]])
        ancestors.append(i)
    unused = decide.unused()
    for sample in samples[1:]:
        if not unused:
            break
        theirs = _node_paths(api.structure(sample, rules=rules))
        unused = [n for n in unused if not decide.names_a_node(n, theirs)]
    if unused:
        sel = decide.selectors[unused[0]][0]
        examples = ", ".join(repr(keystr(p)) for p in paths[:3])
        raise ValueError(
            f"collate: ragged= names {sel!r}, which is no path of the samples "
            f"(their leaves are at {examples}{', ...' if len(paths) > 3 else ''})"
        )
    return _collapse(spec, paths, modes, cuts)


#: _resolve's answers, by (sample 0's spec, ragged=), where they hang on
#: nothing else: every selector named a node of sample 0 (a DataLoader asks
#: the same question for every batch)
_RESOLVED: dict = {}


def _resolved(
    ragged: Ragged, spec: TreeSpec, samples: Any, rules: Rules
) -> tuple[TreeSpec, list[tuple], list[Optional[tuple[str, int]]]]:
    """``_resolve``, remembered where its answer depends on the spec alone."""
    try:
        named = ragged if isinstance(ragged, str) else tuple(ragged.items())  # type: ignore[union-attr]
        key = (spec, named)
        found = _RESOLVED.get(key)
    except (AttributeError, TypeError):  # a callable, or a selector that is not hashable
        return _resolve(ragged, spec, samples, rules)
    if found is None:
        try:
            found = _resolve(ragged, spec, samples[:1], rules)
        except ValueError:  # a selector names no node of sample 0: ask the others
            return _resolve(ragged, spec, samples, rules)
        if len(_RESOLVED) >= 256:
            _RESOLVED.clear()
        _RESOLVED[key] = found
    return found


def _collapse(
    spec: TreeSpec, paths: list[tuple], modes: list, cuts: dict[int, tuple]
) -> tuple[TreeSpec, list, list]:
    """Make every node of ``cuts`` (node index -> its path) a leaf of the
    spec, so each sample's whole subtree there becomes one entry of a list.

    Returns the new spec, and the paths and modes of its leaves.
    """
    if not cuts:
        return spec, paths, modes
    nodes = spec._nodes
    new_nodes: list = []
    keep_orders = []
    new_paths, new_modes = [], []
    index = {}  # old node index -> new node index
    i = leaf = 0
    while i < len(nodes):
        index[i] = len(new_nodes)
        if i in cuts:
            new_nodes.append(LEAF_NODE)
            new_paths.append(cuts[i])
            new_modes.append(("list", len(cuts[i])))
            end = _subtree_end(nodes, i)
            leaf += sum(1 for k in range(i, end) if nodes[k][0] == LEAF_NODE[0])
            i = end
            continue
        new_nodes.append(nodes[i])
        if nodes[i][0] == LEAF_NODE[0]:
            new_paths.append(paths[leaf])
            new_modes.append(modes[leaf])
            leaf += 1
        i += 1
    for i, order in spec._orders:
        if i in index and nodes[i] is new_nodes[index[i]]:
            keep_orders.append((index[i], order))
    new = TreeSpec._make(tuple(new_nodes), tuple(keep_orders), len(new_paths))
    return new, new_paths, new_modes


# --------------------------------------------------------------------------
# collate


def _category(x: Any) -> str:
    if isinstance(x, _Tensor) or _is_ndarray(x):
        return "tensor"
    if isinstance(x, _NUMBERS):
        return "number"
    return "other"


def _is_ndarray(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


class _Columns:
    """What collate knows of the samples, for its messages: paths are made only
    when a message needs them."""

    __slots__ = ("_paths", "rules", "samples", "strict")

    def __init__(self, samples: Any, rules: Rules, paths: Optional[list], strict: bool) -> None:
        self.samples = samples
        self.rules = rules
        self.strict = strict
        self._paths = paths

    def path(self, j: int) -> str:
        if self._paths is None:
            pairs, _ = api.flatten_with_path(self.samples[0], rules=self.rules)
            self._paths = [p for p, _ in pairs]
        return where(self._paths[j])

    def problem(self, j: int, values: Any) -> Optional[ValueError]:
        """What is wrong with a column whose values are not all of one kind, if anything."""
        path = self.path(j)
        kinds = {_category(v) for v in values}
        if len(kinds) > 1 or "other" in kinds:
            # Sample 0 has a leaf here; so must every other sample (not a subtree).
            for k, v in enumerate(values[1:], 1):
                if not api.structure(v, rules=self.rules).is_leaf():
                    return ValueError(
                        f"collate: sample {k} does not have the structure of sample 0: "
                        f"{path}: sample 0 has a leaf of type {type(values[0]).__qualname__}, "
                        f"sample {k} has a {type(v).__qualname__} container"
                    )
        if len(kinds) > 1:
            found = ", ".join(sorted({type(v).__qualname__ for v in values}))
            return ValueError(
                f"collate: {path}: the samples hold different kinds of values here ({found})"
            )
        return None

    def explain(self, j: int, values: Any, error: Optional[BaseException] = None) -> ValueError:
        """The ValueError for a column that could not be collated."""
        path = self.path(j)
        values = list(values)
        problem = self.problem(j, values)
        if problem is not None:
            return problem
        kinds = {_category(v) for v in values}
        tensors = [torch.as_tensor(v) if _is_ndarray(v) else v for v in values]
        if kinds == {"tensor"}:
            shapes = {tuple(v.shape) for v in tensors}
            if (
                len(shapes) > 1
                or len({v.dtype for v in tensors}) > 1
                or len({v.device for v in tensors}) > 1
            ):
                detail = ", ".join(f"{tuple(v.shape)} {v.dtype} {v.device}" for v in tensors[:8])
                hint = (
                    " (for a field whose shape differs between samples, pass "
                    "ragged={...: 'list' | 'pad' | 'nested'})"
                    if len(shapes) > 1
                    else ""
                )
                return ValueError(
                    f"collate: {path}: cannot stack tensors of differing shape, dtype "
                    f"or device: {detail}{hint}"
                )
        return ValueError(f"collate: {path}: {error}")


def _numbers(column: Any, t: type) -> Optional[torch.Tensor]:
    """A tensor of a column of exact ints, floats or bools (type ``t``), made
    fast; None for any other column."""
    try:
        if t is int:
            return torch.frombuffer(array("q", column), dtype=torch.int64).clone()
        if t is float:
            return torch.frombuffer(array("d", column), dtype=torch.float64).to(
                torch.get_default_dtype(), copy=True
            )
        if t is bool:
            return torch.frombuffer(bytearray(column), dtype=torch.bool).clone()
    except OverflowError:
        return None
    return None


def _mode_of(modes: Optional[list], j: int) -> Optional[str]:
    m = modes[j] if modes else None
    return m[0] if m else None


def _numpy_scalars(column: Any, types: set) -> Optional[torch.Tensor]:
    """A tensor of a column of numpy number scalars (as ``default_collate``
    makes it, numpy's dtype kept); None for any other column."""
    np = sys.modules.get("numpy")
    if np is None or not all(issubclass(t, (np.number, np.bool_)) for t in types):
        return None
    return torch.from_numpy(np.array(column))


class _Stack:
    """A column to stack later, into a region of one storage (consolidate=True)."""

    __slots__ = ("j", "values")

    def __init__(self, j: int, values: Any) -> None:
        self.j, self.values = j, values


def _stack(cols: _Columns, j: int, column: Any, out: Optional[torch.Tensor]) -> torch.Tensor:
    first = column[0]
    if out is not None:
        # stacking into ``out`` casts to its dtype: find torch.stack's own dtype
        dtypes = set(map(_dtype_of, column))
        if len(dtypes) > 1 and functools.reduce(torch.promote_types, dtypes) != first.dtype:
            raise cols.explain(j, column)
    try:  # (out=None costs 4 µs more than no out= at all: a slower overload)
        result = torch.stack(column) if out is None else torch.stack(column, 0, out=out)
    except (RuntimeError, TypeError, ValueError) as e:
        raise cols.explain(j, column, e) from None
    if result.dtype != first.dtype:  # torch.stack promoted: the dtypes differ
        raise cols.explain(j, column)
    return result


def _shared_out(first: torch.Tensor, n: int) -> Optional[torch.Tensor]:
    """A tensor in shared memory to stack a column into, as default_collate does
    in a worker (it saves a copy when the batch is sent to the main process)."""
    if type(first) is not _Tensor or first.layout != torch.strided or first.device.type != "cpu":
        return None
    try:
        storage = first.untyped_storage()._new_shared(n * first.numel() * first.element_size())
        return first.new(storage).resize_(n, *first.shape)
    except Exception:  # pragma: no cover - private API changed: plain stack
        return None


def _pad(cols: _Columns, j: int, column: Any, pad_value: Any) -> Padded:
    first = column[0]
    shapes = [tuple(t.shape) for t in column]
    if len({len(s) for s in shapes}) > 1 or len({t.dtype for t in column}) > 1:
        detail = ", ".join(f"{s} {t.dtype}" for s, t in zip(shapes[:8], column))
        raise ValueError(
            f"collate: {cols.path(j)}: ragged='pad' needs tensors of one dtype and one "
            f"number of dimensions: {detail}"
        )
    largest = [max(s[d] for s in shapes) for d in range(first.dim())]
    sizes = torch.tensor(shapes, dtype=torch.int64).view(len(column), first.dim())
    if first.dim() and all(s[1:] == shapes[0][1:] for s in shapes):
        data = torch.nn.utils.rnn.pad_sequence(
            list(column), batch_first=True, padding_value=pad_value
        )
    else:
        data = first.new_full((len(column), *largest), pad_value)
        for i, t in enumerate(column):
            data[i][tuple(slice(0, s) for s in t.shape)] = t
    return Padded(data, sizes)


def _nested(cols: _Columns, j: int, column: Any) -> torch.Tensor:
    shapes = [tuple(t.shape) for t in column]
    if any(len(s) == 0 for s in shapes) or len({s[1:] for s in shapes}) > 1:
        raise ValueError(
            f"collate: {cols.path(j)}: ragged='nested' makes a jagged tensor, which lets "
            f"the samples differ in their first dimension only, got shapes "
            f"{', '.join(map(str, shapes[:8]))} (use 'pad' or 'list')"
        )
    if len({t.dtype for t in column}) > 1:
        raise cols.explain(j, column)
    return torch.nested.as_nested_tensor(list(column), layout=torch.jagged)


def _collate_column(
    cols: _Columns,
    j: int,
    column: Any,
    mode: Optional[str],
    pad_value: Any,
    in_worker: bool,
    defer: bool,
) -> Any:
    first = column[0]
    if not isinstance(first, _Tensor) and _is_ndarray(first):
        if first.dtype.kind not in "biufc":  # strings, objects: a list, as other leaves
            return SampleList(column)
        try:
            column = [torch.as_tensor(a) for a in column]
        except (TypeError, ValueError, RuntimeError) as e:
            raise cols.explain(j, column, e) from None
        first = column[0]
    if isinstance(first, _Tensor):
        if mode is None:
            if defer:
                return _Stack(j, column)
            return _stack(cols, j, column, _shared_out(first, len(column)) if in_worker else None)
        if mode == "list":
            return SampleList(column)
        if mode == "pad":
            return _pad(cols, j, column, pad_value)
        return _nested(cols, j, column)
    if mode == "list":
        return SampleList(column)
    types = set(map(type, column))
    if len(types) == 1:
        fast = _numbers(column, next(iter(types)))
        if fast is not None:
            return fast
    scalars = _numpy_scalars(column, types)
    if scalars is not None:
        return scalars
    if all(isinstance(v, _NUMBERS) for v in column):
        try:
            return torch.tensor(column)
        except (OverflowError, ValueError, RuntimeError) as e:  # an int beyond int64
            raise ValueError(f"collate: {cols.path(j)}: {e}") from None
    if types <= {str, bytes} and not (cols.rules and types & set(cols.rules)):
        return SampleList(column)
    problem = cols.problem(j, column)
    if problem is not None:
        raise problem
    if cols.strict:  # a leaf holding tensors would be listed, its tensors unbatched
        found = first_hidden(column)
        if found is not None:
            k, hidden = found
            path = cols.path(j)
            raise TypeError(hidden_message(f"collate: sample {k}", path, column[k], hidden))
    return SampleList(column)  # other leaves, every one of them a leaf


def collate(
    samples: Iterable[Any],
    *,
    rules: Rules = None,
    ragged: Ragged = None,
    pad_value: Any = 0,
    consolidate: bool = False,
    strict: bool = True,
) -> Any:
    """Turn a list of samples of one structure into one batch of the same types.

    Tensors (and numpy arrays) are stacked along a new first dimension; numbers
    become a tensor (ints int64, floats the default dtype); strings and other
    leaves become a :class:`SampleList`; None stays None. Dataclasses,
    namedtuples, protocol classes and dicts keep their type. A structure
    mismatch, or tensors that cannot be stacked, raise ValueError naming the
    path. The stacked dtype is the one ``torch.stack`` gives, and it must be
    sample 0's. Use it as ``DataLoader(dataset, collate_fn=collate)``.

    ``ragged=`` says what to do with fields whose shapes differ between samples:
    a mode for every tensor, a mapping from paths to modes, or a callable
    ``path -> mode or None``. A path is a keystr (``"['boxes']"``, ``"[1].mask"``,
    ``tree`` in front or not), a dotted name matched at the end of a path
    (``"boxes"``, ``"target.boxes"``), a tuple of keys, or a callable on the
    path; each is tried on every node, the outermost first, and must name a
    node of some sample of the batch (an empty list of the first sample, for
    one, where later samples hold items). The modes:

    - ``"list"``: a :class:`SampleList` of each sample's value; named on a
      container, each sample's whole subtree there (torchvision's detection
      interface: ``ragged={"[0]": "list", "[1]": "list"}`` on ``(image,
      target)`` samples gives a list of images and a list of target dicts).
      The subtrees may differ in structure; an empty list is an empty entry.
    - ``"pad"``: a :class:`Padded` ``(data, sizes)``, padded with ``pad_value``.
    - ``"nested"``: a ``torch.nested`` jagged tensor.

    A leaf that is not a tensor or a plain value but holds tensors (an object
    of a class pytree_kit does not see into) raises TypeError naming the sample
    and the path, rather than being listed with its tensors unbatched: pass
    ``rules=`` for its class, ``ragged=`` ``"list"`` for the field, or
    ``strict=False``.

    ``consolidate=True`` builds the batch in one storage (see
    :func:`consolidate`); in a DataLoader worker it is shared memory, so the
    batch travels to the main process as one storage.

    Examples:
        >>> import dataclasses, torch
        >>> from pytree_kit.torch import collate
        >>> @dataclasses.dataclass
        ... class Sample:
        ...     image: torch.Tensor
        ...     label: int
        ...     name: str
        ...     mask: object = None
        >>> batch = collate([Sample(torch.zeros(3), 1, "a"), Sample(torch.ones(3), 0, "b")])
        >>> type(batch).__name__, tuple(batch.image.shape), batch.label, batch.name, batch.mask
        ('Sample', (2, 3), tensor([1, 0]), ['a', 'b'], None)
        >>> samples = [{"b": torch.ones(1, 4)}, {"b": torch.ones(2, 4)}]
        >>> boxes = collate(samples, ragged={"b": "list"})
        >>> [tuple(t.shape) for t in boxes["b"]]
        [(1, 4), (2, 4)]
    """
    if not isinstance(samples, (list, tuple)):
        samples = list(samples)
    n = len(samples)
    if not n:
        raise ValueError("collate: no samples")
    spec = api.structure(samples[0], rules=rules)
    paths = modes = None
    if ragged is not None:
        spec, paths, modes = _resolved(ragged, spec, samples, rules)
    cols = _Columns(samples, rules, paths, strict)
    in_worker = get_worker_info() is not None
    if spec.is_leaf():  # the samples are the one column
        result = _collate_column(
            cols,
            0,
            samples,
            _mode_of(modes, 0),
            pad_value,
            in_worker,
            consolidate,
        )
        if consolidate:
            return _consolidated(spec, cols, [result])
        return result
    try:
        columns = spec.columns(samples)
    except ValueError:
        for k in range(1, n):
            try:
                spec.flatten_up_to(samples[k])
            except ValueError as e:
                raise ValueError(
                    f"collate: sample {k} does not have the structure of sample 0: {e}"
                ) from None
        raise
    results: list[Any] = []
    for j, column in enumerate(columns):
        mode = _mode_of(modes, j)
        first = column[0]
        # (the commonest columns here, as _collate_column takes them: on 16
        # detection samples the host work beside the stack went from 5.4 to
        # 4.2 µs, and the stack itself runs slower after more Python)
        if mode is None:
            if type(first) is _Tensor and not (in_worker or consolidate):
                results.append(_stack(cols, j, column, None))
                continue
        elif mode == "list" and not _is_ndarray(first):
            results.append(SampleList(column))
            continue
        results.append(_collate_column(cols, j, column, mode, pad_value, in_worker, consolidate))
    spec = _carried_for_batch(spec, samples, rules)
    if consolidate:
        return _consolidated(spec, cols, results)
    return spec.unflatten(results)


# --------------------------------------------------------------------------
# What a batch of subclasses' instances carries (their attributes)

#: the node index and path of each mapping and sequence node of a spec, by
#: spec (a loader repeats its structures)
_SUBCLASS_NODES: dict = {}


def _subclass_nodes(spec: TreeSpec) -> list[tuple[int, tuple]]:
    """``(node index, path)`` of the spec's mapping and sequence nodes."""
    found = _SUBCLASS_NODES.get(spec)
    if found is None:
        found = [
            (i, tuple(keys))
            for i, (node, keys) in enumerate(node_paths(spec._nodes))
            if node[0] == MAPPING or node[0] == SEQUENCE
        ]
        if len(_SUBCLASS_NODES) >= 256:
            _SUBCLASS_NODES.clear()
        _SUBCLASS_NODES[spec] = found
    return found


def _plain(value: Any, data: bool = False) -> bool:
    """None, a bool, int, float, complex, str or bytes, or a tuple of them
    (with ``data``, lists and dicts of them too): values that ``==`` compares
    as values, with no tensor in them."""
    todo = [value]
    while todo:
        v = todo.pop()
        t = type(v)
        if t is tuple or (data and t is list):
            todo.extend(v)
        elif data and t is dict:
            todo.extend(v)
            todo.extend(v.values())
        elif not (v is None or t in (bool, int, float, complex, str, bytes)):
            return False
    return True


def _agree(values: list) -> bool:
    """Whether the samples' values of one attribute are the same object, or
    equal plain data (``_plain``: a number, a str, a dict of them...)."""
    first = values[0]
    if all(v is first for v in values):
        return True
    return _plain(first, True) and all(_plain(v, True) and v == first for v in values)


def _with_state(node: tuple, carried: Carried) -> tuple:
    kind, t, arity, aux = node
    return (kind, t, arity, (*aux[:-1], carried))


def _carried_for_batch(spec: TreeSpec, samples: Any, rules: Rules) -> TreeSpec:
    """The spec that rebuilds the batch: at each mapping or sequence node (a
    tokenizer's ``BatchEncoding``, a dict subclass), what sample 0 carries
    there (its insertion order, its attributes), each attribute kept where
    the samples agree on it (the same object, or equal plain data: a
    ``BatchEncoding``'s ``_n_sequences``) and None where they differ: one
    sample's attribute (its tokenizer ``_encodings``) says nothing of the
    batch. (A cached spec may carry an earlier batch's: each batch's own is
    read here.)"""
    found = _subclass_nodes(spec)
    if not found:
        return spec
    nodes = list(spec._nodes)
    for i, path in found:
        theirs = [_node_at(sample, path, rules)[3][-1] for sample in samples]
        state = []
        for name, how, value in theirs[0].state:
            if how == ATTR or how == SLOT:
                values = [_value_of(c, name) for c in theirs]
                if not _agree(values):
                    value = None
            state.append((name, how, value))
        nodes[i] = _with_state(nodes[i], Carried(theirs[0].order, tuple(state)))
    return TreeSpec._make(tuple(nodes), spec._orders, spec._num_leaves)


_NONE = object()


def _value_of(carried: Carried, name: str) -> Any:
    for n, _how, value in carried.state:
        if n == name:
            return value
    return _NONE


def _node_at(tree: Any, path: tuple, rules: Rules) -> tuple:
    """The node of the container at ``path`` in ``tree``."""
    obj = _paths.tree_get(tree, path, rules=rules) if path else tree
    found = api.flatten_one_level(obj, rules=rules)
    assert found is not None  # a mapping or sequence node of the spec
    return found[1]._nodes[0]  # type: ignore[no-any-return]


def _carried_for_parts(spec: TreeSpec) -> TreeSpec:
    """The spec that rebuilds a part of a batch (``uncollate``'s samples,
    ``select``'s): at each mapping or sequence node, the batch's attributes
    that are plain immutable values (``_plain``: a number, a str, a tuple of
    them say the same of each part), and None for any other (a list of the
    batch's tokenizer encodings says nothing of one sample)."""
    found = _subclass_nodes(spec)
    if not found:
        return spec
    nodes = list(spec._nodes)
    for i, _path in found:
        carried = nodes[i][3][-1]
        state = tuple(
            (n, how, v if how not in (ATTR, SLOT) or _plain(v) else None)
            for n, how, v in carried.state
        )
        nodes[i] = _with_state(nodes[i], Carried(carried.order, state))
    return TreeSpec._make(tuple(nodes), spec._orders, spec._num_leaves)


def _consolidated(spec: TreeSpec, cols: _Columns, results: list) -> Any:
    """The batch with every tensor in one storage: the deferred columns are
    stacked straight into it, the other tensors (numbers, pads, lists) copied."""
    pairs, bspec = api.flatten_with_path(spec.unflatten(results))
    flat = [x for _, x in pairs]
    stacks: dict[int, tuple[Any, Callable[[Any, torch.Tensor], Any]]] = {
        i: (x.values, functools.partial(_stack, cols, x.j))
        for i, x in enumerate(flat)
        if type(x) is _Stack
    }
    packed = _storage.pack(
        flat,
        lambda i: where(pairs[i][0]),
        what="collate(consolidate=True)",
        stacks=stacks,
    )
    return bspec.unflatten(packed)


# --------------------------------------------------------------------------
# The way back: uncollate and select


def _batched(x: Any) -> bool:
    return type(x) is SampleList or type(x) is Padded


def _batch_size(pairs: list) -> int:
    size = None
    source: tuple = ()
    for path, x in pairs:
        if isinstance(x, _Tensor):
            if x.dim() == 0:
                raise ValueError(
                    f"{where(path)}: a 0-d tensor has no batch dimension; a batch's tensors "
                    f"have the samples along their first dimension"
                )
            rows = x.size(0)
        elif type(x) is SampleList:
            rows = len(x)
        elif type(x) is Padded:
            rows = x.data.size(0)
        else:
            continue
        if size is None:
            size, source = rows, path
        elif rows != size:
            raise ValueError(
                f"{where(path)}: has {rows} rows, but {where(source)} has {size}: "
                f"a batch's fields must have one row per sample"
            )
    if size is None:
        raise ValueError("the batch holds no tensor and no SampleList: its size is unknown")
    return size


def _unbind(x: Any) -> Any:
    if isinstance(x, _Tensor):
        return x.unbind(0)
    if type(x) is SampleList:
        return x
    if type(x) is Padded:
        return [x.unpad(i) for i in range(x.data.size(0))]
    return None


def uncollate(batch: Any, *, rules: Rules = None) -> list:
    """The list of samples in a batch: the inverse of :func:`collate`.

    Tensors are split along their first dimension (the samples' tensors are
    views of the batch's); a :class:`SampleList` gives each sample its entry,
    and a :class:`Padded` field each sample's tensor cut back to its own
    shape; jagged nested tensors are unbound. Other leaves (numbers, strings
    outside a SampleList) are given to every sample as they are. Numbers that
    ``collate`` made into a tensor come back as 0-d tensors.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import collate, uncollate
        >>> samples = [{"x": torch.tensor([1, 2]), "name": "a"},
        ...            {"x": torch.tensor([3, 4]), "name": "b"}]
        >>> back = uncollate(collate(samples))
        >>> back[1]["name"], back[1]["x"]
        ('b', tensor([3, 4]))
    """
    pairs, spec = api.flatten_with_path(batch, is_leaf=_batched, rules=rules)
    size = _batch_size(pairs)
    spec = _carried_for_parts(spec)
    columns = [_unbind(x) for _, x in pairs]
    leaves = [x for _, x in pairs]
    out = []
    for i in range(size):
        row = [leaf if col is None else col[i] for leaf, col in zip(leaves, columns)]
        out.append(spec.unflatten(row))
    return out


def _index_of(index: Any, size: int) -> Any:
    if isinstance(index, bool):
        raise TypeError("select: index must be an int, a slice, or an int or bool tensor")
    if not isinstance(index, (int, _Tensor)) and hasattr(index, "__index__"):
        index = operator.index(index)  # a numpy integer, say
    if isinstance(index, int):
        if not -size <= index < size:
            raise IndexError(f"select: index {index} is out of range for a batch of {size}")
        return index % size
    if isinstance(index, slice):
        return index
    if isinstance(index, (list, tuple)):
        index = torch.as_tensor(index, dtype=torch.int64)
    if isinstance(index, _Tensor):
        if index.dtype == torch.bool:
            if index.shape != (size,):
                raise IndexError(
                    f"select: a bool index must have one entry per sample ({size}), "
                    f"got shape {tuple(index.shape)}"
                )
            return index.nonzero().flatten()
        if index.dtype.is_floating_point or index.dim() != 1:
            raise TypeError("select: a tensor index must be a 1-d int or bool tensor")
        if index.numel() and not bool(((index >= -size) & (index < size)).all()):
            raise IndexError(f"select: an index is out of range for a batch of {size}")
        return index % size
    raise TypeError(
        f"select: index must be an int, a slice, or an int or bool tensor, got "
        f"{type(index).__name__}"
    )


def select(batch: Any, index: Any, *, rules: Rules = None) -> Any:
    """Index every batched leaf of a batch along its first dimension.

    ``index`` is an int (sample ``i``, as ``uncollate(batch)[i]`` gives it), a
    slice, a list of ints, or a 1-d int or bool tensor (a smaller batch of the
    same types). Tensors, :class:`SampleList` and :class:`Padded` fields are
    indexed; other leaves are kept. A field whose size differs from the
    others' raises ValueError naming its path.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import collate, select
        >>> batch = collate([{"x": torch.tensor(i), "name": f"s{i}"} for i in range(4)])
        >>> sub = select(batch, torch.tensor([True, False, True, False]))
        >>> sub["x"], sub["name"]
        (tensor([0, 2]), ['s0', 's2'])
        >>> select(batch, -1)
        {'x': tensor(3), 'name': 's3'}
    """
    pairs, spec = api.flatten_with_path(batch, is_leaf=_batched, rules=rules)
    size = _batch_size(pairs)
    spec = _carried_for_parts(spec)
    idx = _index_of(index, size)
    row: list = []
    if isinstance(idx, int):
        for _, x in pairs:
            if isinstance(x, _Tensor):
                row.append(x[idx])
            elif type(x) is SampleList:
                row.append(x[idx])
            elif type(x) is Padded:
                row.append(x.unpad(idx))
            else:
                row.append(x)
        return spec.unflatten(row)
    positions = range(size)[idx] if isinstance(idx, slice) else idx.tolist()
    for _, x in pairs:
        if isinstance(x, _Tensor):
            if x.is_nested:
                parts = x.unbind(0)
                row.append(
                    torch.nested.as_nested_tensor([parts[i] for i in positions], layout=x.layout)
                )
            else:
                row.append(x[idx])
        elif type(x) is SampleList:
            row.append(SampleList(x[i] for i in positions))
        elif type(x) is Padded:
            row.append(Padded(x.data[idx], x.sizes[idx]))
        else:
            row.append(x)
    return spec.unflatten(row)
