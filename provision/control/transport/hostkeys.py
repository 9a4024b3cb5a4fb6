"""Host-key checking that refuses what OpenSSH would refuse.

Fabric installs paramiko's AutoAddPolicy (accept anything). We replace it:
known keys are loaded from the user's and the system's known_hosts files with a
tolerant reader (``@cert-authority`` lines are skipped with a warning, ``@revoked``
keys are collected and never accepted), unknown keys are refused unless
``accept-new`` (or ``no``) is in force, in which case they are appended (never
rewriting the file). A changed key is refused by paramiko itself
(BadHostKeyException), whatever the mode; :meth:`KnownHosts.origin` says which
file and line hold the key it expected.

The system files are the ssh config's ``GlobalKnownHostsFile`` (all of them, in order) when it
sets one; else ``/etc/ssh/ssh_known_hosts``, which the environment variable
``PROVISION_SYSTEM_KNOWN_HOSTS`` replaces, in test mode only (config/testmode.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading

import paramiko
from paramiko.hostkeys import HostKeyEntry

from provision.errors import HostKeyError

SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
SYSTEM_KNOWN_HOSTS_ENV = "PROVISION_SYSTEM_KNOWN_HOSTS"
_append_lock = threading.Lock()


def system_known_hosts() -> str:
    """/etc/ssh/ssh_known_hosts, or PROVISION_SYSTEM_KNOWN_HOSTS in test mode (config/testmode.py)."""
    from provision.config.testmode import switch

    return switch(SYSTEM_KNOWN_HOSTS_ENV) or SYSTEM_KNOWN_HOSTS


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return f"{key.get_name()} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


def host_key_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def _key_file_type(key: paramiko.PKey) -> str:
    name = key.get_name()
    return "ecdsa" if name.startswith("ecdsa") else name.replace("ssh-", "")


def _name_matches(pattern: str, hostname: str) -> bool:
    if pattern == hostname:
        return True
    if pattern.startswith("|1|"):
        try:
            return paramiko.HostKeys.hash_host(hostname, pattern) == pattern
        except Exception:  # noqa: BLE001 - a malformed hashed name never matches
            return False
    return False


class KnownHosts:
    def __init__(self, files: list[str], include_system: bool = True, system: list[str] | tuple | None = None):
        """`files`: the user's (UserKnownHostsFile); `system`: GlobalKnownHostsFile's files (None: the
        system file); `include_system=False`: no system file at all."""
        self.files = [f for f in files if f]
        self.keys = paramiko.HostKeys()
        self.revoked: set[bytes] = set()
        self.warnings: list[str] = []
        self.origins: list[tuple[HostKeyEntry, str, int]] = []
        self.loaded: list[str] = []
        if not include_system:
            self.system_files: list[str] = []
        else:
            self.system_files = [f for f in system if f] if system is not None else [system_known_hosts()]
        self.system = self.system_files[0] if self.system_files else None
        paths = list(self.files) + self.system_files
        for path in paths:
            self._load(path)

    def _load(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            return
        self.loaded.append(path)
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@revoked"):
                parts = line.split()
                if len(parts) >= 4:
                    try:
                        self.revoked.add(base64.b64decode(parts[3], validate=True))
                    except ValueError:
                        self.warnings.append(f"{path}:{lineno}: unreadable @revoked key; ignored")
                else:
                    self.warnings.append(f"{path}:{lineno}: unreadable @revoked line; ignored")
                continue
            if line.startswith("@cert-authority"):
                self.warnings.append(f"{path}:{lineno}: @cert-authority lines are not supported; "
                                     "that CA is not trusted by provision (add the host key itself)")
                continue
            if line.startswith("@"):
                self.warnings.append(f"{path}:{lineno}: unknown marker {line.split()[0]}; line ignored")
                continue
            try:
                entry = HostKeyEntry.from_line(line, lineno)
            except Exception:  # noqa: BLE001 - paramiko raises several types on odd lines
                entry = None
            if entry is None:
                self.warnings.append(f"{path}:{lineno}: unreadable known_hosts line; ignored")
                continue
            self.origins.append((entry, path, lineno))
            for name in entry.hostnames:
                self.keys.add(name, entry.key.get_name(), entry.key)

    def origin(self, hostname: str, key: paramiko.PKey | None = None) -> str | None:
        """``file:line`` of the first known_hosts line for ``hostname`` (holding ``key``, if given)."""
        for entry, path, lineno in self.origins:
            if key is not None and entry.key.asbytes() != key.asbytes():
                continue
            if any(_name_matches(n, hostname) for n in entry.hostnames):
                return f"{path}:{lineno}"
        return None

    def drop_revoked(self) -> None:
        if not self.revoked:
            return
        clean = paramiko.HostKeys()
        for entry in self.keys._entries:  # noqa: SLF001 - paramiko offers no iterator over entries
            if entry.key.asbytes() not in self.revoked:
                for name in entry.hostnames:
                    clean.add(name, entry.key.get_name(), entry.key)
        self.keys = clean

    def install(self, client: paramiko.SSHClient) -> None:
        self.drop_revoked()
        hk = client.get_host_keys()
        for entry in self.keys._entries:  # noqa: SLF001
            for name in entry.hostnames:
                hk.add(name, entry.key.get_name(), entry.key)

    def remember(self, hostname: str, key: paramiko.PKey, path: str | None) -> None:
        """A key just accepted: trusted for the rest of this run, too."""
        self.keys.add(hostname, key.get_name(), key)
        if path:
            self.origins.append((HostKeyEntry([hostname], key), path, 0))


def append_known_host(path: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one line to ``path`` (created 0600 if missing). Never rewrites what is there: the
    previous bytes stay a prefix of the file; a last line without its newline gets one first."""
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
    with _append_lock:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            size = os.fstat(fd).st_size
            if size:
                with open(path, "rb") as fh:
                    fh.seek(size - 1)
                    if fh.read(1) != b"\n":
                        line = b"\n" + line
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)


class VerifyingPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for keys it does not know (no key at all for that host name)."""

    def __init__(self, known: KnownHosts, mode: str, alias: str, append_to: str | None):
        self.known, self.mode, self.alias, self.append_to = known, mode, alias, append_to
        self.notes: list[str] = []

    def missing_host_key(self, client, hostname, key):  # noqa: D401 - paramiko's signature
        fp = fingerprint(key)
        if key.asbytes() in self.known.revoked:
            raise HostKeyError(f"{self.alias}: host key {fp} is marked @revoked in known_hosts; refusing to "
                               "connect (the key was declared compromised: the host needs a new key)")
        if self.mode in ("accept-new", "no"):
            if self.append_to:
                try:
                    append_known_host(self.append_to, hostname, key)
                except OSError as exc:
                    raise HostKeyError(f"{self.alias}: cannot record the new host key {fp} in {self.append_to} "
                                       f"({exc.strerror}); refusing to connect unrecorded") from None
                self.notes.append(f"new host key {fp} for {hostname} recorded in {self.append_to}")
            self.known.remember(hostname, key, self.append_to)
            return
        files = list(self.known.files) + list(self.known.system_files)
        where = ", ".join(files) or "~/.ssh/known_hosts"
        target = self.append_to or "~/.ssh/known_hosts"
        host, _, port = hostname.rpartition("]:") if hostname.startswith("[") else (hostname, "", "22")
        host = host.lstrip("[")
        raise HostKeyError(
            f"{self.alias}: unknown host key {fp} for {hostname} (not in {where}); refusing to connect. "
            f"Check that fingerprint with the host's owner (on the host: ssh-keygen -lf "
            f"/etc/ssh/ssh_host_{_key_file_type(key)}_key.pub), then re-run with "
            f"--accept-new-host-keys or add it: ssh-keyscan -p {port or 22} {host} >> {target}")
