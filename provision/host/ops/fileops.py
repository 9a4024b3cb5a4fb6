"""The safe write transaction for one SGLang model file.

STDLIB ONLY, Python 3.10 syntax (shipped to the GPU hosts with the engine).

patch_file / unpatch_file / restore_file all go through the same path:
lock -> resolve symlinks -> read + sha256 -> plan (engine, pure) -> [stop here
for --check or no change] -> backup into <state_dir>/backups -> temp file in the
same directory with a name that does not end in .py -> copy mode and owner ->
fsync -> refuse if the target changed since it was read -> os.replace -> fsync
the directory -> drop stale bytecode -> verify (compile + engine structure
check), rolling back through the same atomic path on failure -> record state.

Every outcome is a JSON-serialisable dict; expected failures never raise.
Error kinds (on top of the engine's): "locked", "io", "changed-underfoot",
"verify", "backup".
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import re
import signal
import stat
import sys
import time

from provision.host.engine import core as engine
from provision.host.lib import failpoints
from provision.host.lib.modules import make_resolver
from provision.host.lib.state import STATE_NAME, read_state
from provision.host.lib.state import read_bytes as _read
from provision.host.lib.state import sha256 as _sha

KEEP_BACKUPS = 10  # per file, besides the first (the original), which is kept forever
LOCK_NAME = "lock"
BACKUP_DIR = "backups"
_TEMP_RE = re.compile(r"^\..+\.provision-(\d+)\.tmp$")


class _Fail(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


# --------------------------------------------------------------------------- small helpers


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _io_message(exc: OSError, action: str, fallback_path: str) -> str:
    where = exc.filename or fallback_path
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else "?"
    text = exc.strerror or str(exc)
    return f"could not {action} {where}: {text} ({code})"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _open_temp(path: str, mode: int = 0o600) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(path, flags, mode)
    except FileExistsError:
        # left behind by an earlier process with our pid (pids get reused)
        os.unlink(path)
        return os.open(path, flags, mode)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EROFS):
            raise
    finally:
        os.close(fd)


def temp_name(path: str, pid: int | None = None) -> str:
    """`.kimi_k25.py.provision-<pid>.tmp` next to `path`: never a `.py` name, so
    SGLang's model registry never imports it."""
    d, base = os.path.split(path)
    return os.path.join(d, f".{base}.provision-{os.getpid() if pid is None else pid}.tmp")


