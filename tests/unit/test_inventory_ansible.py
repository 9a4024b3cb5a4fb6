"""Ansible inventories: INI, host ranges, group vars and children, the variables we map,
through ansible-inventory where it is installed and through our own reader without it."""

from __future__ import annotations

import shutil

import pytest

from provision.errors import ConfigError
from provision.config.inventory import expand_pattern, host_list, load_inventory, parse_ini, select

INI = """\
# a typical Ansible inventory
bastion.example ansible_host=10.0.0.1

[gpus]
gpu[01:03] ansible_user=ubuntu
gpu04:2200 ansible_host=10.0.1.4 rack=r7

[gpus:vars]
ansible_ssh_private_key_file=~/.ssh/fleet
ansible_become=true
ansible_become_password_file=/etc/provision/sudo-pass
ansible_python_interpreter=/opt/venv/bin/python3
ansible_ssh_common_args='-o ProxyJump=admin@bastion.example:2222 -o UserKnownHostsFile=/etc/fleet_known_hosts -o ServerAliveInterval=5'

[eu]
node-[a:b] ansible_port=2201

[eu:vars]
ansible_user=eu-admin

[fleet:children]
gpus
eu

[fleet:vars]
ansible_user=fleet
ansible_connection=ssh
"""


def test_host_ranges():
    assert expand_pattern("gpu[01:08]") == [f"gpu0{i}" for i in range(1, 9)]
    assert expand_pattern("gpu[8:10]") == ["gpu8", "gpu9", "gpu10"]
    assert expand_pattern("node-[a:c]") == ["node-a", "node-b", "node-c"]
    assert expand_pattern("r[1:2]n[01:02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    assert expand_pattern("gpu[00:10:5]") == ["gpu00", "gpu05", "gpu10"]
    with pytest.raises(ConfigError, match="empty"):
        expand_pattern("gpu[5:1]")


def _check(inv):
    by = {h.name: h for h in inv.hosts}
    assert list(by) == ["bastion.example", "gpu01", "gpu02", "gpu03", "gpu04", "node-a", "node-b"]
    g1 = by["gpu01"].vars
    assert g1["user"] == "ubuntu"  # the host line beats the group, the child group beats its parent
    assert g1["identity"] == "~/.ssh/fleet" and g1["sudo"] is True
    assert g1["sudo_password_file"] == "/etc/provision/sudo-pass" and g1["python"] == "/opt/venv/bin/python3"
    assert g1["jump"] == "admin@bastion.example:2222" and g1["known_hosts"] == "/etc/fleet_known_hosts"
    assert by["gpu04"].vars["port"] == 2200 and by["gpu04"].vars["address"] == "10.0.1.4"
    assert by["gpu04"].vars["user"] == "fleet"
    assert by["node-a"].vars["port"] == 2201 and by["node-a"].vars["user"] == "eu-admin"
    assert set(by["gpu02"].groups) == {"gpus", "fleet"}
    assert by["bastion.example"].vars == {"address": "10.0.0.1"}
    assert [h.name for h in select(inv, "fleet,!eu")] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    notes = " | ".join(inv.notes)
    assert "ansible_connection" in notes and "rack" in notes and "ServerAliveInterval" in notes


def test_ini_inventory_without_ansible(tmp_path):
    p = tmp_path / "hosts"
    p.write_text(INI)
    _check(load_inventory(str(p), use_ansible=False))


@pytest.mark.skipif(not shutil.which("ansible-inventory"), reason="ansible-core not installed (pip install '.[test]')")
def test_ini_inventory_through_ansible_inventory_reads_the_same(tmp_path):
    p = tmp_path / "hosts"
    p.write_text(INI)
    _check(load_inventory(str(p)))


@pytest.mark.parametrize("use_ansible", [False, None], ids=["ours", "ansible-inventory"])
def test_a_directory_inventory_with_group_vars(tmp_path, use_ansible):
    if use_ansible is None and not shutil.which("ansible-inventory"):
        pytest.skip("ansible-core not installed")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "hosts.ini").write_text("[gpus]\ngpu[1:2]\n")
    (tmp_path / "more.yml").write_text("all:\n  children:\n    gpus:\n      hosts:\n        gpu3: {ansible_port: 2203}\n")
    (tmp_path / "group_vars" / "gpus.yml").write_text("ansible_user: ops\n")
    inv = load_inventory(str(tmp_path), use_ansible=use_ansible)
    by = {h.name: h for h in inv.hosts}
    assert sorted(by) == ["gpu1", "gpu2", "gpu3"]
    assert all(h.vars["user"] == "ops" for h in by.values()) and by["gpu3"].vars["port"] == 2203


@pytest.mark.parametrize("use_ansible", [False, None], ids=["ours", "ansible-inventory"])
def test_bad_values_name_the_file_the_host_and_the_value(tmp_path, use_ansible):
    if use_ansible is None and not shutil.which("ansible-inventory"):
        pytest.skip("ansible-core not installed")
    p = tmp_path / "inventory.ini"
    p.write_text("[gpus]\ngpu01 ansible_port=ssh\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(str(p), use_ansible=use_ansible)
    assert str(p) in e.value.message and "gpu01" in e.value.message and "'ssh'" in e.value.message
    p.write_text("[gpus]\ngpu01\n[gpus:vars]\nansible_ssh_common_args=\"-o ProxyCommand='ssh -W %h:%p jump\"\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(str(p), use_ansible=use_ansible)
    msg = e.value.message
    assert str(p) in msg and "ansible_ssh_common_args" in msg and "ProxyCommand='ssh -W %h:%p jump" in msg
    assert "gpu" in msg


def test_become_user_other_than_root_is_refused():
    with pytest.raises(ConfigError, match="ansible_become_user 'postgres'"):
        parse_ini("[g]\nh1 ansible_become_user=postgres\n", "inv")


def test_host_list_and_a_private_key_given_to_i(tmp_path):
    assert [h.name for h in load_inventory("gpu01,gpu02,").hosts] == ["gpu01", "gpu02"]
    assert [h.name for h in host_list("gpu[1:3],").hosts] == ["gpu1", "gpu2", "gpu3"]
    assert [h.name for h in load_inventory("gpu01,").hosts] == ["gpu01"]
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="--private-key"):
        load_inventory(str(key))
    with pytest.raises(ConfigError, match="no such inventory"):
        load_inventory(str(tmp_path / "hosts"))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_INI_BITS = st.sampled_from(["[g]", "[g:vars]", "[g:children]", "[all:vars]", "h[01:0x]", "h[1:3]", "h[a:c]",
                             "h:22", "ansible_port=x", "ansible_port=22", "ansible_become=maybe", "k='v",
                             "ansible_ssh_common_args='-o ProxyJump=a", "x=\"y z\"", "#c", ";c", "[", "]", "=",
                             " ", "\n", "g", "h1", "ansible_become_user=bob"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_INI_BITS, max_size=30).map(" ".join) | st.text(max_size=200))
def test_fuzzed_ini_gives_config_errors_only(text):
    try:
        parse_ini(text, "fuzz.ini")
    except ConfigError:
        pass
