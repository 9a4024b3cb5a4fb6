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
    with SAFE_ENV, cwd / and no stdin;
  * the container transport's runtime (``SH_RULE``, below): the same lookup and rule said in
    POSIX sh, run by the outer host's /bin/sh before `RUNTIME exec` (no python of ours there).

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


def _writable_words(mode: int) -> str:
    mode = stat.S_IMODE(mode)
    who = "group and others" if mode & 0o022 == 0o022 else "group" if mode & 0o020 else "others"
    return f"writable by {who} (mode {mode:04o})"


def _bad_inode(st: os.stat_result, uids: set) -> str | None:
    if st.st_uid not in uids:
        return f"owned by {owner_name(st.st_uid)}"
    if st.st_mode & 0o022:
        return _writable_words(st.st_mode)
    return None


def _where(named: str, real: str, bad: str, why: str) -> str:
    """`why` said of the inode `bad`, seen from the path `named` (resolving to `real`)."""
    if bad != real:
        return f"{bad} is {why}"
    return why if real == named else f"its target {real} is {why}"


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
        return _where(named, real, real, why)
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


# ---- The rule in POSIX sh, for a host where none of our Python runs.
#
# The container transport's step is `RUNTIME exec` run by /bin/sh on the outer host (the
# container holds the python3; the host may have none), so the runtime must be chosen, and
# judged, by that same shell before it runs. SH_RULE says trusted_binary and
# untrusted_path_reason there, function for function:
#   provision_which NAME      the first executable NAME in a SAFE_PATH directory (shutil.which
#                             on SAFE_PATH), never the caller's PATH;
#   provision_untrusted PATH  the inodes untrusted_path_reason stats, in its order: the resolved
#                             path, then for each leading part of PATH as named, every directory
#                             from its resolution down from /. Each must be owned by root or by
#                             the user the shell runs as (`[ -O ]`: trusted_uids()) with no 022
#                             bit; the first that is not is printed as one line (sh_reason turns
#                             it into this module's words) and the function fails.
# Only /usr/bin/realpath and /usr/bin/stat (coreutils; fixed paths, never looked up) run besides
# the shell, as /bin/sh and sudo do. tests/unit/test_trust_sh.py holds the two renditions to the
# same answers on real files.
SH_RULE = r"""provision_which() {
  for _pd in @SAFE_DIRS@; do
    if [ -f "$_pd/$1" ] && [ -x "$_pd/$1" ]; then printf '%s\n' "$_pd/$1"; return 0; fi
  done
  return 1
}
provision_heads() {
  printf '/\n'; _ph=; _pr=${1#/}
  while [ -n "$_pr" ]; do
    _ph=$_ph/${_pr%%/*}; printf '%s\n' "$_ph"
    case $_pr in */*) _pr=${_pr#*/} ;; *) _pr= ;; esac
  done
}
provision_untrusted() {
  _pn=$1
  _pt=$(/usr/bin/realpath -- "$_pn" 2>/dev/null) || { printf 'gone\t-\t%s\t%s\t%s\n' "$_pn" "$_pn" "$_pn"; return 1; }
  _pall=$(printf '%s\n' "$_pt"; provision_heads "$_pn" | while IFS= read -r _px; do
    if _py=$(/usr/bin/realpath -- "$_px" 2>/dev/null); then provision_heads "$_py"; else printf '%s\n' "$_px"; fi
  done)
  _pseen=
  while IFS= read -r _px; do
    case "$_pseen" in *"
$_px
"*) continue ;; esac
    _pseen="$_pseen
$_px
"
    _ps=$(/usr/bin/stat -L -c '%u %a %U' -- "$_px" 2>/dev/null) || { printf 'gone\t-\t%s\t%s\t%s\n' "$_pn" "$_pt" "$_px"; return 1; }
    set -- $_ps
    if [ "$1" != 0 ] && ! [ -O "$_px" ]; then printf 'owner\t%s %s\t%s\t%s\t%s\n' "$1" "$3" "$_pn" "$_pt" "$_px"; return 1; fi
    # 18 = 0o022: writable by group or others
    if [ $(( 0$2 & 18 )) -ne 0 ]; then printf 'mode\t%s\t%s\t%s\t%s\n' "$2" "$_pn" "$_pt" "$_px"; return 1; fi
  done <<PROVISION_EOF
$_pall
PROVISION_EOF
  return 0
}
""".replace("@SAFE_DIRS@", " ".join(SAFE_PATH.split(":")))


def sh_reason(line: str) -> tuple:
    """(path, why) from the line provision_untrusted printed: the path it judged and why it fails,
    in untrusted_path_reason's words (`trusted_binary`'s sentence is f"{path} not run: {why}")."""
    kind, value, named, real, bad = (line.rstrip("\n").split("\t", 4) + ["", "", "", ""])[:5]
    if kind == "gone":
        why = "cannot be checked"
        return named, (why if bad == real else f"{bad} {why}")
    if kind == "owner":
        uid, _, name = value.partition(" ")
        why = f"owned by {name if name and name != 'UNKNOWN' else f'uid {uid}'}"
    else:
        try:
            why = _writable_words(int(value, 8))
        except ValueError:
            why = f"writable by group or others (mode {value})"
    return named, _where(named, real, bad, why)
