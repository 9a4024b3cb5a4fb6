"""The one interface of a server backend, and what every backend shares (port, /health).  STDLIB ONLY.

A backend is picked once, from the record (a running server) or the request (a new one), by
select.py; every verb goes through it: start, stop, state (status), probe (a start-up's progress),
logs, and the stop of a restart (`stop_to_replace`; the restart itself is one transaction for
every backend: ops/server_transaction.py). Implementations: detached.py, transient.py, systemd.py,
container.py.
"""

from __future__ import annotations

import time

from provision.host import inference
from provision.host.facts import installs


def port_open(host: str, port: int) -> bool:
    return installs.port_open(host, port, timeout=0.3)


def health(host: str, port: int, timeout: float, url: str | None = None, path: str = "/health") -> int | None:
    """The HTTP status of the server's readiness endpoint (`path`, its engine's), or of `url`; None
    when nothing answers."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    url = url or f"http://{host}:{port}{path}"
    import urllib.error  # here: a follow's probes before the port opens (most of a load) never need it
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def serves(host: str, port: int, timeout: float, engine, rec: dict) -> int | None:
    """200 when the engine's `serves_path` names the model the record's launch serves, 503 when it
    answers without it, its own status otherwise (401: the key provision gave it was refused).
    The key is the launch's own, read from its 0600 --config file."""
    import urllib.error
    import urllib.request

    from provision.host.ops.server_secrets import parse_config

    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    headers = {}
    try:
        with open(rec.get("config") or "", encoding="utf-8") as fh:
            key = parse_config(fh.read()).get("api-key")
        if key:
            headers["Authorization"] = f"Bearer {key}"
    except OSError:
        pass
    args = ((rec.get("launch") or {}).get("args") or {})
    try:
        req = urllib.request.Request(f"http://{host}:{port}{engine.serves_path}", headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return 200 if engine.serves(resp.read(1 << 20), args) else 503
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


class ServerBackend:
    """How one kind of server is started, stopped, looked at. `launch` (start, restart) is what
    ops/server.py prepared: argv, env, the secret files, the log, the watcher's files."""

    name = "base"

    def start(self, req: dict, launch: dict) -> dict:
        raise NotImplementedError

    def start_problem(self, req: dict) -> str | None:
        """What would stop this backend from starting a server here, in a sentence (None: nothing):
        asked by preflight, so a restart finds out before the running server is stopped."""
        return None

    def stop(self, req: dict, rec: dict, grace: float) -> dict:
        raise NotImplementedError

    def state(self, req: dict, rec: dict) -> dict:
        """{"record", "running", "exit", "survivors", ...}."""
        raise NotImplementedError

    def read_log(self, rec: dict, offset: int, max_bytes: int) -> tuple[str, int]:
        raise NotImplementedError

    def logs(self, req: dict, rec: dict, lines: int) -> dict:
        raise NotImplementedError

    def stop_to_replace(self, req: dict, rec: dict, grace: float, new_backend: "ServerBackend",
                        launch: dict) -> dict:
        """Stop the running server `rec` so that `launch` (started next by `new_backend`) takes its
        place: the restart transaction's stop (ops/server_transaction.py). Default: `stop`; a
        backend whose server outlives a stop in some form (a persistent unit) keeps what the new
        start reuses."""
        return self.stop(req, rec, grace)

    def probe(self, req: dict, rec: dict, st: dict) -> dict:
        """Where a start-up stands: alive?, new log bytes since offset, port, /health."""
        port = int(req.get("port", 30000))
        chunk, offset = self.read_log(rec, int(req.get("offset", 0)), int(req.get("max_bytes", 1 << 20)))
        host = rec.get("host", "127.0.0.1")
        up = port_open(host, port)
        timeout = float(req.get("health_timeout", 30))
        engine = inference.get(inference.of_record(rec))  # the server's engine, from its record
        ready = engine.health_path
        code = health(host, port, timeout, req.get("health_url"), ready) if up and st["running"] else None
        if code == 200 and engine.serves_path and not req.get("health_url"):
            # readiness, second half: the models route names the profile's model (with the run's key)
            code = serves(host, port, timeout, engine, rec)
        confirm = None
        if code == 200 and req.get("confirm"):
            # A second look on the host, not a second round trip: one 200 can be a flap.
            time.sleep(float(req["confirm"]))
            confirm = health(host, port, timeout, req.get("health_url"), ready)
        # A persistent server that systemd is about to restart counts as starting, not as gone.
        running = st["running"] or bool(st.get("restarting"))
        out = {"ok": True, "running": running, "exit": st.get("exit"), "chunk": chunk, "offset": offset,
               "port_open": up, "health": code, "confirm": confirm, "record": rec, "now": time.time(),
               "survivors": st.get("survivors") or [], "stopped": bool(rec.get("stopped_at"))}
        if st.get("container") is not None:
            out["container"] = st["container"]
        return out
