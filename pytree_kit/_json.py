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

This module reads and writes a spec's nodes, below ``_spec`` (whose
``TreeSpec.to_json`` and ``from_json`` call it); the values inside nodes are
``_jsonvalues``'s, which the torch documents share.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Iterable

from . import _kinds as kinds
from ._jsonvalues import (
    Malformed,
    decode,
    decode_data,
    encode,
    encode_data,
    ref,
    resolve,
    resolver,
    short,
)
from ._kinds import Rule, fields_info, user_tail

FORMAT = "pytree_kit.TreeSpec"
VERSION = 1

_KIND_BY_NAME = {name: kind for kind, name in enumerate(kinds.KIND_NAMES)}


# --------------------------------------------------------------------------
# writing


def _node_json(node: tuple, order: Any) -> Any:
    kind, t, arity, aux = node
    if kind == kinds.LEAF:
        return "*"
    if kind == kinds.NONE:
        return None
    out: dict = {"kind": kinds.KIND_NAMES[kind]}
    if kind == kinds.TUPLE or kind == kinds.LIST:
        out["arity"] = arity
    elif kind == kinds.DICT or kind == kinds.ORDEREDDICT:
        out["keys"] = [encode(k) for k in aux]
    elif kind == kinds.DEFAULTDICT:
        out["default_factory"] = encode(aux[0])
        out["keys"] = [encode(k) for k in aux[1]]
    elif kind == kinds.DEQUE:
        out["arity"] = arity
        out["maxlen"] = aux
    elif kind == kinds.NAMEDTUPLE:
        out["class"] = ref(t)
        out["fields"] = list(aux)
    elif kind == kinds.STRUCTSEQ:
        out["class"] = ref(t)
        out["arity"] = arity
        if aux:
            out["hidden"] = [[name, encode(v)] for name, v in aux]
    elif kind == kinds.DATACLASS or kind == kinds.ATTRS:
        names, static, absent, dict_keys = aux
        out["class"] = ref(t)
        out["fields"] = list(names)
        if static:
            out["static"] = [[name, encode(v)] for name, v in static]
        if absent:
            out["unset"] = list(absent)
        if dict_keys is not None:
            out["dict_keys"] = list(dict_keys)
    elif kind == kinds.MAPPING or kind == kinds.SEQUENCE:
        carried = aux[-1]
        out["class"] = ref(t)
        out["base"] = aux[0]
        if kind == kinds.MAPPING:
            out["keys"] = [encode(k) for k in aux[1]]
            if aux[0] == "defaultdict":
                out["default_factory"] = encode(aux[2])
            if carried.order is not None:
                out["order"] = [encode(k) for k in carried.order]
        else:
            out["arity"] = arity
        if carried.state:
            out["state"] = [_state_json(t, entry) for entry in carried.state]
    else:  # kinds.CUSTOM, RULE
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


_HOW = ("attr", "mirror", "data", "slot")  # Carried.state's ``how``, by its number


def _state_json(t: Any, entry: tuple) -> list:
    """One attribute a mapping or sequence node carries: ``[name, how]``, and
    its value for an attribute or a slot, written by ``encode_data``: aux
    data, lists, dicts and sets of such values, objects that pickle as their
    own class (read back only where ``allow=`` names the class), classes,
    and functions a reference names. Anything else (a bound method, an
    object that pickles otherwise) raises TypeError."""
    name, how, value = entry
    if how != kinds.ATTR and how != kinds.SLOT:
        return [name, _HOW[how]]
    plain = not callable(value) or isinstance(
        value, (type, types.FunctionType, types.BuiltinFunctionType)
    )
    try:
        if not plain:
            raise TypeError(f"a {type(value).__qualname__}")
        return [name, _HOW[how], encode_data(value)]
    except TypeError:
        raise Unwritable(
            f"{t.__qualname__} keeps the attribute {name!r} (a {type(value).__qualname__}), "
            "which the JSON of a spec cannot hold (data, and objects that pickle as their "
            "own class); pickle the spec instead, which keeps it"
        ) from None


