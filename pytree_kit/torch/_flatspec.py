"""FlatSpec: how one tree maps to a flat tuple of tensors, and back.

A tracer sees only a flat tuple of tensors. A FlatSpec holds everything else
about the tree: its :class:`~pytree_kit.TreeSpec`, which leaves are tensors,
and the value of every other leaf (a *constant*: a number, a string, a dtype...).
Flattening checks a tree against all of it, so a call that a traced program
would silently get wrong is an error that names the path instead.
"""

from __future__ import annotations

import enum
import json
import math
import re
from typing import Any, Iterable, Mapping, Optional

import torch

from .. import _interface, _jsonvalues, api
from .._keys import DictKey, SequenceKey, keystr
from .._kinds import Rule, check_rules
from .._spec import TreeSpec, render

__all__ = ["FlatSpec"]

Rules = Optional[Mapping[type, Rule]]

# Leaves a traced program can take as constants, compared by type and value.
_PLAIN = (bool, int, float, complex, str, bytes)
_TORCH = (torch.dtype, torch.device, torch.Size)
_CONSTANTS = (
    "int, float, bool, complex, str, bytes, an Enum, torch.dtype, torch.device or torch.Size"
)

_FORMAT = "pytree_kit.torch.FlatSpec"
# An engine message's path into a keyword argument: tree[1]['name']...
_KEYWORD = re.compile(r"\[1\]\['(\w+)'\]")
_VERSION = 1


def is_constant(value: Any) -> bool:
    """Whether a leaf that is not a tensor can be baked into a trace."""
    return isinstance(value, _PLAIN + _TORCH) or isinstance(value, enum.Enum)


