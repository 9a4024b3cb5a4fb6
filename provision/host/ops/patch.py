"""The patch ops: ``discover``, ``status``, ``patch`` and ``unpatch``.  STDLIB ONLY.

When the SGLang install to edit is owned by another interpreter (a different Python
binary), the op re-runs the same bundle under that interpreter on the host itself, so
the grammar that checks the edit is the one that will import the file. Still one SSH
round trip.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import json
import os
import subprocess
import sys
import time

from provision.host.bootstrap import BOOTSTRAP, RESULT_PREFIX, frame
from provision.host.engine import core
from provision.host.facts import installs, packages
from provision.host.facts.servers import changed_at, restart_needed
from provision.host.lib import procfs
from provision.host.lib.hostlog import host_log
from provision.host.lib.modules import PACKAGE, module_name
from provision.host.lib.paths import default_state_dir
from provision.host.lib.state import read_state
from provision.host.ops import fileops
from provision.host.ops.fastpath import specs_of
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import DiscoverAnswer, DiscoverRequest, FileResult, PatchAnswer, PatchRequest, StatusAnswer, StatusRequest


def _spec_file(install: dict, spec: dict) -> tuple:
    """(the spec's file, PackageInfo of its package, resolver for base classes): the file is
    relative to the package the spec names, as the install's interpreter finds it (None when
    that package is missing: PackageInfo's error says so)."""
    path, info = packages.spec_file(install, spec)
    # base classes (and an interface spec's protocol) are read in the spec's own package
    return path, info, (fileops.default_resolver(path, spec) if path else None)


def op_discover(req: DiscoverRequest, bundle: bytes) -> DiscoverAnswer:
    return {"ok": True, "facts": installs.for_request(req)}


def _inspect_one(inst: dict, spec: dict, facts: dict, state_dir: str) -> dict:
    """One spec's read-only view of its file (engine.inspect), with the file, its package, the
    servers that started before it changed, the overlay's state and the fix each server uses."""
    out: dict = {"spec": str(spec.get("name"))}
    path, pkg, resolver = _spec_file(inst, spec)
    try:
        if path is None:
            raise FileNotFoundError
        with open(path, "rb") as fh:
            src = fh.read()
    except OSError as exc:
        out["patch"] = {"error": pkg["error"] or {"kind": "file-missing", "message": f"{path}: {exc.strerror}"},
                        "package": pkg}
        return out
    info = core.inspect(src, spec, resolve_module=resolver)
    info["file"] = path
    info["package"] = pkg
    out["patch"] = info
    out["restart_needed"] = _stale_servers(facts, inst, path)
    from provision.host.engine import overlay as render
    from provision.host.ops import overlay

    out["overlay"] = overlay.status(inst, [spec], state_dir) if render.is_overlayable(spec) else None
    out["server_fixes"] = {str(s["pid"]): render.fix_in_use(procfs.environ(s["pid"]), info.get("methods") or {},
                                                           s["pid"] in out["restart_needed"], overlay.engine_of(inst))
                           for s in facts.get("servers", []) if s.get("install") == inst["path"]}
    return out


def op_status(req: StatusRequest, bundle: bytes) -> StatusAnswer:
    from provision.host.facts.containers import sglang_containers

    facts = installs.for_request(req)
    out = {"ok": facts["error"] is None, "facts": facts, "error": facts["error"],
           "containers": sglang_containers()}
    if req.get("gpu"):
        from provision.host.facts.gpu import compute_capability

        out["gpu"] = compute_capability()
    inst = installs.chosen_install(facts)
    if inst is None:
        if req.get("port"):  # no SGLang on the host itself: its server may run in a container
            from provision.host.ops import server

            out["server"] = server.op_server_status({"port": req["port"], "state_dir": req.get("state_dir"),
                                                         "health_timeout": req.get("health_timeout", 30)}, b"")
        return out
    state_dir = req.get("state_dir") or default_state_dir()
    if "specs" in req:  # several specs: one view each, in order
        out["patches"] = [_inspect_one(inst, spec, facts, state_dir) for spec in specs_of(req)]
    elif req.get("spec"):
        one = _inspect_one(inst, req["spec"], facts, state_dir)
        for key in ("patch", "restart_needed", "overlay", "server_fixes"):
            if key in one:
                out[key] = one[key]
    if req.get("port"):
        from provision.host.ops import server
        from provision.host.ops.backends.record import other_ports

        out["server"] = server.op_server_status({"port": req["port"], "state_dir": req.get("state_dir"),
                                                     "health_timeout": req.get("health_timeout", 30)}, b"")
        # provision's servers on the host's other ports (servers are per port): each one's status
        out["other_servers"] = [server.op_server_status({"port": port, "state_dir": req.get("state_dir"),
                                                         "health_timeout": req.get("health_timeout", 30)}, b"")
                                for port, rec in sorted(other_ports(dict(req), int(req["port"])).items())
                                if not rec.get("stopped_at")]
    try:
        out["state"] = read_state(state_dir)
    except Exception as exc:  # noqa: BLE001 - status must never crash on a bad state file
        out["state_error"] = repr(exc)
    return out


def _stale_servers(facts: dict, inst: dict, path: str) -> list:
    """Pids of servers on this install that started before the file last changed. A process's
    start time comes from /proc/stat's btime, which is whole seconds: a server started less than
    a second after the change is not called stale."""
    try:
        changed = changed_at(os.stat(path)) - 1.0
    except OSError:
        return []
    servers = [dict(s, started=procfs.start_epoch(s["pid"])) for s in facts.get("servers", [])]
    return [s["pid"] for s in restart_needed(servers, inst["path"], changed)]


def _owner_reexec(req: dict, bundle: bytes, inst: dict) -> dict | None:
    """Re-run under the interpreter that owns the install, if it is a different binary."""
    owner, _env = installs.owner_python(inst)
    if req.get("_stage") == "owner":
        return None
    if os.path.realpath(owner) == os.path.realpath(sys.executable):
        return None
    sub = dict(req, _stage="owner", install_path=inst["path"])
    # -I -S and no PYTHONPATH: the engine only reads the install's files, it never imports
    # them, so nothing on a checkout's path (which a user may own) is put on sys.path.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([owner, "-I", "-S", "-c", BOOTSTRAP], input=frame(bundle, json.dumps(sub).encode()),
                          capture_output=True, env=env, timeout=req.get("timeout", 600))
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    if proc.returncode < 0 and req.get("op") in ("patch", "unpatch") and not req.get("check"):
        return {"ok": False, "error": {"kind": "unknown",
                                       "message": f"the engine under {owner} was killed (signal {-proc.returncode}) "
                                                  "mid-step: the file is either as before or as intended; run "
                                                  "`provision status` to see which"}}
    return {"ok": False, "error": {"kind": "owner-python",
                                   "message": f"{owner} could not run the engine (exit {proc.returncode}): "
                                              + proc.stderr.decode('utf-8', 'replace').strip()[-400:]}}


