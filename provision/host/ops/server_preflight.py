"""Preflight gathering for a server on the host: every check a launch must pass before anything
starts or stops.  STDLIB ONLY.

``op_preflight`` gathers them (the install, the specs in place, the port, the model and drafter
through ops/checks.py and ops/preflight_model.py, leftover processes, GPU memory on this server's
GPUs, what the start itself needs); ``restart_preflight`` runs it for a restart before the running
server is touched, and ``refused`` is the answer of a start that did nothing. Only the overlay's
staging writes (ops/overlay.py, under the state directory).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import os
import shutil

from provision.host import inference
from provision.host.facts import installs
from provision.host.lib import procfs
from provision.host.lib.paths import default_state_dir
from provision.host.ops import preflight_model
from provision.host.ops.backends import identity, select
from provision.host.ops.backends.base import port_open
from provision.host.ops.backends.record import log_root, other_ports, side_file, state_root
from provision.host.ops.checks import check_model as _check_model
from provision.host.ops.server_launch import server_env, start_argv

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import Check, ErrorInfo, PreflightAnswer, ServerRequest

_server_state = select.server_state


def describe_pids(pids: list[int]) -> str:
    names = []
    for pid in pids[:8]:
        try:
            with open(f"/proc/{pid}/comm") as fh:
                names.append(f"{pid} ({fh.read().strip()})")
        except OSError:
            names.append(str(pid))
    return ", ".join(names) + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")


def _patch_check(spec: dict, inst: dict) -> tuple:
    """(the preflight check of one spec: is its fix in place, ours or native, in the chosen
    install?, the fix the server will use: "native", "edited file" or "none")."""
    from provision.host.engine import core as engine
    from provision.host.facts import packages
    from provision.host.ops.fileops import default_resolver

    name = spec.get("name")
    path, pkg = packages.spec_file(inst, spec)
    if path is None:
        return {"level": "fail", "check": "patch", "spec": name,
                "message": (pkg.get("error") or {}).get("message", f"spec {name}: its package is missing")}, "none"
    # the spec's own package (sglang's, vllm's) from the file's path, as `patch` resolves it: an
    # interface spec reads its protocol there
    resolver = default_resolver(path, spec)
    try:
        with open(path, "rb") as fh:
            info = engine.inspect(fh.read(), spec, resolve_module=resolver)
    except OSError as exc:
        return {"level": "fail", "check": "patch", "spec": name, "message": f"{path}: {exc.strerror}"}, "none"
    methods = info.get("methods") or {}
    missing = [m for m, v in methods.items() if v == "missing"]
    if info.get("error"):
        return {"level": "fail", "check": "patch", "spec": name,
                "message": f"{path}: {info['error'].get('message')}"}, "none"
    fix = "native" if set(methods.values()) == {"native"} else "edited file"
    if (spec.get("kind") or "delegate") == "delegate":
        if missing:
            return {"level": "fail", "check": "patch", "spec": name,
                    "message": f"{spec['class']} lacks {', '.join(missing)}: EAGLE-3 will crash after "
                               "the weights load. Run `provision patch` (or launch --patch)"}, "none"
        return {"level": "ok", "check": "patch", "spec": name, "message": f"{spec['class']}: delegation methods "
                "in place (" + ", ".join(sorted(set(methods.values()))) + ")"}, fix
    if missing or not methods:
        return {"level": "fail", "check": "patch", "spec": name,
                "message": f"spec {name} is not in place in {path} ({', '.join(missing) or 'nothing to judge'}): "
                           f"run `provision patch --playbook {name}` (or launch --patch)"}, "none"
    return {"level": "ok", "check": "patch", "spec": name, "message": f"spec {name} in place in {path} ("
            + ", ".join(sorted(set(methods.values()))) + ")"}, fix


def op_preflight(req: ServerRequest, bundle: bytes) -> PreflightAnswer:
    if (req.get("profile") or {}).get("container"):  # launch.container: the server runs in a container
        from provision.host.ops import container

        return container.op_preflight(req, bundle)  # type: ignore[return-value]
    checks: list[Check] = []
    facts = installs.for_request(req)
    inst = installs.chosen_install(facts)
    if inst is None:
        err: ErrorInfo = facts.get("error") or {"kind": "not-found", "message":
                                                 f"no {inference.for_request(req).title} install"}
        return {"ok": False, "facts": facts, "error": err, "checks": []}
    prof = req["profile"]
    args = prof["args"]
    port = int(args.get("port", 30000))
    bind = str(args.get("host", "127.0.0.1"))
    # The specs that must be in place: the playbook's own and the profile's `requires:` that apply.
    wanted = list(req.get("patch_specs") or ([req["spec"]] if req.get("spec") else []))
    fix = "none"
    staged = None
    model_rows = preflight_model.model_checks(req, inst["path"], inst.get("version"), server_env(req, inst),
                                              mode="overlay" if req.get("overlay") else "edit",
                                              in_place=({s.get("class") for s in wanted} | {s.get("name") for s in wanted}
                                                        | set(req.get("overlay_bound") or [])),
                                              python=installs.server_python(inst, prof)[0])
    if req.get("overlay"):
        from provision.host.engine.overlay import is_overlayable

        staged, fix = _overlay_preflight(preflight_model.with_covering_specs(req, model_rows), inst, checks)
        wanted = [s for s in wanted if not is_overlayable(s)]  # the overlay carries those
    for spec in wanted:
        check, spec_fix = _patch_check(spec, inst)
        checks.append(check)  # type: ignore[arg-type]
        if (spec.get("kind") or "delegate") == "delegate" and fix == "none":
            fix = spec_fix
    st = _server_state(req, port)
    ours_running = st["running"]
    if port_open(bind, port) and not ours_running:
        checks.append({"level": "fail", "check": "port", "message": f"something is already listening on {bind}:{port}"})
    elif not ours_running:
        checks.append({"level": "ok", "check": "port", "message": f"port {port} is free"})
    offline = bool(req.get("offline"))
    eng = inference.for_request(req)
    env = server_env(req, inst)  # type: ignore[arg-type]  # where the hub cache is, as the server will look
    checks += _check_model(str(args.get(eng.model_arg, "")), "model", offline, env, args.get("revision"))
    if eng.draft_path(args):
        checks += _check_model(str(eng.draft_path(args)), "drafter", offline, env,
                               args.get("speculative-draft-model-revision"))
    checks += model_rows  # type: ignore[arg-type]
    # Leftover ranks of an earlier server: the engine's processes not in a tree we are running now.
    mine = set(identity.owned(st["record"])) if st["record"] else set()
    left = st.get("survivors") or []
    if left:
        rec = st["record"] or {}
        checks.append({"level": "fail", "check": "survivors",
                       "message": f"the server provision started on port {port} (pid {rec.get('pid')}) is dead but "
                                  f"{len(left)} processes of its tree are still alive: {describe_pids(left)}; they "
                                  "hold GPU memory: `provision stop` ends them (launch --restart stops them first)"})
        mine |= set(left)
    # provision's servers on the host's other ports (one record and one lock per port): their
    # processes are theirs, named as such, never "leftovers"
    theirs: dict[int, int] = {}
    for other, rec in other_ports(req, port).items():
        for pid in identity.owned(rec):
            theirs[pid] = other
    strays = []
    for s in installs.running_servers(eng):
        if s["pid"] not in mine and s["pid"] not in theirs:
            strays.append(s)
    for pid in _orphan_workers(eng, mine | set(theirs)):
        strays.append({"pid": pid, "argv": procfs.cmdline(str(pid))})
    checks += _gpu_checks(args, server_env(req, inst).get("CUDA_VISIBLE_DEVICES"), mine, theirs)
    checks += _start_checks(req, installs.server_python(inst, prof)[0], st["record"])
    if strays:
        checks.append({"level": "fail", "check": "strays",
                       "message": f"leftover {eng.title} processes that no record of provision's claims: "
                                  + ", ".join(f"pid {s['pid']}" for s in strays[:8])
                                  + " (they may hold GPU memory; provision did not start them: kill them)"})
    target = str(args.get(eng.model_arg, "/"))
    probe = target if target.startswith("/") and os.path.exists(target) else "/"
    du = shutil.disk_usage(probe)
    checks.append({"level": "info", "check": "disk", "message": f"{du.free / 2**30:.1f} GiB free on {probe}"})
    return {"ok": True, "facts": facts, "checks": checks, "running": ours_running,
            "record": st["record"], "install": inst, "survivors": left, "fix": fix, "overlay": staged,
            "argv": start_argv(req, inst, installs.server_python(inst, prof)[0], eng),  # type: ignore[arg-type]
            "config_file": side_file(req, port, "secrets.yaml")}


def _start_checks(req: ServerRequest, python: str, old: dict | None) -> list:
    """What the start itself needs, checked before anything is stopped (a restart stops the running
    server only once these pass): the interpreter exists and runs, and the backend can start here."""
    out = []
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        where = "launch.python" if (req.get("profile") or {}).get("python") else "the install's interpreter"
        out.append({"level": "fail", "check": "start",
                    "message": f"{where} {python} " + ("is not executable" if os.path.exists(python) else "does not exist")
                               + ": the server could not start"})
    why = select.for_launch(dict(req), old).start_problem(dict(req))
    if why:
        out.append({"level": "fail", "check": "start", "message": why})
    for what, path in (("state", state_root(req)), ("log", log_root(req))):  # the record, the spec, the log
        free = _free_bytes(path)
        if free is not None and free < START_FREE_BYTES:
            out.append({"level": "fail", "check": "start", "message": (
                f"the {what} directory {path} has {free // 1024} KiB free: the server's record and log could "
                "not be written")})
    return out


START_FREE_BYTES = 4 << 20  # the record, spec, unit and the first lines of the log


def _free_bytes(path: str) -> int | None:
    """Free bytes where `path` is (or its nearest existing parent), None when unknown."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or "/").free
    except OSError:
        return None


