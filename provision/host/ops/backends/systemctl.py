"""systemd as the backends see it: is it init here, `systemctl`, a unit's state.  STDLIB ONLY."""

from __future__ import annotations

import os
import subprocess

from provision.host.lib.trust import trusted_binary  # the one policy for binaries run as root


def systemd_available() -> bool:
    return os.path.isdir("/run/systemd/system") and trusted_binary("systemctl")[1] is None


def can_run_units() -> bool:
    """Can this agent start units of the system manager (`systemd-run`, a persistent unit)? systemd
    is init here and the agent is root: a non-root agent's `systemd-run` is refused (no polkit)."""
    return systemd_available() and os.geteuid() == 0


def server_limits(nofile_hard: int) -> dict[str, str]:
    """The limits a GPU server's unit needs, where systemd's service defaults would cap what a
    server started from a shell had (pure): NCCL over InfiniBand registers (locks) memory without
    bound (default 8 MiB); a server holds a socket and a file per client and shard (default soft
    1024: raised to the session's hard limit); its ranks and threads run to thousands (no TasksMax)."""
    infinite = nofile_hard < 0 or nofile_hard >= 2 ** 63 - 1  # RLIM_INFINITY
    return {"LimitMEMLOCK": "infinity", "LimitNOFILE": "infinity" if infinite else str(int(nofile_hard)),
            "TasksMax": "infinity"}


def session_limits() -> dict[str, str]:
    """server_limits for this agent's session (its hard RLIMIT_NOFILE, what a shell could raise to)."""
    import resource

    return server_limits(resource.getrlimit(resource.RLIMIT_NOFILE)[1])


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
