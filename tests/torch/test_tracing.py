"""pytree_kit.torch's tracing adapter: trace, export, save and load.

Every model of tests/support/tracing_models.py runs eagerly, traced, exported, and
loaded from a file in a fresh process; the outputs must agree. Then every
error path.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import pytree_kit as pk  # noqa: E402
import pytree_kit.torch as pkt  # noqa: E402
from pytree_kit.torch import FlatSpec, TracingAdapter  # noqa: E402
from tests.support.tracing_models import CASES, Batch, Detections, Detector, Pair  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_ONLY = ("dict_of_lists", "return_types")

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")


def assert_tree_close(actual, expected):
    """Same structure, types and constants; tensors close."""
    got, got_spec = pk.flatten(actual)
    want, want_spec = pk.flatten(expected)
    assert got_spec == want_spec, f"{got_spec} != {want_spec}"
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert type(a) is type(b) and (a == b or (a != a and b != b))  # NaN is NaN


def _rewrite(good, path, manifest=None, drop=None):
    """A copy of the saved file ``good`` at ``path``, without the member ``drop``
    and with its manifest replaced by ``manifest(manifest)`` (a dict, or bytes)."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.namelist():
            if item == drop:
                continue
            data = src.read(item)
            if item == "pytree_kit.json" and manifest is not None:
                data = manifest(json.loads(data))
                data = data if isinstance(data, bytes) else json.dumps(data).encode()
            dst.writestr(item, data)
    return path


def _call(model, inputs):
    args, kwargs = inputs
    with torch.no_grad():
        return model(*args, **kwargs)


def _build(name):
    model, example, other, allow = CASES[name]()
    traced = pkt.trace(model, *example)
    exported = pkt.export(model, *example)
    return model, example, other, allow, traced, exported


@pytest.fixture(scope="module")
def built():
    return {name: _build(name) for name in CASES}


# --------------------------------------------------------------------------
# eager == traced == exported == loaded


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("how", ["traced", "exported"])
def test_program_matches_eager(built, name, how):
    model, example, other, _, traced, exported = built[name]
    program = traced if how == "traced" else exported
    for inputs in (example, other):
        expected = _call(model, inputs)
        actual = _call(program, inputs)
        assert type(actual) is type(expected)
        assert_tree_close(actual, expected)


def test_other_inputs_really_differ(built):
    """The second inputs are not the example again (else the test above proves less)."""
    for name, (model, example, other, *_rest) in built.items():
        a, b = pk.leaves(_call(model, example)), pk.leaves(_call(model, other))
        tensors = [(x, y) for x, y in zip(a, b) if isinstance(x, torch.Tensor)]
        assert any(not torch.equal(x, y) for x, y in tensors), name


_SUBPROCESS = """
import json, sys
import torch
import pytree_kit as pk
import pytree_kit.torch as pkt

work = sys.argv[1]
results = {}

def record(name, kind, out):
    leaves, spec = pk.flatten(out)
    results[f"{name}/{kind}"] = {"spec": spec.to_json(), "leaves": len(leaves)}
    torch.save(leaves, f"{work}/{name}-{kind}.out.pt")

# Builtin containers only: no class of the tests is imported or allowed.
for name in %(builtin)r:
    args, kwargs = torch.load(f"{work}/{name}.in.pt", weights_only=True)
    for kind in ("jit", "export"):
        loaded = pkt.load(f"{work}/{name}-{kind}.pkt")
        assert loaded.kind == kind
        with torch.no_grad():
            record(name, kind, loaded(*args, **kwargs))
assert "tests.support.tracing_models" not in sys.modules

from tests.support.tracing_models import CASES
for name in %(classes)r:
    _, _, (args, kwargs), allow = CASES[name]()
    for kind in ("jit", "export"):
        loaded = pkt.load(f"{work}/{name}-{kind}.pkt", allow=allow)
        with torch.no_grad():
            record(name, kind, loaded(*args, **kwargs))
print(json.dumps(results))
"""


