"""Every ```python block of every page under docs/ runs, and its asserts hold.

One test per Markdown file (found recursively, so new pages are picked up): its
``python`` blocks run in order in one shared namespace, a fresh module per
file. Blocks fenced as anything else (``text``, ``py-norun``, ``sh``, ...) do
not run. A page that imports an optional peer (jax, optree, torch, ...) that
is not installed is skipped. The README has its own test (test_readme.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: Modules a page may import that the package itself does not need.
OPTIONAL = frozenset(
    {"attrs", "jax", "jaxlib", "numpy", "optree", "tensordict", "torch", "transformers", "tree"}
)

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*?)[ \t]*$")


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


def _pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


#: exit status of run_page's subprocess for a page that needs a missing peer
SKIPPED = 3


@pytest.mark.parametrize("page", _pages())
def test_page_examples_run(page: str) -> None:
    path = DOCS / page
    text = path.read_text(encoding="utf-8")
    if not python_blocks(text):
        pytest.skip(f"docs/{page} has no python blocks")
    if "init_process_group" not in text and "<!-- fresh-process" not in text:
        run_page(page)
        return
    # A page that starts gloo process groups runs in a fresh process, under a
    # timeout: see the repository's conftest.py for the deadlock it avoids. So
    # does a page marked <!-- fresh-process: why -->, whose examples change
    # global state (another library's registrations).
    out = subprocess.run(
        [sys.executable, "-c", f"from tests.test_docs_examples import main; main({page!r})"],
        cwd=DOCS.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if out.returncode == SKIPPED:
        pytest.skip(out.stdout.strip())
    assert out.returncode == 0, out.stdout + out.stderr


def main(page: str) -> None:
    """run_page in a process of its own: exit status 0, SKIPPED, or an exception."""
    try:
        run_page(page)
    except pytest.skip.Exception as e:
        print(e)
        sys.exit(SKIPPED)


def run_page(page: str) -> None:
    """Run the page's python blocks in order, in one fresh module."""
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
                    pytest.skip(f"docs/{page} needs {top}, which is not installed")
                raise
    finally:
        del sys.modules[name]


def test_python_blocks_are_found_with_their_line_numbers() -> None:
    text = "\n".join(
        [
            "# Title",  # 1
            "```python",  # 2
            "a = 1",  # 3
            "```",  # 4
            "```text",  # 5
            "not = run",  # 6
            "```",  # 7
            "- item",  # 8
            "",  # 9
            "    ````python",  # 10
            "    b = [",  # 11
            "        2]",  # 12
            "    ````",  # 13
            "```py-norun",  # 14
            "```python",  # 15
            "```",  # 16
        ]
    )
    assert python_blocks(text) == [(3, "a = 1\n"), (11, "b = [\n    2]\n")]
