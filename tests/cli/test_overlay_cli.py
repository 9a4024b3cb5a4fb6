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
        assert "preflight ok: overlay staged in /var/lib/provision/overlay/" in proc.stderr, proc.stderr
        assert "import not verifiable here" in proc.stderr  # no torch on this host: checked statically
        # the stand-in really called the EAGLE-3 methods on the overlay's class (no scheduler crash)
        log = run("logs", "-i", inv, check_rc=0).stdout
        assert "Capture cuda graph end" in log and "Scheduler hit an exception" not in log
        st = run("status", "-i", inv, "--format", "lines")
        assert "fix: overlay" in st.stdout, st.stdout
        run("stop", "-i", inv, check_rc=0)
    assert sha(host, kimi) == before
    staged = host.run("cat /var/lib/provision/overlay/*/overlay.env").stdout
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay" in staged


def test_patch_overlay_prints_the_environment_a_server_started_by_hand_needs(tmp_path, ssh_env, host):
    inv = inventory(tmp_path, ssh_env, host)
    kimi = f"{host.sglang_dir}/{KIMI}"
    before = sha(host, kimi)
    proc, doc = run_json("patch", "-i", inv, "--overlay")
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["verdict"] == "staged", proc.stdout
    lines = r["data"]["env_lines"]
    assert lines[0] == "SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay"
    assert lines[1].startswith("PYTHONPATH=/var/lib/provision/overlay/")
    assert any("compiled, not imported (--verify-import" in n for n in r["notes"])  # nothing of it runs unasked
    assert any("/var/lib/provision is closed to other users" in n for n in r["notes"]), r["notes"]
    again = run("patch", "-i", inv, "--overlay", check_rc=0)
    assert "unchanged" in again.stdout and "environment: SGLANG_EXTERNAL_MODEL_PACKAGE=provision_overlay" in again.stdout
    assert sha(host, kimi) == before
    st, sdoc = run_json("status", "-i", inv)
    assert st.returncode == 0 and sdoc["hosts"][0]["verdict"] == "overlay", st.stdout

    # the user's own start, with exactly those two lines: EAGLE-3 works, nothing was edited
    host.run(f"env {' '.join(lines)} PROVISION_STANDIN_LOAD_SECONDS=1 setsid {host.python} -m sglang.launch_server "
             "--model-path /data/models/Kimi-K2.5 --speculative-algorithm EAGLE3 --speculative-draft-model-path "
             "/data/models/Kimi-K25-eagle3 > /tmp/own.log 2>&1 < /dev/null & echo $! > /tmp/own.pid")
    try:
        out = host.run("for i in $(seq 200); do grep -q 'fired up' /tmp/own.log && break; "
                       "grep -q 'Scheduler hit' /tmp/own.log && break; sleep 0.2; done; cat /tmp/own.log",
                       timeout=90).stdout
        assert "The server is fired up and ready to roll!" in out and "Scheduler hit an exception" not in out, out
        # status tells which fix that server (not started by provision) uses, from its environment
        st = run("status", "-i", inv, "--format", "lines").stdout
        assert "up; fix: overlay" in st, st
    finally:
        host.run("kill -TERM -$(cat /tmp/own.pid); sleep 1", check=False)

    gone, gdoc = run_json("unpatch", "-i", inv, "--overlay")
    assert gone.returncode == 0 and gdoc["hosts"][0]["verdict"] == "removed"
    assert host.run("ls /var/lib/provision/overlay", check=False).stdout.strip() == ""
    assert run("status", "-i", inv).returncode == 4  # missing again: no overlay, file untouched


def _playbook(tmp_path, params: str | None = None, env: dict | None = None) -> str:
    """The shipped Kimi-K2.5 playbook, with another first-method parameter list or launch env."""
    import yaml

    from provision.config.playbook import PACKAGE_PLAYBOOKS

    pb = yaml.safe_load((PACKAGE_PLAYBOOKS / "kimi-k25-eagle3.yaml").read_text())
    if params:
        pb["patch"]["methods"][0]["params"] = params
    if env:
        pb["launch"]["env"] = env
    pb["launch"]["args"]["model-path"] = "/data/models/Kimi-K2.5"
    pb["launch"]["args"]["speculative-draft-model-path"] = "/data/models/Kimi-K25-eagle3"
    path = tmp_path / "kimi-overlay.yaml"
    path.write_text(yaml.safe_dump(pb))
    return str(path)


