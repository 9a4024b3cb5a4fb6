"""The command line behaves the way infra engineers expect (no hosts needed: every case here
is decided before a host is touched)."""

from __future__ import annotations

import click
import pytest

from provision.cli.main import main
from provision.config.playbook import PACKAGE_PLAYBOOKS
from tests.cli.helpers import run

INV = """\
[gpus]
gpu[01:03] ansible_host=192.0.2.1
[cpu]
login01 ansible_host=192.0.2.2
"""


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "hosts"
    p.write_text(INV)
    return p


def test_unknown_host_with_an_inventory_is_exit_5_listing_what_exists(inv):
    proc = run("status", "-i", inv, "--host", "gpu09")
    assert proc.returncode == 5
    assert "gpu09" in proc.stderr and "gpu01, gpu02, gpu03, login01" in proc.stderr and "groups: cpu, gpus" in proc.stderr


def test_limit_matching_nothing_lists_what_exists(inv):
    proc = run("patch", "-i", inv, "--limit", "gpu1*")
    assert proc.returncode == 5
    assert "matches no host" in proc.stderr and "gpu01, gpu02, gpu03, login01" in proc.stderr


def test_i_means_an_inventory_and_a_key_is_pointed_at_private_key(tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n")
    proc = run("status", "-i", key)
    assert proc.returncode == 2 and f"--private-key {key}" in proc.stderr
    proc = run("status", "-i", tmp_path / "hosts")  # the newcomer's typo is an inventory that is not there
    assert proc.returncode == 2 and "no such inventory" in proc.stderr


def test_malformed_ansible_value_is_exit_2_naming_file_host_and_value(tmp_path):
    p = tmp_path / "hosts"
    p.write_text("[gpus]\ngpu01 ansible_host=192.0.2.1 ansible_ssh_common_args=\"-o ProxyCommand='ssh -W %h:%p j\"\n")
    proc = run("patch", "-i", p)
    assert proc.returncode == 2, proc.stderr
    assert str(p) in proc.stderr and "gpu01" in proc.stderr and "ProxyCommand='ssh -W %h:%p j" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_or_invalid_profile_is_exit_2_before_any_host(tmp_path):
    proc = run("launch", "--host", "192.0.2.1", "--playbook", tmp_path / "nope.yaml")
    assert proc.returncode == 2 and "no such playbook" in proc.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text((PACKAGE_PLAYBOOKS / "kimi-k25-eagle3.yaml").read_text().replace(
        "speculative-num-steps", "x-speculative-num-steps-x"))
    proc = run("launch", "--host", "192.0.2.1", "--playbook", bad)
    assert proc.returncode == 2 and "speculative-num-steps" in proc.stderr, proc.stderr
    proc = run("stop", "--host", "192.0.2.1", "--playbook", tmp_path / "nope.yaml")
    assert proc.returncode == 2


def test_a_spec_the_host_engine_would_reject_is_exit_2_at_load(tmp_path):
    """`type` would shadow the builtin the delegation body uses: the engine on the host rejects it;
    the loader used to accept it, and every host then failed (exit 3)."""
    bad = tmp_path / "shadow.yaml"
    bad.write_text((PACKAGE_PLAYBOOKS / "kimi-k25-eagle3.yaml").read_text().replace(
        '"self, embed, head"', '"self, embed, type"'))
    proc = run("patch", "--host", "192.0.2.1", "--playbook", bad)
    assert proc.returncode == 2 and "shadow the builtin" in proc.stderr, proc.stderr
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts:\n  gpu01: {{address: 192.0.2.1, spec: {bad}}}\n")
    proc = run("status", "-i", inv)
    assert proc.returncode == 2 and "shadow the builtin" in proc.stderr


def test_options_belong_to_their_command():
    for cmd in ("logs", "stop", "wait"):
        proc = run(cmd, "--host", "192.0.2.1", "--arg", "port=1")
        assert proc.returncode == 2 and "No such option '--arg'" in proc.stderr
        proc = run(cmd, "--host", "192.0.2.1", "--api-key-file", "/x")
        assert proc.returncode == 2 and "No such option" in proc.stderr
    assert "--last" in run("history", "--help").stdout and "--limit" not in run("history", "--help").stdout
    assert "--original" not in run("restore", "--help").stdout


def test_every_option_has_help_text():
    ctx = click.Context(main)
    missing = []

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), path + [name])
            return
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and not p.help:
                missing.append(f"{' '.join(path)} {'/'.join(p.opts)}")

    walk(main, ["provision"])
    assert missing == []


def test_an_ssh_config_openssh_rejects_is_exit_2_before_any_host(tmp_path):
    import shutil

    if not shutil.which("ssh"):
        pytest.skip("needs the OpenSSH client")
    cfg = tmp_path / "config"
    cfg.write_text("Host gpu*\n  ProxyJum bastion\n")
    proc = run("status", "--ssh-config", cfg, "--host", "gpu01", "--host", "gpu02")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "bad configuration option: proxyjum" in proc.stderr.lower() and proc.stderr.count("error:") == 1
