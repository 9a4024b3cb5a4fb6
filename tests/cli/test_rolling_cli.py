"""Rolling launches (--serial, --max-fail) and multi-node servers, over real sshd hosts."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run, run_json


@pytest.fixture(scope="module")
def four(sandbox_factory):
    hosts = [sandbox_factory.host(f"roll{i}", sglang="0.5.9", layout="source") for i in range(4)]
    yield hosts
    sandbox_factory.remove(*hosts)


@pytest.fixture
def hosts(four):
    for h in four:
        h.reset()
    return four


def write_inventory(tmp_path, ssh_env, hosts, extra=None, load="2"):
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": load}},
           "hosts": {h.name: {"address": h.address, "port": h.port, **((extra or {}).get(h.name, {}))}
                     for h in hosts}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def started_at(host) -> float:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())["started_at"]


def test_serial_two_never_starts_more_than_two_at_once(tmp_path, ssh_env, hosts):
    inv = write_inventory(tmp_path, ssh_env, hosts, load="3")
    run("patch", "-i", inv, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--serial", "2", "--poll", "0.5", timeout=300)
    assert proc.returncode == 0, doc
    assert doc["batches"] == [[hosts[0].name, hosts[1].name], [hosts[2].name, hosts[3].name]]
    assert [h["verdict"] for h in doc["hosts"]] == ["ready"] * 4
    first = [started_at(h) for h in hosts[:2]]
    second = [started_at(h) for h in hosts[2:]]
    # the second batch starts only after the first is healthy (its load alone takes 3 s)
    assert min(second) >= max(first) + 3
    run("stop", "-i", inv, check_rc=0)


def test_max_fail_zero_stops_the_roll_and_reports_the_rest_skipped(tmp_path, ssh_env, hosts):
    inv = write_inventory(tmp_path, ssh_env, hosts)
    run("patch", "-i", inv, "--limit", ",".join(h.name for h in hosts[1:]), check_rc=0)  # roll0 stays unpatched
    proc, doc = run_json("launch", "-i", inv, "--serial", "1", "--max-fail", "0", "--poll", "0.5", timeout=300)
    assert proc.returncode == 3
    verdicts = [h["verdict"] for h in doc["hosts"]]
    assert verdicts == ["refused", "skipped", "skipped", "skipped"]
    assert "--max-fail 0" in doc["hosts"][1]["detail"]
    for h in hosts[1:]:
        assert not h.hostpath("/var/lib/provision/server/server-30000.json").exists(), "skipped hosts start nothing"
    # piped (no table): each skipped host on its own line, not only "3 skipped" (issue 63)
    proc = run("launch", "-i", inv, "--serial", "1", "--max-fail", "0", "--poll", "0.5", timeout=300)
    for h in hosts[1:]:
        assert f"{h.name}  skipped  - not run: the roll stopped after 1 failed host(s) (--max-fail 0)" in proc.stdout, \
            proc.stdout


def test_multinode_server_starts_every_rank_and_judges_rank0(tmp_path, ssh_env, hosts):
    a, b = hosts[0], hosts[1]
    extra = {a.name: {"server": "kimi2", "node_rank": 0}, b.name: {"server": "kimi2", "node_rank": 1}}
    inv = write_inventory(tmp_path, ssh_env, [a, b], extra)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", timeout=300)
    assert proc.returncode == 0, doc
    by = {h["host"]: h for h in doc["hosts"]}
    assert by[a.name]["verdict"] == "ready" and by[b.name]["verdict"] == "ready"
    assert "judged on rank 0" in by[b.name]["detail"]
    argv_b = b.run("cat /proc/$(cat /var/lib/provision/server/server-30000.pid)/cmdline | tr '\\0' ' '").stdout
    assert "--nnodes 2 --node-rank 1 --dist-init-addr " + a.address + ":50000" in argv_b
    run("stop", "-i", inv, check_rc=0)
    for h in (a, b):
        assert "sglang" not in h.run("ps -eo args=").stdout


def test_bad_node_ranks_are_a_config_error(tmp_path, ssh_env, hosts):
    extra = {hosts[0].name: {"server": "s", "node_rank": 0}, hosts[1].name: {"server": "s", "node_rank": 2}}
    inv = write_inventory(tmp_path, ssh_env, hosts[:2], extra)
    proc = run("launch", "-i", inv)
    assert proc.returncode == 2 and "node_rank values [0, 2]" in proc.stderr


def test_a_ctrl_c_in_a_later_batch_prints_every_hosts_row_and_the_summary(tmp_path, ssh_env, hosts):
    """issue 63: SIGINT during batch 2 of `launch --serial 1` (piped): the row of the host being
    followed (with its paste-able `provision wait`), the rows before it, the summary; exit 130."""
    import os
    import signal
    import subprocess

    two = hosts[:2]
    inv = write_inventory(tmp_path, ssh_env, two, load="1")
    doc = json.loads(open(inv).read())
    doc["defaults"]["env"]["PROVISION_STANDIN_LOAD_GATE"] = "/root/gate"  # the second host holds in its load
    open(inv, "w").write(json.dumps(doc))
    run("patch", "-i", inv, check_rc=0)
    two[1].hostpath("/root/gate").write_text("")
    rec = two[1].hostpath("/var/lib/provision/server/server-30000.json")
    import threading

    p = subprocess.Popen(["provision", "launch", "-i", inv, "--serial", "1", "--poll", "0.5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    lines: list[str] = []
    following = threading.Event()

    def read_out() -> None:  # the run's lines as they come: "roll1: started pid N ..." is the follow's start
        for ln in p.stdout:
            lines.append(ln)
            if ln.startswith(f"{two[1].name}: started pid "):
                following.set()

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    try:
        assert following.wait(120), (p.poll(), "".join(lines))
        assert rec.exists(), p.poll()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
        reader.join(timeout=30)
        out, err = "".join(lines), p.stderr.read()
        print(f"\n{out}\n{err}")
        assert p.returncode == 130, (out, err)
        assert f"{two[0].name}  ready" in out, out
        assert f"{two[1].name}  interrupted" in out and f"provision wait -i {inv} --host {two[1].name}" in out, out
        assert "2 hosts: 1 interrupted, 1 ready" in out, out
        assert err.endswith("\n"), err
    finally:
        if p.poll() is None:
            p.kill()
        two[1].hostpath("/root/gate").unlink()
        run("stop", "-i", inv, timeout=200)


def test_launch_check_shows_the_batches_and_each_hosts_exact_command_line_and_starts_nothing(tmp_path, ssh_env, hosts):
    inv = write_inventory(tmp_path, ssh_env, hosts)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--serial", "2", "--check", timeout=300)
    assert proc.returncode == 4, doc  # something would start: a check that would change something is 4
    assert doc["batches"] == [[hosts[0].name, hosts[1].name], [hosts[2].name, hosts[3].name]]
    assert [h["verdict"] for h in doc["hosts"]] == ["started"] * 4
    planned = {h["host"]: h["data"]["argv"] for h in doc["hosts"]}
    for h in hosts:
        argv = planned[h.name]
        assert argv[1:3] == ["-m", "sglang.launch_server"], argv
        assert "--model-path" in argv and argv[argv.index("--model-path") + 1] == "/data/models/Kimi-K2.5"
        assert not h.hostpath("/var/lib/provision/server/server-30000.json").exists(), "a check starts nothing"
    # the lines say it too, the batches first
    proc = run("launch", "-i", inv, "--serial", "2", "--check", timeout=300)
    assert proc.returncode == 4
    assert f"batch 1/2: {hosts[0].name}, {hosts[1].name}" in proc.stdout, proc.stdout
    assert f"{hosts[2].name}  would-start" in proc.stdout and "would run (port 30000): " in proc.stdout
    assert "4 hosts: 4 would-start" in proc.stdout
    # what --check showed is the command line the start runs
    run("launch", "-i", inv, "--limit", hosts[0].name, "--poll", "0.5", check_rc=0, timeout=300)
    logs = sorted(hosts[0].hostpath("/var/log/provision").glob("*30000*"))
    started = next(ln for ln in logs[-1].read_text().splitlines() if ln.startswith("[provision] starting: "))
    assert started == "[provision] starting: " + " ".join(planned[hosts[0].name])
    pid = json.loads(hosts[0].hostpath("/var/lib/provision/server/server-30000.json").read_text())["pid"]
    # a restart's plan names the server it would stop, which keeps running
    proc, doc = run_json("launch", "-i", inv, "--limit", hosts[0].name, "--restart", "--check", timeout=300)
    assert proc.returncode == 4, doc
    row = doc["hosts"][0]
    assert row["verdict"] == "restarted" and f"would stop pid {pid}" in row["detail"], row
    assert json.loads(hosts[0].hostpath("/var/lib/provision/server/server-30000.json").read_text())["pid"] == pid
    # nothing to do: a running server with this profile, exit 0
    proc, doc = run_json("launch", "-i", inv, "--limit", hosts[0].name, "--check", timeout=300)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "running", doc
    run("stop", "-i", inv, check_rc=0)
