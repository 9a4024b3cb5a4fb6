"""The persistent server's unit (pure) and the watcher's exit status, which systemd's
Restart=on-failure acts on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from provision.host.ops.server import RESTART_SEC, WATCHER, render_server_unit, systemd_quote


def _watch(tmp_path, argv, stop=False):
    prog = tmp_path / "watcher.py"
    prog.write_text(WATCHER)
    spec = {"argv": argv, "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "cwd": str(tmp_path),
            "log": str(tmp_path / "log"), "pidfile": str(tmp_path / "pid"), "exitfile": str(tmp_path / "exit")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    w = subprocess.Popen([sys.executable, str(prog), str(tmp_path / "spec.json")])
    if stop:
        deadline = time.monotonic() + 10
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        w.send_signal(signal.SIGTERM)
    rc = w.wait(timeout=30)
    return rc, int((tmp_path / "exit").read_text())


@pytest.mark.parametrize("argv,status,recorded", [
    (["/bin/sh", "-c", "exit 0"], 0, 0),
    (["/bin/sh", "-c", "exit 3"], 3, 3),
    (["/bin/sh", "-c", "kill -KILL $$"], 137, -9),   # SGLang's own death after a scheduler failed
    (["/bin/sh", "-c", "kill -SEGV $$"], 139, -11),
])
def test_the_watcher_exits_with_the_servers_failure(tmp_path, argv, status, recorded):
    assert _watch(tmp_path, argv) == (status, recorded)


def test_a_stop_asked_for_ends_in_success(tmp_path):
    # systemctl stop sends SIGTERM to the watcher, which forwards it: not a failure to restart.
    assert _watch(tmp_path, ["sleep", "30"], stop=True) == (0, -signal.SIGTERM)


def test_unit_runs_the_watcher_file_on_one_line_and_holds_no_secret():
    unit = render_server_unit(30000, "/usr/bin/python3", "/var/lib/provision/server/server-30000.watcher.py",
                              "/var/lib/provision/server/server-30000.spec.json",
                              "/var/log/provision/sglang-30000-20260101-000000.log", 30)
    lines = unit.splitlines()
    assert "ExecStart=/usr/bin/python3 /var/lib/provision/server/server-30000.watcher.py " \
           "/var/lib/provision/server/server-30000.spec.json" in lines
    assert "Restart=on-failure" in lines and f"RestartSec={RESTART_SEC}" in lines
    assert "WantedBy=multi-user.target" in lines and "KillMode=mixed" in lines
    assert not any(line.startswith("Environment") for line in lines)


def test_systemd_quote():
    assert systemd_quote("/usr/bin/python3") == "/usr/bin/python3"
    assert systemd_quote("/srv/my state/x.py") == '"/srv/my state/x.py"'
    assert systemd_quote('a"b\\c%d$e') == '"a\\"b\\\\c%%d$$e"'
    assert systemd_quote("") == '""'


def test_a_restart_is_followed_even_when_the_pid_number_comes_back(tmp_path):
    """After a reboot the server can get its old pid number: the start time tells them apart."""
    from provision.host.lib.procfs import starttime
    from provision.host.ops.backends import record
    from provision.host.ops.backends.systemd import START_MARK, SystemdBackend, unit_name

    req = {"state_dir": str(tmp_path)}
    root = record.state_root(req)
    os.makedirs(root)
    log = tmp_path / "server.log"
    log.write_bytes(b"first start-up\n" + START_MARK.encode() + b"\nsecond start-up\n")
    with open(os.path.join(root, "server-30000.pid"), "w") as fh:
        fh.write(str(os.getpid()))  # a live process with this record's pid number...
    rec = {"unit": unit_name(30000, "sglang"), "pid": os.getpid(), "starttime": "1", "log": str(log),
           "port": 30000, "started_at": 0.0}  # ...but another start time: not the process we recorded
    new = SystemdBackend().refresh(req, rec)
    assert new["starttime"] == starttime(os.getpid()) and new["restarts"] == 1
    assert new["log_offset"] == len(b"first start-up\n")
    assert record.read_record(req, 30000) == new
    assert SystemdBackend().refresh(req, new) == new  # the same process: nothing to follow


def test_a_persistent_units_name_and_description_say_which_engine_runs_there():
    from provision.host.ops.backends.systemd import unit_name
    from provision.host.ops.backends.transient import unit_name as transient_name

    assert unit_name(30000, "sglang") == "provision-sglang-30000.service"  # the name SGLang's units always had
    assert unit_name(8000, "vllm") == "provision-vllm-8000.service"
    assert transient_name(8000, 17, "vllm") == "provision-vllm-8000-run17.service"
    unit = render_server_unit(8000, "/usr/bin/python3", "/w.py", "/s.json", "/l.log", 30, "vLLM")
    assert "Description=vLLM on port 8000 (managed by provision)" in unit.splitlines()


@pytest.mark.parametrize("unit,back", [
    ({"ActiveState": "activating", "SubState": "auto-restart", "Result": "exit-code"}, True),
    ({"ActiveState": "activating", "SubState": "start-pre", "Result": "success"}, True),
    ({"ActiveState": "active", "SubState": "running", "MainPID": 99}, True),   # the watcher, before the pid file
    ({"ActiveState": "active", "SubState": "running", "MainPID": 0}, False),
    # the server died; systemd ends the rest of its tree before Restart=on-failure (seen lasting 20 s
    # with vLLM's EngineCore and Worker on a cgroup-v1 host)
    ({"ActiveState": "deactivating", "SubState": "stop-sigkill", "Result": "exit-code", "MainPID": 0}, True),
    ({"ActiveState": "deactivating", "SubState": "final-sigterm", "Result": "signal"}, True),
    ({"ActiveState": "deactivating", "SubState": "stop-sigterm", "Result": "success"}, False),  # systemctl stop
    ({"ActiveState": "failed", "SubState": "failed", "Result": "start-limit-hit"}, False),
    ({"ActiveState": "inactive", "SubState": "dead", "Result": "success"}, False),
    ({}, False),
])
def test_a_persistent_server_is_coming_back_only_while_systemd_brings_it_back(unit, back):
    from provision.host.ops.backends.systemd import coming_back

    assert coming_back(unit) is back


@pytest.mark.parametrize("hard, nofile", [(1048576, "1048576"), (524288, "524288"), (4096, "4096"),
                                          (-1, "infinity"), (2 ** 63 - 1, "infinity")])
def test_a_server_unit_gets_the_limits_a_gpu_server_needs(hard, nofile):
    """systemd's service defaults (8 MiB of locked memory, 1024 open files, TasksMax) would cap what a
    server started from a shell had: NCCL over InfiniBand locks memory without bound."""
    from provision.host.ops.backends.systemctl import server_limits

    limits = server_limits(hard)
    assert limits == {"LimitMEMLOCK": "infinity", "LimitNOFILE": nofile, "TasksMax": "infinity"}
    unit = render_server_unit(8000, "/usr/bin/python3", "/w.py", "/s.json", "/l.log", 30, "vLLM", limits)
    service = unit.split("[Service]", 1)[1].split("[Install]", 1)[0].splitlines()
    assert {"LimitMEMLOCK=infinity", f"LimitNOFILE={nofile}", "TasksMax=infinity"} <= set(service), unit
