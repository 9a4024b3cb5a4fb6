"""Which format an inventory text is in, and the reader for it: ours, Ansible's YAML, or Ansible's
INI (by name, or when a text that is not a YAML mapping may be INI). Pure, but for `read_text`."""

from __future__ import annotations

import yaml

from provision.config.inventory.ansible_yaml import parse_ansible
from provision.config.inventory.ini import parse_ini
from provision.config.inventory.model import OUR_TOP, Inventory, error_at
from provision.config.inventory.ours import load_yaml_with_lines, parse_ours
from provision.errors import ConfigError


def parse_inventory(text: str, path: str = "<inventory>", *, ini_fallback: bool = False) -> Inventory:
    """Our YAML, Ansible's YAML, or (by name, or when ``ini_fallback`` and the text is not a
    YAML mapping) Ansible's INI."""
    if path.endswith(".ini"):
        return parse_ini(text, path)
    try:
        data = load_yaml_with_lines(text, path)
    except yaml.YAMLError as exc:
        if ini_fallback:
            return parse_ini(text, path)
        mark = getattr(exc, "problem_mark", None)
        raise error_at(path, mark.line + 1 if mark else None,
                   f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if ini_fallback and not isinstance(data, dict):
        return parse_ini(text, path)
    if not isinstance(data, dict) or not data:
        raise error_at(path, None, "expected a mapping (defaults/groups/hosts, or an Ansible inventory with all:)")
    if set(data) <= OUR_TOP and ("hosts" in data or "groups" in data):
        return parse_ours(data, path)
    if "all" in data or any(isinstance(v, dict) and ({"hosts", "children"} & set(v)) for v in data.values()):
        return parse_ansible(data, path)
    if ini_fallback:
        return parse_ini(text, path)
    return parse_ours(data, path)  # raises with the unknown key and its line


def is_ours(text: str) -> bool:
    """Whether a file is in our own format (Ansible's tools would not read it)."""
    from provision.config.bounded import load_yaml

    try:
        data = load_yaml(text, "<inventory>")
    except (yaml.YAMLError, ConfigError):  # (too deep: ours reads it again and says so, naming the file)
        return False
    return isinstance(data, dict) and bool(data) and set(map(str, data)) <= OUR_TOP and (
        "hosts" in data or "groups" in data or "defaults" in data)


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read inventory ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
