"""Mutation fuzz of TreeSpec.from_json: only ValueError, no import, no crash.

The corpus is the ``to_json()`` of the specs of many real trees (every node
kind the format has; the trees and classes of ``scripts/corpus/json_cases.py`` and
``scripts/corpus/trees.py``, random nestings of them, deep and wide specs, odd keys).
Each document takes one corpus entry and applies 1 to 4 mutations: structural
ones on the parsed JSON (replace, delete, insert, duplicate, other node kinds,
wrong arities, bad numbers, wrong types, references to classes and functions
that are not allowed, nesting 10^5 deep, huge strings, duplicate members,
grafts from other documents) and edits of the text or bytes (characters,
truncation, invalid UTF-8, BOM, surrogates, NaN/Infinity tokens). It goes in
as str, bytes or bytearray. For every document:

* ``from_json`` returns a TreeSpec or raises ValueError, nothing else;
* it imports nothing: ``builtins.__import__`` and ``importlib.import_module``
  are wrapped by recorders during the call, and ``sys.modules`` is compared
  before and after (a relative import inside pytree_kit of its own, already
  imported, submodules would not be an import of anything new);
* an accepted spec is usable: ``to_json`` reads back to the same text and an
  equal spec, ``repr`` and ``hash`` work, and ``unflatten(list(range(n)))``
  ends the same way on the pure and the C engine (equal trees, or the same
  exception type).

Document ``I`` of seed ``S`` depends on ``(S, I)`` only: ``--seed S --index I``
shows it again. The documents run in a child process, so that a crash (a
segfault) is reported with its document as a failure and the run goes on.

    python scripts/fuzz_json.py                      # 10,000 documents, seed 0
    python scripts/fuzz_json.py --docs 2000 --seed 7
    python scripts/fuzz_json.py --seed 7 --index 123 # one document, in full
    python scripts/fuzz_json.py --self-test          # the detectors detect

Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import builtins
import collections
import copy
import dataclasses
import dis
import enum
import faulthandler
import importlib
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections import OrderedDict, defaultdict, deque
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytree_kit as pk  # noqa: E402
import pytree_kit.testing as pkt  # noqa: E402
from pytree_kit import TreeSpec, _pure  # noqa: E402
from pytree_kit._json import encode  # noqa: E402
from pytree_kit._kinds import CUSTOM, KIND_NAMES, RULE  # noqa: E402
from scripts.corpus import json_cases as tj  # noqa: E402
from scripts.corpus import trees as tt  # noqa: E402

try:
    from pytree_kit import _speedups
except ImportError:  # not built: only the pure engine is checked
    _speedups = None

# --------------------------------------------------------------------------
# what from_json is given

ALLOW: tuple = tuple(dict.fromkeys([*tj.ALL_CLASSES, *tj.HOSTILE_ALLOW, *tt.ALLOW]))
RULES: dict = {**tj.RULES, **tt.RULES}

#: References that must never resolve, let alone be imported or called. Some
#: name modules that are not imported (antigravity would open a web browser).
FORBIDDEN = [
    "os:system",
    "os:popen",
    "os.path:join",
    "builtins:eval",
    "builtins:exec",
    "builtins:__import__",
    "builtins:open",
    "builtins:getattr",
    "builtins:breakpoint",
    "builtins:object.__subclasses__",
    "builtins:__builtins__",
    "subprocess:Popen",
    "subprocess:run",
    "importlib:import_module",
    "importlib.util:spec_from_file_location",
    "antigravity:fly",
    "this:s",
    "tkinter:Tk",
    "webbrowser:open",
    "ctypes:CDLL",
    "pickle:loads",
    "shutil:rmtree",
    "sys:exit",
    "code:interact",
    "pdb:set_trace",
    "collections:namedtuple",
    "collections.abc:Mapping",
    "dataclasses:make_dataclass",
    "pytree_kit._json:decode",
    "scripts.corpus.json_cases:_opaque_unflatten",
    "no_such_module_xyz:Thing",
    "builtins",
    "builtins:",
    ":eval",
    "a:b:c",
]
#: Modules a reference above names that must stay unimported.
NEVER_IMPORTED = ["antigravity", "this", "tkinter", "no_such_module_xyz"]

# --------------------------------------------------------------------------
# corpus: to_json() of real trees


def _odd_keys() -> dict:
    return {
        1: 0,
        -(10**30): 1,
        2.5: 2,
        math.nan: 3,
        math.inf: 4,
        -math.inf: 5,
        -0.0: 6,
        b"\x00\xff": 7,
        tj.Color.RED: 8,
        tj.Level.HIGH: 9,
        tj.Perm.R | tj.Perm.W: 10,
        (1, ("a", b"")): 11,
        frozenset({1, "x"}): 12,
        complex(1, -2): 13,
        complex(math.nan, 1): 19,
        complex(-0.0, math.inf): 20,
        None: 14,
        "\u2603\ud800": 16,
        int: 17,
        tj.Plain: 18,
    }


def _deep(depth: int) -> Any:
    tree: Any = 0
    for i in range(depth):
        tree = [tree] if i % 3 else {"k": tree, "z": None}
    return tree


def _random_key(rng: random.Random) -> Any:
    return rng.choice(
        [
            lambda: rng.randint(-3, 3),
            lambda: rng.choice(["a", "b", "c", "", "é", "*"]),
            lambda: rng.choice([0.5, -1.5, 1e300, math.inf]),
            lambda: rng.choice([b"", b"\x01"]),
            lambda: rng.choice(list(tj.Color)),
            lambda: (rng.randint(0, 2), rng.choice("xy")),
            lambda: frozenset(range(rng.randint(0, 2))),
            lambda: None,
            lambda: complex(rng.randint(0, 2), 1),
        ]
    )()


def _random_tree(rng: random.Random, depth: int) -> Any:
    """A tree nesting every kind of container, drawn from ``rng``."""
    if depth <= 0 or rng.random() < 0.2:
        return rng.choice([0, 0, 0, None])

    def c() -> Any:
        return _random_tree(rng, depth - 1)

    def n() -> int:
        return rng.randint(0, 3)

    def mapping() -> dict:
        keys = [_random_key(rng) for _ in range(n())]
        if rng.random() < 0.5:
            keys = [str(k) for k in keys]
            rng.shuffle(keys)
        return {k: c() for k in keys}

    makers: list = [
        lambda: [c() for _ in range(n())],
        lambda: tuple(c() for _ in range(n())),
        mapping,
        lambda: OrderedDict(mapping()),
        lambda: defaultdict(rng.choice([None, list, int, tj.make_zero]), mapping()),
        lambda: deque([c() for _ in range(n())], rng.choice([None, 3, 5])),
        lambda: tj.Point(c(), c()),
        lambda: tj.Pair(c(), c()),
        lambda: tj.Plain(c(), c()),
        lambda: tj.Frozen(c(), c()),
        lambda: tj.Slotted(c(), c()),
        lambda: tj.InitFalse(c()),
        lambda: tj.Derived(c(), c()),
        lambda: tj.WithStatic(c(), rng.choice(["a", "b"]), (1, b"x"), rng.choice(list(tj.Color))),
        lambda: tj.DictOut(loss=c(), logits=rng.choice([None, c()])),
        lambda: tj.AttrsPoint(c(), c()),
        lambda: tj.AttrsFrozen(c(), tag=rng.choice(["t", "u"])),
        lambda: tj.AttrsInitFalse(c()),
        lambda: tj.Outer.Inner(c()),
        lambda: tj.SeqBox([c() for _ in range(n())], rng.choice(tj.RICH_AUX)),
        lambda: tj.MapBox(mapping(), rng.choice([None, ("m", 1)])),
        lambda: tj.Opaque(c(), c()),
        lambda: tj.OpaqueMap(a=c(), b=c()),
        lambda: time.struct_time([c() for _ in range(9)]),
        lambda: os.terminal_size((c(), c())),
        lambda: tt.KwDC(x=c(), y=c()),
        lambda: tt.AttrsStatic(c(), rng.randint(1, 3)),
        lambda: tt.Node(c(), c(), rng.choice(["n", "m"])),
        lambda: tt.Record(a=c(), b=c()),
        lambda: tt.Opaque([c() for _ in range(n())], rng.randint(0, 2)),
        lambda: tt.ModelOutput(logits=c(), loss=tt.Leaf(1)),
        lambda: pkt.Tagged(c(), rng.choice(["x", "y"])),
    ]
    return rng.choice(makers)()


def _corpus_trees() -> list:
    """(name, tree) of every corpus entry beside the cases of scripts/corpus/json_cases.py."""
    out: list = [
        ("nan-key", {math.nan: 1, "a": [2]}),
        ("odd-keys", _odd_keys()),
        ("odd-keys-protocol", tj.MapBox(_odd_keys(), tj.RICH_AUX)),
        ("deep-2000", _deep(2000)),
        ("wide-dict-600", {f"k{i:04d}": [i, (i,)] for i in reversed(range(600))}),
        ("wide-list-1500", list(range(1500))),
        ("struct-time-hidden", time.struct_time(range(9))),
        ("stat-built", os.stat_result(tuple(range(10)), {"st_atime": 1.5, "st_rdev": 3})),
        ("trees-frozen", tt.FrozenDC([1], "u")),
        ("trees-slots", tt.SlotsDC(1, (2,))),
        ("trees-kw", tt.KwDC(x=1, y=[2])),
        ("trees-init-false", tt.InitFalseDC({"a": 1})),
        ("trees-child", tt.ChildDC(1, 2, 3)),
        ("trees-attrs", tt.AttrsCls(1, [2])),
        ("trees-attrs-static", tt.AttrsStatic(1, 3)),
        ("trees-node", tt.Node(1, tt.Node(2, 3, "m"))),
        ("trees-record", tt.Record(b=1, a=[2])),
        ("trees-opaque", tt.Opaque([1, 2, 3], 2)),
        ("trees-model-output", tt.ModelOutput(logits=[1], loss=2)),
        ("testing-tagged", pkt.Tagged(1, "y")),
        ("trees-dict-subclass", tt._batch([1], 2, ("t", 1))),
        ("trees-ordered-subclass", tt.Ordered([("b", 1), ("a", [2])])),
        ("trees-defaultdict-subclass", tt.Counts(list, {"x": 1, 2: 3})),
        ("trees-userdict", tt._encoded([1, 2], 3, 1)),
        ("trees-mirrored", tt._mirrored(1, [2])),
        ("trees-slot-dict", tt._slot_dict(1, "m")),
        ("trees-tuple-subclass", tt._row(1, (2,), "r")),
        ("trees-list-subclass", tt.Items([1, [2]])),
        ("trees-userlist", tt.Rows([1, 2])),
    ]
    rng = random.Random("pytree_kit fuzz_json corpus")
    out += [(f"random-{i}", _random_tree(rng, 4)) for i in range(40)]
    return out


_CORPUS: list = []


def corpus() -> list:
    """[(name, parsed document)], built once. The os.stat() case of test_json is
    left out: its document changes with the file's times."""
    if not _CORPUS:
        named = [(n, make(), r) for n, make, _, r in tj.CASES if n != "structseq-stat"]
        named += [(n, tree, RULES) for n, tree in _corpus_trees()]
        for name, tree, rules in named:
            _CORPUS.append((name, json.loads(pk.structure(tree, rules=rules).to_json())))
        _CORPUS.extend((f"valid-base-{i}", json.loads(t)) for i, t in enumerate(tj.VALID_BASES))
    return _CORPUS


