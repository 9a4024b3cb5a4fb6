"""``ansible-inventory --list``, asked once per content: its answer kept under the sha256 of
everything it read.

Asking ansible-inventory costs about half a CPU-second (it imports Ansible), which used to
double a no-op run with a static inventory. Its answer depends only on what it read, so the
answer is kept in ``$XDG_CACHE_HOME/provision/ansible-inventory/KEY.json`` (default
``~/.cache/...``), KEY being the sha256 of:

- every file of the source (a file, or a directory's files, recursively),
- every file under ``group_vars/`` and ``host_vars/`` next to it (a file's directory, or inside
  the directory) and in the current directory (ansible-inventory reads those too),
- every Ansible config that may be used (``$ANSIBLE_CONFIG``, ``./ansible.cfg``,
  ``~/.ansible.cfg``, ``/etc/ansible/ansible.cfg``),
- the ``ANSIBLE_*`` environment, and the ansible-inventory program itself (path, size, mtime).

Any change to any of them is a new key, so ansible-inventory is asked again: it stays the
authority and the cache only ever gives back what it said for the same bytes. Dynamic
sources are never cached: an executable file (an inventory script) or a YAML file naming an
inventory ``plugin:`` anywhere in the source. Errors are never cached. Writes are atomic (a
reader sees a whole answer or none); a cache that cannot be written is simply not used.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable

# where ansible-inventory reads variables from, relative to a base directory
VARS_DIRS = ("group_vars", "host_vars")
CONFIG_CANDIDATES = ("./ansible.cfg", "~/.ansible.cfg", "/etc/ansible/ansible.cfg")
_MAX_FILES = 5000   # a source this large is asked every run rather than hashed file by file


class Dynamic(Exception):
    """The source runs code (a script, a plugin): its answer may change without any file changing."""


def cache_dir() -> str:
    from provision.config.cachedir import cache_dir as under

    return under("ansible-inventory")


def _files(path: str) -> list[str]:
    """Every regular file at or under ``path`` (sorted; hidden directories skipped), [] if none."""
    if os.path.isfile(path):
        return [path]
    out: list[str] = []
    if not os.path.isdir(path):
        return out
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [os.path.join(root, n) for n in sorted(names)]
        if len(out) > _MAX_FILES:
            raise Dynamic(f"more than {_MAX_FILES} files")
    return out


def _is_plugin_config(data: bytes) -> bool:
    """A YAML inventory file whose top level names a plugin (``plugin: amazon.aws.aws_ec2``)."""
    return any(line.startswith((b"plugin:", b'{"plugin"', b'"plugin"')) for line in data.splitlines())


def key(src: str, exe: str, env: dict | None = None, cwd: str | None = None) -> str:
    """The sha256 naming ansible-inventory's answer for ``src``; raises Dynamic for a source that
    runs code. Reads the files (never runs anything)."""
    env = os.environ if env is None else env
    cwd = cwd or os.getcwd()
    src_abs = os.path.abspath(os.path.join(cwd, os.path.expanduser(src)))
    h = hashlib.sha256()

    def add(tag: str, value: bytes) -> None:
        h.update(tag.encode() + b"\0" + str(len(value)).encode() + b"\0" + value)

    def add_file(path: str, source: bool) -> None:
        try:
            st = os.stat(path)
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise Dynamic(f"{path}: unreadable ({exc.strerror})") from None
        if source and (st.st_mode & 0o111 or _is_plugin_config(data)):
            raise Dynamic(f"{path}: an inventory script or plugin")
        add("file:" + path, data)

    add("src", src_abs.encode())
    add("exe", exe.encode())
    try:
        st = os.stat(exe)
        add("exe-stat", f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode())
    except OSError:
        raise Dynamic(f"{exe}: cannot stat") from None
    add("env", json.dumps(sorted((k, v) for k, v in env.items() if k.startswith("ANSIBLE_"))).encode())
    for path in _files(src_abs):
        add_file(path, source=not any(part in VARS_DIRS for part in
                                      os.path.relpath(path, src_abs).split(os.sep)))
    bases = [src_abs if os.path.isdir(src_abs) else os.path.dirname(src_abs), cwd]
    for base in dict.fromkeys(bases):
        for sub in VARS_DIRS:
            d = os.path.join(base, sub)
            add("dir:" + d, b"1" if os.path.isdir(d) else b"0")
            for path in _files(d):
                add_file(path, source=False)
    configs = ([env["ANSIBLE_CONFIG"]] if env.get("ANSIBLE_CONFIG") else []) + list(CONFIG_CANDIDATES)
    for cand in configs:
        path = os.path.abspath(os.path.join(cwd, os.path.expanduser(cand)))
        if os.path.isfile(path):
            add_file(path, source=False)
        else:
            add("no-config:" + path, b"")
    return h.hexdigest()


def _write(path: str, data: bytes) -> None:
    from provision.host.lib import atomic  # the one atomic writer (stdlib, both sides)

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    atomic.write_bytes(path, data, 0o600, durable=False)  # a cache: rebuilt when lost


def listing(src: str, exe: str, ask: Callable[[], dict]) -> dict:
    """ansible-inventory's ``--list`` document for ``src``: from the cache when the same bytes
    were asked before, else ``ask()`` (which runs it, and raises for a source it cannot read)."""
    try:
        k = key(src, exe)
    except Dynamic:
        return ask()
    path = os.path.join(cache_dir(), k + ".json")
    from provision.host.lib.atomic import read_own  # ours, not a symlink, nobody else can write it

    try:
        data = read_own(path)
        doc = json.loads(data) if data is not None else None
        if isinstance(doc, dict):
            return doc
    except ValueError:
        pass
    doc = ask()
    try:
        if key(src, exe) == k:  # nothing changed while it ran: the answer belongs to these bytes
            _write(path, json.dumps(doc).encode())
    except (OSError, Dynamic):
        pass
    return doc
