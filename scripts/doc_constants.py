"""The implementation constants the docs quote, read from the code, and the check
that every quote says what the code has.

A page quotes a constant in one of two ways, and both are checked:

- by name, in backticks, with its value after it in parentheses or after
  ``is``: ``COALESCE_MIN`` (16), ``STAGE_LIMIT`` is 1,048,576 B;
- in prose, with the value between markers that name it (HTML comments,
  which no renderer shows): ``<!--c:SMALL_DICT-->32<!--/c--> keys``.

Values are read from the source, never imported from a build: a C
``#define`` from ``pytree_kit/*.c`` and ``*.h`` (an int, or an expression of
ints and shifts), a module-level int of a Python file (its assignment, read
with ``ast``), the supported Pythons from ``pyproject.toml``'s classifiers.
A quote is read as an int (``1,024``, ``16 KiB``, ``1 MiB``, ``16,384 B``) or
as a range of Pythons (``3.10 to 3.15``, ``3.10-3.15``), and must equal the
value. ``--write`` puts each marked quote's value from the code, in the unit
the page used; a quote by name is the page's own prose and is only checked.

    python scripts/doc_constants.py            # check README.md and docs/
    python scripts/doc_constants.py --write    # mend the marked quotes

``tests/test_doc_constants.py`` runs the check and shows it failing on a
wrong value, an unknown name and an unreadable quote.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "pytree_kit"

Value = Union[int, tuple]  # an int, or a range of Pythons ((3, 10), (3, 15))


def c_define(name: str) -> int:
    """The value of ``#define name ...`` in the C sources: one definition, an
    int expression of literals, shifts and other defines read the same way."""
    found = []
    for path in sorted(PKG.glob("*.[ch]")):
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(rf"\s*#\s*define\s+{name}\s+(.+?)\s*(/\*.*)?$", line)
            if m:
                found.append(m.group(1))
    if len(set(found)) != 1:
        raise LookupError(f"#define {name}: {len(set(found))} distinct definitions")
    expr = re.sub(r"\b([A-Z][A-Z0-9_]+)\b", lambda m: str(c_define(m.group(1))), found[0])
    if not re.fullmatch(r"[\d\s()<>+*-]+", expr):
        raise LookupError(f"#define {name}: not an int expression: {found[0]}")
    return int(eval(expr, {"__builtins__": {}}))  # (digits, spaces, shifts: checked above)


def _assigned(relpath: str, name: str) -> ast.expr:
    """The value of a module-level ``name = ...`` of a Python file."""
    tree = ast.parse((ROOT / relpath).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node.value
    raise LookupError(f"{relpath}: no {name} = ...")


def py_int(relpath: str, name: str) -> int:
    """A module-level ``name = <int expression>`` of a Python file."""
    return int(eval(compile(ast.Expression(_assigned(relpath, name)), relpath, "eval"), {}))


def py_value(relpath: str, name: str) -> object:
    """A module-level literal (``ast.literal_eval``) of a Python file."""
    return ast.literal_eval(_assigned(relpath, name))


def supported_pythons() -> tuple:
    """The first and last CPython of pyproject.toml's classifiers."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', text)
    minors = sorted(int(m) for m in found)
    return ((3, minors[0]), (3, minors[-1]))


#: every constant a page may quote: its name (as the code spells it, or a
#: name for a value derived from the code) and how to read it
CONSTANTS: dict[str, Callable[[], Value]] = {
    # the C engine (pytree_kit/_core.h and its parts)
    "SMALL_DICT": lambda: c_define("SMALL_DICT"),
    "BIG_DICT": lambda: c_define("BIG_DICT"),
    "DICT_ORDER_SETS": lambda: 1 << c_define("DICT_ORDER_SET_BITS"),
    "DICT_ORDER_WAYS": lambda: c_define("DICT_ORDER_WAYS"),
    "DICT_ORDER_MISSES": lambda: c_define("DICT_ORDER_MISSES"),
    "PLAN_SETS": lambda: 1 << c_define("PLAN_SET_BITS"),
    "PLAN_WAYS": lambda: c_define("PLAN_WAYS"),
    "KEPT_SETS": lambda: 1 << c_define("KEPT_SET_BITS"),
    "KEPT_WAYS": lambda: c_define("KEPT_WAYS"),
    "RECIPE_MAX_NODES": lambda: c_define("RECIPE_MAX_NODES"),
    "SPLIT_READ_MAX": lambda: c_define("SPLIT_READ_MAX"),
    "SPARE_MAX": lambda: c_define("SPARE_MAX"),
    "SPARE_PER_SIZE": lambda: c_define("SPARE_PER_SIZE"),
    "SHARED_SEQ_NODES": lambda: c_define("SHARED_SEQ_NODES"),
    # the torch adapters
    "COALESCE_MIN": lambda: py_int("pytree_kit/torch/_transfer.py", "COALESCE_MIN"),
    "NO_DMA_COALESCE_MIN": lambda: py_int("pytree_kit/torch/_transfer.py", "NO_DMA_COALESCE_MIN"),
    "NO_DMA_STAGE_LIMIT": lambda: py_int("pytree_kit/torch/_transfer.py", "NO_DMA_STAGE_LIMIT"),
    "STAGE_LIMIT": lambda: py_int("pytree_kit/torch/_staging.py", "STAGE_LIMIT"),
    "PINNED_OWN": lambda: py_int("pytree_kit/torch/_staging.py", "PINNED_OWN"),
    "GATHER_UP_TO": lambda: py_int("pytree_kit/torch/_packed.py", "GATHER_UP_TO"),
    # the Pythons
    "SUPPORTED_PYTHONS": supported_pythons,
    "VALIDATED_PYTHONS": lambda: tuple(py_value("pytree_kit/_engine.py", "VALIDATED_PYTHONS")),  # type: ignore[arg-type]
}

UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
MARKER = re.compile(r"<!--c:([A-Za-z_][A-Za-z0-9_]*)-->(.*?)<!--/c-->")
# a name in backticks, then its value: `NAME` (16) or `NAME` is 1,048,576 B
BY_NAME = re.compile(
    r"`([A-Z][A-Z0-9_]+)`(?:'s)?\s*(?:\(|\s+is\s+)"
    r"(\d[\d,]*(?:\.\d+)?(?:\s*(?:KiB|MiB|GiB|B)\b)?(?:\s*(?:to|-)\s*3\.\d+)?)"
)


def parse(text: str) -> Value:
    """A quote's value: an int with an optional unit, or a range of Pythons."""
    t = text.strip()
    m = re.fullmatch(r"3\.(\d+)\s*(?:to|-|\u2013)\s*3\.(\d+)", t)
    if m:
        return ((3, int(m.group(1))), (3, int(m.group(2))))
    m = re.fullmatch(r"(\d[\d,]*)\s*(KiB|MiB|GiB|B)?", t)
    if not m or not re.fullmatch(r"\d{1,3}(,\d{3})*|\d+", m.group(1)):
        raise ValueError(f"not a quote of a value: {text!r}")
    return int(m.group(1).replace(",", "")) * UNITS[m.group(2) or ""]


def render(value: Value, like: str) -> str:
    """value written as the quote like was: its unit, its thousands commas,
    its range's dash."""
    if isinstance(value, tuple):
        sep = " to " if " to " in like else "-"
        return f"{value[0][0]}.{value[0][1]}{sep}{value[1][0]}.{value[1][1]}"
    m = re.fullmatch(r"\s*(\d[\d,]*)\s*(KiB|MiB|GiB|B)?\s*", like)
    unit = m.group(2) if m else None
    if unit and unit != "B" and value % UNITS[unit] == 0:
        n = value // UNITS[unit]
    else:
        n, unit = value, unit
    digits = f"{n:,}" if (m and "," in m.group(1)) or n >= 10_000 else str(n)
    return f"{digits} {unit}" if unit else digits


@dataclass
class Problem:
    path: str
    line: int
    name: str
    quoted: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name} quoted as {self.quoted!r}: {self.why}"


def values() -> dict[str, Value]:
    """Every constant's value, read from the code now."""
    return {name: read() for name, read in CONSTANTS.items()}


def check_text(text: str, path: str, have: dict[str, Value]) -> tuple[list[Problem], int]:
    """The problems of one page's quotes, and how many quotes it has."""
    problems: list[Problem] = []
    count = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        quotes = [(m.group(1), m.group(2), True) for m in MARKER.finditer(line)]
        quotes += [(m.group(1), m.group(2), False) for m in BY_NAME.finditer(line)]
        for name, quoted, marked in quotes:
            if name not in have:
                if marked:
                    problems.append(Problem(path, lineno, name, quoted, "no such constant"))
                continue  # (a name in backticks that is no constant of ours)
            count += 1
            try:
                got = parse(quoted)
            except ValueError as e:
                problems.append(Problem(path, lineno, name, quoted, str(e)))
                continue
            if got != have[name]:
                problems.append(
                    Problem(
                        path, lineno, name, quoted, f"the code has {render(have[name], quoted)}"
                    )
                )
    return problems, count


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def check(paths: list[Path] | None = None) -> tuple[list[Problem], int]:
    have = values()
    problems: list[Problem] = []
    count = 0
    for p in paths or pages():
        name = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
        found, n = check_text(p.read_text(encoding="utf-8"), name, have)
        problems += found
        count += n
    return problems, count


def write(paths: list[Path] | None = None) -> int:
    """Puts the code's value in every marked quote; the pages changed."""
    have = values()
    changed = 0
    for p in paths or pages():
        text = p.read_text(encoding="utf-8")

        def mend(m: re.Match) -> str:
            name, quoted = m.group(1), m.group(2)
            if name not in have:
                return m.group(0)
            return f"<!--c:{name}-->{render(have[name], quoted)}<!--/c-->"

        new = MARKER.sub(mend, text)
        if new != text:
            p.write_text(new, encoding="utf-8")
            changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="mend the marked quotes")
    args = ap.parse_args(argv)
    if args.write:
        print(f"doc_constants: {write()} page(s) mended")
    problems, count = check()
    for p in problems:
        print(p)
    print(f"doc_constants: {count} quotes of {len(CONSTANTS)} constants, {len(problems)} wrong")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
