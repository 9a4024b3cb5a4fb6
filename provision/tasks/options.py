"""The options of `launch`, `wait`, `stop`, `logs` and server `status`, and what they resolve to for
one host: its profile and spec (`resolve`), and the request the host's ops read (`server_request`).

Configuration only: what one launch run got to, per host, is `tasks.interrupt.RunState`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from provision.config.inventory import Host
from provision.config.profile import Profile, host_profile
from provision.errors import ConfigError

if TYPE_CHECKING:
    from provision.tasks.multinode import MultiNode


@dataclass
class LaunchOptions:
    profile: str | None = None
    overrides: dict = field(default_factory=dict)
    patch: bool = False
    force: bool = False
    restart: bool = False       # replace the running server: its record is replayed (tasks/launch.py)
    deadline: float = 3600.0
    poll: float = 2.0
    smoke: bool = False
    persistent: bool = False
    health_url: str | None = None
    secrets: dict = field(default_factory=lambda: {"args": {}, "env": {}})
    error_cap: int = 5
    ready_checks: int = 2
    install_path: str | None = None
    python: str | None = None
    image: str | None = None    # a container server's image over the recorded one (upgrade --image)
    no_pull: bool = False       # preflight pulls no image (upgrade --check)
    max_outage: float = 300.0   # seconds of consecutive connection failures before a follow gives up
    tree_grace: float = 10.0    # the watcher: seconds a dead server's remaining processes get before SIGKILL
    stop_on_interrupt: bool = False
    overlay: bool = False       # launch --overlay (or the profile's `fix: overlay`): no file is edited
    overlay_hosts: set = field(default_factory=set)  # these hosts only (reconcile --restart: overlay-mode hosts),
    overlay_spec: object = None                      # with this spec (None: the host's `spec:`)
    gpu_capability: str | None = None   # for required specs' `applies:` (tasks/specs.py)
    router: str | None = None   # --router: the router in front of every selected host (over `router:`)
    secret_files: tuple = ()    # the secrets given as --*-file (an engine without that flag refuses them)
    check: bool = False         # launch --check: each host's plan (its argv, what it stops), nothing started


def resolve(host: Host, opts: LaunchOptions, multinode: "MultiNode | None" = None):
    overrides = dict(opts.overrides)
    prof, spec = host_profile(host, opts.profile, overrides, opts.python)
    placed = multinode.args_for(host, prof.engine) if multinode is not None else {}
    if placed:  # a rank of a multi-node server: its engine's own flags say where the ranks meet
        prof, spec = host_profile(host, opts.profile, {**overrides, **placed}, opts.python)
    _check_secrets(host, prof, opts)
    if opts.router or host.get("router"):  # a router named wrong is exit 2 before any host is touched
        from provision.tasks.routing import router_url

        router_url(opts.router or host.get("router"), "--router" if opts.router else f"host {host.name}")
    if (opts.overlay or host.name in opts.overlay_hosts) and prof.fix != "overlay":
        from dataclasses import replace

        prof = replace(prof, fix="overlay")
    if host.name in opts.overlay_hosts:
        from provision.config.playbook import load_patch_spec

        spec = opts.overlay_spec or load_patch_spec(host.get("spec"))
    if prof.fix == "overlay" and opts.patch:
        raise ConfigError(f"{prof.name}: --patch edits SGLang's file, overlay mode (--overlay or the profile's "
                          "`fix: overlay`) leaves it untouched: choose one")
    return prof, spec


def _check_secrets(host: Host, prof: Profile, opts: LaunchOptions) -> None:
    """A secret file given for a flag the host's engine does not take is exit 2 before any host is
    touched (vLLM has no --admin-api-key: its server would die on it after the old one was stopped)."""
    from provision.host import inference

    engine = inference.get(prof.engine)
    for flag in opts.secret_files:
        if flag not in engine.secret_flags:
            raise ConfigError(f"--{flag}-file: {engine.title} has no --{flag} (host {host.name}, playbook "
                              f"{prof.name}); it takes {', '.join('--' + f for f in engine.secret_flags)}: nothing "
                              "was started or stopped")


def engine_secrets(secrets: dict, engine: str) -> dict:
    """The run's secrets a server of `engine` takes: a flag secret it has no flag for (the environment's
    PROVISION_ADMIN_API_KEY on a vLLM host) is left out, never passed to its parser. Pure."""
    from provision.host import inference

    flags = inference.get(engine).secret_flags
    return {"args": {k: v for k, v in (secrets.get("args") or {}).items() if k in flags},
            "env": dict(secrets.get("env") or {})}


def uses_overlay(prof: Profile, opts: LaunchOptions) -> bool:
    """launch --overlay, or the profile's `fix: overlay` (resolve() folds the flag into the profile)."""
    return prof.fix == "overlay"


def overlay_package(rec: dict | None) -> str | None:
    """The overlay package a started server runs with (its record says), or None."""
    return ((rec or {}).get("overlay") or {}).get("package")


def secret_values(secrets: dict) -> list[str]:
    return [str(v) for part in ("args", "env") for v in (secrets.get(part) or {}).values() if v]


def server_request(op: str, host: Host, prof: Profile, opts: LaunchOptions, **kw) -> dict:
    from provision.config.profile import render_flags

    req = {"op": op, "port": prof.port, "profile": {"args": prof.args, "flags": render_flags(prof.args),
                                                      "env": prof.env, "module": prof.module,
                                                      "engine": prof.engine,
                                                      "python": prof.python, "keep_logs": prof.keep_logs,
                                                      "grace": prof.grace,
                                                      "container": prof.container.to_request() if prof.container
                                                      else None},
           "profile_digest": prof.digest(), "profile_name": prof.name, "offline": bool(host.get("offline")),
           "install_path": host.install_path(opts.install_path), "python": opts.python or host.get("python"),
           "log_dir": prof.log_dir, "health_timeout": prof.health_timeout, "grace": prof.grace}
    req.update(kw)
    return req
