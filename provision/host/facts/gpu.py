"""The GPUs' compute capability, from nvidia-smi.  STDLIB ONLY, read-only.

``nvidia-smi --query-gpu=compute_cap --format=csv,noheader`` prints one line per GPU
("12.0" on an RTX PRO 6000 Blackwell); it is found and run as facts/nvidia_smi.py says, the one
way. Without it, the capability is unknown and the answer says why.
"""

from __future__ import annotations

import re
TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

from provision.host.facts import nvidia_smi

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import GpuInfo

QUERY = ["--query-gpu=compute_cap", "--format=csv,noheader"]
_CAP = re.compile(r"^\s*(\d{1,2})\.(\d{1,2})\s*$")


def parse_compute_cap(stdout: str) -> tuple[list[str], str | None]:
    """(distinct capabilities in order, None) or ([], why) for nvidia-smi's output. Pure."""
    caps: list[str] = []
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return [], "nvidia-smi listed no GPU"
    for ln in lines:
        m = _CAP.match(ln)
        if not m:
            return [], f"nvidia-smi printed {ln.strip()[:120]!r}, not a compute capability"
        cap = f"{int(m.group(1))}.{int(m.group(2))}"
        if cap not in caps:
            caps.append(cap)
    return caps, None


def compute_capability(timeout: float = 20) -> GpuInfo:
    """{"capabilities": [...], "count": N, "source": path, "unknown": None} or, when it cannot be
    told, {"capabilities": [], "unknown": why}."""
    ran = nvidia_smi.run(QUERY, timeout)
    smi = ran["path"]
    if "why" in ran:
        return {"capabilities": [], "count": 0, "source": smi, "unknown": ran["why"]}
    if ran["returncode"] != 0:
        msg = (ran["stderr"].strip() or ran["stdout"].strip()).splitlines()
        return {"capabilities": [], "count": 0, "source": smi,
                "unknown": f"{smi} failed (exit {ran['returncode']})" + (f": {msg[-1][:160]}" if msg else "")}
    caps, why = parse_compute_cap(ran["stdout"])
    count = len([ln for ln in ran["stdout"].splitlines() if ln.strip()])
    return {"capabilities": caps, "count": count if caps else 0, "source": smi, "unknown": why}
