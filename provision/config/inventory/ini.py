"""Ansible's INI inventory format, read without Ansible: `[group]`, `[group:vars]`,
`[group:children]` (deeper groups' variables win, as in Ansible), `host:port`, `key=value`
host variables and host ranges. Pure."""

from __future__ import annotations

import re
import shlex
from typing import Any

from provision.config.inventory.model import Host, Inventory, error_at, merge
from provision.config.inventory.ranges import expand_pattern
from provision.config.inventory.variables import Notes, ansible_vars, with_notes


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
    notes = Notes()
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
                raise error_at(path, n, f"section header {line!r}: expected [group], [group:vars] or [group:children]")
            name = line[1:-1].strip()
            section, _, kind = name.partition(":")
            kind = kind or "hosts"
            if kind not in ("hosts", "vars", "children") or not section:
                raise error_at(path, n, f"section [{name}]: expected [group], [group:vars] or [group:children]")
            direct.setdefault(section, [])
            continue
        try:
            toks = shlex.split(line, comments=True)
        except ValueError as exc:
            raise error_at(path, n, f"cannot split {line!r} into words ({exc})") from None
        if not toks:
            continue
        if kind == "vars":
            key, sep, val = line.partition("=")
            if not sep:
                raise error_at(path, n, f"[{section}:vars]: expected key=value, got {line!r}")
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
                raise error_at(path, n, f"host {hpat}: expected key=value after the host name, got {tok!r}")
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
            raise error_at(path, None, f"[{g}:children]: groups contain each other ({' > '.join(seen + (g,))})")
        return 1 + max((depth(p, seen + (g,)) for p in parent_of.get(g, ()) if p != "all"), default=0)

    def members(g: str, seen=()) -> list[str]:
        if g in seen:
            raise error_at(path, None, f"[{g}:children]: groups contain each other ({' > '.join(seen + (g,))})")
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
    gvars = {g: ansible_vars(v, path, notes, f"group {g}") for g, v in gvars_raw.items()}
    hosts = []
    for name in order:
        layers = [gvars.get("all", {})] + [gvars.get(g, {}) for g in groups_of.get(name, [])]
        layers.append(ansible_vars(host_raw.get(name, {}), f"{path}:{host_line[name]}", notes, f"host {name}"))
        groups = tuple(g for g in groups_of.get(name, []) if g != "ungrouped")
        hosts.append(Host(name=name, vars=merge(*layers), groups=groups))
    if not hosts:
        raise error_at(path, None, "no hosts found in the INI inventory")
    return with_notes(Inventory(hosts=hosts, path=path), notes)
