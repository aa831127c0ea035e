"""The pure-Python engine: the executable specification of pytree_kit.

Every traversal here is iterative (an explicit stack, no recursion on user
data), so depth is bounded by memory, not by the interpreter's recursion
limit. A C engine must give the same leaves, equal specs, and the same
errors with the same messages.

The spec format (``docs/design.md``): a tuple of nodes in pre-order, each
``(kind, type, arity, aux)``, plus the insertion orders of dicts whose
leaf order (sorted keys) differs from it.

This module holds the rules: what each kind of node is, and how flatten,
unflatten and matching read and build it. Two others hold the rest of the
specification, each with one job: ``_messages``, the text of every error
both engines raise, and ``_traced``, the steps that differ while
torch.compile traces a walk (this module asks ``_traced.on()`` where a step
differs, and nothing more of the tracer). The Python functions the C engine
calls are listed in ``_interface.C_BINDINGS``.
"""

from __future__ import annotations

import functools
import sys
import sysconfig
import types
from collections import OrderedDict, defaultdict, deque
from itertools import islice
from typing import Any, Iterator

from . import _interface, _traced
from ._bridge import rules_fix
from ._errors import StructureError
from ._keys import _KEY_TYPES, DictKey, SequenceKey, where
from ._kinds import (
    AS_LEAF,
    ATTR,
    ATTRS,
    CUSTOM,
    DATA,
    DATACLASS,
    DEFAULTDICT,
    DEQUE,
    DICT,
    LEAF,
    LEAF_NODE,
    LIST,
    MAPPING,
    MAPPING_BASES,
    MIRROR,
    NAMEDTUPLE,
    NEW,
    NONE,
    NONE_NODE,
    NOTHING_CARRIED,
    ORDEREDDICT,
    RULE,
    SEQUENCE,
    SLOT,
    STRUCTSEQ,
    TUPLE,
    Carried,
    check_rules,
    own_setters,
    record_fields,
    subclass_base,
    user_tail,
)
from ._kinds import fields_info as _fields_info
from ._messages import (
    BY_ATTR,
    BY_KEY,
    BY_SEQ,
    changed,
    cycle_error,
    describe_node,
    frame_key,
    keys_text,
    missing,
    qualname,
    refuse_leaves,
    refuse_trees,
    returned,
    stack_path,
    tell_apart,
)
from ._reach import first_reaching  # noqa: F401  (the engine's interface)
from ._rows import leaf_codes, number_list, packed_sample  # noqa: F401  (the engine's interface)
from ._spec import TreeSpec, _subtree_end, child_key, node_paths
from ._traced import CYCLE_DEPTH

NAME = "python"


_NoneType = type(None)

# Exact builtin types that are always leaves: attributes cannot be set on them,
# so no __tree_flatten__ can appear. (A rule for one of them still wins.)
_ATOMS = frozenset({int, float, str, bytes, bool, complex})


# --------------------------------------------------------------------------
# Recognising nodes by their structure (no registry)


def _leaf_order(obj: Any) -> list:
    """The keys of a dict (or a list of them, in insertion order) in leaf
    order: sorted when they are mutually orderable."""
    keys = list(obj)
    try:
        return sorted(keys)
    except Exception:
        # Keys that are not mutually orderable keep insertion order: never an error.
        return keys


#: Where ``_dict_read`` leaves, in a walk's ``cache``, the insertion order of
#: the dict it read last (for ``dict_order``): a tuple, or None when it is to
#: be read again (``dict_order_differs``).
_ORDER = "insertion order"

#: On a free-threaded build the C engine reads each dict from a copy
#: (``READ_SNAPSHOTS`` in ``_core.h``), so a key's ``<`` or ``==`` that
#: changes the dict while its keys are sorted changes nothing it reads: this
#: engine then reads the values and order from its one read of the items too.
_SNAPSHOT_READS = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def _read(read: Any, obj: Any, stack: list) -> Any:
    """``read(obj)``, the one read of a container; CPython's RuntimeError for
    a container that changed during it (``dictionary changed size during
    iteration``), at the container's path."""
    try:
        return read(obj)
    except RuntimeError as e:
        raise changed(stack, e) from None


def _item_list(d: Any) -> list:
    return list(d.items())


def _dict_read(obj: dict, stack: list, cache: dict) -> tuple:
    """``(keys in leaf order, their values)`` of a dict or defaultdict, from
    one read of its items (``list(d.items())``, which CPython makes without
    letting another thread change the dict, with the GIL or without), and
    its insertion order from the same read, left in ``cache[_ORDER]`` for
    ``dict_order``: so the spec's keys, values and order are of one state of
    the dict, whatever other threads do to it.

    Where a key's hash, ``==`` or ``<`` may be Python code (a key of a type
    outside ``_ATOMS``), that code may change the dict while its keys are
    sorted, and it is seen as the C engine sees it: the values are None (the
    caller looks each key up, after what it checks first) and the insertion
    order is read again (``dict_order_differs``). On a free-threaded build
    (``_SNAPSHOT_READS``) the dict is read as the C engine reads it there: as
    one copy (``dict.copy``, which runs no hash), whose values are looked up
    and whose order is kept, since no code of the caller's can change it."""
    if _SNAPSHOT_READS:
        snapshot = _read(dict.copy, obj, stack)
        items = list(snapshot.items())
    else:
        items = _read(_item_list, obj, stack)
    order = [k for k, _ in items]
    keys = _leaf_order(order)
    if not _ATOMS.issuperset(map(type, order)):
        if _SNAPSHOT_READS:
            cache[_ORDER] = tuple(order)
            return keys, [snapshot[k] for k in keys]
        cache[_ORDER] = None
        return keys, None
    cache[_ORDER] = tuple(order)
    if keys == order:
        return keys, [v for _, v in items]
    values = dict(items)
    return keys, [values[k] for k in keys]


def _odict_read(obj: OrderedDict, stack: list) -> tuple:
    """``(keys in its own order, their values)`` of an OrderedDict, from one
    read of its items; as ``_dict_read``, the values are None where a key's
    hash or ``==`` may be Python code (read by the caller, as the C engine
    does; ``OrderedDict``'s items would turn an error of that code into a
    KeyError)."""
    order = _read(_key_order, obj, stack)
    if not _ATOMS.issuperset(map(type, order)):
        return order, None
    items = _read(_item_list, obj, stack)
    return tuple([k for k, _ in items]), [v for _, v in items]


def _plainly_hashable(x: Any) -> bool:
    """Whether ``hash(x)`` would succeed, known without calling it: ``x`` is
    None, a str, int, float, bool, bytes, complex or plain class, or a tuple
    of such values. False means only "not known": ``hash`` decides. Exact
    types only, as a subclass may set ``__hash__`` to None (traced:
    ``_traced.plainly_hashable``)."""
    if _traced.on():
        return _traced.plainly_hashable(x)
    todo = [x]
    while todo:
        v = todo.pop()
        if v is None:
            continue
        t = type(v)
        if t is tuple:
            todo.extend(v)
        elif not (
            t is str
            or t is int
            or t is float
            or t is bool
            or t is bytes
            or t is complex
            or t is type
        ):
            return False
    return True


def _check_hashable(aux: Any, stack: list, what: str) -> None:
    if _plainly_hashable(aux):
        return
    try:
        hash(aux)
    except TypeError as e:
        raise TypeError(
            f"{where(stack_path(stack))}: the aux data of {what} must be hashable ({e})"
        ) from None


def _own_getattr(t: Any) -> bool:
    """Whether the class (or a base) defines ``__getattr__``: looked up in the
    class's MRO, as CPython's ``_PyType_Lookup`` does, never on the metaclass."""
    # Written so that torch.compile can trace it: a plain getattr on the class
    # finds a function of the class's MRO as it is, and one of the metaclass
    # (a __getattr__ for the class's own attributes) bound to the class.
    found = getattr(t, "__getattr__", None)
    return found is not None and getattr(found, "__self__", None) is not t


# what a class's attribute hook is when no class statement wrote it: a
# builtin type's own (object's, dict's: the generic lookup)
_BUILTIN_HOOKS = (
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.BuiltinFunctionType,
)


def _customised(t: Any) -> Any:
    """What makes a rebuild of a dataclass or attrs class ``t`` from its
    fields unfaithful, whatever the instance: the attribute hook its class
    defines (``"__getattr__"``, ``"__getattribute__"`` or ``"__setattr__"``),
    or the builtin class with state of its own it derives from (``list``,
    ``Exception``: its contents are not fields), else None.

    A hook counts when it is a Python function (a builtin type's own, such as
    ``dict``'s, is the generic one). The rebuild sets the fields with
    ``object.__setattr__`` on ``t.__new__(t)``; a ``__setattr__`` that
    dataclasses or attrs wrote (frozen classes, attrs' ``on_setattr``) only
    stores or refuses, and one of a dataclass that is a dict (transformers'
    ``ModelOutput``) keeps the dict view in step, which the rebuild
    restores. attrs' ``__getattr__`` for the ``cached_property`` of a slotted
    class only computes a cached value. A dict or OrderedDict base is the
    dict view, which the engine checks and restores."""
    # plain getattr and isinstance: torch.compile's tracer follows them
    if _own_getattr(t) and _cached_by_attrs(t) is None:
        return "__getattr__"
    if not isinstance(getattr(t, "__getattribute__", None), _BUILTIN_HOOKS):
        return "__getattribute__"
    found = getattr(t, "__setattr__", None)
    if not isinstance(found, _BUILTIN_HOOKS) and not _written_for_records(t, found):
        return "__setattr__"
    for base in t.__mro__:
        if (
            not base.__flags__ & _HEAPTYPE
            and base.__basicsize__ > object.__basicsize__
            and base is not dict
            and base is not OrderedDict
        ):
            return base
    return None


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class a class statement made


