"""How a hint names one host so that it works when pasted (pure, but for the one setting the CLI makes).

A host that exists only in an inventory (`-i demo.yaml`) cannot be reached as `--host NAME`: its
address, user and key are the inventory's. So every command provision prints for the user to run
next names a host the way this run was given it: `-i INVENTORY --host NAME` when an inventory was
given (`--host` picks one host of it), else `--host NAME`.
"""

from __future__ import annotations

import shlex

_inventory: str | None = None


def set_inventory(src: str | None) -> None:
    """The `-i` this run was given (None: hosts named with --host); the CLI sets it once."""
    global _inventory
    _inventory = src


def selector(name: str) -> str:
    """`-i INVENTORY --host NAME`, or `--host NAME`: what to paste after `provision VERB`."""
    if _inventory:
        return f"-i {shlex.quote(_inventory)} --host {shlex.quote(name)}"
    return f"--host {shlex.quote(name)}"


def selectors(names: list[str]) -> str:
    """The same for several hosts: `-i INVENTORY --host A --host B`, or `--host A --host B`."""
    hosts = " ".join(f"--host {shlex.quote(n)}" for n in names)
    return f"-i {shlex.quote(_inventory)} {hosts}" if _inventory else hosts
