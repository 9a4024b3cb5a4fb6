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

One module per job: model (Host, Inventory, the variables we know), ours (our strict YAML, with
lines), ansible_yaml and ini (Ansible's formats without Ansible), ranges (`gpu[01:08]`),
variables (Ansible's variables mapped onto ours), formats (which reader a text goes to),
directory (a directory without Ansible), ansible_inventory (the `ansible-inventory` subprocess),
load (`-i SRC`, `--host`), limit (`--limit`). This package re-exports what the rest of
provision uses.
"""

from __future__ import annotations

from provision.config.inventory.ansible_inventory import ansible_inventory, from_ansible_json
from provision.config.inventory.ansible_yaml import parse_ansible
from provision.config.inventory.formats import is_ours, parse_inventory
from provision.config.inventory.ini import parse_ini
from provision.config.inventory.limit import existing_names, select
from provision.config.inventory.load import adhoc, host_list, load_inventory
from provision.config.inventory.model import HOST_KEYS, Host, Inventory, host_spec_names, spec_vars
from provision.config.inventory.ours import LineDict, parse_ours
from provision.config.inventory.ranges import expand_pattern
from provision.config.inventory.variables import ANSIBLE_MAP

__all__ = ["ANSIBLE_MAP", "HOST_KEYS", "Host", "Inventory", "LineDict", "adhoc", "ansible_inventory",
           "existing_names", "expand_pattern", "from_ansible_json", "host_list", "host_spec_names", "is_ours",
           "load_inventory", "parse_ansible", "parse_ini", "parse_inventory", "parse_ours", "select", "spec_vars"]
