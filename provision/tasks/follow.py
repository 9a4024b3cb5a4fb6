"""The follow loop: poll one host's server from the control machine until healthy, dead, or the deadline.

Each poll is one short remote step (new log bytes since the last offset, is the process alive, is
the port open, what does /health answer, asked on the host), with a tenacity polling policy; a
dropped connection is retried on a fresh one for up to --max-outage (`steady_call`). The log goes
through the pure parser (loadlog) for phase, progress and crash. A rank > 0 of a multi-node server
is followed through tasks/multinode.py (`follow_secondary`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tenacity import (RetryError, Retrying, retry_if_exception, retry_if_result, stop_after_delay, wait_exponential,
                      wait_random)

from provision.config.inventory import Host
from provision.config.profile import Profile
from provision.errors import ConnectError, UnknownOutcome
from provision.output.results import HostResult
from provision.tasks.selection import selector
from provision.tasks.multinode import MultiNode, follow_secondary as _follow_secondary
from provision.tasks.options import LaunchOptions, secret_values

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import ProbeAnswer, StopAnswer


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


# After a crash shows in the log, how long the follow waits for the server's exit status before it
# reports without one (SGLang's tree goes down within seconds; a server that lingers is reported anyway).
CRASH_EXIT_WAIT = 15.0


def lost_result(host: Host, exc: BaseException, st: dict, opts: LaunchOptions) -> HostResult:
    since = st.get("outage_since")
    took = time.monotonic() - since if since is not None else 0.0
    return HostResult(host.name, "unknown", f"lost the connection while following and could not get it back for "
                      f"{took:.0f} s (limit --max-outage {opts.max_outage:g} s; last error: {exc}); the server "
                      f"is left running: `provision wait {selector(host.name)}` re-attaches, `provision status "
                      f"{selector(host.name)}` shows it", error_kind="connect", data={"outage_seconds": round(took, 1)})


def follow(session, host: Host, prof: Profile, opts: LaunchOptions, display, *, offset: int = 0,
           sudo: bool = False, t_start: float | None = None, overlay_package: str | None = None) -> HostResult:
    """Poll until healthy, dead, or the deadline. Returns the host's verdict.

    `overlay_package`: the server runs with that overlay; SGLang skipping one of its modules
    (``Ignore import error when loading PKG...``) is a crash of its own, and the server is
    stopped at once instead of loading weights for a class without the methods."""
    return Follow(session, host, prof, opts, display, offset=offset, sudo=sudo, t_start=t_start,
                  overlay_package=overlay_package).run()


class Follow:
    """One follow of one start-up: the probe loop (`run`), each probe read in named steps: the log
    fed to the engine's reader (`_read_log`), a deliberate stop (`_stopped`), a crash (`_crashed`),
    /health counted towards ready (`_health`), and the ready row (`_ready`)."""

    def __init__(self, session, host: Host, prof: Profile, opts: LaunchOptions, display, *, offset: int,
                 sudo: bool, t_start: float | None, overlay_package: str | None) -> None:
        from provision.logs.readers import reader_for

        self.session, self.host, self.prof, self.opts, self.display, self.sudo = session, host, prof, opts, display, sudo
        self.reader = reader_for(prof.engine)
        self.secrets = secret_values(opts.secrets)
        self.parser = self.reader.LoadLog(secrets=self.secrets, overlay_package=overlay_package)
        self.seen: dict = {"phases": [], "progress": {}}
        self.t0 = t_start or time.monotonic()
        self.st: dict = {"offset": offset, "ok_in_row": 0, "errors_open": 0, "seen_200": False, "bad_after_200": 0,
                         "last": None, "done": None, "record": None}

    def run(self) -> HostResult:
        st, opts = self.st, self.opts
        try:
            for attempt in Retrying(retry=retry_if_result(lambda r: r is None), wait=self._wait,
                                    stop=stop_after_delay(max(0.0, opts.deadline - (time.monotonic() - self.t0)))):
                with attempt:
                    out = self.poll()
                if not attempt.retry_state.outcome.failed:
                    attempt.retry_state.set_result(out)
        except (ConnectError, UnknownOutcome) as exc:
            if self.session.cancelled:
                raise
            return lost_result(self.host, exc, st, opts)
        except RetryError:
            return self._timed_out()
        if isinstance(st["done"], HostResult):
            return st["done"]
        return self._ready()

    def _wait(self, retry_state) -> float:
        if self.st["seen_200"] and self.st["ok_in_row"] > 0:
            return 0.3  # confirm readiness quickly
        # The interval is from probe start to probe start, not from the end of one to the next.
        return max(0.05, self.opts.poll - self.st.get("probe_time", 0.0))

    def poll(self):
        """One probe: None to go on, "ready", or the host's row (st["done"] holds it too)."""
        st, prof, opts = self.st, self.prof, self.opts
        t_probe = time.monotonic()
        ans: ProbeAnswer = steady_call(self.session, {
            "op": "probe", "port": prof.port, "offset": st["offset"], "health_timeout": prof.health_timeout,
            "health_url": opts.health_url, "confirm": 0.3 if opts.ready_checks > 1 else 0, "install_path": None},
            timeout=2 * prof.health_timeout + 30, sudo=self.sudo, opts=opts, display=self.display, host=self.host,
            st=st, budget=opts.deadline - (time.monotonic() - self.t0))
        st["probe_time"] = time.monotonic() - t_probe
        if not ans.get("ok"):
            st["done"] = HostResult(self.host.name, "failed", (ans.get("error") or {}).get("message", "probe failed"))
            return st["done"]
        st["record"] = ans.get("record")
        st["offset"] = ans["offset"]
        state = self._read_log(ans)
        if not ans["running"] and ans.get("stopped"):
            st["done"] = self._stopped(state)
            return st["done"]
        prog = state.draft if state.phase == "draft-weights" else state.target
        self.display.update(self.host.name, state, prog.percent if prog is not None else None)
        if (state.crashed is not None and ans["running"] and state.crashed.kind != "overlay-import"
                and time.monotonic() < st.setdefault("crash_seen", time.monotonic()) + CRASH_EXIT_WAIT):
            # the traceback is in the log, the tree is still going down: one more look for its exit
            # status, so the report has both (a loaded machine once reported the traceback alone)
            return None
        if state.crashed is not None or not ans["running"]:
            st["done"] = self._crashed(state, ans)
            return st["done"]
        st["done"] = self._health(ans, state)
        return st["done"]

    def _read_log(self, ans: dict):
        """Feed the new log bytes to the engine's reader; its state (phases and progress kept)."""
        for ev in self.parser.feed(ans["chunk"]) if ans.get("chunk") else ():
            self._saw(ev.phase)
            if ev.progress is not None and ev.progress.percent is not None:
                m = ev.progress.model
                self.seen["progress"][m] = max(self.seen["progress"].get(m, 0.0), ev.progress.percent)
        for ev in self.parser.flush() if not ans["running"] else ():
            self._saw(ev.phase)
        self.st["last"] = self.parser.state
        return self.parser.state

    def _saw(self, phase) -> None:
        if phase and phase not in self.seen["phases"]:
            self.seen["phases"].append(phase)

    def _stopped(self, state) -> HostResult:
        """`provision stop` ended it: a deliberate stop, not a crash, and not a server that serves:
        failed (exit 3), so `provision wait && send-traffic` never goes ahead; the old log's last
        phase (ready, from before the stop) is never shown as this server's."""
        when = (self.st["record"] or {}).get("stopped_at")
        at = time.strftime(" at %H:%M:%S", time.localtime(float(when))) if when else ""
        return HostResult(self.host.name, "failed", f"the server was stopped by `provision stop`{at}; nothing is "
                          f"running on port {self.prof.port}: `provision launch` starts it", error_kind="stopped",
                          data={"phase": state.phase, "log": (self.st["record"] or {}).get("log")})

    def _crashed(self, state, ans: dict) -> HostResult:
        """The server died (or its log says it will): what the dying process wrote last, the
        engine's hint, and an overlay that did not import stops the server at once."""
        from provision.logs.redact import redact

        crash, prof = state.crashed, self.prof
        tail_lines = list(crash.lines) if crash is not None else parser_tail(self.parser)
        tail = redact("\n".join(tail_lines[-30:]), self.secrets)
        why = crash.summary if crash is not None else "the server process exited"
        status = ans.get("exit")
        detail = f"{why} (exit status {status})" if status is not None else why
        h = self.reader.hint(crash, selector(self.host.name), shipped_classes(prof.engine)) if crash is not None else None
        if h:
            detail += "; hint: " + h
        if crash is not None and crash.kind == "overlay-import" and ans["running"]:
            stop = self.session.call({"op": "stop", "port": prof.port, "grace": prof.grace},
                                     timeout=prof.grace + 60, sudo=self.sudo)
            detail += ("; the server was stopped at once" if stop.get("ok") else
                       f"; stopping the server failed: {(stop.get('error') or {}).get('message')}")
        return HostResult(self.host.name, "crashed", detail, data={
            "log_tail": tail, "phase": state.phase, "log": (self.st["record"] or {}).get("log"),
            "crash_kind": crash.kind if crash is not None else "exited", "exit_status": status,
            "survivors": ans.get("survivors") or [],
            "phases_seen": list(self.seen["phases"]), "progress_seen": dict(self.seen["progress"])})

    def _health(self, ans: dict, state):
        """/health counted: "ready" after --ready-checks 200s in a row, a row for a flapping or
        silent server, None to go on."""
        st, opts = self.st, self.opts
        code = ans.get("health")
        if code == 200 and ans.get("confirm") not in (None, 200):
            st["seen_200"] = True
            code = ans["confirm"]  # 200 then not: count it as the non-200 it turned into
        if code == 200:
            st["ok_in_row"] += 2 if ans.get("confirm") == 200 else 1
            st["seen_200"] = True
            st["errors_open"] = 0
            return "ready" if st["ok_in_row"] >= opts.ready_checks else None
        st["ok_in_row"] = 0
        if st["seen_200"]:
            st["bad_after_200"] += 1
            if st["bad_after_200"] >= 3:
                return HostResult(self.host.name, "failed", f"/health is flapping: 200 seen, then "
                                  f"{st['bad_after_200']} non-200 answers (last: {code})", data={"phase": state.phase})
        if ans.get("port_open") and code is None:
            st["errors_open"] += 1
            if st["errors_open"] >= opts.error_cap:
                return HostResult(self.host.name, "failed", f"port {self.prof.port} is open but /health did not "
                                  f"answer {st['errors_open']} times in a row", data={"phase": state.phase})
        return None

    def _timed_out(self) -> HostResult:
        from provision.output.progress import describe

        state = self.st["last"]
        phase = state.phase if state is not None else "starting"
        last = describe(state) if state is not None else "no log output"
        return HostResult(self.host.name, "timeout", f"not ready after {self.opts.deadline:g} s; stuck in {phase} "
                          f"(last seen: {last}); the server is left running: `provision wait` to keep "
                          f"following, `provision stop` to stop it", data={"phase": phase})

    def _ready(self) -> HostResult:
        rec = self.st["record"] or {}
        ttr = time.monotonic() - self.t0
        summary = (f"ready in {ttr:.1f} s: model {rec.get('model')}, port {self.prof.port}, tp {rec.get('tp')}, "
                   f"speculative {speculative_words(rec.get('spec_args') or {})}")
        return HostResult(self.host.name, "ready", summary, data={
            "time_to_ready": round(ttr, 2), "pid": rec.get("pid"), "log": rec.get("log"), "port": self.prof.port,
            "phases_seen": list(self.seen["phases"]), "progress_seen": dict(self.seen["progress"])})


