"""Which backend a server has: picked once, from its record (a server provision started) or from
the launch request (a new one).  STDLIB ONLY."""

from __future__ import annotations

from provision.host.ops.backends import record
from provision.host.ops.backends.base import ServerBackend
from provision.host.ops.backends.container import ContainerBackend
from provision.host.ops.backends.detached import DetachedBackend
from provision.host.ops.backends.systemctl import can_run_units
from provision.host.ops.backends.systemd import SystemdBackend
from provision.host.ops.backends.transient import TransientBackend

BACKENDS: dict[str, ServerBackend] = {b.name: b for b in (DetachedBackend(), SystemdBackend(), ContainerBackend(),
                                                          TransientBackend())}


def name_of_record(rec: dict) -> str:
    """The backend a record was started with (older records: from what they hold)."""
    if rec.get("backend") in BACKENDS:
        return str(rec["backend"])
    if rec.get("container"):
        return "container"
    if rec.get("unit"):
        return "systemd"
    return "detached"


def for_record(rec: dict) -> ServerBackend:
    return BACKENDS[name_of_record(rec)]


def for_launch(req: dict, old: dict | None) -> ServerBackend:
    """A new launch's backend: the container when the profile names one, systemd for --persistent
    (a restart of a persistent server stays persistent: its record says so), else a transient unit
    where systemd is init, else detached."""
    if (req.get("profile") or {}).get("container"):
        return BACKENDS["container"]
    if req.get("persistent") or (req.get("restart") and old and name_of_record(old) == "systemd"
                                 and not old.get("stopped_at")):
        return BACKENDS["systemd"]
    # where systemd is init, a server runs in a transient unit of its own: its cgroup is its identity;
    # a non-root agent cannot start one (systemd-run for the system manager needs root): detached
    return BACKENDS["transient"] if can_run_units() else BACKENDS["detached"]


def server_state(req: dict, port: int) -> dict:
    """The port's record and what its backend says of it: running, exit, survivors, ..."""
    rec = record.read_record(req, port)
    if not rec:
        return {"record": None, "running": False}
    return for_record(rec).state(req, rec)
