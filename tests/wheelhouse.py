"""A wheelhouse to install provision from the way a user would (`pip install --no-index
--find-links DIR`): this tree's wheel, built fresh, and its dependencies' wheels, which
.ci/run builds once per machine into $PROVISION_WHEELHOUSE (default ~/.cache/provision-wheelhouse)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def wheelhouse_dir() -> Path:
    """$PROVISION_WHEELHOUSE, else the real home's cache (tests may give HOME another value)."""
    import pwd

    home = pwd.getpwuid(os.getuid()).pw_dir
    return Path(os.environ.get("PROVISION_WHEELHOUSE") or Path(home) / ".cache" / "provision-wheelhouse")


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory):
    deps = wheelhouse_dir()
    if not (any(deps.glob("paramiko-*.whl")) and any(deps.glob("setuptools-*.whl"))):
        # .ci/run fills it; try once here (needs the registry). setuptools: to build our wheel offline.
        deps.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w",
                               str(deps), str(REPO), "setuptools>=68"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"no wheelhouse in {deps} and `pip wheel` failed: "
                        + (proc.stderr.strip().splitlines() or ["no output"])[-1])
    for stale in deps.glob("provision-*.whl"):  # this tree's wheel is built fresh below
        stale.unlink()
    own = tmp_path_factory.mktemp("provision-wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                           "--no-index", "--find-links", str(deps), "-w", str(own), str(REPO)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return own, deps
