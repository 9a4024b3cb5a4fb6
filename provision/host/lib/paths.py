"""Where provision keeps its files on a host.  STDLIB ONLY (a leaf)."""

from __future__ import annotations

import json
import os


def default_state_dir() -> str:
    """/var/lib/provision for root, else $XDG_STATE_HOME/provision (~/.local/state/provision)."""
    if os.geteuid() == 0:
        return "/var/lib/provision"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "provision")


def server_state_root(state_dir: str | None) -> str:
    """Where the servers' records are: <state dir>/server (server-PORT.json)."""
    return os.path.join(state_dir or default_state_dir(), "server")


def last_recorded_server(state_dir: str | None) -> dict | None:
    """The record of the server provision started last on this host (running or stopped): the
    newest `started_at` of the state dir's server-PORT.json files, or None."""
    root, best = server_state_root(state_dir), None
    try:
        names = os.listdir(root)
    except OSError:
        return None
    for name in names:
        if not (name.startswith("server-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(root, name)) as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("python"), str) and \
                (best is None or float(rec.get("started_at") or 0) > float(best.get("started_at") or 0)):
            best = rec
    return best
