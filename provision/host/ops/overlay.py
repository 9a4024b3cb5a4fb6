"""Overlay mode on the host: stage the overlay package, check it, and the ``overlay`` op.  STDLIB ONLY.

The overlay (engine/overlay.py renders it) lives in the host's state directory, one
directory per install of an engine (``<state>/overlay/<key>/provision_overlay/``; for vLLM with
the ``provision_overlay-0.1.dist-info`` that holds its entry point), one module per spec, with
only the members the installed class lacks natively. It is compiled with the
server's interpreter and checked statically by the engine (each method bound in the class);
where that interpreter can import torch, it is also imported under a timeout, as the server
would. Against a release that has every method there is no overlay (an old one is removed).

Used by the ``overlay`` op (`provision patch --overlay`), by the server's preflight and start
(`launch --overlay`), and by reconcile (regenerate / remove).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import glob
import hashlib
import json
import os
import shutil
import subprocess

from provision.host import inference
from provision.host.engine import core
from provision.host.engine import overlay as render
from provision.host.facts import installs
from provision.host.lib import atomic, procfs
from provision.host.lib.hostlog import host_log
from provision.host.lib.modules import make_resolver
from provision.host.lib.paths import default_state_dir
if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import OverlayAnswer, OverlayRequest, OverlayStage, OverlayVerify

MANIFEST = "manifest.json"
IMPORT_TIMEOUT = 180.0


def overlay_root(state_dir: str, install_path: str) -> str:
    """Where the overlay of one install lives (what goes first on PYTHONPATH)."""
    key = hashlib.sha256(os.path.realpath(install_path).encode()).hexdigest()[:12]
    return os.path.join(state_dir, "overlay", key)


def read_manifest(root: str) -> dict | None:
    try:
        with open(os.path.join(root, MANIFEST)) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def engine_of(inst: dict):
    """The inference engine an install is of: the one discovery (or an image's mirror) recorded,
    else the engine whose package the install's directory is (an install is its package's dir)."""
    name = inst.get("engine") or inference.of_package(os.path.basename(os.path.normpath(str(inst["path"]))))
    if not name:
        raise inference.UnknownEngine(f"{inst['path']} is no inference engine's package directory")
    return inference.get(name)


def _architectures(inst: dict, spec: dict) -> dict:
    """{arch: class} a replacement class is registered under (vLLM's registry; its own name else)."""
    from provision.host.engine import audit_vllm

    archs = audit_vllm.architectures(inst["path"], spec["file"], spec["class"]) or [spec["class"]]
    return {a: spec["class"] for a in archs}


def _rebind_row(inst: dict, spec: dict, path: str, source: bytes) -> tuple:
    """(row, module text or None) of a `replace` spec scoped to Class.method: native when the
    release has the change (no module); else the method as the spec's edit leaves it (the file's
    own edit, if provision made one, is read through: the overlay never depends on it)."""
    from provision.host.engine import replace
    from provision.host.engine.pysource import decode
    from provision.host.engine.spec import validate_spec

    s = validate_spec(spec)
    cls, _, meth = s["scope"].partition(".")
    a = replace.analyse(decode(source)[0], s)
    row = {"spec": s["name"], "class": cls, "file": path, "methods": [] if a["native"] else [meth],
           "attributes": [], "native": [meth] if a["native"] else [], "rebind": True}
    if a["native"]:
        return row, None
    row["module"] = render.module_for(s["name"])
    return row, render.render_rebind(s, a["want"], inst.get("version"), engine_of(inst))


def plan(inst: dict, specs: list) -> dict:
    """What the overlay of this install holds, from its files: per spec the members the installed
    class lacks natively (a file provision edited still gets them, so the overlay never depends on
    the edit; an interface spec's are its release's protocol's), and the rendered modules (for vLLM
    with the architectures each class is registered under). Problems (class missing, unreadable
    file) are errors."""
    engine = engine_of(inst)
    resolve = make_resolver(inst["path"], engine.package)
    modules: dict = {}
    archs: dict = {}
    rebinds: list = []
    rows: list = []
    errors: list = []
    notes: list = []
    for spec in specs:
        if not render.is_overlayable(spec):
            notes.append(f"spec {spec.get('name')} (kind {spec.get('kind')}) changes values, not a class: it cannot "
                         "be an overlay; `provision patch` edits its file")
            continue
        path = os.path.join(inst["path"], spec["file"])
        try:
            with open(path, "rb") as fh:
                source = fh.read()
            info = core.inspect(source, spec, resolve_module=resolve)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror}")
            continue
        if info.get("error"):
            errors.append(f"{path}: {(info['error'] or {}).get('message')}")
            continue
        if spec.get("kind") == "replace":
            try:
                row, text = _rebind_row(inst, spec, path, source)
            except core.EngineError as exc:
                errors.append(f"{path}: {exc}")
                continue
            if text is not None:
                modules[row["module"]] = text
                rebinds.append(row["module"])
            rows.append(row)
            continue
        try:
            full = core.expanded(spec, resolve)
        except core.EngineError as exc:
            errors.append(f"{path}: {exc}")
            continue
        methods = info.get("methods") or {}
        members = [a["name"] for a in full.get("attributes") or []] + [m["name"] for m in full["methods"]]
        need = [n for n in members if methods.get(n) != "native"]
        row = {"spec": spec["name"], "class": spec["class"], "file": path, "methods": need,
               "attributes": [a["name"] for a in full.get("attributes") or [] if a["name"] in need],
               "native": [n for n, v in methods.items() if v == "native"]}
        if need:
            row["module"] = render.module_for(spec["name"])
            modules[row["module"]] = render.render_module(full, need, inst.get("version"), engine)
            if engine.overlay_style == "general-plugin":
                archs[row["module"]] = _architectures(inst, spec)
        rows.append(row)
    return {"modules": modules, "architectures": archs, "rebinds": rebinds, "specs": rows, "errors": errors,
            "notes": notes}


