"""`patch`, `unpatch` and `status` for one host: build the request, read the answer.

The deciding and writing happen on the host (provision/host/); this module only
turns the host's JSON answer into a HostResult.
"""

from __future__ import annotations

import os

from typing import TYPE_CHECKING

from provision.config.inventory import Host
from provision.config.playbook import DEFAULT_PACKAGE, PatchSpec, load_patch_spec
from provision.host import inference
from provision.output.results import HostResult
from provision.tasks.bundles import call_light
from provision.tasks.upgrade_plan import installs_note

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import (Facts, Inspection, OverlayStage, PatchAnswer, PatchRequest, SpecStatus,
                                         StatusAnswer,
                                         StatusRequest)



def request_for(op: str, host: Host, spec: PatchSpec | None, *, check: bool = False, diff: bool = False,
                force: bool = False, install_path: str | None = None, python: str | None = None,
                verify_import: bool = False) -> PatchRequest:
    req: PatchRequest = {"op": op, "check": check, "diff": diff, "force": force,
           "install_path": host.install_path(install_path),
           "python": python or host.get("python"), "verify_import": verify_import}
    if spec is not None:
        req["spec"] = spec.to_engine()
    if op == "unpatch":
        from provision.control.journal import actor

        req["actor"] = actor()  # recorded on the host: reconcile names who holds it
    return req


def _chosen(facts: Facts | None) -> dict:
    if not facts:
        return {}
    for rec in facts.get("installs", []):
        if rec["path"] == facts.get("chosen"):
            return rec
    return {}


def discovery_notes(facts: Facts | None, *, skipped: bool = True) -> list[str]:
    """Interpreters and installs discovery refused (not root's alone), servers that did not
    choose (another user's), explicit ones used anyway, and (status) which rule chose."""
    facts = facts or {}
    notes = [f"warning: {w}" for w in facts.get("warnings") or []]
    if skipped:
        for k in facts.get("skipped") or []:
            what, pid = k.get("what") or "interpreter", k.get("server_pid")
            if what == "server":
                notes.append(f"skipped server pid {pid} ({k['path']}): {k['reason']}")
            else:
                notes.append(f"skipped {k['path']}: {k['reason']}"
                             + (f" (the {what} of server pid {pid})" if pid else ""))
        if facts.get("chosen") and facts.get("chosen_reason"):
            notes.append(f"install {facts['chosen']}: chosen because {facts['chosen_reason']}")
    return notes


def result_from_answer(host: str, answer: PatchAnswer, *, check: bool = False) -> HostResult:
    facts = answer.get("facts") or {}
    inst = _chosen(facts)
    res = answer.get("result") or {}
    err = answer.get("error") or res.get("error")
    others = [r["path"] for r in facts.get("installs", []) if r["path"] != facts.get("chosen")]
    notes = list(res.get("notes") or []) + discovery_notes(facts, skipped=False)
    engine_pkg = os.path.basename(str(facts.get("chosen") or "")) or DEFAULT_PACKAGE  # sglang, vllm: the install's package
    if others:
        notes.append(f"other {engine_pkg} installs left alone: " + ", ".join(others))
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
    pkg = res.get("package") or {}
    if pkg and pkg.get("name") not in (DEFAULT_PACKAGE, engine_pkg):
        notes.append(package_note(pkg))
    data = {k: res[k] for k in ("sha_before", "sha_after", "backup", "real_file", "kept", "native",
                                "restart_needed", "module_level_leftovers", "package") if k in res}
    data["install_kind"] = inst.get("kind")
    data["engine_package"] = engine_pkg
    data["interpreters"] = inst.get("interpreters")
    data["chosen_reason"] = facts.get("chosen_reason")
    if inst.get("git"):
        data["git_checkout"] = inst["git"]
    return HostResult(host=host, verdict=verdict, detail=detail, version=inst.get("version"),
                      install=inst.get("path"), file=res.get("file"), added=list(res.get("added") or []),
                      notes=notes, diff=res.get("diff"), error_kind=(err or {}).get("kind"), data=data)


