"""Where provision keeps its files on a host.  STDLIB ONLY (a leaf)."""

from __future__ import annotations

import os


def default_state_dir() -> str:
    """/var/lib/provision for root, else $XDG_STATE_HOME/provision (~/.local/state/provision)."""
    if os.geteuid() == 0:
        return "/var/lib/provision"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "provision")
