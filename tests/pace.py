"""The machine's pace: how much slower than the machine the suite's time bounds were set for this one
runs plain Python, measured once per run and shared with every xdist worker.

The bounds (pyproject's 180 s per test, a module's own `timeout` marks, .ci/run's session budget)
were set on a 2-core machine where the whole suite took about 27 minutes. The same suite on a
2-core machine half as fast took 51 minutes and three long tests passed 180 s while working (a roll
behind the router, an upgrade's canary, a realimport scratch venv's removal): a slow machine must be
a slow run, not a red one. So the controller times a fixed loop in a fresh interpreter (the fastest
of three, before any worker starts, so the suite's own load is not in it), and every bound is
multiplied by the pace (never below 1). The real-vLLM tier scales its own bounds by its first real
start (tests/realvllm/tier.py) and is left out here."""

from __future__ import annotations

import os
import subprocess
import sys
import time

ENV = "PROVISION_TEST_PACE"
# The loop below took 0.80-1.09 s on the machine that ran the suite in 51 minutes, so about 0.45 s
# on the one where it ran in 27 (the bounds' machine).
REFERENCE = 0.45
LOOP = "s = 0\nfor i in range(5_000_000):\n    s += i\n"


def measure() -> float:
    """The pace of this machine now: the fastest of three runs of LOOP against REFERENCE, >= 1."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", LOOP], check=True, timeout=120)
        best = min(best, time.perf_counter() - t0)
    return max(1.0, best / REFERENCE)


def pace() -> float:
    """The run's pace (set by the controller's pytest_configure; 1 where it was never measured)."""
    try:
        return max(1.0, float(os.environ.get(ENV, "1")))
    except ValueError:
        return 1.0


def seconds(bound: float) -> float:
    """A time bound set for the reference machine, for this one."""
    return bound * pace()
