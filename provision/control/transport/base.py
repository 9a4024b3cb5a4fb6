"""One way to reach a host: run the host-side step with its bundle and request on stdin, stream its output.

Three implementations share this interface (pyinfra's connectors are the model:
``BaseConnector``, ``local``, and ``chain``/``dockerssh``, whose inner connector wraps
the command in ``docker exec`` and hands it to the outer one):

- ``ssh.Session``: an SSH session (Fabric to connect, the paramiko channel to run);
- ``local.LocalTransport``: a subprocess on this machine, no connection at all;
- ``container.ContainerTransport``: ``RUNTIME exec -i NAME`` through an outer transport
  (a container on an SSH host, or on this machine).

What is the same for all three lives here, once: building the step's command (bootstrap
as the argument, bundle + request on stdin, a one-off ready line before the request is
read, sudo around the whole), the streaming loop (deadlines, the ready line, a sudo
password sent only when sudo's prompt token shows, output lines handed on as they
arrive), reading the answer, and turning "it never started" into one sentence. An
implementation only opens a channel: something with paramiko's channel methods.

Tasks and the host-side agent never know which one carried them: the tasks get a
Transport from the runner (``Fleet.session``) and call ``call``; the agent reads the same
bytes on stdin whichever way they came.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from provision.control.transport import answer
from provision.control.transport.bundle import AGENT, bootstrap_command, bundle_digest, payloads
from provision.errors import ConnectError, HostError, RemoteError, UnknownOutcome
from provision.host.bootstrap import EVENT_PREFIX, RESULT_PREFIX

READY_PREFIX = "PROVISION-READY "
SUDO_HANDSHAKE_SECONDS = 60.0
_PROMPT_FALLBACK = re.compile(rb"(?i)password[^\n]{0,80}:\s*$")
_SUDO_NOISE = ("unable to resolve host", "unable to send audit message", "lecture", "we trust you have")


@dataclass
class ExecResult:
    rc: int
    out: str
    err: str
    ready: bool          # the host-side interpreter started (its ready line arrived)
    password_sent: bool  # a sudo password went over stdin
    said: str = ""       # the word after the ready token (the caching bootstrap's `hit` or `miss`)


class Interrupted(HostError):
    """Ctrl-C before this host's step was sent: nothing was run there."""

    kind = "interrupted"


class SudoRefused(RemoteError):
    """sudo would not run the engine (needs a password, wrong password, requiretty, not allowed)."""

    kind = "sudo"


def sudo_wrap(cmd: str, *, sudo_prompt: str | None = None) -> str:
    """``cmd`` run as root: ``sudo -n`` (never prompts), or with ``sudo_prompt``, ``sudo -S -p
    <token>``: sudo prints that token on stderr when it wants the password, which the
    caller then writes to stdin (never into the command line). ``cmd`` must be one simple
    command (``python3 -S -c ...`` or ``sh -c ...``)."""
    import shlex

    if sudo_prompt is not None:
        if "%" in sudo_prompt or "\n" in sudo_prompt:
            raise ValueError("sudo prompt token must not contain % or a newline")
        return f"sudo -S -p {shlex.quote(sudo_prompt)} -- " + cmd
    return "sudo -n -- " + cmd


