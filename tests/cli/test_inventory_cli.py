"""Ansible inventories drive real runs over sshd: an INI inventory with a host range and
group vars patches every host it names, with ansible-inventory and without it."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.cli.helpers import PROVISION, run_json

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def ini_hosts(sandbox_factory):
    hosts = [sandbox_factory.host(name=f"ini0{i}") for i in (1, 2)]
    yield hosts
    sandbox_factory.remove(*hosts)


def _env(tmp_path, with_ansible: bool) -> dict:
    if with_ansible:
        if not shutil.which("ansible-inventory"):
            pytest.skip("ansible-core not installed (pip install '.[test]')")
        return {}
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "provision").symlink_to(PROVISION)
    path = ":".join([str(bindir)] + [d for d in os.environ["PATH"].split(":")
                                     if d and not os.path.exists(os.path.join(d, "ansible-inventory"))])
    return {"PATH": path}


@pytest.mark.parametrize("with_ansible", [True, False], ids=["ansible-inventory", "ours"])
def test_ini_inventory_with_a_range_and_group_vars_patches_every_host(ini_hosts, sandbox_factory, tmp_path,
                                                                      reset_sglang, with_ansible):
    for h in ini_hosts:
        reset_sglang(h)
    a, b = ini_hosts
    inv = tmp_path / "hosts"
    inv.write_text(f"""\
ini01 ansible_host={a.address}
ini02 ansible_host={b.address}

[gpus]
ini[01:02]

[gpus:vars]
ansible_user=root
ansible_port={a.port}
ansible_ssh_private_key_file={sandbox_factory.key_path}
ansible_ssh_common_args='-o UserKnownHostsFile={sandbox_factory.known_hosts_path} -o StrictHostKeyChecking=yes'
gpu_model=H200
""")
    empty = tmp_path / "ssh_config"
    empty.write_text("")
    env = _env(tmp_path, with_ansible)
    proc, doc = run_json("patch", "-i", inv, "--ssh-config", empty, env=env, timeout=180)
    assert proc.returncode == 0, (proc.stderr, doc)
    assert {h["host"]: h["verdict"] for h in doc["hosts"]} == {"ini01": "patched", "ini02": "patched"}
    assert "gpu_model" in proc.stderr  # a variable we do not use is named, once
    assert proc.stderr.count("gpu_model") == 1
    proc, doc = run_json("status", "-i", inv, "--ssh-config", empty, "--limit", "gpus", env=env, timeout=180)
    assert proc.returncode == 0 and {h["verdict"] for h in doc["hosts"]} == {"patched"}


def test_a_comma_separated_host_list(ini_hosts, ssh_env):
    proc, doc = run_json("status", "-i", "ini01,ini02,", "--ssh-config", ssh_env.ssh_config,
                         "--known-hosts", ssh_env.known_hosts, timeout=180)
    assert sorted(h["host"] for h in doc["hosts"]) == ["ini01", "ini02"]
    assert not any(h["failed"] for h in doc["hosts"]), doc["hosts"]
