"""The systemd backend: a persistent server as a real service unit (``--persistent``), which comes
back after a reboot and after the server dies.  STDLIB ONLY.

The unit runs the watcher (tree.py) from a file, reading the server's spec from a 0600 file: nothing
secret is in the unit (``systemctl show`` prints Environment= and ExecStart= to anyone) nor in the
spec (secrets are 0600 files the spec names). A restart rewrites the spec and the unit after
``systemctl stop`` and starts it again: the unit stays enabled. Only `stop` disables and removes it.
"""

from __future__ import annotations

import os
import sys
import time

from provision.host import inference
from provision.host.lib import atomic
from provision.host.ops.backends import identity, record, tree
from provision.host.ops.backends.base import ServerBackend
from provision.host.ops.backends.systemctl import systemctl as _systemctl
from provision.host.ops.backends.systemctl import session_limits
from provision.host.ops.backends.systemctl import systemd_available, unit_state  # noqa: F401 - re-exported

UNIT_DIR = "/etc/systemd/system"
RESTART_SEC = 10  # systemd restarts a server that died after this many seconds
START_MARK = "[provision] started by systemd"  # ExecStartPre appends it: where each start-up begins
LOG_CAP = 64 << 20  # a persistent server's log is rotated at a start-up once bigger than this
LOG_KEEP = 3        # rotated logs kept (LOG.1 .. LOG.3)


def unit_name(port: int, engine: str) -> str:
    """The persistent unit of the server on `port`, named for its engine (`systemctl status
    provision-vllm-8000` says what runs there)."""
    return f"provision-{engine}-{port}.service"


