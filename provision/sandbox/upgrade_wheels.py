"""Wheels a sandbox host can upgrade to (`provision upgrade`'s tests): a real SGLang release's wheel,
every Python file as released, with the sandbox's two changes a host's own install gets
(hosts.py): `sglang/launch_server.py` runs the stand-in (no GPU here), and the stand-in stubs of
SGLang's heavy imports (torch, ...) come with it as a top-level module and its `.pth`. Installed
by pip with `--no-deps`, the new venv then imports and serves as the host's first one does.
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
