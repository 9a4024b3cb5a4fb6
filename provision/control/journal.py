"""The change journal of the control machine: one JSON line per host and change.

``$PROVISION_JOURNAL`` or ``~/.local/state/provision/journal.jsonl``. Every run that
is not ``--check`` journals each host's row the moment it arrives (a :class:`Writer`
given to the runner as its ``on_result``), appended and fsync'd before the next row
is looked at: Ctrl-C or SIGTERM half-way through a fleet keeps the entries of the
hosts already changed. Only what changed a host is written (and failed attempts
to change one), so the journal answers "who changed what, when, from which sha
to which".

Never holds secrets: results carry none, and ``detail`` still goes through
``provision.logs.redact`` (when that module exists) before it is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import datetime
from typing import Iterable

from provision import __version__
from provision.config.bounded import load_json
from provision.errors import ConfigError

# Verdicts that mean the host changed.
CHANGE_VERDICTS = {"patched", "repaired", "unpatched", "restored", "started", "stopped", "restarted",
                   "staged", "removed",  # (an overlay: `patch|unpatch --overlay`, reconcile)
                   "upgraded", "rolled-back",  # upgrade (staged: its install beside)
                   "swapping", "rolling-back"}  # upgrade: a restart onto the new side, or back, begun
# (the outcome line ends it)
# Commands whose failed (or unknown-outcome) attempts are journaled too: they may have touched the host.
ATTEMPT_COMMANDS = {"patch", "unpatch", "restore", "reconcile", "restart", "launch", "stop", "upgrade"}
ATTEMPT_VERDICTS = {"failed", "unknown"}
# A server's lifecycle: a refusal is an attempt too (someone meant to start or stop a server there),
# and so is a Ctrl-C that left its outcome to be read.
SERVER_COMMANDS = {"launch", "stop"}
SERVER_ATTEMPT_VERDICTS = ATTEMPT_VERDICTS | {"refused", "interrupted", "timeout"}
# Commands whose every outcome is journaled: `history` shows a host's speed over time (bench).
MEASURE_COMMANDS = {"bench"}
# A server's steps behind its router (tasks/routing.py: out, drained, stopped, started, ready, warmed,
# back-in, left-out), carried by a launch's or a stop's row: every one is journaled.
ROUTER_COMMANDS = {"router"}


def state_path(env_var: str, name: str) -> str:
    """A control-machine state file: $env_var if set, else $XDG_STATE_HOME/provision/NAME
    (default ~/.local/state/provision/NAME)."""
    env = os.environ.get(env_var)
    if env:
        return env
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "provision", name)


def path() -> str:
    return state_path("PROVISION_JOURNAL", "journal.jsonl")


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry, no env
        return str(os.geteuid())


def actor() -> str:
    """Who is acting, as the journal names them: user@control-host."""
    return f"{_user()}@{socket.gethostname()}"


def _redact(text: str) -> str:
    try:
        from provision.logs.redact import redact
    except ImportError:
        return text
    return redact(text or "")


def _wanted(command: str, verdict: str, error_kind: str | None) -> bool:
    if command in MEASURE_COMMANDS or command in ROUTER_COMMANDS:
        return True
    if verdict in CHANGE_VERDICTS:
        return True
    wanted = SERVER_ATTEMPT_VERDICTS if command in SERVER_COMMANDS else ATTEMPT_VERDICTS
    if command in ATTEMPT_COMMANDS and verdict in wanted:
        # a refused connection or a bad request never reached the file
        return error_kind not in ("connect", "auth", "hostkey", "config", "usage")
    return False


def entries(command: str, results: Iterable, now: datetime | None = None) -> list[dict]:
    """The journal lines for one run (pure apart from user/host lookups)."""
    stamp = (now or datetime.now().astimezone()).isoformat(timespec="seconds")
    common = {"time": stamp, "user": _user(), "control_host": socket.gethostname(), "tool_version": __version__}
    out = []
    for r in results:
        data = getattr(r, "data", None) or {}
        items = [(command, r.verdict, r.detail, data.get("sha_before"), data.get("sha_after"), r.file,
                  r.error_kind, data.get("spec"))]
        # extra actions on the same host (reconcile: a restart after the re-patch; launch: --patch's edits)
        for extra in data.get("journal_extra") or []:
            items.append((extra.get("command", command), extra.get("verdict"), extra.get("detail", ""),
                          extra.get("sha_before"), extra.get("sha_after"), extra.get("file", r.file),
                          extra.get("error_kind"), extra.get("spec", data.get("spec"))))
        out += _lines(common, r, data, command, items)
    return out


def extra_entries(result, extra: dict, now: datetime | None = None) -> list[dict]:
    """The journal lines for one action added to a host's row after it was journaled (reconcile's
    restart of that host's server): the same shape as :func:`entries`' lines."""
    stamp = (now or datetime.now().astimezone()).isoformat(timespec="seconds")
    common = {"time": stamp, "user": _user(), "control_host": socket.gethostname(), "tool_version": __version__}
    data = getattr(result, "data", None) or {}
    item = (extra.get("command", "restart"), extra.get("verdict"), extra.get("detail", ""), extra.get("sha_before"),
            extra.get("sha_after"), extra.get("file", result.file), extra.get("error_kind"),
            extra.get("spec", data.get("spec")))
    return _lines(common, result, data, item[0], [item])


def _lines(common: dict, r, data: dict, command: str, items: list) -> list[dict]:
    out: list[dict] = []
    for cmd, verdict, detail, before, after, file, kind, spec in items:
        if not verdict or not _wanted(cmd, verdict, kind):
            continue
        if cmd == "reconcile" and verdict == "failed" and data.get("action") != "patch":
            continue  # it failed before deciding to change anything (no install, unreadable file)
        if cmd == command and cmd in SERVER_COMMANDS and verdict not in CHANGE_VERDICTS and any(
                x.get("command") == cmd for x in data.get("journal_extra") or []):
            continue  # the start's own line says it ("started pid ...; then failed"): one line per attempt
        rec = dict(common, command=cmd, spec=spec)
        if data.get("spec_hash") and spec == data.get("spec"):
            rec["spec_hash"] = data["spec_hash"]
        rec.update(host=r.host, file=file or data.get("real_file"), sha256_before=before, sha256_after=after,
                   verdict=verdict, detail=_redact(detail or ""))
        if cmd == command:  # a command's own figures (bench: decode tok/s, accept length, ...)
            rec.update(data.get("journal_fields") or {})
        out.append(rec)
    return out


def append(lines: list[dict], where: str | None = None) -> None:
    """Append lines atomically (one write, under flock) so concurrent runs never interleave."""
    if not lines:
        return
    p = where or path()
    os.makedirs(os.path.dirname(os.path.abspath(p)), mode=0o700, exist_ok=True)
    payload = "".join(json.dumps(line, sort_keys=False) + "\n" for line in lines).encode("utf-8")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(payload)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def record(command: str, results) -> None:
    """Journal every change (and failed attempt) in `results`. Raises OSError on a write failure."""
    append(entries(command, results))


class Writer:
    """Journals one run's rows as they arrive: ``writer(result)`` appends (fsync'd) that host's lines
    at once, so an interrupted run keeps what it already changed. A write failure does not stop the
    run: it is remembered once in ``warnings`` (the CLI prints it) and later rows still try."""

    def __init__(self, command: str, where: str | None = None):
        self.command = command
        self.where = where
        self.warnings: list[str] = []
        self.written = 0

    def _append(self, lines: list[dict]) -> None:
        try:
            append(lines, self.where)
            self.written += len(lines)
        except OSError as exc:
            msg = f"could not write the journal: {exc}"
            if msg not in self.warnings:
                self.warnings.append(msg)

    def __call__(self, result) -> None:
        self._append(entries(self.command, [result]))

    def extra(self, result, extra: dict) -> None:
        """An action added to an already journaled row (reconcile's restart)."""
        self._append(extra_entries(result, extra))


def read(host: str | None = None, limit: int | None = None, where: str | None = None) -> tuple[list[dict], list[int]]:
    """(records oldest first, line numbers that were not JSON). Filtered by host, the last `limit`."""
    p = where or path()
    recs, bad = [], []
    try:
        fh = open(p, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], []
    with fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = load_json(line, f"{p} line {n}")
            except (ValueError, ConfigError):  # not JSON, or nested past what is read: a bad line, said
                bad.append(n)
                continue
            if not isinstance(rec, dict):
                bad.append(n)
                continue
            if host and rec.get("host") != host:
                continue
            recs.append(rec)
    if limit is not None and limit >= 0:
        recs = recs[-limit:] if limit else []
    return recs, bad