def test_broken_overlay_is_reported_within_seconds_and_the_server_stopped(tmp_path, ssh_env, host):
    # A default naming a constant of kimi_k25.py's own module: fine inside the edited file, a
    # NameError in the overlay's module. The static check passes it, the stand-in's import (as
    # SGLang's registry) skips the module: without the crash diagnosis the load would run 60 s first.
    pb = _playbook(tmp_path, params="self, layer_ids=None, limit=KIMIV_VT_INFER_MAX_PATCH_NUM")
    inv = inventory(tmp_path, ssh_env, host, env={"PROVISION_STANDIN_LOAD_SECONDS": "60"})
    t0 = time.monotonic()
    proc, doc = run_json("launch", "-i", inv, "--playbook", pb, "--overlay", "--poll", "0.5", timeout=120)
    took = time.monotonic() - t0
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "crashed", proc.stdout
    assert r["data"]["crash_kind"] == "overlay-import"
    assert "provision_overlay.kimi_k25_eagle3" in r["detail"] and "KIMIV_VT_INFER_MAX_PATCH_NUM" in r["detail"]
    assert "the server was stopped at once" in r["detail"]
    assert took < 20, took
    assert "Load weight end" not in (r["data"].get("log_tail") or "")
    ps = host.run("ps -eo args=").stdout
    assert "launch_server" not in ps and "sglang::" not in ps, ps


