"""systemd as the backends see it: is it init here, `systemctl`, a unit's state.  STDLIB ONLY."""

from __future__ import annotations

import os
import subprocess

from provision.host.lib.trust import trusted_binary  # the one policy for binaries run as root


def systemd_available() -> bool:
    return os.path.isdir("/run/systemd/system") and trusted_binary("systemctl")[1] is None


def systemctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    exe, why = trusted_binary("systemctl")
    if why or not exe:
        return subprocess.CompletedProcess(["systemctl", *args], 1, "", why or "systemctl not found")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def unit_state(unit: str) -> dict | None:
    """ActiveState, SubState, UnitFileState (enabled?), NRestarts, MainPID, Result of a unit."""
    if not systemd_available():
        return None
    keys = ("ActiveState", "SubState", "UnitFileState", "NRestarts", "MainPID", "Result", "LoadState")
    p = systemctl("show", "-p", ",".join(keys), unit, timeout=30)
    if p.returncode != 0:
        return None
    out = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    for k in ("NRestarts", "MainPID"):
        try:
            out[k] = int(out.get(k) or 0)
        except ValueError:
            out[k] = 0
    return out
