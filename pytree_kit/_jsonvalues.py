"""Values in JSON documents, and references to classes: what TreeSpec
documents (``_json``) and the torch documents (``pytree_kit.torch``'s FlatSpec
and a traced model's parameters) write and read alike.

:func:`encode` writes a piece of aux data (a dict key, a static field, a
rule's aux) as a JSON value, and :func:`decode` reads it back; a class or
function is written as ``"module:qualname"`` (:func:`ref`). Reading never
imports a module and never calls anything it was not allowed to: a reference
resolves through :func:`resolver`'s table (the classes in ``allow=`` and in
``rules=``), or to a builtin or ``collections`` type. A malformed value raises
:class:`Malformed`, which each document's reader turns into its ValueError.
"""

from __future__ import annotations

import builtins
import collections
import copyreg
import enum
import json
import math
import sys
from typing import Any, Iterable

from ._bridge import Foreign, context_names

# Every NaN read from JSON is this one object, so that decoding a document twice
# gives equal specs (a NaN only equals itself by identity).
_NAN = float("nan")
_FLOATS = {"nan": _NAN, "inf": float("inf"), "-inf": float("-inf")}
_NAN_COMPLEX: dict = {}  # repr -> the one complex with a NaN part of that repr

# Builtin types that are not attributes of the builtins module.
_BUILTIN_EXTRA = {
    f"builtins:{t.__qualname__}": t for t in (type(None), type(Ellipsis), type(NotImplemented))
}


# --------------------------------------------------------------------------
# writing