class Unwritable(TypeError):
    """An attribute a node carries that JSON cannot hold; ``at`` is the
    node's index, whose path ``TreeSpec.to_json`` puts in its message."""

    at = 0


def _memo_key(node: tuple) -> Any:
    """A key under which a node's line can be kept for its equals in the same
    spec (the leaves, and the many equal containers of a batch), or None.
    Equal nodes can write differently (a dict key ``1`` and ``1.0`` are equal),
    (or ``(1,)`` and ``(1.0,)``), so only nodes whose aux holds no user value
    are kept, and dict nodes whose keys are all str."""
    kind = node[0]
    if kind == kinds.LEAF or kind == kinds.NONE or kind == kinds.TUPLE or kind == kinds.LIST:
        return node
    if kind == kinds.DICT or kind == kinds.ORDEREDDICT:
        for k in node[3]:
            if type(k) is not str:
                return None
        return node
    if (kind == kinds.DATACLASS or kind == kinds.ATTRS) and not node[3][1]:  # no static values
        return node
    return None


def nodes_to_json(nodes: tuple, orders: tuple, num_leaves: int) -> str:
    """The document of a spec's nodes, orders and leaf count (``TreeSpec.to_json``)."""
    by_index = dict(orders)
    memo: dict = {}
    lines = []
    try:
        for i, node in enumerate(nodes):
            order = by_index.get(i) if by_index else None
            key = _memo_key(node) if order is None else None
            line = memo.get(key) if key is not None else None
            if line is None:
                line = json.dumps(_node_json(node, order))
                if key is not None:
                    memo[key] = line
            lines.append(line)
    except ValueError as e:  # e.g. an int beyond sys.get_int_max_str_digits()
        raise TypeError(f"cannot write this spec to JSON: {e}") from None
    except Unwritable as e:
        e.at = len(lines)  # the node's index (TreeSpec.to_json names its path)
        raise
    head = json.dumps({"format": FORMAT, "version": VERSION, "num_leaves": num_leaves})
    return head[:-1] + ', "nodes": [\n' + ",\n".join(lines) + "\n]}\n"


# --------------------------------------------------------------------------
# reading


def _int(node: dict, name: str, i: int, *, optional: bool = False) -> Any:
    value = node.get(name)
    if value is None and optional:
        return None
    if type(value) is not int or value < 0:
        raise Malformed(f"node {i}: {name!r} must be a non-negative integer, got {short(value)}")
    return value


def _names(node: dict, name: str, i: int, default: Any = ()) -> tuple:
    """A list of strings; ``default=None`` makes it required."""
    value = node.get(name, default)
    if value is not default or default is None:
        if type(value) is not list:
            raise Malformed(f"node {i}: {name!r} must be a list of strings")
    out = tuple(value)
    if not all(type(v) is str for v in out):
        raise Malformed(f"node {i}: {name!r} must be a list of strings")
    return out


def _keys(node: dict, name: str, i: int, table: dict) -> tuple:
    value = node.get(name)
    if type(value) is not list:
        raise Malformed(f"node {i}: {name!r} must be a list")
    keys = tuple(decode(v, table) for v in value)
    if len(set(keys)) != len(keys):
        raise Malformed(f"node {i}: {name!r} holds a key twice")
    return keys


def _pairs(node: dict, name: str, i: int, table: dict) -> tuple:
    value = node.get(name, [])
    if type(value) is not list or not all(
        type(p) is list and len(p) == 2 and type(p[0]) is str for p in value
    ):
        raise Malformed(f"node {i}: {name!r} must be a list of [name, value] pairs")
    return tuple((p[0], decode(p[1], table)) for p in value)