def _cached_by_attrs(t: Any) -> Any:
    """The names of the cached properties whose values attrs keeps in slots of
    ``t``, when every ``__getattr__`` of the classes of ``t.__mro__`` is one
    that attrs wrote for them (it computes a missing cached value, and is not
    chained to a ``__getattr__`` of the class's own), else None."""
    names: frozenset = frozenset()
    for c in t.__mro__:
        found = c.__dict__.get("__getattr__")
        if found is None:
            continue
        code = getattr(found, "__code__", None)
        defaults = getattr(found, "__defaults__", None)
        if (
            code is None
            or not code.co_filename.startswith("<attrs generated getattr ")
            or type(defaults) is not tuple
            or len(defaults) < 2
            or type(defaults[0]) is not dict
            or defaults[1] is not None  # the class's own __getattr__, chained
        ):
            return None
        names |= frozenset(defaults[0])
    return names or None


def _written_for_records(t: Any, found: Any) -> bool:
    """Whether ``found``, the ``__setattr__`` of ``t``, is one that dataclasses
    or attrs wrote, or that of a dataclass that is a dict."""
    if issubclass(t, dict):
        return True
    code = getattr(found, "__code__", None)
    if code is None:
        return False
    params = getattr(t, "__dataclass_params__", None)
    if params is not None and params.frozen and code.co_filename == "<string>":
        return True  # dataclasses writes it with exec; a frozen dataclass cannot define its own
    attr_make = sys.modules.get("attr._make")
    if attr_make is None:
        return False
    return found is getattr(attr_make, "_frozen_setattrs", None) or (
        code.co_filename == getattr(attr_make, "__file__", None)  # on_setattr hooks
    )


_HOOKS = {
    "__getattr__": "so a field may be read from state outside the instance's fields, and an "
    "object rebuilt from the fields alone would not be the same",
    "__getattribute__": "so the values read may not be the values stored, and an object "
    "rebuilt from them would not be the same",
    "__setattr__": "which a rebuild from the fields bypasses, so an object rebuilt from "
    "them may not be the same",
}


def _unfaithful(t: Any, kind: int, stack: list, names: Any, hook: Any) -> TypeError:
    """The error for a record that rebuilding from its fields would not
    reproduce: its class customises attribute access with ``hook`` (a str),
    derives from ``hook`` (a builtin class with state of its own), or the
    instance keeps state outside its fields under the names ``hook`` (a
    list)."""
    what = "a dataclass" if kind == DATACLASS else "an attrs class"
    name = qualname(t)
    reads = ", ".join(f"o.{n}" for n in names)
    args = ", ".join(f"{n}=ch[{i}]" for i, n in enumerate(names))
    rule = f"pytree_kit.Rule(lambda o: ([{reads}], None), lambda _, ch: {name}({args}))"
    fix = rules_fix(t, name, rule)
    if type(hook) is str:
        why = f"whose class defines {hook}, {_HOOKS[hook]}"
    elif type(hook) is list:
        shown = ", ".join(repr(k) for k in hook[:5]) + (", ..." if len(hook) > 5 else "")
        why = (
            f"whose instance keeps state outside its fields ({shown}), which an object "
            "rebuilt from the fields would not have"
        )
    else:
        why = (
            f"whose class derives from {hook.__qualname__}, whose own state is not in the "
            "fields, so an object rebuilt from them would not be the same"
        )
    at = where(stack_path(stack))
    return TypeError(f"{at}: {name} is {what} {why} (pytree_kit does not guess); pass {fix}")


def slot_names(t: Any) -> tuple:
    """``((i, name), ...)``: the member descriptors (slots) in the own dict of
    each class ``t.__mro__[i]`` that a class statement made (``__flags__``
    has Py_TPFLAGS_HEAPTYPE), as CPython lays them out, in MRO order.

    A fact about the class alone, of strs and ints: while torch.compile
    traces, the tracer runs it as it is and takes its result as a constant
    (``_dynamo.register`` marks it so), since dynamo 2.9-2.11 cannot iterate
    a class's ``__dict__``."""
    names = []
    for i, c in enumerate(t.__mro__):
        # a class statement makes member descriptors from its __slots__ alone
        # (kept in its dict): one without, or with an empty one (the ABCs'
        # __slots__ = ()), has none, and its dict need not be read
        if c.__flags__ & _HEAPTYPE and c.__dict__.get("__slots__"):
            for name, d in c.__dict__.items():
                if type(d) is types.MemberDescriptorType and d.__objclass__ is c:
                    names.append((i, name))
    return tuple(names)


def _outside_layout(t: Any, cache: dict, obj: Any) -> tuple:
    """(the names of the fields of ``t``, ((name, descriptor), ...) of the
    slots of ``t`` and its bases that are not fields (:func:`slot_names`)),
    memoised per call. While traced, each descriptor is None: the slot is
    read with ``getattr`` (``_traced.layout``), which finds the same
    descriptor unless a class before its own in the MRO has an attribute of
    that name."""
    key = (_outside_layout, t)
    layout = cache.get(key)
    if layout is None:
        fields = frozenset(n for n, _ in _fields_info(t, cache, obj))
        traced = _traced.on()
        slots = []
        for i, name in slot_names(t):
            if name not in fields:
                slots.append((name, None if traced else t.__mro__[i].__dict__[name]))
        layout = cache[key] = (fields, tuple(slots))
    return layout


def _outside(obj: Any, t: Any, cache: dict) -> list:
    """The names under which ``obj``, a dataclass or attrs instance, keeps
    state outside its fields: keys of its ``__dict__`` and set slots that are
    no field's. A ``functools.cached_property`` value (or one attrs keeps in a
    slot) is not state: it is derived from the fields, and a rebuilt object
    computes it again."""
    fields, slots = _outside_layout(t, cache, obj)
    d = getattr(obj, "__dict__", None) if _traced.reads_instance_dicts() else None
    extra = [] if d is None else [k for k in list(dict.keys(d)) if k not in fields]
    return _outside_slots(obj, t, slots, extra)


def _outside_slots(obj: Any, t: Any, slots: tuple, extra: Any = None) -> list:
    """``extra`` (names outside the fields, from the ``__dict__`` of ``obj``),
    and the names of the set ``slots`` of ``obj``, less the cached values
    (``_outside``)."""
    extra = [] if extra is None else extra
    for name, desc in slots:
        try:
            if desc is None:  # traced (_outside_layout)
                getattr(obj, name)
            else:
                desc.__get__(obj, t)
        except AttributeError:  # unset
            continue
        extra.append(name)
    if extra:
        cached = _cached_by_attrs(t) or frozenset()
        extra = [k for k in extra if k not in cached and not _is_cached_property(t, k)]
    return extra


def cached_names(t: Any) -> tuple:
    """The names of the ``functools.cached_property`` attributes of ``t`` (as a
    lookup finds them, first in the MRO). A fact about the class alone (one
    of ``CLASS_FACTS``)."""
    names: list = []
    seen: set = set()
    for c in t.__mro__:
        for name, value in c.__dict__.items():
            if name not in seen:
                seen.add(name)
                if isinstance(value, functools.cached_property):
                    names.append(name)
    return tuple(names)


def _cached_attribute(t: Any, name: str) -> bool:
    """:func:`_is_cached_property`, first asking the class for ``name`` as any
    attribute lookup does (most instance attributes are no class's: then it
    is none, in one lookup where the MRO walk reads each class)."""
    try:
        if getattr(t, name, _NO_ATTRIBUTE) is _NO_ATTRIBUTE:
            return False
    except Exception:  # a descriptor that refuses a class: walk the MRO
        pass
    return _is_cached_property(t, name)


_NO_ATTRIBUTE = object()


def _is_cached_property(t: Any, name: Any) -> bool:
    """Whether the class attribute ``name`` of ``t`` (as a lookup finds it,
    first in the MRO) is a ``functools.cached_property``."""
    return isinstance(_in_mro(t, name), functools.cached_property)


def _record_plan(t: Any, kind: int, cache: dict, obj: Any) -> tuple:
    """What reading instances of the record class ``t`` takes, made once per
    call: ``(hook, fields, plain, direct, slots, node)``. ``hook`` is
    :func:`_customised`'s answer; ``fields`` is ``((name, static), ...)``;
    ``plain`` the names when no field is static, else None; ``direct``
    whether, when an instance's ``__dict__`` holds exactly the fields (keys
    ``plain``, in order), its values are what ``getattr`` of each gives: no
    field is a data descriptor or slot of the class; ``slots`` the
    ``(name, descriptor)`` of the class's slots that are no field's;
    ``node`` the node of every instance whose values are read directly, when
    that is all there is to check (no such slot, and ``t`` is no dict).
    """
    hook = _customised(t)
    if hook is not None:
        return hook, _fields_info(t, cache, obj), None, False, (), None
    fields = _fields_info(t, cache, obj)
    plain = None
    for _name, is_static in fields:
        if is_static:
            break
    else:
        plain = tuple(n for n, _ in fields)
    slots = _outside_layout(t, cache, obj)[1]
    direct = plain is not None
    for n in plain or ():
        if data_descriptor(t, n):
            direct = False
            break
    node = None
    if plain is not None and direct and not slots and not issubclass(t, dict):
        node = (kind, t, len(plain), (plain, (), (), None))
    return None, fields, plain, direct, slots, node


def data_descriptor(t: Any, name: str) -> bool:
    """Whether the class attribute ``name`` of ``t`` (the first in its MRO)
    is a data descriptor, which ``getattr`` reads before the instance's dict.
    A fact about the class alone (one of ``CLASS_FACTS``)."""
    found = _in_mro(t, name)
    if found is _MISSING:
        return False
    kind = type(found)
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


