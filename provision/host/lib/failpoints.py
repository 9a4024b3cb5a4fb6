"""Failpoints: the ONE way to make the host side fail on purpose (fault tests).  STDLIB ONLY (a leaf).

As etcd's gofail and TiKV's fail-rs: named points in the product code, inert unless
switched on. They are switched on by one environment variable on the CONTROL machine,

    PROVISION_FAILPOINTS=after_replace            # SIGKILL the engine right after the rename
    PROVISION_FAILPOINTS=before_read=kill,...     # the same, spelt out; comma-separated

which the control side forwards in every request as ``"failpoints"``
(provision/control/transport/bundle.py); the agent calls ``configure`` with it before
dispatching, and an engine re-run under the install's own interpreter inherits it.
Nothing on the host reads the environment for this.

Points (where the patch / unpatch / restore transaction passes, in order):

    before_read        after the lock, before the file is read
    after_temp_write   the new bytes are in the temp file, not yet renamed
    before_replace     just before the rename (a test hook: someone edits the file now)
    after_replace      the new bytes are in place, not yet verified
    before_verify      just before the re-read and compile check

and in the one atomic writer (host/lib/atomic.py), for every file it writes:

    atomic_before_rename  the temp file is written, not yet renamed (a test hook: another
                          account swaps the temp name for a link now)

and in `upgrade`'s install (host/ops/upgrade.py):

    upgrade_before_marker  pip installed the new release, the venv's marker not yet written (the
                           connection lost mid-install: the next run makes the venv again)

Actions: ``kill`` (SIGKILL this process: the crash the transaction must survive).
In-process tests may also run a function at a point: ``with enabled("before_replace", fn):``.
"""

from __future__ import annotations

import contextlib
import os

TYPE_CHECKING = False  # not typing's: a host never imports typing (see provision/host/__init__.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

POINTS = ("before_read", "after_temp_write", "before_replace", "after_replace", "before_verify",
          "atomic_before_rename", "upgrade_before_marker")
ACTIONS = ("kill",)

_active: dict[str, Callable[..., None]] = {}


def _kill(*_args: Any) -> None:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def parse(text: str | None) -> dict[str, str]:
    """``"a=kill,b"`` -> {"a": "kill", "b": "kill"}; ValueError on an unknown point or action."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, action = part.partition("=")
        name, action = name.strip(), (action.strip() or "kill")
        if name not in POINTS:
            raise ValueError(f"unknown failpoint {name!r}: one of {', '.join(POINTS)}")
        if action not in ACTIONS:
            raise ValueError(f"unknown failpoint action {action!r} for {name}: one of {', '.join(ACTIONS)}")
        out[name] = action
    return out


def configure(text: str | None) -> None:
    """Switch on exactly the failpoints ``text`` names (None or "": none)."""
    wanted = parse(text)
    _active.clear()
    for name in wanted:
        _active[name] = _kill


@contextlib.contextmanager
def enabled(name: str, fn: Callable[..., None] | None = None) -> Iterator[None]:
    """In-process: run ``fn`` (default: kill) at ``name`` inside the with-block."""
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}: one of {', '.join(POINTS)}")
    before = _active.get(name)
    _active[name] = fn or _kill
    try:
        yield
    finally:
        if before is None:
            _active.pop(name, None)
        else:
            _active[name] = before


def hit(name: str, *args: Any) -> None:
    """A failpoint: does nothing unless ``name`` is switched on."""
    fn = _active.get(name)
    if fn is not None:
        fn(*args)
