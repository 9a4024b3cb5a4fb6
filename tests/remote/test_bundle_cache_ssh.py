"""Over real sshd: the host keeps the bundle in /var/lib/provision/bundles/SHA256 (root's, 0700),
a second run reuses it, and a copy that does not hash to its name is never run."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest

from tests.cli.helpers import run_json

pytestmark = pytest.mark.ssh


@pytest.fixture
def host(sandbox_factory):
    h = sandbox_factory.host(name="bundle-cache", sglang="0.5.9", layout="source")
    try:
        yield h
    finally:
        sandbox_factory.remove(h)


def _copies(host):
    d = host.hostpath("/var/lib/provision/bundles")
    # the bundles (named by their sha256), not the compiled modules kept beside them (SHA256.<tag>)
    return d, {p.name: p for p in d.iterdir() if len(p.name) == 64} if d.is_dir() else {}


def test_the_bundle_is_kept_reused_and_verified(host, ssh_env):
    args = [*ssh_env.cli_args, "--host", host.name]
    proc, doc = run_json("patch", *args)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "patched", proc.stderr
    d, copies = _copies(host)
    st = d.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    assert copies, "the bundle was kept on the host"
    for name, p in copies.items():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == name
        assert p.stat().st_uid == 0 and stat.S_IMODE(p.stat().st_mode) == 0o600
    inodes = {n: p.stat().st_ino for n, p in copies.items()}

    proc, doc = run_json("patch", *args)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged", proc.stderr
    _, again = _copies(host)
    assert {n: p.stat().st_ino for n, p in again.items()} == inodes, "a hit: nothing was sent or rewritten"

    # a copy that would lie if it were run: its bytes no longer hash to its name
    for p in copies.values():
        mods = json.loads(p.read_bytes())
        mods["provision.host.agent"] = ("import sys\ndef main(q, b):\n    sys.stdout.write('PROVISION-RESULT "
                                        "{\"ok\": false, \"error\": {\"kind\": \"x\", \"message\": \"tampered\"}}\\n')\n"
                                        "    return 0\n")
        p.write_bytes(json.dumps(mods).encode())
    proc, doc = run_json("patch", *args)
    assert proc.returncode == 0 and doc["hosts"][0]["verdict"] == "unchanged", (proc.stdout, proc.stderr)
    _, fixed = _copies(host)
    for name, p in fixed.items():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == name
