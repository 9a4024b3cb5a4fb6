"""The bundle and its bootstrap, run locally (no SSH): packages, what is shipped, failpoints."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import pytest

from provision.control.transport.bundle import CONTROL_ONLY, bundle_bytes, payload
from provision.host.bootstrap import RESULT_PREFIX, bootstrap_code
from provision.host.lib import failpoints


def run_agent(request: dict, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-S", "-c", bootstrap_code()], input=payload(request),
                          capture_output=True, timeout=60, env=env)
    lines = [x for x in proc.stdout.decode().splitlines() if x.startswith(RESULT_PREFIX)]
    assert lines, (proc.returncode, proc.stderr.decode()[-2000:])
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def test_an_op_deep_in_the_package_tree_runs_from_the_bundle(tmp_path):
    # ops.restore -> ops.fileops -> engine.core -> engine.spec -> lib.*: every package on the
    # way is made by the bootstrap, and nothing imports the (unshipped) protocol at run time.
    out = run_agent({"op": "backups", "file": str(tmp_path / "x.py"), "state_dir": str(tmp_path / "state")})
    assert out["ok"] is True and out["backups"] == [], out


def test_the_bundle_ships_host_modules_only():
    names = set(json.loads(zlib.decompress(bundle_bytes())))
    assert "provision.host.agent" in names and "provision.host.ops.patch" in names
    assert all(n.startswith("provision.host") for n in names), names
    assert not {f"provision.host.{m}" for m in CONTROL_ONLY} & names


def test_failpoints_travel_in_the_request(monkeypatch):
    monkeypatch.setenv("PROVISION_FAILPOINTS", "after_replace")
    body = payload({"op": "nope"})
    assert json.loads(body[body.rindex(b"{"):])["failpoints"] == "after_replace"
    monkeypatch.delenv("PROVISION_FAILPOINTS")
    body = payload({"op": "nope"})
    assert "failpoints" not in json.loads(body[body.rindex(b"{"):])


def test_an_unknown_failpoint_is_refused():
    assert failpoints.parse("before_read, after_replace=kill") == {"before_read": "kill", "after_replace": "kill"}
    for bad in ("sometime", "after_replace=explode"):
        with pytest.raises(ValueError):
            failpoints.parse(bad)
