"""The journal keeps what an interrupted run changed, over real sshd hosts.

`patch --forks 1` over several hosts, interrupted (Ctrl-C, or SIGTERM as a stopped timer unit
gets) right after the second host's row: `provision history --json` must name every host whose
file actually changed, with the sha256 that file now has, and nothing for the hosts left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.helpers import KIMI, PROVISION, run

pytestmark = pytest.mark.ssh


def kimi(host):
    return host.hostpath(os.path.join(host.sglang_dir, KIMI))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def five(sandbox_factory):
    hosts = [sandbox_factory.host() for _ in range(5)]
    try:
        yield hosts
    finally:
        sandbox_factory.remove(*hosts)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_patch_keeps_the_journal_of_the_hosts_it_changed(five, ssh_env, tmp_path, sig):
    for h in five:
        h.reset()
    before = {h.name: kimi(h).read_bytes() for h in five}
    env = {**os.environ, "PROVISION_JOURNAL": str(tmp_path / "journal.jsonl"), "PYTHONUNBUFFERED": "1",
           "COLUMNS": "200"}
    argv = [PROVISION] if PROVISION else [sys.executable, "-m", "provision"]
    hostargs = [a for h in five for a in ("--host", h.name)]
    # The interrupt lands while the third host is in flight, whatever the machine's speed: its sshd
    # (and the last two's) is frozen, so it accepts and never answers until the test thaws it. A run
    # that finished every host before the signal arrived (exit 0) was this test's race.
    for h in five[2:]:
        h.freeze()
    try:
        proc = subprocess.Popen(argv + ["patch", *ssh_env.cli_args, *hostargs, "--forks", "1"], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        names = {h.name for h in five}
        rows = []
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while len(rows) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.split("  ", 1)[0] in names:
                rows.append(line)
        assert len(rows) == 2, (rows, proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        for h in five[2:]:
            h.thaw()
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err, err

    changed = {h.name: sha(kimi(h).read_bytes()) for h in five if kimi(h).read_bytes() != before[h.name]}
    assert len(changed) >= 2, changed
    assert len(changed) < len(five), "the interrupt came too late to leave any host alone"
    hist = run("history", "--json", env={"PROVISION_JOURNAL": env["PROVISION_JOURNAL"]}, check_rc=0)
    recs = [json.loads(x) for x in hist.stdout.splitlines()]
    by_host: dict[str, list[dict]] = {}
    for r in recs:
        by_host.setdefault(r["host"], []).append(r)
    # every host whose file changed is in the journal ...
    assert set(changed) <= set(by_host), (changed, recs)
    for name, now in changed.items():
        done = [r for r in by_host[name] if r["verdict"] == "patched"]
        if done:  # ... with the bytes it has now
            assert done[-1]["sha256_after"] == now and done[-1]["sha256_before"] == sha(before[name])
            assert done[-1]["command"] == "patch" and done[-1]["file"].endswith(KIMI)
        else:  # a host mid-step when the signal came: an attempt of unknown outcome
            assert [r["verdict"] for r in by_host[name]] == ["unknown"], by_host[name]
    # ... and no host left alone is said to be patched
    for name in set(by_host) - set(changed):
        assert all(r["verdict"] != "patched" for r in by_host[name]), by_host[name]


def test_launch_serial_and_launch_patch_are_journaled(five, ssh_env, tmp_path):
    """`launch --serial 1 --patch` over two unpatched hosts: each host's patch (its file's sha256
    before and after) and its start are in `history`."""
    a, b = five[:2]
    for h in (a, b):
        h.reset()
    before = {h.name: sha(kimi(h).read_bytes()) for h in (a, b)}
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1"}},
           "hosts": {h.name: {"address": h.address, "port": h.port} for h in (a, b)}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    env = {"PROVISION_JOURNAL": str(tmp_path / "journal.jsonl")}
    try:
        proc = run("launch", "-i", path, "--serial", "1", "--patch", "--poll", "0.5", env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        run("stop", "-i", path, env=env)
    recs = [json.loads(x) for x in run("history", "--json", env=env, check_rc=0).stdout.splitlines()]
    for h in (a, b):
        mine = [(r["command"], r["verdict"]) for r in recs if r["host"] == h.name]
        assert mine[:2] == [("patch", "patched"), ("launch", "started")], mine
        patched = next(r for r in recs if r["host"] == h.name and r["command"] == "patch")
        assert patched["sha256_before"] == before[h.name]
        assert patched["sha256_after"] == sha(kimi(h).read_bytes()) != before[h.name]
        assert patched["spec"] == "kimi-k25-eagle3" and patched["file"].endswith(KIMI)
