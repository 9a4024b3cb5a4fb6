"""An inventory directory read without Ansible: every inventory file in it, merged, plus
`group_vars/` and `host_vars/` (files named for the group or host, `.yml`/`.yaml` or none)."""

from __future__ import annotations

import os

import yaml

from provision.config.bounded import load_yaml

from provision.config.inventory.formats import parse_inventory, read_text
from provision.config.inventory.model import Host, Inventory, merge
from provision.config.inventory.variables import Notes, ansible_vars
from provision.errors import ConfigError


_SKIP = (".retry", ".pyc", ".swp", "~", ".orig", ".bak", ".md", ".cfg")


def read_directory(path: str) -> Inventory:
    """An inventory directory without Ansible: every file in it, plus group_vars/ and host_vars/."""
    parts = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith(".") or name.endswith(_SKIP) or not os.path.isfile(full):
            continue
        parts.append(parse_inventory(read_text(full), full, ini_fallback=True))
    if not parts:
        raise ConfigError(f"{path}: an inventory directory with no inventory files in it")
    by_name: dict[str, Host] = {}
    notes: list[str] = []
    for inv in parts:
        notes += [n for n in inv.notes if n not in notes]
        for h in inv.hosts:
            old = by_name.get(h.name)
            by_name[h.name] = h if old is None else Host(h.name, merge(old.vars, h.vars),
                                                        tuple(dict.fromkeys(old.groups + h.groups)))
    extra = Notes()
    hosts = []
    for h in by_name.values():
        layers = [h.vars]
        for g in ("all",) + h.groups:
            layers.insert(-1, _vars_file(os.path.join(path, "group_vars", g), extra, f"group {g}"))
        layers.append(_vars_file(os.path.join(path, "host_vars", h.name), extra, f"host {h.name}"))
        hosts.append(Host(h.name, merge(*layers), h.groups))
    return Inventory(hosts=hosts, path=path, notes=notes + [n for n in extra.lines() if n not in notes])


def _vars_file(base: str, notes: Notes, who: str) -> dict:
    for cand in (base, base + ".yml", base + ".yaml"):
        if os.path.isfile(cand):
            try:
                data = load_yaml(read_text(cand), cand) or {}
            except yaml.YAMLError as exc:
                raise ConfigError(f"{cand}: not valid YAML ({exc})") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{cand}: expected a mapping of variables")
            return ansible_vars(data, cand, notes, who)
    return {}
