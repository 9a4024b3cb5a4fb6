"""`provision reconcile`, control side: requests, answers -> HostResults, restart planning, output.

The per-host decision (unchanged / native / wiped / foreign-edit / blocked-git ...)
is made on the host by ``provision.host.ops.reconcile.classify`` (pure, stdlib),
in the same single remote call that re-patches. This module only turns answers
into verdicts, decides which servers to restart and when (``in_window``), runs
the rolling restart through ``provision.tasks.launch``, and prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import ReconcileAnswer

import functools
import os
import re
import sys
import time
from datetime import datetime, time as dtime

from provision.errors import (EXIT_CHANGES, EXIT_FAILED, EXIT_NOTHING, EXIT_OK, UsageError)
from provision.output.results import HostResult
from provision.tasks.bundles import call_light
from provision.tasks.specs import block_shas

_T0 = time.monotonic()  # PROVISION_NOW's clock starts here

# Hosts in these states need a human: they make the run exit 3 like a failure.
ATTENTION = {"foreign-edit", "blocked-git"}
VERDICT_OF_STATE = {"unchanged": "unchanged", "native": "native", "not-applicable": "not-applicable", "foreign-edit": "foreign-edit",
                    "blocked-git": "blocked-git", "held": "held", "missing-file": "failed", "error": "failed"}


# --------------------------------------------------------------------------- maintenance windows (pure)

_WIN_RE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def parse_window(text: str) -> tuple[int, int]:
    """``"02:00-05:00"`` -> (start, end) in minutes after midnight (local time). The end may
    be ``24:00``; a window whose end is before its start crosses midnight (``22:00-02:00``)."""
    m = _WIN_RE.match(text or "")
    if not m:
        raise UsageError(f"--window {text!r}: expected HH:MM-HH:MM, e.g. 02:00-05:00")
    h1, m1, h2, m2 = (int(x) for x in m.groups())
    if h1 > 23 or m1 > 59 or m2 > 59 or h2 > 24 or (h2 == 24 and m2 != 0):
        raise UsageError(f"--window {text!r}: not a time of day (00:00 to 24:00)")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end or (start == 0 and end == 0):
        raise UsageError(f"--window {text!r}: start and end are equal; "
                         "give a real window (00:00-24:00 for always)")
    return start, end


def in_window(now, window) -> bool:
    """Is `now` (a datetime or time, local) inside `window` (text or parse_window's tuple)?
    Start inclusive, end exclusive, to the second."""
    start, end = parse_window(window) if isinstance(window, str) else window
    t = now.time() if isinstance(now, datetime) else now
    if not isinstance(t, dtime):
        raise TypeError("now must be a datetime or a time")
    s = t.hour * 3600 + t.minute * 60 + t.second
    a, b = start * 60, end * 60
    if a < b:
        return a <= s < b
    return s >= a or s < b


def format_window(window) -> str:
    start, end = parse_window(window) if isinstance(window, str) else window
    return f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


@functools.lru_cache(maxsize=None)
def _spec(name: str | None):
    from provision.config.playbook import load_patch_spec

    return load_patch_spec(name)


def request(spec, host, *, check: bool, force: bool, install_path=None, python=None, full=False,
            include_held: bool = False) -> dict:
    """The reconcile request: the spec, its block sha and the host's pinned install, if any."""
    return {"op": "reconcile", "spec": spec.to_engine(), "check": check, "force": force,
            "include_held": include_held,
            "install_path": host.install_path(install_path), "python": python or host.get("python"),
            "full": full, "block_shas": list(block_shas(spec))}


def reconcile_fn(spec=None, *, check=False, force=False, install_path=None, python=None, timeout=300.0,
                 full=False, include_held=False, gpu_capability=None):
    """Every spec a host carries, in one reconcile call: one row per host and spec.

    A spec whose `applies:` needs the host's facts goes in the same call as "pending": its file
    exactly as our last write left it is `unchanged` there and then (no discovery, as for any
    spec); otherwise the answer brings the facts, the spec is decided here, and the ones that
    apply go in one more call on the same connection."""
    from provision.tasks import specs as multi

    given = spec if isinstance(spec, list) else ([spec] if spec is not None else None)

    def call(host, session, fleet, todo, pending=()) -> dict:
        req = request(todo[0], host, check=check, force=force, install_path=install_path, python=python,
                      full=full, include_held=include_held)
        del req["spec"], req["block_shas"]
        req["specs"] = [s.to_engine() for s in todo]
        req["spec_block_shas"] = {s.name: list(block_shas(s)) for s in todo}
        if pending:
            req["pending"] = [s.name for s in pending]
            req["gpu"] = multi.wants_gpu(list(pending), host, gpu_capability)
        return call_light(session, req, timeout=timeout, sudo=fleet.uses_sudo(host, session))

    def parts_of(ans: dict, todo: list) -> list:
        parts = ans.get("results")
        return [parts[i] if parts and i < len(parts) else {k: ans.get(k) for k in ("ok", "error", "facts")}
                for i in range(len(todo))]

    def fn(host, session, fleet) -> list[HostResult]:
        every = multi.specs_for(host, given)
        # a spec of another engine's files than the host's server runs is not applicable there
        other = multi.other_engines_specs(every, multi.host_engine(host))
        rows: list[HostResult] = [multi.not_applicable(host.name, s, other[s.name]) for s in every if s.name in other]
        hspecs = [s for s in every if s.name not in other]
        stated = multi.gpu_given(host, gpu_capability) is not None
        ask = [s for s in hspecs if multi.needs_host(multi.applies_of(s), stated)]
        # what can be decided without the host (no applies:, or only a stated GPU)
        known, no = multi.split([s for s in hspecs if s not in ask],
                                multi.host_view({}, host, gpu_capability) if stated else None)
        rows += [multi.not_applicable(host.name, s, no[s.name]) for s in hspecs if s.name in no]
        todo = known + ask
        if not todo:
            return multi.in_order(every, rows)
        ans = call(host, session, fleet, todo, pending=ask)
        later: list = []
        for s, part in zip(todo, parts_of(ans, todo)):
            if part.get("state") == "pending":
                later.append(s)
            else:
                rows.append(result_from_answer(host.name, part, check=check, spec=s))
        err = (ans.get("facts") or {}).get("error")
        if later and err:  # no install to decide them on: the same failure for each
            rows += [result_from_answer(host.name, {"ok": False, "error": err}, check=check, spec=s) for s in later]
            later = []
        if later:
            ok, no = multi.split(later, multi.host_view(ans, host, gpu_capability))
            rows += [multi.not_applicable(host.name, s, no[s.name], ans.get("facts")) for s in later if s.name in no]
            if ok:
                ans2 = call(host, session, fleet, ok)
                rows += [result_from_answer(host.name, part, check=check, spec=s)
                         for s, part in zip(ok, parts_of(ans2, ok))]
        return multi.in_order(every, rows)

    return fn


# --------------------------------------------------------------------------- answers -> verdicts (pure)

def result_from_answer(host: str, ans: ReconcileAnswer, *, check: bool = False, spec=None) -> HostResult:
    from provision.tasks.patch import result_from_answer as patch_result

    data = {"state": ans.get("state"), "action": ans.get("action"), "reason": ans.get("reason"),
            "path": ans.get("path"), "restart_needed": list(ans.get("restart_needed") or []),
            "servers": ans.get("servers") or [], "check": check, "remote_elapsed": ans.get("elapsed")}
    if spec is not None:
        data["spec"], data["spec_hash"] = spec.name, spec.sha
    for k in ("reference", "kind", "git", "state_cleaned", "state_refreshed", "package"):
        if ans.get(k) is not None:
            data[k] = ans[k]
    notes = list(ans.get("notes") or [])
    ov = ans.get("overlay") or {}
    # an install in overlay mode keeps it: a restart goes through `launch --overlay` (unless now native)
    data["overlay_mode"] = ov.get("verdict") in ("staged", "unchanged")
    if not ans.get("ok") or ans.get("error") and "state" not in ans:
        err = ans.get("error") or {}
        return HostResult(host, "failed", err.get("message", "reconcile failed on the host"),
                          version=ans.get("version"), install=ans.get("install"), file=ans.get("file"),
                          error_kind=err.get("kind"), notes=notes, data=data)
    state, action = ans.get("state"), ans.get("action")
    base = dict(version=ans.get("version"), install=ans.get("install"), file=ans.get("file"))
    reason = ans.get("reason") or ""
    if action == "patch" and check:
        data["sha_before"] = ans.get("sha")
        return HostResult(host, "patched", f"{state}: {reason}; would patch", notes=notes, data=data, **base)
    if action == "patch":
        p = ans.get("patch") or {}
        pr = patch_result(host, p)
        err = p.get("error") or (p.get("result") or {}).get("error") or {}
        verdict = pr.verdict
        if verdict == "failed" and err.get("kind") == "server-loading":
            verdict = "deferred"
        for k in ("sha_before", "sha_after", "backup", "real_file"):
            if k in pr.data:
                data[k] = pr.data[k]
        if verdict in ("patched", "repaired"):
            detail = f"{state}: {reason}; re-patched" + (f" ({pr.detail})" if pr.detail else "")
        else:
            detail = f"{state}: {reason}; patch {verdict}: {pr.detail}"
        return HostResult(host, verdict, detail, added=pr.added, notes=notes + pr.notes, diff=pr.diff,
                          error_kind=pr.error_kind, data=data, **base)
    if action in ("restage", "remove-overlay"):  # overlay mode: the file is never edited
        verdict = "staged" if action == "restage" else "removed"
        detail = reason + ("; would be " if check else "; ") + ("regenerated" if verdict == "staged" else "removed")
        return HostResult(host, verdict, detail, notes=notes, data=dict(data, overlay=ans.get("overlay")), **base)
    verdict = VERDICT_OF_STATE.get(state, "failed")
    detail = reason
    if action == "clean-state":
        detail += ("; would drop" if check else "; dropped") + " provision's stale state for the file (backups kept)"
    elif action == "refresh-state":
        detail += ("; would refresh" if check else "; refreshed") + " provision's state for the file"
    data["sha_before"] = data["sha_after"] = ans.get("sha")
    return HostResult(host, verdict, detail, notes=notes, data=data, **base)


def needs_restart(r: HostResult) -> bool:
    return bool(r.data.get("restart_needed")) and not r.failed and r.verdict != "deferred"


def row_per_host(results: list[HostResult]) -> dict[str, HostResult]:
    """{host: the row a host's restart is reported on}: with several specs per host, the first
    row whose file changed under a running server, else the host's first row. Pure."""
    out: dict[str, HostResult] = {}
    for r in results:
        if r.host not in out or (needs_restart(r) and not needs_restart(out[r.host])):
            out[r.host] = r
    return out


# --------------------------------------------------------------------------- restart planning (pure)

def window_clock():
    """The clock the window checks read: local time now, or, when ``PROVISION_NOW`` holds an ISO time
    (``2026-01-01T04:59:57``; a testing aid, read in test mode only: config/testmode.py), that time
    advancing in real time from this process's start."""
    from provision.config.testmode import switch

    fake = switch("PROVISION_NOW")
    if not fake:
        return datetime.now
    try:
        base = datetime.fromisoformat(fake)
    except ValueError:
        raise UsageError(f"PROVISION_NOW={fake!r}: expected an ISO time such as 2026-01-01T04:59:57") from None
    from datetime import timedelta

    return lambda: base + timedelta(seconds=time.monotonic() - _T0)


def window_closed(now, window) -> str | None:
    """Why a restart batch may not start at `now` (None: it may). Pure."""
    if window is None or in_window(now, window):
        return None
    return f"outside window {format_window(window)}"


def restart_units(need: list, hosts: list) -> list:
    """The hosts to restart: every host that needs it, and with it every selected host of its
    multi-node server (inventory `server:`), so a server group restarts as one unit. Order kept. Pure."""
    groups = {h.vars.get("server") for h in need if h.vars.get("server")}
    names = {h.name for h in need}
    return [h for h in hosts if h.name in names or (h.vars.get("server") and h.vars.get("server") in groups)]


def plan_restarts(results: list[HostResult], hosts: list, *, restart: bool, window=None, now=None,
                  serial=None) -> tuple[list[list], dict]:
    """(batches of Hosts to restart, {host: note}) for hosts whose server predates its file."""
    from provision.control import plan

    by_name = {h.name: h for h in hosts}
    need = [by_name[n] for n in dict.fromkeys(r.host for r in results if needs_restart(r) and r.host in by_name)]
    notes: dict[str, str] = {}
    if not need:
        return [], notes
    if not restart:
        for h in need:
            notes[h.name] = "restart needed: the running server started before the file changed " \
                            "(--restart restarts it)"
        return [], notes
    why = window_closed(now or window_clock()(), window)
    if why is not None:
        for h in need:
            notes[h.name] = f"restart deferred: {why}"
        return [], notes
    units = restart_units(need, hosts)
    for h in units:
        if h not in need:
            notes[h.name] = (f"restarted with the rest of server {h.vars.get('server')} (another of its hosts "
                             "runs code that changed under it)")
    return plan.batches(units, serial), notes


def run_restarts(fleet, batches: list[list], results: list[HostResult], *, profile=None, deadline=3600.0,
                 stream=None, window=None, clock=None, spec=None, journal=None) -> None:
    """Restart batch after batch through the launch code path (launch_fn with restart=True and the
    same multi-node flags as `launch`, health-gated). Before each batch the window is checked again
    (`clock`, default window_clock()); a batch that may not start, and every batch after one that did
    not come back ready, is reported as skipped with the reason.

    `journal(row, extra)` is called with each host's restart outcome the moment it arrives (also when
    Ctrl-C or SIGTERM ends the batch: the hosts mid-restart arrive as "unknown"); an interrupt then
    goes on up, so no later batch starts."""
    from provision.errors import ConfigError
    from provision.tasks.launch import launch_fn
    from provision.tasks.multinode import MultiNode
    from provision.tasks.options import LaunchOptions
    from provision.output.progress import Display
    from provision.control.runner import run_hosts
    from provision.tasks.selection import selector

    by_name = row_per_host(results)
    clock = clock or window_clock()
    # Overlay-mode hosts restart with the overlay of the spec reconcile just used (--playbook, else the
    # host's `spec:`), not one re-rendered from the profile's playbook. Of several --playbook, the
    # overlay is the delegation spec's (the other kinds have none).
    if isinstance(spec, list):
        spec = next((s for s in spec if getattr(s, "kind", "delegate") == "delegate"), None)
    # A restart replays each server's record (its launch, its backend, its fix; --restart-playbook
    # replaces the launch); the host keeps its secrets (the 0600 files its record names): this run has
    # none of its own.
    opts = LaunchOptions(profile=profile, restart=True, deadline=deadline, poll=1.0, overlay_spec=spec,
                         overlay_hosts={r.host for r in results if r.data.get("overlay_mode")})
    done: set[str] = set()

    def outcome(name: str, verdict: str, detail: str) -> None:
        if name in done:
            return
        done.add(name)
        extra = _restart_outcome(by_name[name], verdict, detail)
        if journal is not None and extra is not None:
            journal(by_name[name], extra)

    def arrived(rr: HostResult) -> None:  # as each host's restart ends (before the batch is over)
        outcome(rr.host, *restart_verdict(rr))

    everyone = [h for b in batches for h in b]
    try:
        multinode = MultiNode(everyone)
    except ConfigError as exc:
        for h in everyone:
            outcome(h.name, "failed", f"restart failed: {exc.message}")
        return
    biggest = max((len(v) for v in multinode.members.values()), default=1)
    fleet.opts.forks = max(fleet.opts.forks, biggest)  # every rank of a server restarts together
    current: list = []  # the batch in flight

    def run_batch(batch: list) -> list[HostResult]:
        current[:] = batch
        return run_hosts(fleet, batch, fn, on_result=arrived)

    with Display(plain=True, stream=stream or sys.stderr) as display:
        fn = launch_fn(opts, display, multinode)
        try:
            for name, verdict, detail in roll(batches, window=window, clock=clock, run_batch=run_batch):
                outcome(name, verdict, detail)
        except KeyboardInterrupt:
            # Ctrl-C/SIGTERM: a host of the batch whose worker did not come back in time to say how
            # far it got may have had its old server stopped and its new one started: journaled as
            # an attempt of unknown outcome, never left out
            for h in current:
                outcome(h.name, "unknown", "restart interrupted while it ran: whether the old server was stopped "
                                           f"and a new one started is unknown until `provision status "
                                           f"{selector(h.name)}` looks")
            raise


def restart_verdict(rr: HostResult) -> tuple[str, str]:
    """A launch row of a restart -> (verdict, detail) of the reconcile row's restart."""
    ok = rr.verdict in ("ready", "running")
    if rr.verdict == "interrupted" and rr.data.get("started"):
        # Ctrl-C/SIGTERM while the new server loaded: the old one is gone, whether the new one comes
        # up is not known yet (journaled as an attempt of unknown outcome)
        return "unknown", "restart interrupted after the new server started: " + rr.detail
    return ("restarted" if ok else rr.verdict), ("restarted: " if ok else "restart failed: ") + rr.detail


def roll(batches: list[list], *, window, clock, run_batch):
    """The rolling restart's decisions, batch by batch: yields (host, verdict, detail). The window is
    checked with `clock()` before each batch; once a batch may not start (window closed) or one did
    not come back ready, every later batch is skipped with the reason. `run_batch(batch)` restarts a
    batch and returns its HostResults (the launch results)."""
    skip = None
    for i, batch in enumerate(batches, 1):
        if skip is None:
            now = clock()
            why = window_closed(now, window)
            if why is not None:
                skip = f"restart skipped: batch {i}/{len(batches)} not started, {why} (it was {now:%H:%M:%S})"
        if skip is not None:
            for h in batch:
                yield h.name, "skipped", skip
            continue
        for rr in run_batch(batch):
            verdict, detail = restart_verdict(rr)
            yield rr.host, verdict, detail
            if verdict != "restarted" and skip is None:
                skip = f"restart skipped: batch {i} did not come back healthy"


def _restart_outcome(r: HostResult, verdict: str, detail: str) -> dict | None:
    """Record the restart on the host's reconcile row; its journal line (None when skipped)."""
    r.data["restart"] = {"verdict": verdict, "detail": detail}
    r.notes.append(detail)
    if verdict == "skipped":
        return None
    extra = {"command": "restart", "verdict": verdict, "detail": detail, "file": r.file}
    r.data.setdefault("journal_extra", []).append(extra)
    return extra


def restart_failed(r: HostResult) -> bool:
    rs = r.data.get("restart") or {}
    return bool(rs) and rs.get("verdict") not in ("restarted", "skipped")


# --------------------------------------------------------------------------- output (pure)

def label(r: HostResult) -> str:
    if r.verdict in ("patched", "repaired"):
        return "would-re-patch" if r.data.get("check") else "re-patched"
    return r.verdict


def summary_line(results: list[HostResult]) -> str:
    counts: dict[str, int] = {}
    failed = 0
    for r in results:
        if r.failed:
            failed += 1
            continue
        counts[label(r)] = counts.get(label(r), 0) + 1
    order = ["unchanged", "re-patched", "would-re-patch", "native", "not-applicable", "held", "foreign-edit", "blocked-git", "deferred"]
    keys = sorted(counts, key=lambda k: (order.index(k) if k in order else len(order), k))
    body = ", ".join(f"{counts[k]} {k}" for k in keys) or "none ok"
    from provision.output.report import count_label

    line = f"reconcile: {count_label(results)}: {body}; {failed} failed"
    rs: dict[str, int] = {}
    for r in row_per_host(results).values():
        if r.data.get("restart"):
            v = r.data["restart"]["verdict"]
            rs[v] = rs.get(v, 0) + 1
        elif needs_restart(r):
            key = "restart deferred" if any("restart deferred" in n for n in r.notes) else "restart needed"
            rs[key] = rs.get(key, 0) + 1
    if rs:
        line += "; " + ", ".join(f"{n} {k}" for k, n in sorted(rs.items()))
    return line


def host_line(r: HostResult) -> str:
    """reconcile's form of the one row renderer (output/report.host_line): a repair is labelled
    "re-patched" ("would-re-patch" with --check), and the added methods are left out."""
    from provision.output.report import host_line as row

    return row(r, verdict=label(r), added=False)


def exit_code(results: list[HostResult], check: bool, restart: bool = False) -> int:
    if not results:
        return EXIT_NOTHING
    if any(r.failed or r.verdict in ATTENTION or restart_failed(r) for r in results):
        return EXIT_FAILED
    if check and any(r.verdict in ("patched", "repaired", "staged", "removed") for r in results):
        return EXIT_CHANGES
    if check and any(needs_restart(r) and not any("deferred" in n for n in r.notes) for r in results):
        return EXIT_CHANGES  # a server on stale code: the fleet is not where it should be (--restart moves it)
    return EXIT_OK
