"""The features together over time: a whole training run (tests/support/training_run.py).

Each feature has tests of its own, one call at a time; this is the check that
they work together as a user puts them together, for several epochs: a
PackedList of COCO-like samples (images without annotations among them),
DataLoader workers of every start method, collate with ragged=, PinnedLoader
where CUDA is present, a compiled wrapper that flattens its batch (its graphs
counted), backward and an optimizer step, and DDP on 2 gloo ranks. Each run
is a fresh process (no jax threads to fork), with a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.distributed import free_port

TESTS = Path(__file__).resolve().parents[1]
SCRIPT = str(TESTS / "support" / "training_run.py")
N, EPOCHS = 384, 3


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(TESTS.parent), "GLOO_SOCKET_IFNAME": "lo"}


def _check(r: dict) -> None:
    assert r["seen"] == [True] * EPOCHS, "an epoch did not see every sample once"
    assert r["read"] == [N] * EPOCHS, "the dataset did not read right in the main process"
    losses = r["losses"]
    assert losses[-1] < losses[0] / 10 and losses[1] < losses[0], losses
    # measured once the last epoch's workers are gone: no more than after the first
    assert max(r["fds"][1:]) <= r["fds"][0], f"file descriptors grew over the epochs: {r['fds']}"
    assert max(r["shm"][1:]) <= r["shm"][0], f"shared memory grew over the epochs: {r['shm']}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_a_training_run(context: str) -> None:
    out = subprocess.run(
        [sys.executable, SCRIPT, context], capture_output=True, text=True, timeout=230, env=_env()
    )
    assert out.returncode == 0, out.stderr[-4000:]
    r = json.loads(out.stdout.splitlines()[-1])
    _check(r)
    assert r["graphs"] == 1, "the compiled wrapper compiled more than one graph"


@pytest.mark.timeout(240)
def test_a_training_run_with_ddp_on_two_gloo_ranks(tmp_path: Path) -> None:
    port = str(free_port())
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, "ddp", str(r), "2", port, str(outs[r])],
            env={**_env(), "OMP_NUM_THREADS": "1"},
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    try:
        codes = [p.wait(timeout=220) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    tails = "\n".join((tmp_path / f"rank{r}.log").read_text()[-3000:] for r in range(2))
    assert codes == [0, 0], tails
    for out in outs:
        r = json.loads(out.read_text())
        _check(r)
        assert r["in_step"], "the ranks' weights differ after training"
