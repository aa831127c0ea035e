"""Both engines' results behave alike as objects: weak references, pickling,
iteration and repr of everything the public functions give back
(``tests/support/public_objects.py`` lists the calls; each engine runs them in its
own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# runs the engines side by side, not through the public API: the same whichever
# engine that uses, so the pure-engine jobs leave it out (scripts/ci.py)
pytestmark = pytest.mark.side_by_side

ROOT = Path(__file__).resolve().parent.parent

try:
    from pytree_kit import _speedups
except ImportError:  # pragma: no cover - where the extension is not built
    _speedups = None

#: types that differ by design, one per engine: tree_iter's iterator is a
#: generator in the pure engine and a C type in the C engine (their reprs differ)
SAME_ROLE = {("generator", "LeafIter")}


def report(pure: bool) -> dict:
    env = dict(os.environ, PYTREE_KIT_PURE="1" if pure else "0")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.public_objects"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["engine"] == ("python" if pure else "c")
    return out["report"]


@pytest.mark.skipif(_speedups is None, reason="the C engine is not built")
def test_both_engines_results_behave_alike_as_objects() -> None:
    pure, c = report(pure=True), report(pure=False)
    assert pure.keys() == c.keys() and len(pure) >= 40
    checked = 0
    for name in pure:
        assert len(pure[name]) == len(c[name]), name
        for mine, theirs in zip(pure[name], c[name]):
            if (mine["type"], theirs["type"]) in SAME_ROLE:
                mine, theirs = dict(mine, repr=None, type=None), dict(theirs, repr=None, type=None)
            assert mine == theirs, (name, mine, theirs)
            checked += 1
    assert checked > 200  # the results' parts, not only the results
