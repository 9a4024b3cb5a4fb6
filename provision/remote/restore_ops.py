"""Remote ops for fleet runs: `backups`, `restore` and `reconcile`.  STDLIB ONLY.

Registered with the agent through ``OPS`` (agent._load_extra_ops). ``reconcile``
is also reachable through a lighter entry point (``main`` below, the bootstrap's
``entry``), which the control side runs through ``Session.call(entry=...)``: it
compiles only this module (and, on the slow path, what it imports), not the
agent, discovery and server modules, and skips site-packages processing. On an
unchanged host that is most of the remote cost.

reconcile, per host, in ONE call:

* fast path: ``state.json`` names the spec's file, the file still holds exactly
  the bytes our last patch wrote (sha256), its block marker carries a sha the
  current spec renders (``block_shas`` from the control side: a changed spec is
  re-rendered), the package version is the one recorded, the checkout (if git)
  has no upstream commits to the file, and no SGLang server runs from another
  install. Then: verdict
  ``unchanged``; nothing is written, not even state; no interpreter is probed
  unless a server is running (to learn which install it imports). Likewise a
  file the control side saw native last time (``known_native``) and that is
  byte-identical now is reported native without discovery.
* slow path: full discovery, then ``classify`` (pure, below) over the facts:
  the file's sha against our recorded sha and against the pristine reference
  (the wheel's RECORD for installs; ``git rev-parse HEAD:<file>`` for git
  checkouts; none otherwise), and engine.inspect for the method state.
  ``wiped``/``unpatched``/``stale-block`` are re-patched in the same call
  (through agent.op_patch, so it behaves exactly like `provision patch`).

Host-side logging: when one of these ops changes something (a re-patch, a
restore, a cleaned state entry) it writes one line to the host's syslog through
Python's ``syslog`` module (no subprocess, no extra round trip); nothing is
logged on the fast path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time

# --------------------------------------------------------------------------- light entry point

def main(request: bytes, bundle: bytes) -> int:
    """Entry module of reconcile's light calls (``Session.call(entry=...)``): this module's ops
    only, so the agent, discovery and server modules are not compiled on the fast path."""
    from provision.remote.bootstrap import serve

    def dispatch(req: dict, bundle: bytes) -> dict:
        fn = OPS.get(req.get("op"))
        if fn is None:
            return {"ok": False, "error": {"kind": "bad-request", "message": f"unknown op {req.get('op')!r}"}}
        return fn(req, bundle)

    return serve(dispatch, request, bundle)


# --------------------------------------------------------------------------- small helpers

STATE_NAME = "state.json"  # as fileops.STATE_NAME
_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def default_state_dir() -> str:
    """As agent.default_state_dir (copied: importing the agent costs the fast path ~30 ms)."""
    if os.geteuid() == 0:
        return "/var/lib/provision"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "provision")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def read_state(state_dir: str) -> dict:
    """fileops.read_state without importing fileops (and the engine with it)."""
    try:
        data = json.loads(_read(os.path.join(state_dir, STATE_NAME)).decode("utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def package_version(pkg: str) -> str | None:
    """The version in <pkg>/_version.py or version.py (as discover.package_version, minus pyproject)."""
    for name in ("_version.py", "version.py"):
        try:
            with open(os.path.join(pkg, name), encoding="utf-8") as fh:
                m = _VERSION_RE.search(fh.read())
        except OSError:
            continue
        if m:
            return m.group(1)
    return None


def _boot_time() -> float:
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def proc_start_epoch(pid: int) -> float | None:
    """When a process started (seconds since the epoch), from /proc; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        ticks = int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def changed_at(st) -> float:
    """When a file's bytes last changed: its mtime, or its ctime when later (cp -a and
    some installers keep an old mtime; a rename or write always moves the ctime)."""
    return max(st.st_mtime, st.st_ctime)


