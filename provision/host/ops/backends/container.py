"""The container backend: a server in a container (the profile's ``launch.container``), run and
looked at through the runtime (docker or podman: the same verbs).  STDLIB ONLY.

* **start**: ``RUNTIME run -d --name NAME`` with the profile's options, labels saying it is
  provision's (port, profile digest). Secrets never reach the runtime's command line or ``-e``
  (``inspect`` shows both): ``--api-key``/``--admin-api-key`` go into a 0600 ``--config`` file,
  ``HF_TOKEN`` into a 0600 token file (``HF_TOKEN_PATH``), both in a 0700 directory of the state
  dir mounted read-only at ``SECRETS_DIR``.
* **state**: ``RUNTIME inspect``; the log is ``RUNTIME logs`` (stdout and stderr into one pipe, so
  byte offsets are stable between polls).
* **stop**: ``RUNTIME stop -t GRACE``, then ``RUNTIME rm``, and the secrets directory goes.
The image side (its SGLang, the overlay for it, preflight) is ops/container.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

from provision.host import inference
from provision.host.facts import installs
from provision.host.lib import atomic
from provision.host.ops import server_secrets
from provision.host.ops.backends.base import ServerBackend

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import ContainerConfig, ErrorInfo

SECRETS_DIR = "/run/provision-secrets"  # in the container, read-only
LABEL = "provision.managed"


def runtime_path(runtime: str) -> str | None:
    """The runtime to run as root, when the one policy for binaries run as root allows it."""
    from provision.host.lib.trust import trusted_binary

    path, why = trusted_binary(runtime)
    return path if why is None else None


def missing_runtime(runtime: str) -> ErrorInfo:
    from provision.host.lib.trust import trusted_binary

    path, why = trusted_binary(runtime)
    if path:  # there, but not root's alone: never run
        return {"kind": "untrusted-runtime", "message": f"{why}: provision runs it as root only when it and every "
                                                        "directory above it are root's and not group/other-writable"}
    return {"kind": "no-runtime", "message": (
        f"{runtime} is not installed on this host (no `{runtime}` on {installs.PROBE_ENV['PATH']}): install it, "
        f"or set launch.container.runtime to the runtime the host has")}


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(installs.PROBE_ENV)
    env["HOME"] = os.environ.get("HOME", "/root")
    return subprocess.run(argv, capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL, cwd="/")


def _why(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or b"").decode("utf-8", "replace").strip() or (proc.stdout or b"").decode(
        "utf-8", "replace").strip()
    return (text.splitlines() or [f"exit status {proc.returncode}"])[-1]


def inspect(runtime: str, name: str) -> dict | None:
    """The container's `inspect` document, or None when there is no such container."""
    rt = runtime_path(runtime)
    if rt is None:
        return None
    p = _run([rt, "container", "inspect", name], timeout=30)
    if p.returncode != 0:
        return None
    try:
        data = json.loads(p.stdout)
    except ValueError:
        return None
    return data[0] if isinstance(data, list) and data else None


def _labels(doc: dict) -> dict:
    return (doc.get("Config") or {}).get("Labels") or {}


def summary(doc: dict | None) -> dict:
    """What status shows of a container: name, id, image, running, exit code, main pid."""
    if not doc:
        return {"exists": False}
    state = doc.get("State") or {}
    cfg = doc.get("Config") or {}
    return {"exists": True, "id": str(doc.get("Id", ""))[:12], "name": str(doc.get("Name", "")).lstrip("/"),
            "image": doc.get("ImageName") or cfg.get("Image"), "image_id": str(doc.get("Image", "")),
            "running": bool(state.get("Running")), "status": state.get("Status"),
            "exit": state.get("ExitCode"), "pid": state.get("Pid") or None, "started": state.get("StartedAt"),
            "ours": _labels(doc).get(LABEL) == "1"}


def run_argv(rt: str, conf: ContainerConfig, *, port: int, digest: str, python: str, module: str, flags: list[str],
             env: dict, mounts: list[str], config_file: str | None) -> list[str]:
    """`RUNTIME run -d ...` for the server (pure). No secret is in it: they are in mounted files."""
    argv = [rt, "run", "-d", "--name", conf["name"], "--label", f"{LABEL}=1", "--label", f"provision.port={port}",
            "--label", f"provision.profile={digest}"]
    for opt, value in (("--gpus", conf.get("gpus")), ("--ipc", conf.get("ipc")), ("--shm-size", conf.get("shm_size")),
                       ("--network", conf.get("network"))):
        if value:
            argv += [opt, str(value)]
    for vol in list(conf.get("volumes") or []) + mounts:
        argv += ["-v", vol]
    for k, v in sorted(env.items()):
        argv += ["-e", f"{k}={v}"]
    argv += list(conf.get("run_args") or [])
    argv += [conf["image"], python, "-m", module, *flags]
    if config_file:
        argv += ["--config", config_file]  # the separate-token form: `--config=FILE` is silently ignored
    return argv




