"""Ask Ansible itself: the one place that runs `ansible-inventory -i SRC --list` (where it is on
PATH it is the authority: INI, YAML, directories, dynamic inventory plugins), and the reader of
its JSON answer (`from_ansible_json`, pure)."""

from __future__ import annotations

import json
import os
import subprocess

from provision.config.inventory.model import Host, Inventory
from provision.config.inventory.variables import Notes, ansible_vars, with_notes
from provision.errors import ConfigError


def from_ansible_json(doc: dict, src: str) -> Inventory:
    """``ansible-inventory --list`` output -> Inventory (host vars already merged by Ansible). Pure."""
    notes = Notes()
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
    hosts = [Host(h, ansible_vars(meta.get(h) or {}, src, notes, f"host {h}"), tuple(groups_of.get(h, [])))
             for h in order]
    if not hosts:
        raise ConfigError(f"{src}: ansible-inventory found no hosts in it")
    return with_notes(Inventory(hosts=hosts, path=src), notes)


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
