"""Fetch and unpack real SGLang wheels from the package registry.

The sandbox hosts and the engine tests use real SGLang releases, never a copy
checked into this repository. Wheels are fetched with ``pip download --no-deps``
into a cache directory and unpacked once per version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

DEFAULT_VERSIONS = ("0.5.9", "0.5.10")


def cache_dir() -> Path:
    root = os.environ.get("PROVISION_WHEEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "provision-wheels"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


class WheelUnavailable(RuntimeError):
    """The SGLang wheel is not cached and could not be downloaded."""


def wheel_path(version: str, dist: str = "sglang") -> Path:
    """Return the cached wheel for ``dist==version`` (sglang, flashinfer-python), downloading it
    if needed."""
    cache = cache_dir()
    # pure-Python wheels up to 0.5.22; 0.5.23 ships cp311 wheels with a Rust extension
    stem = dist.replace("-", "_")
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "-d", str(cache), f"{dist}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
    if found and proc.returncode == 0:
        return found[0]
    raise WheelUnavailable(
        f"could not fetch {dist}=={version} ({' '.join(cmd)}): "
        + (proc.stderr.strip().splitlines() or ["no output"])[-1]
    )


FLASHINFER = "flashinfer-python"


def extracted(version: str, dist: str = "sglang") -> Path:
    """Unpack the wheel once; return the directory that holds the package (``sglang/``,
    ``flashinfer/``) and its dist-info."""
    dest = cache_dir() / (f"unpacked-{version}" if dist == "sglang" else f"unpacked-{dist}-{version}")
    marker = dest / ".complete"
    if marker.exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = cache_dir() / f".unpacking-{dist}-{version}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    with zipfile.ZipFile(wheel_path(version, dist)) as zf:
        # the Python files and metadata only: a compiled extension is of no use to a host without a GPU
        names = [n for n in zf.namelist() if not n.endswith(".so")]
        if dist != "sglang":  # e.g. flashinfer's 48 MB of CUDA sources: only its Python and metadata
            names = [n for n in names if n.endswith(".py") or ".dist-info/" in n]
        zf.extractall(tmp, names)
    (tmp / ".complete").write_text(version)
    try:
        os.replace(tmp, dest)
    except OSError:  # another test worker unpacked it first (a cold cache, the suite in parallel)
        shutil.rmtree(tmp, ignore_errors=True)
        if not marker.exists():
            raise
    return dest


def models_file(version: str, name: str = "kimi_k25.py") -> Path:
    return extracted(version) / "sglang" / "srt" / "models" / name


def dist_info(version: str) -> Path:
    return extracted(version) / f"sglang-{version}.dist-info"
