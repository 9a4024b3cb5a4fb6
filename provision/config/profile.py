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
from typing import TYPE_CHECKING

from provision.config.keys import check_keys
from provision.errors import ConfigError
from provision.host import inference

if TYPE_CHECKING:
    from provision.host.inference.base import InferenceEngine

PROFILE_KEYS = {"engine", "python", "module", "args", "env", "log_dir", "keep_logs", "health_timeout", "grace",
                "offline", "fix", "container", "requires"}
CONTAINER_KEYS = {"runtime", "image", "name", "gpus", "ipc", "shm_size", "network", "volumes", "run_args"}
RUNTIMES = ("docker", "podman")
_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$")
# `run` options provision sets itself (the name, detaching, the secrets mount) or that would put
# a secret where `inspect` and `ps` show it: not allowed in run_args.
_RUN_ARGS_OURS = ("-d", "--detach", "--name", "--rm", "-e", "--env", "--env-file")
FIXES = ("edit", "overlay")  # how launch gets the EAGLE-3 methods in: edit the file, or an overlay package
SECRET_ARGS = ("api-key", "admin-api-key")
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class Container:
    """`launch.container`: the server runs in a container (`RUNTIME run -d`), not on the host."""

    runtime: str
    image: str
    name: str
    gpus: str | None = None
    ipc: str | None = None
    shm_size: str | None = None
    network: str | None = None
    volumes: tuple[str, ...] = ()
    run_args: tuple[str, ...] = ()

    def to_request(self) -> dict:
        return {"runtime": self.runtime, "image": self.image, "name": self.name, "gpus": self.gpus, "ipc": self.ipc,
                "shm_size": self.shm_size, "network": self.network, "volumes": list(self.volumes),
                "run_args": list(self.run_args)}


def build_container(raw: object, where: str, port: int, engine: str = inference.DEFAULT) -> Container:
    """Validate `launch.container` (pure); `name` defaults to <engine>-<port> (sglang-30000)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping (runtime, image, name, gpus, ipc, shm_size, network, "
                          "volumes, run_args)")
    check_keys(raw, CONTAINER_KEYS, where)
    runtime = raw.get("runtime", "docker")
    if runtime not in RUNTIMES:
        raise ConfigError(f"{where}.runtime: {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    image = raw.get("image")
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise ConfigError(f"{where}.image: expected an image reference like lmsysorg/sglang:v0.5.9-cu129")
    name = raw.get("name", f"{engine}-{port}")
    if not isinstance(name, str) or not _CONTAINER_NAME.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not a container name (letters, digits, _ . -)")

    def word(key: str, pattern: re.Pattern | None = None) -> str | None:
        v = raw.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).strip() \
                or any(c.isspace() for c in str(v)) or (pattern is not None and not pattern.match(str(v))):
            raise ConfigError(f"{where}.{key}: {v!r} is not a valid value")
        return str(v)

    def strings(key: str) -> tuple[str, ...]:
        v = raw.get(key) or []
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise ConfigError(f"{where}.{key}: expected a list of strings")
        return tuple(v)

    volumes = strings("volumes")
    for vol in volumes:
        parts = vol.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/"):
            raise ConfigError(f"{where}.volumes: {vol!r}: expected SRC:DEST or SRC:DEST:OPTIONS "
                              "(DEST an absolute path in the container)")
    run_args = strings("run_args")
    for arg in run_args:
        flag = arg.split("=", 1)[0]
        if flag in _RUN_ARGS_OURS:
            raise ConfigError(f"{where}.run_args: {flag} is set by provision (name, detach) or would show a "
                              "value in `inspect` (environment): use name:, launch.env, or the secret files")
    return Container(runtime=runtime, image=image.strip(), name=name, gpus=word("gpus"), ipc=word("ipc"),
                     shm_size=word("shm_size", _SIZE), network=word("network"), volumes=volumes, run_args=run_args)


@dataclass(frozen=True)
class Profile:
    name: str
    module: str = "sglang.launch_server"
    engine: str = inference.DEFAULT   # the inference engine (host/inference): asked by every verb
    python: str | None = None
    args: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    log_dir: str | None = None
    keep_logs: int = 5
    health_timeout: float = 30.0
    grace: float = 30.0
    fix: str = "edit"
    container: Container | None = None
    requires: tuple = ()   # patch specs (names) that must be in place where they apply: launch preflight checks

    @property
    def port(self) -> int:
        return int(self.args.get("port", 30000))

    @property
    def bind_host(self) -> str:
        return str(self.args.get("host", "127.0.0.1"))

    @property
    def tp(self) -> int:
        return int(self.args.get(inference.get(self.engine).tp_arg, self.args.get("tp", 1)))

    def digest(self) -> str:
        """Identifies the profile as started (secrets excluded: only whether they are set)."""
        body = {"module": self.module, "python": self.python, "args": self.args, "env": sorted(self.env)}
        if self.fix != "edit":  # (the digest of an edit-mode profile is as before)
            body["fix"] = self.fix
        if self.engine != inference.DEFAULT:  # (and of an SGLang one)
            body["engine"] = self.engine
        if self.container is not None:
            body["container"] = self.container.to_request()
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_launch(self) -> dict:
        """The profile as a playbook's `launch:` mapping, host variables and --arg already in it: what
        a server's record keeps, so a restart replays it (`from_record`) on any control machine."""
        return {"engine": self.engine, "module": self.module, "python": self.python, "args": dict(self.args), "env": dict(self.env),
                "log_dir": self.log_dir, "keep_logs": self.keep_logs, "health_timeout": self.health_timeout,
                "grace": self.grace, "fix": self.fix, "requires": list(self.requires),
                "container": self.container.to_request() if self.container is not None else None}


