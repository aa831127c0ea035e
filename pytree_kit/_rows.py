"""Rebuilding one sample of a packed dataset from typed rows: the read behind
``pytree_kit.torch.PackedList``. This is the specification; the C engine has
the same function (``_rows.c``), with the same results and the same errors.

A packed dataset keeps each distinct structure once (a TreeSpec and a *plan*:
what each of its leaves is and where it is kept) and every leaf in flat, typed
buffers. ``bufs`` is a tuple of eight memoryviews, in this order:

==========  ======  ===========================================================
name        format  what it holds
==========  ======  ===========================================================
``index``   ``q``   two per sample: its layout and its row in that layout
``layouts`` ``q``   three per layout: where its plan starts, its leaves, its rows
``plans``   ``q``   five per leaf: code, base, stride, a, b (below)
``meta``    ``q``   the rows' headers: where their variable-length leaves end,
                    tensors' first elements and shapes
``ints``    ``q``   int leaves, and the items of lists of ints
``floats``  ``d``   float leaves, and the items of lists of floats
``bools``   ``B``   bool leaves (0 or 1)
``text``    ``B``   str (UTF-8, surrogates passed), bytes and pickled leaves
==========  ======  ===========================================================

Rows are kept whole, not column by column, so that reading one sample reads a
few runs of memory: a layout's bool, int and float leaves are blocks with one
row after another (``stride`` leaves a row), and a row's variable-length
leaves follow each other. Leaf ``(code, base, stride, a, b)`` of row ``r`` is
read at ``k = base + r * stride``:

- ``INT``, ``FLOAT``, ``BOOL``: ``ints``, ``floats`` or ``bools`` at ``k``;
- ``STR``, ``BYTES``, ``PICKLED``, ``INTS``, ``FLOATS`` (a list of ints or of
  floats): from ``meta[k - a]`` to ``meta[k]`` in ``text``, ``ints`` or
  ``floats`` (the row header holds where the row's leaves of that buffer
  start, then where each ends); a pickled leaf is ``make(code, 0, 0, payload)``;
- ``TENSOR``, ``NDARRAY``, ``NPSCALAR`` (``a`` names the dtype's buffer, ``b``
  is the number of dimensions): ``meta[k]`` is the first element and the
  ``b`` numbers after it the shape; the leaf is ``make(code, a, first, shape)``.

Nothing here trusts the buffers: every position is checked against the
lengths, and a read that falls outside them raises ``ValueError`` (a file that
was cut short or changed), never reads past a buffer.
"""

from __future__ import annotations

from typing import Any, Callable

INT, FLOAT, BOOL, STR, BYTES, INTS, FLOATS, PICKLED, TENSOR, NDARRAY, NPSCALAR = range(11)
#: how many codes there are (the C engine's enum is checked against these)
CODES = 11
#: the buffers of ``bufs``, in order, with their memoryview formats
BUFFERS = (
    ("index", "q"),
    ("layouts", "q"),
    ("plans", "q"),
    ("meta", "q"),
    ("ints", "q"),
    ("floats", "d"),
    ("bools", "B"),
    ("text", "B"),
)

#: the largest column start and row count read (positions stay far from 2**63)
LIMIT = 2**48

Make = Callable[[int, int, int, Any], Any]

_SIMPLE = {int: INT, float: FLOAT, bool: BOOL, str: STR, bytes: BYTES}


def number_list(x: Any) -> bool:
    """Whether ``x`` is packed as one leaf: a non-empty list of exact ints or of
    exact floats (the ``is_leaf`` of packing).

    Examples:
        >>> number_list([1, 2]), number_list([0.5]), number_list([1, 2.5]), number_list([])
        (True, True, False, False)
        >>> number_list([True]), number_list((1, 2))
        (False, False)
    """
    if type(x) is not list or not x:
        return False
    t = type(x[0])
    if t is not float and t is not int:
        return False
    for v in x:
        if type(v) is not t:
            return False
    return True


def leaf_codes(leaves: list) -> tuple:
    """The code of each leaf that is an exact int, float, bool, str or bytes, or a
    number list (``INTS``/``FLOATS``); None for any other leaf.

    Examples:
        >>> leaf_codes([1, 2.0, True, "a", b"b", [1], [1.0], None, (1,)])
        (0, 1, 2, 3, 4, 5, 6, None, None)
    """
    return tuple(map(_code, leaves))


def _code(x: Any) -> Any:
    code = _SIMPLE.get(type(x))
    if code is None and number_list(x):
        return INTS if type(x[0]) is int else FLOATS
    return code


def corrupt(i: int, what: str) -> ValueError:
    """The error of a read that the buffers do not allow (the same in C)."""
    return ValueError(f"PackedList: sample {i} cannot be read: {what} (the data is corrupt)")


