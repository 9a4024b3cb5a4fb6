"""Running servers of an engine as the reconcile and patch ops see them.  STDLIB ONLY."""

from __future__ import annotations

import os

from provision.host.lib import procfs


def changed_at(st) -> float:
    """When a file's bytes last changed: its mtime, or its ctime when later (cp -a and
    some installers keep an old mtime; a rename or write always moves the ctime)."""
    return max(st.st_mtime, st.st_ctime)


def _server_candidates(engine) -> list:
    """Pids that may be the engine's servers, from a cheap look at /proc (its `may_be_server` on the
    raw command line: false positives only cost time, discover.running_servers decides)."""
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
        if engine.may_be_server(raw):
            out.append(int(pid))
    return out


def _servers(engine) -> list:
    """The engine's running servers with the install each imports (an interpreter probe each).
    Discovery (facts/installs.py, the heaviest import a host step has) is imported only here:
    a fast path on a host with no server never loads it."""
    from provision.host.facts import installs

    out = []
    for s in installs.running_servers(engine):
        s["install"] = installs._server_install(s, engine)
        out.append(s)
    return out


def _fast_servers(engine) -> list:
    """The servers for reconcile's first check: none to probe when none of the engine's servers runs
    (no interpreter is started then); otherwise each with the install it imports."""
    if not _server_candidates(engine):
        return []
    return [_server_view(s) for s in _servers(engine)]


def _server_view(s: dict) -> dict:
    return {"pid": s["pid"], "port": s.get("port"), "listening": s.get("listening"), "install": s.get("install"),
            "started": procfs.start_epoch(s["pid"])}


def restart_needed(servers: list, install: str, changed: float) -> list:
    """Servers importing `install` that started before the file last changed."""
    return [s for s in servers if s.get("install") == install and s.get("started") is not None
            and s["started"] < changed]
