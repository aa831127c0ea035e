"""torch.jit.trace and torch.export on models with nested inputs and outputs.

Tracers take and return flat tuples of tensors. :class:`TracingAdapter` wraps
a model so that its forward takes the flat tensors of the example inputs and
returns the flat tensors of the output; the structure, and every leaf that is
not a tensor, lives in two :class:`FlatSpec` objects beside the program.
:func:`trace` and :func:`export` put the model's own interface back around
the traced program, and :func:`save` / :func:`load` keep both in one file.
No type is registered anywhere.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from .. import _jsonvalues
from .._kinds import Rule, check_rules
from ._arguments import Arguments
from ._flatspec import FlatSpec, check_header
from ._hidden import may_hold_tensor

__all__ = ["TracedModel", "TracingAdapter", "export", "load", "save", "trace"]

Rules = Optional[Mapping[type, Rule]]
PathLike = Union[str, "os.PathLike[str]"]

_FORMAT = "pytree_kit.torch.TracedModel"
_VERSION = 1
_MANIFEST = "pytree_kit.json"
_PROGRAM = "program.pt"
_NOT_OURS = "not a file written by pytree_kit.torch.save"


class _Box:
    """Holds the output spec. torch.export runs forward on a copy of the module
    and undoes attribute writes; a box that copies as itself survives both."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Optional[FlatSpec] = None

    def __copy__(self) -> _Box:
        return self

    def __deepcopy__(self, memo: Any) -> _Box:
        return self


def _inputs(args: Any, kwargs: Any) -> tuple:
    """The ``(args, kwargs)`` pair a model is called with, as a tree."""
    if type(args) is not tuple:
        args = (args,)  # one argument, as torch.jit.trace takes it
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping of names to values, got {type(kwargs).__name__}")
    kwargs = dict(kwargs)
    for key in kwargs:
        if type(key) is not str:
            raise TypeError(f"kwargs keys must be strings, got {key!r}")
    return (args, kwargs)


def _unalias(tensors: tuple) -> tuple:
    """The tensors, with each repeat of one tensor object replaced by a copy.

    A tracer binds a tensor object to one graph input, so a tensor passed at
    two places would make the program read one input twice and ignore the
    other; with a copy, each place is an input of its own.
    """
    seen: set = set()
    out = []
    for t in tensors:
        if id(t) in seen:
            with torch.no_grad():
                t = t.clone().requires_grad_(t.requires_grad)
        else:
            seen.add(id(t))
        out.append(t)
    return tuple(out)


_NO_OUTPUT_SPEC = (
    "output_spec is recorded by the first forward: trace the adapter, "
    "or call it on flat_inputs, first"
)


