"""ssh config resolution (with Include) and the known_hosts reader."""


import os

import paramiko
import pytest

from provision.errors import ConfigError, HostKeyError
from provision.control.transport.hostkeys import KnownHosts, VerifyingPolicy
from provision.control.transport.settings import expand_includes, load_ssh_config, resolve


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


# ---------------------------------------------------------------- ssh -G: what the config set

def _openssh():
    import shutil

    if not shutil.which("ssh"):
        pytest.skip("needs the OpenSSH client")


def test_ssh_G_tells_what_the_config_set_from_openssh_defaults(tmp_path):
    """ssh -G prints the local user, port 22 and ~/.ssh/id_* for every host; none of that may
    pass for a setting (User would beat the inventory, the id_* files would hide the agent)."""
    _openssh()
    import getpass

    me = getpass.getuser()
    cfg = tmp_path / "config"
    cfg.write_text(f"Host explicit\n  User {me}\n  IdentityFile {tmp_path}/k1\n  IdentityFile {tmp_path}/k2\n"
                   "  UserKnownHostsFile /kh1 /kh2\n  ConnectTimeout 3\n  ServerAliveInterval 7\n"
                   "  IdentitiesOnly yes\n  StrictHostKeyChecking accept-new\n"
                   "Match host matched\n  HostName 10.1.2.3\n")
    for k in ("k1", "k2"):
        (tmp_path / k).write_text("")
    sc = load_ssh_config(str(cfg))
    assert sc.source == "ssh -G"
    plain = sc.lookup("plain")
    assert plain == {"hostname": "plain"}  # no user, no identities, no known_hosts
    t = resolve("plain", config=sc)
    assert (t.user, t.identities, t.connect_timeout, t.keepalive, t.strict) == ("root", (), 10.0, 15, "yes")
    t = resolve("explicit", config=sc)
    assert t.user == me  # set by the config, even though it equals the local user
    assert t.identities == (f"{tmp_path}/k1", f"{tmp_path}/k2") and t.identities_only
    assert t.known_hosts == ("/kh1", "/kh2") and t.strict == "accept-new"
    assert (t.connect_timeout, t.keepalive) == (3.0, 7)
    assert resolve("matched", config=sc).hostname == "10.1.2.3"  # Match, which we never parsed ourselves
    assert resolve("explicit", config=sc, user="flag").user == "flag"
    sc.lookup("explicit")
    assert sc.asked == 3  # one ssh -G per host name per run, cached


@pytest.mark.parametrize("openssh", [None, False], ids=["ssh-G", "paramiko"])
def test_proxy_command_tokens_and_proxy_jump_chains(tmp_path, openssh):
    if openssh is None:
        _openssh()
    cfg = tmp_path / "config"
    cfg.write_text("Host pc\n  HostName 10.0.0.5\n  Port 2222\n  User ops\n  ProxyCommand ssh -W %h:%p jump\n"
                   "Host deep\n  HostName 10.0.0.6\n  ProxyJump a,ops@b:2200,c\n"
                   "Host a\n  HostName 10.0.0.1\nHost c\n  User cu\n")
    sc = load_ssh_config(str(cfg), openssh=openssh)
    pc = resolve("pc", config=sc)
    assert pc.proxy_command == "ssh -W 10.0.0.5:2222 jump" and pc.via is None
    deep = resolve("deep", config=sc)
    chain = []
    t = deep.via
    while t is not None:
        chain.append((t.user, t.hostname, t.port))
        t = t.via
    assert chain == [("cu", "c", 22), ("ops", "b", 2200), ("root", "10.0.0.1", 22)]  # the whole chain, not `a`
    # the inventory's jump wins over the config's ProxyJump and ProxyCommand
    assert resolve("pc", config=sc, jump="x").via.hostname == "x" and resolve("pc", config=sc, jump="x").proxy_command is None


def test_a_config_openssh_rejects_is_a_config_error(tmp_path):
    _openssh()
    cfg = tmp_path / "config"
    cfg.write_text("Host x\n  NoSuchOption yes\n")
    with pytest.raises(ConfigError, match="OpenSSH rejects"):
        load_ssh_config(str(cfg)).lookup("x")


def test_a_proxy_command_that_cannot_run_is_a_one_line_connect_error(tmp_path):
    from provision.errors import ConnectError
    from provision.control.transport.hostkeys import KnownHosts
    from provision.control.transport.ssh import Session

    cfg = tmp_path / "config"
    cfg.write_text("Host pc\n  ProxyCommand /nonexistent/ssh -W %h:%p jump\n")
    t = resolve("pc", config=load_ssh_config(str(cfg), openssh=False))
    with pytest.raises(ConnectError, match="cannot run the ProxyCommand .*/nonexistent/ssh -W pc:22 jump"):
        Session(t, known=KnownHosts([], include_system=False), retries=1).open()


@pytest.mark.parametrize("openssh", [None, False], ids=["ssh-G", "paramiko"])
def test_global_known_hosts_file_is_read_from_the_config(tmp_path, openssh):
    """GlobalKnownHostsFile: every file it names, in order ("none" dropped); unset: None (the
    system file, /etc/ssh/ssh_known_hosts), not OpenSSH's printed default."""
    if openssh is None:
        _openssh()
    cfg = tmp_path / "config"
    cfg.write_text("Host managed\n  GlobalKnownHostsFile /etc/fleet/known_hosts ~/fleet2\n"
                   "Host nothing\n  GlobalKnownHostsFile none\n")
    sc = load_ssh_config(str(cfg), openssh=openssh)
    assert resolve("managed", config=sc).global_known_hosts == (
        "/etc/fleet/known_hosts", os.path.expanduser("~/fleet2"))
    assert resolve("nothing", config=sc).global_known_hosts == ()
    assert resolve("plain", config=sc).global_known_hosts is None


def test_known_hosts_loads_the_global_files_given_instead_of_the_system_file(tmp_path):
    from provision.control.transport.hostkeys import KnownHosts

    key = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    (tmp_path / "g1").write_text("")
    (tmp_path / "g2").write_text(f"fleet-host ssh-ed25519 {key}\n")
    kh = KnownHosts([str(tmp_path / "user")], system=[str(tmp_path / "g1"), str(tmp_path / "g2")])
    assert kh.system_files == [str(tmp_path / "g1"), str(tmp_path / "g2")]
    assert kh.keys.lookup("fleet-host") is not None and kh.loaded == [str(tmp_path / "g1"), str(tmp_path / "g2")]
    assert KnownHosts([], system=()).system_files == []


def test_proxy_command_runs_in_the_users_shell_with_exec(tmp_path, monkeypatch):
    """As OpenSSH: `$SHELL -c 'exec COMMAND'`: $VARs, quoting, pipes and redirections are the
    shell's, and the process paramiko holds (and kills on close) is the command itself."""
    from provision.control.transport.ssh import ShellProxyCommand

    monkeypatch.setenv("SHELL", "/bin/sh")
    monkeypatch.setenv("GREETING", "hello proxy")
    pc = ShellProxyCommand('printf "%s\\n" "$GREETING" 2>/dev/null | tr a-z A-Z')
    assert pc.cmd[:2] == ["/bin/sh", "-c"] and pc.cmd[2].startswith("exec printf")
    pc.settimeout(10)
    got = b""
    while not got.endswith(b"\n"):
        got += pc.recv(64)  # what there is, at once (a socket's recv), never a wait to fill 64 bytes
    assert got == b"HELLO PROXY\n"
    assert pc.recv(64) == b""  # the command exited: an end of file, at once
    pc.close()