def _record_fields(obj: Any, t: Any, kind: int, stack: list, cache: dict) -> tuple:
    """Node and children of a dataclass or attrs instance."""
    key = (_record_plan, t)
    plan = cache.get(key)
    if plan is None:
        plan = cache[key] = _record_plan(t, kind, cache, obj)
    hook, fields, plain, direct, slots, node = plan
    if hook is not None:
        raise _unfaithful(t, kind, stack, [n for n, _ in fields], hook)
    children = None
    if direct and _traced.reads_instance_dicts():
        # The values as the instance's __dict__ holds them, when its keys are
        # exactly the fields in order (as __init__ sets them): what getattr
        # reads (_record_plan says when), read with no call, so that
        # torch.compile traces far less. Attribute names are interned: a
        # setattr stores the very str of the field's name.
        # One read of it (``list(d.items())``): keys and values of one state,
        # whatever another thread sets or deletes.
        d = getattr(obj, "__dict__", None)
        if type(d) is dict and len(d) == len(plain):
            items = _read(_item_list, d, stack)
            if len(items) == len(plain):
                for (k, _), name in zip(items, plain):
                    if k is not name:
                        break
                else:
                    children = [v for _, v in items]
                    if node is not None and not isinstance(obj, dict):
                        return node, children, BY_ATTR, plain
    static: list = []
    absent: list = []
    if children is not None:
        names: Any = plain
        outside = _outside_slots(obj, t, slots) if slots else None
    else:
        names = []
        children = []
        for name, is_static in fields:
            try:
                value = getattr(obj, name)
            except AttributeError:
                absent.append(name)
                continue
            if is_static:
                static.append((name, value))
            else:
                names.append(name)
                children.append(value)
        outside = _outside(obj, t, cache)
    if outside:
        raise _unfaithful(t, kind, stack, [n for n, _ in fields], outside)
    dict_keys = None
    if isinstance(obj, dict):
        # A dataclass that is also a dict (transformers' ModelOutput): its dict
        # view must hold exactly the values of fields of the same name.
        base = OrderedDict if isinstance(obj, OrderedDict) else dict
        dict_keys = tuple(list(base.keys(obj)))
        present = dict(zip(names, children))
        present.update(static)
        for k in dict_keys:
            if k not in present or not _same_value(dict.__getitem__(obj, k), present[k]):
                raise TypeError(
                    f"{where(stack_path(stack))}: {qualname(t)} is a dict whose entry {k!r} "
                    "is not the value of its field of that name, so it cannot be rebuilt"
                )
    aux = (tuple(names), tuple(static), tuple(absent), dict_keys)
    if static:
        _check_hashable(aux, stack, f"{qualname(t)} (its static fields)")
    return (kind, t, len(children), aux), children, BY_ATTR, names


def _same_value(a: Any, b: Any) -> bool:
    """Whether ``a`` is ``b``, or both are exact tuples of as many items that
    are, pair by pair, the same values by this rule (a tuple is immutable: one
    of the same items is the same value). The dict view of a record that is a
    dict must hold its fields' values by this rule.

    Never ``id()``, and ``is`` on no tuple: torch.compile's tracer guards an
    ``id()`` on the object's identity, which a new batch fails (a recompile
    per batch), and cannot trace ``is`` between tuples.
    """
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if type(x) is tuple:
            if type(y) is not tuple or len(x) != len(y):
                return False
            pairs.extend(zip(x, y))
        elif type(y) is tuple or x is not y:
            return False
    return True


def _user_children(res: Any, stack: list, what: str) -> tuple:
    """Validate what ``__tree_flatten__`` or a rule returned.

    Two forms are read: ``(children, aux)``, the children a list or tuple, or
    a dict whose keys name them; and optree's ``(children, aux, entries)``,
    the children a list or tuple and ``entries`` one distinct hashable key
    per child (None means none given). Returns ``(children, tail, names,
    mode)``: ``tail`` is the node's aux data after the rule, ``(aux, keys)``
    or ``(aux, None, entries)``, and ``names`` the keys or entries (or None).
    """
    if type(res) is not tuple or not 2 <= len(res) <= 3:
        raise TypeError(
            f"{where(stack_path(stack))}: {what} must return a (children, aux) pair "
            f"or a (children, aux, entries) triple, got {returned(res)}"
        )
    children, aux = res[0], res[1]
    entries = res[2] if len(res) == 3 else None
    if isinstance(children, dict) and entries is None:
        keys = tuple(children)
        children = tuple(children.values())
        mode = BY_KEY
    elif isinstance(children, (list, tuple)):
        keys = None
        children = tuple(children)
        mode = BY_SEQ
    else:
        allowed = "a list or tuple" if entries is not None else "a list, tuple or dict"
        raise TypeError(
            f"{where(stack_path(stack))}: {what} must return children as {allowed}, "
            f"got {type(children).__name__}"
        )
    _check_hashable(aux, stack, what)
    if entries is None:
        return children, (aux, keys), keys, mode
    entries = _entries(entries, len(children), stack, what)
    return children, (aux, None, entries), entries, BY_KEY


def _entries(entries: Any, n: int, stack: list, what: str) -> tuple:
    """optree's entries, checked: one distinct hashable key per child."""
    if isinstance(entries, (str, bytes)) or not hasattr(type(entries), "__iter__"):
        raise TypeError(
            f"{where(stack_path(stack))}: {what} must return entries as an iterable of keys, "
            f"got {type(entries).__name__}"
        )
    entries = tuple(entries)
    if len(entries) != n:
        raise TypeError(
            f"{where(stack_path(stack))}: {what} returned {len(entries)} "
            f"{'entry' if len(entries) == 1 else 'entries'} for "
            f"{n} {'child' if n == 1 else 'children'}"
        )
    try:
        distinct = len(set(entries)) == n
    except TypeError as e:
        raise TypeError(
            f"{where(stack_path(stack))}: the entries of {what} must be hashable ({e})"
        ) from None
    if not distinct:
        raise TypeError(
            f"{where(stack_path(stack))}: the entries of {what} must be distinct, "
            f"got {keys_text(entries)}"
        )
    return entries


def _custom_result(res: Any, stack: list, t: Any) -> tuple:
    """_user_children for what ``t.__tree_flatten__`` returned."""
    return _user_children(res, stack, f"{qualname(t)}.__tree_flatten__")


def _rule_result(res: Any, stack: list, t: Any) -> tuple:
    """_user_children for what the rule for ``t`` returned."""
    return _user_children(res, stack, f"the rule for {qualname(t)}")


def tuple_overrides(t: Any) -> bool:
    """Whether the tuple subclass ``t`` has a ``__len__``, ``__iter__`` or
    ``__getitem__`` of its own (one of ``CLASS_FACTS``)."""
    for name in ("__len__", "__iter__", "__getitem__"):
        if getattr(t, name, None) is not getattr(tuple, name):
            return True
    return False


def _plain_reads(obj: tuple) -> bool:
    """Whether the items ``obj`` stores are read with ``len`` and ``tuple``
    (``_traced.plain_tuple_reads``), not ``tuple``'s own methods."""
    return _traced.on() and _traced.plain_tuple_reads(tuple_overrides(type(obj)))


def _items(obj: tuple) -> tuple:
    """The items a tuple subclass stores, whatever its __iter__, __len__ or
    __getitem__ say (a namedtuple or structseq is rebuilt from exactly these)."""
    if _plain_reads(obj):
        return tuple(obj)
    return tuple.__getitem__(obj, slice(None))


def _stored_len(obj: tuple) -> int:
    """How many items a tuple subclass stores (``_items``)."""
    return len(obj) if _plain_reads(obj) else tuple.__len__(obj)


def _structseq_node(obj: Any, t: Any) -> tuple:
    """A structseq's node: its class and its sequence fields, as in optree and
    jax. The fields outside the sequence (``tm_zone``, ``st_atime``, ...) are
    values, not structure: they are in no spec, and ``unflatten`` rebuilds the
    structseq from its sequence fields alone (``t(children)``: those fields
    are None, as in optree). The node's aux is ``()``: specs from before,
    which kept those values there, read back from JSON or a pickle with
    ``()`` too."""
    children = _items(obj)
    n = len(children)
    if t.n_unnamed_fields == 0 and len(getattr(t, "__match_args__", ())) == n:
        return (STRUCTSEQ, t, n, ()), children, BY_ATTR, t.__match_args__
    return (STRUCTSEQ, t, n, ()), children, BY_SEQ, None


def _is_namedtuple(obj: Any, t: Any) -> bool:
    fields = getattr(t, "_fields", None)
    return type(fields) is tuple and len(fields) == _stored_len(obj)


# --------------------------------------------------------------------------
# Subclasses of the builtin containers: the mapping and sequence kinds


def _instance_dict(obj: Any) -> Any:
    """The ``__dict__`` of ``obj``, read as ``object`` reads it (a class's own
    ``__getattribute__`` or ``__getattr__`` is not asked), or None (traced:
    ``_traced.instance_dict``)."""
    try:
        if _traced.on():
            d = _traced.instance_dict(obj)
        else:
            d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return d if type(d) is dict else None


#: the layout of each subclass an eager call met: class -> (its MRO, facts)
_LAYOUTS: dict = {}


