"""A server in a container (the profile's ``launch.container``): the image's side of it.  STDLIB ONLY.

``ops/server.py`` hands over here for the preflight of a container launch and to prepare its
start; running, looking at and stopping the container is the container backend's
(ops/backends/container.py: ``RUNTIME run -d``, ``inspect``, ``logs``, ``stop``), which this module
re-exports for its callers.

* **the image's SGLang**: read from inside the image, by running the discovery probe
  (``facts/installs.PROBE``: ``-I -S``, no site code) in a throw-away container with no
  network, which also returns the specs' files, so the engine judges the image's own class.
  Cached per image id in the state dir (``images/``).
* **the fix**: the overlay (ops/overlay.py's ``stage``) rendered from those files, one per image
  id, compiled and imported with the image's python3 in another throw-away container, and
  mounted read-only at ``OVERLAY_DIR`` with its two variables; none for a native image.
The server's interpreter is the image's ``python3`` (the official images' command).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

from provision.host import inference
from provision.host.engine.spec import DEFAULT_PACKAGE
from provision.host.facts import installs
from provision.host.lib import atomic
from provision.host.lib.paths import default_state_dir
from provision.host.ops import preflight_model
from provision.host.ops import checks as preflight_checks
from provision.host.ops.backends import select
from provision.host.ops.backends.base import port_open
from provision.host.ops.backends.container import (  # noqa: F401 - re-exported for their callers
    LABEL, SECRETS_DIR, _run, _why, inspect, missing_runtime, run_argv, runtime_path, secrets_dir, summary)

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import ContainerConfig, ContainerImage

OVERLAY_DIR = "/run/provision-overlay"  # in the container, read-only: the overlay root (PYTHONPATH first)

# Run in the image as `python3 -I -S -c IMAGE_PROBE '[]' '<json list of files>'`: the discovery
# probe, then the specs' files (relative to the package it found), base64, in one JSON line.
IMAGE_PROBE = """
import base64, contextlib, io, json, os, sys
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    exec(compile(PROBE, "<provision probe>", "exec"), {"__name__": "__main__"})
out = json.loads(buf.getvalue().strip().splitlines()[-1])
out["files"], out["file_errors"] = {}, {}
for rel in (json.loads(sys.argv[2]) if len(sys.argv) > 2 else []):
    if not out.get("package"):
        break
    try:
        with open(os.path.join(out["package"], rel), "rb") as fh:
            out["files"][rel] = base64.b64encode(fh.read()).decode()
    except OSError as exc:
        out["file_errors"][rel] = "%s: %s" % (os.path.join(out["package"], rel), exc.strerror)
print(json.dumps(out))
"""

# Run in the image with the overlay mounted and switched on, as `python3 -I -S -c OVERLAY_CHECK
# '<json>'`: compile every overlay file with the image's interpreter, then import each module as
# the server would (ops/overlay.IMPORT_SNIPPET: only where torch imports). One JSON line.
OVERLAY_CHECK = """
import json, subprocess, sys
job = json.loads(sys.argv[1])
p = subprocess.run([sys.executable, "-I", "-S", "-c", job["compile"]] + job["files"], capture_output=True, text=True)
if p.returncode != 0:
    print(json.dumps({"compile": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}))
    sys.exit(0)
out = []
for mod, cls, names in job["modules"]:
    p = subprocess.run([sys.executable, "-c", job["import"], mod, cls, names], capture_output=True, text=True,
                       timeout=job["timeout"])
    try:
        out.append(dict(json.loads(p.stdout.strip().splitlines()[-1]), module=mod))
    except (ValueError, IndexError):
        out.append({"status": "failed", "why": (p.stderr.strip().splitlines() or ["no answer"])[-1], "module": mod})
