"""`provision restore` (and `restore --list`) for one host: the request, the answer as a HostResult."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import RestoreAnswer

from provision.output.results import HostResult


def last_change(host: str) -> dict | None:
    """The journal's last change to `host` (file, sha256 after, command, time): what the host
    falls back on when its own state does not say how provision last left the file."""
    from provision.control import journal

    try:
        recs, _bad = journal.read(host=host)
    except OSError:
        return None
    for rec in reversed(recs):
        if rec.get("verdict") in journal.CHANGE_VERDICTS and rec.get("sha256_after") and rec.get("file"):
            return {k: rec.get(k) for k in ("file", "sha256_after", "command", "time")}
    return None


def _restore_result(host: str, ans: RestoreAnswer, spec, listing: bool) -> HostResult:
    data = {"spec": spec.name, "spec_hash": spec.sha, "backups": ans.get("backups") or [],
            "current_sha": ans.get("current_sha")}
    if not ans.get("ok"):
        err = ans.get("error") or {}
        return HostResult(host, "failed", err.get("message", "failed on the host"), file=ans.get("file"),
                          version=ans.get("version"), install=ans.get("install"), error_kind=err.get("kind"),
                          data=data)
    if listing:
        n = len(data["backups"])
        return HostResult(host, "ok", f"{n} backup{'s' if n != 1 else ''} in {ans.get('state_dir')}",
                          file=ans.get("file"), version=ans.get("version"), install=ans.get("install"), data=data)
    res = ans.get("result") or {}
    chosen = res.get("chosen") or {}
    what = f"backup {chosen.get('id')} ({'the original' if chosen.get('original') else chosen.get('time')}"
    what += f", sglang {chosen.get('sglang_version')})" if chosen.get("sglang_version") else ")"
    verdict = res.get("verdict") or "failed"
    if res.get("error"):
        detail = res["error"].get("message", "")
    elif verdict == "restored":
        detail = f"from {what}"
    else:
        detail = f"already holds {what}"
    data.update({k: res.get(k) for k in ("sha_before", "sha_after", "backup") if res.get(k)})
    data["chosen"] = chosen
    if res.get("restart_needed"):
        data["restart_needed"] = True
    return HostResult(host, verdict, detail, file=res.get("real_file") or ans.get("file"), version=ans.get("version"),
                      install=ans.get("install"), notes=list(res.get("notes") or []), diff=res.get("diff"),
                      error_kind=(res.get("error") or {}).get("kind"), data=data)


def restore_fn(spec=None, *, list_=False, backup_id=None, file_=None, check=False, diff=False, force=False,
               install_path=None, python=None, timeout=300.0):
    """The per-host restore (or backup listing): one remote call; `spec` None is each host's own."""
    from provision.tasks.reconcile import _spec

    def fn(host, session, fleet) -> HostResult:
        hspec = spec or _spec(host.get("spec"))
        req = {"op": "backups" if list_ else "restore", "spec": hspec.to_engine(), "file": file_,
               "backup": backup_id, "original": not backup_id, "check": check, "diff": diff, "force": force,
               "install_path": host.install_path(install_path), "python": python or host.get("python"),
               "journal_last": last_change(host.name)}
        ans = session.call(req, timeout=timeout, sudo=fleet.uses_sudo(host, session))
        return _restore_result(host.name, ans, hspec, list_)

    return fn