def package_note(pkg: dict) -> str:
    """Which package (not sglang) a spec's file was found in, for the user."""
    return f"file in package {pkg.get('name')} {pkg.get('version') or '(version unknown)'} at {pkg.get('dir')}"


STATUS_WANTED = {"patched", "native", "overlay", "not-applicable"}  # not-applicable: `applies:` rules it out
STATUS_DUE = {"missing", "stale", "hand-patch"}   # `provision patch` would change the file (exit 4)


def patch_state(p: Inspection) -> tuple[str, str]:
    """(verdict, detail) of one file from the engine's read-only view (engine.inspect). Pure.

    patched: our block is there and matches the spec; native: the class has every method
    itself; stale: our block is there but differs from the spec (or lacks a method);
    hand-patch: a hand-appended def (``cat >>``) is there; missing: methods are absent;
    error: the file could not be judged (the detail says why)."""
    methods = p.get("methods") or {}
    block = p.get("block") or {}
    missing = [k for k, v in methods.items() if v == "missing"]
    if p.get("error"):
        return "error", str((p["error"] or {}).get("message") or p["error"])
    if not methods:
        return "error", "the engine reported no methods for the spec"
    edit = p.get("kind") not in (None, "delegate")  # mapping-entry, replace: one edit, named in `methods`
    if all(v == "native" for v in methods.values()):
        if edit:
            via = "; ".join((p.get("native_via") or {}).values())
            return "native", "upstream has it" + (f": {via}" if via else "")
        return "native", "every method is in the class itself"
    if block.get("present") and (block.get("matches") is False or missing):
        why = f"missing from it: {', '.join(missing)}" if missing else "it differs from the spec"
        if edit:
            return "stale", "provision's edit is there but differs from the spec or the file; `provision patch` re-renders it"
        return "stale", f"provision's block is there but {why}; `provision patch` re-renders it"
    if not missing:
        if edit:
            return "patched", f"provision's edit ({', '.join(methods)}) is in place and matches the spec"
        return "patched", "provision's block is in the class and matches the spec"
    if p.get("hand_patch"):
        return "hand-patch", ("a hand patch (`cat >>`) is there and does not bind the methods; "
                              "`provision patch` repairs it")
    return "missing", "missing: " + ", ".join(missing)


def container_notes(answer: StatusAnswer) -> list[str]:
    """The SGLang servers running in containers on the host (not its installs: their files are
    the containers'), each with the command that looks inside."""
    found = answer.get("containers") or {}
    notes = []
    for c in found.get("containers") or []:
        port = f", port {c['port']}" if c.get("port") else ""
        notes.append(f"container {c.get('name')} ({c.get('runtime')}, image {c.get('image') or '?'}{port}) runs an "
                     f"SGLang server: `provision status --container {c.get('name')}` looks inside")
    return notes + [f"containers: {n}" for n in found.get("notes") or []]


def overlay_state(verdict: str, why: str, methods: dict, ov: OverlayStage) -> tuple[str, str, list[str]]:
    """The status verdict once the host's staged overlay is counted (pure): a file that lacks the
    methods is in the wanted state when a current overlay holds them ("overlay"); a stale or no
    longer needed overlay is a note saying what rewrites or removes it."""
    missing = [k for k, v in methods.items() if v == "missing"]
    held = set()
    for row in ov.get("specs") or []:  # a rebound method (a replace spec's) covers the whole edit
        held |= set(missing) if row.get("rebind") and row.get("module") else set(row.get("methods") or [])
    notes = []
    if not ov.get("current"):
        if ov.get("verdict") == "native" and ov.get("kept_for"):
            notes.append(f"overlay {ov.get('root')} is no longer needed (the install has the methods natively), "
                         f"but {', '.join(ov['kept_for'])} still names it: restart that server without the overlay "
                         "(`provision launch --restart`), then `provision reconcile` removes it")
        elif ov.get("verdict") == "native":
            notes.append(f"overlay {ov.get('root')} is no longer needed (the install has the methods natively): "
                         "`provision reconcile` removes it")
        elif ov.get("verdict") == "failed":
            notes.append(f"overlay {ov.get('root')}: {(ov.get('error') or {}).get('message')}")
        else:
            notes.append(f"overlay {ov.get('root')} differs from the spec: `provision patch --overlay` or "
                         "`provision reconcile` rewrites it")
    elif verdict == "missing" and set(missing) <= held:
        how = ov.get("loaded_by") or f"SGLang loads it with SGLANG_EXTERNAL_MODEL_PACKAGE={ov.get('package')}"
        return "overlay", (f"the file lacks {', '.join(missing)}; the overlay {ov.get('root')} holds them "
                           f"({how})"), notes
    return verdict, why, notes


