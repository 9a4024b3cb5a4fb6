"""Resolve a host the way OpenSSH does: flag, then inventory, then ssh config, then defaults.

The authority is OpenSSH itself. Where the control machine has its client, each host
name is resolved with ``ssh -G`` (which handles ``Include``, ``Match``, ``%`` tokens,
``CanonicalizeHostname`` and the system-wide ``/etc/ssh/ssh_config``), once per name
per run. Where it has none, paramiko's ``SSHConfig`` reads the same files (we expand
``Include`` ourselves; paramiko keeps it as a plain key).

Telling what the config *set* from OpenSSH's defaults: ``ssh -G`` prints a value for
every key (``user`` = the local user, ``identityfile ~/.ssh/id_rsa`` ..., ``port 22``).
We run it on a small wrapper file: ``Include <the user's config>`` (and the system
config when no ``--ssh-config`` was given, as ssh reads it), then a trailing
``Host *`` block setting marker values for User, IdentityFile and UserKnownHostsFile.
ssh keeps the first value it obtains for a key, so a marker that comes back means the
user's files did not set that key (IdentityFile accumulates: the markers are dropped
from the list, and what remains is what the config listed, in order). For keys whose
OpenSSH default equals ours (Port 22, HostName = the name, StrictHostKeyChecking ask =
our yes, ConnectTimeout none, ServerAliveInterval 0, IdentitiesOnly no) the default
and "not set" mean the same, so no marker is needed.

Honoured keys: HostName, User, Port, IdentityFile (all, in order), IdentitiesOnly,
ProxyJump (the whole chain), ProxyCommand (run as OpenSSH runs it: ``$SHELL -c 'exec COMMAND'``,
see ssh.py), ConnectTimeout, ServerAliveInterval, UserKnownHostsFile, GlobalKnownHostsFile (unset:
the system file, /etc/ssh/ssh_known_hosts), StrictHostKeyChecking.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from provision.errors import ConfigError

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KEEPALIVE = 15
UNSET = "__provision_unset__"
_UNSET_PATH = "/nonexistent/" + UNSET
SYSTEM_CONFIG = "/etc/ssh/ssh_config"


@dataclass(frozen=True)
class Target:
    alias: str                     # what the user typed / the inventory name
    hostname: str
    port: int = 22
    user: str = "root"
    identities: tuple[str, ...] = ()
    identities_only: bool = False
    jump: str | None = None        # ProxyJump chain: [user@]host[:port][,...]
    proxy_command: str | None = None   # tokens already expanded
    known_hosts: tuple[str, ...] = ()
    global_known_hosts: tuple[str, ...] | None = None   # GlobalKnownHostsFile; None: the system file
    strict: str = "yes"            # yes | accept-new | no
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    keepalive: int = DEFAULT_KEEPALIVE
    via: "Target | None" = None    # the last gateway of the jump chain (itself chained)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        return self.alias

    @property
    def key(self) -> tuple:
        """Identity of a connection, gateway chain included (for sharing gateways)."""
        return (self.hostname, self.port, self.user, self.proxy_command, self.via.key if self.via else None)


# --------------------------------------------------------------------------- reading the config

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


def _paramiko_settings(c: dict) -> dict:
    """paramiko's lookup() -> the settings dict (what the config set)."""
    out: dict = {}
    for key in ("hostname", "user", "proxyjump", "proxycommand", "stricthostkeychecking"):
        if c.get(key):
            out[key] = c[key]
    if "port" in c:
        out["port"] = c["port"]
    if c.get("identityfile"):
        out["identityfile"] = list(c["identityfile"])
    if c.get("userknownhostsfile"):
        out["userknownhostsfile"] = shlex.split(c["userknownhostsfile"])
    if c.get("globalknownhostsfile"):
        out["globalknownhostsfile"] = shlex.split(c["globalknownhostsfile"])
    for key in ("connecttimeout", "serveraliveinterval", "identitiesonly"):
        if key in c:
            out[key] = c[key]
    return out