def _server_candidates() -> list:
    """Pids that may be SGLang servers, from a cheap look at /proc (false positives
    only cost time: discover.running_servers decides)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return [-1]  # cannot tell: the full look decides
    me = str(os.getpid())
    out = []
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                raw = fh.read(4096)
        except OSError:
            continue
        if b"sglang" in raw and (b"launch_server" in raw or b"serve" in raw):
            out.append(int(pid))
    return out


def _servers() -> list:
    """Running SGLang servers with the install each imports (an interpreter probe each)."""
    from provision.remote import discover

    out = []
    for s in discover.running_servers():
        s["install"] = discover._server_install(s)
        out.append(s)
    return out


def _fast_servers(known) -> list:
    """The servers for the fast paths. A server the control side already knows (same pid,
    same start time: ``known_servers`` from the last answer) keeps its known install, so
    a host with a running server costs no interpreter probe; anything new gets the full
    look (discover.running_servers + a probe)."""
    cands = _server_candidates()
    if not cands:
        return []
    by_pid = {k.get("pid"): k for k in known or [] if isinstance(k, dict)}
    views = []
    for pid in cands:
        k = by_pid.get(pid)
        started = proc_start_epoch(pid)
        if k is None or started is None or k.get("started") is None or abs(k["started"] - started) > 0.5:
            return [_server_view(s) for s in _servers()]
        views.append({"pid": pid, "port": k.get("port"), "listening": None, "install": k.get("install"),
                      "started": started})
    return views


def _server_view(s: dict) -> dict:
    return {"pid": s["pid"], "port": s.get("port"), "listening": s.get("listening"), "install": s.get("install"),
            "started": proc_start_epoch(s["pid"])}


def restart_needed(servers: list, install: str, changed: float) -> list:
    """Servers importing `install` that started before the file last changed."""
    return [s for s in servers if s.get("install") == install and s.get("started") is not None
            and s["started"] < changed]


def host_log(message: str) -> None:
    """One line in the host's syslog (best effort, never raises)."""
    try:
        import syslog

        syslog.openlog("provision", 0, syslog.LOG_USER)
        syslog.syslog(syslog.LOG_NOTICE, message[:900])
        syslog.closelog()
    except Exception:  # noqa: BLE001
        pass


# --------------------------------------------------------------------------- pristine references

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