def subclass_layout(t: Any) -> tuple:
    """``(base, slots, has_dict)`` of the class ``t``: its
    :func:`subclass_base`, the ``(name, descriptor)`` of its slots
    (:func:`slot_names`), and whether its instances have a ``__dict__``.

    Facts of its MRO and its layout: the slots and the ``__dict__`` of a
    class are fixed when it is made, and its base changes only with a new
    ``__bases__``, which makes a new MRO. So an eager call remembers them
    across calls (up to 1024 classes), checked by the identity of the
    class's MRO (traced: ``_traced.layout``)."""
    if _traced.on():
        return _traced.layout(t, slot_names)
    found = _LAYOUTS.get(t)
    mro = t.__mro__
    if found is not None and found[0] is mro:
        return found[1]  # type: ignore[no-any-return]
    base = subclass_base(t)
    slots = tuple((name, mro[i].__dict__[name]) for i, name in slot_names(t)) if base else ()
    facts = (base, slots, t.__dictoffset__ != 0)
    if len(_LAYOUTS) >= 1024:
        _LAYOUTS.clear()
    _LAYOUTS[t] = (mro, facts)
    return facts


def _cached_names(t: Any, cache: dict) -> tuple:
    """:func:`cached_names` of ``t``, memoised per call."""
    key = (cached_names, t)
    names = cache.get(key)
    if names is None:
        names = cache[key] = cached_names(t)
    return names  # type: ignore[no-any-return]


def _storage(obj: Any, t: Any, base: str, stack: list) -> Any:
    """The ``data`` of a ``UserDict`` or ``UserList`` instance: an exact dict
    or list, else TypeError (pytree_kit does not guess how another storage
    is rebuilt)."""
    d = _instance_dict(obj)
    data = None if d is None else d.get("data", _ABSENT)
    want = dict if base == "UserDict" else list
    if type(data) is want:
        return data
    name = qualname(t)
    held = "no data" if data is _ABSENT or d is None else f"data of type {type(data).__qualname__}"
    fix = rules_fix(t, name, "pytree_kit.Rule(flatten, unflatten)")
    raise TypeError(
        f"{where(stack_path(stack))}: {name} is a {base} with {held}, not a {want.__name__}, so "
        f"pytree_kit cannot read or rebuild its items (it does not guess); pass {fix}, or "
        f"rules={{{name}: pytree_kit.Rule.LEAF}} to keep it whole"
    )


_ABSENT = object()


def _carried_state(
    obj: Any, t: Any, base: str, items: Any, stack: list, cache: dict, layout: tuple
) -> tuple:
    """The instance's own attributes, as ``Carried.state`` holds them: its
    ``__dict__`` (a ``functools.cached_property`` value left out: the
    rebuilt object computes it again), then its set slots. ``items`` is the
    mapping's storage (a dict of its items), or None for a sequence;
    ``layout`` is :func:`subclass_layout`'s."""
    _base, slots, has_dict = layout
    d = None
    if has_dict:
        if not _traced.reads_instance_dicts():
            raise _traced.no_instance_dicts(stack, t)
        d = _instance_dict(obj)
    state: list = []
    others: list = []
    user = base == "UserDict" or base == "UserList"
    # the cached properties: while traced, a class fact; else each name's own
    # lookup (a few dict reads, where the class fact reads every class of the
    # MRO)
    cached: Any = _cached_names(t, cache) if _traced.on() and (d or slots) else None
    if d:
        for name, value in list(dict.items(d)):
            if user and name == "data":
                state.append((name, DATA, None))
            elif name in cached if cached is not None else _cached_attribute(t, name):
                continue
            elif (
                items is not None
                and name in items
                and type(name) is str
                and _same_value(value, items[name])
            ):
                state.append((name, MIRROR, None))  # (a ModelOutput built bare)
            else:
                state.append((name, ATTR, value))
                others.append(name)
    for name, desc in slots:
        try:
            value = getattr(obj, name) if desc is None else desc.__get__(obj, t)
        except AttributeError:  # unset
            continue
        if name in cached if cached is not None else _cached_attribute(t, name):
            continue
        state.append((name, SLOT, value))
        others.append(name)
    if others:
        setters = own_setters(t, base)
        if setters:
            raise _follows_items(t, base, setters, others, stack)
    return tuple(state)


def _follows_items(t: Any, base: str, setters: tuple, names: list, stack: list) -> TypeError:
    """The error for an instance whose class sets its items its own way and
    that keeps attributes beside them: they may follow its items, and a
    rebuild that keeps them as they are would not be the same object."""
    name = qualname(t)
    shown = ", ".join(repr(k) for k in names[:5]) + (", ..." if len(names) > 5 else "")
    fix = rules_fix(t, name, "pytree_kit.Rule(flatten, unflatten)")
    own = ", ".join(setters)
    return TypeError(
        f"{where(stack_path(stack))}: {name} is a {base} whose class defines its own {own} and "
        f"whose instance keeps attributes beside its items ({shown}), which may follow the "
        "items, so an object rebuilt with them as they are might not be the same "
        f"(pytree_kit does not guess); pass {fix}, or rules={{{name}: pytree_kit.Rule.LEAF}} "
        "to keep it whole"
    )


def _mapping_node(obj: Any, t: Any, base: str, stack: list, cache: dict) -> tuple:
    """Node and children of an instance of a dict subclass or of a
    ``UserDict``: its items as a dict's (a dict's leaf order, an
    ``OrderedDict``'s insertion order), read from the base's own storage."""
    layout = subclass_layout(t)
    if base == "UserDict":
        items = _storage(obj, t, base, stack)
        order = _key_order(items)
    elif _traced.on():
        order, items = _traced.mapping_items(base, obj)
    else:  # the storage's items, in its order (an OrderedDict's own), in one C call
        items = dict(NEW[base].items(obj))
        order = tuple(items)
    if base == "OrderedDict":
        keys = order
    else:
        keys = tuple(_leaf_order(items))
    factory = None
    if base == "defaultdict":
        factory = obj.default_factory
        _check_hashable(factory, stack, f"{qualname(t)} (its default_factory)")
    state = _carried_state(obj, t, base, items, stack, cache, layout)
    insertion = None if order == keys else order
    carried = Carried(insertion, state) if state or insertion is not None else NOTHING_CARRIED
    children = [items[k] for k in keys]
    return (MAPPING, t, len(keys), (base, keys, factory, carried)), children, BY_KEY, keys


def _list_items(obj: list) -> tuple:
    """The items a list subclass stores, whatever its ``__iter__`` says."""
    plain = _traced.list_items(obj) if _traced.on() else None
    return tuple(list.__iter__(obj)) if plain is None else plain


def _sequence_node(obj: Any, t: Any, base: str, stack: list, cache: dict) -> tuple:
    """Node and children of an instance of a tuple or list subclass, or of a
    ``UserList``: its stored items, in order."""
    if base == "tuple":
        children = _items(obj)
    elif base == "list":
        children = _list_items(obj)
    else:
        children = tuple(_storage(obj, t, base, stack))
    state = _carried_state(obj, t, base, None, stack, cache, subclass_layout(t))
    carried = Carried(None, state) if state else NOTHING_CARRIED
    return (SEQUENCE, t, len(children), (base, carried)), children, BY_SEQ, None


def _subclass(obj: Any, t: Any, stack: list, cache: dict) -> Any:
    """``classify``'s answer for an instance of a class that is none of the
    kinds before these: a mapping or sequence node, or None (a leaf)."""
    base = subclass_layout(t)[0]
    if not base:
        return None
    if base in MAPPING_BASES:
        return _mapping_node(obj, t, base, stack, cache)
    return _sequence_node(obj, t, base, stack, cache)


def _restore_state(obj: Any, t: Any, state: tuple, items: Any, data: Any) -> None:
    """Give a rebuilt instance the attributes ``Carried.state`` holds:
    ``items`` the new items by key (a mirror's value), ``data`` the new
    storage of a ``UserDict`` or ``UserList``."""
    d = None
    for name, how, value in state:
        if how == SLOT:
            _slot(t, name).__set__(obj, value)
            continue
        if d is None:
            d = _instance_dict(obj)
        if how == ATTR:
            d[name] = value
        elif how == MIRROR:
            d[name] = items[name]
        else:  # DATA
            d[name] = data


def _slot(t: Any, name: str) -> Any:
    """The member descriptor of the slot ``name`` of ``t``, as CPython finds it."""
    for c in t.__mro__:
        found = c.__dict__.get(name)
        if type(found) is types.MemberDescriptorType:
            return found
    raise TypeError(f"{qualname(t)} has no slot {name!r}")  # a spec for another class


def _build_mapping(t: Any, aux: tuple, children: list) -> Any:
    """Rebuild an instance of a dict subclass or ``UserDict``, without calling
    its ``__new__`` or ``__init__``: made by its builtin base's ``__new__``
    (``dict.__new__(t)``), given its attributes, and filled with the base's
    own ``__setitem__`` (a ``UserDict``: its ``data``, a new dict)."""
    base, keys, factory, carried = aux
    items = dict(zip(keys, children))
    if carried.order is not None:
        items = {k: items[k] for k in carried.order}
    solid = NEW[base]
    obj = solid.__new__(t)
    if base == "defaultdict":
        defaultdict.__init__(obj, factory)
    _restore_state(obj, t, carried.state, items, items)
    if base != "UserDict":
        setitem = solid.__setitem__
        for k, v in items.items():
            setitem(obj, k, v)
    return obj


def _build_sequence(t: Any, aux: tuple, children: list) -> Any:
    """Rebuild an instance of a tuple or list subclass or of a ``UserList``,
    without calling its ``__new__`` or ``__init__``: ``tuple.__new__(t,
    children)``, ``list.__new__(t)`` extended by ``list.extend``, or a
    ``UserList`` given a new ``data``; then its attributes."""
    base, carried = aux
    if base == "tuple":
        obj = tuple.__new__(t, children)
    elif base == "list":
        if _traced.on():
            obj = _traced.rebuilt_list(t, children, own_setters(t, base))
        else:
            obj = list.__new__(t)
            list.extend(obj, children)
    else:
        obj = object.__new__(t)
    _restore_state(obj, t, carried.state, None, list(children))
    return obj


