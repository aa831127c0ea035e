"""docs/benchmarks.md and its charts are what benchmarks/report.py makes from
benchmarks/results/: the page cannot drift from the recorded figures."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def report(monkeypatch, tmp_path):
    """benchmarks/report.py as a module, reading a copy of the results."""
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    copy = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", copy)
    monkeypatch.setattr(module, "RESULTS", copy)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "PAGE", tmp_path / "page.md")
    monkeypatch.setattr(module, "ASSETS", tmp_path / "assets")
    return module


def _png(description: str) -> bytes:
    """A 1x1 PNG whose tEXt chunk 'Description' is description."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
        + chunk(b"tEXt", b"Description\0" + description.encode())
        + chunk(b"IDAT", zlib.compress(b"\0\0"))
        + chunk(b"IEND", b"")
    )


@pytest.mark.once
def test_the_page_and_charts_are_what_the_results_give():
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.check() == []


@pytest.mark.once
def test_a_changed_figure_changes_the_page_and_its_chart(report, tmp_path):
    text, charts = report.page()
    path = report.RESULTS / "python3.12" / "corpus.json"
    data = json.loads(path.read_text())
    data["families"]["chain"]["unflatten"]["worst"] = 0.4321
    path.write_text(json.dumps(data))
    changed, changed_charts = report.page()
    sign = "0.43\N{MULTIPLICATION SIGN}"
    assert changed != text and sign in changed and sign not in text
    before = {c.file: c.digest for c in charts}
    after = {c.file: c.digest for c in changed_charts}
    assert {f for f in before if before[f] != after[f]} == {
        "bench-unflatten.png",
        "bench-summary.png",
    }


@pytest.mark.once
def test_check_names_a_stale_page_a_missing_chart_and_a_chart_of_other_data(report, tmp_path):
    text, charts = report.page()
    page, assets = tmp_path / "benchmarks.md", tmp_path / "assets"
    assets.mkdir()
    page.write_text(text)
    for chart in charts:
        (assets / chart.file).write_bytes(_png(chart.digest))
    assert report.check(page, assets) == []
    page.write_text(text.replace("Python 3.11.7", "Python 3.11.8", 1))
    (assets / charts[1].file).unlink()
    (assets / charts[2].file).write_bytes(_png("0" * 64))
    problems = report.check(page, assets)
    assert len(problems) == 3, problems
    assert "benchmarks.md is not what the results give" in problems[0]
    assert f"{charts[1].file} is missing" in problems[1]
    assert f"{charts[2].file} was drawn from other data" in problems[2]


@pytest.mark.once
def test_a_results_file_that_lost_its_table_is_an_error_not_a_blank(report):
    path = report.RESULTS / "batches.md"
    path.write_text(path.read_text().replace("## consolidate", "## merged"))
    with pytest.raises(
        report.ResultsError, match=r"batches\.md has no line starting '## consolidate'"
    ):
        report.page()
    (report.RESULTS / "distributed.md").unlink()
    assert report.main([]) == 2  # says so, writes nothing
    assert not report.PAGE.exists() and not report.ASSETS.exists()


def test_png_description_reads_the_text_chunk(report, tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(_png("abc"))
    assert report.png_description(path) == "abc"
    path.write_bytes(b"not a png")
    assert report.png_description(path) is None
