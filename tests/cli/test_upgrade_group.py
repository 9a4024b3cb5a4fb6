"""`provision upgrade` of a multi-node server (issue 62): one SGLang server at tp 16 over two sandbox
hosts of 8 stand-in GPUs each, over real sshd, moved from 0.5.9 (/opt/venv) to the real 0.5.10 wheel
as one unit: every node prepared before any rank stops, both ranks restarted together, the gate
measured on rank 0.
"""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run, run_json
from tests.cli.test_server_lifecycle import env, http, record  # noqa: F401 - fixtures
from tests.cli.test_upgrade import UPGRADE, wheelhouse  # noqa: F401 - fixture

pytestmark = pytest.mark.ssh
NEW = "/opt/sglang-0.5.10"


@pytest.fixture(scope="module")
def gpair(sandbox_factory):
    from provision.sandbox.hosts import HostSpec

    hosts = sandbox_factory.up(*[HostSpec(name=f"ug{i}", address="auto", sglang="0.5.9", layout="venv",
                                          gpu_capability="10.0") for i in range(2)])
    yield hosts
    sandbox_factory.remove(*hosts)


def _inventory(tmp_path, ssh_env, hosts) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "python": "/opt/venv/bin/python3",
                        "args": {"model-path": "/data/models/Kimi-K2.5", "tp-size": 16,
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1", "PROVISION_STANDIN_WARMUP_SECONDS": "0.2",
                                "PROVISION_STANDIN_DECODE_TOK_S": "0.5.9=96,0.5.10=40"}},
           "hosts": {h.name: {"address": h.address, "port": h.port, "server": "kimi16", "node_rank": i}
                     for i, h in enumerate(hosts)}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def test_a_two_node_group_moves_as_one_and_a_node_that_cannot_prepare_stops_nothing(
        tmp_path, ssh_env, gpair, wheelhouse, env):
    """First the second node cannot prepare (its /opt writable by others: root makes no venv there):
    both ranks are refused, neither server restarted. Then both nodes install 0.5.10 beside and the
    group restarts on it together; rank 0 measures it at 0.42x of before, below the gate: both ranks
    are restarted back on 0.5.9 (exit 9). With the gate at 0.3x, the group is kept on 0.5.10: both
    records on the new venv, rank 0 answering."""
    g0, g1 = gpair
    inv = _inventory(tmp_path, ssh_env, gpair)
    proc, doc = run_json("launch", "-i", inv, "--patch", "--poll", "0.5", "--deadline", "120", env=env, timeout=400)
    assert proc.returncode == 0, doc
    pids = {h.name: record(h)["pid"] for h in gpair}
    try:
        g1.run("chmod 0777 /opt")
        try:
            proc = run("upgrade", "-i", inv, "--to", "0.5.10", "--wheelhouse", str(wheelhouse), *UPGRADE, "--json",
                       env=env, timeout=600)
        finally:
            g1.run("chmod 0755 /opt")
        assert proc.stdout.strip(), proc.stderr[-3000:]
        rows = {r["host"]: r for r in json.loads(proc.stdout)["hosts"]}
        print(f"\nnode 2 cannot prepare: {json.dumps({h: r['detail'] for h, r in rows.items()}, indent=1)}")
        assert proc.returncode != 0 and rows["ug1"]["verdict"] == "failed", rows
        assert "writable by other accounts" in rows["ug1"]["detail"], rows["ug1"]
        assert rows["ug0"]["verdict"] == "refused", rows["ug0"]
        assert "rank 1 of server kimi16 (ug1) ended failed" in rows["ug0"]["detail"], rows["ug0"]
        assert "no rank was stopped" in rows["ug0"]["detail"], rows["ug0"]
        for h in gpair:
            assert record(h)["pid"] == pids[h.name] and record(h)["version"] == "0.5.9", h.name
        assert http(g0, "/health") == 200

        proc = run("upgrade", "-i", inv, "--to", "0.5.10", "--wheelhouse", str(wheelhouse), *UPGRADE, "--json",
                   env=env, timeout=600)
        assert proc.stdout.strip(), proc.stderr[-3000:]
        rows = {r["host"]: r for r in json.loads(proc.stdout)["hosts"]}
        print(f"below the gate: {json.dumps({h: r['detail'] for h, r in rows.items()}, indent=1)}")
        assert proc.returncode == 9 and {r["verdict"] for r in rows.values()} == {"rolled-back"}, rows
        assert "below the gate" in rows["ug1"]["detail"] and "serving 0.5.9 again from /opt/venv" in rows["ug1"]["detail"]
        back = {h.name: record(h) for h in gpair}
        assert all(r["version"] == "0.5.9" and r["pid"] != pids[n] for n, r in back.items()), back  # both restarted back
        assert http(g0, "/health") == 200

        proc = run("upgrade", "-i", inv, "--to", "0.5.10", "--wheelhouse", str(wheelhouse), *UPGRADE,
                   "--min-speedup", "0.3", "--json", env=env, timeout=600)
        assert proc.stdout.strip(), proc.stderr[-3000:]
        rows = {r["host"]: r for r in json.loads(proc.stdout)["hosts"]}
        print(f"the group moves: {json.dumps({h: r['detail'] for h, r in rows.items()}, indent=1)}")
        assert proc.returncode == 0 and {r["verdict"] for r in rows.values()} == {"upgraded"}, rows
        assert rows["ug0"]["data"]["after"]["tok_s"] > 0 and rows["ug1"]["data"].get("after") is None, rows
        assert "gated on rank 0, ug0" in rows["ug1"]["detail"], rows["ug1"]
        for h in gpair:
            rec = record(h)
            assert rec["version"] == "0.5.10" and rec["python"] == f"{NEW}/bin/python", (h.name, rec)
            assert rec["pid"] != pids[h.name]
            assert "--nnodes" in rec["argv"] and h.hostpath("/opt/venv/bin/python").exists()
        assert http(g0, "/health") == 200
    finally:
        run_json("stop", "-i", inv, env=env, timeout=200)
