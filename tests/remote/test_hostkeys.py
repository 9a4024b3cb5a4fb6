"""Host-key checking over real sshd: what `provision` does with unknown, new, changed,
revoked and CA-signed host keys, and which known_hosts files it reads and writes.

A user checks: the exit code, the one line printed for the host, and the bytes of
their known_hosts file (appended to, never rewritten; untouched when refused).
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess

import pytest

from provision.control.transport.hostkeys import host_key_name
from tests.cli.helpers import run

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def khost(sandbox_factory):
    host = sandbox_factory.host("hk1", sglang="0.5.9", layout="source")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def env(tmp_path):
    """No stray settings from the caller's environment; an empty "system" known_hosts."""
    system = tmp_path / "ssh_known_hosts"
    system.write_text("")
    return {"PROVISION_SYSTEM_KNOWN_HOSTS": str(system), "PROVISION_KNOWN_HOSTS": "", "PROVISION_SSH_CONFIG": "",
            "PROVISION_JOURNAL": str(tmp_path / "journal.jsonl")}


def host_key(host) -> tuple[str, str]:
    kind, b64 = host.hostpath("/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    return kind, b64


def sha256_fp(b64: str) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(base64.b64decode(b64)).digest()).decode().rstrip("=")


def other_key(tmp_path) -> str:
    n = len(list(tmp_path.glob("other_key*")))
    path = tmp_path / f"other_key{n}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                   stdin=subprocess.DEVNULL)
    return path.with_suffix(".pub").read_text().split()[1]


def base_args(ssh_env, known_hosts) -> list[str]:
    return ["--ssh-config", str(ssh_env.ssh_config), "--identity", str(ssh_env.identity),
            "--known-hosts", str(known_hosts), "--connect-timeout", "5"]


def one_line(proc, host) -> str:
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(host.name), proc.stdout
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_unknown_refused_accept_new_appends_changed_refused(khost, ssh_env, env, tmp_path):
    kind, b64 = host_key(khost)
    name = host_key_name(khost.address, khost.port)
    kh = tmp_path / "known_hosts"
    # a user's file: a comment, another host, and no newline at the end
    prior = b"# my hosts\nother.example ssh-ed25519 " + other_key(tmp_path).encode()
    kh.write_bytes(prior)

    refused = run("status", *base_args(ssh_env, kh), "--host", khost.name, env=env)
    assert refused.returncode == 3
    line = one_line(refused, khost)
    assert "unknown host key" in line and sha256_fp(b64) in line
    assert "--accept-new-host-keys" in line and "ssh-keyscan" in line
    assert kh.read_bytes() == prior, "a refused key is not recorded"

    ok = run("status", *base_args(ssh_env, kh), "--host", khost.name, "--accept-new-host-keys", env=env)
    assert ok.returncode in (0, 4), ok.stdout + ok.stderr
    after = kh.read_bytes()
    assert after.startswith(prior), "appended, never rewritten"
    assert after[len(prior):] == f"\n{name} {kind} {b64}\n".encode()

    again = run("status", *base_args(ssh_env, kh), "--host", khost.name, env=env)
    assert again.returncode in (0, 4) and kh.read_bytes() == after, "a known key is not recorded twice"

    # the host "was reinstalled" (or someone is in the middle): known_hosts holds another key
    changed = after.replace(b64.encode(), other_key(tmp_path).encode())
    kh.write_bytes(changed)
    bad = run("status", *base_args(ssh_env, kh), "--host", khost.name, "--accept-new-host-keys", env=env)
    assert bad.returncode == 3
    line = one_line(bad, khost)
    assert "host key CHANGED" in line and sha256_fp(b64) in line and "ssh-keygen" in line
    assert f"{kh}:3" in line, "says which known_hosts line holds the old key"
    assert kh.read_bytes() == changed, "--accept-new-host-keys never replaces a known key"


