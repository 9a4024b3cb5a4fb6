"""The `patch` op as the agent dispatches it: a no-op answered from the fast path.  STDLIB ONLY.

A timer's `patch` on a host already patched is the hot path. When every spec's file holds exactly
the bytes our last patch of that spec wrote (ops/fastpath.py: the state file, the file, its block
sha), the answer is `unchanged` from here, with only the state file and the file read: neither
discovery (facts/installs.py) nor the engine's parser is imported. Anything else goes to
ops/patch.py, imported only then, whose answer is the full look's.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

from provision.host.lib.modules import PACKAGE
from provision.host.lib.paths import default_state_dir
from provision.host.ops.fastpath import fast, specs_of
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import PatchAnswer, PatchRequest


def op_patch(req: PatchRequest, bundle: bytes) -> PatchAnswer:
    """`patch`: the fast path's answer, else ops/patch.py's full look."""
    ans = answer(dict(req))
    if ans is not None:
        return ans
    from provision.host.ops import patch

    return patch.op_patch(req, bundle)


def answer(req: dict) -> PatchAnswer | None:
    """The no-op patch without discovery (reconcile's fast path, ops/fastpath.py),
    or None. Taken only when nothing but the file's state can change the answer: not for
    --force, --diff, --verify-import or a named interpreter (discovery picks the install it
    imports), and only when every spec's file holds exactly the bytes our last patch of that
    spec wrote, its block is the one the spec renders now, the version is the recorded one,
    and no server runs or loads from another install or loads from this one."""
    if req.get("force") or req.get("diff") or req.get("verify_import") or req.get("python"):
        return None
    state_dir = req.get("state_dir") or default_state_dir()
    results, pkg, servers = [], None, []
    given = req.get("spec_block_shas") or {}
    for spec in specs_of(req):
        if not isinstance(spec, dict) or not spec.get("name") or not spec.get("file") \
                or (spec.get("package") or PACKAGE) != PACKAGE:
            return None  # a file in another package (flashinfer): the full path reads its version
        shas = given.get(str(spec["name"]))
        if shas is None:  # not sent (an in-process caller): render it here
            from provision.host.engine.render import block_shas

            shas = list(block_shas(spec))
        one = fast(dict(req, spec=spec, block_shas=shas), spec, state_dir)
        if one is None or (pkg is not None and one["install"] != pkg):
            return None
        pkg, servers = one["install"], one["servers"]
        if any(not s.get("listening") and s.get("install") == pkg for s in servers):
            return None  # a loading server: the full path says so (or --check/--force decide)
        info = {"name": PACKAGE, "dir": pkg, "version": one["version"], "dist_info": None, "error": None}
        res = {"verdict": "unchanged", "file": one["file"], "real_file": one["file"], "added": [], "native": [],
               "kept": [m["name"] for m in spec.get("methods") or []], "updated": False, "repaired": [],
               "module_level_leftovers": [], "notes": [], "diff": None, "sha_before": one["sha"],
               "sha_after": one["sha"], "backup": None, "check": bool(req.get("check")), "error": None,
               "elapsed": 0.0, "package": info, "path": "fast"}
        results.append({"ok": True, "spec": str(spec["name"]), "result": res, "error": None})
    if not results or pkg is None:
        return None
    kind = "site-packages" if ("site-packages" in pkg or "dist-packages" in pkg) else "source"
    inst = {"path": pkg, "kind": kind, "version": results[0]["result"]["package"]["version"], "interpreters": [],
            "dist_info": None, "git": None, "pythonpath": None, "search_path": None}
    facts = {"installs": [inst], "servers": servers, "chosen": pkg,
             "chosen_reason": "unchanged since provision's last patch (fast path: no discovery)",
             "warnings": [], "skipped": [], "error": None, "fast": True}
    if "specs" in req:
        return {"ok": True, "facts": facts, "results": results}  # type: ignore[typeddict-item]
    one_ans = dict(results[0])
    one_ans.pop("spec", None)
    return dict(one_ans, facts=facts)  # type: ignore[return-value]


OPS = {"patch": op_patch}
