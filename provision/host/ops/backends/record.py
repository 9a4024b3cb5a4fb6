"""A server's record on the host (``server-PORT.json`` in the state dir): the truth a restart
replays and a stop trusts.  STDLIB ONLY.

Besides what status shows (pid, log, model...) it holds what replaying the launch needs: the argv
(secret values are never in it: they are in 0600 files), the whole profile as started (``launch``:
a playbook's ``launch:`` mapping, host variables and ``--arg`` in it), the launch's ``--arg`` overrides, the
backend, the fix, and which secrets were set and the file the server reads each from. Every
whole-file write goes through lib/atomic.py.
"""

from __future__ import annotations

import json
import os

from provision.host.lib import atomic
from provision.host.lib.paths import server_state_root


def state_root(req: dict) -> str:
    return server_state_root(req.get("state_dir"))


def log_root(req: dict) -> str:
    if req.get("log_dir"):
        return req["log_dir"]
    if os.geteuid() == 0:
        return "/var/log/provision"
    return os.path.join(state_root(req), "logs")


def state_file(req: dict, port: int) -> str:
    return os.path.join(state_root(req), f"server-{port}.json")


def side_file(req: dict, port: int, suffix: str) -> str:
    """One of the server's other files in the state dir: server-PORT.<suffix>."""
    return os.path.join(state_root(req), f"server-{port}.{suffix}")


def read_record(req: dict, port: int) -> dict | None:
    try:
        with open(state_file(req, port)) as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def write_record(req: dict, port: int, rec: dict) -> None:
    os.makedirs(state_root(req), mode=0o700, exist_ok=True)
    atomic.write_json(state_file(req, port), rec)


def mark_stopped(req: dict, port: int, rec: dict, when: float) -> dict:
    """The record of a server provision stopped: `stopped_at` set, nothing of it is ours to kill any more."""
    rec = dict(rec, stopped_at=when)
    write_record(req, port, rec)
    return rec


# What a restart replays, kept from the last server on a port that answered ready: a later launch
# that never got there (a forced start past a refused flag, dead at once) does not take its place.
GOOD_FIELDS = ("pid", "started_at", "launch", "overrides", "profile", "profile_digest", "fix", "backend", "unit",
               "engine")


def read_good(req: dict, port: int) -> dict | None:
    """The port's last good launch (``server-PORT.good.json``), or None."""
    try:
        with open(side_file(req, port, "good.json")) as fh:
            good = json.load(fh)
    except (OSError, ValueError):
        return None
    return good if isinstance(good, dict) else None


def note_ready(req: dict, port: int, rec: dict, when: float) -> None:
    """The record's server answered ready (a probe or a status saw /health 200): its launch is the
    port's last good one. Written once per server (its pid and start time), beside the record,
    never into it (a stop writes the record meanwhile)."""
    good = read_good(req, port) or {}
    if good.get("pid") == rec.get("pid") and good.get("started_at") == rec.get("started_at"):
        return
    try:
        os.makedirs(state_root(req), mode=0o700, exist_ok=True)
        atomic.write_json(side_file(req, port, "good.json"),
                          dict({k: rec.get(k) for k in GOOD_FIELDS}, ready_at=when))
    except OSError:  # a read-only state dir: the record alone is replayed, as before
        pass


def forget_good(req: dict, port: int) -> None:
    """A server provision stopped: the next launch on the port is a new one, and no older launch is
    replayed in its place."""
    try:
        os.unlink(side_file(req, port, "good.json"))
    except OSError:
        pass


def other_ports(req: dict, port: int) -> dict[int, dict]:
    """The records of provision's servers on the host's other ports ({port: record}): a process
    of one of those trees is that server's, never a leftover of this one."""
    out: dict[int, dict] = {}
    try:
        names = os.listdir(state_root(req))
    except OSError:
        return out
    for name in names:
        if not (name.startswith("server-") and name.endswith(".json")):
            continue
        try:
            other = int(name[len("server-"):-len(".json")])
        except ValueError:
            continue
        if other == port:
            continue
        rec = read_record(req, other)
        if rec:
            out[other] = rec
    return out
