"""The inventory's values: a Host (name, variables, groups), an Inventory, the host variables
provision knows, how a more specific layer of variables overrides a less specific one, and the
`spec`/`specs`/`gpu_capability` normalisation every format shares. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from provision.errors import ConfigError


HOST_KEYS = {
    "address": "hostname or IP to connect to (default: the host's name, through ssh config)",
    "user": "SSH user (default: ssh config, then root)",
    "port": "SSH port (default: ssh config, then 22)",
    "identity": "private key file",
    "jump": "ProxyJump chain: [user@]host[:port][,...] (each hop opened once per run and shared)",
    "proxy_command": "ProxyCommand, as in ssh_config (%h %p %r %n are expanded)",
    "known_hosts": "known_hosts file to check host keys against",
    "python": "interpreter that owns SGLang on the host",
    "sglang_path": "pin the sglang package directory (the one holding srt/)",
    "spec": "patch spec playbook (short for specs: [NAME])",
    "specs": "patch spec playbooks this host carries, a list (patch/status/unpatch/reconcile act on each)",
    "router": "URL of the router in front of this host's server (sglang-router, vllm-router): stop and restart "
              "take the server out of it first, a restart puts it back once ready",
    "router_worker": "the server's URL as the router reaches it (default http://ADDRESS:PORT)",
    "gpu_capability": "the GPUs' compute capability (\"12.0\"), for specs' applies: where nvidia-smi cannot tell",
    "profile": "launch profile playbook",
    "offline": "host cannot download weights from a hub (true/false)",
    "sudo": "use sudo -n for file writes and process control (default: when user is not root)",
    "sudo_password_file": "file whose first line is this host's sudo password (like --sudo-password-file)",
    "args": "launch profile argument overrides (mapping of the engine's flags: every engine's launches)",
    "sglang_args": "launch argument overrides for SGLang servers only (mapping; over args:)",
    "vllm_args": "launch argument overrides for vLLM servers only (mapping; over args:)",
    "env": "extra environment for the server (mapping)",
    "node_rank": "rank of this host in a multi-node server",
    "server": "name of the multi-node server this host belongs to",
}
OUR_TOP = {"defaults", "groups", "hosts"}
GROUP_KEYS = {"vars", "hosts"}


@dataclass(frozen=True)
class Host:
    name: str
    vars: dict = field(default_factory=dict)
    groups: tuple[str, ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return self.vars.get(key, default)

    def install_path(self, given: str | None = None) -> str | None:
        """The install a command acts on when pinned: `given` (--sglang-path), else the host's
        `sglang_path:` (the inventory key keeps the engine's name: it is the user's)."""
        return given or self.vars.get("sglang_path")


@dataclass
class Inventory:
    hosts: list[Host]
    path: str = ""
    notes: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return [h.name for h in self.hosts]


def error_at(path: str, line: int | None, msg: str) -> ConfigError:
    return ConfigError(f"{path}:{line}: {msg}" if line else f"{path}: {msg}")


def spec_vars(hv: dict, where: str) -> dict:
    """One layer's `spec`/`specs`/`gpu_capability`, normalised: `spec: X` is short for `specs: [X]`
    (both in one place is an error); `specs` is a list of names (an INI value may be "a,b");
    `gpu_capability` is "MAJOR.MINOR". A more specific layer's `specs` replaces a less specific one's."""
    out = dict(hv)
    if "spec" in out and "specs" in out:
        raise ConfigError(f"{where}: give `spec` or `specs`, not both")
    if "spec" in out and out["spec"] is not None:
        out["specs"] = [str(out["spec"])]
    elif "specs" in out:
        raw = out["specs"]
        if isinstance(raw, str):
            raw = [x.strip() for x in raw.strip().strip("[]").split(",") if x.strip().strip("'\"")]
            raw = [x.strip("'\"") for x in raw]
        if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x for x in raw):
            raise ConfigError(f"{where}.specs: expected a non-empty list of spec names, got {hv['specs']!r}")
        if len(set(raw)) != len(raw):
            raise ConfigError(f"{where}.specs: a spec is listed twice: {raw!r}")
        out["specs"] = list(raw)
        out["spec"] = raw[0]
    if out.get("gpu_capability") is not None:
        from provision.config.applies import normalise_capability

        out["gpu_capability"] = normalise_capability(out["gpu_capability"], f"{where}.gpu_capability")
    return out


def host_spec_names(host: Host) -> list:
    """The spec names a host carries (`specs:`, `spec:`), or [None] (the default spec)."""
    return list(host.get("specs") or ([host.get("spec")] if host.get("spec") else [None]))


def merge(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        for k, v in layer.items():
            if k in ("args", "env", "sglang_args", "vllm_args") and isinstance(out.get(k), dict):
                out[k] = {**out[k], **v}
            else:
                out[k] = v
    return out