def _norm_args(args: dict, where: str, engine: "InferenceEngine") -> dict:
    out = {}
    for key, value in args.items():
        k = str(key)
        if k.startswith("--"):
            k = k[2:]
        k = k.replace("_", "-")
        if not _FLAG.match(k):
            raise ConfigError(f"{where}: {key!r} is not {engine.article} {engine.title} flag name (like {engine.tp_arg})")
        if k == "config":
            raise ConfigError(f"{where}: `config` is managed by provision (it carries the secrets); remove it")
        if k in SECRET_ARGS and value not in (None, False):
            raise ConfigError(f"{where}: {k} is a secret: don't put it in a playbook or inventory; set "
                              f"PROVISION_{k.upper().replace('-', '_')} or pass --{k}-file")
        if k == "tp":
            k = engine.tp_arg
        out[k] = value
    return out


def build_profile(launch: dict, path: str, name: str, host_vars: dict | None = None,
                  overrides: dict | None = None) -> Profile:
    if not isinstance(launch, dict):
        raise ConfigError(f"{path}: launch: expected a mapping")
    check_keys(launch, PROFILE_KEYS, f"{path}: launch")
    engine = launch.get("engine", inference.DEFAULT)
    why = inference.refusal(engine)
    if why:
        raise ConfigError(f"{path}: launch.engine: {why}")
    eng = inference.get(engine)
    args = launch.get("args") or {}
    env = launch.get("env") or {}
    if not isinstance(args, dict):
        raise ConfigError(f"{path}: launch.args: expected a mapping of {eng.title} flags")
    if not isinstance(env, dict):
        raise ConfigError(f"{path}: launch.env: expected a mapping")
    args = _norm_args(args, f"{path}: launch.args", eng)
    hv = host_vars or {}
    given: dict[str, str] = {}  # a flag -> where its value came from, when not the playbook (errors name it)
    for key in ("args", f"{engine}_args"):  # every engine's, then this engine's own (sglang_args, vllm_args)
        if hv.get(key):
            inv = _norm_args(hv[key], f"inventory {key}", eng)
            args.update(inv)
            given.update(dict.fromkeys(inv, f"the inventory's {key}"))
    if overrides:
        args.update(_norm_args(overrides, "--arg", eng))
        for k, v in overrides.items():  # (under the flag's own name: --arg tp=8 sets tp-size)
            given[next(iter(_norm_args({k: v}, "--arg", eng)))] = f"--arg {k}={v}"
    for k, v in eng.implied_args.items():  # where the engine's own default is not provision's
        args.setdefault(k, v)
    for k, v in {**env, **(hv.get("env") or {})}.items():
        if isinstance(v, (dict, list, bytes)) or v is None:
            raise ConfigError(f"{path}: env.{k}: expected a word or a number (an environment variable's value), "
                              f"got {v!r}")
    env = {str(k): str(v) for k, v in {**env, **(hv.get("env") or {})}.items()}
    for k in env:
        if k.upper() in SECRET_ENV:
            raise ConfigError(f"{path}: env.{k} is a secret: set it in provision's environment "
                              f"(PROVISION_{k.upper()}) instead of a file")
    requires = launch.get("requires") or []
    if not isinstance(requires, list) or not all(isinstance(r, str) and r for r in requires):
        raise ConfigError(f"{path}: launch.requires: expected a list of patch spec names, got {requires!r}")
    if len(set(requires)) != len(requires):
        raise ConfigError(f"{path}: launch.requires: a spec is listed twice: {requires!r}")
    keep = launch.get("keep_logs", 5)
    if not isinstance(keep, int) or keep < 1:
        raise ConfigError(f"{path}: launch.keep_logs: expected a whole number >= 1")
    # Overlay is the default fix for containers: it survives recreating the container and a new tag.
    fix = launch.get("fix", "overlay" if launch.get("container") is not None else "edit")
    if fix not in FIXES:
        raise ConfigError(f"{path}: launch.fix: expected one of {', '.join(FIXES)}, got {fix!r}")
    if fix == "edit" and launch.get("container") is not None:
        raise ConfigError(f"{path}: launch.fix: edit changes files on the host, and this profile's server runs in a "
                          "container: use overlay (the default for containers), or bake the fix into the image "
                          "(`RUN provision patch --local`)")
    for key in ("module", "python", "log_dir"):
        v = launch.get(key)
        if v is not None and not (isinstance(v, str) and v.strip()):
            raise ConfigError(f"{path}: launch.{key}: expected a word (a path or a module name), got {v!r}")
    if launch.get("log_dir") is not None and not str(launch["log_dir"]).startswith("/"):
        raise ConfigError(f"{path}: launch.log_dir: expected an absolute path, got {launch['log_dir']!r} (a relative "
                          "one would be resolved against wherever the host's agent runs)")
    prof = Profile(name=name, engine=engine, module=str(launch.get("module") or eng.launch_module),
                   fix=fix,
                   python=hv.get("python") or launch.get("python"), args=args, env=env,
                   log_dir=launch.get("log_dir"), keep_logs=keep,
                   health_timeout=_seconds(launch, "health_timeout", path), grace=_seconds(launch, "grace", path),
                   requires=tuple(requires))
    if launch.get("container") is not None:
        prof = Profile(**{**prof.__dict__, "container": build_container(launch["container"],
                                                                         f"{path}: launch.container", prof.port,
                                                                         prof.engine)})
    validate(prof, path, given)
    return prof


