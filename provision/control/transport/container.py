"""A running container, reached through another transport: ``RUNTIME exec -i NAME``.

The container-exec implementation of base.Transport (pyinfra's ``chain``/``dockerssh``
connectors: the inner connector wraps the command, the outer one runs it). The host-side
step's command (``python3 -I -S -c BOOTSTRAP``: isolated, so neither the image's ``PYTHONPATH``
nor its working directory reaches sys.path) becomes ``RUNTIME exec -i -w / NAME sh -c CMD`` and
is run by the outer transport (an SSH session, or this machine), so the bundle and the
request go on stdin exactly as to a host and the agent runs inside the container with
the container's python, files and state directory (/var/lib/provision of the
container). sudo, when the outer host needs it, goes around the runtime (``sudo -n -- sh
-c 'podman exec ...'``): the runtime needs root there, the container does not need sudo.

An edit made this way lives in the container's writable layer: it survives ``RUNTIME
restart`` and is gone when the container is recreated (a new deploy, a new tag).

Runtime: ``docker`` or ``podman`` (the same verbs), or ``auto``: the first of them on the
outer host's PATH that knows the container. A missing runtime, an unknown or stopped
container, a docker daemon that is not running, and a container without python3 are each
one sentence.
"""

from __future__ import annotations

import re
import shlex

from provision.control.transport.base import Transport
from provision.errors import RemoteError, UsageError

RUNTIMES = ("docker", "podman")
# docker's and podman's own rule for names (ids are hex, which it admits too)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
MISSING = "provision-no-container-runtime"
UNKNOWN = "provision-no-runtime-knows-the-container"
PICKED = "provision-container-runtime"  # auto: which runtime took the step (on stderr, before it runs)


class ContainerError(RemoteError):
    """The container could not be reached: no runtime, no such container, not running."""

    kind = "container"


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise UsageError(f"--container {name!r}: not a container name or id (letters, digits, `_.-`, "
                         "starting with a letter or digit)")
    return name


def check_runtime(runtime: str | None) -> str:
    runtime = runtime or "auto"
    if runtime not in RUNTIMES + ("auto",):
        raise UsageError(f"--runtime {runtime!r}: expected docker, podman or auto")
    return runtime


def exec_command(runtime: str, name: str, command: str) -> str:
    """The outer host's command that runs ``command`` (a shell command line) inside ``name``,
    with stdin passed through. A missing runtime prints MISSING and exits 127 before anything
    runs. ``auto``: the first of docker, podman that is on PATH and knows the container
    (``container inspect``: a docker CLI without its daemon, or a host with both, picks the
    right one); none that knows it prints UNKNOWN. Pure."""
    q = shlex.quote(name)
    # -w /: the step runs in /, not the image's WORKDIR (which `python -c` would put first on sys.path)
    run = f"exec \"$r\" exec -i -w / {q} sh -c {shlex.quote(command)}"
    if runtime == "auto":
        script = ("found=; for r in " + " ".join(RUNTIMES) + "; do command -v \"$r\" >/dev/null 2>&1 || continue; "
                  f"found=\"$found $r\"; if \"$r\" container inspect {q} >/dev/null 2>&1; then "
                  f"echo \"{PICKED}: $r\" >&2; {run}; fi; done; "
                  f"if [ -z \"$found\" ]; then echo '{MISSING}: " + " ".join(RUNTIMES) + "' >&2; exit 127; fi; "
                  f"echo \"{UNKNOWN}:$found\" >&2; exit 125")
    else:
        script = (f"r={shlex.quote(runtime)}; if ! command -v \"$r\" >/dev/null 2>&1; then "
                  f"echo '{MISSING}: {runtime}' >&2; exit 127; fi; {run}")
    return "/bin/sh -c " + shlex.quote(script)


