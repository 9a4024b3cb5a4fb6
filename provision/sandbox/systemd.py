"""A sandbox host kind booted by a real systemd: a podman container running ``/sbin/init``.

The namespace hosts of ``hosts.py`` have a tiny reaper as PID 1, so nothing that needs
systemd (``launch --persistent``, ``schedule --install``) can be tried on them. This host
is a Debian 12 root file system (``debootstrap --variant=minbase``, packages in
``PACKAGES``) imported as a podman image and run with ``--systemd=always``:
``systemctl is-system-running`` says ``running`` and units really start, restart and stop.

* **Network:** ``--network host`` (as the issue that asked for it measured), with a
  private UTS namespace. The container's sshd listens on its own ``address:port``
  (``ListenAddress``), so it is an SSH host like the others; its host key is made per
  container and recorded in the sandbox's known_hosts. ssh.service only starts once that
  config is in place (a drop-in ``ConditionPathExists``): a bare image never binds ``*:22``.
* **Files:** everything, seen from this machine, is under the container's merged root
  (``podman mount``), so ``hostpath`` and the SGLang installer of ``hosts.py`` work as on
  the other hosts: SGLang 0.5.9 from the cached wheel, the deps stub and the stand-in.
* **The image** is built when absent and tagged with a content hash of everything that
  goes into it (``image_tag``), so a machine pays debootstrap once.
* **podman settings:** runc, cgroupfs and the ulimits this machine needs
  (SSH_NOTES.md) are passed on every podman command line, so no containers.conf is
  needed or written.
* **Clean-up:** ``Sandbox.down`` / ``remove`` run ``podman rm -f``; with an owner pid (the
  test session) a small reaper removes the container when that process dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from provision.sandbox import hosts as _hosts  # hosts.py never imports this module: it registers itself
from provision.sandbox import images as _images  # the one image builder (debootstrap + podman import)

PODMAN = _images.PODMAN
# libnuma1: vLLM's CPU build links it (vllm/_C), as vLLM's CPU install notes say a host needs
PACKAGES = ("python3", "python3-pip", "systemd", "systemd-sysv", "dbus", "openssh-server", "procps", "libnuma1")
IMAGE_REPO = "localhost/provision-sandbox-systemd"
RUN_LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
# podman's default /dev/shm is 64 MiB; a real host's is half its memory, and vLLM's engine needs 160 MiB
SHM_SIZE = ["--shm-size", "2g"]
SSHD_DROPIN = "/etc/ssh/sshd_config.d/provision-sandbox.conf"
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key"

# Run in the debootstrapped tree (chroot) before it is imported. Part of the image hash.
CUSTOMIZE_SH = f"""\
set -eu
rm -f /etc/ssh/ssh_host_*
mkdir -p /etc/systemd/system/ssh.service.d
cat >/etc/systemd/system/ssh.service.d/provision-sandbox.conf <<'EOF'
# provision sandbox: sshd starts only once the per-container config (ListenAddress) is in place
[Unit]
ConditionPathExists={SSHD_DROPIN}
EOF
systemctl disable ssh.socket >/dev/null 2>&1 || true
systemctl enable ssh.service >/dev/null 2>&1
: >/etc/machine-id
mkdir -p /root/.ssh && chmod 700 /root/.ssh
"""

SSHD_CONFIG = """\
# provision sandbox host {name}: a systemd-booted container (see provision/sandbox/systemd.py)
ListenAddress {address}:{port}
HostKey {host_key}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100
MaxSessions 50
LogLevel ERROR
UseDNS no
"""

# Removes the container when the owner (a test session) dies. Argv: owner pid, name, podman argv...
REAPER_PY = r'''# provision sandbox: remove a systemd host's container when its owner dies (provision/sandbox/systemd.py)
import os, select, subprocess, sys
owner, name, podman = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    fd = os.pidfd_open(owner)
except ProcessLookupError:
    fd = None
while fd is not None:
    ready, _, _ = select.select([fd], [], [], 5)
    if ready:
        break
    if subprocess.run(podman + ["container", "exists", name]).returncode != 0:
        sys.exit(0)  # removed by its sandbox already
subprocess.run(podman + ["rm", "-f", "-t", "0", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''


class SystemdUnavailable(_hosts.SandboxError):
    """podman or debootstrap is missing, or the image cannot be built here."""


def podman_argv(*args: str) -> list[str]:
    return _images.podman_argv(*args)


def podman(*args: str, check: bool = True, timeout: float = 120, input: str | None = None,
           capture: bool = True) -> subprocess.CompletedProcess:
    return _images.podman(*args, check=check, timeout=timeout, input=input, capture=capture,
                          error=SystemdUnavailable)


def problems() -> list[str]:
    """What this machine lacks for systemd hosts (empty: all good)."""
    return _images.problems("podman with --systemd, host network")


def image_tag() -> str:
    """The image name for what goes in it: suite, packages, customisation, format."""
    return _images.rootfs_tag(IMAGE_REPO, PACKAGES, CUSTOMIZE_SH)


image_cache_dir = _images.image_cache_dir


def image_exists(tag: str) -> bool:
    return _images.image_exists(tag)


def ensure_image(log=None) -> tuple[str, float]:
    """The systemd image, built (debootstrap + import) when absent. Returns (tag, seconds spent building)."""
    try:
        return _images.ensure_rootfs_image(image_tag(), PACKAGES, CUSTOMIZE_SH, name="systemd", log=log)
    except _images.ImageUnavailable as exc:
        raise SystemdUnavailable(str(exc)) from None


def container_name(base_dir: Path, host: str) -> str:
    """Unique per sandbox base dir and host name (tests of parallel sessions never collide)."""
    return f"provision-sbx-{hashlib.sha256(str(base_dir).encode()).hexdigest()[:10]}-{host}"


def start_container(*, name: str, hostname: str, address: str, port: int, image: str, client_pub: Path,
                    state_dir: Path, owner_pid: int, bin_dir: Path, ro_binds: tuple = ()) -> dict:
    """Create, configure and boot one container; wait until systemd runs and sshd listens.
    `ro_binds`: (in-container dir, this machine's dir) pairs mounted read-only."""
    podman("rm", "-f", "-t", "0", name, check=False)
    binds = [a for target, source in ro_binds for a in ("-v", f"{source}:{target}:ro")]
    podman("create", "--name", name, "--network", "host", "--uts", "private", "--hostname", hostname,
           "--systemd", "always", *RUN_LIMITS, *SHM_SIZE, *binds, "--label", "provision-sandbox=1", image, "/sbin/init")
    try:
        keydir = state_dir / "hostkey"
        keydir.mkdir(parents=True, exist_ok=True)
        key = keydir / "ssh_host_ed25519_key"
        for p in (key, key.with_suffix(".pub")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        subprocess.run(["/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{hostname}",
                        "-f", str(key)], check=True, capture_output=True)
        cfg = state_dir / "sshd_config"
        cfg.write_text(SSHD_CONFIG.format(name=hostname, address=address, port=port, host_key=HOST_KEY))
        for src, dst in ((key, HOST_KEY), (key.with_suffix(".pub"), HOST_KEY + ".pub"), (cfg, SSHD_DROPIN),
                         (client_pub, "/root/.ssh/authorized_keys")):
            podman("cp", str(src), f"{name}:{dst}")
        podman("start", name)
        merged = podman("mount", name).stdout.strip()
        if owner_pid > 0:
            reaper = bin_dir / "reaper.py"
            if not reaper.exists() or reaper.read_text() != REAPER_PY:
                reaper.write_text(REAPER_PY)
            with open(state_dir / "host.log", "ab") as logf:
                subprocess.Popen(["/usr/bin/python3", "-I", "-S", str(reaper), str(owner_pid), name,
                                  *podman_argv()], stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                 start_new_session=True)
        wait_running(name, address, port)
        pid = int(podman("inspect", "-f", "{{.State.Pid}}", name).stdout.strip() or 0)
        return {"merged": merged, "pid": pid}
    except BaseException:
        podman("rm", "-f", "-t", "0", name, check=False)
        raise


def wait_running(name: str, address: str, port: int, timeout: float = 60) -> None:
    """Until systemd runs and *this container's* sshd holds address:port.

    The address was found free and let go just before the container started, so another
    sandbox (another test session) may have taken it meanwhile: then something answers on
    address:port but it is not us. ssh.service is Type=notify, so "active" means our sshd
    has bound the address; when it failed and the address is taken, that is AddressInUse,
    and the caller picks another address."""
    deadline = time.monotonic() + timeout
    state = ssh = ""
    while time.monotonic() < deadline:
        out = podman("exec", name, "systemctl", "is-system-running", check=False).stdout.strip()
        state = out or state
        ssh = podman("exec", name, "systemctl", "is-active", "ssh.service", check=False).stdout.strip()
        if ssh == "active" and state in ("running", "degraded"):
            return
        if ssh == "failed":
            # Ours could not bind: is the address someone else's now? (Binding it ourselves is
            # the one sure test; the journal may not have sshd's last words yet.)
            _hosts._bind(address, port).close()  # raises AddressInUse when it is taken
            break
        time.sleep(0.2)
    failed = podman("exec", name, "systemctl", "--failed", "--no-legend", "--plain", check=False).stdout.strip()
    raise SystemdUnavailable(f"container {name} did not come up (systemd: {state or 'no answer'}; "
                             f"ssh.service on {address}:{port}: {ssh or 'no answer'}; "
                             f"failed units: {failed or 'none'})")


def remove_container(name: str) -> None:
    podman("rm", "-f", "-t", "0", name, check=False, timeout=120)


def container_running(name: str) -> bool:
    out = podman("inspect", "-f", "{{.State.Running}}", name, check=False)
    return out.returncode == 0 and out.stdout.strip() == "true"


# --------------------------------------------------------------------------- the host

class SystemdHost(_hosts.SandboxHost):
    """A sandbox host whose PID 1 is systemd (a podman container); see the module doc.

    ``init_pid`` is the container's init as this machine sees it, so ``alive`` and
    ``processes`` work as for the namespace hosts; ``run`` is ``podman exec``.
    """

    container: str = ""
    merged: str = ""

    @property
    def fs_dir(self) -> Path:
        return Path(self.merged)

    def hostpath(self, path: str) -> Path:
        if not path.startswith("/"):
            raise ValueError(f"not an absolute path: {path!r}")
        return Path(self.merged) / os.path.normpath(path).lstrip("/")

    def host_key_pub(self) -> Path:
        return self.state_dir / "hostkey" / "ssh_host_ed25519_key.pub"

    def exec_argv(self, env: dict | None = None, workdir: str = "/root", interactive: bool = False) -> list[str]:
        argv = podman_argv("exec", "--workdir", workdir)
        if interactive:
            argv.append("-i")
        for k, v in (env or {}).items():
            argv += ["--env", f"{k}={v}"]
        return argv + [self.container]

    def nsenter_argv(self) -> list[str]:
        return self.exec_argv()

    def run(self, cmd, check: bool = True, timeout: float = 60, input: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
        if not self.alive():
            raise _hosts.SandboxError(f"host {self.name} is not running")
        argv = ["/bin/bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        host_env = {"PATH": _hosts.HOST_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root",
                    "SHELL": "/bin/bash", "LANG": "C.UTF-8"}
        host_env.update(env or {})
        return subprocess.run(self.exec_argv(host_env, interactive=input is not None) + argv, check=check,
                              timeout=timeout, text=True, capture_output=True,
                              stdin=subprocess.DEVNULL if input is None else None, input=input)

    def listener_alive(self) -> bool:
        return self.alive() and self.run("systemctl is-active -q ssh.service", check=False).returncode == 0

    def kill_sshd(self) -> None:
        self.run("systemctl stop ssh.service")

    def start_sshd(self) -> None:
        if not self.alive():
            raise _hosts.SandboxError(f"host {self.name} is not running: `up` it again")
        self.run("systemctl start ssh.service")

    def freeze(self) -> None:
        raise _hosts.SandboxError(f"host {self.name}: freeze is not supported on systemd hosts")

    thaw = freeze

    def reboot(self, timeout: float = 60) -> None:
        """Restart the container: systemd shuts down and boots again, from the same disk."""
        podman("restart", "-t", "10", self.container, timeout=timeout + 30)
        self.merged = podman("mount", self.container).stdout.strip()
        self.init_pid = int(podman("inspect", "-f", "{{.State.Pid}}", self.container).stdout.strip() or 0)
        self.init_start = _hosts._proc_start(self.init_pid)
        self.pid_ns = _hosts._ns(self.init_pid, "pid")
        self.mnt_ns = _hosts._ns(self.init_pid, "mnt")
        self._changed()
        wait_running(self.container, self.address, self.port, timeout)

    def _kill_all(self) -> None:
        if self.container:
            remove_container(self.container)

    def _write_manifest(self) -> None:  # the whole root file system: reset() says what it undoes instead
        pass

    def reset(self) -> None:
        """Back to just after `up`: provision's units gone (stopped, disabled, files removed),
        its state and logs gone, no failed units, SGLang pristine."""
        if not self.alive():
            raise _hosts.SandboxError(f"host {self.name} is not running: `up` it again")
        self.run(RESET_SH, timeout=180)
        self.reset_sglang()

    def to_json(self) -> dict:
        data = super().to_json()
        data["container"], data["merged"] = self.container, self.merged
        return data

    @classmethod
    def from_json(cls, data: dict) -> "SystemdHost":
        host = super().from_json(data)
        host.container, host.merged = data.get("container", ""), data.get("merged", "")
        return host


RESET_SH = r"""
set -u
for u in $(systemctl list-units --all --plain --no-legend 'provision-*' | awk '{print $1}') \
         $(systemctl list-unit-files --plain --no-legend 'provision-*' | awk '{print $1}'); do
  systemctl disable --now "$u" >/dev/null 2>&1 || systemctl stop "$u" >/dev/null 2>&1 || true
done
rm -rf /etc/systemd/system/provision-* /etc/systemd/system/*.wants/provision-*
systemctl daemon-reload
systemctl reset-failed
rm -rf /var/lib/provision /var/log/provision /var/log/provision-reconcile.log /root/.local/state/provision
true
"""


def build(box, spec, sock) -> SystemdHost:
    """Sandbox._build for spec.kind == "systemd"."""
    t0 = time.monotonic()
    tag, built = ensure_image()
    state = box.base_dir / "hosts" / spec.name
    if state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True)
    name = container_name(box.base_dir, spec.name)
    sock.close()  # the address was free: the container's sshd binds it now
    info = start_container(name=name, hostname=spec.name, address=spec.address, port=spec.port, image=tag,
                           client_pub=box.key_path.with_suffix(".pub"), state_dir=state,
                           owner_pid=box.owner_pid, bin_dir=box.bin_dir, ro_binds=spec.ro_binds)
    host = SystemdHost(name=spec.name, address=spec.address, port=spec.port, state_dir=state,
                       init_pid=info["pid"], listener_pid=None, spec=spec, owner_pid=box.owner_pid,
                       bin_dir=box.bin_dir)
    host.container, host.merged = name, info["merged"]
    host.init_start = _hosts._proc_start(host.init_pid)
    host.pid_ns = _hosts._ns(host.init_pid, "pid")
    host.mnt_ns = _hosts._ns(host.init_pid, "mnt")
    try:
        _hosts._fake_weights(host.hostpath("/data"))
        if spec.layout != "none":
            _hosts._install_sglang(host, fresh=True)
    except BaseException:
        host._kill_all()
        shutil.rmtree(state, ignore_errors=True)
        raise
    host._on_change = box._host_changed
    (state / "host.json").write_text(json.dumps(host.to_json(), indent=2) + "\n")
    (state / "build-seconds").write_text(f"{time.monotonic() - t0:.3f}\n")
    (state / "image-build-seconds").write_text(f"{built:.3f}\n")
    return host


_hosts.KIND_MODULES["systemd"] = sys.modules[__name__]  # the host kind `provision sandbox up --systemd` makes
