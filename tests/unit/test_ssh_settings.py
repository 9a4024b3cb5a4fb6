"""ssh config resolution (with Include) and the known_hosts reader."""


import paramiko
import pytest

from provision.errors import ConfigError, HostKeyError
from provision.hostkeys import KnownHosts, VerifyingPolicy
from provision.sshconfig import expand_includes, load_ssh_config, resolve


@pytest.mark.parametrize("openssh", [None, False], ids=["ssh-G", "paramiko"])
def test_include_is_followed_and_flags_win(tmp_path, monkeypatch, openssh):
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh = tmp_path / ".ssh"
    (ssh / "conf.d").mkdir(parents=True)
    (ssh / "gpu").write_text("")
    (ssh / "conf.d" / "cluster.conf").write_text("Host gpu01\n  HostName 10.9.9.9\n  User ubuntu\n  Port 2222\n"
                                                 "  IdentityFile ~/.ssh/gpu\n  ProxyJump admin@bastion\n")
    (ssh / "config").write_text("Include conf.d/*.conf\nHost *\n  ConnectTimeout 7\n")
    cfg = load_ssh_config(None, openssh=openssh)
    t = resolve("gpu01", config=cfg)
    assert (t.hostname, t.user, t.port, t.jump) == ("10.9.9.9", "ubuntu", 2222, "admin@bastion")
    assert t.identities == (str(tmp_path / ".ssh" / "gpu"),) and t.connect_timeout == 7
    t2 = resolve("gpu01", config=cfg, user="root", port=22, identity="/k")
    assert (t2.user, t2.port, t2.identities) == ("root", 22, ("/k",))
    t3 = resolve("other", config=cfg)
    assert (t3.hostname, t3.user, t3.port) == ("other", "root", 22)


def test_include_loop_is_refused(tmp_path):
    (tmp_path / "a").write_text(f"Include {tmp_path}/a\n")
    with pytest.raises(ConfigError, match="nested"):
        expand_includes((tmp_path / "a").read_text(), tmp_path)


def test_strict_host_key_checking_values():
    cfg = paramiko.SSHConfig.from_text("Host x\n  StrictHostKeyChecking accept-new\n  UserKnownHostsFile /kh\n")
    t = resolve("x", config=cfg)
    assert t.strict == "accept-new" and t.known_hosts == ("/kh",)
    with pytest.raises(ConfigError):
        resolve("y", config=paramiko.SSHConfig.from_text("Host y\n  StrictHostKeyChecking maybe\n"))


def _key():
    return paramiko.Ed25519Key.from_private_key_file if False else paramiko.RSAKey.generate(1024)


def test_known_hosts_tolerates_markers_and_refuses_revoked(tmp_path):
    good, revoked, unknown = _key(), _key(), _key()
    kh = tmp_path / "known_hosts"
    kh.write_text(
        f"@cert-authority *.example ssh-rsa {good.get_base64()}\n"
        f"@revoked * ssh-rsa {revoked.get_base64()}\n"
        f"garbage line\n"
        f"h1 ssh-rsa {good.get_base64()}\n"
        f"h2 ssh-rsa {revoked.get_base64()}\n")
    known = KnownHosts([str(kh)], include_system=False)
    assert any("@cert-authority" in w for w in known.warnings)
    client = paramiko.SSHClient()
    known.install(client)
    assert client.get_host_keys().lookup("h1") is not None
    assert client.get_host_keys().lookup("h2") is None  # a revoked key is never trusted
    pol = VerifyingPolicy(known, "accept-new", "h2", str(kh))
    with pytest.raises(HostKeyError, match="revoked"):
        pol.missing_host_key(client, "h2", revoked)
    with pytest.raises(HostKeyError, match="unknown host key"):
        VerifyingPolicy(known, "yes", "h3", str(kh)).missing_host_key(client, "h3", unknown)
    before = kh.read_text()
    VerifyingPolicy(known, "accept-new", "h3", str(kh)).missing_host_key(client, "h3", unknown)
    after = kh.read_text()
    assert after.startswith(before) and after.endswith(f"h3 ssh-rsa {unknown.get_base64()}\n")