def ref(obj: Any) -> str:
    """``"module:qualname"`` of a class or function."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(f"cannot write {obj!r} to JSON: it has no module and qualified name")
    return f"{module}:{qualname}"


def encode(value: Any) -> Any:
    """A JSON value for one piece of aux data (keys, static fields, user aux)."""
    t = type(value)
    if value is None or t is bool or t is str or t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is tuple:
        return {"tuple": [encode(v) for v in value]}
    if t is frozenset:
        return {"frozenset": sorted((encode(v) for v in value), key=_sort_key)}
    if t is bytes:
        return {"bytes": value.hex()}
    if t is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    if isinstance(value, enum.Enum):
        name = value.name
        if isinstance(name, str) and t.__members__.get(name) is value:
            return {"enum": ref(t), "name": name}
        return {"enum": ref(t), "value": encode(value.value)}  # e.g. a Flag combination
    if t is Foreign:
        return {"foreign": _encode_data(value.value)}
    if isinstance(value, type) or callable(value):
        return {"ref": ref(value)}
    raise TypeError(f"cannot write a value of type {t.__qualname__} to JSON: {value!r}")


def _encode_data(value: Any, active: frozenset = frozenset()) -> Any:
    """Another library's context, which may hold lists, dicts, sets and objects
    that pickle by class (its ``__reduce_ex__``)."""
    t = type(value)
    is_object = not (t is list or t is tuple or t is dict or t is set) and _is_object(value)
    if is_object or t is list or t is tuple or t is dict or t is set:
        if id(value) in active:
            raise TypeError(f"cannot write a context that contains itself: {short(value)}")
        active = active | {id(value)}
    if t is list:
        return {"list": [_encode_data(v, active) for v in value]}
    if t is tuple:
        return {"tuple": [_encode_data(v, active) for v in value]}
    if t is dict:
        return {
            "dict": [[_encode_data(k, active), _encode_data(v, active)] for k, v in value.items()]
        }
    if t is set:
        return {"set": sorted((_encode_data(v, active) for v in value), key=_sort_key)}
    if is_object:
        return _encode_object(value, active)
    return encode(value)


def encode_data(value: Any) -> Any:
    """A JSON value for data a node carries (a mapping's attribute): what
    :func:`encode` writes, and lists, dicts, sets and objects that pickle as
    their own class (``{"object": ...}``), as another library's context is
    written; :func:`decode_data` reads it."""
    return _encode_data(value)


def _is_object(value: Any) -> bool:
    """Not a value :func:`encode` writes by itself."""
    t = type(value)
    if value is None or t in _PLAIN or isinstance(value, enum.Enum) or t is Foreign:
        return False
    return not (isinstance(value, type) or callable(value))


_PLAIN = frozenset({bool, str, int, float, tuple, frozenset, bytes, complex})
_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]  # pickle's cls.__new__(cls, *args)


def _encode_object(value: Any, active: frozenset) -> Any:
    """``{"object": "module:qualname", "args" or "new": [...], "state": ...}``
    from ``__reduce_ex__(2)`` where it names the object's own class (called,
    or its ``__new__``), or ``{"ref": "module:name"}`` where it names a module
    global (a torch dtype)."""
    t = type(value)
    try:
        reduced = value.__reduce_ex__(2)
    except Exception as e:
        raise TypeError(f"cannot write a value of type {t.__qualname__} to JSON: {e}") from None
    if type(reduced) is str:
        module = getattr(value, "__module__", None) or getattr(t, "__module__", None)
        if getattr(sys.modules.get(module or ""), reduced, None) is value:
            return {"ref": f"{module}:{reduced}"}
    elif type(reduced) is tuple and 2 <= len(reduced) <= 5 and type(reduced[1]) is tuple:
        fn, args = reduced[0], reduced[1]
        state = reduced[2] if len(reduced) > 2 else None
        if all(x is None for x in reduced[3:]):
            out: dict
            if fn is _NEWOBJ and args and args[0] is t:
                out = {"object": ref(t), "new": [_encode_data(a, active) for a in args[1:]]}
            elif fn is t:
                out = {"object": ref(t), "args": [_encode_data(a, active) for a in args]}
            else:
                out = {}
            if out:
                if state is not None:
                    out["state"] = _encode_data(state, active)
                return out
    raise TypeError(
        f"cannot write a value of type {t.__qualname__} to JSON: {short(value)} "
        "(it does not pickle as its own class called with data)"
    )


def _sort_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


# --------------------------------------------------------------------------
# reading


class Malformed(Exception):
    """A malformed document or value; each reader turns it into ValueError."""


def resolver(allow: Iterable[Any], rules: Any) -> dict:
    table: dict = context_names(rules)
    for obj in allow:
        table[ref(obj)] = obj
    for cls in rules or ():
        table[ref(cls)] = cls
    return table


def resolve(text: Any, table: dict) -> Any:
    if type(text) is not str or text.count(":") != 1:
        raise Malformed(f"a class reference must be a 'module:qualname' string, got {text!r}")
    found = table.get(text)
    if found is not None:
        return found
    if text in _BUILTIN_EXTRA:
        return _BUILTIN_EXTRA[text]
    module, qualname = text.split(":")
    if module == "builtins" or module == "collections":
        obj = getattr(builtins if module == "builtins" else collections, qualname, None)
        if isinstance(obj, type) and ref(obj) == text:
            return obj
    raise Malformed(f"class {text} is not allowed; pass it in allow= to read this spec")


def decode(value: Any, table: dict) -> Any:
    t = type(value)
    if value is None or t is bool or t is str or t is int or t is float:
        return value
    if t is dict and len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "float" and type(body) is str and body in _FLOATS:
            return _FLOATS[body]
        if tag == "tuple" and type(body) is list:
            return tuple(decode(v, table) for v in body)
        if tag == "frozenset" and type(body) is list:
            return frozenset(decode(v, table) for v in body)
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "complex" and type(body) is list and len(body) == 2:
            re, im = (decode(v, table) for v in body)
            if type(re) is float or type(re) is int:
                if type(im) is float or type(im) is int:
                    return _complex(re, im)
        if tag == "ref":
            return resolve(body, table)
        if tag == "foreign":
            return Foreign(_decode_data(body, table))
    if t is dict and len(value) == 2 and "enum" in value:
        cls = resolve(value["enum"], table)
        if isinstance(cls, type) and issubclass(cls, enum.Enum):
            if type(value.get("name")) is str:
                member = cls.__members__.get(value["name"])
                if member is not None:
                    return member
            elif "value" in value:
                try:
                    return cls(decode(value["value"], table))
                except ValueError:
                    pass
    raise Malformed(f"not a valid aux value: {short(value)}")


def _decode_data(value: Any, table: dict) -> Any:
    """What :func:`_encode_data` wrote."""
    if type(value) is dict and len(value) == 1:
        ((tag, body),) = value.items()
        if type(body) is list:
            if tag == "list":
                return [_decode_data(v, table) for v in body]
            if tag == "tuple":
                return tuple(_decode_data(v, table) for v in body)
            try:
                if tag == "set":
                    return {_decode_data(v, table) for v in body}
                if tag == "dict" and all(type(p) is list and len(p) == 2 for p in body):
                    return {_decode_data(k, table): _decode_data(v, table) for k, v in body}
            except TypeError:  # an unhashable key or member
                raise Malformed(f"not a valid aux value: {short(value)}") from None
    if type(value) is dict and "object" in value:
        return _decode_object(value, table)
    return decode(value, table)


def decode_data(value: Any, table: dict) -> Any:
    """What :func:`encode_data` wrote: an object only of a class in ``table``
    (``allow=``), made as pickle makes it."""
    return _decode_data(value, table)


def _decode_object(value: dict, table: dict) -> Any:
    """What :func:`_encode_object` wrote: only an allowed class is called (or
    its ``__new__``), and its state is set as pickle sets it."""
    cls = resolve(value["object"], table)
    how = "new" if "new" in value else "args"
    args = value.get(how)
    if not isinstance(cls, type) or type(args) is not list or set(value) - {"object", how, "state"}:
        raise Malformed(f"not a valid aux value: {short(value)}")
    args = [_decode_data(a, table) for a in args]
    obj = cls.__new__(cls, *args) if how == "new" else cls(*args)
    if "state" in value:
        _set_state(obj, _decode_data(value["state"], table))
    return obj


def _set_state(obj: Any, state: Any) -> None:
    """pickle's BUILD: ``__setstate__``, else a ``__dict__`` and slots."""
    setstate = getattr(obj, "__setstate__", None)
    if setstate is not None:
        setstate(state)
        return
    slots = None
    if type(state) is tuple and len(state) == 2:
        state, slots = state
    for part in (state, slots):
        if part is not None and (type(part) is not dict or not all(type(k) is str for k in part)):
            raise Malformed(f"not a valid object state: {short(part)}")
    if state:
        obj.__dict__.update(state)
    for name, v in (slots or {}).items():
        setattr(obj, name, v)


def _complex(re: Any, im: Any) -> complex:
    value = complex(re, im)
    if value == value:
        return value
    # A complex with a NaN part equals only itself, like a NaN: one object per
    # value, so that decoding a document twice gives equal specs. Bounded, as a
    # hostile stream could send any number of them (the rest stay distinct).
    text = repr(value)
    found = _NAN_COMPLEX.get(text)
    if found is None:
        found = value
        if len(_NAN_COMPLEX) < 4096:
            _NAN_COMPLEX[text] = value
    return found


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