def parse_dump(text: str) -> dict:
    """``ssh -G`` output -> what the user's files set (markers and OpenSSH's defaults dropped). Pure."""
    raw: dict = {}
    ids: list[str] = []
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        key = key.lower()
        if not key:
            continue
        if key == "identityfile":
            if value != _UNSET_PATH:
                ids.append(value)
        elif key not in raw:
            raw[key] = value
    out: dict = {}
    if raw.get("user") and raw["user"] != UNSET:
        out["user"] = raw["user"]
    if ids:
        out["identityfile"] = ids
    ukh = raw.get("userknownhostsfile")
    if ukh and _UNSET_PATH not in ukh:
        out["userknownhostsfile"] = ukh.split()
    gkh = raw.get("globalknownhostsfile")
    if gkh and _UNSET_PATH not in gkh:
        out["globalknownhostsfile"] = gkh.split()
    for key in ("hostname", "port", "stricthostkeychecking", "identitiesonly"):
        if raw.get(key):
            out[key] = raw[key]
    for key, default in (("stricthostkeychecking", "ask"), ("port", "22"), ("identitiesonly", "no")):
        if out.get(key) == default:
            del out[key]
    for key in ("connecttimeout", "serveraliveinterval"):
        if raw.get(key) and raw[key] not in ("none", "0"):
            out[key] = raw[key]
    for key in ("proxyjump", "proxycommand"):
        if raw.get(key) and raw[key].lower() != "none":
            out[key] = raw[key]
    return out


class SshConfig:
    """What the user's ssh config sets for each host name, asked once per name per run.

    ``openssh``: None = use ``ssh -G`` when an ssh client is on PATH; False = always paramiko.
    """

    def __init__(self, path: str | None = None, *, openssh: bool | None = None, text: str | None = None):
        self.explicit = path is not None
        self.path = os.path.expanduser(path) if path else os.path.expanduser("~/.ssh/config")
        if self.explicit and not os.path.exists(self.path):
            raise ConfigError(f"--ssh-config {path}: no such file")
        self.ssh = shutil.which("ssh") if openssh is not False and text is None else None
        self.asked = 0                     # ssh -G processes run (for tests and benchmarks)
        self._cache: dict[str, dict] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._wrapper: str | None = None
        self._wrapper_text = ""
        self._paramiko = None
        if text is not None:
            self._paramiko = _paramiko_config(text, "<ssh config>")

    @property
    def source(self) -> str:
        return "ssh -G" if self.ssh else "paramiko"

    def lookup(self, name: str) -> dict:
        with self._lock:
            if name in self._cache:
                return self._cache[name]
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            with self._lock:
                if name in self._cache:
                    return self._cache[name]
            got = self._ask_openssh(name) if self.ssh else self._ask_paramiko(name)
            with self._lock:
                self._cache[name] = got
            return got

    # -- OpenSSH
    def _wrapper_file(self) -> str:
        with self._lock:
            if self._wrapper is None:
                lines = ["# provision: the user's ssh config, then markers for what it left unset"]
                if os.path.exists(self.path):
                    lines.append(f'Include "{self.path}"')
                if not self.explicit and os.path.exists(SYSTEM_CONFIG):
                    lines.append(f'Include "{SYSTEM_CONFIG}"')
                lines += ["Host *", f"  User {UNSET}", f"  IdentityFile {_UNSET_PATH}",
                          f"  UserKnownHostsFile {_UNSET_PATH}", f"  GlobalKnownHostsFile {_UNSET_PATH}", ""]
                fd, path = tempfile.mkstemp(prefix="provision-ssh-", suffix=".conf")
                self._wrapper_text = "\n".join(lines)
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(self._wrapper_text)
                self._wrapper = path
                import atexit

                atexit.register(self.close)
            return self._wrapper

    def _ask_openssh(self, name: str) -> dict:
        if name.startswith("-") or any(c.isspace() for c in name):
            raise ConfigError(f"host name {name!r}: not a host name ssh accepts")
        from provision.control.transport import openssh_cache

        wrapper = self._wrapper_file()
        try:
            key: str | None = openssh_cache.question(self.ssh or "ssh", self._wrapper_text, name)
        except (OSError, KeyError):  # no passwd entry for this uid (a bare container): ask every run
            key = None
        kept = openssh_cache.lookup(key) if key else None
        if kept is not None:
            return parse_dump(kept)
        try:  # -v: ssh also says which files it read (what the kept answer depends on)
            proc = subprocess.run([self.ssh or "ssh", "-v", "-G", "-F", wrapper, "--", name], capture_output=True,
                                  text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"ssh -G {name}: could not run the OpenSSH client ({exc})") from None
        self.asked += 1
        if proc.returncode != 0:
            why = " | ".join(ln.strip() for ln in proc.stderr.splitlines()
                             if ln.strip() and "terminating" not in ln
                             and not ln.startswith(("debug1:", "debug2:", "debug3:", "OpenSSH_")))[:400]
            where = self.path if os.path.exists(self.path) else "ssh config"
            raise ConfigError(f"{where}: OpenSSH rejects the config for {name}: "
                              f"{why.replace(self._wrapper or '', '<wrapper>') or f'exit {proc.returncode}'}")
        if key:
            openssh_cache.keep(key, wrapper, proc.stdout, proc.stderr)
        return parse_dump(proc.stdout)

    # -- paramiko
    def _ask_paramiko(self, name: str) -> dict:
        with self._lock:
            if self._paramiko is None:
                import paramiko

                text = ""
                if os.path.exists(self.path):
                    try:
                        text = Path(self.path).read_text(encoding="utf-8")
                    except OSError as exc:
                        raise ConfigError(f"{self.path}: cannot read ({exc.strerror})") from None
                    text = expand_includes(text, Path(os.path.expanduser("~/.ssh")))
                self._paramiko = _paramiko_config(text, self.path)
        return _paramiko_settings(self._paramiko.lookup(name))

    def close(self) -> None:
        if self._wrapper:
            try:
                os.unlink(self._wrapper)
            except OSError:
                pass
            self._wrapper = None


