"""ssh -G's answers kept by what ssh said it read (control/transport/openssh_cache.py): a kept answer
is exactly what a fresh `ssh -G` gives for the same files, and any change to a file ssh read, to a
directory an Include globs, or a config whose answer may change on its own asks ssh again."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from provision.control.transport import openssh_cache
from provision.control.transport.settings import load_ssh_config, parse_dump

pytestmark = pytest.mark.skipif(not shutil.which("ssh"), reason="needs the OpenSSH client")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def d(tmp_path):
    """The configs' directory (its entries are part of what an answer depends on: not the cache's)."""
    out = tmp_path / "ssh"
    out.mkdir()
    return out


def _old(*paths):
    """Files written more than the racy window ago (a file changed in the last 2 s is never trusted)."""
    t = time.time() - 10
    for p in paths:
        os.utime(p, (t, t))


def _ask(cfg, name):
    """A fresh run's lookup: (answer, how many ssh -G processes it ran)."""
    sc = load_ssh_config(str(cfg))
    try:
        return sc.lookup(name), sc.asked
    finally:
        sc.close()


def _fresh(cfg, name, tmp_path):
    """What ssh -G answers with no cache at all (another cache directory, empty)."""
    old = os.environ["XDG_CACHE_HOME"]
    os.environ["XDG_CACHE_HOME"] = str(tmp_path / f"fresh-{time.monotonic_ns()}")
    try:
        return _ask(cfg, name)[0]
    finally:
        os.environ["XDG_CACHE_HOME"] = old


def test_a_kept_answer_is_what_ssh_says_until_a_file_it_read_or_a_globbed_directory_changes(tmp_path, d):
    confd = d / "conf.d"
    confd.mkdir()
    part = confd / "50-gpu.conf"
    part.write_text("Host gpu01\n  HostName 10.9.9.9\n  Port 2222\n")
    cfg = d / "config"
    cfg.write_text(f"Include {confd}/*.conf\nInclude {d}/later.d/*.conf\n"
                   "Match originalhost gpu01\n  User ubuntu\nHost *\n  ConnectTimeout 7\n")
    _old(part, cfg)

    first, asked = _ask(cfg, "gpu01")
    assert asked == 1 and first["hostname"] == "10.9.9.9" and first["user"] == "ubuntu"
    again, asked = _ask(cfg, "gpu01")
    assert asked == 0, "the second run did not ask ssh"
    assert again == first == _fresh(cfg, "gpu01", tmp_path)
    assert _ask(cfg, "gpu02")[1] == 1, "another name is another question"

    # an edited file ssh read
    part.write_text("Host gpu01\n  HostName 10.9.9.10\n  Port 2222\n")
    _old(part)
    edited, asked = _ask(cfg, "gpu01")
    assert asked == 1 and edited["hostname"] == "10.9.9.10" and edited == _fresh(cfg, "gpu01", tmp_path)

    # a new file the Include's glob now matches, sorted before the old one: it wins
    early = confd / "10-override.conf"
    early.write_text("Host gpu01\n  HostName 10.9.9.11\n")
    _old(early)
    added, asked = _ask(cfg, "gpu01")
    assert asked == 1 and added["hostname"] == "10.9.9.11" and added == _fresh(cfg, "gpu01", tmp_path)

    # an Include that matched nothing, now matching (its directory created)
    later = d / "later.d"
    later.mkdir()
    (later / "x.conf").write_text("Host gpu01\n  ProxyJump admin@bastion\n")
    _old(later / "x.conf")
    jumped, asked = _ask(cfg, "gpu01")
    assert asked == 1 and jumped.get("proxyjump") == "admin@bastion" and jumped == _fresh(cfg, "gpu01", tmp_path)

    # a removed file
    early.unlink()
    removed, asked = _ask(cfg, "gpu01")
    assert asked == 1 and removed["hostname"] == "10.9.9.10"
    assert _ask(cfg, "gpu01")[1] == 0


@pytest.mark.parametrize("text", [
    "Match host gpu01 exec \"test -e {flag}\"\n  HostName 10.7.7.7\n",
    "Host gpu01\n  IdentityFile ${{HOME}}/k\n",
], ids=["match-exec", "env"])
def test_a_config_whose_answer_can_change_on_its_own_is_asked_every_run(tmp_path, d, text):
    flag = tmp_path / "flag"
    cfg = d / "config"
    cfg.write_text(text.format(flag=flag))
    _old(cfg)
    assert _ask(cfg, "gpu01")[1] == 1
    assert _ask(cfg, "gpu01")[1] == 1, "never kept"
    if "exec" in text:  # and the answer does change without any file changing
        assert _ask(cfg, "gpu01")[0]["hostname"] == "gpu01"
        flag.write_text("")
        assert _ask(cfg, "gpu01")[0]["hostname"] == "10.7.7.7"