def test_revoked_is_never_accepted_and_markers_do_not_crash(khost, ssh_env, env, tmp_path):
    kind, b64 = host_key(khost)
    name = host_key_name(khost.address, khost.port)
    kh = tmp_path / "known_hosts"
    content = (f"@cert-authority *.example.com ssh-ed25519 {other_key(tmp_path)}\n"
               f"@revoked * {kind} {b64}\n"
               f"{name} {kind} {b64}\n").encode()
    kh.write_bytes(content)
    for extra in ([], ["--accept-new-host-keys"]):
        proc = run("status", *base_args(ssh_env, kh), "--host", khost.name, *extra, env=env)
        assert proc.returncode == 3, proc.stdout
        line = one_line(proc, khost)
        assert "@revoked" in line and sha256_fp(b64) in line
        assert "@cert-authority" in proc.stderr and "not supported" in proc.stderr  # a warning, not a crash
        assert kh.read_bytes() == content

    # the CA line alone (the host key not listed): still just an unknown key, refused, no crash
    kh.write_bytes(content.splitlines(keepends=True)[0])
    proc = run("status", *base_args(ssh_env, kh), "--host", khost.name, env=env)
    assert proc.returncode == 3 and "unknown host key" in one_line(proc, khost)


def _config(tmp_path, host, ssh_env, known: str, strict: str) -> str:
    cfg = tmp_path / f"ssh_config_{strict}"
    cfg.write_text(f"Host gpu-{strict}\n  HostName {host.address}\n  Port {host.port}\n  User root\n"
                   f"  IdentityFile {ssh_env.identity}\n  UserKnownHostsFile {known}\n"
                   f"  StrictHostKeyChecking {strict}\n")
    return str(cfg)


def test_ssh_config_user_known_hosts_file_and_strict_checking(khost, ssh_env, env, tmp_path):
    kind, b64 = host_key(khost)
    name = host_key_name(khost.address, khost.port)
    # StrictHostKeyChecking accept-new + UserKnownHostsFile (a file that does not exist yet)
    kh_new = tmp_path / "sub" / "kh_new"
    cfg = _config(tmp_path, khost, ssh_env, str(kh_new), "accept-new")
    proc = run("status", "--ssh-config", cfg, "--host", "gpu-accept-new", env=env)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # reached (4: the host is not patched)
    assert kh_new.read_text() == f"{name} {kind} {b64}\n"
    assert (os.stat(kh_new).st_mode & 0o777) == 0o600

    # StrictHostKeyChecking yes + an empty UserKnownHostsFile: refused, and that file is named
    kh_strict = tmp_path / "kh_strict"
    kh_strict.write_text("")
    cfg = _config(tmp_path, khost, ssh_env, str(kh_strict), "yes")
    proc = run("status", "--ssh-config", cfg, "--host", "gpu-yes", env=env)
    assert proc.returncode == 3
    line = proc.stdout.strip()
    assert "unknown host key" in line and str(kh_strict) in line
    assert kh_strict.read_text() == ""

    # the same, with the key in the "system" file (/etc/ssh/ssh_known_hosts): accepted, nothing written
    system = env["PROVISION_SYSTEM_KNOWN_HOSTS"]
    with open(system, "w") as fh:
        fh.write(f"{name} {kind} {b64}\n")
    proc = run("status", "--ssh-config", cfg, "--host", "gpu-yes", env=env)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr
    assert kh_strict.read_text() == ""


def test_global_known_hosts_file_from_the_ssh_config_is_trusted(khost, ssh_env, env, tmp_path):
    """A fleet's managed known_hosts named by GlobalKnownHostsFile (two files, the key in the second):
    the host is reached with an empty user file and StrictHostKeyChecking yes, nothing is written;
    with the key in neither, it is refused as unknown, naming the files it read."""
    kind, b64 = host_key(khost)
    name = host_key_name(khost.address, khost.port)
    managed = tmp_path / "fleet" / "ssh_known_hosts"
    managed.parent.mkdir()
    managed.write_text(f"{name} {kind} {b64}\n")
    first = tmp_path / "fleet" / "empty_known_hosts"
    first.write_text("")
    user = tmp_path / "user_known_hosts"
    user.write_text("")
    cfg = tmp_path / "ssh_config_global"
    cfg.write_text(f"Host gpu-global\n  HostName {khost.address}\n  Port {khost.port}\n  User root\n"
                   f"  IdentityFile {ssh_env.identity}\n  UserKnownHostsFile {user}\n"
                   f"  GlobalKnownHostsFile {first} {managed}\n  StrictHostKeyChecking yes\n")
    proc = run("status", "--ssh-config", cfg, "--host", "gpu-global", env=env)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr  # reached (4: the host is not patched)
    assert user.read_text() == "" and managed.read_text() == f"{name} {kind} {b64}\n"

    managed.write_text("")
    proc = run("status", "--ssh-config", cfg, "--host", "gpu-global", env=env)
    assert proc.returncode == 3
    line = proc.stdout.strip()
    assert "unknown host key" in line and str(managed) in line and str(user) in line