def speculative_words(spec_args: dict) -> str:
    """The ready line's speculative settings: `EAGLE3 steps=3 topk=1 draft_tokens=4` (vLLM's
    speculative-config mapping read the same way), or `off` for a baseline server (pure)."""
    from provision.output.benchfigures import spec_settings_of_args

    spec = {k: v for k, v in spec_args.items() if v is not None}
    conf = spec_settings_of_args(spec)  # vLLM's one speculative-config mapping
    if conf:
        spec = {"speculative-algorithm": conf["speculative_algorithm"],
                "speculative-num-draft-tokens": conf.get("speculative_num_draft_tokens")}
        spec = {k: v for k, v in spec.items() if v is not None}
    algorithm = spec.get("speculative-algorithm")
    knobs = " ".join(f"{name}={spec[key]}" for name, key in (("steps", "speculative-num-steps"),
                                                            ("topk", "speculative-eagle-topk"),
                                                            ("draft_tokens", "speculative-num-draft-tokens"))
                     if key in spec)
    # a baseline server (launched without --speculative-*) reads "speculative off", never "None ... =None"
    return (algorithm or "off") + (f" {knobs}" if algorithm and knobs else "")


def parser_tail(parser) -> list[str]:
    """The last lines of the log, whatever they say (redacted by the parser)."""
    return list(parser.tail(30))


def shipped_classes(engine: str) -> dict | None:
    """{class: [(spec name, kind)]} the shipped specs of the engine's files fix (for the crash hint;
    its keys are the classes covered); None when the playbooks cannot be read."""
    try:
        from provision.config.playbook import shipped_fixes
        from provision.host import inference

        return shipped_fixes(inference.get(engine).package)
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