def _write(path: str, text: str) -> None:
    """One overlay file, atomically and durably, readable by the server whatever the umask (a
    container's non-root user reads it through the read-only mount). The temp name ends in .tmp,
    never .py: SGLang imports every .py of the package."""
    atomic.write_text(path, text, mode=0o644)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _on_disk(root: str, files: dict) -> bool:
    """The package on disk is exactly `files` (no other module SGLang would import)."""
    pkg = os.path.join(root, render.PACKAGE)
    try:
        present = {f"{render.PACKAGE}/{n}" for n in os.listdir(pkg) if n.endswith(".py")}
    except OSError:
        return False
    if present != {rel for rel in files if rel.startswith(render.PACKAGE + "/")}:
        return False
    return all(_read(os.path.join(root, rel)) == text for rel, text in files.items())


def remove(root: str) -> bool:
    """Take an overlay away (the user asked). True if there was one."""
    if not os.path.isdir(root):
        return False
    shutil.rmtree(root)
    return True


def users(root: str, state_dir: str, engine) -> list:
    """What still names this overlay: running servers of the engine whose
    environment names our package and has the overlay on PYTHONPATH, and persistent servers' saved
    specs (systemd restarts them with it)."""
    out = []
    for s in installs.running_servers(engine):
        env = procfs.environ(s["pid"])
        if render.runs_overlay(env, engine) and root in (env.get("PYTHONPATH") or "").split(":"):
            out.append(f"server pid {s['pid']} (port {s.get('port')})")
    for spec_path in sorted(glob.glob(os.path.join(state_dir, "server", "server-*.spec.json"))):
        try:
            with open(spec_path) as fh:
                env = (json.load(fh).get("env") or {})
        except (OSError, ValueError):
            continue
        if root in str(env.get("PYTHONPATH") or "").split(":"):
            out.append(f"the persistent server of {os.path.basename(spec_path)}")
    return out