class TracingAdapter(nn.Module):
    """A model with a flat interface that tracers accept.

    ``forward(*flat_tensors)`` rebuilds the model's arguments from the tensors
    and the constants recorded from ``args`` / ``kwargs``, calls the model, and
    returns the output's tensors as a flat tuple. The first call records
    ``output_spec``; a later call whose output has another structure, or other
    constants, raises ValueError naming the path.

    Attributes:
        flat_inputs: the example's tensors, in flat order (a tensor given at
            two places appears as two tensors: see docs/tracing.md).
        input_spec: the :class:`FlatSpec` of ``(args, kwargs)``.
        output_spec: the :class:`FlatSpec` of the output, once forward has run.

    Examples:
        >>> import dataclasses, torch
        >>> from pytree_kit.torch import TracingAdapter
        >>> @dataclasses.dataclass
        ... class Out:
        ...     total: torch.Tensor
        ...     n: int
        >>> class Model(torch.nn.Module):
        ...     def forward(self, batch, scale=1):
        ...         return Out(batch["x"].sum() * scale, len(batch["ys"]))
        >>> batch = {"x": torch.ones(3), "ys": [torch.zeros(1), torch.ones(1)]}
        >>> adapter = TracingAdapter(Model(), (batch,), {"scale": 2})
        >>> [tuple(t.shape) for t in adapter.flat_inputs]
        [(3,), (1,), (1,)]
        >>> program = torch.jit.trace(adapter, adapter.flat_inputs)
        >>> adapter.output_spec
        FlatSpec(Out(total=<tensor 0>, n=2))
        >>> adapter.output_spec.unflatten(program(*adapter.flat_inputs))
        Out(total=tensor(6.), n=2)
    """

    flat_inputs: tuple
    input_spec: FlatSpec

    def __init__(
        self,
        model: Callable[..., Any],
        args: Any = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        *,
        rules: Rules = None,
    ) -> None:
        super().__init__()
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        self.model = model
        self._rules = check_rules(rules)
        self.arguments = Arguments.of(model)
        inputs = self.arguments.canonical(*_inputs(args, kwargs))
        tensors, spec = FlatSpec.of(inputs, root="inputs", rules=self._rules)
        self.flat_inputs = _unalias(tensors)
        self.input_spec = spec
        self._box = _Box()

    @property
    def output_spec(self) -> FlatSpec:
        spec = self._box.value
        if spec is None:
            # AttributeError, so hasattr() says False (torch.jit.trace asks).
            raise AttributeError(_NO_OUTPUT_SPEC)
        return spec

    def __getattr__(self, name: str) -> Any:
        # nn.Module.__getattr__ would replace the property's message with its own.
        if name == "output_spec":
            raise AttributeError(_NO_OUTPUT_SPEC)
        return super().__getattr__(name)

    def flatten_inputs(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """The flat tensors of a call, checked against ``input_spec``: what to
        pass to a program traced from this adapter."""
        return self.input_spec.flatten(self.arguments.canonical(*_inputs(args, kwargs)))

    def forward(self, *flat_tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = self.input_spec.unflatten(flat_tensors)
        out = self.model(*args, **kwargs)
        spec = self._box.value
        if spec is None:
            tensors, spec = FlatSpec.of(out, root="output", rules=self._rules)
            self._box.value = spec
            return tensors
        try:
            return spec.flatten(out)
        except (TypeError, ValueError) as e:
            raise ValueError(
                "the model's output does not have the structure and constants of its "
                f"first output, which the traced program returns: {e}"
            ) from None


class TracedModel(nn.Module):
    """A traced or exported program with the model's nested interface.

    ``forward(*args, **kwargs)`` takes what the model took, in any form the
    model's signature accepts (``arguments`` binds it; omitted parameters
    whose default is None or a constant take it). It checks the arguments
    against ``input_spec`` (structure and constants; ValueError or TypeError
    naming the path), runs ``program`` on their tensors and rebuilds the
    output with ``output_spec``. ``kind`` is ``"jit"`` (``program`` is a
    ScriptModule) or ``"export"`` (``exported_program`` is the ExportedProgram
    and ``program`` its module).
    """

    def __init__(
        self,
        program: nn.Module,
        input_spec: FlatSpec,
        output_spec: FlatSpec,
        *,
        arguments: Optional[Arguments] = None,
        exported_program: Any = None,
    ) -> None:
        super().__init__()
        self.program = program
        self.arguments = Arguments(None) if arguments is None else arguments
        self.input_spec = input_spec
        self.output_spec = output_spec
        self.exported_program = exported_program
        self.kind = "jit" if exported_program is None else "export"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        flat = self.input_spec.flatten(self.arguments.canonical(args, kwargs))
        if self.exported_program is None:
            return self.output_spec.unflatten(self.program(*flat))
        try:
            out = self.program(*flat)
        except Exception as e:
            named = _guard_message(str(e), self.input_spec.tensor_paths, flat)
            if named is None:
                raise
            raise _like(e, named) from e
        return self.output_spec.unflatten(out)

    def extra_repr(self) -> str:
        return (
            f"kind={self.kind!r},\ninput_spec={self.input_spec!r},\n"
            f"output_spec={self.output_spec!r}"
        )


_FLAT_NAME = re.compile(r"\bflat_tensors_(\d+)\b")
_DIM_GUARD = re.compile(r"\bflat_tensors_(\d+)\.size\(\)\[(\d+)\] == (\d+)\b")
_DIM = re.compile(r"\bflat_tensors_(\d+)\.size\(\)\[(\d+)\]")


def _guard_message(message: str, paths: Sequence[str], flat: Sequence[Any]) -> Optional[str]:
    """An exported program's error with its flat argument names (``flat_tensors_3``)
    turned into the inputs' paths, and the first failed dimension guard said in
    words; torch's own message is kept below. None when it names no argument."""

    def path(m: Any) -> str:
        i = int(m.group(1))
        return paths[i] if i < len(paths) else m.group(0)

    if not _FLAT_NAME.search(message):
        return None

    def size(i: int, d: int) -> Optional[int]:
        ok = i < len(paths) and i < len(flat) and d < getattr(flat[i], "ndim", 0)
        return int(flat[i].shape[d]) if ok else None

    head = message.strip().splitlines()[0]
    first = _FLAT_NAME.sub(path, head)
    exact = _DIM_GUARD.search(head)
    any_dim = _DIM.search(head)
    if exact is not None and size(int(exact[1]), int(exact[2])) is not None:
        i, d = int(exact[1]), int(exact[2])
        first = f"{paths[i]} dimension {d}: expected {exact[3]}, got {size(i, d)}"
    elif any_dim is not None and size(int(any_dim[1]), int(any_dim[2])) is not None:
        i, d = int(any_dim[1]), int(any_dim[2])
        first += f" ({paths[i]} dimension {d} is {size(i, d)})"
    return f"{first}\n(torch: {message.strip()})"


def _like(error: BaseException, message: str) -> BaseException:
    """An exception of ``error``'s type with ``message``, or a RuntimeError."""
    try:
        return type(error)(message)
    except Exception:
        return RuntimeError(message)


def trace(
    model: Callable[..., Any],
    args: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    rules: Rules = None,
    **trace_kwargs: Any,
) -> TracedModel:
    """``torch.jit.trace`` a model with nested inputs and outputs.

    Returns a :class:`TracedModel` called like the model (``args``, ``kwargs``)
    that returns the model's own output types. ``trace_kwargs`` go to
    ``torch.jit.trace`` (``check_trace``, ``strict``, ...).

    Examples:
        >>> import collections, torch
        >>> import pytree_kit.torch as pkt
        >>> Pair = collections.namedtuple("Pair", "left right")
        >>> def f(pair, bias=None):
        ...     return {"sum": pair.left + pair.right, "bias": bias}
        >>> traced = pkt.trace(f, (Pair(torch.ones(2), torch.ones(2)),))
        >>> traced(Pair(torch.zeros(2), torch.ones(2)))
        {'sum': tensor([1., 1.]), 'bias': None}
    """
    for name in ("example_inputs", "example_kwarg_inputs"):
        if name in trace_kwargs:
            raise TypeError(f"trace() takes the example as args and kwargs, not {name}=")
    adapter = TracingAdapter(model, args, kwargs, rules=rules)
    program = torch.jit.trace(adapter, adapter.flat_inputs, **trace_kwargs)
    return TracedModel(
        program, adapter.input_spec, _eager_spec(adapter), arguments=adapter.arguments
    )


def _eager_spec(adapter: TracingAdapter) -> FlatSpec:
    """The output spec, with the values an eager call gives where the one
    recorded while tracing holds tensors in its aux data: under
    ``torch.jit.trace``, a size a model reads (``x.shape[0]``) is a tensor, and
    a container that keeps it in its context (a TensorDict's batch size) would
    keep that tensor. The model then runs once more, eagerly, as torch's
    ``check_trace`` does, and its spec is taken when it equals the traced one."""
    traced = adapter.output_spec
    if not may_hold_tensor([node[3] for node in traced.tree._nodes]):
        return traced
    adapter._box.value = None
    try:
        with torch.no_grad():
            adapter(*adapter.flat_inputs)
        eager = adapter._box.value
    finally:
        adapter._box.value = traced
    return eager if eager is not None and eager == traced else traced


def export(
    model: Callable[..., Any],
    args: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    rules: Rules = None,
    **export_kwargs: Any,
) -> TracedModel:
    """``torch.export.export`` a model with nested inputs and outputs, registering nothing.

    Returns a :class:`TracedModel` whose ``exported_program`` is the
    ExportedProgram of the flat adapter. ``export_kwargs`` go to
    ``torch.export.export``; ``dynamic_shapes``, if given as a tuple or list,
    has one entry per tensor in flat order (``adapter.input_spec.tensor_paths``
    names them; see docs/tracing.md).

    Examples:
        >>> import dataclasses, torch
        >>> import pytree_kit.torch as pkt
        >>> @dataclasses.dataclass
        ... class Batch:
        ...     x: torch.Tensor
        ...     scale: float
        >>> class Model(torch.nn.Module):
        ...     def forward(self, batch):
        ...         return Batch(batch.x * batch.scale, batch.scale)
        >>> exported = pkt.export(Model(), (Batch(torch.ones(2), 3.0),))
        >>> exported(Batch(torch.arange(2.0), 3.0))
        Batch(x=tensor([0., 3.]), scale=3.0)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"export() takes an nn.Module, got {type(model).__name__}")
    adapter = TracingAdapter(model, args, kwargs, rules=rules)
    shapes = export_kwargs.get("dynamic_shapes")
    if isinstance(shapes, (list, tuple)):
        if len(shapes) != adapter.input_spec.num_tensors:
            raise ValueError(
                f"dynamic_shapes has {len(shapes)} entries; the inputs have "
                f"{adapter.input_spec.num_tensors} tensors: "
                f"{', '.join(adapter.input_spec.tensor_paths)}"
            )
        export_kwargs["dynamic_shapes"] = {"flat_tensors": tuple(shapes)}
    exported = torch.export.export(adapter, adapter.flat_inputs, **export_kwargs)
    if adapter._box.value is None:
        # strict=True traces forward with dynamo, which drops the write to the
        # box: one eager call records the output spec instead.
        with torch.no_grad():
            adapter(*adapter.flat_inputs)
    return TracedModel(
        exported.module(),
        adapter.input_spec,
        adapter.output_spec,
        arguments=adapter.arguments,
        exported_program=exported,
    )


def save(obj: TracedModel, path: PathLike) -> None:
    """Write a :class:`TracedModel` (program and specs) to one file.

    The file is a zip archive holding ``pytree_kit.json`` (the specs) and
    ``program.pt`` (what ``torch.jit.save`` or ``torch.export.save`` wrote).
    """
    if not isinstance(obj, TracedModel):
        raise TypeError(f"save() takes what trace() or export() returned, got {type(obj).__name__}")
    buffer = io.BytesIO()
    if obj.exported_program is not None:
        torch.export.save(obj.exported_program, buffer)
    else:
        torch.jit.save(obj.program, buffer)
    manifest = {
        "format": _FORMAT,
        "version": _VERSION,
        "kind": obj.kind,
        "input_spec": obj.input_spec.to_doc(),
        "output_spec": obj.output_spec.to_doc(),
        "arguments": obj.arguments.to_json(),
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(_MANIFEST, json.dumps(manifest, indent=1))
        archive.writestr(_PROGRAM, buffer.getvalue())


def _return_types() -> list:
    """torch.return_types' structseqs (torch.max's values/indices...): plain
    containers from torch itself, so load() reads them without being asked."""
    found = []
    for name in dir(torch.return_types):
        obj = getattr(torch.return_types, name)
        if isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "n_fields"):
            found.append(obj)
    return found


def load(
    path: PathLike,
    *,
    allow: Iterable[Any] = (),
    rules: Rules = None,
) -> TracedModel:
    """Read what :func:`save` wrote, in this process or a fresh one.

    A model whose containers are builtins (and ``torch.return_types``) needs
    nothing more. Any other class (a dataclass, a namedtuple, ...) resolves
    as in :meth:`TreeSpec.from_json <pytree_kit.TreeSpec.from_json>`: only when
    it is passed in ``allow`` (a class flattened by a rule: in ``rules``);
    nothing is imported. Raises ValueError for a file that is not one of ours
    or names a class it was not allowed.
    """
    where = os.fspath(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if _MANIFEST not in names or _PROGRAM not in names:
                raise ValueError(f"load: {where}: {_NOT_OURS}")
            manifest = json.loads(archive.read(_MANIFEST))
            program_bytes = archive.read(_PROGRAM)
    except zipfile.BadZipFile:
        raise ValueError(f"load: {where}: {_NOT_OURS}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"load: {where}: the manifest is not valid JSON ({e})") from None
    check_header(manifest, _FORMAT, _VERSION, f"load: {where}", _NOT_OURS)
    kind = manifest.get("kind")
    if kind not in ("jit", "export"):
        raise ValueError(f"load: {where}: unknown program kind {kind!r}")
    allowed = [*allow, *_return_types()]
    specs = []
    for name in ("input_spec", "output_spec"):
        try:
            specs.append(FlatSpec.from_doc(manifest.get(name), allow=allowed, rules=rules))
        except ValueError as e:
            raise ValueError(f"load: {where}: the {name.replace('_', ' ')}: {e}") from None
    try:
        arguments = Arguments.from_json(
            manifest.get("arguments"), _jsonvalues.resolver(allowed, check_rules(rules))
        )
    except (ValueError, _jsonvalues.Malformed) as e:
        raise ValueError(f"load: {where}: the parameters: {e}") from None
    buffer = io.BytesIO(program_bytes)
    if kind == "export":
        exported = torch.export.load(buffer)
        return TracedModel(
            exported.module(), *specs, arguments=arguments, exported_program=exported
        )
    return TracedModel(torch.jit.load(buffer), *specs, arguments=arguments)
