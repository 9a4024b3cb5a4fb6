"""`launch`, `wait`, `stop`, `logs`, server `status` for one host.

Start-up is followed from the control machine with a tenacity polling policy:
each poll is one short remote step (new log bytes since the last offset, is the
process alive, is the port open, what does /health answer, asked on the host).
The log goes through the pure parser (loadlog) for phase, progress and crash.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tenacity import (RetryError, Retrying, retry_if_exception, retry_if_result, stop_after_delay, wait_exponential,
                      wait_random)

from provision.config.inventory import Host
from provision.config.profile import Profile, host_profile
from provision.control.transport.base import Interrupted
from provision.errors import ConfigError, ConnectError, UnknownOutcome
from provision.output.results import HostResult
from provision.tasks import specs as multi
from provision.tasks.multinode import MultiNode, follow_secondary as _follow_secondary  # noqa: F401 - MultiNode: launch's interface

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import LogsAnswer, PreflightAnswer, ProbeAnswer, ServerStatusAnswer, SmokeAnswer, StartAnswer, StopAnswer


# Seconds the host may take to import the overlay module as the server would (where torch imports).
OVERLAY_IMPORT_TIMEOUT = 180.0
# Seconds a container launch's preflight may spend pulling an image the host does not have.
IMAGE_PULL_TIMEOUT = 1800.0


@dataclass
class LaunchOptions:
    profile: str | None = None
    overrides: dict = field(default_factory=dict)
    patch: bool = False
    force: bool = False
    restart: bool = False
    deadline: float = 3600.0
    poll: float = 2.0
    smoke: bool = False
    persistent: bool = False
    health_url: str | None = None
    secrets: dict = field(default_factory=lambda: {"args": {}, "env": {}})
    error_cap: int = 5
    ready_checks: int = 2
    sglang_path: str | None = None
    python: str | None = None
    max_outage: float = 300.0   # seconds of consecutive connection failures before a follow gives up
    tree_grace: float = 10.0    # the watcher: seconds a dead server's remaining processes get before SIGKILL
    stop_on_interrupt: bool = False
    overlay: bool = False       # launch --overlay (or the profile's `fix: overlay`): no file is edited
    overlay_hosts: set = field(default_factory=set)  # these hosts only (reconcile --restart: overlay-mode hosts),
    overlay_spec: object = None                      # with this spec (None: the host's `spec:`)
    gpu_capability: str | None = None   # for required specs' `applies:` (tasks/specs.py)
    replay: bool = False        # a restart replays the running server's record: its --arg overrides, its
                                # backend (persistent), its fix (reconcile --restart)
    # per host, how far the launch got ("preflight", "starting", "started") and its result: what a
    # Ctrl-C report is built from (filled by launch_fn, read by the CLI)
    stages: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    # per host, the rows of `--patch` (files edited before the start): journaled with the launch row
    patched: dict = field(default_factory=dict)


def patch_journal(rows) -> list[dict]:
    """`launch --patch`'s edits as journal lines of their own (command patch), carried by the launch row."""
    return [{"command": "patch", "verdict": r.verdict, "detail": r.detail, "file": r.file, "spec": r.data.get("spec"),
             "sha_before": r.data.get("sha_before"), "sha_after": r.data.get("sha_after"),
             "error_kind": r.error_kind} for r in rows or []]


def resolve(host: Host, opts: LaunchOptions, multinode: "MultiNode | None" = None):
    overrides = dict(opts.overrides)
    if multinode is not None:
        overrides.update(multinode.args_for(host))
    prof, spec = host_profile(host, opts.profile, overrides, opts.python)
    if (opts.overlay or host.name in opts.overlay_hosts) and prof.fix != "overlay":
        from dataclasses import replace

        prof = replace(prof, fix="overlay")
    if host.name in opts.overlay_hosts:
        from provision.config.playbook import load_patch_spec

        spec = opts.overlay_spec or load_patch_spec(host.get("spec"))
    if prof.fix == "overlay" and opts.patch:
        raise ConfigError(f"{prof.name}: --patch edits SGLang's file, overlay mode (--overlay or the profile's "
                          "`fix: overlay`) leaves it untouched: choose one")
    return prof, spec


def uses_overlay(prof: Profile, opts: LaunchOptions) -> bool:
    """launch --overlay, or the profile's `fix: overlay` (resolve() folds the flag into the profile)."""
    return prof.fix == "overlay"