def server_part(answer: StatusAnswer, facts: dict, inst: dict) -> dict:
    """What status says of the host's server (pure): {server: the sentence, short: the column,
    unit: the persistent unit's state or None, servers, ours, rec, fixes}."""
    servers = [s for s in facts.get("servers", []) if s.get("install") == inst.get("path")] or facts.get("servers", [])
    server = "none"
    fixes = answer.get("server_fixes") or {}
    ours = answer.get("server") or {}
    rec = ours.get("record") or {}
    if ours.get("running"):
        h = ours.get("health")
        server = (f"pid {rec.get('pid')} port {rec.get('port')} health {h if h is not None else 'no answer'} "
                  f"up {ours.get('uptime')} s model {rec.get('model')}"
                  + (f"; fix: {fixes.get(str(rec.get('pid'))) or rec['fix']}" if rec.get("fix") or
                     str(rec.get("pid")) in fixes else ""))
    elif ours.get("survivors"):
        server = server_survivors_text(ours)
    elif servers:
        s = servers[0]
        server = f"pid {s['pid']} port {s['port']} " + ("up" if s["listening"] else "loading") \
            + (f"; fix: {fixes[str(s['pid'])]}" if str(s["pid"]) in fixes else "")
    elif rec and ours.get("exit") is not None:
        server = f"not running (last exit status {ours['exit']})"
    unit = ours.get("persistent")
    if unit:
        n = unit.get("restarts") or 0
        server += (f"; persistent: {unit['unit']} {unit.get('active')} ({unit.get('sub')}), "
                   f"{unit.get('enabled')}, {n} restart{'' if n == 1 else 's'} by systemd")
    short_server = "none"
    # a server that answered ready once and answers otherwise now (503, no answer): unhealthy, exit 3
    unhealthy = bool(ours.get("running") and ours.get("was_ready") and ours.get("health") != 200)
    if unhealthy:
        server += "; unhealthy: it answered ready before and does not now"
    if ours.get("running"):
        short_server = "up" if ours.get("health") == 200 else "unhealthy" if unhealthy else "starting"
    elif ours.get("survivors"):
        short_server = f"dead, {len(ours['survivors'])} left"
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
    if not ours.get("running") and not ours.get("survivors") and (ours.get("reaped") or {}).get("killed"):
        rp = ours["reaped"]
        server += (f"; its watcher killed {len(rp['killed'])} leftover processes of its tree "
                   f"{rp.get('grace'):g} s after the main process died")
    # a server provision started (recorded, never stopped) that is not running: status exits 3 on it
    down = bool(rec) and not rec.get("stopped_at") and not ours.get("running") and (
        ours.get("exit") is not None or bool(ours.get("survivors")) or (unit or {}).get("sub") == "auto-restart")
    return {"server": server, "short": short_server, "unit": unit, "servers": servers, "ours": ours, "rec": rec,
            "fixes": fixes, "down": down, "unhealthy": unhealthy}


