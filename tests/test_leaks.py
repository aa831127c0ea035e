"""No leaks, no reference cycles: the fast subset of ``scripts/leaks.py``.

Through the public API, so it covers whichever engine is active (the suite
runs once with the C engine and once with ``PYTREE_KIT_PURE=1``). Each
operation goes round every node kind of ``scripts/corpus/workload.py``; the error
calls each raise inside the engine. The detectors are shown to catch leaks
injected on purpose, so these tests can fail.
"""

from __future__ import annotations

from typing import Any

import pytest

import pytree_kit as pk
from pytree_kit import _kinds
from scripts.corpus import workload as w

# Calls per operation without tracemalloc (refcounts; RSS recorded, not judged:
# a CI machine's RSS is too noisy for a 20,000-call run), and with it. A leak
# of one object per call grows the traced size by >= 16 B a call, so 2,000
# traced calls give >= 32 KiB against a 4 KiB limit; tracemalloc slows the
# calls 4-8x, which is why fewer of them are traced. The pure engine is 3-7x
# slower (more with tracemalloc), so it gets fewer calls to stay within
# seconds: measured 3.9 s (C) and 5.3 s (pure) for this file on 2 shared cores.
CALLS = 20_000 if pk.ENGINE == "c" else 5_000
TRACE_CALLS = 2_000 if pk.ENGINE == "c" else 1_000
CHUNKS = 4


@pytest.fixture(scope="module")
def workload() -> tuple[dict[str, list[w.Call]], list[Any]]:
    api = w.public_api()
    cases = w.kind_cases()
    calls = w.leak_calls(api, cases)
    tracked = w.tracked_objects([c.tree for c in cases] + calls[w.ERRORS])
    return calls, tracked


def test_workload_covers_every_node_kind() -> None:
    seen: set[int] = set()
    for case in w.kind_cases():
        spec = pk.structure(case.tree, is_leaf=case.is_leaf, rules=case.rules)
        seen.update(node[0] for node in spec._nodes)
    assert sorted(_kinds.KIND_NAMES[k] for k in seen) == sorted(_kinds.KIND_NAMES)


@pytest.mark.parametrize("op", [*w.OPS, w.ERRORS])
def test_no_leak(op: str, workload: tuple[dict[str, list[w.Call]], list[Any]]) -> None:
    calls, tracked = workload
    r = w.measure(
        op,
        calls[op],
        CALLS,
        tracked,
        chunks=CHUNKS,
        warmup=1000,
        trace_n=TRACE_CALLS,
        rss_limit=None,
    )
    assert r.passed, (op, r.failures, r.trace_chunks)
    assert r.ref_delta == 0 and r.trace_delta <= w.TRACE_LIMIT


def test_no_reference_cycles() -> None:
    """With the GC disabled, every operation on every kind (and the error
    calls) leaves nothing for ``gc.collect()``."""
    counts, findings = w.gc_check(w.gc_groups(w.public_api()))
    assert set(counts) == {*w.OPS, w.ERRORS}
    assert sum(counts.values()) == 0, (counts, findings)


def test_error_calls_raise_and_are_checked() -> None:
    """Every error call raises what it expects (it checks this itself), and the
    check fails when the call does not raise."""
    calls = w.error_calls(w.public_api())
    assert len(calls) >= 30
    for call in calls.values():
        call()
    with pytest.raises(AssertionError, match="no ValueError"):
        w.expecting(lambda: None, ValueError, "cycle")()
    with pytest.raises(AssertionError, match="without"):
        w.expecting(lambda: pk.flatten([1, 2]).__getitem__(5), IndexError, "cycle")()


def test_detectors_catch_injected_leaks() -> None:
    lines = w.self_test(5_000, check_rss=False)
    assert len(lines) == 5
    assert all(line.startswith("ok") for line in lines), lines


def test_a_leaking_op_fails_measure() -> None:
    """measure() itself flags a leak inside a real operation: flatten that keeps
    its result."""
    case = w.kind_cases()[1]
    flatten = w.op_calls(w.public_api(), case)["flatten"]
    kept: list = []

    def leaky() -> None:
        kept.append(flatten())

    r = w.measure("leaky", [leaky], 2_000, w.tracked_objects([case.tree]), rss_limit=None)
    assert not r.passed
    # two leaves, each held by flatten's leaves and flatten_one_level's
    # children (the root's children are the leaves), every call kept
    assert r.ref_delta == 2 * 2 * (2_000 + 2_000 + 1_000)
    assert r.trace_delta > 100_000
