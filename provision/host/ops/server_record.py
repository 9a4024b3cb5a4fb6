"""The record of a started server: what it says, field by field.  STDLIB ONLY.

One record per port (ops/backends/record.py reads and writes it atomically). What every backend's
record holds (``common``), what a host server's adds (``host_record``: its processes, log, argv,
install, model and the secrets' names and files, never their values) and the secret files of a
container's (``container_secrets``). `stop`, `status`, `logs`, `bench` and a restart's replay
read these fields (tasks/launch.py replays ``launch`` and ``overrides``).
"""

from __future__ import annotations

import os
import time

from provision.host.ops import server_secrets
from provision.host.ops.backends import identity


def common(req: dict, backend: str, engine: str) -> dict:
    """The fields of every backend's record."""
    return {"backend": backend, "engine": engine,
            "boot_id": identity.boot_id(), "overrides": dict(req.get("overrides") or {}),
            "launch": req.get("launch"),  # what a restart without --playbook replays (tasks/launch.py)
            "persistent": backend == "systemd", "fix": req.get("fix") or ("overlay" if req.get("overlay_stage")
                                                                          else None)}


def host_record(req: dict, port: int, launch: dict, out: dict, base: dict, secret_names: dict, eng) -> dict:
    """A host server's record: `base` (common()) plus its start (`out`, the backend's answer) as
    prepared (`launch`, ops/server_launch.host_launch)."""
    args = dict(req["profile"]["args"])
    spec, inst = launch["spec"], launch["inst"]
    pid = out["pid"]
    staged = req.get("overlay_stage")
    return dict(base, **{
        "pid": pid, "starttime": (identity.ident(pid) or {}).get("starttime"), "pgid": pid, "sid": out["watcher"],
        "unit": out.get("unit"), "cgroup_unit": out.get("cgroup_unit"), "watcher": out["watcher"],
        "watcher_starttime": out.get("watcher_starttime"),
        "port": port, "host": str(args.get("host", "127.0.0.1")), "log": spec["log"],
        "log_offset": int(out.get("log_offset") or 0), "started_at": time.time(),
        "profile_digest": req.get("profile_digest"), "profile": req.get("profile_name"),
        "exitfile": spec["exitfile"], "reapfile": spec["reapfile"], "config": launch["config"],
        "python": launch["python"], "install": inst["path"], "version": inst.get("version"),
        "model": args.get(eng.model_arg), "tp": args.get(eng.tp_arg, 1), "mechanism": out["mechanism"],
        "spec_args": {k: v for k, v in args.items() if k.startswith("speculative")},
        "overlay": {k: staged.get(k) for k in ("root", "package", "modules", "digest")} if staged else None,
        "argv": launch["argv"], "secrets": server_secrets.described(secret_names, launch["files"])})


def container_secrets(rec: dict, secret_names: dict) -> dict:
    """What a container's record says of its secrets: their names and the files under its
    secrets directory the server reads them from."""
    sdir = rec["container"].get("secrets_dir") or ""
    files = {k: os.path.join(sdir, "config.yaml") for k in secret_names["args"]}
    files.update({k: os.path.join(sdir, "hf_token") for k in secret_names["env"] if k in server_secrets.TOKEN_ENV})
    return server_secrets.described(secret_names, files)
