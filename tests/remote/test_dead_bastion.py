"""A dead bastion fails its own hosts, once, and holds up nobody else (real sshd gateways).

The bastion's packets are dropped (iptables DROP on its loopback address and port): a
silent partition, the slow kind. Three hosts sit behind it, one behind another gateway.
The bastion is dialled once for the run: its three hosts each fail with its error, and the
host behind the other gateway is reached.
"""

from __future__ import annotations

import contextlib
import subprocess

import pytest

from tests.cli.helpers import run_json
from tests.remote.gateways import Gateway, can_run_gateways, host_key_line
from tests.remote.test_faults import IPTABLES, _iptables_ok

pytestmark = pytest.mark.ssh


@contextlib.contextmanager
def dropped(address: str, port: int):
    """Every packet to and from address:port dropped; yields a function counting the SYNs that
    were sent to it (each dial of the bastion sends one, plus its retransmissions)."""
    syn = ["INPUT", "-p", "tcp", "-d", address, "--dport", str(port), "--tcp-flags", "SYN,ACK", "SYN", "-j", "DROP"]
    rules = [syn,
             ["INPUT", "-p", "tcp", "-d", address, "--dport", str(port), "-j", "DROP"],
             ["INPUT", "-p", "tcp", "-s", address, "--sport", str(port), "-j", "DROP"]]
    added = []

    def syns() -> int:
        out = subprocess.run([IPTABLES, "-w", "-L", "INPUT", "-v", "-x", "-n"], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            if f"dpt:{port}" in line and "flags:0x12/0x02" in line:
                return int(line.split()[0])
        raise AssertionError(f"the SYN rule for port {port} is gone:\n{out}")

    try:
        for rule in reversed(rules):  # the SYN-counting rule ends up first
            subprocess.run([IPTABLES, "-w", "-I", *rule], check=True, capture_output=True)
            added.append(rule)
        yield syns
    finally:
        for rule in added:
            subprocess.run([IPTABLES, "-w", "-D", *rule], capture_output=True)


@pytest.fixture(scope="module")
def bastions(sandbox_factory, tmp_path_factory):
    why = can_run_gateways()
    if why:
        pytest.skip(why)
    if not _iptables_ok():
        pytest.skip("needs a working iptables (apt-get install -y iptables)")
    a = sandbox_factory.host()
    root = tmp_path_factory.mktemp("bastions")
    pub = sandbox_factory.key_path.with_name(sandbox_factory.key_path.name + ".pub")
    permit = [f"{a.address}:{a.port}"]
    dead = Gateway(root, "dead", pub, permit=permit, hosts={})
    live = Gateway(root, "live", pub, permit=permit, hosts={})
    kh = root / "known_hosts"
    kh.write_text("\n".join([dead.known_hosts_line(), live.known_hosts_line(), host_key_line(a, a.address)]) + "\n")
    cfg = root / "ssh_config"
    behind_dead = "".join(f"Host dead-{i}\n  HostName {a.address}\n  Port {a.port}\n  ProxyJump bastion-dead\n"
                          for i in (1, 2, 3))
    cfg.write_text(f"""
Host bastion-dead
  HostName 127.0.0.1
  Port {dead.port}
Host bastion-live
  HostName 127.0.0.1
  Port {live.port}
{behind_dead}
Host fine
  HostName {a.address}
  Port {a.port}
  ProxyJump bastion-live
Host *
  User root
  IdentityFile {sandbox_factory.key_path}
  IdentitiesOnly yes
  UserKnownHostsFile {kh}
  StrictHostKeyChecking yes
""")
    yield {"a": a, "dead": dead, "live": live, "cfg": cfg}
    dead.stop()
    live.stop()
    sandbox_factory.remove(a)


def test_a_dead_bastion_is_dialled_once_and_fails_only_its_own_hosts(bastions):
    dead, live = bastions["dead"], bastions["live"]
    before_live = live.accepted()
    with dropped("127.0.0.1", dead.port) as syns:
        proc, doc = run_json("status", "--ssh-config", bastions["cfg"], "--host", "dead-1", "--host", "dead-2",
                             "--host", "dead-3", "--host", "fine", "--connect-timeout", "2", "--forks", "4",
                             timeout=180)
        sent = syns()
    rows = {h["host"]: h for h in doc["hosts"]}
    assert proc.returncode == 3, doc
    # the bastion was dialled once (the kernel counts one SYN and its retransmissions within the 2 s,
    # not three dials' worth)
    assert 1 <= sent <= 3, f"{sent} SYNs reached the dead bastion: {[h['detail'] for h in doc['hosts']]}"
    # the host behind the other gateway was reached, through one connection to that gateway
    assert rows["fine"]["verdict"] in ("missing", "patched"), rows["fine"]
    assert live.accepted() - before_live == 1
    # each of the dead bastion's hosts fails with the bastion's own error ...
    for name in ("dead-1", "dead-2", "dead-3"):
        assert rows[name]["verdict"] == "unreachable", rows[name]
        detail = rows[name]["detail"]
        assert detail.startswith(f"{name}: gateway bastion-dead failed"), detail
        assert f"bastion-dead: no answer from 127.0.0.1:{dead.port} within 2 s (ConnectTimeout)" in detail, detail
    # ... from one dial: the first host's, the others told it is not dialled again
    again = [n for n in ("dead-1", "dead-2", "dead-3") if "not dialled again" in rows[n]["detail"]]
    assert len(again) == 2, [rows[n]["detail"] for n in rows]
