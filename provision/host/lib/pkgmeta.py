"""Package metadata read from files: version, the wheel's RECORD, git root and blobs.  STDLIB ONLY (a leaf)."""

from __future__ import annotations

import hashlib
import os
import re

_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def package_version(pkg: str) -> str | None:
    """Version of an sglang package dir read from its files (no import): _version.py,
    version.py, else the checkout's pyproject.toml."""
    for name in ("_version.py", "version.py"):
        try:
            with open(os.path.join(pkg, name), encoding="utf-8") as fh:
                m = _VERSION_RE.search(fh.read())
        except OSError:
            continue
        if m:
            return m.group(1)
    pyproject = os.path.join(os.path.dirname(pkg), "pyproject.toml")
    try:
        with open(pyproject, encoding="utf-8") as fh:
            m2 = re.search(r'^version\s*=\s*"([^"]+)"', fh.read(), re.M)
        if m2:
            return m2.group(1)
    except OSError:
        pass
    return None


def git_root(pkg: str) -> str | None:
    """A `.git` up to 4 levels above the package."""
    d = os.path.realpath(pkg)
    for _ in range(4):
        d = os.path.dirname(d)
        if os.path.exists(os.path.join(d, ".git")):
            return d
    return None


def record_sha(dist_info: str | None, relpath: str) -> str | None:
    """The sha256 (hex) the wheel's RECORD gives for `relpath` (e.g. sglang/srt/models/x.py)."""
    if not dist_info:
        return None
    try:
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8") as fh:
            for line in fh:
                parts = line.rstrip("\n").rsplit(",", 2)
                if len(parts) == 3 and parts[0] == relpath and parts[1].startswith("sha256="):
                    import base64

                    b64 = parts[1][len("sha256="):]
                    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    except (OSError, ValueError):
        return None
    return None


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git(root: str, *args: str, timeout: float = 10) -> str | None:
    import subprocess

    from provision.host.lib.trust import trusted_binary

    exe, why = trusted_binary("git")
    if not exe or why:
        return None
    try:
        proc = subprocess.run([exe, "-C", root, *args], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C"))
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_facts(root: str, path: str) -> dict:
    """HEAD's blob of the file, and how many upstream commits HEAD lacks that change the
    file (None: no upstream). Those are what make `git pull` refuse our local change.
    Reads only what the last `git fetch` left; never fetches."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    blob = git(root, "rev-parse", f"HEAD:{rel}")
    behind = git(root, "rev-list", "--count", "HEAD..@{u}", "--", rel)
    return {"root": root, "rel": rel, "head_blob": blob,
            "behind": int(behind) if behind and behind.isdigit() else None}
