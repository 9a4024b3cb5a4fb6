"""Faults over real sshd that must not lose data, hang, or be retried blindly.

What a user checks after each: the verdict and exit code, that the model file holds
exactly its old or exactly its new bytes, that no temp file is left among the
models, that `provision status` tells which, and that the next run just works.

A remote step is held "in flight" deterministically by holding the host's provision
lock (as another run would): the engine then waits in the lock, and the test cuts
the connection, presses Ctrl-C, freezes sshd or drops the host's packets. Changes
between read and write are covered by tests/engine/test_fileops.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from provision.errors import AuthError, HostKeyError
from provision.config.inventory import adhoc
from provision.control.runner import ConnOptions, Fleet
from tests.cli.helpers import KIMI, KIMI_CLASS, METHODS, PROVISION, class_methods, run_json

pytestmark = pytest.mark.ssh

LOCK = "/var/lib/provision/lock"
ENGINE_MARK = b"provision.host.agent"


@pytest.fixture(scope="module")
def pair(sandbox_factory):
    from provision.sandbox.hosts import HostSpec
    n = sandbox_factory._count = sandbox_factory._count + 1
    hosts = sandbox_factory.up(HostSpec(f"fault-a{n}", "auto", "0.5.9", "source", sandbox_factory.port),
                               HostSpec(f"fault-b{n}", "auto", "0.5.9", "source", sandbox_factory.port))
    yield hosts
    sandbox_factory.remove(*hosts)


@pytest.fixture
def hosts(pair):
    for h in pair:
        h.reset()
    return pair


@pytest.fixture
def host(hosts):
    return hosts[0]


# ---------------------------------------------------------------- helpers

def kimi_in_host(host) -> str:
    return os.path.join(host.sglang_dir, KIMI)


def kimi(host):
    return host.hostpath(kimi_in_host(host))


def models(host) -> list[str]:
    return sorted(os.listdir(os.path.dirname(kimi(host))))


def is_patched(data: bytes) -> bool:
    return class_methods(data, KIMI_CLASS)[-3:] == METHODS


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def engine_pids(host) -> list[int]:
    pids = []
    for pid in host.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if ENGINE_MARK in fh.read():
                    pids.append(pid)
        except OSError:
            pass
    return pids


def waiting_on_the_lock(host) -> bool:
    """An engine process of the host has the host's lock file open: the remote step has its
    request and has begun (it waits for the lock holding_lock holds). The engine's process alone is
    not that: it exists before the request reaches it, and a cut then is "before the step started"."""
    for pid in engine_pids(host):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == LOCK:
                    return True
            except OSError:
                continue
    return False


@contextlib.contextmanager
def holding_lock(host):
    """Hold the host's provision lock (as another run would) until the block ends."""
    code = ("import fcntl,os,sys,time; os.makedirs('/var/lib/provision', 0o700, exist_ok=True); "
            f"fd=os.open('{LOCK}', os.O_RDWR|os.O_CREAT, 0o600); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(120)")
    pid = host.run(f"python3 -c \"{code}\" > /tmp/lockholder.out 2>&1 < /dev/null & echo $!").stdout.strip()
    try:
        wait_for(lambda: host.hostpath("/tmp/lockholder.out").read_text().startswith("held"), 10, "the lock holder")
        yield
    finally:
        host.run(f"kill -9 {pid}", check=False)


def lock_is_free(host) -> bool:
    code = (f"import fcntl,os; fd=os.open('{LOCK}', os.O_RDWR|os.O_CREAT, 0o600); "
            "fcntl.flock(fd, fcntl.LOCK_EX|fcntl.LOCK_NB); print('free')")
    return host.run(["python3", "-c", code], check=False).stdout.strip() == "free"


def start(*args, env=None) -> subprocess.Popen:
    argv = [PROVISION] if PROVISION else ["python3", "-m", "provision"]
    return subprocess.Popen(argv + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=dict(os.environ, COLUMNS="200", **(env or {})),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def host_records(stdout: str) -> dict:
    import json
    return {h["host"]: h for h in json.loads(stdout)["hosts"]}


def status_state(ssh_env, host) -> str:
    proc, doc = run_json("status", *ssh_env.cli_args, "--host", host.name)
    verdict = doc["hosts"][0]["verdict"]
    assert proc.returncode == (0 if verdict in ("patched", "native") else 4), proc.stdout  # 4: not as wanted
    return doc["hosts"][0]["data"]["patch_state"]


def assert_consistent_and_recovers(ssh_env, host, before: bytes, listing: list[str]) -> bytes:
    """After a fault: old or new bytes exactly, status agrees, the next patch works, no debris."""
    wait_for(lambda: not engine_pids(host), 40, "the remote engine to end")
    now = kimi(host).read_bytes()
    state = status_state(ssh_env, host)
    if now == before:
        assert state.startswith("missing"), state
    else:
        assert is_patched(now) and state == "patched", state
    assert not [n for n in set(models(host)) - set(listing) if n.endswith(".py") or n.endswith(".pyc")]
    proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name)
    assert proc.returncode == 0, proc.stdout
    assert doc["hosts"][0]["verdict"] == ("patched" if now == before else "unchanged")
    final = kimi(host).read_bytes()
    assert is_patched(final) and (now == before or final == now)
    assert models(host) == listing, "no temp files or other debris among the models"
    assert lock_is_free(host)
    return now


