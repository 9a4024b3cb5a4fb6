"""Simulated GPU hosts on this machine: one real OpenSSH ``sshd`` per loopback address.

Each host is a set of Linux namespaces (mount, PID, network, UTS) whose PID 1 is a
tiny reaper (``init.py`` below, run by Debian's ``/usr/bin/python3``). Per-host
directories are bind-mounted over ``/root /tmp /run /var /opt /home /data`` and
``/etc/ssh``, so a host sees only its own files, processes and ports; everything
else (``/usr``, ``/etc``, ...) is this machine's, read-write, shared.

The host's sshd cannot listen on ``127.0.0.x`` of this machine (the host has its
own network namespace), so a *listener* (``listener.py`` below, one small process
per host in the root namespaces) accepts TCP connections on ``address:port`` and,
inetd style, runs ``nsenter --target <init> ... -- /usr/sbin/sshd -i`` with the
accepted socket as stdin/stdout. No bytes are pumped by Python.

Control-side layout of ``base_dir``::

    sandbox.json            state: hosts, pids (another process can `down`)
    client/id_ed25519       throwaway client key, authorized on every host
    known_hosts ssh_config  for OpenSSH / paramiko clients
    bin/init.py listener.py the two helper programs
    hosts/<name>/fs/<dir>   what the host sees at /<dir> (etc-ssh is /etc/ssh)
    hosts/<name>/host.log   init, listener and sshd (-e) stderr

A second kind of host, booted by a real systemd (a podman container), is in
``systemd.py``: ``HostSpec(kind="systemd")``.

``hosts/<name>/fs`` is a symlink into ``data_dir``: by default a directory in
``/dev/shm`` (tmpfs), because copying SGLang (2,000 files) onto this machine's ext4
costs seconds of kernel time and onto tmpfs 0.2 s. Hosts get a private /dev/shm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from provision.sandbox.wheels import FLASHINFER, WheelUnavailable, dist_info, extracted

DEFAULT_BASE_DIR = "/var/tmp/provision-sandbox"
SYSTEM_PYTHON = "/usr/bin/python3"
SSHD = "/usr/sbin/sshd"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LAYOUTS = ("source", "venv", "none")
ENGINES = ("sglang", "vllm")
# A vLLM host (`sandbox up --engine vllm`): where it sees the cached venv and the tiny models, and the
# shipped playbook its inventory line names
VLLM_VENV_IN_HOST = "/opt/vllm-env"
VLLM_MODELS_IN_HOST = "/data/models/tiny-vllm"
VLLM_PLAYBOOK = "sandbox-vllm"
KINDS = ("namespaces", "systemd")  # systemd: a podman container booted by systemd (sandbox/systemd.py)

# provision's caches on a host, each keyed by what it was made from (a bundle by its sha256, preflight's
# tables and the registry's skeletons by their files' mtime and size): what `reset()` keeps by default
KEPT_CACHES = ("var/lib/provision/bundles", "var/lib/provision/cache")

# In-host mount point -> per-host directory name under hosts/<name>/fs/.
MOUNTS = {
    "/root": "root",
    "/tmp": "tmp",
    "/run": "run",
    "/var": "var",
    "/opt": "opt",
    "/home": "home",
    "/data": "data",
    "/etc/ssh": "etc-ssh",
}

# A host with podman (HostSpec.podman) also gets its own /etc/containers (this machine's is
# never read or changed): runc, cgroupfs, file logs (SSH_NOTES.md), storage in the host's own
# /var and /run, and the sandbox's image store (images.shared_store(), where sglang_image.py
# builds the SGLang images) mounted read-only as an additional image store.
PODMAN_ETC = "/etc/containers"
PODMAN_ETC_SUB = "etc-containers"
PODMAN_IMAGES = "/var/lib/provision-sandbox-images"
PODMAN_CONTAINERS_CONF = """\
# provision sandbox host: podman settings for this host only (see provision/sandbox/hosts.py)
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
PODMAN_STORAGE_CONF = f"""\
# provision sandbox host: this host's own image store, plus the sandbox's images read-only
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"

[storage.options]
additionalimagestores = ["{PODMAN_IMAGES}"]
"""

SOURCE_ROOT = "/root/sglang"                 # a source checkout: <root>/python/sglang
VENV_DIR = "/opt/venv"
STANDIN_DIR = "/opt/provision-standin"
STANDIN_MODULE = "sglang_standin.py"
STANDIN_SOURCE = Path(__file__).with_name("standin.py")  # written by another module's owner
# Its modules, one per job (standin_log.py, standin_http.py, standin_generate.py, ...): it imports them
# flat from beside it, so every one is installed next to it under its own name.
STANDIN_MODULES = tuple(sorted(Path(__file__).parent.glob("standin_*.py")))
# The stand-in reads flags with the product's reader; it is installed beside it under this name.
SERVERARGS_SOURCE = Path(__file__).parent.parent / "host" / "engine" / "serverargs.py"
SERVERARGS_MODULE = "provision_serverargs.py"
DEPS_MODULE = "_provision_sandbox_deps"

# SGLang's own dependencies (numpy, tqdm, requests, IPython, torch, ...) are not on the
# hosts, yet `import sglang` (hence `python -m sglang.launch_server`, the stand-in) needs
# them. A .pth file loads this finder; it sits LAST on sys.meta_path and serves an inert
# stub only for a module that does not exist AND is imported by an `sglang` module. Any
# other import of a missing module (`python3 -c 'import torch'`, importlib.util.find_spec)
# fails as on a host without it.
DEPS_STUB_PY = '''"""provision sandbox: stubs for SGLang's missing third-party imports (see provision/sandbox/hosts.py)."""
import importlib.abc
import importlib.machinery
import sys
import types


class _Stub:
    """Absorbs any use: call, attribute, item, iteration, base class, `X | None`."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Stub()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub()

    def __getitem__(self, key):
        return _Stub()

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __or__(self, other):
        return _Stub()

    __ror__ = __or__

    def __mro_entries__(self, bases):
        return (_Stub,)

    def __repr__(self):
        return "<provision sandbox stub>"


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    stubbed = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top == "sglang":
            return None
        if top not in self.stubbed:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
                frame = frame.f_back
            importer = frame.f_globals.get("__name__", "") if frame is not None else ""
            if not (importer == "sglang" or importer.startswith("sglang.")):
                return None
            self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
'''

LAUNCH_SERVER_SHIM = '''\
# provision sandbox: stand-in for sglang.launch_server (no GPU here). See provision/sandbox/standin.py.
import os, sys
sys.path.insert(0, "/opt/provision-standin")
import sglang_standin
if __name__ == "__main__":
    sglang_standin.main(os.path.dirname(os.path.abspath(__file__)))
'''

SSHD_CONFIG = """\
# provision sandbox host {name}: run as `sshd -i` (inetd style) by the sandbox listener.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
AuthorizedKeysFile .ssh/authorized_keys
Subsystem sftp internal-sftp
MaxStartups 100
MaxSessions 50
LogLevel ERROR
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AcceptEnv LANG LC_*
"""

SOURCE_PYPROJECT = """\
# provision sandbox: stand-in for SGLang's python/pyproject.toml (the version comes from git tags).
[project]
name = "sglang"
dynamic = ["version"]
requires-python = ">=3.10"

[tool.setuptools_scm]
root = ".."
version_file = "sglang/_version.py"
"""

