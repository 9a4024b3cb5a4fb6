"""`provision upgrade --image` of a server in a container (issue 62), over real sshd and real podman on a
sandbox host running the SGLang images (0.5.9 and 0.5.10, laid out as lmsysorg/sglang's).

0.5.9's Kimi-K2.5 class lacks the EAGLE-3 methods (the overlay carries them); 0.5.10's has them. The
stand-in's decode speed is set per release in the playbook's environment (the recorded launch
carries it to the new container).
"""

from __future__ import annotations

import json

from tests.cli.helpers import run, run_json
from tests.containers.test_container_launch import containers, http_status, inventory, playbook

UPGRADE = ("--poll", "0.5", "--bench-requests", "2", "--bench-tokens", "64", "--deadline", "120",
           "--min-speedup", "0.7")  # a loaded machine measures 96 tok/s lower; the slow tag is 0.42x


def _inventory(tmp_path, ssh_env, host, pb: str) -> str:
    """The host's inventory with its profile the playbook (as a fleet names its profile: a restart
    without --playbook finds the spec the container's overlay is made from)."""
    doc = json.loads(open(inventory(tmp_path, ssh_env, host)).read())
    doc["hosts"][host.name]["profile"] = pb
    path = tmp_path / f"inv-{len(list(tmp_path.glob('inv-*')))}.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def _record(host) -> dict:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())


def test_a_container_moves_to_the_new_tag_or_back_to_the_old_one_by_the_gate(tmp_path, ssh_env, podman_host,
                                                                              sglang_images):
    host = podman_host
    old, new = sglang_images["0.5.9"], sglang_images["0.5.10"]
    slow = playbook(tmp_path, old, env={"PROVISION_STANDIN_DECODE_TOK_S": "0.5.9=96,0.5.10=40"})
    inv = _inventory(tmp_path, ssh_env, host, slow)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", timeout=300)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stderr[-3000:]
    try:
        rec = _record(host)  # 0.5.9's class lacks the methods: the overlay carries them
        assert rec["container"]["image"] == old and rec["container"]["fix"]["kind"] == "missing" and rec["overlay"]

        # a restart replays it on its overlay (the new launch's own check was a host's, and refused it)
        proc, doc = run_json("launch", "-i", inv, "--restart", "--poll", "0.5", timeout=300)
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stderr[-3000:]
        assert _record(host)["overlay"]
        # --check: judged in the new image (here already on the host), nothing changed
        proc, doc = run_json("upgrade", "-i", inv, "--image", new, "--check", timeout=300)
        row = doc["hosts"][0]
        assert proc.returncode == 4, doc
        assert f"sglang 0.5.9 (image {old}) -> 0.5.10 (image {new}): would restart port 30000 on image {new}" \
            in row["detail"], row
        assert "no overlay needed" in row["detail"], row  # 0.5.10 has the methods itself
        assert _record(host)["container"]["image"] == old

        # slower on 0.5.10: back on the old tag, with its overlay, healthy; exit 9
        proc = run("upgrade", "-i", inv, "--image", new, *UPGRADE, "--json", timeout=600)
        assert proc.stdout.strip(), proc.stderr[-3000:]
        row = json.loads(proc.stdout)["hosts"][0]
        assert proc.returncode == 9 and row["verdict"] == "rolled-back", row["detail"]
        assert f"rolled back: serving 0.5.9 again on image {old}" in row["detail"], row
        rec = _record(host)
        assert rec["container"]["image"] == old and rec["overlay"], rec  # back with its overlay
        assert containers(ssh_env, host) == ["sglang-30000 running"] and http_status(host, "/health") == 200

        # as fast on 0.5.10: kept; the old tag still on the host (the way back, nothing removed)
        (tmp_path / "fast").mkdir()
        fast = playbook(tmp_path / "fast", old, env={"PROVISION_STANDIN_DECODE_TOK_S": "0.5.9=96,0.5.10=100"})
        inv = _inventory(tmp_path, ssh_env, host, fast)
        proc, doc = run_json("launch", "-i", inv, "--playbook", fast, "--restart", "--poll", "0.5", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        proc = run("upgrade", "-i", inv, "--image", new, *UPGRADE, "--json", timeout=600)
        row = json.loads(proc.stdout)["hosts"][0]
        assert proc.returncode == 0 and row["verdict"] == "upgraded", (row, proc.stderr[-3000:])
        assert f"serving 0.5.10 on image {new}" in row["detail"], row
        assert set(row["data"]["seconds"]) >= {"pull_and_checks", "bench_before", "restart_to_ready", "bench_after"}
        print(f"\nupgrade --image, seconds: {row['data']['seconds']}")
        rec = _record(host)
        assert rec["container"]["image"] == new and rec["version"] == "0.5.10", rec
        assert rec["container"]["fix"]["kind"] == "native" and not rec["overlay"], rec  # none needed
        assert ssh_env.ssh(host, f"podman image exists {old} && echo kept").stdout.strip() == "kept"
        proc, doc = run_json("upgrade", "-i", inv, "--image", new, *UPGRADE, timeout=120)
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged", doc
    finally:
        run("stop", "-i", inv, timeout=120)
