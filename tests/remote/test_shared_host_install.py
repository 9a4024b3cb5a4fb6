"""On a shared host, a user's SGLang checkout never steers root (over real sshd).

A venv host (the real install: /opt/venv, root's) where an unprivileged user ("nobody",
uid 65534; /etc is shared with this machine, so no user is added) owns /home/alice and
has there a full SGLang checkout, /home/alice/sglang/python/sglang, found by discovery's
`/home/*/sglang/python/sglang` glob. Its sglang/__init__.py writes a marker when it is
imported as root. The user also runs a "server" from it, as that uid (cwd in the
checkout, so its interpreter imports the checkout).

`patch`, `patch --verify-import`, `patch --overlay` and `status` must neither write into
the checkout nor import it as root; they act on /opt/venv; `status` names the checkout
it skipped and why, the user's server that did not choose, and which rule chose.
"""

from __future__ import annotations

import hashlib
import os
import pwd

import pytest

from tests.cli.helpers import run, run_json

UID = 65534
USER = pwd.getpwuid(UID).pw_name
CHECKOUT = "/home/alice/sglang/python/sglang"
MARKER = "/home/alice/MARKER-init"

COPY = f"mkdir -p /home/alice/sglang/python && cp -a {{site}}/sglang {CHECKOUT}"
EVIL = f"""import os as _o
if _o.geteuid() == 0:
    open("{MARKER}", "a").write("imported as root\\n")
"""
SETUP = f"""
set -e
chown -R {UID}:{UID} /home/alice
chmod 755 /home/alice
cd /home/alice/sglang/python
nohup setpriv --reuid={UID} --regid={UID} --clear-groups \\
  /usr/bin/python3 -c 'import time; time.sleep(3600)' -m sglang.launch_server --port 31998 >/dev/null 2>&1 &
sleep 0.5
"""


@pytest.fixture(scope="module")
def host(sandbox_factory):
    h = sandbox_factory.host(name="shared-inst", sglang="0.5.9", layout="venv")
    try:
        yield h
    finally:
        sandbox_factory.remove(h)


@pytest.fixture
def planted(host):
    host.reset()
    host.run(COPY.format(site=host.site_packages))
    init = host.hostpath(f"{CHECKOUT}/__init__.py")
    init.write_text(EVIL + init.read_text())
    done = host.run(SETUP, check=False)
    assert done.returncode == 0, done.stderr
    assert host.run(f"pgrep -u {UID} -f sglang.launch_server | wc -l").stdout.strip() == "1"
    # the user's own import of it (not root) leaves no marker: the marker means root only
    assert not host.hostpath(MARKER).exists()
    return host


def tree(host) -> dict:
    """Every file under the user's home, with its bytes' digest: what root must not change."""
    base = host.hostpath("/home/alice")
    out = {}
    for root, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, base)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def pycache(host) -> list:
    """__pycache__ dirs root would leave by importing the checkout."""
    return [r for r, d, f in os.walk(host.hostpath(CHECKOUT)) if os.path.basename(r) == "__pycache__"]


def test_status_skips_a_users_checkout_and_their_server_and_says_why(planted, ssh_env):
    h = planted
    args = [*ssh_env.cli_args, "--host", h.name]
    proc = run("status", *args, check_rc=4)  # 4: the real install is not patched yet
    out = proc.stdout
    assert f"skipped {CHECKOUT}: owned by {USER}" in out, out
    assert f"runs as {USER}" in out and "does not choose the install" in out, out
    assert f"install {h.sglang_dir}: chosen because it is the only trusted install" in out, out
    proc, doc = run_json("status", *args, check_rc=4)
    row = doc["hosts"][0]
    assert row["install"] == h.sglang_dir, row
    assert CHECKOUT not in [i["path"] for i in row["data"]["installs"]], "an untrusted install is never a candidate"
    assert row["data"]["chosen_reason"] == "it is the only trusted install on this host", row["data"]
    assert not h.hostpath(MARKER).exists()


def test_root_actions_never_write_into_or_import_a_users_checkout(planted, ssh_env):
    h = planted
    # --force: the user's server "loading" must not be what keeps root out of their checkout
    args = [*ssh_env.cli_args, "--host", h.name, "--force"]
    before = tree(h)
    for argv in (("patch", *args, "--verify-import"), ("unpatch", *args), ("patch", *args, "--overlay"),
                 ("unpatch", *args, "--overlay"), ("patch", *args)):
        proc, doc = run_json(*argv)
        assert not h.hostpath(MARKER).exists(), (argv, h.hostpath(MARKER).read_text())
        assert [k for k, v in tree(h).items() if before.get(k) != v] == [], argv  # nothing written into it
        assert pycache(h) == [], argv
        row = doc["hosts"][0]
        assert row["install"] == h.sglang_dir, (argv, row["install"], row["detail"])
        assert proc.returncode == 0, (argv, proc.returncode, proc.stdout, proc.stderr)
    # the real install was patched
    kimi = h.hostpath(f"{h.sglang_dir}/srt/models/kimi_k25.py").read_text()
    assert "get_embed_and_head" in kimi
    run("status", *ssh_env.cli_args, "--host", h.name, check_rc=0)
    assert not h.hostpath(MARKER).exists()


def test_a_checkout_named_explicitly_is_used_with_a_warning(planted, ssh_env):
    h = planted
    proc = run("status", *ssh_env.cli_args, "--host", h.name, "--sglang-path", CHECKOUT, check_rc=4)
    assert (f"warning: {CHECKOUT}: owned by {USER}; used anyway because it was named "
            "explicitly") in proc.stdout, proc.stdout
    assert f"install {CHECKOUT}: chosen because it was pinned with --sglang-path" in proc.stdout, proc.stdout