# PID 1 of a host. Runs inside fresh namespaces (after `unshare --mount-proc`):
# bind-mounts the per-host dirs (sources opened first, so mounting over /tmp or /var
# cannot hide a state dir that lives below them), brings up lo, sets the hostname,
# reports "ok" and then reaps orphans forever (a plain `sleep` would leave zombies).
INIT_PY = r'''# provision sandbox host init: PID 1 of one simulated host (see provision/sandbox/hosts.py)
import ctypes, os, signal, socket, subprocess, sys

MS_BIND = 4096
MS_REMOUNT = 32
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4


def setup(fsdir, hostname, mounts):
    libc = ctypes.CDLL(None, use_errno=True)
    sources = []
    for item in mounts:  # "TARGET=SUB" (SUB under fsdir, or an absolute path), "ro:" first: read-only
        if item.startswith("+"):
            # "+/usr/bin=gpu-bin": a read-only overlay of the host's dir over this machine's
            # (the stand-in nvidia-smi), in this host's mount namespace only; first, while
            # fsdir is still reachable by name (lowerdir takes paths).
            target, sub = item[1:].split("=", 1)
            opts = ("lowerdir=%s:%s" % (os.path.join(fsdir, sub), target)).encode()
            if libc.mount(b"overlay", target.encode(), b"overlay", 0, opts) != 0:
                err = ctypes.get_errno()
                raise OSError(err, "overlay over %s failed: %s" % (target, os.strerror(err)))
            continue
        ro = item.startswith("ro:")
        target, sub = item[3 if ro else 0:].split("=", 1)
        sources.append((target, os.open(os.path.join(fsdir, sub), os.O_PATH | os.O_DIRECTORY), ro))
    for target, fd, ro in sources:
        os.makedirs(target, exist_ok=True)
        src = ("/proc/self/fd/%d" % fd).encode()
        if libc.mount(src, target.encode(), None, MS_BIND, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "bind mount over %s failed: %s" % (target, os.strerror(err)))
        if ro and libc.mount(None, target.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "read-only remount of %s failed: %s" % (target, os.strerror(err)))
        os.close(fd)
    # A private /dev/shm, as on a real host (this machine's may hold the hosts' files).
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777") != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount tmpfs on /dev/shm failed: %s" % os.strerror(err))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    os.chmod("/run/sshd", 0o755)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    socket.sethostname(hostname)
    libc.prctl(15, b"init", 0, 0, 0)  # PR_SET_NAME: `ps -e` shows "init"


def main():
    fsdir, statedir, hostname = sys.argv[1:4]
    state_fd = os.open(statedir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        setup(fsdir, hostname, sys.argv[4:])
        status = b"ok\n"
    except Exception as exc:  # reported to the parent through the ready file
        status = ("error: %s\n" % exc).encode()
    fd = os.open("ready", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=state_fd)
    os.write(fd, status)
    os.close(fd)
    os.close(state_fd)
    if status != b"ok\n":
        sys.exit(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(devnull, n)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        signal.sigtimedwait({signal.SIGCHLD}, 5)


main()
'''

# One per host, in this machine's namespaces: accepts on address:port (the socket is
# bound by `Sandbox.up` and inherited as an fd) and runs one `sshd -i` per connection
# inside the host. Exits when the host's init dies; if an owner pid is given (the test
# session), kills the host when the owner dies, so a crashed pytest leaves nothing.
LISTENER_PY = r'''# provision sandbox listener (see provision/sandbox/hosts.py)
import os, select, signal, socket, sys


def main():
    sock_fd, init_pid, owner_pid, log = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.set_inheritable(sock_fd, False)
    sock = socket.socket(fileno=sock_fd)
    try:
        init_fd = os.pidfd_open(init_pid)
    except ProcessLookupError:
        return
    owner_fd = None
    if owner_pid > 0:
        try:
            owner_fd = os.pidfd_open(owner_pid)
        except ProcessLookupError:  # the owner died before we started
            signal.pidfd_send_signal(init_fd, signal.SIGKILL)
            return
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    devnull = os.open("/dev/null", os.O_RDWR)
    for n in (0, 1):
        os.dup2(devnull, n)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # auto-reap the nsenter children
    argv = ["/usr/bin/nsenter", "--target=%d" % init_pid, "--mount", "--pid", "--net", "--uts",
            "--wd=/", "--", "/usr/sbin/sshd", "-i", "-e", "-f", "/etc/ssh/sshd_config"]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    # Python ignores SIGPIPE/SIGXFSZ and we ignore SIGCHLD: give sshd (and the shells
    # it starts) default dispositions, as a real sshd has.
    defaults = (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)
    watch = [sock, init_fd] + ([owner_fd] if owner_fd is not None else [])
    while True:
        ready, _, _ = select.select(watch, [], [])
        if init_fd in ready:
            return
        if owner_fd is not None and owner_fd in ready:
            signal.pidfd_send_signal(init_fd, signal.SIGKILL)
            return
        try:
            conn, _ = sock.accept()
        except OSError:
            continue
        try:
            os.posix_spawn(argv[0], argv, env, setsigdef=defaults, file_actions=[
                (os.POSIX_SPAWN_DUP2, conn.fileno(), 0),
                (os.POSIX_SPAWN_DUP2, conn.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ])
        except OSError as exc:
            os.write(log_fd, ("listener: cannot start sshd: %s\n" % exc).encode())
        finally:
            conn.close()


main()
'''


class SandboxError(RuntimeError):
    """The sandbox cannot do what was asked; the message is one sentence for the user."""


class AddressInUse(SandboxError):
    """The address:port a host should listen on is already taken."""


