"""nvidia-smi, found and run one way for every reader of it.  STDLIB ONLY, read-only.

It runs as root here, so it is found and judged by the one policy for binaries run as root
(lib/trust.trusted_binary: on a fixed PATH, never the caller's; it and every directory above it
owned by root, or by the agent's own non-root user, and not writable by group or others), and
run with the one fixed environment (lib/trust.SAFE_ENV), cwd /, no stdin and a timeout.

Its readers parse what it prints, each a pure function beside its query: facts/gpu.py (the
compute capability), facts/gpu_name.py (the product name) and facts/gpu_use.py (the GPUs and
who holds memory on them).
"""

from __future__ import annotations

import subprocess

from provision.host.lib.trust import SAFE_ENV, trusted_binary


def run(args: list[str], timeout: float = 20) -> dict:
    """nvidia-smi `args`: {"path", "stdout", "stderr", "returncode"} when it ran, else {"path": the
    binary or None, "why": a sentence}, with "refused": True when it was never started (none on
    the fixed PATH: path None; or untrusted)."""
    smi, why = trusted_binary("nvidia-smi")
    if not smi:
        return {"path": None, "why": "no nvidia-smi on the host", "refused": True}
    if why:
        return {"path": smi, "why": why, "refused": True}
    try:
        p = subprocess.run([smi] + list(args), capture_output=True, text=True, timeout=timeout, env=dict(SAFE_ENV),
                           cwd="/", stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"path": smi, "why": f"{smi} did not answer in {timeout:g} s"}
    except OSError as exc:
        return {"path": smi, "why": f"{smi} did not run ({exc.strerror})"}
    return {"path": smi, "stdout": p.stdout, "stderr": p.stderr, "returncode": p.returncode}
