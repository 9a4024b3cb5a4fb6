"""`--local`: the same host-side code on this machine, no SSH; the same journal and exit codes.

The tree is a real SGLang 0.5.9 wheel unpacked into a temp dir (as a Dockerfile's `RUN provision
patch --local` would find it in an image), pinned with --sglang-path; the host-side state goes
to --state-dir, so nothing of this machine's /var/lib/provision is touched.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess

import pytest

from provision.sandbox import wheels
from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, module_level_functions, run, run_json


@pytest.fixture
def tree(tmp_path):
    """An unpacked SGLang 0.5.9 (the package and its dist-info, as pip lays them out)."""
    try:
        src = wheels.extracted("0.5.9")
    except wheels.WheelUnavailable as exc:
        pytest.skip(f"SGLang 0.5.9 wheel unavailable: {exc}")
    site = tmp_path / "site-packages"
    shutil.copytree(src / "sglang", site / "sglang")
    shutil.copytree(src / "sglang-0.5.9.dist-info", site / "sglang-0.5.9.dist-info")
    return site / "sglang"


def _local(tree, tmp_path):
    return ["--local", "--sglang-path", str(tree), "--state-dir", str(tmp_path / "state")]


def test_patch_local_on_an_unpacked_tree_then_unchanged(tree, tmp_path):
    kimi = tree / KIMI
    original = kimi.read_bytes()
    listing = sorted(p.name for p in kimi.parent.iterdir())
    proc, doc = run_json("patch", *_local(tree, tmp_path))
    assert proc.returncode == 0, proc.stderr
    (rec,) = doc["hosts"]
    assert rec["verdict"] == "patched" and rec["version"] == "0.5.9" and rec["added"] == METHODS
    assert rec["host"] == socket.gethostname() and rec["data"]["transport"] == "local"
    after = kimi.read_bytes()
    assert class_methods(after, KIMI_CLASS)[-3:] == METHODS
    assert not set(METHODS) & set(module_level_functions(after))
    # the backup of the original is in the state dir given, never in the package
    backups = [p for p in (tmp_path / "state" / "backups").rglob("*") if p.is_file()]
    assert any(p.read_bytes() == original for p in backups)
    assert sorted(p.name for p in kimi.parent.iterdir()) == listing, "no debris (temp or backup files) in models/"

    # a second run changes nothing; status agrees (exit 0); the journal names this machine
    proc, doc = run_json("patch", *_local(tree, tmp_path))
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged"
    assert kimi.read_bytes() == after
    proc = run("status", *_local(tree, tmp_path), check_rc=0)
    assert "patched" in proc.stdout
    lines = run("history", "--json", check_rc=0).stdout.splitlines()
    assert '"command": "patch"' in lines[-1] and f'"host": "{socket.gethostname()}"' in lines[-1]

    # pull mode's command: an "upgrade" wipes the patch, reconcile --local puts it back
    kimi.write_bytes(original)
    proc = run("reconcile", *_local(tree, tmp_path), check_rc=0)
    assert "re-patched" in proc.stdout, proc.stdout
    assert class_methods(kimi.read_bytes(), KIMI_CLASS)[-3:] == METHODS

    # unpatch --local gives the original bytes back
    proc = run("unpatch", *_local(tree, tmp_path), check_rc=0)
    assert kimi.read_bytes() == original
    # --check on an unpatched tree: exit 4, nothing written
    run("patch", *_local(tree, tmp_path), "--check", check_rc=4)
    assert kimi.read_bytes() == original


def test_audit_local_reads_the_tree(tree, tmp_path):
    proc, doc = run_json("audit", *_local(tree, tmp_path))
    assert proc.returncode == 6, proc.stderr  # 0.5.9 has fixable wrappers no shipped spec covers
    gaps = {g["class"]: g for g in doc["hosts"][0]["data"]["gaps"]}
    assert gaps[KIMI_CLASS]["covered_by"] == "kimi-k25-eagle3"


def test_local_flags_that_cannot_go_together_are_exit_2(tree, tmp_path):
    for args, words in ((["--local", "--host", "gpu01"], "--local works on this machine"),
                        (["--local", "-i", "a,b,"], "--local works on this machine"),
                        (["--host", "gpu01", "--state-dir", "x"], "--state-dir"),
                        (["--host", "gpu01", "--runtime", "podman"], "--runtime"),
                        (["--host", "gpu01", "--container", "a b"], "not a container name")):
        proc = run("patch", *args)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert (tree / KIMI).read_bytes() == (wheels.extracted("0.5.9") / "sglang" / KIMI).read_bytes()


def test_schedule_local_installs_a_timer_whose_command_reconciles_this_machine(tree, tmp_path):
    units = tmp_path / "units"
    proc = run("schedule", *_local(tree, tmp_path), "--every", "15m", "--install", "--unit-dir", units, check_rc=0)
    assert f"wrote {units}/provision-reconcile.timer" in proc.stdout
    service = (units / "provision-reconcile.service").read_text()
    exec_start = next(x for x in service.splitlines() if x.startswith("ExecStart="))[len("ExecStart="):]
    argv = shlex.split(exec_start)
    assert argv[1:3] == ["reconcile", "--local"], argv
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(units / "provision-reconcile.service"),
                                 str(units / "provision-reconcile.timer")], capture_output=True, text=True)
        assert "provision-reconcile" not in verify.stdout + verify.stderr, verify.stdout + verify.stderr
    # what the timer runs, run as it would be (from /): the never-patched tree gets patched
    proc = subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert class_methods((tree / KIMI).read_bytes(), KIMI_CLASS)[-3:] == METHODS


def test_a_step_killed_mid_write_is_unknown_then_status_says_which_way_it_went(tree, tmp_path):
    # The host side SIGKILLs itself right after os.replace: over SSH that is `unknown`; locally too.
    kimi = tree / KIMI
    proc, doc = run_json("patch", *_local(tree, tmp_path), env={"PROVISION_FAILPOINTS": "after_replace"})
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    (rec,) = doc["hosts"]
    assert rec["verdict"] == "unknown" and "provision status" in rec["detail"], rec
    assert class_methods(kimi.read_bytes(), KIMI_CLASS)[-3:] == METHODS  # it was replaced: as intended
    proc, doc = run_json("status", *_local(tree, tmp_path))
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched"
