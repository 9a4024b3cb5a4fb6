"""One owner for a server's lifecycle, over a real sshd host in its own pid namespace: a restart
replays the record (it keeps the API key), a stop ends only processes provision provably started
(pid reuse through ns_last_pid), the port's lock (two restarts at once leave one server), and
`wait` after a deliberate stop."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from tests.cli.helpers import PROVISION, run, run_json
from tests.cli.test_fleet_cli import install_release

KEY = "sk-lifecycle-canary-41d2"


@pytest.fixture(scope="module")
def lhost_module(sandbox_factory):
    host = sandbox_factory.host("life1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(lhost_module):
    lhost_module.reset()
    yield lhost_module
    lhost_module.run("pkill -9 -f sglang; pkill -9 -f 'sleep 4242'", check=False)


@pytest.fixture
def env(tmp_path):
    return {"PROVISION_JOURNAL": str(tmp_path / "journal.jsonl"), "PROVISION_LOCK": str(tmp_path / "lock")}


def inventory(tmp_path, ssh_env, host, load="1"):
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": load, "PROVISION_STANDIN_WARMUP_SECONDS": "0.2"}},
           "hosts": {host.name: {"address": host.address, "port": host.port}}}
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return str(path)


def record(host) -> dict:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())


def http(host, path: str, token: str | None = None) -> int:
    """The HTTP status the host's server answers `path` with (asked inside the host's network)."""
    code = ("import sys, urllib.request, urllib.error\n"
            "r = urllib.request.Request('http://127.0.0.1:30000' + sys.argv[1])\n"
            "if len(sys.argv) > 2: r.add_header('Authorization', 'Bearer ' + sys.argv[2])\n"
            "try:\n    print(urllib.request.urlopen(r, timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print(0)\n")
    out = host.run([host.python, "-c", code, path] + ([token] if token else []), check=False).stdout.strip()
    return int(out.splitlines()[-1]) if out else 0


def sglang_pids(host) -> list[int]:
    out = host.run("ps -eo pid=,args=", check=False).stdout
    return sorted(int(l.split()[0]) for l in out.splitlines() if "sglang" in l and "ps -eo" not in l)


def alive_in_host(host, pid: int) -> bool:
    return host.run(f"kill -0 {pid}", check=False).returncode == 0


# --------------------------------------------------------------------------- the record is the truth

def test_reconcile_restart_keeps_the_api_key_with_none_in_its_environment(tmp_path, ssh_env, host, env):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--arg", "mem-fraction-static=0.85",
                         env=dict(env, PROVISION_API_KEY=KEY), timeout=240)
    assert proc.returncode == 0, doc
    pid = record(host)["pid"]
    assert http(host, "/v1/models") == 401 and http(host, "/v1/models", KEY) == 200

    install_release(host, "0.5.9")  # SGLang re-written under the running server
    proc, doc = run_json("reconcile", "-i", inv, "--restart", "--restart-deadline", "120", env=env, timeout=300)
    assert proc.returncode == 0, doc
    assert doc["hosts"][0]["data"]["restart"]["verdict"] == "restarted", doc["hosts"][0]
    rec = record(host)
    assert rec["pid"] != pid
    assert http(host, "/v1/models") == 401, "the restarted server must still require the API key"
    assert http(host, "/v1/models", KEY) == 200
    argv = host.run(f"tr '\\0' ' ' < /proc/{rec['pid']}/cmdline", check=False).stdout
    assert "--mem-fraction-static 0.85" in argv, "the launch's --arg override was replayed"
    # the record names the secret and its 0600 file, never its value
    assert rec["secrets"]["args"] == ["api-key"] and KEY not in json.dumps(rec)
    assert oct(host.hostpath(rec["secrets"]["files"]["api-key"]).stat().st_mode & 0o777) == "0o600"
    run("stop", "-i", inv, env=env, check_rc=0)


def test_secret_files_go_with_their_server(tmp_path, ssh_env, host, env):
    """`stop` removes the port's key and token files; a launch without a key after one with a key
    serves without one and leaves no key file for a restart or `bench` to find (issue 29, item 5)."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    files = [host.hostpath(f"/var/lib/provision/server/server-30000.{s}") for s in ("secrets.yaml", "hf_token")]
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=dict(env, PROVISION_API_KEY=KEY, HF_TOKEN="hf_" + KEY),
                         timeout=240)
    assert proc.returncode == 0, doc
    assert all(f.exists() for f in files), "the key and the token are in their 0600 files while it runs"
    run("stop", "-i", inv, env=env, check_rc=0)
    assert not [f for f in files if f.exists()], "stop leaves no secret file of the port"

    # a key file left from an earlier server (an older provision kept them after stop): a launch
    # without a key removes it rather than leaving it for the next restart or bench
    files[0].write_text(f'# written by provision; holds secrets\napi-key: "{KEY}"\n')
    files[0].chmod(0o600)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    assert http(host, "/v1/models") == 200, "a launch without a key serves without one"
    assert not files[0].exists(), "the earlier server's key file went with the new launch"
    assert record(host).get("config") is None and not record(host)["secrets"]["args"]
    proc, doc = run_json("bench", "-i", inv, "--requests", "1", "--warmup", "0", env=env, timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "measured", doc
    run("stop", "-i", inv, env=env, check_rc=0)


def test_a_restart_that_would_lose_the_key_is_refused_and_the_old_server_keeps_running(tmp_path, ssh_env, host,
                                                                                       env):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=dict(env, PROVISION_API_KEY=KEY), timeout=240)
    assert proc.returncode == 0, doc
    rec = record(host)
    host.hostpath(rec["config"]).unlink()  # the 0600 file the key was in is gone
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--restart", env=env, timeout=240)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", r
    assert "PROVISION_API_KEY" in r["detail"] and rec["config"] in r["detail"] and "keeps running" in r["detail"]
    assert record(host)["pid"] == rec["pid"] and alive_in_host(host, rec["pid"])
    assert http(host, "/health") == 200
    run("stop", "-i", inv, env=env, check_rc=0)