def test_loaded_in_a_fresh_process_matches_eager(built, tmp_path):
    for name, (_, _, other, _, traced, exported) in built.items():
        pkt.save(traced, tmp_path / f"{name}-jit.pkt")
        pkt.save(exported, tmp_path / f"{name}-export.pkt")
        if name in BUILTIN_ONLY:
            torch.save(other, tmp_path / f"{name}.in.pt")
    script = _SUBPROCESS % {
        "builtin": list(BUILTIN_ONLY),
        "classes": sorted(set(CASES) - set(BUILTIN_ONLY)),
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * len(CASES)
    for name, (model, _, other, allow, _, _) in built.items():
        expected = _call(model, other)
        want, want_spec = pk.flatten(expected)
        for kind in ("jit", "export"):
            got = results[f"{name}/{kind}"]
            spec = pk.TreeSpec.from_json(got["spec"], allow=[*allow, type(expected)])
            assert spec == want_spec, (name, kind)
            leaves = torch.load(tmp_path / f"{name}-{kind}.out.pt", weights_only=False)
            assert_tree_close(spec.unflatten(leaves), expected)


def test_save_load_round_trip_in_process(built, tmp_path):
    model, _, other, allow, traced, exported = built["transformer"]
    for program in (traced, exported):
        path = tmp_path / f"{program.kind}.pkt"
        pkt.save(program, path)
        loaded = pkt.load(path, allow=allow)
        assert loaded.input_spec == program.input_spec
        assert loaded.output_spec == program.output_spec
        assert_tree_close(_call(loaded, other), _call(model, other))


# --------------------------------------------------------------------------
# what the adapter records


def test_adapter_exposes_flat_inputs_and_specs():
    model, ((batch,), kwargs), _, _ = CASES["dataclass"]()
    adapter = TracingAdapter(model, (batch,), kwargs)
    assert [id(t) for t in adapter.flat_inputs] == [
        id(batch.images),
        id(batch.boxes[0]),
        id(batch.boxes[1]),
    ]
    assert adapter.input_spec.constants == {"batch.num_classes": 2}
    assert adapter.input_spec.tensor_paths == (
        "batch.images",
        "batch.boxes[0]",
        "batch.boxes[1]",
    )
    assert not hasattr(adapter, "output_spec")
    with pytest.raises(AttributeError, match="recorded by the first forward"):
        adapter.output_spec  # noqa: B018
    flat_out = adapter(*adapter.flat_inputs)
    assert all(isinstance(t, torch.Tensor) for t in flat_out)
    assert adapter.output_spec.constants == {"output.num_classes": 2}
    out = adapter.output_spec.unflatten(flat_out)
    assert type(out) is Detections and out.extra is None


def test_adapter_driven_by_hand_with_jit_trace():
    model, (args, kwargs), (args2, kwargs2), _ = CASES["namedtuple"]()
    adapter = TracingAdapter(model, args, kwargs)
    program = torch.jit.trace(adapter, adapter.flat_inputs)
    flat = adapter.flatten_inputs(*args2, **kwargs2)
    out = adapter.output_spec.unflatten(program(*flat))
    torch.testing.assert_close(out, model(*args2))


def test_export_output_spec_survives_module_copy():
    """torch.export runs forward on a copy and undoes attribute writes."""
    model, (args, kwargs), _, _ = CASES["dataclass"]()
    adapter = TracingAdapter(model, args, kwargs)
    torch.export.export(adapter, adapter.flat_inputs)
    assert adapter.output_spec.tree == pk.structure(_call(model, (args, kwargs)))


def test_export_strict_mode(built):
    model, example, other, *_ = built["dataclass"]
    exported = pkt.export(model, *example, strict=True)
    assert_tree_close(_call(exported, other), _call(model, other))


def test_rules_for_a_class_we_cannot_edit(tmp_path):
    class Frame:  # no dataclass, no protocol
        def __init__(self, pixels, stamp):
            self.pixels, self.stamp = pixels, stamp

    rule = pk.Rule(lambda f: ((f.pixels,), f.stamp), lambda stamp, ch: Frame(ch[0], stamp))

    def brighten(frame):
        return Frame(frame.pixels + 1, frame.stamp)

    rules = {Frame: rule}
    traced = pkt.trace(brighten, (Frame(torch.zeros(2), 7),), rules=rules)
    out = traced(Frame(torch.ones(2), 7))
    assert type(out) is Frame and out.stamp == 7
    torch.testing.assert_close(out.pixels, torch.full((2,), 2.0))
    with pytest.raises(ValueError, match=r"^frame: structure mismatch: .*aux=7.*aux=8"):
        traced(Frame(torch.ones(2), 8))  # the stamp is aux data: part of the structure
    path = tmp_path / "frame.pkt"
    pkt.save(traced, path)
    with pytest.raises(ValueError, match="Frame is not allowed"):
        pkt.load(path)
    loaded = pkt.load(path, rules=rules)
    torch.testing.assert_close(loaded(Frame(torch.ones(2), 7)).pixels, out.pixels)


def test_every_equivalent_call_form_is_accepted(built, tmp_path):
    """Bound to the model's signature: positional or by name, and omitted
    parameters whose default is None or a constant take it."""
    model, ((batch,), _), _, allow, traced, exported = built["dataclass"]
    pkt.save(traced, tmp_path / "d.pkt")
    loaded = pkt.load(tmp_path / "d.pkt", allow=allow)
    want = _call(model, ((batch,), {}))
    for program in (traced, exported, loaded):
        for args, kwargs in [((batch,), {}), ((batch, None), {}), ((), {"batch": batch})]:
            assert_tree_close(_call(program, (args, kwargs)), want)
        with pytest.raises(TypeError, match="multiple values for argument 'batch'"):
            program(batch, batch=batch)
        with pytest.raises(TypeError, match="unexpected keyword argument 'masks'"):
            program(batch, masks=None)


def test_positional_only_varargs_and_defaults_the_model_keeps():
    sentinel = object()

    def f(x, /, *rest, scale=2, cfg=sentinel, **extra):
        assert cfg is sentinel
        return {"y": x * scale + sum(rest), "keys": tuple(sorted(extra))}

    x, r = torch.ones(2), torch.full((2,), 3.0)
    traced = pkt.trace(f, (x, r), {"flag": torch.zeros(1)})
    assert traced.input_spec.tensor_paths == ("args[0]", "args[1]", "flag")
    assert traced.input_spec.constants == {"scale": 2}
    out = traced(torch.zeros(2), r, flag=torch.ones(1))
    torch.testing.assert_close(out["y"], torch.full((2,), 3.0))
    assert out["keys"] == ("flag",)
    with pytest.raises(ValueError, match=r"^kwargs: structure mismatch: .*'cfg'"):
        traced(x, r, cfg=sentinel, flag=torch.zeros(1))  # cfg is left to the model
    with pytest.raises(ValueError, match=r"^args: structure mismatch: .*tuple of 2, .*tuple of 3"):
        traced(x, r, r, flag=torch.zeros(1))


def test_default_after_a_positional_only_default_the_model_keeps():
    sentinel = object()

    def g(x, cfg=sentinel, /, flag=None, scale=2):
        return x * scale

    traced = pkt.trace(g, (torch.ones(1),))
    assert traced.input_spec.constants == {"scale": 2}
    for kwargs in ({}, {"scale": 2}, {"flag": None, "scale": 2}):
        torch.testing.assert_close(traced(torch.ones(1), **kwargs), torch.full((1,), 2.0))


def test_model_without_a_signature():
    traced = pkt.trace(torch.sin, (torch.zeros(2),))
    assert traced.arguments.to_json() is None
    torch.testing.assert_close(traced(torch.ones(2)), torch.sin(torch.ones(2)))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"a": 1}, "must be a list"),
        ([{"name": "x", "kind": "bogus"}], "bad parameter"),
        ([{"name": "1x", "kind": "keyword_only"}], "bad parameter"),
        (
            [{"name": "x", "kind": "keyword_only", "default": {"ref": "builtins:int"}}],
            "bad default",
        ),
        (
            [{"name": "x", "kind": "var_keyword"}, {"name": "y", "kind": "positional_only"}],
            "bad parameters",
        ),
    ],
)
def test_saved_parameters_are_validated(built, tmp_path, doc, message):
    traced = built["namedtuple"][4]
    good = tmp_path / "good.pkt"
    pkt.save(traced, good)
    bad = _rewrite(good, tmp_path / "bad.pkt", lambda m: {**m, "arguments": doc})
    with pytest.raises(ValueError, match=f"the parameters: .*{message}"):
        pkt.load(bad, allow=[Pair])


