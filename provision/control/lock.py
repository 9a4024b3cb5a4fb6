"""The control-machine lock: one `provision reconcile` at a time on this machine.

An ``fcntl.flock`` on ``$PROVISION_LOCK`` or ``~/.local/state/provision/reconcile.lock``,
taken without waiting. The holder writes its pid into the file so the loser can
name it. The kernel drops the lock when the holder exits, however it exits, so
a crashed run never leaves a stale lock behind (the pid text may stay; it is
only informative).
"""

from __future__ import annotations

import fcntl
import os

from provision.errors import LockedError


def default_path() -> str:
    from provision.control.journal import state_path

    return state_path("PROVISION_LOCK", "reconcile.lock")


class ControlLock:
    """``with ControlLock(): ...`` or ``acquire()`` / ``release()``. Raises LockedError (exit 7)."""

    def __init__(self, path: str | None = None, what: str = "provision reconcile"):
        self.path = path or default_path()
        self.what = what
        self.fd: int | None = None

    def holder(self) -> int | None:
        try:
            with open(self.path, "rb") as fh:
                text = fh.read(32).decode("ascii", "replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def acquire(self) -> "ControlLock":
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = self.holder()
            who = f"pid {pid}" if pid else "another process"
            raise LockedError(f"another {self.what} is running ({who} holds {self.path}); "
                              "nothing was done") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "ControlLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
