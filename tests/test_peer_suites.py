"""scripts/peer_suites.py: the runner of the peers' own test files. Its
counts are checked on a small test file written here in a peer's style (the
peers' files are not in this repository), and each shim is checked to leave no
public function of its peer unmapped, so that no peer test passes by calling
the peer itself."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import peer_suites  # noqa: E402

# a script of the developer's, run on one Python: its counts are the same on
# every engine and Python (once: 3.11's C-engine job runs it)
pytestmark = [pytest.mark.scripts, pytest.mark.once]

# a peer-style file for dm-tree's shim: one test of each outcome
_DMTREE_FILE = """
import dataclasses
import unittest

import pytest
import tree


def test_passes():
    assert tree.flatten([1, [2, None]]) == [1, 2, None]


def test_fails_on_a_difference():
    assert tree.flatten({"b": 1, "a": 2}) == [1, 2]  # sorted keys give [2, 1]: dm-tree too


@dataclasses.dataclass
class Point:
    x: int


def test_fails_here_alone():
    assert tree.flatten([Point(1)]) == [Point(1)]  # a leaf in dm-tree, a node here


def test_reaches_a_missing_function():
    tree._is_attrs([1])


def test_swallows_the_missing_function():
    try:
        tree._is_attrs([1])
    except Exception:
        pass
    assert tree.flatten([1]) == [1]


def test_calls_nothing_mapped():
    assert sorted([2, 1]) == [1, 2]


@pytest.mark.skip(reason="the peer skips this")
def test_skipped_by_the_peer():
    tree.flatten([1])


class UnittestStyle(unittest.TestCase):
    def test_passes(self):
        self.assertEqual(tree.map_structure(lambda x: x + 1, [1, (2,)]), [2, (3,)])

    def test_reaches_a_missing_function_in_assert_raises(self):
        with self.assertRaises(Exception):
            tree._is_attrs([1])
"""


def test_runner_counts_each_outcome(tmp_path: Path) -> None:
    pytest.importorskip("tree")
    f = tmp_path / "tree_test.py"
    f.write_text(_DMTREE_FILE, encoding="utf-8")
    results = peer_suites.run("dmtree", [str(f)])
    outcome = {node.split("::", 1)[1]: r["outcome"] for node, r in results.items()}
    assert outcome == {
        "test_passes": "passed",
        "test_fails_on_a_difference": "failed",
        "test_fails_here_alone": "failed",
        "test_reaches_a_missing_function": "not applicable",
        "test_swallows_the_missing_function": "not applicable",
        "test_calls_nothing_mapped": "not applicable",
        "test_skipped_by_the_peer": "skipped",
        "UnittestStyle::test_passes": "passed",
        "UnittestStyle::test_reaches_a_missing_function_in_assert_raises": "not applicable",
    }
    s = peer_suites.summary(results)
    assert (s["passed"], s["failed"], s["applicable"]) == (2, 2, 4)
    assert s["not applicable"] == 4 and s["skipped by the peer"] == 1
    assert (s["functions passing"], s["functions"]) == (2, 4)
    reasons = dict(s["reasons"])
    assert reasons["calls nothing that is mapped to pytree_kit"] == 1
    assert sum(n for r, n in reasons.items() if r.startswith("_is_attrs")) == 3
    # the command line prints the same figures
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "peer_suites.py"), "dmtree", str(f), "--show", "failed"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.startswith("dmtree: 2 / 4 passed (50.0 %); 2 failed, 4 not applicable")
    assert "test_fails_on_a_difference" in out
    # the baseline: on dm-tree itself, the first failure fails too and is left
    # out of the second rate; the peer's own passes are not reclassified
    base = peer_suites.run("dmtree", [str(f)], baseline=True)
    assert {n.split("::", 1)[1] for n, r in base.items() if r["outcome"] == "failed"} == {
        "test_fails_on_a_difference",
        # dm-tree's _is_attrs raises nothing: the assertRaises fails there
        "UnittestStyle::test_reaches_a_missing_function_in_assert_raises",
    }
    assert (
        base[next(n for n in base if n.endswith("::test_calls_nothing_mapped"))]["outcome"]
        == "passed"
    )
    peer_failures = {n for n, r in base.items() if r["outcome"] == "failed"}
    s = peer_suites.summary(results, peer_failures)
    assert (s["passed without those"], s["applicable without those"]) == (2, 3)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "peer_suites.py"), "dmtree", str(f), "--baseline"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "without the 2 tests that fail on the peer itself: 2 / 3 passed (66.7 %)" in out


_PEERS = {
    "optree": "optree",
    "jax": "jax",
    "torch": "torch",
    "dmtree": "tree",
    "accelerate": "accelerate",
    "lightning": "lightning",
    "lightning_utilities": "lightning_utilities",
    "transformers": "transformers",
}


@pytest.mark.parametrize("suite", sorted(_PEERS))
def test_shim_leaves_no_public_function_of_its_peer_unmapped(suite: str) -> None:
    """After install(), each public function of every module the shim patches
    is mapped to pytree_kit or missing; checked in a fresh process (install
    changes the peer's modules)."""
    pytest.importorskip(_PEERS[suite])
    code = textwrap.dedent(f"""
        import importlib, sys
        sys.path.insert(0, {str(ROOT / "scripts")!r})
        import peer_shims
        shim = importlib.import_module("peer_shims.{suite}_shim")
        shim.install()
        modules = shim.patched_modules()
        assert modules, "no module patched"
        left = peer_shims.unmapped(modules) + peer_shims.left_behind()
        print("\\n".join(left))
        sys.exit(1 if left else 0)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, f"{suite}: left to the peer:\n{proc.stdout}{proc.stderr[-2000:]}"


def test_a_file_that_does_not_import_fails_the_run(tmp_path: Path) -> None:
    """No silent 0 / 0: a peer file that fails to import (or holds no test)
    stops the runner with the reason."""
    pytest.importorskip("tree")
    broken = tmp_path / "tree_test.py"
    broken.write_text("import tree\nimport no_such_module\n\ndef test_x():\n    pass\n")
    with pytest.raises(SystemExit, match="no_such_module"):
        peer_suites.run("dmtree", [str(broken)])
    empty = tmp_path / "empty_test.py"
    empty.write_text("import tree\n")
    with pytest.raises(SystemExit, match="no tests"):
        peer_suites.run("dmtree", [str(empty)])


def test_the_shim_check_catches_an_unmapped_function() -> None:
    """The check above fails on a module that leaves a function to the peer."""
    shims = importlib.import_module("peer_shims")
    fake = types.ModuleType("fake_peer")
    exec("def tree_leaves(tree):\n    return [tree]\nCONSTANT = 1", fake.__dict__)
    exec("def register(cls):\n    return cls", fake.__dict__)
    fake.cast = __import__("typing").cast  # imported from elsewhere: not the peer's
    assert shims.unmapped([fake]) == ["fake_peer.register", "fake_peer.tree_leaves"]
    fake.tree_leaves = shims.mapped(fake.tree_leaves)
    fake.register = shims.kept(fake.register)
    assert shims.unmapped([fake]) == []