def _record_node(kind: int, cls: Any, node: dict, i: int, table: dict) -> tuple:
    names = _names(node, "fields", i, None)
    static = _pairs(node, "static", i, table)
    absent = _names(node, "unset", i)
    dict_keys = node.get("dict_keys")
    if dict_keys is not None:
        dict_keys = _names(node, "dict_keys", i)
    dataclass = kind == kinds.DATACLASS
    attr = "__dataclass_fields__" if dataclass else "__attrs_attrs__"
    if not isinstance(cls, type) or not hasattr(cls, attr):
        what = "a dataclass" if dataclass else "an attrs class"
        raise Malformed(f"node {i}: {ref(cls)} is not {what}")
    info = fields_info(cls, {})
    want = {n for n, _ in info}
    static_names = {n for n, s in info if s}
    got = list(names) + [n for n, _ in static] + list(absent)
    if (
        sorted(got) != sorted(want)
        or not {n for n, _ in static} <= static_names
        or (set(names) & static_names)
    ):
        raise Malformed(f"node {i}: the fields of {ref(cls)} do not match the spec")
    if (dict_keys is not None) != issubclass(cls, dict):
        raise Malformed(f"node {i}: 'dict_keys' is for exactly the classes that are dicts")
    if dict_keys is not None and not set(dict_keys) <= set(names) | {n for n, _ in static}:
        raise Malformed(f"node {i}: dict_keys of {ref(cls)} must be fields")
    return (kind, cls, len(names), (names, static, absent, dict_keys))


def _subclass_node(kind: int, cls: Any, node: dict, i: int, table: dict) -> tuple:
    """A mapping or sequence node, checked against its class: one a class
    statement made on the document's base (``_pure.subclass_base``), and
    attributes that class can hold."""
    base = node.get("base")
    mapping = kind == kinds.MAPPING
    bases = (
        ("dict", "OrderedDict", "defaultdict", "UserDict")
        if mapping
        else ("tuple", "list", "UserList")
    )
    if base not in bases:
        raise Malformed(f"node {i}: 'base' must be one of {list(bases)}, got {short(base)}")
    if not isinstance(cls, type) or kinds.subclass_base(cls) != base:
        raise Malformed(f"node {i}: {ref(cls)} is not a class statement's subclass of {base}")
    order = None
    if mapping:
        keys: Any = _keys(node, "keys", i, table)
        arity = len(keys)
        if "order" in node:
            if base == "OrderedDict":
                raise Malformed(f"node {i}: an OrderedDict's keys are in their order already")
            order = _keys(node, "order", i, table)
            if set(order) != set(keys) or order == keys:
                raise Malformed(f"node {i}: 'order' must be another order of the same keys")
        factory = None
        if base == "defaultdict":
            factory = decode(node.get("default_factory"), table)
            if factory is not None and not callable(factory):
                raise Malformed(
                    f"node {i}: default_factory must be null or a reference to a callable"
                )
        elif "default_factory" in node:
            raise Malformed(f"node {i}: 'default_factory' is for a defaultdict's subclass")
    else:
        arity = _int(node, "arity", i)
    raw = node.get("state", [])
    if type(raw) is not list:
        raise Malformed(f"node {i}: 'state' must be a list")
    state = []
    seen: set = set()
    for entry in raw:
        if (
            type(entry) is not list
            or len(entry) not in (2, 3)
            or type(entry[0]) is not str
            or entry[1] not in _HOW
            or (len(entry) == 3) != (entry[1] in ("attr", "slot"))
        ):
            raise Malformed(f"node {i}: a 'state' entry must be [name, how] or [name, how, value]")
        name, how = entry[0], _HOW.index(entry[1])
        if name in seen:
            raise Malformed(f"node {i}: 'state' names {name!r} twice")
        seen.add(name)
        if how == kinds.MIRROR and (not mapping or name not in keys):
            raise Malformed(f"node {i}: a mirrored attribute must be one of the keys")
        if how == kinds.DATA and base not in ("UserDict", "UserList"):
            raise Malformed(f"node {i}: only a UserDict or UserList has 'data'")
        if how == kinds.SLOT and not _has_slot(cls, name):
            raise Malformed(f"node {i}: {ref(cls)} has no slot {name!r}")
        if how != kinds.SLOT and cls.__dictoffset__ == 0:
            raise Malformed(f"node {i}: instances of {ref(cls)} have no __dict__")
        value = decode_data(entry[2], table) if len(entry) == 3 else None
        state.append((name, how, value))
    if base in ("UserDict", "UserList") and "data" not in {
        n for n, h, _ in state if h == kinds.DATA
    }:
        raise Malformed(f"node {i}: a {base}'s state must hold its 'data'")
    carried = kinds.Carried(order, tuple(state)) if state or order else kinds.NOTHING_CARRIED
    if mapping:
        return (kind, cls, arity, (base, keys, factory, carried))
    return (kind, cls, arity, (base, carried))


