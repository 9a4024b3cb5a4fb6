"""The sandbox speaks like a host: after `provision sandbox up`, the commands it prints work
as they are (no --ssh-config to add), and it says which parts are stand-ins."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from tests.cli.helpers import PROVISION

pytestmark = pytest.mark.ssh


def _provision(*args, env=None, timeout=300):
    return subprocess.run([PROVISION, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL)


def test_printed_commands_reach_the_host_by_name(tmp_path, sandbox_factory):
    base = tmp_path / "sbx"
    first = sandbox_factory._address()
    up = _provision("sandbox", "up", "--first-address", first, "--port", sandbox_factory.port, "--base-dir", base)
    try:
        assert up.returncode == 0, up.stderr
        out = up.stdout
        for part in ("stand-ins:", "SGLang server", "GPUs", "tok/s", "as seen on the host"):
            assert part in out, out
        export = next(ln.strip() for ln in out.splitlines() if ln.strip().startswith("export "))
        var, _, value = export[len("export "):].partition("=")
        env = {var: shlex.split(value)[0]}
        # the "try:" command, exactly as printed, with the export applied
        try_cmd = next(ln.split("try:", 1)[1].strip() for ln in out.splitlines() if ln.startswith("try:"))
        argv = shlex.split(try_cmd)
        assert argv[:3] == ["provision", "status", "--host"]
        st = _provision(*argv[1:], "--json", env=env, timeout=120)
        doc = json.loads(st.stdout)
        assert doc["hosts"][0]["verdict"] == "missing", doc["hosts"][0]  # reachable, SGLang 0.5.9 unpatched
        assert st.returncode == 4
        assert _provision("sandbox", "env", "--base-dir", base).stdout.strip() == export
    finally:
        down = _provision("sandbox", "down", "--base-dir", base)
    assert down.returncode == 0