def same_constant(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same constant: the same type and equal (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if a is b or a == b:
        return True
    if isinstance(a, (float, complex)):
        return _nan_equal(a, b)
    return False


def _nan_equal(a: Any, b: Any) -> bool:
    parts_a = (a.real, a.imag) if isinstance(a, complex) else (a,)
    parts_b = (b.real, b.imag) if isinstance(b, complex) else (b,)
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(parts_a, parts_b))


class FlatSpec:
    """The map between a tree and the flat tuple of its tensors.

    ``tree`` is the TreeSpec of the whole tree; ``constants`` pairs the index of
    every leaf that is not a tensor with its value; ``paths`` names every leaf
    the way error messages do. :meth:`flatten` checks a tree against all of
    this and returns its tensors; :meth:`unflatten` puts tensors and constants
    back into a tree. Immutable, hashable and JSON-serialisable. An
    input spec's tree is ``(args, kwargs)``, and its paths read ``args[0]``,
    ``mask`` or ``batch.images``; an output spec's paths read ``output.logits``.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import FlatSpec
        >>> tensors, spec = FlatSpec.of({"x": torch.ones(2), "n": 3}, root="batch")
        >>> spec
        FlatSpec({'n': 3, 'x': <tensor 0>})
        >>> spec.unflatten([torch.zeros(1)])
        {'x': tensor([0.]), 'n': 3}
        >>> spec.flatten({"x": torch.zeros(1), "n": 4})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: batch['n']: this program was traced with the constant 3 here, ... passes 4 ...
    """

    __slots__ = ("_constants", "_paths", "_root", "_template", "_tensor_at", "_tree")
    _tree: TreeSpec
    _constants: tuple
    _paths: tuple
    _root: str
    _template: tuple
    _tensor_at: tuple

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("FlatSpec is not built directly: use FlatSpec.of(tree) or from_json")

    @classmethod
    def _make(cls, tree: TreeSpec, constants: tuple, paths: tuple, root: str) -> FlatSpec:
        self = object.__new__(cls)
        known = dict(constants)
        template = tuple(known.get(i) for i in range(tree.num_leaves))
        tensor_at = tuple(i for i in range(tree.num_leaves) if i not in known)
        for name, value in (
            ("_tree", tree),
            ("_constants", constants),
            ("_paths", paths),
            ("_root", root),
            ("_template", template),
            ("_tensor_at", tensor_at),
        ):
            object.__setattr__(self, name, value)
        return self

    @classmethod
    def of(
        cls, tree: Any, *, root: str = "tree", rules: Rules = None
    ) -> tuple[tuple[torch.Tensor, ...], FlatSpec]:
        """The tensors of ``tree``, in order, and its FlatSpec.

        Every leaf must be a tensor or a constant; anything else raises
        TypeError naming its path. ``root`` is the name paths start with;
        ``"inputs"`` is for an ``(args, kwargs)`` pair, whose paths read
        ``args[0]`` for a positional argument and ``mask`` or
        ``batch.images`` for a keyword argument.
        """
        pairs, spec = api.flatten_with_path(tree, rules=rules)
        paths = tuple(_render(root, p) for p, _ in pairs)
        tensors = []
        constants = []
        for i, (_, leaf) in enumerate(pairs):
            if isinstance(leaf, torch.Tensor):
                tensors.append(leaf)
            elif is_constant(leaf):
                constants.append((i, leaf))
            else:
                raise TypeError(
                    f"{paths[i]}: a leaf of type {type(leaf).__qualname__} is neither a tensor "
                    f"nor a constant a trace can bake in ({_CONSTANTS}); make it a tensor, or "
                    "keep it out of the traced call"
                )
        return tuple(tensors), cls._make(spec, tuple(constants), paths, root)

    # -- properties ----------------------------------------------------------

    @property
    def tree(self) -> TreeSpec:
        """The TreeSpec of the whole tree, constants included as leaves."""
        return self._tree

    @property
    def constants(self) -> dict[str, Any]:
        """Every constant leaf, by path."""
        return {self._paths[i]: v for i, v in self._constants}

    @property
    def tensor_paths(self) -> tuple[str, ...]:
        """The path of each tensor, in flat order."""
        return tuple(self._paths[i] for i in self._tensor_at)

    @property
    def num_tensors(self) -> int:
        """How many tensors the flat tuple has."""
        return len(self._tensor_at)

    # -- operations ----------------------------------------------------------

    def flatten(self, tree: Any) -> tuple[torch.Tensor, ...]:
        """The tensors of ``tree``, which must have this structure and these constants.

        Raises ValueError naming the first path whose structure or constant
        differs, and TypeError where a tensor is expected and something else
        is given.
        """
        try:
            leaves = _interface.engine.flatten_up_to(
                self._tree, tree, "the traced program", "this call"
            )
        except ValueError as e:
            raise ValueError(self._rename(str(e))) from None
        for i, value in self._constants:
            given = leaves[i]
            if not same_constant(value, given):
                raise ValueError(
                    f"{self._paths[i]}: this program was traced with the constant {value!r} "
                    f"here, and bakes it in; this call passes {_show(given)} (pass the value "
                    "as a tensor, or trace again)"
                )
        out = []
        for i in self._tensor_at:
            leaf = leaves[i]
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(
                    f"{self._paths[i]}: this program takes a tensor here; this call passes "
                    f"{_show(leaf)}"
                )
            out.append(leaf)
        return tuple(out)

    def unflatten(self, tensors: Iterable[Any]) -> Any:
        """Build the tree from its tensors (in flat order) and the constants."""
        tensors = tuple(tensors)
        if len(tensors) != len(self._tensor_at):
            raise ValueError(
                f"{self._root}: expected {len(self._tensor_at)} tensors, got {len(tensors)}"
            )
        leaves = list(self._template)
        for i, t in zip(self._tensor_at, tensors):
            leaves[i] = t
        return self._tree.unflatten(leaves)

    def _rename(self, message: str) -> str:
        """An engine message that names ``tree[...]``, naming this spec's root instead."""
        if not message.startswith("tree"):
            return message
        rest = message[4:]
        if self._root == "inputs":
            named = _KEYWORD.match(rest)
            if named and _is_name(named.group(1)):
                return named.group(1) + rest[named.end() :]
            for index, name in (("[0]", "args"), ("[1]", "kwargs")):
                if rest.startswith(index):
                    return name + rest[len(index) :]
            return "(args, kwargs)" + rest
        return self._root + rest

    # -- value semantics -----------------------------------------------------

    def _key(self) -> tuple:
        return (self._tree, tuple((i, type(v), _hashable(v)) for i, v in self._constants))

    def __eq__(self, other: object) -> bool:
        if type(other) is not FlatSpec:
            return NotImplemented
        return (
            self._tree == other._tree
            and len(self._constants) == len(other._constants)
            and all(
                i == j and same_constant(a, b)
                for (i, a), (j, b) in zip(self._constants, other._constants)
            )
        )

    def __hash__(self) -> int:
        return hash(self._key())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FlatSpec is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FlatSpec._make, (self._tree, self._constants, self._paths, self._root))

    def __repr__(self) -> str:
        # Rendered from the spec itself: rebuilding the tree with placeholders
        # would run each class's unflatten (or rule) on objects it cannot take.
        texts = [_constant_repr(v) for v in self._template]
        for n, i in enumerate(self._tensor_at):
            texts[i] = f"<tensor {n}>"
        return f"FlatSpec({render(self._tree, texts)})"

    # -- JSON ----------------------------------------------------------------

    def to_json(self) -> str:
        """A JSON document: the TreeSpec's, the constants and the paths.

        Examples:
            >>> import torch
            >>> from pytree_kit.torch import FlatSpec
            >>> _, spec = FlatSpec.of([torch.ones(1), 2.5, torch.float16])
            >>> FlatSpec.from_json(spec.to_json()) == spec
            True
        """
        return json.dumps(self.to_doc())

    def to_doc(self) -> dict:
        """:meth:`to_json`'s document as a dict, to embed in a larger document."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "root": self._root,
            "tree": json.loads(self._tree.to_json()),
            "constants": [[i, encode_constant(v)] for i, v in self._constants],
            "paths": list(self._paths),
        }

    @classmethod
    def from_json(
        cls, text: str | bytes, *, allow: Iterable[Any] = (), rules: Rules = None
    ) -> FlatSpec:
        """Read what :meth:`to_json` wrote. Classes resolve as in
        :meth:`TreeSpec.from_json <pytree_kit.TreeSpec.from_json>`: only those in
        ``allow`` (and ``rules``), never by importing. Raises ValueError on
        anything else."""
        try:
            doc = json.loads(text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"FlatSpec.from_json: not valid JSON ({e})") from None
        return cls.from_doc(doc, allow=allow, rules=rules)

    @classmethod
    def from_doc(cls, doc: Any, *, allow: Iterable[Any] = (), rules: Rules = None) -> FlatSpec:
        """:meth:`from_json` for a document already parsed (see :meth:`to_doc`)."""
        rules = check_rules(rules)
        check_header(doc, _FORMAT, _VERSION, "FlatSpec.from_json", f"not a {_FORMAT} document")
        tree = TreeSpec.from_json(json.dumps(doc.get("tree")), allow=allow, rules=rules)
        root, paths, raw = doc.get("root"), doc.get("paths"), doc.get("constants")
        n = tree.num_leaves
        if type(root) is not str or type(paths) is not list or type(raw) is not list:
            raise ValueError("FlatSpec.from_json: root, paths or constants missing")
        if len(paths) != n or not all(type(p) is str for p in paths):
            raise ValueError(f"FlatSpec.from_json: paths must be {n} strings")
        table = _jsonvalues.resolver(allow, rules)
        constants: list[tuple[int, Any]] = []
        for item in raw:
            if type(item) is not list or len(item) != 2 or type(item[0]) is not int:
                raise ValueError(f"FlatSpec.from_json: a constant must be [index, value]: {item!r}")
            i = item[0]
            if not 0 <= i < n or (constants and i <= constants[-1][0]):
                raise ValueError(f"FlatSpec.from_json: constant index {i} out of order or range")
            try:
                value = decode_constant(item[1], table)
            except _jsonvalues.Malformed as e:
                raise ValueError(f"FlatSpec.from_json: {paths[i]}: {e}") from None
            if not is_constant(value):
                raise ValueError(f"FlatSpec.from_json: {paths[i]}: not a constant: {item[1]!r}")
            constants.append((i, value))
        return cls._make(tree, tuple(constants), tuple(paths), root)


def check_header(doc: Any, fmt: str, version: int, who: str, not_ours: str) -> None:
    """Raise ValueError unless ``doc`` is a dict of this format and version."""
    if type(doc) is not dict or doc.get("format") != fmt:
        raise ValueError(f"{who}: {not_ours}")
    if doc.get("version") != version:
        raise ValueError(
            f"{who}: format version {doc.get('version')!r} is not supported "
            f"(this pytree_kit reads version {version})"
        )


def _constant_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as e:  # a repr is no reason for a spec's repr to fail
        return f"<{type(value).__name__} (repr raised {type(e).__name__})>"


def _render(root: str, path: tuple) -> str:
    """A leaf's path as messages write it: ``batch.boxes[0]`` for a keyword
    argument, ``args[0]`` for a positional one, ``output['x']`` for outputs."""
    if root == "inputs" and path and type(path[0]) is SequenceKey and path[0].idx in (0, 1):
        if path[0].idx == 0:
            return "args" + keystr(path[1:])
        if len(path) > 1 and type(path[1]) is DictKey and _is_name(path[1].key):
            return path[1].key + keystr(path[2:])
        return "kwargs" + keystr(path[1:])
    return root + keystr(path)


def _is_name(key: Any) -> bool:
    return type(key) is str and key.isidentifier()


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if is_constant(value):
        return repr(value)
    return f"a {type(value).__qualname__}"


def _hashable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, complex) and (math.isnan(value.real) or math.isnan(value.imag)):
        return "complex-nan"
    return value


def encode_constant(value: Any) -> Any:
    """A JSON value for a constant (see :func:`is_constant`)."""
    if isinstance(value, torch.dtype):
        return {"torch.dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"torch.device": str(value)}
    if isinstance(value, torch.Size):
        return {"torch.Size": list(value)}
    return _jsonvalues.encode(value)


def decode_constant(value: Any, table: dict) -> Any:
    """The constant :func:`encode_constant` wrote; raises ``_jsonvalues.Malformed``."""
    if type(value) is dict and len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "torch.dtype" and type(body) is str:
            found = getattr(torch, body, None)
            if isinstance(found, torch.dtype):
                return found
            raise _jsonvalues.Malformed(f"unknown dtype {body!r}")
        if tag == "torch.device" and type(body) is str:
            try:
                return torch.device(body)
            except (RuntimeError, ValueError) as e:
                raise _jsonvalues.Malformed(f"bad device {body!r} ({e})") from None
        if tag == "torch.Size" and type(body) is list and all(type(d) is int for d in body):
            return torch.Size(body)
    return _jsonvalues.decode(value, table)
