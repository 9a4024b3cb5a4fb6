"""The host-side lock of one server port: flock on ``server-PORT.lock`` in the state dir.  STDLIB ONLY.

Held by `start` from its preflight through the start to the record written, and by `stop`, so two
launches at once (an operator and the timer) cannot both start a server on the port: the second
waits a bounded time for the first, then is refused with a sentence naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from provision.host.lib import procfs

WAIT = 60.0  # seconds a second start/stop waits for the holder


class Busy(Exception):
    """The port's lock is held by another provision run on this host."""


def _holder(path: str) -> str:
    try:
        with open(path) as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        return "another provision run"
    pid = info.get("pid")
    argv = " ".join(procfs.cmdline(pid))[:160] if pid else ""
    since = time.strftime("%H:%M:%S", time.localtime(float(info.get("at") or 0)))
    return (f"pid {pid} ({argv or 'its command line is unreadable'}), doing `{info.get('doing')}` since {since}"
            if pid else "another provision run")


@contextlib.contextmanager
def port_lock(root: str, port: int, doing: str, wait: float = WAIT):
    """Hold the port's lock for the block; raises Busy (naming the holder) after `wait` seconds."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    path = os.path.join(root, f"server-{port}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        end = time.monotonic() + max(0.0, wait)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise Busy(f"port {port}'s server lock ({path}) is held by {_holder(path)}; waited {wait:g} s: "
                               "try again when it is done") from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "doing": doing, "at": time.time()}).encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the flock