def test_single_non_tuple_argument_is_one_argument():
    traced = pkt.trace(lambda p: p.query + p.key, Pair(torch.ones(1), torch.ones(1)))
    torch.testing.assert_close(traced(Pair(torch.zeros(1), torch.ones(1))), torch.ones(1))


# --------------------------------------------------------------------------
# aliasing and constants


def _add_scaled(a, b, *, scale=2.0):
    return {"out": a * scale + b}


@pytest.mark.parametrize("how", ["trace", "export"])
def test_aliased_inputs_trace_as_separate_inputs(how):
    x = torch.arange(3.0)
    if how == "trace":
        program = pkt.trace(_add_scaled, (), {"a": x, "b": x}, check_trace=False)
    else:

        class M(torch.nn.Module):
            def forward(self, a, b):
                return _add_scaled(a, b)

        program = pkt.export(M(), (), {"a": x, "b": x})
    a, b = torch.ones(3), torch.full((3,), 10.0)
    torch.testing.assert_close(program(a=a, b=b)["out"], _add_scaled(a, b)["out"])
    torch.testing.assert_close(program(a=x, b=x)["out"], _add_scaled(x, x)["out"])


def test_adapter_copies_a_repeated_tensor():
    x = torch.ones(2, requires_grad=True)
    adapter = TracingAdapter(_add_scaled, (x, x))
    first, second = adapter.flat_inputs
    assert first is x and second is not x
    assert torch.equal(second, x) and second.requires_grad


