"""Which backend a server has: picked once, from its record (a server provision started) or from
the launch request (a new one).  STDLIB ONLY."""

from __future__ import annotations

from provision.host.ops.backends import record
from provision.host.ops.backends.base import ServerBackend
from provision.host.ops.backends.container import ContainerBackend
from provision.host.ops.backends.detached import DetachedBackend
from provision.host.ops.backends.systemd import SystemdBackend

BACKENDS: dict[str, ServerBackend] = {b.name: b for b in (DetachedBackend(), SystemdBackend(), ContainerBackend())}


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
    """A new launch's backend: the container when the profile names one, systemd for --persistent,
    and a restart of a persistent server stays persistent (its record says so)."""
    if (req.get("profile") or {}).get("container"):
        return BACKENDS["container"]
    if req.get("persistent") or (req.get("restart") and old and name_of_record(old) == "systemd"
                                 and not old.get("stopped_at")):
        return BACKENDS["systemd"]
    return BACKENDS["detached"]


def server_state(req: dict, port: int) -> dict:
    """The port's record and what its backend says of it: running, exit, survivors, ..."""
    rec = record.read_record(req, port)
    if not rec:
        return {"record": None, "running": False}
    return for_record(rec).state(req, rec)
