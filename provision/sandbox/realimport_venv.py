"""Venvs where Python really imports released SGLang on a CPU (the `realimport` test tier).

The other tiers judge an edit as text (``ast``) or import SGLang over stub dependencies. This
one builds, once per machine, a venv from Debian's ``/usr/bin/python3`` with the real third-party
packages SGLang's model files import, a CPU build of torch (the local wheel pip's configuration
lists as ``find-links``; a constraints file pins it, so pip never pulls a CUDA build), and SGLang
itself installed ``--no-deps`` from the registry. Two CUDA-only packages, which a GPU host
provides for real, are stand-ins loaded at interpreter start-up by a ``.pth`` file (Debian's own
``sitecustomize`` in the standard library would shadow one in site-packages):

* ``sgl_kernel`` (``.kvcacheio``, ``.scalar_type``): the real one needs ``libcuda.so.1``;
* ``torchvision`` (``.transforms``, ``.transforms.functional``): each with a ``__spec__``, or
  transformers raises. Never ``pip install torchvision`` here: it replaces torch with a CUDA build.

The venv lives in ``~/.cache/provision-realimport/venv-<version>-<hash>``, the hash taken over
everything that goes in (interpreter, torch wheel, packages, stand-ins), so it is rebuilt only
when absent. Tests never write into it: ``overlay_venv`` makes a small venv whose own
site-packages holds a private copy of the ``sglang`` package and whose ``.pth`` adds the cached
site-packages (its ``.pth`` files too) behind it. Test set-up only: nothing here is the product.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from provision.sandbox.homedir import REAL_HOME_VAR

SYSTEM_PYTHON = "/usr/bin/python3"
TORCH = "torch==2.13.0"
LAYOUT_VERSION = 1   # bump when the venv is laid out differently
# What SGLang's model files import, per release (installed with deps, torch constrained).
PACKAGES = {
    "0.5.9": ("transformers==4.57.1", "triton==3.5.1", "numpy", "einops", "pybase64", "ipython", "pydantic",
              "aiohttp", "orjson", "pyzmq", "pillow", "starlette", "openai==2.6.1", "partial-json-parser",
              "dill", "sentencepiece", "compressed-tensors", "gguf", "msgspec"),
    # 0.5.23 pins newer transformers/openai/compressed-tensors (its METADATA); Python >= 3.11.
    "0.5.23": ("transformers==5.19.0", "apache-tvm-ffi==0.1.11", "triton==3.5.1", "numpy", "einops", "pybase64", "ipython", "pydantic",
               "aiohttp", "orjson", "pyzmq", "pillow", "starlette", "openai==2.8.0", "partial-json-parser",
               "dill", "sentencepiece==0.2.1", "compressed-tensors==0.18.0", "gguf", "msgspec"),
}
VERSIONS = tuple(PACKAGES)
STANDINS_MODULE = "_provision_cuda_standins"

STANDINS_PY = '''"""provision realimport venv: stand-ins for CUDA-only packages (see provision/sandbox/realimport_venv.py).

