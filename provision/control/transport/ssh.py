"""One SSH session per host: Fabric for connecting, the paramiko channel for running.

The SSH implementation of base.Transport. The SSH policy lives here and only here:
host-key checking, connect timeouts, keepalive, gateways, retries of transient failures
(``_retrying``, tenacity). How a step runs (bootstrap as the argument, bundle + request written straight
to the channel's stdin, never through Fabric's slow ``in_stream`` and never in the
command line or environment; the ready line; sudo and its password; deadlines) is
base.Transport's, the same for every transport: this module only opens the channel.

Retried (at most 4 attempts, backoff 0.5, 1, 2 s plus jitter): refused or reset
connections and dropped handshakes. Never retried: authentication and host-key
failures, and timeouts (a silent host has had its deadline).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from provision.errors import AuthError, ConnectError, HostKeyError, ProvisionError
# Interrupted and SudoRefused are named here too: callers have always imported them from ssh
from provision.control.transport.base import Interrupted, SudoRefused, Transport  # noqa: F401
from provision.control.transport.hostkeys import KnownHosts, VerifyingPolicy, fingerprint, host_key_name
from provision.control.transport.settings import Target


@dataclass
class Stats:
    connections: int = 0
    commands: int = 0


STATS = Stats()
# paramiko's transport thread logs handshake failures with a traceback; with no handler
# configured, Python would print them on stderr. Our one-line errors say it all.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
_stats_lock = threading.Lock()


def _count(attr: str) -> None:
    with _stats_lock:
        setattr(STATS, attr, getattr(STATS, attr) + 1)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


# paramiko's words when the transport ended while it waited for sshd's answer to a key
# (auth_handler.wait_for_response): the connection was lost, sshd refused nothing.
_AUTH_EOF = "transport shut down or saw EOF"


def _transient(exc: BaseException) -> bool:
    """Worth another try: refused or reset connections, a dropped handshake. Never auth or
    host-key failures, and never timeouts (a silent host already used its deadline)."""
    chain = list(_chain(exc))
    if any(isinstance(e, (AuthError, HostKeyError, paramiko.AuthenticationException,
                          paramiko.BadHostKeyException)) for e in chain):
        return False
    if any(isinstance(e, (socket.timeout, TimeoutError)) for e in chain):
        return False
    if isinstance(exc, (NoValidConnectionsError, ConnectionRefusedError, ConnectionResetError, EOFError)):
        return True
    if isinstance(exc, paramiko.SSHException):
        msg = str(exc)
        return "banner" in msg or "reset" in msg.lower() or "No existing session" in msg
    return False


@dataclass
class GatewayPool:
    """One connection per gateway (ProxyJump hop), shared by every host behind it (sshd
    MaxStartups). A chain a,b is two entries: b is opened through the shared a.

    Each gateway has its own lock, held only while that gateway is dialled: hosts behind it wait
    for that one dial, hosts behind other gateways never wait. A gateway that failed (refused,
    silent, wrong key, authentication) is remembered for the run: the hosts behind it fail at
    once with its error, and it is not dialled again."""

    conns: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)   # guards the dicts, never held while dialling
    opened: int = 0
    dialled: int = 0                     # dials attempted, failed ones included (tests, benchmarks)
    known_for: Callable | None = None   # Target -> KnownHosts (each gateway's own known hosts)
    failed: dict = field(default_factory=dict)   # Target.key -> the ProvisionError of its dial
    _locks: dict = field(default_factory=dict)   # Target.key -> that gateway's lock

    def get(self, target: Target, known: KnownHosts, accept_append: str | None):
        import fabric

        if self.known_for is not None:
            known = self.known_for(target)
            accept_append = target.known_hosts[0] if target.known_hosts else None
        parent = self.get(target.via, known, accept_append) if target.via is not None else None
        with self.lock:
            gate = self._locks.setdefault(target.key, threading.Lock())
        with gate:
            with self.lock:
                if target.key in self.failed:
                    first = self.failed[target.key]
                    again = type(first)(first.message)
                    again.transient = False  # type: ignore[attr-defined]
                    again.remembered = True  # type: ignore[attr-defined]
                    raise again
                conn = self.conns.get(target.key)
            if conn is not None and conn.is_connected:
                return conn
            # none yet, or it died (or a ProxyCommand exited): open it afresh, once for all its hosts
            with self.lock:
                self.dialled += 1
            try:
                conn = _make_connection(fabric, target, known, accept_append, gateway=parent)
                _open(conn, target)
            except ProvisionError as exc:
                exc.transient = False  # type: ignore[attr-defined] - remembered, so never retried either
                with self.lock:
                    self.failed[target.key] = exc
                raise
            transport = conn.client.get_transport()
            if transport is not None:
                transport.set_keepalive(target.keepalive)
            with self.lock:
                self.opened += 1
                self.conns[target.key] = conn
            return conn

    def close(self) -> None:
        for conn in reversed(list(self.conns.values())):
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


def through_gateway(alias: str, gateway: Target, exc: ProvisionError) -> ProvisionError:
    """A host's error when its gateway failed: the gateway's own error, of the same class (the same
    verdict and exit code), naming the host first."""
    when = " earlier in this run (not dialled again)" if getattr(exc, "remembered", False) else ""
    err = type(exc)(f"{alias}: gateway {gateway.alias} failed{when}: {exc.message}")
    err.transient = False  # type: ignore[attr-defined]
    return err


class ShellProxyCommand(paramiko.ProxyCommand):
    """A ProxyCommand run the way OpenSSH runs it (sshconnect.c): ``$SHELL -c 'exec COMMAND'``
    (/bin/sh when SHELL is unset), so the shell's pipes, redirections, quoting and $VARs work as
    they do for ``ssh``. paramiko's own ProxyCommand splits the line with shlex and runs it with no
    shell, where ``a | b`` or ``$HOME`` are plain words."""

    def __init__(self, command_line: str):  # noqa: D107 - paramiko's ProxyCommand fields, set as it does
        import subprocess

        shell = os.environ.get("SHELL") or "/bin/sh"
        self.cmd = [shell, "-c", "exec " + command_line]
        self.process = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, bufsize=0)
        self.timeout = None

    def recv(self, size: int) -> bytes:
        """What the command has written, up to ``size`` bytes, as a socket's recv answers: at once
        when there is some, and b"" when the command has closed its output (it exited). paramiko's
        own read waits to fill ``size`` and takes an end of file for "nothing yet", so a ProxyCommand
        that could not run cost the whole ConnectTimeout before its error was said."""
        start = time.monotonic()
        while True:
            wait = None
            if self.timeout is not None:
                wait = self.timeout - (time.monotonic() - start)
                if wait <= 0:
                    raise socket.timeout()
            try:
                ready, _, _ = select.select([self.process.stdout], [], [], wait)
                if ready:
                    return os.read(self.process.stdout.fileno(), size)
            except OSError as exc:
                raise paramiko.ProxyCommandFailure(" ".join(self.cmd), exc.strerror) from None


def _make_connection(fabric, target: Target, known: KnownHosts, accept_append: str | None, gateway):
    cfg = fabric.Config(overrides={"load_ssh_configs": False, "run": {"hide": True}})
    kwargs = {"allow_agent": not target.identities_only,
              "look_for_keys": not target.identities and not target.identities_only,
              "banner_timeout": target.connect_timeout, "auth_timeout": target.connect_timeout}
    if target.identities:
        kwargs["key_filename"] = list(target.identities)
    if target.proxy_command and gateway is None:
        try:
            kwargs["sock"] = ShellProxyCommand(target.proxy_command)
        except (OSError, ValueError) as exc:
            raise ConnectError(f"{target.alias}: cannot run the ProxyCommand "
                               f"({getattr(exc, 'strerror', None) or exc}): {target.proxy_command}") from None
    conn = fabric.Connection(host=target.hostname, user=target.user, port=target.port, config=cfg,
                             connect_timeout=int(max(1, target.connect_timeout)), connect_kwargs=kwargs,
                             gateway=gateway, inline_ssh_env=False)
    known.install(conn.client)
    conn.client.set_missing_host_key_policy(VerifyingPolicy(known, target.strict, target.alias, accept_append))
    conn._provision_known = known  # noqa: SLF001 - for the changed-key message
    return conn


def _open(conn, target: Target) -> None:
    t0 = time.monotonic()
    try:
        conn.open()
    except HostKeyError:
        raise
    except paramiko.BadHostKeyException as exc:
        known = getattr(conn, "_provision_known", None)
        name = host_key_name(target.hostname, target.port)
        where = known.origin(name, exc.expected_key) if known is not None else None
        files = f" -f {where.rsplit(':', 1)[0]}" if where else ""
        raise HostKeyError(
            f"{target.alias}: host key CHANGED: the host offered {fingerprint(exc.key)}, known_hosts "
            f"{'(' + where + ') ' if where else ''}has {fingerprint(exc.expected_key)}; refusing to connect "
            f"(--accept-new-host-keys never replaces a key). This may be a man-in-the-middle. If the host "
            f"was reinstalled, verify the new key with its owner, then remove the old one "
            f"(ssh-keygen{files} -R '{name}') and run again") from None
    except paramiko.AuthenticationException as exc:
        if _AUTH_EOF in str(exc):  # the connection died before sshd answered: a lost connection, not a refusal
            err = ConnectError(f"{target.alias}: the connection to {target.hostname}:{target.port} closed during "
                               f"authentication (before sshd accepted or refused the key)")
            err.transient = True  # type: ignore[attr-defined]
            raise err from None
        raise AuthError(f"{target.alias}: authentication as {target.user}@{target.hostname}:{target.port} "
                        f"refused ({exc}); check the key (-i/--identity, IdentityFile) and the user") from None
    except socket.timeout:
        raise ConnectError(f"{target.alias}: no answer from {target.hostname}:{target.port} within "
                           f"{target.connect_timeout:g} s (ConnectTimeout)") from None
    except paramiko.ProxyCommandFailure as exc:
        died = _proxy_exit(conn)
        if died is not None:
            raise ConnectError(f"{target.alias}: cannot run the ProxyCommand ({died}): {target.proxy_command}") from None
        raise ConnectError(f"{target.alias}: the ProxyCommand for {target.hostname}:{target.port} failed "
                           f"({_short(exc)}): {target.proxy_command}") from None
    except (NoValidConnectionsError, OSError, EOFError, paramiko.SSHException) as exc:
        died = _proxy_exit(conn)
        if died is not None:  # the ProxyCommand itself ended (not found, refused, a typo): its words
            raise ConnectError(f"{target.alias}: cannot run the ProxyCommand ({died}): {target.proxy_command}") from None
        # A silent host: the greeting timed out (paramiko sometimes reports that as "No existing
        # session" once its own wait ran out). Never retried: the host already had its deadline.
        slow = time.monotonic() - t0 >= 0.9 * target.connect_timeout
        if not isinstance(exc, NoValidConnectionsError) and (slow or any(
                isinstance(e, (socket.timeout, TimeoutError)) for e in _chain(exc))):
            raise ConnectError(f"{target.alias}: {target.hostname}:{target.port} accepted the connection but "
                               f"sent no SSH greeting within {target.connect_timeout:g} s (ConnectTimeout)") from None
        err = ConnectError(f"{target.alias}: cannot connect to {target.hostname}:{target.port}: "
                           f"{_short(exc)}")
        err.__cause__ = exc
        err.transient = _transient(exc)  # type: ignore[attr-defined]
        raise err from None


def _proxy_exit(conn) -> str | None:
    """How a ProxyCommand that already exited ended: its status and the last line it wrote on stderr
    (OpenSSH lets that through to the terminal); None while it runs, or without one."""
    sock = (getattr(conn, "connect_kwargs", None) or {}).get("sock")
    proc = getattr(sock, "process", None)
    if not isinstance(sock, ShellProxyCommand) or proc is None:
        return None
    try:
        status = proc.wait(timeout=1)
    except Exception:  # noqa: BLE001 - still running (subprocess.TimeoutExpired): not the proxy's fault
        return None
    err = b""
    try:
        if proc.stderr is not None and select.select([proc.stderr], [], [], 0)[0]:
            err = os.read(proc.stderr.fileno(), 65536)
    except OSError:
        pass
    last = next((ln.strip() for ln in reversed(err.decode("utf-8", "replace").splitlines()) if ln.strip()), "")
    return f"exit {status}" + (f": {last[:200]}" if last else "")


def _retrying(fn: Callable[[], None], may_retry: Callable[[BaseException], bool], attempts: int,
              sleep: Callable[[float], None], give_up_after: float = 30.0) -> None:
    """Call ``fn`` until it returns; retry what ``may_retry`` accepts, at most ``attempts`` tries
    and no new try once ``give_up_after`` seconds have passed, waiting 0.5, 1, 2, 4, 4 ... s
    plus up to 0.2 s of jitter in between; the last failure is raised as it is. The policy is
    tenacity's, imported only once a first try has failed: a connection that opens at once
    (nearly every one) does not pay tenacity's import (~25 ms of CPU per command)."""
    t0 = time.monotonic()
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - judged by may_retry, re-raised as is
        if attempts <= 1 or not may_retry(exc):
            raise
        first: list[BaseException] = [exc]
    from tenacity import (Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential,
                          wait_random)

    def again() -> None:  # tenacity's attempt 1 is the try that already failed
        if first:
            raise first.pop()
        fn()

    Retrying(retry=retry_if_exception(may_retry),
             stop=stop_after_attempt(attempts) | stop_after_delay(max(0.0, give_up_after - (time.monotonic() - t0))),
             wait=wait_exponential(multiplier=0.5, max=4) + wait_random(0, 0.2),
             sleep=sleep, reraise=True)(again)