def test_constants_are_checked_at_every_call(built):
    model, ((batch,), kwargs), *_, traced, exported = built["dataclass"]
    for program in (traced, exported):
        changed = dataclasses.replace(batch, num_classes=3)
        with pytest.raises(ValueError) as info:
            program(changed, **kwargs)
        message = str(info.value)
        assert message.startswith("batch.num_classes: this program was traced with the constant 2")
        assert "this call passes 3" in message
        with pytest.raises(ValueError, match=r"batch.num_classes: .* passes True"):
            program(dataclasses.replace(batch, num_classes=True), **kwargs)


def test_nan_constant_equals_nan():
    traced = pkt.trace(lambda x, s: x * 2, (torch.ones(1), float("nan")))
    torch.testing.assert_close(traced(torch.ones(1), float("nan")), torch.full((1,), 2.0))
    with pytest.raises(ValueError, match=r"^s: this program was traced with the constant nan"):
        traced(torch.ones(1), 1.0)


def test_output_constants_come_back():
    traced = pkt.trace(lambda x: (x + 1, "label", 3, torch.float16), (torch.ones(1),))
    out = traced(torch.zeros(1))
    assert out[1:] == ("label", 3, torch.float16)


# --------------------------------------------------------------------------
# error paths


def test_structure_mismatch_names_the_path(built):
    _, ((features,), kwargs), *_, traced, exported = built["dict_of_lists"]
    for program in (traced, exported):
        extra = {**features, "text": [torch.ones(3)]}
        with pytest.raises(ValueError, match=r"^features: structure mismatch: the traced "):
            program(extra, **kwargs)
        shorter = {**features, "video": features["video"][:2]}
        with pytest.raises(ValueError, match=r"^features\['video'\]: structure mismatch"):
            program(shorter, **kwargs)
        with pytest.raises(TypeError, match=r"do not fit the model's signature \(features"):
            program(features, torch.ones(1), **kwargs)
        with pytest.raises(ValueError, match=r"^scale: .*constant 0.5 .* passes 1.0"):
            program(features)
        with pytest.raises(TypeError, match=r"^features\['audio'\]\[1\]: .*takes a tensor here"):
            program({**features, "audio": [features["audio"][0], 1.5]}, **kwargs)


