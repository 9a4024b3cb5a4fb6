"""Launch over real sshd hosts when things go wrong: connection blips during the follow, ranks that
outlive their server, Ctrl-C after the server started, and the journal of every server change."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from tests.cli.helpers import PROVISION, run, run_json

SECRET = "sk-trust-canary-7f3a"


@pytest.fixture(scope="module")
def thost_module(sandbox_factory):
    host = sandbox_factory.host("trust1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(thost_module):
    thost_module.reset()
    yield thost_module
    release(thost_module)
    thost_module.run("pkill -9 -f sglang", check=False)  # whatever a failing test left behind


@pytest.fixture
def env(tmp_path):
    return {"PROVISION_JOURNAL": str(tmp_path / "journal.jsonl"), "PROVISION_API_KEY": SECRET}


GATE = "/tmp/provision-test-load-gate"  # on the host: the stand-in's load does not end while it exists


def gate(host):
    """Hold the host's next load open until ``release(host)``: a test acts "during the load" on that
    event, whatever the machine's speed (a fixed load time raced a loaded machine)."""
    host.hostpath(GATE).write_text("")


def release(host):
    host.hostpath(GATE).unlink(missing_ok=True)


def inventory(tmp_path, ssh_env, host, load="2", env=None):
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": load, "PROVISION_STANDIN_LOAD_GATE": GATE,
                                **(env or {})}},
           "hosts": {host.name: {"address": host.address, "port": host.port}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def start(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([PROVISION, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS="200", **(env or {})), stdin=subprocess.DEVNULL)


def record(host) -> dict | None:
    p = host.hostpath("/var/lib/provision/server/server-30000.json")
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def log_text(host) -> str:
    rec = record(host)
    try:
        return host.hostpath(rec["log"]).read_text(errors="replace") if rec else ""
    except OSError:
        return ""


def wait_for(pred, timeout=60.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def sglang_pids(host) -> list[int]:
    out = host.run("ps -eo pid=,args=", check=False).stdout
    return sorted(int(l.split()[0]) for l in out.splitlines() if "sglang" in l and "ps -eo" not in l)


def sessions(host) -> list[int]:
    """sshd processes serving connections (not the host's listener: new connections still work)."""
    return [p for p in host.processes() if _comm(p) in ("sshd", "sshd-session")]


def kill(pid: int) -> None:
    """SIGKILL an sshd session that may have ended on its own since it was listed (a short command's
    session: CI once lost that race)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def journal(env) -> list[tuple]:
    try:
        with open(env["PROVISION_JOURNAL"]) as fh:
            return [(x["command"], x["verdict"]) for x in map(json.loads, fh)]
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------- a blip must not end the follow

def test_killed_ssh_session_mid_load_still_reaches_ready(tmp_path, ssh_env, host, env):
    inv = inventory(tmp_path, ssh_env, host, load="2")
    run("patch", "-i", inv, env=env, check_rc=0)
    gate(host)
    try:
        proc = start("launch", "-i", inv, "--poll", "0.5", "--json", env=env)
        wait_for(lambda: "Load weight begin" in log_text(host), 60, "the load to begin")
        killed = sessions(host)
        assert killed, "the follow's sshd session"
        for pid in killed:
            kill(pid)
        wait_for(lambda: [p for p in sessions(host) if p not in killed], 60, "the follow to reconnect")
        again = [p for p in sessions(host) if p not in killed]
        for pid in again:  # and the reconnection, once more
            kill(pid)
    finally:
        release(host)
    out, err = proc.communicate(timeout=240)
    doc = json.loads(out)
    assert proc.returncode == 0, (out, err)
    assert doc["hosts"][0]["verdict"] == "ready", doc["hosts"][0]
    assert "connection lost" in err and "reconnected after" in err, err
    print("\n".join(line for line in err.splitlines() if "reconnect" in line or "lost" in line))
    assert ("launch", "started") in journal(env)
    run("stop", "-i", inv, env=env, check_rc=0)


def test_sustained_outage_is_unknown_and_the_server_keeps_running(tmp_path, ssh_env, host, env):
    inv = inventory(tmp_path, ssh_env, host, load="2")
    run("patch", "-i", inv, env=env, check_rc=0)
    gate(host)  # the server is still loading when sshd goes (released before `wait` below)
    proc = start("launch", "-i", inv, "--poll", "0.5", "--json", "--max-outage", "3", "--connect-timeout", "2",
                 env=env)
    wait_for(lambda: "Load weight begin" in log_text(host), 60, "the load to begin")
    pid = record(host)["pid"]
    host.kill_sshd()  # listener too: every reconnection is refused
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        host.start_sshd()
    doc = json.loads(out)
    assert proc.returncode == 3, (out, err)
    r = doc["hosts"][0]
    assert r["verdict"] == "unknown", r
    assert "--max-outage 3" in r["detail"] and f"provision wait -i {inv} --host {host.name}" in r["detail"]
    assert "left running" in r["detail"]
    assert pid in sglang_pids(host), "the server was not touched"
    release(host)
    proc2, doc2 = run_json("wait", "-i", inv, "--poll", "0.5", env=env, timeout=120)
    assert proc2.returncode == 0 and doc2["hosts"][0]["verdict"] == "ready", doc2
    run("stop", "-i", inv, env=env, check_rc=0)


# --------------------------------------------------------------------------- ranks that outlive their server

def _launch_and_kill_main(tmp_path, ssh_env, host, env, grace):
    inv = inventory(tmp_path, ssh_env, host, load="2", env={"PROVISION_STANDIN_RANKS_OUTLIVE": "1"})
    run("patch", "-i", inv, env=env, check_rc=0)
    gate(host)  # the ranks are still loading when the main process is killed (the fixture releases it)
    proc = start("launch", "-i", inv, "--poll", "0.5", "--json", "--rank-grace", grace, env=env)
    wait_for(lambda: log_text(host).count("Load weight begin") >= 8, 60, "every rank loading")
    # the detokenizer may start a moment after the last rank logs (seen under CI load): wait for all ten
    wait_for(lambda: len(sglang_pids(host)) >= 10, 30, "the main process, 8 ranks and the detokenizer")
    rec = record(host)
    before = sglang_pids(host)
    assert rec["pid"] in before and len(before) >= 10  # main, 8 ranks, detokenizer
    host.run(f"kill -KILL {rec['pid']}")  # only the main process, as the OOM killer does
    out, err = proc.communicate(timeout=120)
    return inv, rec, before, proc, json.loads(out), err


def test_ranks_outliving_their_server_are_shown_kept_and_stopped(tmp_path, ssh_env, host, env):
    inv, rec, before, proc, doc, err = _launch_and_kill_main(tmp_path, ssh_env, host, env, "600")
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "crashed", r
    # nothing the parser recognises: the log's last lines are shown anyway, redacted
    tail = r["data"]["log_tail"]
    assert "Load weight begin" in tail and SECRET not in tail and SECRET not in json.dumps(doc)
    survivors = sorted(set(before) - {rec["pid"]})
    assert sorted(r["data"]["survivors"]) == survivors

    proc, doc = run_json("status", "-i", inv, env=env)
    st = doc["hosts"][0]
    assert st["data"]["server_state"] == f"dead, {len(survivors)} left", st
    assert sorted(st["data"]["server_survivors"]) == survivors
    assert f"{len(survivors)} processes of its tree are alive" in st["data"]["server"]
    assert "(sglang::schedul)" in st["data"]["server"] and "provision stop" in st["data"]["server"]

    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--force", env=env)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", r
    assert "provision stop" in r["detail"] and str(survivors[0]) in r["detail"]
    assert record(host)["pid"] == rec["pid"], "the old tree's record is kept"
    assert sglang_pids(host) == survivors

    proc, doc = run_json("stop", "-i", inv, env=env)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "stopped", doc
    assert set(survivors) <= set(doc["hosts"][0]["data"]["pids"])  # and the watcher that waited for them
    assert sglang_pids(host) == []
    assert ("stop", "stopped") in journal(env)


def test_launch_restart_stops_the_survivors_first(tmp_path, ssh_env, host, env):
    inv, rec, before, proc, doc, err = _launch_and_kill_main(tmp_path, ssh_env, host, env, "600")
    survivors = sorted(set(before) - {rec["pid"]})
    assert sglang_pids(host) == survivors
    inv2 = inventory(tmp_path, ssh_env, host, load="1")
    release(host)
    proc, doc = run_json("launch", "-i", inv2, "--poll", "0.5", "--restart", env=env, timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc
    assert not set(survivors) & set(sglang_pids(host)), "the old ranks are gone"
    assert ("launch", "restarted") in journal(env)
    run("stop", "-i", inv2, env=env, check_rc=0)
    assert sglang_pids(host) == []


def test_the_watcher_ends_the_rest_of_the_tree_and_says_so(tmp_path, ssh_env, host, env):
    inv, rec, before, proc, doc, err = _launch_and_kill_main(tmp_path, ssh_env, host, env, "1")
    wait_for(lambda: sglang_pids(host) == [], 30, "the watcher to end the ranks")
    reaped = json.loads(host.hostpath(record(host)["reapfile"]).read_text())
    assert sorted(reaped["killed"]) == sorted(set(before) - {rec["pid"]}) and reaped["grace"] == 1
    proc, doc = run_json("status", "-i", inv, env=env)
    server = doc["hosts"][0]["data"]["server"]
    assert f"its watcher killed {len(reaped['killed'])} leftover processes" in server, server


# --------------------------------------------------------------------------- Ctrl-C after the start

@pytest.mark.parametrize("stop_on_interrupt", [False, True])
def test_ctrl_c_after_the_start_says_the_server_was_started(tmp_path, ssh_env, host, env, stop_on_interrupt):
    inv = inventory(tmp_path, ssh_env, host, load="2")
    run("patch", "-i", inv, env=env, check_rc=0)
    gate(host)  # the Ctrl-C comes during the load, always (a 20 s load once ended before it under load)
    extra = ["--stop-on-interrupt"] if stop_on_interrupt else []
    proc = start("launch", "-i", inv, "--poll", "0.5", "--json", *extra, env=env)
    wait_for(lambda: "Load weight begin" in log_text(host), 60, "the load to begin")
    pid = record(host)["pid"]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    doc = json.loads(out)
    assert proc.returncode == 130 and doc["exit_code"] == 130, (out, err)
    r = doc["hosts"][0]
    assert r["verdict"] == "interrupted", r
    assert "nothing was run there" not in out + err
    assert f"the server was started (pid {pid}" in r["detail"] or "the server was started, then stopped" in r["detail"]
    if stop_on_interrupt:
        assert "stopped (--stop-on-interrupt)" in r["detail"], r
        assert sglang_pids(host) == []
        assert ("stop", "stopped") in journal(env)
    else:
        # the hint pastes: the host exists only in the inventory, so it carries the -i (issue 37, item 3)
        hint = f"provision wait -i {inv} --host {host.name}"
        assert "left running" in r["detail"] and hint in r["detail"], r["detail"]
        assert pid in sglang_pids(host)
        release(host)
        pasted = run(*shlex.split(hint)[1:], "--poll", "0.5", env=env, timeout=240)
        assert pasted.returncode == 0 and "ready" in pasted.stdout, (pasted.stdout, pasted.stderr)
        run("stop", "-i", inv, env=env, check_rc=0)
    assert ("launch", "started") in journal(env)


def test_ctrl_c_in_text_mode_says_what_to_do_once(tmp_path, ssh_env, host, env):
    """The interrupted row carries the two commands; nothing repeats it (it was printed three times)."""
    inv = inventory(tmp_path, ssh_env, host, load="2")
    run("patch", "-i", inv, env=env, check_rc=0)
    gate(host)
    proc = start("launch", "-i", inv, "--poll", "0.5", "--format", "lines", env=env)
    wait_for(lambda: "Load weight begin" in log_text(host), 60, "the load to begin")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    hint = f"provision wait -i {inv} --host {host.name}"
    assert (out + err).count(hint) == 1, (out, err)
    assert f"the server on {host.name} keeps loading" in err and "after the interrupt" not in out, (out, err)
    release(host)
    run("stop", "-i", inv, env=env, check_rc=0)


# --------------------------------------------------------------------------- every attempt is journaled

def test_a_refused_and_an_unknown_launch_each_leave_a_journal_line(tmp_path, ssh_env, host, env):
    """issue 38, item 4: `history` shows every attempt to start a server, not only the ones that
    got as far as starting."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    refused = run("launch", "-i", inv, "--arg", "model-path=/data/models/not-there", env=env)
    assert refused.returncode == 3 and "refused" in refused.stdout, (refused.stdout, refused.stderr)
    assert journal(env)[-1] == ("launch", "refused")
    # the engine is SIGKILLed at its first atomic write: the outcome is unknown, and says so
    unknown = run("launch", "-i", inv, env=dict(env, PROVISION_FAILPOINTS="atomic_before_rename"))
    assert unknown.returncode == 3 and "unknown" in unknown.stdout, (unknown.stdout, unknown.stderr)
    assert journal(env)[-1] == ("launch", "unknown")
    with open(env["PROVISION_JOURNAL"]) as fh:
        last = json.loads(fh.readlines()[-1])
    assert last["host"] == host.name and last["detail"], last