def _gpu_checks(args: dict, visible: str | None, mine: set, theirs: dict) -> list:
    """GPU memory judged on the GPUs this server will use (facts/gpu_use.py), each holder named:
    this server's own tree, provision's server on another port, or nobody provision knows."""
    from provision.host.facts import gpu_use

    gpu = gpu_use.read()
    if not gpu["available"]:
        return [{"level": "info", "check": "gpus", "message": f"{gpu['why']}: GPU checks skipped"}]
    used, why = gpu_use.server_gpus(args, visible, gpu["gpus"])
    if why:
        return [{"level": "fail", "check": "gpus", "message": why}]
    uuids = {g["uuid"]: g["index"] for g in gpu["gpus"]}
    ours = {g["uuid"] for g in used}
    # an app on a GPU nvidia-smi -L did not list is counted as on ours: never passed over unseen
    busy = [b for b in gpu["apps"] if b["pid"] not in mine and (b["uuid"] in ours or b["uuid"] not in uuids)]
    where = gpu_use.describe(used)
    if not busy:
        return [{"level": "ok", "check": "gpus", "message": f"{len(gpu['gpus'])} GPUs visible; this server's "
                 f"{where}: none busy"}]
    whose = [f"pid {b['pid']} {b['name']} (GPU {uuids.get(b['uuid'], b['uuid'])}, {b['memory']}"
             + (f", provision's server on port {theirs[b['pid']]})" if b["pid"] in theirs else
                ", started by nobody provision knows)") for b in busy]
    return [{"level": "fail", "check": "gpu-memory",
             "message": f"GPU memory on this server's {where} is held by other processes: " + ", ".join(whose)
                        + " (`provision stop --server-port N` stops provision's; kill the others, or give this "
                          "server other GPUs: base-gpu-id, CUDA_VISIBLE_DEVICES)"}]


