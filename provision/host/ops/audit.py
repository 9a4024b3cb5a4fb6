"""The remote `audit` op: audit the chosen install's models/ and the patch state of known specs.  STDLIB ONLY."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import os

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import AuditAnswer, AuditRequest, ErrorInfo


def op_audit(req: AuditRequest, bundle: bytes) -> AuditAnswer:
    from provision.host.engine import audit, core as engine
    from provision.host.facts import installs
    from provision.host.lib.modules import make_resolver

    facts = installs.for_request(req)
    inst = installs.chosen_install(facts)
    if inst is None:
        missing: ErrorInfo = {"kind": "not-found", "message": "no SGLang install"}
        return {"ok": False, "facts": facts, "error": facts.get("error") or missing}
    models = os.path.join(inst["path"], "srt", "models")
    result = audit.audit_models(models, inst["path"])
    states: dict[str, dict] = {}
    for spec in req.get("specs") or []:
        if spec.get("kind", "delegate") != "delegate":
            continue  # the audit is of model classes' delegation; other kinds are not about a class
        path = os.path.join(inst["path"], spec["file"])
        try:
            with open(path, "rb") as fh:
                info = engine.inspect(fh.read(), spec, resolve_module=make_resolver(inst["path"]))
        except OSError:
            states[spec["class"]] = {"spec": spec["name"], "state": "file-missing"}
            continue
        # the per-method view only: the control side summarises it (tasks/patch.py patch_state)
        entry = {"spec": spec["name"], "methods": info.get("methods") or {}}
        if info.get("error"):
            entry["state"] = "error: " + (info.get("error") or {}).get("message", "")
        states[spec["class"]] = entry
    return {"ok": True, "facts": facts, "audit": result, "spec_states": states}


OPS = {"audit": op_audit}
