"""Fixtures for tests that need a real systemd: a systemd-booted sandbox host (a podman
container running /sbin/init, provision/sandbox/systemd.py) and a wheelhouse to install
provision into it the way a user would (`pip install --no-index --find-links DIR`).

  systemd_host  module: one systemd host (SGLang 0.5.9 source checkout + the stand-in),
                reset before each test (provision's units, state and logs removed, SGLang
                pristine).
  wheelhouse    session (tests/wheelhouse.py): (dir of this tree's provision wheel, dir of its
                dependencies' wheels, built once per machine by .ci/run).
"""

from __future__ import annotations

import pytest

from tests.wheelhouse import wheelhouse  # noqa: F401  (a fixture)


def _systemd_problems() -> list[str]:
    from provision.sandbox import systemd

    return systemd.problems()


@pytest.fixture(scope="module")
def systemd_host_module(sandbox_factory, request):
    if _systemd_problems():
        pytest.skip("systemd hosts unavailable: " + "; ".join(_systemd_problems()))
    from provision.sandbox.hosts import HostSpec

    tag = "".join(c for c in request.module.__name__.rsplit(".", 1)[-1] if c.isalnum())[-10:]
    sandbox_factory._count += 1
    spec = HostSpec(f"sd-{tag}{sandbox_factory._count}", "auto", "0.5.9", "source", sandbox_factory.port,
                    kind="systemd")
    host = sandbox_factory.up(spec)[0]  # podman and debootstrap are here: a failure to boot is a failure
    try:
        yield host
    finally:
        sandbox_factory.remove(host)


@pytest.fixture
def systemd_host(systemd_host_module):
    systemd_host_module.reset()
    return systemd_host_module


def install_provision(host, wheelhouse) -> str:
    """pip-install this tree's provision into the host's system python (Debian's, hence
    --break-system-packages), from the wheelhouse only; returns the `provision` path."""
    import shutil

    own, deps = wheelhouse
    dest = host.hostpath("/root/wheelhouse")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for whl in list(own.glob("*.whl")) + list(deps.glob("*.whl")):
        shutil.copyfile(whl, dest / whl.name)
    out = host.run("python3 -m pip install -q --disable-pip-version-check --no-index --find-links /root/wheelhouse "
                   "--break-system-packages --force-reinstall provision 2>&1 && command -v provision",
                   check=False, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().splitlines()[-1]
