"""The `upgrade` op: a new release of the engine in a venv beside the serving one.  STDLIB ONLY.

`provision upgrade` (tasks/upgrade.py) never installs in place: the new release goes into a venv
beside the serving one, named ENGINE-VERSION (tasks/upgrade_plan.py decides the names), so the
way back is a restart into the old venv. Actions:

- ``survey``: the server on `port` (its record): its interpreter, install and version, its venv,
  the venvs beside it that an upgrade made (ENGINE-VERSION), and whether the new one is there.
- ``install``: the new venv made from the serving venv's interpreter and the release installed by
  pip into it (``--find-links`` a wheelhouse on the host, ``--index-url``, or pip's own
  configuration). The venv is complete only once its marker (`.provision-upgrade.json`) is
  written, last: one without it (a killed pip) is removed and made again, never served.
- ``prune``: remove venvs an upgrade made, never the serving one.

Root creates these, so the directory they go in must be root's and writable by no one else
(links planted there would take the venv elsewhere).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time

from provision.host.lib import atomic, failpoints
from provision.host.ops.backends.record import read_record

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import UpgradeAnswer, UpgradeRequest

MARKER = ".provision-upgrade.json"
PACKAGES = {"sglang": "sglang", "vllm": "vllm"}  # engine -> the distribution pip installs
# A release number as pip takes it, never a path or a shell word (the control side checked it
# with packaging; the host says it again).
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[0-9a-z.]+)?$")
PIP_TAIL = 4000
# A distribution's name with extras, as pip takes it (PEP 508), never an option or a path.
_PACKAGE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*\])?$")


def _err(kind: str, message: str) -> dict:
    return {"ok": False, "error": {"kind": kind, "message": message}}


def venv_of(python: str | None) -> str | None:
    """The venv an interpreter is in: `<venv>/bin/python*` with `<venv>/pyvenv.cfg`."""
    if not python or not os.path.isabs(python):
        return None
    bindir = os.path.dirname(python)
    if os.path.basename(bindir) != "bin" or not os.path.basename(python).startswith("python"):
        return None
    venv = os.path.dirname(bindir)
    return venv if os.path.isfile(os.path.join(venv, "pyvenv.cfg")) else None


def _safe_parent(parent: str) -> str | None:
    """Why root must not create a venv in `parent`, or None: it must be a real directory, owned by
    root (or this account), that no other account can write."""
    try:
        st = os.lstat(parent)
    except OSError as exc:
        return f"{parent}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{parent} is not a directory (a symbolic link, or a file)"
    if st.st_uid not in (0, os.geteuid()):
        return f"{parent} belongs to uid {st.st_uid}, not to root: another account could plant links there"
    if st.st_mode & 0o022:
        return f"{parent} is writable by other accounts (mode {oct(st.st_mode & 0o7777)}): links planted there " \
               "would be followed"
    return None


def _marker(venv: str) -> dict | None:
    try:
        with open(os.path.join(venv, MARKER)) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _beside(parent: str, engine: str) -> list:
    """The venvs an upgrade made beside the serving one: ENGINE-VERSION with the marker."""
    out = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return out
    for name in names:
        path = os.path.join(parent, name)
        if not name.startswith(engine + "-") or not _VERSION.match(name[len(engine) + 1:]):
            continue
        mark = _marker(path)
        out.append({"path": path, "version": name[len(engine) + 1:], "complete": mark is not None,
                    "python": (mark or {}).get("python")})
    return out


def _where(req: dict) -> tuple:
    """(record, serving venv, new venv path, engine, version), or an error answer."""
    engine, version = req.get("engine") or "sglang", str(req.get("version") or "")
    if engine not in PACKAGES:
        return None, _err("bad-request", f"no engine named {engine!r}")
    if not _VERSION.match(version):
        return None, _err("bad-request", f"{version!r} is not a release number")
    port = int(req.get("port") or 30000)
    rec = read_record(req, port)
    if rec is None:
        return None, _err("no-server", f"no server provision started on port {port}: an upgrade restarts a "
                                       "running server into the new release (`provision launch` first)")
    if rec.get("backend") == "container":
        return None, _err("container", f"the server on port {port} runs in a container: its release is the "
                                       "image's (`upgrade --image TAG`, not a venv)")
    venv = venv_of(rec.get("python"))
    if venv is None:
        return None, _err("not-a-venv", f"the server on port {port} runs {rec.get('python')}, which is not in a "
                                        "venv: an upgrade puts the new release in a venv beside the serving one")
    new = os.path.join(os.path.dirname(venv), f"{engine}-{version}")
    return (rec, venv, new, engine, version), None


def _container_survey(req: dict) -> dict | None:
    """A container server's survey (its image and the release read from it when it started), or
    None when the server on the port is not in a container: `upgrade --image` restarts it on
    another tag, nothing is installed on the host."""
    port = int(req.get("port") or 30000)
    rec = read_record(req, port)
    if rec is None or rec.get("backend") != "container":
        return None
    box = rec.get("container") or {}
    return {"ok": True, "serving": {"python": None, "install": rec.get("install"), "version": rec.get("version"),
                                    "venv": None, "pid": rec.get("pid"), "image": box.get("image"),
                                    "container": box.get("name")},
            "new": {}, "beside": []}


def survey(req: dict) -> dict:
    boxed = _container_survey(req)
    if boxed is not None:
        return boxed
    where, err = _where(req)
    if err:
        return err
    rec, venv, new, engine, version = where
    mark = _marker(new)
    return {"ok": True, "serving": {"python": rec.get("python"), "install": rec.get("install"),
                                    "version": rec.get("version"), "venv": venv, "pid": rec.get("pid")},
            "new": {"path": new, "exists": os.path.lexists(new), "complete": mark is not None,
                    "python": (mark or {}).get("python"), "version": (mark or {}).get("version")},
            "beside": _beside(os.path.dirname(venv), engine)}


def _run(argv: list, timeout: float, env: dict) -> tuple:
    """(exit status, the tail of its output) of one step; the output to a temporary file, never
    to memory unbounded."""
    with tempfile.TemporaryFile() as out:
        try:
            rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = None
        size = out.tell()
        out.seek(max(0, size - PIP_TAIL))
        return rc, out.read().decode("utf-8", "replace")


def _wheels_dir(wheels: dict) -> str | None:
    """The wheels the control machine sent (name -> base64), in a private new directory pip reads
    (--find-links), or None when none were sent. Names are wheel file names, never paths."""
    if not wheels:
        return None
    import base64

    where = tempfile.mkdtemp(prefix="provision-wheelhouse-")  # 0700, a fresh name: nothing planted
    for name, data in wheels.items():
        if os.path.basename(name) != name or not name.endswith(".whl") or name.startswith("."):
            shutil.rmtree(where, ignore_errors=True)
            raise ValueError(f"{name!r} is not a wheel's file name")
        with open(os.path.join(where, name), "xb") as fh:
            fh.write(base64.b64decode(data))
    return where


def install(req: dict) -> dict:
    """The new venv made and the release installed in it; already there (marker written): as is."""
    where, err = _where(req)
    if err:
        return err
    rec, venv, new, engine, version = where
    mark = _marker(new)
    if mark is not None and mark.get("version") == version:
        return {"ok": True, "already": True, "venv": new, "python": mark.get("python"), "seconds": 0.0}
    if req.get("package") and not _PACKAGE.match(str(req["package"])):
        return _err("bad-request", f"{req['package']!r} is not a distribution name")
    why = _safe_parent(os.path.dirname(venv))
    if why:
        return _err("unsafe-dir", f"not installing beside {venv}: {why}")
    if os.path.islink(new):
        return _err("unsafe-dir", f"{new} is a symbolic link: not followed, not removed")
    try:
        sent = _wheels_dir(req.get("wheels") or {})
    except (ValueError, OSError) as exc:
        return _err("bad-request", f"the wheels sent: {exc}")
    try:
        return _install(req, rec, new, engine, version, sent)
    finally:
        if sent:
            shutil.rmtree(sent, ignore_errors=True)


def _install(req: dict, rec: dict, new: str, engine: str, version: str, sent: str | None) -> dict:
    if os.path.lexists(new):  # a half install (no marker): made again
        shutil.rmtree(new)
    t0 = time.monotonic()
    deadline = float(req.get("timeout") or 1800)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE", "PIP_FIND_LINKS", "HTTPS_PROXY",
                "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy"):
        if key in os.environ:  # the host's own pip configuration goes on
            env[key] = os.environ[key]
    rc, tail = _run([rec["python"], "-m", "venv", new], deadline, env)
    if rc != 0:
        shutil.rmtree(new, ignore_errors=True)
        return _err("venv", f"making the venv {new} with {rec['python']} failed "
                            f"({'timed out' if rc is None else f'exit {rc}'}): {tail.strip()[-500:]}")
    python = os.path.join(new, "bin", "python")
    package = str(req.get("package") or PACKAGES[engine])
    pip = [python, "-m", "pip", "install", "--quiet"]
    if sent or req.get("find_links"):
        pip += ["--no-index", "--find-links", sent or str(req["find_links"])]
    elif req.get("index_url"):
        pip += ["--index-url", str(req["index_url"])]
    if req.get("no_deps"):
        pip.append("--no-deps")
    pip.append(f"{package}=={version}")
    rc, tail = _run(pip, max(1.0, deadline - (time.monotonic() - t0)), env)
    if rc != 0:
        shutil.rmtree(new, ignore_errors=True)
        return _err("pip", f"pip could not install {package}=={version} into {new} "
                           f"({'timed out' if rc is None else f'exit {rc}'}; the venv was removed): "
                           f"{tail.strip()[-800:]}")
    failpoints.hit("upgrade_before_marker")
    atomic.write_json(os.path.join(new, MARKER), {"engine": engine, "package": package, "version": version,
                                                 "python": python,
                                                 "installed_at": time.time(), "beside": rec.get("python")})
    return {"ok": True, "already": False, "venv": new, "python": python,
            "seconds": round(time.monotonic() - t0, 2)}


def prune(req: dict) -> dict:
    """Remove the venvs named (an upgrade's, with its marker, beside the serving one), never it."""
    where, err = _where(dict(req, version=req.get("version") or "0"))
    if err:
        return err
    rec, venv, _new, engine, _v = where
    gone, kept = [], []
    made = {b["path"] for b in _beside(os.path.dirname(venv), engine) if b["complete"]}
    for path in req.get("paths") or []:
        if path == venv or path not in made or os.path.islink(path):
            kept.append(path)
            continue
        shutil.rmtree(path)
        gone.append(path)
    return {"ok": True, "removed": gone, "kept": kept}


ACTIONS = {"survey": survey, "install": install, "prune": prune}


def op_upgrade(req: UpgradeRequest, bundle: bytes) -> UpgradeAnswer:
    fn = ACTIONS.get(str(req.get("action") or ""))
    if fn is None:
        return _err("bad-request", f"no upgrade action {req.get('action')!r}: one of {', '.join(ACTIONS)}")  # type: ignore[return-value]
    return fn(dict(req))  # type: ignore[return-value]


OPS = {"upgrade": op_upgrade}
