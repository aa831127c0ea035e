"""Where a benchmark script writes its reports.

By default a script writes into ``build/benchmarks/`` (ignored by git), so
running one changes no tracked file. ``--record`` writes into
``benchmarks/results/`` instead: the published figures, which
``benchmarks/report.py`` reads, for those who update them. ``--out DIR``
writes into DIR. Per-Python scripts write into a ``python3.X`` sub-folder of
either default (``sub``); ``--out`` is used as given.

A script does::

    import _output

    _output.add_arguments(parser, sub=_output.PYTHON)
    args = parser.parse_args(argv)
    _output.write_report(args, "name.md", text, sub=_output.PYTHON)  # printed, written

(a script that writes several files takes :func:`folder` and says so with
:func:`wrote`).
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "benchmarks" / "results"
"""The published figures, read by benchmarks/report.py (tracked)."""
SCRATCH = ROOT / "build" / "benchmarks"
"""Where a run writes by default (build/ is ignored by git)."""
PYTHON = "python{}.{}{}".format(
    *sys.version_info[:2], "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
)
"""The sub-folder of a per-Python script's reports, for the running Python
(``python3.13t`` for a free-threaded 3.13)."""


def _shown(path: Path) -> str:
    """path relative to the repository when it is inside it, else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def add_arguments(parser: argparse.ArgumentParser, sub: str = "", *, default: bool = True) -> None:
    """Add ``--out DIR`` and ``--record`` (one or the other) to parser (sub:
    the sub-folder of a per-Python script, e.g. ``python3.11``, for the help
    text; default=False for a script that writes only when given one of them)."""
    where = f"default: {_shown(SCRATCH / sub)}/, ignored by git"
    if not default:
        where = "without it or --record, the report is only printed"
    recorded = f"{_shown(RECORDED / sub)}/"
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"the folder to write in ({where})",
    )
    group.add_argument(
        "--record",
        action="store_true",
        help=f"write into {recorded}: the published figures, for those who update them",
    )


def folder(args: argparse.Namespace, sub: str = "") -> Path:
    """The folder to write in, created: ``args.out`` when given, else
    ``benchmarks/results/<sub>`` with ``--record``, else ``build/benchmarks/<sub>``."""
    if args.out is not None:
        out = Path(args.out)
    else:
        out = (RECORDED if args.record else SCRATCH) / sub
    out.mkdir(parents=True, exist_ok=True)
    return out


def wrote(*paths: Path) -> None:
    """Print one line (to stderr: stdout is often the report itself) saying
    where the reports went and, when not recorded, how to record them."""
    names = ", ".join(_shown(p) for p in paths)
    recorded = all(_is_recorded(p) for p in paths)
    note = "" if recorded else f" (not recorded: --record writes {_shown(RECORDED)}/)"
    print(f"benchmarks: wrote {names}{note}", file=sys.stderr, flush=True)


def write_report(args: argparse.Namespace, name: str, text: str, sub: str = "") -> Path:
    """Print a report and write it as ``name`` in :func:`folder`'s folder,
    saying where (:func:`wrote`); the path written."""
    print(text)
    path = folder(args, sub) / name
    path.write_text(text, encoding="utf-8")
    wrote(path)
    return path


def _is_recorded(path: Path) -> bool:
    return path.resolve().is_relative_to(RECORDED.resolve())


def gpu_sub(device_name: str) -> str:
    """The sub-folder of a GPU's reports: ``gpu_h200`` for "NVIDIA H200"."""
    return "gpu_" + device_name.split()[-1].lower()


def publish(path: Path, lines: list, gpu_measured: bool) -> None:
    """Write a report's lines to ``path`` and print them; without a GPU, a
    last line says that GPU figures were not measured in this run."""
    if not gpu_measured:
        lines = [*lines, "", "GPU figures: not measured in this run (no GPU)."]
    text = "\n".join(lines)
    path.write_text(text + "\n")
    print(text)
    wrote(path)
