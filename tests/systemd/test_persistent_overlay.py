"""Overlay mode on a real systemd (a systemd-booted host, SGLang 0.5.9 source checkout):
`launch --overlay --persistent`, a user's own unit with `EnvironmentFile=` the staged
`overlay.env`, and `reconcile` retiring an overlay that a persistent unit still names.

The stand-in honours SGLANG_EXTERNAL_MODEL_PACKAGE as 0.5.9's registry does and crashes with
EAGLE-3 on exactly when the methods are missing: a healthy server proves the overlay was used.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from provision.host.ops.server import RESTART_SEC
from tests.cli.helpers import KIMI, run, run_json
from tests.systemd.test_persistent import UNIT, inventory, record, unit_props

pytestmark = pytest.mark.ssh

OWN_UNIT = "my-sglang.service"


def sha(host, path) -> str:
    return hashlib.sha256(host.hostpath(path).read_bytes()).hexdigest()


def environ(host, pid) -> dict:
    out = host.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
    return dict(kv.split("=", 1) for kv in out if "=" in kv)


def assert_on_overlay(host, pid) -> str:
    """The server `pid` runs with our package and the overlay first on PYTHONPATH; returns the root."""
    env = environ(host, pid)
    root = env["PYTHONPATH"].split(":")[0]
    assert env.get("SGLANG_EXTERNAL_MODEL_PACKAGE") == "provision_overlay", env
    assert root.startswith("/var/lib/provision/overlay/"), env["PYTHONPATH"]
    assert host.hostpath(f"{root}/provision_overlay/kimi_k25_eagle3.py").is_file()
    return root


def wait_restarted(host, unit=UNIT, restarts=1):
    deadline = time.monotonic() + RESTART_SEC + 30
    props: dict = {}
    while time.monotonic() < deadline:
        props = unit_props_of(host, unit, "NRestarts", "SubState")
        if int(props["NRestarts"]) >= restarts and props["SubState"] == "running":
            return
        time.sleep(0.5)
    pytest.fail(f"systemd did not restart {unit}: {props}\n" + host.run(
        f"journalctl -u {unit} -o cat --no-pager | tail -20", check=False).stdout)


def unit_props_of(host, unit, *props) -> dict:
    if unit == UNIT:
        return unit_props(host, *props)
    out = host.run(f"systemctl show -p {','.join(props)} {unit}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def launch_overlay(inv):
    return run_json("launch", "-i", inv, "--persistent", "--overlay", "--poll", "0.5", "--deadline", "120",
                    timeout=240)


def test_persistent_overlay_server_runs_on_the_overlay_and_systemd_brings_it_back_on_it(
        tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    kimi = f"{host.sglang_dir}/{KIMI}"
    before = sha(host, kimi)
    proc, doc = launch_overlay(inv)
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["verdict"] == "ready", proc.stdout + proc.stderr
    assert "speculative EAGLE3" in r["detail"]
    assert "preflight ok: overlay staged in /var/lib/provision/overlay/" in proc.stderr, proc.stderr
    assert host.run(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
    first = record(host)["pid"]
    root = assert_on_overlay(host, first)
    # a checkout: its own PYTHONPATH (where sglang is) kept after the overlay
    assert environ(host, first)["PYTHONPATH"].split(":")[1:] == [host.sglang_dir.rsplit("/", 1)[0]]
    # nothing of the overlay in the unit (the spec the watcher reads holds the environment)
    assert "provision_overlay" not in host.hostpath(f"/etc/systemd/system/{UNIT}").read_text()
    log = run("logs", "-i", inv, check_rc=0).stdout
    assert "Capture cuda graph end" in log and "Scheduler hit an exception" not in log
    st = run("status", "-i", inv, "--format", "lines").stdout
    assert "fix: overlay" in st, st

    # the server dies: systemd's restart comes back on the same overlay and reaches ready again
    host.run(f"kill -KILL {first}")
    wait_restarted(host)
    proc, doc = run_json("wait", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    second = record(host)["pid"]
    assert second != first and assert_on_overlay(host, second) == root
    log = run("logs", "-i", inv, check_rc=0).stdout  # this start-up's log
    assert "Capture cuda graph end" in log and "Scheduler hit an exception" not in log
    st_proc, sdoc = run_json("status", "-i", inv)
    h = sdoc["hosts"][0]
    assert st_proc.returncode == 0 and h["verdict"] == "overlay", st_proc.stdout
    assert h["data"]["persistent"]["restarts"] == 1
    st = run("status", "-i", inv, "--format", "lines").stdout
    assert "fix: overlay" in st and "1 restart by systemd" in st, st
    run("stop", "-i", inv, check_rc=0)
    assert sha(host, kimi) == before


def test_patch_overlay_env_file_starts_a_users_own_unit_with_eagle3(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    kimi = f"{host.sglang_dir}/{KIMI}"
    before = sha(host, kimi)
    proc, doc = run_json("patch", "-i", inv, "--overlay")
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["verdict"] == "staged", proc.stdout
    root = r["data"]["overlay"]["root"]
    assert any(f"EnvironmentFile={root}/overlay.env" in n for n in r["notes"]), r["notes"]
    # The user's unit, as the README says: what it had before for a source checkout (python3
    # and the checkout on PYTHONPATH), SGLang's flags, and the staged environment file. systemd
    # lets EnvironmentFile= replace Environment='s PYTHONPATH: the file must keep the checkout.
    checkout = host.sglang_dir.rsplit("/", 1)[0]
    unit = f"""[Unit]