def test_none_kwarg_is_part_of_the_structure(built):
    _, ((batch,), _kwargs), *_, traced, _ = built["dataclass"]
    with pytest.raises(ValueError, match=r"^mask: structure mismatch: .*None"):
        traced(batch, mask=torch.ones(2, 2))


def test_leaf_that_is_neither_tensor_nor_constant():
    with pytest.raises(TypeError, match=r"^d\['cfg'\]: a leaf of type object is neither"):
        TracingAdapter(lambda d: d, ({"cfg": object(), "x": torch.ones(1)},))
    adapter = TracingAdapter(lambda x: {"x": x, "obj": object()}, (torch.ones(1),))
    with pytest.raises(TypeError, match=r"^output\['obj'\]: a leaf of type object"):
        adapter(*adapter.flat_inputs)


def test_output_structure_change_is_an_error():
    def flaky(x):
        return [x] * x.shape[0]

    adapter = TracingAdapter(flaky, (torch.ones(2),))
    adapter(torch.ones(2))
    with pytest.raises(ValueError, match=r"output does not have the structure .*output: structure"):
        adapter(torch.ones(3))

    def changing(x):
        return {"x": x, "n": int(x.shape[0])}

    adapter = TracingAdapter(changing, (torch.ones(2),))
    adapter(torch.ones(2))
    with pytest.raises(ValueError, match=r"output\['n'\]: this program was traced with"):
        adapter(torch.ones(3))


def test_dynamic_shapes_in_flat_order():
    model, example, *_ = CASES["namedtuple"]()
    dim, other = torch.export.Dim("rows", min=2, max=16), torch.export.Dim("keys", max=16)
    exported = pkt.export(model, *example, dynamic_shapes=({0: dim}, {0: other}))
    pair = Pair(torch.randn(7, 4), torch.randn(5, 4))
    torch.testing.assert_close(exported(pair), model(pair))
    with pytest.raises(
        ValueError, match=r"has 1 entries; the inputs have 2 tensors: pair.query, pair.key"
    ):
        pkt.export(model, *example, dynamic_shapes=({0: dim},))


def test_bad_arguments():
    with pytest.raises(TypeError, match="model must be callable"):
        TracingAdapter(3)
    with pytest.raises(TypeError, match="kwargs must be a mapping"):
        TracingAdapter(lambda: 0, (), [("a", 1)])
    with pytest.raises(TypeError, match="kwargs keys must be strings"):
        TracingAdapter(lambda: 0, (), {1: torch.ones(1)})
    with pytest.raises(TypeError, match="rules must be a mapping"):
        TracingAdapter(lambda x: x, (torch.ones(1),), rules=3)
    with pytest.raises(TypeError, match="not example_inputs="):
        pkt.trace(lambda x: x, example_inputs=(torch.ones(1),))
    with pytest.raises(TypeError, match=r"export\(\) takes an nn.Module"):
        pkt.export(lambda x: x, (torch.ones(1),))
    with pytest.raises(TypeError, match=r"save\(\) takes what trace\(\) or export\(\) returned"):
        pkt.save(torch.nn.Linear(1, 1), "unused.pkt")


