"""A non-root SSH user: writes go through sudo, and sudo never leaves provision waiting.

The users are real accounts of this machine (the sandbox hosts share /etc/passwd,
/etc/shadow and /etc/sudoers.d with it), made with unique names and removed again;
each host has its own /home, so the key is authorized inside the host.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
import time

import pytest

from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, class_methods, run, run_json

pytestmark = pytest.mark.ssh

SUFFIX = secrets.token_hex(3)
USERS = {role: f"pv{role}{SUFFIX}" for role in ("nopw", "nosudo", "pw", "tty")}
PASSWORD = "pw-" + secrets.token_hex(8) + " with space"
SUDOERS = f"/etc/sudoers.d/provision-test-{SUFFIX}"


def _tools_missing() -> list[str]:
    return [t for t in ("useradd", "userdel", "usermod", "chpasswd", "visudo", "sudo") if not shutil.which(t)]


@pytest.fixture(scope="module")
def users():
    missing = _tools_missing()
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install -y sudo passwd)")
    made = []
    try:
        for name in USERS.values():
            subprocess.run(["useradd", "-M", "-d", f"/home/{name}", "-s", "/bin/bash", name], check=True,
                           capture_output=True)
            made.append(name)
            # "*": no password, but not "locked" (sshd without PAM refuses locked accounts)
            subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        subprocess.run(["chpasswd"], input=f"{USERS['pw']}:{PASSWORD}\n", text=True, check=True,
                       capture_output=True)
        rules = (f"{USERS['nopw']} ALL=(root) NOPASSWD: ALL\n"
                 f"{USERS['pw']} ALL=(root) ALL\n"
                 f"Defaults:{USERS['tty']} requiretty\n"
                 f"{USERS['tty']} ALL=(root) NOPASSWD: ALL\n")
        tmp = SUDOERS + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(rules)
        os.chmod(tmp, 0o440)
        subprocess.run(["visudo", "-c", "-q", "-f", tmp], check=True, capture_output=True)
        os.rename(tmp, SUDOERS)  # sudo skips names with a dot: the .tmp was never live
        yield USERS
    finally:
        for path in (SUDOERS, SUDOERS + ".tmp"):
            if os.path.exists(path):
                os.unlink(path)
        for name in made:
            subprocess.run(["userdel", "-f", name], capture_output=True)


@pytest.fixture(scope="module")
def phost(sandbox_factory, users):
    host = sandbox_factory.host("priv1", sglang="0.5.9", layout="source")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(phost, users):
    phost.reset()  # also drops files `up` did not make, such as these homes
    for name in users.values():
        phost.run(f"mkdir -p /home/{name}/.ssh && cp /root/.ssh/authorized_keys /home/{name}/.ssh/ && "
                  f"chown -R {name}: /home/{name} && chmod 700 /home/{name}/.ssh")
    return phost


def kimi(host):
    return host.hostpath(os.path.join(host.sglang_dir, KIMI))


def args(ssh_env, host, user, *extra):
    return [*ssh_env.cli_args, "--host", host.name, "--user", user, "--timeout", "60", *extra]


class ProcWatch:
    """Reads every host process's command line and environment while a run goes on."""

    def __init__(self, host, needle: str):
        self.host, self.needle = host, needle.encode()
        self.seen_cmdlines: list[bytes] = []
        self.leaks: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            for pid in self.host.processes():
                for what in ("cmdline", "environ"):
                    try:
                        with open(f"/proc/{pid}/{what}", "rb") as fh:
                            data = fh.read()
                    except OSError:
                        continue
                    if what == "cmdline":
                        self.seen_cmdlines.append(data)
                    if self.needle in data:
                        self.leaks.append(f"{pid} {what}: {data[:200]!r}")
            time.sleep(0.01)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def saw(self, fragment: bytes) -> bool:
        return any(fragment in c for c in self.seen_cmdlines)


@pytest.fixture
def odd_owner(host):
    """The model file owned by uid 1234, group 2345, mode 0640; put back afterwards (reset keeps owners)."""
    path = kimi(host)
    os.chown(path, 1234, 2345)
    os.chmod(path, 0o640)
    yield path
    os.chown(path, 0, 0)
    os.chmod(path, 0o644)


