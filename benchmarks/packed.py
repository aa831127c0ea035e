"""Datasets without copy-on-read: a COCO-like dataset kept four ways.

    python benchmarks/packed.py            # build/benchmarks/packed.md, .json and .png
    python benchmarks/packed.py --record   # the same in benchmarks/results/ (published)
    python benchmarks/packed.py --quick    # smoke mode: 1,000 samples, 1 worker

The dataset is generated (seeded): 100,000 samples, each an image path, height,
width and id, and 1 to 20 annotations, each with a bbox (4 floats), an area, a
category id, iscrowd and a polygon list (one polygon of 4 to 16 points). The
stores:

- ``list``: the Python list of dicts itself;
- ``pickle``: one pickle per sample in one byte tensor with an offsets tensor,
  as detectron2's ``_TorchSerializedList`` and mmengine's ``serialize_data``
  do (written here, ``SerializedList``);
- ``PackedList``: ``pytree_kit.torch.PackedList``;
- ``tensordict``: a TensorDict of what it can hold as tensors: the per-image
  numbers (height, width, id). The annotations (ragged) and the paths (strings)
  do not fit, so it answers the column scan and the loader, not the samples.

For each: the bytes it holds (tensor bytes plus the Python objects it keeps,
traced), the time to build it from the list, a random ``__getitem__``, a scan of
one column (``height``: ``PackedList.column``, unpickling every sample, reading
every dict), and one epoch of a DataLoader with 4 workers, with fork and with
spawn, each store in a fresh process: the USS and PSS
(``/proc/<pid>/smaps_rollup``) of the main process and of each worker after its
first batch and at the end of the epoch, and the targets PackedList was built
to meet (the report's last table).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any, Callable

import _output
import torch

import pytree_kit as pk
from pytree_kit.torch import PackedList

STORES = ("list", "pickle", "PackedList", "tensordict")


# -- the dataset ------------------------------------------------------------------------


def coco(n: int, seed: int = 0) -> list:
    """``n`` COCO-like samples (see the module's docstring)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        width, height = rng.choice([(640, 480), (640, 427), (480, 640), (500, 375)])
        anns = []
        for _ in range(rng.randint(1, 20)):
            x, y = round(rng.uniform(0, width - 20), 2), round(rng.uniform(0, height - 20), 2)
            w, h = round(rng.uniform(5, width - x), 2), round(rng.uniform(5, height - y), 2)
            poly = [round(rng.uniform(0, width), 2) for _ in range(2 * rng.randint(4, 16))]
            anns.append(
                {
                    "bbox": [x, y, w, h],
                    "area": round(w * h * 0.7, 2),
                    "category_id": rng.randint(1, 90),
                    "iscrowd": int(rng.random() < 0.01),
                    "segmentation": [poly],
                }
            )
        out.append(
            {
                "file_name": f"train2017/{i:012d}.jpg",
                "height": height,
                "width": width,
                "image_id": i,
                "annotations": anns,
            }
        )
    return out


# -- the stores -------------------------------------------------------------------------


class SerializedList:
    """One pickle per sample, concatenated into one uint8 tensor with an int64
    tensor of end offsets (the detectron2 / mmengine workaround)."""

    def __init__(self, samples: list) -> None:
        blobs = [pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL) for s in samples]
        ends = torch.tensor([len(b) for b in blobs], dtype=torch.int64).cumsum(0)
        self._ends = ends
        self._data = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8).clone()

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> Any:
        start = 0 if i == 0 else int(self._ends[i - 1])
        end = int(self._ends[i])
        return pickle.loads(memoryview(self._data[start:end].numpy()))

    @property
    def nbytes(self) -> int:
        return self._data.numel() + self._ends.numel() * 8


class Rows:
    """A TensorDict dataset: a sample is its row (the per-image numbers only)."""

    def __init__(self, samples: list) -> None:
        from tensordict import TensorDict

        self.td = TensorDict(
            {
                "height": torch.tensor([s["height"] for s in samples]),
                "width": torch.tensor([s["width"] for s in samples]),
                "image_id": torch.tensor([s["image_id"] for s in samples]),
            },
            batch_size=[len(samples)],
        )

    def __len__(self) -> int:
        return len(self.td)

    def __getitem__(self, i: int) -> Any:
        return self.td[i]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.td.values())


def build(store: str, samples: list) -> Any:
    if store == "tensordict":
        import tensordict  # noqa: F401  (its import is not the build)
    if store == "list":
        return samples
    if store == "pickle":
        return SerializedList(samples)
    if store == "PackedList":
        return PackedList(samples)
    return Rows(samples)


