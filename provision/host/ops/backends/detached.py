"""The detached backend: the server under its watcher, in a session of its own.  STDLIB ONLY."""

from __future__ import annotations

import json
import subprocess
import sys

from provision.host.ops.backends import identity, tree
from provision.host.ops.backends.base import ServerBackend


class DetachedBackend(ServerBackend):
    name = "detached"

    def start(self, req: dict, launch: dict) -> dict:
        spec = launch["spec"]
        tree.clear_files(spec)
        watcher = subprocess.Popen([sys.executable, "-c", tree.WATCHER], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                   cwd="/")
        assert watcher.stdin is not None
        watcher.stdin.write(json.dumps(spec).encode())
        watcher.stdin.close()
        watcher_ident = identity.ident(watcher.pid)
        pid = tree.wait_pid(spec["pidfile"], lambda: watcher.poll() is not None)
        if pid is None:
            return {"ok": False, "error": {"kind": "start", "message": tree.start_failure(spec)}}
        return {"ok": True, "pid": pid, "watcher": watcher.pid,
                "watcher_starttime": (watcher_ident or {}).get("starttime"), "unit": None,
                "mechanism": "detached"}

    def stop(self, req: dict, rec: dict, grace: float) -> dict:
        return tree.stop_tree(rec, grace, drain_first=True)

    def state(self, req: dict, rec: dict) -> dict:
        return tree.state(rec)

    def read_log(self, rec: dict, offset: int, max_bytes: int) -> tuple[str, int]:
        return tree.read_chunk(rec["log"], offset, max_bytes)

    def logs(self, req: dict, rec: dict, lines: int) -> dict:
        return tree.tail(rec, lines)