class Transport:
    """How one host (this machine, an SSH host, a container on either) is reached.

    ``label``: how results and the journal name where the step ran. ``user``: who the
    step runs as before any sudo. ``default_sudo``: whether steps go through sudo when
    neither the command line nor the inventory says (an SSH user other than root: yes;
    this machine: no, a step runs as whoever runs provision).
    """

    kind = "?"
    label = "?"
    user = "?"
    where = "host"  # how the not-started sentences name the far side ("host", "container", "machine")
    isolated = False  # run the agent with `python -I` (a container: the image's PYTHONPATH/WORKDIR are not ours)
    default_sudo = False
    sudo_password: bytes | None = None
    # the host-side state directory for every step (None: the host's default, /var/lib/provision as root)
    state_dir: str | None = None
    # what the channel's own failures look like (besides OSError/EOFError), e.g. paramiko.SSHException
    channel_errors: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self.last_said = ""  # the last call's bundle answer on the host: "hit" or "miss"

    # -- lifecycle (an implementation overrides what it needs) -------------
    def open(self) -> "Transport":
        return self

    def close(self) -> None:
        pass

    def reconnect(self) -> "Transport":
        """A fresh connection after this one died (same settings)."""
        self.close()
        return self.open()

    @property
    def connected(self) -> bool:
        return True

    def cancel(self) -> None:
        """From another thread (Ctrl-C): stop waiting on this host now. A step already sent
        ends as UnknownOutcome."""
        self._cancelled.set()
        self.close()

    @property
    def cancelled(self) -> bool:
        """Ctrl-C (``cancel``) was called: nothing more may be tried on this host."""
        return self._cancelled.is_set()

    def _sleep(self, seconds: float) -> None:
        self._cancelled.wait(seconds)

    def pause(self, seconds: float) -> None:
        """Sleep between retries; ends at once on Ctrl-C (``cancel``)."""
        self._sleep(seconds)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    # -- what an implementation provides ----------------------------------
    def wrap_command(self, command: str) -> str:
        """The command as this transport's far side must run it (a container: inside
        ``RUNTIME exec``). The identity for hosts reached directly."""
        return command

    def _channel(self, command: str, timeout: float) -> Any:
        """Start ``command`` and return its channel: an object with paramiko Channel's
        recv_ready/recv/recv_stderr_ready/recv_stderr/send_ready/send/shutdown_write/
        exit_status_ready/exit_status/recv_exit_status/close."""
        raise NotImplementedError

    def _wait(self, chan: Any, seconds: float) -> None:
        """Block until the channel may have something to read, at most ``seconds``."""
        time.sleep(seconds)

    def _alive(self) -> bool:
        """Is the connection that carries the channel still up?"""
        return True

    def _not_started_reason(self, rc: int, err: str, python: str) -> RemoteError | None:
        """An implementation's own reason the step never started (a container runtime
        missing, no such container), before the generic sudo/python reasons."""
        return None

    # -- running -----------------------------------------------------------
    def exec(self, command: str, stdin: bytes = b"", timeout: float = 120.0,
             on_line: Callable[[str], None] | None = None, started: list | None = None) -> tuple[int, str, str]:
        """Run one command with a hard deadline. Returns (exit status, stdout, stderr).

        ``started`` (a list) gets True appended once the request is fully sent:
        after that point a dead channel means the outcome is unknown.
        """
        res = self._exec(self.wrap_command(command), stdin, timeout, on_line, started)
        return res.rc, res.out, res.err

    def _exec(self, command: str, stdin: bytes, timeout: float, on_line, started, *, ready: str | None = None,
              wait_ready: bool = False, sudo_prompt: str | None = None,
              sudo_password: bytes | None = None,
              then: Callable[[str], bytes] | None = None) -> ExecResult:
        """Run ``command``; feed it ``stdin`` (at once, or after the ``ready`` line with
        ``wait_ready``). ``then``: the ready line ends with a word (``hit``/``miss``), and
        ``then(word)`` follows ``stdin`` once that line arrived (the bundle on a miss, nothing on a
        hit); the request (``stdin``) counts as sent, and the step as started, as soon as it is
        written, whatever follows."""
        alias = self.label
        if self._cancelled.is_set():
            raise Interrupted(f"{alias}: interrupted before the remote step started; nothing was run there")
        if not self._alive():
            raise ConnectError(f"{alias}: connection is closed")
        deadline = time.monotonic() + timeout
        # sudo answers at once or asks for the password; something else (an OTP prompt...) must not
        # keep the host waiting for the whole step deadline
        ready_deadline = time.monotonic() + min(timeout, SUDO_HANDSHAKE_SECONDS)
        chan = self._channel(command, timeout)
        marker = ready.encode() if ready else b""
        ready_seen = not ready
        said = ""
        view = None if (wait_ready and ready) else memoryview(stdin)
        after: bytes | None = None  # then(word), once the ready line told the word
        write_closed = False
        sent = False      # the request is written: from here a lost channel means the outcome is unknown
        out, err = bytearray(), bytearray()
        fed = 0           # bytes of `out` handed to on_line
        scan = 0          # bytes of `err` already searched for a sudo prompt
        passwords = 0
        try:
            while True:
                if self._cancelled.is_set():
                    if sent:
                        raise UnknownOutcome(f"{alias}: interrupted while the remote step ran; its outcome is "
                                             "unknown until `provision status` looks")
                    raise Interrupted(f"{alias}: interrupted before the remote step started; nothing was run there")
                got = _read_available(chan, out, err)
                if not ready_seen:
                    i = out.find(marker)
                    j = out.find(b"\n", i + len(marker)) if i >= 0 else -1
                    if j >= 0:
                        said = out[i + len(marker):j].decode("utf-8", "replace").strip()
                        del out[: j + 1]
                        ready_seen = True
                        if view is None:
                            view = memoryview(stdin)
                        if then is not None:
                            after = then(said)
                    elif sudo_password is not None and len(err) > scan:
                        tail = bytes(err[scan:])
                        if (sudo_prompt and sudo_prompt.encode() in tail) or _PROMPT_FALLBACK.search(tail):
                            scan = len(err)
                            if passwords:
                                raise SudoRefused(f"{alias}: sudo rejected the password from --sudo-password-file "
                                                  f"for {self.user}; nothing was run")
                            passwords += 1
                            self._send_all(chan, sudo_password + b"\n", deadline)
                if ready_seen and on_line is not None:
                    while True:
                        j = out.find(b"\n", fed)
                        if j < 0:
                            break
                        on_line(out[fed:j].decode("utf-8", "replace"))
                        fed = j + 1
                fed, scan = _bound(out, err, fed, scan, alias, ready_seen)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    if chan.exit_status != -1 or self._alive():
                        break
                    # no exit status because the connection itself died: handled just below
                if not self._alive():
                    if sent:
                        raise UnknownOutcome(f"{alias}: the connection dropped while the remote step ran; its "
                                             "outcome is unknown until `provision status` looks")
                    raise ConnectError(f"{alias}: the connection dropped before the remote step started")
                if view is not None and not write_closed:
                    if view and chan.send_ready():
                        n = chan.send(view[:32768])
                        view = view[n:]
                        got = got or n > 0
                    if not view and not sent:
                        sent = True
                        if started is not None:
                            started.append(True)
                    if not view and then is not None and after is not None:
                        view, after = memoryview(after), None
                    if not view and (then is None or (ready_seen and after is None)):
                        chan.shutdown_write()
                        write_closed = True
                if wait_ready and not ready_seen and time.monotonic() > ready_deadline:
                    last = (err.decode("utf-8", "replace").strip().splitlines() or ["nothing on stderr"])[-1][:200]
                    raise SudoRefused(f"{alias}: sudo did not start the engine within "
                                      f"{min(timeout, SUDO_HANDSHAKE_SECONDS):g} s and nothing was run; is it asking "
                                      f"for more than a password? (last words: {last})")
                if time.monotonic() > deadline:
                    raise _past_deadline(alias, timeout, sent, bool(ready) and not ready_seen)
                if not got:
                    self._wait(chan, 0.05)
            if on_line is not None and ready_seen and fed < len(out):
                on_line(out[fed:].decode("utf-8", "replace"))
            return ExecResult(chan.recv_exit_status(), out.decode("utf-8", "replace"),
                              err.decode("utf-8", "replace"), ready_seen, passwords > 0, said)
        finally:
            try:
                chan.close()
            except Exception:  # noqa: BLE001
                pass

    def _send_all(self, chan, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            if time.monotonic() > deadline:
                raise ConnectError("timed out sending the sudo password to the host")
            if chan.send_ready():
                view = view[chan.send(view):]
            else:
                time.sleep(0.01)

    def call_read(self, request: dict, **kw: Any) -> dict:
        """`call` for a step that changes nothing on the host (status): when the connection drops
        under it, the outcome is not in doubt, so it is asked once more on a fresh connection
        instead of reported unknown. Ctrl-C still ends it."""
        try:
            return self.call(request, **kw)
        except UnknownOutcome:
            if self.cancelled:
                raise
        self.reconnect()
        return self.call(request, **kw)

    def call(self, request: dict, *, timeout: float = 300.0, python: str = "python3", sudo: bool = False,
             on_event: Callable[[dict], None] | None = None, entry: str = AGENT,
             exclude: frozenset = frozenset()) -> dict:
        """Run a host entry module (the agent by default) with one request; return its JSON answer.

        ``exclude``: host modules this call never needs (``ops.server``), left out of the bundle.
        The host keeps each bundle it was sent (<state dir>/bundles/SHA256, see
        host/bootstrap.py): its ready line says `hit` and only the request is sent, or `miss`
        and the bundle goes first, on the same stdin."""
        ready = READY_PREFIX + secrets.token_hex(8)
        password = self.sudo_password if sudo else None
        prompt = f"[provision-sudo-{secrets.token_hex(8)}] " if password is not None else None
        if self.state_dir and not request.get("state_dir"):
            request = dict(request, state_dir=self.state_dir)
        cmd = self.wrap_command(bootstrap_command(python, ready=ready, entry=entry, digest=bundle_digest(exclude),
                                                  state_dir=request.get("state_dir"), isolated=self.isolated))
        if sudo:
            cmd = sudo_wrap(cmd, sudo_prompt=prompt)
        result: list[dict] = []

        bad: list[RemoteError] = []

        def on_line(line: str) -> None:
            if line.startswith(RESULT_PREFIX):
                try:
                    result.append(answer.parse(line[len(RESULT_PREFIX):], self.label,
                                               op=request.get("op") if entry == AGENT else None))
                except RemoteError as exc:
                    bad.append(exc)
            elif line.startswith(EVENT_PREFIX) and on_event is not None:
                try:
                    on_event(answer.parse(line[len(EVENT_PREFIX):], self.label, "progress event"))
                except RemoteError:
                    pass  # a broken progress event is left out; the answer still decides

        started: list = []
        try:
            first, rest = payloads(request, exclude)
            res = self._exec(cmd, first, timeout, on_line, started, ready=ready,
                             wait_ready=password is not None, sudo_prompt=prompt, sudo_password=password,
                             then=rest)
            self.last_said = res.said
        except (UnknownOutcome, SudoRefused, Interrupted):
            raise
        except ConnectError as exc:
            if started:
                raise UnknownOutcome(str(exc)) from None
            raise
        except (OSError, EOFError) + self.channel_errors as exc:
            if started:
                raise UnknownOutcome(f"{self.label}: connection lost during the remote step "
                                     f"({_short(exc)}); outcome unknown until `provision status` looks") from None
            raise ConnectError(f"{self.label}: {_short(exc)}") from None
        if result:
            return result[-1]
        if bad:
            raise bad[-1]
        rc, out, err = res.rc, res.out, res.err
        if not res.ready and not (rc == -1 and started):
            raise self._not_started(rc, err, python, sudo, res.password_sent)
        tail = (err.strip() or out.strip())[-600:]
        if rc in (-9, 137, -1) and started:
            raise UnknownOutcome(f"{self.label}: the remote engine was killed (exit "
                                 f"{'by a signal' if rc == -1 else rc}) before it answered; the file is either as "
                                 "before or as intended: run `provision status` to see which")
        raise RemoteError(f"{self.label}: the remote engine gave no answer (exit {rc}): "
                          + " | ".join(tail.splitlines()[-4:]))

    def _not_started(self, rc: int, err: str, python: str, sudo: bool, password_sent: bool) -> RemoteError:
        """The host-side interpreter never ran: say why in one sentence (the transport's own
        reason, sudo, or no python)."""
        own = self._not_started_reason(rc, err, python)
        if own is not None:
            return own
        alias, user = self.label, self.user
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
            return RemoteError(f"{alias}: {python} not found on the {self.where} (SGLang needs Python 3.10+)")
        return RemoteError(f"{alias}: the remote python did not start (exit {rc}): {first}")


# What the control side keeps of a host's output besides its answer: the last KEEP_TAIL bytes of
# stdout lines already read and of stderr (the tail an error quotes); a flood is read and dropped.
KEEP_TAIL = 64 << 10
FLOOD = 1 << 20


def _bound(out: bytearray, err: bytearray, fed: int, scan: int, alias: str, ready_seen: bool) -> tuple[int, int]:
    """Keep a host's output bounded while it is read: what was handed on (or, before the ready line,
    all but the tail the marker may be in) and stderr cut to their tails once past FLOOD bytes; a
    line longer than an answer may be is refused. The new (fed, scan) offsets."""
    from provision.control.transport.answer import MAX_ANSWER_BYTES

    done = fed if ready_seen else len(out)
    if done > FLOOD:
        cut = done - KEEP_TAIL
        del out[:cut]
        fed = max(0, fed - cut)
    if len(err) > FLOOD:
        cut = len(err) - KEEP_TAIL
        del err[:cut]
        scan = max(0, scan - cut)
    if len(out) - fed > MAX_ANSWER_BYTES + KEEP_TAIL:
        raise RemoteError(f"{alias}: the host sent more than {MAX_ANSWER_BYTES >> 20} MiB on one line: not used")
    return fed, scan


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _read_available(chan, out: bytearray, err: bytearray) -> bool:
    """Append what the channel has ready on stdout and stderr; whether anything came."""
    got = False
    for ready, recv, buf in ((chan.recv_ready, chan.recv, out), (chan.recv_stderr_ready, chan.recv_stderr, err)):
        while ready():
            chunk = recv(65536)
            if not chunk:
                break
            buf += chunk
            got = True
    return got


def _past_deadline(alias: str, timeout: float, sent: bool, not_started: bool) -> Exception:
    """What a remote step past its deadline is: unknown once the request was sent, else not run."""
    if sent:
        return UnknownOutcome(f"{alias}: no answer within {timeout:g} s; the remote step may still be running: "
                              "its outcome is unknown until `provision status` looks")
    if not_started:
        return ConnectError(f"{alias}: sudo or the remote python did not start within {timeout:g} s; nothing was run")
    return ConnectError(f"{alias}: timed out sending the request after {timeout:g} s")
