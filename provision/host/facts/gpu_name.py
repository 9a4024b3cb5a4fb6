"""The GPUs' product name, from nvidia-smi.  STDLIB ONLY, read-only.

``nvidia-smi --query-gpu=name --format=csv,noheader`` prints one line per GPU. It is run under
the same trust rule as facts/gpu.py (discovery's: the binary and every directory above it owned
by root or the agent's user and not writable by group or others; the fixed PATH and
environment, cwd /, no stdin, a timeout). Without it the name is "unknown" and the answer says
why: `provision bench` keys a baseline by it, and an unknown GPU only matches an unknown one.
"""

from __future__ import annotations

import shutil
import subprocess

from provision.host.facts.installs import PROBE_ENV, untrusted_reason

QUERY = ["--query-gpu=name", "--format=csv,noheader"]


def parse_names(stdout: str) -> tuple[str, int]:
    """(the name, or "A + B" for a mixed host; the GPU count) from nvidia-smi's output. Pure."""
    names = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    distinct = list(dict.fromkeys(n[:120] for n in names))
    return (" + ".join(distinct) if distinct else "unknown"), len(names)


def gpu_name(timeout: float = 20) -> dict:
    """{"name": ..., "count": N, "unknown": None} or {"name": "unknown", "unknown": why}."""
    smi = shutil.which("nvidia-smi", path=PROBE_ENV["PATH"])
    if not smi:
        return {"name": "unknown", "count": 0, "unknown": "no nvidia-smi on the host"}
    why = untrusted_reason(smi)
    if why:
        return {"name": "unknown", "count": 0, "unknown": f"{smi} not run: {why}"}
    try:
        proc = subprocess.run([smi] + QUERY, capture_output=True, text=True, timeout=timeout, env=dict(PROBE_ENV),
                              cwd="/", stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"name": "unknown", "count": 0, "unknown": f"{smi} did not answer in {timeout:g} s"}
    except OSError as exc:
        return {"name": "unknown", "count": 0, "unknown": f"{smi} did not run ({exc.strerror})"}
    if proc.returncode != 0:
        return {"name": "unknown", "count": 0, "unknown": f"{smi} failed (exit {proc.returncode})"}
    name, count = parse_names(proc.stdout)
    return {"name": name, "count": count, "unknown": None if count else "nvidia-smi listed no GPU"}