def retire(root: str, state_dir: str, engine) -> dict:
    """The install no longer needs its overlay: remove it. While a server (or a persistent unit)
    still names it, only its modules go and an empty package stays, so a restart with the old
    environment still starts (SGLang does not catch a missing package); the next run removes the rest."""
    if not os.path.isdir(root):
        return {"removed": False, "kept_for": []}
    left = users(root, state_dir, engine)
    if not left:
        shutil.rmtree(root)
        return {"removed": True, "kept_for": []}
    pkg = os.path.join(root, render.PACKAGE)
    for name in os.listdir(pkg) if os.path.isdir(pkg) else []:
        if name.endswith(".py") and name != "__init__.py":
            os.unlink(os.path.join(pkg, name))
    shutil.rmtree(os.path.join(pkg, "__pycache__"), ignore_errors=True)
    _write(os.path.join(pkg, "__init__.py"), render.render_init(engine))
    return {"removed": True, "kept_for": left}


COMPILE_SNIPPET = ("import sys\n"
                   "for p in sys.argv[1:]:\n"
                   "    compile(open(p, 'rb').read(), p, 'exec', dont_inherit=True)\n")


def compile_with(python: str, paths: list) -> str | None:
    """Compile the modules with the server's interpreter (no bytecode written). None or the error."""
    try:
        proc = subprocess.run([python, "-I", "-S", "-c", COMPILE_SNIPPET, *paths], capture_output=True, text=True,
                              timeout=60, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} could not compile the overlay: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"the overlay does not compile with {python}: {last}"
    return None


def static_problems(inst: dict, specs: list, rows: list, files: dict) -> list:
    """The engine's structure check on each module: the class is there once and binds every method."""
    resolve = make_resolver(inst["path"], engine_of(inst).package)
    by_name = {s["name"]: s for s in specs}
    out = []
    for row in rows:
        rel = f"{render.PACKAGE}/{row.get('module')}.py"
        if rel not in files or row.get("rebind"):  # a rebound method: compiled, and imported where it can be
            continue
        spec = core.expanded(by_name[row["spec"]], resolve)  # plan() expanded it once already
        sub = dict(spec, methods=[m for m in spec["methods"] if m["name"] in row["methods"]],
                   attributes=[a for a in spec.get("attributes") or [] if a["name"] in row["methods"]])
        out += [f"{rel}: {p}" for p in core.check_structure(files[rel].encode("utf-8"), sub, resolve_module=resolve)]
    return out


def _closed_to_others(root: str) -> str | None:
    """The first directory on the way to the overlay that other users cannot enter (or None)."""
    path = os.path.abspath(root)
    while True:
        try:
            if not os.stat(path).st_mode & 0o001:
                return path
        except OSError:
            pass  # not there (yet): look above it
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def stage_for_preflight(inst: dict, specs: list, state_dir: str, checks: list, native: str) -> tuple:
    """Stage the overlay for a launch preflight and add what it says to ``checks``. Returns
    (the stage, None) when there is an overlay to verify next, or (None, the fix the server will
    use: "none" after a failure, "native"). ``native``: the sentence for a release that has every
    method (a host's install, an image). Shared by ops/server.py and ops/container.py."""
    st = dict(stage(inst, specs, state_dir))
    for note in st.get("notes") or []:
        checks.append({"level": "info", "check": "overlay", "message": note})
    if st.get("verdict") == "failed":
        checks.append({"level": "fail", "check": "overlay", "message": (st.get("error") or {}).get("message", "")})
        return None, "none"
    if st.get("verdict") == "native":
        checks.append({"level": "info", "check": "overlay", "message": native
                       + (" (the old overlay was removed)" if st.get("removed") else "")})
        return None, "native"
    return st, None


def start_refusal(staged: dict, profile_env: dict | None, engine) -> str | None:
    """Why a server must not start on what preflight staged (None when it may): the profile now
    owns SGLANG_EXTERNAL_MODEL_PACKAGE, or the overlay went away since preflight. Shared by a
    server on the host (ops/server.py) and one in a container (ops/container.py)."""
    return render.refusal_for_env(profile_env, engine) or (
        None if os.path.isfile(os.path.join(staged["root"], render.PACKAGE, "__init__.py"))
        else f"the overlay {staged['root']} is gone (removed since preflight?); nothing was started")