#: the builtin containers ``classify`` reads by exact type
_BUILTIN_CONTAINERS = frozenset({tuple, list, dict, _NoneType, OrderedDict, defaultdict, deque})


def classify(obj: Any, t: Any, rules: Any, stack: list, cache: dict) -> Any:
    """``(node, children, keymode, names)`` for a container, or None for a leaf.

    The order of the checks is the specification: a rule for the exact type,
    then the builtin containers by exact type, then ``__tree_flatten__``,
    namedtuples and structseqs, dataclasses, attrs classes; anything else
    is a leaf. (``is_leaf`` is asked before all of these by the caller.)
    """
    if rules is not None:
        rule = rules.get(t)
        if rule is AS_LEAF:
            return None
        if rule is not None:
            children, tail, names, mode = _rule_result(rule.flatten(obj), stack, t)
            return (RULE, t, len(children), (rule, *tail)), children, mode, names
    if t in _BUILTIN_CONTAINERS:  # one test for the many types that are none of them
        if t is tuple:
            return (TUPLE, None, len(obj), None), obj, BY_SEQ, None
        if t is list:
            children = tuple(obj)
            return (LIST, None, len(children), None), children, BY_SEQ, None
        if t is dict:
            keys, children = _dict_read(obj, stack, cache)
            if children is None:
                children = [obj[k] for k in keys]
            return (DICT, None, len(keys), tuple(keys)), children, BY_KEY, keys
        if t is _NoneType:
            return NONE_NODE, (), BY_SEQ, None
        if t is OrderedDict:
            order, children = _odict_read(obj, stack)
            if children is None:
                children = [obj[k] for k in order]
            return (ORDEREDDICT, None, len(order), order), children, BY_KEY, order
        if t is defaultdict:
            keys, children = _dict_read(obj, stack, cache)
            factory = obj.default_factory
            node = (DEFAULTDICT, None, len(keys), (factory, tuple(keys)))
            _check_hashable(factory, stack, "a defaultdict (its default_factory)")
            return node, [obj[k] for k in keys] if children is None else children, BY_KEY, keys
        if t is deque:
            children = _read(tuple, obj, stack)
            return (DEQUE, None, len(children), obj.maxlen), children, BY_SEQ, None
    key = (class_traits, t)
    traits = cache.get(key)
    if traits is None:
        traits = cache[key] = class_traits(t)
    custom, structseq, dataclass, attrs = traits
    while custom:
        # One read of the method: a class that lost it since this call read
        # the class (to another thread) is read afresh, not called for it.
        tree_flatten: Any = getattr(obj, "__tree_flatten__", _MISSING)
        if tree_flatten is not _MISSING:
            break
        traits = cache[key] = class_traits(t)
        custom, structseq, dataclass, attrs = traits
    if custom:
        if not callable(getattr(t, "__tree_unflatten__", None)):
            raise TypeError(
                f"{where(stack_path(stack))}: {qualname(t)} defines __tree_flatten__ "
                "but no classmethod __tree_unflatten__"
            )
        children, tail, names, mode = _custom_result(tree_flatten(), stack, t)
        return (CUSTOM, t, len(children), tail), children, mode, names
    if isinstance(obj, tuple):
        if structseq:
            return _structseq_node(obj, t)
        if _is_namedtuple(obj, t):
            children = _items(obj)
            return (NAMEDTUPLE, t, len(children), t._fields), children, BY_ATTR, t._fields
        if hasattr(t, "_fields"):  # a namedtuple of another length: a leaf, as before
            return None
        return _subclass(obj, t, stack, cache)
    if dataclass:
        return _record_fields(obj, t, DATACLASS, stack, cache)
    if attrs:
        return _record_fields(obj, t, ATTRS, stack, cache)
    return _subclass(obj, t, stack, cache)


def class_traits(t: Any) -> tuple:
    """``(custom, structseq, dataclass, attrs)`` for ``classify``, bools:
    whether the class ``t`` defines ``__tree_flatten__``; for a tuple type,
    whether it has a structseq's ``n_sequence_fields`` and ``n_fields``; for
    any other, whether it is a dataclass, else an attrs class (the reads
    ``_classify.c``'s ``make_plan`` makes).

    A fact about the class alone (one of ``CLASS_FACTS``): while
    torch.compile traces, the compiled code checks each container's type
    once, not each of these reads of it (on torch 2.9, two guards less per
    dataclass instance in a batch). Bools only: the tracer cannot guard a
    value a fact returned, so classify branches on them and takes its kinds
    from this module."""
    custom = getattr(t, "__tree_flatten__", None) is not None
    if issubclass(t, tuple):
        return custom, hasattr(t, "n_sequence_fields") and hasattr(t, "n_fields"), False, False
    if hasattr(t, "__dataclass_fields__"):
        return custom, False, True, False
    return custom, False, False, hasattr(t, "__attrs_attrs__")


#: How the C engine reads the instances of a class: the first item of
#: :func:`class_plan`'s answer (``_class_plans.c``'s ``PLAN_*``, in step:
#: tests/test_versions.py checks the two agree).
PLAN_LEAF = 0  # a leaf
PLAN_TUPLE_LEAF = 1  # a tuple subclass that is no namedtuple: a leaf
PLAN_NAMEDTUPLE = 2  # (PLAN_NAMEDTUPLE, _fields)
PLAN_DATACLASS = 3  # (PLAN_DATACLASS, names, reads, other_slots)
PLAN_ATTRS = 4  # (PLAN_ATTRS, names, reads, other_slots)
PLAN_CUSTOM = 5  # __tree_flatten__
PLAN_PYTHON = 6  # each instance is classified by classify, above
PLAN_MAPPING = 7  # (PLAN_MAPPING, base, is_user, slots, has_dict, cached, setters)

#: the class attributes class_plan's answer depends on
_PLANNED_NAMES = (
    "__tree_flatten__",
    "__tree_unflatten__",
    "_fields",
    "n_sequence_fields",
    "n_fields",
    "__dataclass_fields__",
    "__attrs_attrs__",
    "__getattr__",
    "__getattribute__",
    "__setattr__",
)
_MISSING = object()
_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: no attribute of the type can be set


def _in_mro(t: Any, name: str) -> Any:
    """What ``t.__mro__``'s class dicts bind ``name`` to, the first; else ``_MISSING``."""
    for c in t.__mro__:
        # one read of each dict (another thread may delete the name meanwhile)
        found = c.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def _fixed_by_dicts(t: Any) -> bool:
    """Whether ``getattr(t, name)`` for each name :func:`class_plan` reads is
    decided by the class dicts of ``t.__mro__`` alone, with no code of the
    caller's run: the metaclass adds no lookup of its own and binds none of
    these names (the attribute hooks only to what no data descriptor is:
    ``enum``'s metaclass has a ``__setattr__``, which no lookup of the
    class's attributes reads), and none of them is bound to a descriptor
    whose class a class statement wrote. Then the answer holds while neither
    ``t`` nor its metaclass is modified (CPython gives either a new version
    tag then)."""
    meta = type(t)
    if meta is not type:
        if _in_mro(meta, "__getattr__") is not _MISSING:
            return False
        for name in _PLANNED_NAMES:
            found = _in_mro(meta, name)
            if found is _in_mro(type, name):
                continue
            if not name.startswith("__get") and name != "__setattr__":
                return False
            kind = type(found)
            if (
                name == "__getattribute__"
                or hasattr(kind, "__set__")
                or hasattr(kind, "__delete__")
            ):
                return False
    for name in _PLANNED_NAMES:
        found = _in_mro(t, name)
        kind = type(found)
        if found is not _MISSING and kind.__flags__ & _HEAPTYPE and hasattr(kind, "__get__"):
            return False
    return True


def _field_read(t: Any, name: str) -> Any:
    """How the C engine reads the field ``name`` of an instance of the record
    class ``t``: the member descriptor of its slot, ``True`` when the value
    ``getattr`` gives is the instance ``__dict__``'s (the class binds the name
    to nothing, or to a value of an immutable type that is no data
    descriptor: a default such as ``0`` or ``None``, a function), else
    ``False`` (``getattr`` itself: a property, a value of a class that could
    become a data descriptor later)."""
    found = _in_mro(t, name)
    if found is _MISSING:
        return True
    kind = type(found)
    if kind is types.MemberDescriptorType:
        return found
    data = hasattr(kind, "__set__") or hasattr(kind, "__delete__")
    return bool(kind.__flags__ & _IMMUTABLETYPE) and not data