def test_load_errors(built, tmp_path):
    _, _, _, allow, traced, _ = built["dataclass"]
    good = tmp_path / "good.pkt"
    pkt.save(traced, good)
    with pytest.raises(ValueError, match=r"input spec: .*Batch is not allowed; pass it in allow="):
        pkt.load(good)
    with pytest.raises(ValueError, match=r"output spec: .*Detections is not allowed"):
        pkt.load(good, allow=[Batch])
    assert isinstance(pkt.load(good, allow=allow), pkt.TracedModel)

    not_zip = tmp_path / "not.pkt"
    not_zip.write_bytes(b"hello")
    with pytest.raises(ValueError, match=r"not a file written by pytree_kit\.torch\.save"):
        pkt.load(not_zip)

    def rewrite(name, manifest=None, drop=None):
        return _rewrite(good, tmp_path / name, manifest, drop)

    with pytest.raises(ValueError, match=r"not a file written by pytree_kit\.torch\.save"):
        pkt.load(rewrite("a.pkt", drop="program.pt"))
    with pytest.raises(ValueError, match="manifest is not valid JSON"):
        pkt.load(rewrite("b.pkt", manifest=lambda m: b"{"))
    with pytest.raises(ValueError, match=r"not a file written by pytree_kit\.torch\.save"):
        pkt.load(rewrite("c.pkt", manifest=lambda m: {**m, "format": "other"}))
    with pytest.raises(ValueError, match="format version 99 is not supported"):
        pkt.load(rewrite("d.pkt", manifest=lambda m: {**m, "version": 99}))
    with pytest.raises(ValueError, match="unknown program kind 'onnx'"):
        pkt.load(rewrite("e.pkt", manifest=lambda m: {**m, "kind": "onnx"}))
    with pytest.raises(ValueError, match=r"output spec: FlatSpec\.from_json: not a"):
        pkt.load(rewrite("f.pkt", manifest=lambda m: {**m, "output_spec": [1]}), allow=allow)


# --------------------------------------------------------------------------
# FlatSpec


class Color(enum.Enum):
    RED = 1


def test_flatspec_json_round_trip_every_constant_type():
    tree = {
        "t": torch.ones(1),
        "i": 3,
        "f": float("nan"),
        "c": complex(1, -2),
        "s": "x",
        "b": b"\x00",
        "flag": False,
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
        "color": Color.RED,
        "nested": [(torch.zeros(1), None)],
    }
    tensors, spec = FlatSpec.of(tree, root="batch")
    assert len(tensors) == 2 and spec.num_tensors == 2
    text = spec.to_json()
    with pytest.raises(ValueError, match="Color is not allowed"):
        FlatSpec.from_json(text)
    back = FlatSpec.from_json(text, allow=[Color])
    assert back == spec and hash(back) == hash(spec)
    assert back.constants.keys() == spec.constants.keys()
    assert math.isnan(back.constants["batch['f']"])
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert_tree_close(back.unflatten(tensors), tree)


def test_flatspec_equality_and_immutability():
    _, a = FlatSpec.of([torch.ones(1), 2])
    _, b = FlatSpec.of([torch.zeros(3), 2])
    _, c = FlatSpec.of([torch.ones(1), 3])
    _, d = FlatSpec.of([torch.ones(1), 2.0])
    assert a == b and hash(a) == hash(b)
    assert a != c and a != d  # another value; another type of equal value
    with pytest.raises(AttributeError, match="immutable"):
        a._tree = None
    with pytest.raises(TypeError, match="not built directly"):
        FlatSpec()
    with pytest.raises(ValueError, match="expected 1 tensors, got 2"):
        a.unflatten([torch.ones(1), torch.ones(1)])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: "[", "not valid JSON"),
        (lambda d: {**d, "format": "x"}, "not a pytree_kit.torch.FlatSpec document"),
        (lambda d: {**d, "version": 2}, "format version 2 is not supported"),
        (lambda d: {**d, "paths": ["a"]}, "paths must be 2 strings"),
        (lambda d: {**d, "paths": None}, "root, paths or constants missing"),
        (lambda d: {**d, "constants": [[5, 1]]}, "constant index 5"),
        (lambda d: {**d, "constants": [[1, 1], [1, 2]]}, "constant index 1"),
        (lambda d: {**d, "constants": [["1", 1]]}, "a constant must be"),
        (lambda d: {**d, "constants": [[1, {"torch.dtype": "nope"}]]}, "unknown dtype"),
        (lambda d: {**d, "constants": [[1, {"torch.device": "nope:9"}]]}, "bad device"),
        (lambda d: {**d, "constants": [[1, {"ref": "builtins:int"}]]}, "not a constant"),
    ],
)
def test_flatspec_from_json_rejects_bad_documents(edit, message):
    _, spec = FlatSpec.of([torch.ones(1), 2])
    doc = edit(json.loads(spec.to_json()))
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(ValueError, match=message):
        FlatSpec.from_json(text)


