"""The unchanged fast path, shared by `reconcile` and `patch`.  STDLIB ONLY.

Is a spec's file exactly as our last patch of it left it, with nothing else that could change the
answer? Read from the host's state file and the file itself, no discovery, no interpreter probed
(unless a server runs, to learn which install it imports), nothing written. ops/reconcile.py
answers `unchanged` from it; ops/patch.py answers a no-op `patch` from it.
"""

from __future__ import annotations

import os
import re

from provision.host import inference
from provision.host.engine import spec as spec_mod
from provision.host.facts.servers import _fast_servers, changed_at, restart_needed
from provision.host.lib.pkgmeta import git, git_root, package_version
from provision.host.lib.state import read_bytes as _read
from provision.host.lib.state import read_state
from provision.host.lib.state import sha256 as _sha


def specs_of(req: dict) -> list:
    """The specs a request names: ``specs`` (a list: one answer per spec), else ``spec``."""
    if "specs" in req:
        return list(req.get("specs") or [])
    return [req["spec"]] if req.get("spec") else []


def _block_is_current(data: bytes, spec_name: str, block_shas) -> bool:
    """Does the file's begin marker carry a block sha the current spec renders? The
    control side sends every sha the spec can render (engine._block_sha of each subset
    of its methods: some may be native), so no engine is needed here."""
    if not block_shas:
        return False
    m = re.search(rb"^[ \t\f]*" + re.escape(f"{spec_mod.BEGIN_MARK} spec={spec_name} sha=".encode()) + rb"([0-9a-fA-F]+)",
                  data, re.M)
    return m is not None and m.group(1).decode() in set(block_shas)


def fast(req: dict, spec: dict, state_dir: str) -> dict | None:
    """The unchanged fast path, or None when a full look is needed. A spec whose file is in another
    package (flashinfer) takes it too when that package sits beside the engine's install it was
    patched for (the same site-packages: a venv, as pip installs SGLang's pins); else the full
    look finds it (facts/packages.py). The request's engine is the one the agent resolved; a request
    that names none (an op called directly) takes the full look."""
    name = inference.of_request(req)
    if name is None:
        return None
    eng = inference.get(name)
    package = spec.get("package") or eng.package
    state = read_state(state_dir)
    rel = spec["file"]
    cands = [(p, e) for p, e in state.items()
             if isinstance(e, dict) and e.get("spec") == spec["name"] and p.endswith("/" + rel)]
    if req.get("install_path"):
        want = os.path.realpath(os.path.join(req["install_path"], rel))
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
    if package != eng.package:  # pkg is that package's dir: the engine's install beside it
        pkg = os.path.join(os.path.dirname(pkg), eng.package)
        if not os.path.isfile(os.path.join(pkg, "__init__.py")):
            return None
    version = package_version(pkg)
    if version and entry.get("sglang_version") and version != entry["sglang_version"]:
        return None
    root = None if ("site-packages" in pkg or "dist-packages" in pkg) else git_root(pkg)
    if root is not None:
        behind = git(root, "rev-list", "--count", "HEAD..@{u}", "--", os.path.relpath(path, root))
        if behind and behind.isdigit() and int(behind) > 0:
            return None  # upstream moved on: maybe blocked-git, look closer
    servers = _fast_servers(eng)
    if any(s["install"] and s["install"] != pkg for s in servers):
        return None  # a server imports another install: discovery would choose that one
    stale = restart_needed(servers, pkg, changed_at(st))
    return {"ok": True, "path": "fast", "state": "unchanged", "action": "none", "reason": "our patch is in place",
            "file": path, "install": pkg, "version": version or entry.get("sglang_version"), "sha": sha,
            "servers": servers, "restart_needed": [s["pid"] for s in stale], "notes": []}