def stage(inst: dict, specs: list, state_dir: str, *, check: bool = False) -> OverlayStage:
    """Render, write (unless `check`), compile and check the overlay of one install.

    verdict: "staged" (written), "unchanged" (already exactly so), "native" (no method is missing:
    no overlay, an old one removed), "failed" (refused: too old a release, a spec's class missing,
    a module that does not compile or bind its methods)."""
    root = overlay_root(state_dir, inst["path"])
    engine = engine_of(inst)
    out: OverlayStage = {"root": root, "package": render.PACKAGE, "install": inst["path"],
                         "loaded_by": render.loaded_by(engine),
                         "version": inst.get("version"), "modules": [], "specs": [], "notes": [], "env": {},
                         "env_lines": [], "removed": False}
    why = render.refusal_for_version(inst.get("version"), engine)
    if why:
        out["verdict"], out["error"] = "failed", {"kind": "overlay-version", "message": why}
        return out
    p = plan(inst, specs)
    out["specs"], out["notes"] = p["specs"], list(p["notes"])
    if p["errors"]:
        out["verdict"], out["error"] = "failed", {"kind": "overlay", "message": "; ".join(p["errors"])}
        return out
    if not p["modules"]:
        out["verdict"] = "native"
        if check or not os.path.isdir(root):
            out["removed"] = check and os.path.isdir(root)  # (would be)
            return out
        gone = retire(root, state_dir, engine)
        out["removed"] = gone["removed"]
        if gone["kept_for"]:
            out["notes"].append(f"an empty {render.PACKAGE} package stays in {root} while "
                                + ", ".join(gone["kept_for"]) + " names it (a restart with the old environment "
                                "still starts); restart without the overlay, and the next run removes it")
        host_log(f"overlay retired: {root} for {inst['path']} (the methods are native)")
        return out
    files = render.render_package(p["modules"], engine, p["architectures"], p["rebinds"])
    out["digest"] = render.digest(files)
    out["modules"] = [f"{render.PACKAGE}.{m}" for m in sorted(p["modules"])]
    own_pythonpath = installs.owner_python(inst)[1].get("PYTHONPATH")  # a checkout's: sglang is there
    out["env"] = render.server_env(root, own_pythonpath, engine)
    out["env_lines"] = render.env_lines(root, own_pythonpath, engine)
    env_text = "\n".join(out["env_lines"]) + "\n"
    if _on_disk(root, files) and (read_manifest(root) or {}).get("digest") == out["digest"]:
        out["verdict"] = "unchanged"
        if not check and _read(os.path.join(root, render.ENV_FILE)) != env_text:
            _write(os.path.join(root, render.ENV_FILE), env_text)  # one an older provision wrote
    elif check:
        out["verdict"] = "staged"
        return out
    else:
        pkg = os.path.join(root, render.PACKAGE)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)  # the state dir stays root's, as fileops makes it
        os.makedirs(pkg, mode=0o755, exist_ok=True)
        for name in os.listdir(pkg):  # a module of a spec no longer asked for
            if name.endswith(".py") and f"{render.PACKAGE}/{name}" not in files:
                os.unlink(os.path.join(pkg, name))
        shutil.rmtree(os.path.join(pkg, "__pycache__"), ignore_errors=True)
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), mode=0o755, exist_ok=True)
            _write(os.path.join(root, rel), text)
        _write(os.path.join(root, render.ENV_FILE), env_text)
        _write(os.path.join(root, MANIFEST), json.dumps(
            {"digest": out["digest"], "install": inst["path"], "version": inst.get("version"),
             "specs": p["specs"], "spec_docs": [sp for sp in specs if render.is_overlayable(sp)]},
            indent=2, sort_keys=True) + "\n")
        out["verdict"] = "staged"
        host_log(f"overlay staged: {root} for {inst['path']} ({', '.join(out['modules'])}) digest {out['digest']}")
    python, _env = installs.owner_python(inst)
    err = compile_with(python, [os.path.join(root, rel) for rel in sorted(files) if rel.endswith(".py")])
    problems = [err] if err else static_problems(inst, specs, p["specs"], files)
    if problems:
        out["verdict"], out["error"] = "failed", {"kind": "overlay-check", "message": "; ".join(problems)}
    return out


