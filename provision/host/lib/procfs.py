"""The one reader of /proc/PID/stat (and cmdline, environ).  STDLIB ONLY (a leaf)."""

from __future__ import annotations

import os


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3, the state, is [0]); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:].decode("ascii", "replace").split()
    except (OSError, ValueError):
        return None


def _field(pid: int | str, index: int) -> str | None:
    f = stat_fields(pid)
    return f[index] if f is not None and len(f) > index else None


def state(pid: int | str) -> str | None:
    return _field(pid, 0)


def pgid(pid: int | str) -> int | None:
    v = _field(pid, 2)
    return int(v) if v is not None and v.lstrip("-").isdigit() else None


def sid(pid: int | str) -> int | None:
    v = _field(pid, 4)
    return int(v) if v is not None and v.lstrip("-").isdigit() else None


def starttime(pid: int | str) -> str | None:
    """The start time in clock ticks since boot, as /proc gives it (an identity token)."""
    return _field(pid, 19)


def boot_time() -> float:
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def start_epoch(pid: int | str) -> float | None:
    """When a process started (seconds since the epoch), from /proc; None if it is gone."""
    ticks = starttime(pid)
    if ticks is None or not ticks.isdigit():
        return None
    return boot_time() + int(ticks) / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int | str) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def uids(pid: int | str) -> list[int]:
    """The process's real, effective, saved and filesystem uids (/proc/PID/status); [] if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return [int(x) for x in line.split()[1:5]]
    except (OSError, ValueError):
        pass
    return []


def environ(pid: int | str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return {}
    env = {}
    for item in items:
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


def same_root(pid: int | str) -> bool | None:
    """Does the process see the same root directory as we do? False: it is in a container
    (or a chroot), and the paths it names are not ours. None: cannot tell (gone, no access)."""
    try:
        theirs = os.stat(f"/proc/{pid}/root")
        ours = os.stat("/")
    except OSError:
        return None
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def sees_our_file(pid: int | str, path: str) -> bool | None:
    """Is ``path``, as the process names it (through its root and mounts), the file we see at
    ``path``? False for a process in a container or in another mount namespace with other files
    there (the paths it names are not ours); None: cannot tell (gone, no access)."""
    if not os.path.isabs(path):
        return None
    try:
        theirs = os.stat(f"/proc/{pid}/root{path}")
    except OSError:
        return None
    try:
        ours = os.stat(path)
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
