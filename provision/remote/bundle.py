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
def bundle_bytes(exclude: frozenset = frozenset()) -> bytes:
    """The remote modules, less ``exclude`` (stems): a caller that never needs some ships less."""
    modules = {}
    for path in sorted(REMOTE_DIR.glob("*.py")):
        stem = path.stem
        if stem in CONTROL_ONLY or stem == "__init__" or stem in exclude:
            continue
        modules[f"provision.remote.{stem}"] = path.read_text(encoding="utf-8")
    return zlib.compress(json.dumps(modules).encode(), 9)


def payload(request: dict, exclude: frozenset = frozenset()) -> bytes:
    return frame(bundle_bytes(exclude), json.dumps(request).encode())


def bootstrap_command(python: str = "python3", sudo: bool = False, *, sudo_prompt: str | None = None,
                      ready: str | None = None, entry: str = "provision.remote.agent") -> str:
    """The remote command line: ``python -c BOOTSTRAP``, quoted for the remote shell.

    ``sudo``: through ``sudo -n`` (never prompts), or, with ``sudo_prompt``, through
    ``sudo -S -p <sudo_prompt>``: sudo prints that token on stderr when it wants the
    password, which the caller then writes to stdin (never into this command line).
    ``ready``: the interpreter first prints this line on stdout, before reading stdin,
    so the caller knows sudo is done and the request may follow.
    Nothing secret ever goes in here: the line is visible in the host's process list.
    """
    import shlex

    from provision.remote.bootstrap import bootstrap_code

    code = bootstrap_code(entry)
    if ready is not None:
        if "\n" in ready or "'" in ready or "\\" in ready:
            raise ValueError("ready token must be one plain line")
        code = f"import sys as _s;_s.stdout.write('{ready}\\n');_s.stdout.flush()\n" + BOOTSTRAP
    # -S: the agent is stdlib-only, so skip site (and any .pth files) for a faster start.
    cmd = f"{shlex.quote(python)} -S -c {shlex.quote(code)}"
    if sudo:
        if sudo_prompt is not None:
            if "%" in sudo_prompt or "\n" in sudo_prompt:
                raise ValueError("sudo prompt token must not contain % or a newline")
            cmd = f"sudo -S -p {shlex.quote(sudo_prompt)} -- " + cmd
        else:
            cmd = "sudo -n -- " + cmd
    return cmd