def load_ssh_config(path: str | None, *, openssh: bool | None = None) -> SshConfig:
    return SshConfig(path, openssh=openssh)


# --------------------------------------------------------------------------- merging

def _split_userhostport(spec: str) -> tuple[str | None, str, int | None]:
    user = None
    if spec.startswith("ssh://"):
        spec = spec[6:]
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    try:
        if spec.startswith("["):
            host, _, rest = spec[1:].partition("]")
            if rest.startswith(":"):
                port = int(rest[1:])
            return user, host, port
        if spec.count(":") == 1:
            host, p = spec.split(":")
            return user, host, int(p)
    except ValueError:
        raise ConfigError(f"ProxyJump hop {spec!r}: the port is not a number") from None
    return user, spec, port


def _paramiko_config(text: str, path: str):
    """paramiko's reading of an ssh config; a line it cannot parse is a ConfigError naming it."""
    import paramiko

    try:
        return paramiko.SSHConfig.from_text(text)
    except paramiko.ssh_exception.ConfigParseError as exc:
        raise ConfigError(f"ssh config {path}: {exc} (expected `Keyword value`, as ssh_config(5) says)") from None


def _check_name(host: str, what: str, value) -> None:
    from provision.config.names import refusal

    why = refusal(host, what, value)
    if why is not None:
        raise ConfigError(why)


def expand_tokens(command: str, *, hostname: str, port: int, user: str, alias: str) -> str:
    """ProxyCommand's % tokens (ssh_config TOKENS): %h %p %r %n %%. Each value is quoted for the
    shell that runs the line (shlex.quote: a checked name, which has no shell metacharacter, comes
    out as it went in), so no inventory value is ever read by the shell as code."""
    out, i = [], 0
    while i < len(command):
        ch = command[i]
        if ch == "%" and i + 1 < len(command):
            nxt = command[i + 1]
            rep = {"h": hostname, "p": str(port), "r": user, "n": alias, "%": "%"}.get(nxt)
            if rep is not None and nxt != "%":
                rep = shlex.quote(rep)
            if rep is not None:
                out.append(rep)
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _number(alias: str, key: str, value, kind=float):
    try:
        v = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"ssh config: {key} for {alias} is not a number: {value!r}") from None
    return v


def _as_config(config) -> SshConfig:
    if isinstance(config, SshConfig):
        return config
    wrapped = SshConfig.__new__(SshConfig)  # a paramiko.SSHConfig handed in (tests)
    SshConfig.__init__(wrapped, text="")
    wrapped._paramiko = config
    return wrapped


