"""`provision upgrade` across three sandbox hosts over real sshd (issue 61): canary first, then batches.

Each host serves a patched SGLang 0.5.9 from /opt/venv; the wheelhouse holds the real 0.5.10 wheel
(every file as released, the stand-in behind launch_server). The stand-in's decode speed is set per
host and per installed release in the inventory, and the recorded launch carries it to the new
release's server.
"""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run, run_json
from tests.cli.test_server_lifecycle import env, http, record  # noqa: F401 - fixtures
from tests.cli.test_upgrade import UPGRADE, wheelhouse  # noqa: F401 - fixture

NEW = "/opt/sglang-0.5.10"


@pytest.fixture(scope="module")
def fleet(sandbox_factory):
    from provision.sandbox.hosts import HostSpec

    hosts = sandbox_factory.up(*[HostSpec(name=f"upf{i}", address="auto", sglang="0.5.9", layout="venv")
                                 for i in (1, 2, 3)])
    yield hosts
    sandbox_factory.remove(*hosts)


def _inventory(tmp_path, ssh_env, hosts, speeds: dict) -> str:
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "python": "/opt/venv/bin/python3",
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1", "PROVISION_STANDIN_WARMUP_SECONDS": "0.2"}},
           "hosts": {h.name: {"address": h.address, "port": h.port,
                              "env": {"PROVISION_STANDIN_DECODE_TOK_S": speeds[h.name]}} for h in hosts}}
    path = tmp_path / f"inv-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


# a 3-host fleet launched, upgraded twice (a canary rolled back, then every host moved, each with its
# installs, benches and restarts) and stopped: 200-240 s on CI's machine beside the two real-vLLM modules
# it starts with (tests/conftest.py FIRST_MODULES); it passed its default 180 s x pace there while working
@pytest.mark.timeout(480)
def test_the_canary_goes_alone_and_a_rollback_there_leaves_the_fleet_untouched_then_the_fleet_moves(
        tmp_path, ssh_env, fleet, wheelhouse, env):
    """--canary 1 --serial 2. First the canary's 0.5.10 is slower than the gate: it rolls back to
    0.5.9 (patched, healthy), the run stops (exit 9), and the batch after it is untouched (no
    install, same server). Then, the canary as fast on 0.5.10: every host ends serving 0.5.10 from
    its own venv beside the old one, the spec native there (no edit), the old venv kept."""
    from provision.host.engine.core import BEGIN_MARK

    c1, c2, c3 = fleet
    inv = _inventory(tmp_path, ssh_env, fleet, {"upf1": "0.5.9=96,0.5.10=40", "upf2": "96", "upf3": "96"})
    proc, doc = run_json("launch", "-i", inv, "--patch", "--poll", "0.5", env=env, timeout=300)
    assert proc.returncode == 0, doc
    pids = {h.name: record(h)["pid"] for h in fleet}
    try:
        proc = run("upgrade", "-i", inv, "--to", "0.5.10", "--wheelhouse", str(wheelhouse), "--canary", "1",
                   "--serial", "2", *UPGRADE, "--json", env=env, timeout=600)
        assert proc.stdout.strip(), proc.stderr[-3000:]
        rows = {r["host"]: r for r in json.loads(proc.stdout)["hosts"]}
        assert proc.returncode == 9, rows
        assert rows["upf1"]["verdict"] == "rolled-back", rows["upf1"]
        assert "rolled back: serving 0.5.9 again from /opt/venv" in rows["upf1"]["detail"]
        for h in (c2, c3):
            row = rows[h.name]
            assert row["verdict"] == "skipped" and "untouched" in row["detail"], row
            assert not h.hostpath(NEW).exists()  # nothing installed
            assert record(h)["pid"] == pids[h.name] and record(h)["version"] == "0.5.9"
        rec = record(c1)
        assert rec["version"] == "0.5.9" and rec["python"].startswith("/opt/venv/bin/python"), rec
        assert http(c1, "/health") == 200
        kimi = c1.hostpath("/opt/venv/lib/python3.11/site-packages/sglang/srt/models/kimi_k25.py")
        assert BEGIN_MARK in kimi.read_text()  # the old install is patched as it was

        # the canary restarted as fast on 0.5.10 (an explicit playbook: the inventory's env, not the record's)
        inv = _inventory(tmp_path, ssh_env, fleet, {"upf1": "0.5.9=96,0.5.10=100", "upf2": "96", "upf3": "96"})
        proc, doc = run_json("launch", "-i", inv, "--host", "upf1", "--restart", "--playbook", "kimi-k25-eagle3",
                             "--poll", "0.5", env=env, timeout=300)
        assert proc.returncode == 0, doc
        proc = run("upgrade", "-i", inv, "--to", "0.5.10", "--wheelhouse", str(wheelhouse), "--canary", "1",
                   "--serial", "2", *UPGRADE, "--json", env=env, timeout=600)
        assert proc.stdout.strip(), proc.stderr[-3000:]
        rows = {r["host"]: r for r in json.loads(proc.stdout)["hosts"]}
        assert proc.returncode == 0 and {r["verdict"] for r in rows.values()} == {"upgraded"}, rows
        for h in fleet:
            rec = record(h)
            assert rec["version"] == "0.5.10" and rec["python"] == f"{NEW}/bin/python", (h.name, rec)
            assert http(h, "/health") == 200
            kimi = h.hostpath(f"{NEW}/lib/python3.11/site-packages/sglang/srt/models/kimi_k25.py")
            assert BEGIN_MARK not in kimi.read_text()  # native in 0.5.10: nothing edited
            assert h.hostpath("/opt/venv/bin/python").exists()  # the way back kept
        hist = run("history", "--json", env=env, timeout=60)
        assert hist.stdout.count('"upgraded"') >= 3, hist.stdout[-2000:]
    finally:
        run_json("stop", "-i", inv, env=env, timeout=200)


