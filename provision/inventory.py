"""Inventories: which hosts, how to reach them, and their variables.  Pure.

Two formats:
- ours (top-level keys ``defaults``, ``groups``, ``hosts``), strict: unknown keys are errors;
- Ansible's YAML inventory (``all:`` / ``children:`` / ``hosts:`` / ``vars:``), mapped
  for the connection variables; other ``ansible_*`` variables are ignored, said once.

Every error names the file, the line and what is wrong.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from provision.errors import ConfigError

HOST_KEYS = {
    "address": "hostname or IP to connect to (default: the host's name, through ssh config)",
    "user": "SSH user (default: ssh config, then root)",
    "port": "SSH port (default: ssh config, then 22)",
    "identity": "private key file",
    "jump": "ProxyJump host: [user@]host[:port]",
    "known_hosts": "known_hosts file to check host keys against",
    "python": "interpreter that owns SGLang on the host",
    "sglang_path": "pin the sglang package directory (the one holding srt/)",
    "spec": "patch spec playbook",
    "profile": "launch profile playbook",
    "offline": "host cannot download weights from a hub (true/false)",
    "sudo": "use sudo -n for file writes and process control (default: when user is not root)",
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
        if key not in ("args", "env", "offline", "sudo", "port", "node_rank") and not isinstance(value, str):
            raise _err(path, kline, f"{where}.{key}: expected a string, got {type(value).__name__}")
    return {k: _plain(v) for k, v in mapping.items()}


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


ANSIBLE_MAP = {"ansible_host": "address", "ansible_user": "user", "ansible_port": "port",
               "ansible_ssh_private_key_file": "identity", "ansible_python_interpreter": "python"}
_JUMP_RE = re.compile(r"ProxyJump=(\S+)|-J\s*(\S+)")


def _ansible_vars(raw: dict, path: str, notes: set[str]) -> dict:
    out = {}
    for key, value in (raw or {}).items():
        if key in ANSIBLE_MAP:
            out[ANSIBLE_MAP[key]] = value
        elif key == "ansible_ssh_common_args":
            for tok in shlex.split(str(value)):
                pass
            m = _JUMP_RE.search(str(value))
            if m:
                out["jump"] = m.group(1) or m.group(2)
            m2 = re.search(r"ProxyCommand=.*?ssh .*?-W\s+\S+\s+(\S+)", str(value))
            if m2 and "jump" not in out:
                out["jump"] = m2.group(1).strip("'\"")
        elif str(key).startswith("ansible_"):
            notes.add(str(key))
        elif key in HOST_KEYS:
            out[key] = value
    return out


def parse_ansible(data: dict, path: str) -> Inventory:
    notes: set[str] = set()
    hosts: dict[str, dict] = {}
    groups_of: dict[str, list[str]] = {}
    order: list[str] = []

    def walk(gname: str, group: Any, inherited: dict) -> None:
        if group is None:
            return
        if not isinstance(group, dict):
            line = data.line_of(gname) if isinstance(data, LineDict) else None
            raise _err(path, line, f"group {gname}: expected a mapping with hosts/children/vars")
        gvars = _merge(inherited, _ansible_vars(group.get("vars") or {}, path, notes))
        for hname, hv in (group.get("hosts") or {}).items():
            hname = str(hname)
            if hname not in order:
                order.append(hname)
            hosts[hname] = _merge(hosts.get(hname, {}), gvars, _ansible_vars(hv or {}, path, notes))
            if gname != "all":
                groups_of.setdefault(hname, []).append(gname)
        for cname, child in (group.get("children") or {}).items():
            walk(str(cname), child, gvars)

    for gname, group in data.items():
        walk(str(gname), group, {})
    inv = Inventory(hosts=[Host(n, hosts[n], tuple(groups_of.get(n, []))) for n in order], path=path)
    if notes:
        inv.notes.append("ignored Ansible variables (provision does not use them): " + ", ".join(sorted(notes)))
    if not inv.hosts:
        raise _err(path, None, "no hosts found in the Ansible inventory")
    return inv


def parse_inventory(text: str, path: str = "<inventory>") -> Inventory:
    try:
        loader = _Loader(text)
        loader.name = path
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise _err(path, mark.line + 1 if mark else None,
                   f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict) or not data:
        raise _err(path, None, "expected a mapping (defaults/groups/hosts, or an Ansible inventory with all:)")
    if set(data) <= OUR_TOP and ("hosts" in data or "groups" in data):
        return parse_ours(data, path)
    if "all" in data or any(isinstance(v, dict) and ({"hosts", "children"} & set(v)) for v in data.values()):
        return parse_ansible(data, path)
    return parse_ours(data, path)  # raises with the unknown key and its line


def load_inventory(path: str) -> Inventory:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read inventory ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_inventory(text, path)


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