def overlay_package(rec: dict | None) -> str | None:
    """The overlay package a started server runs with (its record says), or None."""
    return ((rec or {}).get("overlay") or {}).get("package")


def secret_values(secrets: dict) -> list[str]:
    return [str(v) for part in ("args", "env") for v in (secrets.get(part) or {}).values() if v]


def _req(op: str, host: Host, prof: Profile, opts: LaunchOptions, **kw) -> dict:
    from provision.config.profile import render_flags

    req = {"op": op, "port": prof.port, "profile": {"args": prof.args, "flags": render_flags(prof.args),
                                                      "env": prof.env, "module": prof.module,
                                                      "python": prof.python, "keep_logs": prof.keep_logs,
                                                      "grace": prof.grace,
                                                      "container": prof.container.to_request() if prof.container
                                                      else None},
           "profile_digest": prof.digest(), "profile_name": prof.name, "offline": bool(host.get("offline")),
           "sglang_path": opts.sglang_path or host.get("sglang_path"), "python": opts.python or host.get("python"),
           "log_dir": prof.log_dir, "health_timeout": prof.health_timeout, "grace": prof.grace}
    req.update(kw)
    return req


def _blip(session, exc: BaseException) -> bool:
    """A dropped session or a probe that did not come back: worth a fresh connection. Never after
    Ctrl-C, never an authentication or host-key refusal."""
    return isinstance(exc, (ConnectError, UnknownOutcome)) and not session.cancelled


def steady_call(session, request: dict, *, timeout: float, sudo: bool, opts: LaunchOptions, display,
                host: Host, st: dict, budget: float | None = None) -> dict:
    """One read-only remote step of a follow. A blip (the SSH session dropped, the probe did not
    answer) is retried on a fresh connection with backoff (tenacity) until `opts.max_outage` seconds
    of consecutive failures (or `budget`), then raised. `st` carries the outage across calls."""
    limit = max(0.0, min(opts.max_outage, budget if budget is not None else opts.max_outage))

    def lost(why) -> None:
        st["outage_failures"] = st.get("outage_failures", 0) + 1
        if st.get("outage_since") is None:
            st["outage_since"] = time.monotonic()
            display.message(host.name, f"connection lost ({why}); reconnecting with backoff for up to "
                                       f"{limit:g} s (--max-outage)")

    def attempt():
        try:
            if not session.connected and not session.cancelled:
                lost("the SSH session closed")
                session.reconnect()
            return session.call(request, timeout=timeout, sudo=sudo)
        except Exception as exc:
            if _blip(session, exc):
                lost(exc)
            raise

    out = Retrying(retry=retry_if_exception(lambda e: _blip(session, e)), reraise=True,
                   wait=wait_exponential(multiplier=0.5, max=10) + wait_random(0, 0.3),
                   stop=stop_after_delay(limit), sleep=session.pause)(attempt)
    if st.get("outage_since") is not None:
        n = st["outage_failures"]
        display.message(host.name, f"reconnected after {time.monotonic() - st['outage_since']:.1f} s "
                                   f"({n} failure{'s' if n != 1 else ''}); still following")
        st["outages"] = st.get("outages", 0) + 1
        st["outage_since"] = None
        st["outage_failures"] = 0
    return out


def lost_result(host: Host, exc: BaseException, st: dict, opts: LaunchOptions) -> HostResult:
    since = st.get("outage_since")
    took = time.monotonic() - since if since is not None else 0.0
    return HostResult(host.name, "unknown", f"lost the connection while following and could not get it back for "
                      f"{took:.0f} s (limit --max-outage {opts.max_outage:g} s; last error: {exc}); the server "
                      f"is left running: `provision wait --host {host.name}` re-attaches, `provision status` "
                      "shows it", error_kind="connect", data={"outage_seconds": round(took, 1)})


