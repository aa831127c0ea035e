"""The README's example runs, and CI runs exactly the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has a python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["leaves"] == ["img0", "img1", "b0", "l0", "b1", "l1"]


def test_readme_example_is_at_most_20_lines():
    block = re.findall(r"```python\n(.*?)```", README, flags=re.S)[0]
    assert len(block.strip().splitlines()) <= 20


def test_ci_runs_the_readme_test_command():
    command = re.search(r"<!-- test-command -->\n```sh\n(.*?)\n```", README).group(1)
    assert command == "python3 scripts/ci.py"  # the matrix: pytest on every Python, both engines
    matrix = (ROOT / "scripts" / "ci.py").read_text()
    assert '"-m", "pytest"' in matrix and 'PYTREE_KIT_PURE": "1"' in matrix
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci  # .ci/run reads the command from the README


def test_readme_is_a_landing_page_under_1500_words():
    assert len(README.split()) < 1500
    # its one chart is the one benchmarks/report.py draws
    charts = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", README)
    assert charts == ["docs/assets/bench-summary.png"]
    assert (ROOT / charts[0]).exists()


def test_every_yes_of_the_feature_table_links_to_its_page():
    table = README[README.index("| | pytree_kit | jax.tree_util") :].split("\n\n")[0]
    header, _, *rows = table.splitlines()
    assert [c.strip() for c in header.strip("|").split("|")][1:] == [
        "pytree_kit", "jax.tree_util", "optree", "torch.utils._pytree", "dm-tree", "tensordict",
    ]  # fmt: skip
    assert len(rows) >= 8
    for row in rows:
        ours = row.strip("|").split("|")[1].strip()
        link = re.match(r"\[yes\]\((docs/[^)#]+)(#[^)]*)?\)", ours)
        assert link, row
        assert (ROOT / link.group(1)).exists(), row


def test_the_home_page_has_the_readmes_comparison_table() -> None:
    """The docs' home page and the README compare the same way (links are
    relative to docs/ on the home page)."""
    import re

    def table(text: str) -> list:
        start = text.index("| | pytree_kit | jax.tree_util")
        rows = text[start:].split("\n\n", 1)[0].splitlines()
        return [re.sub(r"\]\((?:docs/)?([^)]*)\)", r"](\1)", row) for row in rows]

    root = Path(__file__).resolve().parent.parent
    readme = table((root / "README.md").read_text())
    home = table((root / "docs" / "index.md").read_text())
    assert "tensordict" in readme[0] and len(readme) > 8
    assert home == readme