def class_plan(t: Any) -> tuple:
    """How the C engine reads the instances of the class ``t``, asked once per
    class and kept while the class and its metaclass are unchanged: a tuple
    whose first item is one of the ``PLAN_*`` codes above. It is what
    :func:`classify` decides for the class, less what it decides per
    instance (a namedtuple's length, a record's unset fields and its state
    outside its fields, which the C engine checks on each instance):

    - ``(PLAN_LEAF,)``, ``(PLAN_TUPLE_LEAF,)``, ``(PLAN_CUSTOM,)``;
    - ``(PLAN_NAMEDTUPLE, fields)``;
    - ``(PLAN_DATACLASS, names, reads, other_slots)`` (or ``PLAN_ATTRS``) for a
      record class with no static field whose class keeps to the generic
      attribute access: ``names`` its fields' names, ``reads`` how each is read
      (:func:`_field_read`), ``other_slots`` the member descriptors of the
      slots that are no field's (an instance that sets one is left to
      :func:`classify`, which says why it is refused);
    - ``(PLAN_MAPPING, base, is_user, slots, has_dict, cached, setters)`` for a
      subclass of ``dict`` or of ``UserDict`` (``base``, its
      :func:`subclass_base`; ``is_user``, whether it is ``UserDict``): its
      :func:`subclass_layout`'s slots and ``__dict__``, the names of its
      ``functools.cached_property`` attributes (:func:`cached_names`, a
      frozenset) and its own item setters (:func:`own_setters`): what
      :func:`_mapping_node` reads of the class, which the C engine reads of
      each instance (``_mapping_kind.c``);
    - ``(PLAN_PYTHON,)`` for anything :func:`classify` must see per instance:
      the rare builtin containers, structseqs, a record class with static
      fields or its own attribute access (classify refuses it, saying why),
      ``__tree_flatten__`` without ``__tree_unflatten__``, and a class whose
      attributes a metaclass or a descriptor of the caller's computes
      (:func:`_fixed_by_dicts`).

    Examples:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class P:
        ...     x: int
        ...     y: int = 0
        >>> class_plan(P) == (PLAN_DATACLASS, ("x", "y"), (True, True), ())
        True
        >>> class_plan(int) == (PLAN_LEAF,)
        True
    """
    if t in _BUILTIN_CONTAINERS or not _fixed_by_dicts(t):
        return (PLAN_PYTHON,)
    custom, structseq, dataclass, attrs = class_traits(t)
    if custom:
        if callable(getattr(t, "__tree_unflatten__", None)):
            return (PLAN_CUSTOM,)
        return (PLAN_PYTHON,)  # classify raises, naming the class
    if issubclass(t, tuple):
        if structseq:
            return (PLAN_PYTHON,)
        fields = getattr(t, "_fields", _MISSING)
        if type(fields) is tuple:
            return (PLAN_NAMEDTUPLE, fields)
        if fields is _MISSING and subclass_base(t):
            return (PLAN_PYTHON,)  # a tuple subclass: a sequence node
        return (PLAN_TUPLE_LEAF,)
    if not (dataclass or attrs):
        # a dict, list or UserDict subclass: a mapping or sequence node
        base, slots, has_dict = subclass_layout(t)
        if base == "dict" or base == "UserDict":
            cached = frozenset(cached_names(t))
            setters = own_setters(t, base)
            return (PLAN_MAPPING, base, base == "UserDict", slots, has_dict, cached, setters)
        return (PLAN_PYTHON,) if base else (PLAN_LEAF,)
    if _customised(t) is not None:
        return (PLAN_PYTHON,)
    fields = record_fields(t)
    if any(is_static for _, is_static in fields):
        return (PLAN_PYTHON,)
    names = tuple(name for name, _ in fields)
    if not all(type(name) is str for name in names):
        return (PLAN_PYTHON,)
    reads = tuple(_field_read(t, name) for name in names)
    mro = t.__mro__
    other = tuple(mro[i].__dict__[name] for i, name in slot_names(t) if name not in names)
    return (PLAN_DATACLASS if dataclass else PLAN_ATTRS, names, reads, other)


def _key_order(obj: dict) -> tuple:
    """The keys of a dict in insertion order. ``tuple(list(obj))``, not
    ``tuple(obj)``: torch.compile's tracer on torch 2.15 guards no key order
    for ``tuple(obj)``, so a compiled call would reuse the graph of a dict
    whose keys came in another order (a stale result); it does for ``list``."""
    return tuple(list(obj))


def dict_order_differs(node: tuple, obj: dict) -> Any:
    """The insertion order of a dict node, when it differs from its leaf
    order, read from the dict again (the C engine's dicts, and keys whose
    hash, ``==`` or ``<`` may be Python code: ``_dict_read``). An order of
    other keys than the node's (the dict changed since the node was made:
    another thread, or such code of its keys, changed it) would make a spec
    its own leaves cannot rebuild: RuntimeError instead."""
    order = _key_order(obj)
    keys = node[3] if node[0] == DICT else node[3][1]
    if order == keys:
        return None
    if not _traced.on() and (
        len(order) != len(keys) or {id(k) for k in order} != {id(k) for k in keys}
    ):
        raise RuntimeError(
            f"dictionary changed size during iteration: a dict of {len(keys)} keys "
            f"has {len(order)} (not all the same) after its keys were read"
        )
    return order


def dict_order(node: tuple, obj: dict, cache: dict) -> Any:
    """``dict_order_differs`` for the dict just classified, from the read
    ``_dict_read`` made of it (``cache[_ORDER]``) where it kept one."""
    order = cache.pop(_ORDER, None)
    if order is None:
        return dict_order_differs(node, obj)
    return None if order == (node[3] if node[0] == DICT else node[3][1]) else order


# --------------------------------------------------------------------------
# flatten, leaves, flatten_with_path


def _leaf_types(rules: Any) -> set:
    """The types taken as leaves before any is classified. A walk adds the types
    it finds to be leaves: whether a value that is not a tuple is a leaf
    depends only on its type and the call's rules, so this is exact."""
    return set(_ATOMS) if rules is None else {t for t in _ATOMS if t not in rules}


def _visit(obj: Any, is_leaf: Any, rules: Any, stack: list, cache: dict, leaf_types: set) -> Any:
    """What the walk makes of one value: None for a leaf, else ``classify``'s
    ``(node, children, keymode, names)``. ``is_leaf`` is asked first."""
    if is_leaf is not None and is_leaf(obj):
        return None
    t = type(obj)
    if t in leaf_types:
        return None
    found = classify(obj, t, rules, stack, cache)
    if found is None and not isinstance(obj, tuple):
        leaf_types.add(t)
    return found


def _enter(stack: list, onpath: set, obj: Any, children: Any, keymode: int, names: Any) -> None:
    """Push a container's frame, refusing one already on the path (a cycle)."""
    if onpath or len(stack) >= CYCLE_DEPTH:
        _check_entry(stack, onpath, obj)
    stack.append([children, 0, keymode, names, obj])


def _check_entry(stack: list, onpath: set, obj: Any) -> None:
    """Refuse ``obj``, a container about to be entered below ``stack``, when
    it is on the path (a cycle). Called when ``onpath`` holds ``_traced.CHECKING``
    (each entry is checked), or, while it is empty (tracing, no identity read
    yet), when the path reaches ``CYCLE_DEPTH``."""
    if onpath:
        if id(obj) in onpath:
            raise cycle_error(stack, obj)
        onpath.add(id(obj))
    else:
        _traced.check_path(stack, onpath, obj)


def _next_child(stack: list, onpath: set) -> Any:
    """Move to the next value in pre-order: ``(frame, index)`` of it, popping
    the frames that are done; None when the walk is over."""
    while stack:
        fr = stack[-1]
        i = fr[1]
        if i < len(fr[0]):
            fr[1] = i + 1
            return fr, i
        stack.pop()
        if onpath:
            onpath.discard(id(fr[4]))
    return None


def _walk(tree: Any, is_leaf: Any, rules: Any, mode: int) -> tuple:
    """Pre-order traversal. mode 0: leaves; 1: and the spec; 2: and paths;
    3: as 2, with ``is_leaf`` called as ``is_leaf(path, value)``.

    The steps of ``iter_leaves`` (``_visit``, ``_enter``, ``_next_child``)
    written out, with the top frame's children and position in locals
    (``ch``, ``pos``): torch.compile's tracer traces this loop once per value
    of the tree and pays for every call and subscript. ``pos`` is stored in
    the frame before anything that reads the path (``classify``'s errors,
    the cycle check) and when a container is entered."""
    leaves: list = []
    nodes: list = []
    orders: list = []
    paths: list = []
    keys: list = []  # the current path, when mode == 2
    stack: list = []  # frames: [children, position, keymode, names, obj]
    onpath = _traced.onpath()
    cache: dict = {}
    leaf_types = _leaf_types(rules)
    obj = tree
    fr: Any = None  # the top frame, stack[-1]
    ch: Any = ()  # its children
    n = pos = 0  # how many, and the position of the next one
    if mode == 3:  # is_leaf takes the path: the keys that lead to the value
        ask = is_leaf

        def at_path(x: Any) -> Any:
            return ask(tuple(keys), x)

        is_leaf, mode = at_path, 2
    runs = is_leaf is None and mode != 2  # leaves by type need no call (and no path)
    while True:
        if (is_leaf is not None and is_leaf(obj)) or type(obj) in leaf_types:
            found = None
        else:
            if stack:
                fr[1] = pos
            found = classify(obj, type(obj), rules, stack, cache)
            if found is None and not isinstance(obj, tuple):
                leaf_types.add(type(obj))
        if found is None:
            leaves.append(obj)
            if mode:
                nodes.append(LEAF_NODE)
                if mode == 2:
                    paths.append(tuple(keys))
        else:
            node, children, keymode, names = found
            if mode:
                if node[0] == DICT or node[0] == DEFAULTDICT:
                    order = dict_order(node, obj, cache)
                    if order is not None:
                        orders.append((len(nodes), order))
                nodes.append(node)
            if children:
                if onpath or len(stack) >= CYCLE_DEPTH:
                    _check_entry(stack, onpath, obj)
                fr = [children, 0, keymode, names, obj]
                stack.append(fr)
                ch = children
                n = len(children)
                pos = 0
        if runs:  # the run of children that are leaves by their type, taken here
            while pos < n and type(ch[pos]) in leaf_types:
                leaves.append(ch[pos])
                if mode:
                    nodes.append(LEAF_NODE)
                pos += 1
        while pos == n and stack:  # the top frame is done
            done = stack.pop()
            if onpath:
                onpath.discard(id(done[4]))
            if stack:
                fr = stack[-1]
                ch = fr[0]
                n = len(ch)
                pos = fr[1]
        if pos == n:
            break
        obj = ch[pos]
        pos += 1
        if mode == 2:
            del keys[len(stack) - 1 :]
            keys.append(frame_key(fr, pos - 1))
    if not mode:
        return leaves, None
    spec = TreeSpec._make(tuple(nodes), tuple(orders), len(leaves))
    if mode == 2:
        return list(zip(paths, leaves)), spec
    return leaves, spec


