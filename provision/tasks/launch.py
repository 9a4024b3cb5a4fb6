"""`launch` for one host: required and candidate specs, preflight (with --patch), the start, then
the follow (tasks/follow.py); a restart replays the running server's record.

The options are tasks/options.py's, what the run got to per host is tasks/interrupt.py's RunState
(the Ctrl-C report), the multi-node coordinator is tasks/multinode.py, and the verbs on a started
server (wait, stop, logs, status) are tasks/server_verbs.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from provision.config.inventory import Host
from provision.config.profile import Profile
from provision.control.transport.base import Interrupted
from provision.errors import UnknownOutcome
from provision.host import inference
from provision.output.results import HostResult
from provision.tasks import specs as multi
from provision.tasks.follow import follow, follow_secondary
from provision.tasks.interrupt import RunState, interrupted_result, patch_journal
from provision.tasks.multinode import MultiNode
from provision.tasks.options import LaunchOptions, overlay_package, resolve, server_request, uses_overlay

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import PreflightAnswer, ServerStatusAnswer, SmokeAnswer, StartAnswer


# Seconds the host may take to import the overlay module as the server would (where torch imports).
OVERLAY_IMPORT_TIMEOUT = 180.0
# Seconds a container launch's preflight may spend pulling an image the host does not have.
IMAGE_PULL_TIMEOUT = 1800.0

def candidate_objects(spec) -> list:
    """The specs preflight may find covering the model's class (or allow-list): the one given (--playbook
    or the playbook's), then the shipped ones, each name once."""
    from provision.config.playbook import COVERING_KINDS, shipped_patch_specs

    out = [spec] if spec is not None and getattr(spec, "kind", "delegate") in COVERING_KINDS else []
    try:
        shipped = shipped_patch_specs(COVERING_KINDS)
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