# --------------------------------------------------------------------------- provably provision's processes

def _reuse_pid(host, pid: int) -> int:
    """An unrelated `setsid sleep` given `pid` (and so the same pgid and sid) through the host's own
    pid namespace's ns_last_pid. Returns its pid (== pid)."""
    for _ in range(20):
        out = host.run(["/bin/bash", "-c", f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid; "
                        "setsid sleep 4242 </dev/null >/dev/null 2>&1 & echo $!"], check=False).stdout.strip()
        if out == str(pid):
            # `echo $!` can answer before the child has run setsid(): until then its pgid and sid are
            # bash's, outside this pid namespace (read as 0). Wait for the session of its own.
            for _ in range(50):
                if _stat(host, pid) == (pid, pid):
                    break
                time.sleep(0.1)
            return pid
        host.run("pkill -9 -f 'sleep 4242'", check=False)
    raise AssertionError(f"could not get pid {pid} for the sleep")


def _stat(host, pid: int) -> tuple[int, int]:
    f = host.run(f"cat /proc/{pid}/stat", check=False).stdout.rsplit(")", 1)[1].split()
    return int(f[2]), int(f[3])  # pgid, sid


def test_pid_reuse_after_a_hard_death_is_never_killed(tmp_path, ssh_env, host, env):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    rec = record(host)
    # the server and its watcher die hard (the OOM killer, a container host restarted)
    host.run(f"kill -KILL {rec['watcher']} {rec['pid']}; pkill -KILL -f sglang", check=False)
    for _ in range(100):
        if not alive_in_host(host, rec["pid"]) and not sglang_pids(host):
            break
        time.sleep(0.1)
    sleeper = _reuse_pid(host, rec["pid"])
    assert _stat(host, sleeper) == (rec["pid"], rec["pid"]), "the sleep has the dead server's pid, pgid and sid"

    proc, doc = run_json("stop", "-i", inv, env=env)
    assert proc.returncode == 0, doc
    assert alive_in_host(host, sleeper), "stop killed a process provision never started"

    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--restart", env=env, timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc
    assert alive_in_host(host, sleeper), "launch --restart killed a process provision never started"
    run("stop", "-i", inv, env=env, check_rc=0)
    assert alive_in_host(host, sleeper) and sglang_pids(host) == []


def test_a_record_of_an_earlier_boot_kills_nothing(tmp_path, ssh_env, host, env):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    path = host.hostpath("/var/lib/provision/server/server-30000.json")
    rec = json.loads(path.read_text())
    path.write_text(json.dumps(dict(rec, boot_id="00000000-0000-0000-0000-000000000000")))
    proc, doc = run_json("stop", "-i", inv, env=env)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "not-running", doc
    assert "before the host last booted" in doc["hosts"][0]["detail"]
    assert alive_in_host(host, rec["pid"]), "a record of an earlier boot owns no live process"
    host.run(f"kill -KILL {rec['watcher']} {rec['pid']}; pkill -KILL -f sglang", check=False)


# --------------------------------------------------------------------------- the port's lock

