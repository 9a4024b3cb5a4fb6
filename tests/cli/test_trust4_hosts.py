"""Trust, fourth round (issue 60), over real sshd: what another account can do on a host does not
steer root. A profile's `log_dir:` that another account can write, links planted there at the next
log names: root never writes through them; a host whose answer is garbled: a sentence naming it."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.helpers import run, run_json
from tests.cli.test_server_lifecycle import env, inventory  # noqa: F401 - fixtures


# A wrapper around the host's python3 (first on root's PATH over ssh): python3 itself, unless
# /root/hostile-mode names a way to garble the agent's answer line (a compromised host, a broken
# wrapper, a full disk). The filter passes every other line through as it comes (the ready line).
HOSTILE_PYTHON = """#!/bin/sh
mode=$(cat /root/hostile-mode 2>/dev/null)
[ -z "$mode" ] && exec /usr/bin/python3 "$@"
/usr/bin/python3 "$@" | /usr/bin/python3 -I -S /usr/local/bin/garble.py "$mode"
"""
GARBLE_PY = r"""
import json, sys
mode, out, prefix = sys.argv[1], sys.stdout, "PROVISION-RESULT "
for line in iter(sys.stdin.readline, ""):
    if line.startswith(prefix):
        body = line[len(prefix):].rstrip("\n")
        if mode == "truncated":
            body = body[: len(body) // 2]
        elif mode == "list":
            body = "[" + body + "]"
        elif mode == "mistyped":
            body = json.dumps(dict(json.loads(body), ok="yes"))
        elif mode == "forged":
            body = json.dumps({"ok": False, "error": {"kind": "x", "message":
                               "\x1b[2K\rgpu9  ok  patched\x1b]0;owned\x07"}})
        elif mode == "flood":
            for _ in range(40):
                out.write("y" * (1 << 20))
            out.write("\n")
        line = prefix + body + "\n"
    out.write(line)
    out.flush()
"""


@pytest.fixture(scope="module")
def thost_module(sandbox_factory, tmp_path_factory):
    from provision.sandbox.hosts import HostSpec

    hostile = tmp_path_factory.mktemp("hostile-bin")
    (hostile / "python3").write_text(HOSTILE_PYTHON)
    (hostile / "python3").chmod(0o755)
    (hostile / "garble.py").write_text(GARBLE_PY)
    host = sandbox_factory.up(HostSpec(name="trust4", address="auto", sglang="0.5.9", layout="venv",
                                       ro_binds=(("/usr/local/bin", str(hostile)),)))[0]
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(thost_module):
    thost_module.reset()
    yield thost_module
    thost_module.run("pkill -9 -f sglang", check=False)


def test_links_planted_in_a_shared_log_dir_are_never_followed(tmp_path, ssh_env, host, env):
    # /tmp/shared: writable by every account (sticky, as /tmp), the profile's log_dir. Another
    # account planted a link at each log name the next minute could give, pointing at a file root
    # would create or append to.
    host.run("mkdir -p /tmp/shared && chmod 1777 /tmp/shared")
    now = time.time()
    for s in range(-2, 90):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + s))
        for n in ("", "-2"):
            host.run(f"ln -sf /root/pwned-{stamp}{n} /tmp/shared/sglang-30000-{stamp}{n}.log")
    import yaml

    from provision.config.playbook import PACKAGE_PLAYBOOKS

    pb = yaml.safe_load((PACKAGE_PLAYBOOKS / "kimi-k25-eagle3.yaml").read_text())
    pb["launch"]["log_dir"] = "/tmp/shared"
    (tmp_path / "shared-logs.yaml").write_text(yaml.safe_dump(pb))
    inv = inventory(tmp_path, ssh_env, host)
    proc = run("launch", "-i", inv, "--playbook", str(tmp_path / "shared-logs.yaml"), "--patch", "--poll", "0.5",
               "--json", env=env, timeout=300)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    row = json.loads(proc.stdout)["hosts"][0]
    assert proc.returncode == 0 and row["verdict"] == "ready", proc.stdout + proc.stderr
    rec = json.loads(host.hostpath("/var/lib/provision/server/server-30000.json").read_text())
    assert rec["log"].startswith("/tmp/shared/") and rec["log"].endswith("-3.log"), rec["log"]
    listing = host.run("ls -la /root; find /tmp/shared -maxdepth 1 -type f -ls").stdout
    assert "pwned" not in host.run("ls /root").stdout, listing  # no file was created through a link
    assert "The server is fired up" in host.hostpath(rec["log"]).read_text()
    run_json("stop", "-i", inv, "--playbook", str(tmp_path / "shared-logs.yaml"), env=env, timeout=120)


@pytest.mark.parametrize("mode, says", [
    ("truncated", "the host's answer is not JSON"),
    ("list", "the host's answer is a JSON list, not the object provision expects"),
    ("mistyped", "the host's answer to status is not what the protocol says it answers "
                 "(value of key 'ok' of dict is not an instance of bool)"),
    ("flood", "more than 32 MiB on one line"),
])
def test_a_host_whose_answer_is_garbled_is_a_row_naming_it_not_a_traceback(tmp_path, ssh_env, host, env, mode, says):
    """A wrapper around the host's python3 garbles the agent's answer line: the row says so in a
    sentence naming the host, with the documented exit code, and no traceback reaches the user."""
    inv = inventory(tmp_path, ssh_env, host)
    first = run("status", "-i", inv, "--json", env=env, timeout=120)
    assert json.loads(first.stdout)["hosts"][0]["verdict"] == "missing", first.stdout  # as itself, it answers
    host.hostpath("/root/hostile-mode").write_text(mode)
    try:
        proc = run("status", "-i", inv, "--json", env=env, timeout=180)
    finally:
        host.hostpath("/root/hostile-mode").unlink()
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    row = json.loads(proc.stdout)["hosts"][0]
    assert row["verdict"] == "failed" and row["detail"].startswith(f"{host.name}: "), row
    assert says in row["detail"], row
    assert proc.returncode == 3, (proc.returncode, row)  # EXIT_FAILED


def test_a_host_cannot_forge_a_row_or_move_the_cursor(tmp_path, ssh_env, host, env):
    """A host's sentence carrying terminal controls (erase the line, return, retitle the terminal)
    reaches the operator's table escaped, on its own row."""
    inv = inventory(tmp_path, ssh_env, host)
    host.hostpath("/root/hostile-mode").write_text("forged")
    try:
        proc = run("status", "-i", inv, env=env, timeout=120)
    finally:
        host.hostpath("/root/hostile-mode").unlink()
    for c in ("\x1b", "\x07", "\r"):
        assert c not in proc.stdout, proc.stdout
    assert "\\x1b[2K" in proc.stdout, proc.stdout
    row = [ln for ln in proc.stdout.splitlines() if "gpu9" in ln]
    assert len(row) == 1 and row[0].split()[0] == host.name, proc.stdout
