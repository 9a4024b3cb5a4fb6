"""Discovery never runs a local user's code as root (over real sshd).

A host with an unprivileged user ("nobody", uid 65534: /etc is shared with this
machine, so no user is added) who owns /home/alice and plants what discovery used
to execute as root:
  * /home/alice/venv/bin/python3, a script matched by the /home/*/*/bin/python3 glob;
  * /home/alice/env2, a real venv whose site-packages holds a .pth that runs code;
  * /home/alice/evil/sitecustomize.py, on the PYTHONPATH of two "servers" running as
    that user: one with the system python, one with the user's venv.
Each writes a marker only when run as root. `status`, `patch`, `audit` and
`reconcile` must never create one; `status` names the skipped interpreters.
"""

from __future__ import annotations

import os
import pwd

import pytest

from tests.cli.helpers import run, run_json

UID = 65534
USER = pwd.getpwuid(UID).pw_name
MARKERS = ("/home/alice/MARKER-script", "/home/alice/MARKER-pth", "/home/alice/MARKER-pythonpath")

SETUP = f"""
set -e
mkdir -p /home/alice/venv/bin /home/alice/evil
cat > /home/alice/venv/bin/python3 <<'EOF'
#!/bin/sh
[ "$(id -u)" = 0 ] && echo "run as root: $*" >> /home/alice/MARKER-script
exec /usr/bin/python3 "$@"
EOF
chmod 755 /home/alice/venv/bin/python3
/usr/bin/python3 -m venv --without-pip /home/alice/env2
echo 'import os; os.geteuid() == 0 and open("/home/alice/MARKER-pth", "a").write("pth ran as root\\n")' \\
  > "$(echo /home/alice/env2/lib/python3*/site-packages)/zz_evil.pth"
cat > /home/alice/evil/sitecustomize.py <<'EOF'
import os
if os.geteuid() == 0:
    open("/home/alice/MARKER-pythonpath", "a").write("sitecustomize ran as root\\n")
EOF
chown -R {UID}:{UID} /home/alice
chmod 755 /home/alice
cd /home/alice
for py in /usr/bin/python3 /home/alice/env2/bin/python3; do
  PYTHONPATH=/home/alice/evil nohup setpriv --reuid={UID} --regid={UID} --clear-groups \\
    "$py" -c 'import time; time.sleep(3600)' -m sglang.launch_server --port 31999 >/dev/null 2>&1 &
done
sleep 0.5
"""


@pytest.fixture(scope="module")
def host(sandbox_factory):
    h = sandbox_factory.host(name="trust-disc", sglang="0.5.9", layout="venv")
    try:
        yield h
    finally:
        sandbox_factory.remove(h)


@pytest.fixture
def planted(host):
    host.reset()
    done = host.run(SETUP, check=False)
    assert done.returncode == 0, done.stderr
    servers = host.run("pgrep -u 65534 -f sglang.launch_server | wc -l").stdout.strip()
    assert servers == "2", "both stand-in 'servers' run as the unprivileged user"
    return host


def markers(host) -> dict:
    return {m: host.hostpath(m).read_text() for m in MARKERS if host.hostpath(m).exists()}


def test_discovery_never_runs_a_users_code_as_root(planted, ssh_env, tmp_path):
    h = planted
    args = [*ssh_env.cli_args, "--host", h.name]
    proc = run("status", *args, check_rc=4)  # 4: not patched yet
    assert markers(h) == {}
    out = proc.stdout
    assert f"skipped /home/alice/venv/bin/python3: owned by {USER}" in out, out
    assert "skipped /home/alice/env2/bin/python3: /home/alice is owned by" in out, out
    assert "server: pid" in out, "the servers were seen (their PYTHONPATH was read as data, never run)"

    for argv in (("patch", *args), ("audit", *args), ("unpatch", *args),
                 ("reconcile", "-i", ssh_env.inventory(tmp_path / "inv.yaml", [h]))):
        proc = run(*argv)
        assert proc.returncode in (0, 6), (argv, proc.returncode, proc.stdout, proc.stderr)
        assert markers(h) == {}, argv
    # the venv install the host really has was found (and is held unpatched after the unpatch: 4)
    proc, doc = run_json("status", *args, check_rc=4)
    assert doc["hosts"][0]["install"].startswith("/opt/venv/"), doc
    assert markers(h) == {}


def test_an_interpreter_named_explicitly_is_used_with_a_warning(planted, ssh_env):
    h = planted
    proc = run("status", *ssh_env.cli_args, "--host", h.name, "--python", "/home/alice/venv/bin/python3",
               check_rc=4)
    assert (f"warning: /home/alice/venv/bin/python3: owned by {USER}; used anyway because it was named "
            "explicitly") in proc.stdout, proc.stdout
    assert "run as root" in markers(h).get("/home/alice/MARKER-script", ""), "the user asked for it"
    assert "/home/alice/MARKER-pythonpath" not in markers(h), "a server's PYTHONPATH is still only data"
