"""One SSH session per host: Fabric for connecting, the paramiko channel for running.

Policy lives here and only here: host-key checking, timeouts, keepalive, retries
of transient failures (tenacity), deadlines on every remote step, and how the
remote engine travels (bootstrap as the argument, bundle + request written
straight to the channel's stdin, never through Fabric's slow ``in_stream`` and
never in the command line or environment).
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError
from tenacity import RetryError, retry, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from provision.errors import AuthError, ConnectError, HostKeyError, RemoteError, UnknownOutcome
from provision.hostkeys import KnownHosts, VerifyingPolicy, fingerprint
from provision.remote.bootstrap import EVENT_PREFIX, RESULT_PREFIX
from provision.sshconfig import Target


@dataclass
class Stats:
    connections: int = 0
    commands: int = 0


STATS = Stats()
_stats_lock = threading.Lock()


def _count(attr: str) -> None:
    with _stats_lock:
        setattr(STATS, attr, getattr(STATS, attr) + 1)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, (AuthError, HostKeyError, paramiko.AuthenticationException, paramiko.BadHostKeyException)):
        return False
    if isinstance(exc, (NoValidConnectionsError, ConnectionRefusedError, ConnectionResetError, EOFError)):
        return True
    if isinstance(exc, paramiko.SSHException):
        msg = str(exc)
        return "banner" in msg or "reset" in msg.lower() or "No existing session" in msg
    return False


@dataclass
class GatewayPool:
    """One connection per bastion, shared by every host behind it (sshd MaxStartups)."""

    conns: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, target: Target, known: KnownHosts, accept_append: str | None):
        import fabric

        key = (target.hostname, target.port, target.user)
        with self.lock:
            conn = self.conns.get(key)
            if conn is None:
                conn = _make_connection(fabric, target, known, accept_append, gateway=None)
                self.conns[key] = conn
            if not conn.is_connected:
                _open(conn, target)
            return conn

    def close(self) -> None:
        for conn in self.conns.values():
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


def _make_connection(fabric, target: Target, known: KnownHosts, accept_append: str | None, gateway):
    cfg = fabric.Config(overrides={"load_ssh_configs": False, "run": {"hide": True}})
    kwargs = {"allow_agent": True, "look_for_keys": not target.identities,
              "banner_timeout": target.connect_timeout, "auth_timeout": target.connect_timeout}
    if target.identities:
        kwargs["key_filename"] = list(target.identities)
    conn = fabric.Connection(host=target.hostname, user=target.user, port=target.port, config=cfg,
                             connect_timeout=int(max(1, target.connect_timeout)), connect_kwargs=kwargs,
                             gateway=gateway, inline_ssh_env=False)
    known.install(conn.client)
    conn.client.set_missing_host_key_policy(VerifyingPolicy(known, target.strict, target.alias, accept_append))
    return conn


def _open(conn, target: Target) -> None:
    try:
        conn.open()
    except HostKeyError:
        raise
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(
            f"{target.alias}: host key CHANGED: got {fingerprint(exc.key)}, known_hosts has "
            f"{fingerprint(exc.expected_key)}. This may be a man-in-the-middle. If the host was "
            f"reinstalled, remove the old key (ssh-keygen -R {target.hostname}) and verify the new one") from None
    except paramiko.AuthenticationException as exc:
        raise AuthError(f"{target.alias}: authentication as {target.user}@{target.hostname}:{target.port} "
                        f"refused ({exc}); check the key (-i/--identity, IdentityFile) and the user") from None
    except socket.timeout:
        raise ConnectError(f"{target.alias}: no answer from {target.hostname}:{target.port} within "
                           f"{target.connect_timeout:g} s") from None
    except (NoValidConnectionsError, OSError, EOFError, paramiko.SSHException) as exc:
        err = ConnectError(f"{target.alias}: cannot connect to {target.hostname}:{target.port}: "
                           f"{_short(exc)}")
        err.__cause__ = exc
        err.transient = _transient(exc)  # type: ignore[attr-defined]
        raise err from None


def _short(exc: BaseException) -> str:
    if isinstance(exc, NoValidConnectionsError):
        return "connection refused"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


class Session:
    """An open SSH session to one host."""

    def __init__(self, target: Target, *, known: KnownHosts, accept_append: str | None = None,
                 gateways: GatewayPool | None = None, jump_target: Target | None = None,
                 retries: int = 3, keepalive: int = 15):
        self.target = target
        self.known = known
        self.accept_append = accept_append
        self.gateways = gateways
        self.jump_target = jump_target
        self.retries = retries
        self.keepalive = keepalive
        self.conn = None

    def open(self) -> "Session":
        import fabric

        gateway = None
        if self.jump_target is not None:
            pool = self.gateways or GatewayPool()
            gateway = pool.get(self.jump_target, self.known, self.accept_append)

        @retry(retry=retry_if_exception(lambda e: getattr(e, "transient", False)),
               stop=stop_after_attempt(self.retries) | stop_after_delay(30),
               wait=wait_exponential(multiplier=0.5, max=4), reraise=True)
        def attempt():
            self.conn = _make_connection(fabric, self.target, self.known, self.accept_append, gateway)
            _count("connections")
            _open(self.conn, self.target)

        try:
            attempt()
        except RetryError as exc:  # pragma: no cover - reraise=True makes this rare
            raise ConnectError(f"{self.target.alias}: cannot connect: {exc}") from None
        transport = self.conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.keepalive)
        return self

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    # -- running ---------------------------------------------------------
    def exec(self, command: str, stdin: bytes = b"", timeout: float = 120.0,
             on_line: Callable[[str], None] | None = None, started: list | None = None) -> tuple[int, str, str]:
        """Run one command with a hard deadline. Returns (exit status, stdout, stderr).

        ``started`` (a list) gets True appended once the request is fully sent:
        after that point a dead channel means the outcome is unknown.
        """
        transport = self.conn.client.get_transport() if self.conn else None
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.target.alias}: connection is closed")
        _count("commands")
        deadline = time.monotonic() + timeout
        chan = transport.open_session(timeout=min(timeout, 30))
        try:
            chan.settimeout(0.0)
            chan.exec_command(command)
            view = memoryview(stdin)
            while view:
                if time.monotonic() > deadline:
                    raise ConnectError(f"{self.target.alias}: timed out sending the request after {timeout:g} s")
                if chan.send_ready():
                    n = chan.send(view[:32768])
                    view = view[n:]
                else:
                    select.select([], [], [], 0.01)
            chan.shutdown_write()
            if started is not None:
                started.append(True)
            out, err = bytearray(), bytearray()
            pending = ""
            while True:
                got = False
                while chan.recv_ready():
                    chunk = chan.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                    got = True
                    if on_line is not None:
                        pending += chunk.decode("utf-8", "replace")
                        *lines, pending = pending.split("\n")
                        for line in lines:
                            on_line(line)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not transport.is_active():
                    raise UnknownOutcome(f"{self.target.alias}: the connection dropped while the remote step ran; "
                                         "its outcome is unknown until `provision status` looks")
                if time.monotonic() > deadline:
                    raise UnknownOutcome(f"{self.target.alias}: no answer within {timeout:g} s; the remote step may "
                                         "still be running: its outcome is unknown until `provision status` looks")
                if not got:
                    select.select([chan], [], [], 0.05)
            if on_line is not None and pending:
                on_line(pending)
            return chan.recv_exit_status(), out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        finally:
            try:
                chan.close()
            except Exception:  # noqa: BLE001
                pass

    def call(self, request: dict, *, timeout: float = 300.0, python: str = "python3", sudo: bool = False,
             on_event: Callable[[dict], None] | None = None) -> dict:
        """Run the remote agent with one request; return its JSON answer."""
        from provision.remote.bundle import bootstrap_command, payload

        cmd = bootstrap_command(python, sudo=sudo)
        result: list[dict] = []

        def on_line(line: str) -> None:
            if line.startswith(RESULT_PREFIX):
                result.append(json.loads(line[len(RESULT_PREFIX):]))
            elif line.startswith(EVENT_PREFIX) and on_event is not None:
                on_event(json.loads(line[len(EVENT_PREFIX):]))

        started: list = []
        try:
            rc, out, err = self.exec(cmd, payload(request), timeout=timeout, on_line=on_line, started=started)
        except UnknownOutcome:
            raise
        except ConnectError as exc:
            if started:
                raise UnknownOutcome(str(exc)) from None
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if started:
                raise UnknownOutcome(f"{self.target.alias}: connection lost during the remote step "
                                     f"({_short(exc)}); outcome unknown until `provision status` looks") from None
            raise ConnectError(f"{self.target.alias}: {_short(exc)}") from None
        if result:
            return result[-1]
        tail = (err.strip() or out.strip())[-600:]
        if "sudo:" in err and ("password" in err or "a terminal is required" in err):
            raise RemoteError(f"{self.target.alias}: sudo needs a password and -n forbids prompting; "
                              "give passwordless sudo for python3 or use --sudo-password-file")
        if rc == 127 or "python3: not found" in err or "No such file" in err and python in err:
            raise RemoteError(f"{self.target.alias}: {python} not found on the host (SGLang needs Python 3.10+)")
        if rc in (-9, 137) or (rc == -1 and not out):
            if started:
                raise UnknownOutcome(f"{self.target.alias}: the remote engine was killed (exit {rc}); the file is "
                                     "either as before or as intended: run `provision status` to see which")
        raise RemoteError(f"{self.target.alias}: the remote engine gave no answer (exit {rc}): {tail}")
