"""Inventories: ours (strict) and Ansible's; errors name file and line; --limit."""
# The 10.0.0.x addresses below are inventory data for the parser only: no test connects to them.

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from provision.errors import ConfigError
from provision.config.inventory import load_inventory, parse_inventory, select

OURS = """\
defaults:
  user: root
  args: {port: 30000}
groups:
  east:
    vars:
      port: 2222
      args: {mem-fraction-static: 0.85}
    hosts: [gpu01, gpu02]
  west:
    hosts:
      gpu03: {address: 10.0.0.3}
hosts:
  gpu01:
    address: 10.0.0.1
    args: {port: 30001, model-path: /data/kimi}
  gpu02: {address: 10.0.0.2}
"""


def test_ours_merges_defaults_groups_hosts():
    inv = parse_inventory(OURS, "prod.yaml")
    by = {h.name: h for h in inv.hosts}
    assert [h.name for h in inv.hosts] == ["gpu01", "gpu02", "gpu03"]
    assert by["gpu01"].vars["port"] == 2222
    assert by["gpu01"].vars["args"] == {"port": 30001, "mem-fraction-static": 0.85, "model-path": "/data/kimi"}
    assert by["gpu02"].vars["args"] == {"port": 30000, "mem-fraction-static": 0.85}
    assert by["gpu03"].vars["address"] == "10.0.0.3" and by["gpu03"].groups == ("west",)


def test_unknown_key_is_an_error_with_its_line():
    text = OURS.replace("  gpu02: {address: 10.0.0.2}", "  gpu02:\n    adress: 10.0.0.2")
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "prod.yaml")
    assert str(exc.value).startswith("prod.yaml:18:")
    assert "adress" in str(exc.value)


def test_bad_port_and_bad_yaml():
    with pytest.raises(ConfigError, match=r"inv.yaml:3: hosts.a.port: expected a port number"):
        parse_inventory("hosts:\n  a:\n    port: http\n", "inv.yaml")
    with pytest.raises(ConfigError, match=r"inv.yaml:3: not valid YAML"):
        parse_inventory("hosts:\n  a: [\n", "inv.yaml")


def test_ansible_format_maps_connection_vars_and_notes_the_rest():
    text = """
all:
  vars:
    ansible_user: ubuntu
    ansible_become: true
    ansible_connection: ssh
    rack: r12
  children:
    gpus:
      vars:
        ansible_ssh_common_args: "-o ProxyJump=admin@bastion:2200"
      hosts:
        g1: {ansible_host: 10.1.0.1, ansible_port: 2222, ansible_ssh_private_key_file: ~/.ssh/k}
        g2: {ansible_host: 10.1.0.2}
"""
    inv = parse_inventory(text, "hosts.yml")
    g1 = inv.hosts[0]
    assert g1.vars == {"user": "ubuntu", "jump": "admin@bastion:2200", "address": "10.1.0.1", "port": 2222,
                       "identity": "~/.ssh/k", "sudo": True}
    assert g1.groups == ("gpus",)
    assert inv.notes == ["ignored Ansible variables (provision does not use them): ansible_connection",
                         "host variables provision does not use (not passed anywhere): rack"]


def test_limit_by_name_group_glob_and_exclusion():
    inv = parse_inventory(OURS, "prod.yaml")
    assert [h.name for h in select(inv, "east")] == ["gpu01", "gpu02"]
    assert [h.name for h in select(inv, "gpu0[13]")] == ["gpu01", "gpu03"]
    assert [h.name for h in select(inv, "all,!gpu02".replace("all", "*"))] == ["gpu01", "gpu03"]
    assert [h.name for h in select(inv, "west,gpu01")] == ["gpu01", "gpu03"]
    assert select(inv, "nothing") == []


def test_shipped_example_inventory_loads():
    inv = load_inventory("inventories/example.yaml")
    assert inv.hosts


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
@example("{{}}")                   # a mapping as a key: was TypeError (unhashable LineDict), found by this test
@example("hosts: {{a: 1}: {}}")
@example("? [a]\n: 1")             # a list as a key
def test_fuzzed_text_gives_config_errors_only(text):
    try:
        parse_inventory(text, "fuzz.yaml")
    except ConfigError:
        pass


values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                      max_leaves=15)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["defaults", "groups", "hosts", "all", "x"]), values, max_size=3))
def test_fuzzed_structures_give_config_errors_only(doc):
    try:
        parse_inventory(yaml.safe_dump(doc), "fuzz.yaml")
    except ConfigError:
        pass