def op_patch(req: PatchRequest, bundle: bytes, unpatch: bool = False) -> PatchAnswer:
    """patch / unpatch: one discovery, then each spec of the request in turn (``specs``: the
    answer's ``results`` holds one answer per spec, in order; ``spec``: the one answer).
    The agent sends a `patch` here only when ops/patch_fast.py could not answer it from the
    fast path (or reconcile, after its own fast path said no)."""
    facts = installs.for_request(req)
    if facts["error"]:
        return {"ok": False, "facts": facts, "error": facts["error"]}
    inst = installs.chosen_install(facts)
    if inst is None:
        return {"ok": False, "facts": facts,
                "error": {"kind": "not-found", "message": "no SGLang install chosen"}}
    servers = facts["servers"]
    loading = [s for s in servers if not s["listening"] and s.get("install") == inst["path"]]
    if loading and not req.get("force") and not req.get("check"):
        s = loading[0]
        return {"ok": False, "facts": facts,
                "error": {"kind": "server-loading",
                          "message": f"an SGLang server (pid {s['pid']}) is still loading from this install; "
                                     "its ranks may import different versions of the file. "
                                     "Wait for it, stop it, or pass --force"}}
    sub = _owner_reexec(req, bundle, inst)
    if sub is not None:
        sub.setdefault("facts", facts)
        return sub
    if "specs" in req:
        results = [_patch_one(req, spec, inst, servers, unpatch) for spec in specs_of(req)]
        return {"ok": all(r.get("ok") for r in results), "facts": facts, "results": results}
    one = _patch_one(req, req["spec"], inst, servers, unpatch)
    one.pop("spec", None)
    return dict(one, facts=facts)  # type: ignore[return-value]


