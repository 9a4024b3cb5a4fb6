"""Multi-node servers whose rank 0 does not come up, and the default --dist-init-addr, over real
sshd hosts (the stand-in server replaces the GPU).

A user checks: each rank's row, the exit code, and that no rank of the group is left running
(holding its GPUs) when rank 0 failed; and which address the other ranks were told to meet at.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli.helpers import run, run_json

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def pair(sandbox_factory):
    hosts = [sandbox_factory.host(f"mn{i}", sglang="0.5.9", layout="source") for i in range(2)]
    yield hosts
    sandbox_factory.remove(*hosts)


@pytest.fixture
def hosts(pair):
    for h in pair:
        h.reset()
    return pair


def inventory(tmp_path, ssh_env, hosts, extra, addresses=True) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "2"}},
           "hosts": {h.name: {**({"address": h.address, "port": h.port} if addresses else {}), **extra.get(h.name, {})}
                     for h in hosts}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def server_running(host) -> bool:
    return "launch_server" in host.run("ps -eo args=").stdout


def test_an_unreachable_rank0_stops_the_other_ranks_at_once(tmp_path, ssh_env, hosts):
    """Rank 0's sshd refuses (a port nobody listens on): rank 1 must not be left loading and holding
    its GPUs until --deadline; its row says rank 0 failed and why."""
    a, b = hosts
    ok = inventory(tmp_path, ssh_env, hosts, {b.name: {"server": "kimi2", "node_rank": 1}})
    run("patch", "-i", ok, "--host", b.name, check_rc=0)
    inv = inventory(tmp_path, ssh_env, hosts, {a.name: {"server": "kimi2", "node_rank": 0, "port": 1},
                                               b.name: {"server": "kimi2", "node_rank": 1}})
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=400)
    by = {h["host"]: h for h in doc["hosts"]}
    assert proc.returncode == 3, doc
    assert by[a.name]["verdict"] == "unreachable", by[a.name]
    assert by[b.name]["verdict"] == "failed", by[b.name]
    detail = by[b.name]["detail"]
    assert f"rank 0 of server kimi2 ({a.name}) unreachable" in detail, detail
    assert "connection refused" in detail or "cannot connect" in detail, detail
    assert not server_running(b), "rank 1 was left running without its rank 0"
    assert not b.hostpath("/var/lib/provision/server/server-30000.pid").exists() or \
        "stopped" in detail or "not started" in detail


def test_rank0_refused_by_its_preflight_leaves_no_rank_running(tmp_path, ssh_env, hosts):
    """Rank 0 reached but refused by its preflight (its port is taken): rank 1 is not started, or
    stopped if it already was, and its row says why."""
    a, b = hosts
    inv = inventory(tmp_path, ssh_env, hosts, {a.name: {"server": "kimi2", "node_rank": 0},
                                               b.name: {"server": "kimi2", "node_rank": 1}})
    run("patch", "-i", inv, check_rc=0)
    squat = ("import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); "
             "s.bind(('0.0.0.0',30000)); s.listen(); print('listening', flush=True); time.sleep(600)")
    blocker = subprocess.Popen(a.nsenter_argv() + ["python3", "-c", squat], stdout=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    assert blocker.stdout is not None and blocker.stdout.readline().strip() == "listening"
    try:
        proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=400)
    finally:
        blocker.kill()
        blocker.wait()
    by = {h["host"]: h for h in doc["hosts"]}
    assert proc.returncode == 3, doc
    assert by[a.name]["verdict"] in ("refused", "failed"), by[a.name]
    assert by[b.name]["verdict"] == "failed" and f"rank 0 of server kimi2 ({a.name})" in by[b.name]["detail"]
    assert not server_running(b)


def test_the_default_dist_init_addr_is_rank0s_resolved_address(tmp_path, ssh_env, hosts):
    """Hosts named in the inventory by their ssh alias only: the peers are told rank 0's HostName
    (what `ssh -G` says), not the alias, and the rows say where the address came from."""
    a, b = hosts
    inv = inventory(tmp_path, ssh_env, hosts, {a.name: {"server": "kimi2", "node_rank": 0},
                                               b.name: {"server": "kimi2", "node_rank": 1}}, addresses=False)
    run("patch", "-i", inv, "--ssh-config", ssh_env.ssh_config, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--ssh-config", ssh_env.ssh_config, "--poll", "0.5", timeout=300)
    assert proc.returncode == 0, doc
    argv_b = b.run("cat /proc/$(cat /var/lib/provision/server/server-30000.pid)/cmdline | tr '\\0' ' '").stdout
    assert f"--dist-init-addr {a.address}:50000" in argv_b, argv_b
    by = {h["host"]: h for h in doc["hosts"]}
    for h in hosts:
        assert any(f"dist-init-addr {a.address}:50000" in n and "HostName in the ssh config" in n
                   for n in by[h.name]["notes"]), by[h.name]["notes"]
    run("stop", "-i", inv, "--ssh-config", ssh_env.ssh_config, check_rc=0)