def status_from_answer(host: str, answer: StatusAnswer) -> HostResult:
    facts = answer.get("facts") or {}
    inst = _chosen(facts)
    err = answer.get("error")
    if err and ((answer.get("server") or {}).get("record") or {}).get("container"):
        from provision.tasks.container import container_status

        return container_status(host, answer)
    containers = list((answer.get("containers") or {}).get("containers") or [])
    if err:
        return HostResult(host, "error", err.get("message", ""), error_kind=err.get("kind"),
                          data={"installs": facts.get("installs", []), "containers": containers},
                          notes=discovery_notes(facts) + container_notes(answer))
    p = answer.get("patch") or {}
    methods = p.get("methods") or {}
    verdict, why = patch_state(p)
    ov = answer.get("overlay")
    overlay_notes: list[str] = []
    if ov:
        verdict, why, overlay_notes = overlay_state(verdict, why, methods, ov)
    # "patched", "native", "missing: a, b", "stale: why", "hand-patch: why", "error: why"
    state = verdict if verdict in ("patched", "native") else why if verdict == "missing" else f"{verdict}: {why}"
    sp = server_part(answer, facts, inst)
    server, short_server, unit, servers = sp["server"], sp["short"], sp["unit"], sp["servers"]
    ours, rec, fixes = sp["ours"], sp["rec"], sp["fixes"]
    notes = list(overlay_notes)
    others = [o for o in answer.get("other_servers") or [] if o.get("running") or o.get("survivors")]
    for o in others:
        orec = o.get("record") or {}
        notes.append(f"also on this host: provision's server on port {orec.get('port')}: "
                     + (f"pid {orec.get('pid')} health {o.get('health') if o.get('health') is not None else 'no answer'}"
                        f" up {o.get('uptime')} s model {orec.get('model')}" if o.get("running")
                        else server_survivors_text(o))
                     + f" (`--server-port {orec.get('port')}` for its verbs)")
    listed = ([{"port": rec.get("port"), "pid": rec.get("pid"), "health": ours.get("health")}]
              if ours.get("running") else [])
    listed += [{"port": (o.get("record") or {}).get("port"), "pid": (o.get("record") or {}).get("pid"),
                "health": o.get("health")} for o in others if o.get("running")]
    pkg = p.get("package") or {}
    if pkg and pkg.get("name") != DEFAULT_PACKAGE:
        notes.append(package_note(pkg))
    notes += installs_note(list(facts.get("installs") or []), rec.get("python") if ours.get("running") else None,
                           rec.get("port"), inst.get("path"))
    stale_pids = answer.get("restart_needed") or []
    if stale_pids:
        notes.append(f"restart needed: the running server (pid {', '.join(map(str, stale_pids))}) started "
                     "before the file last changed")
    data = {"persistent": unit, "patch_state": state, "patch": verdict, "server_state": short_server,
            "server_down": sp["down"], "server_unhealthy": sp["unhealthy"],
            "fix": (fixes.get(str(rec.get("pid"))) or rec.get("fix")) if ours.get("running") else
            (fixes.get(str(servers[0]["pid"])) if servers else None), "overlay": ov,
            "server_survivors": list(ours.get("survivors") or []), "install_kind": inst.get("kind"),
            "interpreters": inst.get("interpreters"), "installs": facts.get("installs", []), "server": server,
            "methods": methods, "chosen_reason": facts.get("chosen_reason"), "restart_needed": bool(stale_pids),
            "package": pkg or None, "containers": containers, "servers": listed,
            "engine_package": inference.PACKAGES.get(str(inst.get("engine") or inference.DEFAULT)),
            "server_port": rec.get("port") if ours.get("running") else (servers[0].get("port") if servers else None)}
    if inst.get("git"):
        data["git_checkout"] = inst["git"]
    return HostResult(host, verdict, f"{state}; server: {server}", version=inst.get("version"),
                      install=inst.get("path"), file=p.get("file"),
                      notes=discovery_notes(facts) + notes + container_notes(answer), data=data,
                      error_kind="status" if verdict == "error" else None)


