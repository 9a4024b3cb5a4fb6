"""Inventories: which hosts, how to reach them, and their variables.

``-i SRC`` means what it means to Ansible: a file, a directory, or a comma-separated host
list (``-i gpu01,gpu02,``). Formats:
- ours (top-level keys ``defaults``, ``groups``, ``hosts``), strict: unknown keys are errors;
- anything Ansible reads. Where ``ansible-inventory`` is on PATH it is the authority
  (``ansible-inventory -i SRC --list``: INI, YAML, directories, dynamic plugins). Without
  it we read Ansible's YAML and INI formats ourselves (host ranges ``gpu[01:08]``,
  ``[group:vars]``, ``[group:children]``; directories with group_vars/ and host_vars/).
Ansible variables are mapped onto ours (connection, interpreter, become); the rest are
named once in a note, never silently dropped.

Parsing is pure (text in, Inventory out); every error names the file, the line or the
host, and the value.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import re
import shlex
import shutil
import string
import subprocess
from dataclasses import dataclass, field
from typing import Any

import yaml

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
    "gpu_capability": "the GPUs' compute capability (\"12.0\"), for specs' applies: where nvidia-smi cannot tell",
    "profile": "launch profile playbook",
    "offline": "host cannot download weights from a hub (true/false)",
    "sudo": "use sudo -n for file writes and process control (default: when user is not root)",
    "sudo_password_file": "file whose first line is this host's sudo password (like --sudo-password-file)",
    "args": "launch profile argument overrides (mapping of SGLang flags)",
    "env": "extra environment for the server (mapping)",
    "node_rank": "rank of this host in a multi-node server",
    "server": "name of the multi-node server this host belongs to",
}
OUR_TOP = {"defaults", "groups", "hosts"}
GROUP_KEYS = {"vars", "hosts"}


class LineDict(dict):
    """A mapping that remembers the line of each key (1-based)."""

    lines: dict

    def line_of(self, key: Any) -> int | None:
        return getattr(self, "lines", {}).get(key)


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise ConfigError(f"{loader.name}:{key_node.start_mark.line + 1}: duplicate key {key!r}")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    out.start_line = node.start_mark.line + 1  # type: ignore[attr-defined]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True)
class Host:
    name: str
    vars: dict = field(default_factory=dict)
    groups: tuple[str, ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return self.vars.get(key, default)


@dataclass
class Inventory:
    hosts: list[Host]
    path: str = ""
    notes: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return [h.name for h in self.hosts]


def _err(path: str, line: int | None, msg: str) -> ConfigError:
    return ConfigError(f"{path}:{line}: {msg}" if line else f"{path}: {msg}")


def _check_vars(path: str, mapping: Any, where: str, line: int | None) -> dict:
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise _err(path, line, f"{where}: expected a mapping of host variables")
    for key, value in mapping.items():
        kline = mapping.line_of(key) if isinstance(mapping, LineDict) else line
        if key not in HOST_KEYS:
            raise _err(path, kline, f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(HOST_KEYS))}")
        if key == "port" and not (isinstance(value, int) and 0 < value < 65536):
            raise _err(path, kline, f"{where}.port: expected a port number, got {value!r}")
        if key in ("args", "env") and not isinstance(value, dict):
            raise _err(path, kline, f"{where}.{key}: expected a mapping")
        if key in ("offline", "sudo") and not isinstance(value, bool):
            raise _err(path, kline, f"{where}.{key}: expected true or false, got {value!r}")
        if key not in ("args", "env", "offline", "sudo", "port", "node_rank", "specs", "gpu_capability") \
                and not isinstance(value, str):
            raise _err(path, kline, f"{where}.{key}: expected a string, got {type(value).__name__}")
    out = {k: _plain(v) for k, v in mapping.items()}
    try:
        return spec_vars(out, where)
    except ConfigError as exc:
        key = "specs" if "specs" in mapping else "gpu_capability"
        at = mapping.line_of(key) if isinstance(mapping, LineDict) else None
        raise _err(path, at or line, exc.message) from None


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


def host_spec_names(host: "Host") -> list:
    """The spec names a host carries (`specs:`, `spec:`), or [None] (the default spec)."""
    return list(host.get("specs") or ([host.get("spec")] if host.get("spec") else [None]))


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _merge(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        for k, v in layer.items():
            if k in ("args", "env") and isinstance(out.get(k), dict):
                out[k] = {**out[k], **v}
            else:
                out[k] = v
    return out


def parse_ours(data: LineDict, path: str) -> Inventory:
    for key in data:
        if key not in OUR_TOP:
            raise _err(path, data.line_of(key), f"unknown top-level key {key!r}; expected defaults, groups, hosts")
    defaults = _check_vars(path, data.get("defaults"), "defaults", data.line_of("defaults"))
    hosts_raw = data.get("hosts") or LineDict()
    if not isinstance(hosts_raw, dict):
        raise _err(path, data.line_of("hosts"), "hosts: expected a mapping of host name to variables")
    host_vars: dict[str, dict] = {}
    order: list[str] = []
    for name, hv in hosts_raw.items():
        host_vars[str(name)] = _check_vars(path, hv, f"hosts.{name}", hosts_raw.line_of(name))
        order.append(str(name))
    groups_raw = data.get("groups") or LineDict()
    if not isinstance(groups_raw, dict):
        raise _err(path, data.line_of("groups"), "groups: expected a mapping of group name to {vars, hosts}")
    membership: dict[str, list[str]] = {}
    group_vars: dict[str, dict] = {}
    for gname, g in groups_raw.items():
        gline = groups_raw.line_of(gname)
        if not isinstance(g, dict):
            raise _err(path, gline, f"groups.{gname}: expected a mapping with vars and hosts")
        for key in g:
            if key not in GROUP_KEYS:
                raise _err(path, g.line_of(key), f"groups.{gname}: unknown key {key!r}; expected vars, hosts")
        group_vars[gname] = _check_vars(path, g.get("vars"), f"groups.{gname}.vars", g.line_of("vars"))
        members = g.get("hosts") or []
        if isinstance(members, dict):
            for hname, hv in members.items():
                hv = _check_vars(path, hv, f"groups.{gname}.hosts.{hname}", members.line_of(hname))
                host_vars[str(hname)] = _merge(host_vars.get(str(hname), {}), hv)
                if str(hname) not in order:
                    order.append(str(hname))
            members = list(members)
        elif not isinstance(members, list):
            raise _err(path, g.line_of("hosts"), f"groups.{gname}.hosts: expected a list or mapping of hosts")
        for hname in members:
            membership.setdefault(str(hname), []).append(str(gname))
            if str(hname) not in order:
                order.append(str(hname))
                host_vars.setdefault(str(hname), {})
    hosts = []
    for name in order:
        layers = [defaults] + [group_vars[g] for g in membership.get(name, [])] + [host_vars.get(name, {})]
        hosts.append(Host(name=name, vars=_merge(*layers), groups=tuple(membership.get(name, []))))
    if not hosts:
        raise _err(path, None, "no hosts defined")
    return Inventory(hosts=hosts, path=path)


ANSIBLE_MAP = {"ansible_host": "address", "ansible_ssh_host": "address", "ansible_user": "user",
               "ansible_ssh_user": "user", "ansible_port": "port", "ansible_ssh_port": "port",
               "ansible_ssh_private_key_file": "identity", "ansible_private_key_file": "identity",
               "ansible_python_interpreter": "python", "ansible_become_password_file": "sudo_password_file"}
# Ansible's own variables that only steer Ansible: said once, never mistaken for ours.
_SSH_OPTIONS = {"proxyjump": "jump", "proxycommand": "proxy_command", "userknownhostsfile": "known_hosts"}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


@dataclass
class _Notes:
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


def _ansible_vars(raw: dict, path: str, notes: "_Notes", who: str = "") -> dict:
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


def _finish(inv: Inventory, notes: "_Notes") -> Inventory:
    inv.notes.extend(notes.lines())
    return inv


def parse_ansible(data: dict, path: str) -> Inventory:
    notes = _Notes()
    hosts: dict[str, dict] = {}
    groups_of: dict[str, list[str]] = {}
    order: list[str] = []

    def walk(gname: str, group: Any, inherited: dict) -> None:
        if group is None:
            return
        if not isinstance(group, dict):
            line = data.line_of(gname) if isinstance(data, LineDict) else None
            raise _err(path, line, f"group {gname}: expected a mapping with hosts/children/vars")
        gvars = _merge(inherited, _ansible_vars(group.get("vars") or {}, path, notes, f"group {gname}"))
        members = group.get("hosts") or {}
        if not isinstance(members, dict):
            raise _err(path, group.line_of("hosts") if isinstance(group, LineDict) else None,
                       f"group {gname}: hosts: expected a mapping of host names")
        for hpat, hv in members.items():
            if hv is not None and not isinstance(hv, dict):
                raise _err(path, members.line_of(hpat) if isinstance(members, LineDict) else None,
                           f"host {hpat}: expected a mapping of variables")
            for hname in expand_pattern(str(hpat), path):
                if hname not in order:
                    order.append(hname)
                hosts[hname] = _merge(hosts.get(hname, {}), gvars,
                                      _ansible_vars(hv or {}, path, notes, f"host {hname}"))
                if gname != "all":
                    groups_of.setdefault(hname, []).append(gname)
        children = group.get("children") or {}
        if not isinstance(children, dict):
            raise _err(path, None, f"group {gname}: children: expected a mapping of group names")
        for cname, child in children.items():
            walk(str(cname), child, gvars)

    for gname, group in data.items():
        walk(str(gname), group, {})
    inv = Inventory(hosts=[Host(n, hosts[n], tuple(groups_of.get(n, []))) for n in order], path=path)
    if not inv.hosts:
        raise _err(path, None, "no hosts found in the Ansible inventory")
    return _finish(inv, notes)


# --------------------------------------------------------------------------- Ansible INI, ranges

_RANGE = re.compile(r"\[([^\]:]+):([^\]:]+)(?::([^\]]+))?\]")


def expand_pattern(pattern: str, path: str = "<inventory>") -> list[str]:
    """Ansible host ranges: ``gpu[01:08]`` (zero padding kept), ``node-[a:c]``, ``[1:9:2]`` (a step). Pure."""
    parts = _RANGE.split(pattern)
    if len(parts) == 1:
        return [pattern]
    pieces: list[list[str]] = []
    for i in range(0, len(parts), 4):
        pieces.append([parts[i]])
        if i + 1 >= len(parts):
            break
        start, end, step = parts[i + 1], parts[i + 2], parts[i + 3]
        try:
            inc = int(step) if step else 1
        except ValueError:
            raise ConfigError(f"{path}: host range {pattern!r}: the step {step!r} is not a number") from None
        if inc < 1:
            raise ConfigError(f"{path}: host range {pattern!r}: the step must be at least 1")
        if start.isdigit() and end.isdigit():
            width = len(start) if start.startswith("0") and len(start) > 1 else 0
            lo, hi = int(start), int(end)
            values = [str(n).zfill(width) for n in range(lo, hi + 1, inc)]
        elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
            letters = string.ascii_letters
            lo, hi = letters.index(start), letters.index(end)
            values = list(letters[lo:hi + 1:inc])
        else:
            raise ConfigError(f"{path}: host range {pattern!r}: expected [01:08] or [a:c], got [{start}:{end}]")
        if not values:
            raise ConfigError(f"{path}: host range {pattern!r}: the range is empty (start after end)")
        pieces.append(values)
    return ["".join(combo) for combo in itertools.product(*pieces)]


def _ini_value(text: str) -> Any:
    """A value in an INI inventory, as Ansible reads it: numbers and booleans, else the string."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    return text