def _has_slot(cls: type, name: str) -> bool:
    """Whether ``name`` is a slot of ``cls`` (a member descriptor of a class of its MRO)."""
    return any(type(c.__dict__.get(name)) is types.MemberDescriptorType for c in cls.__mro__)


def _node_from_json(node: Any, i: int, table: dict, rules: Any) -> tuple[tuple, Any]:
    """(node, insertion order or None) from one JSON node."""
    if node == "*":
        return kinds.LEAF_NODE, None
    if node is None:
        return kinds.NONE_NODE, None
    if type(node) is not dict or type(node.get("kind")) is not str:
        raise Malformed(
            f"node {i}: expected '*', null or an object with a 'kind', got {short(node)}"
        )
    kind = _KIND_BY_NAME.get(node["kind"])
    if kind is None or kind in (kinds.LEAF, kinds.NONE):
        raise Malformed(f"node {i}: unknown kind {node['kind']!r}")
    order = None
    if kind == kinds.TUPLE or kind == kinds.LIST:
        return (kind, None, _int(node, "arity", i), None), None
    if kind in (kinds.DICT, kinds.ORDEREDDICT, kinds.DEFAULTDICT):
        keys: Any = _keys(node, "keys", i, table)
        if kind != kinds.ORDEREDDICT and "order" in node:
            order = _keys(node, "order", i, table)
            if set(order) != set(keys) or order == keys:
                raise Malformed(f"node {i}: 'order' must be another order of the same keys")
        if kind == kinds.DEFAULTDICT:
            factory = decode(node.get("default_factory"), table)
            if factory is not None and not callable(factory):
                raise Malformed(
                    f"node {i}: default_factory must be null or a reference to a callable"
                )
            return (kind, None, len(keys), (factory, keys)), order
        return (kind, None, len(keys), keys), order
    if kind == kinds.DEQUE:
        arity = _int(node, "arity", i)
        maxlen = _int(node, "maxlen", i, optional=True)
        if maxlen is not None and arity > maxlen:
            raise Malformed(f"node {i}: a deque of maxlen {maxlen} cannot hold {arity} children")
        if maxlen is not None and maxlen > sys.maxsize:
            raise Malformed(f"node {i}: 'maxlen' is larger than any deque can have ({sys.maxsize})")
        return (kind, None, arity, maxlen), None
    cls = resolve(node.get("class"), table)
    if kind == kinds.NAMEDTUPLE:
        fields = _names(node, "fields", i, None)
        if not (
            isinstance(cls, type)
            and issubclass(cls, tuple)
            and getattr(cls, "_fields", None) == fields
        ):
            raise Malformed(f"node {i}: {ref(cls)} is not a namedtuple with fields {list(fields)}")
        return (kind, cls, len(fields), fields), None
    if kind == kinds.STRUCTSEQ:
        arity = _int(node, "arity", i)
        if not (
            isinstance(cls, type)
            and issubclass(cls, tuple)
            and getattr(cls, "n_sequence_fields", None) == arity
        ):
            raise Malformed(f"node {i}: {ref(cls)} is not a structseq of {arity} fields")
        # "hidden": the values outside the sequence, which documents written
        # before they left the structure hold; checked, then dropped, so such a
        # document reads as the spec a flatten gives now
        _pairs(node, "hidden", i, table)
        return (kind, cls, arity, ()), None
    if kind == kinds.DATACLASS or kind == kinds.ATTRS:
        return _record_node(kind, cls, node, i, table), None
    if kind == kinds.MAPPING or kind == kinds.SEQUENCE:
        return _subclass_node(kind, cls, node, i, table), None
    arity = _int(node, "arity", i)
    keys = None
    if "keys" in node:
        keys = _keys(node, "keys", i, table)
        if len(keys) != arity:
            raise Malformed(f"node {i}: 'keys' must have 'arity' entries")
    aux = decode(node.get("aux"), table)
    hash(aux)
    tail: tuple = (aux, keys)
    if "entries" in node:
        # optree's form: the children are named, and unflattened as a tuple
        entries = _keys(node, "entries", i, table)
        if keys is not None or len(entries) != arity:
            raise Malformed(f"node {i}: 'entries' must have 'arity' items, and no 'keys' beside")
        tail = (aux, None, entries)
    if kind == kinds.CUSTOM:
        if not isinstance(cls, type) or not callable(getattr(cls, "__tree_unflatten__", None)):
            raise Malformed(f"node {i}: {ref(cls)} has no __tree_unflatten__")
        return (kind, cls, arity, tail), None
    rule = (rules or {}).get(cls)
    if type(rule) is not Rule:
        raise Malformed(
            f"class {ref(cls)} was flattened by a rule; pass its rule in rules= to read this spec"
        )
    return (kind, cls, arity, (rule, *tail)), None


