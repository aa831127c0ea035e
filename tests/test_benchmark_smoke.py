"""Smoke test of `benchmarks/corpus.py compare`: its --quick mode runs and writes a whole report.

No timing is asserted: only that every tree and operation has a row, pytree_kit
and at least one peer have a column, the machine section is there and the chart
is a PNG.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Each test runs a benchmark script: whether it runs does not depend on the
# engine loaded, so CI runs these in each Python's C-engine job only.
pytestmark = pytest.mark.scripts

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "corpus.py"

TREE_LABELS = (
    "(a) dict of 10",
    "(b) detection batch",
    "(c) 1000 dicts x 3",
    "(d) depth-50 chain",
    "(e) dataclass batch",
    "(f) wide, 100,000",
)
OPS = ("flatten", "unflatten", "leaves", "tree_map", "flatten_up_to")
PEERS = (
    "jax.tree_util",
    "optree",
    "torch.utils._pytree",
    "torch.utils._cxx_pytree",
    "dm-tree",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sections(report: str) -> dict[str, str]:
    """The report's `## ` sections, by title."""
    parts = re.split(r"^## (.+)$", report, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _table_header(section: str) -> list[str]:
    line = next(line for line in section.splitlines() if line.startswith("| tree"))
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    pytest.importorskip("matplotlib")
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "# pytree_kit: side-by-side speed benchmark" in proc.stdout
    return (out / "compare.md").read_text(encoding="utf-8"), out


def test_every_operation_has_a_row_per_tree(quick_run: tuple[str, Path]) -> None:
    sections = _sections(quick_run[0])
    for op in OPS:
        assert op in sections, f"no section for {op}"
        rows = [line for line in sections[op].splitlines() if line.startswith("| (")]
        labels = [row.split("|")[1].strip() for row in rows]
        assert labels == list(TREE_LABELS), (op, labels)


def test_columns_pytree_kit_and_a_peer(quick_run: tuple[str, Path]) -> None:
    sections = _sections(quick_run[0])
    for op in OPS:
        header = _table_header(sections[op])
        assert "pytree_kit (python)" in header
        assert any(peer in header for peer in PEERS), header
        rows = [line for line in sections[op].splitlines() if line.startswith("| (a)")]
        assert re.search(r"\d \(\d+\.\d\d\u00d7\)", rows[0]), rows[0]


def test_both_engines_and_the_targets(quick_run: tuple[str, Path]) -> None:
    """The C engine has its own column where it is built, and the targets table
    judges every target on the quick run's trees (met or MISSED, never blank)."""
    sections = _sections(quick_run[0])
    if importlib.util.find_spec("pytree_kit._speedups") is not None:
        assert "pytree_kit (c)" in _table_header(sections["flatten"])
    targets = sections["Targets"]
    rows = [line for line in targets.splitlines() if line.startswith("| ") and "target" not in line]
    assert len(rows) == 5, targets
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        timed = [c for c in cells if c != "-"]
        assert timed, row  # the quick run skips only tree (f)
        assert all(re.fullmatch(r"\d+\.\d\d\u00d7 (met|MISSED)", c) for c in timed), row


def test_flatten_up_to_against_flatten_in_the_same_rounds(quick_run: tuple[str, Path]) -> None:
    """Each timed tree has pytree_kit's flatten_up_to and flatten side by side, with their
    ratio; the targets row for flatten_up_to is that ratio."""
    sections = _sections(quick_run[0])
    table = sections["flatten_up_to against flatten"]
    rows = {
        row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")[1:]]
        for row in table.splitlines()
        if row.startswith("| (")
    }
    assert list(rows) == list(TREE_LABELS), table
    header = _table_header(table)
    ours = header.index("pytree_kit (c)") if "pytree_kit (c)" in header else 1
    target = next(r for r in sections["Targets"].splitlines() if r.startswith("| flatten_up_to"))
    judged = [c.strip() for c in target.strip("|").split("|")[1:]]
    for label, judge in zip(TREE_LABELS, judged):
        cell = rows[label][ours - 1]
        if judge == "-":
            assert cell == "-", (label, cell)
            continue
        m = re.fullmatch(r"([\d.,]+) / ([\d.,]+) \((\d+\.\d\d)\u00d7\)", cell)
        assert m, (label, cell)
        assert judge.startswith(m.group(3) + "\u00d7"), (label, cell, judge)


def test_floor_and_scaling_tables(quick_run: tuple[str, Path]) -> None:
    sections = _sections(quick_run[0])
    floor = sections["leaves() against the floor"]
    for label in TREE_LABELS:
        assert f"| {label} |" in floor
    scaling = sections["Scaling"]
    assert "**flatten**, ns per leaf" in scaling and "**leaves**, ns per leaf" in scaling
    assert "| 1,000 |" in scaling and "| 10,000 |" in scaling


def test_machine_section(quick_run: tuple[str, Path]) -> None:
    sections = _sections(quick_run[0])
    machine = sections["Machine and versions"]
    for word in ("Python", "CPU", "cores", "pytree_kit", "engines benchmarked", "jax"):
        assert word in machine, word


def test_charts_are_pngs(quick_run: tuple[str, Path]) -> None:
    out = quick_run[1]
    for name in ("compare.png", "scaling.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name


def _run_quick(script: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run benchmarks/SCRIPT --quick --out OUT; it must exit 0."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", *extra, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_pinning_benchmark_smoke(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    proc = _run_quick("pinning.py", tmp_path)
    report = (tmp_path / "pinning.md").read_text()
    assert "## Host side, on the CPU" in report and "1,000 of 3 dtypes" in report
    assert re.search(
        r"per 1,000 small tensors \(the copy-to-CPU column[^)]*\): (met|MISSED)", report
    )
    if torch.cuda.is_available():
        for way in (
            "coalesced",
            "pinned, then coalesced",
            "per tensor",
            "consolidated (beforehand)",
            "torch DataLoader pinning",
        ):
            assert way in report
    else:
        assert "No CUDA device here" in proc.stdout
    # what --instructions runs under callgrind, one process per case (here
    # without callgrind, two calls each): it must run for every batch and case
    for batch in ("1,000 x float32[64]", "1,000 of 3 dtypes"):
        for case in ("cpu", "floor"):
            one = subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "pinning.py"), "--op", batch, case, "2"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert one.returncode == 0, one.stderr[-2000:]


@pytest.mark.once  # a script's smoke run (torch only): the C-engine job on 3.11
def test_distributed_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/distributed.py --quick starts two gloo ranks and writes its report."""
    pytest.importorskip("torch")
    _run_quick("distributed.py", tmp_path, "--timeout", "240")
    sections = _sections((tmp_path / "distributed.md").read_text())
    target = [line for line in sections["Targets"].splitlines() if "1,000 all_reduce" in line]
    assert len(target) == 1 and re.search(r"\| [\d,.]+x \| (yes|MISSED) \|$", target[0]), target
    times = sections["Times"]
    for label in ("10 x float32[8]", "1,000 x float32[8]", "1,000 x 3 dtypes"):
        assert f"| {label} |" in times, label
    assert "torch" in sections["Machine"]


@pytest.mark.once  # a script's smoke run (torch only): the C-engine job on 3.11
def test_batches_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/batches.py --quick checks collate against default_collate on
    every input (same values), consolidate against tensordict when installed,
    and runs a DataLoader with 2 forked workers; no timing is judged here."""
    pytest.importorskip("torch")
    _run_quick("batches.py", tmp_path)
    report = (tmp_path / "batches.md").read_text(encoding="utf-8")
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    collate_rows = [r for r in rows if "(x" in r.split("|")[1]]
    assert len(collate_rows) == 15, rows
    for row in collate_rows:
        assert re.search(r"\| [0-9.]+ \|$", row), row
    loaders = {r.split("|")[1].strip(): r for r in rows if r.startswith(("| plain", "| consol"))}
    assert set(loaders) == {"plain", "consolidated"}
    # one storage a batch, against one per tensor
    assert loaders["consolidated"].split("|")[3].strip() == "1"
    assert loaders["plain"].split("|")[3].strip() == "1,000"


@pytest.mark.once  # a script's smoke run (torch only): the C-engine job on 3.11
def test_compiled_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/compiled.py --quick compiles the wrapper with each library,
    checks every result, and counts one graph over 20 fresh batches for each;
    no timing is judged here."""
    pytest.importorskip("torch")
    _run_quick("compiled.py", tmp_path)
    report = (tmp_path / "compiled.md").read_text(encoding="utf-8")
    rows = {
        r.split("|")[1].strip(): r.split("|")[2:-1]
        for r in report.splitlines()
        if r.startswith("| ") and not r.startswith("| library")
    }
    assert {"pytree_kit", "torch.utils._pytree", "optree"} <= set(rows)
    for name in ("pytree_kit", "torch.utils._pytree"):
        compile_s, call_us, eager_us, guards, graphs = (c.strip() for c in rows[name])
        assert float(compile_s) > 0 and float(call_us) > 0 and int(guards) > 0
        assert graphs == "1", (name, graphs)
    assert "Python 3." in report and "torch " in report


@pytest.mark.once
def test_compiled_benchmark_counts_instructions_in_a_child() -> None:
    """--instructions runs each library's calls in a child under callgrind:
    the child (here without valgrind) compiles, checks its results and makes
    its calls; the report gives the counts' ratio."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compiled.py"),
            "--callgrind-child",
            "pytree_kit",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        compiled = importlib.import_module("compiled")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rows = [
        {"name": "pytree_kit", "call_ir": 2.0e6},
        {"name": "torch.utils._pytree", "call_ir": 2.5e6},
        {"name": "optree", "untraceable": "no"},
    ]
    (line,) = compiled.instructions_line(rows)
    assert "**0.80**" in line and "pytree_kit 2.00 M, torch.utils._pytree 2.50 M)" in line
    assert compiled.instructions_line([{"name": "pytree_kit"}, rows[1]]) == []


def _c_engine_benchmark(name: str) -> Any:
    """benchmarks/<name>.py, a script that measures the C engine, imported
    (skips where the pure engine runs)."""
    import pytree_kit as pk

    if pk.ENGINE != "c":
        pytest.skip("it measures the C engine")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_instructions_runs_each_case_it_counts() -> None:
    """benchmarks/instructions.py's counted process runs every op of each set
    on its trees, fresh ones too (callgrind, and the baseline checkout, are for
    real runs only)."""
    pytest.importorskip("attrs")
    ins = _c_engine_benchmark("instructions")
    corpus = [f"{f}:{size}:{v}" for f, size, v in (("none", 10, ""), ("named", 0, "d"))]
    corpus.append("state_dict:1000:OrderedDict")
    sets = {
        "named": [*list(ins.named_trees())[:2], "state_dict of 500"],
        "records": list(ins.record_trees()),
        "corpus": corpus,
    }
    for trees, labels in sets.items():
        ops = ins.CORPUS_OPS if trees == "corpus" else ins.SET_OPS[trees]
        for tree in labels:
            for op in ops:
                fresh = "fresh" if trees == "records" else "same"
                script = ROOT / "benchmarks" / "instructions.py"
                subprocess.run(
                    [sys.executable, script, "--count", trees, tree, op, fresh, "2"],
                    cwd=ROOT,
                    check=True,
                    timeout=120,
                )


def test_instructions_reports() -> None:
    """benchmarks/instructions.py's reports: a case's before and now and their
    ratio; on the corpus, a ratio under flatten_up_to's target marked, and one
    op's before ÷ now."""
    ins = _c_engine_benchmark("instructions")
    base = ROOT / "benchmarks"  # a second checkout stands in
    cases = [("100 dataclass records", "flatten", False), ("100 dataclass records", "leaves", True)]
    got = {(w, c): v for c in cases for w, v in ((ROOT, 150.0), (base, 100.0))}
    text = ins.report(got, cases, "records", 20, ROOT, base, "T")
    assert "| 100 dataclass records | flatten | same | 100 | 150 | 1.500 |" in text
    assert "| 100 dataclass records | leaves | fresh | 100 | 150 | 1.500 |" in text
    assert "--trees records --n 20" in text and "Ratios from 1.500 to 1.500." in text
    pts = ["none:10:", "dataclass:4:"]
    got = {
        (ROOT, (p, op, False)): v
        for p, vals in zip(pts, ((300.0, 100.0), (140.0, 100.0)))
        for op, v in zip(ins.SET_OPS["corpus"], vals)
    }
    text = ins.report_up_to(pts, got, ROOT, None)
    assert "| none | 10 | 300 | 100 | 3.00 |" in text
    assert "| dataclass | 4 | 140 | 100 | 1.40 ✗ |" in text
    assert "- dataclass: 1.40 ✗" in text and "- none: 3.00\n" in text
    one = {(w, (p, "unflatten", False)): v for p in pts for w, v in ((ROOT, 100.0), (base, 250.0))}
    text = ins.report_one(pts, one, "unflatten", ROOT, base)
    assert "| dataclass | 4 | 250 | 100 | 2.50 |" in text


def test_algebra_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/algebra.py --quick times every function beside its peers."""
    _run_quick("algebra.py", tmp_path)
    text = (tmp_path / "algebra.md").read_text()
    for name in (
        "tree_map_only(int, f)",
        "tree_all",
        "tree_transpose",
        "spec.paths()",
        "spec.paths(), first call",
        "flatten_one_level",
        "assert_same_structure",
        "tree_broadcast_prefix",
    ):
        assert f"| {name} |" in text, name
    assert "## Worst ratio per function" in text


@pytest.mark.once  # a script's smoke run (torch only): the C-engine job on 3.11
@pytest.mark.timeout(300)
def test_packed_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/packed.py --quick keeps 1,000 samples four ways, runs an epoch
    of each in a fresh process (fork, then spawn) and writes its report, chart
    and figures; no figure is judged here."""
    pytest.importorskip("torch")
    pytest.importorskip("tensordict")
    _run_quick("packed.py", tmp_path)
    text = (tmp_path / "packed.md").read_text(encoding="utf-8")
    for store in ("list", "pickle", "PackedList", "tensordict"):
        for context in ("fork", "spawn"):
            assert f"| {store} | {context} |" in text, (store, context)
        # --quick spawns workers for the two stores the targets compare only
        spawned = f"| {store} | spawn | not run (--quick) |" not in text
        assert spawned == (store in ("list", "PackedList")), store
    targets = [r for r in text.split("## Targets")[1].splitlines() if r.startswith("| ")][1:]
    assert len(targets) == 5 and all(r.endswith(("| yes |", "| MISSED |")) for r in targets)
    assert (tmp_path / "packed.png").stat().st_size > 10_000
    assert "open_ms" in (tmp_path / "packed.json").read_text()


CORPUS_FAMILIES = (
    "state_dict",
    "optimizer",
    "config",
    "records",
    "chain",
    "wide",
    "dataclass",
    "attrs",
    "namedtuple",
    "modeloutput",
    "none",
    "mixed_keys",
    "named",
)


@pytest.mark.once  # a script's smoke run: the C-engine job on 3.11
def test_corpus_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/corpus.py --quick draws a tree of every family, times pytree_kit
    beside the peers on it and writes corpus.md and corpus.json; every family has
    its worst cell for every operation, judged met or MISSED (no figure is judged
    here), and every drawn tree its row."""
    pytest.importorskip("jax")  # a peer that takes part in every family
    pytest.importorskip("attrs")
    _run_quick("corpus.py", tmp_path, "--seed", "3")
    report = (tmp_path / "corpus.md").read_text(encoding="utf-8")
    sections = _sections(report)
    cell = re.compile(
        r"\d+\.\d\d\u00d7 \((?:[jotcd], )?[^()]*(?:\([a-f]\)[^()]*)?\) (met|\*\*MISSED\*\*)"
    )
    rows = {
        row.split("|")[1].strip(): [c.strip() for c in row.strip("|").split("|")[1:]]
        for row in sections["Worst ratio per family"].splitlines()
        if row.startswith("| ") and not row.startswith("| family")
    }
    assert list(rows) == list(CORPUS_FAMILIES), rows
    for family, cells in rows.items():
        assert len(cells) == len(OPS), (family, cells)
        assert all(cell.fullmatch(c) for c in cells), (family, cells)
    per_tree = [
        r
        for r in sections["Per tree"].splitlines()
        if r.startswith("| ") and not r.startswith("| family")
    ]
    assert {r.split("|")[1].strip() for r in per_tree} == set(CORPUS_FAMILIES)
    for word in ("Python", "CPU", "pytree_kit", "jax", "Leaves"):
        assert word in sections["Machine and versions"], word
    data = json.loads((tmp_path / "corpus.json").read_text(encoding="utf-8"))
    keys = {"python", "engine", "peers", "seed", "targets", "families", "trees", "left_out"}
    assert keys <= data.keys(), data.keys()
    assert data["seed"] == 3 and data["quick"] is True
    assert list(data["families"]) == list(CORPUS_FAMILIES)
    for family, figures in data["families"].items():
        assert list(figures) == list(OPS), family
        for op, fig in figures.items():
            assert fig is not None, (family, op)
            assert {"worst", "worst_tree", "worst_peer", "median", "met"} <= fig.keys()
            assert fig["worst"] > 0 and fig["median"] >= fig["worst"], (family, op, fig)
            assert fig["met"] == (fig["worst"] >= data["targets"][op]), (family, op, fig)
    assert len(data["trees"]) == len(per_tree)
    for tree in data["trees"]:
        assert tree["leaves"] > 0 and set(tree["ops"]) == set(OPS), tree


@pytest.mark.once  # a script's smoke run (torch only): the C-engine job on 3.11
def test_ravel_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/ravel.py --quick checks pk.ravel against parameters_to_vector,
    vector_to_parameters and jax's ravel_pytree on two models (same values),
    then times each operation; every row has its figures and ratio (no timing
    is judged here)."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    _run_quick("ravel.py", tmp_path)
    sections = _sections((tmp_path / "ravel.md").read_text(encoding="utf-8"))
    ratios = [
        [c.strip() for c in r.strip("|").split("|")]
        for r in sections["Ratio per model and operation"].splitlines()
        if r.startswith("| ") and not r.startswith("| model")
    ]
    assert [r[:3] for r in ratios] == [
        [model, op, peer]
        for model in ("MLP, 10 tensors", "CNN, 100 tensors")
        for op, peer in (
            ("ravel (torch)", "parameters_to_vector"),
            ("unravel (torch)", "vector_to_parameters"),
            ("ravel (numpy)", "jax ravel_pytree"),
            ("unravel (numpy)", "jax unravel"),
        )
    ]
    assert all(float(r[3]) > 0 for r in ratios), ratios
    cells = [r for r in sections["Every cell"].splitlines() if r.startswith("| MLP")]
    assert len(cells) == 4 and all(re.search(r"\| \d+\.\d\d\u00d7 \|$", r) for r in cells), cells
    assert "vector.clone() alone" in sections["Every cell"]


def test_transfer_peers_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _run_quick("transfer_peers.py", tmp_path, "--thresholds")
    report = (tmp_path / "transfer_peers.md").read_text()
    for batch in ("tokenizer batch: 4 x int64[32, 512] in a dict", "40 0-d tensors (metrics)"):
        assert f"| {batch} |" in report
    assert re.search(r"Targets: .*\*\*(met|MISSED)\*\*", report)
    assert "| pkt.to_device (default) | coalesce=True | coalesce=False |" in report
    assert "| default vs fastest peer that moves all |" in report
    # the same tensors in dicts: every way moves every one of them
    assert re.search(r"\| 16 uint8 images .* dict targets .*\| 0( / 0)+ \|\n", report)
    assert re.search(r"Packing pays from (\d+|no count measured) tensors of 128 B", report)


def test_pipeline_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _run_quick("pipeline.py", tmp_path, "--workers", "1")
    report = (tmp_path / "pipeline.md").read_text()
    for workload in ("tokenizer", "detection"):
        # one round (--quick): its spread is none
        assert re.search(
            rf"\| {workload} \| pytree_kit as the docs advise \| [\d,]+ \| \*\*[\d.]+x\*\* "
            rf"\| 1\.00-1\.00 \| ([\d.]+|not read) \|",
            report,
        )
        if Path("/proc/self/stat").exists():  # the CPU a batch, and PackedList's share of it
            assert re.search(rf"{workload}: [\d.]+ ms against [\d.]+ ms, \*\*[\d.]+%\*\*", report)
        assert f"| {workload} | collate in a worker, and the batch into shared memory |" in report
        assert re.search(
            rf"\| {workload} \| (stand-in pinning \(a clone\)|pinned) \| \d+ \|", report
        )
    assert re.search(r"Targets: .*\*\*(met|MISSED)\*\*", report)


def test_corpus_before_after_times_both_checkouts_and_reports_each_cell(tmp_path: Path) -> None:
    """benchmarks/corpus_before_after.py, with this checkout as its own
    baseline: every tree and op has a time on both sides and a ratio, and the
    child refuses a checkout its pytree_kit did not come from."""
    import pytree_kit as pk

    if pk.ENGINE != "c":
        pytest.skip("it measures the C engine")
    proc = _run_quick(
        "corpus_before_after.py",
        tmp_path,
        "--baseline",
        str(ROOT),
        "--rounds",
        "2",
        "--families",
        "chain,dataclass",
    )
    data = json.loads((tmp_path / "corpus_before_after.json").read_text())
    assert data["rounds"] == 2 and data["before"] == data["after"]
    assert set(data["before_s"]) == set(data["after_s"]) and data["after_s"]
    for tid, cell in data["after_s"].items():
        assert cell["family"] in ("chain", "dataclass"), tid
        assert set(cell["s"]) == {"flatten", "unflatten", "leaves", "tree_map", "flatten_up_to"}
        assert all(v > 0 for v in cell["s"].values()) and data["before_s"][tid]["s"]
    text = (tmp_path / "corpus_before_after.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| chain", "| dataclass"))]
    # the summary's row for each family and op, then every tree
    assert len(rows) == 2 * 5 + len(data["after_s"])
    assert "before ÷ after" in proc.stdout and set(data["noise_gmean"]) == {"before", "after"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "corpus_before_after.py"), "--quick",
         "--baseline", str(elsewhere), "--rounds", "1", "--families", "chain",
         "--out", str(tmp_path / "bad")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode != 0 and "not the checkout" in bad.stderr + bad.stdout


def test_threads_benchmark_smoke(tmp_path: Path) -> None:
    _run_quick("threads.py", tmp_path)
    report = (tmp_path / "threads.md").read_text()
    assert re.search(r"GIL (on|off), engine (c|python)", report)
    rows = re.findall(r"^\| (\d) \| ([\d,]+) \| ([\d.]+) \| ([\d, ]+) \|$", report, re.M)
    assert [r[0] for r in rows] == ["1", "2"]
    assert rows[0][2] == "1.00" and all(int(r[1].replace(",", "")) > 0 for r in rows)