def _patch_one(req: dict, spec: dict, inst: dict, servers: list, unpatch: bool) -> PatchAnswer:
    """One spec's patch or unpatch on the chosen install: {"ok", "spec", "result", "error"}."""
    name = str(spec.get("name"))
    path, pkg, resolver = _spec_file(inst, spec)
    state_dir = req.get("state_dir") or default_state_dir()
    common = dict(state_dir=state_dir, check=bool(req.get("check")), want_diff=bool(req.get("diff")))
    if path is None:
        return {"ok": False, "spec": name, "error": pkg["error"]}
    if not os.path.lexists(path):
        return {"ok": False, "spec": name,
                "error": {"kind": "file-missing",
                          "message": f"{path} does not exist (spec {spec['name']} expects "
                                     f"{spec['file']} in the {pkg['name']} package at {pkg['dir']})"}}
    t0 = time.monotonic()
    res: FileResult
    if unpatch:
        res = fileops.unpatch_file(path, spec, actor=req.get("actor"), **common)
    else:
        res = fileops.patch_file(path, spec, sglang_version=inst.get("version"),
                                 resolve_module=resolver, **common)
    res["elapsed"] = round(time.monotonic() - t0, 4)
    res["package"] = pkg
    if res.get("verdict") in ("patched", "repaired", "unpatched") and not req.get("check"):
        host_log(f"{'unpatch' if unpatch else 'patch'} {res['verdict']}: {path} spec={spec['name']} "
                 f"sha256 {str(res.get('sha_before'))[:12]} -> {str(res.get('sha_after'))[:12]}")
    running = [s for s in servers if s.get("install") == inst["path"] and s["listening"]]
    changed = res.get("verdict") in ("patched", "repaired", "unpatched")
    if running and changed and not req.get("check"):
        res.setdefault("notes", []).append(
            f"restart needed: the running server (pid {running[0]['pid']}) imported the old file")
        res["restart_needed"] = True
    if inst.get("git") and changed and not req.get("check"):
        res.setdefault("notes", []).append(
            f"{inst['git']} is a git checkout: the patch is a local change there and `git pull` will refuse "
            "to update the file until `provision unpatch`")
    if req.get("verify_import") and not req.get("check") and res.get("verdict") not in ("failed",):
        res["verify_import"] = verify_import(inst, spec)
    return {"ok": res.get("verdict") != "failed", "spec": name, "result": res, "error": res.get("error")}


VERIFY_SNIPPET = r"""
import importlib, json, sys
mod, cls, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
try:
    m = importlib.import_module(mod)
except Exception as exc:
    print(json.dumps({"importable": False, "why": "%s: %s" % (type(exc).__name__, exc)})); sys.exit(0)
c = getattr(m, cls, None) if cls else m
print(json.dumps({"importable": True, "class_found": c is not None,
                  "callable": {n: callable(getattr(c, n, None)) for n in names}}))
"""


def verify_import(inst: dict, spec: dict) -> dict:
    owner, env_extra, unowned = installs.owning_interpreter(inst)
    if owner is None:  # never python3 with PYTHONPATH: it skips the venv's .pth files
        return {"status": "not-verifiable", "why": f"{unowned}; name its interpreter with --python"}
    mod = module_name(spec["file"], spec.get("package") or PACKAGE)
    names = ",".join(m["name"] for m in spec.get("methods") or [])
    try:
        proc = subprocess.run([owner, "-c", VERIFY_SNIPPET, mod, spec["class"], names], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, **env_extra), cwd="/")
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {"status": "not-verifiable", "why": "import timed out after 120 s"}
    except (ValueError, IndexError, OSError) as exc:
        return {"status": "not-verifiable", "why": f"no answer from {owner}: {exc}"}
    if not data.get("importable"):
        return {"status": "not-verifiable", "why": f"cannot import {mod} here: {data.get('why')}"}
    if not spec.get("class"):
        return {"status": "ok", "why": f"imported {mod}"}
    if not data.get("class_found"):
        return {"status": "failed", "why": f"{mod} has no class {spec['class']}"}
    bad = [n for n, ok in data["callable"].items() if not ok]
    if bad:
        return {"status": "failed", "why": "not callable on the class: " + ", ".join(bad)}
    return {"status": "ok", "why": "imported; every method is callable on the class"}


def op_unpatch(req: PatchRequest, bundle: bytes) -> PatchAnswer:
    return op_patch(req, bundle, unpatch=True)


OPS = {"discover": op_discover, "status": op_status, "patch": op_patch, "unpatch": op_unpatch}  # patch: via patch_fast
