"""The follow's step, `probe`: where a start-up stands (alive?, new log bytes, port, /health).  STDLIB ONLY.

A follow runs it every second or two for the whole of a start-up (minutes of 550 GB loading, on every
host of a fleet), each time in a fresh interpreter, so it lives apart from the verbs that change a
server (ops/server.py, which pulls in the restart transaction, the preflight and the engine's
parser): it imports what it reads and nothing else.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import time

from provision.host.ops.backends import select
from provision.host.ops.backends.record import note_ready

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import ProbeAnswer, ServerRequest


def op_probe(req: ServerRequest, bundle: bytes) -> ProbeAnswer:
    """Where a start-up stands: alive?, new log bytes since offset, port, /health. A client
    following another log (`log`) than the record's (a new launch) is given the new one from its start."""
    port = int(req.get("port", 30000))
    st = select.server_state(req, port)
    rec = st["record"]
    if not rec:
        return {"ok": False, "error": {"kind": "no-server", "message": f"no server recorded on port {port}"}}
    q = dict(req)
    changed = bool(req.get("log")) and req.get("log") != rec.get("log")
    if changed:
        q["offset"] = int(rec.get("log_offset") or 0)
    out = select.for_record(rec).probe(q, rec, st)
    out["log_changed"] = changed
    if out.get("running") and out.get("health") == 200 and out.get("confirm") in (None, 200) \
            and not rec.get("stopped_at"):
        note_ready(req, port, rec, time.time())  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


OPS = {"probe": op_probe}
