"""Every ```python block of every page under docs/ runs, and its asserts hold
(scripts/docs_examples.py runs them).

One test per Markdown file (found recursively, so new pages are picked up): its
``python`` blocks run in order in one shared namespace, a fresh module per
file. Blocks fenced as anything else (``text``, ``py-norun``, ``sh``, ...) do
not run. A page that imports an optional peer (jax, optree, torch, ...) that
is not installed is skipped. The README has its own test (test_readme.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
# the runner itself: stdlib only, for CI's venvs that hold one extra and no pytest
import docs_examples  # noqa: E402
from docs_examples import DOCS, python_blocks  # noqa: E402

#: exit status of run_page's subprocess for a page that needs a missing peer
SKIPPED = 3


@pytest.mark.parametrize("page", docs_examples.pages())
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
    """Run the page's python blocks in order, in one fresh module (skipped
    when it needs an optional module that is not installed)."""
    try:
        docs_examples.run_page(page)
    except docs_examples.Skipped as e:
        pytest.skip(str(e))


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


def test_each_extra_alone_has_the_pages_it_can_run() -> None:
    """CI's "extras alone" job runs these in venvs holding one extra each."""
    of = {extra: set(docs_examples.pages_of(extra)) for extra in docs_examples.EXTRAS}
    assert {"quickstart.md", "concepts.md", "index.md"} <= of["core"]
    assert of["testing"] == {"testing.md"}
    assert {"checkpoint.md", "loading.md", "datasets.md"} <= of["torch"]
    # a page that needs a peer beside torch is no extra's alone
    assert "ecosystem.md" not in set().union(*of.values())
    assert not of["core"] & of["torch"] and not of["core"] & of["testing"]