def packed_sample(bufs: tuple, specs: Any, i: int, make: Make) -> Any:
    """Sample ``i`` (``0 <= i < len(index) // 2``), rebuilt: its layout's spec
    (``specs[layout]``) unflattened with its leaves, read from ``bufs``.

    Examples:
        >>> import array, pytree_kit as pk
        >>> spec = pk.structure({"name": "x", "n": 0, "xy": [0.0, 0.0]},
        ...                     is_leaf=lambda x: type(x) is list)
        >>> spec.unflatten([1, 2, 3])  # the order of its leaves: n, name, xy
        {'name': 2, 'n': 1, 'xy': 3}
        >>> q = lambda *v: memoryview(array.array("q", v))
        >>> plan = q(BOOL, 0, 1, 0, 0,  STR, 1, 4, 1, 0,  FLOATS, 3, 4, 1, 0)
        >>> header = q(0, 5, 0, 2)  # text starts at 0, the str ends at 5; floats 0, 2
        >>> bufs = (q(0, 0), q(0, 3, 1), plan, header, q(),
        ...         memoryview(array.array("d", [1.5, 2.5])), memoryview(b"\\x01"),
        ...         memoryview(b"hello"))
        >>> packed_sample(bufs, [spec], 0, None)
        {'name': 'hello', 'n': True, 'xy': [1.5, 2.5]}
    """
    index, layouts = bufs[0], bufs[1]
    if not 0 <= i < len(index) // 2:
        raise IndexError(f"PackedList: sample {i} is out of range")
    layout, row = index[2 * i], index[2 * i + 1]
    if not 0 <= layout < len(layouts) // 3 or layout >= len(specs):
        raise corrupt(i, f"layout {layout} does not exist")
    return specs[layout].unflatten(row_leaves(bufs, i, layout, row, make))


def row_leaves(bufs: tuple, i: int, layout: int, row: int, make: Make) -> list:
    """The leaves of row ``row`` of layout ``layout`` (``i`` names the sample in errors)."""
    _, layouts, plans, meta, ints, floats, bools, text = bufs
    start, count, rows = layouts[3 * layout], layouts[3 * layout + 1], layouts[3 * layout + 2]
    if not 0 <= row < rows:
        raise corrupt(i, f"row {row} of layout {layout} does not exist")
    if (
        start < 0
        or count < 0
        or rows > LIMIT
        or start > len(plans)
        or count > len(plans)
        or (start + count) * 5 > len(plans)
    ):
        raise corrupt(i, f"the plan of layout {layout} is out of bounds")
    leaves = []
    for j in range(count):
        p = 5 * (start + j)
        code, base, stride, a, b = plans[p : p + 5]
        if not (0 <= base <= LIMIT and 0 <= stride <= LIMIT):
            raise corrupt(i, f"leaf {j} is at {base} + row * {stride}")
        k = base + row * stride
        if code == INT:
            leaves.append(_at(ints, k, i))
        elif code == FLOAT:
            leaves.append(_at(floats, k, i))
        elif code == BOOL:
            v = _at(bools, k, i)
            if v > 1:
                raise corrupt(i, f"a bool is stored as {v}")
            leaves.append(v == 1)
        elif code in (STR, BYTES, PICKLED, INTS, FLOATS):
            target = ints if code == INTS else floats if code == FLOATS else text
            if not 0 < a <= LIMIT:
                raise corrupt(i, f"leaf {j} starts {a} before its end")
            lo, hi = _at(meta, k - a, i), _at(meta, k, i)
            if not 0 <= lo <= hi <= len(target):
                raise corrupt(i, f"a span {lo}:{hi} is outside its buffer of {len(target)}")
            if code == STR:
                try:
                    leaves.append(bytes(text[lo:hi]).decode("utf-8", "surrogatepass"))
                except UnicodeDecodeError:
                    raise corrupt(i, "a str is not UTF-8") from None
            elif code == BYTES:
                leaves.append(bytes(text[lo:hi]))
            elif code == PICKLED:
                leaves.append(make(code, 0, 0, bytes(text[lo:hi])))
            else:
                leaves.append(target[lo:hi].tolist())
        elif code in (TENSOR, NDARRAY, NPSCALAR):
            if b < 0 or b > 64:
                raise corrupt(i, f"a tensor has {b} dimensions")
            first = _at(meta, k, i)
            shape = tuple(_at(meta, k + 1 + d, i) for d in range(b))
            if first < 0 or any(n < 0 for n in shape):
                raise corrupt(i, f"a tensor starts at {first} with shape {shape}")
            leaves.append(make(code, a, first, shape))
        else:
            raise corrupt(i, f"unknown leaf code {code}")
    return leaves


def _at(buf: memoryview, k: int, i: int) -> Any:
    if not 0 <= k < len(buf):
        raise corrupt(i, f"position {k} is outside a buffer of {len(buf)}")
    return buf[k]
