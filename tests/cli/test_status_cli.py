"""`provision status` repeats "restart needed" where the running server predates its file."""

from __future__ import annotations

import pytest

from tests.cli.helpers import run, run_json
from tests.cli.test_launch_cli import inventory, launch

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def shost(sandbox_factory):
    host = sandbox_factory.host("status1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


def test_status_repeats_restart_needed_when_the_server_predates_the_file(tmp_path, ssh_env, shost):
    shost.reset()
    inv = inventory(tmp_path, ssh_env, shost)
    run("patch", "-i", inv, check_rc=0)
    proc, doc = launch(inv)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "ready", proc.stderr
    try:
        proc, doc = run_json("status", "-i", inv)
        assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched"
        assert not any("restart needed" in n for n in doc["hosts"][0]["notes"])
        run("unpatch", "-i", inv, check_rc=0)  # the file changes under the running server
        proc, doc = run_json("status", "-i", inv)
        r = doc["hosts"][0]
        assert proc.returncode == 4 and r["verdict"] == "missing"
        assert any(n.startswith("restart needed") for n in r["notes"]), r["notes"]
        plain = run("status", "-i", inv)
        assert "note: restart needed: the running server (pid " in plain.stdout, plain.stdout
    finally:
        run("stop", "-i", inv)
