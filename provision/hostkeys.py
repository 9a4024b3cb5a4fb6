"""Host-key checking that refuses what OpenSSH would refuse.

Fabric installs paramiko's AutoAddPolicy (accept anything). We replace it:
known keys are loaded from the user's and the system's known_hosts files with a
tolerant reader (``@cert-authority`` lines are skipped with a warning, ``@revoked``
keys are collected and never accepted), unknown keys are refused unless
``accept-new`` is in force, in which case they are appended (never rewriting the
file). A changed key is refused by paramiko itself (BadHostKeyException).
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
_append_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return f"{key.get_name()} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


def host_key_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class KnownHosts:
    def __init__(self, files: list[str], include_system: bool = True):
        self.files = [f for f in files if f]
        self.keys = paramiko.HostKeys()
        self.revoked: set[bytes] = set()
        self.warnings: list[str] = []
        paths = list(self.files) + ([SYSTEM_KNOWN_HOSTS] if include_system else [])
        for path in paths:
            self._load(path)

    def _load(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            return
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@revoked"):
                parts = line.split()
                if len(parts) >= 4:
                    try:
                        self.revoked.add(base64.b64decode(parts[3]))
                    except ValueError:
                        self.warnings.append(f"{path}:{lineno}: unreadable @revoked key; ignored")
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
            for name in entry.hostnames:
                self.keys.add(name, entry.key.get_name(), entry.key)

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


class VerifyingPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for keys it does not know."""

    def __init__(self, known: KnownHosts, mode: str, alias: str, append_to: str | None):
        self.known, self.mode, self.alias, self.append_to = known, mode, alias, append_to

    def missing_host_key(self, client, hostname, key):  # noqa: D401 - paramiko's signature
        fp = fingerprint(key)
        if key.asbytes() in self.known.revoked:
            raise HostKeyError(f"{self.alias}: host key {fp} is marked @revoked in known_hosts; refusing to connect")
        if self.mode == "no":
            return
        if self.mode == "accept-new" and self.append_to:
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with _append_lock:
                os.makedirs(os.path.dirname(os.path.abspath(self.append_to)), exist_ok=True)
                with open(self.append_to, "a", encoding="utf-8") as fh:
                    fh.write(line)
            return
        files = ", ".join(self.known.files) or "~/.ssh/known_hosts"
        raise HostKeyError(
            f"{self.alias}: unknown host key {fp} (not in {files}). Check the fingerprint with the host's owner, "
            f"then add it (ssh-keyscan -p PORT HOST >> ~/.ssh/known_hosts) or re-run with --accept-new-host-keys")
