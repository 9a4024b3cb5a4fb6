"""Which processes are provably provision's.  STDLIB ONLY.

A pid number is no identity: after a server and its watcher die hard (the OOM killer, a host
restarted) the kernel hands the number, and with it the process group and session numbers, to
anything. A record therefore keeps, for each process provision started, its pid and its start time
(field 22 of /proc/PID/stat, clock ticks since boot), and the boot id. A live process counts as
the server's only if its pid and start time match a recorded one, or it descends from one that
does (the watcher is a child subreaper: ranks whose server died are re-parented to it). A server in a
transient systemd unit (backends/transient.py) also owns every process of its unit's cgroup. A
record from an earlier boot, or of a server already stopped, owns nothing.
"""

from __future__ import annotations

import os

from provision.host.lib import procfs

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    try:
        with open(BOOT_ID) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def ident(pid: int | None) -> dict | None:
    """{"pid", "starttime"} of a live process, or None."""
    if not pid:
        return None
    st = procfs.starttime(pid)
    return {"pid": int(pid), "starttime": st} if st is not None else None


def _zombie(pid: int) -> bool:
    st = procfs.state(pid)
    return st is None or st == "Z"


def matches(pid: int | None, starttime: str | None) -> bool:
    """The process `pid` lives and is the one that started at `starttime` (None: not provable)."""
    if not pid or starttime is None:
        return False
    return procfs.starttime(pid) == str(starttime) and not _zombie(int(pid))


def roots(rec: dict | None) -> list[dict]:
    """The processes a record names with their start times: the server's main process and its watcher."""
    if not rec:
        return []
    out = []
    for pid_key, st_key in (("pid", "starttime"), ("watcher", "watcher_starttime")):
        if rec.get(pid_key) and rec.get(st_key) is not None:
            out.append({"pid": int(rec[pid_key]), "starttime": str(rec[st_key])})
    return out


def same_boot(rec: dict) -> bool:
    """The record was written in this boot (a record without a boot id is taken as this boot's)."""
    return not rec.get("boot_id") or rec.get("boot_id") == boot_id()


def process_table() -> dict[int, tuple[int, str]]:
    """{pid: (ppid, starttime)} of every live, non-zombie process (ourselves left out)."""
    me = os.getpid()
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for d in names:
        if not d.isdigit() or int(d) == me:
            continue
        f = procfs.stat_fields(d)
        if f is None or len(f) < 20 or f[0] == "Z":
            continue
        try:
            out[int(d)] = (int(f[1]), f[19])
        except ValueError:
            continue
    return out


def descendants_of(anchors: list[dict], table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Live pids that are one of `anchors` (pid and start time match) or descend from one. Pure given `table`."""
    table = process_table() if table is None else table
    good = {a["pid"] for a in anchors if a["pid"] in table and table[a["pid"]][1] == str(a["starttime"])}
    out = []
    for pid in table:
        p, seen = pid, 0
        while p and seen < 4096:
            if p in good:
                out.append(pid)
                break
            nxt = table.get(p)
            if nxt is None or nxt[0] == p:
                break
            p, seen = nxt[0], seen + 1
    return sorted(out)


def in_unit(unit: str, table: dict[int, tuple[int, str]]) -> list[int]:
    """Live pids in the cgroup of systemd unit `unit` (a transient unit provision named for one launch)."""
    out = []
    for pid in table:
        try:
            with open(f"/proc/{pid}/cgroup") as fh:
                text = fh.read()
        except OSError:
            continue
        if f"/{unit}\n" in text or text.endswith(f"/{unit}"):
            out.append(pid)
    return out


def owned(rec: dict | None, table: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """The live processes of a record's server tree that are provably provision's (see the module
    doc); for a server in a transient unit, also every process of the unit's cgroup."""
    if not rec or rec.get("stopped_at") or not same_boot(rec):
        return []
    table = process_table() if table is None else table
    out = set(descendants_of(roots(rec), table))
    if rec.get("cgroup_unit"):
        out |= set(in_unit(str(rec["cgroup_unit"]), table))
    return sorted(out)


def snapshot(pids: list[int]) -> list[dict]:
    """The identities of `pids` now, so a stop keeps knowing them after their parent dies."""
    return [i for i in (ident(p) for p in pids) if i is not None]


def still_alive(idents: list[dict]) -> list[int]:
    return sorted(i["pid"] for i in idents if matches(i["pid"], i["starttime"]))