def with_staged(root: str, specs: list, drop: bool = False) -> list:
    """`specs` and the other specs the overlay at `root` already carries (its manifest keeps them):
    one overlay per install holds every spec staged for it, so staging, checking or reconciling one
    spec keeps the others. `drop`: the others alone (unpatch --overlay of `specs`)."""
    asked = {sp.get("name") for sp in specs}
    others = [d for d in (read_manifest(root) or {}).get("spec_docs") or []
              if isinstance(d, dict) and d.get("name") not in asked]
    return others if drop else list(specs) + others


def status(inst: dict, specs: list, state_dir: str) -> OverlayStage | None:
    """The overlay staged for this install, if any, and whether it is current (read-only):
    verdict "unchanged" = current, "staged" = stale (patch --overlay / reconcile rewrites it),
    "native" = no longer needed (reconcile removes it), "failed" = the check says why."""
    root = overlay_root(state_dir, inst["path"])
    if not os.path.isdir(root):
        return None
    asked = {sp.get("name") for sp in specs}
    st = stage(inst, with_staged(root, specs), state_dir, check=True)  # these as they are now, and the others
    st["specs"] = [r for r in st.get("specs") or [] if r.get("spec") in asked]
    st["current"] = st.get("verdict") == "unchanged"
    if st.get("verdict") == "native":
        st["kept_for"] = users(root, state_dir, engine_of(inst))  # reconcile keeps it (empty) while these name it
    return st


IMPORT_SNIPPET = r"""
import importlib, importlib.util, json, sys
mod, cls, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
group, attrs = (sys.argv + ["", ""])[4], (sys.argv + ["", ""])[5].split(",")  # vLLM's entry-point group, attributes
if importlib.util.find_spec("torch") is None:
    print(json.dumps({"status": "not-verifiable", "why": "torch does not import with " + sys.executable}))
    sys.exit(0)
try:
    m = importlib.import_module(mod)
except Exception as exc:
    print(json.dumps({"status": "failed", "why": "%s does not import: %s: %s" % (mod, type(exc).__name__, exc)}))
    sys.exit(0)
if callable(getattr(m, "apply", None)):  # a rebound method: bind it as register() would, then look
    try:
        m.apply()
        bound = getattr(getattr(importlib.import_module(m.MODULE), m.CLASS), m.METHOD)
    except Exception as exc:
        print(json.dumps({"status": "failed", "why": "%s.apply() fails: %s: %s" % (mod, type(exc).__name__, exc)}))
        sys.exit(0)
    ok = "provision overlay" in getattr(getattr(bound, "__code__", None), "co_filename", "")
    what = "%s.%s" % (m.CLASS, m.METHOD)
    print(json.dumps({"status": "ok" if ok else "failed",
                      "why": "imported; %s is bound from the overlay" % what if ok
                      else "%s is not the overlay's after apply()" % what}))
    sys.exit(0)
entry = getattr(m, "EntryClass", None) or [getattr(m, cls, None)]
c = next((e for e in entry if getattr(e, "__name__", None) == cls), None)
if c is None:
    print(json.dumps({"status": "failed", "why": "%s registers no class %s" % (mod, cls)})); sys.exit(0)
if group:
    from importlib.metadata import entry_points
    pkg = mod.split(".")[0]
    if not [e for e in entry_points(group=group) if e.name == pkg and e.value == pkg + ":register"]:
        print(json.dumps({"status": "failed", "why": "no entry point %s in %s is found on sys.path" % (pkg, group)}))
        sys.exit(0)
bad = [n for n in names if n and not (hasattr(c, n) if n in attrs else callable(getattr(c, n, None)))]
print(json.dumps({"status": "failed" if bad else "ok",
                  "why": ("missing or not callable: " + ", ".join(bad)) if bad else "imported; every method is callable"}))
"""


