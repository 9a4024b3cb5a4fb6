"""Trust, fourth round (issue 60), over real sshd: what another account can do on a host does not
steer root. A profile's `log_dir:` that another account can write, links planted there at the next
log names: root never writes through them; a host whose answer is garbled: a sentence naming it."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.helpers import run, run_json
from tests.cli.test_server_lifecycle import env, inventory  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def thost_module(sandbox_factory):
    host = sandbox_factory.host("trust4", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(thost_module):
    thost_module.reset()
    yield thost_module
    thost_module.run("pkill -9 -f sglang", check=False)


def test_links_planted_in_a_shared_log_dir_are_never_followed(tmp_path, ssh_env, host, env):
    # /tmp/shared: writable by every account (sticky, as /tmp), the profile's log_dir. Another
    # account planted a link at each log name the next minute could give, pointing at a file root
    # would create or append to.
    host.run("mkdir -p /tmp/shared && chmod 1777 /tmp/shared")
    now = time.time()
    for s in range(-2, 90):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + s))
        for n in ("", "-2"):
            host.run(f"ln -sf /root/pwned-{stamp}{n} /tmp/shared/sglang-30000-{stamp}{n}.log")
    import yaml

    from provision.config.playbook import PACKAGE_PLAYBOOKS

    pb = yaml.safe_load((PACKAGE_PLAYBOOKS / "kimi-k25-eagle3.yaml").read_text())
    pb["launch"]["log_dir"] = "/tmp/shared"
    (tmp_path / "shared-logs.yaml").write_text(yaml.safe_dump(pb))
    inv = inventory(tmp_path, ssh_env, host)
    proc = run("launch", "-i", inv, "--playbook", str(tmp_path / "shared-logs.yaml"), "--patch", "--poll", "0.5",
               "--json", env=env, timeout=300)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    row = json.loads(proc.stdout)["hosts"][0]
    assert proc.returncode == 0 and row["verdict"] == "ready", proc.stdout + proc.stderr
    rec = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
    assert rec["log"].startswith("/tmp/shared/") and rec["log"].endswith("-3.log"), rec["log"]
    listing = host.run("ls -la /root; find /tmp/shared -maxdepth 1 -type f -ls").stdout
    assert "pwned" not in host.run("ls /root").stdout, listing  # no file was created through a link
    assert "The server is fired up" in host.hostpath(rec["log"]).read_text()
    run_json("stop", "-i", inv, "--playbook", str(tmp_path / "shared-logs.yaml"), env=env, timeout=120)
