"""Server control on the host: preflight, start, probe, stop, status, logs, smoke.  STDLIB ONLY.

How a server runs is its backend's (ops/backends/: detached under a watcher, a systemd unit, a
container), picked once from the record or the request; this module gathers the preflight, prepares
a start (argv, environment, the secrets' 0600 files: never the command line), holds the port's lock
(ops/backends/lock.py) from the preflight of a restart through the start to the record, and writes
the record a restart replays (ops/backends/record.py).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import json
import os
import shutil
import time
import urllib.error
import urllib.request

from provision.host import inference
from provision.host.facts import installs
from provision.host.lib import atomic, procfs
from provision.host.ops import server_secrets
from provision.host.ops.backends import identity, lock, record, select, tree
from provision.host.ops.backends.base import health, port_open
from provision.host.ops.backends.record import log_root, other_ports, read_record, state_root, write_record
from provision.host.ops.backends.systemd import (RESTART_SEC, UNIT_DIR, render_server_unit,  # noqa: F401
                                                 systemd_available, systemd_quote, unit_name)
from provision.host.ops.backends.tree import WATCHER  # noqa: F401 - the watcher, for its tests
from provision.host.ops.checks import check_model as _check_model
from provision.host.lib.paths import default_state_dir
from provision.host.ops import preflight_model
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import (Check, ErrorInfo, LogsAnswer, PreflightAnswer, ProbeAnswer, ServerRequest, ServerStatusAnswer,
                                         SmokeAnswer, StartAnswer, StopAnswer)

_server_state = select.server_state


def _describe_pids(pids: list[int]) -> str:
    names = []
    for pid in pids[:8]:
        try:
            with open(f"/proc/{pid}/comm") as fh:
                names.append(f"{pid} ({fh.read().strip()})")
        except OSError:
            names.append(str(pid))
    return ", ".join(names) + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")


# -- preflight ---------------------------------------------------------------
def _patch_check(spec: dict, inst: dict) -> tuple:
    """(the preflight check of one spec: is its fix in place, ours or native, in the chosen
    install?, the fix the server will use: "native", "edited file" or "none")."""
    from provision.host.engine import core as engine
    from provision.host.facts import packages
    from provision.host.lib.modules import PACKAGE, make_resolver

    name = spec.get("name")
    path, pkg = packages.spec_file(inst, spec)
    if path is None:
        return {"level": "fail", "check": "patch", "spec": name,
                "message": (pkg.get("error") or {}).get("message", f"spec {name}: its package is missing")}, "none"
    resolver = make_resolver(inst["path"]) if (spec.get("package") or PACKAGE) == PACKAGE else None
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
                                                 f"no {inference.get(inference.of_request(req)).title} install"}
        return {"ok": False, "facts": facts, "error": err, "checks": []}
    prof = req["profile"]
    args = prof["args"]
    port = int(args.get("port", 30000))
    bind = str(args.get("host", "127.0.0.1"))
    # The specs that must be in place: the playbook's own and the profile's `requires:` that apply.
    wanted = list(req.get("patch_specs") or ([req["spec"]] if req.get("spec") else []))
    fix = "none"
    staged = None
    model_rows = preflight_model.model_checks(req, inst["path"], inst.get("version"), _server_env(req, inst),
                                              mode="overlay" if req.get("overlay") else "edit",
                                              in_place={s.get("class") for s in wanted} | set(req.get("overlay_bound") or []),
                                              python=prof.get("python") or installs.owner_python(inst)[0])
    if req.get("overlay"):
        staged, fix = _overlay_preflight(preflight_model.with_covering_specs(req, model_rows), inst, checks)
        wanted = [s for s in wanted if (s.get("kind") or "delegate") != "delegate"]  # the overlay binds those
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
    eng = inference.get(inference.of_request(req))
    env = _server_env(req, inst)  # type: ignore[arg-type]  # where the hub cache is, as the server will look
    checks += _check_model(str(args.get(eng.model_arg, "")), "model", offline, env, args.get("revision"))
    if eng.draft_path(args):
        checks += _check_model(str(eng.draft_path(args)), "drafter", offline, env,
                               args.get("speculative-draft-model-revision"))
    checks += model_rows  # type: ignore[arg-type]
    # Leftover ranks of an earlier server: sglang processes not in a tree we are running now.
    mine = set(identity.owned(st["record"])) if st["record"] else set()
    left = st.get("survivors") or []
    if left:
        rec = st["record"] or {}
        checks.append({"level": "fail", "check": "survivors",
                       "message": f"the server provision started on port {port} (pid {rec.get('pid')}) is dead but "
                                  f"{len(left)} processes of its tree are still alive: {_describe_pids(left)}; they "
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
    for pid in _sglang_children_orphans(mine | set(theirs)):
        strays.append({"pid": pid, "argv": procfs.cmdline(str(pid))})
    checks += _gpu_checks(args, _server_env(req, inst).get("CUDA_VISIBLE_DEVICES"), mine, theirs)
    checks += _start_checks(req, prof.get("python") or installs.owner_python(inst)[0], st["record"])
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
            "record": st["record"], "install": inst, "survivors": left, "fix": fix, "overlay": staged}


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

    specs = list(req.get("specs") or ([req["spec"]] if req.get("spec") else []))
    why = render.refusal_for_env((req.get("profile") or {}).get("env")) or (
        None if specs else "overlay mode needs a patch spec, and the profile's playbook has no `patch:` section")
    if why:
        checks.append({"level": "fail", "check": "overlay", "message": why})
        return None, "none"
    st, fix = overlay.stage_for_preflight(
        inst, specs, req.get("state_dir") or default_state_dir(), checks,
        native=f"SGLang {inst.get('version')} has every method natively: no overlay needed, the server starts without one")
    if st is None:
        return None, fix
    env = _server_env(req, inst)
    st["verify"] = overlay.verify_import(inst, st, dict(env, **render.server_env(st["root"], env.get("PYTHONPATH"))),
                                         float(req.get("import_timeout") or overlay.IMPORT_TIMEOUT))
    held = "; ".join(f"{r['class']}: {', '.join(r['methods'])}" for r in st["specs"] if r["methods"])
    if st["verify"]["status"] == "failed":
        checks.append({"level": "fail", "check": "overlay", "message": f"the overlay {st['root']} is broken: "
                       f"{st['verify']['why']}"})
        return None, "none"
    checks.append({"level": "ok", "check": "overlay", "message": f"overlay {st['verdict']} in {st['root']} "
                   f"({held}); {st['verify']['why']}"})
    return st, "overlay"


def _sglang_children_orphans(exclude: set) -> list[int]:
    """Scheduler/detokenizer processes whose server is gone (re-parented to init)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in exclude:
            continue
        argv = procfs.cmdline(p)
        joined = " ".join(argv)
        if "sglang" not in joined or "launch_server" in joined:
            continue
        try:
            with open(f"/proc/{p}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            comm = ""
        if comm.startswith("sglang::"):
            try:
                with open(f"/proc/{p}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == 1:
                out.append(int(p))
    return out


# -- start / stop ------------------------------------------------------------
def _server_env(req: ServerRequest, inst: dict) -> dict:
    """The server's environment, as op_start gives it (secrets aside): this session's, less SSH's,
    the install's own (a checkout's PYTHONPATH), then the profile's env."""
    _owner, env_extra = installs.owner_python(inst)
    env = dict(os.environ)
    for k in ("SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK"):
        env.pop(k, None)
    env.update(env_extra)
    env.update({str(k): str(v) for k, v in ((req.get("profile") or {}).get("env") or {}).items()})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _refused(kind: str, message: str, rec: dict | None) -> dict:
    """A start that did nothing: the running server (if any) is left as it was."""
    return {"ok": False, "refused": True, "error": {"kind": kind, "message": message}, "record": rec}


def op_start(req: ServerRequest, bundle: bytes) -> StartAnswer:
    """Start (or, with `restart`, replace) the port's server, holding the port's lock from the
    restart's preflight through the start to the record."""
    port = int(req["profile"]["args"].get("port", 30000))
    try:
        with lock.port_lock(state_root(req), port, "start", float(req.get("lock_wait", lock.WAIT))):
            return _start_locked(dict(req), bundle, port)  # type: ignore[return-value]
    except lock.Busy as exc:
        return {"ok": False, "refused": True, "error": {"kind": "locked", "message": str(exc)}}


def _restart_preflight(req: dict, bundle: bytes, old: dict) -> dict | None:
    """The new launch's preflight, run before the running server is touched: a refusal, or None.
    The server being replaced does not count against it (its port, its processes, its GPUs)."""
    specs = list(req.get("patch_specs") or [])
    stage = req.get("overlay_stage") or {}  # staged and verified by this launch's preflight: it binds the
    bound = [r["class"] for r in stage.get("specs") or [] if r.get("class")]  # delegation specs' classes, so
    if stage:                                                  # neither they nor `spec` are checked in the file
        specs = [s for s in specs if (s.get("kind") or "delegate") != "delegate"]
    pre = op_preflight(dict(req, overlay=False, overlay_bound=bound, patch_specs=specs,  # type: ignore[arg-type]
                            spec=None if stage else req.get("spec")), bundle)
    pid = old.get("pid")
    if not pre.get("ok"):
        return _refused("preflight", f"the new launch's preflight failed: "
                        f"{(pre.get('error') or {}).get('message', 'no answer')}; the running server (pid {pid}) "
                        "was left running", old)
    fails = [c for c in pre.get("checks") or [] if c["level"] == "fail" and c.get("check") != "survivors"]
    if fails and not req.get("force"):
        return _refused("preflight", "preflight of the new launch: " + "; ".join(c["message"] for c in fails)
                        + f"; the running server (pid {pid}) was left running (--force to replace it anyway)", old)
    return None


def _host_launch(req: dict, port: int, secrets: dict) -> dict:
    """What a host server's start needs (argv, environment, log, the watcher's files): {"ok", ...}."""
    prof = req["profile"]
    args = dict(prof["args"])
    facts = installs.for_request(req)
    inst = installs.chosen_install(facts)
    if inst is None:
        err: ErrorInfo = facts.get("error") or {"kind": "not-found", "message":
                                                 f"no {inference.get(inference.of_request(req)).title} install"}
        return {"ok": False, "error": err}
    owner, _env_extra = installs.owner_python(inst)
    python = prof.get("python") or owner
    logdir = log_root(req)
    os.makedirs(logdir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    engine = inference.get(prof.get("engine"))
    n = 1
    log = os.path.join(logdir, engine.log_name(port, stamp))
    while os.path.exists(log):
        n += 1
        log = os.path.join(logdir, engine.log_name(port, stamp, n))
    sroot = state_root(req)
    os.makedirs(sroot, mode=0o700, exist_ok=True)
    # the flags were rendered on the control side (profile.render_flags)
    argv = engine.start_argv(python, prof.get("module"), prof["flags"])
    cfg, token, files = server_secrets.write_host_files(req, port, secrets)
    if cfg:
        argv += [engine.config_flag, cfg]  # the separate-token form: SGLang silently ignores `--config=FILE`
    env = _server_env(req, inst)  # type: ignore[arg-type]
    for k in server_secrets.TOKEN_ENV:
        env.pop(k, None)
    if token:
        env["HF_TOKEN_PATH"] = token  # the hub reads the token from the 0600 file: it is in no environment
    staged = req.get("overlay_stage")
    if staged:
        from provision.host.engine import overlay as render
        from provision.host.ops.overlay import start_refusal

        why = start_refusal(staged, prof.get("env"))
        if why:
            return {"ok": False, "error": {"kind": "overlay", "message": why}}
        env.update(render.server_env(staged["root"], env.get("PYTHONPATH")))
    spec = {"argv": argv, "env": env, "cwd": "/", "log": log,
            "pidfile": os.path.join(sroot, f"server-{port}.pid"),
            "exitfile": os.path.join(sroot, f"server-{port}.exit"),
            "reapfile": os.path.join(sroot, f"server-{port}.reaped.json"),
            "tree_grace": float(req.get("tree_grace", 10))}
    # SGLang logs server_args (api_key included) at start-up: the log is for its owner only.
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as fh:
        fh.write(("[provision] starting: " + " ".join(argv) + "\n").encode())
    return {"ok": True, "spec": spec, "port": port, "grace": float(prof.get("grace", 30)), "inst": inst,
            "engine": engine.name, "title": engine.title, "python": python, "argv": argv, "config": cfg, "files": files, "logdir": logdir}


# The files of a port's server that a new start writes over: its secrets, the watcher's spec and
# script, and a persistent server's unit. A restart keeps a copy until the old server is gone.
SIDE_FILES = ("secrets.yaml", "hf_token", "spec.json", "run.json", "watcher.py")


def snapshot_files(paths: list[str]) -> dict:
    """{path: (bytes, mode) or None when absent}: what put_back_files restores."""
    out: dict = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                out[path] = (fh.read(), os.stat(path).st_mode & 0o777)
        except FileNotFoundError:
            out[path] = None
        except OSError:
            pass  # unreadable: left as it is
    return out


def put_back_files(snap: dict) -> list[str]:
    """Restore a snapshot (absent files removed again): the paths that differed."""
    changed = []
    for path, was in snap.items():
        try:
            with open(path, "rb") as fh:
                now: tuple | None = (fh.read(), os.stat(path).st_mode & 0o777)
        except FileNotFoundError:
            now = None
        except OSError:
            continue
        if now == was:
            continue
        changed.append(path)
        if was is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        else:
            atomic.write_bytes(path, was[0], mode=was[1])
    return changed


def _old_files(req: dict, port: int, old: dict) -> dict:
    paths = [record.side_file(req, port, s) for s in SIDE_FILES]
    if old.get("unit"):
        paths.append(os.path.join(UNIT_DIR, str(old["unit"])))
    return snapshot_files(paths)


def _restore_old_files(snap: dict) -> None:
    """The new start failed before the old server was stopped: it keeps running with the files its
    record describes (its key, its unit: systemd's next Restart= runs what the record says)."""
    changed = put_back_files(snap)
    if any(p.endswith(".service") for p in changed):
        from provision.host.ops.backends.systemctl import systemctl

        systemctl("daemon-reload")  # the old unit text is back: systemd reads it again


def _start_locked(req: dict, bundle: bytes, port: int) -> dict:
    prof = req["profile"]
    args = dict(prof["args"])
    grace = float(prof.get("grace", 30))
    st = select.server_state(req, port)
    old = st["record"]
    same = bool(old) and old.get("profile_digest") == req.get("profile_digest")
    if not req.get("restart"):
        if st["running"]:
            return {"ok": True, "already": True, "record": old, "same_profile": same}
        if st.get("restarting"):  # a persistent unit in systemd's restart window: it is coming back
            try:  # followed from here on: the start-up systemd is about to make
                size = os.path.getsize(old.get("log") or "")
            except OSError:
                size = int(old.get("log_offset") or 0)
            return {"ok": True, "already": True, "adopted": old.get("unit"), "record": dict(old, log_offset=size),
                    "same_profile": same}
        if st.get("survivors"):
            # Never write over the record of a tree that still has live processes: `stop` could no
            # longer find them, and they hold the GPU memory the new server needs.
            left = st["survivors"]
            return {"ok": False, "error": {"kind": "survivors", "message": (
                f"the server on port {port} (pid {old.get('pid')}) is dead but {len(left)} processes "
                f"of its tree are still alive ({_describe_pids(left)}); nothing was started: `provision stop` "
                "ends them, or launch --restart stops them first")}}
    replacing = bool(old) and (st["running"] or bool(st.get("survivors")) or bool(st.get("restarting")))
    if replacing:
        refusal = _restart_preflight(req, bundle, old)
        if refusal:
            return refusal
    secrets, why = server_secrets.keep_for_restart(req, old)
    if why:
        return _refused("secret", why, old)
    kept = _old_files(req, port, old) if replacing else None
    req = dict(req, secrets=secrets)
    backend = select.for_launch(req, old)
    sroot = state_root(req)
    os.makedirs(sroot, mode=0o700, exist_ok=True)
    img = None
    if backend.name == "container":
        from provision.host.ops import container

        prep = container.prepare_start(req, sroot)
        if not prep["ok"]:
            return prep
        launch, img = prep["launch"], prep["image"]
    else:
        launch = _host_launch(req, port, secrets)
        if not launch["ok"]:
            if kept is not None:
                _restore_old_files(kept)
            return launch
    replaced = None
    if replacing:
        old_backend = select.for_record(old)
        if old_backend is backend:
            out = backend.restart(req, old, launch, grace)
        else:
            stopped = old_backend.stop(req, old, grace)
            if not stopped["ok"]:
                return stopped
            out = backend.start(req, launch)
            if out.get("ok"):
                out["replaced"] = stopped.get("pids") or []
            else:
                out["old_stopped"] = True
        replaced = out.get("replaced")
    else:
        out = backend.start(req, launch)
    if not out.get("ok"):
        if kept is not None and not out.get("old_stopped"):
            _restore_old_files(kept)  # the old server still runs: with its own files
        if replacing and out.get("old_stopped"):  # say it in words, and the record says it too
            write_record(req, port, dict(old, stopped_at=time.time(), stopped_by="a restart whose new start failed"))
            why = (out.get("error") or {}).get("message") or "no reason given"
            out = dict(out, error=dict(out.get("error") or {}, message=(
                f"the old server (pid {old.get('pid')}) was stopped; the new one failed: {why}")))
        return out
    eng = inference.get(inference.of_request(req))
    common = {"backend": backend.name, "engine": eng.name,
              "boot_id": identity.boot_id(), "overrides": dict(req.get("overrides") or {}),
              "launch": req.get("launch"),  # what a restart without --playbook replays (tasks/launch.py)
              "persistent": backend.name == "systemd", "fix": req.get("fix") or ("overlay" if req.get("overlay_stage")
                                                                                 else None)}
    names = server_secrets.names(secrets)
    if backend.name == "container":
        from provision.host.ops import container

        rec = container.finish_record(req, dict(out["record"], **common), img)  # type: ignore[arg-type]
        sdir = rec["container"].get("secrets_dir") or ""
        files = {k: os.path.join(sdir, "config.yaml") for k in names["args"]}
        files.update({k: os.path.join(sdir, "hf_token") for k in names["env"] if k in server_secrets.TOKEN_ENV})
        rec["secrets"] = server_secrets.described(names, files)
        write_record(req, port, rec)
        return {"ok": True, "started": True, "record": rec, "replaced": replaced}
    spec, inst = launch["spec"], launch["inst"]
    pid = out["pid"]
    staged = req.get("overlay_stage")
    rec = dict(common, **{
        "pid": pid, "starttime": (identity.ident(pid) or {}).get("starttime"), "pgid": pid, "sid": out["watcher"],
        "unit": out.get("unit"), "cgroup_unit": out.get("cgroup_unit"), "watcher": out["watcher"],
        "watcher_starttime": out.get("watcher_starttime"),
        "port": port, "host": str(args.get("host", "127.0.0.1")), "log": spec["log"],
        "log_offset": int(out.get("log_offset") or 0), "started_at": time.time(),
        "profile_digest": req.get("profile_digest"), "profile": req.get("profile_name"),
        "exitfile": spec["exitfile"], "reapfile": spec["reapfile"], "config": launch["config"],
        "python": launch["python"], "install": inst["path"], "version": inst.get("version"),
        "model": args.get(eng.model_arg), "tp": args.get(eng.tp_arg, 1), "mechanism": out["mechanism"],
        "spec_args": {k: v for k, v in args.items() if k.startswith("speculative")},
        "overlay": {k: staged.get(k) for k in ("root", "package", "modules", "digest")} if staged else None,
        "argv": launch["argv"], "secrets": server_secrets.described(names, launch["files"])})
    write_record(req, port, rec)
    pruned = tree.prune_logs(launch["logdir"], inference.get(prof.get("engine")).log_glob(port),
                             int(prof.get("keep_logs", 5)), spec["log"])
    return {"ok": True, "started": True, "record": rec, "pruned_logs": pruned, "replaced": replaced}


def op_stop(req: ServerRequest, bundle: bytes) -> StopAnswer:
    """Stop the port's server: only processes provably its own (ops/backends/identity.py)."""
    port = int(req.get("port", 30000))
    try:
        with lock.port_lock(state_root(req), port, "stop", float(req.get("lock_wait", lock.WAIT))):
            return _stop_locked(req, port)  # type: ignore[return-value]
    except lock.Busy as exc:
        return {"ok": False, "error": {"kind": "locked", "message": str(exc)}}


def _stop_locked(req: ServerRequest, port: int) -> dict:
    rec = read_record(req, port)
    if not rec:
        return {"ok": True, "stopped": False, "message": f"no server recorded on port {port}"}
    if rec.get("stopped_at"):
        server_secrets.remove_host_files(req, port)  # left by a provision before they went with their server
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec["stopped_at"])))
        return {"ok": True, "stopped": False, "message": f"the server on port {port} was stopped at {when}; "
                                                         "nothing of it is left to stop"}
    backend = select.for_record(rec)
    if backend.name == "detached" and not identity.same_boot(rec):
        res: dict = {"ok": True, "stopped": False, "message": f"the server on port {port} was started before the host "
                                                              "last booted: none of its processes is left"}
    else:
        res = backend.stop(req, rec, float(req.get("grace", 30)))
    if res["ok"]:
        rec = read_record(req, port) or rec  # a persistent server's record may have followed a restart
        rec["stopped_at"] = time.time()
        write_record(req, port, rec)
        server_secrets.remove_host_files(req, port)
    return res


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
    return out  # type: ignore[return-value]