def systemd_quote(arg: str) -> str:
    """One argument of ExecStart=: plain when it can be, else double-quoted, with systemd's
    specifier (%) and variable ($) characters escaped."""
    arg = str(arg)
    if arg and not any(c in arg for c in " \t\n\"'\\;$%"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("$", "$$") \
        .replace("%", "%%") + '"'


# ExecStartPre: rotate the log when it outgrew LOG_CAP (LOG -> LOG.1 -> ... LOG.KEEP), then mark the start-up.
MARK = ("import os, sys; p = sys.argv[1]; cap, keep = int(sys.argv[2]), int(sys.argv[3])\n"
        "if os.path.exists(p) and os.path.getsize(p) > cap:\n"
        "    [os.replace(p + '.%d' % i, p + '.%d' % (i + 1)) for i in range(keep - 1, 0, -1) "
        "if os.path.exists(p + '.%d' % i)]\n"
        "    os.replace(p, p + '.1')\n"
        "fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600); os.write(fd, b'" + START_MARK
        + "\\n'); os.close(fd)\n")


def render_server_unit(port: int, python: str, watcher: str, spec_path: str, log: str, grace: float,
                       title: str = "SGLang", limits: dict | None = None) -> str:
    """The service unit of a persistent server (pure). ``limits``: systemctl.server_limits."""
    q = systemd_quote
    lim = "".join(f"{k}={v}\n" for k, v in (limits or {}).items())
    return (f"# written by provision launch --persistent; `provision stop` removes it\n"
            f"[Unit]\nDescription={title} on port {port} (managed by provision)\n"
            f"Wants=network-online.target\nAfter=network-online.target\n"
            f"StartLimitIntervalSec=600\nStartLimitBurst=5\n\n"
            f"[Service]\nType=simple\n"
            f"ExecStartPre={q(python)} -c {q(MARK)} {q(log)} {LOG_CAP} {LOG_KEEP}\n"
            f"ExecStart={q(python)} {q(watcher)} {q(spec_path)}\n"
            f"KillMode=mixed\nTimeoutStopSec={int(grace)}\n{lim}"
            f"Restart=on-failure\nRestartSec={RESTART_SEC}\n\n"
            f"[Install]\nWantedBy=multi-user.target\n")


def last_start_offset(log: str) -> int:
    """Where the last start-up by systemd begins in the log (the offset of its mark line)."""
    mark = START_MARK.encode()
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            pos = fh.tell()
            while pos > 0:
                start = max(0, pos - (1 << 20))
                fh.seek(start)
                data = fh.read(pos - start + len(mark))
                i = data.rfind(mark)
                if i >= 0:
                    return start + i
                pos = start
    except OSError:
        pass
    return 0


def coming_back(unit: dict) -> bool:
    """Whether systemd is bringing a persistent server back, from its unit's state (pure):
    - the unit ends what is left of the dead server's tree after its main process failed
      (deactivating with a failed Result; this can last the whole TimeoutStopSec);
    - between that and the restart (auto-restart, RestartSec);
    - while it starts again (ExecStartPre, or the watcher not yet past its pid file).
    A unit being stopped on purpose (`systemctl stop`: Result success) is not coming back."""
    sub, active = unit.get("SubState"), unit.get("ActiveState")
    if sub in ("auto-restart", "start-pre", "start", "start-post"):
        return True
    if active == "active":
        return bool(unit.get("MainPID"))
    return active == "deactivating" and unit.get("Result") not in (None, "", "success")


class SystemdBackend(ServerBackend):
    name = "systemd"

    def start_problem(self, req: dict) -> str | None:
        if not systemd_available():
            return "--persistent needs systemd as init (/run/systemd/system is missing here); start without it"
        if os.geteuid() != 0:
            return ("--persistent writes a unit of the system manager, which needs root: connect as root or "
                    "with sudo (become), or start without it")
        return None

    def _install(self, req: dict, launch: dict) -> dict:
        """Write the spec, the watcher and the unit, then (re)start the unit, enabled."""
        why = self.start_problem(req)
        if why:
            return {"ok": False, "error": {"kind": "no-systemd", "message": why}}
        spec, port, grace = launch["spec"], int(launch["port"]), float(launch["grace"])
        sroot = record.state_root(req)
        unit = unit_name(port, launch["engine"])
        spec_path = record.side_file(req, port, "spec.json")
        watcher = record.side_file(req, port, "watcher.py")
        atomic.write_json(spec_path, spec)
        atomic.write_text(watcher, tree.WATCHER)
        atomic.write_text(os.path.join(UNIT_DIR, unit),
                          render_server_unit(port, sys.executable, watcher, spec_path, spec["log"], grace,
                                             launch.get("title") or inference.get(launch["engine"]).title,
                                             session_limits()), mode=0o644)
        os.makedirs(sroot, mode=0o700, exist_ok=True)
        tree.clear_files(spec, ("pidfile",))
        for cmd in (["daemon-reload"], ["reset-failed", unit], ["enable", unit], ["restart", unit]):
            p = _systemctl(*cmd, timeout=grace + 60)
            if p.returncode != 0 and cmd[0] != "reset-failed":
                return {"ok": False, "error": {"kind": "systemd",
                                               "message": f"systemctl {' '.join(cmd)}: {p.stderr.strip()}"}}
            if cmd[0] == "reset-failed":
                tree.clear_files(spec, ("exitfile", "reapfile"))
        watcher_pid = 0
        for _ in range(250):  # MainPID is the watcher once ExecStartPre is done
            st = unit_state(unit) or {}
            watcher_pid = st.get("MainPID") or 0
            if watcher_pid or st.get("ActiveState") in ("failed", "inactive"):
                break
            time.sleep(0.02)
        pid = tree.wait_pid(spec["pidfile"], lambda: not tree.alive(watcher_pid, None))
        if pid is None:
            return {"ok": False, "error": {"kind": "start", "message": tree.start_failure(spec)}}
        return {"ok": True, "pid": pid, "watcher": watcher_pid,
                "watcher_starttime": (identity.ident(watcher_pid) or {}).get("starttime"), "unit": unit,
                "mechanism": "systemd unit " + unit, "log_offset": last_start_offset(spec["log"])}

    def start(self, req: dict, launch: dict) -> dict:
        return self._install(req, launch)

    def stop_to_replace(self, req: dict, rec: dict, grace: float, new_backend: ServerBackend,
                        launch: dict) -> dict:
        """A restart's stop: when the new launch is this port's same unit, `systemctl stop` it and keep
        it installed and enabled (the start rewrites its spec and starts it again); otherwise (another
        engine's unit on this port, or a persistent server becoming another kind) remove it as `stop`
        does. Either way no process of the old server is left."""
        if not systemd_available() or rec.get("stopped_at"):
            return tree.stop_tree(rec, grace)
        same_unit = new_backend is self and rec.get("unit") == unit_name(int(launch["port"]),
                                                                         launch["engine"])
        if not same_unit:
            return self.stop(req, rec, grace)
        rec = self.refresh(req, rec)
        before, t0 = identity.owned(rec), time.monotonic()
        known = identity.snapshot(before)
        p = _systemctl("stop", rec["unit"], timeout=grace + 60)
        if p.returncode != 0 and identity.still_alive(known):
            return {"ok": False, "error": {"kind": "systemd", "message": f"systemctl stop {rec['unit']}: "
                                                                        f"{p.stderr.strip()}"}}
        if not identity.still_alive(known):
            return {"ok": True, "stopped": True, "pids": before, "escalated": False,
                    "elapsed": round(time.monotonic() - t0, 2), "unit": rec["unit"]}
        out = tree.stop_tree(rec, grace)
        if out.get("ok"):
            out.update(stopped=True, pids=sorted(set(before) | set(out.get("pids") or [])), unit=rec["unit"])
        return out

    def refresh(self, req: dict, rec: dict) -> dict:
        """systemd may have restarted a persistent server since we last looked: follow it to the
        new process (pid file), the new start-up in the log, and count the restart."""
        if not rec.get("unit") or rec.get("stopped_at"):
            return rec
        port = int(rec.get("port") or 30000)
        pidfile = record.side_file(req, port, "pid")
        try:
            with open(pidfile) as fh:
                pid = int(fh.read().strip())
            mtime = os.stat(pidfile).st_mtime
        except (OSError, ValueError):
            return rec
        same = pid == rec.get("pid") and (identity.ident(pid) or {}).get("starttime") == str(rec.get("starttime"))
        if not tree.alive(pid, None) or same:
            return rec  # the same process (a pid number can come back after a reboot: compare start times)
        watcher = (unit_state(rec["unit"]) or {}).get("MainPID") or rec.get("watcher")
        rec = dict(rec, pid=pid, starttime=(identity.ident(pid) or {}).get("starttime"), pgid=pid, sid=watcher,
                   watcher=watcher, watcher_starttime=(identity.ident(watcher) or {}).get("starttime"),
                   started_at=mtime, boot_id=identity.boot_id(), log_offset=last_start_offset(rec["log"]),
                   restarts=int(rec.get("restarts") or 0) + 1)
        record.write_record(req, port, rec)
        return rec

    def _remove_unit(self, req: dict, rec: dict, grace: float) -> dict | None:
        """Stop and disable the unit and remove what --persistent wrote, so nothing brings it back
        (no restart, no boot). An error dict, or None."""
        unit = rec["unit"]
        p = _systemctl("disable", "--now", unit, timeout=grace + 60)
        if p.returncode != 0 and (unit_state(unit) or {}).get("LoadState") not in ("not-found", None):
            return {"kind": "systemd", "message": f"systemctl disable --now {unit}: {p.stderr.strip()}"}
        port = int(rec.get("port") or 30000)
        for path in (os.path.join(UNIT_DIR, unit), record.side_file(req, port, "spec.json"),
                     record.side_file(req, port, "watcher.py")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        _systemctl("daemon-reload")
        _systemctl("reset-failed", unit)
        return None

    def stop(self, req: dict, rec: dict, grace: float) -> dict:
        if not systemd_available():
            return tree.stop_tree(rec, grace)
        rec = self.refresh(req, rec)
        before, t0 = identity.owned(rec), time.monotonic()
        known = identity.snapshot(before)
        err = self._remove_unit(req, rec, grace)
        if err:
            return {"ok": False, "error": err}
        if not identity.still_alive(known):
            # Stopped even with no process left (between a death and systemd's restart): the unit is gone.
            return {"ok": True, "stopped": True, "pids": before, "escalated": False,
                    "elapsed": round(time.monotonic() - t0, 2), "unit": rec["unit"], "unit_removed": True}
        out = tree.stop_tree(rec, grace)
        if out.get("ok"):
            out.update(stopped=True, pids=sorted(set(before) | set(out.get("pids") or [])), unit=rec["unit"],
                       unit_removed=True)
        return out

    def state(self, req: dict, rec: dict) -> dict:
        if rec.get("stopped_at"):
            return tree.state(rec)
        rec = self.refresh(req, rec)
        out = tree.state(rec)
        out["unit"] = unit_state(rec["unit"])
        out["restarting"] = not out["running"] and coming_back(out["unit"] or {})
        return out

    def read_log(self, rec: dict, offset: int, max_bytes: int) -> tuple[str, int]:
        return tree.read_chunk(rec["log"], offset, max_bytes)

    def logs(self, req: dict, rec: dict, lines: int) -> dict:
        return tree.tail(rec, lines)
