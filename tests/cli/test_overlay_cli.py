"""Overlay mode over real sshd hosts: `launch --overlay`, `patch --overlay`, status and reconcile.

The stand-in server honours SGLANG_EXTERNAL_MODEL_PACKAGE as the installed release's registry does,
executing the overlay's module with stubbed imports, so whether EAGLE-3 works follows from the
class SGLang would really use.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from tests.cli.helpers import KIMI, run, run_json


@pytest.fixture(scope="module")
def ohost(sandbox_factory):
    host = sandbox_factory.host("ovl1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(ohost):
    ohost.reset()
    ohost.run("rm -rf /var/lib/provision/overlay", check=False)
    return ohost


def inventory(tmp_path, ssh_env, host, env=None, extra=None, spec=None):
    inv = {"defaults": {"user": "root", "identity": str(ssh_env.identity), "known_hosts": str(ssh_env.known_hosts),
                        "args": {"model-path": "/data/models/Kimi-K2.5",
                                 "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"},
                        "env": {"PROVISION_STANDIN_LOAD_SECONDS": "2", **(env or {})}},
           "hosts": {host.name: {"address": host.address, "port": host.port, **(extra or {})}}}
    if spec:
        inv["defaults"]["spec"] = spec
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))  # JSON is YAML
    return str(path)


def sha(host, path) -> str:
    return hashlib.sha256(host.hostpath(path).read_bytes()).hexdigest()


class ReadOnly:
    """The host's site-packages bind-mounted read-only (root ignores mode bits)."""

    def __init__(self, host, path):
        self.host, self.path = host, path

    def __enter__(self):
        self.host.run(f"mount --bind {self.path} {self.path} && mount -o remount,ro,bind {self.path}")
        return self

    def __exit__(self, *exc):
        self.host.run(f"umount {self.path}", check=False)


def test_launch_overlay_on_a_read_only_install_reaches_ready_with_eagle3(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host)
    kimi = f"{host.sglang_dir}/{KIMI}"
    before = sha(host, kimi)
    with ReadOnly(host, host.site_packages):
        assert "Read-only file system" in host.run(f"touch {host.sglang_dir}/x", check=False).stderr
        proc, doc = run_json("launch", "-i", inv, "--overlay", "--poll", "0.5", timeout=240)
        r = doc["hosts"][0]
        assert proc.returncode == 0 and r["verdict"] == "ready", (proc.stdout, proc.stderr)
        assert "speculative EAGLE3" in r["detail"]
        # the stand-in really called the EAGLE-3 methods on the overlay's class (no scheduler crash)
        log = run("logs", "-i", inv, check_rc=0).stdout
        assert "Capture cuda graph end" in log and "Scheduler hit an exception" not in log
        st = run("status", "-i", inv, "--format", "lines")
        assert "fix: overlay" in st.stdout, st.stdout
        run("stop", "-i", inv, check_rc=0)
    assert sha(host, kimi) == before
    staged = host.run("cat /var/lib/provision/overlay/*/overlay.env").stdout
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay" in staged
