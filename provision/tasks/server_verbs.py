"""`wait`, `stop`, `logs` and server `status` for one host: the verbs on a server already started."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from provision.config.inventory import Host
from provision.control.router import RouterError
from provision.output.results import HostResult
from provision.tasks import recorded, routing
from provision.tasks.follow import follow
from provision.tasks.options import LaunchOptions, overlay_package, resolve, secret_values

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import LogsAnswer, ServerStatusAnswer, StopAnswer


def wait_fn(opts: LaunchOptions, display):
    def fn(host: Host, session, fleet) -> HostResult:
        sudo = fleet.uses_sudo(host, session)
        got = recorded.server_of(host, session, resolve(host, opts)[0], opts, sudo)
        if isinstance(got, HostResult):
            return got
        prof, note = got
        if note:
            display.message(host.name, note)
        st: ServerStatusAnswer = session.call({"op": "server_status", "port": prof.port}, timeout=prof.health_timeout + 30, sudo=sudo)
        if not st.get("record"):
            return HostResult(host.name, "failed", f"no server started by provision on port {prof.port}")
        t_start = time.monotonic() - max(0.0, time.time() - st["record"]["started_at"])
        # From the current start-up on: a persistent server systemd restarted has the earlier
        # ones (and their crash) above it in the same log.
        res = follow(session, host, prof, opts, display, offset=int(st["record"].get("log_offset") or 0),
                     sudo=sudo, t_start=t_start, overlay_package=overlay_package(st["record"]))
        if note:
            res.notes.append(note)
        return back_in_router(res, host, prof.port, opts, session, fleet, sudo, display)

    return fn


def back_in_router(res: HostResult, host: Host, port: int, opts: LaunchOptions, session, fleet, sudo: bool,
                   display) -> HostResult:
    """`wait` behind a router: a ready server the router does not list (a Ctrl-C between "out" and
    "back in") is warmed and put back; one that is listed is left alone."""
    place = routing.place_of(host, port, opts.router, fleet)
    if place is None or res.verdict != "ready":
        return res
    words, listed = routing.listed_words(place)
    if listed:
        res.notes.append(words)
        return res
    _, said = routing.back_in(res, place, session, port, opts.secrets, sudo, routing.Steps())
    display.message(host.name, said)
    return res


def drain_words(ans: dict, grace: float) -> str:
    """What the drain did, for a stop's row (pure): drained, or the requests the deadline cut."""
    d = ans.get("drain")
    if not d:
        return ""
    if d.get("drained"):
        return f"; drained: every request in flight finished ({d.get('waited')} s)"
    if d.get("aborted"):
        return (f"; {d['aborted']} request(s) in flight were aborted by the server itself on SIGTERM, not drained "
                f"(it drains only when started with --{d.get('flag') or 'its drain flag'} above 0: leave that "
                "flag to provision, which sets it to the grace)")
    cut = ans.get("cut")
    if cut is None:
        return f"; the drain did not end by the {grace:g} s deadline (--grace): what was in flight was cut"
    return (f"; {cut} request(s) still in flight were cut at the {grace:g} s deadline (--grace)" if cut else
            f"; the drain did not end by the {grace:g} s deadline (--grace), with nothing in flight")


def stop_fn(opts: LaunchOptions, grace: float | None = None):
    def fn(host: Host, session, fleet) -> HostResult:
        prof, _ = resolve(host, opts)
        g = prof.grace if grace is None else grace
        port, note = prof.port, ""
        if not recorded.named(host, opts.profile, opts.overrides.get("port")):  # the server recorded here
            got = recorded.port_for(host, session, prof.port, fleet.uses_sudo(host, session))
            if isinstance(got, HostResult):
                return got
            port, note = got
        res = _stop(host, port, g, opts, session, fleet)
        if note:
            res.notes.append(note)
        return res

    return fn


def _stop(host: Host, port: int, g: float, opts: LaunchOptions, session, fleet) -> HostResult:
    """The stop of the server on `port`: out of the router first (when one is named), then the
    host's stop (drained for the grace, SIGTERM, SIGKILL), back in the router's words."""
    place = routing.place_of(host, port, opts.router, fleet)
    steps, out_words = routing.Steps(), ""
    if place is not None:
        try:
            out_words = routing.take_out(place, steps) + "; "
        except RouterError as exc:
            if not opts.force:
                return HostResult(host.name, "refused", f"{exc}: the server was not stopped and stays in the "
                                  "router (--force stops it without the router)", error_kind="router")
            out_words, place = f"{exc}: stopped without the router (--force); ", None
    began = time.monotonic()
    ans: StopAnswer = session.call({"op": "stop", "port": port, "grace": g}, timeout=g + 60,
                       sudo=fleet.uses_sudo(host, session))
    res = _stop_row(host, ans, g)
    if out_words:
        res.detail = out_words + res.detail
    if place is not None:
        if ans.get("stopped"):
            routing.stop_steps(steps, ans, began)
        routing.record(res, place, steps, False)
    return res


