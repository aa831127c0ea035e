"""``PackedList``: a dataset of nested samples kept in a few flat buffers.

A map-style dataset that holds its samples as a Python list is copied, page by
page, into every DataLoader worker it is forked into: reading an object writes
its reference count. ``PackedList`` keeps no Python object per sample. Samples
that share a structure share one TreeSpec and one *plan* (the type of each of
its leaves and where it is kept); the leaves live in flat typed tensors (int64,
float64, bool, one byte buffer for str, bytes and pickled leaves, one buffer
per tensor dtype), each row kept whole so that reading a sample reads a few
runs of memory; each sample is one ``(layout, row)`` pair. Reading sample
``i`` rebuilds it in the C engine (``_rows.c``; ``pytree_kit/_rows.py`` is its
specification) from memory it never writes.

A list of ints or of floats (``[x0, y0, x1, y1, ...]``, token ids) is stored
as one leaf of variable length, so that samples whose lists differ in length
still share a structure.

The file format (``save``/``load``): ``MAGIC``, the header's length (8 bytes,
little-endian) and its CRC-32 (4 bytes), the header (JSON: the specs as
``TreeSpec.to_json`` documents, and each buffer's dtype, offset, length and
CRC-32), then the buffers, each starting on a 64-byte boundary. Nothing in it
is pickle except leaves stored with ``fallback="pickle"``, and those are read
back with an unpickler that finds only the classes named in ``allow=``.
"""

from __future__ import annotations

import ctypes
import io
import json
import mmap as _mmap
import os
import pickle
import sys
import zlib
from array import array
from itertools import accumulate, chain
from math import prod
from multiprocessing.reduction import ForkingPickler
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Sequence, Union

import torch

from .. import _interface, _rows, api
from .._keys import keystr
from .._paths import _as_path, parse_keystr
from .._spec import TreeSpec
from ._staging import contiguous_strides
from ._storage import consolidate

__all__ = ["PackedList", "Column"]

MAGIC = b"PKPACK\x00\x01"
ALIGN = 64
_I64 = (-(2**63), 2**63 - 1)

INT, FLOAT, BOOL, STR, BYTES = _rows.INT, _rows.FLOAT, _rows.BOOL, _rows.STR, _rows.BYTES
INTS, FLOATS, PICKLED = _rows.INTS, _rows.FLOATS, _rows.PICKLED
TENSOR, NDARRAY, NPSCALAR = _rows.TENSOR, _rows.NDARRAY, _rows.NPSCALAR

#: the dtypes a tensor or array leaf may have, by their number in a plan (the
#: file names them, so this order is not part of the format)
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)
_DTYPE_ID = {d: i for i, d in enumerate(DTYPES)}
_DTYPE_NAME = {d: str(d).replace("torch.", "") for d in DTYPES}
_NAME_DTYPE = {n: d for d, n in _DTYPE_NAME.items()}
#: the typed buffers of ``_rows.BUFFERS`` other than the index, with their dtypes
_FIXED = {"layouts": torch.int64, "plans": torch.int64, "meta": torch.int64,
          "ints": torch.int64, "floats": torch.float64, "bools": torch.uint8,
          "text": torch.uint8}  # fmt: skip
_ROW_READ = ctypes.pythonapi.PyMemoryView_FromMemory
_ROW_READ.restype = ctypes.py_object
_ROW_READ.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PyBUF_READ = 0x100