def _seconds(launch: dict, key: str, path: str, default: float = 30.0) -> float:
    """A profile's duration in seconds: a number above 0, else a sentence naming the key."""
    v = launch.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < 10**7):
        raise ConfigError(f"{path}: launch.{key}: expected a number of seconds above 0, got {v!r}")
    return float(v)


def from_record(launch: dict, name: str, where: str, overrides: dict | None = None) -> Profile:
    """The profile a server's record keeps (`Profile.to_launch`), with this run's --arg over it,
    validated as a playbook's is."""
    launch = {k: v for k, v in launch.items()
              if (v is not None or k not in ("python", "log_dir", "container")) and k != "spec"}  # (the spec: the
    # launch's own, tasks/launch.py recorded_spec)
    return build_profile(launch, where, name, None, overrides)


def validate(p: Profile, path: str = "profile", given: dict | None = None) -> None:
    """Reject, before touching a host, what the profile's engine would reject at start-up (its
    `check_args`), and a port out of range. `given`: the flags this run or the inventory set (flag
    -> where), so the error names where the value came from, not the playbook."""
    for why in inference.get(p.engine).check_args(p.args):
        flag = why.split(" ", 1)[0]
        if given and flag in given:
            raise ConfigError(f"{given[flag]}: {why} (the playbook {path} is not the one to fix)")
        raise ConfigError(f"{path}: {why}")
    port = p.args.get("port", 30000)
    if not isinstance(port, int) or isinstance(port, bool) or port < 0:
        where = (given or {}).get("port") or path
        raise ConfigError(f"{where}: port must be a whole number, got {port!r}")
    if not (0 < p.port < 65536):
        raise ConfigError(f"{path}: port {p.port} out of range")


