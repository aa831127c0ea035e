"""scripts/torch_matrix.py: what it counts, and the table it writes.

The matrix itself installs a torch per cell (hours); these check its parts:
every test of its files counts under a feature, junit XML is read into
passed / failed / skipped, and docs/compatibility.md holds the table the
recorded results give.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# scripts/torch_matrix.py's parts: the same on every engine and Python (once: 3.11's
# C-engine job runs them)
pytestmark = pytest.mark.once


@pytest.fixture(scope="module")
def tm():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("torch_matrix", ROOT / "scripts/torch_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _test_names(path: Path) -> list:
    tree = ast.parse(path.read_text())
    return [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]


def test_every_test_of_the_matrix_files_counts_under_a_feature(tm):
    seen = set()
    for name in tm.TEST_FILES:
        for test in _test_names(ROOT / name):
            seen.add(tm.feature_of(f"{name}::{test}"))
    assert seen == set(tm.FEATURES)
    with pytest.raises(ValueError, match="not a test of the matrix"):
        tm.feature_of("tests/test_engines.py::test_x")


def test_junit_is_read_into_counts(tm):
    xml = """<testsuites><testsuite>
    <testcase classname="tests.test_dynamo" name="test_a[dict]"/>
    <testcase classname="tests.test_dynamo" name="test_b"><failure message="x"/></testcase>
    <testcase classname="tests.torch.test_tracing" name="test_export_x"><skipped/></testcase>
    <testcase classname="tests.torch.test_tracing" name="test_trace_y"><error message="e"/></testcase>
    </testsuite></testsuites>"""
    got = tm.read_junit(xml)
    assert got["torch.compile"] == {
        "passed": 1, "failed": 1, "skipped": 0, "failures": ["tests/test_dynamo.py::test_b"]
    }  # fmt: skip
    assert got["torch.export"]["skipped"] == 1
    assert got["jit.trace"]["failed"] == 1


def test_the_table_marks_failures_and_counts_runs(tm):
    feats = {f: {"passed": 3, "failed": 0, "skipped": 1, "failures": []} for f in tm.FEATURES}
    bad = dict(feats, checkpoint={"passed": 2, "failed": 1, "skipped": 0, "failures": ["t"]})
    table = tm.render(
        {
            "3.11/2.9": {"python": "3.11.7", "torch": "2.9.1", "features": feats},
            "3.11/2.10": {
                "python": "3.11.7",
                "torch": "2.10.0",
                "features": bad,
                "commit": "c0ffee1",
            },
        }
    )
    rows = [line for line in table.splitlines() if line.startswith("| 3.11")]
    assert [r.split(" | ")[1] for r in rows] == ["2.9.1", "2.10.0"]  # by version, not text
    assert rows[0].count("3 / 3") == len(tm.FEATURES) and "✗" not in rows[0]
    assert rows[1].endswith("| 2 / 3 ✗ |")
    # the commit each row tested stays in the results, off the page
    assert "c0ffee1" not in table


def test_the_compatibility_page_is_what_the_results_give(tm):
    text = tm.PAGE.read_text()
    start, end = text.index(tm.BEGIN) + len(tm.BEGIN), text.index(tm.END)
    assert text[start:end].strip() == tm.render(tm.load()).strip(), (
        "docs/compatibility.md is not what benchmarks/results/torch_matrix.json gives: "
        "run python3 scripts/torch_matrix.py --table"
    )
    # and the versions table in each install section
    for page, wanted in tm.pages_for(tm.load()).items():
        assert page.read_text() == wanted, (
            f"{page.name}'s versions table is not what the results give: "
            "run python3 scripts/torch_matrix.py --table"
        )


def test_the_versions_table_marks_each_pair(tm, ci):
    ok = {f: {"passed": 3, "failed": 0, "skipped": 0, "failures": []} for f in tm.FEATURES}
    bad = dict(ok, checkpoint={"passed": 2, "failed": 1, "skipped": 0, "failures": ["t"]})
    grid = tm.render_grid(
        {
            "a": {"python": "3.11.7", "torch": "2.9.1", "features": ok},
            "b": {"python": "3.13.0", "torch": "2.15.0", "features": bad},
        }
    )
    rows = {
        r.split(" | ")[0][2:]: r.split(" | ")[1:] for r in grid.splitlines() if r.startswith("| 3.")
    }
    assert list(rows) == list(ci.VERSIONS)  # every supported Python, in order
    column = {m: i for i, m in enumerate(tm.TORCH)}
    assert rows["3.11"][column["2.9"]] == "✓" and rows["3.13"][column["2.15"]].startswith("✗")
    assert rows["3.10"][column["2.9"]] == "·" and rows["3.11"][column["2.10"]] == "·"
