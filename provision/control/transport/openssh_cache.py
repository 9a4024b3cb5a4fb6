"""``ssh -G``'s answers, kept by what ssh itself said it read: asked once per content.

``ssh -G`` is the authority on a host's settings (settings.py), but it is one process per name:
~8 ms of CPU on this project's machine, about half of what each extra host costs the control side.
Its answer depends on the config files it reads, the name, the local user and host name, and the
ssh binary. So the first run asks ``ssh -v -G`` (the same answer, and on stderr ssh's own list of
every file it read: ``Reading configuration data FILE``, and every ``Include`` that matched
nothing), and keeps the answer in ``$XDG_CACHE_HOME/provision/ssh-G/KEY`` (default
``~/.cache/...``), KEY naming the question (the ssh binary's path, size, mtime and inode; the
wrapper config's text; the name; uid, user name, home ($HOME too), host name). A later run uses the answer
only when every file ssh read has the same bytes and every directory holding one (or named by an
unmatched ``Include``) the same entries: an edited, added or removed config file is a new question
for ssh.

Never kept, so always asked: a config with ``Match exec`` or ``Match localnetwork`` (the answer
depends on a command's exit or the network), with a ``${VAR}`` (the environment), or whose answer
canonicalises the host name (DNS); a file changed in the last 2 s (git's "racily clean" rule: it
may have changed while ssh read it); errors; and any answer whose ``-v`` output does not name the
wrapper itself among the files read (not OpenSSH's output as we know it: nothing to key on).
Reads only the user's own files that nobody else can write (not a symlink); writes are atomic,
0600 in a 0700 directory; a cache that cannot be used is not used. Deleting the directory is
always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time

READ = re.compile(r"^debug\d: Reading configuration data (.+)$", re.M)
UNMATCHED = re.compile(r"^debug\d: .* line \d+: include (.+) matched no files$", re.M)
# what makes an answer depend on more than the files' bytes (case-insensitive, anywhere in a file)
VOLATILE = re.compile(rb"^[ \t]*match\b[^\n]*\b(?:exec|localnetwork)\b|\$\{", re.I | re.M)
RACY_NS = 2_000_000_000
KEEP = 256


def cache_dir() -> str:
    from provision.config.cachedir import cache_dir as under

    return under("ssh-G")


def question(ssh: str, wrapper_text: str, name: str) -> str:
    """The key: everything the answer depends on besides the files ssh reads."""
    import pwd

    st = os.stat(ssh)
    pw = pwd.getpwuid(os.getuid())
    parts = [ssh, st.st_size, st.st_mtime_ns, st.st_ino, wrapper_text, name, os.getuid(), pw.pw_name,
             pw.pw_dir, os.environ.get("HOME"), socket.gethostname()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class Volatile(Exception):
    """The answer may change without any file changing: ask every time."""


def read_list(debug: str, wrapper: str) -> tuple[list[str], list[str]]:
    """(files ssh read, directories whose entries decide what it reads) from ``ssh -v``'s stderr.
    Pure."""
    files = list(dict.fromkeys(p.strip() for p in READ.findall(debug) if p.strip() != wrapper))
    dirs = {os.path.dirname(f) for f in files}
    dirs |= {os.path.dirname(os.path.expanduser(p.strip())) for p in UNMATCHED.findall(debug)}
    return files, sorted(d for d in dirs if d)


def fingerprint(files: list[str], dirs: list[str], now_ns: int | None = None) -> str:
    """sha256 of the files' bytes and the directories' entries; raises Volatile for a file whose
    answer may change without its bytes changing, or that changed too recently to trust."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    h = hashlib.sha256()
    for path in files:
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                data = fh.read()
        except OSError:
            h.update(f"absent\0{path}\n".encode())
            continue
        if VOLATILE.search(data):
            raise Volatile(path)
        if now_ns - st.st_mtime_ns < RACY_NS:  # written while ssh read it? (content: the fingerprint)
            raise Volatile(f"{path} changed in the last seconds")
        h.update(f"file\0{path}\0{len(data)}\0".encode() + data)
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            names = None
        h.update(f"dir\0{d}\0{json.dumps(names)}\n".encode())
    return h.hexdigest()


def _read_own(path: str) -> dict | None:
    """A kept entry, only from a regular file of ours that nobody else can write (not a symlink)."""
    from provision.host.lib.atomic import read_own

    data = read_own(path)
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def lookup(key: str) -> str | None:
    """The kept ``ssh -G`` output for this question, if every file and directory it depended on is
    as it was; else None (ask ssh)."""
    doc = _read_own(os.path.join(cache_dir(), key))
    if not doc or not isinstance(doc.get("files"), list) or not isinstance(doc.get("dirs"), list):
        return None
    try:
        if fingerprint(doc["files"], doc["dirs"]) != doc.get("fingerprint"):
            return None
    except Volatile:
        return None
    answer = doc.get("answer")
    return answer if isinstance(answer, str) else None


def keep(key: str, wrapper: str, answer: str, debug: str) -> bool:
    """Keep a successful ``ssh -v -G`` answer (stdout, stderr), unless it may change without a file
    changing. True when kept."""
    if re.search(r"^canonicalizehostname (?!false)", answer, re.M):
        return False  # the name goes through DNS
    if wrapper not in (p.strip() for p in READ.findall(debug)):
        return False  # ssh did not say what it read (not OpenSSH's -v as we know it): nothing to key on
    files, dirs = read_list(debug, wrapper)
    try:
        fp = fingerprint(files, dirs)
    except Volatile:
        return False
    from provision.host.lib import atomic  # the one atomic writer (stdlib, both sides)

    d = cache_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        atomic.write_bytes(os.path.join(d, key), json.dumps(
            {"files": files, "dirs": dirs, "fingerprint": fp, "answer": answer}).encode(), 0o600, durable=False)
        _prune(d)
    except OSError:
        return False
    return True


def _prune(d: str) -> None:
    entries = sorted(os.scandir(d), key=lambda e: e.stat().st_mtime, reverse=True)
    for e in entries[KEEP:]:
        try:
            os.unlink(e.path)
        except OSError:
            pass
