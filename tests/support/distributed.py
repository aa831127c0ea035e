"""Start the ranks of tests/support/dist_worker.py and collect what each reports.

Every rank is a fresh Python process on the gloo backend, joined over
127.0.0.1 on a free port. The whole run has a timeout: a hang kills every rank
and fails the test instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = Path(__file__).with_name("dist_worker.py")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    scenario: str,
    world: int = 2,
    timeout: float = 240,
    *,
    worker: Path = WORKER,
    args: tuple[str, ...] = (),
) -> list[list[dict]]:
    """Each rank's list of ``{"case", "ok", "detail"}``, in rank order. The
    ranks run ``worker`` (``SCENARIO RANK WORLD PORT OUT`` then ``args``)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, f"rank{r}.json") for r in range(world)]
        logs = [Path(tmp, f"rank{r}.log") for r in range(world)]
        port = free_port()
        procs = []
        for r in range(world):
            with open(logs[r], "w") as log:
                cmd = [sys.executable, str(worker), scenario, str(r), str(world), str(port)]
                procs.append(
                    subprocess.Popen(
                        [*cmd, str(outs[r]), *args], env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        failed: list = []
        try:
            for r, p in enumerate(procs):
                if p.wait(timeout=timeout) != 0:
                    failed.append(r)
        except subprocess.TimeoutExpired:
            failed = [f"timed out after {timeout} s"]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if failed:
            tails = "\n".join(f"--- rank {r}\n{logs[r].read_text()[-3000:]}" for r in range(world))
            raise AssertionError(f"{scenario}: ranks {failed} failed\n{tails}")
        return [json.loads(o.read_text()) for o in outs]
