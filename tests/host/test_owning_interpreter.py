"""installs.owning_interpreter: which interpreter imports an install, read from its layout, never guessed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from provision.host.facts import installs

XY = "python%d.%d" % sys.version_info[:2]


def fake_sglang(site: Path) -> Path:
    pkg = site / "sglang"
    (pkg / "srt" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    return pkg


def venv(root: Path, lib: str = "lib") -> Path:
    """A real venv of Debian's python (or this one), and a fake sglang in its site-packages."""
    py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    subprocess.run([py, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    real = sorted((root / "lib").glob("python3.*/site-packages"))[0]
    site = root / lib / real.parent.name / "site-packages"
    return fake_sglang(site if site.is_dir() else real)


def record(pkg: Path, kind: str = "site-packages", interpreters=()) -> dict:
    return {"path": os.path.realpath(pkg), "kind": kind, "interpreters": list(interpreters),
            "pythonpath": os.path.dirname(os.path.realpath(pkg))}


@pytest.fixture
def trusted_tmp():
    """A directory discovery's trust rule accepts (root's, no group/other write up to /)."""
    for parent in ("/run", "/var/lib"):
        if os.path.isdir(parent) and installs.untrusted_reason(parent) is None:
            path = Path(tempfile.mkdtemp(prefix="provision-test-", dir=parent))
            os.chmod(path, 0o755)
            yield path
            shutil.rmtree(path, ignore_errors=True)
            return
    pytest.skip("no directory here passes the trust rule (run as root)")


def test_layout_python_reads_the_venv_around_site_packages(tmp_path):
    pkg = venv(tmp_path / "env")
    exe = installs._layout_python(os.path.realpath(pkg))
    assert exe is not None and exe.startswith(str(tmp_path / "env" / "bin" / "python"))
    assert os.access(exe, os.X_OK)


@pytest.mark.parametrize("layout", [
    "site-packages/sglang",                       # no lib/pythonX.Y above it
    f"lib/{XY}/dist-packages/sglang",             # Debian's system layout: not a venv's
    f"lib/{XY}/site-packages/sglang",             # no pyvenv.cfg above it
    f"lib/notpython/site-packages/sglang",
    f"opt/{XY}/site-packages/sglang",             # not under lib/ or lib64/
])
def test_layout_python_is_none_without_a_venv_layout(tmp_path, layout):
    pkg = fake_sglang((tmp_path / layout).parent)
    assert installs._layout_python(str(pkg)) is None


def test_layout_python_needs_an_interpreter_in_bin(tmp_path):
    pkg = fake_sglang(tmp_path / "env" / "lib" / XY / "site-packages")
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert installs._layout_python(str(pkg)) is None  # pyvenv.cfg, but no bin/python*


def test_an_interpreter_discovery_found_comes_first(tmp_path):
    pkg = fake_sglang(tmp_path / "site-packages")
    assert installs.owning_interpreter(record(pkg, interpreters=["/x/bin/python3"])) == ("/x/bin/python3", {}, None)


def test_a_source_checkout_runs_python3_with_pythonpath(tmp_path):
    pkg = fake_sglang(tmp_path / "sglang" / "python")
    python, env, why = installs.owning_interpreter(record(pkg, kind="source"))
    assert python and env == {"PYTHONPATH": str(tmp_path / "sglang" / "python")} and why is None


def test_a_bare_site_packages_tree_has_no_owner(tmp_path):
    pkg = fake_sglang(tmp_path / "site-packages")
    python, env, why = installs.owning_interpreter(record(pkg))
    assert python is None and env == {} and "no venv layout" in why
    # the other callers keep their fallback
    assert installs.owner_python(record(pkg))[1] == {"PYTHONPATH": str(tmp_path / "site-packages")}


def test_a_venv_under_a_world_writable_dir_is_not_run(tmp_path):
    if installs.untrusted_reason(str(tmp_path)) is None:
        pytest.skip("tmp_path passes the trust rule here")
    pkg = venv(tmp_path / "env")
    python, env, why = installs.owning_interpreter(record(pkg))
    assert python is None and "is not trusted here" in why, why


def test_a_trusted_venv_is_its_own_owner(trusted_tmp):
    pkg = venv(trusted_tmp / "env")
    python, env, why = installs.owning_interpreter(record(pkg))
    assert why is None and env == {}, why
    assert python.startswith(str(trusted_tmp / "env" / "bin" / "python"))
    assert installs.owner_python(record(pkg)) == (python, {})


def test_a_trusted_venv_through_lib64(trusted_tmp):
    root = trusted_tmp / "env"
    pkg = venv(root)
    if not (root / "lib64").exists():
        os.symlink("lib", root / "lib64")
    via = root / "lib64" / pkg.parent.parent.name / "site-packages" / "sglang"
    python, _env, why = installs.owning_interpreter(record(via) | {"path": str(via)})
    assert why is None and python.startswith(str(root / "bin" / "python")), why