def status_exit_code(results: list[HostResult]) -> int:
    """0: every host patched or native; 4: some host would be changed by `provision patch`;
    3: a host failed, was unreachable, or its file could not be judged (error), or a server provision
    started there is down (exited, dead with ranks left, or systemd restarting it) or unhealthy (it
    answered ready once and its health check fails now)."""
    from provision.errors import EXIT_CHANGES, EXIT_FAILED, EXIT_NOTHING, EXIT_OK

    if not results:
        return EXIT_NOTHING
    if any(r.failed or r.data.get("server_down") or r.data.get("server_unhealthy") for r in results):
        return EXIT_FAILED
    if any(r.verdict not in STATUS_WANTED for r in results):
        return EXIT_CHANGES
    return EXIT_OK


def server_survivors_text(ours: dict) -> str:
    """A dead server whose tree still has live processes (ranks hold GPU memory): count, pids, what to do."""
    rec = ours.get("record") or {}
    left = ours.get("survivors") or []
    status = f" (exit status {ours['exit']})" if ours.get("exit") is not None else ""
    return (f"dead{status}: main pid {rec.get('pid')} port {rec.get('port')} is gone but {len(left)} processes of "
            f"its tree are alive: pids {ours.get('survivors_described') or ', '.join(map(str, left))}; "
            "`provision stop` ends them")


def _spec_rows(host: str, answer: dict, specs: list[PatchSpec], one) -> list[HostResult]:
    """One row per spec from a several-spec answer (`results`, in the order sent). An answer
    without them (discovery failed, no install, the owner interpreter could not run) is the
    same error for each spec."""
    parts = answer.get("results")
    rows = []
    for i, spec in enumerate(specs):
        part = dict(parts[i]) if parts and i < len(parts) else {k: answer.get(k) for k in ("ok", "error")}
        part["facts"] = answer.get("facts") or {}
        r = one(host, part)
        r.data["spec"], r.data["spec_hash"] = spec.name, spec.sha  # for the journal and the spec column
        rows.append(r)
    return rows


def do_patch(op: str, spec: "PatchSpec | list[PatchSpec] | None", *, check=False, diff=False, force=False,
             install_path=None, python=None, verify_import=False, timeout=300.0, gpu_capability=None, decided=False):
    """patch / unpatch of every spec a host carries: one row per host and spec. Specs whose
    `applies:` rule them out are `not-applicable` (patch only: unpatch takes our edit out
    wherever it is; `decided`: the caller has already ruled them out)."""
    from provision.tasks import specs as multi

    given = spec if isinstance(spec, list) else ([spec] if spec is not None else None)

    def fn(host: Host, session, fleet) -> list[HostResult]:
        hspecs = multi.specs_for(host, given)
        rows: list[HostResult] = []
        todo = hspecs
        if op == "patch" and not decided:
            todo, rows, _ = multi.applicable(session, host, fleet, hspecs, gpu_capability, install_path=install_path,
                                             python=python)
        for engine, group in multi.by_engine(todo):  # each engine's specs to its own install, one call
            req = request_for(op, host, None, check=check, diff=diff, force=force, install_path=install_path,
                              python=python, verify_import=verify_import)
            req["specs"] = [s.to_engine() for s in group]
            if engine:
                req["engine"] = engine
            req["spec_block_shas"] = {s.name: list(multi.block_shas(s)) for s in group}  # the fast path's check
            answer = call_light(session, req, timeout=timeout, sudo=fleet.uses_sudo(host, session))
            rows += _spec_rows(host.name, answer, group,
                               lambda h, part: result_from_answer(h, part, check=check))
        return multi.in_order(hspecs, rows)

    return fn


