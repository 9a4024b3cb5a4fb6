"""The shipped playbooks are found from every way a user installs provision (non-editable):
`pip install --user` into Debian's python, `pipx install` and `uv tool install`, each from a
wheelhouse, offline. (A system-wide `pip install` is tested inside a systemd host:
tests/systemd/test_schedule_install.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheelhouse import wheelhouse  # noqa: F401  (a fixture)

SYSTEM_PYTHON = "/usr/bin/python3"
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))        # test extras: uv, pipx
PIPX = shutil.which("pipx") or str(Path(sys.executable).with_name("pipx"))


def _install(layout: str, home: Path, own: Path, deps: Path) -> tuple[Path, Path]:
    """Install; return (the `provision` executable, the python it runs on)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    links = ["--find-links", str(own), "--find-links", str(deps)]
    if layout == "pip --user":
        if subprocess.run([SYSTEM_PYTHON, "-m", "pip", "--version"], capture_output=True).returncode != 0:
            pytest.skip(f"no pip for {SYSTEM_PYTHON} (apt-get install python3-pip)")
        argv = [SYSTEM_PYTHON, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--user",
                "--break-system-packages", "--ignore-installed", "--no-index", *links, "provision"]
        exe, python = home / ".local/bin/provision", Path(SYSTEM_PYTHON)
    elif layout == "pipx":
        if not os.access(PIPX, os.X_OK):
            pytest.skip("no pipx (pip install pipx)")
        env.update(PIPX_HOME=str(home / "pipx"), PIPX_BIN_DIR=str(home / "bin"))
        argv = [PIPX, "install", "--pip-args", " ".join(["--no-index", *links]),
                str(next(own.glob("provision-*.whl")))]
        exe, python = home / "bin/provision", home / "pipx/venvs/provision/bin/python"
    else:
        if not os.access(UV, os.X_OK):
            pytest.skip("no uv (pip install uv)")
        env.update(UV_TOOL_DIR=str(home / "tools"), UV_TOOL_BIN_DIR=str(home / "bin"),
                   UV_CACHE_DIR=str(home / "uv-cache"))
        argv = [UV, "tool", "install", "--offline", "--no-index", *links, "--python", SYSTEM_PYTHON, "provision"]
        exe, python = home / "bin/provision", home / "tools/provision/bin/python"
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return exe, python


@pytest.mark.parametrize("layout", ["pip --user", "pipx", "uv tool"])
def test_shipped_playbooks_are_found_from_a_non_editable_install(layout, tmp_path, wheelhouse):  # noqa: F811
    own, deps = wheelhouse
    home = tmp_path / "home"
    home.mkdir()
    exe, python = _install(layout, home, own, deps)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    where = subprocess.run([str(python), "-c", "import provision.config.playbook as p; p.load_patch_spec(None); "
                            "print(p.PACKAGE_PLAYBOOKS)"], cwd="/", env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(home)) and where.stdout.strip().endswith("provision/playbooks")
    # The command itself, from another directory: a shipped spec by name, and the unit it would write.
    proc = subprocess.run([str(exe), "schedule", "--host", "gpu01", "--playbook", "kimi-vl-eagle3"], cwd="/", env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"ExecStart={exe} reconcile --host gpu01 --playbook kimi-vl-eagle3" in proc.stdout