# ---------------------------------------------------------------- kill points

KILL_POINTS = {"before_read": False, "after_temp_write": False, "after_replace": True, "before_verify": True}


def test_failpoints_left_in_a_shell_never_kill_a_real_patch(host, ssh_env):
    """A shell left over from running the tests (PROVISION_FAILPOINTS set) without the suite's
    PROVISION_TEST_MODE: the run is refused with exit 2 naming the variable, the host untouched;
    the failpoint never reaches the host, and without it the same patch just works."""
    env = {k: v for k, v in os.environ.items() if k != "PROVISION_TEST_MODE"}
    env["PROVISION_FAILPOINTS"] = "after_replace"
    argv = [PROVISION] if PROVISION else ["python3", "-m", "provision"]
    before = kimi(host).read_bytes()
    proc = subprocess.run(argv + ["patch", *ssh_env.cli_args, "--host", host.name], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "PROVISION_FAILPOINTS" in proc.stderr and "nothing was done" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert kimi(host).read_bytes() == before and engine_pids(host) == []
    del env["PROVISION_FAILPOINTS"]
    proc = subprocess.run(argv + ["patch", *ssh_env.cli_args, "--host", host.name], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert is_patched(kimi(host).read_bytes())


@pytest.fixture(scope="module")
def quad(sandbox_factory):
    from provision.sandbox.hosts import HostSpec
    n = sandbox_factory._count = sandbox_factory._count + 1
    hosts = sandbox_factory.up(*(HostSpec(f"kill{i}-{n}", "auto", "0.5.9", "source", sandbox_factory.port)
                                 for i in range(len(KILL_POINTS))))
    yield hosts
    sandbox_factory.remove(*hosts)


def test_engine_killed_at_each_point(quad, ssh_env):
    """PROVISION_FAILPOINTS="P=kill" SIGKILLs the engine at P; one host per point, all at once."""
    for h in quad:
        h.reset()
    by_point = dict(zip(KILL_POINTS, quad))
    before = {p: kimi(h).read_bytes() for p, h in by_point.items()}
    listing = {p: models(h) for p, h in by_point.items()}
    procs = {p: start("patch", *ssh_env.cli_args, "--host", h.name, "--json",
                      env={"PROVISION_FAILPOINTS": f"{p}=kill"})
             for p, h in by_point.items()}
    outs = {p: proc.communicate(timeout=120) for p, proc in procs.items()}
    killed = {}
    for point, h in by_point.items():
        assert procs[point].returncode == 3, (point, outs[point])
        rec = host_records(outs[point][0])[h.name]
        assert rec["verdict"] == "unknown" and "provision status" in rec["detail"], (point, rec)
        now = killed[point] = kimi(h).read_bytes()
        assert (now != before[point]) is KILL_POINTS[point], f"{point}: the file was replaced or not"
        assert now == before[point] or is_patched(now), f"{point}: exactly the old or the new bytes"
        new_names = set(models(h)) - set(listing[point])
        assert not [n for n in new_names if n.endswith((".py", ".pyc"))], (point, new_names)
    # `provision status` tells which, for every host at once
    names = [h.name for h in quad]
    proc, doc = run_json("status", *ssh_env.cli_args, *(a for n in names for a in ("--host", n)))
    assert proc.returncode == 4, proc.stdout  # some hosts are still unpatched: not as wanted
    states = {r["host"]: r["data"]["patch_state"] for r in doc["hosts"]}
    for point, h in by_point.items():
        want = "patched" if KILL_POINTS[point] else "missing"
        assert states[h.name].startswith(want), (point, states[h.name])
    # and the next patch just works, leaving no debris
    proc, doc = run_json("patch", *ssh_env.cli_args, *(a for n in names for a in ("--host", n)))
    assert proc.returncode == 0, proc.stdout
    verdicts = {r["host"]: r["verdict"] for r in doc["hosts"]}
    for point, h in by_point.items():
        assert verdicts[h.name] == ("unchanged" if KILL_POINTS[point] else "patched"), point
        final = kimi(h).read_bytes()
        assert is_patched(final) and (final == killed[point] or not KILL_POINTS[point])
        assert models(h) == listing[point], f"{point}: stale temp file removed"
        assert lock_is_free(h)


# ---------------------------------------------------------------- the connection dies mid-step

def test_connection_cut_mid_step_is_unknown_then_status_tells(host, ssh_env):
    before, listing = kimi(host).read_bytes(), models(host)
    with holding_lock(host):
        proc = start("patch", *ssh_env.cli_args, "--host", host.name, "--timeout", "60", "--json")
        wait_for(lambda: waiting_on_the_lock(host), 60, "the remote step to wait for the host's lock")
        t_cut = time.monotonic()
        host.kill_sshd()  # sshd and every session process of this host die
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t_cut
        host.start_sshd()
    assert proc.returncode == 3, err
    rec = host_records(out)[host.name]
    assert rec["verdict"] == "unknown" and "provision status" in rec["detail"], rec
    assert took < 10, f"noticed the dead connection after {took:.1f} s, not at its 60 s deadline"
    assert_consistent_and_recovers(ssh_env, host, before, listing)


def test_ctrl_c_mid_step_leaves_no_temp_files_or_locks(host, ssh_env):
    before, listing = kimi(host).read_bytes(), models(host)
    with holding_lock(host):
        proc = start("patch", *ssh_env.cli_args, "--host", host.name, "--timeout", "60")
        wait_for(lambda: waiting_on_the_lock(host), 60, "the remote step to wait for the host's lock")
        t_int = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t_int
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err and "Traceback" not in err
    assert took < 8, f"Ctrl-C took {took:.1f} s to return"
    line = [ln for ln in out.splitlines() if ln.startswith(host.name)]
    assert line and "unknown" in line[0] and "provision status" in line[0], out
    assert_consistent_and_recovers(ssh_env, host, before, listing)


def test_two_runs_at_once_one_patches(host, ssh_env):
    listing = models(host)
    procs = [start("patch", *ssh_env.cli_args, "--host", host.name, "--json") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    recs = [host_records(o)[host.name] for o, _ in outs]
    verdicts = sorted(r["verdict"] for r in recs)
    assert verdicts in (["patched", "unchanged"], ["failed", "patched"]), recs
    if "failed" in verdicts:
        assert any(r["error_kind"] == "locked" for r in recs), recs
    assert is_patched(kimi(host).read_bytes()) and models(host) == listing
    assert lock_is_free(host)


# ---------------------------------------------------------------- the disk says no

def test_read_only_models_dir_fails_cleanly(host, ssh_env):
    before, listing = kimi(host).read_bytes(), models(host)
    d = os.path.dirname(kimi_in_host(host))
    host.run(f"mount --bind {d} {d} && mount -o remount,ro,bind {d}")
    try:
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name)
    finally:
        host.run(f"umount {d}")
    assert proc.returncode == 3
    rec = doc["hosts"][0]
    assert rec["verdict"] == "failed" and "Read-only file system (EROFS)" in rec["detail"], rec
    assert "was left as it was" in rec["detail"]
    assert kimi(host).read_bytes() == before and models(host) == listing


def test_disk_full_fails_cleanly(host, ssh_env):
    d = os.path.dirname(kimi_in_host(host))
    f = kimi_in_host(host)
    # the models on a small tmpfs of their own, filled up
    host.run(f"cp -a {d} /tmp/models-copy && mount -t tmpfs -o size=8m tmpfs {d} && cp -a /tmp/models-copy/. {d}/ "
             f"&& (dd if=/dev/zero of={d}/.filler bs=4k 2>/dev/null || true) && rm -rf /tmp/models-copy")
    try:
        before = host.run(f"sha256sum {f} && ls -a {d}").stdout
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", host.name)
        after = host.run(f"sha256sum {f} && ls -a {d}").stdout
    finally:
        host.run(f"umount {d}")
    assert proc.returncode == 3
    rec = doc["hosts"][0]
    assert rec["verdict"] == "failed" and "No space left on device (ENOSPC)" in rec["detail"], rec
    assert after == before, "file untouched, no temp file left in the full directory"


# ---------------------------------------------------------------- retries: what is and is not retried

def _fleet(ssh_env, **kw) -> Fleet:
    opts = dict(ssh_config=str(ssh_env.ssh_config), identity=str(ssh_env.identity),
                known_hosts=str(ssh_env.known_hosts), connect_timeout=5)
    opts.update(kw)
    return Fleet(ConnOptions(**opts))


BACKOFF = 0.5 + 1.0 + 2.0  # the waits between Session.open's 4 attempts


def test_transient_refusal_is_retried_and_succeeds(host, ssh_env):
    session = _fleet(ssh_env).session(adhoc([host.name]).hosts[0])
    host.kill_sshd()
    threading.Timer(1.0, host.start_sshd).start()
    t0 = time.monotonic()
    try:
        session.open()
        assert session.exec("echo ok")[:2] == (0, "ok\n")
    finally:
        session.close()
    assert session.attempts >= 2, "the first attempts were refused"
    assert time.monotonic() - t0 < BACKOFF + 5



def test_auth_and_host_key_failures_are_never_retried(host, ssh_env, tmp_path, monkeypatch):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True,
                   stdin=subprocess.DEVNULL)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    monkeypatch.setenv("PROVISION_SYSTEM_KNOWN_HOSTS", str(empty))
    for kw, exc in (({"identity": str(other)}, AuthError), ({"known_hosts": str(empty)}, HostKeyError)):
        session = _fleet(ssh_env, **kw).session(adhoc([host.name]).hosts[0])
        t0 = time.monotonic()
        with pytest.raises(exc):
            session.open()
        took = time.monotonic() - t0
        session.close()
        assert session.attempts == 1, f"{exc.__name__} was retried"
        assert took < BACKOFF, f"{exc.__name__} took {took:.1f} s"


# ---------------------------------------------------------------- silent partitions

IPTABLES = shutil.which("iptables")


def _iptables_ok() -> bool:
    return bool(IPTABLES) and subprocess.run([IPTABLES, "-w", "-n", "-L", "INPUT"], capture_output=True).returncode == 0


@contextlib.contextmanager
def silent_drop(host):
    """Drop every packet to and from this host's address:port (both ways: a silent partition)."""
    rules = [["INPUT", "-p", "tcp", "-d", host.address, "--dport", str(host.port), "-j", "DROP"],
             ["INPUT", "-p", "tcp", "-s", host.address, "--sport", str(host.port), "-j", "DROP"]]
    added = []
    try:
        for rule in rules:
            subprocess.run([IPTABLES, "-w", "-I", *rule], check=True, capture_output=True)
            added.append(rule)
        yield
    finally:
        for rule in added:
            subprocess.run([IPTABLES, "-w", "-D", *rule], capture_output=True)


@contextlib.contextmanager
def partition(host, how: str):
    if how == "drop":
        if not _iptables_ok():
            pytest.skip("needs a working iptables (apt-get install -y iptables)")
        with silent_drop(host):
            yield
    else:
        host.freeze()  # sshd stopped: TCP is still accepted, SSH never answers
        try:
            yield
        finally:
            host.thaw()


@pytest.mark.parametrize("how", ["freeze", "drop"])
def test_silent_host_at_handshake_fails_within_connect_timeout(hosts, ssh_env, how):
    bad, good = hosts
    before = kimi(bad).read_bytes()
    with partition(bad, how):
        t0 = time.monotonic()
        proc, doc = run_json("patch", *ssh_env.cli_args, "--host", bad.name, "--host", good.name,
                             "--connect-timeout", "2", "--timeout", "60", timeout=120)
        took = time.monotonic() - t0
    assert took < 2 + 15, f"took {took:.1f} s"
    recs = {h["host"]: h for h in doc["hosts"]}
    assert proc.returncode == 3
    assert recs[good.name]["verdict"] == "patched"
    assert recs[bad.name]["verdict"] == "unreachable", recs[bad.name]
    assert "within 2 s" in recs[bad.name]["detail"]
    assert kimi(bad).read_bytes() == before


def test_silent_host_mid_step_fails_within_its_deadline(hosts, ssh_env):
    """The engine answers, but the packets are dropped (iptables; sshd frozen where there is none)."""
    how = "drop" if _iptables_ok() else "freeze"
    bad, good = hosts
    before, listing = kimi(bad).read_bytes(), models(bad)
    deadline = 5
    with holding_lock(bad):
        t0 = time.monotonic()
        proc = start("patch", *ssh_env.cli_args, "--host", bad.name, "--host", good.name, "--json",
                     "--timeout", str(deadline))
        wait_for(lambda: engine_pids(bad), 20, "the remote engine")
        with partition(bad, how):
            # let the engine finish now: its answer is what the partition swallows
            bad.run("pkill -9 -f 'time.sleep\\(120\\)'", check=False)
            out, err = proc.communicate(timeout=120)
            took = time.monotonic() - t0
    assert took < deadline + 15, f"took {took:.1f} s"
    recs = host_records(out)
    assert proc.returncode == 3, err
    assert recs[good.name]["verdict"] == "patched"
    assert recs[bad.name]["verdict"] == "unknown", recs[bad.name]
    assert f"no answer within {deadline} s" in recs[bad.name]["detail"]
    assert_consistent_and_recovers(ssh_env, bad, before, listing)
