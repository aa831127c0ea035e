"""pytest plugin for ``scripts/peer_suites.py``: installs one suite's shim
before the peer's files are imported, and writes each test's outcome to the
JSON file ``--peer-report`` names."""

from __future__ import annotations

import importlib
import json
from typing import Any

import peer_shims
import pytest

_RESULTS: dict[str, dict[str, Any]] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--peer-suite",
        required=True,
        help="optree, jax, torch, dmtree, accelerate, lightning, lightning_utilities or "
        "transformers",
    )
    parser.addoption("--peer-report", required=True, help="where to write the outcomes (JSON)")
    parser.addoption(
        "--peer-baseline",
        action="store_true",
        help="run the peer's tests on the peer itself: no shim, only its prepare()",
    )


def pytest_configure(config: pytest.Config) -> None:
    shim = importlib.import_module(f"peer_shims.{config.getoption('--peer-suite')}_shim")
    if config.getoption("--peer-baseline"):
        getattr(shim, "prepare", lambda: None)()
    else:
        shim.install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    peer_shims.CALLS[0] = 0


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    return str(crash.message if crash is not None else longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _RESULTS.setdefault(report.nodeid, {"outcome": "passed", "reason": ""})
    if report.when == "call":
        entry["calls"] = peer_shims.CALLS[0]
    if entry["outcome"] != "passed":
        return  # the first phase that did not pass decides
    if report.skipped:
        reason = _reason(report)
        entry["outcome"] = "not applicable" if reason.startswith(peer_shims.NA) else "skipped"
        entry["reason"] = reason.removeprefix(peer_shims.NA)
    elif report.failed:
        entry["outcome"] = "failed"
        entry["reason"] = _reason(report).splitlines()[0][:300] if _reason(report) else ""


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:  # a file that does not import: no test of it ran
        _RESULTS[report.nodeid or "<collection>"] = {
            "outcome": "collection error",
            "reason": _reason(report).splitlines()[-1][:300] if _reason(report) else "",
        }


def pytest_sessionfinish(session: pytest.Session) -> None:
    baseline = session.config.getoption("--peer-baseline")
    for entry in [] if baseline else _RESULTS.values():
        if entry["outcome"] == "passed" and not entry.get("calls"):
            entry["outcome"] = "not applicable"
            entry["reason"] = "calls nothing that is mapped to pytree_kit"
    path = session.config.getoption("--peer-report")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_RESULTS, f, indent=1, sort_keys=True)