def follow(session, host: Host, prof: Profile, opts: LaunchOptions, display, *, offset: int = 0,
           sudo: bool = False, t_start: float | None = None, overlay_package: str | None = None) -> HostResult:
    """Poll until healthy, dead, or the deadline. Returns the host's verdict.

    `overlay_package`: the server runs with that overlay; SGLang skipping one of its modules
    (``Ignore import error when loading PKG...``) is a crash of its own, and the server is
    stopped at once instead of loading weights for a class without the methods."""
    from provision.logs.loadlog import LoadLog, hint
    from provision.logs.redact import redact

    secrets = secret_values(opts.secrets)
    parser = LoadLog(secrets=secrets, overlay_package=overlay_package)
    seen = {"phases": [], "progress": {}}
    t0 = t_start or time.monotonic()
    st = {"offset": offset, "ok_in_row": 0, "errors_open": 0, "seen_200": False, "bad_after_200": 0,
          "last": None, "done": None, "record": None}

    def poll():
        t_probe = time.monotonic()
        ans: ProbeAnswer = steady_call(session, {"op": "probe", "port": prof.port, "offset": st["offset"],
                                    "health_timeout": prof.health_timeout, "health_url": opts.health_url,
                                    "confirm": 0.3 if opts.ready_checks > 1 else 0, "sglang_path": None},
                          timeout=2 * prof.health_timeout + 30, sudo=sudo, opts=opts, display=display, host=host,
                          st=st, budget=opts.deadline - (time.monotonic() - t0))
        st["probe_time"] = time.monotonic() - t_probe
        if not ans.get("ok"):
            st["done"] = HostResult(host.name, "failed", (ans.get("error") or {}).get("message", "probe failed"))
            return st["done"]
        st["record"] = ans.get("record")
        st["offset"] = ans["offset"]
        if ans.get("chunk"):
            for ev in parser.feed(ans["chunk"]):
                if ev.phase and ev.phase not in seen["phases"]:
                    seen["phases"].append(ev.phase)
                if ev.progress is not None and ev.progress.percent is not None:
                    m = ev.progress.model
                    seen["progress"][m] = max(seen["progress"].get(m, 0.0), ev.progress.percent)
        if not ans["running"]:
            for ev in parser.flush():
                if ev.phase and ev.phase not in seen["phases"]:
                    seen["phases"].append(ev.phase)
        state = parser.state
        st["last"] = state
        pct = None
        prog = state.draft if state.phase == "draft-weights" else state.target
        if prog is not None and prog.percent is not None:
            pct = prog.percent
        display.update(host.name, state, pct)
        if not ans["running"] and ans.get("stopped"):
            # `provision stop` ended it: a deliberate stop, not a crash
            when = (st["record"] or {}).get("stopped_at")
            at = time.strftime(" at %H:%M:%S", time.localtime(float(when))) if when else ""
            st["done"] = HostResult(host.name, "stopped", f"the server was stopped by `provision stop`{at}; "
                                    "nothing is running on port " + str(prof.port),
                                    data={"phase": state.phase, "log": (st["record"] or {}).get("log")})
            return st["done"]
        if state.crashed is not None or not ans["running"]:
            # Read whatever the dying process wrote last, then report.
            crash = state.crashed
            tail_lines = list(crash.lines) if crash is not None else parser_tail(parser)
            tail = redact("\n".join(tail_lines[-30:]), secrets)
            why = crash.summary if crash is not None else "the server process exited"
            status = ans.get("exit")
            detail = f"{why} (exit status {status})" if status is not None else why
            h = hint(crash, host.name, shipped_classes()) if crash is not None else None
            if h:
                detail += "; hint: " + h
            if crash is not None and crash.kind == "overlay-import" and ans["running"]:
                stop = session.call({"op": "stop", "port": prof.port, "grace": prof.grace}, timeout=prof.grace + 60,
                                    sudo=sudo)
                detail += ("; the server was stopped at once" if stop.get("ok") else
                           f"; stopping the server failed: {(stop.get('error') or {}).get('message')}")
            st["done"] = HostResult(host.name, "crashed", detail, data={
                "log_tail": tail, "phase": state.phase, "log": (st["record"] or {}).get("log"),
                "crash_kind": crash.kind if crash is not None else "exited", "exit_status": status,
                "survivors": ans.get("survivors") or [],
                "phases_seen": list(seen["phases"]), "progress_seen": dict(seen["progress"])})
            return st["done"]
        code = ans.get("health")
        if code == 200 and ans.get("confirm") not in (None, 200):
            st["seen_200"] = True
            code = ans["confirm"]  # 200 then not: count it as the non-200 it turned into
        if code == 200:
            st["ok_in_row"] += 2 if ans.get("confirm") == 200 else 1
            st["seen_200"] = True
            st["errors_open"] = 0
            if st["ok_in_row"] >= opts.ready_checks:
                st["done"] = "ready"
                return st["done"]
        else:
            st["ok_in_row"] = 0
            if st["seen_200"]:
                st["bad_after_200"] += 1
                if st["bad_after_200"] >= 3:
                    st["done"] = HostResult(host.name, "failed",
                                            f"/health is flapping: 200 seen, then {st['bad_after_200']} non-200 "
                                            f"answers (last: {code})", data={"phase": state.phase})
                    return st["done"]
            if ans.get("port_open") and code is None:
                st["errors_open"] += 1
                if st["errors_open"] >= opts.error_cap:
                    st["done"] = HostResult(host.name, "failed", f"port {prof.port} is open but /health did not "
                                            f"answer {st['errors_open']} times in a row", data={"phase": state.phase})
                    return st["done"]
        return None

    def wait(retry_state) -> float:
        if st["seen_200"] and st["ok_in_row"] > 0:
            return 0.3  # confirm readiness quickly
        # The interval is from probe start to probe start, not from the end of one to the next.
        return max(0.05, opts.poll - st.get("probe_time", 0.0))

    try:
        for attempt in Retrying(retry=retry_if_result(lambda r: r is None), wait=wait,
                                stop=stop_after_delay(max(0.0, opts.deadline - (time.monotonic() - t0)))):
            with attempt:
                out = poll()
            if not attempt.retry_state.outcome.failed:
                attempt.retry_state.set_result(out)
    except (ConnectError, UnknownOutcome) as exc:
        if session.cancelled:
            raise
        return lost_result(host, exc, st, opts)
    except RetryError:
        state = st["last"]
        phase = state.phase if state is not None else "starting"
        from provision.output.progress import describe

        last = describe(state) if state is not None else "no log output"
        return HostResult(host.name, "timeout", f"not ready after {opts.deadline:g} s; stuck in {phase} "
                          f"(last seen: {last}); the server is left running: `provision wait` to keep "
                          f"following, `provision stop` to stop it", data={"phase": phase})
    if isinstance(st["done"], HostResult):
        return st["done"]
    rec = st["record"] or {}
    ttr = time.monotonic() - t0
    spec = rec.get("spec_args") or {}
    summary = (f"ready in {ttr:.1f} s: model {rec.get('model')}, port {prof.port}, tp {rec.get('tp')}, "
               f"speculative {spec.get('speculative-algorithm', 'off')}"
               + (f" steps={spec.get('speculative-num-steps')} topk={spec.get('speculative-eagle-topk')} "
                  f"draft_tokens={spec.get('speculative-num-draft-tokens')}" if spec else ""))
    state = st["last"]
    return HostResult(host.name, "ready", summary, data={"time_to_ready": round(ttr, 2), "pid": rec.get("pid"),
                                                         "log": rec.get("log"), "port": prof.port,
                                                         "phases_seen": list(seen["phases"]),
                                                         "progress_seen": dict(seen["progress"])})