Description=my SGLang server

[Service]
Environment=PROVISION_STANDIN_LOAD_SECONDS=1 PYTHONPATH={checkout}
EnvironmentFile={root}/overlay.env
ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /data/models/Kimi-K2.5 \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path /data/models/Kimi-K25-eagle3
StandardOutput=append:/root/my-sglang.log
StandardError=append:/root/my-sglang.log
Restart=on-failure
RestartSec=1
"""
    host.hostpath(f"/etc/systemd/system/{OWN_UNIT}").write_text(unit)
    try:
        verify = host.run(f"systemd-analyze verify /etc/systemd/system/{OWN_UNIT}", check=False)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        host.run(f"systemctl daemon-reload && systemctl start {OWN_UNIT}")
        out = host.run("for i in $(seq 300); do grep -q 'fired up' /root/my-sglang.log && break; "
                       "grep -q 'Scheduler hit\\|Error' /root/my-sglang.log && break; sleep 0.2; done; "
                       "cat /root/my-sglang.log", timeout=90).stdout
        assert "The server is fired up and ready to roll!" in out and "Scheduler hit an exception" not in out, out
        pid = int(unit_props_of(host, OWN_UNIT, "MainPID")["MainPID"])
        assert_on_overlay(host, pid)
        assert environ(host, pid)["PYTHONPATH"] == f"{root}:{checkout}"
        st = run("status", "-i", inv, "--format", "lines").stdout
        assert "up; fix: overlay" in st, st
        assert unit_props_of(host, OWN_UNIT, "NRestarts")["NRestarts"] == "0"
    finally:
        host.run(f"systemctl stop {OWN_UNIT}; rm -f /etc/systemd/system/{OWN_UNIT} /root/my-sglang.log; "
                 "systemctl daemon-reload; systemctl reset-failed", check=False)
    assert sha(host, kimi) == before


def test_reconcile_keeps_an_empty_overlay_a_persistent_unit_names_and_systemd_restarts_it(
        tmp_path, ssh_env, systemd_host):
    from tests.cli.test_fleet_cli import install_release

    host = systemd_host
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = launch_overlay(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    root = assert_on_overlay(host, record(host)["pid"])

    # An upgrade to a release with the methods natively (`git checkout v0.5.10`), and the server
    # dies: reconcile runs while systemd waits RestartSec to start it again, with the unit's old
    # environment. No process names the overlay now; the unit's saved spec does.
    install_release(host, "0.5.10")
    host.run(f"kill -KILL {record(host)['pid']}")
    deadline = time.monotonic() + RESTART_SEC
    while unit_props(host, "SubState")["SubState"] != "auto-restart" and time.monotonic() < deadline:
        time.sleep(0.1)
    proc, doc = run_json("reconcile", "-i", inv)
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["verdict"] == "removed" and "native" in r["detail"], proc.stdout
    notes = " ".join(r.get("notes") or []) + r["detail"]
    assert "an empty provision_overlay package stays" in notes, r
    assert "the persistent server of server-30000.spec.json" in notes, r
    assert host.run(f"ls {root}/provision_overlay").stdout.split() == ["__init__.py"]

    # systemd's restart, with the old environment, comes up (an empty package, not a missing one)
    wait_restarted(host)
    proc, doc = run_json("wait", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    log = run("logs", "-i", inv, check_rc=0).stdout
    assert "Capture cuda graph end" in log and "Ignore import error" not in log, log
    assert environ(host, record(host)["pid"])["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "provision_overlay"
    proc, doc = run_json("reconcile", "-i", inv)  # still named: still kept
    assert proc.returncode == 0 and host.hostpath(f"{root}/provision_overlay/__init__.py").is_file(), proc.stdout
    # status says what still names it and what to do, not a `reconcile` that would keep it again
    st = run("status", "-i", inv, "--format", "lines", check_rc=0).stdout
    assert "is no longer needed" in st and "the persistent server of server-30000.spec.json still names it" in st, st
    assert ("restart that server without the overlay (`provision launch --restart`), then `provision reconcile` "
            "removes it") in st, st

    # doing so: the unit's server restarted on the native release, then the overlay goes for good
    proc, doc = run_json("launch", "-i", inv, "--persistent", "--restart", "--poll", "0.5", "--deadline", "120",
                         timeout=240)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in environ(host, record(host)["pid"])
    proc, doc = run_json("reconcile", "-i", inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "removed", proc.stdout
    assert host.run("ls /var/lib/provision/overlay", check=False).stdout.strip() == ""
    st = run("status", "-i", inv, "--format", "lines", check_rc=0).stdout
    assert "fix: native" in st and "/var/lib/provision/overlay" not in st, st
    run("stop", "-i", inv, check_rc=0)
