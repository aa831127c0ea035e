"""The implementation constants the docs quote say what the code has
(``scripts/doc_constants.py``): a page that quotes a cache size, a threshold
or the range of Pythons the code does not have fails here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from scripts import doc_constants as dc


def test_every_quote_in_the_docs_is_the_codes_value() -> None:
    problems, count = dc.check()
    assert not problems, "\n".join(map(str, problems))
    # the pages quote (by name or between markers) most of the constants:
    # a check that found no quotes would pass on anything
    assert count >= 30
    quoted = set()
    for page in dc.pages():
        text = page.read_text(encoding="utf-8")
        quoted |= {m.group(1) for m in dc.MARKER.finditer(text)}
        quoted |= {m.group(1) for m in dc.BY_NAME.finditer(text)} & set(dc.CONSTANTS)
    assert quoted == set(dc.CONSTANTS), "a constant no page quotes: drop it from CONSTANTS"


def test_every_constant_is_read_from_the_code() -> None:
    have = dc.values()
    assert have["BIG_DICT"] == 32 and have["SMALL_DICT"] == 32  # (the docs' 32s)
    assert have["RECIPE_MAX_NODES"] == 1 << 16
    assert have["SUPPORTED_PYTHONS"][0] == (3, 10)
    from pytree_kit import _engine

    assert have["VALIDATED_PYTHONS"] == _engine.VALIDATED_PYTHONS


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("a table of <!--c:DICT_ORDER_SETS-->8<!--/c--> sets", "the code has 256"),
        ("staged from `COALESCE_MIN` (17) tensors", "the code has 16"),
        ("up to `STAGE_LIMIT` (2 MiB) each", "the code has 1 MiB"),
        ("`NO_DMA_STAGE_LIMIT` is 16,385 B", "the code has 16,384 B"),
        ("CPython <!--c:SUPPORTED_PYTHONS-->3.10 to 3.14<!--/c-->", "the code has 3.10 to 3.15"),
        ("<!--c:CACHE_ENTRIES-->8<!--/c--> entries", "no such constant"),
        ("<!--c:BIG_DICT-->thirty-two<!--/c--> keys", "not a quote of a value"),
    ],
)
def test_a_wrong_quote_fails(line: str, why: str) -> None:
    problems, _ = dc.check_text(f"text\n{line}\n", "page.md", dc.values())
    assert len(problems) == 1 and problems[0].line == 2
    assert why in str(problems[0])


def test_a_right_quote_passes_in_every_unit() -> None:
    have = dc.values()
    for line in (
        "`STAGE_LIMIT` (1 MiB)",
        "`STAGE_LIMIT` is 1,048,576 B",
        "`NO_DMA_STAGE_LIMIT` (16 KiB)",
        "`PINNED_OWN` (64 KiB)",
        "<!--c:RECIPE_MAX_NODES-->65,536<!--/c-->",
        "<!--c:VALIDATED_PYTHONS-->3.10-3.15<!--/c-->",
    ):
        assert dc.check_text(line, "page.md", have) == ([], 1), line


def test_write_mends_a_marked_quote_in_its_own_unit(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!--c:STAGE_LIMIT-->2 MiB<!--/c--> and <!--c:RECIPE_MAX_NODES-->1,000<!--/c-->\n"
        "<!--c:SUPPORTED_PYTHONS-->3.9-3.12<!--/c-->\n",
        encoding="utf-8",
    )
    assert dc.write([page]) == 1
    text = page.read_text(encoding="utf-8")
    assert text == (
        "<!--c:STAGE_LIMIT-->1 MiB<!--/c--> and <!--c:RECIPE_MAX_NODES-->65,536<!--/c-->\n"
        "<!--c:SUPPORTED_PYTHONS-->3.10-3.15<!--/c-->\n"
    )
    assert dc.check([page]) == ([], 3)


def test_a_constant_changed_in_the_code_fails_the_docs(tmp_path: Path, monkeypatch) -> None:
    """The C source read as the build reads it: a #define changed there (in a
    copy) makes the docs' quotes of it wrong."""
    pkg = tmp_path / "pytree_kit"
    shutil.copytree(dc.PKG, pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    header = pkg / "_core.h"
    text = header.read_text(encoding="utf-8")
    header.write_text(
        re.sub(r"#define BIG_DICT 32\b", "#define BIG_DICT 64", text), encoding="utf-8"
    )
    monkeypatch.setattr(dc, "PKG", pkg)
    problems, _ = dc.check()
    assert problems and {p.name for p in problems} == {"BIG_DICT"}
    assert all("the code has 64" in str(p) for p in problems)
