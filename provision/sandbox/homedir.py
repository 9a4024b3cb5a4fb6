"""A throwaway HOME and XDG state for test and benchmark runs.

The test suite and the benchmarks run the real `provision` command, which keeps its
journal, reconcile cache and lock under ``~/.local/state/provision`` and reads
``~/.ssh``. Run from a user's machine, they must never write there: every run gets
its own directories, set in the environment so that `provision` subprocesses
inherit them. The wheel cache (``~/.cache/provision-wheels``) is the one thing kept
from the real HOME (pinned through ``PROVISION_WHEEL_CACHE``): re-downloading
SGLang per run would cost minutes and reach the registry.
"""

from __future__ import annotations

import os
from pathlib import Path

REAL_HOME_VAR = "PROVISION_REAL_HOME"  # where the real HOME was, for the few that need it


def isolated_env(base: str | os.PathLike, environ: dict | None = None) -> dict:
    """The variables to set so that nothing reaches the real HOME: created under `base`."""
    environ = os.environ if environ is None else environ
    base = Path(base)
    home = base / "home"
    env = {
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "PROVISION_JOURNAL": str(home / ".local" / "state" / "provision" / "journal.jsonl"),
        "PROVISION_LOCK": str(home / ".local" / "state" / "provision" / "reconcile.lock"),
        # the test-only switches (PROVISION_FAILPOINTS, PROVISION_NOW, ...) act: provision/config/testmode.py
        "PROVISION_TEST_MODE": "1",
    }
    real_home = environ.get(REAL_HOME_VAR) or environ.get("HOME") or os.path.expanduser("~")
    env[REAL_HOME_VAR] = real_home
    env["PROVISION_WHEEL_CACHE"] = environ.get("PROVISION_WHEEL_CACHE") or os.path.join(
        real_home, ".cache", "provision-wheels")
    for key in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    return env


def isolate(base: str | os.PathLike) -> dict:
    """Set isolated_env(base) in os.environ (for this process and its children); return the old values."""
    env = isolated_env(base)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return old


def restore(old: dict) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
