"""`schedule --install` holds what its root unit runs to the trust rule (issue 29, item 3): the
provision executable and its interpreter, each with every directory up to /, root's and writable by
no one else. Real files and owners (root, nobody), the real installed `provision` script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from provision.errors import UsageError
from provision.tasks.schedule import interpreter_of, vet_argv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the trust rule's owners need root to set up")

NOBODY = 65534


@pytest.fixture
def trusted_dir():
    """A directory only root can write, with every directory above it (not under /tmp)."""
    d = tempfile.mkdtemp(prefix="provision-vet-", dir="/root")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _script(path, interpreter):
    with open(path, "w") as fh:
        fh.write(f"#!{interpreter}\nimport sys\nfrom provision.cli.main import main\nsys.exit(main())\n")
    os.chmod(path, 0o755)
    return path


def test_the_installed_provision_and_its_python_pass():
    exe = shutil.which("provision")
    if exe is None:
        pytest.skip("provision is not installed as a command here")
    checked = vet_argv([exe, "reconcile"])
    assert checked[0] == exe and os.path.isabs(checked[-1])
    assert checked[-1] == interpreter_of(exe)


def test_an_executable_another_account_owns_is_refused(trusted_dir):
    exe = _script(os.path.join(trusted_dir, "provision"), sys.executable)
    os.chown(exe, NOBODY, NOBODY)
    with pytest.raises(UsageError, match=f"the provision executable {exe} .*owned by nobody"):
        vet_argv([exe, "reconcile"])


def test_an_executable_in_a_group_writable_directory_is_refused(trusted_dir):
    sub = os.path.join(trusted_dir, "bin")
    os.mkdir(sub)
    os.chmod(sub, 0o775)
    exe = _script(os.path.join(sub, "provision"), sys.executable)
    with pytest.raises(UsageError, match=r"writable by group \(mode 0775\)"):
        vet_argv([exe, "reconcile"])


def test_an_interpreter_anyone_can_replace_is_refused(trusted_dir, tmp_path):
    python = tmp_path / "python3"  # under /tmp: world-writable on the way up
    python.symlink_to(sys.executable)
    exe = _script(os.path.join(trusted_dir, "provision"), str(python))
    assert vet_argv([sys.executable, "-m", "provision"])  # the real python passes
    with pytest.raises(UsageError, match=f"its interpreter {python} .*writable by"):
        vet_argv([exe, "reconcile"])
    with pytest.raises(UsageError, match=f"the provision executable {python}"):
        vet_argv([str(python), "-m", "provision"])


def test_schedule_install_refuses_an_untrusted_provision_and_writes_no_unit(trusted_dir, tmp_path):
    """As a user meets it: the provision they run lives in a directory another account can write."""
    shared = os.path.join(trusted_dir, "shared-bin")
    os.mkdir(shared)
    os.chown(shared, NOBODY, NOBODY)
    exe = _script(os.path.join(shared, "provision"), sys.executable)
    units = tmp_path / "units"
    proc = subprocess.run([exe, "schedule", "--host", "gpu01", "--install", "--unit-dir", str(units)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"the provision executable {exe}" in proc.stderr and f"{shared} is owned by nobody" in proc.stderr, \
        proc.stderr
    assert "Traceback" not in proc.stderr
    assert not units.exists() or not list(units.iterdir())


def test_schedule_install_with_a_trusted_provision_writes_absolute_paths(trusted_dir):
    exe = _script(os.path.join(trusted_dir, "provision"), sys.executable)
    units = os.path.join(trusted_dir, "units")
    proc = subprocess.run([exe, "schedule", "--host", "gpu01", "--install", "--unit-dir", units],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    service = open(os.path.join(units, "provision-reconcile.service")).read()
    line = next(x for x in service.splitlines() if x.startswith("ExecStart="))
    assert line.startswith(f"ExecStart={exe} reconcile"), line
    assert oct(os.stat(os.path.join(units, "provision-reconcile.service")).st_mode & 0o777) == "0o644"
