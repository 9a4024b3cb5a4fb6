"""An agent that is not root on a host where systemd is init (issue 42): `systemd-run` for the
system manager needs root, so its server runs detached (in its own session, under the watcher),
and `--persistent` is refused before anything starts, saying why."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli.helpers import run, run_json

pytestmark = pytest.mark.ssh

USER = "pvagent"


def user_inventory(tmp_path, ssh_env, host) -> str:
    doc = yaml.safe_load(ssh_env.inventory(tmp_path / "root-inv.yaml", [host]).read_text())
    doc["defaults"]["user"] = USER
    doc["defaults"]["sudo"] = False  # the agent itself is not root: its own files, its own server
    doc["hosts"][host.name]["args"] = dict(doc["hosts"][host.name].get("args") or {}, **{"tp-size": 1})
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_non_root_agent_runs_its_server_detached_where_systemd_is_init(tmp_path, ssh_env, systemd_host):
    host = systemd_host
    # the user's own checkout and user site (root's are not readable), its SSH key, nothing else
    host.run(f"id {USER} >/dev/null 2>&1 || useradd -m -s /bin/bash {USER}; usermod -p '*' {USER}; "
             f"mkdir -p /home/{USER}/.ssh /home/{USER}/.local && cp /root/.ssh/authorized_keys /home/{USER}/.ssh/ && "
             f"rm -rf /home/{USER}/sglang && cp -a /root/sglang /home/{USER}/sglang && "
             f"cp -a /root/.local/lib /home/{USER}/.local/ && chown -R {USER}: /home/{USER} && "
             f"chmod 700 /home/{USER}/.ssh")
    inv = user_inventory(tmp_path, ssh_env, host)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = run_json("launch", "-i", inv, "--persistent", "--poll", "0.5", timeout=240)
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused", r
    assert "--persistent writes a unit of the system manager, which needs root" in r["detail"], r
    try:
        proc, doc = run_json("launch", "-i", inv, "--poll", "0.5", "--deadline", "120", timeout=240)
        r = doc["hosts"][0]
        assert proc.returncode == 0 and r["verdict"] == "ready", (r, proc.stderr[-2000:])
        owners = host.run("ps -eo user=,args=").stdout.splitlines()
        assert any(line.split()[0] == USER and "sglang.launch_server" in line for line in owners), owners
        units = host.run("systemctl list-units --all --no-legend 'provision-*'").stdout
        assert "provision-sglang-30000" not in units, units
    finally:
        proc, doc = run_json("stop", "-i", inv, timeout=120)
    assert doc["hosts"][0]["verdict"] == "stopped", doc
    assert "sglang.launch_server" not in host.run("ps -eo args=").stdout