def nodes_from_json(
    text: Any, *, allow: Iterable[Any] = (), rules: Any = None
) -> tuple[tuple, tuple, int]:
    """(nodes, orders, leaf count) of a document :func:`nodes_to_json` wrote
    (``TreeSpec.from_json``); ValueError for any malformed document."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"TreeSpec.from_json: not UTF-8 text ({e})") from None
    if not isinstance(text, str):
        raise TypeError(f"TreeSpec.from_json expects str or bytes, got {type(text).__name__}")
    table = resolver(allow, rules)
    try:
        doc = json.loads(text, object_pairs_hook=_unique_members, parse_constant=_no_constant)
        return _nodes_from_doc(doc, table, rules)
    except json.JSONDecodeError as e:
        raise ValueError(f"TreeSpec.from_json: not valid JSON ({e})") from None
    except Malformed as e:
        raise ValueError(f"TreeSpec.from_json: {e}") from None
    except RecursionError:
        raise ValueError("TreeSpec.from_json: the document is nested too deeply") from None
    except Exception as e:  # anything else a hostile document provokes
        raise ValueError(
            f"TreeSpec.from_json: malformed document ({type(e).__name__}: {e})"
        ) from None


def _no_constant(name: str) -> Any:
    # NaN, Infinity and -Infinity are not JSON; to_json writes {"float": "nan"}.
    # (A NaN read as a number would also be a NaN other than the one decode
    # gives: the spec would differ from the one its own to_json reads back to.)
    raise Malformed(f'{name} is not JSON; a non-finite float is written as {{"float": ...}}')


def _unique_members(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise Malformed("an object names a member twice")
    return out


def _nodes_from_doc(doc: Any, table: dict, rules: Any) -> tuple[tuple, tuple, int]:
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise Malformed(f"not a {FORMAT} document")
    version = doc.get("version")
    if type(version) is not int or version != VERSION:
        raise Malformed(
            f"unsupported version {short(version)} (this pytree_kit reads version {VERSION})"
        )
    raw = doc.get("nodes")
    if type(raw) is not list or not raw:
        raise Malformed("'nodes' must be a non-empty list")
    nodes = []
    orders = []
    need = 1
    for i, item in enumerate(raw):
        if need == 0:
            raise Malformed(f"node {i}: the nodes describe more than one tree")
        node, order = _node_from_json(item, i, table, rules)
        need += node[2] - 1
        nodes.append(node)
        if order is not None:
            orders.append((i, order))
    if need:
        raise Malformed(f"the nodes end early: {need} more expected")
    num_leaves = sum(1 for n in nodes if n[0] == kinds.LEAF)
    if doc.get("num_leaves") != num_leaves or type(doc.get("num_leaves")) is not int:
        raise Malformed(
            f"'num_leaves' is {short(doc.get('num_leaves'))}, but the nodes hold {num_leaves}"
        )
    return tuple(nodes), tuple(orders), num_leaves