def render_flags(args: dict) -> list[str]:
    """SGLang flags as argv tokens, as its argparse parser takes them: True is the bare switch,
    False and None leave the flag out, a list is one token per item after its flag (`nargs`
    flags: `--cuda-graph-bs 1 2 4 8`), a mapping one JSON string. Preflight holds each to the
    installed release's own declaration (host/engine/serverargs.py `decide`)."""
    out: list[str] = []
    for k, v in args.items():
        if v is None or v is False:
            continue
        if v is True:
            out.append(f"--{k}")
        elif isinstance(v, dict):
            out += [f"--{k}", json.dumps(v)]
        elif isinstance(v, (list, tuple)):
            out += [f"--{k}", *(json.dumps(x) if isinstance(x, (dict, list)) else str(x) for x in v)]
        else:
            out += [f"--{k}", str(v)]
    return out


def secret_value(raw: bytes, where: str) -> str:
    """A secret read from a file or the environment, validated once: UTF-8 text, one line (a final
    newline dropped), printable, not empty. ConfigError with a sentence naming `where` otherwise: an
    empty key file would start a server with no key at all. Pure."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start} is {raw[exc.start:exc.start + 1]!r}): "
                          "write the key as one line of text") from None
    if text.endswith("\n"):
        text = text[:-2] if text.endswith("\r\n") else text[:-1]
    text = text.strip(" \t")
    if not text:
        raise ConfigError(f"{where}: is empty: a server would start without the key; write the key in it "
                          "(or unset it to start without one)")
    if "\n" in text or "\r" in text:
        raise ConfigError(f"{where}: holds more than one line: a key is one line of text")
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise ConfigError(f"{where}: holds a control character ({bad!r}): a key is printable text")
    return text


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
                with open(os.path.expanduser(fpath), "rb") as fh:
                    raw = fh.read(1 << 16)
            except OSError as exc:
                raise ConfigError(f"{fpath}: cannot read the {flag} secret ({exc.strerror})") from None
            val = secret_value(raw, f"{fpath} (the {flag} secret)")
        elif env.get(var):
            val = secret_value(env[var].encode("utf-8", "surrogateescape"), f"${var}")
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
    from provision.config.playbook import load_patch_spec, load_playbook

    pb = load_playbook(profile or host.get("profile"))
    if pb.launch is None:
        raise ConfigError(f"{pb.path}: has no `launch:` section, so it cannot be used as a launch profile")
    prof = build_profile(pb.launch, pb.path, pb.name, host.vars, dict(overrides or {}))
    for name in prof.requires:  # a required spec that does not load is this profile's error (exit 2)
        try:
            load_patch_spec(name)
        except ConfigError as exc:
            raise ConfigError(f"{pb.path}: launch.requires: {name}: {exc.message}") from None
    if python:
        prof = Profile(**{**prof.__dict__, "python": python})
    return prof, pb.patch