A GPU host has the real sgl_kernel (it needs libcuda.so.1) and a torchvision matching its torch.
Here every name asked of them is an inert placeholder; calling one raises.
"""
import importlib
import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError("%s is a CPU stand-in (provision realimport venv): no CUDA here" % self._name)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder(self._name + "." + name)

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return "<CPU stand-in %s>" % self._name


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder(self.__name__ + "." + name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves any submodule of the stand-in packages (transformers 5 asks for torchvision.io, ...)."""
    tops = ("sgl_kernel", "torchvision")

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.tops:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        if module.__name__ == "torchvision":  # transformers 5 compares it (torch 2.13 goes with 0.28)
            module.__version__ = "0.28.0+cpu"
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
for _name in ("sgl_kernel", "sgl_kernel.kvcacheio", "sgl_kernel.scalar_type",
              "torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
    importlib.import_module(_name)
'''


class VenvUnavailable(RuntimeError):
    """The realimport venv cannot be built here; the message says why."""


def cache_root() -> Path:
    root = os.environ.get("PROVISION_REALIMPORT_CACHE") or os.path.join(
        os.environ.get(REAL_HOME_VAR) or os.path.expanduser("~"), ".cache", "provision-realimport")
    return Path(root)


def _find_links() -> list[str]:
    """pip's configured find-links directories (where the CPU torch wheel lies)."""
    proc = subprocess.run([SYSTEM_PYTHON, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if proc.returncode != 0:  # Debian's python without pip: ask the one running us
        proc = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True)
    out = []
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            out += [v for v in value.strip().strip("'\"").split() if v]
    return list(dict.fromkeys(out))


def _torch_wheels() -> list[str]:
    name = TORCH.split("==")[0]
    version = TORCH.split("==")[1]
    found = []
    for d in _find_links():
        path = d[len("file://"):] if d.startswith("file://") else d
        if os.path.isdir(path):
            found += sorted(n for n in os.listdir(path) if n.startswith(f"{name}-{version}+cpu-"))
    return found


def recipe(version: str) -> dict:
    if version not in PACKAGES:
        raise VenvUnavailable(f"no realimport package list for SGLang {version} (known: {', '.join(VERSIONS)})")
    py = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
    # The stand-ins are not in it: ensure_venv rewrites them in place when they change (no rebuild).
    return {"python": py.stdout.strip(), "torch": TORCH, "torch_wheels": _torch_wheels(),
            "packages": list(PACKAGES[version]), "sglang": version, "layout": LAYOUT_VERSION}


def venv_dir(version: str) -> Path:
    digest = hashlib.sha256(json.dumps(recipe(version), sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / f"venv-{version}-{digest}"


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if not found:
        raise VenvUnavailable(f"{venv} has no lib/python3.*/site-packages")
    return found[0]


def _run(cmd: list[str], log: Callable[[str], object] | None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise VenvUnavailable(f"{' '.join(cmd[:6])} ... failed (exit {proc.returncode}):\n{tail}")


def locked_build(venv: Path, lock: Path, build: Callable[[], None], mark: str) -> float:
    """Build `venv` once per machine with `build()`: under the lock file `lock` (two builders never
    race), skipped while its `.complete` mark exists, started afresh after a build that stopped
    half-way; the mark (`mark`'s text) is written once `build()` returned. Seconds spent, 0 when cached."""
    done = venv / ".complete"
    if done.exists():
        return 0.0
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if done.exists():
            return 0.0
        t0 = time.monotonic()
        if venv.exists():
            shutil.rmtree(venv)
        build()
        done.write_text(f"{mark}\n")
        return time.monotonic() - t0


def ensure_venv(version: str = "0.5.9", log: Callable[[str], object] | None = None) -> tuple[Path, float]:
    """The cached venv for SGLang ``version``, built when absent. Returns (venv dir, seconds spent
    building: 0 when cached). One builder at a time per machine (a lock file beside it)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise VenvUnavailable(f"no {SYSTEM_PYTHON} (apt-get install -y python3 python3-venv)")
    venv = venv_dir(version)
    done = venv / ".complete"
    if done.exists() and _standins_current(venv):
        return venv, 0.0
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".lock-{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            _write_standins(site_packages(venv))
            return venv, 0.0
        t0 = time.monotonic()
        if log:
            log(f"building {venv.name}: CPU torch, SGLang {version}'s imports, sglang=={version} --no-deps "
                "(about a minute and 220 MB downloaded, once per machine)")
        if not recipe(version)["torch_wheels"]:  # else pip could take the registry's CUDA build
            raise VenvUnavailable(f"no CPU torch wheel ({TORCH}+cpu) in pip's find-links "
                                  f"({', '.join(_find_links()) or 'none configured'}; see `pip config list`)")
        if venv.exists():
            shutil.rmtree(venv)
        _run([SYSTEM_PYTHON, "-m", "venv", str(venv)], log)
        py = str(venv / "bin" / "python")
        constraints = venv / "constraints.txt"
        constraints.write_text(f"{TORCH}\n")
        pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input"]
        _run(pip + ["-c", str(constraints), "torch", *PACKAGES[version]], log)
        _run(pip + ["--no-deps", f"sglang=={version}"], log)
        _write_standins(site_packages(venv))
        # torch must be the CPU build, and torchvision never a real one
        check = subprocess.run([py, "-c", "import torch, torchvision, sys; "
                                "print(torch.__version__, torchvision.__spec__.origin)"],
                               capture_output=True, text=True)
        if check.returncode != 0 or "+cpu" not in check.stdout:
            raise VenvUnavailable(f"{venv}: torch is not the CPU build: {check.stdout.strip()} {check.stderr[-300:]}")
        (venv / "recipe.json").write_text(json.dumps(recipe(version), indent=2, sort_keys=True) + "\n")
        done.write_text(f"{version}\n")
        for old in root.glob(f"venv-{version}-*"):  # an older recipe's venv: nothing uses it any more
            if old != venv:
                shutil.rmtree(old, ignore_errors=True)
        return venv, time.monotonic() - t0


def _standins_current(venv: Path) -> bool:
    with contextlib.suppress(OSError, VenvUnavailable):
        return (site_packages(venv) / f"{STANDINS_MODULE}.py").read_text() == STANDINS_PY
    return False


def _write_standins(site: Path) -> None:
    """The CUDA stand-ins, loaded at start-up by a .pth (a sitecustomize here would be shadowed by
    Debian's own in the standard library)."""
    if (site / f"{STANDINS_MODULE}.py").is_file() and (site / f"{STANDINS_MODULE}.py").read_text() == STANDINS_PY:
        return
    tmp = site / f".{STANDINS_MODULE}.tmp"
    tmp.write_text(STANDINS_PY)
    os.replace(tmp, site / f"{STANDINS_MODULE}.py")
    (site / f"{STANDINS_MODULE}.pth").write_text(f"import {STANDINS_MODULE}\n")


def tree_size(path: Path) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, f)).st_size
    return total


def overlay_venv(base: Path, dest: Path, base_site_seen_as: str | None = None) -> Path:
    """A small venv at ``dest`` that imports a private copy of the cached venv ``base``'s
    ``sglang`` (its own site-packages, first on sys.path) and everything else from ``base``'s
    site-packages (a ``.pth`` that runs ``site.addsitedir``, so base's own ``.pth`` files, the
    stand-ins, run too). Patching the copy never writes into ``base``.
    ``base_site_seen_as``: the path where the interpreter that runs ``dest`` sees base's
    site-packages (a sandbox host with it bind-mounted elsewhere); default, where it is.
    Returns dest's site-packages."""
    base_site = site_packages(base)
    _run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(dest)], None)
    site = site_packages(dest)
    for entry in sorted(base_site.iterdir()):
        if entry.name == "sglang" or (entry.name.startswith("sglang-") and entry.name.endswith(".dist-info")):
            subprocess.run(["cp", "-a", "--", str(entry), str(site / entry.name)], check=True)
    seen = base_site_seen_as or str(base_site)
    (site / "zz_provision_realimport_base.pth").write_text(f"import site; site.addsitedir({seen!r})\n")
    return site
