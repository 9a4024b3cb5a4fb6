"""`provision sandbox up --systemd` / `down`, the way a user runs them."""

from __future__ import annotations

import subprocess

import pytest

from provision.sandbox import systemd
from tests.cli.helpers import run

pytestmark = pytest.mark.ssh


def test_sandbox_up_systemd_boots_an_ssh_host_and_down_removes_it(tmp_path, sandbox_factory):
    if systemd.problems():
        pytest.skip("systemd hosts unavailable: " + "; ".join(systemd.problems()))
    base = tmp_path / "box"
    for _ in range(32):  # an address nobody on this machine uses, picked as the fixtures pick theirs
        address = sandbox_factory._address()
        up = run("sandbox", "up", "--systemd", "--base-dir", base, "--first-address", address,
                 "--port", sandbox_factory.port, timeout=600)
        if "cannot listen on" not in up.stderr:  # taken: try the next one
            break
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"sbx1  {address}:{sandbox_factory.port}  sglang 0.5.9" in up.stdout and "systemd" in up.stdout
        assert f"args: {{host: {address}}}" in (base / "inventory.yaml").read_text()
        ssh = subprocess.run(["ssh", "-F", str(base / "ssh_config"), "-o", "BatchMode=yes", "sbx1",
                              "systemctl is-system-running; readlink /proc/1/exe; ls /root/sglang/python/sglang"],
                             capture_output=True, text=True, timeout=60)
        assert ssh.returncode == 0, ssh.stderr
        lines = ssh.stdout.split()
        assert lines[0] == "running" and lines[1].endswith("/systemd") and "srt" in lines
        status = run("sandbox", "status", "--base-dir", base, check_rc=0)
        assert "up" in status.stdout and "systemd" in status.stdout
    finally:
        down = run("sandbox", "down", "--base-dir", base)
    assert down.returncode == 0 and "sbx1" in down.stdout
    name = systemd.container_name(base.absolute(), "sbx1")
    assert systemd.podman("container", "exists", name, check=False).returncode != 0


def test_a_systemd_hosts_container_goes_when_its_owner_dies(tmp_path, sandbox_factory):
    """A test session that dies without teardown leaves no container behind."""
    if systemd.problems():
        pytest.skip("systemd hosts unavailable: " + "; ".join(systemd.problems()))
    import time

    from provision.sandbox.hosts import AddressInUse, HostSpec, Sandbox

    owner = subprocess.Popen(["sleep", "300"])
    box = Sandbox(tmp_path / "box", owner_pid=owner.pid)
    try:
        for _ in range(32):
            try:
                host = box.up([HostSpec("orphan", sandbox_factory._address(), None, "none", sandbox_factory.port,
                                        kind="systemd")])[0]
                break
            except AddressInUse:
                continue
        assert systemd.container_running(host.container)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 30
        while systemd.podman("container", "exists", host.container, check=False).returncode == 0:
            assert time.monotonic() < deadline, "the container outlived its owner"
            time.sleep(0.2)
    finally:
        owner.kill()
        box.down()


def test_an_address_taken_while_the_container_boots_is_address_in_use(tmp_path, sandbox_factory):
    """The address is free when checked and let go before the container's sshd binds it; if
    another sandbox takes it meanwhile, the host must not come up answering with their sshd."""
    if systemd.problems():
        pytest.skip("systemd hosts unavailable: " + "; ".join(systemd.problems()))
    import socket

    from provision.sandbox.hosts import AddressInUse

    for _ in range(32):
        address = sandbox_factory._address()
        taken = socket.socket()
        try:
            taken.bind((address, sandbox_factory.port))
            break
        except OSError:
            taken.close()
    taken.listen(8)  # someone else's listener: it accepts connections
    key = tmp_path / "client"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    name = systemd.container_name(tmp_path, "race")
    tag, _ = systemd.ensure_image()
    try:
        with pytest.raises(AddressInUse):
            systemd.start_container(name=name, hostname="race", address=address, port=sandbox_factory.port,
                                    image=tag, client_pub=key.with_suffix(".pub"), state_dir=tmp_path,
                                    owner_pid=0, bin_dir=tmp_path)
        assert systemd.podman("container", "exists", name, check=False).returncode != 0
    finally:
        taken.close()
        systemd.remove_container(name)
