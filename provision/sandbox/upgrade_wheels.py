"""Wheels a sandbox host can upgrade to (`provision upgrade`'s tests): a real SGLang release's wheel,
every Python file as released, with the sandbox's two changes a host's own install gets
(hosts.py): `sglang/launch_server.py` runs the stand-in (no GPU here), and the stand-in stubs of
SGLang's heavy imports (torch, ...) come with it as a top-level module and its `.pth`. Installed
by pip with `--no-deps`, the new venv then imports and serves as the host's first one does.

vLLM's wheels on the registry are CUDA builds of hundreds of MB: `vllm_files_wheel` packs a release's
Python files and metadata from its source archive (vllm_sources.py, as the sandbox's vLLM hosts
carry them) into a pure wheel, which pip installs as it would the release's own.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from provision.sandbox.hosts import DEPS_MODULE, DEPS_STUB_PY, LAUNCH_SERVER_SHIM
from provision.sandbox.wheels import wheel_path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def standin_wheel(version: str, out_dir: Path) -> Path:
    """`sglang==version`'s real wheel with the sandbox's changes, written to `out_dir` under the
    real wheel's file name (pip reads the version from it); reused when already there."""
    src = wheel_path(version)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / src.name
    if dest.is_file():
        return dest
    extra = {"sglang/launch_server.py": LAUNCH_SERVER_SHIM.encode(), f"{DEPS_MODULE}.py": DEPS_STUB_PY.encode(),
             f"{DEPS_MODULE}.pth": f"import {DEPS_MODULE}\n".encode()}
    tmp = dest.with_suffix(".tmp")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in zin.infolist():
            if info.filename == record_name or info.filename in extra:
                continue
            data = zin.read(info.filename)
            zout.writestr(info, data)
            lines.append(_record_line(info.filename, data))
        for name, data in extra.items():
            zout.writestr(name, data)
            lines.append(_record_line(name, data))
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")
    tmp.rename(dest)
    return dest


def vllm_files_wheel(version: str, out_dir: Path) -> Path:
    """`vllm-VERSION-py3-none-any.whl`: the release's .py files and its METADATA (the source
    archive's PKG-INFO), with the dist-info a wheel has (WHEEL, top_level.txt, RECORD); reused
    when already there."""
    from provision.sandbox.vllm_sources import extracted

    src = extracted(version)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / f"vllm-{version}-py3-none-any.whl"
    if dest.is_file():
        return dest
    info = f"vllm-{version}.dist-info"
    tmp = dest.with_suffix(".tmp")
    lines = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for path in sorted((src / "vllm").rglob("*.py")):
            name = path.relative_to(src).as_posix()
            data = path.read_bytes()
            zout.writestr(name, data)
            lines.append(_record_line(name, data))
        extra = {f"{info}/METADATA": (src / info / "METADATA").read_bytes(), f"{info}/top_level.txt": b"vllm\n",
                 f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: provision-sandbox\nRoot-Is-Purelib: true\n"
                                  b"Tag: py3-none-any\n"}
        for name, data in extra.items():
            zout.writestr(name, data)
            lines.append(_record_line(name, data))
        lines.append(f"{info}/RECORD,,")
        zout.writestr(f"{info}/RECORD", "\n".join(lines) + "\n")
    tmp.rename(dest)
    return dest