def verify_import(inst: dict, st: OverlayStage, server_env: dict, timeout: float = IMPORT_TIMEOUT) -> OverlayVerify:
    """Import each overlay module as the server would (its interpreter and environment, the overlay
    first on PYTHONPATH), where that interpreter can import torch; else say it cannot be verified."""
    python, _ = installs.owner_python(inst)
    group = render.PLUGIN_GROUP if engine_of(inst).overlay_style == "general-plugin" else ""
    results = []
    for row in st.get("specs") or []:
        if not row.get("module"):
            continue
        mod = f"{render.PACKAGE}.{row['module']}"
        try:
            proc = subprocess.run([python, "-c", IMPORT_SNIPPET, mod, row["class"], ",".join(row["methods"]), group,
                                   ",".join(row.get("attributes") or [])],
                                  capture_output=True, text=True, timeout=timeout, env=server_env, cwd="/")
            data = json.loads(proc.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            data = {"status": "failed", "why": f"importing {mod} took longer than {timeout:g} s"}
        except (ValueError, IndexError, OSError) as exc:
            data = {"status": "not-verifiable", "why": f"no answer from {python}: {exc}"}
        results.append(dict(data, module=mod))
    if not results:
        return {"status": "ok", "why": "no overlay module", "modules": []}
    worst = next((r for r in results if r["status"] == "failed"), None) \
        or next((r for r in results if r["status"] == "not-verifiable"), None) or results[0]
    why = worst["why"] if worst["status"] != "ok" else "imported; every method is callable"
    if worst["status"] == "not-verifiable":
        why = f"import not verifiable here ({worst['why']}): checked statically"
    return {"status": worst["status"], "why": why, "modules": results}


def op_overlay(req: OverlayRequest, bundle: bytes) -> OverlayAnswer:
    """`provision patch --overlay`: stage the overlay of the chosen install (or, with `remove`,
    take it away) and say the two environment lines."""
    facts = installs.for_request(req)
    if facts["error"]:
        return {"ok": False, "facts": facts, "error": facts["error"]}
    inst = installs.chosen_install(facts)
    if inst is None:
        return {"ok": False, "facts": facts, "error": {"kind": "not-found", "message": "no install chosen"}}
    state_dir = req.get("state_dir") or default_state_dir()
    specs = list(req.get("specs") or ([req["spec"]] if req.get("spec") else []))
    root = overlay_root(state_dir, inst["path"])
    if req.get("remove"):
        left = with_staged(root, specs, drop=True) if specs else []
        if left and os.path.isdir(root):  # the overlay carries other specs too: only these go
            st = stage(inst, left, state_dir, check=bool(req.get("check")))
            if st.get("verdict") != "failed":
                st["verdict"] = "removed"
                st["notes"] = list(st.get("notes") or []) + [
                    "the overlay keeps " + ", ".join(str(d.get("name")) for d in left)]
            return {"ok": st.get("verdict") != "failed", "facts": facts, "error": st.get("error"), "overlay": st}
        gone = os.path.isdir(root) if req.get("check") else remove(root)
        return {"ok": True, "facts": facts, "overlay": {"verdict": "removed" if gone else "absent", "root": root,
                                                         "install": inst["path"], "version": inst.get("version")}}
    st = stage(inst, with_staged(root, specs), state_dir, check=bool(req.get("check")))
    closed = _closed_to_others(st["root"]) if st.get("verdict") in ("staged", "unchanged") else None
    if closed:  # the user starts the server, maybe not as root
        st.setdefault("notes", []).append(
            f"{closed} is closed to other users: a server running as another user than root cannot import the "
            "overlay from here; for one, write it where it can read it (`provision overlay write --out DIR`)")
    if st.get("verdict") in ("staged", "unchanged") and not req.get("check") and req.get("verify_import"):
        # importing it runs the specs' code (a rebound method's apply()): only when asked
        python, extra = installs.owner_python(inst)
        env = dict(os.environ, **extra)
        engine = engine_of(inst)
        env.update(render.server_env(st["root"], env.get("PYTHONPATH"), engine, env.get(engine.overlay_plugins_env)))
        st["verify"] = verify_import(inst, st, env, float(req.get("import_timeout") or IMPORT_TIMEOUT))
        if st["verify"]["status"] == "failed":
            st["verdict"] = "failed"
            st["error"] = {"kind": "overlay-import", "message": st["verify"]["why"]}
    return {"ok": st.get("verdict") != "failed", "facts": facts, "overlay": st, "error": st.get("error")}


OPS = {"overlay": op_overlay}
