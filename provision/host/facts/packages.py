"""Where an installed package other than sglang is, for an SGLang install.  STDLIB ONLY.

A spec's `package:` (e.g. flashinfer) names the package its `file` is relative to. It is
the one the SGLang server would import: found on the search path of the interpreter that
owns the SGLang install, as discovery's probe computed it (facts/installs.py keeps it as
data in ``install["search_path"]``; nothing is imported or run here). Its version comes from
the dist-info beside it whose top_level.txt (or RECORD) names the package.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from provision.host.lib.modules import PACKAGE

_VERSION = re.compile(r"^Version:[ \t]*(\S+)", re.M)


def search_path(install: dict) -> list:
    """The directories the install's interpreter imports from, in order (the probe's
    sys.path), else the directory that holds the sglang package (a bare source tree)."""
    dirs = [d for d in (install.get("search_path") or []) if isinstance(d, str) and d]
    if install.get("pythonpath"):
        dirs.insert(0, install["pythonpath"])
    if not dirs:
        dirs = [os.path.dirname(install["path"])]
    return list(dict.fromkeys(dirs))


def _read(path: str, limit: int = 1 << 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return ""


def dist_info_for(site: str, package: str) -> str | None:
    """The *.dist-info directory in `site` that installed the import package `package`."""
    for d in sorted(glob.glob(os.path.join(glob.escape(site), "*.dist-info"))):
        top = _read(os.path.join(d, "top_level.txt")).split()
        if package in top:
            return d
        if not top and any(line.startswith(package + "/") for line in _read(os.path.join(d, "RECORD"), 4 << 20).splitlines()):
            return d
    return None


def dist_version(dist_info: str | None) -> str | None:
    if not dist_info:
        return None
    m = _VERSION.search(_read(os.path.join(dist_info, "METADATA"), 64 << 10))
    return m.group(1) if m else None


def locate(install: dict, package: str) -> Any:
    """PackageInfo (protocol.py) of `package` as the install's interpreter would import it."""
    if package == PACKAGE:
        return {"name": package, "dir": install["path"], "version": install.get("version"),
                "dist_info": install.get("dist_info"), "error": None}
    for site in search_path(install):
        cand = os.path.join(site, package)
        if os.path.isfile(os.path.join(cand, "__init__.py")):
            di = dist_info_for(site, package)
            return {"name": package, "dir": os.path.realpath(cand), "version": dist_version(di),
                    "dist_info": di, "error": None}
    where = install["interpreters"][0] if install.get("interpreters") else f"the tree of {install['path']}"
    return {"name": package, "dir": None, "version": None, "dist_info": None,
            "error": {"kind": "package-missing",
                      "message": f"package {package} is not installed for {where} (looked in: "
                                 + ", ".join(search_path(install)[:6]) + ")"}}


def spec_file(install: dict, spec: dict) -> tuple:
    """(path of the spec's file, PackageInfo of its package). The path is None when the package
    is missing (PackageInfo's error says why)."""
    info = locate(install, spec.get("package") or PACKAGE)
    if info["dir"] is None:
        return None, info
    return os.path.join(info["dir"], spec["file"]), info


def wanted(specs: list, extra: list | None = None) -> list:
    """The package names a request's specs name (`package`, and `applies` keys), plus `extra`."""
    out: list = []
    for s in specs:
        if not isinstance(s, dict):
            continue
        names = [s.get("package") or PACKAGE] + [k for k in (s.get("applies") or {}) if k != "gpu_capability"]
        out.extend(names)
    out.extend(extra or [])
    return [n for n in dict.fromkeys(out) if isinstance(n, str) and n]


def for_install(install: dict | None, names: list) -> dict:
    """{name: PackageInfo} for every name (discovery's `packages` fact)."""
    if install is None:
        return {}
    return {n: locate(install, n) for n in names}
