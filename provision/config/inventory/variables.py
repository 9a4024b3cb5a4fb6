"""Ansible's variables mapped onto ours: `ansible_host`, `ansible_user`, `ansible_port`, the key
file, the interpreter, `ansible_become*`, and the ProxyJump / ProxyCommand / UserKnownHostsFile
options of `ansible_ssh_common_args`. Every variable provision does not use is collected in
`Notes` and named once, never silently dropped. Pure."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from provision.config.inventory.model import HOST_KEYS, Inventory, spec_vars
from provision.errors import ConfigError


ANSIBLE_MAP = {"ansible_host": "address", "ansible_ssh_host": "address", "ansible_user": "user",
               "ansible_ssh_user": "user", "ansible_port": "port", "ansible_ssh_port": "port",
               "ansible_ssh_private_key_file": "identity", "ansible_private_key_file": "identity",
               "ansible_python_interpreter": "python", "ansible_become_password_file": "sudo_password_file"}
# Ansible's own variables that only steer Ansible: said once, never mistaken for ours.
_SSH_OPTIONS = {"proxyjump": "jump", "proxycommand": "proxy_command", "userknownhostsfile": "known_hosts"}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


@dataclass
class Notes:
    ansible: set = field(default_factory=set)      # ansible_* variables we do not use
    plain: set = field(default_factory=set)        # other host variables we do not use
    ssh: set = field(default_factory=set)          # ssh options in ansible_ssh_common_args we do not use

    def lines(self) -> list[str]:
        out = []
        if self.ansible:
            out.append("ignored Ansible variables (provision does not use them): " + ", ".join(sorted(self.ansible)))
        if self.plain:
            out.append("host variables provision does not use (not passed anywhere): " + ", ".join(sorted(self.plain)))
        if self.ssh:
            out.append("ssh options in ansible_ssh_common_args provision does not use: " + ", ".join(sorted(self.ssh)))
        return out


def _boolish(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in _TRUE:
        return True
    if str(value).strip().lower() in _FALSE:
        return False
    raise ConfigError(f"{what}: expected true or false, got {value!r}")


def _ssh_args(value: Any, where: str) -> dict:
    """ansible_ssh_common_args / _extra_args -> jump, proxy_command, known_hosts (+ unused option names)."""
    try:
        toks = shlex.split(str(value))
    except ValueError as exc:
        raise ConfigError(f"{where}: ansible_ssh_common_args is not valid shell words ({exc}): {value!r}") from None
    out: dict = {"_unused": []}
    i = 0
    while i < len(toks):
        tok = toks[i]
        opt = None
        if tok == "-o" and i + 1 < len(toks):
            opt, i = toks[i + 1], i + 2
        elif tok.startswith("-o") and len(tok) > 2:
            opt, i = tok[2:], i + 1
        elif tok == "-J" and i + 1 < len(toks):
            out["jump"], i = toks[i + 1], i + 2
            continue
        elif tok.startswith("-J") and len(tok) > 2:
            out["jump"], i = tok[2:], i + 1
            continue
        else:
            out["_unused"].append(tok)
            i += 1
            continue
        key, sep, val = opt.partition("=")
        if not sep:
            key, _, val = opt.partition(" ")
        ours = _SSH_OPTIONS.get(key.strip().lower())
        if ours:
            out[ours] = val.strip()
        else:
            out["_unused"].append(key.strip())
    return out


def _port(value: Any, where: str) -> int:
    try:
        port = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        port = None
    if port is None or not 0 < port < 65536:
        raise ConfigError(f"{where}: ansible_port: expected a port number (1-65535), got {value!r}")
    return port


def ansible_vars(raw: dict, path: str, notes: Notes, who: str = "") -> dict:
    """Ansible's variables for one host or group -> ours. ``who`` names it in errors."""
    where = f"{path}: {who}" if who else path
    out = {}
    for key, value in (raw or {}).items():
        key = str(key)
        if key in ANSIBLE_MAP:
            ours = ANSIBLE_MAP[key]
            out[ours] = _port(value, where) if ours == "port" else (str(value) if value is not None else value)
        elif key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            got = _ssh_args(value, where)
            notes.ssh.update(got.pop("_unused"))
            if "known_hosts" in got:
                got["known_hosts"] = got["known_hosts"].split()[0] if got["known_hosts"].split() else ""
            out.update(got)
        elif key == "ansible_become":
            out["sudo"] = _boolish(value, f"{where}: ansible_become")
        elif key == "ansible_become_user":
            if str(value) != "root":
                raise ConfigError(f"{where}: ansible_become_user {value!r}: provision's remote steps run as root "
                                  f"(sudo to another user is not supported)")
        elif key == "ansible_become_method":
            if str(value) != "sudo":
                raise ConfigError(f"{where}: ansible_become_method {value!r}: provision becomes root with sudo only")
        elif key in ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass", "ansible_password",
                     "ansible_ssh_pass"):
            notes.ansible.add(f"{key} (passwords are read from files only: ansible_become_password_file or "
                              f"--sudo-password-file)")
        elif key.startswith("ansible_"):
            notes.ansible.add(key)
        elif key in HOST_KEYS:
            out[key] = value
        else:
            notes.plain.add(key)
    return spec_vars(out, where)


def with_notes(inv: Inventory, notes: Notes) -> Inventory:
    inv.notes.extend(notes.lines())
    return inv
