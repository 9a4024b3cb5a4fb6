"""The remote `audit` op: audit the chosen install's model classes and the patch state of known specs.  STDLIB ONLY.

Which audit runs is the engine's ``audit_reader`` (a ``module:function`` reference to one of the
functions below, or a third engine's own): SGLang's EntryClass wrappers and their delegation
methods (``entry_classes``, engine/audit.py), vLLM's registry against its SupportsEagle3 protocol
(``protocol``, engine/audit_vllm.py).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import os

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import AuditAnswer, AuditRequest, ErrorInfo


def entry_classes(eng, package_dir: str) -> dict:
    from provision.host.engine import audit
    return audit.audit_models(os.path.join(package_dir, eng.models_subdir), package_dir)


def protocol(eng, package_dir: str) -> dict:
    from provision.host.engine import audit_vllm
    return audit_vllm.audit_registry(package_dir, eng.eagle3_protocol)


def op_audit(req: AuditRequest, bundle: bytes) -> AuditAnswer:
    from provision.host import inference
    from provision.host.engine import core as engine
    from provision.host.engine.spec import DEFAULT_PACKAGE
    from provision.host.facts import installs
    from provision.host.lib.modules import make_resolver

    eng = inference.for_request(req)
    facts = installs.for_request(req)
    inst = installs.chosen_install(facts)
    if inst is None:
        missing: ErrorInfo = {"kind": "not-found", "message": f"no {eng.title} install"}
        return {"ok": False, "facts": facts, "error": facts.get("error") or missing}
    result = inference.load(eng.audit_reader)(eng, inst["path"])
    resolve = make_resolver(inst["path"], eng.package)
    states: dict[str, dict] = {}
    for spec in req.get("specs") or []:
        if spec.get("kind", "delegate") not in ("delegate", "interface") or (spec.get("package") or DEFAULT_PACKAGE) != eng.package:
            continue  # the audit is of this engine's model classes; other kinds are not about a class
        path = os.path.join(inst["path"], spec["file"])
        try:
            with open(path, "rb") as fh:
                info = engine.inspect(fh.read(), spec, resolve_module=resolve)
        except OSError:
            states[spec["class"]] = {"spec": spec["name"], "state": "file-missing"}
            continue
        # the per-method view only: the control side summarises it (tasks/patch.py patch_state)
        entry = {"spec": spec["name"], "methods": info.get("methods") or {}}
        if info.get("error"):
            entry["state"] = "error: " + (info.get("error") or {}).get("message", "")
        states[spec["class"]] = entry
    return {"ok": True, "facts": facts, "audit": result, "spec_states": states, "engine": eng.name}


OPS = {"audit": op_audit}
