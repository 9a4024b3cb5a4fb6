"""Who may run code here: the ONE trust rule for what the host side runs or imports as root.  STDLIB ONLY (a leaf).

The host side runs as root (or as the SSH user, without sudo). Anything it executes or
imports runs with that power, so it must be no one else's to change. The rule, said once:

    a path is trusted when it, and every directory from it up to /, is owned by root
    (or by the agent's own non-root user, an SSH user without sudo) and is not writable
    by group or others; as named, through each symlink on the way, and as resolved.

It is applied to
  * interpreters (``untrusted_reason``): the rule, plus a venv's pyvenv.cfg and the
    standard-library directories of the interpreter it names (facts/installs.py);
  * SGLang installs (``untrusted_install_reason``): the rule for the package directory,
    and every file and directory inside it (facts/installs.py: an untrusted one is never
    chosen, written or imported, unless named with --sglang-path/--python);
  * binaries (``trusted_binary``): nvidia-smi, docker, podman, systemctl, git: looked up
    on SAFE_PATH only (never the caller's PATH) and run only when they pass the rule,
    with SAFE_ENV, cwd / and no stdin.

Each check answers one phrase the user can act on ("/home/alice is owned by alice"), or None.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The whole environment of a helper run as root: nothing of the caller's (or a server's).
SAFE_ENV = {"PATH": SAFE_PATH, "LC_ALL": "C.UTF-8"}


def trusted_uids() -> set:
    """Owners whose files this agent may execute: root, and the agent's own user when it
    runs without root (an SSH user with no sudo); never anyone else."""
    euid = os.geteuid()
    return {0} if euid == 0 else {0, euid}


def owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def _bad_inode(st: os.stat_result, uids: set) -> str | None:
    if st.st_uid not in uids:
        return f"owned by {owner_name(st.st_uid)}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = "group and others" if mode & 0o022 == 0o022 else "group" if mode & 0o020 else "others"
        return f"writable by {who} (mode {mode:04o})"
    return None


def _chain(path: str) -> list:
    """`path` and every directory above it, top first."""
    out = []
    while True:
        out.append(path)
        if path in ("/", ""):
            break
        path = os.path.dirname(path)
    return out[::-1]


def _check(paths: list, uids: set) -> str | None:
    for p in paths:
        try:
            why = _bad_inode(os.stat(p), uids)
        except OSError as exc:
            return f"{p} cannot be checked ({exc.strerror})"
        if why:
            return f"{p} is {why}"
    return None


def untrusted_path_reason(path: str, uids: set | None = None) -> str | None:
    """THE RULE: why `path` could hold someone else's code, or None when it cannot. `path` and
    every directory above it, as named and through each symlink on the way (each prefix of the
    path is resolved and its chain checked) and as finally resolved, must be owned by `uids`
    (trusted_uids()) and not writable by group or others."""
    uids = trusted_uids() if uids is None else uids
    named = os.path.normpath(path if os.path.isabs(path) else os.path.abspath(path))
    real = os.path.realpath(named)
    try:
        why = _bad_inode(os.stat(real), uids)
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    if why:
        return why if real == named else f"its target {real} is {why}"
    parts = named.split("/")
    dirs: list = []
    for head in ("/".join(parts[:i]) or "/" for i in range(1, len(parts) + 1)):
        for d in _chain(os.path.realpath(head)):
            if d != real and d not in dirs:
                dirs.append(d)
    return _check(dirs, uids)


def untrusted_reason(path: str, uids: set | None = None) -> str | None:
    """Why running the interpreter `path` could run someone else's code as us, or None.

    The rule (untrusted_path_reason) for the interpreter; and, held to the same rule, a venv's
    pyvenv.cfg (which picks the standard library), the chain of the `home` it names, and the
    standard-library directories of the resolved interpreter."""
    uids = trusted_uids() if uids is None else uids
    if not os.path.isabs(path):
        path = shutil.which(path) or os.path.abspath(path)
    why = untrusted_path_reason(path, uids)
    if why:
        return why
    named = os.path.normpath(path)
    real = os.path.realpath(named)
    bin_dir = os.path.dirname(named)
    extra_files = [c for c in (os.path.join(bin_dir, "pyvenv.cfg"),
                               os.path.join(os.path.dirname(bin_dir), "pyvenv.cfg")) if os.path.isfile(c)]
    homes = []
    for cfg in extra_files:
        try:
            with open(cfg, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    k, _, v = line.partition("=")
                    if k.strip().lower() == "home" and os.path.isabs(v.strip()):
                        homes.append(os.path.realpath(v.strip()))
        except OSError as exc:
            return f"{cfg} cannot be read ({exc.strerror})"
    checks = list(extra_files)
    for home in homes:
        checks += [d for d in _chain(home) if d not in checks]
    for pre in dict.fromkeys([os.path.dirname(os.path.dirname(real))] + [os.path.dirname(h) for h in homes]):
        checks += [d for d in sorted(glob.glob(os.path.join(glob.escape(pre), "lib*", "python3*")))
                   if os.path.isdir(d) and d not in checks]
    return _check(checks, uids)


def untrusted_install_reason(pkg: str, uids: set | None = None) -> str | None:
    """Why importing (or writing into) the SGLang package directory `pkg` as us could run someone
    else's code, or None. The rule for `pkg` itself, then every directory and file inside it
    (a symlink inside is held to the rule at its target)."""
    uids = trusted_uids() if uids is None else uids
    why = untrusted_path_reason(pkg, uids)
    if why:
        return why
    stack = [pkg]  # scandir, not os.walk: one stat per entry, no more (0.5.9's 2,100 entries: ~40 ms)
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError as exc:
            return f"{d} cannot be checked ({exc.strerror})"
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError as exc:
                    return f"{e.path} cannot be checked ({exc.strerror})"
                if stat.S_ISLNK(st.st_mode):
                    why = untrusted_path_reason(e.path, uids)
                    if why:
                        return f"{e.path} (a symlink): {why}"
                    continue
                if st.st_uid not in uids or st.st_mode & 0o022:
                    return f"{e.path} is {_bad_inode(st, uids)}"
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
    return None


def trusted_binary(name: str, uids: set | None = None) -> tuple:
    """(path, None): run `name` from `path`. (path, why): the first `name` on SAFE_PATH fails the
    rule and must not run (no later one is tried: root's own shell would run that one).
    (None, why): there is none on SAFE_PATH. Never the caller's PATH."""
    path = shutil.which(name, path=SAFE_PATH)
    if not path:
        return None, f"no {name} on {SAFE_PATH}"
    why = untrusted_path_reason(path, uids)
    return (path, None) if why is None else (path, f"{path} not run: {why}")
