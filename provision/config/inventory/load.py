"""`-i SRC` and `--host`: a comma-separated host list, our YAML, or anything Ansible reads
(through `ansible-inventory` when it is on PATH, else our YAML, INI and directory readers);
`--host NAME...` as an inventory of its own."""

from __future__ import annotations

import os
import shutil

import yaml

from provision.config.inventory.ansible_inventory import ansible_inventory
from provision.config.inventory.directory import read_directory
from provision.config.inventory.formats import is_ours, parse_inventory, read_text
from provision.config.inventory.model import Host, Inventory
from provision.config.inventory.ranges import expand_pattern
from provision.errors import ConfigError


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


def load_inventory(src: str, *, use_ansible: bool | None = None) -> Inventory:
    """Read ``-i SRC``: a host list, our YAML, or anything Ansible reads (through
    ansible-inventory when it is on PATH, else our YAML/INI/directory readers). Every host's name,
    address and user is held to OpenSSH's rule for names (config/names.py) here, whatever the format,
    before anything uses it."""
    return checked_names(_load(src, use_ansible=use_ansible))


def checked_names(inv: Inventory) -> Inventory:
    """`inv`, or a ConfigError naming the inventory and the host whose name, address or user holds
    a shell metacharacter, whitespace, a control character or a leading '-'."""
    from provision.config.names import refusal

    for h in inv.hosts:
        for what, value in (("name", h.name), ("address", h.get("address")), ("user", h.get("user"))):
            if value is None and what != "name":
                continue
            why = refusal(h.name, what, value if isinstance(value, str) else str(value))
            if why:
                raise ConfigError(f"{inv.path}: {why}")
    return inv


def _load(src: str, *, use_ansible: bool | None = None) -> Inventory:
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
        text = read_text(src)
        if is_ours(text):
            return parse_inventory(text, src)
        if src.endswith((".yaml", ".yml", ".json")):
            from provision.config.bounded import load_yaml

            try:
                load_yaml(text, src)
            except yaml.YAMLError:
                return parse_inventory(text, src)  # raises, naming the line (as Ansible would fail too)
    exe = shutil.which("ansible-inventory") if use_ansible is not False else None
    if exe:
        return ansible_inventory(src, exe)
    if text is None:
        return read_directory(src)
    return parse_inventory(text, src, ini_fallback=not src.endswith((".yaml", ".yml", ".json")))


def adhoc(hosts: list[str], common: dict | None = None) -> Inventory:
    """An inventory from --host flags."""
    return checked_names(Inventory(hosts=[Host(name=h, vars=dict(common or {})) for h in hosts], path="--host"))
