"""A persistent server's lifecycle on a real systemd: `reconcile --restart` restarts its unit (which
stays enabled, with its API key), and `launch` in the unit's restart window adopts the unit."""

from __future__ import annotations

import json
import time

import pytest

from provision.host.ops.backends.systemd import RESTART_SEC
from tests.cli.helpers import run, run_json
from tests.cli.test_fleet_cli import install_release
from tests.systemd.test_persistent import assert_server_limits

pytestmark = pytest.mark.ssh

UNIT = "provision-sglang-30000.service"
KEY = "sk-persistent-lifecycle-5e1b"


def unit_props(host, *props) -> dict:
    out = host.run(f"systemctl show -p {','.join(props)} {UNIT}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def record(host) -> dict:
    return json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())


def http(host, path: str) -> int:
    """The HTTP status the server answers `path` with, asked inside the host on the address it binds."""
    code = ("import sys, urllib.request, urllib.error\n"
            "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print(0)\n")
    url = f"http://{record(host)['host']}:30000{path}"
    out = host.run(["python3", "-c", code, url], check=False).stdout.strip()
    return int(out.splitlines()[-1]) if out else 0


def test_reconcile_restart_of_a_persistent_server_restarts_its_unit(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = ssh_env.inventory(tmp_path / "inv.yaml", [host])
    proc, doc = run_json("launch", "-i", inv, "--persistent", "--patch", "--poll", "0.5", "--deadline", "120",
                         env={"PROVISION_API_KEY": KEY}, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    main_pid = unit_props(host, "MainPID")["MainPID"]
    install_release(host, "0.5.9")  # SGLang re-written under the running server
    proc, doc = run_json("reconcile", "-i", inv, "--restart", "--restart-deadline", "120", timeout=300)
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["data"]["restart"]["verdict"] == "restarted", proc.stdout + proc.stderr
    props = unit_props(host, "MainPID", "ActiveState", "SubState", "UnitFileState")
    assert props["UnitFileState"] == "enabled" and props["ActiveState"] == "active", props
    assert props["MainPID"] != main_pid, "the unit was restarted: a new main process"
    rec = record(host)
    assert rec["unit"] == UNIT and rec["backend"] == "systemd"
    assert host.hostpath(f"/etc/systemd/system/{UNIT}").exists()
    assert http(host, "/v1/models") == 401, "the restarted unit's server still requires the key"
    run("stop", "-i", inv, check_rc=0)


def test_launch_in_the_units_restart_window_adopts_the_unit(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = ssh_env.inventory(tmp_path / "inv.yaml", [host])
    proc, doc = run_json("launch", "-i", inv, "--persistent", "--patch", "--poll", "0.5", "--deadline", "120",
                         timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for _ in range(3):  # the window is RestartSec long; a loaded machine can miss it: try again
        host.run("kill -KILL $(cat /var/lib/provision/server/server-30000.pid)", check=False)
        deadline = time.monotonic() + RESTART_SEC
        while unit_props(host, "SubState")["SubState"] != "auto-restart" and time.monotonic() < deadline:
            time.sleep(0.1)
        proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=240)
        if "restart window" in proc.stderr:
            break
        time.sleep(1)
    else:
        pytest.fail("never launched inside the unit's restart window: " + proc.stderr)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    assert f"persistent unit {UNIT} is in systemd's restart window" in proc.stderr
    rec = record(host)
    assert rec["unit"] == UNIT and unit_props(host, "UnitFileState")["UnitFileState"] == "enabled"
    out = host.run("ps -eo args=").stdout
    assert out.count("sglang.launch_server") >= 1 and out.count(".watcher.py") == 1, out
    run("stop", "-i", inv, check_rc=0)


def test_a_plain_launch_runs_in_a_transient_unit_and_stop_ends_its_cgroup(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = ssh_env.inventory(tmp_path / "inv.yaml", [host])
    proc, doc = run_json("launch", "-i", inv, "--patch", "--poll", "0.5", "--deadline", "120", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = record(host)
    unit = rec["cgroup_unit"]
    assert rec["backend"] == "transient" and unit.startswith("provision-sglang-30000-run") and not rec["unit"]
    out = host.run(f"systemctl show -p ActiveState,UnitFileState {unit}").stdout
    assert "ActiveState=active" in out and "UnitFileState=enabled" not in out, out
    pids = [int(line.split()[0]) for line in host.run("ps -eo pid=,args=").stdout.splitlines()
            if "sglang.launch_server" in line]
    assert rec["pid"] in pids
    for pid in pids:  # the server and its ranks are in the unit's cgroup: that is what makes them ours
        assert f"/{unit}\n" in host.run(f"cat /proc/{pid}/cgroup").stdout
    assert_server_limits(ssh_env, host, unit, rec["pid"])  # as a server started from root's shell had them
    proc, doc = run_json("stop", "-i", inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "stopped", proc.stdout
    assert "sglang.launch_server" not in host.run("ps -eo args=").stdout
    assert "LoadState=not-found" in host.run(f"systemctl show -p LoadState {unit}").stdout
