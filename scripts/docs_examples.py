#!/usr/bin/env python3
"""Runs the ```python blocks of the docs pages, with nothing but the standard
library and what the pages import (tests/test_docs_examples.py runs every page
through it under pytest; CI's "extras alone" job runs it in venvs that hold
one extra each, where pytest is not installed).

    python3 scripts/docs_examples.py                  # every page
    python3 scripts/docs_examples.py --extra torch    # the pages the torch extra alone runs

A page's blocks run in order in one shared namespace, a fresh module per page.
Blocks fenced as anything else (``text``, ``py-norun``, ``sh``, ...) do not
run. A page that imports an optional module (``OPTIONAL``) that is not
installed is skipped, saying which.

``--extra NAME`` picks the pages whose imports, outside the standard library
and pytree_kit, are all provided by that extra alone (``EXTRAS``; ``core`` is
no extra), and that import something it provides: a page that needs
numpy as well as torch is not the torch extra's. There, a skip is a failure:
the extra must provide what its pages import. The exit status is 0 when every
page run passed (and, with ``--extra``, at least one ran and none skipped).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import types
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: Modules a page may import that the package itself does not need.
OPTIONAL = frozenset(
    {
        "accelerate", "attrs", "hypothesis", "jax", "jaxlib", "lightning", "lightning_utilities",
        "numpy", "optree", "tensordict", "torch", "transformers", "tree",
    }
)  # fmt: skip
#: what each extra installed alone provides (pyproject.toml's extras), and
#: "core", none; a page belongs to an extra when its optional imports are
#: within it and meet what the extra adds
EXTRAS = {"core": frozenset(), "testing": frozenset({"hypothesis"}), "torch": frozenset({"torch"})}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*?)[ \t]*$")


class Skipped(Exception):
    """A page needs an optional module that is not installed."""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number of the block's first line, source)`` for each ```python block."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        lang = m["info"].split()[0].lstrip(".").lower() if m["info"].split() else ""
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if (
                close
                and not close["info"]
                and close["fence"][0] == fence[0]
                and len(close["fence"]) >= len(fence)
            ):
                break
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        if lang == "python":
            first = i - len(body) + 1  # 1-based number of the block's first line
            blocks.append((first, "\n".join(body) + "\n"))
        i += 1
    return blocks


def pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


#: pytree_kit's modules that need an optional one
NEEDS = {"pytree_kit.torch": "torch", "pytree_kit.testing": "hypothesis"}


def imports(page: str) -> set:
    """The top-level modules a page's python blocks import (pytree_kit.torch
    counting as torch, pytree_kit.testing as hypothesis)."""
    names: set = set()
    for _, source in python_blocks((DOCS / page).read_text(encoding="utf-8")):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                if node.module == "pytree_kit":  # from pytree_kit import torch
                    names.update(f"pytree_kit.{a.name}" for a in node.names)
    out = {n.partition(".")[0] for n in names}
    for name in names:
        for module, needs in NEEDS.items():
            if name == module or name.startswith(module + "."):
                out.add(needs)
    return out


def pages_of(extra: str) -> list[str]:
    """The pages whose optional imports the extra alone provides, and that
    need what it adds (for core: the pages with no optional import)."""
    provides = EXTRAS[extra]
    chosen = []
    for page in pages():
        if not python_blocks((DOCS / page).read_text(encoding="utf-8")):
            continue
        third_party = {m for m in imports(page) if m not in sys.stdlib_module_names}
        third_party -= {"pytree_kit"}
        if third_party <= provides and (third_party & provides or not provides):
            chosen.append(page)
    return chosen


def run_page(page: str) -> None:
    """Run the page's python blocks in order, in one fresh module; raises
    Skipped when it needs an optional module that is not installed."""
    path = DOCS / page
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    name = "_docs_" + re.sub(r"\W", "_", page)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # so that pickle and dataclasses find the page's classes
    try:
        for first_line, source in blocks:
            # Leading newlines put every line, in tracebacks too, at its line in the page.
            code = compile("\n" * (first_line - 1) + source, str(path), "exec")
            try:
                exec(code, module.__dict__)
            except ModuleNotFoundError as e:
                top = (e.name or "").partition(".")[0]
                if top in OPTIONAL:
                    raise Skipped(f"docs/{page} needs {top}, which is not installed") from e
                raise
    finally:
        del sys.modules[name]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", choices=sorted(EXTRAS), help="only the pages of this extra")
    parser.add_argument("pages", nargs="*", help="pages under docs/ (default: all)")
    args = parser.parse_args()
    chosen = args.pages or (pages_of(args.extra) if args.extra else pages())
    failed = skipped = passed = 0
    for page in chosen:
        try:
            run_page(page)
        except Skipped as e:
            skipped += 1
            print(f"skipped {page}: {e}", flush=True)
        except BaseException as e:  # a page's failure is reported, the others go on
            failed += 1
            print(f"FAILED  {page}: {type(e).__name__}: {e}", flush=True)
            import traceback

            traceback.print_exc()
        else:
            passed += 1
            print(f"passed  {page}", flush=True)
    print(f"docs examples{f' ({args.extra} alone)' if args.extra else ''}: "
          f"{passed} passed, {failed} failed, {skipped} skipped")  # fmt: skip
    if failed or (args.extra and (skipped or not passed)):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
