"""One SSH session per host: Fabric for connecting, the paramiko channel for running.

Policy lives here and only here: host-key checking, timeouts, keepalive, retries
of transient failures (tenacity), deadlines on every remote step, and how the
remote engine travels (bootstrap as the argument, bundle + request written
straight to the channel's stdin, never through Fabric's slow ``in_stream`` and
never in the command line or environment).

Every step's interpreter first prints a one-off ready line, so a step that never
started (sudo refused, no python) is told apart from one that started and died
(outcome unknown). sudo: ``sudo -n`` by default (never waits at a prompt); with
a password, ``sudo -S -p <one-off token>``: the password goes to stdin only when
that token appears on stderr, and the request only after the ready line.

Retried (at most 4 attempts, backoff 0.5, 1, 2 s plus jitter): refused or reset
connections and dropped handshakes. Never retried: authentication and host-key
failures, and timeouts (a silent host has had its deadline).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError
from tenacity import (RetryError, retry, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential,
                      wait_random)

from provision.errors import AuthError, ConnectError, HostError, HostKeyError, RemoteError, UnknownOutcome
from provision.control.transport.hostkeys import KnownHosts, VerifyingPolicy, fingerprint, host_key_name
from provision.host.bootstrap import EVENT_PREFIX, RESULT_PREFIX
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
    MaxStartups). A chain a,b is two entries: b is opened through the shared a."""

    conns: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    opened: int = 0
    known_for: Callable | None = None   # Target -> KnownHosts (each gateway's own known hosts)

    def get(self, target: Target, known: KnownHosts, accept_append: str | None):
        import fabric

        if self.known_for is not None:
            known = self.known_for(target)
            accept_append = target.known_hosts[0] if target.known_hosts else None
        parent = self.get(target.via, known, accept_append) if target.via is not None else None
        with self.lock:
            conn = self.conns.get(target.key)
            if conn is not None and not conn.is_connected:
                conn = None  # died (or a ProxyCommand exited): open it afresh
            if conn is None:
                conn = _make_connection(fabric, target, known, accept_append, gateway=parent)
                _open(conn, target)
                transport = conn.client.get_transport()
                if transport is not None:
                    transport.set_keepalive(target.keepalive)
                self.opened += 1
                self.conns[target.key] = conn
            return conn

    def close(self) -> None:
        for conn in reversed(list(self.conns.values())):
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


def _make_connection(fabric, target: Target, known: KnownHosts, accept_append: str | None, gateway):
    cfg = fabric.Config(overrides={"load_ssh_configs": False, "run": {"hide": True}})
    kwargs = {"allow_agent": not target.identities_only,
              "look_for_keys": not target.identities and not target.identities_only,
              "banner_timeout": target.connect_timeout, "auth_timeout": target.connect_timeout}
    if target.identities:
        kwargs["key_filename"] = list(target.identities)
    if target.proxy_command and gateway is None:
        try:
            kwargs["sock"] = paramiko.ProxyCommand(target.proxy_command)
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
        raise AuthError(f"{target.alias}: authentication as {target.user}@{target.hostname}:{target.port} "
                        f"refused ({exc}); check the key (-i/--identity, IdentityFile) and the user") from None
    except socket.timeout:
        raise ConnectError(f"{target.alias}: no answer from {target.hostname}:{target.port} within "
                           f"{target.connect_timeout:g} s (ConnectTimeout)") from None
    except paramiko.ProxyCommandFailure as exc:
        raise ConnectError(f"{target.alias}: the ProxyCommand for {target.hostname}:{target.port} failed "
                           f"({_short(exc)}): {target.proxy_command}") from None
    except (NoValidConnectionsError, OSError, EOFError, paramiko.SSHException) as exc:
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


def _short(exc: BaseException) -> str:
    if isinstance(exc, NoValidConnectionsError):
        return "connection refused"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


READY_PREFIX = "PROVISION-READY "
SUDO_HANDSHAKE_SECONDS = 60.0
_PROMPT_FALLBACK = re.compile(rb"(?i)password[^\n]{0,80}:\s*$")
_SUDO_NOISE = ("unable to resolve host", "unable to send audit message", "lecture", "we trust you have")