def test_a_file_changed_in_the_last_seconds_is_not_trusted(d):
    cfg = d / "config"
    cfg.write_text("Host gpu01\n  HostName 10.9.9.9\n")  # just written: ssh may have read it mid-write
    assert _ask(cfg, "gpu01")[1] == 1
    assert _ask(cfg, "gpu01")[1] == 1
    _old(cfg)
    assert _ask(cfg, "gpu01")[1] == 1
    assert _ask(cfg, "gpu01")[1] == 0


def test_a_kept_answer_others_could_write_is_ignored(d):
    cfg = d / "config"
    cfg.write_text("Host gpu01\n  HostName 10.9.9.9\n")
    _old(cfg)
    _ask(cfg, "gpu01")
    kept = list(os.scandir(openssh_cache.cache_dir()))
    assert len(kept) == 1 and oct(os.stat(kept[0]).st_mode & 0o777) == "0o600"
    assert oct(os.stat(openssh_cache.cache_dir()).st_mode & 0o777) == "0o700"
    os.chmod(kept[0], 0o664)
    assert _ask(cfg, "gpu01")[1] == 1, "a group-writable answer is not believed"


def test_what_ssh_said_it_read():
    """Pure: the files and directories from `ssh -v -G`'s stderr, the wrapper left out."""
    debug = ("OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026\n"
             "debug1: Reading configuration data /tmp/provision-ssh-x.conf\n"
             "debug1: Reading configuration data /home/a/.ssh/config\n"
             "debug1: /home/a/.ssh/config line 1: include /home/a/.ssh/conf.d/*.conf matched no files\n"
             "debug1: Reading configuration data /etc/ssh/ssh_config\n"
             "debug1: /etc/ssh/ssh_config line 19: include /etc/ssh/ssh_config.d/*.conf matched no files\n"
             "debug1: /etc/ssh/ssh_config line 21: Applying options for *\n")
    files, dirs = openssh_cache.read_list(debug, "/tmp/provision-ssh-x.conf")
    assert files == ["/home/a/.ssh/config", "/etc/ssh/ssh_config"]
    assert dirs == ["/etc/ssh", "/etc/ssh/ssh_config.d", "/home/a/.ssh", "/home/a/.ssh/conf.d"]


def test_ssh_v_says_what_it_read_on_this_machine(tmp_path):
    """The one thing the cache relies on OpenSSH for: `-v` names every config file it reads."""
    inc = tmp_path / "inc.conf"
    inc.write_text("Host x\n  Port 2200\n")
    cfg = tmp_path / "config"
    cfg.write_text(f"Include {inc}\n")
    p = subprocess.run(["ssh", "-v", "-G", "-F", str(cfg), "x"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert parse_dump(p.stdout)["port"] == "2200"
    assert openssh_cache.read_list(p.stderr, "")[0] == [str(cfg), str(inc)]


def test_nothing_is_kept_when_ssh_did_not_say_what_it_read(tmp_path):
    """An ssh whose -v output lacks the files it read (a wrapper script, another client) would key
    the answer on nothing: it is never kept."""
    assert openssh_cache.keep("k" * 64, "/tmp/wrapper.conf", "hostname x\n", "") is False
    assert openssh_cache.keep("k" * 64, "/tmp/wrapper.conf", "hostname x\n",
                              "debug1: Reading configuration data /tmp/other.conf\n") is False
    assert not os.path.exists(openssh_cache.cache_dir())


def test_a_user_without_a_passwd_entry_is_asked_every_run(d, monkeypatch):
    """A bare container's uid may have no passwd entry: nothing to key the answer on, no traceback."""
    import pwd

    cfg = d / "config"
    cfg.write_text("Host gpu01\n  HostName 10.9.9.9\n")
    _old(cfg)

    def nobody(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", nobody)
    assert _ask(cfg, "gpu01") == ({"hostname": "10.9.9.9"}, 1)
    assert _ask(cfg, "gpu01")[1] == 1
