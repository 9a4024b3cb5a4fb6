"""One way to replace a small file on the host: write a same-directory temp file, fsync it,
rename it over the target, fsync the directory. A reader sees the old bytes or the new ones,
never half a file, and a power cut after the call returns keeps the new ones. And one way to read
back such a private file only while it is still the user's own (``read_own``).

Used for records, unit files, secret files, caches: everything the host side writes whole, and the
control side's caches and metrics files too (a stdlib leaf, like the redactor: one writer for both).
(The patch transaction in ops/fileops.py has more to do: a hash re-check, the owner and mode of
the file it replaces, a temp name that never ends in `.py`.)
"""

from __future__ import annotations

import json
import os
import threading


def _tmp(path: str) -> str:
    """A hidden same-directory temp name, one per process and thread (a fleet's threads may write
    one cache at once), ending in .tmp (never .py, never .prom: readers of those folders skip it)."""
    d, base = os.path.split(path)
    return os.path.join(d, f".{base}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_bytes(path: str, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically replace `path` with `data`, created with `mode` (default private: 0600).
    `durable=False` skips the fsyncs, for caches that can be rebuilt."""
    tmp = _tmp(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


def write_text(path: str, text: str, mode: int = 0o600, durable: bool = True) -> None:
    write_bytes(path, text.encode(), mode, durable)


def write_json(path: str, doc: object, mode: int = 0o600, durable: bool = True) -> None:
    write_bytes(path, json.dumps(doc).encode(), mode, durable)


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_own(path: str, limit: int = -1) -> bytes | None:
    """The bytes of a file this process's user wrote and nobody else can change: a regular file (not
    a symlink), owned by the effective user, not writable by group or others; else None. How the
    control side's caches are read back (what they hold steers where it connects and what runs)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            return None
        return fh.read(limit)

