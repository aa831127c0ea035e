"""What a process holds that a leak would grow: open file descriptors and the
shared memory it maps. Read by tests/support/packed_lifecycle.py and
tests/support/training_run.py after each epoch."""

from __future__ import annotations

import gc
import os
import time
from typing import Callable


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def shm() -> int:
    """Bytes of shared memory this process maps (its /dev/shm mappings, unlinked
    ones included): other processes' shared memory is not counted."""
    total = 0
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/" in line or "/memfd:" in line:
                lo, hi = line.split()[0].split("-")
                total += int(hi, 16) - int(lo, 16)
    return total


def settled(measure: Callable[[], int]) -> int:
    """``measure()`` once it holds still (three equal readings 50 ms apart, 3 s
    at most): the last epoch's workers may still be closing their pipes."""
    last = [measure()]
    for _ in range(60):
        time.sleep(0.05)
        gc.collect()
        last.append(measure())
        if len(last) >= 3 and last[-1] == last[-2] == last[-3]:
            break
    return last[-1]