def secrets_dir(sroot: str, port: int) -> str:
    return os.path.join(sroot, f"container-{port}")


def start(req: dict, sroot: str, image: dict, extra_env: dict | None = None,
          extra_mounts: list[str] | None = None) -> dict:
    """Run the server's container; returns {"ok", "record"} or {"ok": False, "error"}."""
    prof = req["profile"]
    conf: ContainerConfig = prof["container"]
    rt = runtime_path(conf["runtime"])
    if rt is None:
        return {"ok": False, "error": missing_runtime(conf["runtime"])}
    args = dict(prof["args"])
    port = int(args.get("port", 30000))
    old = summary(inspect(conf["runtime"], conf["name"]))
    if old["exists"]:
        if not old["ours"]:
            return {"ok": False, "error": {"kind": "name-taken", "message": (
                f"a container named {conf['name']} exists and provision did not start it: remove it, or set "
                "launch.container.name")}}
        p = _run([rt, "rm", "-f", conf["name"]], timeout=float(prof.get("grace", 30)) + 60)
        if p.returncode != 0:
            return {"ok": False, "error": {"kind": "container", "message": f"{conf['runtime']} rm {conf['name']}: "
                                                                           f"{_why(p)}"}}
    secrets = req.get("secrets") or {}
    sdir = secrets_dir(sroot, port)
    shutil.rmtree(sdir, ignore_errors=True)
    os.makedirs(sdir, mode=0o700)
    env = {str(k): str(v) for k, v in (prof.get("env") or {}).items()}
    env.update(extra_env or {})
    env["PYTHONUNBUFFERED"] = "1"
    config_file = None
    if secrets.get("args"):
        atomic.write_text(os.path.join(sdir, "config.yaml"), server_secrets.render_config(secrets["args"]))
        config_file = f"{SECRETS_DIR}/config.yaml"
    token = server_secrets.token_of(secrets)
    if token:
        atomic.write_text(os.path.join(sdir, "hf_token"), str(token))
        env["HF_TOKEN_PATH"] = f"{SECRETS_DIR}/hf_token"
    mounts = [f"{sdir}:{SECRETS_DIR}:ro"] + list(extra_mounts or [])
    python = "python3"  # the image's (the host's `python:` setting is a host path, not the image's)
    argv = run_argv(rt, conf, port=port, digest=str(req.get("profile_digest") or ""), python=python,
                    module=prof.get("module") or inference.for_request(req).launch_module, flags=[str(f) for f in prof["flags"]],
                    env=env, mounts=mounts, config_file=config_file)
    t0 = time.time()
    p = _run(argv, timeout=600)
    if p.returncode != 0:
        shutil.rmtree(sdir, ignore_errors=True)
        return {"ok": False, "error": {"kind": "container", "message": f"{conf['runtime']} run failed: {_why(p)}"}}
    cid = p.stdout.decode().strip().splitlines()[-1] if p.stdout.strip() else ""
    now = summary(inspect(conf["runtime"], conf["name"]))
    rec = {"container": {"runtime": conf["runtime"], "name": conf["name"], "id": cid[:12] or now.get("id"),
                         "image": conf["image"], "image_id": image.get("image_id"), "sglang": image.get("version"),
                         "install_path": image.get("install"), "secrets_dir": sdir},
           "pid": now.get("pid"), "port": port, "host": str(args.get("host", "127.0.0.1")),
           "log": f"{conf['runtime']} logs {conf['name']}", "log_offset": 0, "started_at": t0,
           "run_seconds": round(time.time() - t0, 3),
           "profile_digest": req.get("profile_digest"), "profile": req.get("profile_name"),
           "config": os.path.join(sdir, "config.yaml") if config_file else None, "python": python,
           "install": image.get("install"), "version": image.get("version"), "model": args.get(inference.for_request(req).model_arg),
           "tp": args.get(inference.for_request(req).tp_arg, 1), "mechanism": f"{conf['runtime']} container {conf['name']}",
           "spec_args": {k: v for k, v in args.items() if k.startswith("speculative")}}
    return {"ok": True, "started": True, "record": rec}


