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
        text = read_text(src)
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
        return read_directory(src)
    return parse_inventory(text, src, ini_fallback=not src.endswith((".yaml", ".yml", ".json")))


def adhoc(hosts: list[str], common: dict | None = None) -> Inventory:
    """An inventory from --host flags."""
    return Inventory(hosts=[Host(name=h, vars=dict(common or {})) for h in hosts], path="--host")