def test_two_restarts_at_once_leave_one_recorded_server_and_stop_ends_it(tmp_path, ssh_env, host, env):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    procs = [subprocess.Popen([PROVISION, "launch", "-i", inv, "--poll", "0.5", "--restart", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PROVISION_JOURNAL=str(tmp_path / f"j{i}.jsonl")),
                              stdin=subprocess.DEVNULL) for i in range(2)]
    for p in procs:
        p.communicate(timeout=300)
    rec = record(host)
    assert alive_in_host(host, rec["pid"])
    left = sglang_pids(host)
    # every SGLang process on the host is the recorded server's tree: its main process and its ranks
    tree = host.run(f"ps -o pid= --ppid {rec['pid']}", check=False).stdout.split()
    assert set(left) <= {rec["pid"], *map(int, tree)}, (left, rec["pid"], tree)
    proc, doc = run_json("stop", "-i", inv, env=env)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "stopped", doc
    assert sglang_pids(host) == []


def test_wait_and_bench_after_a_deliberate_stop_say_stopped_and_fail(tmp_path, ssh_env, host, env):
    """A stopped server is not serving: `wait` never says ready or exits 0 for it (a script doing
    `provision wait && send-traffic` must not go ahead), and `bench` says it was stopped instead of an
    internal error (issue 37, items 1 and 2)."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    run("stop", "-i", inv, env=env, check_rc=0)
    proc = run("wait", "-i", inv, "--poll", "0.5", env=env, timeout=120)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "ready" not in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)
    assert "stopped by `provision stop`" in proc.stdout and "`provision launch` starts it" in proc.stdout
    proc, doc = run_json("wait", "-i", inv, "--poll", "0.5", env=env, timeout=120)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "failed" and r.get("error_kind") == "stopped", r
    proc, doc = run_json("bench", "-i", inv, "--requests", "1", "--warmup", "0", env=env, timeout=120)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "failed", r
    assert "was stopped at" in r["detail"] and "AttributeError" not in r["detail"], r
    assert r.get("error_kind") != "internal", r


HOLD = ("import fcntl, json, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.ftruncate(fd, 0)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'doing': 'start', 'at': time.time()}).encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "print(repr(time.time()), flush=True)\n")


def test_a_start_waits_for_the_ports_lock_another_run_holds(tmp_path, ssh_env, host, env):
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    host.run("mkdir -p -m 700 /var/lib/provision/server")
    holder = subprocess.Popen(host.nsenter_argv() + [host.python, "-c", HOLD,
                                                     "/var/lib/provision/server/server-30000.lock", "8"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    released = float(holder.stdout.readline())
    holder.wait(timeout=30)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc
    assert record(host)["started_at"] >= released, "the server was started while another run held the port's lock"
    run("stop", "-i", inv, env=env, check_rc=0)


def test_logs_follow_continues_with_a_new_launchs_log_from_its_start(tmp_path, ssh_env, host, env):
    import signal

    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, doc
    follower = subprocess.Popen([PROVISION, "logs", "-i", inv, "-F", "-n", "0"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env),
                                stdin=subprocess.DEVNULL)
    # Each step waits for the follower to show it is there, never for a guessed time: its first
    # line (the last 0 lines: one empty line) says it is attached; the new log's first line, that it
    # has followed the relaunch. Sleeps of 3 s raced a loaded machine.
    lines: list[str] = []
    seen = threading.Condition()

    def read():
        for line in follower.stdout:
            with seen:
                lines.append(line.rstrip("\n"))
                seen.notify_all()
        with seen:
            lines.append(None)
            seen.notify_all()

    def wait_line(pred, what):
        with seen:
            assert seen.wait_for(lambda: any(x is None or pred(x) for x in lines), timeout=120), what
            assert None not in lines, (what, follower.stderr.read() if follower.poll() is not None else "")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_line(lambda x: True, "the follower to attach")
    # another argv (an --arg override), so the new log's first line is its own
    proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--restart", "--arg", "mem-fraction-static=0.85",
                         env=env, timeout=240)
    assert proc.returncode == 0, doc
    new_log = record(host)["log"]
    first = host.hostpath(new_log).read_text().splitlines()[0]
    wait_line(lambda x: x == first, "the follower to show the new log's first line")
    follower.send_signal(signal.SIGINT)
    follower.wait(timeout=60)
    err = follower.stderr.read()
    reader.join(10)
    out = "\n".join(x for x in lines if x is not None)
    assert first.startswith("[provision] starting:") and "0.85" in first
    assert first in out.splitlines(), (first, out[-2000:])
    assert f"a new launch: {new_log}" in err
    run("stop", "-i", inv, env=env, check_rc=0)


def test_launch_smoke_on_a_server_already_running_runs_the_smoke(tmp_path, ssh_env, host, env):
    """A smoke asked for is never skipped in silence: the healthy server found running gets it."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    run("launch", "-i", inv, "--poll", "0.5", env=env, check_rc=0, timeout=240)
    proc, doc = run_json("launch", "-i", inv, "--smoke", "--poll", "0.5", env=env, timeout=240)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    row = doc["hosts"][0]
    assert row["verdict"] == "running", row
    assert any(n.startswith("smoke: ") and " tokens in " in n for n in row["notes"]), row
    run("stop", "-i", inv, env=env, check_rc=0)


