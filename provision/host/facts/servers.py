"""Running SGLang servers as the reconcile and patch ops see them.  STDLIB ONLY."""

from __future__ import annotations

import os

from provision.host.facts import installs
from provision.host.lib import procfs


def changed_at(st) -> float:
    """When a file's bytes last changed: its mtime, or its ctime when later (cp -a and
    some installers keep an old mtime; a rename or write always moves the ctime)."""
    return max(st.st_mtime, st.st_ctime)


def _server_candidates() -> list:
    """Pids that may be SGLang servers, from a cheap look at /proc (false positives
    only cost time: discover.running_servers decides)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return [-1]  # cannot tell: the full look decides
    me = str(os.getpid())
    out = []
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                raw = fh.read(4096)
        except OSError:
            continue
        if b"sglang" in raw and (b"launch_server" in raw or b"serve" in raw):
            out.append(int(pid))
    return out


def _servers() -> list:
    """Running SGLang servers with the install each imports (an interpreter probe each)."""
    out = []
    for s in installs.running_servers():
        s["install"] = installs._server_install(s)
        out.append(s)
    return out


def _fast_servers(known) -> list:
    """The servers for the fast paths. A server the control side already knows (same pid,
    same start time: ``known_servers`` from the last answer) keeps its known install, so
    a host with a running server costs no interpreter probe; anything new gets the full
    look (discover.running_servers + a probe)."""
    cands = _server_candidates()
    if not cands:
        return []
    by_pid = {k.get("pid"): k for k in known or [] if isinstance(k, dict)}
    views = []
    for pid in cands:
        k = by_pid.get(pid)
        started = procfs.start_epoch(pid)
        if k is None or started is None or k.get("started") is None or abs(k["started"] - started) > 0.5:
            return [_server_view(s) for s in _servers()]
        views.append({"pid": pid, "port": k.get("port"), "listening": None, "install": k.get("install"),
                      "started": started})
    return views


def _server_view(s: dict) -> dict:
    return {"pid": s["pid"], "port": s.get("port"), "listening": s.get("listening"), "install": s.get("install"),
            "started": procfs.start_epoch(s["pid"])}


def restart_needed(servers: list, install: str, changed: float) -> list:
    """Servers importing `install` that started before the file last changed."""
    return [s for s in servers if s.get("install") == install and s.get("started") is not None
            and s["started"] < changed]
