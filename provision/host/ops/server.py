"""Server control on the host: the verbs preflight, start, probe, stop, status, logs, smoke.  STDLIB ONLY.

How a server runs is its backend's (ops/backends/: detached under a watcher, a systemd unit, a
container), picked once from the record or the request. The verbs are here; what they use is in
modules named for it: ops/server_preflight.py gathers the preflight, ops/server_launch.py prepares a
start (argv, environment, the secrets' 0600 files: never the command line), ops/server_record.py
says what the record holds. This module holds the port's lock (ops/backends/lock.py) from the
preflight of a restart through the start to the record (ops/backends/record.py writes it).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import json
import os
import time
import urllib.error
import urllib.request

from provision.host import inference
from provision.host.ops import server_secrets, server_transaction
from provision.host.ops.backends import identity, lock, select
from provision.host.ops.backends.base import health, port_open
from provision.host.ops.backends.record import (forget_good, note_ready, read_good, read_record, state_root,  # noqa: F401
                                                write_record)  # (read_record: bench reads)
from provision.host.ops.backends.systemd import RESTART_SEC, render_server_unit, systemd_quote  # noqa: F401 - units
from provision.host.ops.backends.tree import WATCHER  # noqa: F401 - the watcher, for its tests
from provision.host.ops.server_launch import (host_launch, old_files, put_back_files,  # noqa: F401
                                              restore_old_files, snapshot_files)
from provision.host.ops.server_preflight import describe_pids, op_preflight  # noqa: F401
from provision.host.ops.server_probe import op_probe

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import (LogsAnswer, ServerRequest, ServerStatusAnswer, SmokeAnswer,
                                         StartAnswer, StopAnswer)

_server_state = select.server_state


# -- start / stop ------------------------------------------------------------
def op_start(req: ServerRequest, bundle: bytes) -> StartAnswer:
    """Start (or, with `restart`, replace) the port's server, holding the port's lock from the
    restart's preflight through the start to the record."""
    port = int(req["profile"]["args"].get("port", 30000))
    try:
        with lock.port_lock(state_root(req), port, "start", float(req.get("lock_wait", lock.WAIT))):
            return _start_locked(dict(req), bundle, port)  # type: ignore[return-value]
    except lock.Busy as exc:
        return {"ok": False, "refused": True, "error": {"kind": "locked", "message": str(exc)}}


def _start_locked(req: dict, bundle: bytes, port: int) -> dict:
    st = select.server_state(req, port)
    old = st["record"]
    same = bool(old) and old.get("profile_digest") == req.get("profile_digest")
    if not req.get("restart"):
        if st["running"]:
            return {"ok": True, "already": True, "record": old, "same_profile": same}
        if st.get("restarting"):  # a persistent unit in systemd's restart window: it is coming back
            try:  # followed from here on: the start-up systemd is about to make
                size = os.path.getsize(old.get("log") or "")
            except OSError:
                size = int(old.get("log_offset") or 0)
            return {"ok": True, "already": True, "adopted": old.get("unit"), "record": dict(old, log_offset=size),
                    "same_profile": same}
        if st.get("survivors"):
            # Never write over the record of a tree that still has live processes: `stop` could no
            # longer find them, and they hold the GPU memory the new server needs.
            left = st["survivors"]
            return {"ok": False, "error": {"kind": "survivors", "message": (
                f"the server on port {port} (pid {old.get('pid')}) is dead but {len(left)} processes "
                f"of its tree are still alive ({describe_pids(left)}); nothing was started: `provision stop` "
                "ends them, or launch --restart stops them first")}}
    return server_transaction.run(req, bundle, port, st, inference.for_request(req))


def op_stop(req: ServerRequest, bundle: bytes) -> StopAnswer:
    """Stop the port's server: only processes provably its own (ops/backends/identity.py)."""
    port = int(req.get("port", 30000))
    try:
        with lock.port_lock(state_root(req), port, "stop", float(req.get("lock_wait", lock.WAIT))):
            return _stop_locked(req, port)  # type: ignore[return-value]
    except lock.Busy as exc:
        return {"ok": False, "error": {"kind": "locked", "message": str(exc)}}


def _stop_locked(req: ServerRequest, port: int) -> dict:
    rec = read_record(req, port)
    if not rec:
        return {"ok": True, "stopped": False, "message": f"no server recorded on port {port}"}
    if rec.get("stopped_at"):
        server_secrets.remove_host_files(req, port)  # left by a provision before they went with their server
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec["stopped_at"])))
        return {"ok": True, "stopped": False, "message": f"the server on port {port} was stopped at {when}; "
                                                         "nothing of it is left to stop"}
    backend = select.for_record(rec)
    if backend.name == "detached" and not identity.same_boot(rec):
        res: dict = {"ok": True, "stopped": False, "message": f"the server on port {port} was started before the host "
                                                              "last booted: none of its processes is left"}
    else:
        res = backend.stop(req, rec, float(req.get("grace", 30)))
    if res["ok"]:
        rec = read_record(req, port) or rec  # a persistent server's record may have followed a restart
        rec["stopped_at"] = time.time()
        write_record(req, port, rec)
        server_secrets.remove_host_files(req, port)
        forget_good(req, port)  # type: ignore[arg-type]
    return res


