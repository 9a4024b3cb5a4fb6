"""The GPUs' product name, from nvidia-smi.  STDLIB ONLY, read-only.

``nvidia-smi --query-gpu=name --format=csv,noheader`` prints one line per GPU; it is found and
run as facts/nvidia_smi.py says, the one way. Without it the name is "unknown" and the answer says
why: `provision bench` keys a baseline by it, and an unknown GPU only matches an unknown one.
"""

from __future__ import annotations

from provision.host.facts import nvidia_smi

QUERY = ["--query-gpu=name", "--format=csv,noheader"]


def parse_names(stdout: str) -> tuple[str, int]:
    """(the name, or "A + B" for a mixed host; the GPU count) from nvidia-smi's output. Pure."""
    names = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    distinct = list(dict.fromkeys(n[:120] for n in names))
    return (" + ".join(distinct) if distinct else "unknown"), len(names)


def gpu_name(timeout: float = 20) -> dict:
    """{"name": ..., "count": N, "unknown": None} or {"name": "unknown", "unknown": why}."""
    ran = nvidia_smi.run(QUERY, timeout)
    if "why" in ran:
        return {"name": "unknown", "count": 0, "unknown": ran["why"]}
    if ran["returncode"] != 0:
        return {"name": "unknown", "count": 0, "unknown": f"{ran['path']} failed (exit {ran['returncode']})"}
    name, count = parse_names(ran["stdout"])
    return {"name": name, "count": count, "unknown": None if count else "nvidia-smi listed no GPU"}
