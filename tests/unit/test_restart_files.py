"""A restart keeps a copy of the old server's files (its secrets, the watcher's spec, a persistent
unit) until the old server is gone, and puts them back when the new start fails before that: the
old server keeps running with the key and the unit its record describes (issue 42)."""

from __future__ import annotations

import os

from provision.host.ops.server import put_back_files, snapshot_files


def test_a_snapshot_puts_back_each_file_with_its_mode_and_removes_the_new_ones(tmp_path):
    key, unit, token = tmp_path / "server-30000.secrets.yaml", tmp_path / "provision-sglang-30000.service", \
        tmp_path / "server-30000.hf_token"
    key.write_text("api-key: sk-old\n")
    os.chmod(key, 0o600)
    unit.write_text("[Service]\nExecStart=/old\n")
    os.chmod(unit, 0o644)
    snap = snapshot_files([str(key), str(unit), str(token)])
    # the new start writes its files, then fails before the old server was stopped
    key.write_text("api-key: sk-new\n")
    os.chmod(key, 0o644)
    unit.write_text("[Service]\nExecStart=/new\n")
    token.write_text("hf_new")
    changed = put_back_files(snap)
    assert sorted(changed) == sorted([str(key), str(unit), str(token)])
    assert key.read_text() == "api-key: sk-old\n" and os.stat(key).st_mode & 0o777 == 0o600
    assert unit.read_text() == "[Service]\nExecStart=/old\n" and os.stat(unit).st_mode & 0o777 == 0o644
    assert not token.exists(), "a file the old server did not have is removed again"
    assert put_back_files(snap) == [], "nothing to do twice"


def test_a_file_the_new_start_removed_comes_back(tmp_path):
    key = tmp_path / "server-30000.secrets.yaml"
    key.write_text("api-key: sk-old\n")
    os.chmod(key, 0o600)
    snap = snapshot_files([str(key)])
    key.unlink()  # a launch without a key removes the old key's file
    assert put_back_files(snap) == [str(key)] and key.read_text() == "api-key: sk-old\n"
