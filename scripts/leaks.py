"""Leak and reference-cycle check: many calls per operation, per engine.

For each engine (each in its own process, with ``PYTREE_KIT_PURE`` set for the
pure one, so the public API uses it) and each operation of the workload in
``scripts/corpus/workload.py`` (flatten, unflatten, tree_map, flatten_with_path,
leaves, flatten_up_to, tree_map_with_path, and the error calls), separately:

1. warm up (1% of the calls, at least 1,000);
2. ``--calls`` calls in ``--chunks`` chunks, reading RSS after a full
   collection at the start and at each chunk's end;
3. ``--trace-calls`` calls with tracemalloc started after the warm-up,
   reading its traced size the same way (default: ``--calls`` for the C
   engine, a tenth of it for the pure one, which tracemalloc slows ~7x);
4. the refcount of every leaf and container of the trees, before 1 and after 3.

Each call goes round the kinds: one call is one operation on one kind's small
tree (24 kinds), or one error call (34 kinds of error). Then the GC check:
with ``gc.collect(); gc.disable()``, every operation on every kind and both
combined trees, and every error call; ``gc.collect()`` must be 0, and where it
is not the garbage is searched for a cycle, which is printed.

Criteria (see ``scripts/corpus/workload.py`` for why): tracemalloc at most 4 KiB above
its start, and at most 1 KiB more at the last chunk's end than at the first's;
RSS at most 1 MiB above its reading after the warm-up; refcounts unchanged.
Before all that, ``--self-test`` (run by default first) shows the detectors
fail on leaks injected on purpose. Exit status 1 on any failure.

Examples:
    python scripts/leaks.py                      # 10^6 calls, both engines (~25 min)
    python scripts/leaks.py --calls 20000 --engine c
    python scripts/leaks.py --engine python --calls 1000000 --trace-calls 100000
    python scripts/leaks.py --api direct         # _speedups / _pure, not pytree_kit.*
    python scripts/leaks.py --self-test          # only show the detectors work
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ENGINE_ENV = {"c": "0", "python": "1"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("--calls", type=int, default=1_000_000, help="calls per operation (RSS pass)")
    p.add_argument(
        "--trace-calls",
        type=int,
        default=None,
        help="calls per operation with tracemalloc (default: --calls for the C engine, "
        "--calls / 10 for the pure one, which tracemalloc slows ~7x: 10^6 traced calls "
        "of every operation would take ~40 min on the pure engine; 0: skip)",
    )
    p.add_argument("--engine", choices=["c", "python", "both"], default="both")
    p.add_argument(
        "--api",
        choices=["public", "direct"],
        default="public",
        help="call pytree_kit's public functions, or the engine module directly",
    )
    p.add_argument("--chunks", type=int, default=10, help="readings per pass")
    p.add_argument("--ops", default=None, help="comma-separated operations (default: all)")
    p.add_argument("--no-gc", action="store_true", help="skip the GC check")
    p.add_argument(
        "--self-test",
        action="store_true",
        help="only run the injected leaks through the detectors",
    )
    p.add_argument("--no-self-test", action="store_true", help="skip the self-test")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # JSON output path
    return p.parse_args(argv)


def trace_calls(args: argparse.Namespace, engine: str) -> int:
    if args.trace_calls is not None:
        return int(args.trace_calls)
    return int(args.calls if engine == "c" else args.calls // 10)


# -- in the child process: one engine ---------------------------------------------


def child(args: argparse.Namespace) -> int:
    import pytree_kit as pk
    from scripts.corpus import workload as w

    if pk.ENGINE != args.engine:
        print(f"expected engine {args.engine}, pytree_kit.ENGINE is {pk.ENGINE}", file=sys.stderr)
        return 2
    if args.api == "public":
        api = w.public_api()
    elif args.engine == "c":
        from pytree_kit import _speedups

        api = w.direct_api(_speedups)
    else:
        from pytree_kit import _pure

        api = w.direct_api(_pure)
    cases = w.kind_cases()
    leak_calls = w.leak_calls(api, cases)
    errors = leak_calls[w.ERRORS]
    tracked = w.tracked_objects([c.tree for c in cases] + errors)  # what the closures hold
    ops = list(leak_calls) if args.ops is None else args.ops.split(",")
    trace_n = trace_calls(args, args.engine)
    print(
        f"[{api.name}] {len(cases)} kinds, {len(errors)} error calls, "
        f"{len(tracked)} objects tracked",
        flush=True,
    )
    results = []
    for op in ops:
        t0 = time.perf_counter()
        r = w.measure(op, leak_calls[op], args.calls, tracked, chunks=args.chunks, trace_n=trace_n)
        rss = " ".join(f"{(v - r.rss_chunks[0]) // 1024:+d}" for v in r.rss_chunks[1:])
        print(
            f"[{api.name}] {op}: {time.perf_counter() - t0:.1f} s, "
            f"{'pass' if r.passed else 'FAIL ' + '; '.join(r.failures)}; "
            f"RSS KiB by chunk: {rss}",
            flush=True,
        )
        results.append(
            dataclasses.asdict(r) | {"us": r.us_per_call, "trace_us": r.trace_us_per_call}
        )
    gc_out: dict[str, Any] = {}
    if not args.no_gc:
        t0 = time.perf_counter()
        counts, findings = w.gc_check(w.gc_groups(api))
        gc_out = {
            "counts": counts,
            "findings": [dataclasses.asdict(f) for f in findings],
            "seconds": time.perf_counter() - t0,
            "kinds": len(cases) + 2,
            "errors": len(errors),
        }
    with open(args.child, "w") as f:
        json.dump({"api": api.name, "results": results, "gc": gc_out}, f)
    return 0


# -- in the parent: one child per engine, then the table ---------------------------


def run_engine(engine: str, args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTREE_KIT_PURE=ENGINE_ENV[engine])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--engine", engine, "--child", out]
        proc = subprocess.run(cmd, env=env, cwd=ROOT)
        if proc.returncode != 0 or not os.path.exists(out):
            return {"engine": engine, "error": f"child exited with {proc.returncode}"}
        with open(out) as f:
            data: dict[str, Any] = json.load(f)
    data["engine"] = engine
    return data


def print_table(data: dict[str, Any]) -> bool:
    ok = True
    print(f"\n## {data['api']}\n")
    print(
        "| op | calls | µs/call | RSS Δ KiB | traced calls | µs/call traced | tracemalloc Δ B "
        "| Δ first→last chunk B | refcount Δ | result |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in data["results"]:
        rss = (r["rss_chunks"][-1] - r["rss_chunks"][0]) / 1024 if r["rss_chunks"] else 0
        tc = r["trace_chunks"]
        tdelta = tc[-1] - tc[0] if tc else 0
        growth = tc[-1] - tc[1] if len(tc) > 2 else 0
        result = "pass" if not r["failures"] else "FAIL: " + "; ".join(r["failures"])
        ok = ok and not r["failures"]
        print(
            f"| {r['op']} | {r['calls']:,} | {r['us']:.2f} | {rss:+.0f} | {r['trace_calls']:,} "
            f"| {r['trace_us']:.2f} | {tdelta:+d} | {growth:+d} | {r['ref_delta']} | {result} |"
        )
    g = data["gc"]
    if g:
        total = sum(g["counts"].values())
        print(
            f"\nGC check ({g['kinds']} trees x {len(g['counts']) - 1} operations, "
            f"{g['errors']} error calls; {g['seconds']:.1f} s): "
            + ", ".join(f"{op} {n}" for op, n in g["counts"].items())
            + (" — pass" if total == 0 else " — FAIL")
        )
        for f in g["findings"]:
            print(f"  cycle: {f['op']} on {f['kind']}: {f['objects']} objects ({f['types']})")
            print(f"    {f['cycle']}")
        ok = ok and total == 0
    return ok


def self_test_main(n: int) -> bool:
    from scripts.corpus import workload as w

    print(f"self-test: injected leaks through the detectors ({n} calls each)")
    lines = w.self_test(n)
    for line in lines:
        print("  " + line)
    return all(line.startswith("ok") for line in lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    t0 = time.perf_counter()
    if args.self_test:
        ok = self_test_main(20_000)
        print(f"\nself-test {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s")
        return 0 if ok else 1
    ok = True
    if not args.no_self_test:
        ok = self_test_main(20_000)
    child_argv = ["--calls", str(args.calls), "--api", args.api, "--chunks", str(args.chunks)]
    if args.trace_calls is not None:
        child_argv += ["--trace-calls", str(args.trace_calls)]
    if args.ops is not None:
        child_argv += ["--ops", args.ops]
    if args.no_gc:
        child_argv.append("--no-gc")
    engines = ["c", "python"] if args.engine == "both" else [args.engine]
    summary = []
    for engine in engines:
        t1 = time.perf_counter()
        data = run_engine(engine, args, child_argv)
        summary.append((engine, time.perf_counter() - t1, data))
    for engine, seconds, data in summary:
        if "error" in data:
            print(f"\n## {engine}: {data['error']}")
            ok = False
            continue
        ok = print_table(data) and ok
        print(f"\n{engine}: {seconds:.0f} s")
    traced = ", ".join(f"{trace_calls(args, e):,} traced ({e})" for e in engines)
    print(
        f"\nsummary: api {args.api}, {args.calls:,} calls + {traced} per operation; "
        f"total {time.perf_counter() - t0:.0f} s; {'all passed' if ok else 'FAILURES above'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
