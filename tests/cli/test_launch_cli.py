"""`provision launch / wait / stop / logs` over real sshd hosts running the stand-in server."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import run, run_json
from tests.pace import seconds


@pytest.fixture(scope="module")
def lhost(sandbox_factory):
    host = sandbox_factory.host("launch1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(lhost):
    lhost.reset()
    return lhost


def inventory(tmp_path, ssh_env, host, env=None, extra=None):
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "2", **(env or {})}},
           "hosts": {host.name: {"address": host.address, "port": host.port, **(extra or {})}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))  # JSON is YAML
    return str(path)


def sglang_procs(host) -> list[str]:
    out = host.run("ps -eo pid=,args=", check=False).stdout
    return [l for l in out.splitlines() if "sglang" in l and "ps -eo" not in l]


def launch(inv, *extra, timeout=240):
    return run_json("launch", "-i", inv, "--poll", "0.5", *extra, timeout=timeout)


def test_patched_host_reaches_ready_then_noop_restart_and_stop(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0, proc.stderr
    r = doc["hosts"][0]
    assert r["verdict"] == "ready"
    assert "ready in" in r["detail"] and "speculative EAGLE3" in r["detail"]
    # both loading phases were followed, each bar seen to 100 %
    for phase in ("target-weights", "kv-cache", "cuda-graphs", "draft-weights", "draft-graphs", "warmup"):
        assert phase in r["data"]["phases_seen"]
    assert r["data"]["progress_seen"] == {"target": 100.0, "draft": 100.0}
    assert r["data"]["time_to_ready"] > 0
    pid = r["data"]["pid"]

    proc2, doc2 = launch(inv)
    assert proc2.returncode == 0 and doc2["hosts"][0]["verdict"] == "running"
    assert "already running" in doc2["hosts"][0]["detail"]

    proc3, doc3 = launch(inv, "--restart")
    assert proc3.returncode == 0 and doc3["hosts"][0]["verdict"] == "ready", doc3
    assert doc3["hosts"][0]["data"]["pid"] != pid

    st = run("status", "-i", inv, check_rc=0)
    assert "health 200" in st.stdout

    proc4 = run("stop", "-i", inv, check_rc=0)
    assert "stopped" in proc4.stdout and "none left" in proc4.stdout
    assert sglang_procs(host) == []


def test_unpatched_is_refused_and_force_fails_fast_with_the_attributeerror(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch(inv)
    assert proc.returncode == 3
    assert doc["hosts"][0]["verdict"] == "refused"
    assert "lacks set_eagle3_layers_to_capture" in doc["hosts"][0]["detail"]
    assert sglang_procs(host) == [], "a refused launch starts nothing"

    forced = run("launch", "-i", inv, "--force", "--poll", "0.5", "--deadline", "600", timeout=300)
    assert forced.returncode == 3
    assert "crashed" in forced.stdout and "timeout" not in forced.stdout
    assert "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute " \
           "'set_eagle3_layers_to_capture'" in forced.stderr
    assert f"provision patch -i {inv} --host launch1" in forced.stdout  # the hint pastes: it carries the -i
    assert sglang_procs(host) == [], "SGLang kills its whole tree on this crash"

    # The old crash stays in the old log: a patched relaunch is judged on its own log.
    run("patch", "-i", inv, check_rc=0)
    proc2, doc2 = launch(inv)
    assert doc2["hosts"][0]["verdict"] == "ready", doc2
    run("stop", "-i", inv, check_rc=0)


def test_wait_reattaches_to_a_startup_in_progress(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host, env={"PROVISION_STANDIN_LOAD_SECONDS": "6"})
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv, "--deadline", "1")
    assert proc.returncode == 3 and doc["hosts"][0]["verdict"] == "timeout"
    assert "left running" in doc["hosts"][0]["detail"]
    proc2, doc2 = run_json("wait", "-i", inv, "--poll", "0.5", timeout=120)
    assert proc2.returncode == 0 and doc2["hosts"][0]["verdict"] == "ready"
    assert "draft-weights" in doc2["hosts"][0]["data"]["phases_seen"]
    run("stop", "-i", inv, check_rc=0)


def test_preflight_refuses_a_stray_server_process(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    host.run("setsid bash -c 'exec -a \"python3 -m sglang.launch_server --port 31999\" sleep 300' "
             "</dev/null >/dev/null 2>&1 &")
    proc, doc = launch(inv)
    assert proc.returncode == 3 and doc["hosts"][0]["verdict"] == "refused"
    assert "leftover SGLang processes" in doc["hosts"][0]["detail"]


@pytest.mark.parametrize("fault,verdict,needle", [
    ("crash-mid-load", "crashed", "exit status"),
    ("hang", "timeout", "stuck in target-weights"),
    ("flap", "failed", "flapping"),
    ("oom", "crashed", "out of memory"),
])
def test_faults_give_the_right_verdict(tmp_path, ssh_env, host, fault, verdict, needle):
    env = {"PROVISION_STANDIN_FAULT": fault, "PROVISION_STANDIN_FLAP_EVERY": "1"}
    inv = inventory(tmp_path, ssh_env, host, env=env)
    run("patch", "-i", inv, check_rc=0)
    # The hang is seen only once the stand-in is in target-weights: 8 s on the bounds' machine, the
    # machine's pace on a slower one (a fixed 8 s ended in 'starting' there).
    deadline = str(round(seconds(8))) if fault == "hang" else "120"
    proc, doc = launch(inv, "--deadline", deadline)
    assert proc.returncode == 3, doc
    r = doc["hosts"][0]
    assert r["verdict"] == verdict, r
    assert needle.lower() in r["detail"].lower(), r["detail"]
    run("stop", "-i", inv)
    assert sglang_procs(host) == []


def test_logs_show_this_launch_redacted(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    env = {"PROVISION_API_KEY": "canary-key-5e1f9a"}
    proc = run("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout
    logs = run("logs", "-i", inv, "-n", "400", env=env, check_rc=0)
    assert "server_args=ServerArgs(" in logs.stdout and "api_key=" in logs.stdout
    assert "canary-key-5e1f9a" not in logs.stdout + logs.stderr + proc.stdout + proc.stderr
    assert "canary-key-5e1f9a" not in host.run("ps -eo args=").stdout
    run("stop", "-i", inv, check_rc=0)


def test_persistent_needs_systemd_and_says_so(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv, "--persistent")
    assert proc.returncode == 3
    assert "needs systemd as init" in doc["hosts"][0]["detail"]
    assert sglang_procs(host) == []


def test_patch_targets_the_running_server_and_refuses_while_it_loads(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host, env={"PROVISION_STANDIN_LOAD_SECONDS": "6"})
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv, "--deadline", "1")
    assert doc["hosts"][0]["verdict"] == "timeout"  # still loading
    loading = run("unpatch", "-i", inv)
    assert loading.returncode == 3 and "still loading" in loading.stdout
    run_json("wait", "-i", inv, "--poll", "0.5", timeout=120)
    proc2, doc2 = run_json("unpatch", "-i", inv)
    assert proc2.returncode == 0 and doc2["hosts"][0]["verdict"] == "unpatched"
    assert any("restart needed" in n for n in doc2["hosts"][0]["notes"])
    run("stop", "-i", inv, check_rc=0)


def test_a_restart_into_an_interpreter_that_does_not_exist_is_refused_before_anything_stops(tmp_path, ssh_env,
                                                                                            host):
    """A restart checks what its start needs before it stops the running server (issue 42): a
    playbook whose launch.python does not exist leaves the healthy server as it was."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    rec = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
    pb = tmp_path / "nopython.yaml"
    pb.write_text(json.dumps({"name": "nopython", "launch": {"python": "/opt/gone/bin/python3"}}))
    try:
        proc, doc = launch(inv, "--restart", "--playbook", str(pb))
        r = doc["hosts"][0]
        assert proc.returncode == 3 and r["verdict"] == "refused", r
        assert "launch.python /opt/gone/bin/python3 does not exist: the server could not start" in r["detail"], r
        assert f"the running server (pid {rec['pid']}) was left running" in r["detail"], r
        now = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
        assert now["pid"] == rec["pid"] and not now.get("stopped_at"), now
        st = run("status", "-i", inv, "--format", "lines")
        assert "health 200" in st.stdout and f"pid {rec['pid']}" in st.stdout, st.stdout
    finally:
        run("stop", "-i", inv)


