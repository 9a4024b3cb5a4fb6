"""Bad input is a sentence, never a traceback (issue 29, item 4): every parser of what a user hands
provision ends in a ConfigError or UsageError, whatever the text. Deterministic (the suite's
hypothesis profile); every example that ever found a bug stays as an @example.

The inventories in YAML (ours and Ansible's) and the playbooks have their own properties in
test_inventory.py, test_inventory_ansible.py and test_playbook.py; here: Ansible INI, `-i` host
lists and ranges, an inventory of unknown format, `--arg` values, the ssh config (paramiko's reader),
and the same bad files through the `provision` command.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from provision.errors import ConfigError, ProvisionError

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=200)
INI_LINES = st.sampled_from([
    "[a]", "[a:vars]", "[a:children]", "[", "]", "[x:y:z]", "h1", "h1 ansible_host=10.1.230.174", "x=", "=y",
    "a[1:3]", "h[a:c] ansible_port=22", "h ansible_port=abc", "h ansible_user=ops", "b", ":", "h1 a=b c",
    "#c", ";c", "h ansible_ssh_common_args='-o X=1'", "h ansible_ssh_common_args='unclosed",
    "h[1:]", "h[:3]", "h[3:1]", "h[1:3:0]", "h ansible_become=maybe"])


@FUZZ
@given(st.lists(INI_LINES | TEXT, max_size=8).map("\n".join))
def test_ansible_ini_gives_config_errors_only(text):
    from provision.config.inventory.ini import parse_ini

    try:
        parse_ini(text, "fuzz.ini")
    except ConfigError:
        pass


@FUZZ
@given(TEXT)
@example("gpu[01:03],")
@example("gpu[3:1],")
@example(",,,")
def test_i_host_lists_give_config_errors_only(text):
    from provision.config.inventory.load import host_list

    try:
        host_list(text)
    except ConfigError:
        pass


@FUZZ
@given(TEXT | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
@example("{{}}")
@example("hosts: {{a: 1}: {}}")
@example("- a\n- b\n")           # a list where a mapping belongs
@example("\x00\x01\x02garbage")
def test_an_inventory_of_any_format_gives_config_errors_only(text):
    from provision.config.inventory import parse_inventory

    try:
        parse_inventory(text, "fuzz", ini_fallback=True)
    except ConfigError:
        pass


@FUZZ
@given(st.lists(TEXT, max_size=4))
@example(["=\x1f"])                 # a value YAML cannot read: was yaml.ReaderError, found by this test
@example(["=5"])                    # no flag name
@example(["port=[1"])
def test_arg_values_give_usage_errors_only(args):
    from provision.cli.launch import _parse_overrides

    try:
        _parse_overrides(args)
    except ProvisionError:
        pass


@FUZZ
@given(TEXT, st.sampled_from(["gpu01", "a"]))
@example("0", "gpu01")              # paramiko: "Unparsable line 0" was a ConfigParseError traceback
@example("Host gpu01\n  Port x\n", "gpu01")
def test_an_ssh_config_gives_config_errors_only(text, alias):
    from provision.control.transport.settings import SshConfig, resolve

    try:
        resolve(alias, config=SshConfig(text=text))
    except ConfigError:
        pass


# --------------------------------------------------------------------------- through the command

BAD_FILES = {
    "empty-mapping-key": "{{}}",
    "mapping-as-host-name": "hosts: {{a: 1}: {}}",
    "list-where-a-mapping-belongs": "hosts:\n  - gpu01\n  - gpu02\n",
    "binary-garbage": "\x00\x01\x02\xff\xfe garbage \x7f",
    "ten-megabyte-line": "hosts: {gpu01: {address: " + "a" * 10_000_000 + "}}\n",
}


def _provision(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_inventory_is_one_sentence_and_exit_2(tmp_path, name):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(BAD_FILES[name].encode("utf-8", "surrogateescape"))
    proc = _provision("status", "-i", str(path))
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and str(path) in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_playbook_is_one_sentence_and_exit_2(tmp_path, name):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(BAD_FILES[name].encode("utf-8", "surrogateescape"))
    proc = _provision("patch", "--check", "--playbook", str(path), "--host", "gpu01")
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and str(path) in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr[-2000:]


def test_a_bad_arg_is_one_sentence_and_exit_2(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"hosts": {"gpu01": {}}}))
    proc = _provision("launch", "-i", str(inv), "--arg", "=\x1f")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--arg" in proc.stderr, proc.stderr
