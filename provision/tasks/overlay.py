"""Overlay mode from the control side: `patch --overlay` / `unpatch --overlay` on a host, and
`overlay write` on this machine (no SSH).

An overlay is the fix as a package SGLang (0.5.6+) loads on purpose through
SGLANG_EXTERNAL_MODEL_PACKAGE: a subclass of the wrapper, of the same name, with the spec's
delegation methods. The host renders and stages it (provision/host/ops/overlay.py); `overlay
write` renders it here with the same engine code (host/engine/overlay.py, pure) for a container
or a Kubernetes init container that writes it into a shared volume.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from provision.config.inventory import Host
from provision.config.playbook import PatchSpec, load_patch_spec
from provision.host.lib import atomic
from provision.output.results import HostResult

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import OverlayAnswer, OverlayRequest


def request_for(host: Host, specs: list[PatchSpec], *, check: bool = False, remove: bool = False,
                install_path: str | None = None, python: str | None = None,
                verify_import: bool = False) -> OverlayRequest:
    """One request for every spec: the install's one overlay carries them all (and keeps the others
    it already carries; `remove` takes only these out). `verify_import`: import it in the install's
    interpreter too (the spec's code runs then: only when asked)."""
    return {"op": "overlay", "check": check, "remove": remove, "specs": [s.to_engine() for s in specs],
            "install_path": host.install_path(install_path), "python": python or host.get("python"),
            "verify_import": verify_import}


def result_from_answer(host: str, answer: OverlayAnswer, *, check: bool = False) -> HostResult:
    """staged / unchanged / native / removed / absent / failed, with the two environment lines."""
    from provision.tasks.patch import _chosen, discovery_notes

    facts = answer.get("facts") or {}
    inst = _chosen(facts)
    ov = answer.get("overlay") or {}
    err = answer.get("error") or ov.get("error")
    verdict = ov.get("verdict") or ("failed" if err else "ok")
    notes = list(ov.get("notes") or []) + discovery_notes(facts, skipped=False)
    held = "; ".join(f"{r['class']}: {', '.join(r['methods'])}" for r in ov.get("specs") or [] if r.get("methods"))
    root = ov.get("root")
    if err:
        verdict, detail = "failed", err.get("message", str(err))
    elif verdict == "native":
        from provision.host import inference

        title = inference.get(inst.get("engine") or inference.DEFAULT).title
        detail = (f"{title} {inst.get('version')} has every method natively: no overlay"
                  + (" (the old one " + ("would be" if check else "was") + f" removed: {root})"
                     if ov.get("removed") else ""))
    elif verdict in ("removed", "absent"):
        detail = f"overlay {root} " + ("removed" if verdict == "removed" else "was not there")
    else:
        detail = f"overlay {root}: {held}" + (" (would be written)" if check else "")
        notes += [f"environment: {line}" for line in ov.get("env_lines") or []]
        if ov.get("verify"):
            notes.append(f"check: {ov['verify']['why']}")
        elif not check:
            notes.append("check: compiled, not imported (--verify-import imports it in the install's interpreter: "
                         "the specs' code runs there then)")
        if not check:
            notes.append("start the server with these variables (a PYTHONPATH of yours goes after it), or "
                         f"use EnvironmentFile={root}/overlay.env in its unit")
    data = {"overlay": ov, "env_lines": list(ov.get("env_lines") or []), "install_kind": inst.get("kind")}
    return HostResult(host=host, verdict=verdict, detail=detail, version=inst.get("version"),
                      install=inst.get("path"), file=root, notes=notes, error_kind=(err or {}).get("kind"),
                      data=data)


def do_overlay(specs: list[PatchSpec] | None, *, check=False, remove=False, install_path=None, python=None,
               timeout=300.0, verify_import=False):
    """`patch --overlay` / `unpatch --overlay`: one row per host for every spec (`--playbook`,
    repeatable; else the host's spec)."""
    def fn(host: Host, session, fleet) -> HostResult:
        hspecs = list(specs or [load_patch_spec(host.get("spec"))])
        req = request_for(host, hspecs, check=check, remove=remove, install_path=install_path, python=python,
                          verify_import=verify_import)
        answer = session.call(req, timeout=timeout, sudo=fleet.uses_sudo(host, session))
        res = result_from_answer(host.name, answer, check=check)
        res.data["spec"] = ", ".join(s.name for s in hspecs)  # for the journal
        res.data["spec_hash"] = ",".join(s.sha for s in hspecs)
        return res

    return fn


# --------------------------------------------------------------------------- overlay write (no SSH)

def _engine_of_specs(specs: list[PatchSpec]):
    """The inference engine whose files the specs fix (their `package`), one for all of them."""
    from provision.errors import ConfigError
    from provision.host import inference

    names = {inference.of_package(s.package) for s in specs} - {None}
    if len(names) > 1:
        raise ConfigError(f"the specs fix the files of {' and '.join(sorted(str(n) for n in names))}: an overlay is "
                          "one engine's; write one per engine")
    if not names:
        raise ConfigError("none of the specs fixes an inference engine's files: there is no overlay to write")
    return inference.get(names.pop())  # type: ignore[arg-type]


def _real_dirs(root: str, directory: str) -> None:
    """Make `directory` (under `root`), refusing a symbolic link on the way: root writes there, and a
    link another account planted would take the files elsewhere."""
    import stat

    from provision.errors import ConfigError

    rel = os.path.relpath(directory, root)
    path = root
    for part in [] if rel == "." else rel.split(os.sep):
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise ConfigError(f"{path} is not a directory (a symbolic link, or a file): overlay write does not "
                              "follow it; remove it or write elsewhere")


def write(specs: list[PatchSpec], out: str, *, mount_path: str | None = None, version: str | None = None) -> dict:
    """Write the overlay package for `specs` into `out` (every method of each delegate spec: there
    is no install here to ask which ones it lacks) and say the environment the SGLang container
    needs, with the overlay seen at `mount_path` (default: `out`). Refuses a `version` below 0.5.6.
    Returns {"files": [...], "env_lines": [...], "notes": [...]}."""
    from provision.errors import ConfigError
    from provision.host.engine import overlay as render

    engine = _engine_of_specs(specs)
    if not engine.overlay_offline:
        raise ConfigError(f"`overlay write` renders an overlay with no install to read, which {engine.title}'s "
                          f"needs (its interface is read from the release's files): use `provision launch --overlay` "
                          f"or `provision patch --overlay` on the host")
    if version:
        why = render.refusal_for_version(version, engine)
        if why:
            raise ConfigError(why)
    modules, notes = {}, []
    for spec in specs:
        e = spec.to_engine()
        if not render.is_overlayable(e):
            notes.append(f"spec {spec.name} is not a delegation spec: it cannot be an overlay (left out)")
            continue
        modules[render.module_for(spec.name)] = render.render_module(e, [m.name for m in spec.methods], version, engine)
    if not modules:
        raise ConfigError("no delegation spec to write an overlay for")
    files = render.render_package(modules, engine)
    root = os.path.abspath(out)
    os.makedirs(root, mode=0o755, exist_ok=True)
    written = []
    for rel, text in files.items():
        path = os.path.join(root, rel)
        _real_dirs(root, os.path.dirname(path))
        # the one atomic writer: a random O_EXCL|O_NOFOLLOW temp (never a .py name: SGLang imports
        # every .py of the package), so no link planted in `out` is followed
        atomic.write_text(path, text, mode=0o644)
        written.append(path)
    seen = mount_path or root
    lines = render.env_lines(seen, None, engine)
    atomic.write_text(os.path.join(root, render.ENV_FILE), "\n".join(lines) + "\n", mode=0o644)
    compile_errors = []
    for path in written:
        with open(path, "rb") as fh:
            try:
                compile(fh.read(), path, "exec", dont_inherit=True)
            except SyntaxError as exc:
                compile_errors.append(f"{path}: {exc}")
    if compile_errors:
        raise ConfigError("the overlay does not compile: " + "; ".join(compile_errors))
    if not version:
        notes.append("no install was asked which methods it lacks, so the overlay holds every method of each spec "
                     f"(for {engine.title} {'.'.join(map(str, engine.overlay_min_version))} and later); a release that "
                     "has them all "
                     "natively (0.5.10+ for Kimi-K2.5) needs no overlay")
    return {"files": written, "env_lines": lines, "notes": notes, "digest": render.digest(files)}