def test_a_restart_whose_new_start_fails_after_the_stop_says_so_and_marks_the_old_record_stopped(
        tmp_path, ssh_env, host):
    """What preflight cannot see: an interpreter that is there and executable but does not run (not
    a program: exec format error). The old server is stopped first; the row says so in words, the
    old record is marked stopped, the log keeps the watcher's own error, and `history` the attempt."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    old = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
    host.run("mkdir -p /opt/notpy/bin && printf 'not a program\\n' > /opt/notpy/bin/python3 && "
             "chmod 755 /opt/notpy/bin/python3")
    pb = tmp_path / "notpy.yaml"
    pb.write_text(json.dumps({"name": "notpy", "launch": {"python": "/opt/notpy/bin/python3"}}))
    journal = tmp_path / "journal.jsonl"
    try:
        proc, doc = run_json("launch", "-i", inv, "--restart", "--playbook", str(pb), "--poll", "0.5",
                             env={"PROVISION_JOURNAL": str(journal)}, timeout=240)
        r = doc["hosts"][0]
        assert proc.returncode == 3 and r["verdict"] == "failed", r
        assert r["detail"].startswith(f"the old server (pid {old['pid']}) was stopped; the new one failed: the server "
                                      "did not start: OSError: [Errno 8] Exec format error"), r["detail"]
        now = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
        assert now["pid"] == old["pid"] and now.get("stopped_at"), now
        assert sglang_procs(host) == [], "nothing of either server runs"
        log = r["detail"].rsplit("; see ", 1)[1]
        assert "the watcher could not start the server: OSError: [Errno 8] Exec format error" in \
            host.hostpath(log).read_text()
        last = json.loads(journal.read_text().splitlines()[-1])
        assert last["command"] == "launch" and last["verdict"] == "failed" and "was stopped" in last["detail"], last
        st = run("status", "-i", inv, "--format", "lines")
        assert "health 200" not in st.stdout, st.stdout
    finally:
        run("stop", "-i", inv)


def test_a_restart_onto_a_full_log_disk_is_refused_before_anything_stops(tmp_path, ssh_env, host):
    """The new start needs room for its log and record: a full disk is found before the healthy
    server is stopped (it was stopped, then the start failed on ENOSPC)."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    old = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
    host.run("mkdir -p /var/log/full && mount -t tmpfs -o size=1m tmpfs /var/log/full && "
             "(dd if=/dev/zero of=/var/log/full/filler bs=4k 2>/dev/null || true)")
    pb = tmp_path / "fulllog.yaml"
    pb.write_text(json.dumps({"name": "fulllog", "launch": {"log_dir": "/var/log/full"}}))
    try:
        proc, doc = launch(inv, "--restart", "--playbook", str(pb))
        r = doc["hosts"][0]
        assert proc.returncode == 3 and r["verdict"] == "refused", r
        assert "the log directory /var/log/full has 0 KiB free" in r["detail"], r["detail"]
        assert f"the running server (pid {old['pid']}) was left running" in r["detail"], r["detail"]
        now = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
        assert now["pid"] == old["pid"] and not now.get("stopped_at"), now
    finally:
        host.run("umount /var/log/full", check=False)
        run("stop", "-i", inv)


