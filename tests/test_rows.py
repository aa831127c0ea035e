"""packed_sample, the read behind PackedList: the C engine's (_rows.c) against
the specification (pytree_kit/_rows.py) on hand-made buffers holding every
leaf code, whole and damaged (every answer and every error message the same),
without torch: this runs on every Python."""

from __future__ import annotations

import array
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pytree_kit as pk
from pytree_kit import _engine, _interface, _rows
from pytree_kit._rows import (
    BOOL,
    BYTES,
    FLOAT,
    FLOATS,
    INT,
    INTS,
    NDARRAY,
    NPSCALAR,
    PICKLED,
    STR,
    TENSOR,
)

try:
    from pytree_kit import _speedups
except ImportError:  # the pure engine only
    _speedups = None  # type: ignore[assignment]

# runs the engines side by side, not through the public API: the same whichever
# engine that uses, so the pure-engine jobs leave it out (scripts/ci.py)
pytestmark = pytest.mark.side_by_side

READERS = [_rows.packed_sample] + ([_speedups.packed_sample] if _speedups else [])


def make(code: int, a: int, first: int, shape: Any) -> Any:
    """What PackedList's make does, in a form a test can see."""
    if code == PICKLED:
        return pickle.loads(shape)
    return ("tensor", code, a, first, shape)


def example() -> tuple[list, list, list]:
    """Two layouts, three samples, every leaf code; (buffers as lists, specs, the samples)."""
    sample_a = {
        "n": 7,
        "x": 2.5,
        "ok": True,
        "name": "héllo",
        "raw": b"\x00\xff",
        "ids": [1, -2, 3],
        "xy": [0.5, 1.5],
        "obj": {1, 2},
        "t": ("tensor", TENSOR, 3, 0, (2, 3)),
        "a": ("tensor", NDARRAY, 1, 6, (4,)),
        "s": ("tensor", NPSCALAR, 0, 10, ()),
    }
    spec_a = pk.structure(sample_a, is_leaf=lambda x: type(x) in (list, tuple, set))
    # leaves in spec order: a, ids, n, name, obj, ok, raw, s, t, x, xy
    order = [p[0].key for p in spec_a.paths()]
    assert order == ["a", "ids", "n", "name", "obj", "ok", "raw", "s", "t", "x", "xy"]
    spec_b = pk.structure([1, "z"])
    obj = pickle.dumps({1, 2})
    text = "héllo".encode() + b"\x00\xff" + obj + b"z"
    # layout 0, one row; header: text start, name end, raw end, obj end | ints start,
    # ids end | floats start, xy end | t: first, 2, 3 | a: first, 4 | s: first
    header = [0, 6, 8, 8 + len(obj), 1, 4, 1, 3, 0, 2, 3, 6, 4, 10]
    width = len(header)
    plans = [
        (NDARRAY, 11, width, 1, 1),  # a
        (INTS, 5, width, 1, 0),  # ids
        (INT, 0, 1, 0, 0),  # n
        (STR, 1, width, 1, 0),  # name
        (PICKLED, 3, width, 1, 0),  # obj
        (BOOL, 0, 1, 0, 0),  # ok
        (BYTES, 2, width, 1, 0),  # raw
        (NPSCALAR, 13, width, 0, 0),  # s
        (TENSOR, 8, width, 3, 2),  # t
        (FLOAT, 0, 1, 0, 0),  # x
        (FLOATS, 7, width, 1, 0),  # xy
    ]
    # layout 1, two rows of [int, str]: ints 4 and 5, header (start, end) per row
    end = len(text) - 1
    plans += [(INT, 4, 1, 0, 0), (STR, width + 1, 2, 1, 0)]
    header += [end, end, end, end + 1]
    text_all = text
    bufs = [
        [0, 0, 1, 1, 1, 0],  # index: sample 0 -> layout 0 row 0; 1 -> (1, 1); 2 -> (1, 0)
        [0, 11, 1, 11, 2, 2],
        [v for p in plans for v in p],
        header,
        [7, 1, -2, 3, 1, 1],
        [2.5, 0.5, 1.5],
        [1],
        list(text_all),
    ]
    return bufs, [spec_a, spec_b], [sample_a, [1, "z"], [1, ""]]


def views(bufs: list) -> tuple:
    out = []
    for (_name, fmt), values in zip(_rows.BUFFERS, bufs):
        out.append(
            memoryview(array.array(fmt, values)) if fmt != "B" else memoryview(bytes(values))
        )
    return tuple(out)


def outcome(read: Any, bufs: tuple, specs: list, i: int) -> Any:
    try:
        return ("ok", read(bufs, specs, i, make))
    except Exception as e:  # the same type and message from both
        return ("error", type(e), str(e))


@pytest.mark.parametrize("read", READERS)
def test_every_code_reads_back(read: Any) -> None:
    raw, specs, samples = example()
    bufs = views(raw)
    got = read(bufs, specs, 0, make)
    want = samples[0]
    assert list(got) == list(want)  # the dict's order
    assert got == want
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
    assert read(bufs, specs, 1, make) == [1, "z"]
    assert read(bufs, specs, 2, make) == [1, ""]


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize("i", [-1, 3, 2**70])
def test_out_of_range(read: Any, i: int) -> None:
    raw, specs, _ = example()
    with pytest.raises(IndexError, match="out of range"):
        read(views(raw), specs, i, make)


