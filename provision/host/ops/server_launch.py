"""Launch preparation for a server on the host: what its start needs, written before any process
starts.  STDLIB ONLY.

``server_env`` (the server's environment), ``host_launch`` (the argv, the log, the watcher's spec,
the secrets' 0600 files: never the command line) and, for a restart, the snapshot of the files a
new start writes over (``old_files``) and their return when it fails before the old server stops
(``restore_old_files``). ops/server.py starts; ops/server_preflight.py judges.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import os
import time

from provision.host import inference
from provision.host.facts import installs
from provision.host.lib import atomic
from provision.host.lib.paths import default_state_dir
from provision.host.ops import server_secrets
from provision.host.ops.backends import record
from provision.host.ops.backends.record import log_root, state_root
from provision.host.ops.backends.systemd import UNIT_DIR

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import ErrorInfo, ServerRequest


def server_env(req: ServerRequest, inst: dict) -> dict:
    """The server's environment, as op_start gives it (secrets aside): this session's, less SSH's,
    the install's own (a checkout's PYTHONPATH), then the profile's env."""
    _python, env_extra = installs.server_python(inst, req.get("profile") or {})
    env = dict(os.environ)
    for k in ("SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK"):
        env.pop(k, None)
    env.update(env_extra)
    env.update({str(k): str(v) for k, v in ((req.get("profile") or {}).get("env") or {}).items()})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def new_log(logdir: str, engine, port: int, stamp: str) -> str:
    """Create this launch's log file, exclusively and never through a link (O_EXCL|O_NOFOLLOW: a
    profile's `log_dir:` may be a directory another account writes, with a link planted at the next
    name): LOG, else LOG-2, LOG-3, ... The path."""
    for n in range(1, 1000):
        log = os.path.join(logdir, engine.log_name(port, stamp, n) if n > 1 else engine.log_name(port, stamp))
        try:
            os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            return log
        except FileExistsError:
            continue
    raise OSError(f"{logdir}: no free log name for {engine.log_name(port, stamp)}")


def host_launch(req: dict, port: int, secrets: dict) -> dict:
    """What a host server's start needs (argv, environment, log, the watcher's files): {"ok", ...}."""
    prof = req["profile"]
    args = dict(prof["args"])
    facts = installs.for_request(req)
    inst = installs.chosen_install(facts)
    if inst is None:
        err: ErrorInfo = facts.get("error") or {"kind": "not-found", "message":
                                                 f"no {inference.for_request(req).title} install"}
        return {"ok": False, "error": err}
    python, _env_extra = installs.server_python(inst, prof)
    logdir = log_root(req)
    os.makedirs(logdir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    engine = inference.for_request(req)
    log = new_log(logdir, engine, port, stamp)
    sroot = state_root(req)
    os.makedirs(sroot, mode=0o700, exist_ok=True)
    argv = start_argv(req, inst, python, engine)
    cfg, token, files = server_secrets.write_host_files(req, port, secrets)
    if cfg:
        argv += [engine.config_flag, cfg]  # the separate-token form: SGLang silently ignores `--config=FILE`
    env = server_env(req, inst)  # type: ignore[arg-type]
    for k in server_secrets.TOKEN_ENV:
        env.pop(k, None)
    if token:
        env["HF_TOKEN_PATH"] = token  # the hub reads the token from the 0600 file: it is in no environment
    staged = req.get("overlay_stage")
    if staged:
        from provision.host.engine import overlay as render
        from provision.host.ops.overlay import start_refusal

        why = start_refusal(staged, prof.get("env"), engine)
        if why:
            return {"ok": False, "error": {"kind": "overlay", "message": why}}
        env.update(render.server_env(staged["root"], env.get("PYTHONPATH"), engine, env.get(engine.overlay_plugins_env)))
    spec = {"argv": argv, "env": env, "cwd": "/", "log": log,
            "pidfile": os.path.join(sroot, f"server-{port}.pid"),
            "exitfile": os.path.join(sroot, f"server-{port}.exit"),
            "reapfile": os.path.join(sroot, f"server-{port}.reaped.json"),
            "tree_grace": float(req.get("tree_grace", 10))}
    # SGLang logs server_args (api_key included) at start-up: the log is for its owner only.
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as fh:
        fh.write(("[provision] starting: " + " ".join(argv) + "\n").encode())
    return {"ok": True, "spec": spec, "port": port, "grace": float(prof.get("grace", 30)), "inst": inst,
            "engine": engine.name, "title": engine.title, "python": python, "argv": argv, "config": cfg, "files": files, "logdir": logdir}


def start_argv(req: dict, inst: dict, python: str, engine) -> list:
    """The server's command line as the start runs it, before the secrets' `--config FILE`: the
    flags rendered on the control side (profile.render_flags), then the drain flag the install has.
    What the start runs and what `launch --check` shows (preflight's `argv`): one function."""
    prof = req["profile"]
    return engine.start_argv(python, prof.get("module"), prof["flags"]) + drain_flags(req, inst, python, engine)


def drain_flags(req: dict, inst: dict, python: str, engine) -> list:
    """`--shutdown-timeout GRACE` for an engine whose SIGTERM aborts requests in flight unless a
    start-time flag says to drain (vLLM), when the install's own parser has the flag (the table
    preflight read and cached) and the profile does not set it: a stop then drains up to the grace."""
    flag = engine.drain_flag
    prof = req["profile"]
    if not flag or flag in (prof.get("args") or {}) or f"--{flag}" in [str(f).split("=")[0] for f in prof["flags"]]:
        return []
    from provision.host.ops import preflight_model

    try:
        table = preflight_model.install_tables(inst["path"], req.get("state_dir") or default_state_dir(),
                                               engine.name, python).get("flags") or {}
    except Exception:  # noqa: BLE001 - an unread parser adds no flag: the release's own default stands
        return []
    return [f"--{flag}", str(max(1, int(float(prof.get("grace", 30)))))] if f"--{flag}" in table else []


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


def old_files(req: dict, port: int, old: dict) -> dict:
    paths = [record.side_file(req, port, s) for s in SIDE_FILES]
    if old.get("unit"):
        paths.append(os.path.join(UNIT_DIR, str(old["unit"])))
    return snapshot_files(paths)


def restore_old_files(snap: dict) -> None:
    """The new start failed before the old server was stopped: it keeps running with the files its
    record describes (its key, its unit: systemd's next Restart= runs what the record says)."""
    changed = put_back_files(snap)
    if any(p.endswith(".service") for p in changed):
        from provision.host.ops.backends.systemctl import systemctl

        systemctl("daemon-reload")  # the old unit text is back: systemd reads it again
