"""The venv of the router tier: the real ``sglang-router`` and ``vllm-router`` from the package
registry (test set-up only).

Each is a Rust binary in an abi3 wheel (``sglang_router_rs``, ``vllm_router_rs``) with a Python
launcher, ``python -m sglang_router.launch_router`` / ``python -m vllm_router.launch_router``; the
launchers also import their debugging load balancer's dependencies (aiohttp, fastapi, uvicorn,
orjson) and setproctitle, so they get a venv of their own (both in one: their modules and
dependencies do not clash), made from Debian's ``/usr/bin/python3``. Cached in
``~/.cache/provision-router/venv-routers-<versions>-<hash>``, built once per machine (about 40 s and
200 MB); a lock file keeps two builders apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Callable

from provision.sandbox.homedir import REAL_HOME_VAR
from provision.sandbox.realimport_venv import SYSTEM_PYTHON, VenvUnavailable, locked_build

VERSION = "0.3.2"             # sglang-router
VLLM_ROUTER_VERSION = "0.1.17"
PACKAGES = (f"sglang-router=={VERSION}", f"vllm-router=={VLLM_ROUTER_VERSION}")
LAUNCHERS = ("sglang_router.launch_router", "vllm_router.launch_router")
LAYOUT_VERSION = 2


def cache_root() -> Path:
    root = os.environ.get("PROVISION_ROUTER_CACHE") or os.path.join(
        os.environ.get(REAL_HOME_VAR) or os.path.expanduser("~"), ".cache", "provision-router")
    return Path(root)


def venv_dir() -> Path:
    digest = hashlib.sha256(json.dumps({"packages": PACKAGES, "layout": LAYOUT_VERSION,
                                        "python": os.path.realpath(SYSTEM_PYTHON)}, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / f"venv-routers-{VERSION}-{VLLM_ROUTER_VERSION}-{digest}"


def cached() -> Path | None:
    venv = venv_dir()
    return venv if (venv / ".complete").exists() else None


def ensure_venv(log: Callable[[str], object] | None = None) -> tuple[Path, float]:
    """The cached venv, built when absent: (venv dir, seconds spent building, 0 when cached)."""
    venv = venv_dir()

    def build() -> None:
        if log:
            log(f"building {venv.name}: {' '.join(PACKAGES)} (about 40 s, once per machine)")
        for cmd in ([SYSTEM_PYTHON, "-m", "venv", str(venv)],
                    [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                     "--no-input", *PACKAGES]):
            proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
                raise VenvUnavailable(f"{' '.join(cmd[:6])} ... failed (exit {proc.returncode}):\n{tail}")
        for launcher in LAUNCHERS:
            check = subprocess.run([str(venv / "bin" / "python"), "-m", launcher, "--help"],
                                   capture_output=True, text=True, timeout=120)
            if check.returncode != 0:
                raise VenvUnavailable(f"{venv}: {launcher} does not run: {check.stderr[-400:]}")

    return venv, locked_build(venv, cache_root() / f".lock-routers-{VERSION}-{VLLM_ROUTER_VERSION}", build,
                              f"{VERSION}+{VLLM_ROUTER_VERSION}")