def _short(exc: BaseException) -> str:
    if isinstance(exc, NoValidConnectionsError):
        return "connection refused"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


class Session(Transport):
    """An open SSH session to one host (the SSH implementation of base.Transport).

    ``sudo_password`` (bytes) is used only for steps run with ``sudo=True``: the step
    becomes ``sudo -S -p <one-off token>``, and the password is written to the
    channel's stdin only once that token shows up on stderr (never in a command
    line or an environment variable); the request follows once the remote
    interpreter says it runs. Without it, sudo steps use ``sudo -n``.
    """

    def __init__(self, target: Target, *, known: KnownHosts, accept_append: str | None = None,
                 gateways: GatewayPool | None = None, jump_target: Target | None = None,
                 retries: int = 4, keepalive: int | None = None, sudo_password: bytes | None = None):
        self.target = target
        self.known = known
        self.accept_append = accept_append
        self.gateways = gateways
        self.jump_target = jump_target if jump_target is not None else target.via
        self.retries = retries
        self.keepalive = keepalive if keepalive is not None else target.keepalive
        self.sudo_password = sudo_password
        self.conn = None
        self.attempts = 0
        super().__init__()

    kind = "ssh"
    channel_errors = (paramiko.SSHException,)

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.target.alias

    @property
    def user(self) -> str:  # type: ignore[override]
        return self.target.user

    @property
    def default_sudo(self) -> bool:  # type: ignore[override]
        """An SSH user other than root steps up with sudo (unless told otherwise)."""
        return self.target.user != "root"

    def open(self) -> "Session":
        import fabric

        gateway = None
        if self.jump_target is not None:
            pool = self.gateways or GatewayPool()
            try:
                gateway = pool.get(self.jump_target, self.known, self.accept_append)
            except ProvisionError as exc:
                raise through_gateway(self.target.alias, self.jump_target, exc) from None

        def may_retry(exc: BaseException) -> bool:
            return bool(getattr(exc, "transient", False)) and not self._cancelled.is_set()

        def attempt():
            if self._cancelled.is_set():
                raise Interrupted(f"{self.target.alias}: interrupted before connecting; nothing was done there")
            self.conn = _make_connection(fabric, self.target, self.known, self.accept_append, gateway)
            _count("connections")
            self.attempts += 1
            _open(self.conn, self.target)

        _retrying(attempt, may_retry, max(1, self.retries), self._sleep)
        transport = self.conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.keepalive)
        return self

    @property
    def connected(self) -> bool:
        return self._alive()

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001
                pass

    # -- running (the loop, the answer and the sentences are Transport's) ---
    def _channel(self, command: str, timeout: float):
        transport = self.conn.client.get_transport() if self.conn else None
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.target.alias}: connection is closed")
        _count("commands")
        chan = transport.open_session(timeout=min(timeout, 30))
        chan.settimeout(0.0)
        try:
            chan.exec_command(command)
        except BaseException:
            chan.close()
            raise
        return chan

    def _wait(self, chan, seconds: float) -> None:
        select.select([chan], [], [], seconds)

    def _alive(self) -> bool:
        transport = self.conn.client.get_transport() if self.conn is not None else None
        return transport is not None and transport.is_active()