def do_status(spec: "PatchSpec | list[PatchSpec] | None", *, install_path=None, python=None, timeout=120.0,
              gpu_capability=None):
    """status of every spec a host carries, in one call (with the facts `applies:` needs):
    one row per host and spec."""
    from provision.tasks import specs as multi

    given = spec if isinstance(spec, list) else ([spec] if spec is not None else None)
    unfinished = unfinished_upgrades()

    def fn(host: Host, session, fleet) -> list[HostResult]:
        hspecs = multi.specs_for(host, given)
        req: StatusRequest = {"op": "status", "install_path": host.install_path(install_path),
                              "python": python or host.get("python"), "specs": [s.to_engine() for s in hspecs],
                              "gpu": multi.wants_gpu(hspecs, host, gpu_capability)}
        pk = multi.packages_wanted(hspecs)
        if pk:
            req["packages"] = pk  # discovery reports their versions
        other: dict[str, str] = {}  # spec -> why: it edits another engine's files than the host's server runs
        try:
            from provision.config.profile import host_profile

            prof, _ = host_profile(host)
            req["port"], req["health_timeout"] = prof.port, prof.health_timeout
            if prof.engine != inference.DEFAULT:  # the host's profile names its engine: its install is the one
                req["engine"] = prof.engine
                other = multi.other_engines_specs(hspecs, prof.engine)
                req["specs"] = [s.to_engine() for s in hspecs if s.name not in other]
        except Exception:  # noqa: BLE001 - status works without a launch profile
            pass
        groups = multi.by_engine([s for s in hspecs if s.name not in other])
        if "engine" in req or len(groups) < 2:
            return _status_rows(host, req, hspecs, other, given, session, fleet, timeout, gpu_capability, unfinished)
        rows = []  # SGLang's and vLLM's specs on one host: each engine's specs asked of its own install
        for n, (engine, group) in enumerate(groups):
            greq: StatusRequest = dict(req, specs=[s.to_engine() for s in group])  # type: ignore[assignment]
            if engine:
                greq["engine"] = engine
            rows += _status_rows(host, greq, group, {}, given, session, fleet, timeout, gpu_capability,
                                 unfinished if n == 0 else {}, first=n == 0)
        return multi.in_order(hspecs, rows)

    return fn


def _status_rows(host: Host, req, hspecs: list, other: dict, given, session, fleet, timeout: float,
                 gpu_capability, unfinished: dict, first: bool = True) -> list[HostResult]:
    """The rows of one status call (one engine's install): one per spec; what is of the host, not of an
    install (the router's place, an unfinished upgrade, the host's containers), said on the `first`."""
    from provision.tasks import specs as multi

    answer = session.call_read(req, timeout=timeout, sudo=fleet.uses_sudo(host, session))
    engine_note = ""
    if given is None and "engine" not in req and not (host.get("specs") or host.get("spec")) and \
            (answer.get("error") or {}).get("kind") == "not-found":
        found = _other_engine_status(req, session, fleet, host, timeout)
        if found is not None:
            req, hspecs, answer, engine_note = found
    recorded_elsewhere(answer, host)  # type: ignore[arg-type]
    no: dict[str, str] = dict(other)
    if answer.get("ok") and any(multi.applies_of(s) for s in hspecs):
        no.update(multi.split([s for s in hspecs if s.name not in other],
                              multi.host_view(answer, host, gpu_capability))[1])
    answered = iter(answer.get("patches") or [])
    rows = []
    for s in hspecs:
        part: SpecStatus = next(answered, {}) if s.name not in other else {}
        if s.name in no:
            row = multi.not_applicable(host.name, s, no[s.name], answer.get("facts"))
            if s.name in other and answer.get("ok"):  # the host's server is another engine's: say how it is
                sp = server_part(answer, answer.get("facts") or {}, _chosen(answer.get("facts")))
                row.detail += f"; server: {sp['server']}"
                row.data.update(persistent=sp["unit"], server_state=sp["short"], server=sp["server"])
            rows.append(row)
            continue
        one: StatusAnswer = dict(answer)  # type: ignore[assignment]
        one["patch"] = part.get("patch") or {}
        one["restart_needed"] = part.get("restart_needed") or []
        one["overlay"] = part.get("overlay")
        one["server_fixes"] = part.get("server_fixes") or {}
        if rows or not first:  # the host's containers are said once, on its first row
            one["containers"] = {}
        r = status_from_answer(host.name, one)
        r.data["spec"] = s.name
        rows.append(r)
    for r in rows:  # which engine the install and version are (the host's profile's)
        r.data["engine"] = req.get("engine") or inference.DEFAULT
    if rows and engine_note:
        rows[0].notes.insert(0, engine_note)
    if rows and answer.get("server_from_record"):
        rows[0].notes.insert(0, answer["server_from_record"])
    if rows and first and host.get("router"):  # where the server stands in the router in front, said once
        from provision.tasks import routing

        place = routing.place_of(host, int(req.get("port") or 30000), None, fleet)
        if place is not None:
            words, listed = routing.listed_words(place)
            rows[0].notes.append(words)
            rows[0].data["router"] = {"router": place.router.url, "worker": place.worker, "listed": listed}
    if rows and host.name in unfinished:  # an upgrade this machine left mid-swap there
        rows[0].notes.append(unfinished[host.name])
        rows[0].data["upgrade_unfinished"] = unfinished[host.name]
    return rows