def parse_ini(text: str, path: str = "<inventory>") -> Inventory:
    """Ansible's INI inventory format. Pure."""
    notes = _Notes()
    order: list[str] = []
    host_raw: dict[str, dict] = {}
    host_line: dict[str, int] = {}
    direct: dict[str, list[str]] = {"all": [], "ungrouped": []}
    children: dict[str, list[str]] = {}
    gvars_raw: dict[str, dict] = {}
    section, kind = "ungrouped", "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise _err(path, n, f"section header {line!r}: expected [group], [group:vars] or [group:children]")
            name = line[1:-1].strip()
            section, _, kind = name.partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children") or not section:
                raise _err(path, n, f"section [{name}]: expected [group], [group:vars] or [group:children]")
            direct.setdefault(section, [])
            continue
        try:
            toks = shlex.split(line, comments=True)
        except ValueError as exc:
            raise _err(path, n, f"cannot split {line!r} into words ({exc})") from None
        if not toks:
            continue
        if kind == "vars":
            key, sep, val = line.partition("=")
            if not sep:
                raise _err(path, n, f"[{section}:vars]: expected key=value, got {line!r}")
            val = val.strip()
            if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
                val = val[1:-1]
            gvars_raw.setdefault(section, {})[key.strip()] = val
            continue
        if kind == "children":
            children.setdefault(section, []).append(toks[0])
            direct.setdefault(toks[0], [])
            continue
        hpat, hv = toks[0], {}
        for tok in toks[1:]:
            key, sep, val = tok.partition("=")
            if not sep:
                raise _err(path, n, f"host {hpat}: expected key=value after the host name, got {tok!r}")
            hv[key] = _ini_value(val)
        m = re.fullmatch(r"(.+?):(\d+)", hpat)
        if m and "[" not in hpat[m.end(1):]:
            hpat, hv = m.group(1), {"ansible_port": int(m.group(2)), **hv}
        for hname in expand_pattern(hpat, f"{path}:{n}"):
            if hname not in order:
                order.append(hname)
                host_line[hname] = n
            host_raw[hname] = {**host_raw.get(hname, {}), **hv}
            direct.setdefault(section, [])
            if hname not in direct[section]:
                direct[section].append(hname)
    # group depth (all 0, its children 1, ...) decides which group's vars win, as in Ansible
    parent_of: dict[str, set] = {}
    for parent, kids in children.items():
        for k in kids:
            parent_of.setdefault(k, set()).add(parent)

    def depth(g: str, seen=()) -> int:
        if g == "all":
            return 0
        if g in seen:
            raise _err(path, None, f"[{g}:children]: groups contain each other ({' > '.join(seen + (g,))})")
        return 1 + max((depth(p, seen + (g,)) for p in parent_of.get(g, ()) if p != "all"), default=0)

    def members(g: str, seen=()) -> list[str]:
        if g in seen:
            raise _err(path, None, f"[{g}:children]: groups contain each other ({' > '.join(seen + (g,))})")
        out = list(direct.get(g, []))
        for k in children.get(g, []):
            out += [h for h in members(k, seen + (g,)) if h not in out]
        return out

    groups_of: dict[str, list[str]] = {}
    for g in sorted(direct, key=lambda x: (depth(x), x)):
        if g in ("all",):
            continue
        for h in members(g):
            groups_of.setdefault(h, []).append(g)
    gvars = {g: _ansible_vars(v, path, notes, f"group {g}") for g, v in gvars_raw.items()}
    hosts = []
    for name in order:
        layers = [gvars.get("all", {})] + [gvars.get(g, {}) for g in groups_of.get(name, [])]
        layers.append(_ansible_vars(host_raw.get(name, {}), f"{path}:{host_line[name]}", notes, f"host {name}"))
        groups = tuple(g for g in groups_of.get(name, []) if g != "ungrouped")
        hosts.append(Host(name=name, vars=_merge(*layers), groups=groups))
    if not hosts:
        raise _err(path, None, "no hosts found in the INI inventory")
    return _finish(Inventory(hosts=hosts, path=path), notes)


