"""Build the payload shipped to a host: the stdlib-only modules of provision.remote.

Control side only. The bundle is built once per process and reused for every host.
"""

from __future__ import annotations

import functools
import json
import zlib
from pathlib import Path

from provision.remote.bootstrap import BOOTSTRAP, frame

REMOTE_DIR = Path(__file__).resolve().parent
# Modules that never leave the control machine.
CONTROL_ONLY = {"bundle"}


@functools.lru_cache(maxsize=None)
def bundle_bytes() -> bytes:
    modules = {}
    for path in sorted(REMOTE_DIR.glob("*.py")):
        stem = path.stem
        if stem in CONTROL_ONLY or stem == "__init__":
            continue
        modules[f"provision.remote.{stem}"] = path.read_text(encoding="utf-8")
    return zlib.compress(json.dumps(modules).encode(), 9)


def payload(request: dict) -> bytes:
    return frame(bundle_bytes(), json.dumps(request).encode())


def bootstrap_command(python: str = "python3", sudo: bool = False) -> str:
    import shlex

    cmd = f"{shlex.quote(python)} -c {shlex.quote(BOOTSTRAP)}"
    if sudo:
        cmd = "sudo -n -- " + cmd
    return cmd
