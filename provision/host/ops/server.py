"""Server control on the host: preflight, start, probe, stop, status.  STDLIB ONLY.

The server is started detached (its own session, stdin from /dev/null, output to
a new log per launch) under a small watcher that records its exit status, so a
crash is reported with its real status even though nobody is attached.
Secrets arrive in the request (stdin) and go into a 0600 ``--config`` file or
the process environment: never the command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from provision.host.facts import installs
from provision.host.lib import procfs
from provision.host.lib.procfs import starttime as proc_starttime
from provision.host.lib.paths import default_state_dir
from provision.host.ops import preflight_model
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import (Check, ErrorInfo, LogsAnswer, PreflightAnswer, ProbeAnswer, ServerRequest, ServerStatusAnswer,
                                         SmokeAnswer, StartAnswer, StopAnswer)

WATCHER = r"""
import json, os, subprocess, sys, signal, time
def end_rest_of_tree(pgid, grace, reapfile):
    # The main server process is gone; ranks it did not take with it hold GPU memory. Give them
    # `grace` seconds to follow, then SIGKILL what is left of the process group and the watcher's
    # session, and record it (reapfile) so `status` can say so.
    me, sid = os.getpid(), os.getsid(0)
    def left():
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            try:
                f = open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if f[0] != "Z" and (int(f[2]) == pgid or int(f[3]) == sid):
                out.append(int(d))
        return sorted(out)
    seen = left()
    if not seen:
        return
    end = time.monotonic() + grace
    while time.monotonic() < end and left():
        time.sleep(0.2)
    killed = left()
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    with open(reapfile + ".tmp", "w") as fh:
        json.dump({"at": time.time(), "pids": seen, "killed": killed, "grace": grace}, fh)
    os.replace(reapfile + ".tmp", reapfile)
spec = json.loads(open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read())
log = open(spec["log"], "ab", buffering=0)
p = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                     env=spec["env"], cwd=spec["cwd"], preexec_fn=os.setpgrp)
with open(spec["pidfile"], "w") as fh:
    fh.write(str(p.pid))
def fwd(sig, frame):
    try:
        os.killpg(p.pid, sig)
    except OSError:
        pass
stopping = []  # signals we forwarded: a stop asked for, not a failure
signal.signal(signal.SIGTERM, lambda sig, frame: (stopping.append(sig), fwd(sig, frame)))
signal.signal(signal.SIGINT, lambda sig, frame: (stopping.append(sig), fwd(sig, frame)))
rc = p.wait()
with open(spec["exitfile"] + ".tmp", "w") as fh:
    fh.write(str(rc))
os.replace(spec["exitfile"] + ".tmp", spec["exitfile"])
if spec.get("reapfile"):
    end_rest_of_tree(p.pid, float(spec.get("tree_grace", 10)), spec["reapfile"])
# The exit status carries the server's failure (a signal n as 128+n, like a shell), so that
# systemd's Restart=on-failure restarts a server that died; one stopped on purpose (we
# forwarded SIGTERM/SIGINT) ends in success.
if rc != 0 and not stopping:
    sys.exit(rc if rc > 0 else 128 - rc)
"""


def state_root(req: dict) -> str:

    return os.path.join(req.get("state_dir") or default_state_dir(), "server")


def log_root(req: dict) -> str:
    if req.get("log_dir"):
        return req["log_dir"]
    if os.geteuid() == 0:
        return "/var/log/provision"
    return os.path.join(state_root(req), "logs")


def _is_zombie(pid: int) -> bool:
    """A zombie, or gone."""
    st = procfs.state(pid)
    return st is None or st == "Z"


def alive(pid: int | None, starttime: str | None) -> bool:
    if not pid:
        return False
    st = proc_starttime(pid)
    return st is not None and (starttime is None or st == starttime) and not _is_zombie(pid)


def tree_pids(rec: dict) -> list[int]:
    """Every live process of the server: its process group and the watcher's session."""
    out = []
    pgid, sid = rec.get("pgid"), rec.get("sid")
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        pid = int(p)
        if pid == os.getpid():
            continue
        if (pgid and procfs.pgid(pid) == pgid) or (sid and procfs.sid(pid) == sid):
            if not _is_zombie(pid):
                out.append(pid)
    return sorted(out)


