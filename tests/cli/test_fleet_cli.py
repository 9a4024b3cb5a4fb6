"""Fleet runs over real sshd sandbox hosts: patch in parallel, reconcile, history,
restore, the control-machine lock, inventories."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, run, run_json

HAND_PATCH = (b"\n\ndef set_eagle3_layers_to_capture(self, layer_ids=None):\n"
              b"    self.language_model.set_eagle3_layers_to_capture(layer_ids)\n\n"
              b"def get_embed_and_head(self):\n    return self.language_model.get_embed_and_head()\n")


def kimi(host):
    return host.hostpath(os.path.join(host.sglang_dir, KIMI))


def state_json(host):
    return host.hostpath("/var/lib/provision/state.json")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_release(host, version: str) -> None:
    """What `pip install sglang==VERSION` (or a checkout's `git checkout vVERSION`) leaves:
    the release's tree over the host's, dist-info included for venv hosts. Keeps the
    sandbox's launch_server stand-in shim, as `up` installs it."""
    from provision.sandbox import hosts as sb
    from provision.sandbox.wheels import extracted

    src = extracted(version)
    if host.layout == "venv":
        site = host.hostpath(host.site_packages)
        for p in list(site.iterdir()):
            if p.name in ("sglang", "tools") or (p.name.startswith("sglang-") and p.name.endswith(".dist-info")):
                shutil.rmtree(p)
        for p in src.iterdir():
            if not p.name.startswith("."):
                subprocess.run(["cp", "-a", str(p), str(site / p.name)], check=True)
    else:
        pkg = host.hostpath(host.sglang_dir)
        shutil.rmtree(pkg)
        subprocess.run(["cp", "-a", str(src / "sglang"), str(pkg)], check=True)
    pkg = host.hostpath(host.sglang_dir)
    if sb._install_standin(host, pkg) and host.layout == "venv":
        record = host.hostpath(host.site_packages) / sb.dist_info(version).name / "RECORD"
        sb._fix_record(record, "sglang/launch_server.py", sb.LAUNCH_SERVER_SHIM.encode())


@pytest.fixture(scope="module")
def fleet(sandbox_factory):
    """Eight hosts: 0.5.9 checkouts and venvs, a 0.5.10 venv. Built once for the module."""
    from provision.sandbox.hosts import HostSpec

    n = sandbox_factory._count = sandbox_factory._count + 1
    layout = [("src", "0.5.9", "source"), ("src2", "0.5.9", "source"), ("hand", "0.5.9", "source"),
              ("down", "0.5.9", "source"), ("venv", "0.5.9", "venv"), ("venv2", "0.5.9", "venv"),
              ("done", "0.5.9", "venv"), ("new", "0.5.10", "venv")]
    specs = [HostSpec(f"fl{n}-{name}", "auto", ver, lay, sandbox_factory.port) for name, ver, lay in layout]
    hosts = sandbox_factory.up(*specs)
    by = {name: h for (name, _, _), h in zip(layout, hosts)}
    try:
        yield by
    finally:
        sandbox_factory.remove(*hosts)


@pytest.fixture
def hosts(fleet):
    """The module's hosts, as built (files, state dirs, processes, sshd)."""
    for h in fleet.values():
        h.reset()
    return fleet


@pytest.fixture
def env(tmp_path):
    """A private journal and control lock for each test."""
    return {"PROVISION_JOURNAL": str(tmp_path / "journal.jsonl"), "PROVISION_LOCK": str(tmp_path / "reconcile.lock")}


def inv(ssh_env, tmp_path, hosts, name="inv.yaml"):
    return ssh_env.inventory(tmp_path / name, list(hosts))


def verdicts(doc):
    return {h["host"]: h["verdict"] for h in doc["hosts"]}


def journal_lines(env):
    path = env["PROVISION_JOURNAL"]
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


# --------------------------------------------------------------------------- (a) patch in parallel

def test_parallel_patch_with_mixed_states(hosts, ssh_env, tmp_path, env):
    h = hosts
    run("patch", *ssh_env.cli_args, "--host", h["done"].name, env=env, check_rc=0)
    original = {k: kimi(x).read_bytes() for k, x in h.items()}
    kimi(h["hand"]).write_bytes(original["hand"] + HAND_PATCH)  # what `cat >> kimi_k25.py` leaves
    h["down"].kill_sshd()
    try:
        proc, doc = run_json("patch", "-i", inv(ssh_env, tmp_path, h.values()), "--forks", "8",
                             "--connect-timeout", "5", env=env, timeout=180)
    finally:
        h["down"].start_sshd()
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    got = verdicts(doc)
    assert got == {h["src"].name: "patched", h["src2"].name: "patched", h["hand"].name: "repaired",
                   h["down"].name: "unreachable", h["venv"].name: "patched", h["venv2"].name: "patched",
                   h["done"].name: "unchanged", h["new"].name: "native"}, got
    by = {x["host"]: x for x in doc["hosts"]}
    assert "connection refused" in by[h["down"].name]["detail"]
    for k in ("src", "src2", "hand", "venv", "venv2", "done"):
        assert class_methods(kimi(h[k]).read_bytes(), KIMI_CLASS)[-3:] == METHODS, k
    assert kimi(h["new"]).read_bytes() == original["new"]
    assert kimi(h["down"]).read_bytes() == original["down"]
    # every change (and only changes) is journaled: one line per changed host
    lines = [x for x in journal_lines(env) if x["command"] == "patch"]
    changed = {x["host"]: x for x in lines}
    assert set(changed) == {h[k].name for k in ("src", "src2", "hand", "venv", "venv2", "done")}
    assert changed[h["src"].name]["sha256_before"] == sha(original["src"])
    assert changed[h["src"].name]["sha256_after"] == sha(kimi(h["src"]).read_bytes())
    assert changed[h["hand"].name]["verdict"] == "repaired"


# --------------------------------------------------------------------------- (b) reconcile

def snapshot(hosts):
    out = {}
    for h in hosts:
        for p in (kimi(h), state_json(h)):
            if p.exists():
                st = p.stat()
                out[str(p)] = (st.st_mtime_ns, st.st_ctime_ns, p.read_bytes())
    return out


def test_reconcile_upgrade_downgrade_wipe_and_unchanged_fleet(hosts, ssh_env, tmp_path, env):
    h = hosts
    fleet_inv = inv(ssh_env, tmp_path, h.values())
    run("patch", "-i", fleet_inv, env=env, check_rc=0)

    # an unchanged fleet: every host on the fast path, not one byte or mtime moves
    before = snapshot(h.values())
    proc, doc = run_json("reconcile", "-i", fleet_inv, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert verdicts(doc) == {x.name: ("native" if k == "new" else "unchanged") for k, x in h.items()}
    assert {x["host"]: x["data"]["path"] for x in doc["hosts"] if x["verdict"] == "unchanged"} == \
        {x.name: "fast" for k, x in h.items() if k != "new"}
    assert snapshot(h.values()) == before
    assert doc["summary"] == "reconcile: 8 hosts: 7 unchanged, 1 native; 0 failed"
    # a second run sees the same (no control-side cache: the host judges a native file each time)
    proc, doc = run_json("reconcile", "-i", fleet_inv, env=env)
    assert proc.returncode == 0
    assert verdicts(doc)[h["new"].name] == "native"
    assert snapshot(h.values()) == before

    # upgrade one venv host to 0.5.10 (methods native): reported, its stale state dropped
    venv = h["venv"]
    install_release(venv, "0.5.10")
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", venv.name, env=env)
    assert proc.returncode == 0
    rec = next(x for x in doc["hosts"] if x["host"] == venv.name)
    assert (rec["verdict"], rec["version"], rec["data"]["state"]) == ("native", "0.5.10", "native")
    assert "dropped provision's stale state" in rec["detail"]
    assert str(kimi(venv).resolve()).replace(str(venv.fs_dir), "") not in state_json(venv).read_text()
    assert json.loads(state_json(venv).read_text()) == {}
    assert kimi(venv).read_bytes() == (install_sglang_file("0.5.10"))

    # back to 0.5.9: the methods are missing again -> patched in the same call
    install_release(venv, "0.5.9")
    proc = run("reconcile", "-i", fleet_inv, env=env, check_rc=0)
    assert f"{venv.name}  re-patched  sglang 0.5.9" in proc.stdout
    assert "reconcile: 8 hosts: 6 unchanged, 1 re-patched, 1 native; 0 failed" in proc.stdout
    assert class_methods(kimi(venv).read_bytes(), KIMI_CLASS)[-3:] == METHODS

    # a reinstall of the same version wipes our block: --check says so (exit 4) and writes nothing
    src = h["src"]
    install_release(src, "0.5.9")
    pristine = snapshot([src])
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", src.name, "--check", env=env)
    assert proc.returncode == 4
    rec = doc["hosts"][0]
    assert (rec["verdict"], rec["data"]["state"], rec["data"]["check"]) == ("patched", "wiped", True)
    assert snapshot([src]) == pristine
    proc = run("reconcile", *ssh_env.cli_args, "--host", src.name, env=env, check_rc=0)
    assert f"{src.name}  re-patched" in proc.stdout and "wiped" in proc.stdout
    assert class_methods(kimi(src).read_bytes(), KIMI_CLASS)[-3:] == METHODS

    # someone else's edit of a pristine file: left alone (exit 3) until --force
    v2 = h["venv2"]
    install_release(v2, "0.5.9")
    edited = b"# local tweak by an operator\n" + kimi(v2).read_bytes()
    kimi(v2).write_bytes(edited)
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", v2.name, env=env)
    assert proc.returncode == 3
    rec = doc["hosts"][0]
    assert rec["verdict"] == "foreign-edit" and "--force" in rec["detail"]
    assert kimi(v2).read_bytes() == edited
    proc = run("reconcile", "--host", v2.name, *ssh_env.cli_args, "--force", env=env, check_rc=0)
    assert "re-patched" in proc.stdout
    assert kimi(v2).read_bytes().startswith(b"# local tweak by an operator\n")
    # every re-patch went into the journal, as `reconcile`
    rp = [(x["host"], x["verdict"]) for x in journal_lines(env) if x["command"] == "reconcile"]
    assert rp == [(venv.name, "patched"), (src.name, "patched"), (v2.name, "patched")]


def install_sglang_file(version):
    from provision.sandbox.wheels import models_file

    return models_file(version).read_bytes()


def test_blocked_git_checkout(sandbox_factory, ssh_env, env):
    host = sandbox_factory.host(sglang="0.5.9", layout="source", git=True)
    try:
        run("reconcile", *ssh_env.cli_args, "--host", host.name, env=env, check_rc=0)
        root = host.hostpath("/root/sglang")
        rel = "python/sglang/" + KIMI

        def git(*args, **kw):
            return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                                  **kw).stdout.strip()

        # upstream gets a commit changing the same file (as `git fetch` would bring in)
        idx = str(root / ".git" / "tmp-index")
        genv = dict(os.environ, GIT_INDEX_FILE=idx, GIT_AUTHOR_NAME="up", GIT_AUTHOR_EMAIL="up@x",
                    GIT_COMMITTER_NAME="up", GIT_COMMITTER_EMAIL="up@x")
        git("read-tree", "HEAD", env=genv)
        blob = subprocess.run(["git", "-C", str(root), "hash-object", "-w", "--stdin"], check=True,
                              capture_output=True, input=b"# upstream\n" + git("show", f"HEAD:{rel}").encode(),
                              ).stdout.decode().strip()
        git("update-index", "--cacheinfo", f"100644,{blob},{rel}", env=genv)
        tree = git("write-tree", env=genv)
        commit = git("commit-tree", tree, "-p", "HEAD", "-m", "upstream change", env=genv)
        git("branch", "upstream", commit)
        git("branch", "-u", "upstream", "main")
        proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", host.name, env=env)
        assert proc.returncode == 3
        rec = doc["hosts"][0]
        assert rec["verdict"] == "blocked-git"
        assert "provision unpatch" in rec["detail"] and "git pull" in rec["detail"]
    finally:
        sandbox_factory.remove(host)


# --------------------------------------------------------------------------- (c) history and restore

def test_history_and_restore(hosts, ssh_env, env):
    src, venv = hosts["src"], hosts["venv"]
    original = kimi(src).read_bytes()
    run("patch", *ssh_env.cli_args, "--host", src.name, "--host", venv.name, env=env, check_rc=0)
    patched = kimi(src).read_bytes()

    listing = run("restore", *ssh_env.cli_args, "--host", src.name, "--list", env=env, check_rc=0)
    assert "original" in listing.stdout and sha(original)[:12] in listing.stdout
    proc, doc = run_json("restore", *ssh_env.cli_args, "--host", src.name, env=env)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "restored"
    assert kimi(src).read_bytes() == original
    # any backup by id: the patched bytes were backed up by the restore
    run("restore", *ssh_env.cli_args, "--host", src.name, "--backup", sha(patched)[:10], env=env, check_rc=0)
    assert kimi(src).read_bytes() == patched
    bad = run("restore", *ssh_env.cli_args, "--host", src.name, "--backup", "ffffffffff", env=env)
    assert bad.returncode == 3 and "no backup with id" in bad.stdout
    # reconcile takes the restored patch as ours (state refreshed), then stays on the fast path
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", src.name, env=env)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged"
    assert "refreshed" in doc["hosts"][0]["detail"]
    proc, doc = run_json("reconcile", *ssh_env.cli_args, "--host", src.name, env=env)
    assert doc["hosts"][0]["data"]["path"] == "fast" and kimi(src).read_bytes() == patched

    proc = run("history", "--json", env=env, check_rc=0)
    recs = [json.loads(line) for line in proc.stdout.splitlines()]
    # the two hosts of one patch run are journaled as each finishes: in either order
    recs[:2] = sorted(recs[:2], key=lambda r: r["host"] != src.name)
    assert [(r["command"], r["host"], r["verdict"]) for r in recs] == [
        ("patch", src.name, "patched"), ("patch", venv.name, "patched"), ("restore", src.name, "restored"),
        ("restore", src.name, "restored"), ("restore", src.name, "failed")]
    assert recs[2]["sha256_before"] == sha(patched) and recs[2]["sha256_after"] == sha(original)
    assert recs[3]["sha256_before"] == sha(original) and recs[3]["sha256_after"] == sha(patched)
    assert recs[2]["spec"] == "kimi-k25-eagle3" and recs[2]["spec_hash"]
    assert recs[0]["spec"] == "kimi-k25-eagle3" and recs[0]["spec_hash"] == recs[2]["spec_hash"]
    assert recs[0]["sha256_before"] == sha(original) and recs[0]["sha256_after"] == sha(patched)
    assert all(r["user"] and r["control_host"] and r["tool_version"] and r["time"] for r in recs)
    only = run("history", "--host", src.name, "-n", "2", "--json", env=env, check_rc=0)
    assert [json.loads(x)["verdict"] for x in only.stdout.splitlines()] == ["restored", "failed"]
    table = run("history", env=env, check_rc=0)
    assert table.stdout.count(src.name) == 4 and table.stdout.count(venv.name) == 1 and "restored" in table.stdout


# --------------------------------------------------------------------------- (d) the control lock

def test_second_reconcile_while_locked_exits_7(hosts, ssh_env, env):
    from provision.control.lock import ControlLock

    src = hosts["src"]
    before = snapshot([src])
    with ControlLock(env["PROVISION_LOCK"]):
        proc = run("reconcile", *ssh_env.cli_args, "--host", src.name, env=env)
    assert proc.returncode == 7, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {os.getpid()}" in lines[0] and env["PROVISION_LOCK"] in lines[0]
    assert proc.stdout == "" and snapshot([src]) == before
    # --check takes no lock
    with ControlLock(env["PROVISION_LOCK"]):
        assert run("reconcile", *ssh_env.cli_args, "--host", src.name, "--check", env=env).returncode == 4


# --------------------------------------------------------------------------- (e) inventories

def test_ansible_inventory_and_a_bad_one(hosts, ssh_env, tmp_path, env):
    venv = hosts["venv2"]
    ans = tmp_path / "hosts.yml"
    ans.write_text(f"""\
all:
  vars:
    ansible_user: root
    ansible_ssh_private_key_file: {ssh_env.identity}
    ansible_become: false
    ansible_connection: ssh
  children:
    gpu:
      hosts:
        {venv.name}:
          ansible_host: {venv.address}
          ansible_port: {venv.port}
""")
    proc, doc = run_json("patch", "-i", ans, "--known-hosts", ssh_env.known_hosts, env=env)
    assert proc.returncode == 0, proc.stderr
    assert verdicts(doc) == {venv.name: "patched"}
    assert proc.stderr.count("ansible_connection") == 1  # ignored variables are said once
    bad = tmp_path / "bad.yaml"
    bad.write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: [10.0.0.1\n")
    for cmd in ("patch", "reconcile"):
        proc = run(cmd, "-i", bad, env=env)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {bad}:5: "), lines
        assert proc.stdout == ""


# --------------------------------------------------------------------------- restart needed / --restart

def test_restart_needed_window_and_rolling_restart(hosts, ssh_env, tmp_path, env):
    host = hosts["venv"]
    invf = tmp_path / "restart.yaml"
    invf.write_text(ssh_env.sandbox.inventory_yaml([host.name]).replace(
        "\nhosts:", "\n  env: {PROVISION_STANDIN_LOAD_SECONDS: '0.3', PROVISION_STANDIN_WARMUP_SECONDS: '0.1'}"
                     "\nhosts:", 1))
    run("patch", "-i", invf, env=env, check_rc=0)
    run("launch", "-i", invf, "--poll", "0.3", "--deadline", "60", env=env, check_rc=0, timeout=120)
    install_release(host, "0.5.9")  # the server imported our patched file; the install is pristine again
    # re-patched at once; the restart waits for the window
    proc, doc = run_json("reconcile", "-i", invf, "--restart", "--window", _window_not_now(), env=env)
    assert proc.returncode == 0, proc.stdout
    rec = doc["hosts"][0]
    assert rec["verdict"] == "patched" and rec["data"]["restart_needed"]
    assert any(n.startswith("restart deferred: outside window") for n in rec["notes"])
    assert doc["summary"].endswith("; 1 restart deferred") and "restart" not in rec["data"]
    proc = run("reconcile", "-i", invf, env=env, check_rc=0)
    assert "restart needed" in proc.stdout and "1 restart needed" in proc.stdout
    proc = run("reconcile", "-i", invf, "--restart", "--serial", "1", "--restart-deadline", "60", env=env,
               check_rc=0, timeout=120)
    assert "restarted: ready" in proc.stdout and "1 restarted" in proc.stdout
    proc, doc = run_json("reconcile", "-i", invf, env=env)
    assert proc.returncode == 0 and doc["hosts"][0]["data"]["restart_needed"] == []
    kinds = [(x["command"], x["verdict"]) for x in journal_lines(env)]
    assert ("restart", "restarted") in kinds and ("reconcile", "patched") in kinds


def _window_not_now() -> str:
    from datetime import datetime, timedelta

    start = datetime.now() + timedelta(hours=2)
    end = start + timedelta(minutes=30)
    return f"{start:%H:%M}-{end:%H:%M}"


# --------------------------------------------------------------------------- schedule

def test_schedule_prints_and_installs_units(ssh_env, tmp_path, env):
    invf = tmp_path / "inv.yaml"
    invf.write_text("hosts:\n  gpu01: {address: 10.0.0.1}\n")
    proc = run("schedule", "-i", invf, "--every", "15m", env=env, check_rc=0)
    assert "[Timer]" in proc.stdout and "OnUnitActiveSec=900s" in proc.stdout
    exe = proc.stdout.split("ExecStart=", 1)[1].split()[0]
    assert os.path.isabs(exe.strip('"')) and f"reconcile --inventory {invf}" in proc.stdout
    cron = [line for line in proc.stdout.splitlines() if line.startswith("*/15 * * * * ")]
    assert len(cron) == 1 and str(invf) in cron[0]
    units = tmp_path / "units"
    run("schedule", "-i", invf, "--every", "1h", "--install", "--unit-dir", units, "--restart", "--window",
        "02:00-05:00", env=env, check_rc=0)
    svc = (units / "provision-reconcile.service").read_text()
    assert "--restart --window 02:00-05:00" in svc and (units / "provision-reconcile.timer").exists()
    assert run("schedule", "-i", invf, "--every", "45m", env=env).returncode == 2