# --------------------------------------------------------------------------
# mutations


class Raw:
    """Text put into the document as is (deep nesting, duplicate members, NaN,
    numbers json cannot write...)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_TOKEN = "\x00fuzz-raw-{}\x00"
_TOKEN_RE = re.compile(r'"\\u0000fuzz-raw-(\d+)\\u0000"')


class Writer:
    """json.dumps that writes Raw pieces verbatim."""

    def __init__(self) -> None:
        self.raws: list = []

    def _default(self, obj: Any) -> Any:
        if type(obj) is Raw:
            self.raws.append(obj.text)
            return _TOKEN.format(len(self.raws) - 1)
        raise TypeError(type(obj).__name__)

    def dumps(self, value: Any) -> str:
        text = json.dumps(value, default=self._default)
        return _TOKEN_RE.sub(lambda m: self.raws[int(m.group(1))], text)


def _positions(doc: Any) -> list:
    return tj._positions(doc)


def _node_dicts(doc: Any) -> list:
    nodes = doc.get("nodes") if type(doc) is dict else None
    if type(nodes) is not list:
        return []
    return [n for n in nodes if type(n) is dict]


def _json_arity(node: Any) -> int:
    if type(node) is not dict:
        return 0
    kind = node.get("kind")
    if type(kind) is not str:
        return 0
    member = {"dict": "keys", "ordereddict": "keys", "defaultdict": "keys"}.get(kind)
    if kind in ("namedtuple", "dataclass", "attrs"):
        member = "fields"
    if member is not None:
        value = node.get(member)
        return len(value) if type(value) is list else 0
    value = node.get("arity")
    return value if type(value) is int and 0 <= value < 10**6 else 0


def _subtree_end(nodes: list, start: int) -> int:
    need, i = 1, start
    while need and i < len(nodes):
        need += _json_arity(nodes[i]) - 1
        i += 1
    return i


_BAD_NUMBERS: list = [
    -1,
    -2,
    -(2**63),
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    10**18,
    10**30,
    sys.maxsize + 1,
    0,
    1.0,
    2.5,
    -0.0,
    1e308,
    True,
    False,
    "2",
    None,
    [],
    {},
]
_RAW_NUMBERS = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "9" * 4300, "9" * 4301, "-0"]
_PIECES = [*'[]{}",:*0 -e.n\\', "\x00", "\ud800", "\udfff", "\ufeff", "\u2028", "\u00a0", "\x0b"]
_PIECES += ["NaN", "Infinity", "-Infinity", "1e999", "\\ud800", "\\udc80", "\\u0000", "\\x", "\r"]
_BAD_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]


class Mutator:
    """The mutations of one document, drawn from its own Random."""

    def __init__(self, rng: random.Random, writer: Writer) -> None:
        self.rng = rng
        self.writer = writer

    # -- values -------------------------------------------------------------

    def ref(self) -> str:
        rng = self.rng
        if rng.random() < 0.6:
            return rng.choice(FORBIDDEN)
        return tj.ref(rng.choice(ALLOW))

    def tagged(self) -> Any:
        rng = self.rng
        return rng.choice(
            [
                lambda: {"float": rng.choice(["nan", "inf", "-inf", "NaN", "1.5", "", 1.5])},
                lambda: {"bytes": rng.choice(["00ff", "0", "zz", "", " 00 ff", "0g", 12])},
                lambda: {"tuple": [self.value(1) for _ in range(rng.randint(0, 3))]},
                lambda: {"frozenset": [self.value(1) for _ in range(rng.randint(0, 3))]},
                lambda: {"complex": [self.value(1) for _ in range(rng.randint(0, 3))]},
                lambda: {"complex": [self.number(), self.number()]},
                lambda: {"tuple": [self.number(), {"complex": [self.number(), self.number()]}]},
                lambda: {"enum": self.ref(), "name": rng.choice(["RED", "R", "x", 1])},
                lambda: {"enum": tj.ref(rng.choice([tj.Color, tj.Perm, tj.Level])), "value": 3},
                lambda: {"enum": tj.ref(tj.Perm), "value": rng.choice([0, 3, -1, 2**70, "R"])},
                lambda: {"ref": self.ref()},
                lambda: {"ref": rng.choice(["builtins:int", "collections:OrderedDict", 5])},
                lambda: {"tuple": [], "bytes": ""},
            ]
        )()

    def number(self) -> Any:
        """A number, or something in its place, for the parts of a complex."""
        special = [{"float": "nan"}, {"float": "inf"}, {"float": "-inf"}, True, "1", Raw("1e999")]
        return self.rng.choice([0, 1, -1, 0.5, -0.0, 1e308, 10**400, *special])

    def node(self) -> Any:
        rng = self.rng
        out: dict = {"kind": rng.choice([*KIND_NAMES, "set", "LIST", ""])}
        for name in rng.sample(tj._MEMBER_NAMES, rng.randint(0, 4)):
            out[name] = self.value(1)
        return out

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return copy.deepcopy(rng.choice(tj._SPECIAL))
        if r < 0.45:
            return rng.choice(_BAD_NUMBERS + [Raw(t) for t in _RAW_NUMBERS])
        if r < 0.55:
            return rng.choice(["x", "", "\ud800", "\x00", "é", "*", "**", "kind", self.ref()])
        if r < 0.7:
            return self.tagged()
        if r < 0.8:
            return self.node()
        if r < 0.9 and depth < 2:
            return [self.value(depth + 1) for _ in range(rng.randint(0, 3))]
        if depth < 2:
            return {rng.choice(tj._MEMBER_NAMES): self.value(depth + 1)}
        return rng.choice([math.nan, math.inf, -1, 0.5])

    def deep(self) -> Raw:
        rng = self.rng
        n = rng.choice([100_000, 100_000, 5000, 1001, 1000, 999])
        d = rng.choice([100, 300, 400, 450, 480, 500, 1000, 50_000])
        tag = rng.choice(["tuple", "frozenset", "complex"])
        return Raw(
            rng.choice(
                [
                    "[" * n,
                    "[" * n + "]" * n,
                    '{"a":' * n,
                    '{"a":' * n + "1" + "}" * n,
                    f'{{"{tag}": [' * d + "1" + "]}" * d,
                    '{"tuple": [' * d,
                ]
            )
        )

    def huge_string(self) -> Any:
        rng = self.rng
        n = rng.choice([10**4, 10**5, 10**6])
        return rng.choice(
            ["x" * n, "\u2603" * (n // 10), "a" * n + ":" + "b", "builtins:" + "i" * n, "*" * n]
        )

    def with_duplicate_member(self, obj: dict) -> Raw:
        items = list(obj.items()) or [("kind", "list")]
        name, value = self.rng.choice(items)
        other = self.rng.choice([value, self.value(1)])
        items.insert(self.rng.randint(0, len(items)), (name, other))
        members = [f"{json.dumps(k)}: {self.writer.dumps(v)}" for k, v in items]
        return Raw("{" + ", ".join(members) + "}")

    # -- structural mutations on the parsed document -------------------------

    def structural(self, doc: Any) -> tuple[Any, str]:
        rng = self.rng
        op = rng.choice(STRUCTURAL)
        positions = _positions(doc)
        nodes = _node_dicts(doc)
        if not positions:
            return self.value(), "new-root"
        container, key = rng.choice(positions)
        if op == "replace":
            container[key] = self.value()
        elif op == "delete":
            del container[key]
        elif op == "insert":
            if type(container) is list:
                container.insert(key, self.value())
            else:
                container[rng.choice(tj._MEMBER_NAMES)] = self.value()
        elif op == "duplicate":
            if type(container) is list:
                container.insert(key, copy.deepcopy(container[key]))
            else:
                container[key] = copy.deepcopy(rng.choice(positions)[0])
        elif op == "swap-kind" and nodes:
            node = rng.choice(nodes)
            node["kind"] = rng.choice([*KIND_NAMES, "set"])
        elif op == "swap-nodes" and type(doc) is dict and type(doc.get("nodes")) is list:
            seq = doc["nodes"]
            if len(seq) > 1:
                i, j = rng.sample(range(len(seq)), 2)
                seq[i], seq[j] = seq[j], seq[i]
            elif seq:
                seq[0] = rng.choice(["*", None, {"kind": "list", "arity": 0}])
        elif op == "arity":
            with_int = [(c, k) for c, k in positions if type(c[k]) is int]
            if with_int:
                c, k = rng.choice(with_int)
                c[k] += rng.choice([-3, -2, -1, 1, 2, 3])
            elif nodes:
                rng.choice(nodes)["arity"] = rng.randint(0, 3)
        elif op == "bad-number":
            with_number = [(c, k) for c, k in positions if type(c[k]) in (int, float, bool)]
            c, k = rng.choice(with_number or positions)
            c[k] = rng.choice(_BAD_NUMBERS + [Raw(t) for t in _RAW_NUMBERS])
        elif op == "wrong-type":
            value = container[key]
            choices: list = [None, True, 1, -1, 1.5, "s", [], {}, [value], {"x": value}, "*"]
            container[key] = rng.choice([c for c in choices if type(c) is not type(value)])
        elif op == "forbidden-ref":
            places = [(c, k) for c, k in positions if k in ("class", "ref", "enum")]
            places += [(n, "class") for n in nodes]
            c, k = rng.choice(places) if places else (container, key)
            c[k] = rng.choice(FORBIDDEN)
            if rng.random() < 0.3 and nodes:
                rng.choice(nodes)["default_factory"] = {"ref": rng.choice(FORBIDDEN)}
        elif op == "deep":
            container[key] = self.deep()
        elif op == "huge-string":
            strings = [(c, k) for c, k in positions if type(c[k]) is str]
            c, k = rng.choice(strings or positions)
            c[k] = self.huge_string()
        elif op == "duplicate-member":
            objects = [(c, k) for c, k in positions if type(c[k]) is dict]
            if type(doc) is dict and rng.random() < 0.3:
                return self.with_duplicate_member(doc), op
            if objects:
                c, k = rng.choice(objects)
                c[k] = self.with_duplicate_member(c[k])
        elif op == "string-edit":
            strings = [(c, k) for c, k in positions if type(c[k]) is str and c[k]]
            if strings:
                c, k = rng.choice(strings)
                s = c[k]
                i = rng.randrange(len(s))
                c[k] = rng.choice([s[:i] + s[i + 1 :], s[:i] + rng.choice(_PIECES) + s[i:]])
        elif op == "tagged":
            container[key] = self.tagged()
        elif op == "graft" and type(doc) is dict and type(doc.get("nodes")) is list:
            seq = doc["nodes"]
            _, other = rng.choice(corpus())
            theirs = other["nodes"]
            a = rng.randrange(len(theirs))
            piece = copy.deepcopy(theirs[a : _subtree_end(theirs, a)])
            if seq:
                b = rng.randrange(len(seq))
                seq[b : _subtree_end(seq, b)] = piece
        elif op in ("reorder", "rekey", "retype", "reaux"):
            self.valid_edit(op, nodes)
        elif op == "members":
            if nodes:
                node = rng.choice(nodes)
                if node and rng.random() < 0.5:
                    del node[rng.choice(list(node))]
                else:
                    node[rng.choice(tj._MEMBER_NAMES)] = self.value(1)
        return doc, op

    def valid_edit(self, op: str, nodes: list) -> None:
        """Edits that keep a valid document valid (most of the time), so that
        new combinations get past the checks and into unflatten."""
        rng = self.rng
        keyed = [n for n in nodes if type(n.get("keys")) is list and n["keys"]]
        if op == "reorder" and keyed:
            node = rng.choice(keyed)
            order = list(node["keys"])
            rng.shuffle(order)
            if node.get("kind") == "custom" or node.get("kind") == "rule":
                node["keys"] = order
            else:
                node["order"] = order
        elif op == "rekey" and keyed:
            keys = rng.choice(keyed)["keys"]
            keys[rng.randrange(len(keys))] = encode(_random_key(rng))
        elif op == "retype" and nodes:
            node = rng.choice(nodes)
            kind = node.get("kind")
            if kind in ("list", "tuple", "deque") or ("keys" in node and kind != "custom"):
                arity = _json_arity(node)
                kinds = ["list", "tuple", "deque", "custom"] if "keys" not in node else []
                kinds += ["dict", "ordereddict", "defaultdict"] if "keys" in node else []
                node.clear()
                node["kind"] = new = rng.choice(kinds)
                if new == "custom":
                    node.update({"class": tj.ref(tj.SeqBox), "arity": arity, "aux": None})
                elif new in ("list", "tuple", "deque"):
                    node["arity"] = arity
                    if new == "deque" and rng.random() < 0.5:
                        big = [sys.maxsize, sys.maxsize + 1, 2**64, 10**30]
                        node["maxlen"] = rng.choice([arity, arity + 1, arity + 2, *big])
                else:
                    node["keys"] = [encode(k) for k in range(arity)]
                    if new == "defaultdict":
                        node["default_factory"] = rng.choice([None, {"ref": "builtins:list"}])
        elif op == "reaux":
            custom = [n for n in nodes if n.get("kind") in ("custom", "rule")]
            static = [n for n in nodes if type(n.get("static")) is list and n["static"]]
            value = encode(rng.choice([*tj.RICH_AUX, *_odd_keys()]))
            if custom and (not static or rng.random() < 0.5):
                rng.choice(custom)["aux"] = value
            elif static:
                pairs = rng.choice(static)["static"]
                pair = pairs[rng.randrange(len(pairs))]
                if type(pair) is list and len(pair) == 2:
                    pair[1] = value

    # -- edits of the text and of the bytes ----------------------------------

    def edit_text(self, s: str) -> tuple[str, str]:
        rng = self.rng
        op = rng.choice(TEXT)
        i = rng.randint(0, len(s))
        if op == "char-insert":
            s = s[:i] + rng.choice(_PIECES) + s[i:]
        elif op == "char-delete":
            s = s[:i] + s[i + rng.randint(1, 3) :]
        elif op == "char-replace":
            piece = rng.choice(_PIECES)
            s = s[:i] + piece + s[i + len(piece) :]
        elif op == "truncate":
            s = s[:i]
        elif op == "number-token":
            numbers = list(re.finditer(r"-?\d+(\.\d+)?([eE][+-]?\d+)?", s))
            if numbers:
                m = rng.choice(numbers)
                s = s[: m.start()] + rng.choice(_RAW_NUMBERS) + s[m.end() :]
        elif op == "in-string":
            quotes = [m.end() for m in re.finditer('"', s)]
            if quotes:
                j = rng.choice(quotes)
                piece = rng.choice(["\ud800", "\udfff\ud800", "\\ud800", "\x00", "\\", '\\"'])
                s = s[:j] + piece + s[j:]
        elif op == "bom":
            s = "\ufeff" + s
        elif op == "lines":
            lines = s.split("\n")
            j = rng.randrange(len(lines))
            how = rng.choice(["drop", "dup", "swap"])
            if how == "drop":
                del lines[j]
            elif how == "dup":
                lines.insert(j, lines[j])
            else:
                k = rng.randrange(len(lines))
                lines[j], lines[k] = lines[k], lines[j]
            s = "\n".join(lines)
        return s, op

    def edit_bytes(self, b: bytes) -> tuple[bytes, str]:
        rng = self.rng
        op = rng.choice(BYTES)
        i = rng.randint(0, len(b))
        if op == "bad-utf8":
            b = b[:i] + rng.choice(_BAD_UTF8) + b[i:]
        elif op == "byte-flip" and b:
            i = min(i, len(b) - 1)
            b = b[:i] + bytes([b[i] ^ (1 << rng.randrange(8))]) + b[i + 1 :]
        elif op == "byte-truncate":
            b = b[:i]
        elif op == "bom-bytes":
            text = b.decode("utf-8", "surrogateescape")
            encoding = rng.choice(["utf-8-sig", "utf-16", "utf-32"])
            b = text.encode(encoding, "surrogatepass")
        return b, op


STRUCTURAL = [
    "replace",
    "delete",
    "insert",
    "duplicate",
    "swap-kind",
    "swap-nodes",
    "arity",
    "bad-number",
    "wrong-type",
    "forbidden-ref",
    "deep",
    "huge-string",
    "duplicate-member",
    "string-edit",
    "tagged",
    "graft",
    "members",
    "reorder",
    "rekey",
    "retype",
    "reaux",
]
TEXT = [
    "char-insert",
    "char-delete",
    "char-replace",
    "truncate",
    "number-token",
    "in-string",
    "bom",
    "lines",
]
BYTES = ["bad-utf8", "byte-flip", "byte-truncate", "bom-bytes"]


@dataclasses.dataclass
class Document:
    seed: int
    index: int
    base: str  # the corpus entry
    ops: list  # the mutations, in order
    form: str  # str, bytes or bytearray
    data: Any  # what from_json is given
    allow: tuple
    rules: Any


def make_document(seed: int, index: int) -> Document:
    """Document ``index`` of ``seed``: a function of the two only."""
    rng = random.Random(f"fuzz_json:{seed}:{index}")
    writer = Writer()
    mut = Mutator(rng, writer)
    base, doc = rng.choice(corpus())
    doc = copy.deepcopy(doc)
    form = rng.choice(["str", "str", "bytes", "bytes", "bytearray"])
    kinds = [
        rng.choice(["structural"] * 13 + ["text"] * 5 + (["bytes"] * 2 if form != "str" else []))
        for _ in range(rng.randint(1, 4))
    ]
    ops = []
    for _ in range(kinds.count("structural")):
        doc, op = mut.structural(doc)
        ops.append(op)
    # Most mutations break the leaf count first; fixing it up lets them reach
    # the checks behind it.
    if type(doc) is dict and type(doc.get("nodes")) is list and rng.random() < 0.6:
        doc["num_leaves"] = sum(1 for n in doc["nodes"] if n == "*")
        ops.append("(num_leaves fixed)")
    text = writer.dumps(doc)
    if rng.random() < 0.5:  # sometimes the exact layout of to_json
        text = text.replace('"nodes": [', '"nodes": [\n', 1).replace("}, ", "},\n")
    for _ in range(kinds.count("text")):
        text, op = mut.edit_text(text)
        ops.append(op)
    data: Any = text
    if form != "str":
        data = text.encode("utf-8", "surrogatepass")
        for _ in range(kinds.count("bytes")):
            data, op = mut.edit_bytes(data)
            ops.append(op)
        if form == "bytearray":
            data = bytearray(data)
    r = rng.random()
    allow: tuple = ALLOW
    rules: Any = RULES
    if r < 0.1:
        allow, rules = (), None
    elif r < 0.15:
        allow = tuple(rng.sample(ALLOW, rng.randint(0, 5)))
        rules = dict(rng.sample(sorted(RULES.items(), key=lambda kv: tj.ref(kv[0])), 1))
    return Document(seed, index, base, ops, form, data, allow, rules)


# --------------------------------------------------------------------------
# the checks


class ImportRecorder:
    """Records every import a block makes: calls of ``builtins.__import__``
    and ``importlib.import_module`` (both wrapped, and restored on the way out,
    error or not), and modules that appear in or leave ``sys.modules``.

    Two calls load nothing and are not recorded:

    * a relative import from inside pytree_kit of one of its submodules that
      is already imported (``TreeSpec.from_json`` makes none: ``_json`` is
      imported with ``_spec``);
    * CPython's own: from 3.12 on, the C part of the json module reports a
      syntax error by looking up ``json.decoder.JSONDecodeError`` with
      ``PyImport_ImportModule``, which calls ``builtins.__import__``. Such a
      call comes from C code running under the json package's Python code,
      not from an ``import`` statement in it, and names a module that is
      already loaded (anything it did load would still show in sys.modules).
    """

    def __init__(self) -> None:
        self.calls: list = []
        self.added: list = []
        self.removed: list = []

    def __enter__(self) -> ImportRecorder:
        self._before = set(sys.modules)
        self._real_import = real_import = builtins.__import__
        self._real_import_module = real_import_module = importlib.import_module
        calls = self.calls

        def spy_import(
            name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
        ) -> Any:
            if not _own_loaded_submodule(name, globals, fromlist, level) and not (
                _cpython_json_lookup(name, level, sys._getframe(1))
            ):
                calls.append(f"__import__({name!r}, level={level})")
            return real_import(name, globals, locals, fromlist, level)

        def spy_import_module(name: str, package: Any = None) -> Any:
            calls.append(f"importlib.import_module({name!r})")
            return real_import_module(name, package)

        builtins.__import__ = spy_import
        importlib.import_module = spy_import_module  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        builtins.__import__ = self._real_import
        importlib.import_module = self._real_import_module
        after = set(sys.modules)
        self.added = sorted(after - self._before)
        self.removed = sorted(self._before - after)

    def problems(self) -> list:
        out = []
        if self.calls:
            out.append("import called: " + ", ".join(self.calls[:5]))
        if self.added:
            out.append(f"modules imported: {self.added[:5]}")
        if self.removed:
            out.append(f"modules removed from sys.modules: {self.removed[:5]}")
        return out


def _own_loaded_submodule(name: str, globals: Any, fromlist: Any, level: int) -> bool:
    package = (globals or {}).get("__package__") if isinstance(globals, dict) else None
    if level != 1 or package != "pytree_kit":
        return False
    full = f"pytree_kit.{name}" if name else "pytree_kit"
    module = sys.modules.get(full)
    if module is None:
        return False
    return all(hasattr(module, f) or f"{full}.{f}" in sys.modules for f in fromlist or ())


_IMPORT_NAME = dis.opmap["IMPORT_NAME"]


def _cpython_json_lookup(name: str, level: int, caller: Any) -> bool:
    """Whether an ``__import__`` call is CPython's json C code looking up a
    module that is already loaded: the Python frame it runs under belongs to
    the json package and is not executing an ``import`` statement."""
    module = caller.f_globals.get("__name__", "")
    return (
        level == 0
        and name in sys.modules
        and (module == "json" or module.startswith("json."))
        and caller.f_code.co_code[caller.f_lasti] != _IMPORT_NAME
    )


_MISSING = object()
_ATOMS = (int, float, complex, str, bytes, bool, type(None))


def tree_diff(a: Any, b: Any) -> Optional[str]:
    """Where two rebuilt trees differ (types, keys and their order, factories,
    maxlens, hidden structseq fields, attributes), or None."""
    stack = [(a, b, "tree")]
    seen: set = set()
    while stack:
        x, y, path = stack.pop()
        if type(x) is not type(y):
            return f"{path}: {type(x).__qualname__} != {type(y).__qualname__}"
        if x is y or (id(x), id(y)) in seen:
            continue
        seen.add((id(x), id(y)))
        t = type(x)
        if t in _ATOMS or isinstance(x, (type, enum.Enum, types.FunctionType)):
            if not (x == y or (x != x and y != y)):
                return f"{path}: {x!r} != {y!r}"
            continue
        structured = False
        if isinstance(x, dict):
            structured = True
            kx, ky = list(dict.keys(x)), list(dict.keys(y))
            if kx != ky:
                return f"{path}: keys {kx!r} != {ky!r}"
            if isinstance(x, defaultdict) and x.default_factory != y.default_factory:
                return f"{path}: default_factory"
            stack.extend(
                (dict.__getitem__(x, k), dict.__getitem__(y, k), f"{path}[{k!r}]") for k in kx
            )
        if isinstance(x, (list, tuple, deque)):
            structured = True
            if len(x) != len(y):
                return f"{path}: length {len(x)} != {len(y)}"
            if isinstance(x, deque) and x.maxlen != y.maxlen:
                return f"{path}: maxlen {x.maxlen} != {y.maxlen}"
            if isinstance(x, tuple) and hasattr(t, "n_sequence_fields"):
                if x.__reduce__()[1][1] != y.__reduce__()[1][1]:
                    return f"{path}: hidden fields"
            stack.extend((p, q, f"{path}[{i}]") for i, (p, q) in enumerate(zip(x, y)))
        names: list = list(getattr(x, "__dict__", {}))
        if names != list(getattr(y, "__dict__", {})):
            return f"{path}: attributes {names} != {list(getattr(y, '__dict__', {}))}"
        for cls in t.__mro__:
            slots = cls.__dict__.get("__slots__", ())
            names += [slots] if isinstance(slots, str) else [s for s in slots if s != "__dict__"]
        for name in names:
            structured = True
            p, q = getattr(x, name, _MISSING), getattr(y, name, _MISSING)
            if (p is _MISSING) != (q is _MISSING):
                return f"{path}.{name}: set on one side only"
            if p is not _MISSING:
                stack.append((p, q, f"{path}.{name}"))
        if not structured and repr(x) != repr(y):
            return f"{path}: {x!r} != {y!r}"
    return None


def _outcome(unflatten: Callable, spec: TreeSpec, n: int) -> tuple[Any, Any]:
    try:
        return unflatten(spec, list(range(n))), None
    except Exception as e:
        return None, e


def compare_engines(spec: TreeSpec, engines: Any = None) -> tuple[Optional[str], str]:
    """(problem or None, what happened) for unflatten on the two engines."""
    if engines is None:
        if _speedups is None:
            return None, "C engine not built"
        engines = (_pure.unflatten, _speedups.unflatten)
    n = spec.num_leaves
    (ra, ea), (rb, eb) = (_outcome(f, spec, n) for f in engines)
    if ea is None and eb is None:
        diff = tree_diff(ra, rb)
        return (None if diff is None else f"engines build different trees: {diff}"), "built"
    if ea is None or eb is None or type(ea) is not type(eb):
        names = [("ok" if e is None else f"{type(e).__name__}: {e}")[:300] for e in (ea, eb)]
        return f"engines differ: pure {names[0]} / C {names[1]}", "differ"
    note = "" if str(ea) == str(eb) else " (messages differ)"
    if not any(node[0] in (CUSTOM, RULE) for node in spec._nodes):
        # Only user code (a protocol class, a rule) may fail to build a spec.
        return f"no engine can build it: {type(ea).__name__}: {str(ea)[:300]}", "raise"
    return None, f"both raise {type(ea).__name__}{note}"


@dataclasses.dataclass
class Result:
    outcome: str  # "accepted", "rejected" or "failure"
    problems: list
    detail: str = ""  # for failures: the traceback; else what unflatten did


def check_document(
    data: Any,
    allow: Any = ALLOW,
    rules: Any = RULES,
    from_json: Callable = TreeSpec.from_json,
    engines: Any = None,
) -> Result:
    """Run ``from_json`` on one document and check the contract."""
    spec: Any = None
    error: Optional[BaseException] = None
    recorder = ImportRecorder()
    with recorder:
        try:
            spec = from_json(data, allow=allow, rules=rules)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            error = e
    problems = recorder.problems()
    if error is not None:
        if isinstance(error, ValueError):
            return Result("failure" if problems else "rejected", problems, "")
        tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        problems.append(f"raised {type(error).__name__}: {str(error)[:300]}")
        return Result("failure", problems, tb[-3000:])
    if type(spec) is not TreeSpec:
        problems.append(f"returned a {type(spec).__name__}, not a TreeSpec")
        return Result("failure", problems)
    step = "to_json"
    what = ""
    try:
        text = spec.to_json()
        step = "from_json of to_json"
        back = from_json(text, allow=allow, rules=rules)
        step = "the round trip"
        if back.to_json() != text:
            problems.append("to_json of the spec read back is other text")
        if back != spec or hash(back) != hash(spec):
            problems.append("the spec read back from to_json is not equal to it")
        stars = sum(1 for node in json.loads(text)["nodes"] if node == "*")
        if not spec.num_leaves == stars == json.loads(text)["num_leaves"]:
            problems.append(f"num_leaves {spec.num_leaves} but {stars} leaves")
        step = "repr"
        repr(spec)
        step = "hash"
        hash(spec)
        step = "unflatten"
        problem, what = compare_engines(spec, engines)
        if problem:
            problems.append(problem)
    except Exception as e:
        problems.append(f"accepted, but {step} raised {type(e).__name__}: {str(e)[:300]}")
        what = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
    return Result("failure" if problems else "accepted", problems, what)


# --------------------------------------------------------------------------
# runs


@dataclasses.dataclass
class Summary:
    docs: int = 0
    accepted: int = 0
    rejected: int = 0
    failures: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    forms: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    unflatten: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    slowest: tuple = (0.0, -1)

    def add(self, other: Summary) -> None:
        self.docs += other.docs
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.failures += other.failures
        self.ops.update(other.ops)
        self.forms.update(other.forms)
        self.unflatten.update(other.unflatten)
        self.slowest = max(self.slowest, tuple(other.slowest))

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["slowest"] = list(self.slowest)
        return out

    @classmethod
    def from_json(cls, d: dict) -> Summary:
        s = cls(**d)
        s.ops, s.forms = collections.Counter(s.ops), collections.Counter(s.forms)
        s.unflatten, s.slowest = collections.Counter(s.unflatten), tuple(s.slowest)
        return s


def show(data: Any, limit: int = 400) -> str:
    text = repr(data)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} ... {text[-limit // 2 :]} ({len(data)} {type(data).__name__})"


def failure_record(doc: Document, result: Result, limit: int = 400) -> dict:
    return {
        "seed": doc.seed,
        "index": doc.index,
        "base": doc.base,
        "ops": doc.ops,
        "form": doc.form,
        "allow": "all" if doc.allow is ALLOW else f"{len(doc.allow)} classes",
        "problems": result.problems,
        "detail": result.detail,
        "document": show(doc.data, limit),
    }


def render_failure(f: dict) -> str:
    lines = [f"FAILURE seed={f['seed']} index={f['index']}: {'; '.join(f['problems'])}"]
    if "base" in f:
        lines += [
            f"  from {f['base']!r} by {', '.join(f['ops'])}, as {f['form']}, allow={f['allow']}",
            f"  again: python scripts/fuzz_json.py --seed {f['seed']} --index {f['index']}",
            f"  document: {f['document']}",
        ]
    if f.get("detail"):
        lines += ["  " + line for line in f["detail"].rstrip().splitlines()[-12:]]
    return "\n".join(lines)


def save(doc: Document, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    data = doc.data
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    Path(directory, f"seed{doc.seed}-index{doc.index}.json").write_bytes(bytes(data))


def fuzz(
    docs: int,
    seed: int = 0,
    start: int = 0,
    *,
    from_json: Callable = TreeSpec.from_json,
    on_failure: Optional[Callable[[dict], None]] = None,
    trace: Optional[Callable[[int, Summary], None]] = None,
    save_dir: Optional[str] = None,
) -> Summary:
    """Check documents ``start .. start+docs-1`` of ``seed``; the core of the script."""
    summary = Summary()
    t0 = time.perf_counter()
    unimported = [m for m in NEVER_IMPORTED if m not in sys.modules]
    for index in range(start, start + docs):
        if trace is not None:
            trace(index, summary)
        doc = make_document(seed, index)
        t1 = time.perf_counter()
        result = check_document(doc.data, doc.allow, doc.rules, from_json=from_json)
        took = time.perf_counter() - t1
        summary.slowest = max(summary.slowest, (took, index))
        summary.docs += 1
        summary.ops.update(doc.ops)
        summary.forms[doc.form] += 1
        if result.outcome == "accepted":
            summary.accepted += 1
            summary.unflatten[result.detail] += 1
        elif result.outcome == "rejected":
            summary.rejected += 1
        else:
            record = failure_record(doc, result)
            summary.failures.append(record)
            if on_failure is not None:
                on_failure(record)
            if save_dir:
                save(doc, save_dir)
    imported = [m for m in unimported if m in sys.modules]
    if imported:  # the per-document checks should have caught it first
        summary.failures.append({"seed": seed, "index": -1, "problems": [f"imported {imported}"]})
    summary.seconds = time.perf_counter() - t0
    return summary


def print_summary(s: Summary, seed: int) -> None:
    ops = ", ".join(f"{k} {v}" for k, v in sorted(s.ops.items()))
    print(f"mutations applied: {ops}")
    print(f"inputs: {dict(sorted(s.forms.items()))}")
    print(f"accepted specs, unflatten on both engines: {dict(s.unflatten.most_common())}")
    print(f"slowest document: index {s.slowest[1]}, {s.slowest[0] * 1000:.1f} ms")
    print(
        f"fuzz_json seed={seed}: {s.docs} documents, {s.accepted} accepted, "
        f"{s.rejected} rejected with ValueError, {len(s.failures)} failures, "
        f"{s.seconds:.1f} s"
    )


# --------------------------------------------------------------------------
# a child process per run, so that a crash is reported and the run goes on


def _worker(args: argparse.Namespace) -> int:
    faulthandler.enable()
    fd = os.open(args.trace_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    failures = open(args.failures_file, "a", encoding="utf-8")

    def trace(index: int, s: Summary) -> None:
        line = json.dumps([index, s.docs, s.accepted, s.rejected, len(s.failures)])
        os.pwrite(fd, line.ljust(200).encode(), 0)
        if index == args.crash_at:  # --self-test: a crash must be caught
            faulthandler.disable()
            faulthandler._sigsegv()  # type: ignore[attr-defined]
        if s.docs and s.docs % 1000 == 0:
            print(f"  {args.start + s.docs} documents ...", flush=True)

    def on_failure(record: dict) -> None:
        print(render_failure(record), flush=True)
        failures.write(json.dumps(record) + "\n")
        failures.flush()

    s = fuzz(
        args.docs,
        args.seed,
        args.start,
        on_failure=on_failure,
        trace=trace,
        save_dir=args.save,
    )
    failures.close()
    Path(args.result_file).write_text(json.dumps(s.to_json()))
    os.pwrite(fd, json.dumps([-1, s.docs, 0, 0, 0]).ljust(200).encode(), 0)  # all done
    return 0


def supervise(args: argparse.Namespace, quiet: bool = False) -> Summary:
    """Run the documents in child processes; a crash is a failure, then the
    next child goes on after the document that crashed."""
    total = Summary()
    t0 = time.perf_counter()
    start, end = args.start, args.start + args.docs
    with tempfile.TemporaryDirectory(prefix="fuzz_json-") as tmp:
        trace, result, fails = (os.path.join(tmp, n) for n in ("trace", "result", "failures"))
        while start < end:
            cmd = [sys.executable, __file__, "--worker", "--docs", str(end - start)]
            cmd += ["--seed", str(args.seed), "--start", str(start), "--trace-file", trace]
            cmd += ["--result-file", result, "--failures-file", fails]
            cmd += ["--crash-at", str(args.crash_at)] + (["--save", args.save] if args.save else [])
            proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL if quiet else None)
            if proc.returncode == 0 and os.path.exists(result):
                part = Summary.from_json(json.loads(Path(result).read_text()))
                part.failures = []  # printed and kept in the failures file
                total.add(part)
                break
            # The child died: the trace file names the document it was on.
            state = Path(trace).read_text() if os.path.exists(trace) else ""
            if not state.strip():
                raise RuntimeError(f"the worker failed before any document ({proc.returncode})")
            index, done, accepted, rejected, _ = json.loads(state)
            if index < 0:
                raise RuntimeError(f"the worker failed after its documents ({proc.returncode})")
            total.add(Summary(docs=done + 1, accepted=accepted, rejected=rejected))
            doc = make_document(args.seed, index)
            problem = f"the process died (exit status {proc.returncode}) on this document"
            record = failure_record(doc, Result("failure", [problem]))
            if not quiet:
                print(render_failure(record), flush=True)
            with open(fails, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if args.save:
                save(doc, args.save)
            start = index + 1
        if os.path.exists(fails):
            lines = Path(fails).read_text(encoding="utf-8").splitlines()
            total.failures = [json.loads(line) for line in lines]
    total.seconds = time.perf_counter() - t0
    return total


# --------------------------------------------------------------------------
# self-test: the detectors detect


def _unimported_module() -> str:
    for name in ("colorsys", "netrc", "tabnanny", "graphlib", "zipapp", "wave"):
        if name not in sys.modules:
            return name
    raise RuntimeError("no unimported standard module left for the self-test")


def then(action: Callable[[], Any]) -> Callable:
    """A from_json that does ``action`` first (for checking the detectors)."""

    def from_json(text: Any, **kw: Any) -> Any:
        action()
        return TreeSpec.from_json(text, **kw)

    return from_json


def raises(exc: BaseException) -> Callable:
    """A from_json that raises ``exc`` (for checking the detectors)."""

    def from_json(text: Any, **kw: Any) -> Any:
        raise exc

    return from_json


def self_test() -> list:
    """Problems with the detectors (empty when each one fires where it must and
    stays quiet where it must)."""
    good = pk.structure({"b": [1, (2, None)], "a": 0}).to_json()
    real_import, real_import_module = builtins.__import__, importlib.import_module
    problems: list = []

    def expect(name: str, result: Result, outcome: str, word: str = "") -> None:
        text = " ".join(result.problems)
        if result.outcome != outcome or word not in text:
            problems.append(f"{name}: got {result.outcome} {result.problems}, want {outcome}")
        if builtins.__import__ is not real_import or importlib.import_module is not (
            real_import_module
        ):
            problems.append(f"{name}: the import hooks were not restored")

    def fake_module() -> None:
        sys.modules["_fuzz_json_fake"] = types.ModuleType("_fuzz_json_fake")

    fresh = _unimported_module()
    expect("valid document", check_document(good), "accepted")
    expect("garbage", check_document(b"\xff{"), "rejected")
    expect(
        "__import__ call",
        check_document(good, from_json=then(lambda: __import__("json"))),
        "failure",
        "__import__('json'",
    )
    call = then(lambda: importlib.import_module("json"))
    expect("import_module call", check_document(good, from_json=call), "failure", "import_module")
    expect(
        "sys.modules",
        check_document(good, from_json=then(fake_module)),
        "failure",
        "_fuzz_json_fake",
    )
    sys.modules.pop("_fuzz_json_fake", None)
    call = then(lambda: importlib.import_module(fresh))
    expect("real import", check_document(good, from_json=call), "failure", fresh)
    if fresh not in sys.modules:
        problems.append(f"real import: {fresh} was not imported, the check proves nothing")
    for exc in (TypeError("t"), RecursionError("r"), KeyError("k"), MemoryError()):
        expect(
            type(exc).__name__,
            check_document(good, from_json=raises(exc)),
            "failure",
            type(exc).__name__,
        )
    expect(
        "ValueError subclass",
        check_document(good, from_json=raises(UnicodeDecodeError("utf-8", b"", 0, 1, "x"))),
        "rejected",
    )

    def not_a_spec(text: Any, **kw: Any) -> Any:
        return json.loads(text)

    expect(
        "not a TreeSpec", check_document(good, from_json=not_a_spec), "failure", "not a TreeSpec"
    )
    broken = TreeSpec._make(((99, None, 0, None),), (), 0)
    expect(
        "unusable spec",
        check_document(good, from_json=lambda text, **kw: broken),
        "failure",
        "accepted, but",
    )
    lying = (_pure.unflatten, lambda spec, leaves: _pure.unflatten(spec, leaves[::-1]))
    expect(
        "engines build different trees", check_document(good, engines=lying), "failure", "engines"
    )
    other_error = (_pure.unflatten, raises(TypeError("x")))
    expect("one engine raises", check_document(good, engines=other_error), "failure", "engines")
    for a, b in [
        ([0], (0,)),
        ({1: 2}, {1: 3}),
        (deque(maxlen=1), deque(maxlen=2)),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (defaultdict(list), defaultdict(int)),
        (tj.Plain(1, 2), tj.Plain(1, 3)),
    ]:
        if tree_diff(a, b) is None:
            problems.append(f"tree_diff found no difference between {a!r} and {b!r}")
    if tree_diff(tj.Plain(1, [2]), tj.Plain(1, [2])) is not None:
        problems.append("tree_diff found a difference between equal trees")
    return problems


def crash_self_test() -> list:
    """A document that kills the process is reported as a failure, and the run
    goes on with the next document."""
    args = argparse.Namespace(seed=0, start=0, docs=3, crash_at=1, save=None)
    s = supervise(args, quiet=True)
    if [f["index"] for f in s.failures] != [1] or s.docs != 3:
        return [f"a crash at document 1 was not reported as its failure: {s.failures}, {s.docs}"]
    return []


# --------------------------------------------------------------------------


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, default=10_000, help="how many documents (10,000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the run (0)")
    ap.add_argument("--start", type=int, default=0, help="first document index (0)")
    ap.add_argument("--index", type=int, default=None, help="show and check one document")
    ap.add_argument("--save", default=None, help="write each failing document to this folder")
    ap.add_argument("--self-test", action="store_true", help="check that the detectors detect")
    ap.add_argument("--in-process", action="store_true", help="no child process (no crash report)")
    for hidden in ("--trace-file", "--result-file", "--failures-file"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--crash-at", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        return _worker(args)
    if args.self_test:
        problems = self_test() + crash_self_test()
        for p in problems:
            print(f"SELF-TEST FAILED: {p}")
        print(f"self-test: {'ok' if not problems else f'{len(problems)} problems'}")
        return 1 if problems else 0
    if args.index is not None:
        doc = make_document(args.seed, args.index)
        result = check_document(doc.data, doc.allow, doc.rules)
        print(f"seed={doc.seed} index={doc.index}: {doc.base!r} by {', '.join(doc.ops)}")
        print(f"as {doc.form}, allow: {len(doc.allow)} classes, rules: {len(doc.rules or ())}")
        print(f"document: {show(doc.data, 4000)}")
        print(f"outcome: {result.outcome} {'; '.join(result.problems)}")
        if result.detail:
            print(result.detail)
        if args.save:
            save(doc, args.save)
        return 1 if result.outcome == "failure" else 0
    if args.in_process:
        s = fuzz(
            args.docs,
            args.seed,
            args.start,
            on_failure=lambda r: print(render_failure(r), flush=True),
            save_dir=args.save,
        )
    else:
        s = supervise(args)
    print_summary(s, args.seed)
    return 1 if s.failures else 0


if __name__ == "__main__":
    sys.exit(main())
