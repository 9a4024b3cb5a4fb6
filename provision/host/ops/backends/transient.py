"""The transient-unit backend: where systemd is init, a server that is not --persistent runs in a
transient unit of its own (``systemd-run --unit=... --collect -p KillMode=control-group``, with the
limits a GPU server needs: systemctl.server_limits), under the same watcher (tree.py).  STDLIB ONLY.

The unit's cgroup is the server's identity: every process in it is the server's (its name is new
for each launch), whatever its pid number or parent; `stop` is ``systemctl stop`` of the unit, which
ends the whole cgroup (SIGTERM, SIGKILL after the grace period). Nothing brings it back: it is
not enabled, and --collect removes it once it ended.
"""

from __future__ import annotations

import subprocess
import sys
import time

from provision.host import inference
from provision.host.lib import atomic
from provision.host.lib.trust import trusted_binary  # the one policy for binaries run as root
from provision.host.ops.backends import identity, record, tree
from provision.host.ops.backends.base import ServerBackend
from provision.host.ops.backends.systemctl import session_limits, systemctl, unit_state


def unit_name(port: int, stamp: int, engine: str) -> str:
    return f"provision-{engine}-{port}-run{stamp}.service"


class TransientBackend(ServerBackend):
    name = "transient"

    def start_problem(self, req: dict) -> str | None:
        run, why = trusted_binary("systemd-run")
        return None if run and not why else f"systemd-run: {why or 'not found'} (a server runs in a transient unit here)"

    def start(self, req: dict, launch: dict) -> dict:
        spec, port, grace = launch["spec"], int(launch["port"]), float(launch["grace"])
        tree.clear_files(spec)
        spec_path = record.side_file(req, port, "run.json")
        watcher = record.side_file(req, port, "watcher.py")
        atomic.write_json(spec_path, spec)
        atomic.write_text(watcher, tree.WATCHER)
        unit = unit_name(port, time.time_ns() // 1000, launch["engine"])
        run, why = trusted_binary("systemd-run")
        if why or not run:
            return {"ok": False, "error": {"kind": "systemd", "message": f"systemd-run: {why or 'not found'}"}}
        limits = [a for k, v in session_limits().items() for a in ("-p", f"{k}={v}")]
        title = launch.get("title") or inference.get(launch["engine"]).title
        try:
            p = subprocess.run([run, f"--unit={unit}", "--collect", "--quiet", *limits,
                                "-p", "KillMode=control-group", "-p", f"TimeoutStopSec={int(grace)}",
                                "-p", f"Description={title} on port {port} (started by provision)",
                                sys.executable, watcher, spec_path], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return {"ok": False, "error": {"kind": "systemd", "message": f"systemd-run: {exc}"}}
        if p.returncode != 0:
            return {"ok": False, "error": {"kind": "systemd", "message": f"systemd-run --unit={unit}: "
                                                                         f"{p.stderr.strip()}"}}
        watcher = {"pid": 0}

        def gone() -> bool:  # the unit's MainPID is the watcher; a failed or inactive unit ended first
            st = unit_state(unit) or {}
            watcher["pid"] = watcher["pid"] or st.get("MainPID") or 0
            return st.get("ActiveState") in ("failed", "inactive")

        pid = tree.wait_pid(spec["pidfile"], gone)
        watcher_pid = watcher["pid"]
        if pid is None:
            return {"ok": False, "error": {"kind": "start", "message": tree.start_failure(spec)}}
        if not watcher_pid:
            watcher_pid = (unit_state(unit) or {}).get("MainPID") or 0
        return {"ok": True, "pid": pid, "watcher": watcher_pid,
                "watcher_starttime": (identity.ident(watcher_pid) or {}).get("starttime"), "unit": None,
                "cgroup_unit": unit, "mechanism": f"transient unit {unit}"}

    def stop(self, req: dict, rec: dict, grace: float) -> dict:
        unit = rec.get("cgroup_unit")
        t0 = time.monotonic()
        before = identity.owned(rec)
        # the server drains first (its main process alone is signalled): `systemctl stop` would
        # SIGTERM every process of the unit's cgroup at once, ranks mid-request included
        drained = tree.drain(rec, grace) if before else {"skipped": True}
        if not drained.get("skipped"):
            grace = max(1.0, grace - drained["waited"])
        if unit and before:
            p = systemctl("stop", unit, timeout=grace + 60)
            if p.returncode != 0 and (unit_state(unit) or {}).get("LoadState") not in ("not-found", None):
                return {"ok": False, "error": {"kind": "systemd", "message": f"systemctl stop {unit}: "
                                                                             f"{p.stderr.strip()}"}}
        out = tree.stop_tree(rec, grace)  # anything the unit's stop left (none, with control-group)
        if out.get("ok") and before:
            out.update(stopped=True, pids=sorted(set(before) | set(out.get("pids") or [])),
                       elapsed=round(time.monotonic() - t0, 2), transient_unit=unit)
            if not drained.get("skipped"):
                out["drain"] = {"drained": drained["drained"], "waited": drained["waited"]}
                if not drained["drained"]:
                    out["cut"] = drained["in_flight"]
        return out

    def state(self, req: dict, rec: dict) -> dict:
        return tree.state(rec)

    def read_log(self, rec: dict, offset: int, max_bytes: int) -> tuple[str, int]:
        return tree.read_chunk(rec["log"], offset, max_bytes)

    def logs(self, req: dict, rec: dict, lines: int) -> dict:
        return tree.tail(rec, lines)
