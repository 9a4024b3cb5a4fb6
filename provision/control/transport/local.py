"""This machine as the host: the host-side step as a subprocess, no connection at all.

The local implementation of base.Transport (pyinfra's ``@local`` connector). The step's
command is the one an SSH host runs (``python3 -S -c BOOTSTRAP``, bundle and request on
stdin), started with ``/bin/sh -c`` the way sshd starts it, so the agent cannot tell the
difference. Its environment is a login's, not this process's: PATH, HOME, the user and
locale, and XDG_STATE_HOME (where a non-root user's host state lives); nothing else of
provision's environment reaches it.

Used by ``--local`` (a Dockerfile's ``RUN provision patch --local``, pull mode's
``provision reconcile --local`` from a timer on each host) and as the outer transport of a
container on this machine (``--local --container NAME``).
"""

from __future__ import annotations

import getpass
import os
import select
import socket
import subprocess

from provision.control.transport.base import Transport

# What a login shell would have; the rest of this process's environment stays here.
PASSED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "XDG_STATE_HOME", "TMPDIR")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def machine_name() -> str:
    """How results and the journal name this machine: its host name."""
    return socket.gethostname() or "localhost"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry, no env
        return str(os.geteuid())


class PipeChannel:
    """A subprocess behind the channel methods base.Transport's loop uses (paramiko's names)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._in = proc.stdin.fileno()
        self._out = proc.stdout.fileno()
        self._err = proc.stderr.fileno()
        for fd in (self._in, self._out, self._err):
            os.set_blocking(fd, False)
        self._eof = {self._out: False, self._err: False}
        self._in_open = True

    def _readable(self, fd: int) -> bool:
        return not self._eof[fd] and bool(select.select([fd], [], [], 0)[0])

    def _read(self, fd: int, n: int) -> bytes:
        try:
            data = os.read(fd, n)
        except BlockingIOError:
            return b""
        if not data:
            self._eof[fd] = True
        return data

    def recv_ready(self) -> bool:
        return self._readable(self._out)

    def recv(self, n: int) -> bytes:
        return self._read(self._out, n)

    def recv_stderr_ready(self) -> bool:
        return self._readable(self._err)

    def recv_stderr(self, n: int) -> bytes:
        return self._read(self._err, n)

    def send_ready(self) -> bool:
        return self._in_open and bool(select.select([], [self._in], [], 0)[1])

    def send(self, data) -> int:
        try:
            return os.write(self._in, data)
        except BlockingIOError:
            return 0
        except BrokenPipeError:
            # the step stopped reading (it died, or never started): what it said decides the outcome
            self.shutdown_write()
            return len(data)

    def shutdown_write(self) -> None:
        if self._in_open:
            self._in_open = False
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def exit_status_ready(self) -> bool:
        return self.proc.poll() is not None

    @property
    def exit_status(self) -> int:
        rc = self.proc.poll()
        return -1 if rc is None else rc

    def recv_exit_status(self) -> int:
        return self.proc.wait()

    def fds(self) -> list[int]:
        return [fd for fd, eof in self._eof.items() if not eof]

    def close(self) -> None:
        # As sshd does when the channel closes: the step is not killed (a patch mid-write
        # finishes, or its own transaction rolls back); only our ends of the pipes go.
        self.shutdown_write()
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f.close()  # type: ignore[union-attr]
            except OSError:
                pass


class LocalTransport(Transport):
    """This machine, reached without any connection."""

    kind = "local"
    where = "machine"

    def __init__(self, label: str | None = None, *, sudo_password: bytes | None = None,
                 state_dir: str | None = None):
        super().__init__()
        self.label = label or machine_name()
        self.user = _user()
        self.sudo_password = sudo_password
        self.state_dir = state_dir

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}
        env.setdefault("PATH", DEFAULT_PATH)
        return env

    def _channel(self, command: str, timeout: float) -> PipeChannel:
        # cwd /: `python -c` puts the cwd first on sys.path, and no stray json.py of wherever
        # provision was started may be imported by the step (paths reach it made absolute)
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self._env(), cwd="/", start_new_session=True)
        return PipeChannel(proc)

    def _wait(self, chan: PipeChannel, seconds: float) -> None:
        fds = chan.fds()
        if fds:
            select.select(fds, [], [], seconds)
            return
        try:
            chan.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        pass