def not_started_reason(label: str, name: str, runtime: str, rc: int, err: str, python: str) -> RemoteError | None:
    """One sentence for a step that never started in the container, from the runtime's own
    words (docker's and podman's). None: not a container problem (sudo, ...). Pure."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    picked = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(PICKED + ":")]
    if runtime == "auto" and picked:
        runtime = picked[-1]
    said = [ln for ln in lines if not ln.startswith((MISSING, UNKNOWN, PICKED))]  # the runtime's own words
    low = "\n".join(said).lower()
    first = (said[0] if said else f"exit {rc}")[:200]
    if MISSING in err:
        if runtime == "auto":
            return ContainerError(f"{label}: cannot reach container {name}: neither docker nor podman is installed "
                                  "on this host (neither is on PATH)")
        return ContainerError(f"{label}: cannot reach container {name}: {runtime} is not installed on this host "
                              "(not on PATH); pick the runtime that runs it with --runtime")
    if UNKNOWN in err:
        asked = err.split(UNKNOWN + ":", 1)[1].split()
        return ContainerError(f"{label}: no container named {name} on this host (asked {' and '.join(asked)}; "
                              f"`{asked[-1] if asked else 'docker'} ps` lists the running ones)")
    if "no such container" in low or "no container with name or id" in low:
        return ContainerError(f"{label}: no container named {name} on this host "
                              f"(`{_rt(runtime)} ps` lists the running ones)")
    if "cannot connect to the docker daemon" in low:
        return ContainerError(f"{label}: cannot reach container {name}: the docker daemon is not running on this "
                              f"host ({first}); start it, or pick the runtime that runs the container with --runtime")
    if ("is not running" in low or "container state improper" in low or "is paused" in low
            or "can only create exec sessions on running containers" in low):
        return ContainerError(f"{label}: container {name} is not running; start it "
                              f"(`{_rt(runtime)} start {name}`) and run again")
    if "permission denied" in low and ("docker.sock" in low or "daemon" in low):
        return ContainerError(f"{label}: cannot reach container {name}: the runtime refused this user "
                              f"({first}); run as root (--sudo) or add the user to the docker group")
    if "executable file" in low and "not found" in low and ('"sh"' in low or "'sh'" in low):
        return ContainerError(f"{label}: container {name} has no /bin/sh, which provision runs its step with")
    if rc == 127 and "not found" in low:
        return ContainerError(f"{label}: {python} not found in container {name} (SGLang needs Python 3.10+)")
    return None


def _rt(runtime: str) -> str:
    return "docker" if runtime == "auto" else runtime


class ContainerTransport(Transport):
    """Container ``name`` on the host ``outer`` reaches; ``label`` is ``HOST/NAME``."""

    kind = "container"
    where = "container"
    isolated = True  # the agent runs `python3 -I -S`: the image's PYTHONPATH and WORKDIR never reach sys.path

    def __init__(self, outer: Transport, name: str, runtime: str | None = None):
        super().__init__()
        self.outer = outer
        self.name = check_name(name)
        self.runtime = check_runtime(runtime)

    # everything about the connection is the outer transport's
    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{self.outer.label}/{self.name}"

    @property
    def user(self) -> str:  # type: ignore[override]
        return self.outer.user

    @property
    def default_sudo(self) -> bool:  # type: ignore[override]
        return self.outer.default_sudo

    @property
    def sudo_password(self) -> bytes | None:  # type: ignore[override]
        return self.outer.sudo_password

    @property
    def channel_errors(self):  # type: ignore[override]
        return self.outer.channel_errors

    def open(self) -> "ContainerTransport":
        self.outer.open()
        return self

    def close(self) -> None:
        self.outer.close()

    @property
    def connected(self) -> bool:
        return self.outer.connected

    def cancel(self) -> None:
        self._cancelled.set()
        self.outer.cancel()

    def wrap_command(self, command: str) -> str:
        return self.outer.wrap_command(exec_command(self.runtime, self.name, command))

    def _channel(self, command: str, timeout: float):
        return self.outer._channel(command, timeout)

    def _wait(self, chan, seconds: float) -> None:
        self.outer._wait(chan, seconds)

    def _alive(self) -> bool:
        return self.outer._alive()

    def _not_started_reason(self, rc: int, err: str, python: str) -> RemoteError | None:
        return not_started_reason(self.label, self.name, self.runtime, rc, err, python)
