"""Ansible's YAML inventory format (`all:` with `hosts`, `children`, `vars`), read without
Ansible: a child group's variables beat its parent's, host variables beat both. Pure."""

from __future__ import annotations

from typing import Any

from provision.config.inventory.model import Host, Inventory, error_at, merge
from provision.config.inventory.ours import LineDict
from provision.config.inventory.ranges import expand_pattern
from provision.config.inventory.variables import Notes, ansible_vars, with_notes


def parse_ansible(data: dict, path: str) -> Inventory:
    notes = Notes()
    hosts: dict[str, dict] = {}
    groups_of: dict[str, list[str]] = {}
    order: list[str] = []

    def walk(gname: str, group: Any, inherited: dict) -> None:
        if group is None:
            return
        if not isinstance(group, dict):
            line = data.line_of(gname) if isinstance(data, LineDict) else None
            raise error_at(path, line, f"group {gname}: expected a mapping with hosts/children/vars")
        gvars = merge(inherited, ansible_vars(group.get("vars") or {}, path, notes, f"group {gname}"))
        members = group.get("hosts") or {}
        if not isinstance(members, dict):
            raise error_at(path, group.line_of("hosts") if isinstance(group, LineDict) else None,
                       f"group {gname}: hosts: expected a mapping of host names")
        for hpat, hv in members.items():
            if hv is not None and not isinstance(hv, dict):
                raise error_at(path, members.line_of(hpat) if isinstance(members, LineDict) else None,
                           f"host {hpat}: expected a mapping of variables")
            for hname in expand_pattern(str(hpat), path):
                if hname not in order:
                    order.append(hname)
                hosts[hname] = merge(hosts.get(hname, {}), gvars,
                                      ansible_vars(hv or {}, path, notes, f"host {hname}"))
                if gname != "all":
                    groups_of.setdefault(hname, []).append(gname)
        children = group.get("children") or {}
        if not isinstance(children, dict):
            raise error_at(path, None, f"group {gname}: children: expected a mapping of group names")
        for cname, child in children.items():
            walk(str(cname), child, gvars)

    for gname, group in data.items():
        walk(str(gname), group, {})
    inv = Inventory(hosts=[Host(n, hosts[n], tuple(groups_of.get(n, []))) for n in order], path=path)
    if not inv.hosts:
        raise error_at(path, None, "no hosts found in the Ansible inventory")
    return with_notes(inv, notes)
