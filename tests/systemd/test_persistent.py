"""`launch --persistent`, `stop` and `status` against a real systemd (a systemd-booted host)."""

from __future__ import annotations

import json
import time

import pytest

from provision.host.ops.server import RESTART_SEC
from tests.cli.helpers import run, run_json

pytestmark = pytest.mark.ssh

UNIT = "provision-sglang-30000.service"
SECRET = "canary-key-0d7f3e"


def inventory(tmp_path, ssh_env, host):
    return ssh_env.inventory(tmp_path / "inv.yaml", [host])


def launch(inv, *extra, env=None):
    return run_json("launch", "-i", inv, "--persistent", "--patch", "--poll", "0.5", "--deadline", "120", *extra,
                    env=env, timeout=240)


def unit_props(host, *props) -> dict:
    out = host.run(f"systemctl show -p {','.join(props)} {UNIT}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def server_procs(host) -> list[str]:
    """Every process of the server's tree in the host: the watcher and the server's ranks."""
    out = host.run("ps -eo pid=,args=").stdout.splitlines()
    return [line for line in out if "sglang.launch_server" in line or ".watcher.py" in line]


def record(host) -> dict:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())


def assert_server_limits(ssh_env, host, unit: str, pid: int) -> None:
    """What a user checks of a GPU server's unit: `systemctl show` has locked memory and tasks
    unlimited and open files at an SSH session's hard limit (systemd's defaults: 8 MiB, TasksMax, soft
    1024); the server's own /proc/PID/limits has soft = hard = the most the host allows (this machine
    grants no CAP_SYS_RESOURCE: systemd raises memlock only as far as the session could, 8 MiB here)."""
    import subprocess

    said = subprocess.run(ssh_env.ssh_argv(host, "ulimit -Hn; ulimit -Hl"), capture_output=True, text=True,
                          timeout=60).stdout.split()
    hard_n, hard_l = said[0], said[1]
    props = dict(line.split("=", 1) for line in host.run(
        f"systemctl show -p LimitMEMLOCK,LimitNOFILE,TasksMax {unit}").stdout.splitlines() if "=" in line)
    big = str(2 ** 64 - 1)  # how systemctl shows "infinity"
    assert props["LimitMEMLOCK"] in ("infinity", big) and props["TasksMax"] in ("infinity", big), props
    assert props["LimitNOFILE"] == (big if hard_n == "unlimited" else hard_n), (props, hard_n)
    limits = host.run(f"cat /proc/{pid}/limits").stdout
    memlock = next(line for line in limits.splitlines() if line.startswith("Max locked memory")).split()[3:5]
    want = "unlimited" if hard_l == "unlimited" else str(int(hard_l) * 1024)
    assert memlock == [want, want], (memlock, hard_l)
    nofile = next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3:5]
    assert nofile == [hard_n, hard_n], (nofile, hard_n)