def parse_inventory(text: str, path: str = "<inventory>", *, ini_fallback: bool = False) -> Inventory:
    """Our YAML, Ansible's YAML, or (by name, or when ``ini_fallback`` and the text is not a
    YAML mapping) Ansible's INI."""
    if path.endswith(".ini"):
        return parse_ini(text, path)
    try:
        loader = _Loader(text)
        loader.name = path
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        if ini_fallback:
            return parse_ini(text, path)
        mark = getattr(exc, "problem_mark", None)
        raise _err(path, mark.line + 1 if mark else None,
                   f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if ini_fallback and not isinstance(data, dict):
        return parse_ini(text, path)
    if not isinstance(data, dict) or not data:
        raise _err(path, None, "expected a mapping (defaults/groups/hosts, or an Ansible inventory with all:)")
    if set(data) <= OUR_TOP and ("hosts" in data or "groups" in data):
        return parse_ours(data, path)
    if "all" in data or any(isinstance(v, dict) and ({"hosts", "children"} & set(v)) for v in data.values()):
        return parse_ansible(data, path)
    if ini_fallback:
        return parse_ini(text, path)
    return parse_ours(data, path)  # raises with the unknown key and its line


def is_ours(text: str) -> bool:
    """Whether a file is in our own format (Ansible's tools would not read it)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and bool(data) and set(map(str, data)) <= OUR_TOP and (
        "hosts" in data or "groups" in data or "defaults" in data)


def host_list(src: str) -> Inventory:
    """``-i gpu01,gpu02,``: the comma-separated host list of Ansible."""
    names = [n.strip() for n in src.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"-i {src!r}: an empty host list")
    hosts = []
    for n in names:
        for name in expand_pattern(n, "-i"):
            hosts.append(Host(name=name))
    return Inventory(hosts=hosts, path=f"-i {src}")


def from_ansible_json(doc: dict, src: str) -> Inventory:
    """``ansible-inventory --list`` output -> Inventory (host vars already merged by Ansible). Pure."""
    notes = _Notes()
    meta = (doc.get("_meta") or {}).get("hostvars") or {}
    order: list[str] = []
    groups_of: dict[str, list[str]] = {}

    def walk(g: str, trail: tuple = ()) -> list[str]:
        if g in trail:
            return []
        node = doc.get(g) or {}
        out = []
        for h in node.get("hosts") or []:
            if h not in order:
                order.append(h)
            out.append(h)
        for c in node.get("children") or []:
            out += walk(c, trail + (g,))
        if g not in ("all", "ungrouped"):
            for h in dict.fromkeys(out):
                if g not in groups_of.setdefault(h, []):
                    groups_of[h].append(g)
        return out

    walk("all")
    for h in meta:
        if h not in order:
            order.append(h)
    hosts = [Host(h, _ansible_vars(meta.get(h) or {}, src, notes, f"host {h}"), tuple(groups_of.get(h, [])))
             for h in order]
    if not hosts:
        raise ConfigError(f"{src}: ansible-inventory found no hosts in it")
    return _finish(Inventory(hosts=hosts, path=src), notes)


def ansible_inventory(src: str, exe: str) -> Inventory:
    """Ask Ansible itself: ``ansible-inventory -i SRC --list`` (once per content: ansible_cache)."""
    from provision.config.ansible_cache import listing

    return from_ansible_json(listing(src, exe, lambda: _ask_ansible(src, exe)), src)


def _ask_ansible(src: str, exe: str) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="provision-ansible-") as tmp:
        env = dict(os.environ, ANSIBLE_INVENTORY_UNPARSED_FAILED="1", ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1",
                   ANSIBLE_LOCAL_TEMP=tmp, ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0")
        try:
            proc = subprocess.run([exe, "-i", src, "--list"], capture_output=True, text=True, timeout=120, env=env,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"{src}: ansible-inventory did not run ({exc})") from None
    if proc.returncode != 0:
        why = " | ".join(ln.strip() for ln in proc.stderr.splitlines()
                         if ln.strip() and "WARNING" not in ln[:12])[:600]
        raise ConfigError(f"{src}: ansible-inventory cannot read it: {why or f'exit {proc.returncode}'}")
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise ConfigError(f"{src}: ansible-inventory printed no JSON") from None
    return doc


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read inventory ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None


_SKIP = (".retry", ".pyc", ".swp", "~", ".orig", ".bak", ".md", ".cfg")


def _directory(path: str) -> Inventory:
    """An inventory directory without Ansible: every file in it, plus group_vars/ and host_vars/."""
    parts = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith(".") or name.endswith(_SKIP) or not os.path.isfile(full):
            continue
        parts.append(parse_inventory(_read(full), full, ini_fallback=True))
    if not parts:
        raise ConfigError(f"{path}: an inventory directory with no inventory files in it")
    by_name: dict[str, Host] = {}
    notes: list[str] = []
    for inv in parts:
        notes += [n for n in inv.notes if n not in notes]
        for h in inv.hosts:
            old = by_name.get(h.name)
            by_name[h.name] = h if old is None else Host(h.name, _merge(old.vars, h.vars),
                                                        tuple(dict.fromkeys(old.groups + h.groups)))
    extra = _Notes()
    hosts = []
    for h in by_name.values():
        layers = [h.vars]
        for g in ("all",) + h.groups:
            layers.insert(-1, _vars_file(os.path.join(path, "group_vars", g), extra, f"group {g}"))
        layers.append(_vars_file(os.path.join(path, "host_vars", h.name), extra, f"host {h.name}"))
        hosts.append(Host(h.name, _merge(*layers), h.groups))
    return Inventory(hosts=hosts, path=path, notes=notes + [n for n in extra.lines() if n not in notes])


def _vars_file(base: str, notes: "_Notes", who: str) -> dict:
    for cand in (base, base + ".yml", base + ".yaml"):
        if os.path.isfile(cand):
            try:
                data = yaml.safe_load(_read(cand)) or {}
            except yaml.YAMLError as exc:
                raise ConfigError(f"{cand}: not valid YAML ({exc})") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{cand}: expected a mapping of variables")
            return _ansible_vars(data, cand, notes, who)
    return {}


def load_inventory(src: str, *, use_ansible: bool | None = None) -> Inventory:
    """Read ``-i SRC``: a host list, our YAML, or anything Ansible reads (through
    ansible-inventory when it is on PATH, else our YAML/INI/directory readers)."""
    if "," in src and not os.path.exists(src):
        return host_list(src)
    if not os.path.exists(src):
        raise ConfigError(f"-i {src}: no such inventory file or directory (a host list needs a comma: -i {src},)")
    text = None
    if os.path.isfile(src):
        with open(src, "rb") as fh:
            head = fh.read(4096)
        if b"PRIVATE KEY-----" in head:
            raise ConfigError(f"-i {src}: this is a private key, and -i means an inventory (as in Ansible); "
                              f"use --private-key {src}")
        text = _read(src)
        if is_ours(text):
            return parse_inventory(text, src)
        if src.endswith((".yaml", ".yml", ".json")):
            try:
                yaml.safe_load(text)
            except yaml.YAMLError:
                return parse_inventory(text, src)  # raises, naming the line (as Ansible would fail too)
    exe = shutil.which("ansible-inventory") if use_ansible is not False else None
    if exe:
        return ansible_inventory(src, exe)
    if text is None:
        return _directory(src)
    return parse_inventory(text, src, ini_fallback=not src.endswith((".yaml", ".yml", ".json")))


def existing_names(inv: Inventory, hosts: list | None = None, limit: int = 60) -> str:
    """The inventory's host names (and groups), up to a screenful."""
    names = [h.name for h in (inv.hosts if hosts is None else hosts)]
    text = ", ".join(names[:limit]) + (f", ... and {len(names) - limit} more" if len(names) > limit else "")
    groups = sorted({g for h in inv.hosts for g in h.groups})
    if groups:
        text += "; groups: " + ", ".join(groups[:20]) + (" ..." if len(groups) > 20 else "")
    return text


def select(inv: Inventory, limit: str | None) -> list[Host]:
    """Ansible-style --limit: comma/colon separated host names, group names or globs; `!x` excludes."""
    if not limit:
        return list(inv.hosts)
    include, exclude = [], []
    for part in re.split(r"[,:]", limit):
        part = part.strip()
        if not part:
            continue
        (exclude if part.startswith("!") else include).append(part.lstrip("!"))

    def match(h: Host, pat: str) -> bool:
        return fnmatch.fnmatchcase(h.name, pat) or any(fnmatch.fnmatchcase(g, pat) for g in h.groups) or \
            fnmatch.fnmatchcase(str(h.vars.get("address", "")), pat)

    chosen = [h for h in inv.hosts if (not include or any(match(h, p) for p in include))]
    return [h for h in chosen if not any(match(h, p) for p in exclude)]


def adhoc(hosts: list[str], common: dict | None = None) -> Inventory:
    """An inventory from --host flags."""
    return Inventory(hosts=[Host(name=h, vars=dict(common or {})) for h in hosts], path="--host")