def resolve(alias: str, *, config, user: str | None = None, port: int | None = None,
            identity: str | list | None = None, jump: str | None = None, proxy_command: str | None = None,
            hostname: str | None = None,
            known_hosts: list[str] | None = None, strict: str | None = None,
            connect_timeout: float | None = None, _depth: int = 0) -> Target:
    """Given values (flag, else inventory) win over ssh config, which wins over defaults.

    ``None`` means "not given". The config is asked for the address when one is given
    (as ``ssh ADDRESS`` would be), else for the name. The ProxyJump chain is resolved
    into ``via`` (each hop through the config itself)."""
    cfg = _as_config(config)
    _check_name(alias, "name", alias)  # before `ssh -G` is asked anything (the user is checked below,
    if hostname is not None:           # once it is final; ssh -G is never given it)
        _check_name(alias, "address", hostname)
    c = cfg.lookup(hostname or alias)
    if hostname is None:
        hostname = c.get("hostname") or alias
    cport = _number(alias, "Port", c["port"], int) if "port" in c else None
    if identity:
        ids = [os.path.expanduser(i) for i in ([identity] if isinstance(identity, str) else identity)]
    else:
        ids = [os.path.expanduser(i) for i in c.get("identityfile", [])]
        ids = [i for i in ids if os.path.exists(i)]  # like ssh: a listed key that is absent is skipped
    only = str(c.get("identitiesonly", "no")).lower() in ("yes", "true")
    pj = jump if jump is not None else None if proxy_command is not None else c.get("proxyjump")
    if pj and pj.lower() == "none":
        pj = None
    pc = proxy_command if proxy_command is not None else None if jump is not None else c.get("proxycommand")
    if pc and pc.lower() == "none":
        pc = None
    kh = list(known_hosts or [])
    if not kh:
        ukh = c.get("userknownhostsfile")
        if ukh:
            kh = [os.path.expanduser(p) for p in ukh if p.lower() != "none"]
        else:
            kh = [os.path.expanduser("~/.ssh/known_hosts")]
    gkh = c.get("globalknownhostsfile")
    global_kh = tuple(os.path.expanduser(p) for p in gkh if p.lower() != "none") if gkh else None
    shk = (strict or c.get("stricthostkeychecking") or "yes").lower()
    shk = {"true": "yes", "false": "no", "off": "no", "ask": "yes"}.get(shk, shk)
    if shk not in ("yes", "accept-new", "no"):
        raise ConfigError(f"StrictHostKeyChecking {shk!r} for {alias}: expected yes, accept-new or no")
    ct = connect_timeout
    if ct is None and "connecttimeout" in c:
        ct = _number(alias, "ConnectTimeout", c["connecttimeout"])
    ka = _number(alias, "ServerAliveInterval", c["serveraliveinterval"], int) if "serveraliveinterval" in c else None
    final_user = user or c.get("user") or "root"
    final_port = port or cport or 22
    _check_name(alias, "address", hostname)  # the ssh config's HostName and User are held to it too
    _check_name(alias, "user", final_user)
    if pc:
        pc = expand_tokens(pc, hostname=hostname, port=final_port, user=final_user, alias=alias)
    # what the flags gave (not the config): it applies to every gateway of the chain too
    given = {"known_hosts": known_hosts, "strict": strict, "connect_timeout": connect_timeout}
    t = Target(alias=alias, hostname=hostname, port=final_port, user=final_user, identities=tuple(ids),
               identities_only=only, jump=pj or None, proxy_command=None if pj else pc, known_hosts=tuple(kh),
               global_known_hosts=global_kh,
               strict=shk, connect_timeout=ct or DEFAULT_CONNECT_TIMEOUT, keepalive=ka or DEFAULT_KEEPALIVE,
               extra={"given": given})
    if t.jump:
        t = _replace(t, via=resolve_jump(t.jump, config=cfg, base=t, _depth=_depth + 1))
    return t


def _replace(t: Target, **kw) -> Target:
    import dataclasses

    return dataclasses.replace(t, **kw)


def resolve_jump(spec: str, *, config, base: Target, _depth: int = 0) -> Target:
    """The last gateway of a ProxyJump chain ``a,b,c``: c, reached through b, reached through a.

    As OpenSSH does (``ssh -J a,b`` connects to b with ``-J a``): the first hop uses its own
    ssh config (its own ProxyJump or ProxyCommand included); each later hop goes through
    the hops before it. Each hop reads its own settings (User, IdentityFile, known hosts,
    ConnectTimeout...) from the config; what a flag gave applies to every hop."""
    if _depth > 8:
        raise ConfigError(f"{base.alias}: ProxyJump chain nested more than 8 deep (a loop in the ssh config?)")
    hops = [h.strip() for h in spec.split(",") if h.strip()]
    if not hops:
        raise ConfigError(f"{base.alias}: empty ProxyJump {spec!r}")
    juser, jhost, jport = _split_userhostport(hops[-1])
    before = ",".join(hops[:-1]) or None
    given = base.extra.get("given") or {}
    return resolve(jhost, config=config, user=juser, port=jport, jump=before, known_hosts=given.get("known_hosts"),
                   strict=given.get("strict"), connect_timeout=given.get("connect_timeout"), _depth=_depth)