@dataclass
class HostSpec:
    name: str
    address: str
    sglang: str | None = "0.5.9"
    layout: str = "source"  # "source" | "venv" | "none"
    port: int = 22
    git: bool = False
    stub_deps: bool = True  # SGLang's missing imports get stubs (see DEPS_STUB_PY)
    kind: str = "namespaces"  # or "systemd" (see KINDS)
    flashinfer: str | None = None  # a flashinfer-python version installed beside SGLang (venv layout)
    vllm: str | None = None  # a vLLM release's .py files installed beside SGLang (venv layout; vllm_sources.py)
    podman: bool = False  # podman usable on the host (namespaces kind; see PODMAN_ETC)
    gpu_capability: str | None = None  # a stand-in nvidia-smi reporting 8 GPUs of this compute capability
    # (in-host dir, this machine's dir) pairs bind-mounted read-only into the host, e.g. the realimport
    # tier's cached venv (realimport_venv.py), which the host's own venv builds on, or the real-vLLM venv
    ro_binds: tuple = ()
    # the engine its servers run: "sglang" (the stand-in server, behind the real release's files) or
    # "vllm" (a REAL vLLM on this machine's CPU: the cached venv and tiny models bound read-only,
    # sandbox/vllm_venv.py; the inventory names the shipped sandbox-vllm playbook for it)
    engine: str = "sglang"

    def __post_init__(self) -> None:
        self.ro_binds = tuple((str(t), str(s)) for t, s in self.ro_binds)
        for target, source in self.ro_binds:
            if not (target.startswith("/") and source.startswith("/")) or "=" in target or "=" in source:
                raise SandboxError(f"host {self.name}: ro_binds takes absolute paths without '=': {target}, {source}")
        if self.podman and self.kind != "namespaces":
            raise SandboxError(f"host {self.name}: podman is set up on namespace hosts only")
        if self.kind not in KINDS:
            raise SandboxError(f"host {self.name}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.layout not in LAYOUTS:
            raise SandboxError(f"host {self.name}: layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        if self.layout == "none":
            self.sglang = None
        elif self.sglang is None:
            self.layout = "none"
        if self.flashinfer and self.layout != "venv":
            raise SandboxError(f"host {self.name}: flashinfer is installed only into a venv layout host")
        if self.vllm and self.layout != "venv":
            raise SandboxError(f"host {self.name}: vllm is installed only into a venv layout host")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise SandboxError(f"bad host name {self.name!r}")
        if self.engine not in ENGINES:
            raise SandboxError(f"host {self.name}: engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")


# --------------------------------------------------------------------------- processes

def _euid() -> int:
    return os.geteuid()


def _executable(path: str) -> bool:
    return os.access(path, os.X_OK)


def _proc_start(pid: int) -> int | None:
    """Start time of a process (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    if fields[0] == b"Z":
        return None
    return int(fields[19])


def _alive(pid: int | None, start: int | None) -> bool:
    if not pid:
        return False
    now = _proc_start(pid)
    return now is not None and (start is None or now == start)


def _ns(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _spawn_detached(argv: list[str], log: Path, pass_fds: tuple[int, ...] = ()) -> int:
    """Start argv in its own session, not our child (so no zombie, survives us); return its pid."""
    proc = subprocess.run(
        ["/bin/sh", "-c", 'setsid "$@" </dev/null >>"$SANDBOX_LOG" 2>&1 & echo $!', "sh", *argv],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "SANDBOX_LOG": str(log)},
        pass_fds=pass_fds, capture_output=True, text=True, check=True,
    )
    return int(proc.stdout.strip())


def _wait_gone(procs: list[tuple[int, int | None]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(p, st) for p, st in procs if p):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return [p for p in _all_pids() if _ppid(p) == pid]


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError):
        return None


def _bind(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise AddressInUse(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


DATA_ROOT = Path("/dev/shm/provision-sandbox")


def _default_data_dir(base_dir: Path) -> Path:
    """Per-sandbox dir for the hosts' files: on tmpfs when /dev/shm is one with room."""
    try:
        with open("/proc/mounts") as f:
            shm_is_tmpfs = any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in f)
        st = os.statvfs("/dev/shm")
        roomy = st.f_bavail * st.f_frsize > 2 * 1024**3
    except OSError:
        shm_is_tmpfs = roomy = False
    if shm_is_tmpfs and roomy and os.access("/dev/shm", os.W_OK):
        return DATA_ROOT / hashlib.sha256(str(base_dir).encode()).hexdigest()[:16]
    return base_dir / "data"


def _copytree(src: Path, dst: Path) -> None:
    """A real copy (not hardlinks: tests edit these files), fast."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--", str(src), str(dst)], check=True)


# --------------------------------------------------------------------------- hosts

@dataclass
class SandboxHost:
    name: str
    address: str
    port: int
    state_dir: Path
    init_pid: int
    listener_pid: int | None
    spec: HostSpec | None = None
    init_start: int | None = None
    listener_start: int | None = None
    unshare_pid: int | None = None
    unshare_start: int | None = None
    pid_ns: str | None = None
    mnt_ns: str | None = None
    owner_pid: int = 0
    bin_dir: Path | None = field(default=None, repr=False)
    data_dir: Path | None = field(default=None, repr=False)  # where fs/ really is
    site_packages: str | None = None  # in-host, venv layout only
    _on_change: object = field(default=None, repr=False, compare=False)

    def _changed(self) -> None:
        if self.state_dir.exists():
            (self.state_dir / "host.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        if callable(self._on_change):
            self._on_change(self)

    # ---- paths
    @property
    def fs_dir(self) -> Path:
        return self.state_dir / "fs"

    @property
    def mounts(self) -> dict[str, str]:
        """In-host mount point -> per-host directory name under fs/ (MOUNTS, and /etc/containers
        on a podman host)."""
        if self.spec is not None and self.spec.podman:
            return {**MOUNTS, PODMAN_ETC: PODMAN_ETC_SUB}
        return MOUNTS

    @property
    def log_path(self) -> Path:
        return self.state_dir / "host.log"

    @property
    def layout(self) -> str:
        return self.spec.layout if self.spec else "none"

    @property
    def sglang_version(self) -> str | None:
        return self.spec.sglang if self.spec else None

    @property
    def python(self) -> str:
        """The in-host python that can import SGLang (source hosts also need PYTHONPATH)."""
        return f"{VENV_DIR}/bin/python" if self.layout == "venv" else SYSTEM_PYTHON

    @property
    def sglang_dir(self) -> str | None:
        """In-host path of the `sglang` package directory, or None."""
        if self.layout == "source":
            return f"{SOURCE_ROOT}/python/sglang"
        if self.layout == "venv":
            return f"{self.site_packages}/sglang"
        return None

    def host_key_pub(self) -> Path:
        """The host's public ed25519 host key, as this machine sees it (for known_hosts)."""
        return self.fs_dir / "etc-ssh" / "ssh_host_ed25519_key.pub"

    def hostpath(self, path: str) -> Path:
        """Control-side path of an absolute in-host path under one of the per-host dirs."""
        if not path.startswith("/"):
            raise ValueError(f"not an absolute path: {path!r}")
        norm = os.path.normpath(path)
        if norm == "/var/run" or norm.startswith("/var/run/"):
            norm = "/run" + norm[len("/var/run"):]
        mounts = self.mounts
        for target in sorted(mounts, key=len, reverse=True):
            if norm == target or norm.startswith(target + "/"):
                return self.fs_dir / mounts[target] / norm[len(target):].lstrip("/")
        raise ValueError(f"{path} is not in a per-host directory ({', '.join(mounts)}): "
                         "it is this machine's own file, shared by every host")

    # ---- running things inside
    def nsenter_argv(self) -> list[str]:
        return ["/usr/bin/nsenter", f"--target={self.init_pid}", "--mount", "--pid", "--net",
                "--uts", "--wd=/root", "--"]

    def run(self, cmd: str | list[str], check: bool = True, timeout: float = 60,
            input: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command inside the host (as root, cwd /root); a str goes to `bash -c`."""
        if not self.alive():
            raise SandboxError(f"host {self.name} is not running")
        argv = ["/bin/bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        host_env = {"PATH": HOST_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root",
                    "SHELL": "/bin/bash", "LANG": "C.UTF-8"}
        host_env.update(env or {})
        return subprocess.run(self.nsenter_argv() + argv, check=check, timeout=timeout, text=True,
                              capture_output=True, env=host_env,
                              stdin=subprocess.DEVNULL if input is None else None, input=input)

    # ---- process control
    def alive(self) -> bool:
        return _alive(self.init_pid, self.init_start)

    def listener_alive(self) -> bool:
        return _alive(self.listener_pid, self.listener_start)

    def processes(self) -> list[int]:
        """Pids (as this machine sees them) of every process inside the host."""
        if not self.pid_ns or not self.alive():
            return []
        return [p for p in _all_pids() if _ns(p, "pid") == self.pid_ns]

    def _sshd_pids(self) -> list[int]:
        return [p for p in self.processes() if _comm(p) in ("sshd", "sshd-session")]

    def kill_sshd(self) -> None:
        """Kill the listener and every sshd of this host (new connections are refused)."""
        if self.listener_alive():
            _signal(self.listener_pid, signal.SIGCONT)
            _signal(self.listener_pid, signal.SIGKILL)
        for pid in self._sshd_pids():
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (self.listener_alive() or self._sshd_pids()):
            time.sleep(0.01)
        self.listener_pid = None
        self.listener_start = None
        self._changed()

    def start_sshd(self) -> None:
        """Bring the listener back (no-op if it runs)."""
        if self.listener_alive():
            return
        if not self.alive():
            raise SandboxError(f"host {self.name} is not running: `up` it again")
        sock = _bind(self.address, self.port)
        try:
            pid = _spawn_detached(
                [SYSTEM_PYTHON, "-I", "-S", str(self.bin_dir / "listener.py"), str(sock.fileno()),
                 str(self.init_pid), str(self.owner_pid), str(self.log_path)],
                self.log_path, pass_fds=(sock.fileno(),))
        finally:
            sock.close()
        self.listener_pid = pid
        self.listener_start = _proc_start(pid)
        self._changed()

    def freeze(self) -> None:
        """SIGSTOP the listener and sshds: the host accepts TCP but never answers."""
        if self.listener_alive():
            _signal(self.listener_pid, signal.SIGSTOP)
        for pid in self._sshd_pids():
            _signal(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.listener_alive():
            _signal(self.listener_pid, signal.SIGCONT)
        for pid in self._sshd_pids():
            _signal(pid, signal.SIGCONT)

    def _remove_containers(self, timeout: float = 120) -> None:
        """A podman host's containers go with podman's own clean-up (their mounts, cgroups)."""
        if self.spec is None or not self.spec.podman or not self.alive():
            return
        if not self.hostpath("/var/lib/containers/storage").exists():
            return  # podman never ran here
        with contextlib.suppress(subprocess.TimeoutExpired, SandboxError):
            self.run(["/usr/bin/podman", "rm", "--all", "--force", "--time", "0"], check=False, timeout=timeout)

    def _kill_all(self) -> None:
        """Kill the host: listener, then init (which takes the PID namespace with it)."""
        self._remove_containers(timeout=60)
        if self.listener_alive():
            _signal(self.listener_pid, signal.SIGKILL)
            _wait_gone([(self.listener_pid, self.listener_start)], 5)
        stragglers = []
        if self.alive():
            # Only while init lives are these namespace ids surely this host's. The
            # nsenter parents of its sshds live in our PID namespace but hold its mounts.
            stragglers = [(p, _proc_start(p)) for p in _all_pids()
                          if p != self.init_pid and (_ns(p, "mnt") == self.mnt_ns or _ns(p, "pid") == self.pid_ns)]
            _signal(self.init_pid, signal.SIGKILL)
        if _alive(self.unshare_pid, self.unshare_start):  # --kill-child: takes init along
            _signal(self.unshare_pid, signal.SIGKILL)
        for pid, start in stragglers:
            if _alive(pid, start):
                _signal(pid, signal.SIGKILL)
        _wait_gone([(self.init_pid, self.init_start), (self.unshare_pid, self.unshare_start)]
                   + stragglers, 10)

    # ---- SGLang
    def reset_sglang(self) -> None:
        """Put the host's SGLang tree back to how `up` made it: undo patches, drop stray
        files (backups, __pycache__). Only differing files are copied: fast."""
        if self.spec is None or self.layout == "none":
            return
        if self.layout == "venv" and not self.hostpath(f"{VENV_DIR}/bin/python").exists():
            shutil.rmtree(self.hostpath(VENV_DIR), ignore_errors=True)
            _install_sglang(self, fresh=True)
            return
        _install_sglang(self, fresh=False)

    def reset(self, keep_caches: bool = True) -> None:
        """Back to just after `up`: sshd running and thawed, no process but init and sshd,
        no file that `up` did not make (outside SGLang), SGLang pristine. `keep_caches`: provision's
        caches on the host stay (KEPT_CACHES: each keyed by what it was made from, as on a host
        provision ran on before), so a test does not pay the first call's bundle and preflight
        reads again; False: no provision state at all."""
        if not self.alive():
            raise SandboxError(f"host {self.name} is not running: `up` it again")
        self.thaw()
        self.start_sshd()
        self._remove_containers()
        keep = {self.init_pid, *self._sshd_pids()}
        doomed = [(p, _proc_start(p)) for p in self.processes() if p not in keep]
        for pid, _ in doomed:
            _signal(pid, signal.SIGKILL)
        _wait_gone(doomed, 5)
        self._prune_files(KEPT_CACHES if keep_caches else ())
        self.reset_sglang()

    def _sglang_rel(self) -> set[str]:
        return {os.path.relpath(dst, self.fs_dir) for _, dst in _sglang_trees(self)}

    def _write_manifest(self) -> None:
        skip, paths = self._sglang_rel(), []
        for top, dirs, files in os.walk(self.fs_dir):
            rel_top = os.path.relpath(top, self.fs_dir)
            for d in list(dirs):
                rel = os.path.normpath(os.path.join(rel_top, d))
                if rel in skip:
                    dirs.remove(d)
                paths.append(rel)
            paths += [os.path.normpath(os.path.join(rel_top, f)) for f in files]
        (self.state_dir / "manifest.json").write_text(json.dumps(sorted(paths)) + "\n")

    def _prune_files(self, keep: tuple = ()) -> None:
        path = self.state_dir / "manifest.json"
        if not path.exists():
            return
        known, skip = set(json.loads(path.read_text())), self._sglang_rel() | set(keep)
        for rel in keep:  # the directories above a kept one that exists stay too (their other files do not)
            if (self.fs_dir / rel).is_dir():
                known |= {os.path.normpath(os.path.join(*rel.split("/")[:i])) for i in range(1, rel.count("/") + 1)}
        for top, dirs, files in os.walk(self.fs_dir):
            rel_top = os.path.relpath(top, self.fs_dir)
            for d in list(dirs):
                rel = os.path.normpath(os.path.join(rel_top, d))
                if rel in skip:
                    dirs.remove(d)
                elif rel not in known:
                    dirs.remove(d)
                    full = os.path.join(top, d)
                    if os.path.islink(full):
                        os.unlink(full)
                    else:
                        shutil.rmtree(full, ignore_errors=True)
            for f in files:
                if os.path.normpath(os.path.join(rel_top, f)) not in known:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(top, f))

    # ---- (de)serialisation
    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")}
        data["state_dir"] = str(self.state_dir)
        data["bin_dir"] = str(self.bin_dir) if self.bin_dir else None
        data["data_dir"] = str(self.data_dir) if self.data_dir else None
        data["spec"] = dataclasses.asdict(self.spec) if self.spec else None
        return data

    @classmethod
    def from_json(cls, data: dict) -> "SandboxHost":
        data = dict(data)
        data["state_dir"] = Path(data["state_dir"])
        data["bin_dir"] = Path(data["bin_dir"]) if data.get("bin_dir") else None
        data["data_dir"] = Path(data["data_dir"]) if data.get("data_dir") else None
        data["spec"] = HostSpec(**data["spec"]) if data.get("spec") else None
        known = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        return cls(**{k: v for k, v in data.items() if k in known})


_PY_VERSION: list[str] = []


# The stand-in nvidia-smi of a sandbox host with a GPU capability: what provision asks of the
# real one (the GPUs' compute capability; the GPU list and busy processes for the launch
# preflight), for 8 GPUs. Busy: each live rank of a stand-in server holds memory on the GPU it
# wrote into GPU_APPS_DIR (standin_ranks.py: base-gpu-id, gpu-id-step, CUDA_VISIBLE_DEVICES), as
# SGLang's ranks do on theirs. There are no GPUs: it says so in its own name only.
GPU_APPS_DIR = "/run/provision-standin/gpu-apps"
NVIDIA_SMI = """#!/bin/sh
# provision sandbox: a stand-in nvidia-smi (there is no GPU here; see provision/sandbox/hosts.py)
case "$*" in
  *--query-gpu=compute_cap*) for i in 0 1 2 3 4 5 6 7; do echo "{cap}"; done ;;
  *--query-gpu=name*) for i in 0 1 2 3 4 5 6 7; do echo "NVIDIA RTX PRO 6000 Blackwell Server Edition"; done ;;
  *--query-compute-apps*)
    for f in {apps}/*; do
      [ -f "$f" ] || continue
      pid=${{f##*/}}
      [ -d "/proc/$pid" ] || continue
      echo "$(cat "$f"), $pid, $(readlink "/proc/$pid/exe"), 71234 MiB"
    done ;;
  *-L*) for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-sandbox-$i)"; done ;;
  *) echo "NVIDIA-SMI stand-in (provision sandbox): 8 GPUs, compute capability {cap}" ;;