print(json.dumps({"modules": out}))
"""


def _image_inspect(rt: str, image: str) -> tuple[str | None, list]:
    """(the image's id, its Config.Env) or (None, []) when the host does not have it."""
    p = _run([rt, "image", "inspect", "--format", "{{.Id}} {{json .Config.Env}}", image], timeout=60)
    if p.returncode != 0 or not p.stdout.strip():
        return None, []
    iid, _, env = p.stdout.decode().strip().partition(" ")
    try:
        env_list = json.loads(env) if env else []
    except ValueError:
        env_list = []
    return iid or None, env_list if isinstance(env_list, list) else []


def spec_files(req: dict) -> list[str]:
    """The files (relative to the engine's package) of the request's specs of that package, in order,
    and those judging each reads besides (the engine's `spec_read_files`: an interface's protocol)."""
    engine = inference.for_request(req)
    specs = list(req.get("specs") or ([req["spec"]] if req.get("spec") else []))
    out = []
    for s in specs:
        if s.get("file") and (s.get("package") or DEFAULT_PACKAGE) == engine.package:
            out += [str(s["file"])] + engine.spec_read_files(s)
    return list(dict.fromkeys(out))


def image_probe_script(package: str) -> str:
    """What runs in a throw-away container of the image (`python3 -I -S -c SCRIPT '[]' FILES`):
    discovery's probe asking for `package`, then the specs' files read from it."""
    return f"PROBE = {installs.probe_text(package)!r}\n" + IMAGE_PROBE


def image_install(req: dict, conf: ContainerConfig, files: list[str]) -> ContainerImage:
    """The image's install of the request's engine (path, version, the specs' files), read from
    inside it; cached per image id, package and file list (without files, any of the image's will
    do). Pulls the image first when the host does not have it (not when the host is offline)."""
    engine = inference.for_request(req)
    rt = runtime_path(conf["runtime"])
    if rt is None:
        return {"error": missing_runtime(conf["runtime"])}
    image = conf["image"]
    iid, image_env = _image_inspect(rt, image)
    pulled = False
    if iid is None:
        if req.get("no_pull"):  # upgrade --check: nothing is pulled
            return {"error": {"kind": "not-pulled", "message": f"image {image} is not on this host (nothing was "
                                                              "pulled)"}}
        if req.get("offline"):
            return {"error": {"kind": "no-image", "message": f"image {image} is not on this host and the host is "
                                                             f"marked offline: `{conf['runtime']} pull` it first"}}
        try:
            p = _run([rt, "pull", image], timeout=float(req.get("pull_timeout") or 1800))
        except subprocess.TimeoutExpired:
            return {"error": {"kind": "no-image", "message": f"image {image}: `{conf['runtime']} pull` took longer "
                                                             f"than {float(req.get('pull_timeout') or 1800):g} s; pull "
                                                             "it first"}}
        iid, image_env = _image_inspect(rt, image) if p.returncode == 0 else (None, [])
        if iid is None:
            return {"error": {"kind": "no-image", "message": f"image {image}: not on this host and `{conf['runtime']} "
                                                             f"pull` failed: {_why(p)}"}}
        pulled = True
    cache_dir = os.path.join(req.get("state_dir") or default_state_dir(), "images")
    key = iid.replace(":", "-").replace("/", "-") + "-" + engine.package
    want = sorted(files)
    cache = os.path.join(cache_dir, key + "-" + hashlib.sha256(json.dumps(want).encode()).hexdigest()[:12] + ".json")
    try:
        names = [os.path.basename(cache)] if want else sorted(
            n for n in os.listdir(cache_dir) if n.startswith(key + "-") and n.endswith(".json"))
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(cache_dir, name)) as fh:
                cached = json.load(fh)
        except (OSError, ValueError):
            continue
        if not want or sorted(cached.get("files") or {}) + sorted(cached.get("file_errors") or {}) == want \
                or sorted(set(cached.get("files") or {}) | set(cached.get("file_errors") or {})) == want:
            cached["cached"] = True
            return cached
    script = image_probe_script(engine.package)
    p = _run([rt, "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-I", "-S", "-c", script,
              "[]", json.dumps(want)], timeout=300)
    if p.returncode != 0:
        return {"image_id": iid, "error": {"kind": "image-probe", "message": (
            f"could not read {engine.title}'s version inside image {image} (python3 -I -S in a throw-away "
            "container): "
            f"{_why(p)}")}}
    try:
        found = json.loads(p.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        found = {}
    if not found.get("package"):
        return {"image_id": iid, "error": {"kind": "not-found",
                                           "message": f"image {image} has no {engine.title} that python3 imports"}}
    pythonpath = next((e.split("=", 1)[1] for e in image_env if isinstance(e, str) and e.startswith("PYTHONPATH=")),
                      None)
    out: ContainerImage = {"image": image, "image_id": iid, "install": found["package"],
                           "version": found.get("dist_version"), "python": found.get("version"),
                           "files": found.get("files") or {}, "file_errors": found.get("file_errors") or {},
                           "pythonpath": pythonpath, "pulled": pulled}
    os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
    atomic.write_json(cache, {k: v for k, v in out.items() if k != "pulled"}, durable=False)
    return out


def public(img: ContainerImage) -> dict:
    """What goes back to the control side of the image facts (not the files)."""
    return {k: v for k, v in img.items() if k != "files"}


def host_path(volumes: list[str], path: str) -> str | None:
    """Where a container path is on the host, through the profile's volumes (pure); None when no
    volume holds it (then it is the image's own file)."""
    best = None
    for vol in volumes:
        parts = vol.split(":")
        if len(parts) < 2:
            continue
        src, dst = parts[0], parts[1].rstrip("/") or "/"
        if (path == dst or path.startswith(dst + "/")) and src.startswith("/"):
            if best is None or len(dst) > len(best[1]):
                best = (src, dst)
    if best is None:
        return None
    return best[0].rstrip("/") + path[len(best[1]):] if best[1] != "/" else os.path.join(best[0], path.lstrip("/"))


def image_patch_state(img: ContainerImage, spec: dict | None) -> dict | None:
    """The engine's inspection of the spec's class in the image's own file (None without a spec)."""
    if not spec:
        return None
    rel = spec["file"]
    files = img.get("files") or {}
    if rel not in files:
        return {"error": {"kind": "file-missing",
                          "message": (img.get("file_errors") or {}).get(rel) or f"{rel}: not in the image"}}
    from provision.host.engine import core as engine

    # The image's other modules are read from it only when judging the spec needs them (an
    # interface's protocol): base classes elsewhere in the image are not followed.
    info: dict = dict(engine.inspect(base64.b64decode(files[rel]), spec,
                                     resolve_module=_image_resolver(files, spec.get("package") or DEFAULT_PACKAGE)))
    info["file"] = os.path.join(img.get("install") or "", rel)
    return info


def _image_resolver(files: dict, package: str):
    """resolve_module over the files read from an image ({relative path: base64}): `vllm.a.b` ->
    a/b.py or a/b/__init__.py when it was read, else None."""
    def resolve(name: str) -> bytes | None:
        parts = name.split(".")
        if parts[0] != package:
            return None
        base = "/".join(parts[1:])
        for rel in (base + ".py", base + "/__init__.py"):
            if rel in files:
                return base64.b64decode(files[rel])
        return None

    return resolve


def image_fix(info: dict | None) -> dict:
    """What the image's class needs for a spec (pure): kind native | in-image (provision's block
    baked into the image) | missing (+ the methods) | none (no spec, or not judged)."""
    if info is None or info.get("error"):
        return {"kind": "none", "missing": [], "file": (info or {}).get("file")}
    methods = info.get("methods") or {}
    missing = [m for m, v in methods.items() if v == "missing"]
    states = sorted(set(methods.values()))
    kind = "missing" if missing else "native" if states == ["native"] else "in-image"
    return {"kind": kind, "missing": missing, "file": info.get("file")}


def mirror_install(state_dir: str, img: ContainerImage, engine) -> dict:
    """The image's install of the engine as an install record ops/overlay.py can stage an overlay for:
    the specs' files from the image, written under <state>/images/<image id>/<package> (one overlay
    per image)."""
    key = str(img.get("image_id") or "unknown").replace(":", "-").replace("/", "-")
    pkg = os.path.join(state_dir, "images", key, engine.package)
    for rel, b64 in (img.get("files") or {}).items():
        path = os.path.join(pkg, rel)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        data = base64.b64decode(b64)
        try:
            with open(path, "rb") as fh:
                if fh.read() == data:
                    continue
        except OSError:
            pass
        atomic.write_bytes(path, data, mode=0o644, durable=False)
    return {"path": pkg, "version": img.get("version"), "interpreters": [], "pythonpath": os.path.dirname(pkg),
            "kind": "image", "git": None, "dist_info": None, "engine": engine.name}


def overlay_env(img: ContainerImage, prof_env: dict | None, engine) -> dict:
    """The overlay's variables in the container: what names our package to the engine, and OVERLAY_DIR
    first on PYTHONPATH, the profile's (else the image's) PYTHONPATH kept after it."""
    from provision.host.engine import overlay as render

    env = prof_env or {}
    return render.server_env(OVERLAY_DIR, env.get("PYTHONPATH") or img.get("pythonpath"), engine,
                             env.get(engine.overlay_plugins_env) if engine.overlay_plugins_env else None)


def verify_in_image(rt: str, conf: ContainerConfig, img: ContainerImage, st: dict, prof_env: dict | None,
                    timeout: float, engine) -> dict:
    """Compile the staged overlay with the image's interpreter and import it as the server would
    (where torch imports there), in a throw-away container with the overlay mounted read-only."""
    from provision.host.engine import overlay as render
    from provision.host.ops import overlay

    files = sorted(f"{OVERLAY_DIR}/{render.PACKAGE}/{n}" for n in os.listdir(os.path.join(st["root"], render.PACKAGE))
                   if n.endswith(".py"))
    modules = [[f"{render.PACKAGE}.{r['module']}", r["class"], ",".join(r["methods"])]
               for r in st.get("specs") or [] if r.get("module")]
    job = {"compile": overlay.COMPILE_SNIPPET, "import": overlay.IMPORT_SNIPPET, "files": files, "modules": modules,
           "timeout": timeout}
    argv = [rt, "run", "--rm", "--network", "none", "-v", f"{st['root']}:{OVERLAY_DIR}:ro"]
    for k, v in sorted({**{str(a): str(b) for a, b in (prof_env or {}).items()}, **overlay_env(img, prof_env, engine)}.items()):
        argv += ["-e", f"{k}={v}"]
    argv += ["--entrypoint", "python3", conf["image"], "-I", "-S", "-c", OVERLAY_CHECK, json.dumps(job)]
    try:
        p = _run(argv, timeout=timeout + 120)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "why": f"checking the overlay in image {conf['image']} took longer than "
                                           f"{timeout + 120:g} s"}
    try:
        res = json.loads(p.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"status": "failed", "why": f"the overlay check in image {conf['image']} gave no answer: {_why(p)}"}
    if res.get("compile"):
        return {"status": "failed", "why": f"the overlay does not compile with the image's python3: {res['compile']}"}
    results = res.get("modules") or []
    worst = next((r for r in results if r["status"] == "failed"), None) \
        or next((r for r in results if r["status"] == "not-verifiable"), None) or (results[0] if results else None)
    if worst is None:
        return {"status": "ok", "why": "compiled with the image's python3; no module to import", "modules": []}
    why = "compiled and imported with the image's python3; every method is callable"
    if worst["status"] == "failed":
        why = worst["why"]
    elif worst["status"] == "not-verifiable":
        why = f"compiled with the image's python3; import not verifiable here ({worst['why']}): checked statically"
    return {"status": worst["status"], "why": why, "modules": results}