def recorded_elsewhere(answer: dict, host: Host) -> None:
    """Nothing names the host's server (no --server-port, profile or `args: port`) and none is
    recorded on the default port, but provision started one on another port: that one is the
    host's server in the row (its health decides the exit code), said in a note, as stop, bench,
    logs and wait act on it (tasks/recorded.py). In place."""
    from provision.tasks import recorded

    ours = answer.get("server") or {}
    live = [o for o in answer.get("other_servers") or [] if o.get("running") or o.get("survivors")]
    if recorded.named(host, None, None) or ((ours.get("record") or {}) and not ours["record"].get("stopped_at")) \
            or len(live) != 1:
        return
    one = live[0]
    rec = one.get("record") or {}
    answer["server"] = one
    answer["other_servers"] = [o for o in answer.get("other_servers") or [] if o is not one]
    answer["server_from_record"] = (f"no server named: the one provision recorded on this host, port {rec.get('port')} "
                                    f"({(rec.get('launch') or {}).get('engine') or rec.get('engine') or 'sglang'}, "
                                    f"playbook {rec.get('profile') or 'unnamed'})")


def _other_engine_status(req: dict, session, fleet, host: Host, timeout: float):
    """status with no --playbook on a host without the default engine: the first other engine with
    an install there, judged with its default playbook's spec ((request, specs, answer, the note)),
    or None (no other engine here either: the not-found answer stands, naming what it looked for)."""
    from provision.config.playbook import ENGINE_DEFAULT_PLAYBOOKS, load_patch_spec

    for eng in inference.engines():
        book = ENGINE_DEFAULT_PLAYBOOKS.get(eng.name)
        if book is None:
            continue
        spec = load_patch_spec(book)
        specs = [spec] if spec is not None else []
        again = dict(req, engine=eng.name, specs=[s.to_engine() for s in specs])
        ans = session.call_read(again, timeout=timeout, sudo=fleet.uses_sudo(host, session))
        if ans.get("ok"):
            return again, specs, ans, (f"no --playbook: this host's engine is {eng.title} (no "
                                       f"{inference.get(inference.DEFAULT).title} install); judged with "
                                       f"{book.removesuffix('.yaml')}")
    return None


def unfinished_upgrades() -> dict[str, str]:
    """Host -> what `status` says of the upgrade this machine's journal shows stopped mid-swap there
    (read once per run: one pass over the journal, whatever the fleet's size)."""
    from provision.control import journal
    from provision.tasks.upgrade_plan import unfinished_words

    try:
        records = journal.read()[0]
    except OSError:
        return {}
    by_host: dict[str, list[dict]] = {}
    for rec in records:
        if rec.get("command") == "upgrade":
            by_host.setdefault(str(rec.get("host")), []).append(rec)
    return {h: words for h, recs in by_host.items() if (words := unfinished_words(recs))}