def _git_root(pkg: str) -> str | None:
    """As discover.git_root: a `.git` up to 4 levels above the package (not for site-packages)."""
    if "site-packages" in pkg or "dist-packages" in pkg:
        return None
    d = os.path.realpath(pkg)
    for _ in range(4):
        d = os.path.dirname(d)
        if os.path.exists(os.path.join(d, ".git")):
            return d
    return None


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(root: str, *args: str, timeout: float = 10) -> str | None:
    import shutil
    import subprocess

    git = shutil.which("git")
    if not git:
        return None
    try:
        proc = subprocess.run([git, "-C", root, *args], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C"))
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_facts(root: str, path: str) -> dict:
    """HEAD's blob of the file, and how many upstream commits HEAD lacks that change the
    file (None: no upstream). Those are what make `git pull` refuse our local change.
    Reads only what the last `git fetch` left; never fetches."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    blob = _git(root, "rev-parse", f"HEAD:{rel}")
    behind = _git(root, "rev-list", "--count", "HEAD..@{u}", "--", rel)
    return {"root": root, "rel": rel, "head_blob": blob,
            "behind": int(behind) if behind and behind.isdigit() else None}


# --------------------------------------------------------------------------- the pure classifier

STATES = ("unchanged", "native", "wiped", "unpatched", "held", "stale-block", "foreign-edit", "blocked-git",
          "missing-file", "error")
ACTIONS = ("none", "patch", "clean-state", "refresh-state")


def classify(f: dict) -> dict:
    """Decide what reconcile does with one file.  Pure.

    f (every key optional):
      exists               the spec's file exists
      parse_error          the engine could not read the class (message) or None
      methods              {name: "native" | "ours" | "missing"} (engine.inspect)
      block                our managed block is in the file
      block_matches        ... and is exactly what the spec renders
      hand_patch           methods appended at module level (`cat >> file`)
      sha                  sha256 of the file now
      recorded_op          the op state.json last recorded for the file ("patch", "unpatch", "restore") or None
      recorded_sha_after   the sha256 that op left
      recorded_version     the SGLang version it recorded
      version              the SGLang version now
      pristine             the file equals the release's own (RECORD / git HEAD): True, False, None (unknown)
      unpatched_pristine   the file minus our block equals the release's own: True, False, None
      git_behind           upstream commits the checkout lacks that change the file (None: not git or
                           no upstream): with our local change in the file, `git pull` refuses them
      recorded_by          who ran that op (user@control-host), recorded_time when
      force                act on foreign edits too
      include_held         re-patch a host held by an explicit `provision unpatch` too

    An explicit `provision unpatch` is a decision: the host is "held" (left alone, who
    and when in the reason) until `provision patch` runs on it again, or reconcile runs
    with --include-held.

    Returns {"state", "action", "reason"}: state in STATES, action in ACTIONS.
    """
    def out(state, action, reason):
        return {"state": state, "action": action, "reason": reason}

    force = bool(f.get("force"))
    methods = f.get("methods") or {}
    rec_op = f.get("recorded_op")
    ver, rec_ver = f.get("version"), f.get("recorded_version")
    moved = f" (SGLang {rec_ver} -> {ver})" if rec_ver and ver and rec_ver != ver else ""
    if not f.get("exists"):
        return out("missing-file", "none", "the spec's file does not exist in this install")
    if f.get("parse_error"):
        if f.get("pristine") is False:
            return out("foreign-edit", "none", f"someone edited the file and the engine cannot read it: "
                                                f"{f['parse_error']}; fix or reinstall it, then reconcile")
        return out("error", "none", f"the spec does not fit this file: {f['parse_error']}")
    if methods and all(v == "native" for v in methods.values()):
        if f.get("block"):
            return out("native", "patch", "the methods are native now and our old block duplicates them")
        if rec_op is not None:
            return out("native", "clean-state", f"the methods are native{moved}")
        return out("native", "none", "the methods are native")
    if f.get("hand_patch"):
        return out("foreign-edit", "patch" if force else "none",
                   "a hand patch (methods appended at module level)"
                   + ("" if force else "; left alone (--force repairs it)"))
    if f.get("block"):
        intact = rec_op == "patch" and f.get("sha") is not None and f.get("sha") == f.get("recorded_sha_after")
        clean = intact or f.get("unpatched_pristine") is not False
        if not clean:
            if force and f.get("block_matches"):
                return out("unchanged", "refresh-state", "our block is in place; other lines differ from the "
                                                         "release (--force: adopted as the patched state)")
            return out("foreign-edit", "patch" if force else "none",
                       "our block is there but other lines differ from the release"
                       + ("" if force else "; left alone (--force adopts the file as it is)"))
        if f.get("block_matches") and all(v in ("native", "ours") for v in methods.values()):
            if f.get("git_behind"):
                return out("blocked-git", "none",
                           f"our patch is a local change in a git checkout whose upstream has {f['git_behind']} "
                           "new commit(s) to this file: `git pull` refuses them. Run `provision unpatch`, "
                           "`git pull`, then `provision reconcile`")
            fresh = intact and (rec_ver is None or ver is None or rec_ver == ver)
            return out("unchanged", "none" if fresh else "refresh-state", "our patch is in place")
        return out("stale-block", "patch", "our block does not match the spec (or a method became native)")
    if rec_op == "unpatch" and not f.get("include_held"):
        who = f.get("recorded_by") or "an unknown user"
        when = f.get("recorded_time") or "an unknown time"
        return out("held", "none", f"held: `provision unpatch` by {who} at {when}; left alone until "
                                   "`provision patch` runs on it (or reconcile --include-held)")
    if f.get("pristine") is False:
        return out("foreign-edit", "patch" if force else "none",
                   "the methods are missing and the file differs from the release's own (someone edited it)"
                   + ("" if force else "; left alone (--force patches it)"))
    if rec_op == "patch":
        if moved:
            why = f"SGLang changed{moved}"
        elif f.get("pristine"):
            why = "the file is the release's own again (SGLang reinstalled)"
        else:
            why = "the file was replaced"
        return out("wiped", "patch", f"our block is gone: {why}")
    last = f" (the last provision op on it was {rec_op})" if rec_op else ""
    return out("unpatched", "patch", f"the methods are missing{last}")


# --------------------------------------------------------------------------- state edits

def _edit_state(state_dir: str, real: str, update: dict | None) -> None:
    """Drop (update None) or update the state entry of `real` (making one if there is
    none), under the host lock."""
    from provision.remote import fileops

    lock = fileops._Lock(state_dir, 30)
    try:
        state = fileops.read_state(state_dir)
        if update is None:
            if state.pop(real, None) is None:
                return
        else:
            state[real] = dict(state.get(real) or {"op": "patch", "verdict": "adopted", "backup": None},
                               **update, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        fileops._write_json(os.path.join(state_dir, fileops.STATE_NAME), state)
    finally:
        lock.release()


# --------------------------------------------------------------------------- reconcile

BEGIN_MARK = "# >>> provision managed block:"  # as engine.BEGIN_MARK


def _block_is_current(data: bytes, spec_name: str, block_shas) -> bool:
    """Does the file's begin marker carry a block sha the current spec renders? The
    control side sends every sha the spec can render (engine._block_sha of each subset
    of its methods: some may be native), so no engine is needed here."""
    if not block_shas:
        return False
    m = re.search(rb"^[ \t\f]*" + re.escape(f"{BEGIN_MARK} spec={spec_name} sha=".encode()) + rb"([0-9a-fA-F]+)",
                  data, re.M)
    return m is not None and m.group(1).decode() in set(block_shas)


def _fast(req: dict, spec: dict, state_dir: str) -> dict | None:
    """The unchanged fast path, or None when a full look is needed."""
    state = read_state(state_dir)
    rel = spec["file"]
    cands = [(p, e) for p, e in state.items()
             if isinstance(e, dict) and e.get("spec") == spec["name"] and p.endswith("/" + rel)]
    if req.get("sglang_path"):
        want = os.path.realpath(os.path.join(req["sglang_path"], rel))
        cands = [(p, e) for p, e in cands if p == want]
    if len(cands) != 1:
        return None
    path, entry = cands[0]
    if entry.get("op") != "patch" or not entry.get("sha256_after"):
        return None
    try:
        st = os.stat(path)
        data = _read(path)
    except OSError:
        return None
    sha = _sha(data)
    if sha != entry["sha256_after"]:
        return None
    if not _block_is_current(data, spec["name"], req.get("block_shas")):
        return None  # the spec changed since that patch (or no hint): look closer
    pkg = path[: -len(rel) - 1]
    version = package_version(pkg)
    if version and entry.get("sglang_version") and version != entry["sglang_version"]:
        return None
    root = _git_root(pkg)
    if root is not None:
        behind = _git(root, "rev-list", "--count", "HEAD..@{u}", "--", os.path.relpath(path, root))
        if behind and behind.isdigit() and int(behind) > 0:
            return None  # upstream moved on: maybe blocked-git, look closer
    servers = _fast_servers(req.get("known_servers"))
    if any(s["install"] and s["install"] != pkg for s in servers):
        return None  # a server imports another install: discovery would choose that one
    stale = restart_needed(servers, pkg, changed_at(st))
    return {"ok": True, "path": "fast", "state": "unchanged", "action": "none", "reason": "our patch is in place",
            "file": path, "install": pkg, "version": version or entry.get("sglang_version"), "sha": sha,
            "servers": servers, "restart_needed": [s["pid"] for s in stale], "notes": []}


def _fast_native(req: dict, spec: dict, state_dir: str) -> dict | None:
    """A file the control side saw native last time (``known_native``: path, sha256,
    version, for this same spec) and that is byte-identical now is still native."""
    kn = req.get("known_native") or {}
    path, rel = kn.get("file"), spec["file"]
    if not path or not kn.get("sha") or not path.endswith("/" + rel):
        return None
    if req.get("sglang_path") and os.path.realpath(os.path.join(req["sglang_path"], rel)) != path:
        return None
    if path in read_state(state_dir):
        return None  # stale state to drop: the full path does that
    try:
        data = _read(path)
    except OSError:
        return None
    if _sha(data) != kn["sha"]:
        return None
    pkg = path[: -len(rel) - 1]
    version = package_version(pkg)
    if version and kn.get("version") and version != kn["version"]:
        return None
    servers = _fast_servers(req.get("known_servers"))
    if any(s["install"] and s["install"] != pkg for s in servers):
        return None
    return {"ok": True, "path": "fast", "state": "native", "action": "none", "reason": "the methods are native",
            "file": path, "install": pkg, "version": version or kn.get("version"), "sha": kn["sha"],
            "servers": servers, "restart_needed": [], "notes": []}


def op_reconcile(req: dict, bundle: bytes) -> dict:
    t0 = time.monotonic()
    spec = req["spec"]
    state_dir = req.get("state_dir") or default_state_dir()
    if not req.get("full"):
        ans = _fast(req, spec, state_dir) or _fast_native(req, spec, state_dir)
        if ans is not None:
            ans["elapsed"] = round(time.monotonic() - t0, 4)
            return ans
    ans = _full(req, bundle, spec, state_dir)
    ans["elapsed"] = round(time.monotonic() - t0, 4)
    return ans


def _full(req: dict, bundle: bytes, spec: dict, state_dir: str) -> dict:
    from provision.remote import agent, engine

    facts = agent._facts(req)
    slim = {"installs": facts.get("installs"), "chosen": facts.get("chosen"),
            "chosen_reason": facts.get("chosen_reason"), "error": facts.get("error")}
    if facts.get("error"):
        return {"ok": False, "path": "full", "facts": slim, "error": facts["error"]}
    inst = agent._install(facts)
    if inst is None:
        return {"ok": False, "path": "full", "facts": slim,
                "error": {"kind": "not-found", "message": "no SGLang install chosen"}}
    path = os.path.join(inst["path"], spec["file"])
    real = os.path.realpath(path)
    servers = [_server_view(s) for s in facts.get("servers") or []]
    base = {"ok": True, "path": "full", "facts": slim, "file": real, "install": inst["path"],
            "version": inst.get("version"), "kind": inst.get("kind"), "git": inst.get("git"),
            "servers": servers, "notes": [], "restart_needed": []}
    entry = read_state(state_dir).get(real) or {}
    f = {"exists": os.path.isfile(real), "force": bool(req.get("force")), "version": inst.get("version"),
         "recorded_op": entry.get("op"), "recorded_sha_after": entry.get("sha256_after"),
         "recorded_version": entry.get("sglang_version"), "recorded_by": entry.get("by"),
         "recorded_time": entry.get("time"), "include_held": bool(req.get("include_held"))}
    if f["exists"]:
        try:
            src = _read(real)
        except OSError as exc:
            return dict(base, ok=False, error={"kind": "io", "message": f"cannot read {real}: {exc.strerror}"})
        f["sha"] = base["sha"] = _sha(src)
        info = engine.inspect(src, spec, resolve_module=agent.module_resolver(inst["path"]))
        f["parse_error"] = (info.get("error") or {}).get("message")
        f["methods"] = info.get("methods") or {}
        f["block"] = bool((info.get("block") or {}).get("present"))
        f["block_matches"] = bool((info.get("block") or {}).get("matches"))
        f["hand_patch"] = bool(info.get("hand_patch"))
        base["methods"] = f["methods"]
        unpatched = None
        if f["block"]:
            plan = engine.plan_unpatch(src, spec)
            unpatched = plan.get("new") if plan.get("verdict") == "unpatched" else None
        ref = None
        rel_in_dist = "sglang/" + spec["file"]
        if inst.get("dist_info"):
            ref = record_sha(inst["dist_info"], rel_in_dist)
            if ref is not None:
                base["reference"] = "RECORD"
                f["pristine"] = f["sha"] == ref
                if unpatched is not None:
                    f["unpatched_pristine"] = _sha(unpatched) == ref
        if ref is None and inst.get("git"):
            g = git_facts(inst["git"], real)
            base["git_facts"] = g
            f["git_behind"] = g["behind"]
            if g["head_blob"]:
                base["reference"] = "git HEAD"
                f["pristine"] = git_blob_sha(src) == g["head_blob"]
                if unpatched is not None:
                    f["unpatched_pristine"] = git_blob_sha(unpatched) == g["head_blob"]
    decision = classify(f)
    base.update(decision)
    base["classifier_input"] = {k: v for k, v in f.items() if k != "methods"}
    check = bool(req.get("check"))
    action = decision["action"]
    if action == "patch" and not check:
        sub = dict(req, op="patch", sglang_path=inst["path"], check=False, force=False)
        ans = agent.op_patch(sub, bundle)
        ans.pop("facts", None)
        base["patch"] = ans
        res = ans.get("result") or {}
        if res.get("verdict") in ("patched", "repaired"):
            host_log(f"reconcile re-patched {real} ({decision['state']}; spec {spec['name']}; "
                     f"sha256 {res.get('sha_before', '')[:12]} -> {res.get('sha_after', '')[:12]})")
    elif action == "clean-state" and not check:
        _edit_state(state_dir, real, None)
        base["state_cleaned"] = True
        host_log(f"reconcile: {real} has the methods natively; dropped provision's state entry")
    elif action == "refresh-state" and not check:
        _edit_state(state_dir, real, {"op": "patch", "sglang_version": inst.get("version"),
                                      "sha256_after": f.get("sha"), "spec": spec["name"]})
        base["state_refreshed"] = True
    if f["exists"]:
        try:
            changed = changed_at(os.stat(real))
        except OSError:
            changed = time.time()
        base["restart_needed"] = [s["pid"] for s in restart_needed(servers, inst["path"], changed)]
    return base


# --------------------------------------------------------------------------- backups / restore

def _target(req: dict) -> tuple:
    """(real file path, install record or None, facts or None, error or None)."""
    if req.get("file"):
        return os.path.realpath(req["file"]), None, None, None
    from provision.remote import agent

    facts = agent._facts(req)
    if facts.get("error"):
        return None, None, facts, facts["error"]
    inst = agent._install(facts)
    if inst is None:
        return None, None, facts, {"kind": "not-found", "message": "no SGLang install chosen"}
    return os.path.realpath(os.path.join(inst["path"], req["spec"]["file"])), inst, facts, None


def _backup_view(meta: dict) -> dict:
    return {"id": (meta.get("sha256") or "")[:12], "time": meta.get("time"), "sha256": meta.get("sha256"),
            "size": meta.get("size"), "sglang_version": meta.get("sglang_version"), "spec": meta.get("spec"),
            "reason": meta.get("reason"), "original": bool(meta.get("original")), "backup": meta.get("backup")}


def op_backups(req: dict, bundle: bytes) -> dict:
    from provision.remote import fileops

    state_dir = req.get("state_dir") or default_state_dir()
    real, inst, facts, err = _target(req)
    if err:
        return {"ok": False, "error": err}
    try:
        current = _sha(_read(real))
    except OSError:
        current = None
    return {"ok": True, "file": real, "install": inst and inst["path"], "version": inst and inst.get("version"),
            "current_sha": current, "state_dir": state_dir,
            "backups": [_backup_view(m) for m in fileops.list_backups(state_dir, real)]}


def choose_backup(backups: list, ident: str | None, original: bool) -> tuple:
    """(backup, error message): the original (first) by default, else the one whose id,
    sha256 or file name starts with `ident`."""
    if not backups:
        return None, "no backups"
    if ident is None or original:
        firsts = [b for b in backups if b.get("original")] or backups[:1]
        return firsts[0], None
    ident = ident.strip()
    hits = [b for b in backups if (b.get("sha256") or "").startswith(ident)
            or os.path.basename(b.get("backup") or "").startswith(ident)]
    if not hits:
        return None, f"no backup with id {ident!r} (ids: {', '.join(b['id'] for b in backups)})"
    if len(hits) > 1:
        return None, f"backup id {ident!r} is ambiguous: {', '.join(b['id'] for b in hits)}"
    return hits[0], None


def restore_refusal(chosen: dict, installed: str | None, current_sha: str | None, left: dict | None) -> str | None:
    """Why putting back `chosen` would be a silent downgrade or clobber, or None.  Pure.

    A backup may be restored only when it was taken under the SGLang version installed
    now, and when the file is still as provision last left it (`left`: the sha256 our
    last change wrote, from the host's state or else the control journal, with what
    and when). Anything else is refused; --force overrides."""
    reasons = []
    bid = f"backup {chosen.get('id')} ({'the original' if chosen.get('original') else chosen.get('time')})"
    bver = chosen.get("sglang_version")
    if not bver or not installed:
        reasons.append(f"{bid} was taken under SGLang {bver or '(version not recorded)'} and the install is "
                       f"SGLang {installed or '(version unknown)'}: provision cannot tell they are the same release")
    elif bver != installed:
        reasons.append(f"{bid} was taken under SGLang {bver}, but SGLang {installed} is installed now: it would put "
                       f"{bver}'s file into {installed}")
    if not left or not left.get("sha"):
        reasons.append("provision has no record of how it last left the file, so it cannot tell what a restore "
                       "would overwrite")
    elif current_sha != left["sha"]:
        reasons.append(f"the file is not as provision last left it (sha256 {str(current_sha)[:12]} now, "
                       f"{left['sha'][:12]} after {left.get('what') or 'its last change'}): something else "
                       "changed it since")
    if not reasons:
        return None
    return ("refusing to restore: " + "; and ".join(reasons)
            + ". Pick another backup (`provision restore --list`), or pass --force to restore anyway")


def _last_left(state_dir: str, real: str, journal: dict | None) -> dict | None:
    """The sha256 provision's last change left in `real`: the host's state, else the
    control journal's last entry for this host and file (sent by the control side)."""
    entry = read_state(state_dir).get(real) or {}
    if entry.get("sha256_after"):
        return {"sha": entry["sha256_after"], "what": f"the last {entry.get('op') or 'change'} "
                                                      f"({entry.get('time') or 'time unknown'})"}
    journal = journal or {}
    if journal.get("sha256_after") and journal.get("file") == real:
        return {"sha": journal["sha256_after"], "what": f"the last `provision {journal.get('command')}` in the "
                                                        f"control journal ({journal.get('time')})"}
    return None


def op_restore(req: dict, bundle: bytes) -> dict:
    from provision.remote import fileops

    state_dir = req.get("state_dir") or default_state_dir()
    real, inst, facts, err = _target(req)
    if err:
        return {"ok": False, "error": err}
    backups = [_backup_view(m) for m in fileops.list_backups(state_dir, real)]
    chosen, why = choose_backup(backups, req.get("backup"), bool(req.get("original")))
    if chosen is None:
        where = os.path.join(state_dir, fileops.BACKUP_DIR)
        return {"ok": False, "file": real, "backups": backups,
                "error": {"kind": "no-backup", "message": f"{real}: {why} (backups live in {where})"}}
    rel = (req.get("spec") or {}).get("file") or ""
    installed = inst.get("version") if inst else (
        package_version(real[: -len(rel) - 1]) if rel and real.endswith("/" + rel) else None)
    try:
        current = _sha(_read(real))
    except OSError:
        current = None
    refusal = restore_refusal(chosen, installed, current, _last_left(state_dir, real, req.get("journal_last")))
    if refusal and not req.get("force"):
        return {"ok": False, "file": real, "install": inst and inst["path"], "version": installed,
                "backups": backups, "result": {"verdict": "failed", "chosen": chosen, "real_file": real,
                                               "error": {"kind": "restore-refused", "message": refusal}},
                "error": {"kind": "restore-refused", "message": refusal}}
    res = fileops.restore_file(real, chosen["backup"], state_dir=state_dir, check=bool(req.get("check")),
                               want_diff=bool(req.get("diff")), sglang_version=installed)
    if refusal:
        res.setdefault("notes", []).append("--force: " + refusal[len("refusing to restore: "):].split(". Pick")[0])
    res["chosen"] = chosen
    if res.get("verdict") == "restored" and not req.get("check"):
        which = "the original" if chosen["original"] else chosen["time"]
        host_log(f"restored {real} from backup {chosen['id']} ({which}); "
                 f"sha256 {(res.get('sha_before') or '')[:12]} -> {(res.get('sha_after') or '')[:12]}")
        if facts and inst:
            running = [s for s in facts.get("servers") or [] if s.get("install") == inst["path"]]
            if running:
                res.setdefault("notes", []).append(
                    f"restart needed: the running server (pid {running[0]['pid']}) imported the old file")
                res["restart_needed"] = True
    return {"ok": res.get("verdict") != "failed", "file": real, "install": inst and inst["path"],
            "version": installed, "result": res, "error": res.get("error"),
            "backups": backups}


OPS = {"reconcile": op_reconcile, "backups": op_backups, "restore": op_restore}