def test_native_release_gets_no_overlay_and_launch_says_so(tmp_path, ssh_env, sandbox_factory):
    new = sandbox_factory.host("ovl10", sglang="0.5.10", layout="venv")
    try:
        inv = inventory(tmp_path, ssh_env, new)
        proc = run("launch", "-i", inv, "--overlay", "--poll", "0.5", "--format", "lines", timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "has every method natively: no overlay needed, the server starts without one" in proc.stdout
        st = run("status", "-i", inv, "--format", "lines")
        assert "fix: native" in st.stdout, st.stdout
        assert new.run("ls /var/lib/provision/overlay", check=False).stdout.strip() == ""
        assert "native" in run("patch", "-i", inv, "--overlay", check_rc=0).stdout
        run("stop", "-i", inv, check_rc=0)
    finally:
        sandbox_factory.remove(new)


def test_profile_owning_the_variable_is_refused_and_its_pythonpath_kept_after_ours(tmp_path, ssh_env, host):
    theirs = _playbook(tmp_path, env={"SGLANG_EXTERNAL_MODEL_PACKAGE": "acme_models"})
    inv = inventory(tmp_path, ssh_env, host)
    proc, doc = run_json("launch", "-i", inv, "--playbook", theirs, "--overlay", "--poll", "0.5")
    r = doc["hosts"][0]
    assert proc.returncode == 3 and r["verdict"] == "refused"
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=acme_models" in r["detail"] and "will not replace yours" in r["detail"]

    keep = _playbook(tmp_path, env={"PYTHONPATH": "/opt/acme"})
    proc, doc = run_json("launch", "-i", inv, "--playbook", keep, "--overlay", "--poll", "0.5", timeout=240)
    assert proc.returncode == 0, proc.stdout
    pid = doc["hosts"][0]["data"]["pid"]
    env = dict(kv.split("=", 1) for kv in host.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
               if "=" in kv)
    root = env["PYTHONPATH"].split(":")[0]
    assert root.startswith("/var/lib/provision/overlay/") and env["PYTHONPATH"] == f"{root}:/opt/acme"
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "provision_overlay"
    run("stop", "-i", inv, "--playbook", keep, check_rc=0)


def test_overlay_is_refused_below_0_5_6_naming_the_version(tmp_path, ssh_env, sandbox_factory):
    old = sandbox_factory.host("ovl055", sglang="0.5.5.post3", layout="venv")
    try:
        # 0.5.5.post3 has no kimi_k25.py; its KimiVL wrapper has the same EAGLE-3 gap
        inv = inventory(tmp_path, ssh_env, old, spec="kimi-vl-eagle3")
        proc, doc = run_json("patch", "-i", inv, "--overlay")
        r = doc["hosts"][0]
        assert proc.returncode == 3 and r["verdict"] == "failed"
        assert r["detail"] == ("overlay mode needs SGLang 0.5.6 or later: SGLang 0.5.5.post3 does not read "
                               "SGLANG_EXTERNAL_MODEL_PACKAGE; use `provision patch` (edit the file) instead")
        assert old.run("ls /var/lib/provision/overlay", check=False).stdout.strip() == ""
    finally:
        sandbox_factory.remove(old)


def test_reconcile_keeps_the_overlay_current_and_removes_it_once_native(tmp_path, ssh_env, sandbox_factory):
    from tests.cli.test_fleet_cli import install_release

    h = sandbox_factory.host("ovlrec", sglang="0.5.9", layout="venv")
    try:
        inv = inventory(tmp_path, ssh_env, h)
        kimi = f"{h.sglang_dir}/{KIMI}"
        before = sha(h, kimi)
        run("patch", "-i", inv, "--overlay", check_rc=0)
        mod = "/var/lib/provision/overlay/*/provision_overlay/kimi_k25_eagle3.py"
        proc, doc = run_json("reconcile", "-i", inv)
        r = doc["hosts"][0]
        assert proc.returncode == 0 and r["verdict"] == "unchanged" and "overlay mode" in r["detail"], proc.stdout
        assert sha(h, kimi) == before   # overlay mode: never re-patched into the file

        # a server runs with the overlay when the spec changes
        proc, doc = run_json("launch", "-i", inv, "--overlay", "--poll", "0.5", timeout=240)
        assert proc.returncode == 0, proc.stdout
        pid = doc["hosts"][0]["data"]["pid"]

        # the spec changed: the overlay is regenerated (check first: says so, writes nothing)
        changed = _playbook(tmp_path, params="self, layer_ids=None, **kwargs")
        old_text = h.run(f"cat {mod}").stdout
        proc, doc = run_json("reconcile", "-i", inv, "--playbook", changed, "--check")
        assert proc.returncode == 4 and doc["hosts"][0]["verdict"] == "staged"
        assert h.run(f"cat {mod}").stdout == old_text
        proc, doc = run_json("reconcile", "-i", inv, "--playbook", changed, "--restart")
        r = doc["hosts"][0]
        assert proc.returncode == 0 and r["verdict"] == "staged" and "regenerated" in r["detail"], proc.stdout
        assert "def set_eagle3_layers_to_capture(self, layer_ids=None, **kwargs):" in h.run(f"cat {mod}").stdout
        # ... and the running server, which imported the old one, was restarted in overlay mode
        assert r["data"]["restart"]["verdict"] == "restarted", r
        st = run("status", "-i", inv, "--playbook", changed, "--format", "lines").stdout
        assert "fix: overlay" in st and f"pid {pid} " not in st, st
        run("stop", "-i", inv, check_rc=0)
        st, sdoc = run_json("status", "-i", inv, "--playbook", changed)
        assert st.returncode == 0 and sdoc["hosts"][0]["verdict"] == "overlay"
        assert sha(h, kimi) == before

        # an upgrade to a release with the methods natively: the overlay goes
        install_release(h, "0.5.10")
        proc, doc = run_json("reconcile", "-i", inv, "--playbook", changed)
        r = doc["hosts"][0]
        assert proc.returncode == 0 and r["verdict"] == "removed" and "native" in r["detail"], proc.stdout
        assert h.run("ls /var/lib/provision/overlay", check=False).stdout.strip() == ""
        proc, doc = run_json("reconcile", "-i", inv, "--playbook", changed)
        assert doc["hosts"][0]["verdict"] == "native"
    finally:
        sandbox_factory.remove(h)


def test_where_torch_imports_the_overlay_is_imported_as_the_server_would(tmp_path, ssh_env, host):
    # A host whose interpreter finds torch: with --verify-import (asked: importing it runs the spec's
    # code) the overlay module is really imported (with the server's environment) instead of only
    # checked statically. Here torch is an empty package and SGLang's own imports then fail on it:
    # the import check reports that and refuses. Without --verify-import nothing is imported (issue 60).
    torch = f"{host.site_packages}/torch"
    host.run(f"mkdir -p {torch} && touch {torch}/__init__.py")
    try:
        inv = inventory(tmp_path, ssh_env, host)
        proc, doc = run_json("patch", "-i", inv, "--overlay")
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "staged", proc.stdout
        assert "does not import" not in proc.stdout
        proc, doc = run_json("patch", "-i", inv, "--overlay", "--verify-import")
        r = doc["hosts"][0]
        assert proc.returncode == 3 and r["verdict"] == "failed", proc.stdout
        assert "provision_overlay.kimi_k25_eagle3 does not import: AttributeError: module 'torch' has no attribute" \
            in r["detail"], r["detail"]
        proc, doc = run_json("launch", "-i", inv, "--overlay", "--poll", "0.5")
        r = doc["hosts"][0]
        assert proc.returncode == 3 and r["verdict"] == "refused" and "is broken" in r["detail"], proc.stdout
        assert "launch_server" not in host.run("ps -eo args=").stdout
    finally:
        host.run(f"rm -rf {torch}")


def test_a_source_checkout_keeps_its_own_pythonpath_after_the_overlay(tmp_path, ssh_env, sandbox_factory):
    src = sandbox_factory.host("ovlsrc", sglang="0.5.9", layout="source")
    try:
        inv = inventory(tmp_path, ssh_env, src)
        kimi = f"{src.sglang_dir}/{KIMI}"
        before = sha(src, kimi)
        proc, doc = run_json("launch", "-i", inv, "--overlay", "--poll", "0.5", timeout=240)
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
        pid = doc["hosts"][0]["data"]["pid"]
        env = dict(kv.split("=", 1) for kv in src.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
                   if "=" in kv)
        root, *rest = env["PYTHONPATH"].split(":")
        assert root.startswith("/var/lib/provision/overlay/") and rest == [src.sglang_dir.rsplit("/", 1)[0]]
        run("stop", "-i", inv, check_rc=0)
        assert sha(src, kimi) == before
    finally:
        sandbox_factory.remove(src)