def test_passwordless_sudo_patches_and_keeps_owner_group_mode(host, users, ssh_env, tmp_path, odd_owner):
    path = odd_owner
    # a file of another uid makes the install not root's alone: discovery skips it unless it is named
    proc = run("patch", *args(ssh_env, host, users["nopw"]))
    assert proc.returncode == 3 and f"{path.name} is owned by uid 1234" in proc.stdout, proc.stdout
    pin = ("--sglang-path", host.sglang_dir)
    proc, doc = run_json("patch", *args(ssh_env, host, users["nopw"], *pin))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["hosts"][0]["verdict"] == "patched"
    assert any("used anyway because it was named explicitly" in n for n in doc["hosts"][0]["notes"])
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 2345, 0o640)
    assert class_methods(path.read_bytes(), KIMI_CLASS)[-3:] == METHODS
    # root's state dir (sudo ran the engine as root), not the user's
    assert any(host.hostpath("/var/lib/provision/backups").iterdir())
    assert not host.hostpath(f"/home/{users['nopw']}/.local").exists()

    # with a password file but a NOPASSWD rule, sudo never asks: still fine
    pwfile = tmp_path / "pw"
    pwfile.write_text("unused\n")
    pwfile.chmod(0o600)
    proc = run("patch", *args(ssh_env, host, users["nopw"], "--sudo-password-file", str(pwfile), *pin))
    assert proc.returncode == 0 and "unchanged" in proc.stdout, proc.stdout + proc.stderr


def test_no_sudo_rights_fails_at_once_with_one_line(host, users, ssh_env):
    before = kimi(host).read_bytes()
    t0 = time.monotonic()
    proc = run("patch", *args(ssh_env, host, users["nosudo"]), timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "failed" in lines[0], proc.stdout
    assert "sudo needs a password" in lines[0] and "NOPASSWD" in lines[0] and "--sudo-password-file" in lines[0]
    assert elapsed < 20, "never waits at a prompt"
    assert kimi(host).read_bytes() == before


def test_sudo_password_file_sent_only_on_stdin(host, users, ssh_env, tmp_path):
    path = kimi(host)
    before = path.read_bytes()
    wrong = tmp_path / "wrong"
    wrong_pw = "wrong-" + secrets.token_hex(8)
    wrong.write_text(wrong_pw + "\n")
    wrong.chmod(0o600)
    t0 = time.monotonic()
    with ProcWatch(host, wrong_pw) as watch:
        proc = run("patch", *args(ssh_env, host, users["pw"], "--sudo-password-file", str(wrong)))
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 3 and "sudo rejected the password" in proc.stdout, proc.stdout
    assert watch.saw(b"sudo\x00-S\x00-p\x00"), "the watch saw sudo waiting for the password"
    assert watch.leaks == []
    assert path.read_bytes() == before

    good = tmp_path / "good"
    good.write_text(PASSWORD + "\n")
    good.chmod(0o600)
    with ProcWatch(host, PASSWORD) as watch:
        proc, doc = run_json("patch", *args(ssh_env, host, users["pw"], "--sudo-password-file", str(good)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["hosts"][0]["verdict"] == "patched"
    assert class_methods(path.read_bytes(), KIMI_CLASS)[-3:] == METHODS
    assert watch.saw(b"PROVISION-READY"), "the watch saw the engine run"
    assert watch.leaks == [], "the password is in no command line or environment"
    assert PASSWORD not in proc.stdout + proc.stderr

    # a world-readable password file is used, with a warning
    good.chmod(0o644)
    proc = run("status", *args(ssh_env, host, users["pw"], "--sudo-password-file", str(good)))
    assert proc.returncode in (0, 4) and "readable by others" in proc.stderr, proc.stdout


def test_requiretty_says_how_to_fix(host, users, ssh_env):
    before = kimi(host).read_bytes()
    proc = run("patch", *args(ssh_env, host, users["tty"]))
    assert proc.returncode == 3
    line = proc.stdout.strip()
    assert "requiretty" in line and f"Defaults:{users['tty']} !requiretty" in line, line
    assert kimi(host).read_bytes() == before
