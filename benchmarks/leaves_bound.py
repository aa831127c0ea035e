"""How close can any leaves() come to the list-copy floor? A measured lower bound.

Issue 3 asks for ``leaves()`` within 1.3x of the cost of copying as many
references into a list. This script times, on the trees of
``benchmarks/compare.py`` and in the same interleaved rounds:

- the floor: ``prebuilt.copy()`` of a list of as many references;
- the bound: ``benchmarks/bound/leaves_bound.c``, a traversal that does less
  than any real leaves() can (exact dict/list/tuple only, no key ordering, no
  spec, no cycle check, no is_leaf; see its header), compiled here;
- ``pk.leaves(tree)`` (the public function, on the active engine);
- ``jax.tree_util.tree_leaves`` when jax is installed.

and prints each as a multiple of the floor. The bound's multiple is what
no implementation can beat on that tree with this interpreter and machine.

    python benchmarks/leaves_bound.py                # a minute or so
    python benchmarks/leaves_bound.py --quick        # smoke mode
    python benchmarks/leaves_bound.py --out /tmp/b   # write OUT/leaves_bound.md elsewhere
    python benchmarks/leaves_bound.py --record       # benchmarks/results/leaves_bound.md

By default it writes ``build/benchmarks/leaves_bound.md``.

Needs a C compiler (the one Python was built with, from ``sysconfig``).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _output  # noqa: E402
import compare  # noqa: E402

import pytree_kit as pk  # noqa: E402

X = compare.X  # the multiplication sign

SOURCE = HERE / "bound" / "leaves_bound.c"


def build(workdir: Path, source: Path = SOURCE) -> Any:
    """Compile source (a bound of benchmarks/bound/, one C file) into workdir
    and import it, under the file's name."""
    name = source.stem
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = workdir / f"{name}{suffix}"
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    cmd = [
        *cc,
        "-O3",
        "-shared",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
        str(source),
        "-o",
        str(target),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke mode: tiny loops")
    _output.add_arguments(parser)
    args = parser.parse_args(argv)
    min_time, repeats = (0.002, 3) if args.quick else (0.05, 9)
    try:
        import jax.tree_util as jtu
    except ImportError:
        jtu = None

    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bound = build(Path(tmp))
        for case in compare.TREES:
            if case.key in ("e", "f"):
                continue  # see the report: no bound for these
            tree = case.make()
            want = pk.leaves(tree)
            got = bound.leaves(tree)
            # the same leaves, in insertion order rather than key order
            assert sorted(map(id, got)) == sorted(map(id, want)), case.key
            prebuilt = list(range(len(want)))
            fns: dict[str, Callable[[], Any]] = {
                "floor": prebuilt.copy,
                "bound": lambda t=tree: bound.leaves(t),
                "pk.leaves": lambda t=tree: pk.leaves(t),
            }
            if jtu is not None:
                fns["jax"] = lambda t=tree: jtu.tree_leaves(t)
            times = compare.measure_many(fns, min_time, repeats)
            rows.append((case, len(want), times))
            del tree, prebuilt, fns

    names = ["bound", "pk.leaves"] + (["jax"] if jtu is not None else [])
    lines = [
        "# leaves(): a measured lower bound against the list-copy floor",
        "",
        f"`python benchmarks/leaves_bound.py{' --quick' if args.quick else ''}`, "
        f"{time.perf_counter() - started:.0f} s; Python {sys.version.split()[0]}, "
        f"pytree_kit engine `{pk.ENGINE}`; median of {repeats} interleaved loops of at "
        f"least {min_time * 1000:g} ms each.",
        "",
        "Each cell: µs per call, and the multiple of the floor (lower is better). "
        "**bound** is `benchmarks/bound/leaves_bound.c`: exact dict/list/tuple only, dict "
        "values in insertion order (no key ordering), no spec, no cycle check, no "
        "`is_leaf`; no real `leaves()` can do less, so no real one can get below its "
        "multiple. Trees (e) and (f) are left out: the bound knows no dataclasses, and it "
        "pushes every leaf of (f) on its stack where the C engine copies runs of leaves "
        "at once (it would be no bound there; the C engine meets the target on (f)).",
        "",
        "| tree | leaves | floor µs | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for case, n, times in rows:
        floor = times["floor"]
        cells = [f"{times[k] * 1e6:.3g} ({times[k] / floor:.2f}{X})" for k in names]
        lines.append(f"| {case.label} | {n:,} | {floor * 1e6:.3g} | " + " | ".join(cells) + " |")
    report = "\n".join(lines) + "\n"
    print(report)
    out = _output.folder(args)
    (out / "leaves_bound.md").write_text(report, encoding="utf-8")
    _output.wrote(out / "leaves_bound.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