esac
"""


def _standin_nvidia_smi(directory: Path, capability: str) -> None:
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    smi = directory / "nvidia-smi"
    smi.write_text(NVIDIA_SMI.format(cap=capability, apps=GPU_APPS_DIR))
    os.chmod(smi, 0o755)


def _system_python_version() -> str:
    if not _PY_VERSION:
        _PY_VERSION.append(subprocess.run(
            [SYSTEM_PYTHON, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True).stdout.strip())
    return _PY_VERSION[0]


def _install_deps_stub(host: SandboxHost) -> None:
    """The .pth + finder (DEPS_STUB_PY) where the host's SGLang python reads them: the venv's
    site-packages, or root's user site for the system python of a source checkout."""
    if host.layout == "venv":
        site = host.hostpath(host.site_packages)
    else:
        site = host.hostpath(f"/root/.local/lib/python{_system_python_version()}/site-packages")
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{DEPS_MODULE}.py").write_text(DEPS_STUB_PY)
    (site / f"{DEPS_MODULE}.pth").write_text(f"import {DEPS_MODULE}\n")


def _install_standin(host: SandboxHost, sglang_dir: Path) -> bool:
    """Copy standin.py and its modules into the host and replace launch_server.py with the shim."""
    standin = STANDIN_SOURCE
    if not standin.is_file():
        return False
    dest = host.hostpath(f"{STANDIN_DIR}/{STANDIN_MODULE}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(standin, dest)
    for module in STANDIN_MODULES:
        shutil.copyfile(module, dest.with_name(module.name))
    shutil.copyfile(SERVERARGS_SOURCE, dest.with_name(SERVERARGS_MODULE))
    (sglang_dir / "launch_server.py").write_text(LAUNCH_SERVER_SHIM)
    return True


def _fix_record(record: Path, relpath: str, content: bytes) -> None:
    """Keep the venv's RECORD true to the (shimmed) file, as pip would have written it."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    lines = record.read_text().splitlines()
    out = [f"{relpath},sha256={digest},{len(content)}" if line.split(",", 1)[0] == relpath else line
           for line in lines]
    record.write_text("\n".join(out) + "\n")


def _sync_tree(src: Path, dst: Path) -> int:
    """Make dst a copy of src again, touching only what differs (size or mtime; cp -a keeps
    mtimes). Removes extra files (backups, __pycache__). Returns how many entries changed."""
    changed = 0
    if not dst.is_dir() or dst.is_symlink():
        if dst.exists() or dst.is_symlink():
            dst.unlink() if not dst.is_dir() or dst.is_symlink() else shutil.rmtree(dst)
        _copytree(src, dst)
        return 1
    with os.scandir(src) as it:
        want = {e.name: e for e in it}
    with os.scandir(dst) as it:
        have = {e.name: e for e in it}
    for name, e in have.items():
        if name not in want:
            shutil.rmtree(e.path) if e.is_dir(follow_symlinks=False) else os.unlink(e.path)
            changed += 1
    for name, e in want.items():
        target = dst / name
        if e.is_dir(follow_symlinks=False):
            changed += _sync_tree(Path(e.path), target)
            continue
        h = have.get(name)
        if h is not None and h.is_file(follow_symlinks=False):
            a, b = e.stat(follow_symlinks=False), h.stat(follow_symlinks=False)
            if a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns:
                continue
        if h is not None and h.is_dir(follow_symlinks=False):
            shutil.rmtree(target)
        shutil.copy2(e.path, target)
        changed += 1
    return changed


def _sglang_trees(host: SandboxHost) -> list[tuple[Path, Path]]:
    """(pristine source, control-side copy) for every SGLang tree of the host."""
    spec = host.spec
    if spec is None or not spec.sglang or spec.layout == "none":
        return []
    src = extracted(spec.sglang)
    # Everything the wheel holds (0.5.10 also ships a top-level `tools` package), `sglang` first.
    names = sorted((p.name for p in src.iterdir() if not p.name.startswith(".")),
                   key=lambda n: (n != "sglang", n))
    if spec.layout == "source":  # a checkout's python/ dir: the packages, no dist-info
        dest = host.hostpath(f"{SOURCE_ROOT}/python")
        return [(src / n, dest / n) for n in names if not n.endswith(".dist-info")]
    site = host.hostpath(host.site_packages)
    trees = [(src / n, site / n) for n in names]
    if spec.flashinfer:  # beside SGLang in the same venv, as pip installs SGLang's pinned flashinfer
        fi = extracted(spec.flashinfer, FLASHINFER)
        trees += [(fi / n, site / n) for n in sorted(p.name for p in fi.iterdir() if not p.name.startswith("."))]
    if spec.vllm:  # a vLLM release's Python files and its metadata, as a wheel would lay them out
        from provision.sandbox.vllm_sources import extracted as vllm_extracted

        vl = vllm_extracted(spec.vllm)
        trees += [(vl / n, site / n) for n in sorted(p.name for p in vl.iterdir() if not p.name.startswith("."))]
    return trees


def _install_sglang(host: SandboxHost, fresh: bool) -> None:
    """Copy (fresh) or re-sync (reset) the host's SGLang, then install the stand-in shim."""
    spec = host.spec
    assert spec is not None and spec.sglang
    if spec.layout == "venv" and fresh:
        out = host.run(
            f"{SYSTEM_PYTHON} -m venv --without-pip {VENV_DIR} && {VENV_DIR}/bin/python -c "
            "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'").stdout.strip()
        host.site_packages = out
    trees = _sglang_trees(host)
    for src, dst in trees:
        if fresh:
            _copytree(src, dst)
        else:
            _sync_tree(src, dst)
    pkg = trees[0][1]
    if spec.stub_deps:
        _install_deps_stub(host)
    if spec.layout == "source":
        (pkg.parent / "pyproject.toml").write_text(SOURCE_PYPROJECT)
        _install_standin(host, pkg)
        if spec.git and fresh:
            _git_init(host.hostpath(SOURCE_ROOT), spec.sglang)
    elif _install_standin(host, pkg):
        record = host.hostpath(host.site_packages) / dist_info(spec.sglang).name / "RECORD"
        _fix_record(record, "sglang/launch_server.py", LAUNCH_SERVER_SHIM.encode())


SANDBOX_MODEL = "/data/models/Kimi-K2.5"
SANDBOX_DRAFTER = "/data/models/Kimi-K25-eagle3"


def _fake_weights(data: Path, shards: int = 64) -> None:
    """Stand-ins for the weights, laid out like a real checkpoint: config.json with the architectures,
    the shard index, shards with real safetensors headers and tiny tensors (sandbox/weights.py)."""
    from provision.sandbox.weights import write_checkpoint

    for rel, n, arch in ((SANDBOX_MODEL, shards, "KimiK25ForConditionalGeneration"),
                         (SANDBOX_DRAFTER, 1, "LlamaForCausalLMEagle3")):
        write_checkpoint(data / Path(rel).relative_to("/data"), [arch], n)


def _podman_setup(etc: Path) -> list[str]:
    """Fill a podman host's own /etc/containers; return init's extra mounts (it, and the
    sandbox's image store read-only at PODMAN_IMAGES)."""
    from provision.sandbox import images

    if not _executable(images.PODMAN) or not os.path.isdir(PODMAN_ETC):
        raise SandboxError(f"podman hosts need podman here (no {images.PODMAN} or {PODMAN_ETC}: "
                           "apt-get install -y podman runc)")
    etc.mkdir(parents=True, exist_ok=True)
    for name in ("policy.json", "registries.conf", "registries.conf.d"):
        src = Path(PODMAN_ETC) / name
        if src.is_dir():
            shutil.copytree(src, etc / name)
        elif src.is_file():
            shutil.copyfile(src, etc / name)
    (etc / "networks").mkdir(exist_ok=True)
    (etc / "containers.conf").write_text(PODMAN_CONTAINERS_CONF)
    (etc / "storage.conf").write_text(PODMAN_STORAGE_CONF)
    store = images.shared_store()
    try:
        images.init_store(store)
    except images.ImageUnavailable as exc:
        raise SandboxError(f"cannot set up the sandbox's image store {store.graph}: {exc}") from None
    return [f"{PODMAN_ETC}={PODMAN_ETC_SUB}", f"ro:{PODMAN_IMAGES}={store.graph}"]


def _git_init(root: Path, version: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "sandbox", "GIT_AUTHOR_EMAIL": "sandbox@localhost",
           "GIT_COMMITTER_NAME": "sandbox", "GIT_COMMITTER_EMAIL": "sandbox@localhost"}
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", f"sglang v{version}"], ["git", "tag", f"v{version}"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)


# Host kinds other than these namespaces register their module here on import (provision/sandbox/systemd.py
# does; the package's __init__ imports it), so this module never imports them: no cycle.
KIND_MODULES: dict = {}


def _kind(name: str):
    try:
        return KIND_MODULES[name]
    except KeyError:
        raise SandboxError(f"sandbox host kind {name!r} is not registered") from None


def _host_from_json(data: dict) -> SandboxHost:
    if (data.get("spec") or {}).get("kind") == "systemd":
        return _kind("systemd").SystemdHost.from_json(data)
    return SandboxHost.from_json(data)


# --------------------------------------------------------------------------- sandbox

class Sandbox:
    """A set of simulated hosts whose state lives in ``base_dir`` (see the module doc)."""

    def __init__(self, base_dir: str | Path = DEFAULT_BASE_DIR, owner_pid: int = 0,
                 data_dir: str | Path | None = None):
        """``owner_pid``: if set, hosts die when that process dies (for test sessions).
        ``data_dir``: where the hosts' files go (default: tmpfs, see the module doc)."""
        self.base_dir = Path(base_dir).absolute()
        self.owner_pid = owner_pid
        self.data_dir = Path(data_dir) if data_dir else None
        self.hosts: dict[str, SandboxHost] = {}
        self._lock = threading.RLock()
        self._depth = 0
        self._load()

    # ---- paths
    @property
    def state_path(self) -> Path:
        return self.base_dir / "sandbox.json"

    @property
    def key_path(self) -> Path:
        return self.base_dir / "client" / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.base_dir / "known_hosts"

    @property
    def ssh_config_path(self) -> Path:
        return self.base_dir / "ssh_config"

    @property
    def inventory_path(self) -> Path:
        return self.base_dir / "inventory.yaml"

    @property
    def bin_dir(self) -> Path:
        return self.base_dir / "bin"

    # ---- prerequisites
    @staticmethod
    def check_prereqs() -> list[str]:
        """What this machine lacks to run the sandbox (empty list: all good)."""
        problems = []
        if _euid() != 0:
            problems.append("must run as root (namespaces, bind mounts, sshd)")
        for tool, fix in (("/usr/bin/unshare", "apt-get install -y util-linux"),
                          ("/usr/bin/nsenter", "apt-get install -y util-linux"),
                          (SSHD, "apt-get install -y openssh-server"),
                          ("/usr/bin/ssh-keygen", "apt-get install -y openssh-client"),
                          (SYSTEM_PYTHON, "apt-get install -y python3"),
                          ("/usr/sbin/ip", "apt-get install -y iproute2")):
            if not _executable(tool) and not (tool == "/usr/sbin/ip" and _executable("/bin/ip")):
                problems.append(f"no {tool} ({fix})")
        if not problems:
            probe = subprocess.run(
                ["/usr/bin/unshare", "--mount", "--pid", "--net", "--uts", "--fork", "--mount-proc",
                 "--propagation", "private", "/bin/true"], capture_output=True, text=True)
            if probe.returncode != 0:
                why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
                problems.append(f"cannot create namespaces here (unshare: {why})")
        return problems

    # ---- state
    def _load(self) -> None:
        """Read the hosts from disk; objects this process already handed out stay valid."""
        found: dict[str, SandboxHost] = {}
        data = {}
        if self.state_path.exists():
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(self.state_path.read_text())
        if self.data_dir is None:
            self.data_dir = Path(data["data_dir"]) if data.get("data_dir") else _default_data_dir(self.base_dir)
        for name, rec in data.get("hosts", {}).items():
            with contextlib.suppress(Exception):
                found[name] = _host_from_json(rec)
        # Each host's own host.json is the freshest record (kill_sshd/start_sshd write it
        # first), and it also finds a host that never reached sandbox.json (crash mid-`up`).
        for path in (self.base_dir / "hosts").glob("*/host.json"):
            with contextlib.suppress(Exception):
                found[path.parent.name] = _host_from_json(json.loads(path.read_text()))
        hosts = {}
        for name, new in found.items():
            old = self.hosts.get(name)
            if old is not None and old.init_pid == new.init_pid and old.init_start == new.init_start:
                for f in dataclasses.fields(new):
                    if not f.name.startswith("_"):
                        setattr(old, f.name, getattr(new, f.name))
                new = old
            new._on_change = self._host_changed
            hosts[name] = new
        self.hosts = hosts

    def _host_changed(self, host: SandboxHost) -> None:
        with self._locked():
            self.hosts[host.name] = host
            self._save()

    def _save(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        data = {"base_dir": str(self.base_dir), "data_dir": str(self.data_dir), "key_path": str(self.key_path),
                "known_hosts_path": str(self.known_hosts_path),
                "ssh_config_path": str(self.ssh_config_path),
                "hosts": {n: h.to_json() for n, h in sorted(self.hosts.items())}}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.state_path)
        self._write_client_files()

    @contextlib.contextmanager
    def _locked(self):
        """One process at a time changes a base dir (threads of this one share the RLock)."""
        with self._lock:
            if self._depth:  # nested (e.g. up() -> start_sshd() -> save): already locked
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self.base_dir.mkdir(parents=True, exist_ok=True)
            with open(self.base_dir / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._depth = 1
                try:
                    self._load()
                    yield
                finally:
                    self._depth = 0
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _write_client_files(self) -> None:
        hosts = sorted(self.hosts.values(), key=lambda h: h.name)
        kh, cfg = [], ["# written by provision sandbox: `ssh -F this-file <host>`", ""]
        for h in hosts:
            pub = h.host_key_pub()
            if pub.exists():
                key = " ".join(pub.read_text().split()[:2])
                kh.append(f"{h.address if h.port == 22 else f'[{h.address}]:{h.port}'} {key}")
            cfg += [f"Host {h.name}", f"  HostName {h.address}", f"  Port {h.port}", "  User root",
                    f"  IdentityFile {self.key_path}", f"  UserKnownHostsFile {self.known_hosts_path}",
                    "  StrictHostKeyChecking yes", "  IdentitiesOnly yes", ""]
        self.known_hosts_path.write_text("".join(line + "\n" for line in kh))
        self.ssh_config_path.write_text("\n".join(cfg))

    def inventory_yaml(self, names: list[str] | None = None) -> str:
        """The inventory for all hosts, or only for ``names`` (in that order)."""
        hosts = ([self.hosts[n] for n in names] if names is not None
                 else sorted(self.hosts.values(), key=lambda h: h.name))
        vllm = {h.name for h in hosts if h.spec is not None and h.spec.engine == "vllm"}
        lines = ["# written by `provision sandbox up`", "defaults:", "  user: root",
                 f"  identity: {self.key_path}", f"  known_hosts: {self.known_hosts_path}"]
        if len(vllm) < len(hosts) or not hosts:  # SGLang's flags: never on a vLLM host's launch
            lines += ["  args:  # the sandbox's stand-in weights (safetensors shards: real headers, tiny tensors) "
                      "instead of hub ids",
                      f"    model-path: {SANDBOX_MODEL}", f"    speculative-draft-model-path: {SANDBOX_DRAFTER}"]
        lines.append("hosts:")
        for h in hosts:
            # A systemd host shares this machine's network: its server binds its own address.
            extra = f", args: {{host: {h.address}}}" if h.spec is not None and h.spec.kind == "systemd" else ""
            extra += f", profile: {VLLM_PLAYBOOK}" if h.name in vllm else ""  # a real vLLM, the tiny models
            lines.append(f"  {h.name}: {{address: {h.address}, port: {h.port}{extra}}}")
        if not hosts:
            lines[-1] = "hosts: {}"
        return "\n".join(lines) + "\n"

    def write_inventory(self, path: str | Path | None = None, names: list[str] | None = None) -> Path:
        path = Path(path) if path else self.inventory_path
        path.write_text(self.inventory_yaml(names))
        return path

    # ---- building
    def _prepare(self) -> None:
        """Client key and helper programs: once per base dir."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o700)
        self.bin_dir.mkdir(exist_ok=True)
        for name, text in (("init.py", INIT_PY), ("listener.py", LISTENER_PY)):
            path = self.bin_dir / name
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                os.replace(tmp, path)
        if not self.key_path.exists():
            self.key_path.parent.mkdir(exist_ok=True)
            subprocess.run(["/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                            "provision-sandbox-client", "-f", str(self.key_path)],
                           check=True, capture_output=True)
        for target in MOUNTS:  # mount points must exist on this machine (only /data may not)
            os.makedirs(target, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir.parent if self.data_dir.parent == DATA_ROOT else self.data_dir, 0o700)
        self._collect_garbage()

    def _collect_garbage(self) -> None:
        """Drop host files in DATA_ROOT left by sandboxes whose base dir is gone (a crash)."""
        if not DATA_ROOT.is_dir():
            return
        for sandbox_dir in DATA_ROOT.iterdir():
            if sandbox_dir == self.data_dir:
                continue
            for host_dir in list(sandbox_dir.iterdir()) if sandbox_dir.is_dir() else []:
                with contextlib.suppress(OSError):
                    owner = Path((host_dir / "owner").read_text().strip())
                    if not owner.exists():
                        shutil.rmtree(host_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                sandbox_dir.rmdir()

    def _build(self, spec: HostSpec, sock: socket.socket) -> SandboxHost:
        if spec.kind == "systemd":
            return _kind("systemd").build(self, spec, sock)
        t0 = time.monotonic()
        state = self.base_dir / "hosts" / spec.name
        data = self.data_dir / spec.name
        for old in (state, data):
            if old.exists():
                shutil.rmtree(old)
        state.mkdir(parents=True)
        (data / "fs").mkdir(parents=True)
        (data / "owner").write_text(f"{state}\n")
        os.symlink(data / "fs", state / "fs")
        fs = state / "fs"
        for sub in MOUNTS.values():
            (fs / sub).mkdir(parents=True)
        os.chmod(fs / "tmp", 0o1777)
        for d, mode in (("var/tmp", 0o1777), ("var/log", 0o755), ("var/lib", 0o755),
                        ("var/cache", 0o755), ("run/sshd", 0o755), ("run/lock", 0o1777),
                        ("root/.ssh", 0o700)):
            (fs / d).mkdir(parents=True, exist_ok=True)
            os.chmod(fs / d, mode)
        os.symlink("/run", fs / "var/run")
        os.symlink("/run/lock", fs / "var/lock")
        os.chmod(fs / "root", 0o700)
        for skel in (".bashrc", ".profile"):
            with contextlib.suppress(OSError):
                shutil.copyfile(f"/etc/skel/{skel}", fs / "root" / skel)
        shutil.copyfile(self.key_path.with_suffix(".pub"), fs / "root/.ssh/authorized_keys")
        _fake_weights(fs / MOUNTS["/data"])
        etc_ssh = fs / "etc-ssh"
        for name in ("moduli", "ssh_config"):
            with contextlib.suppress(OSError):
                shutil.copyfile(f"/etc/ssh/{name}", etc_ssh / name)
        subprocess.run(["/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                        f"root@{spec.name}", "-f", str(etc_ssh / "ssh_host_ed25519_key")],
                       check=True, capture_output=True)
        (etc_ssh / "sshd_config").write_text(SSHD_CONFIG.format(name=spec.name))
        extra_mounts = _podman_setup(fs / PODMAN_ETC_SUB) if spec.podman else []
        extra_mounts += [f"ro:{target}={source}" for target, source in spec.ro_binds]
        if spec.gpu_capability:
            _standin_nvidia_smi(fs / "gpu-bin", spec.gpu_capability)
            extra_mounts.insert(0, "+/usr/bin=gpu-bin")

        log = state / "host.log"
        unshare_pid = _spawn_detached(
            ["/usr/bin/unshare", "--mount", "--pid", "--net", "--uts", "--fork", "--kill-child",
             "--mount-proc", "--propagation", "private", "--",
             SYSTEM_PYTHON, "-I", "-S", str(self.bin_dir / "init.py"), str(fs), str(state), spec.name,
             *(f"{t}={s}" for t, s in MOUNTS.items()), *extra_mounts], log)
        host = SandboxHost(name=spec.name, address=spec.address, port=spec.port, state_dir=state,
                           init_pid=0, listener_pid=None, spec=spec, unshare_pid=unshare_pid,
                           unshare_start=_proc_start(unshare_pid),
                           owner_pid=self.owner_pid, bin_dir=self.bin_dir, data_dir=data)
        try:
            # Copy a source tree while the namespaces come up.
            if spec.layout == "source":
                _install_sglang(host, fresh=True)
            ready = state / "ready"
            deadline = time.monotonic() + 20
            while not ready.exists() or not ready.read_text().endswith("\n"):
                if time.monotonic() > deadline or not _alive(unshare_pid, None):
                    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
                    raise SandboxError(f"host {spec.name} did not start: {' '.join(tail) or 'no output'}")
                time.sleep(0.005)
            status = ready.read_text().strip()
            if status != "ok":
                raise SandboxError(f"host {spec.name} did not start: {status}")
            kids = _children(unshare_pid)
            if len(kids) != 1:
                raise SandboxError(f"host {spec.name} did not start: cannot find its init process")
            host.init_pid = kids[0]
            host.init_start = _proc_start(host.init_pid)
            host.pid_ns = _ns(host.init_pid, "pid")
            host.mnt_ns = _ns(host.init_pid, "mnt")
            if spec.layout == "venv":
                _install_sglang(host, fresh=True)
            # Listener last: the socket is bound already, so early clients just wait.
            pid = _spawn_detached(
                [SYSTEM_PYTHON, "-I", "-S", str(self.bin_dir / "listener.py"), str(sock.fileno()),
                 str(host.init_pid), str(self.owner_pid), str(log)], log, pass_fds=(sock.fileno(),))
            host.listener_pid = pid
            host.listener_start = _proc_start(pid)
        except BaseException:
            host._kill_all()
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(data, ignore_errors=True)
            raise
        host._on_change = self._host_changed
        host._write_manifest()
        (state / "host.json").write_text(json.dumps(host.to_json(), indent=2) + "\n")
        (state / "build-seconds").write_text(f"{time.monotonic() - t0:.3f}\n")
        return host

    def up(self, specs: list[HostSpec]) -> list[SandboxHost]:
        """Start these hosts (in parallel); a host already running with the same spec is kept."""
        problems = self.check_prereqs()
        if any(s.kind == "systemd" for s in specs):
            problems += _kind("systemd").problems()
        if problems:
            raise SandboxError("the sandbox cannot run here: " + "; ".join(problems))
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise SandboxError("host names must be unique")
        addrs = [(s.address, s.port) for s in specs]
        if len(set(addrs)) != len(addrs):
            raise SandboxError("two hosts cannot share an address and port")
        with self._locked():
            self._prepare()
            todo, socks = [], {}
            try:
                for spec in specs:
                    old = self.hosts.get(spec.name)
                    if old and old.spec == spec and old.alive():
                        if not old.listener_alive():
                            old.start_sshd()
                        continue
                    for other in self.hosts.values():
                        if other.name != spec.name and (other.address, other.port) == (spec.address, spec.port):
                            raise AddressInUse(f"{spec.address}:{spec.port} is already host {other.name} of this sandbox")
                    if old:
                        old._kill_all()
                        self.hosts.pop(spec.name)
                    socks[spec.name] = _bind(spec.address, spec.port)
                    todo.append(spec)
                # Fetch/unpack each release once, here: wheels.extracted() is not thread-safe.
                for version in sorted({s.sglang for s in todo if s.sglang}):
                    extracted(version)
                errors = []
                with ThreadPoolExecutor(max_workers=min(8, max(1, len(todo)))) as pool:
                    futures = {s.name: pool.submit(self._build, s, socks[s.name]) for s in todo}
                    for name, fut in futures.items():
                        try:
                            self.hosts[name] = fut.result()
                        except Exception as exc:  # build the others, then report
                            errors.append(exc)
                if errors:
                    err = errors[0]
                    if isinstance(err, (SandboxError, WheelUnavailable)):
                        raise err
                    raise SandboxError(f"{type(err).__name__}: {err}")
            finally:
                for sock in socks.values():
                    sock.close()
                if self.hosts:
                    self._save()
                else:  # nothing runs: leave no half-made sandbox behind
                    self._remove_files()
            return [self.hosts[n] for n in names]

    def add(self, spec: HostSpec) -> SandboxHost:
        return self.up([spec])[0]

    def remove(self, name: str) -> None:
        with self._locked():
            host = self.hosts.pop(name, None)
            if host is None:
                return
            host._kill_all()
            shutil.rmtree(host.state_dir, ignore_errors=True)
            if host.data_dir:
                shutil.rmtree(host.data_dir, ignore_errors=True)
            self._save()

    def down(self) -> None:
        """Kill every host and remove everything this sandbox wrote under base_dir."""
        if not self.base_dir.exists():
            self.hosts = {}
            return
        with self._locked():
            for host in self.hosts.values():
                host._kill_all()
            self.hosts = {}
            self._remove_files()

    def _remove_files(self) -> None:
        shutil.rmtree(self.base_dir / "hosts", ignore_errors=True)
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            if self.data_dir.parent == DATA_ROOT:
                with contextlib.suppress(OSError):
                    DATA_ROOT.rmdir()
        for name in ("client", "bin"):
            shutil.rmtree(self.base_dir / name, ignore_errors=True)
        for name in ("sandbox.json", "sandbox.tmp", "known_hosts", "ssh_config", "inventory.yaml", ".lock"):
            with contextlib.suppress(FileNotFoundError):
                (self.base_dir / name).unlink()
        with contextlib.suppress(OSError):
            self.base_dir.rmdir()  # only if we made everything in it

    def status(self) -> list[dict]:
        """One row per host: name, address, port, running (init), sshd (listener) alive."""
        self._load()
        return [{"name": h.name, "address": h.address, "port": h.port, "running": h.alive(),
                 "sshd": h.alive() and h.listener_alive(), "layout": h.layout,
                 "sglang": h.sglang_version, "kind": h.spec.kind if h.spec else "namespaces",
                 "podman": bool(h.spec and h.spec.podman)}
                for h in sorted(self.hosts.values(), key=lambda h: h.name)]
