"""Host names, aliases and users are checked before they are used (issue 29, item 1): the pure rule,
and the connection settings that refuse a bad one before `ssh -G` or a ProxyCommand runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provision.config.names import SHELL_METACHARACTERS, problem
from provision.control.transport.settings import SshConfig, expand_tokens, resolve
from provision.errors import ConfigError

BAD = ["ops$(touch${IFS}/tmp/pwned)", "a`id`b", "a;id", "-oProxyCommand=id", "a b", "a\tb", "a\nb", "a|b",
       "a&b", "a>b", "'a'", '"a"', "a\\b", "", "a\x00b", "a\x7fb"]
GOOD = ["ops-1", "gpu01.example", "user_2", "root", "10.1.230.174", "fe80::1%eth0", "gpu01.example.com",
        "ubuntu", "a+b", "a@b", "x=1"]


@pytest.mark.parametrize("value", BAD)
def test_bad_names_are_refused_with_the_reason(value):
    assert problem(value) is not None


@pytest.mark.parametrize("value", GOOD)
def test_ordinary_names_pass(value):
    assert problem(value) is None


@given(st.text(max_size=30))
def test_a_name_that_passes_has_no_shell_metacharacter_space_or_control_and_no_leading_dash(value):
    if problem(value) is None:
        assert value and not value.startswith("-")
        assert not any(c in SHELL_METACHARACTERS or c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value)


def _config(text=""):
    return SshConfig(text=text)


@pytest.mark.parametrize("field", ["user", "name", "address"])
@pytest.mark.parametrize("value", ["ops$(touch${IFS}/tmp/pwned)", "a`id`", "a;id", "-oX=1"])
def test_resolve_refuses_an_inventory_value_before_anything_runs(field, value, tmp_path):
    cfg = _config(f"Host *\n  ProxyCommand touch {tmp_path}/ran-%r-%h\n")
    kw = {"user": value} if field == "user" else {"hostname": value} if field == "address" else {}
    alias = value if field == "name" else "gpu01"
    with pytest.raises(ConfigError, match="refused before any connection"):
        resolve(alias, config=cfg, **kw)
    assert not list(tmp_path.iterdir())


def test_a_user_from_the_ssh_config_is_held_to_the_rule_too():
    cfg = _config("Host gpu01\n  User ops;id\n")
    with pytest.raises(ConfigError, match="user 'ops;id'"):
        resolve("gpu01", config=cfg)


def test_proxy_command_tokens_are_quoted_for_the_shell():
    line = expand_tokens("ssh -W %h:%p %r@bastion # %n %%", hostname="gpu01.example", port=22, user="ops-1",
                         alias="gpu01")
    assert line == "ssh -W gpu01.example:22 ops-1@bastion # gpu01 %"  # checked names come out as they went in
    odd = expand_tokens("echo %r", hostname="h", port=22, user="a$(id)b", alias="h")
    assert odd == "echo 'a$(id)b'"


def test_ordinary_names_resolve_with_a_proxy_command():
    cfg = _config("Host *\n  User user_2\n  ProxyCommand ssh -W %h:%p %r@bastion\n")
    t = resolve("gpu01", config=cfg, hostname="gpu01.example")
    assert t.proxy_command == "ssh -W gpu01.example:22 user_2@bastion"