def test_check_to_a_release_whose_parser_lacks_a_profile_flag_refuses_each_host_and_changes_nothing(
        tmp_path, tmp_path_factory, ssh_env, fleet, env):
    """The profile sets --cuda-graph-max-bs, which SGLang 0.5.23 split in two (its argparse refuses the
    old name as an ambiguous prefix of -decode and -prefill): staged (installed beside from
    the real 0.5.23 wheel) and judged in 0.5.23's own files, the host is refused with the flag named;
    --check then says the same; the servers go on on 0.5.9, untouched."""
    from provision.sandbox.upgrade_wheels import standin_wheel
    from provision.sandbox.wheels import WheelUnavailable

    hosts = fleet[1:2]  # one host: the refusal is per host (the fleet test shows the batches)
    house = tmp_path_factory.mktemp("wheelhouse-0.5.23")
    try:
        standin_wheel("0.5.23", house)
    except WheelUnavailable as exc:
        pytest.skip(str(exc))
    inv = json.loads(open(_inventory(tmp_path, ssh_env, hosts, {h.name: "96" for h in hosts})).read())
    inv["defaults"]["args"]["cuda-graph-max-bs"] = 16
    path = tmp_path / "inv-flag.yaml"
    path.write_text(json.dumps(inv))
    proc, doc = run_json("launch", "-i", str(path), "--patch", "--poll", "0.5", env=env, timeout=300)
    assert proc.returncode == 0, doc
    pids = {h.name: record(h)["pid"] for h in hosts}
    try:
        proc, doc = run_json("upgrade", "-i", str(path), "--to", "0.5.23", "--stage", "--wheelhouse", str(house),
                             "--no-deps", env=env, timeout=600)
        assert proc.returncode == 3, doc
        for row in doc["hosts"]:
            assert row["verdict"] == "refused", row
            assert "--cuda-graph-max-bs is ambiguous for SGLang 0.5.23: it could be --cuda-graph-max-bs-decode" in row["detail"], row
            assert "the server goes on on 0.5.9, nothing was stopped" in row["detail"], row
        proc, doc = run_json("upgrade", "-i", str(path), "--to", "0.5.23", "--check", env=env, timeout=300)
        assert proc.returncode == 3 and {r["verdict"] for r in doc["hosts"]} == {"refused"}, doc
        assert all("--cuda-graph-max-bs is ambiguous for SGLang 0.5.23: it could be --cuda-graph-max-bs-decode" in r["detail"] for r in doc["hosts"]), doc
        for h in hosts:
            rec = record(h)
            assert rec["pid"] == pids[h.name] and rec["version"] == "0.5.9", rec
            assert http(h, "/health") == 200
    finally:
        run_json("stop", "-i", str(path), env=env, timeout=200)