def iter_leaves(tree: Any, is_leaf: Any = None, rules: Any = None) -> Iterator[Any]:
    """The leaves as a generator: ``_walk``'s traversal in mode 0, each leaf
    yielded as soon as it is found. A container's children are read when the
    container is reached, so a change the caller makes between two leaves
    shows only in containers not reached yet. As in one call, a type found
    to be a leaf type stays one for the rest of the iteration."""
    stack: list = []  # frames: [children, position, keymode, names, obj]
    onpath = _traced.onpath()
    cache: dict = {}
    leaf_types = _leaf_types(rules)
    obj = tree
    while True:
        found = _visit(obj, is_leaf, rules, stack, cache, leaf_types)
        if found is None:
            yield obj
        else:
            _node, children, _keymode, _names = found
            if children:
                _enter(stack, onpath, obj, children, _keymode, _names)
        at = _next_child(stack, onpath)
        if at is None:
            return
        fr, i = at
        obj = fr[0][i]


def any_leaf(tree: Any, is_leaf: Any, rules: Any, want: bool) -> bool:
    """Whether the truth of some leaf is ``want``: ``tree_any`` with ``want``
    True, and ``tree_all`` is ``not any_leaf(..., False)``. The leaves are
    ``iter_leaves``'s, each tested as it is found; the walk stops at the
    first one that decides."""
    want = bool(want)
    for x in iter_leaves(tree, is_leaf, rules):
        if bool(x) is want:
            return True
    return False


def flatten(tree: Any, is_leaf: Any = None, rules: Any = None) -> tuple[list, TreeSpec]:
    return _walk(tree, is_leaf, rules, 1)


def leaves(tree: Any, is_leaf: Any = None, rules: Any = None) -> list:
    return _walk(tree, is_leaf, rules, 0)[0]


def flatten_with_path(
    tree: Any, is_leaf: Any = None, rules: Any = None, is_leaf_takes_path: Any = False
) -> tuple[list, TreeSpec]:
    return _walk(tree, is_leaf, rules, 3 if is_leaf_takes_path and is_leaf is not None else 2)


def flatten_one_level(tree: Any, is_leaf: Any = None, rules: Any = None) -> Any:
    """``(children, spec)`` of the root, the spec being the root's node over a
    leaf per child; None when the root is a leaf. The same classification as
    ``_walk`` makes of the root (``classify``, after ``is_leaf``), with no
    descent, so every engine gives it by this function."""
    if is_leaf is not None and is_leaf(tree):
        return None
    t = type(tree)
    if t in _ATOMS and (rules is None or t not in rules):
        return None
    cache: dict = {}
    found = classify(tree, t, rules, [], cache)
    if found is None:
        return None
    node, children, _keymode, _names = found
    orders: tuple = ()
    if node[0] == DICT or node[0] == DEFAULTDICT:
        order = dict_order(node, tree, cache)
        if order is not None:
            orders = ((0, order),)
    arity = node[2]
    return list(children), TreeSpec._make((node,) + (LEAF_NODE,) * arity, orders, arity)


# --------------------------------------------------------------------------
# unflatten


def _set_fields(t: Any, aux: tuple, children: list) -> Any:
    """Rebuild a dataclass or attrs instance without calling __init__."""
    names, static, _absent, dict_keys = aux
    obj = t.__new__(t)
    setattr_ = object.__setattr__
    for name, value in zip(names, children):
        setattr_(obj, name, value)
    for name, value in static:
        setattr_(obj, name, value)
    if dict_keys is not None:
        values = dict(zip(names, children))
        values.update(static)
        setitem = OrderedDict.__setitem__ if isinstance(obj, OrderedDict) else dict.__setitem__
        for k in dict_keys:
            setitem(obj, k, values[k])
    return obj


def _in_order(keys: tuple, children: list, order: Any) -> dict:
    if order is None:
        return dict(zip(keys, children))
    m = dict(zip(keys, children))
    return {k: m[k] for k in order}


def build(kind: int, t: Any, aux: Any, children: list, order: Any) -> Any:
    """Rebuild one node from its children (already in leaf order)."""
    if kind == TUPLE:
        return tuple(children)
    if kind == LIST:
        return children
    if kind == DICT:
        return _in_order(aux, children, order)
    if kind == MAPPING:  # (before the rest: the C engine builds those above itself)
        return _build_mapping(t, aux, children)
    if kind == NONE:
        return None
    if kind == NAMEDTUPLE:
        return tuple.__new__(t, children)
    if kind == DATACLASS or kind == ATTRS:
        return _set_fields(t, aux, children)
    if kind == ORDEREDDICT:
        return OrderedDict(zip(aux, children))
    if kind == DEFAULTDICT:
        return defaultdict(aux[0], _in_order(aux[1], children, order))
    if kind == DEQUE:
        return deque(children, aux)
    if kind == STRUCTSEQ:
        return t(children, dict(aux)) if aux else t(children)
    if kind == CUSTOM or kind == RULE:
        tail = user_tail(kind, aux)
        keys = tail[1]
        got = tuple(children) if keys is None else dict(zip(keys, children))
        if kind == CUSTOM:
            return t.__tree_unflatten__(tail[0], got)
        return aux[0].unflatten(tail[0], got)
    if kind == SEQUENCE:
        return _build_sequence(t, aux, children)
    raise ValueError(f"unknown node kind {kind!r}")  # pragma: no cover - specs are validated


def _read_leaves(leaves: Any, n: int) -> Any:
    """The leaves as a list or tuple. A sized iterable is read whole, so the
    error can count it; an iterator only up to one leaf more than the spec
    needs, so an endless one is an error, not a hang. A str, bytes or
    mapping is refused (``refuse_leaves``). A list is read as it is, as it
    changes, but on a free-threaded build it is copied first, as the C engine
    copies it there (``_SNAPSHOT_READS``)."""
    if type(leaves) is list:
        return tuple(leaves) if _SNAPSHOT_READS else leaves
    if type(leaves) is tuple:
        return leaves
    refuse_leaves(leaves)
    if hasattr(type(leaves), "__len__"):
        return list(leaves)
    got = list(islice(leaves, n + 1))
    if len(got) > n:
        raise ValueError(
            f"unflatten: the spec has {n} {'leaf' if n == 1 else 'leaves'}, "
            f"but more than {n} were given"
        )
    return got


def unflatten(spec: TreeSpec, leaves: Any) -> Any:
    n = spec._num_leaves
    leaves = _read_leaves(leaves, n)
    if len(leaves) != n:
        given = len(leaves)
        raise ValueError(
            f"unflatten: the spec has {n} {'leaf' if n == 1 else 'leaves'}, "
            f"but {given} {'was' if given == 1 else 'were'} given"
        )
    nodes = spec._nodes
    orders = dict(spec._orders) if spec._orders else None
    stack: list = []
    push = stack.append
    li = n
    # Reversed pre-order: popping a node's arity values gives its children in order.
    for idx in range(len(nodes) - 1, -1, -1):
        node = nodes[idx]
        if node[0] == LEAF:
            li -= 1
            push(leaves[li])
            continue
        kind, t, arity, aux = node
        if arity:
            children = stack[-arity:]
            del stack[-arity:]
            children.reverse()
        else:
            children = []
        push(build(kind, t, aux, children, orders.get(idx) if orders else None))
    return stack[0]


# --------------------------------------------------------------------------
# flatten_up_to: the leaves of a tree that must have a known structure


def describe(obj: Any, rules: Any = None) -> str:
    """What an object is, in the words of :func:`describe_node`."""
    found = None
    try:
        found = classify(obj, type(obj), rules, [], {})
    except Exception:
        found = None
    if found is None:
        return f"a leaf of type {qualname(type(obj))}"
    return describe_node(found[0])


def _mismatch(stack: list, label: str, node: tuple, obj: Any, other: str) -> StructureError:
    rules = {node[1]: node[3][0]} if node[0] == RULE else None
    mine, theirs = tell_apart(describe_node(node), node[1], describe(obj, rules), type(obj))
    return StructureError(
        f"{where(stack_path(stack))}: structure mismatch: {label} has {mine}, {other} has {theirs}"
    )


def _dict_match(obj: Any, kind: int, arity: int, aux: Any, keys: Any, stack: list) -> Any:
    """The values of ``keys`` (a dict node's) in ``obj``, a dict or
    defaultdict, or None when it has other keys (or another
    ``default_factory``). When its keys and the node's are of types whose
    hash and ``==`` run no Python code (``_ATOMS``), from one read of the
    dict (``_dict_read``); else the dict is asked about each key (``in``,
    then its value), as the C engine asks, so that what that code does is
    seen alike."""
    items = _read(_item_list, obj, stack)
    if not _ATOMS.issuperset(map(type, keys)) or not _ATOMS.issuperset([type(k) for k, _ in items]):
        if (
            len(obj) == arity
            and (kind == DICT or obj.default_factory == aux[0])
            and all(k in obj for k in keys)
        ):
            return [obj[k] for k in keys]
        return None
    if len(items) != arity or (kind != DICT and obj.default_factory != aux[0]):
        return None
    values = dict(items)
    if not all(k in values for k in keys):
        return None
    return [values[k] for k in keys]