def op_server_status(req: ServerRequest, bundle: bytes) -> ServerStatusAnswer:
    port = int(req.get("port", 30000))
    st = select.server_state(req, port)
    rec = st["record"]
    out = {"ok": True, "running": st["running"], "record": rec, "exit": st.get("exit"),
           "survivors": st.get("survivors") or [], "reaped": st.get("reaped"),
           "stopped": bool((rec or {}).get("stopped_at"))}
    if out["survivors"]:
        out["survivors_described"] = _describe_pids(out["survivors"])
    if st.get("container") is not None:
        out["container"] = st["container"]
    if st.get("unit") is not None:
        u = st["unit"]
        out["persistent"] = {"unit": rec["unit"], "active": u.get("ActiveState"), "sub": u.get("SubState"),
                             "enabled": u.get("UnitFileState"), "restarts": u.get("NRestarts", 0),
                             "result": u.get("Result")}
    if rec and st["running"]:
        host = rec.get("host", "127.0.0.1")
        out["port_open"] = port_open(host, port)
        out["health"] = health(host, port, float(req.get("health_timeout", 30)), None,
                               inference.get(rec.get("engine")).health_path) if out["port_open"] else None
        out["uptime"] = round(time.time() - rec["started_at"], 1)
    return out  # type: ignore[return-value]


