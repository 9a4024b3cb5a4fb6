"""Servers are per port (issue 38, item 1), on a sandbox host whose stand-in nvidia-smi reports 8
GPUs and, like the real one, the processes holding memory on each: every rank of a stand-in
server holds its GPU (base-gpu-id + rank, through CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run, run_json


@pytest.fixture(scope="module")
def ghost(sandbox_factory):
    host = sandbox_factory.host("ports8", sglang="0.5.9", layout="venv", gpu_capability="12.0")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def env(tmp_path):
    return {"PROVISION_JOURNAL": str(tmp_path / "journal.jsonl"), "PROVISION_LOCK": str(tmp_path / "lock")}


def inventory(tmp_path, ssh_env, host) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3", "tp-size": 4},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1", "PROVISION_STANDIN_WARMUP_SECONDS": "0.2"}},
           "hosts": {host.name: {"address": host.address, "port": host.port}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def pid_of(host, port: int) -> int:
    return json.loads(host.hostpath(f"/var/lib/provision/server/server-{port}.json").read_text())["pid"]


def test_two_servers_on_disjoint_gpus_live_side_by_side(tmp_path, ssh_env, ghost, env):
    """Server A (port 30000, GPUs 0-3) and server B (30001, base-gpu-id 4: GPUs 4-7) both launch,
    both show in `status`, a restart of each restarts only itself, and a third on A's GPUs is
    refused with a true sentence: the memory is provision's server's on port 30000. Before, B was
    refused: "GPU memory held by other processes" (the host's, not its GPUs)."""
    inv = inventory(tmp_path, ssh_env, ghost)
    try:
        run("patch", "-i", inv, env=env, check_rc=0)
        run("launch", "-i", inv, "--poll", "0.5", env=env, check_rc=0, timeout=240)
        b = run("launch", "-i", inv, "--server-port", "30001", "--arg", "base-gpu-id=4", "--poll", "0.5",
                env=env, timeout=240)
        assert b.returncode == 0 and "ready" in b.stdout, (b.stdout, b.stderr)

        clash = run("launch", "-i", inv, "--server-port", "30002", "--arg", "base-gpu-id=2", "--poll", "0.5",
                    env=env, timeout=240)
        assert clash.returncode != 0
        text = clash.stdout + clash.stderr
        assert "GPU memory on this server's GPUs 2-5 is held by other processes" in text, text
        assert "provision's server on port 30000" in text and "provision's server on port 30001" in text, text
        assert "nobody provision knows" not in text and "leftover" not in text

        proc, doc = run_json("status", "-i", inv, env=env)
        ports = sorted(s.get("port") for s in doc["hosts"][0]["data"].get("servers", []))
        assert ports == [30000, 30001], doc["hosts"][0]

        for port, other in ((30001, 30000), (30000, 30001)):
            before, other_pid = pid_of(ghost, port), pid_of(ghost, other)
            r = run("launch", "-i", inv, "--server-port", str(port), "--restart", "--poll", "0.5", env=env, timeout=240)
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert pid_of(ghost, port) != before and pid_of(ghost, other) == other_pid
    finally:
        for port in (30000, 30001):
            run("stop", "-i", inv, "--server-port", str(port), env=env)
