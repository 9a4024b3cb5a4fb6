"""`provision patch / unpatch / status` over real sshd hosts, as a user runs them."""

from __future__ import annotations

import os

from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, module_level_functions, run, run_json


def kimi(host):
    return host.hostpath(os.path.join(host.sglang_dir, KIMI))


def models_listing(host):
    return sorted(os.listdir(os.path.dirname(kimi(host))))


def test_patch_three_layouts(three_hosts, ssh_env):
    src, venv, new = three_hosts
    before = {h.name: kimi(h).read_bytes() for h in three_hosts}
    listing = {h.name: models_listing(h) for h in three_hosts}
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", src.name, "--host", venv.name, "--host", new.name)
    assert proc.returncode == 0, proc.stderr
    verdicts = {h["host"]: h["verdict"] for h in doc["hosts"]}
    assert verdicts == {src.name: "patched", venv.name: "patched", new.name: "native"}
    for h in (src, venv):
        after = kimi(h).read_bytes()
        assert class_methods(after, KIMI_CLASS)[-3:] == METHODS
        assert not set(METHODS) & set(module_level_functions(after))
        assert after.endswith(b"\n\nEntryClass = [KimiK25ForConditionalGeneration]\n")
        assert models_listing(h) == listing[h.name], "no debris (temp or backup files) in models/"
        rec = next(x for x in doc["hosts"] if x["host"] == h.name)
        assert rec["version"] == "0.5.9" and rec["added"] == METHODS
        # the backup of the original lives in the host's state dir, never in the package
        backups = h.hostpath("/var/lib/provision/backups")
        assert any(p.read_bytes() == before[h.name] for p in backups.rglob("*") if p.is_file())
    assert kimi(new).read_bytes() == before[new.name], "0.5.10 (native methods) must stay byte-identical"
    # The venv install was found through its own interpreter; the checkout through the disk.
    kinds = {x["host"]: x["data"]["install_kind"] for x in doc["hosts"]}
    assert kinds[src.name] == "source" and kinds[venv.name] == "site-packages"

    # a second run is a no-op
    proc2, doc2 = run_json("patch", *ssh_env.cli_args, "--host", src.name, "--host", new.name)
    assert proc2.returncode == 0
    assert [h["verdict"] for h in doc2["hosts"]] == ["unchanged", "native"]

    # unpatch restores the original bytes
    proc3 = run("unpatch", *ssh_env.cli_args, "--host", src.name, "--host", venv.name, check_rc=0)
    assert "unpatched" in proc3.stdout
    for h in (src, venv):
        assert kimi(h).read_bytes() == before[h.name]


def test_check_changes_nothing_and_says_so(three_hosts, ssh_env):
    src = three_hosts.source
    before = kimi(src).read_bytes()
    proc = run("patch", *ssh_env.cli_args, "--host", src.name, "--check", "--diff")
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    assert "would-patch" in proc.stdout
    assert "+    def set_eagle3_layers_to_capture(self, layer_ids=None):" in proc.stdout
    assert kimi(src).read_bytes() == before
    assert not src.hostpath("/var/lib/provision/backups").exists()


def test_hand_patch_is_repaired(three_hosts, ssh_env):
    src = three_hosts.source
    path = kimi(src)
    original = path.read_bytes()
    hand = (b"\n\ndef set_eagle3_layers_to_capture(self, layer_ids=None):\n"
            b"    self.language_model.set_eagle3_layers_to_capture(layer_ids)\n\n"
            b"def get_embed_and_head(self):\n    return self.language_model.get_embed_and_head()\n")
    path.write_bytes(original + hand)  # what `cat >> kimi_k25.py` leaves behind
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", src.name)
    assert proc.returncode == 0
    assert doc["hosts"][0]["verdict"] == "repaired"
    fixed = path.read_bytes()
    assert class_methods(fixed, KIMI_CLASS)[-3:] == METHODS
    assert module_level_functions(fixed) == module_level_functions(original)
    # unpatch gives the repaired file without our block: the pristine original
    run("unpatch", *ssh_env.cli_args, "--host", src.name, check_rc=0)
    assert path.read_bytes() == original


def test_refused_auth_fails_cleanly_and_others_are_patched(three_hosts, ssh_env):
    src, venv, new = three_hosts
    keys = venv.hostpath("/root/.ssh/authorized_keys")
    saved = keys.read_text()
    keys.write_text("")  # this host now refuses our key
    try:
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", src.name, "--host", venv.name, timeout=120)
        plain = run("status", *ssh_env.cli_args, "--host", venv.name)
    finally:
        keys.write_text(saved)
    assert proc.returncode == 3
    by = {h["host"]: h for h in doc["hosts"]}
    assert by[src.name]["verdict"] == "patched"
    assert by[venv.name]["verdict"] == "failed" and by[venv.name]["error_kind"] == "auth"
    assert "authentication" in by[venv.name]["detail"]
    assert plain.returncode == 3 and "authentication" in plain.stdout


def test_unreachable_host_is_one_line(three_hosts, ssh_env):
    src = three_hosts.source
    src.kill_sshd()
    try:
        proc = run("status", *ssh_env.cli_args, "--host", src.name, "--connect-timeout", "3", timeout=120)
    finally:
        src.start_sshd()
    assert proc.returncode == 3
    lines = [l for l in proc.stdout.splitlines() if l.startswith(src.name)]
    assert lines and "unreachable" in lines[0] and "connection refused" in lines[0]


def test_status_reports_version_install_and_state(three_hosts, ssh_env, tmp_path):
    src, venv, new = three_hosts
    run("patch", *ssh_env.cli_args, "--host", venv.name, check_rc=0)
    proc, doc = run_json("status", *ssh_env.cli_args, "--host", src.name, "--host", venv.name, "--host", new.name)
    assert proc.returncode == 4  # a host is not as wanted: what a monitoring check needs
    by = {h["host"]: h for h in doc["hosts"]}
    assert {n: h["verdict"] for n, h in by.items()} == {src.name: "missing", venv.name: "patched",
                                                         new.name: "native"}
    assert by[src.name]["data"]["patch_state"].startswith("missing")
    assert by[new.name]["version"] == "0.5.10"
    assert by[venv.name]["install"].endswith("site-packages/sglang")
    run("status", *ssh_env.cli_args, "--host", venv.name, "--host", new.name, check_rc=0)
    # the same spec name with other parameters: our block is there but stale (it said "patched")
    from provision.config.playbook import PACKAGE_PLAYBOOKS

    changed = tmp_path / "changed.yaml"
    changed.write_text((PACKAGE_PLAYBOOKS / "kimi-k25-eagle3.yaml").read_text().replace(
        "self, embed, head", "self, embed, head, extra=None"))
    plain = run("status", *ssh_env.cli_args, "--host", venv.name, "--playbook", changed, check_rc=4)
    line = next(ln for ln in plain.stdout.splitlines() if ln.startswith(venv.name))
    assert line.split("  ")[1] == "stale", plain.stdout