def clean_stale_temps(directory: str) -> list:
    """Remove `.*.provision-<pid>.tmp` files whose pid is dead; return their paths."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _TEMP_RE.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid != os.getpid() and _pid_alive(pid):
            continue
        p = os.path.join(directory, name)
        try:
            if not os.path.islink(p) and os.path.isfile(p):
                os.unlink(p)
                removed.append(p)
        except OSError:
            pass
    return removed


def _atomic_write(real: str, data: bytes, st, *, notes: list, expect_sha: str | None = None,
                  points: bool = True) -> None:
    """Write `data` to `real` via a same-directory temp file and os.replace.

    Copies mode and owner from `st`. If `expect_sha` is given, the target must
    still have that sha256 right before the replace (else _Fail changed-underfoot).
    The temp file never survives a failure (only a SIGKILL). ``points``: pass the
    failpoints (lib/failpoints.py; not when putting the old bytes back)."""
    directory = os.path.dirname(real)
    tmp = temp_name(real)
    replaced = False
    fd = _open_temp(tmp)
    try:
        try:
            _write_all(fd, data)
            try:
                os.fchown(fd, st.st_uid, st.st_gid)
            except PermissionError:
                if os.geteuid() == 0:
                    raise
                if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                    notes.append(f"could not keep owner {st.st_uid}:{st.st_gid} (not root); the file is now owned by {os.geteuid()}:{os.getegid()}")
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
            os.fsync(fd)
        finally:
            os.close(fd)
        if points:
            failpoints.hit("after_temp_write")
            failpoints.hit("before_replace", real)
        if expect_sha is not None:
            try:
                now = _sha(_read(real))
            except FileNotFoundError:
                now = "(deleted)"
            if now != expect_sha:
                raise _Fail("changed-underfoot", f"{real} changed while provision was working on it (sha256 {expect_sha[:12]} when read, {now[:12]} before the write); nothing was written, run again")
        os.replace(tmp, real)
        replaced = True
    finally:
        if not replaced:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    if points:
        failpoints.hit("after_replace")
    _fsync_dir(directory)


def drop_bytecode(real: str) -> list:
    """Remove `__pycache__/<stem>.*.pyc` next to `real`; return what was removed."""
    d, base = os.path.split(real)
    stem = base[:-3] if base.endswith(".py") else base
    removed = []
    for p in glob.glob(os.path.join(glob.escape(d), "__pycache__", glob.escape(stem) + ".*.pyc")):
        try:
            os.unlink(p)
            removed.append(p)
        except OSError:
            # not fatal: the new file's mtime already makes the cache stale
            pass
    return removed


# --------------------------------------------------------------------------- lock

class _Lock:
    def __init__(self, state_dir: str, timeout: float):
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(state_dir, LOCK_NAME)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        deadline = time.monotonic() + max(0.0, float(timeout))
        delay = 0.02
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    os.close(self.fd)
                    self.fd = None
                    who = f"pid {holder}" if holder else "another process"
                    raise _Fail("locked", f"{who} holds the provision lock {self.path} on this host; waited {timeout:g} s. Try again when it is done")
                time.sleep(delay)
                delay = min(delay * 2, 0.25)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())

    def _holder(self):
        try:
            with open(self.path, "rb") as fh:
                text = fh.read(64).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else None
        except OSError:
            return None

    def release(self):
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # closing drops the flock
            self.fd = None


# --------------------------------------------------------------------------- state + backups


def _write_json(path: str, data) -> None:
    payload = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")
    tmp = temp_name(path)
    fd = _open_temp(tmp, 0o600)
    done = False
    try:
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        done = True
    finally:
        if not done:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _record_state(state_dir: str, real: str, entry: dict) -> None:
    path = os.path.join(state_dir, STATE_NAME)
    state = read_state(state_dir)
    if os.path.exists(path) and not state:
        try:  # keep an unreadable state file for a human instead of overwriting it
            with open(path, "rb") as fh:
                raw = fh.read()
            if raw.strip() and raw.strip() != b"{}":
                os.replace(path, path + f".corrupt-{int(time.time())}")
        except OSError:
            pass
    state[real] = entry
    _write_json(path, state)


def _backup_dir(state_dir: str) -> str:
    return os.path.join(state_dir, BACKUP_DIR)


def list_backups(state_dir: str, path: str | None = None) -> list:
    """Backups (sidecar data plus "backup" and "sidecar" paths), oldest first;
    only those of `path` (after resolving symlinks) when given."""
    bdir = _backup_dir(state_dir)
    want = None if path is None else {path, os.path.abspath(path), os.path.realpath(path)}
    out = []
    for side in glob.glob(os.path.join(glob.escape(bdir), "*.json")):
        try:
            with open(side, "rb") as fh:
                meta = json.loads(fh.read().decode("utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        bak = side[: -len(".json")] + ".bak"
        if not os.path.exists(bak):
            continue
        if want is not None and meta.get("path") not in want:
            continue
        meta["backup"] = bak
        meta["sidecar"] = side
        out.append(meta)
    out.sort(key=lambda m: (m.get("time_ns", 0), m["backup"]))
    return out


def _backup(state_dir: str, real: str, data: bytes, sha: str, *, sglang_version, spec_name: str,
            reason: str) -> str:
    """Save `data` (the current bytes of `real`) unless a backup of the same
    path+sha exists (that first one is kept). Prune beyond KEEP_BACKUPS per file,
    never the file's first backup (its original)."""
    bdir = _backup_dir(state_dir)
    os.makedirs(bdir, mode=0o700, exist_ok=True)
    clean_stale_temps(bdir)
    existing = list_backups(state_dir, real)
    for meta in existing:
        if meta.get("sha256") == sha:
            try:
                if _sha(_read(meta["backup"])) == sha:
                    return meta["backup"]
            except OSError:
                pass
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", real.strip("/"))[-80:]
    ns = time.time_ns()
    base = os.path.join(bdir, f"{safe}.{_sha(real.encode())[:8]}.{sha[:12]}.{ns}")
    bak, side = base + ".bak", base + ".json"
    meta = {"path": real, "sha256": sha, "size": len(data), "sglang_version": sglang_version,
            "spec": spec_name, "time": _now(), "time_ns": ns, "reason": reason,
            "original": not existing}
    try:
        fd = _open_temp(temp_name(bak), 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp_name(bak), bak)
        _write_json(side, meta)
    except BaseException:
        for p in (temp_name(bak), bak, side):
            try:
                os.unlink(p)
            except OSError:
                pass
        raise
    _fsync_dir(bdir)
    # prune: the first backup of the file stays forever; of the rest keep the newest
    allb = list_backups(state_dir, real)
    rest = allb[1:]
    for meta_old in rest[: max(0, len(rest) - KEEP_BACKUPS)]:
        for p in (meta_old["backup"], meta_old["sidecar"]):
            try:
                os.unlink(p)
            except OSError:
                pass
    return bak


