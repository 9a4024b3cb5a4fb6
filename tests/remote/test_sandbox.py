"""The sandbox gives each simulated host its own files, processes and ports, over real sshd."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest
import yaml
from click.testing import CliRunner

from provision.sandbox import hosts as sbx
from provision.sandbox.cli import sandbox as sandbox_cli
from provision.sandbox.hosts import AddressInUse, HostSpec, Sandbox, SandboxError
from provision.sandbox.wheels import models_file

pytestmark = pytest.mark.ssh

SERVER = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); "
          "s.bind(('127.0.0.1',30000)); s.listen(); print('listening', flush=True)\n"
          "while True:\n c,_=s.accept(); c.sendall(sys.argv[1].encode()); c.close()")
CLIENT = ("import socket\ntry:\n c=socket.create_connection(('127.0.0.1',30000),timeout=3); "
          "print(c.recv(100).decode())\nexcept OSError as e:\n print('refused', e.errno)")


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _live(pid: int) -> bool:
    """Running (zombies do not count: this machine's init reaps them lazily)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ns_members(ns: str) -> list[int]:
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        for kind in ("mnt", "pid"):
            try:
                if os.readlink(f"/proc/{p}/ns/{kind}") == ns and _live(int(p)):
                    found.append(int(p))
            except OSError:
                pass
    return found


# --------------------------------------------------------------------------- isolation

def test_files_are_per_host(three_hosts, ssh_env):
    a, b, _ = three_hosts
    ssh_env.ssh(a, "echo from-a > /tmp/only-a && mkdir -p /data/x /home/u && touch /var/tmp/v /opt/o")
    assert a.hostpath("/tmp/only-a").read_text() == "from-a\n"
    out = ssh_env.ssh(b, "ls /tmp/only-a /data/x /home/u /var/tmp/v /opt/o 2>&1; true").stdout
    assert out.count("No such file") == 5, out
    assert not b.hostpath("/tmp/only-a").exists()
    # Shared system dirs stay shared; /etc/ssh is per host (own host key).
    keys = {ssh_env.ssh(h, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1] for h in three_hosts}
    assert len(keys) == 3
    with pytest.raises(ValueError):
        a.hostpath("/usr/bin/python3")
    assert a.hostpath("/var/run/sshd") == a.hostpath("/run/sshd")


def test_processes_are_per_host(three_hosts, ssh_env):
    a, b, _ = three_hosts
    ssh_env.ssh(b, "nohup sleep 600 >/dev/null 2>&1 &")
    out = ssh_env.ssh(a, "ps -e -o pid=,comm=").stdout.split("\n")
    comms = {line.split()[1] for line in out if line.strip()}
    assert comms <= {"init", "sshd", "bash", "ps"}, out
    assert "1 init" in [" ".join(line.split()) for line in out]
    assert "sleep" in ssh_env.ssh(b, "ps -e -o comm=").stdout
    # nor do this machine's pytest or listeners, nor other hosts' processes
    assert len([line for line in out if line.strip()]) < 8, out
    assert ssh_env.ssh(a, "hostname").stdout.strip() == a.name


def test_ports_are_per_host(three_hosts, ssh_env):
    a, b, _ = three_hosts
    start = f"nohup python3 -c \"{SERVER}\" {{}} >/tmp/server.log 2>&1 &"
    ssh_env.ssh(a, start.format("A"))
    assert _wait_for(lambda: "listening" in a.hostpath("/tmp/server.log").read_text())
    # A's server is invisible from B and from this machine.
    assert ssh_env.ssh(b, f"python3 -c \"{CLIENT}\"").stdout.startswith("refused")
    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", 30000))
            assert s.recv(10) != b"A"
        except OSError:
            pass
    # Both can bind 127.0.0.1:30000 at once.
    ssh_env.ssh(b, start.format("B"))
    assert _wait_for(lambda: "listening" in b.hostpath("/tmp/server.log").read_text())
    assert ssh_env.ssh(a, f"python3 -c \"{CLIENT}\"").stdout.strip() == "A"
    assert ssh_env.ssh(b, f"python3 -c \"{CLIENT}\"").stdout.strip() == "B"


def test_system_python_is_debians(three_hosts, ssh_env):
    for host in three_hosts:
        out = ssh_env.ssh(host, "python3 -c 'import sys; print(sys.executable)'; command -v python3; "
                                "ls -d /root/.pyenv 2>&1; echo $HOME").stdout.splitlines()
        assert out[0] == "/usr/bin/python3" and out[1] == "/usr/bin/python3", out
        assert "No such file" in out[2] and out[3] == "/root", out


# --------------------------------------------------------------------------- SGLang layouts

def test_sglang_layouts(three_hosts, ssh_env):
    src, venv, new = three_hosts
    rel = "srt/models/kimi_k25.py"
    assert src.sglang_dir == "/root/sglang/python/sglang"
    assert src.hostpath(f"{src.sglang_dir}/{rel}").read_bytes() == models_file("0.5.9").read_bytes()
    # An un-installed checkout: importable only with PYTHONPATH.
    probe = "python3 -c 'import importlib.util as u; s=u.find_spec(\"sglang\"); print(s and s.origin)'"
    assert ssh_env.ssh(src, probe).stdout.strip() == "None"
    assert ssh_env.ssh(src, f"PYTHONPATH=/root/sglang/python {probe}").stdout.strip() == \
        "/root/sglang/python/sglang/__init__.py"

    version = "import importlib.metadata as m; print(m.version('sglang'))"
    for host, want in ((venv, "0.5.9"), (new, "0.5.10")):
        assert host.sglang_dir == "/opt/venv/lib/python3.11/site-packages/sglang"
        out = ssh_env.ssh(host, f"/opt/venv/bin/python -c \"{version}\"; grep ^home /opt/venv/pyvenv.cfg")
        assert out.stdout.split() == [want, "home", "=", "/usr/bin"], out
        # RECORD matches every file (launch_server.py too, even when it is the stand-in shim).
        check = ("import base64,csv,hashlib,importlib.metadata as m,os\n"
                 "d=m.distribution('sglang'); bad=[]\n"
                 "for f in d.files:\n"
                 " if f.hash:\n"
                 "  h=base64.urlsafe_b64encode(hashlib.sha256(f.read_binary()).digest()).rstrip(b'=').decode()\n"
                 "  bad += [str(f)] if h != f.hash.value else []\n"
                 "print(len(d.files), bad)")
        proc = host.run(["/opt/venv/bin/python", "-c", check], check=False)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        count, bad = out.split(" ", 1)
        assert int(count) > 1000 and bad.strip() == "[]", out
    # The 0.5.9 hosts hold the same release; the 0.5.10 one a different one.
    assert venv.hostpath(f"{venv.sglang_dir}/{rel}").read_bytes() == models_file("0.5.9").read_bytes()
    assert new.hostpath(f"{new.sglang_dir}/version.py").exists()


def test_sglang_imports_and_launch_server_is_the_stand_in(three_hosts, ssh_env):
    src, venv, new = three_hosts
    # `import sglang` works as on a real server (its missing deps are stubbed for sglang's
    # own imports only); anyone else importing a missing module still fails.
    cmd = "python3 -c 'import sglang; print(sglang.__version__)'; python3 -c 'import numpy' 2>&1 | tail -1"
    assert ssh_env.ssh(src, f"cd /tmp && export PYTHONPATH=/root/sglang/python && {cmd}").stdout.splitlines() == \
        ["0.5.9", "ModuleNotFoundError: No module named 'numpy'"]
    for host, want in ((venv, "0.5.9"), (new, "0.5.10")):
        out = ssh_env.ssh(host, f"cd /tmp && export PATH=/opt/venv/bin:$PATH && {cmd}").stdout.splitlines()
        assert out == [want, "ModuleNotFoundError: No module named 'numpy'"]

    if not sbx.STANDIN_SOURCE.exists():
        for host in three_hosts:
            assert "provision sandbox" not in host.hostpath(f"{host.sglang_dir}/launch_server.py").read_text()
        pytest.skip("provision/sandbox/standin.py not written yet: hosts keep the real launch_server.py")
    for host in three_hosts:
        assert host.hostpath(f"{host.sglang_dir}/launch_server.py").read_text() == sbx.LAUNCH_SERVER_SHIM
        assert host.hostpath("/opt/provision-standin/sglang_standin.py").read_bytes() == \
            sbx.STANDIN_SOURCE.read_bytes()
    help_out = ssh_env.ssh(venv, "/opt/venv/bin/python -m sglang.launch_server --help", check=False)
    assert help_out.returncode == 0 and "--model-path" in help_out.stdout, help_out.stderr[-2000:]
    help_out = ssh_env.ssh(src, "cd /tmp && PYTHONPATH=/root/sglang/python python3 -m sglang.launch_server --help",
                           check=False)
    assert help_out.returncode == 0 and "--speculative-algorithm" in help_out.stdout, help_out.stderr[-2000:]


def test_reset_restores_host(three_hosts, ssh_env):
    src, venv, _ = three_hosts
    for host in (src, venv):
        kimi = f"{host.sglang_dir}/srt/models/kimi_k25.py"
        ssh_env.ssh(host, f"echo '# patched' >> {kimi}; cp {kimi} {kimi}.orig; touch /tmp/t /root/x; "
                          "mkdir -p /var/lib/provision && echo s > /var/lib/provision/state; "
                          "nohup sleep 600 >/dev/null 2>&1 &")
        host.reset()
        assert host.hostpath(kimi).read_bytes() == models_file("0.5.9").read_bytes()
        out = ssh_env.ssh(host, f"ls {kimi}.orig /tmp/t /root/x /var/lib/provision 2>&1; pgrep -x sleep; "
                                "ls /run/sshd /root/.ssh/authorized_keys >/dev/null && echo ok", check=False)
        assert out.stdout.count("No such file") == 4 and out.stdout.strip().endswith("ok"), out.stdout
    # Mid-test undo of SGLang edits only.
    target = src.hostpath(f"{src.sglang_dir}/srt/server_args.py")
    target.write_text("broken")
    src.reset_sglang()
    assert "class ServerArgs" in target.read_text()


# --------------------------------------------------------------------------- ssh behaviour

def test_paramiko_and_sftp(three_hosts, ssh_env, tmp_path):
    host = three_hosts.venv
    client = paramiko.SSHClient()
    client.load_host_keys(str(ssh_env.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(host.address, port=host.port, username="root", key_filename=str(ssh_env.identity),
                   look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, out, _ = client.exec_command("hostname; echo $0")
        assert out.read().decode().split() == [host.name, "bash"]
        local = tmp_path / "payload.bin"
        local.write_bytes(os.urandom(300_000))
        with client.open_sftp() as sftp:
            sftp.put(str(local), "/tmp/payload.bin")
            assert host.hostpath("/tmp/payload.bin").read_bytes() == local.read_bytes()
            sftp.get("/opt/venv/pyvenv.cfg", str(tmp_path / "cfg"))
            assert "home = /usr/bin" in (tmp_path / "cfg").read_text()
    finally:
        client.close()
    # A key this host does not know is refused.
    other = paramiko.SSHClient()
    other.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        other.connect(host.address, port=host.port, username="root", key_filename=str(ssh_env.identity),
                      look_for_keys=False, allow_agent=False, timeout=10)
    other.close()


def test_ten_concurrent_sessions(three_hosts, ssh_env):
    host = three_hosts.source
    t0 = time.monotonic()
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda i: ssh_env.ssh(host, f"sleep 1; echo s{i}", timeout=30), range(10)))
    assert sorted(r.stdout.strip() for r in results) == sorted(f"s{i}" for i in range(10))
    assert time.monotonic() - t0 < 10  # in parallel: one after another takes over 10 s


def test_kill_and_freeze_sshd(three_hosts, ssh_env):
    host = three_hosts.venv_new
    ssh_env.ssh(host, "nohup sleep 600 >/dev/null 2>&1 &")
    host.kill_sshd()
    r = ssh_env.ssh(host, "true", check=False)
    assert r.returncode == 255 and "refused" in r.stderr
    assert "sleep" in host.run("ps -e -o comm=").stdout  # what sshd started survives
    host.start_sshd()
    assert ssh_env.ssh(host, "echo back").stdout == "back\n"
    host.freeze()
    t0 = time.monotonic()
    r = subprocess.run(["ssh", "-F", str(ssh_env.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=1",
                        host.name, "true"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert r.returncode == 255 and "timed out" in r.stderr and time.monotonic() - t0 >= 1
    host.thaw()
    assert ssh_env.ssh(host, "echo thawed").stdout == "thawed\n"


# --------------------------------------------------------------------------- lifecycle

def test_up_is_idempotent_and_refuses_taken_addresses(sandbox_factory):
    box = sandbox_factory.sandbox
    host = sandbox_factory.host(layout="none", sglang=None)
    again = box.up([host.spec])[0]
    assert again.init_pid == host.init_pid
    with pytest.raises(AddressInUse):
        box.up([HostSpec("other", host.address, None, "none", host.port)])
    addr = sandbox_factory._address()
    with socket.socket() as squatter:
        squatter.bind((addr, sandbox_factory.port))
        squatter.listen()
        with pytest.raises(AddressInUse, match=f"{addr}:{sandbox_factory.port}"):
            box.up([HostSpec("squatted", addr, None, "none", sandbox_factory.port)])
    assert "squatted" not in box.hosts and "other" not in box.hosts
    # Another process (the CLI) sees the same sandbox.
    assert host.name in Sandbox(box.base_dir).hosts
    sandbox_factory.remove(host)
    assert host.name not in Sandbox(box.base_dir).hosts and not _live(host.init_pid)


def test_down_leaves_nothing(tmp_path, sandbox_factory, ssh_env):
    box = Sandbox(tmp_path / "sbx")
    specs = [HostSpec("d1", sandbox_factory._address(), "0.5.9", "venv", sandbox_factory.port),
             HostSpec("d2", sandbox_factory._address(), None, "none", sandbox_factory.port)]
    hosts = box.up(specs)
    cfg = str(box.ssh_config_path)
    # A live session (its nsenter parent holds the host's mounts) and a daemonized process.
    session = subprocess.Popen(["ssh", "-F", cfg, "d1", "sleep 600"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        subprocess.run(["ssh", "-F", cfg, "d2", "nohup sleep 600 >/dev/null 2>&1 &"], check=True, timeout=30)
        assert _wait_for(lambda: "sleep" in hosts[0].run("ps -e -o comm=").stdout)
        namespaces = [(h.pid_ns, h.mnt_ns) for h in hosts]
        pids = [p for h in hosts for p in (h.init_pid, h.listener_pid, h.unshare_pid)]
        assert all(_live(p) for p in pids)
        t0 = time.monotonic()
        Sandbox(box.base_dir).down()  # as `provision sandbox down` would, from state on disk
        assert time.monotonic() - t0 < 10
        assert not [p for p in pids if _live(p)]
        for pid_ns, mnt_ns in namespaces:
            # a process SIGKILLed by down() is gone once the kernel has reaped it: on a loaded
            # machine (CI's 4 workers) that can lag the kill by a moment, so give it 5 s, then name it
            assert _wait_for(lambda: _ns_members(pid_ns) == [] and _ns_members(mnt_ns) == [], 5.0), [
                (p, open(f"/proc/{p}/cmdline", "rb").read()) for p in _ns_members(pid_ns) + _ns_members(mnt_ns)
                if os.path.exists(f"/proc/{p}")]
        assert session.wait(timeout=10) == 255
    finally:
        session.kill()
    with open("/proc/self/mountinfo") as f:
        assert str(box.base_dir) not in f.read()
    assert not box.base_dir.exists()
    for spec in specs:  # the addresses are free again
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((spec.address, spec.port))


def test_cli_up_status_down(tmp_path, sandbox_factory):
    base = tmp_path / "cli-sbx"
    first = sandbox_factory._address()
    sandbox_factory._address()  # the second host's
    runner = CliRunner()
    r = runner.invoke(sandbox_cli, ["up", "--hosts", "2", "--layout", "none", "--first-address", first,
                                    "--port", "2222", "--base-dir", str(base)])
    try:
        assert r.exit_code == 0, r.output
        cfg = base / "ssh_config"
        assert f"ssh -F {cfg} sbx1" in r.output
        inv = yaml.safe_load((base / "inventory.yaml").read_text())
        assert inv["defaults"] == {"user": "root", "identity": str(base / "client/id_ed25519"),
                                   "known_hosts": str(base / "known_hosts"),
                                   "args": {"model-path": "/data/models/Kimi-K2.5",
                                            "speculative-draft-model-path": "/data/models/Kimi-K25-eagle3"}}
        assert inv["hosts"]["sbx1"] == {"address": first, "port": 2222} and len(inv["hosts"]) == 2
        assert f"[{first}]:2222 ssh-ed25519 " in (base / "known_hosts").read_text()
        out = subprocess.run(["ssh", "-F", str(cfg), "sbx2", "hostname"], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL)
        assert out.stdout == "sbx2\n", out.stderr
        r = runner.invoke(sandbox_cli, ["status", "--base-dir", str(base)])
        assert r.exit_code == 0 and r.output.count(" up ") == 2, r.output
    finally:
        r = runner.invoke(sandbox_cli, ["down", "--base-dir", str(base)])
    assert r.exit_code == 0 and "stopped 2 host(s)" in r.output, r.output
    assert not base.exists()
    r = runner.invoke(sandbox_cli, ["status", "--base-dir", str(base)])
    assert "no sandbox hosts" in r.output


def test_cli_up_never_rebuilds_or_drops_running_hosts_behind_the_users_back(tmp_path, sandbox_factory):
    """A second `up` with other options (or fewer hosts) is refused with a sentence: it used to rebuild
    the hosts without their stand-in GPUs, wiping patches and servers, and stop listing the third
    (issue 37, item 7). The same options again keep the hosts as they are."""
    base = tmp_path / "cli-sbx"
    first = sandbox_factory._address()
    for _ in range(2):
        sandbox_factory._address()
    runner = CliRunner()
    args = ["--hosts", "3", "--layout", "none", "--first-address", first, "--port", "2222", "--base-dir", str(base)]
    r = runner.invoke(sandbox_cli, ["up", *args, "--gpu-capability", "12.0"])
    try:
        assert r.exit_code == 0, r.output
        assert "a stand-in nvidia-smi reports 8 of compute capability 12.0" in r.output, r.output
        pids = {n: h.init_pid for n, h in Sandbox(base).hosts.items()}
        r = runner.invoke(sandbox_cli, ["up", *args, "--gpu-capability", "12.0"])
        assert r.exit_code == 0, r.output
        assert {n: h.init_pid for n, h in Sandbox(base).hosts.items()} == pids, "kept as they were"
        r = runner.invoke(sandbox_cli, ["up", *args])
        assert r.exit_code == 2 and "already run with other options" in r.output, r.output
        assert "--gpu-capability 12.0" in r.output and "provision sandbox down" in r.output, r.output
        # the commands to paste act on this sandbox, not the default one (issue 63)
        assert f"--gpu-capability 12.0 --base-dir {base}`" in r.output, r.output
        assert f"`provision sandbox down --base-dir {base}` first" in r.output, r.output
        fewer = [a if a != "3" else "2" for a in args]
        r = runner.invoke(sandbox_cli, ["up", *fewer, "--gpu-capability", "12.0"])
        assert r.exit_code == 2 and "would stop listing sbx3" in r.output, r.output
        assert {n: h.init_pid for n, h in Sandbox(base).hosts.items()} == pids, "nothing was rebuilt"
    finally:
        runner.invoke(sandbox_cli, ["down", "--base-dir", str(base)])


def test_hosts_die_with_their_owner(tmp_path, sandbox_factory):
    """A test session killed without teardown (owner_pid) leaves no host running."""
    addr = sandbox_factory._address()
    script = (f"import os, sys, time; sys.path.insert(0, {str(Path(sbx.__file__).parents[2])!r})\n"
              "from provision.sandbox.hosts import Sandbox, HostSpec\n"
              f"box = Sandbox({str(tmp_path / 'owned')!r}, owner_pid=os.getpid())\n"
              f"h = box.up([HostSpec('o1', {addr!r}, None, 'none', {sandbox_factory.port})])[0]\n"
              "print(h.init_pid, h.listener_pid, flush=True); time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(_live(p) for p in pids)
    finally:
        owner.kill()
        owner.wait()
    assert _wait_for(lambda: not any(_live(p) for p in pids), 10)
    Sandbox(tmp_path / "owned").down()
    assert not (tmp_path / "owned").exists()


def test_missing_prereqs_are_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setattr(sbx, "_euid", lambda: 1000)
    monkeypatch.setattr(sbx, "_executable", lambda path: not path.endswith("sshd"))
    problems = Sandbox.check_prereqs()
    assert any("root" in p for p in problems)
    assert any("apt-get install -y openssh-server" in p for p in problems)
    r = CliRunner().invoke(sandbox_cli, ["up", "--base-dir", str(tmp_path / "x")])
    assert r.exit_code == 2
    assert r.output.startswith("error: the sandbox cannot run here: ") and r.output.count("\n") == 1
    with pytest.raises(SandboxError, match="cannot run here"):
        Sandbox(tmp_path / "y").up([HostSpec("h", "127.0.0.99")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