def parser_tail(parser) -> list[str]:
    """The last lines of the log, whatever they say (redacted by the parser)."""
    return list(parser.tail(30))


def shipped_classes() -> set[str] | None:
    """Classes a shipped patch spec covers (for the crash hint); None when the playbooks cannot be read."""
    try:
        from provision.config.playbook import shipped_patch_classes

        return shipped_patch_classes()
    except Exception:  # noqa: BLE001 - a hint must never break a launch report
        return None


def follow_secondary(session, host: Host, prof: Profile, multinode: MultiNode, opts: LaunchOptions, display,
                     sudo: bool) -> HostResult:
    """A rank > 0: tasks/multinode.py decides; this gives it the probe and the stop of this rank."""
    st: dict = {}

    def probe():
        try:
            return steady_call(session, {"op": "probe", "port": prof.port, "offset": 0, "max_bytes": 0,
                                         "health_timeout": 1}, timeout=60, sudo=sudo, opts=opts, display=display,
                               host=host, st=st)
        except (ConnectError, UnknownOutcome) as exc:
            if session.cancelled:
                raise
            return lost_result(host, exc, st, opts)

    def stop() -> HostResult:
        display.message(host.name, f"rank 0 of server {host.get('server')} did not come up: stopping this rank")
        try:
            ans: StopAnswer = session.call({"op": "stop", "port": prof.port, "grace": prof.grace},
                                           timeout=prof.grace + 60, sudo=sudo)
        except (ConnectError, UnknownOutcome) as exc:
            if session.cancelled:
                raise
            return HostResult(host.name, "failed", str(exc))
        if not ans.get("ok"):
            return HostResult(host.name, "failed", (ans.get("error") or {}).get("message", "stop failed"))
        if not ans.get("stopped"):
            return HostResult(host.name, "not-running", ans.get("message", "nothing to stop"))
        return HostResult(host.name, "stopped", f"stopped {len(ans.get('pids') or [])} processes in "
                          f"{ans.get('elapsed')} s", data={"pids": ans.get("pids")})

    return _follow_secondary(host, multinode, poll=opts.poll, deadline=opts.deadline, probe=probe, stop=stop)


