"""`provision schedule`: the systemd units and the cron line that run `provision reconcile`.  Pure."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys

from provision.errors import UsageError


def parse_every(text: str) -> tuple[int, str]:
    """`15m` / `1h` -> (seconds, cron schedule). Cron can only repeat on divisors of an
    hour or a day, so those are what is accepted."""
    m = re.fullmatch(r"\s*(\d+)\s*(m|min|minutes?|h|hours?)\s*", text or "")
    if not m or int(m.group(1)) < 1:
        raise UsageError(f"--every {text!r}: expected minutes or hours, e.g. 15m or 2h")
    n, unit = int(m.group(1)), m.group(2)[0]
    minutes = n if unit == "m" else n * 60
    if minutes < 60 and 60 % minutes == 0:
        return minutes * 60, f"*/{minutes} * * * *" if minutes > 1 else "* * * * *"
    if minutes % 60 == 0 and 24 % (minutes // 60) == 0:
        h = minutes // 60
        return minutes * 60, "0 * * * *" if h == 1 else f"0 */{h} * * *"
    raise UsageError(f"--every {text!r}: cron cannot repeat on that; use minutes dividing 60 "
                     "(5m, 10m, 15m, 30m) or hours dividing 24 (1h, 2h, 6h, 12h, 24h)")


def provision_argv() -> list[str]:
    """How to run this same provision from a unit file: an absolute path."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "provision" and os.path.isfile(argv0):
        return [os.path.abspath(argv0)]
    found = shutil.which("provision")
    if found:
        return [os.path.abspath(found)]
    return [os.path.abspath(sys.executable), "-m", "provision"]


def interpreter_of(script: str) -> str | None:
    """The interpreter a script's #! line names (an absolute path), or None (a binary, no #!)."""
    try:
        with open(script, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:  # #!/usr/bin/env python3: as PATH finds it
        found = shutil.which(words[-1])
        return os.path.abspath(found) if found else words[-1]
    return words[0]


def vet_argv(argv: list[str]) -> list[str]:
    """What a root unit (or a user's) will run, held to the host side's one trust rule before it is
    written: the provision executable and the interpreter it runs under (its #! line, or the python
    of `python -m provision`), each with every directory up to /, owned by root (or the installing
    user, for a user unit) and writable by nobody else. A path anyone else can write would have the
    timer run their code as root every 15 minutes. Returns the paths checked; UsageError (exit 2)
    with the sentence naming the path, its owner or mode, otherwise."""
    from provision.host.lib.trust import untrusted_path_reason, untrusted_reason

    exe = argv[0]
    checks = [("the provision executable", exe, untrusted_path_reason)]
    interp = exe if argv[1:2] == ["-m"] else interpreter_of(exe)
    if interp is not None and interp != exe:
        checks.append(("its interpreter", interp, untrusted_reason))
    for what, path, rule in checks:
        if not os.path.isabs(path):
            raise UsageError(f"{what} {path!r} is not an absolute path: a unit must name what it runs; "
                             "install provision where root's units can name it (pip install as root, pipx)")
        why = rule(path)
        if why:
            raise UsageError(f"{what} {path} cannot go into a unit that runs as "
                             f"{'root' if os.geteuid() == 0 else 'you'}: {why}. Anyone who can change it would "
                             "run their code from the timer; install provision somewhere only root can write "
                             "(e.g. `pip install .` as root, or `pipx install .` with PIPX_HOME under /opt), "
                             "then run schedule --install from there")
    return [path for _, path, _ in checks]


def install_units(target: str, units: dict) -> list[str]:
    """Write the service and the timer into `target` with the one atomic writer (0644: systemd
    reads them; a link at their names is replaced, never followed). Returns the paths written."""
    from provision.host.lib import atomic

    os.makedirs(target, exist_ok=True)
    written = []
    for name in ("provision-reconcile.service", "provision-reconcile.timer"):
        path = os.path.join(target, name)
        atomic.write_text(path, units[name], 0o644)
        written.append(path)
    return written


def start_timeout(argv: list[str]) -> str:
    """The service's TimeoutStartSec line. A re-patch-only reconcile is minutes: 2 h catches a hung
    run. With --restart, a rolling restart is as long as its batches' model loads (eight Kimi loads
    with --serial 1 take more than two hours), which no fixed limit fits, so there is none: each
    restart already has its own --restart-deadline."""
    if "--restart" in argv:
        return ("# --restart: no start limit (each batch waits for its servers' loads, each bounded by "
                "--restart-deadline)\nTimeoutStartSec=infinity")
    return "TimeoutStartSec=2h"


def render_units(argv: list[str], seconds: int, cron: str, log: str, metrics_argv: list[str] | None = None) -> dict:
    """metrics_argv: `provision status ... --format prometheus --metrics-file PATH`, run after every
    reconcile, whatever its exit code (ExecStopPost=-, and `;` in the cron line)."""
    from provision.host.ops.server import systemd_quote  # one quoting for every unit provision writes

    exec_start = " ".join(systemd_quote(a) for a in argv)
    if metrics_argv:
        exec_start += "\n# the fleet's state for node_exporter's textfile collector (schedule --metrics-file)\n" \
                      "ExecStopPost=-" + " ".join(systemd_quote(a) for a in metrics_argv)
    timeout = start_timeout(argv)
    service = f"""\
# written by `provision schedule`
[Unit]
Description=provision: reconcile the SGLang fleet (re-apply the EAGLE-3 patch where it is gone)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
ExecStart={exec_start}
# 7: another reconcile holds the control-machine lock (that run does the work)
SuccessExitStatus=7
{timeout}
# stopped (systemctl stop, a timeout): SIGTERM ends the run as Ctrl-C does, hosts mid-step are
# journaled as "unknown" and no new batch starts; SIGKILL only if that takes longer than this
TimeoutStopSec=2min
Nice=5
"""
    timer = f"""\
# written by `provision schedule`
[Unit]
Description=provision: run provision-reconcile.service every {seconds // 60} min

[Timer]
OnBootSec=5min
OnUnitActiveSec={seconds}s
RandomizedDelaySec=30s
AccuracySec=30s
Unit=provision-reconcile.service

[Install]
WantedBy=timers.target
"""
    command = f"{' '.join(shlex.quote(a) for a in argv)} >>{shlex.quote(log)} 2>&1"
    if metrics_argv:
        command += f"; {' '.join(shlex.quote(a) for a in metrics_argv)} >/dev/null 2>>{shlex.quote(log)}"
    logdir = os.path.dirname(log)
    if logdir != "/var/log":  # a user's ~/.local/state/provision may not exist yet: `>>` would fail
        command = f"mkdir -p {shlex.quote(logdir)} && {command}"
    cron_line = f"{cron} " + command.replace("%", "\\%")  # cron turns a bare % into a newline
    return {"provision-reconcile.service": service, "provision-reconcile.timer": timer, "cron": cron_line}