def _read_only(t: torch.Tensor, fmt: Any) -> memoryview:
    """A read-only memoryview of a contiguous CPU tensor's memory, as items of ``fmt``.

    The view holds a bare address: the caller keeps the tensor alive, and
    uses the view only while nothing can move the tensor's memory (a
    ``share_memory_()`` moves a storage that is not shared yet, and frees its
    old memory). ``PackedList`` keeps such views only of memory that cannot
    move (docs/reliability.md, "Addresses held")."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"").cast(fmt)
    view: memoryview = _ROW_READ(t.data_ptr(), n, _PyBUF_READ)
    return view.cast(fmt)


def _owned_index(index: torch.Tensor) -> tuple[torch.Tensor, memoryview]:
    """A copy of ``index`` (int64) in a bytearray, as a tensor over it and a
    read-only view of it. The view keeps the bytearray: if the tensor's
    storage is later moved (pickled through ForkingPickler, or a caller's
    ``share_memory_()``), the bytes the view reads stay where they are."""
    owned = bytearray(index.numel() * 8)
    if not owned:
        return torch.empty(0, dtype=torch.int64), memoryview(b"").cast("q")
    t = torch.frombuffer(owned, dtype=torch.int64)
    t.copy_(index.reshape(-1))
    return t, memoryview(owned).toreadonly().cast("q")


class _File(NamedTuple):
    """What a PackedList read from a file keeps of it."""

    memory: Any  # the mapping (or the bytes read), which its tensors view
    file_index: torch.Tensor  # the file's index, a view of ``memory``
    path: Optional[str]  # where it was mapped from (None: read whole, not mapped)
    identity: tuple  # (size, mtime_ns, inode, device) when it was mapped
    start: int  # where the buffers start
    entries: tuple  # (name, dtype name, offset, nbytes) of each buffer


class Column(NamedTuple):
    """What :meth:`PackedList.column` returns.

    ``values``: one tensor when every value is a number (a bool, int or
    float, or an item of a list of numbers), or a tensor of the same shape
    and dtype, stacked; a list otherwise. ``indices``: the samples they are
    from, in increasing order (int64). ``missing``: the samples that have no
    leaf at the path (int64).
    """

    values: Any
    indices: torch.Tensor
    missing: torch.Tensor


class _Restricted(pickle.Unpickler):
    """An unpickler that finds only the classes and functions it is given."""

    def __init__(self, data: bytes, allowed: dict) -> None:
        super().__init__(io.BytesIO(data))
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        found = self._allowed.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"a pickled leaf needs {module}.{name}, which allow= does not name"
            )
        return found


#: elements up to which ``PackedList.__getitems__`` gathers a dtype and
#: shape's tensors together: the gather's index is an int64 an element, and
#: past a few thousand bytes a tensor's own copy costs more than its call
GATHER_UP_TO = 1024
#: tensors of one dtype and shape from which they are gathered: a gather
#: costs about five torch calls, a tensor's own copy two
GATHER_FROM = 4
#: batches that ``__getitems__`` reads sample by sample, without looking for
#: tensors to gather, after a batch in which it found none (ragged samples:
#: the look costs 2-10 µs a sample)
GATHER_RETRY = 16


class _Store:
    """What the samples of a PackedList and of its slices share (never changed)."""

    __slots__ = ("_texts", "allowed", "crcs", "data", "file", "pickled", "specs", "tensors")

    def __init__(
        self,
        specs: list,
        tensors: dict,
        data: dict,
        pickled: int,
        allowed: Optional[dict],
        crcs: Optional[dict] = None,
        file: Optional[_File] = None,
    ) -> None:
        if file is None and not all(
            t.is_shared() for t in chain(tensors.values(), data.values()) if t.numel()
        ):
            # PackedList keeps bare addresses of these (_read_only): in shared
            # memory nothing moves them, and in one storage they cost one file
            # descriptor. (A file's buffers view its mapping, which the store
            # keeps; buffers sent from another process are shared already.)
            tensors, data = consolidate((tensors, data), shared=True)
        self.specs = specs
        self.tensors = tensors  # the buffers of _FIXED, by name
        self.data = data  # dtype number -> the elements of that dtype's tensor leaves
        self.pickled = pickled  # leaves stored pickled
        self.allowed = allowed  # None: pickled leaves are this process's own
        self.crcs = crcs  # buffer name -> CRC-32, for a store read from a file
        self.file: Optional[_File] = file  # for a store read from a file
        self._texts: list = [None] * len(specs)

    def make(self, code: int, a: int, first: int, shape: Any) -> Any:
        """A pickled leaf (``shape`` is its payload) or a tensor/array leaf, rebuilt."""
        if code == PICKLED:
            if self.allowed is None:
                return pickle.loads(shape)
            try:
                return _Restricted(shape, self.allowed).load()
            except pickle.UnpicklingError as e:
                raise ValueError(f"PackedList: {e}") from None
        buf = self.data.get(a)
        n = prod(shape)
        if buf is None or first + n > buf.numel():
            size = 0 if buf is None else buf.numel()
            raise ValueError(
                f"PackedList: a tensor's elements {first}:{first + n} are outside its "
                f"buffer of {size} (the data is corrupt)"
            )
        strides = contiguous_strides(shape)
        try:
            # one view and one copy (a slice, then a view, cost a call each more)
            t = buf.as_strided(shape, strides, buf.storage_offset() + first).clone()
            if code == TENSOR:
                return t
            arr = t.numpy()
        except (RuntimeError, TypeError) as e:  # a dtype numpy lacks, in a changed file
            raise ValueError(
                f"PackedList: a tensor cannot be rebuilt ({e}); the data is corrupt"
            ) from None
        return arr if code == NDARRAY else arr[()]

    def made(self, wanted: list, per: int = 0) -> tuple[list, bool]:
        """What ``make`` gives for each ``(code, a, first, shape)`` of ``wanted``
        (the leaves of several samples, in order), with the tensors of one
        dtype and shape gathered by one ``index_select`` and cut apart by one
        more call, not rebuilt one by one: a few torch calls a batch where
        ``make`` costs two a tensor. The pieces are not views: each has its
        own version counter, as a tensor ``make`` clones has. Also returns
        whether any tensors were gathered.

        ``per``, when not 0, says that every sample has that many entries in
        ``wanted``: then a column (the ``j``-th entry of every sample) whose
        tensors share one dtype and shape is gathered in sample order and put
        in place with one slice assignment, and only the other entries are
        grouped one by one."""
        out: list = [None] * len(wanted)
        rest: Sequence[int] = range(len(wanted))
        gathered = False
        if per:
            rest, gathered = self._columns(wanted, per, out)
        groups: dict = {}  # (dtype number, shape) -> (positions in wanted, firsts)
        for pos in rest:
            code, a, first, shape = wanted[pos]
            if code == TENSOR:
                group = groups.get((a, shape))
                if group is None:
                    groups[(a, shape)] = ([pos], [first])
                else:
                    group[0].append(pos)
                    group[1].append(first)
            else:
                out[pos] = self.make(code, a, first, shape)
        for (a, shape), (where, starts) in groups.items():
            buf = self.data.get(a)
            n = prod(shape)
            if (
                len(where) < GATHER_FROM
                or not 0 < n <= GATHER_UP_TO
                or buf is None
                or max(starts) + n > buf.numel()
            ):  # (make names a corrupt one)
                for pos, first in zip(where, starts):
                    out[pos] = self.make(TENSOR, a, first, shape)
                continue
            for pos, piece in zip(where, _gathered(buf, starts, shape, n)):
                out[pos] = piece
            gathered = True
        return out, gathered

    def _columns(self, wanted: list, per: int, out: list) -> tuple[list, bool]:
        """``made``'s columns: for each ``j`` below ``per``, the ``j``-th entry
        of every sample gathered into ``out`` when all are tensors of one
        dtype and shape. Returns the positions left, and whether any column
        was gathered."""
        rest: list = []
        gathered = False
        codes, dtypes, firsts, shapes = zip(*wanted)
        k = len(wanted) // per
        for j in range(per):
            code, a, _, shape = wanted[j]
            column = slice(j, None, per)
            buf = self.data.get(a) if code == TENSOR else None
            n = 0 if buf is None else prod(shape)
            if (
                buf is not None
                and k >= GATHER_FROM
                and 0 < n <= GATHER_UP_TO
                and codes[column].count(code) == k
                and dtypes[column].count(a) == k
                and shapes[column].count(shape) == k
                and max(firsts[column]) + n <= buf.numel()
            ):
                out[column] = _gathered(buf, firsts[column], shape, n)
                gathered = True
            else:
                rest.extend(range(j, len(wanted), per))
        return rest, gathered

    def texts(self, layout: int) -> dict:
        """The keystr text of each leaf path of ``layout``, to its leaf number."""
        found = self._texts[layout]
        if found is None:
            found = self._texts[layout] = {
                keystr(p): j for j, p in enumerate(self.specs[layout].paths())
            }
        return found

    def nbytes(self) -> int:
        ts = chain(self.tensors.values(), self.data.values())
        return sum(t.numel() * t.element_size() for t in ts)


class PackedList(Sequence):
    """A read-only list of nested samples, packed into a few flat tensors.

    Keep a dataset's samples in one of these instead of a Python list, and
    DataLoader workers stop copying it: the samples live in tensors, which a
    forked worker reads without writing to their pages and a spawned one
    receives through shared memory. Each distinct structure is kept once, as
    a TreeSpec; every leaf is kept in a typed column; ``packed[i]`` rebuilds
    sample ``i`` in the C engine.

    Leaves may be ``int`` (in int64's range), ``float``, ``bool``, ``str``,
    ``bytes`` and ``None``, CPU tensors (plain, dense, without grad) and numpy
    arrays and scalars of a dtype torch has. With ``fallback="pickle"``, any
    other leaf (and an int too large for int64) is stored pickled, and the
    repr says how many were; without it such a leaf raises ``TypeError``
    naming the sample and the path, for example
    ``samples[17]['annotations'][3].segmentation``. Containers are whatever
    ``pytree_kit.flatten`` reads, ``rules=`` included.

    ``packed[i]`` equals the sample packed: the same types, the same dict
    order, tensors equal in dtype, shape and values (returned as new tensors:
    changing them changes nothing stored). A slice, a list of ints or a tensor
    of indices (or a bool mask) gives a PackedList of those samples, sharing
    the storage.

    Examples:
        >>> from pytree_kit.torch import PackedList
        >>> samples = [{"file": f"img{i}.jpg", "size": (480, 640), "boxes": [0.5] * (4 * i)}
        ...            for i in range(1, 4)]
        >>> packed = PackedList(samples)
        >>> packed[2] == samples[2], len(packed), len(packed.specs)
        (True, 3, 1)
        >>> packed.column("['size'][1]").values
        tensor([640, 640, 640])
        >>> packed[1:].column("['file']").values
        ['img2.jpg', 'img3.jpg']
    """

    __slots__ = ("__weakref__", "_alone", "_bufs", "_index", "_store")

    def __init__(
        self,
        samples: Iterable[Any],
        *,
        rules: Any = None,
        fallback: Optional[str] = None,
    ) -> None:
        if fallback not in (None, "pickle"):
            raise ValueError(f"fallback must be None or 'pickle', not {fallback!r}")
        store, index = _pack(samples, rules, fallback == "pickle")
        self._set(store, index)

    # -- construction ----------------------------------------------------------

    def _set(self, store: _Store, index: torch.Tensor) -> None:
        self._store = store
        self._alone = 0  # batches __getitems__ reads sample by sample, gathering nothing
        if (store.file is not None and index is store.file.file_index) or index.is_shared():
            view = _read_only(index, "q")  # memory nothing moves (a file's, or shared)
        else:
            index, view = _owned_index(index)
        self._index = index
        t = store.tensors
        self._bufs = (view, *(_read_only(t[name], fmt) for name, fmt in _rows.BUFFERS[1:]))

    @classmethod
    def _of(cls, store: _Store, index: torch.Tensor) -> PackedList:
        self = cls.__new__(cls)
        self._set(store, index)
        return self

    def __reduce__(self) -> tuple:
        s = self._store
        flat = _one_storage(s)
        if flat is not None:  # torch.save takes no views of one storage as several dtypes
            return (_unpickle_flat, (s.specs, *flat, s.pickled, s.allowed, self._index))
        return (
            _unpickle,
            (s.specs, s.tensors, s.data, s.pickled, s.allowed, self._index),
        )

    # -- the sequence ----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._bufs[0]) // 2

    def __getitem__(self, i: Any) -> Any:  # type: ignore[override]
        if type(i) is int:
            n = len(self._bufs[0]) // 2
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"PackedList index out of range (len {n})")
            return _interface.engine.packed_sample(
                self._bufs, self._store.specs, i, self._store.make
            )
        pairs = self._index.view(-1, 2)
        if type(i) is slice:
            start, stop, step = i.indices(len(pairs))
            if step > 0:
                return PackedList._of(self._store, pairs[i].contiguous().view(-1))
            i = torch.arange(start, stop, step)
        if isinstance(i, torch.Tensor) or (
            isinstance(i, (list, tuple)) and all(type(k) in (int, bool) for k in i)
        ):
            if isinstance(i, torch.Tensor):
                sel = i
            else:
                mask = bool(i) and all(type(k) is bool for k in i)
                sel = torch.tensor(i, dtype=torch.bool if mask else torch.int64)
            if sel.dtype != torch.bool and (sel.is_floating_point() or sel.is_complex()):
                raise TypeError(f"PackedList indices must be integers or bools, not {sel.dtype}")
            if sel.dtype == torch.bool and sel.shape != (len(self),):
                raise IndexError(f"a bool mask of shape {tuple(sel.shape)} for {len(self)} samples")
            return PackedList._of(self._store, pairs[sel].contiguous().view(-1))
        try:
            k = i.__index__()
        except AttributeError:
            raise TypeError(
                f"PackedList indices are ints, slices, lists or tensors, not {type(i).__name__}"
            ) from None
        return self[k]

    def __getitems__(self, indices: Sequence[int]) -> list:
        """The samples at ``indices``, as a list (what a DataLoader's fetcher
        asks for): the same as ``[packed[i] for i in indices]``, but with the
        tensors of one dtype and shape read together, in a few torch calls
        (``packed[i]`` makes two a tensor). The samples are read twice in C:
        first to learn where their tensors lie, then to build them. After a
        batch with nothing to gather, the next ``GATHER_RETRY`` are read
        sample by sample."""
        n = len(self._bufs[0]) // 2
        at = []
        for i in indices:
            if type(i) is not int:
                return [self[i] for i in indices]
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"PackedList index out of range (len {n})")
            at.append(i)
        if len(at) < 2 or self._alone:
            self._alone = max(0, self._alone - 1)
            return [self[i] for i in at]
        read, bufs, store = _interface.engine.packed_sample, self._bufs, self._store
        specs = store.specs
        wanted: list = []
        note = wanted.append

        def where(code: int, a: int, first: int, shape: Any) -> None:
            note((code, a, first, shape))

        per = -1  # entries a sample, while each has as many; 0 once they differ
        for i in at:
            before = len(wanted)
            read(bufs, specs, i, where)
            if per != len(wanted) - before:
                per = len(wanted) - before if per < 0 else 0
        leaves, gathered = store.made(wanted, max(per, 0))
        if not gathered:  # (ragged samples: a shape per few tensors) not worth a look
            self._alone = GATHER_RETRY
        take = iter(leaves).__next__

        def made(code: int, a: int, first: int, shape: Any) -> Any:
            return take()

        return [read(bufs, specs, i, made) for i in at]

    def __iter__(self) -> Iterator[Any]:
        read, bufs, store = _interface.engine.packed_sample, self._bufs, self._store
        for i in range(len(self)):
            yield read(bufs, store.specs, i, store.make)

    def __repr__(self) -> str:
        s = self._store
        extra = f"; {s.pickled} leaves pickled" if s.pickled else ""
        return (
            f"PackedList({len(self)} samples, {len(s.specs)} structures, "
            f"{self.nbytes / 2**20:.1f} MiB{extra})"
        )

    # -- what it holds ---------------------------------------------------------

    @property
    def specs(self) -> tuple:
        """The spec of each layout. A layout is a structure with the types of its
        leaves (int, str, a float32 tensor of 2 dimensions, ...), so one spec
        appears once for each combination of leaf types its samples have."""
        return tuple(self._store.specs)

    @property
    def nbytes(self) -> int:
        """Bytes held in tensors: the columns, the plans and this list's index."""
        return self._store.nbytes() + self._index.numel() * 8

    @property
    def pickled(self) -> int:
        """How many leaves are stored pickled (``fallback="pickle"``)."""
        return self._store.pickled

    def column(self, path: Union[str, tuple]) -> Column:
        """Every sample's leaf at ``path`` (a keystr such as ``"['boxes'][0]"``,
        or a path tuple of keys), without rebuilding the samples.

        The position after a list of numbers reads one item of it
        (``"['bbox'][2]"``); samples whose list is shorter are missing. A list
        of numbers read whole comes back as a 2-D tensor when every one has
        the same length, as a list of lists otherwise. A path that names a
        container in some sample raises ``ValueError``.

        Examples:
            >>> from pytree_kit.torch import PackedList
            >>> packed = PackedList([{"h": 480, "id": "a"}, {"id": "b"}, {"h": 600, "id": "c"}])
            >>> col = packed.column("['h']")
            >>> col.values, col.indices, col.missing
            (tensor([480, 600]), tensor([0, 2]), tensor([1]))
        """
        text = keystr(parse_keystr(path) if type(path) is str else _as_path(path))
        try:
            return _column(self, text)
        except (IndexError, RuntimeError) as e:  # a position the buffers do not hold
            raise ValueError(f"PackedList.column: the data is corrupt ({e})") from None

    # -- files -----------------------------------------------------------------

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write this list to one file (see :meth:`load`); no pickle but pickled leaves."""
        _save(self, path)

    @classmethod
    def load(
        cls,
        path: Union[str, os.PathLike],
        *,
        mmap: bool = True,
        allow: Iterable[Any] = (),
        rules: Any = None,
    ) -> PackedList:
        """Read a list written by :meth:`save`.

        The specs are read as ``TreeSpec.from_json(..., allow=allow,
        rules=rules)``: a class a sample uses must be named in ``allow`` or
        have a rule in ``rules``, and nothing is imported. Pickled leaves
        (``fallback="pickle"``) find only the classes and functions in
        ``allow``.

        With ``mmap=True`` the file is mapped, not read: opening it reads the
        header only, and a sample's pages are read when it is. With
        ``mmap=False`` the file is read whole and every buffer's checksum is
        checked. A file that is not one, or is cut short, raises ``ValueError``;
        so does reading a sample of a changed file whose damage makes a
        position fall outside the buffers. :meth:`verify` checks the
        checksums of a mapped file.
        """
        return _load(cls, path, mmap, allow, rules)

    def verify(self) -> None:
        """Check each buffer against the checksum in its file; ``ValueError`` when
        one differs (the file was changed after it was written). Does nothing
        for a list that was not read from a file."""
        crcs, file = self._store.crcs, self._store.file
        if crcs is None or file is None:
            return
        for name, t in [("index", file.file_index), *_named_buffers(self._store)]:
            if _crc(t) != crcs[name]:
                raise ValueError(f"PackedList: buffer {name!r} does not match its checksum")


def _gathered(buf: torch.Tensor, firsts: Sequence[int], shape: tuple, n: int) -> Any:
    """The tensors of ``shape`` (``n`` elements each) that start at ``firsts``
    in the flat ``buf``: gathered into one new tensor, then cut apart into
    tensors that are not views (each its own version counter)."""
    # (an array's buffer is read as it is, where torch.tensor of a list
    # converts each int: 2.5 against 13 µs for 64)
    starts = torch.frombuffer(array("q", firsts), dtype=torch.int64)
    if n == 1:
        flat = buf.index_select(0, starts)
    else:  # row r of the unfolded buffer is buf[r:r + n]: one index a tensor
        flat = buf.unfold(0, n, 1).index_select(0, starts).view(-1)
    if not shape:  # 0-d: unbind's views, each detached (.data: no base, its own counter)
        return [piece.data for piece in flat.unbind(0)]
    if len(shape) == 1:
        return torch.unsafe_split(flat, n)
    return torch.unsafe_split(flat.view(-1, *shape[1:]), shape[0])


def _unpickle(
    specs: list, tensors: dict, data: dict, pickled: int, allowed: Any, index: Any
) -> PackedList:
    return PackedList._of(_Store(specs, tensors, data, pickled, allowed), index)


def _one_storage(store: _Store) -> Optional[tuple]:
    """``(whole, places)``, when the store's buffers are views of one storage
    (a store made in memory): that storage as one uint8 tensor, and
    ``((kind, key, dtype name, byte offset, elements), ...)`` of each buffer
    (kind ``"t"`` for a buffer of ``tensors``, ``"d"`` for one of ``data``)."""
    named = [("t", k, t) for k, t in store.tensors.items()]
    named += [("d", k, t) for k, t in store.data.items()]
    full = [t for _, _, t in named if t.numel()]
    if not full or store.file is not None:
        return None
    storage = full[0].untyped_storage()
    if any(t.untyped_storage().data_ptr() != storage.data_ptr() for t in full):
        return None
    whole = torch.empty(0, dtype=torch.uint8).set_(storage)
    places = tuple(
        (kind, k, _DTYPE_NAME[t.dtype], t.storage_offset() * t.element_size(), t.numel())
        for kind, k, t in named
    )
    return whole, places


def _unpickle_flat(
    specs: list, whole: torch.Tensor, places: tuple, pickled: int, allowed: Any, index: Any
) -> PackedList:
    """A PackedList pickled by ``_one_storage``: its buffers, views of ``whole`` again."""
    tensors: dict = {}
    data: dict = {}
    storage = whole.untyped_storage()
    for kind, k, dtype_name, offset, n in places:
        dtype = _NAME_DTYPE[dtype_name]
        t = torch.empty(0, dtype=dtype)
        if n:
            t = t.set_(storage, offset // t.element_size(), (n,), (1,))
        (tensors if kind == "t" else data)[k] = t
    return PackedList._of(_Store(specs, tensors, data, pickled, allowed), index)


def _reduce_for_ipc(packed: PackedList) -> tuple:
    """How ForkingPickler (a spawn or forkserver DataLoader's dataset, an
    ``mp.Queue``, torch.multiprocessing) sends a PackedList: a mapped file's
    by its path, to be mapped again (its bytes are not copied into shared
    memory); any other by value, its buffers being in shared memory already."""
    store, file = packed._store, packed._store.file
    if file is None or file.path is None:
        return packed.__reduce__()
    index = None if packed._index is file.file_index else packed._index
    return (
        _remap,
        (file.path, file.identity, file.start, file.entries, store.specs, store.pickled,
         store.allowed, store.crcs, index),
    )  # fmt: skip


def _remap(
    path: str,
    identity: tuple,
    start: int,
    entries: tuple,
    specs: list,
    pickled: int,
    allowed: Any,
    crcs: dict,
    index: Optional[torch.Tensor],
) -> PackedList:
    """A PackedList sent by :func:`_reduce_for_ipc`: the file mapped again,
    when it is still the file that was mapped."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if _identity(st) != tuple(identity):
            raise ValueError(
                f"PackedList: {path!r} changed after it was loaded, so it cannot be "
                "mapped again in this process"
            )
        memory: Any = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_COPY) if st.st_size else b""
    tensors, data = _map_buffers(memory, start, entries)
    own = tensors.pop("index")
    file = _File(memory, own, path, tuple(identity), start, tuple(entries))
    store = _Store(specs, tensors, data, pickled, allowed, crcs, file)
    return PackedList._of(store, own if index is None else index)


