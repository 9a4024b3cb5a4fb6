"""A server's secrets on the host: the 0600 files it reads them from, what its record says of
them, and how a restart keeps them.  STDLIB ONLY.

``--api-key``/``--admin-api-key`` go into a 0600 ``--config`` file (server-PORT.secrets.yaml),
``HF_TOKEN`` into a 0600 token file (server-PORT.hf_token) the server reads through
``HF_TOKEN_PATH``: never the command line, the environment of a unit, or a spec file. The record
keeps the secrets' names and files, never their values. A restart whose request lacks a secret
the record had reads it back from that file; where the file is gone the restart is refused (the
old server keeps running): a server never comes back without a secret it had.
"""

from __future__ import annotations

import json
import os

from provision.host.lib import atomic
from provision.host.ops.backends import record

TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
CONFIG_HEAD = "# written by provision; holds secrets; readable by its owner only\n"


def control_variable(name: str) -> str:
    """The control machine's variable a secret comes from (`api-key` -> PROVISION_API_KEY)."""
    return "PROVISION_" + name.upper().replace("-", "_") if name not in TOKEN_ENV else name


def render_config(args: dict) -> str:
    """The --config file of the flag secrets (api-key, admin-api-key), for a host server and a
    container's alike: the one renderer (pure)."""
    return CONFIG_HEAD + "".join(f"{k}: {json.dumps(str(v))}\n" for k, v in args.items())


def token_of(secrets: dict) -> str | None:
    """The Hugging Face token among the environment secrets, if one is set (pure)."""
    return next((str(v) for k, v in (secrets.get("env") or {}).items() if k in TOKEN_ENV and v), None)


def parse_config(text: str) -> dict:
    """The secrets of a config file render_config wrote (pure)."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#") or ": " not in line:
            continue
        k, v = line.split(": ", 1)
        try:
            out[k.strip()] = str(json.loads(v))
        except ValueError:
            continue
    return out


def names(secrets: dict) -> dict:
    return {"args": sorted((secrets.get("args") or {})), "env": sorted((secrets.get("env") or {}))}


def described(rec_secrets: dict, files: dict) -> dict:
    """What a record keeps of the secrets: names, and the file the server reads each from."""
    return dict(rec_secrets, files=files)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def keep_for_restart(req: dict, old: dict | None) -> tuple[dict, str | None]:
    """(the secrets the new server gets, a refusal): this run's, and for every secret the old
    record says its server had but this run lacks, the value from the host's 0600 file."""
    secrets = {"args": dict((req.get("secrets") or {}).get("args") or {}),
               "env": dict((req.get("secrets") or {}).get("env") or {})}
    had = (old or {}).get("secrets") or {}
    if not req.get("restart") or not old or old.get("stopped_at") or not had:
        return secrets, None
    files = had.get("files") or {}
    for name in had.get("args") or []:
        if name in secrets["args"]:
            continue
        path = files.get(name) or old.get("config") or ""
        text = _read(path) if path else None
        value = parse_config(text).get(name) if text is not None else None
        if not value:
            return secrets, (f"the running server was started with --{name} (the control machine's "
                             f"{control_variable(name)}), and its 0600 file {path or '(none recorded)'} "
                             f"{'does not hold it' if text is not None else 'is gone'}; set "
                             f"{control_variable(name)} for this run, or stop the server first: the old "
                             "server keeps running")
        secrets["args"][name] = value
    for name in had.get("env") or []:
        if name in secrets["env"]:
            continue
        path = files.get(name) or ""
        value = (_read(path) or "").strip() if path else ""
        if not value:
            return secrets, (f"the running server was started with {name} set, and its 0600 token file "
                             f"{path or '(none recorded)'} is gone; set {name} for this run, or stop the server "
                             "first: the old server keeps running")
        secrets["env"][name] = value
    return secrets, None


def write_host_files(req: dict, port: int, secrets: dict) -> tuple[str | None, str | None, dict]:
    """Write a host server's secret files (0600). Returns (the --config file or None, the token
    file or None, {secret name: file})."""
    cfg = token = None
    files: dict = {}
    os.makedirs(record.state_root(req), mode=0o700, exist_ok=True)
    path = record.side_file(req, port, "secrets.yaml")
    if secrets.get("args"):
        cfg = path
        atomic.write_text(cfg, render_config(secrets["args"]))
        files.update({k: cfg for k in secrets["args"]})
    else:  # a launch without a key replaces one with: the old key's file goes with it
        _unlink(path)
    value = token_of(secrets)
    path = record.side_file(req, port, "hf_token")
    if value:
        token = path
        atomic.write_text(token, str(value))
        files.update({k: token for k in secrets["env"] if k in TOKEN_ENV})
    else:
        _unlink(path)
    return cfg, token, files


def remove_host_files(req: dict, port: int) -> None:
    """A stopped server's secret files go with it: nothing of its keys stays on the host for a
    later launch, restart or bench to find (a restart of a stopped server is a new launch)."""
    import glob

    for name in ("secrets.yaml", "hf_token"):
        path = record.side_file(req, port, name)
        _unlink(path)
        # and a write's temporary file a killed writer left (atomic.py's `.NAME.<random>.tmp`)
        for tmp in glob.glob(os.path.join(glob.escape(os.path.dirname(path)),
                                          "." + glob.escape(os.path.basename(path)) + ".*.tmp")):
            _unlink(tmp)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
