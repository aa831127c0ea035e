#!/usr/bin/env python3
"""The benchmarks page, made from the recorded results, so the two cannot drift.

    python benchmarks/report.py           # docs/benchmarks.md, docs/assets/bench-*.png
    python benchmarks/report.py --check   # exit 1: page or chart not what the results give

Every figure on ``docs/benchmarks.md`` is read here from ``benchmarks/results/``
(the JSON and Markdown files the benchmark scripts write), and nothing else. A
chart's PNG carries a digest of the data it plots (its ``Description`` text
chunk), so ``--check`` needs no matplotlib: it rebuilds the page's text and
each chart's data, and compares the text and the digests. ``tests/test_report.py``
runs it. Rerun a benchmark, then this script, and commit both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
ASSETS = ROOT / "docs" / "assets"
VERSIONS = ("3.10", "3.11", "3.12", "3.13", "3.14", "3.15")
#: the runs of the corpus charted: each Python's release build, then the
#: portable core (built with PYTREE_KIT_NO_FAST_PATHS=1) on 3.11 and 3.13
#: (benchmarks/results/python3.X/no_fast_paths/)
PORTABLE = "no_fast_paths"
RUNS = (*((v, "") for v in VERSIONS), ("3.11", PORTABLE), ("3.13", PORTABLE))
#: the Pythons the tree algebra was recorded on (benchmarks/algebra.py)
ALGEBRA_VERSIONS = ("3.10", "3.11", "3.12", "3.13")
OPS = ("flatten", "unflatten", "leaves", "tree_map", "flatten_up_to")
OP_CALLS = {
    "flatten": "`pk.flatten(tree)` against each peer's `tree_flatten`",
    "unflatten": "`pk.unflatten(spec, leaves)` against each peer's `tree_unflatten`",
    "leaves": "`pk.leaves(tree)` against each peer's `tree_leaves` (dm-tree's `flatten`)",
    "tree_map": "`pk.tree_map(f, tree)` against each peer's `tree_map` (dm-tree's `map_structure`)",
    "flatten_up_to": (
        "`spec.flatten_up_to(tree)`, the call for trees of a known structure, against"
        " pytree_kit's own `flatten` of the same tree (the peers' `flatten_up_to` is"
        " slower than their `flatten`)"
    ),
}
X = "\N{MULTIPLICATION SIGN}"  # the speedup sign
CHART_STYLE = {"figure.dpi": 100, "font.size": 12, "svg.hashsalt": "pytree_kit"}
#: group labels longer than this wrap onto more lines (none is rotated)
LABEL_WIDTH = 14
COLORS = (
    "#4c72b0",
    "#dd8452",
    "#55a868",
    "#c44e52",
    "#8172b3",
    "#937860",
    "#a9a9a9",
    "#5f5f5f",
)


class ResultsError(Exception):
    """A results file is missing, or no longer has what the page reads from it."""


# -- reading the results -----------------------------------------------------------------


def _read(path: Path) -> str:
    if not path.exists():
        raise ResultsError(f"{path.relative_to(ROOT)} is missing")
    return path.read_text()


def md_table(path: Path, heading: Optional[str] = None) -> List[List[str]]:
    """The first Markdown table in the file from the line that starts with
    ``heading`` (the whole file when None; a heading that starts with '|' is
    the table's header row): its header row, then its rows,
    without the separator line."""
    lines = _read(path).splitlines()
    start = 0
    if heading is not None:
        for i, line in enumerate(lines):
            if line.startswith(heading):
                start = i if heading.startswith("|") else i + 1  # a table's own header
                break
        else:
            raise ResultsError(f"{path.relative_to(ROOT)} has no line starting {heading!r}")
    rows: List[List[str]] = []
    for line in lines[start:]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            break
    if not rows:
        raise ResultsError(f"{path.relative_to(ROOT)} has no table after {heading!r}")
    return rows


def md_line(path: Path, pattern: str) -> re.Match:
    """The first match of pattern in the file."""
    m = re.search(pattern, _read(path), flags=re.M)
    if m is None:
        raise ResultsError(f"{path.relative_to(ROOT)} has nothing matching {pattern!r}")
    return m


def number(cell: str) -> float:
    """A table cell's leading number: '1,538' -> 1538.0, '**1.341**' -> 1.341, '6.9x' -> 6.9."""
    m = re.search(r"-?[\d,]*\.?\d+", cell.replace("*", ""))
    if m is None:
        raise ResultsError(f"no number in the cell {cell!r}")
    return float(m.group(0).replace(",", ""))


def corpus(version: str, build: str = "") -> Dict[str, Any]:
    path = RESULTS / f"python{version}" / build / "corpus.json"
    return json.loads(_read(path))


def run_name(run: Tuple[str, str]) -> str:
    """A run's name in a chart: 'Python 3.13', 'Python 3.13, no fast paths'."""
    v, build = run
    return f"Python {v}" + (", no fast paths" if build else "")


def pivot(rows: List[List[str]], series: int, group: int, value: int) -> Tuple[list, dict]:
    """A table's body laid out for a chart: the groups (column ``group``'s
    values, in order) and, per value of column ``series``, the number in
    column ``value`` for each group."""
    groups = list(dict.fromkeys(r[group] for r in rows))
    found = {(r[series], r[group]): number(r[value]) for r in rows}
    names = dict.fromkeys(r[series] for r in rows)
    return groups, {n: [found[(n, g)] for g in groups] for n in names}


def columns(rows: List[List[str]], *names: str) -> List[List[str]]:
    """The named columns of a table (header first), in the order named."""
    header = rows[0]
    try:
        index = [header.index(n) for n in names]
    except ValueError as e:
        raise ResultsError(f"a table has columns {header}, not all of {names}") from e
    return [[row[i] for i in index] for row in rows]


# -- writing ---------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[str]], align: str = "") -> str:
    """rows (header first) as a Markdown table; align: one 'l' or 'r' a column."""
    header, body = rows[0], rows[1:]
    seps = ["---:" if a == "r" else "---" for a in (align or "l" + "r" * (len(header) - 1))]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(seps) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(out)


class Chart:
    """A chart's data and how to draw it; its digest goes into the PNG."""

    def __init__(self, name: str, alt: str, kind: str, data: Dict[str, Any]):
        self.name, self.alt, self.kind, self.data = name, alt, kind, data

    @property
    def file(self) -> str:
        return f"bench-{self.name}.png"

    @property
    def digest(self) -> str:
        text = json.dumps([self.kind, self.data], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def markdown(self) -> str:
        return f"![{self.alt}](assets/{self.file})"

    def draw(self, folder: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        with plt.rc_context(CHART_STYLE):
            fig = DRAW[self.kind](plt, self.data)
            fig.savefig(
                folder / self.file,
                metadata={"Software": None, "Description": self.digest},
            )
            plt.close(fig)


def _grouped(plt, data):
    """Grouped vertical bars: data = {title, ylabel, groups, series: {name: values}, line}."""
    groups, series = data["groups"], data["series"]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        values = [float("nan") if x is None else x for x in values]
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name, color=COLORS[k % len(COLORS)])
        if data.get("labels"):  # figures too small to see as bars: each one written
            ax.bar_label(bars, fmt="%.2f", fontsize=10, padding=2)
    if data.get("labels"):
        ax.margins(y=0.15)  # room above the tallest bar for its figure
    if data.get("line") is not None:
        ax.axhline(data["line"], color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([textwrap.fill(g, LABEL_WIDTH) for g in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    if data.get("log"):
        ax.set_yscale("log")
    ax.set_ylabel(data["ylabel"])
    # the legend between the title and the plot, never over a bar
    ax.set_title(data["title"], pad=34)
    ax.legend(ncol=len(series), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _horizontal(plt, data):
    """Grouped horizontal bars, one row a label: data as _grouped's."""
    groups, series = data["groups"], data["series"]
    fig, ax = plt.subplots(figsize=(10, max(3.0, 1.4 + 0.1 * len(groups) * (len(series) + 1))))
    height = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        values = [float("nan") if x is None else x for x in values]
        ys = [i + (k - (len(series) - 1) / 2) * height for i in range(len(groups))]
        ax.barh(ys, values, height, label=name, color=COLORS[k % len(COLORS)])
    if data.get("line") is not None:
        ax.axvline(data["line"], color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels(groups)
    ax.set_ylim(len(groups) - 0.5, -0.5)  # the first group on top, no empty band
    if data.get("log"):
        ax.set_xscale("log")
    ax.set_xlabel(data["ylabel"])
    fig.suptitle(data["title"])  # over the figure: the labels take much of the width
    ax.grid(axis="x", alpha=0.3)
    if len(series) > 1:  # below the bars, never over them or beside (long labels need the width)
        fig.legend(loc="lower center", ncol=len(series), frameon=False)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
    else:
        fig.tight_layout()
    return fig


DRAW = {"grouped": _grouped, "horizontal": _horizontal}


# -- the sections ------------------------------------------------------------------------------


def _corpus_rows(
    op: str, data: Dict[Tuple[str, str], Dict[str, Any]]
) -> Tuple[List[str], Dict[Tuple[str, str], List[float]], List[List[str]]]:
    """The labels, per-Python values and table rows of one operation: each
    family's worst tree, then the six named trees one by one."""
    labels: List[str] = []
    values: Dict[Tuple[str, str], List[float]] = {r: [] for r in RUNS}
    rows = [["tree"] + [run_name((data[r]["python"], r[1])) for r in RUNS]]
    first = data[RUNS[0]]
    for family in first["families"]:
        if family == "named":
            continue
        labels.append(f"{family} (worst)")
        cells = [f"{family}, worst of {first['families'][family][op]['trees']} sizes"]
        for r in RUNS:
            cell = data[r]["families"][family][op]
            values[r].append(round(cell["worst"], 3))
            cells.append(f"{cell['worst']:.2f}{X} ({cell['worst_tree']})")
        rows.append(cells)
    for tree in first["trees"]:
        if tree["family"] != "named":
            continue
        labels.append(tree["label"])
        cells = [tree["label"]]
        for r in RUNS:
            (same,) = [t for t in data[r]["trees"] if t["label"] == tree["label"]]
            cell = same["ops"][op]
            values[r].append(round(cell["speedup"], 3))
            cells.append(f"{cell['speedup']:.2f}{X} ({cell['us']:.3g} µs)")
        rows.append(cells)
    return labels, values, rows


def operations() -> Tuple[str, List[Chart]]:
    data = {r: corpus(*r) for r in RUNS}
    out = [
        "## The core operations",
        "",
        "pytree_kit's C engine against the fastest of jax.tree_util, optree,"
        " torch.utils._pytree, torch.utils._cxx_pytree and dm-tree, on 47 trees"
        " of 13 families: `state_dict`s of 10 to 5,000 keys, optimizer states,"
        " configs, lists of records, deep chains, wide lists, dataclass, attrs and"
        " namedtuple batches, transformers-style `ModelOutput`s, trees with None,"
        " dicts with mixed keys, and six named trees, (a) to (f)."
        " Each cell is the **speedup**: the fastest peer's time over pytree_kit's,"
        f" so above 1{X} is faster than every peer. A family's row is its worst tree."
        " Every tree and peer: `benchmarks/results/python3.X/corpus.md`; the peers"
        " and leaves of each Python: [How these are measured](#how-these-are-measured).",
        "",
    ]
    charts = []
    for op in OPS:
        labels, values, rows = _corpus_rows(op, data)
        what = "its own flatten" if op == "flatten_up_to" else "the fastest peer"
        chart = Chart(
            op,
            f"{op}: speedup over {what} per tree and Python",
            "horizontal",
            {
                "title": f"{op}: speedup over {what} (higher is better)",
                "ylabel": f"speedup ({X})",
                "groups": labels,
                "series": {run_name(r): values[r] for r in RUNS},
                "line": 1.0,
            },
        )
        charts.append(chart)
        out += [
            f"### {op}",
            "",
            chart.markdown(),
            "",
            f"{OP_CALLS[op]}.",
            "",
            table([r[: 1 + len(VERSIONS)] for r in rows]),
            "",
            "The portable core alone (no layout fast paths):",
            "",
            table([[r[0], *r[1 + len(VERSIONS) :]] for r in rows]),
            "",
        ]
    out += [
        "### Without the layout fast paths",
        "",
        "The C engine's core reads through CPython's public API; each fast path that"
        " reads CPython's own layouts is an add-on, kept only where it buys at least"
        " 10 % on some family (`benchmarks/fast_paths.py`, in callgrind's instructions:"
        " `benchmarks/results/python3.X/fast_paths.md`). The charts' last two runs are"
        " the portable core alone, built with `PYTREE_KIT_NO_FAST_PATHS=1` on 3.11 and"
        " 3.13 (`benchmarks/results/python3.X/no_fast_paths/corpus.md`): what any"
        " Python the engine was not validated on gets. On 3.10 and 3.11 the portable"
        " core keeps no class plan from one call to the next (no public API gives a"
        " class's version tag before 3.12), so trees of records pay for their plans"
        " in every call.",
        "",
    ]
    return "\n".join(out), charts


def algebra() -> Tuple[str, List[Chart]]:
    tables = {
        v: md_table(RESULTS / f"python{v}" / "algebra.md", "## Worst ratio")
        for v in ALGEBRA_VERSIONS
    }
    cells_of = {v: {r[0]: number(r[1]) for r in tables[v][1:]} for v in ALGEBRA_VERSIONS}
    # the functions only torch has a peer for are timed where torch is (3.11)
    functions = list(
        dict.fromkeys(r[0] for v in ("3.11", *ALGEBRA_VERSIONS) for r in tables[v][1:])
    )
    rows = [["function"] + [f"Python {v}" for v in ALGEBRA_VERSIONS]]
    values: Dict[str, List[Optional[float]]] = {v: [] for v in ALGEBRA_VERSIONS}
    for name in functions:
        cells = [name]
        for v in ALGEBRA_VERSIONS:
            x = cells_of[v].get(name)
            values[v].append(x)
            cells.append("—" if x is None else f"{x:.2f}{X}")
        rows.append(cells)
    # the outlier the caption explains: jax's flatten_one_level, on the Pythons
    # whose jax has one (3.10's does not: optree is the peer there)
    below = [v for v in ALGEBRA_VERSIONS if cells_of[v].get("flatten_one_level", 1.0) < 1.0]
    one_level_low = min((cells_of[v]["flatten_one_level"] for v in below), default=1.0)
    chart = Chart(
        "algebra",
        "tree algebra: worst speedup over the fastest peer per function",
        "horizontal",
        {
            "title": "tree algebra: worst speedup over the fastest peer (log scale)",
            "ylabel": f"speedup ({X})",
            "groups": functions,
            "series": {f"Python {v}": values[v] for v in ALGEBRA_VERSIONS},
            "line": 1.0,
            "log": True,
        },
    )
    method = md_line(RESULTS / "python3.11" / "algebra.md", r"^- `python benchmarks/algebra.py`.*$")
    out = [
        "## The tree algebra",
        "",
        chart.markdown(),
        "",
        "Filters, reductions, restructuring and spec algebra (`tree_map_only`,"
        " `tree_sum`, `tree_transpose`, `spec.paths()`, ...) against the fastest of"
        " optree, jax.tree_util, torch.utils._pytree and dm-tree that has the"
        " function (a dash: no peer on that Python; the `_only` functions are"
        " torch's, timed where torch is installed). Each cell is the worst"
        f" speedup over the trees timed; below 1{X}"
        " the peer is faster (`flatten_one_level` makes a spec where optree's"
        " returns only the children; `spec.paths()` computes its paths on the"
        " first call and keeps them).",
        "",
        f"*The outlier:* `flatten_one_level` falls to {one_level_low:.2f}{X} on"
        f" {', '.join(below)} on a list"
        " of 1,000 records, where jax's hands back the list it was given (faster than"
        " copying the list: `list(records) alone` in the results) while pytree_kit"
        " makes a new list and its spec. On 3.10, the jax that installs there has no"
        " `flatten_one_level`, so the peer is optree, and the figure is"
        f" {cells_of['3.10'].get('flatten_one_level', float('nan')):.2f}{X}.",
        "",
        table(rows),
        "",
        f"**Method.** {method.group(0)[2:]} Every cell: `benchmarks/results/python3.X/algebra.md`.",
        "",
    ]
    return "\n".join(out), [chart]


def batches() -> Tuple[str, List[Chart]]:
    path = RESULTS / "batches.md"
    machine = md_line(path, r"^Machine: (.*?)\.?$").group(1)
    collate = md_table(path, "## collate")
    consolidate = md_table(path, "## consolidate")
    loader = md_table(path, "## A DataLoader")
    check = md_table(path, "## The check")
    chart = Chart(
        "collate",
        "collate: time against default_collate per input",
        "horizontal",
        {
            "title": "collate / default_collate, time (lower is better)",
            "ylabel": "ratio",
            "groups": [r[0] for r in collate[1:]],
            "series": {"collate": [number(r[3]) for r in collate[1:]]},
            "line": 1.0,
        },
    )
    out = [
        "## Collating and consolidating batches",
        "",
        chart.markdown(),
        "",
        "`pytree_kit.torch.collate` against torch's `default_collate` on the"
        " samples both accept (and on dataclass, namedtuple and protocol samples,"
        " against the same samples as dicts); below 1 is faster.",
        "",
        table(collate),
        "",
        "`consolidate` (every tensor of a tree in one storage) against"
        " tensordict's `TensorDict.consolidate()` on the same tensors:",
        "",
        table(consolidate),
        "",
        "A DataLoader with 2 workers and batches of 1,000 small tensors, plain"
        " and with `collate(consolidate=True)` (one storage, so one file"
        " descriptor, a batch):",
        "",
        table(loader),
        "",
        "The check that no leaf holds tensors pytree_kit does not see (the"
        " default, `strict=True`) against `strict=False`:",
        "",
        table(check),
        "",
        f"**Method.** `python benchmarks/batches.py`; best of interleaved rounds; {machine}.",
        "",
    ]
    return "\n".join(out), [chart]


def device() -> Tuple[str, List[Chart]]:
    host_path, gpu_path = RESULTS / "pinning.md", RESULTS / "gpu_h200" / "pinning.md"
    host = md_table(host_path, "## Host side")
    host_machine = md_line(host_path, r"^(torch .*ms per call\.)$").group(1)
    host_rows = columns(
        host,
        "batch",
        "flatten",
        "pack",
        "copy",
        "rebuild",
        "unflatten",
        "**whole, copy to CPU**",
        "per tensor (meta)",
        "floor",
    )
    host_rows[0][6] = "whole call"
    gpu = md_table(gpu_path, "## On the GPU")
    gpu_machine = md_line(gpu_path, r"^(torch .*CUDA 13.*)$").group(1)
    gpu_rows = columns(gpu, "batch", "way", "ms", "host ms", "vs per tensor")
    ways, series = pivot(gpu_rows[1:], series=0, group=1, value=4)
    chart = Chart(
        "device",
        "moving a batch to the GPU: speedup over pinning and moving tensor by tensor",
        "horizontal",
        {
            "title": "to the GPU: speedup over per-tensor pin + copy (higher is better)",
            "ylabel": f"speedup ({X})",
            "groups": ways,
            "series": series,
            "line": 1.0,
        },
    )
    out = [
        "## Moving batches to the GPU",
        "",
        chart.markdown(),
        "",
        "`to_device(batch, 'cuda', non_blocking=True, coalesce=True)` packs the"
        " small tensors of each dtype into one reused pinned buffer, copies it"
        " with one `copy_`, and rebuilds the leaves on the device, each with its"
        " own version counter; tensors over `STAGE_LIMIT` go through the pinned"
        " buffer one copy each. *Per tensor* is `t.pin_memory().to(device,"
        " non_blocking=True)` on every leaf; *torch DataLoader pinning* is"
        " torch's own `pin_memory` of the batch, then moving it tensor by tensor.",
        "",
        table(gpu_rows),
        "",
        f"**Method.** `bash scripts/gpu_checks.sh` (`benchmarks/pinning.py`): {gpu_machine}",
        "",
        "The host side of the same call, per part, with the copy sent to the"
        " CPU (a 256 KB memcpy for the small batches), in ms; *floor* is what any"
        " implementation that returns separate tensors pays (reading every"
        " tensor's dtype and element count, one `torch.cat` per group, one"
        " split per group, each alone):",
        "",
        table(host_rows),
        "",
        "In the last row the parts time staging its 40 MB (a `torch.cat`, then a"
        " copy), which the whole call never does: its tensors are over"
        " `STAGE_LIMIT` and go one by one, and a CPU tensor sent to the CPU comes"
        " back as it is, so that whole call is the walk alone.",
        "",
        f"**Method.** `python benchmarks/pinning.py` on x86_64 Linux, 2 CPU cores: {host_machine}"
        " Instruction counts (callgrind) and every run: `benchmarks/results/pinning.md`.",
        "",
    ]
    return "\n".join(out), [chart]


def _transfer_chart(name: str, rows: list, where: str) -> Chart:
    """The peers' time over the default to_device's, a batch a row of a
    transfer_peers.md table (``where``: "" on the CPU, else the GPU's name)."""
    ours = rows[0].index("pkt.to_device (default)")
    series = {
        peer: [number(r[k]) / number(r[ours]) for r in rows[1:]]
        for k, peer in enumerate(rows[0][1:4], start=1)
    }
    to = f" to an {where}" if where else ""
    return Chart(
        name,
        f"moving a batch{to}: the default to_device against accelerate, Lightning and tree_map",
        "horizontal",
        {
            "title": (f"to an {where}: " if where else "")
            + "each way's time / to_device's default (above 1: to_device is faster)",
            "ylabel": f"ratio ({X})",
            "groups": [r[0] for r in rows[1:]],
            "series": series,
            "line": 1.0,
        },
    )


def transfer() -> Tuple[str, List[Chart]]:
    path, pipe_path = RESULTS / "transfer_peers.md", RESULTS / "pipeline.md"
    machine = md_line(path, r"^(torch .*ms per call\.)$").group(1)
    rows = md_table(path)
    chart = _transfer_chart("transfer", rows, "")
    thresholds = md_line(path, r"^(Packing pays from .*)$").group(1)
    gpu_path, gpu_pipe_path = (
        RESULTS / "gpu_h200" / "transfer_peers.md",
        RESULTS / "gpu_h200" / "pipeline.md",
    )
    gpu_machine = md_line(gpu_path, r"^(torch .*ms per call\.)$").group(1)
    gpu_rows = md_table(gpu_path)
    gpu_chart = _transfer_chart("transfer-gpu", gpu_rows, "H200")
    gpu_thresholds = md_line(gpu_path, r"^(Packing pays from .*)$").group(1)
    gpu_whole = md_table(gpu_pipe_path, "## Whole pipelines")
    gpu_pipe_machine = md_line(gpu_pipe_path, r"^(torch .*)$").group(1)
    pipe_machine = md_line(pipe_path, r"^(torch .*)$").group(1)
    whole = md_table(pipe_path, "## Whole pipelines")
    parts = md_table(pipe_path, "## Parts, in one process")
    pinning = md_table(pipe_path, "## Where PinnedLoader's thread spends its time")
    share = md_line(pipe_path, r"^(What `PackedList` adds to a batch.*)$").group(1)
    least = md_line(pipe_path, r"^(Collate in this process, at best.*)$").group(1)
    (read,) = [r for r in parts if r[0] == "tokenizer" and r[1].startswith("reading")]
    read_us = number(read[4]) * 1e3 / int(read[1].split()[1])
    slowest = min(
        float(r[4].split("-")[0]) for r in whole[1:] if r[1] == "torch"
    )  # "0.81-1.00": the slowest round against the fastest
    out = [
        "## Moving a batch against accelerate and Lightning",
        "",
        chart.markdown(),
        "",
        "`pytree_kit.torch.to_device(batch, device)` at its default (it picks, per"
        ' batch, between one staged copy and a copy each: docs/loading.md, "How'
        ' `to_device` moves a batch"), with `coalesce=True` and `coalesce=False`,'
        " against accelerate's `send_to_device`, Lightning's `move_data_to_device`"
        " and `tree_map(lambda t: t.to(device))`, each called as a user calls it.",
        " *Left behind* counts the tensors a way gave back unmoved: accelerate and"
        " `tree_map` skip a dataclass's tensors, so the target compares the default"
        " with the fastest peer that moves every tensor (the same batch with its"
        " targets in dicts, which every peer moves, is the row after it).",
        "",
        table(rows),
        "",
        f"**Method.** `python benchmarks/transfer_peers.py --thresholds`,"
        f" host-side: {machine} The target is `meta`, and a stand-in"
        " `Tensor.to` makes the copy on the CPU for every way alike; a GPU's"
        " cost per copy (7 µs from ordinary memory on an H200) is not in these"
        " figures, so they understate what staging saves there (on a GPU:"
        f" below). {thresholds}",
        "",
        "### On a GPU",
        "",
        gpu_chart.markdown(),
        "",
        table(gpu_rows),
        "",
        f"**Method.** `bash scripts/gpu_checks.sh` (`benchmarks/transfer_peers.py"
        f" --thresholds`), {gpu_machine} Each call is timed to a"
        " `torch.cuda.synchronize()` after it: Lightning's copies are queued"
        " (`non_blocking=True`) and waited for there, a blocking call's inside"
        " it; `benchmarks/results/gpu_h200/transfer_bound.md` measures what a"
        f" blocking call can reach (README.md beside it). {gpu_thresholds}",
        "",
        "The whole input pipeline on the same machine (four workers; samples per"
        " second over the second epoch, the best of three rounds):",
        "",
        table(gpu_whole),
        "",
        f"**Method.** `benchmarks/pipeline.py`: {gpu_pipe_machine}"
        " The parts and the pinning thread's profile:"
        " `benchmarks/results/gpu_h200/pipeline.md`.",
        "",
        "The input pipeline, whole and part by part, against torch's own"
        " (`benchmarks/pipeline.py`; CPU only: nothing is pinned, and moving to"
        " the CPU is a no-op for both; samples per second over the second"
        " epoch, the best of rounds that each run every pipeline once, in"
        " turn). With four workers on two cores, the workers' time comes out"
        " of the main process's: `PackedList` reads a batch's samples together"
        f" ({read_us:.1f} µs a tokenizer sample) where a list hands them over."
        " The last column is how far one pipeline's rounds moved in the same"
        f" run (torch's own by as much as {1 - slowest:.2f}), so a ratio that"
        " close to 1.0 is not told apart from it here.",
        "",
        table(whole),
        "",
        "Parts, in one process, best of interleaved rounds, ms a batch. Collate"
        " is timed in this process and as in a worker, where a DataLoader runs"
        " it: there `default_collate` and `pkt.collate` stack into shared"
        " memory, a custom collate's `torch.stack` does not, and each batch's"
        " storages then go into shared memory, as its pickling puts them. That"
        " trip costs more than the collate: each storage is a new shared-memory"
        " segment, whose pages are faulted in as they are written.",
        "",
        table(parts),
        "",
        least,
        "",
        share,
        "",
        "Where `PinnedLoader`'s thread spends a batch's time, in the advised"
        " pipeline's second epoch (ms a batch; with no accelerator, pinning is"
        " a stand-in that packs and copies into memory that is not pinned).",
        "",
        table(pinning),
        "",
        f"**Method.** {pipe_machine}",
        "",
    ]
    return "\n".join(out), [chart, gpu_chart]


def packed() -> Tuple[str, List[Chart]]:
    path = RESULTS / "packed.md"
    made = md_line(path, r"^Generated by `benchmarks/packed.py` \((.*)\)\. Machine: (.*?)\.?$")
    stores = md_table(path, "## Stores")
    epoch = md_table(path, "## One epoch")
    opening = md_line(path, r"^## Opening a saved PackedList\n\n(.*)$").group(1)
    growth = columns(epoch, "store", "start", "growth")
    store_names, by_start = pivot(growth[1:], series=1, group=0, value=2)
    chart = Chart(
        "packed",
        "a DataLoader worker's memory growth over one epoch, per store",
        "grouped",
        {
            "title": "a worker's private memory growth over an epoch, MiB (lower is better)",
            "labels": True,
            "ylabel": "MiB",
            "groups": store_names,
            "series": by_start,
            "line": None,
        },
    )
    out = [
        "## Datasets without copy-on-read",
        "",
        chart.markdown(),
        "",
        "A COCO-like dataset of nested samples kept four ways: a list of dicts,"
        " a list of pickled samples, a `PackedList`, and a tensordict of the"
        " per-image numbers only. A list of dicts is copied page by page into"
        " every forked worker as reference counts are touched; a `PackedList`"
        " is a few flat tensors, so it is not.",
        "",
        table(stores),
        "",
        "One epoch, each store in a fresh process (MiB); *growth* is the largest"
        " growth of one worker's private memory (USS) during the epoch:",
        "",
        table(epoch),
        "",
        f"{opening}",
        "",
        f"**Method.** `python benchmarks/packed.py` ({made.group(1)}); {made.group(2)}.",
        "",
    ]
    return "\n".join(out), [chart]


def ravel() -> Tuple[str, List[Chart]]:
    path = RESULTS / "ravel.md"
    ratios = md_table(path, "## Ratio per model")
    machine = md_line(path, r"^- (CPU: .*)$").group(1)
    versions = md_line(path, r"^- (torch .*)$").group(1)
    named = [[r[0], f"{r[1]} vs {r[2]}", r[3]] for r in ratios[1:]]
    models, series = pivot(named, series=1, group=0, value=2)
    chart = Chart(
        "ravel",
        "ravel and unravel: speedup over parameters_to_vector and jax's ravel_pytree",
        "horizontal",
        {
            "title": f"ravel / unravel: the peer's time over pytree_kit's ({X}, log scale)",
            "ylabel": f"speedup ({X})",
            "groups": models,
            "series": series,
            "line": 1.0,
            "log": True,
        },
    )
    out = [
        "## One vector of a tree: ravel",
        "",
        chart.markdown(),
        "",
        "`flat, unravel = pk.ravel(tree)` against torch's `parameters_to_vector`"
        " / `vector_to_parameters` on a model's parameters, and against jax's"
        " `ravel_pytree` on the same parameters as numpy arrays; above 1 is"
        " faster. `vector_to_parameters` points each parameter into the vector;"
        " `unravel` returns tensors cut from one private copy of it, so on a few"
        " large tensors that copy is most of its time.",
        "",
        table(ratios),
        "",
        f"**Method.** `python benchmarks/ravel.py`: median of interleaved rounds;"
        f" {machine}; {versions}. Every cell, with the bounds:"
        " `benchmarks/results/ravel.md`.",
        "",
    ]
    return "\n".join(out), [chart]


def compiled() -> Tuple[str, List[Chart]]:
    path = RESULTS / "compiled.md"
    runs = md_table(path, "| library")
    rows = [["library", "compile (s)", "call (µs)", "eager (µs)", "guards", "graphs"], *runs[1:]]
    method = md_line(path, r"^`python benchmarks/compiled.py`: (.*)$").group(1)
    machine = md_line(path, r"^Machine: (.*?)\.?$").group(1)
    history = md_table(path, "## Runs at this code")
    chart = Chart(
        "compiled",
        "inside torch.compile: compile time and call time per library",
        "grouped",
        {
            "title": "in torch.compile: pytree_kit / torch.utils._pytree per run (lower: better)",
            "ylabel": "ratio",
            "groups": [f"run {r[0].split()[0]}" for r in history[1:]],
            "series": {
                "compile time": [number(r[1]) for r in history[1:]],
                "steady-state call": [number(r[2]) for r in history[1:]],
            },
            "line": 1.0,
        },
    )
    out = [
        "## Inside torch.compile",
        "",
        chart.markdown(),
        "",
        "A wrapper that flattens a batch, changes one leaf and unflattens, under"
        " `torch.compile(fullgraph=True)`: pytree_kit, torch.utils._pytree and"
        " optree each trace into one graph that fresh batches reuse.",
        "",
        table(rows),
        "",
        "pytree_kit / torch.utils._pytree, in three runs of the same code:",
        "",
        table(columns(history, "run", "compile, pk / torch", "call, pk / torch")),
        "",
        f"**Method.** `python benchmarks/compiled.py`: {method} {machine}.",
        "",
    ]
    return "\n".join(out), [chart]


def distributed() -> Tuple[str, List[Chart]]:
    path = RESULTS / "distributed.md"
    times = md_table(path, "## Times")
    setup = md_line(path, r"^(Backend .*?)\. Median").group(1)
    machine = md_line(path, r"^- (Python .*)$").group(1)
    chart = Chart(
        "distributed",
        "all_reduce_tree: speedup over one all_reduce per tensor",
        "horizontal",
        {
            "title": "all_reduce_tree: speedup over one all_reduce per tensor (log scale)",
            "ylabel": f"speedup ({X})",
            "groups": [r[0] for r in times[1:]],
            "series": {
                "vs per tensor": [number(r[6]) for r in times[1:]],
                "vs per tensor, async": [number(r[7]) for r in times[1:]],
            },
            "line": 1.0,
            "log": True,
        },
    )
    out = [
        "## Collectives over a tree",
        "",
        chart.markdown(),
        "",
        "`all_reduce_tree` (one collective per dtype bucket) against one"
        " `all_reduce` per tensor, and the same loop with `async_op=True`; ms per"
        " call; *floor* is one collective of all the bytes.",
        "",
        table(times),
        "",
        f"**Method.** `python benchmarks/distributed.py`: {setup}; median after a"
        f" warm-up; {machine}.",
        "",
    ]
    return "\n".join(out), [chart]


def checkpoint() -> Tuple[str, List[Chart]]:
    path = RESULTS / "checkpoint.md"
    rows = md_table(path, "| |")
    setup = md_line(path, r"^(torch .*?), ms\.$").group(1)
    ways = ["ours", "DCP alone", "DCP, tensors only", "torch.save / torch.load"]
    picked = columns(rows, "", *ways, "our work alone")
    picked[0][0] = ""
    chart = Chart(
        "checkpoint",
        "checkpointing: save and load time per way",
        "grouped",
        {
            "title": "checkpoint of 102 MB of tensors in dataclasses, ms (lower is better)",
            "ylabel": "ms",
            "groups": ways,
            "series": {r[0]: [number(r[1 + i]) for i in range(len(ways))] for r in picked[1:]},
            "line": None,
        },
    )
    out = [
        "## Checkpointing nested state",
        "",
        chart.markdown(),
        "",
        "`pytree_kit.torch.checkpoint.save` / `load` against torch's"
        " distributed checkpoint (DCP) on the same state dict, DCP given only"
        " the tensors (a state it could not restore: the floor of any DCP-based"
        " way), and `torch.save` / `torch.load`. *Our work alone* is what"
        " pytree_kit adds to DCP's own work.",
        "",
        table(picked),
        "",
        f"**Method.** `python benchmarks/checkpoint.py`: {setup}.",
        "",
    ]
    return "\n".join(out), [chart]


#: the core operations timed against the peers (flatten_up_to is timed
#: against pytree_kit's own flatten)
PEER_OPS = OPS[:4]


def _worst(run: Dict[str, Any], op: str) -> Tuple[float, str, str]:
    """An operation's worst speedup over one run's trees, and that tree: as a
    table cell names it ('dataclass, 4 items') and as prose does ('dataclass (4 items)')."""
    family, cells = min(run["families"].items(), key=lambda kv: kv[1][op]["worst"])
    cell = cells[op]
    if family == "named":
        return cell["worst"], cell["worst_tree"], cell["worst_tree"]
    return (
        cell["worst"],
        f"{family}, {cell['worst_tree']}",
        f"{family} ({cell['worst_tree']})",
    )


def _lowest(
    data: Dict[Tuple[str, str], Dict[str, Any]], runs: Sequence[Tuple[str, str]], ops: Sequence[str]
) -> Tuple[float, str, str, str]:
    """The lowest of the runs' worst cases in the operations: (speedup, op, tree, Python)."""
    cases = [(_worst(data[r], op), op, data[r]["python"]) for r in runs for op in ops]
    (x, _, tree), op, python = min(cases, key=lambda c: c[0][0])
    return x, op, tree, python


def verdict() -> str:
    """The page's lead: what the core operations' worst cases say, and their table."""
    data = {r: corpus(*r) for r in RUNS}
    release = [(v, "") for v in VERSIONS]
    trees = len(data[release[0]]["trees"])
    ops = ", ".join(PEER_OPS[:-1]) + f" and {PEER_OPS[-1]}"
    span = f"{VERSIONS[0]} to {VERSIONS[-1]}"
    x, op, tree, python = _lowest(data, release, PEER_OPS)
    if x > 1:
        lead = (
            f"**On every Python from {span}, pytree_kit's C engine is faster than the"
            f" fastest peer on each of the {trees} trees in {ops}:** at worst"
            f" {x:.2f}{X}, {op} of {tree} on Python {python}."
        )
    else:
        below = sum(_worst(data[r], o)[0] <= 1 for r in release for o in PEER_OPS)
        lead = (
            f"**On the Pythons from {span}, pytree_kit's C engine is not faster than the"
            f" fastest peer in {below} of the {len(release) * len(PEER_OPS)} worst cases"
            f" of {ops} below:** at worst {x:.2f}{X}, {op} of {tree} on Python {python}."
        )
    x, _, tree, python = _lowest(data, release, ("flatten_up_to",))
    own = (
        "`spec.flatten_up_to`, the call for trees of a known structure, is"
        f" {'faster' if x > 1 else 'not faster'} than pytree_kit's own `flatten` on"
        f" every tree: at worst {x:.2f}{X}, on {tree} on Python {python}."
    )
    faster, slower = [], []
    for r in RUNS:
        if not r[1]:
            continue
        x, op, tree, _ = _lowest(data, [r], PEER_OPS)
        if x > 1:
            faster.append(f"on {r[0]} (at worst {x:.2f}{X}, {op} of {tree})")
        else:
            old = tuple(map(int, r[0].split("."))) < (3, 12)
            why = ": before 3.12 no public API tells it that a class is unchanged" if old else ""
            slower.append(f"on {r[0]} ({x:.2f}{X}, {op} of {tree}{why})")
    portable = "The portable core alone, the C engine built without the fast paths that read"
    portable += (
        " CPython's own layouts ([Without the layout fast paths](#without-the-layout-fast-paths)),"
    )
    if faster:
        portable += (
            f" is faster than every peer on every tree in those operations {' and '.join(faster)}"
        )
        portable += f", and not {' and '.join(slower)}." if slower else "."
    else:
        portable += f" is not faster than every peer {' and '.join(slower)}."
    most = max(release, key=lambda r: len(data[r]["peers"]))
    peers = list(dict.fromkeys(k for r in (most, *release) for k in data[r]["peers"]))
    rows = [["Python", *PEER_OPS, "flatten_up_to (own flatten)"]]
    for r in RUNS:
        cells = [run_name((data[r]["python"], r[1]))]
        for op in OPS:
            x, tree, _ = _worst(data[r], op)
            cells.append(f"{x:.2f}{X} ({tree})")
        rows.append(cells)
    return "\n".join(
        [
            f"{lead} {own} {portable}",
            "",
            "Each operation's worst case on each Python: the lowest speedup over the"
            f" fastest peer across the {trees} trees, and the tree it is on; above 1{X}"
            " pytree_kit is faster than every peer (flatten_up_to: than its own"
            f" `flatten`). The peers are {', '.join(peers[:-1])} and {peers[-1]},"
            " each where it installs ([How these are measured](#how-these-are-measured)).",
            "",
            table(rows),
        ]
    )


def measured() -> str:
    """The last section: how the figures are measured."""
    data = {r: corpus(*r) for r in RUNS}
    repeats = " or ".join(str(n) for n in dict.fromkeys(data[r]["repeats"] for r in RUNS))
    least = " or ".join(f"{t * 1e3:g} ms" for t in dict.fromkeys(data[r]["min_time"] for r in RUNS))

    def setup(r: Tuple[str, str]) -> List[str]:
        return [data[r]["leaves"], ", ".join(f"{k} {w}" for k, w in data[r]["peers"].items())]

    # a portable-core run gets a row only where its set-up is not its Python's
    rows = [["Python", "leaves", "peers"]] + [
        [run_name((data[r]["python"], r[1])), *setup(r)]
        for r in RUNS
        if not r[1] or setup(r) != setup((r[0], ""))
    ]
    return "\n".join(
        [
            "## How these are measured",
            "",
            "Each ratio sets another library's time against pytree_kit's, and each"
            " section says which way its ratios read (in the core operations, above"
            f" 1{X} is faster than every peer). Each section's **Method** names its"
            " script, machine and versions; every figure on this page is read from"
            " `benchmarks/results/`.",
            "",
            "The core operations: `python benchmarks/corpus.py` on each Python, in one"
            f" process: median of {repeats} interleaved loops per cell, each of at"
            f" least {least} after a warm-up call, gc enabled with `gc.freeze()` after"
            " the imports. Peers get the dataclasses registered (pytree_kit needs"
            " nothing); a peer that sees another number of leaves (torch.utils._pytree"
            " takes None for a leaf) takes no part in that tree. On x86_64 Linux with"
            " 2 CPU cores; the leaves (and Python numbers) and the peers of each"
            " Python, the portable core's runs with their Python's:",
            "",
            table(rows, "lll"),
            "",
            "Timings on a 2-core machine shared with other work move by several"
            " percent between runs; each benchmark interleaves the libraries round"
            " by round so a drift of the machine hits all of them alike. Where the"
            " machine is too noisy for a decision, the same scripts count"
            " instructions with callgrind (`--instructions`).",
            "",
            "Run any benchmark yourself (`pip install -e '.[bench,torch]' -c constraints.txt`):",
            "",
            "```sh",
            "python benchmarks/corpus.py            # the core operations, 47 trees",
            "python benchmarks/compare.py --quick   # six trees, with the pure engine, in a minute",
            "python benchmarks/report.py            # this page, from benchmarks/results/",
            "```",
            "",
        ]
    )


def readme_chart() -> Chart:
    """The README's one chart: each operation's worst speedup over the 47 trees, per Python."""
    data = {r: corpus(*r) for r in RUNS}
    series = {
        run_name(r): [
            round(min(f[op]["worst"] for f in data[r]["families"].values()), 3) for op in OPS
        ]
        for r in RUNS
    }
    return Chart(
        "summary",
        "worst speedup over the fastest peer across 47 trees, per operation and Python",
        "grouped",
        {
            "title": "pytree_kit's worst speedup over the fastest peer, 47 trees (higher: better)",
            "ylabel": f"speedup ({X})",
            "groups": ["flatten", "unflatten", "leaves", "tree_map", "flatten_up_to (own flatten)"],
            "series": series,
            "line": 1.0,
        },
    )


def page() -> Tuple[str, List[Chart]]:
    summary = readme_chart()
    parts, charts = [], [summary]
    for section in (
        operations,
        algebra,
        ravel,
        batches,
        device,
        transfer,
        packed,
        compiled,
        distributed,
        checkpoint,
    ):
        text, more = section()
        parts.append(text)
        charts += more
    head = "\n".join(
        [
            "# Benchmarks",
            "",
            "<!-- Made by `python benchmarks/report.py` from benchmarks/results/;"
            " edit the script, not this page. -->",
            "",
            summary.markdown(),
            "",
            verdict(),
            "",
            "- [The core operations](#the-core-operations): flatten, unflatten,"
            " leaves, tree_map, flatten_up_to",
            "- [The tree algebra](#the-tree-algebra)",
            "- [One vector of a tree: ravel](#one-vector-of-a-tree-ravel)",
            "- [Collating and consolidating batches](#collating-and-consolidating-batches)",
            "- [Moving batches to the GPU](#moving-batches-to-the-gpu)",
            "- [Moving a batch against accelerate and Lightning]"
            "(#moving-a-batch-against-accelerate-and-lightning)",
            "- [Datasets without copy-on-read](#datasets-without-copy-on-read)",
            "- [Inside torch.compile](#inside-torchcompile)",
            "- [Collectives over a tree](#collectives-over-a-tree)",
            "- [Checkpointing nested state](#checkpointing-nested-state)",
            "- [How much room is left](#how-much-room-is-left)",
            "- [How these are measured](#how-these-are-measured)",
            "",
        ]
    )
    tail = "\n".join(
        [
            "## How much room is left",
            "",
            "What no implementation can beat, measured on the same machine: a C walk"
            " of exact dicts, lists and tuples with no spec for `leaves()`"
            " (`benchmarks/results/leaves_bound.md`), and a C rebuild from a plan"
            " compiled ahead for `unflatten()`"
            " (`benchmarks/results/python3.X/unflatten_bound.md`); each record names"
            " the commit it measured.",
            "",
            measured(),
        ]
    )
    return head + "\n" + "\n".join(parts) + "\n" + tail, charts


# -- checking ----------------------------------------------------------------------------------


def png_description(path: Path) -> Optional[str]:
    """The PNG's 'Description' text chunk (tEXt, zTXt or iTXt), or None."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    pos = 8
    while pos + 8 <= len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            if key == b"Description":
                return value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            if key == b"Description":
                return zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            if key == b"Description":
                flag, rest = rest[0], rest[2:]
                _lang, _, rest = rest.partition(b"\0")
                _tkey, _, text = rest.partition(b"\0")
                return (zlib.decompress(text) if flag else text).decode("utf-8")
    return None


def check(page_path: Path = PAGE, assets: Path = ASSETS) -> List[str]:
    """What differs between the page, its charts and what the results give."""
    text, charts = page()
    problems = []
    if not page_path.exists() or page_path.read_text() != text:
        problems.append(f"{page_path.name} is not what the results give: run benchmarks/report.py")
    for chart in charts:
        path = assets / chart.file
        if not path.exists():
            problems.append(f"{chart.file} is missing")
        elif png_description(path) != chart.digest:
            problems.append(f"{chart.file} was drawn from other data: run benchmarks/report.py")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check()
            for p in problems:
                print(f"report: {p}", file=sys.stderr)
            return 1 if problems else 0
        text, charts = page()
        PAGE.write_text(text)
        ASSETS.mkdir(parents=True, exist_ok=True)
        for chart in charts:
            chart.draw(ASSETS)
        print(f"report: wrote {PAGE.relative_to(ROOT)} and {len(charts)} charts")
        return 0
    except ResultsError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
