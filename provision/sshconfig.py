"""Resolve a host the way OpenSSH would: flags, then ~/.ssh/config, then defaults.

paramiko's SSHConfig ignores ``Include``; we expand it ourselves (globs, paths
relative to ~/.ssh, nested includes) before parsing. Supported keys: HostName,
User, Port, IdentityFile, ProxyJump, UserKnownHostsFile, StrictHostKeyChecking,
ConnectTimeout. Everything else is ignored (documented in README).
"""

from __future__ import annotations

import glob
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from provision.errors import ConfigError


@dataclass(frozen=True)
class Target:
    alias: str                     # what the user typed / the inventory name
    hostname: str
    port: int = 22
    user: str = "root"
    identities: tuple[str, ...] = ()
    jump: str | None = None        # ProxyJump spec: [user@]host[:port]
    known_hosts: tuple[str, ...] = ()
    strict: str = "yes"            # yes | accept-new | no
    connect_timeout: float = 10.0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        return self.alias


def expand_includes(text: str, base_dir: Path, depth: int = 0) -> str:
    if depth > 16:
        raise ConfigError(f"ssh config: Include nested more than 16 deep under {base_dir}")
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        parts = stripped.split(None, 1)
        if len(parts) == 2 and parts[0].lower() == "include":
            for pattern in shlex.split(parts[1]):
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = str(base_dir / pattern)
                for path in sorted(glob.glob(pattern)):
                    try:
                        sub = Path(path).read_text(encoding="utf-8")
                    except OSError:
                        continue
                    out.append(expand_includes(sub, base_dir, depth + 1))
            continue
        out.append(line)
    return "\n".join(out)


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    cfg_path = Path(path) if path else Path(os.path.expanduser("~/.ssh/config"))
    if not cfg_path.exists():
        if path:
            raise ConfigError(f"--ssh-config {path}: no such file")
        return paramiko.SSHConfig.from_text("")
    try:
        text = cfg_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{cfg_path}: cannot read ({exc.strerror})") from None
    base = Path(os.path.expanduser("~/.ssh"))
    return paramiko.SSHConfig.from_text(expand_includes(text, base))


def _split_userhostport(spec: str) -> tuple[str | None, str, int | None]:
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
        return user, host, port
    if spec.count(":") == 1:
        host, p = spec.split(":")
        return user, host, int(p)
    return user, spec, port


def resolve(alias: str, *, config: paramiko.SSHConfig, user: str | None = None, port: int | None = None,
            identity: str | None = None, jump: str | None = None, hostname: str | None = None,
            known_hosts: list[str] | None = None, strict: str | None = None,
            connect_timeout: float | None = None) -> Target:
    """Flag (or inventory) values win over ssh config, which wins over defaults."""
    c = config.lookup(hostname or alias) if hostname else config.lookup(alias)
    if hostname is None:
        hostname = c.get("hostname", alias)
    try:
        cport = int(c["port"]) if "port" in c else None
    except ValueError:
        raise ConfigError(f"ssh config: Port for {alias} is not a number: {c['port']!r}") from None
    ids: list[str] = [os.path.expanduser(identity)] if identity else [
        os.path.expanduser(i) for i in c.get("identityfile", [])]
    pj = jump if jump is not None else c.get("proxyjump")
    if pj and pj.lower() == "none":
        pj = None
    kh = list(known_hosts or [])
    if not kh:
        ukh = c.get("userknownhostsfile")
        if ukh:
            kh = [os.path.expanduser(p) for p in shlex.split(ukh) if p.lower() != "none"]
        else:
            kh = [os.path.expanduser("~/.ssh/known_hosts")]
    shk = (strict or c.get("stricthostkeychecking") or "yes").lower()
    shk = {"true": "yes", "false": "no", "off": "no", "ask": "yes"}.get(shk, shk)
    if shk not in ("yes", "accept-new", "no"):
        raise ConfigError(f"StrictHostKeyChecking {shk!r} for {alias}: expected yes, accept-new or no")
    ct = connect_timeout
    if ct is None and "connecttimeout" in c:
        ct = float(c["connecttimeout"])
    return Target(alias=alias, hostname=hostname, port=port or cport or 22, user=user or c.get("user") or "root",
                  identities=tuple(ids), jump=pj, known_hosts=tuple(kh), strict=shk,
                  connect_timeout=ct or 10.0)


def resolve_jump(spec: str, *, config: paramiko.SSHConfig, base: Target) -> Target:
    """A ProxyJump hop, itself resolved through ssh config (first hop only)."""
    first = spec.split(",")[0].strip()
    juser, jhost, jport = _split_userhostport(first)
    return resolve(jhost, config=config, user=juser, port=jport, known_hosts=list(base.known_hosts),
                   strict=base.strict, connect_timeout=base.connect_timeout)
