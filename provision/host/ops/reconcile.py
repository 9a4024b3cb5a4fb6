"""The `reconcile` op.  STDLIB ONLY.

The agent imports only the modules an op needs, so reconcile on an unchanged host
compiles this module and the few lib/ leaves it uses, not the engine core,
discovery or the server modules (the control side leaves the audit and server
modules out of its bundle altogether).

reconcile, per host, in ONE call:

* fast path: ``state.json`` names the spec's file, the file still holds exactly
  the bytes our last patch wrote (sha256), its block marker carries a sha the
  current spec renders (``block_shas`` from the control side: a changed spec is
  re-rendered), the package version is the one recorded, the checkout (if git)
  has no upstream commits to the file, and no SGLang server runs from another
  install. Then: verdict
  ``unchanged``; nothing is written, not even state; no interpreter is probed
  unless a server is running (to learn which install it imports).
* slow path: full discovery, then ``classify`` (pure, below) over the facts:
  the file's sha against our recorded sha and against the pristine reference
  (the wheel's RECORD for installs; ``git rev-parse HEAD:<file>`` for git
  checkouts; none otherwise), and engine.inspect for the method state.
  ``wiped``/``unpatched``/``stale-block`` are re-patched in the same call
  (through ops.patch.op_patch, so it behaves exactly like `provision patch`).

Host-side logging: when one of these ops changes something (a re-patch, a
restore, a cleaned state entry) it writes one line to the host's syslog through
Python's ``syslog`` module (no subprocess, no extra round trip); nothing is
logged on the fast path.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import os
import re
import time

from provision.host import inference
from provision.host.facts.servers import _server_view, changed_at, restart_needed
from provision.host.lib.hostlog import host_log
from provision.host.lib.paths import default_state_dir
from provision.host.ops.fastpath import fast as _fast
from provision.host.lib.pkgmeta import git_blob_sha, git_facts, package_version, record_sha
from provision.host.lib.state import read_bytes as _read
from provision.host.lib.state import read_state
from provision.host.lib.state import sha256 as _sha
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import ReconcileAnswer, ReconcileRequest, Spec

# --------------------------------------------------------------------------- the pure classifier

STATES = ("unchanged", "native", "wiped", "unpatched", "held", "stale-block", "foreign-edit", "blocked-git",
          "missing-file", "error")
ACTIONS = ("none", "patch", "clean-state", "refresh-state")


def classify(f: dict) -> dict:
    """Decide what reconcile does with one file.  Pure.

    f (every key optional):
      exists               the spec's file exists
      parse_error          the engine could not read the class (message) or None
      methods              {name: "native" | "ours" | "missing"} (engine.inspect)
      block                our managed block is in the file
      block_matches        ... and is exactly what the spec renders
      hand_patch           methods appended at module level (`cat >> file`)
      sha                  sha256 of the file now
      recorded_op          the op state.json last recorded for the file ("patch", "unpatch", "restore") or None
      recorded_sha_after   the sha256 that op left
      recorded_version     the SGLang version it recorded
      version              the SGLang version now
      pristine             the file equals the release's own (RECORD / git HEAD): True, False, None (unknown)
      unpatched_pristine   the file minus our block equals the release's own: True, False, None
      git_behind           upstream commits the checkout lacks that change the file (None: not git or
                           no upstream): with our local change in the file, `git pull` refuses them
      recorded_by          who ran that op (user@control-host), recorded_time when
      force                act on foreign edits too
      include_held         re-patch a host held by an explicit `provision unpatch` too

    An explicit `provision unpatch` is a decision: the host is "held" (left alone, who
    and when in the reason) until `provision patch` runs on it again, or reconcile runs
    with --include-held.

    Returns {"state", "action", "reason"}: state in STATES, action in ACTIONS.
    """
    def out(state, action, reason):
        return {"state": state, "action": action, "reason": reason}

    force = bool(f.get("force"))
    methods = f.get("methods") or {}
    rec_op = f.get("recorded_op")
    ver, rec_ver = f.get("version"), f.get("recorded_version")
    moved = f" (SGLang {rec_ver} -> {ver})" if rec_ver and ver and rec_ver != ver else ""
    if not f.get("exists"):
        return out("missing-file", "none", "the spec's file does not exist in this install")
    if f.get("parse_error"):
        if f.get("pristine") is False:
            return out("foreign-edit", "none", f"someone edited the file and the engine cannot read it: "
                                                f"{f['parse_error']}; fix or reinstall it, then reconcile")
        return out("error", "none", f"the spec does not fit this file: {f['parse_error']}")
    if methods and all(v == "native" for v in methods.values()):
        if f.get("block"):
            return out("native", "patch", "the methods are native now and our old block duplicates them")
        if rec_op is not None:
            return out("native", "clean-state", f"the methods are native{moved}")
        return out("native", "none", "the methods are native")
    if f.get("hand_patch"):
        return out("foreign-edit", "patch" if force else "none",
                   "a hand patch (methods appended at module level)"
                   + ("" if force else "; left alone (--force repairs it)"))
    if f.get("block"):
        intact = rec_op == "patch" and f.get("sha") is not None and f.get("sha") == f.get("recorded_sha_after")
        clean = intact or f.get("unpatched_pristine") is not False
        if not clean:
            if force and f.get("block_matches"):
                return out("unchanged", "refresh-state", "our block is in place; other lines differ from the "
                                                         "release (--force: adopted as the patched state)")
            return out("foreign-edit", "patch" if force else "none",
                       "our block is there but other lines differ from the release"
                       + ("" if force else "; left alone (--force adopts the file as it is)"))
        if f.get("block_matches") and all(v in ("native", "ours") for v in methods.values()):
            if f.get("git_behind"):
                return out("blocked-git", "none",
                           f"our patch is a local change in a git checkout whose upstream has {f['git_behind']} "
                           "new commit(s) to this file: `git pull` refuses them. Run `provision unpatch`, "
                           "`git pull`, then `provision reconcile`")
            fresh = intact and (rec_ver is None or ver is None or rec_ver == ver)
            return out("unchanged", "none" if fresh else "refresh-state", "our patch is in place")
        return out("stale-block", "patch", "our block does not match the spec (or a method became native)")
    if rec_op == "unpatch" and not f.get("include_held"):
        who = f.get("recorded_by") or "an unknown user"
        when = f.get("recorded_time") or "an unknown time"
        return out("held", "none", f"held: `provision unpatch` by {who} at {when}; left alone until "
                                   "`provision patch` runs on it (or reconcile --include-held)")
    if f.get("pristine") is False:
        return out("foreign-edit", "patch" if force else "none",
                   "the methods are missing and the file differs from the release's own (someone edited it)"
                   + ("" if force else "; left alone (--force patches it)"))
    if rec_op == "patch":
        if moved:
            why = f"SGLang changed{moved}"
        elif f.get("pristine"):
            why = f"the file is the release's own again ({f.get('package')} reinstalled)"
        else:
            why = "the file was replaced"
        return out("wiped", "patch", f"our block is gone: {why}")
    last = f" (the last provision op on it was {rec_op})" if rec_op else ""
    return out("unpatched", "patch", f"the methods are missing{last}")


# --------------------------------------------------------------------------- state edits

def _edit_state(state_dir: str, real: str, update: dict | None) -> None:
    """Drop (update None) or update the state entry of `real` (making one if there is
    none), under the host lock."""
    from provision.host.ops import fileops

    lock = fileops._Lock(state_dir, 30)
    try:
        state = read_state(state_dir)
        if update is None:
            if state.pop(real, None) is None:
                return
        else:
            state[real] = dict(state.get(real) or {"op": "patch", "verdict": "adopted", "backup": None},
                               **update, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        fileops._write_json(os.path.join(state_dir, fileops.STATE_NAME), state)
    finally:
        lock.release()


# --------------------------------------------------------------------------- reconcile

def op_reconcile(req: ReconcileRequest, bundle: bytes) -> ReconcileAnswer:
    """One spec (``spec``), or several (``specs``: ``results`` holds one answer per spec, in
    order; discovery runs at most once for all of them, and not at all when every file is
    exactly as our last write left it).

    ``pending``: specs whose `applies:` the control side has not decided yet (it needs this
    host's facts). Such a spec still gets the fast path (a file exactly as our last write left
    it is `unchanged`, whatever decided that write); otherwise it is answered with state
    "pending" and nothing is done, and the answer carries the facts to decide it from (discovery
    with the packages' versions, and the GPUs' when ``gpu``): the control side then sends the
    specs that apply in a second call."""
    if "specs" in req:
        t0 = time.monotonic()
        one = {k: v for k, v in req.items() if k not in ("specs", "spec_block_shas", "pending")}
        shared: dict = {"specs": req.get("specs") or []}  # discovery reports every spec's package
        shas = req.get("spec_block_shas") or {}
        pending = set(req.get("pending") or [])
        results: list = []
        for spec in req.get("specs") or []:
            sub = dict(one, spec=spec, block_shas=shas.get(spec.get("name"), []))
            if spec.get("name") in pending:
                state_dir = sub.get("state_dir") or default_state_dir()
                fast = _fast(sub, spec, state_dir)
                results.append(fast if fast is not None else
                               {"ok": True, "state": "pending", "action": "none", "reason": "applies: to decide"})
                continue
            results.append(_reconcile_one(sub, bundle, shared))
        out: ReconcileAnswer = {"ok": all(r.get("ok") for r in results), "results": results}
        if any(r.get("state") == "pending" for r in results):
            from provision.host.facts import installs

            if "facts" not in shared:
                shared["facts"] = installs.for_request(dict(one, specs=shared["specs"]))
            out["facts"] = shared["facts"]
            if req.get("gpu"):
                from provision.host.facts.gpu import compute_capability

                out["gpu"] = compute_capability()
        out["elapsed"] = round(time.monotonic() - t0, 4)
        return out
    return _reconcile_one(req, bundle, {})


def _reconcile_one(req: dict, bundle: bytes, shared: dict) -> ReconcileAnswer:
    t0 = time.monotonic()
    spec = req["spec"]
    state_dir = req.get("state_dir") or default_state_dir()
    # One path: it starts with the cheap check of our own last write and stops there when the
    # file is exactly as we left it; anything else gets the full look (discovery, classify).
    ans = _fast(req, spec, state_dir)
    if ans is not None:
        ans["elapsed"] = round(time.monotonic() - t0, 4)
        return ans
    ans = _full(req, bundle, spec, state_dir, shared)
    ans["elapsed"] = round(time.monotonic() - t0, 4)
    return ans


def _full(req: dict, bundle: bytes, spec: dict, state_dir: str, shared: dict | None = None) -> dict:
    from provision.host.engine import core as engine
    from provision.host.facts import installs
    from provision.host.lib.modules import make_resolver
    from provision.host.ops import patch

    shared = {} if shared is None else shared
    if "facts" not in shared:  # one discovery for every spec of the request
        shared["facts"] = installs.for_request(dict(req, specs=shared.get("specs") or []))
    facts = shared["facts"]
    slim = {"installs": facts.get("installs"), "chosen": facts.get("chosen"),
            "chosen_reason": facts.get("chosen_reason"), "error": facts.get("error")}
    if facts.get("error"):
        return {"ok": False, "path": "full", "facts": slim, "error": facts["error"]}
    inst = installs.chosen_install(facts)
    if inst is None:
        return {"ok": False, "path": "full", "facts": slim,
                "error": {"kind": "not-found", "message": f"no {inference.for_request(req).title} install chosen"}}
    from provision.host.facts import packages

    eng = inference.get(inst["engine"])  # the chosen install's: discovery resolved it
    path, pkg = packages.spec_file(inst, spec)
    if path is None:
        return {"ok": False, "path": "full", "facts": slim, "error": pkg["error"], "package": pkg}
    real = os.path.realpath(path)
    servers = [_server_view(s) for s in facts.get("servers") or []]
    base = {"ok": True, "path": "full", "facts": slim, "file": real, "install": inst["path"],
            "version": inst.get("version"), "kind": inst.get("kind"), "git": inst.get("git"),
            "servers": servers, "notes": [], "restart_needed": [], "package": pkg}
    from provision.host.engine import overlay as overlay_render
    from provision.host.ops import overlay

    if overlay_render.is_overlayable(spec) and os.path.isdir(overlay.overlay_root(state_dir, inst["path"])):
        return _overlay(req, inst, spec, state_dir, base, facts)
    entry = read_state(state_dir).get(real) or {}
    f = {"exists": os.path.isfile(real), "force": bool(req.get("force")), "version": inst.get("version"),
         "recorded_op": entry.get("op"), "recorded_sha_after": entry.get("sha256_after"),
         "recorded_version": entry.get("sglang_version"), "recorded_by": entry.get("by"),
         "recorded_time": entry.get("time"), "include_held": bool(req.get("include_held")),
         # what was reinstalled, in a sentence: the engine's title for its own package, else the package's name
         "package": eng.title if pkg["name"] == eng.package else pkg["name"]}
    if f["exists"]:
        try:
            src = _read(real)
        except OSError as exc:
            return dict(base, ok=False, error={"kind": "io", "message": f"cannot read {real}: {exc.strerror}"})
        f["sha"] = base["sha"] = _sha(src)
        # base classes (and an interface spec's protocol) are read in the spec's own package
        info = engine.inspect(src, spec, resolve_module=make_resolver(pkg["dir"], pkg["name"]) if pkg.get("dir") else None)
        f["parse_error"] = (info.get("error") or {}).get("message")
        f["methods"] = info.get("methods") or {}
        f["block"] = bool((info.get("block") or {}).get("present"))
        f["block_matches"] = bool((info.get("block") or {}).get("matches"))
        f["hand_patch"] = bool(info.get("hand_patch"))
        base["methods"] = f["methods"]
        unpatched = None
        if f["block"]:
            plan = engine.plan_unpatch(src, spec)
            unpatched = plan.get("new") if plan.get("verdict") == "unpatched" else None
        ref = None
        rel_in_dist = f"{pkg['name']}/{spec['file']}"
        if pkg.get("dist_info"):
            ref = record_sha(pkg["dist_info"], rel_in_dist)
            if ref is not None:
                base["reference"] = "RECORD"
                f["pristine"] = f["sha"] == ref
                if unpatched is not None:
                    f["unpatched_pristine"] = _sha(unpatched) == ref
        if ref is None and inst.get("git"):
            g = git_facts(inst["git"], real)
            base["git_facts"] = g
            f["git_behind"] = g["behind"]
            if g["head_blob"]:
                base["reference"] = "git HEAD"
                f["pristine"] = git_blob_sha(src) == g["head_blob"]
                if unpatched is not None:
                    f["unpatched_pristine"] = git_blob_sha(unpatched) == g["head_blob"]
    decision = classify(f)
    base.update(decision)
    base["classifier_input"] = {k: v for k, v in f.items() if k != "methods"}
    check = bool(req.get("check"))
    action = decision["action"]
    if action == "patch" and not check:
        sub = dict(req, op="patch", install_path=inst["path"], check=False, force=False)
        ans = patch.op_patch(sub, bundle)
        ans.pop("facts", None)
        base["patch"] = ans
        res = ans.get("result") or {}
        if res.get("verdict") in ("patched", "repaired"):
            host_log(f"reconcile re-patched {real} ({decision['state']}; spec {spec['name']}; "
                     f"sha256 {res.get('sha_before', '')[:12]} -> {res.get('sha_after', '')[:12]})")
    elif action == "clean-state" and not check:
        _edit_state(state_dir, real, None)
        base["state_cleaned"] = True
        host_log(f"reconcile: {real} has the methods natively; dropped provision's state entry")
    elif action == "refresh-state" and not check:
        _edit_state(state_dir, real, {"op": "patch", "sglang_version": inst.get("version"),
                                      "sha256_after": f.get("sha"), "spec": spec["name"]})
        base["state_refreshed"] = True
    if f["exists"]:
        try:
            changed = changed_at(os.stat(real))
        except OSError:
            changed = time.time()
        base["restart_needed"] = [s["pid"] for s in restart_needed(servers, inst["path"], changed)]
    return base


def _overlay(req: dict, inst: dict, spec: dict, state_dir: str, base: dict, facts: dict) -> dict:
    """An install in overlay mode (provision staged an overlay for it): keep the overlay current,
    never edit the file. Regenerated when the spec (or the release's missing methods) changed,
    removed when the release has every method natively."""
    from provision.host.engine import overlay as render
    from provision.host.lib import procfs
    from provision.host.ops import overlay

    check = bool(req.get("check"))
    st = overlay.stage(inst, overlay.with_staged(overlay.overlay_root(state_dir, inst["path"]), [spec]), state_dir,
                       check=check)
    base["overlay"] = st
    base["notes"] += list(st.get("notes") or [])
    root = st["root"]
    if st.get("verdict") == "failed":
        return dict(base, ok=False, state="error", action="none", error=st.get("error"),
                    reason=(st.get("error") or {}).get("message", ""))
    if st.get("verdict") == "unchanged":
        return dict(base, state="unchanged", action="none",
                    reason=f"overlay mode: the overlay {root} is current (the file is left as released)")
    users = [s for s in facts.get("servers") or []
             if s.get("install") == inst["path"] and render.runs_overlay(procfs.environ(s["pid"]), overlay.engine_of(inst))]
    base["restart_needed"] = [] if check else [s["pid"] for s in users]
    if st.get("verdict") == "native":
        if not st.get("removed"):
            return dict(base, state="native", action="none", reason="the methods are native")
        return dict(base, state="native", action="remove-overlay",
                    reason=f"the methods are native now ({overlay.engine_of(inst).title} {inst.get('version')}): "
                           f"the overlay {root} is no longer needed")
    held = ", ".join(m for r in st.get("specs") or [] for m in r.get("methods") or [])
    if not check:
        host_log(f"reconcile regenerated the overlay {root} ({held}; spec {spec['name']})")
    return dict(base, state="stale-overlay", action="restage",
                reason=f"overlay mode: the overlay {root} differed from the spec ({held})")


OPS = {"reconcile": op_reconcile}
