"""Over real sshd: an explicit `unpatch` holds a host against reconcile, and `restore`
never puts an older release's file into a newer one without --force."""

from __future__ import annotations

import json
import os

import pytest

from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, run, run_json
from tests.cli.test_fleet_cli import install_release, sha


def kimi(host):
    return host.hostpath(os.path.join(host.sglang_dir, KIMI))


@pytest.fixture(scope="module")
def box(sandbox_factory):
    h = sandbox_factory.host(name="trust-hold", sglang="0.5.9", layout="venv")
    try:
        yield h
    finally:
        sandbox_factory.remove(h)


@pytest.fixture
def host(box):
    """As built: SGLang 0.5.9 pristine, no provision state or backups (reset prunes them)."""
    box.reset(keep_caches=False)
    assert not box.hostpath("/var/lib/provision").exists()
    return box


def test_an_explicit_unpatch_holds_the_host_until_patch(host, ssh_env, tmp_path):
    args = [*ssh_env.cli_args, "--host", host.name]
    pristine = kimi(host).read_bytes()
    run("patch", *args, check_rc=0)
    run("unpatch", *args, check_rc=0)
    assert kimi(host).read_bytes() == pristine

    from provision.control.journal import actor

    for extra in ((), ("--check",)):
        proc, doc = run_json("reconcile", *args, *extra)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        rec = doc["hosts"][0]
        assert (rec["verdict"], rec["data"]["state"]) == ("held", "held"), rec
        assert f"`provision unpatch` by {actor()} at 20" in rec["detail"], rec["detail"]
        assert kimi(host).read_bytes() == pristine, "reconcile leaves a held host alone"
    assert "1 held" in run("reconcile", *args, check_rc=0).stdout

    # --include-held re-patches it
    proc, doc = run_json("reconcile", *args, "--include-held")
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched", doc["hosts"][0]
    assert class_methods(kimi(host).read_bytes(), KIMI_CLASS)[-3:] == METHODS

    # unpatch again, then `provision patch` releases the hold: reconcile is back to normal
    run("unpatch", *args, check_rc=0)
    run("patch", *args, check_rc=0)
    proc, doc = run_json("reconcile", *args)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged"
    # a wipe after that is re-patched as before
    install_release(host, "0.5.9")
    proc, doc = run_json("reconcile", *args)
    assert doc["hosts"][0]["verdict"] == "patched" and doc["hosts"][0]["data"]["state"] == "wiped"


def test_restore_refuses_an_older_releases_backup_after_an_upgrade(host, ssh_env):
    args = [*ssh_env.cli_args, "--host", host.name]
    original = kimi(host).read_bytes()
    run("patch", *args, check_rc=0)
    install_release(host, "0.5.10")
    new = kimi(host).read_bytes()
    assert new != original

    for extra in ((), ("--check",)):
        proc, doc = run_json("restore", *args, *extra)
        assert proc.returncode == 3, (extra, proc.stdout, proc.stderr)
        rec = doc["hosts"][0]
        assert rec["verdict"] == "failed" and rec["error_kind"] == "restore-refused", rec
        assert "taken under SGLang 0.5.9, but SGLang 0.5.10 is installed now" in rec["detail"], rec["detail"]
        assert "--force" in rec["detail"]
        assert kimi(host).read_bytes() == new, "the 0.5.10 file is byte-identical"
    proc = run("restore", *args)
    assert proc.returncode == 3 and "refusing to restore" in proc.stdout and "0.5.10" in proc.stdout

    # --force does it, and keeps the 0.5.10 bytes as a backup labelled 0.5.10
    proc, doc = run_json("restore", *args, "--force")
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "restored", doc["hosts"][0]
    assert kimi(host).read_bytes() == original
    assert any(n.startswith("--force: ") for n in doc["hosts"][0]["notes"])
    proc, doc = run_json("restore", *args, "--list")
    labelled = {b["sha256"]: b["sglang_version"] for b in doc["hosts"][0]["data"]["backups"]}
    assert labelled[sha(new)] == "0.5.10"


def test_restore_refuses_a_file_changed_since_provision_left_it(host, ssh_env):
    args = [*ssh_env.cli_args, "--host", host.name]
    original = kimi(host).read_bytes()
    run("patch", *args, check_rc=0)
    edited = kimi(host).read_bytes() + b"# an operator's later edit\n"
    kimi(host).write_bytes(edited)
    proc, doc = run_json("restore", *args)
    assert proc.returncode == 3
    detail = doc["hosts"][0]["detail"]
    assert "not as provision last left it" in detail and sha(edited)[:12] in detail, detail
    assert kimi(host).read_bytes() == edited
    # same release, file as we left it: restore works without --force
    kimi(host).write_bytes(edited[: -len(b"# an operator's later edit\n")])
    run("restore", *args, check_rc=0)
    assert kimi(host).read_bytes() == original
    history = [json.loads(x) for x in run("history", "--json", check_rc=0).stdout.splitlines()]
    assert [r["verdict"] for r in history if r["host"] == host.name][-2:] == ["failed", "restored"]


def test_a_renamed_playbook_replaces_the_old_block_and_reconcile_keeps_the_state(host, ssh_env, tmp_path):
    """Patched under an old playbook name, then the default one: never `native`, never `absent`."""
    from pathlib import Path

    args = [*ssh_env.cli_args, "--host", host.name]
    pristine = kimi(host).read_bytes()
    text = (Path(__file__).resolve().parents[2] / "playbooks" / "kimi-k25-eagle3.yaml").read_text()
    old = tmp_path / "kimi-old.yaml"
    old.write_text(text.replace("name: kimi-k25-eagle3", "name: kimi-eagle3-old", 1))
    run("patch", *args, "--playbook", old, check_rc=0)
    assert b"spec=kimi-eagle3-old" in kimi(host).read_bytes()

    proc, doc = run_json("status", *args)
    assert doc["hosts"][0]["data"]["methods"] == {m: "ours" for m in METHODS}, doc["hosts"][0]
    # reconcile under the default spec: our old block is stale, re-rendered; state kept
    proc, doc = run_json("reconcile", *args)
    rec = doc["hosts"][0]
    assert proc.returncode == 0 and (rec["verdict"], rec["data"]["state"]) == ("patched", "stale-block"), rec
    data = kimi(host).read_bytes()
    assert b"spec=kimi-eagle3-old" not in data and b"spec=kimi-k25-eagle3" in data
    assert class_methods(data, KIMI_CLASS).count("get_embed_and_head") == 1
    state = json.loads(host.hostpath("/var/lib/provision/state.json").read_text())
    assert [e["spec"] for e in state.values()] == ["kimi-k25-eagle3"]

    # patch under the old name again, then unpatch under the new one: the original comes back
    run("patch", *args, "--playbook", old, check_rc=0)
    proc, doc = run_json("patch", *args)
    assert doc["hosts"][0]["verdict"] == "patched"
    assert any("replaced the managed block written under spec kimi-eagle3-old" in n for n in doc["hosts"][0]["notes"])
    run("patch", *args, "--playbook", old, check_rc=0)
    proc, doc = run_json("unpatch", *args)
    assert doc["hosts"][0]["verdict"] == "unpatched" and kimi(host).read_bytes() == pristine
