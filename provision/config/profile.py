"""Launch profiles: the `launch:` half of a playbook, merged with host overrides.  Pure.

A profile says how to start the server: interpreter, module, SGLang flags (`args`),
environment, log retention. Inventory host variables (`args`, `env`, `python`)
override it. Secrets never live in a profile: they come from the control
machine's environment or a file, and travel to the host on stdin only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field

from provision.config.keys import check_keys
from provision.errors import ConfigError

PROFILE_KEYS = {"python", "module", "args", "env", "log_dir", "keep_logs", "health_timeout", "grace",
                "offline", "fix"}
FIXES = ("edit", "overlay")  # how launch gets the EAGLE-3 methods in: edit the file, or an overlay package
SECRET_ARGS = ("api-key", "admin-api-key")
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Profile:
    name: str
    module: str = "sglang.launch_server"
    python: str | None = None
    args: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    log_dir: str | None = None
    keep_logs: int = 5
    health_timeout: float = 30.0
    grace: float = 30.0
    fix: str = "edit"

    @property
    def port(self) -> int:
        return int(self.args.get("port", 30000))

    @property
    def bind_host(self) -> str:
        return str(self.args.get("host", "127.0.0.1"))

    @property
    def tp(self) -> int:
        return int(self.args.get("tp-size", self.args.get("tp", 1)))

    def digest(self) -> str:
        """Identifies the profile as started (secrets excluded: only whether they are set)."""
        body = {"module": self.module, "python": self.python, "args": self.args, "env": sorted(self.env)}
        if self.fix != "edit":  # (the digest of an edit-mode profile is as before)
            body["fix"] = self.fix
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _norm_args(args: dict, where: str) -> dict:
    out = {}
    for key, value in args.items():
        k = str(key)
        if k.startswith("--"):
            k = k[2:]
        k = k.replace("_", "-")
        if not _FLAG.match(k):
            raise ConfigError(f"{where}: {key!r} is not an SGLang flag name (like tp-size)")
        if k == "config":
            raise ConfigError(f"{where}: `config` is managed by provision (it carries the secrets); remove it")
        if k in SECRET_ARGS and value not in (None, False):
            raise ConfigError(f"{where}: {k} is a secret: don't put it in a playbook or inventory; set "
                              f"PROVISION_{k.upper().replace('-', '_')} or pass --{k}-file")
        if k == "tp":
            k = "tp-size"
        out[k] = value
    return out


def build_profile(launch: dict, path: str, name: str, host_vars: dict | None = None,
                  overrides: dict | None = None) -> Profile:
    if not isinstance(launch, dict):
        raise ConfigError(f"{path}: launch: expected a mapping")
    check_keys(launch, PROFILE_KEYS, f"{path}: launch")
    args = launch.get("args") or {}
    env = launch.get("env") or {}
    if not isinstance(args, dict):
        raise ConfigError(f"{path}: launch.args: expected a mapping of SGLang flags")
    if not isinstance(env, dict):
        raise ConfigError(f"{path}: launch.env: expected a mapping")
    args = _norm_args(args, f"{path}: launch.args")
    hv = host_vars or {}
    if hv.get("args"):
        args.update(_norm_args(hv["args"], "inventory args"))
    if overrides:
        args.update(_norm_args(overrides, "--arg"))
    env = {str(k): str(v) for k, v in {**env, **(hv.get("env") or {})}.items()}
    for k in env:
        if k.upper() in SECRET_ENV:
            raise ConfigError(f"{path}: env.{k} is a secret: set it in provision's environment "
                              f"(PROVISION_{k.upper()}) instead of a file")
    keep = launch.get("keep_logs", 5)
    if not isinstance(keep, int) or keep < 1:
        raise ConfigError(f"{path}: launch.keep_logs: expected a whole number >= 1")
    fix = launch.get("fix", "edit")
    if fix not in FIXES:
        raise ConfigError(f"{path}: launch.fix: expected one of {', '.join(FIXES)}, got {fix!r}")
    prof = Profile(name=name, module=str(launch.get("module") or "sglang.launch_server"), fix=fix,
                   python=hv.get("python") or launch.get("python"), args=args, env=env,
                   log_dir=launch.get("log_dir"), keep_logs=keep,
                   health_timeout=float(launch.get("health_timeout", 30.0)), grace=float(launch.get("grace", 30.0)))
    validate(prof, path)
    return prof


def validate(p: Profile, path: str = "profile") -> None:
    """Reject, before touching a host, what SGLang would reject at start-up."""
    a = p.args
    if "model-path" not in a:
        raise ConfigError(f"{path}: launch.args.model-path is required")
    steps = a.get("speculative-num-steps")
    for k in ("speculative-eagle-topk", "speculative-num-draft-tokens"):
        if a.get(k) is not None and steps is None:
            raise ConfigError(f"{path}: {k} is set without speculative-num-steps; SGLang 0.5.9 fails an assertion "
                              "at start-up. Set all three, or none (auto: 3, 1, 4)")
    alg = a.get("speculative-algorithm")
    if alg is not None and str(alg) not in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"):
        raise ConfigError(f"{path}: speculative-algorithm {alg!r}: expected one of EAGLE, EAGLE3, NEXTN, "
                          "STANDALONE, NGRAM")
    if alg in ("EAGLE", "EAGLE3") and not a.get("speculative-draft-model-path"):
        raise ConfigError(f"{path}: speculative-algorithm {alg} needs speculative-draft-model-path")
    for k in ("tp-size", "port", "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"):
        if k in a and a[k] is not None and (not isinstance(a[k], int) or isinstance(a[k], bool) or a[k] < 0):
            raise ConfigError(f"{path}: {k} must be a whole number, got {a[k]!r}")
    if not (0 < p.port < 65536):
        raise ConfigError(f"{path}: port {p.port} out of range")
    mfs = a.get("mem-fraction-static")
    if mfs is not None and not (isinstance(mfs, (int, float)) and 0 < float(mfs) <= 1):
        raise ConfigError(f"{path}: mem-fraction-static must be in (0, 1], got {mfs!r}")


def render_flags(args: dict) -> list[str]:
    """SGLang flags as argv tokens. Booleans are store_true switches; mappings become JSON strings."""
    out: list[str] = []
    for k, v in args.items():
        if v is None or v is False:
            continue
        if v is True:
            out.append(f"--{k}")
        elif isinstance(v, (dict, list)):
            out += [f"--{k}", json.dumps(v)]
        else:
            out += [f"--{k}", str(v)]
    return out


def secrets_from_env(environ: dict | None = None, files: dict | None = None) -> dict:
    """Secrets from the control machine: PROVISION_API_KEY, PROVISION_ADMIN_API_KEY, HF_TOKEN (or *_FILE)."""
    env = environ if environ is not None else os.environ
    out: dict = {"args": {}, "env": {}}
    for flag in SECRET_ARGS:
        var = "PROVISION_" + flag.upper().replace("-", "_")
        val = None
        fpath = (files or {}).get(flag) or env.get(var + "_FILE")
        if fpath:
            try:
                with open(os.path.expanduser(fpath), encoding="utf-8") as fh:
                    val = fh.read().strip()
            except OSError as exc:
                raise ConfigError(f"{fpath}: cannot read the {flag} secret ({exc.strerror})") from None
        val = val or env.get(var)
        if val:
            out["args"][flag] = val
    for name in SECRET_ENV:
        val = env.get("PROVISION_" + name) or env.get(name)
        if val:
            out["env"][name] = val
    return out


def is_hub_id(path: str) -> bool:
    return not (path.startswith("/") or path.startswith(".") or path.startswith("~")) and path.count("/") == 1


def host_profile(host, profile: str | None = None, overrides: dict | None = None, python: str | None = None):
    """(Profile, the playbook's patch spec or None) for one inventory host: the playbook named by
    `profile` (else the host's `profile:`, else the default), its `launch:` merged with the host's
    variables and `overrides`. ConfigError when the playbook has no `launch:` section."""
    from provision.config.playbook import load_playbook

    pb = load_playbook(profile or host.get("profile"))
    if pb.launch is None:
        raise ConfigError(f"{pb.path}: has no `launch:` section, so it cannot be used as a launch profile")
    prof = build_profile(pb.launch, pb.path, pb.name, host.vars, dict(overrides or {}))
    if python:
        prof = Profile(**{**prof.__dict__, "python": python})
    return prof, pb.patch
