"""SSH settings mean what OpenSSH means, over real sshd: ProxyCommand, a two-hop ProxyJump
whose gateways are each opened once and shared, and ConnectTimeout from the config.

The gateways are real sshd (tests/remote/gateways.py) that can resolve names the control
machine cannot, so a host named that way is reachable only through them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from tests.cli.helpers import PROVISION, run, run_json
from tests.remote.gateways import Gateway, can_run_gateways, host_key_line

pytestmark = pytest.mark.ssh


def _unresolvable(name: str) -> bool:
    try:
        socket.getaddrinfo(name, 22)
    except socket.gaierror:
        return True
    return False


@pytest.fixture(scope="module")
def behind(sandbox_factory, tmp_path_factory):
    """Two sandbox hosts and two gateways; an ssh config that reaches the hosts only through them."""
    why = can_run_gateways()
    if why:
        pytest.skip(why)
    a, b = sandbox_factory.host(), sandbox_factory.host()
    root = tmp_path_factory.mktemp("gateways")
    pub = sandbox_factory.key_path.with_name(sandbox_factory.key_path.name + ".pub")
    g2 = Gateway(root, "g2", pub, permit=[f"deep-a-internal:{a.port}", f"deep-b-internal:{b.port}"],
                 hosts={"deep-a-internal": a.address, "deep-b-internal": b.address})
    g1 = Gateway(root, "g1", pub, permit=[f"only-on-g1:{a.port}", f"g2-internal:{g2.port}"],
                 hosts={"only-on-g1": a.address, "g2-internal": "127.0.0.1"})
    kh = root / "known_hosts"
    kh.write_text("\n".join([g1.known_hosts_line(), g2.known_hosts_line("g2-internal"),
                             host_key_line(a, "only-on-g1"), host_key_line(a, "deep-a-internal"),
                             host_key_line(b, "deep-b-internal")]) + "\n")
    cfg = root / "ssh_config"
    cfg.write_text(f"""
Host jump1
  HostName 127.0.0.1
  Port {g1.port}
Host pc-a
  HostName only-on-g1
  Port {a.port}
  ProxyCommand /usr/bin/ssh -F {cfg} -W %h:%p jump1
Host pc-shell
  HostName only-on-g1
  Port {a.port}
  ProxyCommand /usr/bin/ssh -F "$PROVISION_TEST_JUMP_CONFIG" -o 'ConnectTimeout 10' -W %h:%p jump1 2>/dev/null | /bin/cat
Host pc-* -*
  HostName only-on-g1
  Port {a.port}
  ProxyCommand /usr/bin/ssh -F {cfg} -o SetEnv=PROVISION_TEST_R=%r -o SetEnv=PROVISION_TEST_N=%n -W %h:%p jump1
Host deep-a
  HostName deep-a-internal
  Port {a.port}
  ProxyJump jump1,root@g2-internal:{g2.port}
Host deep-b
  HostName deep-b-internal
  Port {b.port}
  ProxyJump jump1,root@g2-internal:{g2.port}
Host *
  User root
  IdentityFile {sandbox_factory.key_path}
  IdentitiesOnly yes
  UserKnownHostsFile {kh}
  StrictHostKeyChecking yes
  BatchMode yes
""")
    yield {"a": a, "b": b, "g1": g1, "g2": g2, "cfg": cfg}
    g1.stop()
    g2.stop()


def _no_openssh_env(tmp_path) -> dict:
    """PATH without an ssh client: provision falls back to paramiko's SSHConfig."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    link = bindir / "provision"
    if not link.exists():
        link.symlink_to(PROVISION)
    return {"PATH": str(bindir)}


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
def test_host_reached_only_through_proxycommand(behind, tmp_path, reader):
    assert _unresolvable("only-on-g1")  # the control machine cannot reach it by itself
    env = _no_openssh_env(tmp_path) if reader == "paramiko" else None
    proc, doc = run_json("status", "--ssh-config", behind["cfg"], "--host", "pc-a", env=env, timeout=120)
    host = doc["hosts"][0]
    assert host["verdict"] in ("missing", "patched"), host
    assert host["version"] == "0.5.9"
    assert proc.returncode in (0, 4)


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
def test_proxycommand_runs_in_the_users_shell_as_openssh_runs_it(behind, tmp_path, reader):
    """A ProxyCommand with a $VAR, quoting, a redirection and a pipe: OpenSSH runs it as
    `$SHELL -c 'exec COMMAND'`; provision reaches the host through it as `ssh` does."""
    env = {"PROVISION_TEST_JUMP_CONFIG": str(behind["cfg"])}
    ssh = subprocess.run(["ssh", "-F", str(behind["cfg"]), "-o", "BatchMode=yes", "pc-shell", "true"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **env},
                         stdin=subprocess.DEVNULL)
    assert ssh.returncode == 0, ssh.stderr  # the same line works for OpenSSH's own client
    if reader == "paramiko":
        env.update(_no_openssh_env(tmp_path))
    proc, doc = run_json("status", "--ssh-config", behind["cfg"], "--host", "pc-shell", env=env, timeout=120)
    host = doc["hosts"][0]
    assert host["verdict"] in ("missing", "patched"), host
    assert host["version"] == "0.5.9" and proc.returncode in (0, 4)