def test_persistent_unit_verifies_is_enabled_and_keeps_secrets_out(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch(inv, env={"PROVISION_API_KEY": SECRET, "HF_TOKEN": SECRET + "-hf"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["hosts"][0]["verdict"] == "ready"
    path = f"/etc/systemd/system/{UNIT}"
    verify = host.run(f"systemd-analyze verify {path}", check=False)
    assert verify.returncode == 0 and UNIT not in verify.stdout + verify.stderr, verify.stdout + verify.stderr
    unit = host.hostpath(path).read_text()
    exec_start = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert len(exec_start) == 1 and " -c " not in exec_start[0]
    watcher = exec_start[0].split()[1]
    assert watcher.startswith("/var/lib/provision/server/") and watcher.endswith(".watcher.py")
    assert host.run(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
    assert host.hostpath(f"/etc/systemd/system/multi-user.target.wants/{UNIT}").is_symlink()
    assert unit_props(host, "ActiveState")["ActiveState"] == "active"
    # the limits a GPU server needs (systemd's defaults: 8 MiB locked, 1024 files): NCCL over InfiniBand
    assert_server_limits(ssh_env, host, UNIT, record(host)["pid"])
    # The secrets are in 0600 files (HF_TOKEN: the token file the hub reads through HF_TOKEN_PATH;
    # SGLang's --config file: the key), nowhere anyone can read; the spec the watcher reads has neither.
    spec = host.hostpath("/var/lib/provision/server/server-30000.spec.json")
    assert spec.stat().st_mode & 0o777 == 0o600 and SECRET not in spec.read_text()
    token = host.hostpath("/var/lib/provision/server/server-30000.hf_token")
    assert token.stat().st_mode & 0o777 == 0o600 and token.read_text() == SECRET + "-hf"
    config = host.hostpath("/var/lib/provision/server/server-30000.secrets.yaml")
    assert config.stat().st_mode & 0o777 == 0o600 and SECRET in config.read_text()
    shown = host.run(f"systemctl show {UNIT}; systemctl cat {UNIT}; ps -eo args=").stdout
    assert SECRET not in shown and SECRET not in unit
    run("stop", "-i", inv, check_rc=0)


def test_persistent_server_comes_back_after_it_dies_and_wait_follows_it(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch(inv)
    assert doc["hosts"][0]["verdict"] == "ready", proc.stdout
    first = record(host)["pid"]
    host.run(f"kill -KILL {first}")
    deadline = time.monotonic() + RESTART_SEC + 30
    while time.monotonic() < deadline:
        props = unit_props(host, "NRestarts", "ActiveState", "SubState")
        if int(props["NRestarts"]) >= 1 and props["SubState"] == "running":
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"systemd did not restart the server: {props}\n" + host.run(
            f"systemctl list-jobs --no-pager; journalctl -u {UNIT} -o short-monotonic --no-pager | tail -15; "
            "ps -eo pid,stat,args", check=False).stdout)
    proc, doc = run_json("wait", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=240)
    h = doc["hosts"][0]
    assert proc.returncode == 0 and h["verdict"] == "ready", proc.stdout + proc.stderr
    assert record(host)["pid"] != first and record(host)["log_offset"] > 0
    st = run_json("status", "-i", inv)[1]["hosts"][0]
    assert st["data"]["persistent"]["restarts"] == 1
    assert st["data"]["persistent"]["enabled"] == "enabled" and st["data"]["persistent"]["active"] == "active"
    text = run("status", "-i", inv, check_rc=0).stdout
    assert f"persistent: {UNIT} active (running), enabled, 1 restart by systemd" in text
    run("stop", "-i", inv, check_rc=0)


def test_stop_disables_the_unit_and_it_stays_down(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch(inv)
    assert doc["hosts"][0]["verdict"] == "ready", proc.stdout
    assert server_procs(host)
    proc, doc = run_json("stop", "-i", inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "stopped", proc.stdout
    assert "stopped, disabled and removed" in doc["hosts"][0]["detail"]
    assert server_procs(host) == []
    time.sleep(2 * RESTART_SEC + 1)
    assert server_procs(host) == []
    assert unit_props(host, "LoadState")["LoadState"] == "not-found"
    assert not host.hostpath(f"/etc/systemd/system/{UNIT}").exists()
    assert not host.hostpath(f"/etc/systemd/system/multi-user.target.wants/{UNIT}").exists()
    assert not host.hostpath("/var/lib/provision/server/server-30000.spec.json").exists()
    st = run_json("status", "-i", inv)[1]["hosts"][0]
    assert st["data"]["server_state"] == "stopped" and not st["data"]["persistent"]


def test_persistent_server_starts_again_when_the_host_boots(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch(inv)
    assert doc["hosts"][0]["verdict"] == "ready", proc.stdout
    before = record(host)
    host.reboot()
    assert host.run(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
    proc, doc = run_json("wait", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    st = run_json("status", "-i", inv)[1]["hosts"][0]
    assert st["data"]["server_state"].startswith("up") and st["data"]["persistent"]["active"] == "active"
    after = record(host)
    assert after["started_at"] > before["started_at"] and after["log_offset"] > before["log_offset"]
    run("stop", "-i", inv, check_rc=0)


def test_stop_between_a_death_and_the_restart_keeps_it_down(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch(inv)
    assert doc["hosts"][0]["verdict"] == "ready", proc.stdout
    # The window is RestartSec long; on a loaded machine a few `podman exec` can miss it: try again.
    for _ in range(3):
        host.run("kill -KILL $(cat /var/lib/provision/server/server-30000.pid)")
        deadline = time.monotonic() + RESTART_SEC
        while unit_props(host, "SubState")["SubState"] != "auto-restart" and time.monotonic() < deadline:
            time.sleep(0.1)
        st = run_json("status", "-i", inv)[1]["hosts"][0]
        if st["data"]["server_state"] == "restarting (persistent)":
            break
        back = time.monotonic() + RESTART_SEC + 30
        while unit_props(host, "SubState")["SubState"] != "running" and time.monotonic() < back:
            time.sleep(0.2)  # systemd brought it back: kill it again
        time.sleep(1)
    else:
        pytest.fail("never saw the unit between the server's death and its restart: "
                    + host.run(f"systemctl show -p ActiveState,SubState,Result,NRestarts {UNIT}").stdout)
    proc, doc = run_json("stop", "-i", inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "stopped", proc.stdout
    time.sleep(2 * RESTART_SEC + 1)
    assert server_procs(host) == []
    assert unit_props(host, "LoadState")["LoadState"] == "not-found"