def survivors(rec: dict | None) -> list[int]:
    """Live processes of a server tree whose main process is dead (ranks it left behind), never the
    watcher itself, never a process older than the server (a reused pid or process group)."""
    if not rec:
        return []
    started = proc_starttime(rec["pid"]) if rec.get("pid") else None
    if started is not None and (rec.get("starttime") is None or started == rec.get("starttime")) \
            and not _is_zombie(rec["pid"]):
        return []  # the main process lives: these are its tree, not survivors
    floor = int(rec["starttime"]) if str(rec.get("starttime") or "").isdigit() else None
    out = []
    for pid in tree_pids(rec):
        if pid == rec.get("watcher"):
            continue
        st = proc_starttime(pid)
        if floor is not None and (st is None or int(st) < floor):
            continue
        out.append(pid)
    return out


def _describe_pids(pids: list[int]) -> str:
    names = []
    for pid in pids[:8]:
        try:
            with open(f"/proc/{pid}/comm") as fh:
                names.append(f"{pid} ({fh.read().strip()})")
        except OSError:
            names.append(str(pid))
    return ", ".join(names) + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")


def _state_file(req: dict, port: int) -> str:
    return os.path.join(state_root(req), f"server-{port}.json")


def read_record(req: dict, port: int) -> dict | None:
    try:
        with open(_state_file(req, port)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write_record(req: dict, port: int, rec: dict) -> None:
    os.makedirs(state_root(req), mode=0o700, exist_ok=True)
    path = _state_file(req, port)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(rec, fh)
    os.replace(tmp, path)


def port_open(host: str, port: int) -> bool:
    return installs.port_open(host, port, timeout=0.3)


def health(host: str, port: int, timeout: float, url: str | None = None) -> int | None:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    url = url or f"http://{host}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def _server_state(req: dict, port: int) -> dict:
    rec = read_record(req, port)
    out = {"record": rec, "running": False}
    if not rec:
        return out
    if rec.get("container"):  # a server in a container: the runtime knows its state (ops/container.py)
        from provision.host.ops import container

        return container.state(rec)
    if rec.get("unit") and not rec.get("stopped_at"):
        rec = out["record"] = _refresh_persistent(req, port, rec)
        out["unit"] = unit_state(rec["unit"])
        # Between the server's death and systemd's restart (RestartSec) it is coming back.
        out["restarting"] = (out["unit"] or {}).get("SubState") == "auto-restart"
    out["running"] = alive(rec.get("pid"), rec.get("starttime"))
    out["survivors"] = [] if out["running"] else survivors(rec)
    out["exit"] = None
    try:
        with open(rec.get("reapfile") or "") as fh:
            out["reaped"] = json.load(fh)
    except (OSError, ValueError):
        pass
    try:
        with open(rec["exitfile"]) as fh:
            out["exit"] = int(fh.read().strip())
    except (OSError, ValueError, KeyError):
        pass
    return out


# -- preflight ---------------------------------------------------------------
def _nvidia() -> dict:
    from provision.host.lib.trust import SAFE_ENV, trusted_binary  # the one policy for binaries run as root

    smi, why = trusted_binary("nvidia-smi")
    if not smi or why:
        return {"available": False, "why": why if smi else "nvidia-smi not found"}
    out = {"available": True, "gpus": None, "busy": []}
    run = {"capture_output": True, "text": True, "timeout": 20, "env": dict(SAFE_ENV), "cwd": "/",
           "stdin": subprocess.DEVNULL}
    try:
        p = subprocess.run([smi, "-L"], **run)  # type: ignore[call-overload]
        out["gpus"] = len([x for x in p.stdout.splitlines() if x.startswith("GPU ")])
        q = subprocess.run([smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                           **run)  # type: ignore[call-overload]
        for line in q.stdout.splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 3 and parts[0].isdigit():
                out["busy"].append({"pid": int(parts[0]), "name": parts[1], "memory": parts[2]})
    except (OSError, subprocess.SubprocessError) as exc:
        out["error"] = str(exc)
    return out


def _check_model(path: str, what: str, offline: bool) -> list[dict]:
    items = []
    if not (path.startswith("/") or path.startswith(".") or path.startswith("~")):
        level = "fail" if offline else "warn"
        items.append({"level": level, "check": what,
                      "message": f"{what} {path} is a hub id: the host downloads it at start"
                                 + (" but is marked offline" if offline else "")})
        return items
    p = os.path.expanduser(path)
    if not os.path.isdir(p):
        items.append({"level": "fail", "check": what, "message": f"{what} {p} does not exist"})
        return items
    index = os.path.join(p, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as fh:
                shards = sorted(set(json.load(fh).get("weight_map", {}).values()))
        except (OSError, ValueError) as exc:
            items.append({"level": "fail", "check": what, "message": f"{index}: unreadable ({exc})"})
            return items
        missing = [s for s in shards if not os.path.exists(os.path.join(p, s))]
        if missing:
            items.append({"level": "fail", "check": what,
                          "message": f"{what} {p}: {len(missing)} of {len(shards)} shards missing "
                                     f"(first: {missing[0]})"})
        else:
            items.append({"level": "ok", "check": what, "message": f"{what} {p}: all {len(shards)} shards present"})
    else:
        items.append({"level": "ok", "check": what, "message": f"{what} {p} exists (no shard index to check)"})
    return items


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
                           f"run `provision patch --spec {name}` (or launch --patch)"}, "none"
    return {"level": "ok", "check": "patch", "spec": name, "message": f"spec {name} in place in {path} ("
            + ", ".join(sorted(set(methods.values()))) + ")"}, fix


def op_preflight(req: ServerRequest, bundle: bytes) -> PreflightAnswer:
    if (req.get("profile") or {}).get("container"):  # launch.container: the server runs in a container
        from provision.host.ops import container

        return container.op_preflight(req, bundle)
    checks: list[Check] = []
    facts = installs.for_request(req)
    inst = installs.chosen_install(facts)
    if inst is None:
        err: ErrorInfo = facts.get("error") or {"kind": "not-found", "message": "no SGLang install"}
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
                                              in_place={s.get("class") for s in wanted})
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
    checks += _check_model(str(args.get("model-path", "")), "model", offline)
    if args.get("speculative-draft-model-path"):
        checks += _check_model(str(args["speculative-draft-model-path"]), "drafter", offline)
    checks += model_rows  # type: ignore[arg-type]
    # Leftover ranks of an earlier server: sglang processes not in a tree we are running now.
    mine = set(tree_pids(st["record"])) if ours_running and st["record"] else set()
    left = st.get("survivors") or []
    if left:
        rec = st["record"] or {}
        checks.append({"level": "fail", "check": "survivors",
                       "message": f"the server provision started on port {port} (pid {rec.get('pid')}) is dead but "
                                  f"{len(left)} processes of its tree are still alive: {_describe_pids(left)}; they "
                                  "hold GPU memory: `provision stop` ends them (launch --restart stops them first)"})
        mine |= set(left)
    strays = []
    for s in installs.running_servers():
        if s["pid"] not in mine:
            strays.append(s)
    for pid in _sglang_children_orphans(mine):
        strays.append({"pid": pid, "argv": procfs.cmdline(str(pid))})
    gpu = _nvidia()
    if gpu["available"]:
        tp = int(args.get("tp-size", 1))
        if gpu.get("gpus") is not None and gpu["gpus"] < tp:
            checks.append({"level": "fail", "check": "gpus", "message": f"{gpu['gpus']} GPUs visible, tp-size is {tp}"})
        busy = [b for b in gpu["busy"] if b["pid"] not in mine]
        if busy:
            checks.append({"level": "fail", "check": "gpu-memory",
                           "message": "GPU memory held by leftover processes: "
                                      + ", ".join(f"pid {b['pid']} {b['name']} ({b['memory']})" for b in busy)
                                      + " (stop them: `provision stop`, or kill them)"})
        else:
            checks.append({"level": "ok", "check": "gpus", "message": f"{gpu.get('gpus')} GPUs visible, none busy"})
    else:
        checks.append({"level": "info", "check": "gpus", "message": f"{gpu['why']}: GPU checks skipped"})
    if strays:
        checks.append({"level": "fail", "check": "strays",
                       "message": "leftover SGLang processes from an earlier server: "
                                  + ", ".join(f"pid {s['pid']}" for s in strays[:8])
                                  + " (they hold GPU memory; provision did not start them: kill them)"})
    target = str(args.get("model-path", "/"))
    probe = target if target.startswith("/") and os.path.exists(target) else "/"
    du = shutil.disk_usage(probe)
    checks.append({"level": "info", "check": "disk", "message": f"{du.free / 2**30:.1f} GiB free on {probe}"})
    return {"ok": True, "facts": facts, "checks": checks, "running": ours_running,
            "record": st["record"], "install": inst, "survivors": left, "fix": fix, "overlay": staged}


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
        if comm.startswith("sglang::") or "sglang_standin" in joined and "--rank" in joined:
            try:
                with open(f"/proc/{p}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == 1:
                out.append(int(p))
    return out


# -- start / stop ------------------------------------------------------------
def _prune_logs(directory: str, port: int, keep: int) -> list[str]:
    logs = sorted(glob.glob(os.path.join(directory, f"sglang-{port}-*.log")))
    gone = []
    for old in logs[:-keep] if keep > 0 else []:
        try:
            os.unlink(old)
            gone.append(old)
        except OSError:
            pass
    return gone


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


def op_start(req: ServerRequest, bundle: bytes) -> StartAnswer:
    if (req.get("profile") or {}).get("container"):  # launch.container: `RUNTIME run -d` (ops/container.py)
        from provision.host.ops import container

        return container.op_start(req, bundle)
    prof = req["profile"]
    args = dict(prof["args"])
    port = int(args.get("port", 30000))
    facts = installs.for_request(req)
    inst = installs.chosen_install(facts)
    if inst is None:
        err: ErrorInfo = facts.get("error") or {"kind": "not-found", "message": "no SGLang install"}
        return {"ok": False, "error": err}
    owner, env_extra = installs.owner_python(inst)
    python = prof.get("python") or owner
    st = _server_state(req, port)
    replaced = None
    if st["running"]:
        if req.get("restart"):
            stopped = _stop(req, st["record"], float(prof.get("grace", 30)))
            if not stopped["ok"]:
                return stopped
            replaced = stopped["pids"]
        else:
            return {"ok": True, "already": True, "record": st["record"],
                    "same_profile": st["record"].get("profile_digest") == req.get("profile_digest")}
    if st.get("survivors"):
        # Never write over the record of a tree that still has live processes: `stop` could no
        # longer find them, and they hold the GPU memory the new server needs.
        if not req.get("restart"):
            left = st["survivors"]
            return {"ok": False, "error": {"kind": "survivors", "message": (
                f"the server on port {port} (pid {st['record'].get('pid')}) is dead but {len(left)} processes "
                f"of its tree are still alive ({_describe_pids(left)}); nothing was started: `provision stop` "
                "ends them, or launch --restart stops them first")}}
        stopped = _stop(req, st["record"], float(prof.get("grace", 30)))
        if not stopped["ok"]:
            return stopped
        replaced = stopped["pids"]
    logdir = log_root(req)
    os.makedirs(logdir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = os.path.join(logdir, f"sglang-{port}-{stamp}.log")
    n = 1
    while os.path.exists(log):
        n += 1
        log = os.path.join(logdir, f"sglang-{port}-{stamp}-{n}.log")
    sroot = state_root(req)
    os.makedirs(sroot, mode=0o700, exist_ok=True)
    secrets = req.get("secrets") or {}
    flags = [str(f) for f in prof["flags"]]  # rendered on the control side (profile.render_flags)
    argv = [python, "-m", prof.get("module") or "sglang.launch_server"] + flags
    cfg = None
    if secrets.get("args"):
        cfg = os.path.join(sroot, f"server-{port}.secrets.yaml")
        fd = os.open(cfg + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("# written by provision; holds secrets; readable by its owner only\n")
            for k, v in secrets["args"].items():
                fh.write(f"{k}: {json.dumps(str(v))}\n")
        os.replace(cfg + ".tmp", cfg)
        argv += ["--config", cfg]  # the separate-token form: `--config=FILE` is silently ignored by SGLang
    env = _server_env(req, inst)
    env.update({str(k): str(v) for k, v in (secrets.get("env") or {}).items()})
    staged = req.get("overlay_stage")
    if staged:
        from provision.host.engine import overlay as render
        from provision.host.ops.overlay import start_refusal

        why = start_refusal(staged, prof.get("env"))
        if why:
            return {"ok": False, "error": {"kind": "overlay", "message": why}}
        env.update(render.server_env(staged["root"], env.get("PYTHONPATH")))
    pidfile = os.path.join(sroot, f"server-{port}.pid")
    exitfile = os.path.join(sroot, f"server-{port}.exit")
    reapfile = os.path.join(sroot, f"server-{port}.reaped.json")
    for f in (pidfile, exitfile, reapfile):
        try:
            os.unlink(f)
        except OSError:
            pass
    spec = {"argv": argv, "env": env, "cwd": "/", "log": log, "pidfile": pidfile, "exitfile": exitfile,
            "reapfile": reapfile, "tree_grace": float(req.get("tree_grace", 10))}
    # SGLang logs server_args (api_key included) at start-up: the log is for its owner only.
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as fh:
        fh.write(("[provision] starting: " + " ".join(argv) + "\n").encode())
    unit = None
    if req.get("persistent"):
        started = _start_systemd(req, sroot, port, spec, float(prof.get("grace", 30)))
        if not started["ok"]:
            return started
        unit, watcher_pid = started["unit"], started["pid"]
        poll = lambda: not alive(watcher_pid, None)  # noqa: E731
    else:
        watcher = subprocess.Popen([sys.executable, "-c", WATCHER], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                   cwd="/")
        watcher.stdin.write(json.dumps(spec).encode())
        watcher.stdin.close()
        watcher_pid = watcher.pid
        poll = lambda: watcher.poll() is not None  # noqa: E731
    pid = None
    for _ in range(500):
        try:
            with open(pidfile) as fh:
                pid = int(fh.read().strip())
            break
        except (OSError, ValueError):
            if poll():
                break
            time.sleep(0.02)
    if pid is None:
        return {"ok": False, "error": {"kind": "start", "message": f"the server did not start; see {log}"}}
    rec = {"pid": pid, "starttime": proc_starttime(pid), "pgid": pid, "sid": watcher_pid, "unit": unit,
           "watcher": watcher_pid, "watcher_starttime": proc_starttime(watcher_pid), "port": port,
           "host": str(args.get("host", "127.0.0.1")), "log": log, "log_offset": 0, "started_at": time.time(),
           "profile_digest": req.get("profile_digest"), "profile": req.get("profile_name"),
           "exitfile": exitfile, "reapfile": reapfile, "config": cfg, "python": python, "install": inst["path"],
           "version": inst.get("version"), "model": args.get("model-path"), "tp": args.get("tp-size", 1),
           "mechanism": "systemd unit " + unit if unit else "detached", "spec_args": {k: v for k, v in args.items() if k.startswith("speculative")},
           "fix": req.get("fix") or ("overlay" if staged else None),
           "overlay": {k: staged.get(k) for k in ("root", "package", "modules", "digest")} if staged else None}
    write_record(req, port, rec)
    pruned = _prune_logs(logdir, port, int(prof.get("keep_logs", 5)))
    return {"ok": True, "started": True, "record": rec, "pruned_logs": pruned, "replaced": replaced}


def systemd_available() -> bool:
    from provision.host.lib.trust import trusted_binary

    return os.path.isdir("/run/systemd/system") and trusted_binary("systemctl")[1] is None


# -- persistent servers: a systemd service -------------------------------------
UNIT_DIR = "/etc/systemd/system"
RESTART_SEC = 10  # systemd restarts a server that died after this many seconds
START_MARK = "[provision] started by systemd"  # ExecStartPre appends it: where each start-up begins


def unit_name(port: int) -> str:
    return f"provision-sglang-{port}.service"


def systemd_quote(arg: str) -> str:
    """One argument of ExecStart=: plain when it can be, else double-quoted, with systemd's
    specifier (%) and variable ($) characters escaped."""
    arg = str(arg)
    if arg and not any(c in arg for c in " \t\n\"'\\;$%"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("$", "$$") \
        .replace("%", "%%") + '"'


def render_server_unit(port: int, python: str, watcher: str, spec_path: str, log: str, grace: float) -> str:
    """The service unit of a persistent server (pure). The watcher is a file, the spec (argv,
    environment, secrets) a 0600 file it reads: nothing secret is in the unit, whose
    Environment= and ExecStart= anyone can read with `systemctl show`."""
    mark = (f"import sys; open(sys.argv[1], 'ab').write(b'{START_MARK}\\n')")
    q = systemd_quote
    return (f"# written by provision launch --persistent; `provision stop` removes it\n"
            f"[Unit]\nDescription=SGLang on port {port} (managed by provision)\n"
            f"Wants=network-online.target\nAfter=network-online.target\n"
            f"StartLimitIntervalSec=600\nStartLimitBurst=5\n\n"
            f"[Service]\nType=simple\n"
            f"ExecStartPre={q(python)} -c {q(mark)} {q(log)}\n"
            f"ExecStart={q(python)} {q(watcher)} {q(spec_path)}\n"
            f"KillMode=mixed\nTimeoutStopSec={int(grace)}\n"
            f"Restart=on-failure\nRestartSec={RESTART_SEC}\n\n"
            f"[Install]\nWantedBy=multi-user.target\n")


def _write_private(path: str, text: str) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def _systemctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    from provision.host.lib.trust import trusted_binary

    exe, why = trusted_binary("systemctl")
    if why:
        return subprocess.CompletedProcess(["systemctl", *args], 1, "", why)
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def unit_state(unit: str) -> dict | None:
    """ActiveState, SubState, UnitFileState (enabled?), NRestarts, MainPID, Result of a unit."""
    if not systemd_available():
        return None
    keys = ("ActiveState", "SubState", "UnitFileState", "NRestarts", "MainPID", "Result", "LoadState")
    p = _systemctl("show", "-p", ",".join(keys), unit, timeout=30)
    if p.returncode != 0:
        return None
    out = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    for k in ("NRestarts", "MainPID"):
        try:
            out[k] = int(out.get(k) or 0)
        except ValueError:
            out[k] = 0
    return out


def _start_systemd(req: dict, sroot: str, port: int, spec: dict, grace: float) -> dict:
    """A real service unit that comes back after a reboot and after the server dies."""
    if not systemd_available():
        return {"ok": False, "error": {"kind": "no-systemd",
                                       "message": "--persistent needs systemd as init (/run/systemd/system is "
                                                  "missing here); start without it"}}
    unit = unit_name(port)
    spec_path = os.path.join(sroot, f"server-{port}.spec.json")
    watcher = os.path.join(sroot, f"server-{port}.watcher.py")
    _write_private(spec_path, json.dumps(spec))
    _write_private(watcher, WATCHER)
    path = os.path.join(UNIT_DIR, unit)
    with open(path + ".tmp", "w") as fh:
        fh.write(render_server_unit(port, sys.executable, watcher, spec_path, spec["log"], grace))
    os.replace(path + ".tmp", path)
    for cmd in (["daemon-reload"], ["reset-failed", unit], ["enable", unit], ["restart", unit]):
        p = _systemctl(*cmd)
        if p.returncode != 0 and cmd[0] != "reset-failed":
            return {"ok": False, "error": {"kind": "systemd",
                                           "message": f"systemctl {' '.join(cmd)}: {p.stderr.strip()}"}}
    pid = 0
    for _ in range(250):  # MainPID is the watcher once ExecStartPre is done
        st = unit_state(unit) or {}
        pid = st.get("MainPID") or 0
        if pid or st.get("ActiveState") in ("failed", "inactive"):
            break
        time.sleep(0.02)
    return {"ok": True, "unit": unit, "pid": pid}


def _last_start_offset(log: str) -> int:
    """Where the last start-up by systemd begins in the log (the offset of its mark line)."""
    mark = START_MARK.encode()
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            pos = size
            while pos > 0:
                start = max(0, pos - (1 << 20))
                fh.seek(start)
                data = fh.read(pos - start + len(mark))
                i = data.rfind(mark)
                if i >= 0:
                    return start + i
                pos = start
    except OSError:
        pass
    return 0


def _refresh_persistent(req: dict, port: int, rec: dict) -> dict:
    """systemd may have restarted a persistent server since we last looked: follow it to the
    new process (pid file), the new start-up in the log, and count the restart."""
    if not rec.get("unit") or rec.get("stopped_at"):
        return rec
    pidfile = os.path.join(state_root(req), f"server-{port}.pid")
    try:
        with open(pidfile) as fh:
            pid = int(fh.read().strip())
        mtime = os.stat(pidfile).st_mtime
    except (OSError, ValueError):
        return rec
    if not alive(pid, None) or (pid == rec.get("pid") and proc_starttime(pid) == rec.get("starttime")):
        return rec  # the same process (a pid number can come back after a reboot: compare start times)
    watcher = (unit_state(rec["unit"]) or {}).get("MainPID") or rec.get("watcher")
    rec = dict(rec, pid=pid, starttime=proc_starttime(pid), pgid=pid, sid=watcher, watcher=watcher,
               watcher_starttime=proc_starttime(watcher) if watcher else None, started_at=mtime,
               log_offset=_last_start_offset(rec["log"]), restarts=int(rec.get("restarts") or 0) + 1)
    write_record(req, port, rec)
    return rec


def _remove_unit(req: dict, rec: dict, grace: float) -> dict | None:
    """Stop and disable a persistent server's unit and remove what --persistent wrote, so
    nothing brings it back (no restart, no boot). An error dict, or None."""
    unit = rec["unit"]
    p = _systemctl("disable", "--now", unit, timeout=grace + 60)
    if p.returncode != 0 and (unit_state(unit) or {}).get("LoadState") not in ("not-found", None):
        return {"kind": "systemd", "message": f"systemctl disable --now {unit}: {p.stderr.strip()}"}
    port = rec.get("port")
    for path in (os.path.join(UNIT_DIR, unit), os.path.join(state_root(req), f"server-{port}.spec.json"),
                 os.path.join(state_root(req), f"server-{port}.watcher.py")):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    _systemctl("daemon-reload")
    _systemctl("reset-failed", unit)
    return None


def _stop(req: dict, rec: dict, grace: float) -> dict:
    if rec.get("container"):  # `RUNTIME stop -t GRACE`, then rm (ops/container.py)
        from provision.host.ops import container

        return container.stop(rec, grace)
    if rec.get("unit") and systemd_available():
        rec = _refresh_persistent(req, int(rec.get("port") or 30000), rec)
        before, t0 = tree_pids(rec), time.monotonic()
        err = _remove_unit(req, rec, grace)
        if err:
            return {"ok": False, "error": err}
        left = tree_pids(rec)
        if not left:
            # Stopped even with no process left (between a death and systemd's restart): the unit is gone.
            return {"ok": True, "stopped": True, "pids": before, "escalated": False,
                    "elapsed": round(time.monotonic() - t0, 2),
                    "unit": rec["unit"], "unit_removed": True}
    pids = tree_pids(rec)
    if rec.get("pid") and alive(rec["pid"], rec.get("starttime")) and rec["pid"] not in pids:
        pids.append(rec["pid"])
    t0 = time.monotonic()
    sent_kill = False
    if pids:
        for target in (rec.get("pgid"),):
            try:
                os.killpg(target, signal.SIGTERM)
            except (OSError, TypeError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and tree_pids(rec):
            time.sleep(0.1)
        left = tree_pids(rec)
        if left:
            sent_kill = True
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            end = time.monotonic() + 10
            while time.monotonic() < end and tree_pids(rec):
                time.sleep(0.05)
    left = tree_pids(rec)
    if left:
        return {"ok": False, "error": {"kind": "stop", "message": f"processes still alive after SIGKILL: {left}"}}
    return {"ok": True, "stopped": bool(pids), "pids": pids, "escalated": sent_kill,
            "elapsed": round(time.monotonic() - t0, 2)}


def op_stop(req: ServerRequest, bundle: bytes) -> StopAnswer:
    port = int(req.get("port", 30000))
    rec = read_record(req, port)
    if not rec:
        return {"ok": True, "stopped": False, "message": f"no server recorded on port {port}"}
    res = _stop(req, rec, float(req.get("grace", 30)))
    if res["ok"]:
        rec = read_record(req, port) or rec  # a persistent server's record may have followed a restart
        rec["stopped_at"] = time.time()
        write_record(req, port, rec)
    return res


def op_probe(req: ServerRequest, bundle: bytes) -> ProbeAnswer:
    """Where a start-up stands: alive?, new log bytes since offset, port, /health."""
    port = int(req.get("port", 30000))
    st = _server_state(req, port)
    rec = st["record"]
    if not rec:
        return {"ok": False, "error": {"kind": "no-server", "message": f"no server recorded on port {port}"}}
    if rec.get("container"):  # the log is `RUNTIME logs` (ops/container.py)
        from provision.host.ops import container

        return container.op_probe(req, rec, st)
    offset = int(req.get("offset", 0))
    chunk = ""
    try:
        with open(rec["log"], "rb") as fh:
            fh.seek(offset)
            data = fh.read(int(req.get("max_bytes", 1 << 20)))
            offset += len(data)
            chunk = data.decode("utf-8", "replace")
    except OSError:
        pass
    up = port_open(rec.get("host", "127.0.0.1"), port)
    code = health(rec.get("host", "127.0.0.1"), port, float(req.get("health_timeout", 30)),
                  req.get("health_url")) if up and st["running"] else None
    confirm = None
    if code == 200 and req.get("confirm"):
        # A second look on the host, not a second round trip: one 200 can be a flap.
        time.sleep(float(req["confirm"]))
        confirm = health(rec.get("host", "127.0.0.1"), port, float(req.get("health_timeout", 30)),
                         req.get("health_url"))
    # A persistent server that systemd is about to restart counts as starting, not as gone.
    running = st["running"] or bool(st.get("restarting"))
    return {"ok": True, "running": running, "exit": st.get("exit"), "chunk": chunk, "offset": offset,
            "port_open": up, "health": code, "confirm": confirm, "record": rec, "now": time.time(),
            "survivors": st.get("survivors") or []}


def op_server_status(req: ServerRequest, bundle: bytes) -> ServerStatusAnswer:
    port = int(req.get("port", 30000))
    st = _server_state(req, port)
    rec = st["record"]
    out = {"ok": True, "running": st["running"], "record": rec, "exit": st.get("exit"),
           "survivors": st.get("survivors") or [], "reaped": st.get("reaped")}
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
        out["health"] = health(host, port, float(req.get("health_timeout", 30))) if out["port_open"] else None
        out["uptime"] = round(time.time() - rec["started_at"], 1)
    return out


def op_logs(req: ServerRequest, bundle: bytes) -> LogsAnswer:
    port = int(req.get("port", 30000))
    rec = read_record(req, port)
    if not rec:
        return {"ok": False, "error": {"kind": "no-server", "message": f"no server recorded on port {port}"}}
    lines = int(req.get("lines", 100))
    if rec.get("container"):  # `RUNTIME logs` (ops/container.py)
        from provision.host.ops import container

        return container.logs_tail(rec, lines)
    try:
        with open(rec["log"], "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return {"ok": False, "error": {"kind": "io", "message": f"{rec['log']}: {exc.strerror}"}}
    text = data.replace("\r", "\n")
    tail = "\n".join(text.splitlines()[-lines:])
    return {"ok": True, "log": rec["log"], "text": tail, "offset": size, "record": rec}


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
