"""Find an inference engine's installs on this host without importing them.  STDLIB ONLY.

Runs on the GPU host (shipped as text by provision). What an install is comes from the engine
(host/inference: its ``package``, ``is_install`` and ``checkout_globs``; SGLang by default).
Importing the package pulls in torch and takes seconds, so each candidate interpreter is asked only
for ``importlib.util.find_spec(PACKAGE)`` and ``importlib.metadata``; source checkouts are found on
disk. Installs are de-duplicated by real path.

This runs as root on the host, so it runs no one else's code: an interpreter is
probed only when ``untrusted_reason`` finds it (and every directory above it) owned
by root or by the agent's own non-root user and not writable by group or others;
the others are listed in ``facts["skipped"]`` (an interpreter the user named is
used anyway, with a warning). The probe runs ``-I -S`` with PROBE_ENV, so no
site-packages code, ``PYTHONPATH`` or ``sitecustomize`` runs, and a server's cwd
and ``PYTHONPATH`` are handed to it as data.

The same rule (lib/trust.py, said once there) holds for each install found: a package
directory that is not root's alone (it, every directory above it and every file in it)
is never chosen, written or imported; it is listed in ``facts["skipped"]`` with why,
unless --sglang-path names it (or --python names an interpreter that imports it): then
it is used, with a warning. A server run by another uid never chooses the install.

Which install: the first of these rules that names one (``facts["chosen_rule"]``):
pinned (--sglang-path), python (--python / the inventory's `python:` imports it),
server (a running server of root's imports it; the lowest pid), python3 (python3 on
PATH imports it), only (the only trusted install); else an error naming them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
from typing import TYPE_CHECKING, Any, Mapping

from provision.host import inference
from provision.host.facts import packages
from provision.host.lib import trust
from provision.host.lib.paths import last_recorded_server
from provision.host.lib.pkgmeta import git_root, package_version
from provision.host.lib.procfs import cmdline as _proc_cmdline
from provision.host.lib.procfs import environ as _proc_environ
from provision.host.lib.procfs import uids as _proc_uids
from provision.host.lib.procfs import same_root, sees_our_file

if TYPE_CHECKING:
    from provision.host.inference.base import InferenceEngine

# Asked of each candidate interpreter, run as `python -I -S -c PROBE '<json list of dirs>'`:
# isolated from the environment (no PYTHONPATH, PYTHONHOME, user site) and without the
# site module, so no code from any site-packages (.pth files, sitecustomize) or from the
# listed dirs ever runs. The search path a normal start would build (the venv's
# site-packages, plain-path lines of .pth files) is rebuilt here as data, and the dirs
# given as argv[1] (a server's cwd and PYTHONPATH) are put in front. Then only
# `find_spec` (which does not import the package, PACKAGE: probe_text() names it) and
# `importlib.metadata` read files. Prints one JSON line; "package" is where the package is found.
PROBE = r"""
import json, os, sys
out = {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]}
extra = [p for p in (json.loads(sys.argv[1]) if len(sys.argv) > 1 else []) if isinstance(p, str) and p]
name = PACKAGE
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
prefix, system_site = sys.prefix, True
for cfg in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg")):
    if os.path.isfile(cfg):
        prefix = os.path.dirname(exe_dir)  # as site.venv() would set sys.prefix
        try:
            with open(cfg, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    k, _, v = line.partition("=")
                    if k.strip().lower() == "include-system-site-packages":
                        system_site = v.strip().lower() == "true"
        except OSError:
            pass
        break
out["prefix"] = prefix
xy = "python%d.%d" % sys.version_info[:2]
dirs = []
try:
    import site
    prefixes = [prefix] + ([sys.base_prefix, sys.base_exec_prefix] if prefix != sys.base_prefix and system_site else [])
    if prefix == sys.base_prefix:
        prefixes = [sys.prefix, sys.exec_prefix]
    for pre in dict.fromkeys(prefixes):
        for lib in dict.fromkeys((getattr(sys, "platlibdir", "lib"), "lib")):
            dirs.append(os.path.join(pre, lib, xy, "site-packages"))
        dirs.extend(site.getsitepackages([pre]))
except Exception as exc:
    out["site_error"] = repr(exc)
dirs = [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
more = []
for d in dirs:
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
    except OSError:
        continue
    for n in names:
        try:
            with open(os.path.join(d, n), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    line = line.rstrip()
                    if not line or line.startswith(("#", "import ", "import\t")):
                        continue
                    p = os.path.join(d, line)
                    if os.path.isdir(p):
                        more.append(p)
        except OSError:
            pass
sys.path[:] = extra + sys.path + dirs + more
out["search_path"] = [p for p in sys.path if p]
try:
    import importlib.util
    spec = importlib.util.find_spec(name)
except Exception as exc:
    spec = None
    out["error"] = repr(exc)
dist = None
try:
    import importlib.metadata as md
    dist = md.distribution(name)
except Exception:
    pass
if spec is None and dist is not None:
    try:  # an editable install served by a finder hook (.pth `import` line): its project dir
        du = json.loads(dist.read_text("direct_url.json") or "{}")
        if (du.get("dir_info") or {}).get("editable") and du.get("url", "").startswith("file://"):
            root = du["url"][len("file://"):]
            for cand in (os.path.join(root, name), os.path.join(root, "python", name)):
                if os.path.isfile(os.path.join(cand, "__init__.py")):
                    out["package"] = cand
                    break
    except Exception:
        pass
if spec is not None and spec.submodule_search_locations:
    out["package"] = list(spec.submodule_search_locations)[0]
if out.get("package") and dist is not None:
    try:
        out["dist_version"] = dist.version
        p = getattr(dist, "_path", None)
        out["dist_info"] = str(p) if p else None
        du = dist.read_text("direct_url.json")
        if du:
            out["direct_url"] = json.loads(du)
    except Exception:
        pass
print(json.dumps(out))
"""



def probe_text(package: str) -> str:
    """The probe's source asking for `package` (an engine's, as a literal: nothing of it is run)."""
    return f"PACKAGE = {package!r}\n" + PROBE


# The probe's whole environment: nothing of the caller's (or a server's) is inherited.
PROBE_ENV = trust.SAFE_ENV

INTERPRETER_GLOBS = [
    "/usr/bin/python3", "/usr/local/bin/python3",
    "/opt/*/bin/python3", "/opt/*/*/bin/python3", "/opt/conda/envs/*/bin/python3",
    "/root/*/bin/python3", "/root/.venv*/bin/python3", "/root/*/.venv/bin/python3",
    "/root/miniconda3/envs/*/bin/python3", "/root/anaconda3/envs/*/bin/python3",
    "/root/.local/share/uv/tools/*/bin/python3",
    "/home/*/*/bin/python3", "/home/*/.venv*/bin/python3", "/home/*/*/.venv/bin/python3",
    "/home/*/miniconda3/envs/*/bin/python3",
    "/workspace/*/bin/python3", "/workspace/.venv/bin/python3",
]



# --------------------------------------------------------------------------- who may run code here
# The one rule (lib/trust.py); its names stay importable from here.
trusted_uids = trust.trusted_uids
untrusted_reason = trust.untrusted_reason
_owner_name = trust.owner_name


def probe_interpreter(python: str, extra_paths: list | None = None, timeout: float = 15,
                      *, package: str) -> dict | None:
    """Ask `python` (already checked with untrusted_reason, or named by the user) where it
    finds `package` (its "package"). Isolated: -I -S, PROBE_ENV only, cwd /; `extra_paths` travel
    as data. Asked once per host call (facts/probed.py)."""
    from provision.host.facts import probed

    key = (python, package, tuple(extra_paths or ()))
    if probed.answers is not None and key in probed.answers:
        return probed.answers[key]
    got = _probe(python, extra_paths, timeout, package)
    if probed.answers is not None:
        probed.answers[key] = got
    return got


def _probe(python: str, extra_paths: list | None, timeout: float, package: str) -> dict | None:
    try:
        proc = subprocess.run([python, "-I", "-S", "-c", probe_text(package), json.dumps(list(extra_paths or []))],
                              capture_output=True, text=True, timeout=timeout, env=dict(PROBE_ENV), cwd="/",
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def candidate_interpreters(extra: list[str] | None = None) -> list[str]:
    seen: list[str] = []
    for p in list(extra or []) + [shutil.which("python3") or ""]:
        if p and p not in seen:
            seen.append(p)
    for pattern in INTERPRETER_GLOBS:
        for p in sorted(glob.glob(pattern)):
            if os.access(p, os.X_OK) and p not in seen:
                seen.append(p)
    home = os.path.expanduser("~")
    for pattern in (home + "/*/bin/python3", home + "/.venv*/bin/python3", home + "/*/.venv/bin/python3"):
        for p in sorted(glob.glob(pattern)):
            if os.access(p, os.X_OK) and p not in seen:
                seen.append(p)
    return seen


def _flag(argv: list[str], *names: str, default: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return default


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def running_servers(engine: "InferenceEngine") -> list[dict]:
    """The engine's server processes on this host (the main process of each tree, by the engine's
    own rule, ``is_server``); a server in a container (its root is not ours) is not the host's."""
    found = []
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    by_pid = {}
    for pid in pids:
        argv = _proc_cmdline(pid)
        if not argv:
            continue
        if engine.is_server(argv):
            if same_root(pid) is False:
                continue  # in a container: its files are not ours (facts/containers.py names it)
            by_pid[pid] = argv
    for pid, argv in by_pid.items():
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = fh.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            ppid = "0"
        if ppid in by_pid:
            continue  # a child (scheduler rank) of a server we already list
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = argv[0]
        if sees_our_file(pid, argv[0] if os.path.isabs(argv[0]) else exe) is False:
            continue  # another mount namespace whose interpreter is not ours: not this host's server
        host = _flag(argv, "--host", default="127.0.0.1")
        port = int(_flag(argv, "--port", default="30000") or 30000)
        found.append({"pid": int(pid), "argv": argv, "exe": exe, "python": argv[0],
                      "host": host, "port": port, "listening": port_open(host or "127.0.0.1", port)})
    return found


def _server_install(server: dict, engine: "InferenceEngine") -> str | None:
    """The install a running server imports, asked of its interpreter (if that passes
    untrusted_reason; else ``server["skipped"]`` says why). Its cwd and PYTHONPATH, read
    from /proc, are handed to the probe as data: nothing in them is ever executed."""
    python = server["python"] if os.path.isabs(server["python"]) else server["exe"]
    why = untrusted_reason(python)
    if why:
        server["skipped"] = {"path": python, "reason": why, "server_pid": server["pid"]}
        return None
    env = _proc_environ(str(server["pid"]))
    try:
        cwd = os.readlink(f"/proc/{server['pid']}/cwd")
    except OSError:
        cwd = None
    extra = [cwd] if cwd else []
    for entry in (env.get("PYTHONPATH") or "").split(os.pathsep):
        if entry:
            extra.append(entry if os.path.isabs(entry) or not cwd else os.path.join(cwd, entry))
    res = probe_interpreter(python, extra, package=engine.package)
    if res and res.get("package"):
        return os.path.realpath(res["package"])
    return None


def discover(extra_interpreters: list[str] | None = None, pinned: str | None = None,
             configured_python: str | None = None, *, engine: str, recorded: dict | None = None) -> dict:
    """All installs of the engine, its running servers, and which install to act on."""
    eng = inference.get(engine)
    warnings: list[str] = []
    skipped: list[dict] = []
    if configured_python and not pinned and not (os.path.isfile(configured_python)
                                                 and os.access(configured_python, os.X_OK)):
        if os.path.isabs(configured_python) or not shutil.which(configured_python):
            return {"installs": [], "servers": [], "chosen": None, "chosen_reason": None, "warnings": warnings,
                    "skipped": [], "error": {"kind": "python-missing",
                              "message": f"the configured interpreter {configured_python} does not exist on this "
                                         "host (fix --python or the inventory's `python:`)"}}
    named = ([configured_python] if configured_python else []) + (extra_interpreters or [])
    found = _Found(eng)
    interpreters = _interpreters(named, warnings, skipped)
    from concurrent.futures import ThreadPoolExecutor  # here: (threading, logging) only a discovery pays for it

    with ThreadPoolExecutor(max_workers=8) as pool:
        probes = list(pool.map(lambda py: probe_interpreter(py, package=eng.package), interpreters))
    for python, res in zip(interpreters, probes):
        if not res or not res.get("package") or not eng.is_install(res["package"]):
            continue
        pkg = res["package"]
        kind = "site-packages" if ("site-packages" in pkg or "dist-packages" in pkg) else "source"
        found.add(pkg, kind, python, res.get("dist_version") or package_version(pkg), res.get("dist_info"),
                  res.get("direct_url"), res.get("search_path"))
    for pattern in eng.checkout_globs:
        for pkg in sorted(glob.glob(pattern)):
            if eng.is_install(pkg):
                found.add(pkg, "source", None, package_version(pkg))
    if pinned:
        if not eng.is_install(pinned):
            return {"installs": list(found.installs.values()), "servers": [], "chosen": None, "warnings": warnings,
                    "skipped": skipped, "error": {"kind": "pinned-missing",
                              "message": f"--sglang-path {pinned}: not {eng.article} {eng.package} package directory "
                                         f"(expected {eng.install_shape})"}}
        found.add(pinned, "source" if "site-packages" not in pinned else "site-packages", None, package_version(pinned))
    pinned_real = os.path.realpath(pinned) if pinned else None
    _drop_untrusted(found, named, pinned_real, warnings, skipped)
    for rec in found.installs.values():
        _complete(rec, eng)
    servers = _judge_servers(sorted(running_servers(eng), key=lambda s: s["pid"]), found, skipped)
    installs = list(found.installs.values())
    chosen, rule, reason, error = choose(installs, servers, pinned=pinned_real,
                                         configured_python=configured_python, python3=shutil.which("python3"),
                                         skipped=skipped, recorded=recorded, engine=eng)
    if error is not None and error.get("kind") == "not-found" and not _probing_others:
        error = dict(error, message=error["message"] + _others_here(eng, named))
    return {"installs": installs, "servers": servers, "chosen": chosen,
            "chosen_reason": reason, "chosen_rule": rule, "warnings": warnings, "error": error,
            "skipped": skipped}


_probing_others: list = []  # set while _others_here runs discovery for the other engines (no recursion)


def _others_here(eng, named: list) -> str:
    """What a not-found error adds: the other engines' installs this host does have, and the option
    that picks one (issue 63: a vLLM-only host answered "no SGLang install found" and no more)."""
    out = []
    _probing_others.append(True)
    try:
        for other in inference.engines():
            if other.name == eng.name:
                continue
            got = discover(named, engine=other.name)
            for inst in got.get("installs") or []:
                out.append(f"{other.title} {inst.get('version') or '?'} at {inst['path']}")
            if got.get("installs"):
                out[-1] += f" (--engine {other.name}, or a playbook of engine: {other.name})"
    finally:
        _probing_others.pop()
    return f"; this host has {', '.join(out)}" if out else ""


class _Found:
    """The installs found so far, by real path, and the install rule's verdict on each path (asked once)."""

    def __init__(self, eng) -> None:
        self.eng = eng
        self.installs: dict[str, dict] = {}
        self._why: dict[str, str | None] = {}

    def add(self, pkg: str, kind: str, python: str | None, version: str | None, dist_info: str | None = None,
            direct_url: dict | None = None, search_path: list | None = None) -> None:
        real = os.path.realpath(pkg)
        rec = self.installs.setdefault(real, {
            "path": real, "kind": kind, "version": version, "interpreters": [], "dist_info": dist_info,
            "git": None, "pythonpath": None, "search_path": None, "engine": self.eng.name,
        })
        if search_path and not rec["search_path"]:  # the owning interpreter's (the first that imports it)
            rec["search_path"] = list(search_path)
        if python and python not in rec["interpreters"]:
            rec["interpreters"].append(python)
        if version and not rec["version"]:
            rec["version"] = version
        if dist_info and not rec["dist_info"]:
            rec["dist_info"] = dist_info
        if direct_url and (direct_url.get("dir_info") or {}).get("editable"):
            rec["kind"] = "editable"

    def why(self, path: str) -> str | None:
        """The install rule (lib/trust.py): why an install is not root's (and its user's) alone, or None."""
        real = os.path.realpath(path)
        if real not in self._why:
            self._why[real] = trust.untrusted_install_reason(real)
        return self._why[real]


def _interpreters(named: list, warnings: list, skipped: list) -> list[str]:
    """The interpreters to probe: the trusted candidates, and those named explicitly (with a warning)."""
    out = []
    for python in candidate_interpreters(named):
        why = untrusted_reason(python)
        if why is None:
            out.append(python)
        elif python in named:
            out.append(python)
            warnings.append(f"{python}: {why}; used anyway because it was named explicitly (--python or the "
                            f"inventory's `python:`): it runs as {_owner_name(os.geteuid())} here")
        else:
            skipped.append({"path": python, "reason": why})
    return out


def _drop_untrusted(found: _Found, named: list, pinned_real: str | None, warnings: list, skipped: list) -> None:
    """An install that is not root's (and its user's) alone is never chosen, written or imported;
    one named explicitly is used, with a warning."""
    for real in list(found.installs):
        why = found.why(real)
        if why is None:
            continue
        by = next((p for p in found.installs[real]["interpreters"] if p in named), None)
        if real == pinned_real or by:
            how = "--sglang-path" if real == pinned_real else f"{by}, named with --python or `python:`, imports it"
            warnings.append(f"{real}: {why}; used anyway because it was named explicitly ({how}): "
                            f"{_owner_name(os.geteuid())} imports it and writes into it here")
        else:
            del found.installs[real]
            skipped.append({"path": real, "reason": why, "what": "install"})


def _complete(rec: dict, eng) -> None:
    """An install's version, git checkout, PYTHONPATH (an un-installed checkout) and dist-info."""
    if rec["version"] is None:
        rec["version"] = package_version(rec["path"])
    rec["git"] = git_root(rec["path"]) if rec["kind"] != "site-packages" else None
    if not rec["interpreters"]:
        # An un-installed source checkout: python3 runs it with PYTHONPATH set.
        rec["pythonpath"] = os.path.dirname(rec["path"])
    if rec["dist_info"] is None and rec["kind"] == "site-packages":
        for cand in glob.glob(os.path.join(os.path.dirname(rec["path"]), f"{eng.package}-*.dist-info")):
            rec["dist_info"] = cand


def _judge_servers(servers: list, found: _Found, skipped: list) -> list:
    """A running server chooses the install only when it runs as root (or as the agent's own user)
    and imports a trusted install: another user's server never steers root."""
    ours = trust.trusted_uids()
    for s in servers:
        s["install"] = _server_install(s, found.eng)
        if s.get("skipped") and s["skipped"]["path"] not in [k["path"] for k in skipped]:
            skipped.append(s["skipped"])
        uids = _proc_uids(s["pid"])[:2]
        s["uid"] = uids[-1] if uids else None
        foreign = [u for u in uids if u not in ours]
        if foreign:
            s["user"] = _owner_name(foreign[0])
            skipped.append({"path": s["install"] or s["python"], "server_pid": s["pid"], "what": "server",
                            "reason": f"it runs as {s['user']}, so it does not choose the install"})
            continue
        if s["install"] and found.why(s["install"]) is not None:
            if s["install"] not in [k["path"] for k in skipped]:
                skipped.append({"path": s["install"], "reason": found.why(s["install"]), "what": "install",
                                "server_pid": s["pid"]})
            continue
        s["chooses"] = bool(s["install"])
    return servers


SELECTION_ORDER = ("pinned", "python", "server", "recorded", "python3", "only")


def choose(installs: list, servers: list, *, pinned: str | None = None, configured_python: str | None = None,
           python3: str | None = None, skipped: list | None = None, recorded: dict | None = None,
           engine: "InferenceEngine") -> tuple:
    """Which install to act on: (path, rule, reason, None) for the first rule of SELECTION_ORDER that
    names one, or (None, None, None, error). `installs` are the trusted ones (and any named
    explicitly); a server counts when it ``chooses`` (run by a trusted uid, a trusted install):
    the lowest pid's. `recorded`: the record of the server provision started last here (its
    `python`, `port`): after an upgrade the old and new installs both stay, and the one the last
    server ran is the one a plain launch means. `engine` names the engine in the sentences. Pure."""
    eng = engine
    by_python = [r["path"] for r in installs if configured_python and configured_python in r["interpreters"]]
    live = sorted((s for s in servers if s.get("chooses") and s.get("install")), key=lambda s: s["pid"])
    by_py3 = [r["path"] for r in installs if python3 and python3 in r["interpreters"]]
    rec_py = (recorded or {}).get("python")
    rec_venv = os.path.dirname(os.path.dirname(rec_py)) if isinstance(rec_py, str) and "/bin/" in rec_py else None
    by_record = [r["path"] for r in installs if rec_py and (rec_py in r["interpreters"] or (
        rec_venv and rec_venv != "/" and r["path"].startswith(rec_venv + "/")))]
    if pinned:
        return pinned, "pinned", "it was pinned with --sglang-path", None
    if by_python:
        return by_python[0], "python", f"{configured_python} (--python or `python:`) imports it", None
    if live:
        s = live[0]
        who = _owner_name(s["uid"]) if s.get("uid") is not None else "a trusted user"
        return s["install"], "server", f"the running server pid {s['pid']} (run by {who}) imports it", None
    if by_record:
        return by_record[0], "recorded", (f"the server provision started last here (port {recorded.get('port')}, "
                                          f"{rec_py}) ran it"), None
    if by_py3:
        return by_py3[0], "python3", f"python3 on PATH ({python3}) imports it", None
    if len(installs) == 1:
        return installs[0]["path"], "only", "it is the only trusted install on this host", None
    if installs:
        return None, None, None, {
            "kind": "ambiguous",
            "message": f"several {eng.title} installs and none is imported by python3 on PATH: "
                       + "; ".join(f"{r['path']} ({r['version']})" for r in installs)
                       + ". Pin one with --sglang-path or set `python:` for the host"}
    untrusted = [k for k in skipped or [] if k.get("what") == "install"]
    return None, None, None, {
        "kind": "not-found",
        "message": f"no {eng.title} install found (looked at python3 on PATH, venvs and conda envs "
                   f"under /opt, /root, /home, and source checkouts {eng.checkout_hint})"
                   + ("; skipped as not root's alone: " + "; ".join(f"{k['path']} ({k['reason']})" for k in untrusted)
                      + " (name one with --sglang-path to use it anyway)" if untrusted else "")}


def installed_engine(req: Mapping[str, Any]) -> str:
    """The engine of a request that names none: the first engine provision knows whose install this
    host has (discovery as the request asks it), else the first engine (whose discovery then says
    what is missing)."""
    found = installed_engines(req, first=True)
    return found[0][0] if found else inference.KNOWN[0]


def installed_engines(req: Mapping[str, Any], first: bool = False) -> list:
    """[(engine name, its chosen install)] for each engine provision knows whose install this host
    has (discovery as the request asks it); `first`: stop at the first."""
    out = []
    _probing_others.append(True)  # (each engine is tried here: a miss need not look for the others)
    try:
        for eng in inference.engines():
            facts = discover(extra_interpreters=req.get("interpreters") or [], pinned=req.get("install_path"),
                             configured_python=req.get("python"), engine=eng.name)
            if facts.get("chosen"):
                out.append((eng.name, chosen_install(facts)))
                if first:
                    break
    finally:
        _probing_others.pop()
    return out


def ambiguous_engine(found: list) -> dict | None:
    """The error of a command that names no engine on a host with several (pure): each install
    named, and the option that picks one; None with one or none."""
    if len(found) < 2:
        return None
    said = " and ".join(f"{inference.get(n).title} {(i or {}).get('version') or '?'} at {(i or {}).get('path')}"
                        for n, i in found)
    return {"kind": "engine-ambiguous", "message": f"this host has {said}: name the engine with "
            + " or ".join(f"--engine {n}" for n, _ in found)}


def for_request(req: Mapping[str, Any]) -> Any:
    """Discovery as a request asks for it (extra interpreters, a pinned path, a configured python),
    with `packages`: where the chosen install's interpreter finds each package the request's
    specs name (their `package` and `applies` keys) or its `packages` list asks for."""
    facts = discover(extra_interpreters=req.get("interpreters") or [],
                     pinned=req.get("install_path"), configured_python=req.get("python"),
                     engine=inference.of_request(req) or installed_engine(req),
                     recorded=last_recorded_server(req.get("state_dir")))
    specs = ([req["spec"]] if isinstance(req.get("spec"), dict) else []) + list(req.get("specs") or [])
    names = packages.wanted(specs, req.get("packages"))
    facts["packages"] = packages.for_install(chosen_install(facts), names) if not facts.get("error") else {}
    return facts


def chosen_install(facts: Mapping[str, Any]) -> Any:
    """The install record discovery chose, or None."""
    for rec in facts["installs"]:
        if rec["path"] == facts["chosen"]:
            return rec
    return None


def _layout_python(pkg: str) -> str | None:
    """The interpreter of the venv whose layout holds `pkg`: <venv>/lib/pythonX.Y/site-packages/sglang
    under a <venv>/pyvenv.cfg, run as <venv>/bin/pythonX.Y (or python3, python). None otherwise."""
    site = os.path.dirname(pkg)
    libdir = os.path.dirname(site)
    m = re.fullmatch(r"python(\d+\.\d+)", os.path.basename(libdir))
    if not m or os.path.basename(site) != "site-packages" or \
            os.path.basename(os.path.dirname(libdir)) not in ("lib", "lib64"):
        return None
    prefix = os.path.dirname(os.path.dirname(libdir))
    if not os.path.isfile(os.path.join(prefix, "pyvenv.cfg")):
        return None
    for name in (f"python{m.group(1)}", "python3", "python"):
        exe = os.path.join(prefix, "bin", name)
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    return None


def owning_interpreter(install: dict) -> tuple[str | None, dict, str | None]:
    """(interpreter, extra env, None) that imports this install as its server would: an interpreter
    discovery found importing it; else, for a site-packages install, the venv its layout names
    (subject to untrusted_reason, and asked where it finds the package); else, for a source checkout,
    python3 with PYTHONPATH. (None, {}, why) when no interpreter owns a site-packages install:
    python3 with PYTHONPATH would skip the venv's .pth files, so it is never guessed."""
    if install["interpreters"]:
        return install["interpreters"][0], {}, None
    if install.get("kind") != "site-packages":
        return shutil.which("python3") or "/usr/bin/python3", {"PYTHONPATH": install["pythonpath"]}, None
    exe = _layout_python(install["path"])
    if exe is None:
        return None, {}, f"no interpreter on this host imports {install['path']} (no venv layout around it)"
    why = untrusted_reason(exe)
    if why:
        return None, {}, f"{exe}, whose venv holds {install['path']}, is not trusted here: {why}"
    package = os.path.basename(install["path"].rstrip("/"))  # the package directory is named for it
    res = probe_interpreter(exe, package=package)
    if not res or not res.get("package") or os.path.realpath(res["package"]) != os.path.realpath(install["path"]):
        return None, {}, f"{exe}, whose venv holds {install['path']}, imports " \
                         f"{(res or {}).get('package') or 'no ' + package} instead"
    return exe, {}, None


def owner_python(install: dict) -> tuple[str, dict]:
    """(interpreter, extra env) that imports this install (owning_interpreter); where none owns it,
    python3 with PYTHONPATH, for the callers that only read or stage files."""
    python, env, _why = owning_interpreter(install)
    if python:
        return python, env
    py = shutil.which("python3") or "/usr/bin/python3"
    return py, {"PYTHONPATH": install["pythonpath"]}


def server_python(install: dict, profile: dict) -> tuple[str, dict]:
    """(interpreter, extra env) that runs the server: the profile's `python:` when it names one,
    else owner_python's. The one rule for the server, used by its preflight, its start checks, its
    environment and its start alike. It differs from owner_python (the rule for reading and staging
    the install's files) only by that choice: a launch may run its own interpreter (a wrapper venv
    that imports the same install), while the files read and staged are always the owner's. The
    extra env (a checkout's PYTHONPATH) is the owner's either way: it is where the install is."""
    python, env = owner_python(install)
    return (profile.get("python") or python), env