def _stop_row(host: Host, ans: "StopAnswer", g: float) -> HostResult:
    """A stop's row from the host's answer."""
    if not ans.get("ok"):
        return HostResult(host.name, "failed", (ans.get("error") or {}).get("message", "stop failed"))
    if ans.get("container") and ans.get("removed") and not ans.get("stopped"):
        return HostResult(host.name, "stopped", f"container {ans['container']} was not running (exit status "
                          f"{ans.get('exit')}); removed it")
    if not ans.get("stopped"):
        return HostResult(host.name, "not-running", ans.get("message", "nothing to stop"))
    if ans.get("container"):
        how = "it did not stop in the grace period: killed" if ans.get("escalated") else "SIGTERM"
        return HostResult(host.name, "stopped", f"stopped and removed container {ans['container']} ({how}) in "
                          f"{ans['elapsed']} s", data={"pids": ans["pids"], "container": ans["container"]})
    how = "SIGTERM, then SIGKILL after the grace period" if ans.get("escalated") else "SIGTERM"
    if ans.get("unit_removed"):
        how = f"systemd unit {ans['unit']} stopped, disabled and removed"
    elif ans.get("transient_unit"):
        how = f"its transient unit {ans['transient_unit']} stopped" + (", then SIGKILL" if ans.get("escalated")
                                                                       else "")
    return HostResult(host.name, "stopped", f"stopped {len(ans['pids'])} processes ({how}) in "
                      f"{ans['elapsed']} s; none left" + drain_words(ans, g),
                      data={"pids": ans["pids"], "drain": ans.get("drain"), "cut": ans.get("cut")})


def logs_fn(opts: LaunchOptions, lines: int):
    from provision.logs.redact import redact

    def fn(host: Host, session, fleet) -> HostResult:
        sudo = fleet.uses_sudo(host, session)
        got = recorded.server_of(host, session, resolve(host, opts)[0], opts, sudo)
        if isinstance(got, HostResult):
            return got
        prof, note = got
        ans: LogsAnswer = session.call({"op": "logs", "port": prof.port, "lines": lines}, timeout=60, sudo=sudo)
        if not ans.get("ok"):
            return HostResult(host.name, "failed", ans["error"]["message"])
        text = redact(ans["text"], secret_values(opts.secrets))
        return HostResult(host.name, "ok", ans["log"], notes=[note] if note else [],
                          data={"text": text, "offset": ans["offset"], "engine": ans.get("engine"),
                                "version": ans.get("version")})

    return fn


def server_status_fn(opts: LaunchOptions):
    def fn(host: Host, session, fleet) -> HostResult:
        prof, _ = resolve(host, opts)
        ans: ServerStatusAnswer = session.call({"op": "server_status", "port": prof.port}, timeout=prof.health_timeout + 30,
                           sudo=fleet.uses_sudo(host, session))
        rec = ans.get("record") or {}
        if not ans.get("running") and ans.get("survivors"):
            from provision.tasks.patch import server_survivors_text

            return HostResult(host.name, "failed", server_survivors_text(ans), data={"survivors": ans["survivors"]})
        if not ans.get("running"):
            extra = f" (last exit status {ans['exit']})" if ans.get("exit") is not None else ""
            return HostResult(host.name, "not-running", f"no server running on port {prof.port}{extra}")
        h = ans.get("health")
        detail = (f"pid {rec.get('pid')} port {prof.port} health {h if h is not None else 'no answer'} "
                  f"model {rec.get('model')} uptime {ans.get('uptime')} s")
        if rec.get("container"):
            from provision.tasks.container import container_text

            detail = container_text(rec, ans) + f", health {h if h is not None else 'no answer'} uptime " \
                f"{ans.get('uptime')} s model {rec.get('model')}"
        return HostResult(host.name, "running", detail, data={"pid": rec.get("pid"), "health": h,
                                                              "uptime": ans.get("uptime"), "model": rec.get("model")})

    return fn