def candidate_objects(spec) -> list:
    """The delegation specs preflight may find covering the model's class: the one given (--spec or
    the playbook's), then the shipped ones, each name once."""
    from provision.config.playbook import shipped_patch_specs

    out = [spec] if spec is not None and getattr(spec, "kind", "delegate") == "delegate" else []
    try:
        shipped = shipped_patch_specs()
    except Exception:  # noqa: BLE001 - the candidates only widen the check; none is fine
        shipped = []
    return out + [s for s in shipped if all(s.name != x.name for x in out)]


def candidate_specs(spec) -> list:
    return [s.to_engine() for s in candidate_objects(spec)]


def required_specs(spec, prof: Profile) -> list:
    """The specs a launch needs in place: the playbook's own patch spec, then the profile's
    `requires:` (names; loaded when the profile was), each once."""
    from provision.tasks.specs import _load

    out = [spec] if spec is not None else []
    for name in prof.requires:
        s = _load(name)
        if all(x.name != s.name for x in out):
            out.append(s)
    return out


# Seconds a start or stop waits for the host's port lock (held by another launch or stop there).
START_LOCK_WAIT = 60.0


def launch_fn(opts: LaunchOptions, display, multinode: MultiNode | None = None):
    from provision.tasks.patch import do_patch

    def replayed(host: Host, session, sudo: bool, prof: Profile, spec):
        """(profile, spec, persistent) of a restart that replays the running server's record: its
        --arg overrides under this run's, its backend, its fix."""
        from dataclasses import replace

        st: ServerStatusAnswer = session.call({"op": "server_status", "port": prof.port},
                                              timeout=prof.health_timeout + 30, sudo=sudo)
        rec = st.get("record") or {}
        if not rec or rec.get("stopped_at"):
            return prof, spec, opts.persistent
        recorded = rec.get("overrides") or {}
        if recorded:
            prof, spec = resolve(host, replace(opts, overrides={**recorded, **opts.overrides}), multinode)
        if rec.get("fix") == "overlay" and prof.fix != "overlay" and prof.container is None:
            prof = replace(prof, fix="overlay")
        persistent = opts.persistent or rec.get("backend") == "systemd" or bool(rec.get("unit"))
        return prof, spec, persistent

    def fn(host: Host, session, fleet) -> HostResult:
        try:
            res = _launch_one(host, session, fleet)
        except BaseException as exc:
            # an error becomes the host's row in the runner, which hands it (with its sentence) to
            # multinode.host_done; only an interrupt never becomes a row
            if multinode is not None and not isinstance(exc, Exception):
                multinode.finish(host, "failed", "interrupted")
            raise
        if multinode is not None:
            note = multinode.address_note(host)
            if note:
                res.notes.append(note)
        if opts.patched.get(host.name):
            res.data["journal_extra"] = patch_journal(opts.patched[host.name]) + res.data.get("journal_extra", [])
        if multinode is not None:
            multinode.finish(host, res.verdict, res.detail)
        opts.results[host.name] = res
        return res

    if multinode is not None:  # rank 0's verdict also when it is never reached (the runner calls this)
        setattr(fn, "on_host_done", multinode.host_done)  # noqa: B010 - an attribute of the function

    def _launch_one(host: Host, session, fleet) -> HostResult:
        sudo = fleet.uses_sudo(host, session)
        if multinode is not None:  # the default dist-init-addr: rank 0's address as SSH resolves it
            multinode.resolve_addresses(lambda h: getattr(fleet.target(h), "hostname", None))
        prof, spec = resolve(host, opts, multinode)
        persistent = opts.persistent
        if opts.replay:
            prof, spec, persistent = replayed(host, session, sudo, prof, spec)
        t0 = time.monotonic()
        notes: list[str] = []
        opts.stages[host.name] = "preflight"
        wanted = required_specs(spec, prof)
        checked, skipped = wanted, []
        if any(multi.applies_of(s) for s in wanted):
            checked, skipped, _ = multi.applicable(session, host, fleet, wanted, opts.gpu_capability,
                                                   sglang_path=opts.sglang_path, python=opts.python)
        for r in skipped:
            display.message(host.name, f"requires {r.data['spec']}: not applicable ({r.detail})")
        if opts.patch and checked:
            opts.stages[host.name] = "patching"
            rows = do_patch("patch", checked, sglang_path=opts.sglang_path, python=opts.python,
                            decided=True)(host, session, fleet)
            opts.patched[host.name] = rows
            for pres in rows:
                if pres.failed:
                    pres.detail = f"patch {pres.data.get('spec')}: {pres.detail}"
                    return pres
                display.message(host.name, f"patch: {pres.verdict}" + (f" ({pres.data.get('spec')})"
                                                                       if len(rows) > 1 else ""))
            opts.stages[host.name] = "preflight"
        overlay = uses_overlay(prof, opts)
        pull = IMAGE_PULL_TIMEOUT if prof.container is not None else 0.0
        extra = {}
        if overlay:  # the overlay holds a module for each delegation spec that must be in place
            extra["specs"] = [s.to_engine() for s in checked if getattr(s, "kind", "delegate") == "delegate"]
        extra["candidate_specs"] = candidate_specs(spec)

        def preflight() -> PreflightAnswer:
            return session.call(_req("preflight", host, prof, opts, spec=spec.to_engine() if spec else None,
                                     patch_specs=[s.to_engine() for s in checked],
                                     overlay=overlay, import_timeout=OVERLAY_IMPORT_TIMEOUT, pull_timeout=pull,
                                     **extra),
                                timeout=120 + (OVERLAY_IMPORT_TIMEOUT if overlay else 0) + pull, sudo=sudo)

        pre: PreflightAnswer = preflight()
        covering = [c.get("spec") for c in pre.get("checks") or [] if c.get("check") == "eagle3"
                    and c.get("level") == "fail" and c.get("spec")]
        if opts.patch and covering and prof.container is None and pre.get("ok"):
            # launch --patch, and the model's class has a gap a shipped (or --spec) spec covers:
            # apply that spec, then check again
            opts.stages[host.name] = "patching"
            found = [s for s in candidate_objects(spec) if s.name in covering]
            for pres in do_patch("patch", found, sglang_path=opts.sglang_path, python=opts.python,
                                 decided=True)(host, session, fleet):
                if pres.failed:
                    pres.detail = f"patch {pres.data.get('spec')}: {pres.detail}"
                    return pres
                display.message(host.name, f"patch: {pres.verdict} ({pres.data.get('spec')}, which covers the "
                                           "model's class)")
            opts.stages[host.name] = "preflight"
            pre = preflight()
        if not pre.get("ok"):
            return HostResult(host.name, "failed", (pre.get("error") or {}).get("message", "preflight failed"))
        if pre.get("image"):
            img = pre["image"]
            display.message(host.name, f"image {img.get('image')}: SGLang {img.get('version')} inside"
                                       + (" (read from the image just now)" if not img.get("cached") else ""))
        fails = [c for c in pre["checks"] if c["level"] == "fail"]
        for c in pre["checks"]:
            if c["level"] in ("warn", "info") or (c["level"] == "fail" and opts.force) or \
                    (c["level"] == "ok" and c.get("check") == "overlay"):  # what the overlay holds, how checked
                display.message(host.name, f"preflight {c['level']}: {c['message']}")
        if pre.get("survivors") and not opts.restart:
            msg = next((c["message"] for c in fails if c.get("check") == "survivors"),
                       f"processes of the last server's tree are still alive: {pre['survivors']}")
            return HostResult(host.name, "refused", msg + "; nothing was started (--force does not override this)",
                              data={"survivors": pre["survivors"], "checks": pre["checks"]})
        if pre.get("running") and not opts.restart:
            rec = pre.get("record") or {}
            same = rec.get("profile_digest") == prof.digest()
            if not same:
                return HostResult(host.name, "refused", f"a server started by provision with another profile is "
                                  f"running (pid {rec.get('pid')}); use --restart to replace it")
            status: ServerStatusAnswer = session.call({"op": "server_status", "port": prof.port}, timeout=prof.health_timeout + 30,
                                  sudo=sudo)
            if status.get("health") == 200:
                return HostResult(host.name, "running", f"already running and healthy with this profile "
                                  f"(pid {rec.get('pid')}); nothing to do (--restart replaces it)",
                                  data={"pid": rec.get("pid")})
            display.message(host.name, "already starting with this profile: following it")
            return follow(session, host, prof, opts, display, offset=0, sudo=sudo)
        fails = [c for c in fails if c.get("check") != "survivors"]  # --restart stops them first
        if fails and not opts.force:
            for c in fails:  # one line per reason (the row joins them)
                display.message(host.name, f"preflight fail: {c['message']}")
            return HostResult(host.name, "refused", "preflight: " + "; ".join(c["message"] for c in fails)
                              + " (--force to start anyway)", data={"checks": pre["checks"]})
        if multinode is not None and multinode.rank(host) and multinode.rank0_failed(host):
            return HostResult(host.name, "failed", f"not started: {multinode.rank0_failed(host)}")
        opts.stages[host.name] = "starting"
        extra = {"spec": spec.to_engine()} if prof.container is not None and spec is not None else {}
        if spec is not None and "spec" not in extra:
            extra["spec"] = spec.to_engine()
        # A restart runs the new launch's preflight again on the host, under the port's lock, before
        # it touches the running server: it gets what the preflight above got.
        start: StartAnswer = session.call(_req("start", host, prof, opts, secrets=opts.secrets, restart=opts.restart,
                                               persistent=persistent, tree_grace=opts.tree_grace,
                                               overlay_stage=pre.get("overlay"), fix=pre.get("fix"),
                                               patch_specs=[s.to_engine() for s in checked], force=opts.force,
                                               overrides=dict(opts.overrides), lock_wait=START_LOCK_WAIT,
                                               pull_timeout=pull, **extra),
                             timeout=120 + START_LOCK_WAIT + pull + (prof.grace + 120 if opts.restart else 0),
                             sudo=sudo)
        if not start.get("ok"):
            verdict = "refused" if start.get("refused") else "failed"
            return HostResult(host.name, verdict, (start.get("error") or {}).get("message", "start failed"),
                              error_kind=(start.get("error") or {}).get("kind"))
        if start.get("already"):
            rec = start.get("record") or {}
            how = (f"persistent unit {start['adopted']} is in systemd's restart window: following it"
                   if start.get("adopted") else f"another run started a server here first (pid {rec.get('pid')}): "
                                                "following it")
            display.message(host.name, how)
            return follow(session, host, prof, opts, display, offset=int(rec.get("log_offset") or 0), sudo=sudo,
                          overlay_package=overlay_package(rec))
        rec = start["record"]
        opts.stages[host.name] = "started"
        display.message(host.name, f"started pid {rec['pid']} ({rec['mechanism']}), log {rec['log']}"
                        + (f", overlay {rec['overlay']['root']}" if rec.get("overlay") else ""))
        try:
            res = _follow_started(host, session, prof, sudo, t0, rec)
        except (Interrupted, UnknownOutcome):
            if not session.cancelled:
                raise
            res = interrupted_result(host, rec, opts)
        res.notes = notes + res.notes
        if pre.get("image"):
            res.data["image"] = pre["image"]
        replaced = start.get("replaced")
        change = "restarted" if replaced else "started"
        res.data.setdefault("pid", rec["pid"])
        res.data["server_change"] = change
        res.data.setdefault("journal_extra", []).append({
            "command": "launch", "verdict": change,
            "detail": (f"{change} pid {rec['pid']} port {prof.port} profile {prof.name}"
                       + (f" (stopped {len(replaced)} processes of the old one)" if replaced else "")
                       + f"; then {res.verdict}")})
        return res

    def _follow_started(host: Host, session, prof: Profile, sudo: bool, t0: float, rec: dict) -> HostResult:
        if multinode is not None and (multinode.rank(host) or 0) > 0:
            return follow_secondary(session, host, prof, multinode, opts, display, sudo)
        res = follow(session, host, prof, opts, display, offset=0, sudo=sudo, t_start=t0,
                     overlay_package=overlay_package(rec))
        if res.verdict == "ready" and opts.smoke:
            sm: SmokeAnswer = session.call({"op": "smoke", "port": prof.port, "secrets": opts.secrets}, timeout=180, sudo=sudo)
            if sm.get("ok"):
                res.data["smoke"] = sm
                res.notes.append(f"smoke: {sm.get('completion_tokens')} tokens in {sm['elapsed']:.2f} s = "
                                 f"{sm.get('tokens_per_s')} tok/s, accept length {sm.get('spec_accept_length')}, "
                                 f"accept rate {sm.get('spec_accept_rate')}")
            else:
                res.verdict, res.detail = "failed", "smoke: " + sm["error"]["message"]
        return res

    return fn


