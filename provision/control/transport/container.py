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

Runtime: ``docker`` or ``podman`` (the same verbs), or ``auto``: the first of them that knows
the container. It runs as root on the outer host, so it is chosen by the one rule for binaries
run as root (provision/host/lib/trust.py): looked up on SAFE_PATH, never the login PATH, and
run only when it and every directory above it are root's and not writable by group or others.
The outer host may have no python of ours, so its /bin/sh applies the rule, in trust.py's sh
rendition (SH_RULE), before the runtime runs. A missing runtime, one that fails the rule, an
unknown or stopped container, a docker daemon that is not running, and a container without
python3 are each one sentence.
"""

from __future__ import annotations

import re
import shlex

from provision.control.transport.base import Transport
from provision.errors import RemoteError, UsageError
from provision.host.lib.trust import SAFE_PATH, SH_RULE, sh_reason  # the one trust rule, stdlib, both sides

RUNTIMES = ("docker", "podman")
# docker's and podman's own rule for names (ids are hex, which it admits too)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
MISSING = "provision-no-container-runtime"
UNKNOWN = "provision-no-runtime-knows-the-container"
PICKED = "provision-container-runtime"  # auto: which runtime took the step (on stderr, before it runs)
REFUSED = "provision-untrusted-container-runtime"  # a runtime that fails the trust rule: never run
RULE = ("provision runs a container runtime as root only when it and every directory above it are root's "
        "and not writable by group or others")


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


def exec_command(runtime: str, name: str, command: str, runtimes: tuple = RUNTIMES) -> str:
    """The outer host's command that runs ``command`` (a shell command line) inside ``name``,
    with stdin passed through. The runtime is chosen as the host side chooses every binary it
    runs as root (provision/host/lib/trust.py, said in sh there as SH_RULE): the first one on
    SAFE_PATH, never the login PATH, and run only if it passes the trust rule; PATH is SAFE_PATH
    for the runtime too. A missing runtime prints MISSING and exits 127, one that fails the rule
    prints REFUSED and its line and exits 126, before anything runs. ``auto``: the first of
    ``runtimes`` that is there, passes the rule and knows the container (``container inspect``:
    a docker CLI without its daemon, or a host with both, picks the right one); one that fails
    the rule is never run, not even to ask; none that knows it prints UNKNOWN. Pure."""
    q = shlex.quote(name)
    # -w /: the step runs in /, not the image's WORKDIR (which `python -c` would put first on sys.path)
    run = f"exec \"$p\" exec -i -w / {q} sh -c {shlex.quote(command)}"
    head = f"PATH={SAFE_PATH}; export PATH\n{SH_RULE}"
    if runtime == "auto":
        script = (head + "found=; asked=; refused=; for r in " + " ".join(runtimes) + "; do "
                  "p=$(provision_which \"$r\") || continue; found=\"$found $r\"; "
                  f"if ! why=$(provision_untrusted \"$p\"); then printf '%s: %s %s\\n' {REFUSED} \"$r\" \"$why\" >&2; refused=1; continue; fi; "
                  f"asked=\"$asked $r\"; if \"$p\" container inspect {q} >/dev/null 2>&1; then "
                  f"echo \"{PICKED}: $r\" >&2; {run}; fi; done; "
                  f"if [ -z \"$found\" ]; then echo '{MISSING}: " + " ".join(runtimes) + "' >&2; exit 127; fi; "
                  f"echo \"{UNKNOWN}:$asked\" >&2; if [ -n \"$refused\" ]; then exit 126; fi; exit 125")
    else:
        script = (head + f"r={shlex.quote(runtime)}; if ! p=$(provision_which \"$r\"); then "
                  f"echo '{MISSING}: {runtime}' >&2; exit 127; fi; "
                  f"if ! why=$(provision_untrusted \"$p\"); then printf '%s: %s %s\\n' {REFUSED} \"$r\" \"$why\" >&2; exit 126; fi; {run}")
    return "/bin/sh -c " + shlex.quote(script)


def not_started_reason(label: str, name: str, runtime: str, rc: int, err: str, python: str) -> RemoteError | None:
    """One sentence for a step that never started in the container, from the runtime's own
    words (docker's and podman's). None: not a container problem (sudo, ...). Pure."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    picked = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(PICKED + ":")]
    if runtime == "auto" and picked:
        runtime = picked[-1]
    said = [ln for ln in lines if not ln.startswith((MISSING, UNKNOWN, PICKED, REFUSED))]  # the runtime's own words
    low = "\n".join(said).lower()
    first = (said[0] if said else f"exit {rc}")[:200]
    if MISSING in err:
        if runtime == "auto":
            return ContainerError(f"{label}: cannot reach container {name}: neither docker nor podman is installed "
                                  f"on this host (neither is on {SAFE_PATH})")
        return ContainerError(f"{label}: cannot reach container {name}: {runtime} is not installed on this host "
                              f"(not on {SAFE_PATH}); pick the runtime that runs it with --runtime")
    refused = [ln[len(REFUSED) + 2:].split(" ", 1) for ln in err.splitlines() if ln.startswith(REFUSED + ": ")]
    if refused and not picked:  # each runtime's line: "RUNTIME <provision_untrusted's line>"
        said_no = "; ".join("{} not run: {}".format(*sh_reason(r[-1])) for r in refused)
        asked = err.split(UNKNOWN + ":", 1)[1].split() if UNKNOWN in err else []
        also = f"; {' and '.join(asked)}, asked too, does not know it" if asked else ""
        return ContainerError(f"{label}: cannot reach container {name}: {said_no} ({RULE}){also}")
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
