"""How the arguments of one call become one canonical ``(args, kwargs)`` tree.

A traced program takes its inputs in one fixed structure, but a model can be
called in several equivalent ways: ``m(batch)``, ``m(batch, None)`` and
``m(batch=batch, mask=None)`` are the same call when ``mask`` defaults to None.
:class:`Arguments` binds a call to the model's signature, so that every one of
them gives the same tree: positional-only parameters and ``*args`` stay
positional, every other parameter goes by name, and an omitted parameter takes
its default when the default is None or a constant (otherwise it stays
omitted, and the model supplies it). Without a signature (a builtin, a
ScriptModule), the call's own ``(args, kwargs)`` is the tree.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch
from torch import nn

from ._flatspec import decode_constant, encode_constant, is_constant

__all__ = ["Arguments"]

_P = inspect.Parameter
_KINDS = {
    "positional_only": _P.POSITIONAL_ONLY,
    "positional_or_keyword": _P.POSITIONAL_OR_KEYWORD,
    "var_positional": _P.VAR_POSITIONAL,
    "keyword_only": _P.KEYWORD_ONLY,
    "var_keyword": _P.VAR_KEYWORD,
}
_KIND_NAMES = {kind: name for name, kind in _KINDS.items()}


def _fills_in(default: Any) -> bool:
    """Whether an omitted parameter takes this default in the canonical tree."""
    return default is None or is_constant(default)


class Arguments:
    """The parameters of a model's forward, as far as calls need them.

    Examples:
        >>> from pytree_kit.torch._arguments import Arguments
        >>> def forward(x, mask=None, *, scale=1.0):
        ...     pass
        >>> a = Arguments.of(forward)
        >>> a.canonical((1,), {})
        ((), {'x': 1, 'mask': None, 'scale': 1.0})
        >>> a.canonical((), {"x": 1, "mask": None}) == a.canonical((1, None), {})
        True
    """

    __slots__ = ("_signature",)

    def __init__(self, signature: Optional[inspect.Signature]) -> None:
        self._signature = signature

    @classmethod
    def of(cls, model: Callable[..., Any]) -> Arguments:
        """The parameters of ``model`` (its ``forward``, for an nn.Module)."""
        if isinstance(model, torch.jit.ScriptModule):
            return cls(None)
        target = model.forward if isinstance(model, nn.Module) else model
        try:
            return cls(inspect.signature(target))
        except (TypeError, ValueError):  # a builtin, or no signature to read
            return cls(None)

    def canonical(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The ``(args, kwargs)`` every equivalent call gives.

        Raises TypeError when the call does not fit the signature, as calling
        the model would.
        """
        sig = self._signature
        if sig is None:
            return args, kwargs
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"the arguments do not fit the model's signature {sig}: {e}") from None
        given = bound.arguments
        positional: list = []
        named: dict = {}
        skipped = False  # a positional-only parameter left to the model
        for name, param in sig.parameters.items():
            kind = param.kind
            if name in given:
                value = given[name]
            elif (
                param.default is not _P.empty
                and _fills_in(param.default)
                and not (skipped and kind is _P.POSITIONAL_ONLY)
            ):
                value = param.default
            else:
                skipped = skipped or kind is _P.POSITIONAL_ONLY
                continue
            if kind is _P.POSITIONAL_ONLY:
                positional.append(value)
            elif kind is _P.VAR_POSITIONAL:
                positional.extend(value)
            elif kind is _P.VAR_KEYWORD:
                named.update(value)
            else:
                named[name] = value
        return tuple(positional), named

    def to_json(self) -> Any:
        """A JSON value: the parameters' names, kinds and fillable defaults."""
        if self._signature is None:
            return None
        out = []
        for param in self._signature.parameters.values():
            item: dict = {"name": param.name, "kind": _KIND_NAMES[param.kind]}
            if param.default is not _P.empty and _fills_in(param.default):
                item["default"] = encode_constant(param.default)
            elif param.default is not _P.empty:
                item["has_default"] = True  # not written: the model supplies it
            out.append(item)
        return out

    @classmethod
    def from_json(cls, doc: Any, table: dict) -> Arguments:
        """Read :meth:`to_json`'s value; raises ValueError when malformed."""
        if doc is None:
            return cls(None)
        if type(doc) is not list:
            raise ValueError("the parameters must be a list")
        params = []
        for item in doc:
            if (
                type(item) is not dict
                or item.get("kind") not in _KINDS
                or type(item.get("name")) is not str
            ):
                raise ValueError(f"bad parameter {item!r}")
            default: Any = _P.empty
            if "default" in item:
                default = decode_constant(item["default"], table)
                if not _fills_in(default):
                    raise ValueError(f"bad default in {item!r}")
            elif item.get("has_default"):
                default = _Unwritten()
            try:
                params.append(_P(str(item.get("name")), _KINDS[item["kind"]], default=default))
            except (TypeError, ValueError) as e:
                raise ValueError(f"bad parameter {item!r} ({e})") from None
        try:
            return cls(inspect.Signature(params))
        except (TypeError, ValueError) as e:
            raise ValueError(f"bad parameters ({e})") from None

    def __repr__(self) -> str:
        return f"Arguments{self._signature}"


class _Unwritten:
    """A default that was not saved (not a constant): the model supplies it."""

    def __repr__(self) -> str:
        return "<default>"