def interrupted_result(host: Host, rec: dict, opts: LaunchOptions) -> HostResult:
    """Ctrl-C after this host's server was started: say so (it was, and where it stands)."""
    how = ("stopping it (--stop-on-interrupt)" if opts.stop_on_interrupt else
           f"it is left running: `provision wait --host {host.name}` re-attaches, `provision stop --host "
           f"{host.name}` stops it")
    return HostResult(host.name, "interrupted", f"interrupted while following; the server was started (pid "
                      f"{rec.get('pid')}, log {rec.get('log')}) and {how}", error_kind="interrupted",
                      data={"pid": rec.get("pid"), "log": rec.get("log"), "started": True})


def interrupt_report(hosts: list[Host], opts: LaunchOptions) -> list[HostResult]:
    """Every selected host's record after a Ctrl-C, from what launch_fn got to (pure)."""
    out = []
    for h in hosts:
        r = opts.results.get(h.name)
        stage = opts.stages.get(h.name)
        if r is not None:
            out.append(r)
            continue
        if stage == "patching":
            out.append(HostResult(h.name, "unknown", "interrupted while --patch ran: the file is either as before "
                                  f"or patched; `provision status --host {h.name}` says which; no server was started",
                                  error_kind="interrupted"))
        elif stage == "starting":
            out.append(HostResult(h.name, "unknown", "interrupted while the start request ran: whether a server "
                                  f"was started is unknown until `provision status --host {h.name}` looks",
                                  error_kind="interrupted"))
        elif stage == "started":  # the worker did not come back in time to say more
            out.append(HostResult(h.name, "interrupted", "interrupted while following; the server was started "
                                  "and " + ("is being stopped (--stop-on-interrupt)" if opts.stop_on_interrupt
                                            else "is left running (`provision wait` re-attaches)"),
                                  error_kind="interrupted", data={"started": True}))
        else:
            out.append(HostResult(h.name, "interrupted", "interrupted before a server was started there; nothing "
                                  "was started", error_kind="interrupted"))
        if opts.patched.get(h.name):  # --patch edited files before the interrupt
            out[-1].data["journal_extra"] = patch_journal(opts.patched[h.name])
    return out