def op_server_status(req: ServerRequest, bundle: bytes) -> ServerStatusAnswer:
    port = int(req.get("port", 30000))
    st = select.server_state(req, port)
    rec = st["record"]
    out = {"ok": True, "running": st["running"], "record": rec, "exit": st.get("exit"),
           "survivors": st.get("survivors") or [], "reaped": st.get("reaped"),
           "stopped": bool((rec or {}).get("stopped_at"))}
    if out["survivors"]:
        out["survivors_described"] = describe_pids(out["survivors"])
    if req.get("elsewhere") and (not rec or rec.get("stopped_at")):  # the servers provision started on other ports
        from provision.host.ops.backends.record import other_ports

        out["elsewhere"] = [{"port": p, "pid": r.get("pid"), "profile": r.get("profile"),
                             "engine": (r.get("launch") or {}).get("engine") or "sglang"}
                            for p, r in sorted(other_ports(dict(req), port).items()) if not r.get("stopped_at")]
    if st.get("container") is not None:
        out["container"] = st["container"]
    if st.get("unit") is not None:
        u = st["unit"]
        out["persistent"] = {"unit": rec["unit"], "active": u.get("ActiveState"), "sub": u.get("SubState"),
                             "enabled": u.get("UnitFileState"), "restarts": u.get("NRestarts", 0),
                             "result": u.get("Result")}
    if rec and st["running"]:
        host = rec.get("host", "127.0.0.1")
        out["port_open"] = port_open(host, port)
        out["health"] = health(host, port, float(req.get("health_timeout", 30)), None,
                               inference.get(inference.of_record(rec)).health_path) if out["port_open"] else None
        out["uptime"] = round(time.time() - rec["started_at"], 1)
        if out["health"] == 200:
            note_ready(req, port, rec, time.time())  # type: ignore[arg-type]
    good = read_good(req, port)  # type: ignore[arg-type]
    if good and rec:
        if (good.get("pid"), good.get("started_at")) != (rec.get("pid"), rec.get("started_at")):
            out["good"] = good  # the record's server never answered ready
        else:
            out["was_ready"] = True  # ... it did: a health other than 200 now is a server gone unhealthy
    return out  # type: ignore[return-value]


def op_logs(req: ServerRequest, bundle: bytes) -> LogsAnswer:
    port = int(req.get("port", 30000))
    rec = read_record(req, port)
    if not rec:
        return {"ok": False, "error": {"kind": "no-server", "message": f"no server recorded on port {port}"}}
    out = select.for_record(rec).logs(req, rec, int(req.get("lines", 100)))
    if out.get("ok"):  # which engine wrote it, and which release (the record's)
        out["engine"], out["version"] = inference.get(inference.of_record(rec)).title, rec.get("version")
    return out  # type: ignore[return-value]


OPS = {"preflight": op_preflight, "start": op_start, "stop": op_stop, "probe": op_probe,
       "server_status": op_server_status, "logs": op_logs}


def op_smoke(req: ServerRequest, bundle: bytes) -> SmokeAnswer:
    """One short native /generate request, timed; speculative stats from meta_info or /metrics."""
    port = int(req.get("port", 30000))
    rec = read_record(req, port) or {}
    host = rec.get("host", "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    body = json.dumps({"text": req.get("prompt", "The capital of France is"),
                       "sampling_params": {"max_new_tokens": int(req.get("max_new_tokens", 64)),
                                           "temperature": 0}}).encode()
    headers = {"Content-Type": "application/json"}
    key = (req.get("secrets") or {}).get("args", {}).get("api-key")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.monotonic()
    try:
        r = urllib.request.Request(f"http://{host}:{port}/generate", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(r, timeout=float(req.get("timeout", 120))) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": {"kind": "smoke", "message": f"/generate answered HTTP {exc.code}"}}
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": {"kind": "smoke", "message": f"/generate failed: {exc}"}}
    elapsed = time.monotonic() - t0
    meta = data.get("meta_info") or {}
    toks = meta.get("completion_tokens") or 0
    out = {"ok": True, "elapsed": round(elapsed, 3), "completion_tokens": toks,
           "tokens_per_s": round(toks / elapsed, 1) if elapsed > 0 and toks else None,
           "spec_accept_length": meta.get("spec_accept_length"), "spec_accept_rate": meta.get("spec_accept_rate")}
    if out["spec_accept_length"] is None:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
                for line in resp.read().decode().splitlines():
                    for name in ("spec_accept_length", "spec_accept_rate"):
                        if line.startswith(f"sglang:{name}"):
                            out[name] = float(line.rsplit(" ", 1)[1])
        except (OSError, ValueError):
            pass
    return out


OPS["smoke"] = op_smoke
