"""TreeSpec to JSON and back.

The document (``docs/design.md`` has the full format)::

    {"format": "pytree_kit.TreeSpec", "version": 1, "num_leaves": 3, "nodes": [
    {"kind": "dict", "keys": ["a", "b"]},
    "*",
    {"kind": "list", "arity": 2},
    "*",
    "*"
    ]}

Nodes are in pre-order; a leaf is ``"*"`` and ``None`` is ``null``. Classes and
functions are referenced as ``"module:qualname"``. Reading never imports a
module and never calls anything it was not allowed to: builtin and
``collections`` types always resolve, anything else only when passed in
``allow=`` (or, for a class flattened by a rule, in ``rules=``).
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
from ._kinds import (
    ATTRS,
    CUSTOM,
    DATACLASS,
    DEFAULTDICT,
    DEQUE,
    DICT,
    KIND_NAMES,
    LEAF,
    LEAF_NODE,
    LIST,
    NAMEDTUPLE,
    NONE,
    NONE_NODE,
    ORDEREDDICT,
    STRUCTSEQ,
    TUPLE,
    Rule,
    user_tail,
)
from ._pure import _fields_info
from ._spec import TreeSpec

FORMAT = "pytree_kit.TreeSpec"
VERSION = 1

_KIND_BY_NAME = {name: kind for kind, name in enumerate(KIND_NAMES)}

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
            raise TypeError(f"cannot write a context that contains itself: {_short(value)}")
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
        f"cannot write a value of type {t.__qualname__} to JSON: {_short(value)} "
        "(it does not pickle as its own class called with data)"
    )


def _sort_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def _node_json(node: tuple, order: Any) -> Any:
    kind, t, arity, aux = node
    if kind == LEAF:
        return "*"
    if kind == NONE:
        return None
    out: dict = {"kind": KIND_NAMES[kind]}
    if kind == TUPLE or kind == LIST:
        out["arity"] = arity
    elif kind == DICT or kind == ORDEREDDICT:
        out["keys"] = [encode(k) for k in aux]
    elif kind == DEFAULTDICT:
        out["default_factory"] = encode(aux[0])
        out["keys"] = [encode(k) for k in aux[1]]
    elif kind == DEQUE:
        out["arity"] = arity
        out["maxlen"] = aux
    elif kind == NAMEDTUPLE:
        out["class"] = ref(t)
        out["fields"] = list(aux)
    elif kind == STRUCTSEQ:
        out["class"] = ref(t)
        out["arity"] = arity
        if aux:
            out["hidden"] = [[name, encode(v)] for name, v in aux]
    elif kind == DATACLASS or kind == ATTRS:
        names, static, absent, dict_keys = aux
        out["class"] = ref(t)
        out["fields"] = list(names)
        if static:
            out["static"] = [[name, encode(v)] for name, v in static]
        if absent:
            out["unset"] = list(absent)
        if dict_keys is not None:
            out["dict_keys"] = list(dict_keys)
    else:  # CUSTOM, RULE
        tail = user_tail(kind, aux)
        out["class"] = ref(t)
        out["arity"] = arity
        if tail[1] is not None:
            out["keys"] = [encode(k) for k in tail[1]]
        if len(tail) == 3:
            out["entries"] = [encode(k) for k in tail[2]]
        out["aux"] = encode(tail[0])
    if order is not None:
        out["order"] = [encode(k) for k in order]
    return out


def spec_to_json(spec: TreeSpec) -> str:
    orders = dict(spec._orders)
    try:
        lines = [json.dumps(_node_json(node, orders.get(i))) for i, node in enumerate(spec._nodes)]
    except ValueError as e:  # e.g. an int beyond sys.get_int_max_str_digits()
        raise TypeError(f"cannot write this spec to JSON: {e}") from None
    head = json.dumps({"format": FORMAT, "version": VERSION, "num_leaves": spec._num_leaves})
    return head[:-1] + ', "nodes": [\n' + ",\n".join(lines) + "\n]}\n"


# --------------------------------------------------------------------------
# reading


class _Bad(Exception):
    """A malformed document; turned into ValueError at the boundary."""


def _resolver(allow: Iterable[Any], rules: Any) -> dict:
    table: dict = context_names(rules)
    for obj in allow:
        table[ref(obj)] = obj
    for cls in rules or ():
        table[ref(cls)] = cls
    return table


def _resolve(text: Any, table: dict) -> Any:
    if type(text) is not str or text.count(":") != 1:
        raise _Bad(f"a class reference must be a 'module:qualname' string, got {text!r}")
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
    raise _Bad(f"class {text} is not allowed; pass it in allow= to read this spec")


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
            return _resolve(body, table)
        if tag == "foreign":
            return Foreign(_decode_data(body, table))
    if t is dict and len(value) == 2 and "enum" in value:
        cls = _resolve(value["enum"], table)
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
    raise _Bad(f"not a valid aux value: {_short(value)}")


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
                raise _Bad(f"not a valid aux value: {_short(value)}") from None
    if type(value) is dict and "object" in value:
        return _decode_object(value, table)
    return decode(value, table)


def _decode_object(value: dict, table: dict) -> Any:
    """What :func:`_encode_object` wrote: only an allowed class is called (or
    its ``__new__``), and its state is set as pickle sets it."""
    cls = _resolve(value["object"], table)
    how = "new" if "new" in value else "args"
    args = value.get(how)
    if not isinstance(cls, type) or type(args) is not list or set(value) - {"object", how, "state"}:
        raise _Bad(f"not a valid aux value: {_short(value)}")
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
            raise _Bad(f"not a valid object state: {_short(part)}")
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int(node: dict, name: str, i: int, *, optional: bool = False) -> Any:
    value = node.get(name)
    if value is None and optional:
        return None
    if type(value) is not int or value < 0:
        raise _Bad(f"node {i}: {name!r} must be a non-negative integer, got {_short(value)}")
    return value


def _names(node: dict, name: str, i: int, default: Any = ()) -> tuple:
    """A list of strings; ``default=None`` makes it required."""
    value = node.get(name, default)
    if value is not default or default is None:
        if type(value) is not list:
            raise _Bad(f"node {i}: {name!r} must be a list of strings")
    out = tuple(value)
    if not all(type(v) is str for v in out):
        raise _Bad(f"node {i}: {name!r} must be a list of strings")
    return out


def _keys(node: dict, name: str, i: int, table: dict) -> tuple:
    value = node.get(name)
    if type(value) is not list:
        raise _Bad(f"node {i}: {name!r} must be a list")
    keys = tuple(decode(v, table) for v in value)
    if len(set(keys)) != len(keys):
        raise _Bad(f"node {i}: {name!r} holds a key twice")
    return keys


def _pairs(node: dict, name: str, i: int, table: dict) -> tuple:
    value = node.get(name, [])
    if type(value) is not list or not all(
        type(p) is list and len(p) == 2 and type(p[0]) is str for p in value
    ):
        raise _Bad(f"node {i}: {name!r} must be a list of [name, value] pairs")
    return tuple((p[0], decode(p[1], table)) for p in value)


def _record_node(kind: int, cls: Any, node: dict, i: int, table: dict) -> tuple:
    names = _names(node, "fields", i, None)
    static = _pairs(node, "static", i, table)
    absent = _names(node, "unset", i)
    dict_keys = node.get("dict_keys")
    if dict_keys is not None:
        dict_keys = _names(node, "dict_keys", i)
    attr = "__dataclass_fields__" if kind == DATACLASS else "__attrs_attrs__"
    if not isinstance(cls, type) or not hasattr(cls, attr):
        raise _Bad(
            f"node {i}: {ref(cls)} is not a{' dataclass' if kind == DATACLASS else 'n attrs class'}"
        )
    info = _fields_info(cls, {})
    want = {n for n, _ in info}
    static_names = {n for n, s in info if s}
    got = list(names) + [n for n, _ in static] + list(absent)
    if (
        sorted(got) != sorted(want)
        or not {n for n, _ in static} <= static_names
        or (set(names) & static_names)
    ):
        raise _Bad(f"node {i}: the fields of {ref(cls)} do not match the spec")
    if (dict_keys is not None) != issubclass(cls, dict):
        raise _Bad(f"node {i}: 'dict_keys' is for exactly the classes that are dicts")
    if dict_keys is not None and not set(dict_keys) <= set(names) | {n for n, _ in static}:
        raise _Bad(f"node {i}: dict_keys of {ref(cls)} must be fields")
    return (kind, cls, len(names), (names, static, absent, dict_keys))


def _node_from_json(node: Any, i: int, table: dict, rules: Any) -> tuple[tuple, Any]:
    """(node, insertion order or None) from one JSON node."""
    if node == "*":
        return LEAF_NODE, None
    if node is None:
        return NONE_NODE, None
    if type(node) is not dict or type(node.get("kind")) is not str:
        raise _Bad(f"node {i}: expected '*', null or an object with a 'kind', got {_short(node)}")
    kind = _KIND_BY_NAME.get(node["kind"])
    if kind is None or kind in (LEAF, NONE):
        raise _Bad(f"node {i}: unknown kind {node['kind']!r}")
    order = None
    if kind == TUPLE or kind == LIST:
        return (kind, None, _int(node, "arity", i), None), None
    if kind in (DICT, ORDEREDDICT, DEFAULTDICT):
        keys: Any = _keys(node, "keys", i, table)
        if kind != ORDEREDDICT and "order" in node:
            order = _keys(node, "order", i, table)
            if set(order) != set(keys) or order == keys:
                raise _Bad(f"node {i}: 'order' must be another order of the same keys")
        if kind == DEFAULTDICT:
            factory = decode(node.get("default_factory"), table)
            if factory is not None and not callable(factory):
                raise _Bad(f"node {i}: default_factory must be null or a reference to a callable")
            return (kind, None, len(keys), (factory, keys)), order
        return (kind, None, len(keys), keys), order
    if kind == DEQUE:
        arity = _int(node, "arity", i)
        maxlen = _int(node, "maxlen", i, optional=True)
        if maxlen is not None and arity > maxlen:
            raise _Bad(f"node {i}: a deque of maxlen {maxlen} cannot hold {arity} children")
        if maxlen is not None and maxlen > sys.maxsize:
            raise _Bad(f"node {i}: 'maxlen' is larger than any deque can have ({sys.maxsize})")
        return (kind, None, arity, maxlen), None
    cls = _resolve(node.get("class"), table)
    if kind == NAMEDTUPLE:
        fields = _names(node, "fields", i, None)
        if not (
            isinstance(cls, type)
            and issubclass(cls, tuple)
            and getattr(cls, "_fields", None) == fields
        ):
            raise _Bad(f"node {i}: {ref(cls)} is not a namedtuple with fields {list(fields)}")
        return (kind, cls, len(fields), fields), None
    if kind == STRUCTSEQ:
        arity = _int(node, "arity", i)
        if not (
            isinstance(cls, type)
            and issubclass(cls, tuple)
            and getattr(cls, "n_sequence_fields", None) == arity
        ):
            raise _Bad(f"node {i}: {ref(cls)} is not a structseq of {arity} fields")
        return (kind, cls, arity, _pairs(node, "hidden", i, table)), None
    if kind == DATACLASS or kind == ATTRS:
        return _record_node(kind, cls, node, i, table), None
    arity = _int(node, "arity", i)
    keys = None
    if "keys" in node:
        keys = _keys(node, "keys", i, table)
        if len(keys) != arity:
            raise _Bad(f"node {i}: 'keys' must have 'arity' entries")
    aux = decode(node.get("aux"), table)
    hash(aux)
    tail: tuple = (aux, keys)
    if "entries" in node:
        # optree's form: the children are named, and unflattened as a tuple
        entries = _keys(node, "entries", i, table)
        if keys is not None or len(entries) != arity:
            raise _Bad(f"node {i}: 'entries' must have 'arity' items, and no 'keys' beside")
        tail = (aux, None, entries)
    if kind == CUSTOM:
        if not isinstance(cls, type) or not callable(getattr(cls, "__tree_unflatten__", None)):
            raise _Bad(f"node {i}: {ref(cls)} has no __tree_unflatten__")
        return (kind, cls, arity, tail), None
    rule = (rules or {}).get(cls)
    if type(rule) is not Rule:
        raise _Bad(
            f"class {ref(cls)} was flattened by a rule; pass its rule in rules= to read this spec"
        )
    return (kind, cls, arity, (rule, *tail)), None


def spec_from_json(text: Any, *, allow: Iterable[Any] = (), rules: Any = None) -> TreeSpec:
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"TreeSpec.from_json: not UTF-8 text ({e})") from None
    if not isinstance(text, str):
        raise TypeError(f"TreeSpec.from_json expects str or bytes, got {type(text).__name__}")
    table = _resolver(allow, rules)
    try:
        doc = json.loads(text, object_pairs_hook=_unique_members, parse_constant=_no_constant)
        return _spec_from_doc(doc, table, rules)
    except json.JSONDecodeError as e:
        raise ValueError(f"TreeSpec.from_json: not valid JSON ({e})") from None
    except _Bad as e:
        raise ValueError(f"TreeSpec.from_json: {e}") from None
    except RecursionError:
        raise ValueError("TreeSpec.from_json: the document is nested too deeply") from None
    except Exception as e:  # anything else a hostile document provokes
        raise ValueError(
            f"TreeSpec.from_json: malformed document ({type(e).__name__}: {e})"
        ) from None


def _no_constant(name: str) -> Any:
    # NaN, Infinity and -Infinity are not JSON; to_json writes {"float": "nan"}.
    # (A NaN read as a number would also be a NaN other than _NAN: the spec
    # would differ from the one its own to_json reads back to.)
    raise _Bad(f'{name} is not JSON; a non-finite float is written as {{"float": ...}}')


def _unique_members(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Bad("an object names a member twice")
    return out


def _spec_from_doc(doc: Any, table: dict, rules: Any) -> TreeSpec:
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise _Bad(f"not a {FORMAT} document")
    version = doc.get("version")
    if type(version) is not int or version != VERSION:
        raise _Bad(
            f"unsupported version {_short(version)} (this pytree_kit reads version {VERSION})"
        )
    raw = doc.get("nodes")
    if type(raw) is not list or not raw:
        raise _Bad("'nodes' must be a non-empty list")
    nodes = []
    orders = []
    need = 1
    for i, item in enumerate(raw):
        if need == 0:
            raise _Bad(f"node {i}: the nodes describe more than one tree")
        node, order = _node_from_json(item, i, table, rules)
        need += node[2] - 1
        nodes.append(node)
        if order is not None:
            orders.append((i, order))
    if need:
        raise _Bad(f"the nodes end early: {need} more expected")
    num_leaves = sum(1 for n in nodes if n[0] == LEAF)
    if doc.get("num_leaves") != num_leaves or type(doc.get("num_leaves")) is not int:
        raise _Bad(
            f"'num_leaves' is {_short(doc.get('num_leaves'))}, but the nodes hold {num_leaves}"
        )
    return TreeSpec._make(tuple(nodes), tuple(orders), num_leaves)
