"""The host's entry point: decode one request, dispatch it to its op, encode the answer.  STDLIB ONLY.

Nothing else lives here. Each op is in provision/host/ops/; only the module an op needs is
imported (the server ops pull in urllib/http, which a patch has no use for, and the
reconcile or patch op on an unchanged host imports neither the engine's parser nor discovery).
Nothing imports this module: the bootstrap runs it.
"""

from __future__ import annotations

from provision.host.bootstrap import serve
from provision.host.lib import failpoints

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)
if TYPE_CHECKING:
    from typing import Any, Callable

# op -> the ops module (provision.host.ops.<name>) whose OPS table has it
OP_MODULES = {
    "discover": "patch", "status": "patch", "facts": "hostfacts", "patch": "patch_fast", "unpatch": "patch",
    "preflight": "server", "start": "server", "stop": "server", "probe": "server_probe",
    "server_status": "server", "logs": "server", "smoke": "server",
    "audit": "audit",
    "reconcile": "reconcile",
    "backups": "restore", "restore": "restore",
    "overlay": "overlay",
    "bench": "bench", "warm": "bench",
    "upgrade": "upgrade",
}


def handler(op: Any) -> Callable[[Any, bytes], Any] | None:
    name = OP_MODULES.get(op) if isinstance(op, str) else None
    if name is None:
        return None
    import importlib

    try:
        mod = importlib.import_module(f"provision.host.ops.{name}")
    except ImportError:  # left out of this call's bundle
        return None
    fn: Callable[[Any, bytes], Any] | None = getattr(mod, "OPS", {}).get(op)
    return fn


# ops that act on an engine's install: a request of one that names no engine (a spec of another
# package's files, flashinfer's, or none) is given the engine whose install the host has
INSTALL_OPS = {"discover", "status", "patch", "unpatch", "audit", "reconcile", "overlay"}


def dispatch(req: dict, bundle: bytes) -> dict:
    failpoints.configure(req.get("failpoints"))
    fn = handler(req.get("op"))
    if fn is None:
        return {"ok": False, "error": {"kind": "bad-request", "message": f"unknown op {req.get('op')!r}"}}
    from provision.host.facts import probed

    with probed.once():  # an interpreter asked once per call, however many discoveries it makes
        resolved = resolve_engine(req)
        if "error" in resolved:
            return {"ok": False, "error": resolved["error"]}
        out: dict = fn(resolved, bundle)
    return out


def resolve_engine(req: dict) -> dict:
    """The request with its engine resolved, once, here: the one it names (itself, its profile, its
    specs' package: inference.of_request), else for an op on an install the engine whose install
    the host has (facts/installs.py). Server ops on a running server read it from the record."""
    if not isinstance(req, dict) or req.get("op") not in INSTALL_OPS:
        return req
    from provision.host import inference

    name = inference.of_request(req)
    if name is None and req.get("engine") == inference.FROM_HOST:  # the host's one engine; several: say which
        from provision.host.facts import installs

        found = installs.installed_engines(req)
        err = installs.ambiguous_engine(found)
        if err is not None:
            return {"error": err}
        name = found[0][0] if found else inference.KNOWN[0]
    elif name is None:
        from provision.host.facts import installs

        name = installs.installed_engine(req)
    return dict(req, engine=name)


def main(request: bytes, bundle: bytes) -> int:
    return serve(dispatch, request, bundle)