def test_flatspec_repr_marks_tensors():
    _, spec = FlatSpec.of(Batch(torch.ones(1), [torch.ones(1)], 4))
    assert repr(spec) == "FlatSpec(Batch(images=<tensor 0>, boxes=[<tensor 1>], num_classes=4))"


class _Cache:
    """A cache whose constructor reads its tensor, as transformers' caches do."""

    def __init__(self, k):
        self.k, self.dtype = k, k.dtype


def test_flatspec_repr_runs_no_unflatten_and_no_rule():
    rules = {
        _Cache: pk.Rule(lambda c: ([c.k], None), lambda aux, ch: _Cache(ch[0])),
    }
    traced = pkt.trace(lambda x: {"cache": _Cache(x * 2), "n": 3}, (torch.ones(2),), rules=rules)
    assert repr(traced.output_spec) == "FlatSpec({'cache': _Cache(<tensor 0>, aux=None), 'n': 3})"
    assert "_Cache(<tensor 0>" in repr(traced)

    class Loud:
        def __init__(self, x):
            self.x = x

        def __tree_flatten__(self):
            return [self.x], None

        @classmethod
        def __tree_unflatten__(cls, aux, children):
            raise AssertionError("repr must not rebuild")

        def __eq__(self, other):
            return isinstance(other, Loud)

        def __hash__(self):
            return 0

    _, spec = FlatSpec.of([Loud(torch.ones(1)), 2.5])
    assert repr(spec) == "FlatSpec([Loud(<tensor 0>, aux=None), 2.5])"


def test_traced_model_repr_names_kind_and_specs(built):
    text = repr(built["namedtuple"][4])
    assert "kind='jit'" in text and "Pair(query=<tensor 0>, key=<tensor 1>)" in text


def test_detector_none_default_matches(built):
    model = Detector().eval()
    (batch,), _ = CASES["dataclass"]()[1]
    traced = built["dataclass"][4]
    assert_tree_close(_call(traced, ((batch,), {"mask": None})), _call(model, ((batch,), {})))


def test_ordered_dict_output_keeps_its_entries(built):
    model, _, other, *_rest, traced, exported = built["transformer"]
    for program in (traced, exported):
        out = _call(program, other)
        assert list(out.keys()) == ["last_hidden_state", "hidden_states", "attentions"]
        assert out["last_hidden_state"] is out.last_hidden_state
        assert isinstance(out, collections.OrderedDict)


def test_docs_page_documents_what_tracing_cannot_capture():
    text = (ROOT / "docs" / "tracing.md").read_text().lower()
    for needle in (
        "data-dependent control flow",
        "len()",
        "torch.cond",
        "dynamic_shapes",
        "torch.where",
    ):
        assert needle in text


class _MatMul(torch.nn.Module):
    def forward(self, batch):
        return batch["x"] @ batch["w"]


def test_export_guard_errors_name_the_input_path():
    example = ({"x": torch.ones(3, 7), "w": torch.ones(7, 2)},)
    exported = pkt.export(_MatMul(), example)
    with pytest.raises(AssertionError) as e:
        exported({"x": torch.ones(3, 5), "w": torch.ones(5, 2)})
    lines = str(e.value).splitlines()
    assert lines[0] == "batch['w'] dimension 0: expected 7, got 5"
    assert lines[1].startswith("(torch: ") and "flat_tensors_0" in lines[1]  # torch's, kept
    n = torch.export.Dim("n", min=2, max=8)
    dynamic = pkt.export(_MatMul(), example, dynamic_shapes=[{}, {0: n}])
    with pytest.raises(AssertionError) as e:
        dynamic({"x": torch.ones(10, 7), "w": torch.ones(7, 2)})
    assert str(e.value).splitlines()[0] == (
        "Guard failed: batch['x'].size()[0] <= 8 (batch['x'] dimension 0 is 10)"
    )
    assert torch.equal(
        dynamic({"x": torch.ones(4, 7), "w": torch.ones(7, 2)}), torch.full((4, 2), 7.0)
    )