def test_two_hop_proxyjump_opens_each_gateway_once_and_shares_it(behind):
    assert _unresolvable("g2-internal") and _unresolvable("deep-a-internal")
    g1, g2 = behind["g1"], behind["g2"]
    before = (g1.accepted(), g2.accepted())
    proc, doc = run_json("status", "--ssh-config", behind["cfg"], "--host", "deep-a", "--host", "deep-b",
                         timeout=120)
    verdicts = {h["host"]: h["verdict"] for h in doc["hosts"]}
    assert set(verdicts.values()) <= {"missing", "patched"}, doc["hosts"]
    assert proc.returncode in (0, 4)
    # g1 carried the tunnel to g2; g2 carried both hosts: one connection each for the whole run. Under
    # CI load a connection through g2 has dropped under status's read-only step, which is then asked
    # once more on a fresh connection (Transport.call_read): g2 once more, through the same g1 tunnel.
    g1_new, g2_new = g1.accepted() - before[0], g2.accepted() - before[1]
    assert g1_new == 1 and g2_new in (1, 2), (g1_new, g2_new)


def test_connect_timeout_from_the_ssh_config_is_used(sandbox_factory, tmp_path):
    """ConnectTimeout 2 in the config, packets dropped: the host fails after 2 s, not the old fixed 10."""
    from tests.remote.test_faults import _iptables_ok, silent_drop

    if not _iptables_ok():
        pytest.skip("needs a working iptables (apt-get install -y iptables)")
    host = sandbox_factory.host()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host slow\n  HostName {host.address}\n  Port {host.port}\n  User root\n"
                   f"  IdentityFile {sandbox_factory.key_path}\n  UserKnownHostsFile {sandbox_factory.known_hosts_path}\n"
                   "  ConnectTimeout 2\n")
    with silent_drop(host):
        t0 = time.monotonic()
        proc, doc = run_json("status", "--ssh-config", cfg, "--host", "slow", timeout=120)
        took = time.monotonic() - t0
    rec = doc["hosts"][0]
    assert proc.returncode == 3 and rec["verdict"] == "unreachable", rec
    assert "within 2 s (ConnectTimeout)" in rec["detail"], rec["detail"]
    assert took < 30, f"took {took:.1f} s"  # generous: the precise number is in benchmarks/
    # a flag still wins over the config
    with silent_drop(host):
        proc, doc = run_json("status", "--ssh-config", cfg, "--host", "slow", "--connect-timeout", "1", timeout=120)
    assert "within 1 s" in doc["hosts"][0]["detail"]
    sandbox_factory.remove(host)


INJECTIONS = [("user", "ops$(touch${IFS}MARK)"), ("user", "ops`touch${IFS}MARK`"), ("user", "ops;touch${IFS}MARK"),
              ("user", "-oProxyCommand=touch${IFS}MARK"), ("name", "pc-$(touch${IFS}MARK)"),
              ("name", "pc-`touch${IFS}MARK`"), ("name", "pc-x;touch${IFS}MARK"), ("name", "-pc")]


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
@pytest.mark.parametrize("field,value", INJECTIONS, ids=[f"{f}:{v.split('MARK')[0]}" for f, v in INJECTIONS])
def test_inventory_names_that_would_run_a_command_are_refused_before_the_proxycommand(behind, tmp_path, reader,
                                                                                      field, value):
    """The usual bastion set-up (`ProxyCommand ssh ... %r ... %n -W %h:%p jump1`): an inventory
    user or host name carrying $(...), backticks, `;` or a leading `-` is refused (exit 2, one
    sentence naming the host) before any connection, and the ProxyCommand never runs; issue 29."""
    marker = tmp_path / "pwned"
    value = value.replace("MARK", str(marker))
    name, user = (value, "root") if field == "name" else ("pc-gpu01", value)
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"hosts": {name: {"user": user}}}))
    env = _no_openssh_env(tmp_path) if reader == "paramiko" else {}
    proc = run("status", "--ssh-config", behind["cfg"], "-i", inv, env=env, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "refused before any connection" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists(), "the inventory value ran a command on the control machine"


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko"])
def test_ordinary_names_still_connect_through_the_bastion(behind, tmp_path, reader):
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"hosts": {"pc-gpu01.example": {"user": "root"}, "pc-ops-1": {}}}))
    env = _no_openssh_env(tmp_path) if reader == "paramiko" else {}
    proc, doc = run_json("status", "--ssh-config", behind["cfg"], "-i", inv, env=env, timeout=120)
    assert proc.returncode in (0, 4), (proc.stdout, proc.stderr)
    assert {h["verdict"] for h in doc["hosts"]} <= {"missing", "patched"}, doc["hosts"]