def wait_fn(opts: LaunchOptions, display):
    def fn(host: Host, session, fleet) -> HostResult:
        sudo = fleet.uses_sudo(host, session)
        prof, _ = resolve(host, opts)
        st: ServerStatusAnswer = session.call({"op": "server_status", "port": prof.port}, timeout=prof.health_timeout + 30, sudo=sudo)
        if not st.get("record"):
            return HostResult(host.name, "failed", f"no server started by provision on port {prof.port}")
        t_start = time.monotonic() - max(0.0, time.time() - st["record"]["started_at"])
        # From the current start-up on: a persistent server systemd restarted has the earlier
        # ones (and their crash) above it in the same log.
        return follow(session, host, prof, opts, display, offset=int(st["record"].get("log_offset") or 0),
                      sudo=sudo, t_start=t_start, overlay_package=overlay_package(st["record"]))

    return fn


def stop_fn(opts: LaunchOptions, grace: float | None = None):
    def fn(host: Host, session, fleet) -> HostResult:
        prof, _ = resolve(host, opts)
        g = prof.grace if grace is None else grace
        ans: StopAnswer = session.call({"op": "stop", "port": prof.port, "grace": g}, timeout=g + 60,
                           sudo=fleet.uses_sudo(host, session))
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
                          f"{ans['elapsed']} s; none left", data={"pids": ans["pids"]})

    return fn


def logs_fn(opts: LaunchOptions, lines: int):
    from provision.logs.redact import redact

    def fn(host: Host, session, fleet) -> HostResult:
        prof, _ = resolve(host, opts)
        ans: LogsAnswer = session.call({"op": "logs", "port": prof.port, "lines": lines}, timeout=60,
                           sudo=fleet.uses_sudo(host, session))
        if not ans.get("ok"):
            return HostResult(host.name, "failed", ans["error"]["message"])
        text = redact(ans["text"], secret_values(opts.secrets))
        return HostResult(host.name, "ok", ans["log"], data={"text": text, "offset": ans["offset"]})

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

