"""Build the payload shipped to a host: the stdlib-only modules of provision.host, read as files.

Control side only. The bundle is built once per process and reused for every host.
Modules are keyed by their real dotted names (``provision.host.ops.patch``); a package's
``__init__`` travels only when it has code (the bootstrap makes every package on the way).
"""

from __future__ import annotations

import functools
import json
import zlib
from pathlib import Path

from provision.host.bootstrap import bootstrap_code, frame

HOST_DIR = Path(__file__).resolve().parents[2] / "host"
# Host modules that never run on a host: the protocol's types are imported there only under
# TYPE_CHECKING (mypy reads them; the control side's tasks import them), so they stay here.
CONTROL_ONLY = frozenset({"protocol"})
# Switches the host-side failpoints on (provision/host/lib/failpoints.py): forwarded in every request.
FAILPOINTS_ENV = "PROVISION_FAILPOINTS"


def host_modules() -> dict[str, Path]:
    """{name relative to provision.host (``ops.patch``, ``agent``): file} of every shipped module."""
    out = {}
    for path in sorted(HOST_DIR.rglob("*.py")):
        rel = path.relative_to(HOST_DIR).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


@functools.lru_cache(maxsize=None)
def bundle_bytes(exclude: frozenset = frozenset()) -> bytes:
    """The host modules, less ``exclude`` (names relative to provision.host, e.g. ``ops.server``):
    a caller that never needs some ships less."""
    modules = {}
    for rel, path in host_modules().items():
        if rel in exclude or rel in CONTROL_ONLY:
            continue
        text = path.read_text(encoding="utf-8")
        if path.name == "__init__.py" and not text.strip():
            continue
        modules["provision.host" + ("." + rel if rel else "")] = text
    return zlib.compress(json.dumps(modules).encode(), 9)


def with_failpoints(request: dict) -> dict:
    """The request with the control machine's PROVISION_FAILPOINTS forwarded (when set, and only
    in test mode: config/testmode.py)."""
    from provision.config.testmode import switch

    points = switch(FAILPOINTS_ENV)
    return dict(request, failpoints=points) if points else request


def payload(request: dict, exclude: frozenset = frozenset()) -> bytes:
    return frame(bundle_bytes(exclude), json.dumps(with_failpoints(request)).encode())


def bootstrap_command(python: str = "python3", sudo: bool = False, *, sudo_prompt: str | None = None,
                      ready: str | None = None, entry: str = "provision.host.agent", isolated: bool = False) -> str:
    """The host-side command line: ``python -c BOOTSTRAP``, quoted for a shell.

    ``isolated``: ``-I`` too (the container transport: an image's PYTHONPATH and WORKDIR are not ours).
    ``sudo``: through ``sudo -n`` (never prompts), or, with ``sudo_prompt``, through
    ``sudo -S -p <sudo_prompt>`` (base.sudo_wrap; a transport applies it itself, around
    whatever it wraps the command in). ``ready``: the interpreter first prints this line on
    stdout, before reading stdin, so the caller knows sudo is done and the request may follow.
    Nothing secret ever goes in here: the line is visible in the host's process list.
    """
    import shlex

    code = bootstrap_code(entry)
    if ready is not None:
        if "\n" in ready or "'" in ready or "\\" in ready:
            raise ValueError("ready token must be one plain line")
        code = f"import sys as _s;_s.stdout.write('{ready}\\n');_s.stdout.flush()\n" + code
    # -S: the agent is stdlib-only, so skip site (and any .pth files) for a faster start.
    # isolated (-I): no PYTHON* variable, no cwd on sys.path (a container image's ENV and WORKDIR).
    cmd = f"{shlex.quote(python)} {'-I -S' if isolated else '-S'} -c {shlex.quote(code)}"
    if sudo:
        from provision.control.transport.base import sudo_wrap

        cmd = sudo_wrap(cmd, sudo_prompt=sudo_prompt)
    return cmd
