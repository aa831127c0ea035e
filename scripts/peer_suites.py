#!/usr/bin/env python3
"""Run the peers' own test files against pytree_kit, through the name mapping
of the migration guides, and report passed / applicable per suite.

    python scripts/peer_suites.py optree PEERS/optree/tests/test_{ops,treespec,accessors}.py
    python scripts/peer_suites.py jax PEERS/jax/tests/tree_util_test.py
    python scripts/peer_suites.py torch PEERS/pytorch/test/test_pytree.py
    python scripts/peer_suites.py dmtree PEERS/tree/tree/tree_test.py
    python scripts/peer_suites.py accelerate PEERS/accelerate/tests/test_utils.py
    python scripts/peer_suites.py lightning PL/tests/tests_fabric/utilities/test_apply_func.py \
        PL/tests/tests_fabric/test_fabric.py PL/tests/tests_fabric/utilities/test_optimizer.py
    python scripts/peer_suites.py lightning_utilities LU/tests/unittests/core/test_apply_func.py \
        --pythonpath LU/tests
    python scripts/peer_suites.py transformers HF/tests/utils/test_model_output.py
    python scripts/peer_suites.py optree FILES... --json out.json --show failed

It fetches nothing: it runs the files it is given (from a checkout of the
peer at the commit the guide names; a file's helpers, such as optree's
``helpers.py`` and ``conftest.py``, beside it), in a pytest subprocess with
``scripts/peer_shims/<suite>_shim.py`` installed: the peer's public tree
functions call pytree_kit, as ``docs/migration/<suite>.md`` maps them, and
its functions that pytree_kit does not have (registries among them) skip the
test that reaches them as *not applicable*. A test that calls nothing mapped
is not applicable too: it tests the peer, not pytree_kit. The peer itself
must be installed (its internals stay in place for its test helpers).

The report gives, per suite: passed / applicable (applicable = passed +
failed), the tests the peer skipped itself, and the not-applicable tests by
reason, most frequent first; ``--show failed`` lists each failure's first
line. Each case of a parametrized test counts as a test; a second line
counts test functions, one passing when all its applicable cases pass.
``--baseline`` runs the files on the peer itself too (no shim) and
gives the rate without the tests that fail there (a test file newer or older
than the installed peer).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = (
    "optree",
    "jax",
    "torch",
    "dmtree",
    "accelerate",
    "lightning",
    "lightning_utilities",
    "transformers",
)


def run(
    suite: str,
    files: list[str],
    extra: list[str] | None = None,
    baseline: bool = False,
    pythonpath: list[str] | None = None,
) -> dict[str, dict]:
    """Each test's outcome (``passed``, ``failed``, ``not applicable``,
    ``skipped``) and reason, keyed by pytest node id. ``baseline``: on the
    peer itself, with no shim (only the shim's ``prepare()``, which lets the
    file import where the installed peer lacks something it imports).
    ``pythonpath``: directories of the peer's checkout its files import from
    (lightning-utilities' ``tests``, for its ``unittests.mocks``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [
                str(ROOT / "scripts"),
                str(ROOT),
                *(str(Path(d).resolve()) for d in pythonpath or ()),
                env.get("PYTHONPATH", ""),
            ]
        )
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-p", "peer_shims.plugin",
            "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", "--tb=line",
            "--peer-suite", suite, "--peer-report", str(report),
            "--rootdir", str(Path(files[0]).resolve().parent),
            *(["--peer-baseline"] if baseline else []),
            *(extra or []), *[str(Path(f).resolve()) for f in files],
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if not report.exists():
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit(f"peer_suites: pytest wrote no report (exit {proc.returncode})")
        results = json.loads(report.read_text(encoding="utf-8"))
    broken = {n: r["reason"] for n, r in results.items() if r["outcome"] == "collection error"}
    if broken or not results:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"peer_suites: no tests, or files that do not import: {broken}")
    return results


def summary(results: dict[str, dict], peer_failures: set[str] | None = None) -> dict:
    """Counts by outcome, passed / applicable, and not-applicable reasons.
    With ``peer_failures`` (the tests that fail on the peer itself: a
    baseline run), also the rate over the other tests."""
    counts = collections.Counter(r["outcome"] for r in results.values())
    applicable = counts["passed"] + counts["failed"]
    reasons = collections.Counter(
        r["reason"] for r in results.values() if r["outcome"] == "not applicable"
    )
    # by test function: its parametrized cases are one test of it (optree's
    # files run most functions over thousands of trees)
    by_function: dict[str, set[str]] = collections.defaultdict(set)
    for node, r in results.items():
        if r["outcome"] in ("passed", "failed"):
            by_function[node.split("[", 1)[0]].add(r["outcome"])
    extra: dict = {
        "functions": len(by_function),
        "functions passing": sum(1 for o in by_function.values() if o == {"passed"}),
    }
    if peer_failures is not None:
        rest = collections.Counter(
            r["outcome"] for node, r in results.items() if node not in peer_failures
        )
        n = rest["passed"] + rest["failed"]
        extra |= {
            "failing on the peer": sorted(peer_failures),
            "passed without those": rest["passed"],
            "applicable without those": n,
            "rate without those": rest["passed"] / n if n else 0.0,
        }
    return {
        "tests": len(results),
        "passed": counts["passed"],
        "failed": counts["failed"],
        "applicable": applicable,
        "rate": counts["passed"] / applicable if applicable else 0.0,
        "not applicable": counts["not applicable"],
        "skipped by the peer": counts["skipped"],
        "reasons": reasons.most_common(),
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("files", nargs="+", help="the peer's test files")
    parser.add_argument("--json", help="write every test's outcome here")
    parser.add_argument(
        "--show", choices=("failed", "not-applicable", "passed"), action="append", default=[]
    )
    parser.add_argument("-k", help="pytest's -k expression")
    parser.add_argument(
        "--pythonpath",
        action="append",
        default=[],
        help="a directory of the peer's checkout that its files import from",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also run the files on the peer itself, and give the rate without the tests "
        "that fail there",
    )
    args = parser.parse_args(argv)
    extra = ["-k", args.k] if args.k else None
    results = run(args.suite, args.files, extra, pythonpath=args.pythonpath)
    peer_failures = None
    if args.baseline:
        base = run(args.suite, args.files, extra, baseline=True, pythonpath=args.pythonpath)
        peer_failures = {node for node, r in base.items() if r["outcome"] == "failed"}
    s = summary(results, peer_failures)
    print(
        f"{args.suite}: {s['passed']} / {s['applicable']} passed ({100 * s['rate']:.1f} %); "
        f"{s['failed']} failed, {s['not applicable']} not applicable, "
        f"{s['skipped by the peer']} skipped by the peer, {s['tests']} tests"
    )
    print(
        f"by test function (every applicable case of it passing): "
        f"{s['functions passing']} / {s['functions']}"
    )
    if peer_failures is not None:
        print(
            f"without the {len(peer_failures)} tests that fail on the peer itself: "
            f"{s['passed without those']} / {s['applicable without those']} passed "
            f"({100 * s['rate without those']:.1f} %)"
        )
        for node in sorted(peer_failures):
            print(f"  fails on the peer: {node} ({results.get(node, {}).get('outcome', '?')} here)")
    print("not applicable, by reason:")
    for reason, n in s["reasons"]:
        print(f"  {n:6d}  {reason}")
    for kind in args.show:
        outcome = kind.replace("-", " ")
        print(f"{outcome}:")
        for node, r in sorted(results.items()):
            if r["outcome"] == outcome:
                print(f"  {node}  {r['reason']}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"summary": s, "tests": results}, indent=1), encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