def _overlay_preflight(req: ServerRequest, inst: dict, checks: list) -> tuple:
    """launch --overlay: stage the overlay (ops/overlay.py), check it, and say what it holds.
    Returns (the staged overlay or None, the fix the server will use)."""
    from provision.host.engine import overlay as render
    from provision.host.ops import overlay

    specs = [s for s in req.get("specs") or ([req["spec"]] if req.get("spec") else []) if render.is_overlayable(s)]
    engine = overlay.engine_of(inst)
    why = render.refusal_for_env((req.get("profile") or {}).get("env"), engine) or (
        None if specs else "overlay mode needs a patch spec, and the profile's playbook has no `patch:` section")
    if why:
        checks.append({"level": "fail", "check": "overlay", "message": why})
        return None, "none"
    st, fix = overlay.stage_for_preflight(
        inst, specs, req.get("state_dir") or default_state_dir(), checks,
        native=f"{engine.title} {inst.get('version')} has every method natively: no overlay needed, the server starts "
               "without one")
    if st is None:
        return None, fix
    env = server_env(req, inst)
    st["verify"] = overlay.verify_import(inst, st, dict(env, **render.server_env(st["root"], env.get("PYTHONPATH"), engine,
                                                                           env.get(engine.overlay_plugins_env))),
                                         float(req.get("import_timeout") or overlay.IMPORT_TIMEOUT))
    held = "; ".join(f"{r['class']}: {', '.join(r['methods'])}" for r in st["specs"] if r["methods"])
    if st["verify"]["status"] == "failed":
        checks.append({"level": "fail", "check": "overlay", "message": f"the overlay {st['root']} is broken: "
                       f"{st['verify']['why']}"})
        return None, "none"
    checks.append({"level": "ok", "check": "overlay", "message": f"overlay {st['verdict']} in {st['root']} "
                   f"({held}); {st['verify']['why']}"})
    return st, "overlay"