def overlay_preflight(req: dict, conf: ContainerConfig, img: ContainerImage, checks: list) -> tuple:
    """The overlay for a container (the default fix): staged from the image's own files, compiled
    and imported in the image. Returns (the staged overlay or None, the fix the server will use)."""
    from provision.host.engine import overlay as render
    from provision.host.ops import overlay

    engine = inference.for_request(req)
    prof_env = (req.get("profile") or {}).get("env") or {}
    specs = list(req.get("specs") or ([req["spec"]] if req.get("spec") else []))
    why = render.refusal_for_env(prof_env, engine) or render.refusal_for_version(img.get("version"), engine)
    if why:
        checks.append({"level": "fail", "check": "overlay", "message": f"image {conf['image']}: {why}"
                       if "version" in why else why})
        return None, "none"
    state_dir = req.get("state_dir") or default_state_dir()
    inst = mirror_install(state_dir, img, engine)
    st, fix = overlay.stage_for_preflight(
        inst, specs, state_dir, checks, native=f"the image's {engine.title} {img.get('version')} has every method "
                                               "natively: no overlay needed, the container starts without one")
    if st is None:
        return None, fix
    rt = runtime_path(conf["runtime"]) or conf["runtime"]
    st["verify"] = verify_in_image(rt, conf, img, st, prof_env, float(req.get("import_timeout") or overlay.IMPORT_TIMEOUT),
                                   engine)
    held = ", ".join(f"{r['class']}.{m}" for r in st["specs"] for m in r["methods"])
    if st["verify"]["status"] == "failed":
        checks.append({"level": "fail", "check": "overlay", "message": f"the overlay {st['root']} is broken: "
                       f"{st['verify']['why']}"})
        return None, "none"
    st["env"] = overlay_env(img, prof_env, engine)
    st["container_root"] = OVERLAY_DIR
    checks.append({"level": "ok", "check": "overlay", "message": (
        f"overlay {st['verdict']} in {st['root']} ({held}), mounted read-only at {OVERLAY_DIR}; "
        f"{st['verify']['why']}")})
    return st, "overlay"


