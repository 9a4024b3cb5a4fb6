"""Ansible's `--limit` (host names, group names or globs; `!x` excludes), and the names a
selection that matched nothing lists. Pure."""

from __future__ import annotations

import fnmatch
import re

from provision.config.inventory.model import Host, Inventory


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
