"""`provision audit` for one host: the request, and the answer turned into rows and a HostResult."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provision.output.results import HostResult

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import AuditAnswer


def known_specs(extra: str | None = None, engine: str | None = None) -> list:
    """The shipped playbooks' specs (and `extra`'s) of files in `engine`'s package (default SGLang's):
    the coverage the audit counts."""
    from provision.config.playbook import PACKAGE_PLAYBOOKS, load_playbook
    from provision.host import inference

    packages = [inference.PACKAGES[engine]] if engine else list(inference.PACKAGES.values())  # None: each engine's
    specs = []
    paths = sorted(PACKAGE_PLAYBOOKS.glob("*.yaml")) + ([extra] if extra else [])
    for p in paths:
        pb = load_playbook(str(p))
        if pb.patch is not None and pb.patch.package in packages:
            specs.append(pb.patch)
    return specs


def spec_state(st: dict) -> str:
    """A spec's state in the audited install, from the engine's per-method view through the one
    patch-state summary (tasks/patch.py): native, patched, or not patched (also file-missing, error)."""
    from provision.tasks.patch import patch_state

    if "methods" not in st or str(st.get("state", "")).startswith("error"):
        return st.get("state")
    verdict, _ = patch_state({"methods": st["methods"]})
    return verdict if verdict in ("native", "patched") else "not patched"


def rows_from_answer(ans: dict) -> list[dict]:
    """One row per gap (and per covered wrapper): class, verdict, covered-by, patch state."""
    audit = ans["audit"]
    states = ans.get("spec_states") or {}
    rows = []
    seen = set()
    for gap in audit.get("wrappers", []):
        st = states.get(gap["class"])
        rows.append({"class": gap["class"], "file": gap["file"], "attr": gap.get("attr"),
                     "verdict": gap["verdict"], "missing": gap.get("missing", []),
                     "inner": gap.get("inner", []), "reason": gap.get("reason", ""),
                     "covered_by": st["spec"] if st else None, "patch_state": spec_state(st) if st else None})
        seen.add(gap["class"])
    for cls, st in states.items():
        if cls not in seen and spec_state(st) == "patched":
            rows.append({"class": cls, "file": None, "attr": None, "verdict": "closed", "missing": [], "inner": [],
                         "reason": "closed by provision's patch", "covered_by": st["spec"], "patch_state": "patched"})
    return rows


def uncovered_fixable(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["verdict"] == "fixable" and not (r["covered_by"])]


def audit_fn(specs: list, *, install_path=None, python=None, timeout=300.0, engine: str | None = None):
    """The per-host audit of `engine`'s install (None: the host's one engine; a host with several is
    refused, naming each): one remote call, the answer as a HostResult (gaps or ok)."""
    from provision.host import inference

    def fn(host, session, fleet) -> HostResult:
        ans: AuditAnswer = session.call({"op": "audit", "engine": engine or inference.FROM_HOST,
                                         "specs": [s.to_engine() for s in specs],
                            "install_path": host.install_path(install_path),
                            "python": python or host.get("python")},
                           timeout=timeout, sudo=fleet.uses_sudo(host, session))
        if not ans.get("ok"):
            err = ans.get("error") or {}
            if err.get("kind") == "engine-ambiguous":
                return HostResult(host.name, "refused", err.get("message", ""), error_kind="usage")
            return HostResult(host.name, "failed", err.get("message", "audit failed"))
        used = ans.get("engine") or engine or inference.DEFAULT
        broken = (ans.get("audit") or {}).get("error")
        if broken:  # a tree it could not read is judged by nobody: failed (exit 3), naming the file
            return HostResult(host.name, "failed", broken.get("message", "the audit could not read the install"),
                              error_kind="audit")
        unread = [u for u in (ans.get("audit") or {}).get("unparsable") or []
                  if str(u.get("error", "")).split(":")[0] in ("OSError", "PermissionError", "IsADirectoryError")]
        if unread:  # a model file it could not read is not one without gaps
            more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
            return HostResult(host.name, "failed", f"{unread[0]['file']} cannot be read ({unread[0]['error']}){more}: "
                              "the audit judges no install it cannot read", error_kind="audit")
        rows = rows_from_answer(ans)
        unc = uncovered_fixable(rows)
        inst = next((i for i in ans["facts"]["installs"] if i["path"] == ans["facts"]["chosen"]), {})
        return HostResult(host.name, "gaps" if unc else "ok",
                          f"{len(rows)} wrapper gaps, {len(unc)} fixable and uncovered",
                          version=inst.get("version"), install=inst.get("path"),
                          data={"gaps": rows, "uncovered_fixable": [x["class"] for x in unc], "engine": used,
                                "engine_package": inference.PACKAGES[used],
                                "files_scanned": ans["audit"].get("files_scanned")})

    return fn