def column(store: str, data: Any) -> Any:
    """Every sample's height, as the store allows."""
    if store == "list":
        return [s["height"] for s in data]
    if store == "pickle":
        return [data[i]["height"] for i in range(len(data))]
    if store == "PackedList":
        return data.column("['height']").values
    return data.td["height"]


def held(store: str, samples_fn: Callable[[], list]) -> tuple[int, float]:
    """(bytes the store holds, seconds to build it from the list): the Python
    objects it keeps, traced, plus its tensors' bytes."""
    samples = samples_fn()
    gc.collect()
    t = time.perf_counter()
    data = build(store, samples)
    seconds = time.perf_counter() - t if store != "list" else 0.0
    del data
    gc.collect()
    if store == "list":
        del samples
        gc.collect()
        tracemalloc.start()
        samples = samples_fn()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return size, seconds
    tracemalloc.start()
    data = build(store, samples)
    del samples
    gc.collect()
    size = tracemalloc.get_traced_memory()[0] + data.nbytes
    tracemalloc.stop()
    return size, seconds


# -- memory -----------------------------------------------------------------------------


def smaps(pid: int) -> dict:
    """USS and PSS of a process, MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1])
    return {
        "uss": (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024,
        "pss": fields["Pss"] / 1024,
    }


def as_is(batch: list) -> list:
    return batch


def epoch(store: str, n: int, context: str, workers: int) -> dict:
    """One epoch of a DataLoader over a store built in this process (run in a
    fresh process: --epoch)."""
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    samples = coco(n)
    data = build(store, samples)
    del samples
    gc.collect()
    if context == "fork":
        gc.freeze()  # what the collector writes to old objects is not the dataset's
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=64,
        num_workers=workers,
        collate_fn=as_is,
        multiprocessing_context=context,
        persistent_workers=True,  # alive at the end of the epoch, to be read
    )
    it = iter(loader)
    seen = 0
    for _ in range(2 * workers):  # every worker has made a batch: its start-up is behind it
        seen += len(next(it))
    pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    start = {"main": smaps(os.getpid()), **{f"w{k}": smaps(p) for k, p in enumerate(pids)}}
    for batch in it:
        seen += len(batch)
    end = {"main": smaps(os.getpid()), **{f"w{k}": smaps(p) for k, p in enumerate(pids)}}
    assert seen == len(data)
    return {"start": start, "end": end, "nbytes": getattr(data, "nbytes", 0)}


def run_epochs(stores: tuple, n: int, context: str, workers: int, fresh: bool) -> dict:
    """An epoch of each store, each in a fresh process (``fresh``: the memory
    figures are then each store's own), or all in one (a smoke run)."""
    groups = [[s] for s in stores] if fresh else [list(stores)]
    results: dict = {}
    for group in groups:
        out = subprocess.run(
            [sys.executable, __file__, "--epoch", ",".join(group), str(n), context, str(workers)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if out.returncode:
            raise RuntimeError(f"epoch {group} {context} failed:\n{out.stderr[-3000:]}")
        results.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


# -- speed ------------------------------------------------------------------------------


def per_call(fn: Callable[[int], Any], indices: list, repeats: int) -> float:
    """Median over ``repeats`` of the mean µs of ``fn(i)`` over ``indices``."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in indices:
            fn(i)
        times.append((time.perf_counter() - t) / len(indices) * 1e6)
    times.sort()
    return times[len(times) // 2]


def speeds(n: int, repeats: int) -> dict:
    """Random __getitem__ (µs) and the column scan (ms) of each store, in one process."""
    samples = coco(n)
    stores = {s: build(s, samples) for s in STORES}
    rng = random.Random(1)
    indices = [rng.randrange(n) for _ in range(min(n, 20_000))]
    for s in STORES:  # warm
        stores[s][0]
    out: dict = {s: {} for s in STORES}
    was = gc.isenabled()
    gc.disable()  # a collection in one store's loop would be charged to it
    try:
        for _ in range(repeats):  # interleaved
            for s in STORES:
                data = stores[s]
                out[s].setdefault("getitem", []).append(per_call(data.__getitem__, indices, 1))
                t = time.perf_counter()
                column(s, data)
                out[s].setdefault("column", []).append((time.perf_counter() - t) * 1e3)
    finally:
        if was:
            gc.enable()
    packed = stores["PackedList"]
    fresh = PackedList(samples)
    t = time.perf_counter()
    fresh.column("['height']")
    out["PackedList"]["column_first"] = (time.perf_counter() - t) * 1e3
    assert packed.column("['height']").values.tolist() == column("list", samples)
    assert all(pk.tree_equal(packed[i], samples[i]) for i in indices[:200])
    return {
        s: {k: (sorted(v)[len(v) // 2] if isinstance(v, list) else v) for k, v in d.items()}
        for s, d in out.items()
    } | {"structures": len(packed.specs)}


def million(n: int) -> dict:
    """Open a saved PackedList of ``n`` small samples with mmap=True: the time,
    and how much of the file the process has in memory afterwards."""
    rng = random.Random(2)
    samples = (
        {"path": f"img/{i:08d}.jpg", "label": rng.randrange(1000), "box": [rng.random()] * 4}
        for i in range(n)
    )
    t = time.perf_counter()
    packed = PackedList(samples)
    build_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "million.pk"
        packed.save(path)
        size = path.stat().st_size
        del packed
        gc.collect()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            back = PackedList.load(path, mmap=True)
            times.append((time.perf_counter() - t) * 1e3)
            resident = _mapped_rss(path)
            del back
        back = PackedList.load(path, mmap=True)
        t = time.perf_counter()
        back[n // 2]
        first_read = (time.perf_counter() - t) * 1e6
        del back
    times.sort()
    return {
        "samples": n,
        "file_mb": size / 2**20,
        "build_s": build_s,
        "open_ms": times[len(times) // 2],
        "resident_kb": resident,
        "first_read_us": first_read,
    }


def _mapped_rss(path: Path) -> int:
    """kB of ``path``'s mapping resident in this process (pages read through it)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0] and len(line.split()) >= 5:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


# -- the report -------------------------------------------------------------------------


def growth(r: dict) -> float:
    """The largest growth of a worker's USS over the epoch, MiB."""
    return max(r["end"][w]["uss"] - r["start"][w]["uss"] for w in r["start"] if w != "main")


def worker_max(r: dict, key: str, when: str = "end") -> float:
    return max(v[key] for w, v in r[when].items() if w != "main")


def report(results: dict, quick: bool) -> str:
    n, workers = results["n"], results["workers"]
    sp, sizes, ep = results["speeds"], results["held"], results["epochs"]
    packed_mb = ep["fork"]["PackedList"]["nbytes"] / 2**20
    lines = [
        "# Datasets without copy-on-read: a COCO-like dataset four ways",
        "",
        f"Generated by `benchmarks/packed.py{' --quick' if quick else ''}` "
        f"({n:,} samples, {sp['structures']} distinct structures; DataLoader with "
        f"{workers} workers, batch 64). Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores; Python {platform.python_version()}; torch {torch.__version__}; "
        f"pytree_kit {pk.__version__} ({pk.ENGINE} engine).",
        "",
        "## Stores",
        "",
        "| store | bytes held (MiB) | build (s) | random `__getitem__` (µs) | column scan (ms) |",
        "|---|---|---|---|---|",
    ]
    for s in STORES:
        size, build_s = sizes[s]
        note = " (per-image numbers only)" if s == "tensordict" else ""
        lines.append(
            f"| {s}{note} | {size / 2**20:,.1f} | {build_s:.2f} | {sp[s]['getitem']:.2f} | "
            f"{sp[s]['column']:,.2f} |"
        )
    lines += [
        "",
        f"The first column scan of a fresh PackedList (it names each structure's paths "
        f"once) took {sp['PackedList']['column_first']:.2f} ms.",
        "",
        "## One epoch, each store in a fresh process (MiB)",
        "",
        "USS is the memory only that process maps; PSS shares each page among the",
        "processes that map it. Workers are read once each has made a batch (start;",
        "the first two batches of each), and at the end of the epoch; *growth* is the",
        "largest growth of one worker's USS between the two.",
        "",
        "| store | start | main USS | main PSS | worker USS, start | worker USS, end | "
        "worker PSS, end | growth | growth / packed size |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for context in ("fork", "spawn"):
        for s in STORES:
            if s not in ep[context]:
                lines.append(f"| {s} | {context} | not run (--quick) |" + " |" * 6)
                continue
            r = ep[context][s]
            g = growth(r)
            lines.append(
                f"| {s} | {context} | {r['end']['main']['uss']:,.1f} | "
                f"{r['end']['main']['pss']:,.1f} | {worker_max(r, 'uss', 'start'):,.1f} | "
                f"{worker_max(r, 'uss'):,.1f} | {worker_max(r, 'pss'):,.1f} | {g:,.2f} | "
                f"{g / packed_mb:.1%} |"
            )
    m = results["million"]
    lines += [
        "",
        "## Opening a saved PackedList",
        "",
        f"{m['samples']:,} small samples (a path, a label, a box) saved to one file of "
        f"{m['file_mb']:,.1f} MiB (built in {m['build_s']:.1f} s). "
        f"`PackedList.load(path, mmap=True)` took {m['open_ms']:.2f} ms (median of 5), "
        f"after which {m['resident_kb']:,} kB of the file's mapping was resident in the "
        f"process (the header's pages; no sample is read); reading one sample then took "
        f"{m['first_read_us']:.0f} µs.",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    checks = []
    for context in ("fork", "spawn"):
        g = growth(ep[context]["PackedList"])
        checks.append(
            (
                f"a worker's private memory grows < 5% of the packed size ({context})",
                f"{g:.2f} MiB of {packed_mb:.1f} MiB ({g / packed_mb:.1%}); a list of dicts: "
                f"{growth(ep[context]['list']):,.1f} MiB",
                g < 0.05 * packed_mb,
            )
        )
    checks += [
        (
            "bytes held <= pickle-per-item",
            f"{sizes['PackedList'][0] / 2**20:,.1f} vs {sizes['pickle'][0] / 2**20:,.1f} MiB",
            sizes["PackedList"][0] <= sizes["pickle"][0],
        ),
        (
            "random `__getitem__` no slower than pickle-per-item",
            f"{sp['PackedList']['getitem']:.2f} vs {sp['pickle']['getitem']:.2f} µs "
            f"({sp['pickle']['getitem'] / sp['PackedList']['getitem']:.2f}x)",
            sp["PackedList"]["getitem"] <= sp["pickle"]["getitem"],
        ),
        (
            "column scan >= 50x faster than through pickle",
            f"{sp['pickle']['column'] / sp['PackedList']['column']:,.0f}x "
            f"(first scan {sp['pickle']['column'] / sp['PackedList']['column_first']:,.0f}x)",
            sp["pickle"]["column"] >= 50 * sp["PackedList"]["column"],
        ),
    ]
    for what, measured, met in checks:
        lines.append(f"| {what} | {measured} | {'yes' if met else 'MISSED'} |")
    return "\n".join(lines) + "\n"


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sp, sizes, ep = results["speeds"], results["held"], results["epochs"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    colors = ["#999999", "#d98c3f", "#3f7fbf", "#7fbf7f"]
    panels = [
        ("bytes held (MiB)", [sizes[s][0] / 2**20 for s in STORES], False),
        ("random __getitem__ (µs)", [sp[s]["getitem"] for s in STORES], False),
        ("height column scan (ms, log)", [sp[s]["column"] for s in STORES], True),
    ]
    for ax, (title, values, log) in zip(axes, panels):
        ax.bar(STORES, values, color=colors)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.tick_params(axis="x", labelsize=8, rotation=20)
    ax = axes[3]
    width = 0.38
    xs = range(len(STORES))
    for k, context in enumerate(("fork", "spawn")):
        vals = [worker_max(ep[context][s], "uss") if s in ep[context] else 0 for s in STORES]
        ax.bar([x + (k - 0.5) * width for x in xs], vals, width, label=context)
    ax.set_xticks(list(xs), STORES, fontsize=8, rotation=20)
    ax.set_yscale("log")
    ax.set_title("a worker's private memory after an epoch (MiB, log)", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle(f"{results['n']:,} COCO-like samples", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--epoch":
        stores, n, context, workers = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        print(json.dumps({s: epoch(s, n, context, workers) for s in stores.split(",")}))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 samples, 1 worker: a smoke run")
    _output.add_arguments(ap)
    args = ap.parse_args()
    n, workers = (1_000, 1) if args.quick else (100_000, 4)
    results: dict = {"n": n, "workers": workers}
    print(f"packed: {n:,} samples", flush=True)
    results["held"] = {s: held(s, lambda: coco(n)) for s in STORES}
    print("packed: bytes held", {s: round(v[0] / 2**20, 1) for s, v in results["held"].items()})
    results["speeds"] = speeds(n, 3 if args.quick else 5)
    print("packed: speeds", results["speeds"], flush=True)
    # A smoke run spawns workers for the two stores the targets compare only:
    # each spawned worker imports torch (~8 s a store on 2 cores).
    spawned = ("list", "PackedList") if args.quick else STORES
    results["epochs"] = {
        "fork": run_epochs(STORES, n, "fork", workers, fresh=not args.quick),
        "spawn": run_epochs(spawned, n, "spawn", workers, fresh=not args.quick),
    }
    print("packed: epochs done", flush=True)
    results["million"] = million(20_000 if args.quick else 1_000_000)
    out = _output.folder(args)
    text = report(results, args.quick)
    (out / "packed.md").write_text(text, encoding="utf-8")
    (out / "packed.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    chart(results, out / "packed.png")
    print(text)
    _output.wrote(out / "packed.md", out / "packed.json", out / "packed.png")


if __name__ == "__main__":
    main()
