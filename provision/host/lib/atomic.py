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


_ATTEMPTS = 3


def _tmp(path: str) -> str:
    """A hidden same-directory temp name nobody can guess (128 random bits), ending in .tmp (never
    .py, never .prom: readers of those folders skip it). Guessable names let anyone who can write the
    directory (a textfile collector's, often the exporter's own account) plant a link there first."""
    d, base = os.path.split(path)
    return os.path.join(d, f".{base}.{os.urandom(16).hex()}.tmp")


def _create(path: str, mode: int) -> tuple[str, int]:
    """A new temp file of ours: O_EXCL|O_NOFOLLOW, so it is never an existing file or a link."""
    for _ in range(16):
        tmp = _tmp(path)
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp name beside {path}")


def write_bytes(path: str, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically replace `path` with `data`, created with `mode` (default private: 0600).
    `durable=False` skips the fsyncs, for caches that can be rebuilt.

    Safe in a directory others can write: the temp file is created new (O_EXCL|O_NOFOLLOW, an
    unguessable name), written and chmod-ed through its descriptor only, and renamed over `path`,
    which replaces a link there instead of following it. If another process swaps the temp name
    before the rename, what landed at `path` is not our file (its inode differs from the descriptor
    we wrote): it is written again under a new name, and after 3 swaps it is an error. No byte is
    ever written, and no mode set, through a path another account could have pointed elsewhere."""
    for _ in range(_ATTEMPTS):
        if _write_once(path, data, mode, durable):
            if durable:
                fsync_dir(os.path.dirname(path) or ".")
            return
    raise OSError(f"{path}: replaced by another process {_ATTEMPTS} times while provision wrote it; "
                  f"check who else can write {os.path.dirname(os.path.abspath(path))}")


def _write_once(path: str, data: bytes, mode: int, durable: bool) -> bool:
    """One attempt: True when `path` is now the file we wrote."""
    from provision.host.lib import failpoints

    tmp, fd = _create(path, mode)
    renamed = False
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
        failpoints.hit("atomic_before_rename", tmp)
        try:
            os.replace(tmp, path)
        except FileNotFoundError:  # another process took the temp name away: nothing of ours to remove
            renamed = True
            return False
        renamed = True
        mine = os.fstat(fd)
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            return False
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)
    finally:
        os.close(fd)
        if not renamed:
            try:
                os.unlink(tmp)
            except OSError:
                pass


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

