"""The fast subset of ``scripts/fuzz_json.py``: mutated TreeSpec.from_json
documents give a spec or ValueError, import nothing, and what is accepted is
usable on both engines. Also: the fuzzer's detectors detect, and the bugs it
found in ``pytree_kit/_json.py`` stay fixed.

The long run is ``python scripts/fuzz_json.py`` (10,000 documents).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import json
import math
import sys
import types
from collections import defaultdict, deque
from pathlib import Path
from typing import Any, Callable

import pytest

import pytree_kit as pk
from pytree_kit import TreeSpec
from pytree_kit._kinds import DEQUE, KIND_NAMES, LEAF_NODE
from scripts.corpus import json_cases as tj

ROOT = Path(__file__).resolve().parent.parent


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_json", ROOT / "scripts" / "fuzz_json.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_json"] = module
    spec.loader.exec_module(module)
    return module


fz = _load_script()

SEED = 20240611
DOCS = 300
GOOD = pk.structure({"b": [1, (2, None)], "a": 0}).to_json()


def _doc(nodes: list, num_leaves: Any = None) -> str:
    if num_leaves is None:
        num_leaves = sum(1 for n in nodes if n == "*")
    head = {"format": "pytree_kit.TreeSpec", "version": 1, "num_leaves": num_leaves}
    return json.dumps({**head, "nodes": nodes})


@pytest.fixture(scope="module")
def summary() -> Any:
    return fz.fuzz(DOCS, SEED)


# --------------------------------------------------------------------------
# the fast subset


def test_mutated_documents_give_spec_or_value_error(summary: Any) -> None:
    assert not summary.failures, "\n\n".join(map(fz.render_failure, summary.failures))
    assert summary.docs == DOCS
    assert summary.accepted + summary.rejected == DOCS
    # both ways out are exercised
    assert summary.accepted >= 10
    assert summary.rejected >= DOCS // 2


def test_every_mutation_and_input_form_is_used(summary: Any) -> None:
    assert set(fz.STRUCTURAL + fz.TEXT + fz.BYTES) <= set(summary.ops)
    assert set(summary.forms) == {"str", "bytes", "bytearray"}


def test_accepted_specs_are_built_by_both_engines(summary: Any) -> None:
    if fz._speedups is None:
        pytest.skip("the C engine is not built")
    assert summary.unflatten["built"] >= 10


def test_no_named_module_was_imported(summary: Any) -> None:
    assert summary.docs == DOCS
    for name in fz.NEVER_IMPORTED:
        assert name not in sys.modules


def test_documents_depend_on_seed_and_index_only() -> None:
    a, b = fz.make_document(7, 42), fz.make_document(7, 42)
    assert (a.data, a.ops, a.base, a.form) == (b.data, b.ops, b.base, b.form)
    others = {repr(fz.make_document(7, i).data) for i in range(20)}
    assert len(others) == 20
    assert fz.make_document(8, 42).data != a.data


def _corpus_nodes() -> list:
    return [node for _, doc in fz.corpus() for node in doc["nodes"]]


def test_corpus_covers_every_node_kind() -> None:
    nodes = _corpus_nodes()
    kinds = {n["kind"] for n in nodes if isinstance(n, dict)}
    assert kinds == set(KIND_NAMES[2:])  # all but leaf and None, which are "*" and null
    assert "*" in nodes and None in nodes
    members = {m for n in nodes if isinstance(n, dict) for m in n}
    want = {"order", "maxlen", "static", "unset", "dict_keys", "hidden", "default_factory"}
    assert want <= members
    assert any(isinstance(n, dict) and n.get("kind") == "deque" and n.get("maxlen") for n in nodes)


def test_corpus_has_odd_keys_deep_and_wide_specs() -> None:
    text = json.dumps([doc for _, doc in fz.corpus()])
    for tag in ('{"float": "nan"}', '{"bytes":', '{"enum":', '{"tuple":', '{"frozenset":'):
        assert tag in text
    for tag in ('{"complex":', '{"ref":'):
        assert tag in text
    sizes = {name: len(doc["nodes"]) for name, doc in fz.corpus()}
    assert sizes["deep-2000"] > 2000
    assert sizes["wide-dict-600"] > 1800
    assert len(fz.corpus()) >= 100


def test_every_corpus_document_is_accepted_and_usable() -> None:
    for name, doc in fz.corpus():
        result = fz.check_document(json.dumps(doc))
        assert result.outcome == "accepted", (name, result.problems, result.detail)


def test_forbidden_references_include_the_dangerous_ones() -> None:
    for name in ("os:system", "builtins:eval", "subprocess:Popen", "importlib:import_module"):
        assert name in fz.FORBIDDEN
    for module in ("antigravity", "this", "tkinter"):
        assert any(ref.startswith(module + ":") for ref in fz.FORBIDDEN)


def test_one_document_from_the_command_line(capsys: pytest.CaptureFixture) -> None:
    assert fz.main(["--seed", "3", "--index", "5"]) == 0
    out = capsys.readouterr().out
    assert "seed=3 index=5" in out and "outcome: " in out


# --------------------------------------------------------------------------
# the detectors detect


def _hooks_are_real() -> bool:
    return builtins.__import__ is _REAL_IMPORT and importlib.import_module is _REAL_IMPORT_MODULE


_REAL_IMPORT = builtins.__import__
_REAL_IMPORT_MODULE = importlib.import_module


def test_a_valid_document_is_accepted_and_garbage_rejected() -> None:
    assert fz.check_document(GOOD).outcome == "accepted"
    assert fz.check_document(GOOD.encode()).outcome == "accepted"
    assert fz.check_document(b"\xff{").outcome == "rejected"
    assert _hooks_are_real()


def _fake_module() -> None:
    sys.modules["_fuzz_json_fake_module"] = types.ModuleType("_fuzz_json_fake_module")


@pytest.mark.parametrize(
    ("action", "word"),
    [
        pytest.param(lambda: __import__("json"), "__import__('json'", id="__import__"),
        pytest.param(lambda: importlib.import_module("json"), "import_module", id="import_module"),
        pytest.param(_fake_module, "_fuzz_json_fake_module", id="sys.modules"),
    ],
)
def test_import_recorder_flags_imports(action: Callable, word: str) -> None:
    try:
        result = fz.check_document(GOOD, from_json=fz.then(action))
    finally:
        sys.modules.pop("_fuzz_json_fake_module", None)
    assert result.outcome == "failure"
    assert word in " ".join(result.problems)
    assert _hooks_are_real()


def test_import_recorder_flags_a_real_import() -> None:
    name = fz._unimported_module()
    result = fz.check_document(GOOD, from_json=fz.then(lambda: importlib.import_module(name)))
    assert name in sys.modules  # it did import
    assert result.outcome == "failure"
    text = " ".join(result.problems)
    assert f"import_module({name!r})" in text and "modules imported" in text


def test_import_recorder_lets_pytree_kit_reach_its_own_loaded_submodules() -> None:
    with fz.ImportRecorder() as rec:
        from pytree_kit import _json  # noqa: F401  (absolute: recorded)

        # relative, of a loaded submodule: not recorded
        builtins.__import__("_json", {"__package__": "pytree_kit"}, None, ("FORMAT",), 1)
        pk.TreeSpec.from_json(GOOD)  # imports nothing
    assert rec.calls == ["__import__('pytree_kit', level=0)"]
    with fz.ImportRecorder() as rec:
        with pytest.raises(ImportError):
            builtins.__import__("_not_a_module", {"__package__": "pytree_kit"}, None, ("x",), 1)
    assert rec.calls == ["__import__('_not_a_module', level=1)"]
    assert _hooks_are_real()


def test_import_recorder_lets_cpython_json_report_a_syntax_error() -> None:
    # from 3.12 on, the json C code looks up json.decoder.JSONDecodeError with
    # PyImport_ImportModule, which calls builtins.__import__
    with fz.ImportRecorder() as rec:
        with pytest.raises(json.JSONDecodeError):
            json.loads('{"a" 1}')  # "Expecting ':' delimiter", raised in C
    assert rec.calls == [] and rec.added == []
    assert _hooks_are_real()


def test_import_recorder_flags_an_import_statement_in_json_code() -> None:
    # the exemption is for C code under the json package's frames, not for an
    # ``import`` statement that runs in them
    for name in ("json", "json.decoder"):
        with fz.ImportRecorder() as rec:
            exec("import json", {"__name__": name, "__builtins__": builtins})
        assert rec.calls == ["__import__('json', level=0)"], name
    assert _hooks_are_real()


@pytest.mark.parametrize(
    "exc",
    [TypeError("t"), RecursionError("r"), KeyError("k"), MemoryError(), AttributeError("a")],
    ids=lambda e: type(e).__name__,
)
def test_type_check_flags_other_exceptions(exc: BaseException) -> None:
    result = fz.check_document(GOOD, from_json=fz.raises(exc))
    assert result.outcome == "failure"
    assert f"raised {type(exc).__name__}" in " ".join(result.problems)
    assert type(exc).__name__ in result.detail  # the traceback
    assert _hooks_are_real()


def test_type_check_accepts_value_error_and_subclasses() -> None:
    for exc in (ValueError("v"), UnicodeDecodeError("utf-8", b"", 0, 1, "x")):
        assert fz.check_document(GOOD, from_json=fz.raises(exc)).outcome == "rejected"


def test_a_result_that_is_not_a_spec_is_a_failure() -> None:
    result = fz.check_document(GOOD, from_json=lambda text, **kw: json.loads(text))
    assert result.outcome == "failure" and "not a TreeSpec" in result.problems[0]


def test_an_unusable_spec_is_a_failure() -> None:
    broken = TreeSpec._make(((99, None, 0, None),), (), 0)
    result = fz.check_document(GOOD, from_json=lambda text, **kw: broken)
    assert result.outcome == "failure"
    assert "accepted, but to_json raised" in result.problems[0]


def test_a_spec_no_engine_can_build_is_a_failure() -> None:
    spec = TreeSpec._make(((DEQUE, None, 1, 2**63), LEAF_NODE), (), 1)
    problem, _ = fz.compare_engines(spec, (fz._pure.unflatten, fz._pure.unflatten))
    assert problem is not None and "no engine can build it: OverflowError" in problem


def test_engines_that_disagree_are_a_failure() -> None:
    pure = fz._pure.unflatten
    lying = (pure, lambda spec, leaves: pure(spec, leaves[::-1]))
    result = fz.check_document(GOOD, engines=lying)
    assert result.outcome == "failure" and "engines build different trees" in result.problems[0]
    raising = (pure, fz.raises(TypeError("x")))
    result = fz.check_document(GOOD, engines=raising)
    assert result.outcome == "failure" and "engines differ" in result.problems[0]
    fine = (pure, pure)
    assert fz.check_document(GOOD, engines=fine).outcome == "accepted"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([0], (0,)),
        ({1: 2}, {1: 3}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (deque([1], 1), deque([1], 2)),
        (defaultdict(list), defaultdict(int)),
        (tj.Plain(1, 2), tj.Plain(1, 3)),
        (tj.Slotted(1, 2), tj.Slotted(1, 3)),
        (tj.SeqBox([1], "a"), tj.SeqBox([1], "b")),
        (tj.Point(1, [2]), tj.Point(1, [3])),
    ],
)
def test_tree_diff_finds_differences(a: Any, b: Any) -> None:
    assert fz.tree_diff(a, b) is not None
    assert fz.tree_diff(a, a) is None


def test_tree_diff_of_deep_equal_trees() -> None:
    def deep() -> Any:
        tree: Any = 0
        for _ in range(20_000):
            tree = [tree]
        return tree

    assert fz.tree_diff(deep(), deep()) is None
    assert fz.tree_diff({float("nan"): [1]}, {float("nan"): [1]}) is not None  # two NaNs
    nan = float("nan")
    assert fz.tree_diff({nan: [1]}, {nan: [1]}) is None
    assert fz.tree_diff([nan], [float("nan")]) is None  # a NaN leaf is a NaN leaf


def test_self_test_of_the_script() -> None:
    assert fz.self_test() == []


def test_a_crash_is_reported_with_its_document_and_the_run_goes_on() -> None:
    # The child process segfaults on document 1: that is its failure, and a
    # new child goes on with document 2.
    assert fz.crash_self_test() == []


# --------------------------------------------------------------------------
# bugs the fuzzer found in pytree_kit/_json.py


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_tokens_are_refused(token: str) -> None:
    # A bare NaN key was another NaN than the one {"float": "nan"} reads as:
    # the spec was not equal to what its own to_json read back to.
    text = _doc([{"kind": "dict", "keys": [0]}, "*"]).replace("[0]", f"[{token}]")
    with pytest.raises(ValueError, match=token):
        TreeSpec.from_json(text)
    assert TreeSpec.from_json(text.replace(token, '{"float": "nan"}')).num_leaves == 1


@pytest.mark.parametrize(
    "parts", [['{"float": "nan"}', "0"], ["0", '{"float": "nan"}'], ['{"float": "nan"}'] * 2]
)
def test_complex_with_a_nan_part_decodes_to_equal_specs(parts: list) -> None:
    key = '{"complex": [' + ", ".join(parts) + "]}"
    text = _doc([{"kind": "dict", "keys": ["K"]}, "*"]).replace('"K"', key)
    spec = TreeSpec.from_json(text)
    assert TreeSpec.from_json(text) == spec
    again = TreeSpec.from_json(spec.to_json())
    assert again == spec and hash(again) == hash(spec)
    assert fz.check_document(text).outcome == "accepted"


def test_complex_nan_key_in_keys_and_order_is_one_key() -> None:
    key = {"complex": [{"float": "nan"}, 1]}
    text = _doc([{"kind": "dict", "keys": [key, "b"], "order": ["b", key]}, "*", "*"])
    rebuilt = TreeSpec.from_json(text).unflatten([10, 20])
    assert next(iter(rebuilt)) == "b" and rebuilt["b"] == 20
    (nan_key,) = [k for k in rebuilt if k != "b"]
    assert math.isnan(nan_key.real) and nan_key.imag == 1 and rebuilt[nan_key] == 10


@pytest.mark.parametrize("maxlen", [sys.maxsize + 1, 2**64, 10**30])
def test_deque_maxlen_beyond_any_deque_is_refused(maxlen: int) -> None:
    # It was accepted, and no engine could unflatten the spec (OverflowError).
    text = _doc([{"kind": "deque", "arity": 1, "maxlen": maxlen}, "*"])
    with pytest.raises(ValueError, match="maxlen"):
        TreeSpec.from_json(text)
    ok = TreeSpec.from_json(_doc([{"kind": "deque", "arity": 1, "maxlen": sys.maxsize}, "*"]))
    assert ok.unflatten([1]) == deque([1], sys.maxsize)