def state(rec: dict) -> dict:
    """_server_state's answer for a container server."""
    c = rec["container"]
    s = summary(inspect(c["runtime"], c["name"]))
    ours = s["exists"] and (not c.get("id") or str(s.get("id", "")).startswith(str(c["id"])[:12]))
    running = bool(ours and s.get("running"))
    out: dict = {"record": rec, "running": running, "survivors": [], "container": s if ours else {"exists": False}}
    out["exit"] = s.get("exit") if ours and not running else None
    if runtime_path(c["runtime"]) is None:
        out["error"] = missing_runtime(c["runtime"])
    return out


def log_bytes(rec: dict) -> bytes:
    """The container's whole log (`RUNTIME logs`, stdout and stderr in one pipe, in order)."""
    c = rec["container"]
    rt = runtime_path(c["runtime"])
    if rt is None:
        return b""
    env = dict(installs.PROBE_ENV)
    try:
        p = subprocess.run([rt, "logs", c["name"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                           env=env, stdin=subprocess.DEVNULL, cwd="/")
    except subprocess.TimeoutExpired:
        return b""
    return p.stdout if p.returncode == 0 else b""


def stop(rec: dict, grace: float) -> dict:
    """`RUNTIME stop -t GRACE`, then `rm`; the secrets directory goes too."""
    c = rec["container"]
    rt = runtime_path(c["runtime"])
    if rt is None:
        return {"ok": False, "error": missing_runtime(c["runtime"])}
    s = summary(inspect(c["runtime"], c["name"]))
    t0 = time.monotonic()
    if not s["exists"]:
        shutil.rmtree(c.get("secrets_dir") or "/nonexistent", ignore_errors=True)
        return {"ok": True, "stopped": False, "pids": [], "container": c["name"], "removed": False,
                "message": f"container {c['name']} is gone already"}
    if not s["ours"]:
        return {"ok": True, "stopped": False, "pids": [], "container": c["name"], "removed": False,
                "message": f"container {c['name']} is not provision's (no {LABEL} label): left alone"}
    was_running = bool(s.get("running"))
    if was_running:
        p = _run([rt, "stop", "-t", str(int(grace)), c["name"]], timeout=grace + 60)
        if p.returncode != 0:
            return {"ok": False, "error": {"kind": "stop", "message": f"{c['runtime']} stop {c['name']}: {_why(p)}"}}
    after = summary(inspect(c["runtime"], c["name"]))
    p = _run([rt, "rm", "-f", c["name"]], timeout=60)
    if p.returncode != 0:
        return {"ok": False, "error": {"kind": "stop", "message": f"{c['runtime']} rm {c['name']}: {_why(p)}"}}
    shutil.rmtree(c.get("secrets_dir") or "/nonexistent", ignore_errors=True)
    return {"ok": True, "stopped": was_running, "pids": [s["pid"]] if s.get("pid") else [],
            "escalated": was_running and after.get("exit") == 137, "elapsed": round(time.monotonic() - t0, 2),
            "container": c["name"], "removed": True, "exit": after.get("exit")}


def logs_tail(rec: dict, lines: int) -> dict:
    data = log_bytes(rec)
    text = data[-256 * 1024:].decode("utf-8", "replace").replace("\r", "\n")
    return {"ok": True, "log": rec["log"], "text": "\n".join(text.splitlines()[-lines:]) if lines else "",
            "offset": len(data), "record": rec}



class ContainerBackend(ServerBackend):
    name = "container"

    def start(self, req: dict, launch: dict) -> dict:
        return start(req, launch["sroot"], launch["image"], extra_env=launch.get("extra_env"),
                     extra_mounts=launch.get("extra_mounts"))

    def stop(self, req: dict, rec: dict, grace: float) -> dict:
        return stop(rec, grace)

    def state(self, req: dict, rec: dict) -> dict:
        return state(rec)

    def read_log(self, rec: dict, offset: int, max_bytes: int) -> tuple[str, int]:
        data = log_bytes(rec)[offset:offset + max_bytes]
        return data.decode("utf-8", "replace"), offset + len(data)

    def logs(self, req: dict, rec: dict, lines: int) -> dict:
        return logs_tail(rec, lines)