def _orphan_workers(eng, exclude: set) -> list[int]:
    """The engine's workers (SGLang's schedulers and detokenizer, vLLM's engine core and workers: its
    `is_orphan_worker` rule) whose server is gone (re-parented to init)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in exclude:
            continue
        try:
            with open(f"/proc/{p}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            comm = ""
        if not eng.is_orphan_worker(procfs.cmdline(p), comm):
            continue
        try:
            with open(f"/proc/{p}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == 1:
            out.append(int(p))
    return out


def refused(kind: str, message: str, rec: dict | None) -> dict:
    """A start that did nothing: the running server (if any) is left as it was."""
    return {"ok": False, "refused": True, "error": {"kind": kind, "message": message}, "record": rec}


def restart_preflight(req: dict, bundle: bytes, old: dict) -> dict | None:
    """The new launch's preflight, run before the running server is touched: a refusal, or None.
    The server being replaced does not count against it (its port, its processes, its GPUs)."""
    if (req.get("profile") or {}).get("container"):  # a container's own preflight, its overlay as this launch
        over = bool(req.get("overlay") or req.get("overlay_stage"))  # staged it (re-staged unchanged: seconds)
        return _refusal(op_preflight(dict(req, overlay=over), bundle), req, old)  # type: ignore[arg-type]
    specs = list(req.get("patch_specs") or [])
    stage = req.get("overlay_stage") or {}  # staged and verified by this launch's preflight: it binds the
    bound = [r["class"] for r in stage.get("specs") or [] if r.get("class")]  # delegation specs' classes, so
    if stage:                                                  # neither they nor `spec` are checked in the file
        specs = [s for s in specs if (s.get("kind") or "delegate") != "delegate"]
    pre = op_preflight(dict(req, overlay=False, overlay_bound=bound, patch_specs=specs,  # type: ignore[arg-type]
                            spec=None if stage else req.get("spec")), bundle)
    return _refusal(pre, req, old)


def _refusal(pre: dict, req: dict, old: dict) -> dict | None:
    """The new launch's preflight answer as restart_preflight's: a refusal naming the running
    server left running, or None."""
    pid = old.get("pid")
    if not pre.get("ok"):
        return refused("preflight", f"the new launch's preflight failed: "
                        f"{(pre.get('error') or {}).get('message', 'no answer')}; the running server (pid {pid}) "
                        "was left running", old)
    fails = [c for c in pre.get("checks") or [] if c["level"] == "fail" and c.get("check") != "survivors"]
    if fails and not req.get("force"):
        return refused("preflight", "preflight of the new launch: " + "; ".join(c["message"] for c in fails)
                        + f"; the running server (pid {pid}) was left running (--force to replace it anyway)", old)
    return None