def test_a_second_server_on_another_port_is_not_a_leftover_of_the_first(tmp_path, ssh_env, host, env):
    """issue 38, item 1: servers are per port. A second server on port 30001 starts beside the one
    on 30000 (before, preflight refused it: "leftover SGLang processes ... provision did not start
    them: kill them", of provision's own healthy server); stopping 30001 leaves 30000 as it was."""
    inv = inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, env=env, check_rc=0)
    run("launch", "-i", inv, "--poll", "0.5", env=env, check_rc=0, timeout=240)
    first = record(host)["pid"]
    second = run("launch", "-i", inv, "--server-port", "30001", "--poll", "0.5", env=env, timeout=240)
    assert second.returncode == 0 and "ready" in second.stdout, (second.stdout, second.stderr)
    assert "leftover" not in second.stdout + second.stderr
    stop = run("stop", "-i", inv, "--server-port", "30001", env=env)
    assert stop.returncode == 0 and "stopped" in stop.stdout, (stop.stdout, stop.stderr)
    assert record(host)["pid"] == first and http(host, "/health") == 200
    run("stop", "-i", inv, env=env, check_rc=0)


def _proc(host, pid: int, what: str) -> list[str]:
    return host.run(f"cat /proc/{pid}/{what}", check=False).stdout.split("\0")


def test_a_restart_without_a_playbook_replays_the_recorded_launch(tmp_path, ssh_env, host, env):
    """issue 38, item 2: a server launched with the user's own playbook (its own model path, flags and
    environment) comes back from `launch --restart` and `reconcile --restart`, neither naming a
    playbook, with the same argv and environment (read from /proc). Before, the restart re-resolved
    the default playbook on the control machine: another model (the hub id), --mem-fraction-static
    0.9, no --enable-metrics and none of the environment."""
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts)},
           "hosts": {host.name: {"address": host.address, "port": host.port}}}
    (tmp_path / "inv.yaml").write_text(json.dumps(inv))
    mine = tmp_path / "my.yaml"
    mine.write_text(json.dumps({"name": "my-kimi", "launch": {
        "args": {"model-path": "/data/models/Kimi-K2.5", "speculative-algorithm": "EAGLE3",
                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3", "tp-size": 8,
                 "trust-remote-code": True, "enable-metrics": True, "mem-fraction-static": 0.85,
                 "cuda-graph-bs": [1, 2, 4, 8]},
        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "1", "PROVISION_STANDIN_WARMUP_SECONDS": "0.2",
                "MY_FLEET_SETTING": "kept"}}}))
    inv_path = str(tmp_path / "inv.yaml")
    run("patch", "-i", inv_path, env=env, check_rc=0)
    run("launch", "-i", inv_path, "--playbook", str(mine), "--poll", "0.5", env=env, check_rc=0, timeout=240)
    first = record(host)["pid"]
    argv, environ = _proc(host, first, "cmdline"), _proc(host, first, "environ")
    assert "--enable-metrics" in argv and "MY_FLEET_SETTING=kept" in environ

    again = run("launch", "-i", inv_path, "--restart", "--poll", "0.5", env=env, timeout=240)
    assert again.returncode == 0, (again.stdout, again.stderr)
    assert "replaying the recorded launch (playbook my-kimi)" in again.stdout + again.stderr
    second = record(host)["pid"]
    assert second != first
    assert _proc(host, second, "cmdline") == argv
    assert "MY_FLEET_SETTING=kept" in _proc(host, second, "environ")

    install_release(host, "0.5.9")  # SGLang re-written under the running server: reconcile restarts it
    proc, doc = run_json("reconcile", "-i", inv_path, "--restart", "--restart-deadline", "120", env=env, timeout=300)
    assert proc.returncode == 0, doc
    third = record(host)["pid"]
    assert third != second and _proc(host, third, "cmdline") == argv

    changed = run("launch", "-i", inv_path, "--restart", "--arg", "mem-fraction-static=0.8", "--poll", "0.5",
                  env=env, timeout=240)
    assert changed.returncode == 0, (changed.stdout, changed.stderr)
    assert "with --arg mem-fraction-static=0.8 over it" in changed.stdout + changed.stderr
    fourth = _proc(host, record(host)["pid"], "cmdline")
    assert fourth[fourth.index("--mem-fraction-static") + 1] == "0.8" and "--enable-metrics" in fourth
    run("stop", "-i", inv_path, env=env, check_rc=0)