def launch_fn(opts: LaunchOptions, display, multinode: MultiNode | None = None, run: RunState | None = None):
    """The per-host launch the runner calls. `run` gets what each host got to (the Ctrl-C report's
    input): the caller creates one per run and keeps it; without one, a fresh one nobody reads."""
    from provision.tasks.patch import do_patch

    state = run if run is not None else RunState()

    def replayed(host: Host, session, sudo: bool, prof: Profile, spec):
        """(profile, spec, persistent, note) of a restart: the running server's record replayed. With
        no --playbook it starts the recorded launch (its argv and environment; this run's --arg over
        it); an explicit --playbook replaces it. Either way its backend and its fix are kept."""
        from dataclasses import replace

        from provision.config.profile import from_record

        st: ServerStatusAnswer = session.call({"op": "server_status", "port": prof.port},
                                              timeout=prof.health_timeout + 30, sudo=sudo)
        rec = st.get("record") or {}
        if not rec or rec.get("stopped_at"):
            return prof, spec, opts.persistent, None
        mine = {k: v for k, v in opts.overrides.items() if k != "port"}  # --server-port finds; it changes nothing
        if multinode is not None:
            mine.update(multinode.args_for(host))
        said = ", ".join(f"{k}={v}" for k, v in mine.items() if k in opts.overrides)
        launch, name = rec.get("launch"), rec.get("profile") or "unnamed"
        note = None
        if opts.profile is not None:
            if rec.get("profile_digest") != prof.digest():
                note = (f"restart: --playbook {opts.profile} replaces the recorded launch (playbook {name}, "
                        f"profile {rec.get('profile_digest')})")
        elif isinstance(launch, dict):
            prof = from_record(launch, name, f"{host.name}: the record of port {prof.port}", mine)
            note = (f"restart: replaying the recorded launch (playbook {name})"
                    + (f", with --arg {said} over it" if said else ""))
        else:  # a record written before records kept the launch: the profile is re-resolved here
            recorded = rec.get("overrides") or {}
            if recorded:
                prof, spec = resolve(host, replace(opts, overrides={**recorded, **opts.overrides}), multinode)
            note = (f"restart: the record of port {prof.port} predates recorded launches; playbook {prof.name} "
                    "was resolved here with its recorded --arg")
        if rec.get("fix") == "overlay" and prof.fix != "overlay" and prof.container is None:
            prof = replace(prof, fix="overlay")
        persistent = opts.persistent or rec.get("backend") == "systemd" or bool(rec.get("unit"))
        return prof, spec, persistent, note

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
        if state.patched.get(host.name):
            res.data["journal_extra"] = patch_journal(state.patched[host.name]) + res.data.get("journal_extra", [])
        if multinode is not None:
            multinode.finish(host, res.verdict, res.detail)
        state.results[host.name] = res
        return res

    if multinode is not None:  # rank 0's verdict also when it is never reached (the runner calls this)
        setattr(fn, "on_host_done", multinode.host_done)  # noqa: B010 - an attribute of the function

    def _launch_one(host: Host, session, fleet) -> HostResult:
        sudo = fleet.uses_sudo(host, session)
        if multinode is not None:  # the default dist-init-addr: rank 0's address as SSH resolves it
            multinode.resolve_addresses(lambda h: getattr(fleet.target(h), "hostname", None))
        prof, spec = resolve(host, opts, multinode)
        persistent = opts.persistent
        notes: list[str] = []
        if opts.restart:
            prof, spec, persistent, note = replayed(host, session, sudo, prof, spec)
            if note:
                display.message(host.name, note)
                notes.append(note)
        t0 = time.monotonic()
        state.stages[host.name] = "preflight"
        other = multi.other_engines_specs(required_specs(spec, prof), prof.engine)  # another engine's files
        for name, why in other.items():
            display.message(host.name, f"spec {name}: not applicable ({why})")
        if spec is not None and spec.name in other:
            spec = None
        wanted = [s for s in required_specs(spec, prof) if s.name not in other]
        checked, skipped = wanted, []
        if any(multi.applies_of(s) for s in wanted):
            checked, skipped, _ = multi.applicable(session, host, fleet, wanted, opts.gpu_capability,
                                                   install_path=opts.install_path, python=opts.python)
        for r in skipped:
            display.message(host.name, f"requires {r.data['spec']}: not applicable ({r.detail})")
        if opts.patch and checked:
            state.stages[host.name] = "patching"
            rows = do_patch("patch", checked, install_path=opts.install_path, python=opts.python,
                            decided=True)(host, session, fleet)
            state.patched[host.name] = rows
            for pres in rows:
                if pres.failed:
                    pres.detail = f"patch {pres.data.get('spec')}: {pres.detail}"
                    return pres
                display.message(host.name, f"patch: {pres.verdict}" + (f" ({pres.data.get('spec')})"
                                                                       if len(rows) > 1 else ""))
            state.stages[host.name] = "preflight"
        overlay = uses_overlay(prof, opts)
        pull = IMAGE_PULL_TIMEOUT if prof.container is not None else 0.0
        extra = {}
        if overlay:  # the overlay holds a module for each spec that must be in place and can be one (the host says)
            extra["specs"] = [s.to_engine() for s in checked]
        extra["candidate_specs"] = candidate_specs(spec)

        def preflight() -> PreflightAnswer:
            return session.call(server_request("preflight", host, prof, opts,
                                               spec=spec.to_engine() if spec else None,
                                               patch_specs=[s.to_engine() for s in checked],
                                               overlay=overlay, import_timeout=OVERLAY_IMPORT_TIMEOUT,
                                               pull_timeout=pull, persistent=persistent, **extra),
                                timeout=120 + (OVERLAY_IMPORT_TIMEOUT if overlay else 0) + pull, sudo=sudo)

        pre: PreflightAnswer = preflight()
        covering = [c.get("spec") for c in pre.get("checks") or [] if c.get("check") == "eagle3"
                    and c.get("level") == "fail" and c.get("spec")]
        if opts.patch and covering and prof.container is None and pre.get("ok"):
            # launch --patch, and the model's class has a gap a shipped (or --playbook) spec covers:
            # apply that spec, then check again
            state.stages[host.name] = "patching"
            found = [s for s in candidate_objects(spec) if s.name in covering]
            for pres in do_patch("patch", found, install_path=opts.install_path, python=opts.python,
                                 decided=True)(host, session, fleet):
                if pres.failed:
                    pres.detail = f"patch {pres.data.get('spec')}: {pres.detail}"
                    return pres
                display.message(host.name, f"patch: {pres.verdict} ({pres.data.get('spec')}, which covers the "
                                           "model's class)")
            state.stages[host.name] = "preflight"
            pre = preflight()
        if not pre.get("ok"):
            return HostResult(host.name, "failed", (pre.get("error") or {}).get("message", "preflight failed"))
        if pre.get("image"):
            img = pre["image"]
            display.message(host.name, f"image {img.get('image')}: {inference.get(prof.engine).title} "
                                       f"{img.get('version')} inside"
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
                running = HostResult(host.name, "running", f"already running and healthy with this profile "
                                     f"(pid {rec.get('pid')}); nothing to do (--restart replaces it)",
                                     data={"pid": rec.get("pid")})
                return _smoke(session, prof, sudo, running, "running")
            display.message(host.name, "already starting with this profile: following it")
            return _smoke(session, prof, sudo, follow(session, host, prof, opts, display, offset=0, sudo=sudo))
        fails = [c for c in fails if c.get("check") != "survivors"]  # --restart stops them first
        if fails and not opts.force:
            for c in fails:  # one line per reason (the row joins them)
                display.message(host.name, f"preflight fail: {c['message']}")
            kept = ""
            if opts.restart and pre.get("running"):  # nothing was stopped: say so, a restart was asked for
                kept = f"; the running server (pid {(pre.get('record') or {}).get('pid')}) was left running"
            return HostResult(host.name, "refused", "preflight: " + "; ".join(c["message"] for c in fails)
                              + kept + " (--force to start anyway)", data={"checks": pre["checks"]})
        if multinode is not None and multinode.rank(host) and multinode.rank0_failed(host):
            return HostResult(host.name, "failed", f"not started: {multinode.rank0_failed(host)}")
        state.stages[host.name] = "starting"
        extra = {"spec": spec.to_engine()} if prof.container is not None and spec is not None else {}
        if spec is not None and "spec" not in extra:
            extra["spec"] = spec.to_engine()
        # A restart runs the new launch's preflight again on the host, under the port's lock, before
        # it touches the running server: it gets what the preflight above got.
        start: StartAnswer = session.call(server_request("start", host, prof, opts, secrets=opts.secrets,
                                                         restart=opts.restart, persistent=persistent,
                                                         tree_grace=opts.tree_grace,
                                                         overlay_stage=pre.get("overlay"), fix=pre.get("fix"),
                                                         patch_specs=[s.to_engine() for s in checked],
                                                         force=opts.force, overrides=dict(opts.overrides),
                                                         launch=prof.to_launch(),
                                                         lock_wait=START_LOCK_WAIT, pull_timeout=pull, **extra),
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
        state.stages[host.name] = "started"
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
        return _smoke(session, prof, sudo, res)

    def _smoke(session, prof: Profile, sudo: bool, res: HostResult, healthy: str = "ready") -> HostResult:
        """--smoke: one short /generate on a healthy server, the one just started or the one found
        running (a smoke asked for is never skipped in silence)."""
        if res.verdict != healthy or not opts.smoke:
            return res
        sm: SmokeAnswer = session.call({"op": "smoke", "port": prof.port, "secrets": opts.secrets}, timeout=180,
                                       sudo=sudo)
        if sm.get("ok"):
            res.data["smoke"] = sm
            res.notes.append(f"smoke: {sm.get('completion_tokens')} tokens in {sm['elapsed']:.2f} s = "
                             f"{sm.get('tokens_per_s')} tok/s, accept length {sm.get('spec_accept_length')}, "
                             f"accept rate {sm.get('spec_accept_rate')}")
        else:
            res.verdict, res.detail = "failed", "smoke: " + sm["error"]["message"]
        return res

    return fn
