"""`patch`, `unpatch` and `status` for one host: build the request, read the answer.

The deciding and writing happen on the host (provision/remote/); this module only
turns the host's JSON answer into a HostResult.
"""

from __future__ import annotations

from provision.inventory import Host
from provision.playbook import PatchSpec, load_patch_spec
from provision.results import HostResult


def request_for(op: str, host: Host, spec: PatchSpec | None, *, check: bool = False, diff: bool = False,
                force: bool = False, sglang_path: str | None = None, python: str | None = None,
                verify_import: bool = False, kill_at: str | None = None) -> dict:
    req = {"op": op, "check": check, "diff": diff, "force": force,
           "sglang_path": sglang_path or host.get("sglang_path"),
           "python": python or host.get("python"), "verify_import": verify_import}
    if spec is not None:
        req["spec"] = spec.to_engine()
    if kill_at:
        req["kill_at"] = kill_at
    return req


def _chosen(facts: dict | None) -> dict:
    if not facts:
        return {}
    for rec in facts.get("installs", []):
        if rec["path"] == facts.get("chosen"):
            return rec
    return {}


def result_from_answer(host: str, answer: dict, *, check: bool = False) -> HostResult:
    facts = answer.get("facts") or {}
    inst = _chosen(facts)
    res = answer.get("result") or {}
    err = answer.get("error") or res.get("error")
    others = [r["path"] for r in facts.get("installs", []) if r["path"] != facts.get("chosen")]
    notes = list(res.get("notes") or [])
    if others:
        notes.append("other SGLang installs left alone: " + ", ".join(others))
    if res.get("verify_import"):
        vi = res["verify_import"]
        notes.append(f"verify-import: {vi['status']} ({vi['why']})")
    verdict = res.get("verdict") or ("failed" if err else "ok")
    detail = ""
    if err:
        verdict = "unknown" if err.get("kind") == "unknown" else "failed"
        detail = err.get("message", str(err))
    elif res.get("verdict") == "repaired":
        detail = "removed a broken hand patch: " + "; ".join(res.get("repaired") or [])
    elif res.get("verify_import", {}).get("status") == "failed":
        verdict, detail = "failed", "verify-import: " + res["verify_import"]["why"]
    data = {k: res[k] for k in ("sha_before", "sha_after", "backup", "real_file", "kept", "native",
                                "restart_needed", "module_level_leftovers") if k in res}
    data["install_kind"] = inst.get("kind")
    data["interpreters"] = inst.get("interpreters")
    data["chosen_reason"] = facts.get("chosen_reason")
    if inst.get("git"):
        data["git_checkout"] = inst["git"]
    return HostResult(host=host, verdict=verdict, detail=detail, version=inst.get("version"),
                      install=inst.get("path"), file=res.get("file"), added=list(res.get("added") or []),
                      notes=notes, diff=res.get("diff"), error_kind=(err or {}).get("kind"), data=data)


def status_from_answer(host: str, answer: dict) -> HostResult:
    facts = answer.get("facts") or {}
    inst = _chosen(facts)
    err = answer.get("error")
    if err:
        return HostResult(host, "failed", err.get("message", ""), error_kind=err.get("kind"),
                          data={"installs": facts.get("installs", [])})
    p = answer.get("patch") or {}
    methods = p.get("methods") or {}
    if p.get("error"):
        state = f"error: {p['error'].get('message')}"
    elif methods and all(v == "native" for v in methods.values()):
        state = "native"
    elif methods and all(v in ("native", "ours") for v in methods.values()):
        state = "patched" + ("" if (p.get("block") or {}).get("matches_spec", True) else " (stale block)")
    elif p.get("hand_patch"):
        state = "broken hand patch"
    else:
        missing = [k for k, v in methods.items() if v == "missing"]
        state = "missing: " + ", ".join(missing) if missing else "unknown"
    servers = [s for s in facts.get("servers", []) if s.get("install") == inst.get("path")] or facts.get("servers", [])
    server = "none"
    ours = answer.get("server") or {}
    rec = ours.get("record") or {}
    if ours.get("running"):
        h = ours.get("health")
        server = (f"pid {rec.get('pid')} port {rec.get('port')} health {h if h is not None else 'no answer'} "
                  f"up {ours.get('uptime')} s model {rec.get('model')}")
    elif servers:
        s = servers[0]
        server = f"pid {s['pid']} port {s['port']} " + ("up" if s["listening"] else "loading")
    elif rec and ours.get("exit") is not None:
        server = f"not running (last exit status {ours['exit']})"
    unit = ours.get("persistent")
    if unit:
        n = unit.get("restarts") or 0
        server += (f"; persistent: {unit['unit']} {unit.get('active')} ({unit.get('sub')}), "
                   f"{unit.get('enabled')}, {n} restart{'' if n == 1 else 's'} by systemd")
    short_patch = state if len(state) <= 20 else state.split(":")[0] + f" ({sum(1 for v in methods.values() if v == 'missing')})"
    short_server = "none"
    if ours.get("running"):
        short_server = "up" if ours.get("health") == 200 else "starting"
    elif servers:
        short_server = "up (not ours)" if servers[0]["listening"] else "loading (not ours)"
    elif rec and rec.get("stopped_at"):
        short_server = "stopped"
    elif rec and ours.get("exit") is not None:
        short_server = f"exited {ours['exit']}"
    if unit and ours.get("running"):
        short_server += f" (persistent, {unit.get('restarts') or 0} restarts)"
    elif unit and unit.get("sub") == "auto-restart":
        short_server = "restarting (persistent)"
    data = {"persistent": unit, "patch_state": state, "patch": short_patch, "server_state": short_server, "install_kind": inst.get("kind"), "interpreters": inst.get("interpreters"),
            "installs": facts.get("installs", []), "server": server, "methods": methods,
            "chosen_reason": facts.get("chosen_reason")}
    if inst.get("git"):
        data["git_checkout"] = inst["git"]
    return HostResult(host, "ok", f"patch: {state}; server: {server}", version=inst.get("version"),
                      install=inst.get("path"), file=p.get("file"), data=data)


def do_patch(op: str, spec: PatchSpec | None, *, check=False, diff=False, force=False, sglang_path=None, python=None,
             verify_import=False, kill_at=None, timeout=300.0):
    def fn(host: Host, session, fleet) -> HostResult:
        hspec = spec or load_patch_spec(host.get("spec"))
        req = request_for(op, host, hspec, check=check, diff=diff, force=force, sglang_path=sglang_path,
                          python=python, verify_import=verify_import, kill_at=kill_at)
        answer = session.call(req, timeout=timeout, sudo=fleet.uses_sudo(host, session))
        res = result_from_answer(host.name, answer, check=check)
        res.data["spec"], res.data["spec_hash"] = hspec.name, hspec.sha  # for the journal
        return res

    return fn


def do_status(spec: PatchSpec | None, *, sglang_path=None, python=None, timeout=120.0):
    def fn(host: Host, session, fleet) -> HostResult:
        hspec = spec or load_patch_spec(host.get("spec"))
        req = request_for("status", host, hspec, sglang_path=sglang_path, python=python)
        try:
            from provision.launch import LaunchOptions, resolve

            prof, _ = resolve(host, LaunchOptions())
            req["port"], req["health_timeout"] = prof.port, prof.health_timeout
        except Exception:  # noqa: BLE001 - status works without a launch profile
            pass
        answer = session.call(req, timeout=timeout, sudo=fleet.uses_sudo(host, session))
        return status_from_answer(host.name, answer)

    return fn
