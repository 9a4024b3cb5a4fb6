"""reconcile --restart over real sshd hosts: a two-node server restarts as one unit with the same rank
flags as at launch, and a window that closes during the roll stops it at a batch boundary."""

from __future__ import annotations

import datetime
import json
import math

import pytest

from tests import pace
from tests.cli.helpers import run, run_json
from tests.cli.test_fleet_cli import install_release


@pytest.fixture(scope="module")
def pair_module(sandbox_factory):
    hosts = [sandbox_factory.host(f"rr{i}", sglang="0.5.9", layout="venv") for i in range(2)]
    yield hosts
    sandbox_factory.remove(*hosts)


@pytest.fixture
def pair(pair_module):
    for h in pair_module:
        h.reset()
    yield pair_module
    for h in pair_module:
        h.run("pkill -9 -f sglang", check=False)


@pytest.fixture
def env(tmp_path):
    return {"PROVISION_JOURNAL": str(tmp_path / "journal.jsonl"), "PROVISION_LOCK": str(tmp_path / "lock")}


def write_inventory(tmp_path, ssh_env, hosts, extra=None, load="1"):
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": load, "PROVISION_STANDIN_WARMUP_SECONDS": "0.2"}},
           "hosts": {h.name: {"address": h.address, "port": h.port, **((extra or {}).get(h.name, {}))}
                     for h in hosts}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def server(host) -> tuple[int, str]:
    """(pid, argv) of the server provision recorded on the host."""
    rec = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
    argv = host.run(f"tr '\\0' ' ' < /proc/{rec['pid']}/cmdline", check=False).stdout
    return rec["pid"], argv


def rank_flags(argv: str) -> str:
    i = argv.find("--nnodes")
    return argv[i:].split(" --config")[0].strip() if i >= 0 else ""


def test_two_node_group_restarts_as_one_unit_with_its_rank_flags(tmp_path, ssh_env, pair, env):
    a, b = pair
    extra = {a.name: {"server": "kimi2", "node_rank": 0}, b.name: {"server": "kimi2", "node_rank": 1}}
    inv = write_inventory(tmp_path, ssh_env, pair, extra)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    (pa, argv_a), (pb, argv_b) = server(a), server(b)
    want_b = f"--nnodes 2 --node-rank 1 --dist-init-addr {a.address}:50000"
    assert rank_flags(argv_b) == want_b and rank_flags(argv_a).startswith("--nnodes 2 --node-rank 0")

    install_release(b, "0.5.9")  # only rank 1's file changed under its server
    proc, doc = run_json("reconcile", "-i", inv, "--restart", "--restart-deadline", "120", env=env, timeout=300)
    assert proc.returncode == 0, doc
    by = {h["host"]: h for h in doc["hosts"]}
    assert by[b.name]["verdict"] == "patched"
    for h in (a, b):
        assert by[h.name]["data"]["restart"]["verdict"] == "restarted", by[h.name]
    assert doc["restart_batches"] == [[a.name, b.name]]
    (pa2, argv_a2), (pb2, argv_b2) = server(a), server(b)
    assert pa2 != pa and pb2 != pb, "both ranks were restarted"
    assert rank_flags(argv_b2) == want_b and rank_flags(argv_a2) == rank_flags(argv_a)
    assert "restarted with the rest of server kimi2" in " ".join(by[a.name]["notes"])
    run("stop", "-i", inv, env=env, check_rc=0)


def test_a_window_closing_mid_roll_stops_at_a_batch_boundary(tmp_path, ssh_env, pair, env):
    a, b = pair
    # the window ends `margin` s after this run starts (3 on the reference machine, more on a slower
    # one: the re-patch before the first restart must fit); the first restart alone takes longer (a
    # load as long as the margin)
    margin = math.ceil(pace.seconds(3))
    inv = write_inventory(tmp_path, ssh_env, pair, load=str(margin))
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    pid_b = server(b)[0]
    for h in pair:
        install_release(h, "0.5.9")
    start = datetime.datetime(2026, 1, 1, 5, 0, 0) - datetime.timedelta(seconds=margin)
    proc, doc = run_json("reconcile", "-i", inv, "--restart", "--serial", "1", "--window", "02:00-05:00",
                         env=dict(env, PROVISION_NOW=start.isoformat()), timeout=300)
    by = {h["host"]: h for h in doc["hosts"]}
    assert by[a.name]["data"]["restart"]["verdict"] == "restarted", by[a.name]
    skipped = by[b.name]["data"]["restart"]
    assert skipped["verdict"] == "skipped", by[b.name]
    assert skipped["detail"].startswith("restart skipped: batch 2/2 not started, outside window 02:00-05:00 (it was 05:00:")
    assert server(b)[0] == pid_b, "the skipped batch was not touched"
    assert proc.returncode == 0 and "1 skipped" in doc["summary"] and "1 restarted" in doc["summary"]
    run("stop", "-i", inv, env=env, check_rc=0)


def test_sigterm_mid_roll_journals_what_was_done_and_starts_no_new_batch(tmp_path, ssh_env, pair, env):
    """What systemd does to a timer run it stops: SIGTERM while batch 1 of `--serial 1` loads. The
    re-patches and the restart in flight are in the journal; batch 2 never starts."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.cli.helpers import PROVISION

    a, b = pair
    inv = write_inventory(tmp_path, ssh_env, pair, load="1")
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    pid_a, pid_b = server(a)[0], server(b)[0]
    for h in pair:
        install_release(h, "0.5.9")
    slow = write_inventory(tmp_path, ssh_env, pair, load="120")  # the restarted server loads for 2 min
    argv = [PROVISION] if PROVISION else [sys.executable, "-m", "provision"]
    roll = subprocess.Popen(argv + ["reconcile", "-i", slow, "--restart", "--serial", "1", "--json"],
                            env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while server(a)[0] == pid_a and time.monotonic() < deadline and roll.poll() is None:
        time.sleep(0.2)
    assert server(a)[0] != pid_a, "batch 1's restart never started"
    time.sleep(1)
    roll.send_signal(signal.SIGTERM)
    out, err = roll.communicate(timeout=120)
    assert roll.returncode == 130, (roll.returncode, out, err)
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert server(b)[0] == pid_b, "batch 2 was started after the SIGTERM"
    recs = [json.loads(x) for x in run("history", "--json", env=env, check_rc=0).stdout.splitlines()]
    done = [(r["command"], r["host"], r["verdict"]) for r in recs if r["command"] in ("reconcile", "restart")]
    assert ("reconcile", a.name, "patched") in done and ("reconcile", b.name, "patched") in done, done
    assert ("restart", a.name, "unknown") in done, done
    assert not any(c == "restart" and h == b.name for c, h, _ in done), done