def op_preflight(req: dict, bundle: bytes) -> dict:
    """Preflight of a container launch: runtime, image (and its SGLang, read from inside it), the
    spec's class in the image, the container name, port, model paths through the volumes."""
    prof = req["profile"]
    conf: ContainerConfig = prof["container"]
    args = prof["args"]
    port = int(args.get("port", 30000))
    bind = str(args.get("host", "127.0.0.1"))
    if runtime_path(conf["runtime"]) is None:
        return {"ok": False, "error": missing_runtime(conf["runtime"]), "checks": []}
    specs = list(req.get("specs") or ([req["spec"]] if req.get("spec") else []))
    img = image_install(req, conf, spec_files(req))
    if img.get("error"):
        return {"ok": False, "error": img["error"], "checks": []}
    vols = list(conf.get("volumes") or [])
    eng = inference.for_request(req)
    model_paths = [(str(p), what) for p, what in ((args.get(eng.model_arg), "model"), (eng.draft_path(args), "drafter"))
                   if p]
    # a folder on no volume is the image's own: read where the server will look, before any start
    in_image = preflight_model.image_models(runtime_path(conf["runtime"]), img, bundle,
                                            {p: w for p, w in model_paths if p.startswith("/") and
                                             host_path(vols, p) is None})
    model_rows = preflight_model.image_model_checks(req, runtime_path(conf["runtime"]), img, bundle,
                                                    lambda p: host_path(vols, p), in_image)
    req = preflight_model.with_covering_specs(req, model_rows)  # --overlay: it carries a covering spec
    specs = list(req.get("specs") or ([req["spec"]] if req.get("spec") else []))
    if set(spec_files(req)) - set(img.get("files") or {}) - set(img.get("file_errors") or {}):
        img = image_install(req, conf, spec_files(req))  # the covering spec's file, from the image
        if img.get("error"):
            return {"ok": False, "error": img["error"], "checks": []}
    checks: list[dict] = [{"level": "ok", "check": "image", "message": (
        f"image {conf['image']}: {eng.title} {img.get('version')} at "
        f"{img.get('install')} (python {img.get('python')})"
        + (", pulled" if img.get("pulled") else ""))}]
    staged = None
    fix = "none"
    if req.get("overlay") and specs:
        staged, fix = overlay_preflight(req, conf, img, checks)
    else:
        for spec in specs:
            info = image_patch_state(img, spec)
            need = image_fix(info)
            if info is not None and info.get("error"):
                checks.append({"level": "fail", "check": "patch", "message": f"{info.get('file') or spec['file']} in "
                               f"the image: {info['error'].get('message')}"})
            elif need["kind"] == "missing":
                checks.append({"level": "fail", "check": "patch", "message": (
                    f"{spec['class']} in the image's {eng.title} {img.get('version')} lacks {', '.join(need['missing'])}: "
                    "EAGLE-3 will crash after the weights load; launch with the overlay (`fix: overlay`)")})
            else:
                fix = "native" if need["kind"] == "native" else "edited file"
                checks.append({"level": "ok", "check": "patch", "message": (
                    f"{spec['class']} in the image: delegation methods in place ({need['kind']}); no fix needed")})
    st = select.server_state(req, port)
    ours_running = st["running"]
    doc = summary(inspect(conf["runtime"], conf["name"]))
    rec = st["record"] or {}
    if doc["exists"] and not doc["ours"]:
        checks.append({"level": "fail", "check": "name", "message": (
            f"a container named {conf['name']} exists and provision did not start it ({doc.get('status')}, image "
            f"{doc.get('image')}): remove it, or set launch.container.name")})
    if not ours_running and port_open(bind, port):
        checks.append({"level": "fail", "check": "port", "message": f"something is already listening on {bind}:{port}"})
    elif not ours_running:
        checks.append({"level": "ok", "check": "port", "message": f"port {port} is free"})
    offline = bool(req.get("offline"))
    for path, what in model_paths:
        if not path.startswith("/"):
            checks += preflight_checks.check_model(path, what, offline)
            continue
        on_host = host_path(vols, path)
        if on_host is None:
            checks += in_image_rows(path, what, conf["image"], in_image.get(path) or {})
        else:
            checks += [dict(c, message=c["message"] + f" (in the container: {path})")
                       for c in preflight_checks.check_model(on_host, what, offline)]
    checks.append({"level": "info", "check": "gpus", "message": (
        f"GPUs: {conf['gpus']} (the runtime's --gpus)" if conf.get("gpus") else "no --gpus in the profile")})
    checks += model_rows
    return {"ok": True, "checks": checks, "running": ours_running, "record": st["record"] if rec else None,
            "survivors": st.get("survivors") or [], "image": public(img), "fix": fix, "overlay": staged, "facts": {}}


