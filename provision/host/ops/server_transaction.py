"""The one start-or-restart transaction of a port's server.  STDLIB ONLY.

Every backend and every verb that puts a server on a port goes through `run`, under the port's
lock (ops/server.py holds it): a plain start is the same transaction with no old server. In order:

1. check   the new start can happen: the new launch's preflight (a restart: before the running
           server is touched), the secrets it keeps, the backend's own start problem;
2. prepare the new start (argv, environment, the 0600 files; a container's image and mounts),
           keeping the old server's files aside so they can be put back;
3. stop    the old server, by its own backend (`ServerBackend.stop_to_replace`: a persistent
           unit that stays the port's unit is stopped, not removed);
4. start   the new one, by the new launch's backend;
5. record  `replaced` (the old server's pids) and the new record, or keep the old: its files put
           back when it still runs, its record marked stopped when the new start failed after it
           was stopped ("old_stopped"), said in the error's sentence.

The control side journals the answer (tasks/launch.py): `restarted` with the pids replaced, or the
failure with its sentence. Drain, the router and `upgrade` extend step 3 and the steps around it.
"""

from __future__ import annotations

import os
import time

from provision.host.ops import server_record, server_secrets
from provision.host.ops.backends import select, tree
from provision.host.ops.backends.record import state_root, write_record
from provision.host.ops.server_launch import host_launch, old_files, restore_old_files
from provision.host.ops.server_preflight import refused, restart_preflight


def run(req: dict, bundle: bytes, port: int, st: dict, engine) -> dict:
    """Start the launch `req` on `port`, replacing the server `st` describes when one is there (its
    record running, restarting, or with survivors). The answer op_start returns."""
    t0 = time.monotonic()
    old = st["record"]
    replacing = bool(old) and (st["running"] or bool(st.get("survivors")) or bool(st.get("restarting")))
    # 1. check
    if replacing:
        refusal = restart_preflight(req, bundle, old)
        if refusal:
            return refusal
    secrets, why = server_secrets.keep_for_restart(req, old)
    if why:
        return refused("secret", why, old)
    # 2. prepare
    kept = old_files(req, port, old) if replacing else None
    req = dict(req, secrets=secrets)
    backend = select.for_launch(req, old)
    os.makedirs(state_root(req), mode=0o700, exist_ok=True)
    prep = _prepare(req, port, backend, secrets)
    if not prep["ok"]:
        if kept is not None:
            restore_old_files(kept)
        return prep
    launch = prep["launch"]
    # 3. stop, 4. start
    if replacing:
        out = _replace(req, old, backend, launch, float(req["profile"].get("grace", 30)), t0)
    else:
        out = backend.start(req, launch)
    # 5. record
    if not out.get("ok"):
        return _kept_or_lost(req, port, old, out, kept, replacing)
    rec = _record(req, port, backend, launch, out, prep.get("image"), secrets, engine)
    answer = {"ok": True, "started": True, "record": rec, "replaced": out.get("replaced") if replacing else None,
              "old_stop": out.get("old_stop") if replacing else None}
    if backend.name != "container":
        answer["pruned_logs"] = tree.prune_logs(launch["logdir"], engine.log_glob(port),
                                                int(req["profile"].get("keep_logs", 5)), launch["spec"]["log"])
    return answer


def _prepare(req: dict, port: int, backend, secrets: dict) -> dict:
    """{"ok", "launch", "image"}: what the new start needs, made before the old server is touched."""
    if backend.name == "container":
        from provision.host.ops import container

        prep = container.prepare_start(req, state_root(req))
        return prep if not prep["ok"] else {"ok": True, "launch": prep["launch"], "image": prep["image"]}
    launch = host_launch(req, port, secrets)
    return launch if not launch["ok"] else {"ok": True, "launch": launch, "image": None}


def _replace(req: dict, old: dict, backend, launch: dict, grace: float, t0: float) -> dict:
    """Stop the old server (its own backend), then start the new: the start's answer with
    "replaced" (the old pids) and "old_stop" (when the stop began, seconds since the op began, how
    long it took, its drain), or "old_stopped" when the new start failed after the stop."""
    began = time.monotonic()
    stopped = select.for_record(old).stop_to_replace(req, old, grace, backend, launch)
    if not stopped["ok"]:
        return stopped
    out = backend.start(req, launch)
    if out.get("ok"):
        out["replaced"] = stopped.get("pids") or []
        out["old_stop"] = {"began": round(began - t0, 2), "elapsed": stopped.get("elapsed"),
                           "drain": stopped.get("drain"), "cut": stopped.get("cut")}
    else:
        out["old_stopped"] = True
    return out


def _kept_or_lost(req: dict, port: int, old: dict | None, out: dict, kept, replacing: bool) -> dict:
    """A failed start: the old server keeps its files when it still runs; when it was stopped first,
    its record says so and the error's sentence too."""
    if kept is not None and not out.get("old_stopped"):
        restore_old_files(kept)  # the old server still runs: with its own files
    if replacing and out.get("old_stopped") and old:
        write_record(req, port, dict(old, stopped_at=time.time(), stopped_by="a restart whose new start failed"))
        why = (out.get("error") or {}).get("message") or "no reason given"
        out = dict(out, error=dict(out.get("error") or {}, message=(
            f"the old server (pid {old.get('pid')}) was stopped; the new one failed: {why}")))
    return out


def _record(req: dict, port: int, backend, launch: dict, out: dict, image, secrets: dict, engine) -> dict:
    """The new server's record, written."""
    base = server_record.common(req, backend.name, engine.name)
    names = server_secrets.names(secrets)
    if backend.name == "container":
        from provision.host.ops import container

        rec = container.finish_record(req, dict(out["record"], **base), image)  # type: ignore[arg-type]
        rec["secrets"] = server_record.container_secrets(rec, names)
    else:
        rec = server_record.host_record(req, port, launch, out, base, names, engine)
    write_record(req, port, rec)
    return rec

