"""The GPUs' compute capability, from nvidia-smi.  STDLIB ONLY, read-only.

``nvidia-smi --query-gpu=compute_cap --format=csv,noheader`` prints one line per GPU
("12.0" on an RTX PRO 6000 Blackwell). It runs as root here, so it is found and
judged by the one policy for binaries run as root (lib/trust.trusted_binary: on a fixed PATH,
never the caller's; it and every directory above it owned by root, or by the agent's own
non-root user, and not writable by group or others), and run with a fixed environment,
cwd /, no stdin and a timeout. Without it, the capability is unknown and
the answer says why.
"""

from __future__ import annotations

import re
import subprocess
TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

from provision.host.lib.trust import SAFE_ENV, trusted_binary

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
    smi, why = trusted_binary("nvidia-smi")
    if not smi:
        return {"capabilities": [], "count": 0, "source": None, "unknown": "no nvidia-smi on the host"}
    if why:
        return {"capabilities": [], "count": 0, "source": smi, "unknown": why}
    try:
        proc = subprocess.run([smi] + QUERY, capture_output=True, text=True, timeout=timeout, env=dict(SAFE_ENV),
                              cwd="/", stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"capabilities": [], "count": 0, "source": smi, "unknown": f"{smi} did not answer in {timeout:g} s"}
    except OSError as exc:
        return {"capabilities": [], "count": 0, "source": smi, "unknown": f"{smi} did not run ({exc.strerror})"}
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        return {"capabilities": [], "count": 0, "source": smi,
                "unknown": f"{smi} failed (exit {proc.returncode})" + (f": {msg[-1][:160]}" if msg else "")}
    caps, why = parse_compute_cap(proc.stdout)
    count = len([ln for ln in proc.stdout.splitlines() if ln.strip()])
    return {"capabilities": caps, "count": count if caps else 0, "source": smi, "unknown": why}