def op_logs(req: ServerRequest, bundle: bytes) -> LogsAnswer:
    port = int(req.get("port", 30000))
    rec = read_record(req, port)
    if not rec:
        return {"ok": False, "error": {"kind": "no-server", "message": f"no server recorded on port {port}"}}
    out = select.for_record(rec).logs(req, rec, int(req.get("lines", 100)))
    if out.get("ok"):  # which engine wrote it, and which release (the record's)
        out["engine"], out["version"] = inference.get(rec.get("engine")).title, rec.get("version")
    return out  # type: ignore[return-value]


OPS = {"preflight": op_preflight, "start": op_start, "stop": op_stop, "probe": op_probe,
       "server_status": op_server_status, "logs": op_logs}


def op_smoke(req: ServerRequest, bundle: bytes) -> SmokeAnswer:
    """One short native /generate request, timed; speculative stats from meta_info or /metrics."""
    port = int(req.get("port", 30000))
    rec = read_record(req, port) or {}
    host = rec.get("host", "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    body = json.dumps({"text": req.get("prompt", "The capital of France is"),
                       "sampling_params": {"max_new_tokens": int(req.get("max_new_tokens", 64)),
                                           "temperature": 0}}).encode()
    headers = {"Content-Type": "application/json"}
    key = (req.get("secrets") or {}).get("args", {}).get("api-key")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.monotonic()
    try:
        r = urllib.request.Request(f"http://{host}:{port}/generate", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(r, timeout=float(req.get("timeout", 120))) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": {"kind": "smoke", "message": f"/generate answered HTTP {exc.code}"}}
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": {"kind": "smoke", "message": f"/generate failed: {exc}"}}
    elapsed = time.monotonic() - t0
    meta = data.get("meta_info") or {}
    toks = meta.get("completion_tokens") or 0
    out = {"ok": True, "elapsed": round(elapsed, 3), "completion_tokens": toks,
           "tokens_per_s": round(toks / elapsed, 1) if elapsed > 0 and toks else None,
           "spec_accept_length": meta.get("spec_accept_length"), "spec_accept_rate": meta.get("spec_accept_rate")}
    if out["spec_accept_length"] is None:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
                for line in resp.read().decode().splitlines():
                    for name in ("spec_accept_length", "spec_accept_rate"):
                        if line.startswith(f"sglang:{name}"):
                            out[name] = float(line.rsplit(" ", 1)[1])
        except (OSError, ValueError):
            pass
    return out


OPS["smoke"] = op_smoke