# --------------------------------------------------------------------------- resolver


def default_resolver(path: str, spec: dict):
    """Derive the spec's package directory (sglang's, vllm's) from `path` ending in spec["file"]."""
    rel = spec.get("file") if isinstance(spec, dict) else None
    ap = os.path.abspath(path)
    if isinstance(rel, str) and ap.replace(os.sep, "/").endswith("/" + rel):
        return make_resolver(ap[: -len(rel) - 1], spec.get("package") or "sglang")
    return None


# --------------------------------------------------------------------------- the transaction

def _result(path: str) -> dict:
    return {"verdict": "failed", "file": path, "real_file": None, "added": [], "native": [], "kept": [],
            "updated": False, "repaired": [], "module_level_leftovers": [], "notes": [], "diff": None,
            "sha_before": None, "sha_after": None, "backup": None, "check": False, "error": None}


def _written_and_compiles(real: str, expected: bytes, after: str) -> tuple:
    """(bytes on disk, problems): the file holds what was written and compiles with this interpreter."""
    data = _read(real)
    if data != expected:
        return data, [f"{real} does not hold the bytes that were written (sha256 {_sha(data)[:12]}, "
                      f"expected {_sha(expected)[:12]})"]
    try:
        compile(data, real, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        return data, [f"{real} does not compile {after}: {e}"]
    return data, []


def _verify_patch(spec, resolve_module):
    def verify(real: str, expected: bytes) -> list:
        data, problems = _written_and_compiles(real, expected, f"with {sys.executable}")
        return problems or engine.check_structure(data, spec, resolve_module)
    return verify


def _verify_unpatch(spec):
    def verify(real: str, expected: bytes) -> list:
        data, problems = _written_and_compiles(real, expected, "after removing the block")
        if problems:
            return problems
        if engine.plan_unpatch(data, spec)["verdict"] != "absent":
            return [f"{real} still holds a managed block for spec {spec.get('name')}"]
        return []
    return verify


_DONE = {"patch": "patched", "unpatch": "unpatched", "restore": "restored"}
_STAGE = {"lock": "take the provision lock in", "read": "read", "plan": "read", "backup": "back up",
          "write": "write", "verify": "verify", "state": "record the state of"}


def _transaction(op: str, path: str, spec: dict, *, state_dir: str, check: bool, want_diff: bool,
                 lock_timeout: float, planner, verifier, state_entry, sglang_version) -> dict:
    res = _result(path)
    res["check"] = bool(check)
    lock = None
    real = os.path.realpath(path)
    res["real_file"] = real
    replaced = False
    old = new = None
    st = None
    stage = "lock"
    try:
        if not check:  # --check writes nothing, not even the lock file
            lock = _Lock(state_dir, lock_timeout)
        stage = "read"
        if real != os.path.abspath(path):
            res["notes"].append(f"symlink: patched target {real}" if op != "unpatch" else f"symlink: changed target {real}")
        failpoints.hit("before_read")
        if not check:
            stale = clean_stale_temps(os.path.dirname(real))
            if stale:
                res["notes"].append(f"removed {len(stale)} stale temp file(s) of dead provision runs: {', '.join(os.path.basename(p) for p in stale)}")
        old = _read(real)
        st = os.stat(real)
        stage = "plan"
        res["sha_before"] = res["sha_after"] = _sha(old)
        plan = planner(old)
        for k in ("added", "native", "kept", "updated", "repaired", "module_level_leftovers", "removed"):
            if k in plan:
                res[k] = plan[k]
        res["notes"] += plan.get("notes", [])
        if plan["verdict"] == "failed":
            res["error"] = plan["error"]
            return res
        new = plan["new"]
        res["verdict"] = plan["verdict"]
        if want_diff:
            res["diff"] = engine.unified_diff(old, new, path) if new is not None else ""
        if check or new is None:
            return res
        if st.st_nlink > 1:
            res["notes"].append(f"{real} had {st.st_nlink} hard links; the other links keep the old bytes (the file was replaced, not written in place)")
        stage = "backup"
        try:
            res["backup"] = _backup(state_dir, real, old, res["sha_before"], sglang_version=sglang_version,
                                    spec_name=spec.get("name") if isinstance(spec, dict) else None, reason=op)
        except OSError as e:
            raise _Fail("io", _io_message(e, "back up the original of", real) + f"; nothing was written, {real} was left as it was")
        stage = "write"
        _atomic_write(real, new, st, notes=res["notes"], expect_sha=res["sha_before"])
        replaced = True
        res["sha_after"] = _sha(new)
        gone = drop_bytecode(real)
        if gone:
            res["notes"].append(f"removed stale bytecode: {', '.join(os.path.basename(p) for p in gone)}")
        failpoints.hit("before_verify")
        stage = "verify"
        problems = verifier(real, new)
        if problems:
            _atomic_write(real, old, st, notes=res["notes"], points=False)
            replaced = False
            drop_bytecode(real)
            res["sha_after"] = _sha(_read(real))
            res["verdict"] = "failed"
            res["error"] = {"kind": "verify", "message": f"the {_DONE[op]} file failed verification, so the previous bytes were put back: " + "; ".join(problems)}
            return res
        stage = "state"
        entry = state_entry(res, plan)
        entry.update(time=_now(), sha256_after=res["sha_after"], backup=res["backup"])
        _record_state(state_dir, real, entry)
        return res
    except _Fail as f:
        res["verdict"] = "failed"
        res["error"] = {"kind": f.kind, "message": f.message}
        return res
    except OSError as e:
        res["verdict"] = "failed"
        msg = _io_message(e, _STAGE[stage], real)
        if replaced and old is not None and st is not None:
            try:
                _atomic_write(real, old, st, notes=res["notes"])
                drop_bytecode(real)
                res["sha_after"] = res["sha_before"]
                msg += f"; the previous bytes of {real} were put back"
            except OSError as e2:
                msg += f"; putting the previous bytes back failed too ({e2.strerror}): {real} holds the new bytes, its backup is {res['backup']}"
        elif stage != "lock":
            msg += f"; {real} was left as it was"
        res["error"] = {"kind": "io", "message": msg}
        return res
    except Exception as e:  # a bug: put the old bytes back if we got that far, report, never crash
        res["verdict"] = "failed"
        msg = f"{op} failed unexpectedly: {type(e).__name__}: {e} (a bug in provision)"
        if replaced and old is not None and st is not None:
            try:
                _atomic_write(real, old, st, notes=res["notes"])
                res["sha_after"] = res["sha_before"]
                msg += f"; the previous bytes of {real} were put back"
            except OSError as e2:
                msg += f"; putting the previous bytes back failed ({e2.strerror}); backup: {res['backup']}"
        res["error"] = {"kind": "internal", "message": msg}
        return res
    finally:
        if lock is not None:
            lock.release()


def patch_file(path: str, spec: dict, *, state_dir: str, sglang_version: str | None, check: bool = False,
               want_diff: bool = False, resolve_module=None, lock_timeout: float = 30) -> dict:
    """Patch one file safely. Returns the result dict (see the module docstring)."""
    if resolve_module is None:
        resolve_module = default_resolver(path, spec)

    def state_entry(res, plan):
        block = None
        try:
            info = engine.inspect(_read(res["real_file"]), spec, resolve_module)
            block = info["block"]["sha"]
        except Exception:  # state is informative; never fail the patch over it
            pass
        prev = read_state(state_dir).get(res["real_file"], {})
        return {"op": "patch", "verdict": res["verdict"], "sglang_version": sglang_version,
                "spec": spec.get("name"), "block_sha": block, "sha256_before": res["sha_before"],
                "repaired": bool(res["repaired"]) or (bool(prev.get("repaired")) and prev.get("spec") == spec.get("name")),
                "repair_backup": res["backup"] if res["repaired"] else prev.get("repair_backup")}

    return _transaction("patch", path, spec, state_dir=state_dir, check=check, want_diff=want_diff,
                        lock_timeout=lock_timeout,
                        planner=lambda old: engine.plan_patch(old, spec, resolve_module),
                        verifier=_verify_patch(spec, resolve_module), state_entry=state_entry,
                        sglang_version=sglang_version)


def unpatch_file(path: str, spec: dict, *, state_dir: str, check: bool = False, want_diff: bool = False,
                 lock_timeout: float = 30, actor: str | None = None) -> dict:
    """Remove our block safely; verdict "unpatched", "absent" or "failed". The state
    records who (`actor`, user@control-host) unpatched: reconcile holds the host."""
    prev = read_state(state_dir).get(os.path.realpath(path), {})

    def planner(old):
        plan = engine.plan_unpatch(old, spec)
        if plan["verdict"] == "unpatched" and prev.get("repaired") and prev.get("repair_backup"):
            plan["notes"].append(f"this file had been repaired from a hand patch; the hand-patched original is kept in the backup {prev['repair_backup']}")
        return plan

    def state_entry(res, plan):
        return {"op": "unpatch", "verdict": res["verdict"], "sglang_version": prev.get("sglang_version"),
                "spec": spec.get("name"), "block_sha": None, "sha256_before": res["sha_before"], "by": actor,
                "repaired": bool(prev.get("repaired")), "repair_backup": prev.get("repair_backup")}

    return _transaction("unpatch", path, spec, state_dir=state_dir, check=check, want_diff=want_diff,
                        lock_timeout=lock_timeout, planner=planner,
                        verifier=_verify_unpatch(spec), state_entry=state_entry,
                        sglang_version=prev.get("sglang_version"))


def restore_file(path: str, backup_path: str, *, state_dir: str, check: bool = False, want_diff: bool = False,
                 lock_timeout: float = 30, sglang_version: str | None = None) -> dict:
    """Put a backup's bytes back through the same atomic path (the current bytes
    are backed up first, labelled with `sglang_version`, the release installed now,
    which the state records too). Verdict "restored", "unchanged" or "failed".
    Whether this backup may be put back at all is ops.restore.restore_refusal's call."""
    meta = {}
    side = backup_path[: -len(".bak")] + ".json" if backup_path.endswith(".bak") else backup_path + ".json"
    try:
        with open(side, "rb") as fh:
            meta = json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError):
        meta = {}
    real = os.path.realpath(path)

    def planner(old):
        try:
            data = _read(backup_path)
        except OSError as e:
            return {"verdict": "failed", "new": None, "notes": [],
                    "error": {"kind": "backup", "message": _io_message(e, "read the backup", backup_path)}}
        if meta.get("sha256") and meta["sha256"] != _sha(data):
            return {"verdict": "failed", "new": None, "notes": [],
                    "error": {"kind": "backup", "message": f"backup {backup_path} is damaged: sha256 {_sha(data)[:12]}, its sidecar says {meta['sha256'][:12]}"}}
        notes = []
        if meta.get("path") and meta["path"] != real:
            notes.append(f"the backup was taken of {meta['path']}, not {real}")
        if data == old:
            return {"verdict": "unchanged", "new": None, "notes": notes + ["the file already holds the backup's bytes"], "error": None}
        return {"verdict": "restored", "new": data, "notes": notes, "error": None}

    def verify(real_path, expected):
        data = _read(real_path)
        return [] if data == expected else [f"{real_path} does not hold the backup's bytes after the write"]

    version = sglang_version or meta.get("sglang_version")

    def state_entry(res, plan):
        return {"op": "restore", "verdict": res["verdict"], "sglang_version": version,
                "spec": meta.get("spec"), "block_sha": None, "sha256_before": res["sha_before"],
                "restored_from": backup_path, "repaired": False, "repair_backup": None}

    return _transaction("restore", path, {"name": meta.get("spec")}, state_dir=state_dir, check=check,
                        want_diff=want_diff, lock_timeout=lock_timeout, planner=planner,
                        verifier=verify, state_entry=state_entry, sglang_version=version)