def test_stop_bench_logs_and_wait_without_a_port_act_on_the_server_recorded_on_the_host(tmp_path, ssh_env, host,
                                                                                        env):
    """issue 63: a server started on another port (`launch --arg port=8000`; a vLLM profile's 8000) was
    never found by `stop` (`not-running - no server recorded on port 30000`, exit 0, the server still
    running) nor `bench` (`down`). With nothing naming the port they act on the one provision recorded
    there, and say so."""
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--patch", "--arg", "port=8000", "--poll", "0.5", env=env, timeout=300)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", doc
    rec8000 = host.hostpath("/var/lib/provision/server/server-8000.json")
    pid = json.loads(rec8000.read_text())["pid"]
    proc, doc = run_json("bench", "-i", inv, "-n", "2", "--warmup", "0", "--max-new-tokens", "16", env=env, timeout=300)
    row = doc["hosts"][0]
    assert row["verdict"] == "measured" and any("port 8000" in n for n in row["notes"]), row
    proc, doc = run_json("logs", "-i", inv, "-n", "5", env=env, timeout=200)
    row = doc["hosts"][0]
    assert proc.returncode == 0 and "-8000-" in row["detail"], row  # the log of the server on 8000
    assert any("port 8000" in n for n in row["notes"]), row
    proc, doc = run_json("wait", "-i", inv, "--poll", "0.5", env=env, timeout=200)
    row = doc["hosts"][0]
    assert proc.returncode == 0 and row["verdict"] == "ready", row
    assert any("port 8000" in n for n in row["notes"]), row
    proc, doc = run_json("status", "-i", inv, env=env, timeout=200)
    row = doc["hosts"][0]
    assert proc.returncode == 0 and row["data"]["server_port"] == 8000 and row["data"]["server_state"] == "up", row
    assert any("the one provision recorded on this host, port 8000" in n for n in row["notes"]), row
    proc, doc = run_json("stop", "-i", inv, env=env, timeout=200)
    row = doc["hosts"][0]
    assert proc.returncode == 0 and row["verdict"] == "stopped", row
    assert any("the one provision recorded on this host, port 8000" in n for n in row["notes"]), row
    assert host.run(f"kill -0 {pid}", check=False).returncode != 0  # the server is gone
    # nothing recorded live anywhere now: as before, nothing to stop on the default port
    proc, doc = run_json("stop", "-i", inv, env=env, timeout=200)
    assert doc["hosts"][0]["verdict"] == "not-running", doc


def test_a_forced_restart_that_dies_says_the_old_server_was_stopped_and_the_replay_names_its_arguments(
        tmp_path, ssh_env, host, env):
    """issue 63: `launch --restart --force --arg mem-fraction-statc=0.8` (a typo preflight refused)
    stops the healthy server and the new one dies; the row said neither. It says both now, and the
    next `launch --restart` replays the last launch that reached ready, not the dead one's typo,
    and says so, naming it."""
    inv = inventory(tmp_path, ssh_env, host)
    run("launch", "-i", inv, "--patch", "--poll", "0.5", env=env, check_rc=0, timeout=240)
    proc, doc = run_json("launch", "-i", inv, "--restart", "--force", "--arg", "mem-fraction-statc=0.8",
                         "--poll", "0.5", "--deadline", "60", env=env, timeout=240)
    row = doc["hosts"][0]
    print(f"\nforced: {row['verdict']}: {row['detail']}")
    assert row["verdict"] in ("crashed", "failed"), row
    assert "the server it replaced was stopped first" in row["detail"] and "--force" in row["detail"], row
    proc, doc = run_json("launch", "-i", inv, "--restart", "--poll", "0.5", env=env, timeout=240)
    row = doc["hosts"][0]
    assert proc.returncode == 0 and row["verdict"] == "ready", row
    said = " ".join(row["notes"])
    assert "--arg mem-fraction-statc=0.8) never answered ready: its record is not replayed" in said, said
    assert "replaying the last good launch" in said, said
    rec = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
    assert "mem-fraction-statc" not in " ".join(rec["argv"]) and "mem-fraction-statc" not in rec["overrides"], rec
    run("stop", "-i", inv, env=env, check_rc=0, timeout=200)
