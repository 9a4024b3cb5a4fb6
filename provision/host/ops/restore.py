"""The `backups` and `restore` ops.  STDLIB ONLY."""

from __future__ import annotations

import os
from typing import Any, Mapping, TYPE_CHECKING

from provision.host.facts import installs, packages
from provision.host.lib.hostlog import host_log
from provision.host.lib.paths import default_state_dir
from provision.host.lib.pkgmeta import package_version
from provision.host.lib.state import read_bytes as _read
from provision.host.lib.state import read_state
from provision.host.lib.state import sha256 as _sha
from provision.host.ops import fileops
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import BackupsAnswer, BackupsRequest, FileResult, RestoreAnswer, RestoreRequest


# --------------------------------------------------------------------------- backups / restore

def _target(req: Mapping[str, Any]) -> tuple:
    """(real file path, install record or None, facts or None, error or None)."""
    if req.get("file"):
        return os.path.realpath(req["file"]), None, None, None
    facts = installs.for_request(req)
    if facts.get("error"):
        return None, None, facts, facts["error"]
    inst = installs.chosen_install(facts)
    if inst is None:
        return None, None, facts, {"kind": "not-found", "message": "no SGLang install chosen"}
    path, pkg = packages.spec_file(inst, req["spec"])
    if path is None:
        return None, inst, facts, pkg["error"]
    return os.path.realpath(path), inst, facts, None


def _backup_view(meta: dict) -> dict:
    return {"id": (meta.get("sha256") or "")[:12], "time": meta.get("time"), "sha256": meta.get("sha256"),
            "size": meta.get("size"), "sglang_version": meta.get("sglang_version"), "spec": meta.get("spec"),
            "reason": meta.get("reason"), "original": bool(meta.get("original")), "backup": meta.get("backup")}


def op_backups(req: BackupsRequest, bundle: bytes) -> BackupsAnswer:
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


def op_restore(req: RestoreRequest, bundle: bytes) -> RestoreAnswer:
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
    res: FileResult = fileops.restore_file(real, chosen["backup"], state_dir=state_dir, check=bool(req.get("check")),
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


OPS = {"backups": op_backups, "restore": op_restore}
