"""CI builds the documentation site with ``mkdocs build --strict``, then loads
every page in headless Chromium (tests/support/browser.py): no broken link, missing
image, console error or request to another host than 127.0.0.1.

The browser tests need Debian's ``chromium``: they skip without it, except
under ``CI=true``, where they fail (scripts/ci.py installs it when run as root).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import check_site, site_pages

ROOT = Path(__file__).resolve().parent.parent


def _chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(
            "CI=true and chromium is not on PATH: install Debian's chromium "
            "(apt-get install chromium; scripts/ci.py does when run as root)"
        )
    pytest.skip("chromium is not installed (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: Any) -> tuple[subprocess.CompletedProcess, Path]:
    """The site built once for this module: (mkdocs' process, the site folder)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return proc, out


@pytest.mark.once  # the same on every engine and Python
def test_mkdocs_build_strict(site):
    proc, out = site
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    page = (out / "api" / "index.html").read_text()
    assert "flatten_up_to" in page and "check_container" in page


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    missing = [p for p in pages if p not in nav]
    assert not missing, missing


@pytest.mark.once
def test_every_docs_page_loads_in_chromium_without_errors(site):
    chromium = _chromium()
    proc, out = site
    if proc.returncode != 0:
        pytest.fail("the site did not build (test_mkdocs_build_strict says why)")
    report = check_site(out, chromium)
    # every page of the nav was loaded (directory URLs), and 404.html was not
    assert {"", "quickstart/", "api/", "migration/jax/"} <= set(report.pages)
    assert len(report.pages) == len(list(out.rglob("*.html"))) - 1
    assert not report.failures, f"{len(report.failures)} failures:\n{report.text()}"
    # links to other hosts are not followed (no network here), only their form checked
    odd = [u for u in report.external_links if not u.startswith(("https://", "http://", "mailto:"))]
    assert not odd, odd


def _png() -> bytes:
    """A 1x1 PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
        + chunk(b"IEND", b"")
    )


# hand-made pages, each with one break (and two clean ones that must pass)
BROKEN_PAGES = {
    "clean.html": """<h1 id="there">Clean</h1><a name="old"></a><img src="dot.png">
        <a href="#there">here</a> <a href="clean.html#old">old anchor</a>
        <a href="sub/">sub</a> <a href="sub/#top">sub's top</a> <a href="#">top</a>
        <a href="https://example.com/elsewhere">out</a> <a href="mailto:a@example.com">mail</a>""",
    "sub/index.html": """<h1 id="top">Sub</h1><a href="../clean.html#there">back</a>
        <img src="../dot.png">""",
    "broken-link.html": '<a href="missing.html">gone</a> <a href="assets/">a listing</a>',
    "missing-fragment.html": '<a href="clean.html#nowhere">no such id</a>',
    "missing-image.html": '<img src="assets/nope.png">',
    "console-error.html": '<script>console.error("x")</script>',
    "exception.html": '<script>throw new Error("boom")</script>',
    "external-resource.html": (
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
    ),
    "worker-external.html": '<script>new Worker("worker.js")</script>',
    "bad-scheme.html": '<a href="file:///etc/hostname">a local file</a>',
    # wider than the column at 1280 px: a code line, a table in a scrolled box
    "wide-code.html": "<pre><code>x = 1  # " + "y" * 300 + "</code></pre>",
    "wide-table.html": '<div class="md-typeset__scrollwrap" style="overflow-x: auto; width: 600px">'
    + "<table><tr>"
    + "<td>a&nbsp;wide&nbsp;cell</td>" * 40
    + "</tr></table></div>",
    # the same long line, wrapped: all of it readable, nothing wider
    "wrapped-code.html": '<pre style="white-space: pre-wrap; overflow-wrap: anywhere">'
    + "<code>x = 1  # "
    + "y" * 300
    + "</code></pre>",
    # not a page of the site: never checked
    "404.html": '<script>console.error("the 404 page")</script>',
}


@pytest.mark.once
def test_the_browser_check_catches_broken_links_images_console_errors_and_outside_requests(
    tmp_path,
):
    chromium = _chromium()
    for name, body in BROKEN_PAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        # an icon of its own, or the browser asks for /favicon.ico (a 404 here)
        head = '<link rel="icon" href="data:,">'
        (tmp_path / name).write_text(f"<!doctype html><head>{head}</head><body>{body}</body>")
    (tmp_path / "dot.png").write_bytes(_png())
    (tmp_path / "assets").mkdir()  # a folder with no index.html: no page
    # a worker's own requests are watched too (its failure is swallowed: only
    # the request itself shows)
    (tmp_path / "worker.js").write_text(
        'fetch("https://example.com/data.json").catch(() => null);\n'
    )
    assert "404.html" not in site_pages(tmp_path)
    report = check_site(tmp_path, chromium)
    expected = {
        "clean.html": [],
        "sub/": [],
        "broken-link.html": [
            "broken link 'missing.html': http://127.0.0.1:",
            "/missing.html is HTTP 404",
            "broken link 'assets/': http://127.0.0.1:",  # a folder: no listing
        ],
        "missing-fragment.html": ["broken link 'clean.html#nowhere': no id 'nowhere' on"],
        "missing-image.html": [
            "image not loaded: 'assets/nope.png'",
            "/assets/nope.png",  # the 404 response and the browser's log of it
            "browser log error: Failed to load resource",
        ],
        "console-error.html": ["console.error: x"],
        "exception.html": ["uncaught exception: Error: boom"],
        # each request leaving 127.0.0.1 (the browser's dead proxy then fails it)
        "external-resource.html": [
            "request to another host than 127.0.0.1: https://fonts.googleapis.com/css?family=Roboto",
            "https://fonts.googleapis.com/css?family=Roboto",
        ],
        "worker-external.html": [
            "request to another host than 127.0.0.1: https://example.com/data.json",
            "request failed (net::ERR_PROXY_CONNECTION_FAILED): https://example.com/data.json",
        ],
        "bad-scheme.html": [
            "link 'file:///etc/hostname' is neither to this site nor an http(s) or mailto URL"
        ],
        "wide-code.html": ["wider than its column at 1280 px: <code> right edge "],
        "wide-table.html": [
            "wider than its column at 1280 px: <div> ",
            "wider than its column at 1280 px: <table> ",
        ],
        "wrapped-code.html": [],
    }
    assert sorted(report.pages) == sorted(expected)
    for page, wanted in expected.items():
        found = report.on(page)
        # each break reported, and nothing else
        assert all(any(w in f for f in found) for w in wanted), (page, wanted, found)
        assert all(any(w in f for w in wanted) for f in found), (page, wanted, found)
    assert sorted(report.external_links) == [
        "https://example.com/elsewhere",
        "mailto:a@example.com",
    ]


def test_the_home_page_links_every_page_of_the_nav():
    home = (ROOT / "docs" / "index.md").read_text()
    pages = sorted(
        p.relative_to(ROOT / "docs").as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if p.name != "index.md"
    )
    unlisted = [p for p in pages if f"]({p})" not in home]
    assert not unlisted, unlisted