def test_an_offline_host_with_the_hub_id_in_its_cache_is_not_refused(tmp_path, ssh_env, host):
    """issue 43 item 1: an `offline` host whose Hugging Face cache has the model's snapshot starts it
    (preflight refused before looking); one whose cache lacks it is refused, saying where it looked."""
    snap = "/root/.cache/huggingface/hub/models--moonshotai--Kimi-K2.5"
    host.run(f"mkdir -p {snap}/snapshots/0123abc {snap}/refs && printf 0123abc > {snap}/refs/main && "
             f"cp -a /data/models/Kimi-K2.5/. {snap}/snapshots/0123abc/")
    inv = inventory(tmp_path, ssh_env, host, extra={"offline": True, "args": {"model-path": "moonshotai/Kimi-K2.5"}})
    run("patch", "-i", inv, check_rc=0)
    try:
        proc, doc = launch(inv)
        r = doc["hosts"][0]
        assert proc.returncode == 0 and r["verdict"] == "ready", (r, proc.stderr[-2000:])
        assert "marked offline" not in proc.stderr, proc.stderr
    finally:
        run("stop", "-i", inv)
    host.run(f"rm -rf {snap}")
    proc, doc = launch(inv)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", r
    assert "model moonshotai/Kimi-K2.5 is a hub id: the host downloads it at start but is marked offline and hub id " \
           "moonshotai/Kimi-K2.5 is not in this host's Hugging Face cache (/root/.cache/huggingface/hub)" in r["detail"], r