def _match(node: tuple, obj: Any, stack: list, label: str, other: str) -> tuple:
    """Children (in leaf order), keymode and names of obj, which must match node."""
    kind, t, arity, aux = node
    ot = type(obj)
    if kind == TUPLE:
        if ot is tuple and len(obj) == arity:
            return obj, BY_SEQ, None
    elif kind == LIST:
        if ot is list:
            items = tuple(obj)  # one read: its length is the one checked
            if len(items) == arity:
                return items, BY_SEQ, None
    elif kind == DICT or kind == DEFAULTDICT:
        keys = aux if kind == DICT else aux[1]
        if ot is (dict if kind == DICT else defaultdict):
            values = _dict_match(obj, kind, arity, aux, keys, stack)
            if values is not None:
                return values, BY_KEY, keys
    elif kind == NONE:
        if obj is None:
            return (), BY_SEQ, None
    elif kind == NAMEDTUPLE:
        if ot is t and _stored_len(obj) == arity:
            return _items(obj), BY_ATTR, aux
    elif kind == DATACLASS or kind == ATTRS:
        if ot is t:
            mine, children, keymode, names = _record_fields(obj, t, kind, stack, {})
            if mine[3] == aux:
                return children, keymode, names
    elif kind == ORDEREDDICT:
        if ot is OrderedDict:
            order, children = _odict_read(obj, stack)
            if order == aux:
                if children is None or not _ATOMS.issuperset(map(type, aux)):
                    children = [obj[k] for k in aux]
                return children, BY_KEY, aux
    elif kind == DEQUE:
        if ot is deque:
            children = _read(tuple, obj, stack)
            if len(children) == arity and obj.maxlen == aux:
                return children, BY_SEQ, None
    elif kind == STRUCTSEQ:
        if ot is t:
            mine, children, keymode, names = _structseq_node(obj, t)
            if mine == node:
                return children, keymode, names
    elif kind == CUSTOM:
        if ot is t:
            children, tail, names, mode = _custom_result(obj.__tree_flatten__(), stack, t)
            if len(children) == arity and tail == aux:
                return children, mode, names
    elif kind == RULE:
        if ot is t:
            children, tail, names, mode = _rule_result(aux[0].flatten(obj), stack, t)
            if len(children) == arity and tail == user_tail(RULE, aux):
                return children, mode, names
    elif kind == MAPPING:
        if ot is t:
            mine, children, keymode, names = _mapping_node(obj, t, aux[0], stack, {})
            if mine[2] == arity and mine[3] == aux:  # (what it carries is not compared)
                return children, keymode, names
    elif kind == SEQUENCE:
        if ot is t:
            mine, children, keymode, names = _sequence_node(obj, t, aux[0], stack, {})
            if mine[2] == arity and mine[3] == aux:
                return children, keymode, names
    raise _mismatch(stack, label, node, obj, other)


def flatten_up_to(
    spec: TreeSpec, tree: Any, label: str = "the spec", other: str = "the tree"
) -> list:
    nodes = spec._nodes
    out: list = []
    stack: list = []  # frames: [children, position, keymode, names]
    obj = tree
    i = 0
    while True:
        node = nodes[i]
        i += 1
        if node[0] == LEAF:
            out.append(obj)
        else:
            children, keymode, names = _match(node, obj, stack, label, other)
            if children:
                stack.append([children, 0, keymode, names])
        while stack:
            fr = stack[-1]
            j = fr[1]
            if j < len(fr[0]):
                fr[1] = j + 1
                obj = fr[0][j]
                break
            stack.pop()
        else:
            break
    return out


def flatten_up_to_columns(
    spec: TreeSpec, trees: Any, label: str = "the spec", other: str = "the tree"
) -> list:
    """flatten_up_to of each tree, as one list per leaf of the spec:
    ``columns[j][k]`` is leaf ``j`` of ``trees[k]``."""
    if type(trees) is not list and type(trees) is not tuple:
        refuse_trees(trees)
    rows = [flatten_up_to(spec, t, label, other) for t in tuple(trees)]
    return (
        [list(column) for column in zip(*rows)] if rows else [[] for _ in range(spec._num_leaves)]
    )


# --------------------------------------------------------------------------
# The spec algebra on node tuples (TreeSpec.compose, is_prefix, paths)


def spec_compose(
    outer_nodes: tuple, outer_orders: tuple, inner_nodes: tuple, inner_orders: tuple
) -> tuple:
    """``(nodes, orders)`` of the outer nodes with every leaf replaced by the
    inner nodes; the dict orders of both moved to where their nodes now stand."""
    nodes: list = []
    orders: list = []
    by_index = dict(outer_orders)
    for i, node in enumerate(outer_nodes):
        if node[0] == LEAF:
            orders.extend((len(nodes) + j, o) for j, o in inner_orders)
            nodes.extend(inner_nodes)
            continue
        if i in by_index:
            orders.append((len(nodes), by_index[i]))
        nodes.append(node)
    return tuple(nodes), tuple(orders)


def spec_is_prefix(mine: tuple, theirs: tuple) -> bool:
    """Whether the nodes ``theirs`` are the nodes ``mine`` with some leaves
    replaced by subtrees."""
    j = 0
    for node in mine:
        if node[0] == LEAF:
            j = _subtree_end(theirs, j)
            continue
        if node != theirs[j]:
            return False
        j += 1
    return True


def keystr(path: Any) -> str:
    """``_keys.keystr`` with its default options: each key as its ``str``."""
    return "".join(map(str, path))


def spec_paths(nodes: tuple) -> list:
    """The path of each leaf of a spec's nodes, as ``flatten_with_path`` names them."""
    return [tuple(keys) for node, keys in node_paths(nodes) if node[0] == LEAF]


def path_get(tree: Any, path: tuple) -> tuple:
    """``tree_get``'s reading of builtin containers: down ``path`` from
    ``tree`` while each node is an exact dict read by a DictKey or an exact
    list or tuple read by a SequenceKey of an int in range; ``(the node
    reached, how many keys were read)``. A key a dict lacks or cannot hash
    stops the reading as any other key would."""
    node = tree
    done = 0
    for key in path:
        t = type(node)
        if t is dict:
            if type(key) is not DictKey:
                break
            try:
                node = node[key.key]
            except (KeyError, TypeError):
                break
        elif t is list or t is tuple:
            if type(key) is not SequenceKey:
                break
            i = key.idx
            if type(i) is not int or not 0 <= i < len(node):
                break
            node = node[i]
        else:
            break
        done += 1
    return node, done


def check_path(path: tuple) -> tuple:
    """``path``, when each of its keys is a DictKey, SequenceKey or
    GetAttrKey; else TypeError."""
    for key in path:
        if type(key) not in _KEY_TYPES:
            raise TypeError(
                "a path's keys are DictKey, SequenceKey or GetAttrKey, "
                f"got {type(key).__name__} in {path!r}"
            )
    return path


def child_at(fn: str, node: Any, path: tuple, depth: int, is_leaf: Any, rules: Any) -> tuple:
    """(children, spec, i): the children of ``node`` (the tree at
    ``path[:depth]``), the spec that rebuilds it, and the index of the child
    ``path[depth]`` names; for a builtin dict, list or tuple, ``(node, None,
    key or index)``. A child that is not there raises KeyError (IndexError
    for a position) naming ``fn``, the place and what stands there."""
    key = path[depth]
    t = type(node)
    if is_leaf is None and (rules is None or t not in rules):
        # the builtin containers, read directly: what the engines would give
        if t is dict and type(key) is DictKey:
            try:
                if key.key in node:
                    return node, None, key.key
            except TypeError:  # an unhashable key: no such child
                pass
        elif (
            (t is list or t is tuple)
            and type(key) is SequenceKey
            and type(key.idx) is int
            and 0 <= key.idx < len(node)
        ):
            return node, None, key.idx
    found = _interface.engine.flatten_one_level(node, is_leaf, rules)
    if found is None:
        raise missing(fn, path, depth, key, f"a leaf of type {type(node).__qualname__}")
    children, spec = found
    root = spec._nodes[0]
    for i in range(root[2]):
        k = child_key(root, i)
        # an [int] read from text may be a mapping's int key
        if k == key or (
            type(key) is SequenceKey
            and type(k) is DictKey
            and k.key == key.idx
            and type(k.key) is int
        ):
            return children, spec, i
    raise missing(fn, path, depth, key, describe_node(root))


def tree_get(tree: Any, path: tuple, is_leaf: Any = None, rules: Any = None, /) -> Any:
    """What stands at ``path``, a tuple of keys, in ``tree`` (``pk.tree_get``,
    and an ``Accessor``'s call). Builtin dicts, lists and tuples are read by
    the engine's ``path_get``; from the first other node on, a node's
    children are found as the engine flattens it (:func:`child_at`)."""
    node, done = tree, 0
    if is_leaf is None and not rules:
        node, done = _interface.engine.path_get(tree, path)
        if done == len(path):
            return node
    check_path(path)
    rules = check_rules(rules)
    for depth in range(done, len(path)):
        children, _, i = child_at("tree_get", node, path, depth, is_leaf, rules)
        node = children[i]
    return node


#: Functions of a class (and strs) alone whose results are strs, ints and
#: bools in tuples: while torch.compile traces, the tracer runs each as it
#: is and takes its result as a constant (``_dynamo`` marks them so), as
#: dynamo 2.9-2.11 cannot follow the reads of class dicts they make.
CLASS_FACTS = (
    class_traits,
    record_fields,
    slot_names,
    data_descriptor,
    tuple_overrides,
    subclass_base,
    own_setters,
    cached_names,
)
