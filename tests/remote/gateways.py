"""SSH gateways (bastions) for tests: a real sshd on 127.0.0.1 in the control machine's
network namespace, so it can forward to the sandbox hosts' listeners.

Each gateway runs in its own mount namespace with a private /run (sshd's privilege
separation directory) and a private /etc/hosts, so a name can be made resolvable *only
on that gateway*: a host named that way is reachable only through it. It accepts the
sandbox key for root, allows TCP forwarding to the given targets only, and runs no
commands and no terminals. Its log counts the connections it accepted.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

GATEWAY_SSHD = """\
# a provision test gateway: forwarding only
ListenAddress 127.0.0.1:{port}
HostKey {dir}/host_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
AuthorizedKeysFile {dir}/authorized_keys
AllowTcpForwarding yes
AllowStreamLocalForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTTY no
ForceCommand /bin/false
PermitOpen {permit}
MaxStartups 100
LogLevel INFO
UseDNS no
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Gateway:
    def __init__(self, root: Path, name: str, public_key: Path, permit: list[str], hosts: dict[str, str]):
        """permit: host:port targets it may forward to; hosts: name -> address in its /etc/hosts."""
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.port = free_port()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / "host_key")], check=True)
        (self.dir / "authorized_keys").write_text(public_key.read_text())
        (self.dir / "sshd_config").write_text(GATEWAY_SSHD.format(port=self.port, dir=self.dir,
                                                                   permit=" ".join(permit)))
        lines = ["127.0.0.1 localhost"] + [f"{addr} {n}" for n, addr in hosts.items()]
        (self.dir / "hosts").write_text("\n".join(lines) + "\n")
        self.log = self.dir / "sshd.log"
        script = (f"mount -t tmpfs tmpfs /run && mkdir -p /run/sshd && mount --bind {self.dir}/hosts /etc/hosts && "
                  f"exec /usr/sbin/sshd -D -e -f {self.dir}/sshd_config -E {self.log}")
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gateway {name}: sshd exited: {self.proc.stderr.read().decode()[-500:]}")
                time.sleep(0.05)
        else:
            raise RuntimeError(f"gateway {name}: sshd did not listen on 127.0.0.1:{self.port}")

    def known_hosts_line(self, as_name: str | None = None) -> str:
        key = " ".join((self.dir / "host_key.pub").read_text().split()[:2])
        return f"[{as_name or '127.0.0.1'}]:{self.port} {key}"

    def accepted(self) -> int:
        """Connections this gateway authenticated so far."""
        try:
            return self.log.read_text().count("Accepted publickey")
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def host_key_line(host, as_name: str) -> str:
    """A sandbox host's key in known_hosts, under a name the client will use for it."""
    pub = host.fs_dir / "etc-ssh" / "ssh_host_ed25519_key.pub"
    key = " ".join(pub.read_text().split()[:2])
    return f"{as_name if host.port == 22 else f'[{as_name}]:{host.port}'} {key}"


def can_run_gateways() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a private mount namespace for the gateway's sshd)"
    for tool in ("/usr/sbin/sshd", "/usr/bin/unshare", "/usr/bin/ssh", "/usr/bin/ssh-keygen"):
        if not os.path.exists(tool):
            return f"needs {tool}"
    return None