def test_a_vllm_playbook_on_a_host_without_vllm_is_refused_naming_the_engine_it_has(tmp_path, ssh_env, host):
    """issue 63: the vLLM playbook on an SGLang-only host was `failed` (a failure of the run), not the
    `refused` preflight documents for what it finds missing; it is refused now, and says what the host has."""
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch(inv, "--playbook", "kimi-k25-eagle3-vllm", "--arg", "model=/data/models/Kimi-K2.5")
    assert proc.returncode == 3, doc
    row = doc["hosts"][0]
    assert row["verdict"] == "refused", row
    assert "no vLLM install" in row["detail"] and "this host has SGLang 0.5.9" in row["detail"], row
    assert "nothing was started" in row["detail"] and not sglang_procs(host)


def test_status_after_an_upgrade_in_place_says_the_running_server_has_the_old_code(tmp_path, ssh_env, host):
    """issue 63: after the release's file was replaced under a running server (an upgrade in place),
    status said `fix: native` for a server still running the code it loaded at its start."""
    from provision.sandbox.wheels import models_file

    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0, doc
    proc, doc = run_json("status", "-i", inv, timeout=120)
    row = doc["hosts"][0]
    assert row["data"]["fix"] == "edited file", row
    host.hostpath(row["file"]).write_bytes(models_file("0.5.10").read_bytes())  # 0.5.10 has the methods natively
    proc, doc = run_json("status", "-i", inv, timeout=120)
    row = doc["hosts"][0]
    assert row["verdict"] == "native" and row["data"]["fix"] == "old code", row
    assert "fix: old code" in row["detail"] and any("restart needed" in n for n in row["notes"]), row
    run("stop", "-i", inv, check_rc=0)


def test_status_exits_3_on_a_server_that_answered_ready_and_is_unhealthy_now(tmp_path, ssh_env, host):
    """issue 63: `status` exited 0 while a server provision started failed its health check."""
    import time

    env = {"PROVISION_STANDIN_FAULT": "flap", "PROVISION_STANDIN_FLAP_SECONDS": "3"}
    inv = inventory(tmp_path, ssh_env, host, env=env)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc
    seen = {}
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:  # its health alternates 200 / 503 every 3 s
        proc, doc = run_json("status", "-i", inv, timeout=120)
        row = doc["hosts"][0]
        seen[row["data"]["server_state"]] = (proc.returncode, row)
    assert set(seen) == {"up", "unhealthy"}, seen
    code, row = seen["unhealthy"]
    assert code == 3 and row["data"]["server_unhealthy"], row
    assert "health 503" in row["detail"] and "unhealthy: it answered ready before" in row["detail"], row
    assert seen["up"][0] == 0, seen["up"]
    run("stop", "-i", inv, check_rc=0)