@pytest.mark.skipif(_speedups is None, reason="the C engine is not built")
@given(st.data())
def test_damaged_buffers_give_the_same_answer_in_both_engines(data: st.DataObject) -> None:
    raw, specs, _ = example()
    for _ in range(data.draw(st.integers(1, 3))):
        b = data.draw(st.integers(0, len(raw) - 1))
        if not raw[b]:
            continue
        k = data.draw(st.integers(0, len(raw[b]) - 1))
        if _rows.BUFFERS[b][1] == "B":
            raw[b][k] = data.draw(st.one_of(st.integers(0, 3), st.integers(0, 255)))
        elif _rows.BUFFERS[b][1] == "d":
            raw[b][k] = data.draw(st.floats())
        else:
            raw[b][k] = data.draw(st.one_of(st.integers(-3, 40), st.integers(-(2**63), 2**63 - 1)))
    bufs = views(raw)
    for i in range(3):
        mine = outcome(_rows.packed_sample, bufs, specs, i)
        theirs = outcome(_speedups.packed_sample, bufs, specs, i)
        if mine[0] == "ok" and theirs[0] == "ok":
            assert repr(mine[1]) == repr(theirs[1])
        else:
            assert mine == theirs


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize(
    "damage, message",
    [
        ((0, 0, 9), "layout 9 does not exist"),
        ((0, 1, 5), "row 5 of layout 0 does not exist"),
        ((6, 0, 2), "a bool is stored as 2"),
        ((3, 1, 10**6), "a span 0:1000000 is outside its buffer"),
        ((3, 1, -1), "a span 0:-1 is outside"),
        ((2, 0, 99), "unknown leaf code 99"),
        ((2, 1, -4), "leaf 0 is at -4 \\+ row"),
        ((2, 4, 65), "a tensor has 65 dimensions"),
        ((3, 9, -2), "a tensor starts at 0 with shape \\(-2, 3\\)"),
        ((2, 8, 0), "leaf 1 starts 0 before its end"),
        ((1, 0, 2**60), "the plan of layout 0 is out of bounds"),
        ((1, 2, 2**50), "the plan of layout 0 is out of bounds"),
        ((2, 11, 2**49), "leaf 2 is at 562949953421312"),
        ((7, 1, 255), "a str is not UTF-8"),
    ],
)
def test_damage_is_named(read: Any, damage: tuple, message: str) -> None:
    raw, specs, _ = example()
    b, k, v = damage
    raw[b][k] = v
    with pytest.raises(ValueError, match="sample 0 cannot be read: " + message):
        read(views(raw), specs, 0, make)


def test_the_c_codes_are_the_specifications() -> None:
    text = (Path(_rows.__file__).parent / "_rows.c").read_text()
    enum = re.search(r"enum \{ (C_INT.*?C_COUNT) \}", text, re.S)
    assert enum is not None
    names = [n.strip() for n in enum.group(1).split(",")]
    mine = ["INT", "FLOAT", "BOOL", "STR", "BYTES", "INTS", "FLOATS", "PICKLED", "TENSOR"]
    mine += ["NDARRAY", "NPSCALAR"]
    assert names == ["C_" + n for n in mine] + ["C_COUNT"]
    assert [getattr(_rows, n) for n in mine] == list(range(_rows.CODES))
    buffers = re.search(r"enum \{ (B_INDEX.*?B_COUNT) \}", text, re.S)
    assert buffers is not None
    assert [n.strip() for n in buffers.group(1).split(",")] == [
        "B_" + name.upper() for name, _ in _rows.BUFFERS
    ] + ["B_COUNT"]


def test_the_engine_reads_with_its_own_function() -> None:
    assert _interface.engine.packed_sample is (
        _speedups.packed_sample if _engine.ENGINE == "c" else _rows.packed_sample
    )


values = st.one_of(
    st.integers(),
    st.floats(),
    st.booleans(),
    st.text(max_size=2),
    st.binary(max_size=2),
    st.none(),
    st.tuples(st.integers()),
)
lists = st.one_of(
    st.lists(st.integers(), max_size=4),
    st.lists(st.floats(), max_size=4),
    st.lists(st.one_of(st.integers(), st.floats(), st.booleans()), max_size=4),
    st.lists(values, max_size=3),
)


class Int(int):
    pass


@pytest.mark.skipif(_speedups is None, reason="the C engine is not built")
@given(st.lists(st.one_of(values, lists, st.builds(Int, st.integers()))))
def test_packing_codes_match_the_specification(leaves: list) -> None:
    assert _speedups.leaf_codes(leaves) == _rows.leaf_codes(leaves)
    assert [_speedups.number_list(x) for x in leaves] == [_rows.number_list(x) for x in leaves]


def test_packing_codes() -> None:
    read = _interface.engine.leaf_codes
    assert read([1, 2.0, True, "s", b"b", [1, 2], [0.5], [], [1, 2.0], Int(1), None]) == (
        INT, FLOAT, BOOL, STR, BYTES, INTS, FLOATS, None, None, None, None
    )  # fmt: skip
    assert read(()) == ()
    assert _interface.engine.number_list([True, False]) is False