def in_image_rows(path: str, what: str, image: str, got: dict) -> list[dict]:
    """The path check of a model folder on no volume, from what was read inside the image. Pure."""
    if "rows" not in got:
        return [{"level": "warn", "check": what, "message": got.get("error") or f"{what} {path}: not checked"}]
    rows = []
    for r in got["rows"]:
        if r["level"] == "fail" and r["message"] == f"{what} {path} does not exist":
            r = dict(r, message=(f"{what} {path} is neither on a volume nor in image {image}: the server would die "
                                 f"after it starts; mount the host folder that holds it (launch.container.volumes: "
                                 f"HOST_DIR:{path}:ro) or use an image that has it"))
        else:
            r = dict(r, message=r["message"] + f" (in image {image}, on no volume)")
        rows.append(r)
    return rows


def prepare_start(req: dict, sroot: str) -> dict:
    """What the container backend's start needs for this request: the image (its SGLang), the
    overlay's variables and mount. {"ok", "launch"} or {"ok": False, "error"}."""
    prof = req["profile"]
    conf: ContainerConfig = prof["container"]
    if runtime_path(conf["runtime"]) is None:
        return {"ok": False, "error": missing_runtime(conf["runtime"])}
    img = image_install(req, conf, spec_files(req))
    if img.get("error"):
        return {"ok": False, "error": img["error"]}
    extra_env: dict = {}
    extra_mounts: list[str] = []
    staged = req.get("overlay_stage")
    if staged:
        from provision.host.ops.overlay import start_refusal

        why = start_refusal(staged, prof.get("env"), inference.for_request(req))
        if why:
            return {"ok": False, "error": {"kind": "overlay", "message": why}}
        extra_env = overlay_env(img, prof.get("env"), inference.for_request(req))
        extra_mounts = [f"{staged['root']}:{OVERLAY_DIR}:ro"]
    return {"ok": True, "launch": {"sroot": sroot, "image": dict(img), "extra_env": extra_env,
                                   "extra_mounts": extra_mounts}, "image": img}


def finish_record(req: dict, rec: dict, img: ContainerImage) -> dict:
    """The container's fix (per spec) and the overlay, in its record."""
    specs = list(req.get("specs") or ([req["spec"]] if req.get("spec") else []))
    staged = req.get("overlay_stage")
    needs = [dict(image_fix(image_patch_state(img, sp)), spec=sp.get("name")) for sp in specs]
    rec["container"]["fix"] = needs[0] if needs else image_fix(None)
    rec["container"]["fixes"] = needs
    rec["overlay"] = {k: staged.get(k) for k in ("root", "package", "modules", "digest", "container_root")} \
        if staged else None
    return rec
