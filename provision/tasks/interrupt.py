"""What a launch run got to, per host (`RunState`, written by launch_fn's workers), and the report a
Ctrl-C during `launch` prints from it (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from provision.config.inventory import Host
from provision.output.results import HostResult
from provision.tasks.selection import selector
from provision.tasks.options import LaunchOptions


@dataclass
class RunState:
    """One launch run's state, apart from its options: created per run, filled by launch_fn (from the
    runner's worker threads, one key per host), read by the Ctrl-C report."""
    # per host, how far the launch got ("preflight", "patching", "starting", "started") and its result
    stages: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    # per host, the rows of `--patch` (files edited before the start): journaled with the launch row
    patched: dict = field(default_factory=dict)
    # per host, the router it was taken out of (tasks/routing.py) and not put back in yet
    router_out: dict = field(default_factory=dict)
    # per host, the server the start request started ({"pid", "log", "change"}): journaled from here
    # when Ctrl-C comes before the worker's own row does
    started: dict = field(default_factory=dict)


def router_out_words(name: str, said: str) -> str:
    """What a host taken out of its router and not put back says (pure)."""
    return (f"; it is out of {said}: `provision wait {selector(name)}` (or the next `launch --restart`) puts "
            "it back once it is healthy")


def patch_journal(rows) -> list[dict]:
    """`launch --patch`'s edits as journal lines of their own (command patch), carried by the launch row."""
    return [{"command": "patch", "verdict": r.verdict, "detail": r.detail, "file": r.file, "spec": r.data.get("spec"),
             "sha_before": r.data.get("sha_before"), "sha_after": r.data.get("sha_after"),
             "error_kind": r.error_kind} for r in rows or []]


def interrupted_result(host: Host, rec: dict, opts: LaunchOptions) -> HostResult:
    """Ctrl-C after this host's server was started: say so (it was, and where it stands)."""
    how = ("stopping it (--stop-on-interrupt)" if opts.stop_on_interrupt else
           f"it is left running: `provision wait {selector(host.name)}` re-attaches, `provision stop "
           f"{selector(host.name)}` stops it")
    return HostResult(host.name, "interrupted", f"interrupted while following; the server was started (pid "
                      f"{rec.get('pid')}, log {rec.get('log')}) and {how}", error_kind="interrupted",
                      data={"pid": rec.get("pid"), "log": rec.get("log"), "started": True})


def interrupt_report(hosts: list[Host], run: RunState, opts: LaunchOptions) -> list[HostResult]:
    """Every selected host's record after a Ctrl-C, from what launch_fn got to (`run`) (pure)."""
    out = []
    for h in hosts:
        r = run.results.get(h.name)
        stage = run.stages.get(h.name)
        if r is not None:
            out.append(r)
            continue
        if stage == "patching":
            out.append(HostResult(h.name, "unknown", "interrupted while --patch ran: the file is either as before "
                                  f"or patched; `provision status {selector(h.name)}` says which; no server was started",
                                  error_kind="interrupted"))
        elif stage == "starting":
            out.append(HostResult(h.name, "unknown", "interrupted while the start request ran: whether a server "
                                  f"was started is unknown until `provision status {selector(h.name)}` looks",
                                  error_kind="interrupted"))
        elif stage == "started":  # the worker did not come back in time to say more
            srv = run.started.get(h.name) or {}
            out.append(HostResult(h.name, "interrupted", "interrupted while following; the server was started "
                                  + (f"(pid {srv['pid']}, log {srv.get('log')}) " if srv.get("pid") else "")
                                  + "and " + ("is being stopped (--stop-on-interrupt)" if opts.stop_on_interrupt
                                              else f"is left running: `provision wait {selector(h.name)}` "
                                                   f"re-attaches, `provision stop {selector(h.name)}` stops it"),
                                  error_kind="interrupted", data={"started": True, "pid": srv.get("pid")}))
            if srv.get("pid"):  # the start is a change on the host: its journal line, as the row would have had
                change = srv.get("change") or "started"
                out[-1].data["journal_extra"] = [{"command": "launch", "verdict": change,
                                                  "detail": f"{change} pid {srv['pid']}; then interrupted"}]
        else:
            out.append(HostResult(h.name, "interrupted", "interrupted before a server was started there; nothing "
                                  "was started", error_kind="interrupted"))
        if run.router_out.get(h.name) and "out of the router" not in out[-1].detail:
            out[-1].detail += router_out_words(h.name, run.router_out[h.name])
        if run.patched.get(h.name):  # --patch edited files before the interrupt
            out[-1].data["journal_extra"] = patch_journal(run.patched[h.name]) + out[-1].data.get("journal_extra", [])
    return out
