"""Running containers whose command is an SGLang server, on this host.  STDLIB ONLY.

A server in a container is not one of the host's installs: its files are the container's
(``provision patch --container NAME`` reaches them), so discovery keeps it apart. A process
whose root directory is not ours is in a container (or a chroot); installs.running_servers
leaves such processes out, and this module names the containers, from the runtime's own
list (``docker ps`` / ``podman ps``), so `status` can show them beside the host's installs.

The runtime is asked only when a process with another root runs an SGLang server (a
host without one pays nothing: no runtime is started), and only a runtime binary that
passes installs.untrusted_reason is run (as root, it must be root's).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import TYPE_CHECKING, Any

from provision.host.lib import procfs
from provision.host import inference
from provision.host.lib.redact import redact_argv

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import ContainersFacts, SglangContainer

RUNTIMES = ("docker", "podman")
RUNTIME_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# `ps` output, one JSON document per container (podman's `json` format is one list)
PS_FORMAT = {"docker": "{{json .}}", "podman": "json"}


def foreign_root_servers() -> list[int]:
    """Pids of server processes (of any engine provision knows) whose root directory is not ours (in a container)."""
    out = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        argv = procfs.cmdline(pid)
        if argv and _is_server(argv) and procfs.same_root(pid) is False:
            out.append(int(pid))
    return out


def _is_server(argv: list[str]) -> bool:
    """Is this command line the main process of a server of any engine provision knows (each by its own rule)?"""
    return any(e.is_server(argv) for e in inference.engines())


def _command(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value or "").strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]  # docker quotes its Command column
    return text.split()


def _names(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [n for n in str(value or "").split(",") if n]


def _port(argv: list[str]) -> int | None:
    for i, a in enumerate(argv):
        v = argv[i + 1] if a == "--port" and i + 1 < len(argv) else a.split("=", 1)[1] if a.startswith("--port=") \
            else None
        if v is not None and v.isdigit():
            return int(v)
    return None


def parse_ps(runtime: str, text: str) -> list[SglangContainer]:
    """The SGLang-server containers in ``RUNTIME ps`` output (docker's JSON lines, podman's JSON
    list), each as {runtime, name, id, image, command, state, port}; the command redacted (another
    container's ``--api-key`` must not reach status --json and monitoring). Pure."""
    text = text.strip()
    if not text:
        return []
    docs: list = []
    if text.startswith("["):
        try:
            docs = json.loads(text)
        except ValueError:
            return []
    else:
        for line in text.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    out: list[SglangContainer] = []
    for d in docs:
        if not isinstance(d, dict):
            continue
        argv = _command(d.get("Command"))
        if not _is_server(argv):
            continue
        names = _names(d.get("Names"))
        out.append({"runtime": runtime, "name": names[0] if names else str(d.get("ID") or d.get("Id") or "")[:12],
                    "id": str(d.get("ID") or d.get("Id") or "")[:12], "image": str(d.get("Image") or ""),
                    "command": redact_argv(argv), "state": str(d.get("State") or d.get("Status") or ""), "port": _port(argv)})
    return out


def sglang_containers(force: bool = False, timeout: float = 15.0) -> ContainersFacts:
    """{"containers": [...], "notes": [...]}: running containers whose command is an SGLang
    server, from every trusted runtime on this host. Asks no runtime unless a process with
    another root runs an SGLang server (``force``: ask anyway)."""
    from provision.host.lib.trust import trusted_binary

    out: ContainersFacts = {"containers": [], "notes": []}
    if not force and not foreign_root_servers():
        return out
    env = dict(os.environ)
    env.setdefault("PATH", RUNTIME_PATH)
    for runtime in RUNTIMES:
        path, why = trusted_binary(runtime)
        if not path:
            continue
        if why:
            out["notes"].append(why)
            continue
        try:
            proc = subprocess.run([path, "ps", "--no-trunc", "--format", PS_FORMAT[runtime]], capture_output=True,
                                  text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd="/")
        except (OSError, subprocess.SubprocessError) as exc:
            out["notes"].append(f"`{runtime} ps` did not answer: {exc}")
            continue
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200]
            if "cannot connect to the docker daemon" not in last.lower():  # no daemon: no containers of its
                out["notes"].append(f"`{runtime} ps` failed: {last}")
            continue
        out["containers"].extend(parse_ps(runtime, proc.stdout))
    return out