def _identity(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _map_buffers(memory: Any, start: int, entries: Iterable[tuple]) -> tuple[dict, dict]:
    """``(tensors by name, data by dtype number)``: views of ``memory`` at the
    entries (checked by ``_load``)."""
    tensors: dict = {}
    data: dict = {}
    for name, dtype_name, offset, nbytes in entries:
        dtype = _NAME_DTYPE[dtype_name]
        item = torch.empty(0, dtype=dtype).element_size()
        t = (
            torch.frombuffer(memory, dtype=dtype, count=nbytes // item, offset=start + offset)
            if nbytes
            else torch.empty(0, dtype=dtype)
        )
        if name.startswith("data."):
            data[_DTYPE_ID[dtype]] = t
        else:
            tensors[name] = t
    return tensors, data


ForkingPickler.register(PackedList, _reduce_for_ipc)


# -- packing ---------------------------------------------------------------------------


class _Layout:
    __slots__ = ("codes", "id", "rows", "samples", "spec")

    def __init__(self, id: int, spec: TreeSpec, codes: tuple) -> None:
        self.id = id
        self.spec = spec
        self.codes = codes
        self.rows: list = []
        self.samples: list = []


def _where(n: int, spec: TreeSpec, j: int, tail: str = "") -> str:
    return f"samples[{n}]{keystr(spec.paths()[j])}{tail}"


def _tensor_code(n: int, spec: TreeSpec, j: int, x: Any) -> tuple:
    """The code of a tensor, array or numpy scalar leaf, or TypeError naming it."""
    if isinstance(x, torch.Tensor):
        why = None
        if type(x) is not torch.Tensor:
            why = f"is a {type(x).__qualname__}; only plain tensors are packed"
        elif x.layout != torch.strided or x.is_nested:
            why = "is not a dense tensor"
        elif x.device.type != "cpu":
            why = f"is on {x.device}; only CPU tensors are packed"
        elif x.requires_grad:
            why = "requires grad; pack x.detach()"
        elif x.dtype not in _DTYPE_ID:
            why = f"has dtype {x.dtype}, which is not packed"
        if why:
            raise TypeError(f"{_where(n, spec, j)} {why}")
        return (TENSOR, _DTYPE_ID[x.dtype], x.dim())
    np = sys.modules.get("numpy")
    if np is not None and (type(x) is np.ndarray or isinstance(x, np.generic)):
        code = NDARRAY if type(x) is np.ndarray else NPSCALAR
        try:
            t = torch.from_numpy(_contiguous(np, x))
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"{_where(n, spec, j)} is a numpy {type(x).__name__} of dtype {x.dtype}, "
                "which torch cannot hold"
            ) from None
        if code == NPSCALAR and type(t.numpy()[()]) is not type(x):
            raise TypeError(f"{_where(n, spec, j)} is a {type(x).__name__}, which is not packed")
        return (code, _DTYPE_ID[t.dtype], x.ndim if code == NDARRAY else 0)
    raise TypeError(
        f"{_where(n, spec, j)} is a {type(x).__qualname__}; PackedList stores int, float, "
        "bool, str, bytes, None, tensors and numpy arrays (fallback='pickle' stores others)"
    )


def _contiguous(np: Any, x: Any) -> Any:
    """A numpy array or scalar as a C-contiguous array of its shape (0-d for a scalar)."""
    return np.ascontiguousarray(x) if x.ndim else np.array(x)


def _codes(n: int, leaves: list, spec: TreeSpec, pickle_others: bool) -> tuple:
    codes: list[Any] = list(_interface.engine.leaf_codes(leaves))
    for j, c in enumerate(codes):
        if c is None:
            x = leaves[j]
            try:
                codes[j] = _tensor_code(n, spec, j, x)
            except TypeError:
                if not pickle_others:
                    raise
                codes[j] = PICKLED
    return tuple(codes)


def _pack(samples: Iterable[Any], rules: Any, pickle_others: bool) -> tuple:
    layouts: dict = {}
    index = array("q")
    flatten = api.flatten
    number_list, leaf_codes = _interface.engine.number_list, _interface.engine.leaf_codes
    for n, sample in enumerate(samples):
        try:
            leaves, spec = flatten(sample, is_leaf=number_list, rules=rules)
        except (TypeError, ValueError) as e:
            raise type(e)(f"samples[{n}]: {e}") from e
        codes = leaf_codes(leaves)
        if None in codes:
            codes = _codes(n, leaves, spec, pickle_others)
        lay = layouts.get((spec, codes))
        if lay is None:
            lay = layouts[spec, codes] = _Layout(len(layouts), spec, codes)
        index.append(lay.id)
        index.append(len(lay.rows))
        lay.rows.append(leaves)
        lay.samples.append(n)
    return _Columns(pickle_others).build(list(layouts.values()), index)


class _Columns:
    """Turns the layouts' rows into the typed buffers (``_rows`` says how they are read)."""

    def __init__(self, pickle_others: bool) -> None:
        self.pickle_others = pickle_others
        self.ints: list = []
        self.floats: list = []
        self.bools: list = []
        self.text: list = []
        self.text_len = 0
        self.meta: list = []
        self.data: dict = {}  # dtype number -> list of flat tensors
        self.data_len: dict = {}
        self.pickled = 0

    def build(self, layouts: list, index: array) -> tuple:
        plans: list = []
        table: list = []
        for lay in layouts:
            table += (len(plans) // 5, len(lay.codes), len(lay.rows))
            columns = list(zip(*lay.rows)) if lay.codes else []
            lay.rows = []  # let the leaves go as they are stored
            plans += chain.from_iterable(self.layout(lay, columns))
        tensors = {
            "layouts": _from_bytes(array("q", table)),
            "plans": _from_bytes(array("q", plans)),
            "meta": _from_bytes(array("q", self.meta)),
            "ints": _from_bytes(array("q", self.ints)),
            "floats": _from_bytes(array("d", self.floats)),
            "bools": _from_bytes(bytes(self.bools)),
            "text": _from_bytes(b"".join(self.text)),
        }
        data = {d: torch.cat(parts) for d, parts in self.data.items()}
        store = _Store([lay.spec for lay in layouts], tensors, data, self.pickled, None)
        return store, _from_bytes(index)

    def _overflow(self, lay: _Layout, j: int, col: Sequence, items: bool) -> Optional[str]:
        """Where an int out of int64's range is in column ``j``, if one is."""
        lo, hi = _I64
        for r, v in enumerate(col):
            for k, x in enumerate(v if items else (v,)):
                if not lo <= x <= hi:
                    return _where(lay.samples[r], lay.spec, j, f"[{k}]" if items else "")
        return None

    def _code(self, lay: _Layout, j: int, code: Any, col: Sequence) -> Any:
        """The column's code, PICKLED for ints out of int64's range when they may be."""
        if code in (INT, INTS):
            values = col if code == INT else list(chain.from_iterable(col))
            if values and (min(values) < _I64[0] or max(values) > _I64[1]):
                if not self.pickle_others:
                    where = self._overflow(lay, j, col, code == INTS)
                    raise TypeError(f"{where} is an int outside int64's range")
                return PICKLED
        return code

    def layout(self, lay: _Layout, columns: list) -> list:
        """The plan of each leaf of ``lay``, its rows stored."""
        m = len(lay.samples)
        plans: list = [None] * len(columns)
        fixed: dict = {INT: [], FLOAT: [], BOOL: []}
        groups: dict = {"text": [], INTS: [], FLOATS: []}
        tensors = []
        for j, col in enumerate(columns):
            code = self._code(lay, j, lay.codes[j], col)
            if code in fixed:
                fixed[code].append(j)
            elif code in (INTS, FLOATS):
                groups[code].append((j, code, col))
            elif code in (STR, BYTES, PICKLED):
                if code == STR:
                    col = [x.encode("utf-8", "surrogatepass") for x in col]
                elif code == PICKLED:
                    col = [pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL) for x in col]
                    self.pickled += len(col)
                groups["text"].append((j, code, col))
            else:
                tensors.append((j, code, col))
        # bools, ints and floats: one block each, a row after another
        for code, js in fixed.items():
            if js:
                target = (self.ints, self.floats, self.bools)[code]
                base = len(target)
                target += chain.from_iterable(zip(*(columns[j] for j in js)))
                for k, j in enumerate(js):
                    plans[j] = (code, base + k, len(js), 0, 0)
        # the row headers: per buffer, where the row's leaves start, then where each
        # ends; per tensor, its first element and its shape
        header: list = []  # columns of the header, each m long
        hb = len(self.meta)
        width = sum(len(g) + 1 for g in groups.values() if g)
        width += sum(1 + code[2] for _, code, _ in tensors)
        for name, group in groups.items():
            if not group:
                continue
            if name == "text":
                at = self.text_len
            else:
                at = len(self.ints if name == INTS else self.floats)
            lens = [list(map(len, col)) for _, _, col in group]
            ends = list(accumulate(map(sum, zip(*lens)), initial=at))
            cur = ends[:-1]
            header.append(cur)
            for (j, code, _), n in zip(group, lens):
                cur = list(map(int.__add__, cur, n))
                header.append(cur)
                plans[j] = (code, hb + len(header) - 1, width, 1, 0)
            rows = chain.from_iterable(zip(*(col for _, _, col in group)))
            if name == "text":
                joined = b"".join(rows)
                self.text.append(joined)
                self.text_len += len(joined)
            else:
                (self.ints if name == INTS else self.floats).extend(chain.from_iterable(rows))
        np = sys.modules.get("numpy")
        for j, (kind, dtype, ndim), col in tensors:
            parts = self.data.setdefault(dtype, [])
            at = self.data_len.get(dtype, 0)
            firsts = []
            shapes = []
            for x in col:
                t = x if kind == TENSOR else torch.from_numpy(_contiguous(np, x))
                t = t.resolve_conj().resolve_neg().reshape(-1)
                firsts.append(at)
                shapes.append(tuple(x.shape))
                parts.append(t)
                at += t.numel()
            self.data_len[dtype] = at
            plans[j] = (kind, hb + len(header), width, dtype, ndim)
            header.append(firsts)
            header += [list(d) for d in zip(*shapes)] if ndim else []
        assert len(header) == width
        if width:
            self.meta += chain.from_iterable(zip(*header))
        assert all(len(h) == m for h in header)
        return plans


def _from_bytes(data: Any) -> torch.Tensor:
    """An int64 or float64 (an array of q or d) or uint8 (bytes) tensor holding a
    copy of ``data``."""
    dtype = torch.uint8
    if isinstance(data, array):
        dtype = torch.float64 if data.typecode == "d" else torch.int64
    if not len(data):
        return torch.empty(0, dtype=dtype)
    # a copy in torch's own memory: the bytearray goes, and the storage can be shared
    return torch.frombuffer(bytearray(data), dtype=dtype).clone()


# -- reading a column ---------------------------------------------------------------


def _column(packed: PackedList, text: str) -> Column:
    store = packed._store
    n = len(packed)
    pairs = packed._index.view(-1, 2)
    layout_of = pairs[:, 0]
    tables = store.tensors["layouts"].view(-1, 3)
    plans = store.tensors["plans"].view(-1, 5)
    meta = store.tensors["meta"]
    if n and not 0 <= int(layout_of.min()) <= int(layout_of.max()) < len(store.specs):
        raise ValueError(
            "PackedList.column: a sample's layout does not exist (the data is corrupt)"
        )
    # the samples of each layout, in increasing order: one stable sort
    order = torch.argsort(layout_of, stable=True)
    counts = torch.bincount(layout_of, minlength=len(store.specs)).tolist()
    found: list = []  # (samples, values)
    numbers = True
    at_sample = 0
    for layout, count in enumerate(counts):
        samples = order[at_sample : at_sample + count]
        at_sample += count
        if not count:
            continue
        texts = store.texts(layout)
        j = texts.get(text)
        item = None
        if j is None:
            j, item = _inside_list(layout, text, texts, plans, tables)
            if j is None:
                continue
        plan = tuple(plans[int(tables[layout, 0]) + j].tolist())
        code, base, stride, a, _ = plan
        rows = pairs[samples, 1]
        at = base + rows * stride
        if item is not None:  # one item of a list of numbers
            lo, hi = meta[at - a], meta[at]
            has = hi - lo > item
            items = store.tensors["ints" if code == INTS else "floats"]
            found.append((samples[has], items[lo[has] + item]))
        elif code in (INT, FLOAT, BOOL):
            vals = store.tensors[("ints", "floats", "bools")[code]][at]
            found.append((samples, vals.bool() if code == BOOL else vals))
        else:
            found.append((samples, _objects(store, plan, at, rows)))
            numbers = False
    present = torch.zeros(n, dtype=torch.bool)
    for samples, _ in found:
        present[samples] = True
    index = present.nonzero().view(-1)
    values: Any
    if found and numbers:
        dtype = found[0][1].dtype
        for _, vals in found[1:]:
            dtype = torch.promote_types(dtype, vals.dtype)
        out = torch.empty(n, dtype=dtype)
        for samples, vals in found:
            out[samples] = vals.to(dtype)
        values = out[index]
    else:
        out_list: list = [None] * n
        for samples, vals in found:
            for k, v in zip(
                samples.tolist(), vals.tolist() if isinstance(vals, torch.Tensor) else vals
            ):
                out_list[k] = v
        values = _stacked([out_list[k] for k in index.tolist()])
    return Column(values, index, (~present).nonzero().view(-1))


def _stacked(values: list) -> Any:
    """One tensor when every value is a tensor of one shape and dtype, or a list of
    numbers of one length and type; the list otherwise."""
    if not values:
        return values
    first = values[0]
    if type(first) is torch.Tensor:
        if all(
            type(v) is torch.Tensor and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        ):
            return torch.stack(values)
    elif type(first) is list and first:
        t = type(first[0])
        if all(type(v) is list and len(v) == len(first) and type(v[0]) is t for v in values):
            return torch.tensor(values, dtype=torch.int64 if t is int else torch.float64)
    return values


def _inside_list(layout: int, text: str, texts: dict, plans: Any, tables: Any) -> tuple:
    """(leaf, item) when ``text`` is an item of a list-of-numbers leaf of ``layout``;
    (None, None) when the layout has nothing at ``text``; ValueError when ``text``
    names a container there."""
    for t in texts:
        if t.startswith(text) and t[len(text) : len(text) + 1] in ("[", "."):
            raise ValueError(
                f"PackedList.column: {text} is a container in the samples of structure "
                f"{layout}, not a leaf (its leaves include {t})"
            )
    cut = text.rfind("[")
    if cut > 0 and text.endswith("]") and text[cut + 1 : -1].isdigit():
        j = texts.get(text[:cut])
        if j is not None:
            code = int(plans[int(tables[layout, 0]) + j, 0])
            if code in (INTS, FLOATS):
                return j, int(text[cut + 1 : -1])
    return None, None


def _objects(store: _Store, plan: tuple, at: torch.Tensor, rows: torch.Tensor) -> list:
    """The leaves of one plan entry at header positions ``at`` (rows ``rows``)
    that are not single numbers."""
    code, a = plan[0], plan[3]
    if code in (STR, BYTES, INTS, FLOATS):
        meta = store.tensors["meta"]
        spans = zip(meta[at - a].tolist(), meta[at].tolist())
        if code in (INTS, FLOATS):
            items = store.tensors["ints" if code == INTS else "floats"]
            return [items[lo:hi].tolist() for lo, hi in spans]
        text = _read_only(store.tensors["text"], "B")
        if code == BYTES:
            return [bytes(text[lo:hi]) for lo, hi in spans]
        return [str(text[lo:hi], "utf-8", "surrogatepass") for lo, hi in spans]
    bufs = (
        memoryview(b""),
        memoryview(array("q", [0, 1, _rows.LIMIT])),
        memoryview(array("q", plan)),
        *(_read_only(store.tensors[name], fmt) for name, fmt in _rows.BUFFERS[3:]),
    )
    return [_rows.row_leaves(bufs, -1, 0, r, store.make)[0] for r in rows.tolist()]


# -- files ---------------------------------------------------------------------------


def _named_buffers(store: _Store) -> list:
    named = list(store.tensors.items())
    named += [(f"data.{_DTYPE_NAME[DTYPES[d]]}", t) for d, t in sorted(store.data.items())]
    return named


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(_read_only(t, "B"))


def _save(packed: PackedList, path: Any) -> None:
    store = packed._store
    named = [("index", packed._index), *_named_buffers(store)]
    buffers = []
    offset = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        buffers.append(
            {
                "name": name,
                "dtype": _DTYPE_NAME[t.dtype],
                "offset": offset,
                "nbytes": nbytes,
                "crc32": _crc(t),
            }
        )
        offset += -(-nbytes // ALIGN) * ALIGN
    end = max((b["offset"] + b["nbytes"] for b in buffers), default=0)
    header = json.dumps(
        {
            "format": 1,
            "samples": len(packed),
            "data": end,
            "pickled": store.pickled,
            "specs": [spec.to_json() for spec in store.specs],
            "buffers": buffers,
        },
        separators=(",", ":"),
    ).encode()
    start = -(-(len(MAGIC) + 12 + len(header)) // ALIGN) * ALIGN
    with open(path, "wb") as f:
        f.write(
            MAGIC + len(header).to_bytes(8, "little") + zlib.crc32(header).to_bytes(4, "little")
        )
        f.write(header)
        for (_, t), b in zip(named, buffers):
            f.seek(start + b["offset"])
            f.write(_read_only(t, "B"))
        f.truncate(start + end)


def _bad(path: Any, what: str) -> ValueError:
    return ValueError(f"PackedList.load: {os.fspath(path)!r} {what}")


def _load(cls: Any, path: Any, mapped: bool, allow: Iterable[Any], rules: Any) -> PackedList:
    if sys.byteorder != "little":
        raise ValueError("PackedList files are little-endian; this machine is not")
    allow = tuple(allow)
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        size = st.st_size
        head = f.read(len(MAGIC) + 12)
        if len(head) < len(MAGIC) + 12 or head[: len(MAGIC)] != MAGIC:
            raise _bad(path, "is not a PackedList file")
        n = int.from_bytes(head[len(MAGIC) : len(MAGIC) + 8], "little")
        if n > size:
            raise _bad(path, "is cut short (its header runs past its end)")
        header = f.read(n)
        if len(header) != n or zlib.crc32(header) != int.from_bytes(head[-4:], "little"):
            raise _bad(path, "has a damaged header (its checksum differs)")
        start = -(-(len(MAGIC) + 12 + n) // ALIGN) * ALIGN
        if mapped:
            keep: Any = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_COPY) if size else b""
        else:
            f.seek(0)
            keep = bytearray(f.read())
    try:
        doc = json.loads(header)
        samples, pickled, texts = int(doc["samples"]), int(doc["pickled"]), list(doc["specs"])
        written = start + int(doc["data"])
        entries = {b["name"]: b for b in doc["buffers"]}
        if len(entries) != len(doc["buffers"]) or doc["format"] != 1:
            raise ValueError("its buffers are listed twice, or its format is not 1")
    except (ValueError, KeyError, TypeError) as e:
        raise _bad(path, f"has a malformed header ({type(e).__name__}: {e})") from None
    if written != size:
        raise _bad(path, f"is {size} bytes, not the {written} it was written as (cut short?)")
    crcs: dict = {}
    checked = []
    for name, b in entries.items():
        try:
            dtype = _NAME_DTYPE[b["dtype"]]
            offset, nbytes, crc = int(b["offset"]), int(b["nbytes"]), int(b["crc32"])
        except (KeyError, TypeError, ValueError):
            raise _bad(path, f"has a malformed entry for buffer {name!r}") from None
        item = torch.empty(0, dtype=dtype).element_size()
        if offset < 0 or nbytes < 0 or nbytes % item or start + offset + nbytes > size:
            raise _bad(path, f"is cut short or damaged (buffer {name!r} is outside the file)")
        if name.startswith("data."):
            if _NAME_DTYPE.get(name[5:]) != dtype:
                raise _bad(path, f"has a buffer {name!r} of dtype {b['dtype']}")
        elif name != "index" and _FIXED.get(name) != dtype:
            raise _bad(path, f"has an unknown buffer {name!r} of dtype {b['dtype']}")
        crcs[name] = crc
        checked.append((name, b["dtype"], offset, nbytes))
    tensors, data = _map_buffers(keep, start, checked)
    index = tensors.pop("index", None)
    if index is None or set(tensors) != set(_FIXED) or index.numel() != 2 * samples:
        raise _bad(path, "lacks a buffer, or its index does not hold its samples")
    specs = [TreeSpec.from_json(text, allow=allow, rules=rules) for text in texts]
    table = tensors["layouts"]
    if table.numel() != 3 * len(specs) or any(
        int(table[3 * k + 1]) != spec.num_leaves for k, spec in enumerate(specs)
    ):
        raise _bad(path, "has layouts that do not match its specs")
    allowed = {(getattr(x, "__module__", None), getattr(x, "__qualname__", None)): x for x in allow}
    where = os.path.abspath(os.fspath(path)) if mapped else None
    file = _File(keep, index, where, _identity(st), start, tuple(checked))
    store = _Store(specs, tensors, data, pickled, allowed, crcs, file)
    packed = cls._of(store, index)
    if not mapped:
        packed.verify()
    return packed