@dataclass
class ExecResult:
    rc: int
    out: str
    err: str
    ready: bool          # the remote interpreter started (its ready line arrived)
    password_sent: bool  # a sudo password went over stdin


class Interrupted(HostError):
    """Ctrl-C before this host's step was sent: nothing was run there."""

    kind = "interrupted"


class SudoRefused(RemoteError):
    """sudo would not run the engine (needs a password, wrong password, requiretty, not allowed)."""

    kind = "sudo"


class Session:
    """An open SSH session to one host.

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
        self._cancelled = threading.Event()

    def open(self) -> "Session":
        import fabric

        gateway = None
        if self.jump_target is not None:
            pool = self.gateways or GatewayPool()
            gateway = pool.get(self.jump_target, self.known, self.accept_append)

        def may_retry(exc: BaseException) -> bool:
            return bool(getattr(exc, "transient", False)) and not self._cancelled.is_set()

        @retry(retry=retry_if_exception(may_retry),
               stop=stop_after_attempt(max(1, self.retries)) | stop_after_delay(30),
               wait=wait_exponential(multiplier=0.5, max=4) + wait_random(0, 0.2),
               sleep=self._sleep, reraise=True)
        def attempt():
            if self._cancelled.is_set():
                raise Interrupted(f"{self.target.alias}: interrupted before connecting; nothing was done there")
            self.conn = _make_connection(fabric, self.target, self.known, self.accept_append, gateway)
            _count("connections")
            self.attempts += 1
            _open(self.conn, self.target)

        try:
            attempt()
        except RetryError as exc:  # pragma: no cover - reraise=True makes this rare
            raise ConnectError(f"{self.target.alias}: cannot connect: {exc}") from None
        transport = self.conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.keepalive)
        return self

    def _sleep(self, seconds: float) -> None:
        self._cancelled.wait(seconds)

    def pause(self, seconds: float) -> None:
        """Sleep between retries; ends at once on Ctrl-C (``cancel``)."""
        self._sleep(seconds)

    @property
    def cancelled(self) -> bool:
        """Ctrl-C (``cancel``) was called: nothing more may be tried on this host."""
        return self._cancelled.is_set()

    @property
    def connected(self) -> bool:
        transport = self.conn.client.get_transport() if self.conn is not None else None
        return transport is not None and transport.is_active()

    def reconnect(self) -> "Session":
        """A fresh connection after this one died (same target, host-key policy and retries)."""
        self.close()
        return self.open()

    def cancel(self) -> None:
        """From another thread (Ctrl-C): stop waiting on this host now. A step already sent
        ends as UnknownOutcome; the connection is closed."""
        self._cancelled.set()
        self.close()

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
        res = self._exec(command, stdin, timeout, on_line, started)
        return res.rc, res.out, res.err

    def _exec(self, command: str, stdin: bytes, timeout: float, on_line, started, *, ready: str | None = None,
              wait_ready: bool = False, sudo_prompt: str | None = None,
              sudo_password: bytes | None = None) -> ExecResult:
        alias = self.target.alias
        if self._cancelled.is_set():
            raise Interrupted(f"{alias}: interrupted before the remote step started; nothing was run there")
        transport = self.conn.client.get_transport() if self.conn else None
        if transport is None or not transport.is_active():
            raise ConnectError(f"{alias}: connection is closed")
        _count("commands")
        deadline = time.monotonic() + timeout
        # sudo answers at once or asks for the password; something else (an OTP prompt...) must not
        # keep the host waiting for the whole step deadline
        ready_deadline = time.monotonic() + min(timeout, SUDO_HANDSHAKE_SECONDS)
        chan = transport.open_session(timeout=min(timeout, 30))
        marker = (ready + "\n").encode() if ready else b""
        ready_seen = not ready
        view = None if (wait_ready and ready) else memoryview(stdin)
        write_closed = False
        out, err = bytearray(), bytearray()
        fed = 0           # bytes of `out` handed to on_line
        scan = 0          # bytes of `err` already searched for a sudo prompt
        passwords = 0
        try:
            chan.settimeout(0.0)
            chan.exec_command(command)
            while True:
                if self._cancelled.is_set():
                    if write_closed:
                        raise UnknownOutcome(f"{alias}: interrupted while the remote step ran; its outcome is "
                                             "unknown until `provision status` looks")
                    raise Interrupted(f"{alias}: interrupted before the remote step started; nothing was run there")
                got = False
                while chan.recv_ready():
                    chunk = chan.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                    got = True
                while chan.recv_stderr_ready():
                    chunk = chan.recv_stderr(65536)
                    if not chunk:
                        break
                    err += chunk
                    got = True
                if not ready_seen:
                    i = out.find(marker)
                    if i >= 0:
                        del out[: i + len(marker)]
                        ready_seen = True
                        if view is None:
                            view = memoryview(stdin)
                    elif sudo_password is not None and len(err) > scan:
                        tail = bytes(err[scan:])
                        if (sudo_prompt and sudo_prompt.encode() in tail) or _PROMPT_FALLBACK.search(tail):
                            scan = len(err)
                            if passwords:
                                raise SudoRefused(f"{alias}: sudo rejected the password from --sudo-password-file "
                                                  f"for {self.target.user}; nothing was run")
                            passwords += 1
                            self._send_all(chan, sudo_password + b"\n", deadline)
                if ready_seen and on_line is not None:
                    while True:
                        j = out.find(b"\n", fed)
                        if j < 0:
                            break
                        on_line(out[fed:j].decode("utf-8", "replace"))
                        fed = j + 1
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    if chan.exit_status != -1 or transport.is_active():
                        break
                    # no exit status because the connection itself died: handled just below
                if not transport.is_active():
                    if write_closed:
                        raise UnknownOutcome(f"{alias}: the connection dropped while the remote step ran; its "
                                             "outcome is unknown until `provision status` looks")
                    raise ConnectError(f"{alias}: the connection dropped before the remote step started")
                if view is not None and not write_closed:
                    if view and chan.send_ready():
                        n = chan.send(view[:32768])
                        view = view[n:]
                        got = got or n > 0
                    if not view:
                        chan.shutdown_write()
                        write_closed = True
                        if started is not None:
                            started.append(True)
                if wait_ready and not ready_seen and time.monotonic() > ready_deadline:
                    last = (err.decode("utf-8", "replace").strip().splitlines() or ["nothing on stderr"])[-1][:200]
                    raise SudoRefused(f"{alias}: sudo did not start the engine within "
                                      f"{min(timeout, SUDO_HANDSHAKE_SECONDS):g} s and nothing was run; is it asking "
                                      f"for more than a password? (last words: {last})")
                if time.monotonic() > deadline:
                    if write_closed:
                        raise UnknownOutcome(f"{alias}: no answer within {timeout:g} s; the remote step may still "
                                             "be running: its outcome is unknown until `provision status` looks")
                    if not ready_seen and ready:
                        what = "sudo or the remote python"
                        raise ConnectError(f"{alias}: {what} did not start within {timeout:g} s; nothing was run")
                    raise ConnectError(f"{alias}: timed out sending the request after {timeout:g} s")
                if not got:
                    select.select([chan], [], [], 0.05)
            if on_line is not None and ready_seen and fed < len(out):
                on_line(out[fed:].decode("utf-8", "replace"))
            return ExecResult(chan.recv_exit_status(), out.decode("utf-8", "replace"),
                              err.decode("utf-8", "replace"), ready_seen, passwords > 0)
        finally:
            try:
                chan.close()
            except Exception:  # noqa: BLE001
                pass

    @staticmethod
    def _send_all(chan, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            if time.monotonic() > deadline:
                raise ConnectError("timed out sending the sudo password to the host")
            if chan.send_ready():
                view = view[chan.send(view):]
            else:
                select.select([], [], [], 0.01)

    def call(self, request: dict, *, timeout: float = 300.0, python: str = "python3", sudo: bool = False,
             on_event: Callable[[dict], None] | None = None, entry: str = "provision.host.agent",
             exclude: frozenset = frozenset()) -> dict:
        """Run a remote entry module (the agent by default) with one request; return its JSON answer.

        ``exclude``: host modules this call never needs (``ops.server``), left out of the bundle."""
        from provision.control.transport.bundle import bootstrap_command, payload

        ready = READY_PREFIX + secrets.token_hex(8)
        password = self.sudo_password if sudo else None
        prompt = f"[provision-sudo-{secrets.token_hex(8)}] " if password is not None else None
        cmd = bootstrap_command(python, sudo=sudo, sudo_prompt=prompt, ready=ready, entry=entry)
        result: list[dict] = []

        def on_line(line: str) -> None:
            if line.startswith(RESULT_PREFIX):
                result.append(json.loads(line[len(RESULT_PREFIX):]))
            elif line.startswith(EVENT_PREFIX) and on_event is not None:
                on_event(json.loads(line[len(EVENT_PREFIX):]))

        started: list = []
        try:
            res = self._exec(cmd, payload(request, exclude), timeout, on_line, started, ready=ready,
                             wait_ready=password is not None, sudo_prompt=prompt, sudo_password=password)
        except (UnknownOutcome, SudoRefused, Interrupted):
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
        rc, out, err = res.rc, res.out, res.err
        if not res.ready and not (rc == -1 and started):
            raise self._not_started(rc, err, python, sudo, res.password_sent)
        tail = (err.strip() or out.strip())[-600:]
        if rc in (-9, 137, -1) and started:
            raise UnknownOutcome(f"{self.target.alias}: the remote engine was killed (exit "
                                 f"{'by a signal' if rc == -1 else rc}) before it answered; the file is either as "
                                 "before or as intended: run `provision status` to see which")
        raise RemoteError(f"{self.target.alias}: the remote engine gave no answer (exit {rc}): "
                          + " | ".join(tail.splitlines()[-4:]))

    def _not_started(self, rc: int, err: str, python: str, sudo: bool, password_sent: bool) -> RemoteError:
        """The remote interpreter never ran: say why in one sentence (sudo, or no python)."""
        alias, user = self.target.alias, self.target.user
        lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
        sudo_lines = [ln for ln in lines if ln.startswith("sudo:") and not any(n in ln.lower() for n in _SUDO_NOISE)]
        low = err.lower()
        first = (sudo_lines or lines or [f"exit {rc}"])[0][:200]
        if sudo:
            if "must have a tty" in low or "requiretty" in low:
                return SudoRefused(
                    f"{alias}: sudo for {user} requires a terminal (sudoers has `Defaults requiretty`) and provision "
                    f"runs without one; allow it with the sudoers line `Defaults:{user} !requiretty` (visudo), "
                    f"or connect as root ({first})")
            if "incorrect password" in low or "sorry, try again" in low:
                return SudoRefused(f"{alias}: sudo rejected the password from --sudo-password-file for {user}; "
                                   "nothing was run")
            if "a password is required" in low or "a terminal is required" in low or "no askpass" in low:
                return SudoRefused(
                    f"{alias}: sudo needs a password for {user} and provision never waits at a prompt; give {user} "
                    f"passwordless sudo (sudoers: `{user} ALL=(root) NOPASSWD: ALL`) or pass --sudo-password-file "
                    f"FILE ({first})")
            if "not in the sudoers" in low or "not allowed to" in low or "may not run sudo" in low:
                return SudoRefused(f"{alias}: {user} may not run {python} as root through sudo ({first}); "
                                   f"grant it in sudoers or connect as root")
            if "command not found" in low:
                return RemoteError(f"{alias}: {python} not found on the host through sudo's PATH "
                                   f"(secure_path) ({first})")
            if sudo_lines or rc == 1:
                return SudoRefused(f"{alias}: sudo did not run the engine as root: {first}")
        if rc == 127 or "not found" in low or "no such file" in low:
            return RemoteError(f"{alias}: {python} not found on the host (SGLang needs Python 3.10+)")
        return RemoteError(f"{alias}: the remote python did not start (exit {rc}): {first}")
