"""`launch` for one host: required and candidate specs, preflight (with --patch), the start, then
the follow (tasks/follow.py); a restart replays the running server's record.

The options are tasks/options.py's, what the run got to per host is tasks/interrupt.py's RunState
(the Ctrl-C report), the multi-node coordinator is tasks/multinode.py, and the verbs on a started
server (wait, stop, logs, status) are tasks/server_verbs.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from provision.config.inventory import Host
from provision.config.profile import Profile
from provision.control.transport.base import Interrupted
from provision.errors import ConfigError, UnknownOutcome
from provision.host import inference
from provision.output.results import HostResult
from provision.tasks import specs as multi
from provision.tasks.follow import follow, follow_secondary
from provision.control.router import RouterError
from provision.tasks import routing
from provision.tasks.interrupt import RunState, interrupted_result, patch_journal, router_out_words
from provision.tasks.multinode import MultiNode
from provision.tasks.options import (LaunchOptions, engine_secrets, overlay_package, resolve, server_request,
                                    uses_overlay)

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

    kinds = COVERING_KINDS + ("replace",)  # (replace: a proposer's read of the class, preflight_model.proposer_rows)
    out = [spec] if spec is not None and getattr(spec, "kind", "delegate") in kinds else []
    try:
        shipped = shipped_patch_specs(kinds)
    except Exception:  # noqa: BLE001 - the candidates only widen the check; none is fine
        shipped = []
    return out + [s for s in shipped if all(s.name != x.name for x in out)]


def candidate_specs(spec) -> list:
    return [s.to_engine() for s in candidate_objects(spec)]


def recorded_launch(prof: Profile, spec) -> dict:
    """What a server's record keeps of its launch: the profile as a playbook's `launch:`, and its
    playbook's own patch spec by name, so a restart with no --playbook puts the same fix in place
    (a server started with `--playbook` alone, no inventory `profile:`)."""
    out = prof.to_launch()
    if spec is not None:
        out["spec"] = spec.name
    return out


def recorded_spec(launch: dict, spec):
    """(the spec a replayed launch carries, a note or ""): the recorded one (by name) over the
    inventory's; a record without one (written before records kept it), the inventory's."""
    from provision.config.playbook import load_patch_spec

    name = launch.get("spec")
    if not name or (spec is not None and spec.name == name):
        return spec, ""
    try:
        return load_patch_spec(str(name)), ""
    except ConfigError:
        kept = f"the inventory's {spec.name}" if spec is not None else "none"
        return spec, f"its spec {name} is not a playbook found on this machine: {kept} is used"


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


# What preflight answers for a host without the profile's engine (or its pinned path): a refusal,
# as any failed check, never a failure of the run (docs/preflight.md).
NO_INSTALL = ("not-found", "pinned-missing")

# Seconds a start or stop waits for the host's port lock (held by another launch or stop there).
START_LOCK_WAIT = 60.0


@dataclass
class HostPlan:
    """What `select` resolved for one host, passed from stage to stage: its profile and spec (a
    restart's from the record), the specs to check and patch, and the start's options."""
    host: Host
    session: Any
    fleet: Any
    sudo: bool
    prof: Profile
    spec: Any
    persistent: bool
    notes: list = field(default_factory=list)
    checked: list = field(default_factory=list)  # the required specs that apply here
    overlay: bool = False
    pull: float = 0.0
    t0: float = 0.0
    place: Any = None   # the router in front (tasks/routing.py Place), or None
    steps: Any = None   # ... and the timeline since the server was taken out of it (routing.Steps)


def launch_fn(opts: LaunchOptions, display, multinode: MultiNode | None = None, run: RunState | None = None):
    """The per-host launch the runner calls. `run` gets what each host got to (the Ctrl-C report's
    input): the caller creates one per run and keeps it; without one, a fresh one nobody reads."""
    launch = Launch(opts, display, multinode, run if run is not None else RunState())

    def fn(host: Host, session, fleet) -> HostResult:
        return launch.host(host, session, fleet)

    if multinode is not None:  # rank 0's verdict also when it is never reached (the runner calls this)
        setattr(fn, "on_host_done", multinode.host_done)  # noqa: B010 - an attribute of the function
    return fn


class Launch:
    """One launch run, host by host, in named stages: `select` (the profile, a restart's record
    replayed, the specs that apply), `patch` (--patch's edits), `preflight` (with the covering spec
    patched on --patch), `admit` (what preflight refuses, a server already running), `start`,
    `follow`, and `report` (the journal's lines); `ask_preflight` alone is `upgrade`'s judge. Each
    stage returns its values, or the host's row where the launch ends there."""

    def __init__(self, opts: LaunchOptions, display, multinode: MultiNode | None, state: RunState) -> None:
        self.opts, self.display, self.multinode, self.state = opts, display, multinode, state

    def host(self, host: Host, session, fleet) -> HostResult:
        multinode, state = self.multinode, self.state
        try:
            res = self.one(host, session, fleet)
        except BaseException as exc:
            # an error becomes the host's row in the runner, which hands it (with its sentence) to
            # multinode.host_done; only an interrupt never becomes a row
            if multinode is not None and not isinstance(exc, Exception):
                multinode.finish(host, "failed", "interrupted")
            raise
        if multinode is not None:
            note = multinode.address_note(host, resolve(host, self.opts)[0].engine)
            if note:
                res.notes.append(note)
        if state.patched.get(host.name):
            res.data["journal_extra"] = patch_journal(state.patched[host.name]) + res.data.get("journal_extra", [])
        if multinode is not None:
            multinode.finish(host, res.verdict, res.detail)
        state.results[host.name] = res
        return res

    def one(self, host: Host, session, fleet) -> HostResult:
        plan = self.select(host, session, fleet)
        self.state.stages[host.name] = "preflight"
        failed = (self.patch(plan, plan.checked, "") if self.opts.patch and plan.checked and not self.opts.check
                  else None)
        if failed is not None:
            return failed
        pre = self.preflight(plan)
        if isinstance(pre, HostResult):
            return pre
        row = self.admit(plan, pre)
        if row is not None:
            return row
        if self.opts.check:
            return self.planned(plan, pre)
        return self.start(plan, pre)

    # -- select ------------------------------------------------------------------------------------
    def select(self, host: Host, session, fleet) -> HostPlan:
        """The host's profile and spec (a restart: the running server's record replayed), and the
        required specs that apply to its install."""
        opts, display, multinode = self.opts, self.display, self.multinode
        sudo = fleet.uses_sudo(host, session)
        if multinode is not None:  # the default dist-init-addr: rank 0's address as SSH resolves it
            multinode.resolve_addresses(lambda h: getattr(fleet.target(h), "hostname", None))
        prof, spec = resolve(host, opts, multinode)
        plan = HostPlan(host, session, fleet, sudo, prof, spec, opts.persistent)
        if opts.restart:
            plan.prof, plan.spec, plan.persistent, note = self.replayed(plan)
            if note:
                display.message(host.name, note)
                plan.notes.append(note)
        plan.t0 = time.monotonic()
        other = multi.other_engines_specs(required_specs(plan.spec, plan.prof), plan.prof.engine)  # another engine's
        for name, why in other.items():
            display.message(host.name, f"spec {name}: not applicable ({why})")
        if plan.spec is not None and plan.spec.name in other:
            plan.spec = None
        wanted = [s for s in required_specs(plan.spec, plan.prof) if s.name not in other]
        plan.checked, skipped = wanted, []
        if any(multi.applies_of(s) for s in wanted):
            plan.checked, skipped, _ = multi.applicable(session, host, fleet, wanted, opts.gpu_capability,
                                                        install_path=opts.install_path, python=opts.python)
        for r in skipped:
            display.message(host.name, f"requires {r.data['spec']}: not applicable ({r.detail})")
        plan.overlay = uses_overlay(plan.prof, opts)
        plan.pull = IMAGE_PULL_TIMEOUT if plan.prof.container is not None else 0.0
        return plan

    def replayed(self, plan: HostPlan):
        """(profile, spec, persistent, note) of a restart: the running server's record replayed. With
        no --playbook it starts the recorded launch (its argv and environment; this run's --arg over
        it); an explicit --playbook replaces it. Either way its backend and its fix are kept."""
        from dataclasses import replace

        from provision.config.profile import from_record

        opts, host, prof, spec = self.opts, plan.host, plan.prof, plan.spec
        st: ServerStatusAnswer = plan.session.call({"op": "server_status", "port": prof.port},
                                                   timeout=prof.health_timeout + 30, sudo=plan.sudo)
        rec = st.get("record") or {}
        if not rec or rec.get("stopped_at"):
            return prof, spec, opts.persistent, None
        bad = ""
        good = st.get("good")
        if good and not st.get("running") and opts.profile is None and isinstance(good.get("launch"), dict):
            # the record's server never answered ready (a forced start past a refused flag, dead at
            # once): the last launch that did is what the restart replays
            mine_said = ", ".join(f"{k}={v}" for k, v in (rec.get("overrides") or {}).items() if k != "port")
            bad = (f"the last launch (pid {rec.get('pid')}" + (f", --arg {mine_said}" if mine_said else "")
                   + f") never answered ready: its record is not replayed; ")
            rec = dict(rec, **{k: good.get(k) for k in ("launch", "overrides", "profile", "profile_digest", "fix")})
        mine = {k: v for k, v in opts.overrides.items() if k != "port"}  # --server-port finds; it changes nothing
        if self.multinode is not None:
            mine.update(self.multinode.args_for(host, prof.engine))
        said = ", ".join(f"{k}={v}" for k, v in mine.items() if k in opts.overrides)
        launch, name = rec.get("launch"), rec.get("profile") or "unnamed"
        note = None
        if opts.profile is not None:
            if rec.get("profile_digest") != prof.digest():
                note = (f"restart: --playbook {opts.profile} replaces the recorded launch (playbook {name}, "
                        f"profile {rec.get('profile_digest')})")
        elif isinstance(launch, dict):
            prof = from_record(launch, name, f"{host.name}: the record of port {prof.port}", mine)
            kept = {k: v for k, v in (rec.get("overrides") or {}).items() if k != "port" and k not in mine}
            note = (f"restart: {bad}replaying the {'last good' if bad else 'recorded'} launch (playbook {name}"
                    + (f"; its --arg {', '.join(f'{k}={v}' for k, v in kept.items())}" if kept else "") + ")"
                    + (f", with --arg {said} over it" if said else ""))
            spec, why = recorded_spec(launch, spec)
            if why:
                note += f"; {why}"
        else:  # a record written before records kept the launch: the profile is re-resolved here
            recorded = rec.get("overrides") or {}
            if recorded:
                prof, spec = resolve(host, replace(opts, overrides={**recorded, **opts.overrides}), self.multinode)
            note = (f"restart: the record of port {prof.port} predates recorded launches; playbook {prof.name} "
                    "was resolved here with its recorded --arg")
        if opts.python and prof.python != opts.python:  # this run's interpreter over the recorded one (upgrade)
            prof = replace(prof, python=opts.python)
        if opts.image and prof.container is not None and prof.container.image != opts.image:  # upgrade --image
            prof = replace(prof, container=replace(prof.container, image=opts.image))
        if rec.get("fix") == "overlay" and prof.fix != "overlay" and prof.container is None:
            prof = replace(prof, fix="overlay")
        persistent = opts.persistent or rec.get("backend") == "systemd" or bool(rec.get("unit"))
        return prof, spec, persistent, note

    # -- patch -------------------------------------------------------------------------------------
    def patch(self, plan: HostPlan, specs: list, why: str) -> HostResult | None:
        """--patch: put `specs` in place, each row said (`why`: what made it wanted); the first failed
        row ends the launch (returned), else None."""
        from provision.tasks.patch import do_patch

        name = plan.host.name
        self.state.stages[name] = "patching"
        rows = do_patch("patch", specs, install_path=self.opts.install_path, python=self.opts.python,
                        decided=True)(plan.host, plan.session, plan.fleet)
        self.state.patched[name] = self.state.patched.get(name, []) + list(rows)
        for pres in rows:
            if pres.failed:
                pres.detail = f"patch {pres.data.get('spec')}: {pres.detail}"
                return pres
            said = f"{pres.data.get('spec')}{why}" if why or len(rows) > 1 else ""
            self.display.message(name, f"patch: {pres.verdict}" + (f" ({said})" if said else ""))
        self.state.stages[name] = "preflight"
        return None

    # -- preflight ---------------------------------------------------------------------------------
    def preflight(self, plan: HostPlan) -> "PreflightAnswer | HostResult":
        """The host's preflight; with --patch, a gap of the model's class that a shipped (or
        --playbook) spec covers is patched and preflight runs again. The answer, or the failed row."""
        pre = self.ask_preflight(plan)
        covering = [c.get("spec") for c in pre.get("checks") or [] if c.get("check") == "eagle3"
                    and c.get("level") == "fail" and c.get("spec")]
        if self.opts.patch and covering and plan.prof.container is None and pre.get("ok") and not self.opts.check:
            found = [s for s in candidate_objects(plan.spec) if s.name in covering]
            failed = self.patch(plan, found, ", which covers the model's class")
            if failed is not None:
                return failed
            pre = self.ask_preflight(plan)
        if not pre.get("ok"):
            err = pre.get("error") or {}
            if self.opts.check and err.get("kind") == "not-pulled" and plan.prof.container is not None:
                return HostResult(plan.host.name, "started",
                                  f"would pull image {plan.prof.container.image} first (not on this host; --check "
                                  "pulled nothing): preflight reads the image's install once it is there; would run "
                                  "in its container", notes=list(plan.notes),
                                  data={"port": plan.prof.port, "engine": plan.prof.engine, "playbook": plan.prof.name,
                                        "pull": plan.prof.container.image})
            if err.get("kind") in NO_INSTALL:  # preflight's answer, as any check it fails: nothing was started
                return HostResult(plan.host.name, "refused", f"preflight: {err.get('message')}; nothing was started",
                                  error_kind=err.get("kind"))
            return HostResult(plan.host.name, "failed", err.get("message", "preflight failed"))
        if pre.get("image"):
            img = pre["image"]
            self.display.message(plan.host.name, f"image {img.get('image')}: {inference.get(plan.prof.engine).title} "
                                                 f"{img.get('version')} inside"
                                                 + (" (read from the image just now)" if not img.get("cached") else ""))
        for c in pre["checks"]:
            if c["level"] in ("warn", "info") or (c["level"] == "fail" and self.opts.force) or \
                    (c["level"] == "ok" and c.get("check") == "overlay"):  # what the overlay holds, how checked
                self.display.message(plan.host.name, f"preflight {c['level']}: {c['message']}")
        return pre

    def ask_preflight(self, plan: HostPlan) -> "PreflightAnswer":
        """The host's preflight answer as it is, nothing shown, nothing patched: the stage `preflight`
        reads, and `upgrade` judges a new install with (its interpreter in the options)."""
        extra: dict = {"candidate_specs": candidate_specs(plan.spec)}
        if plan.overlay:  # the overlay holds a module for each spec that must be in place and can be one (the host says)
            extra["specs"] = [s.to_engine() for s in plan.checked]
        return plan.session.call(
            server_request("preflight", plan.host, plan.prof, self.opts,
                           spec=plan.spec.to_engine() if plan.spec else None,
                           patch_specs=[s.to_engine() for s in plan.checked], overlay=plan.overlay,
                           import_timeout=OVERLAY_IMPORT_TIMEOUT, pull_timeout=plan.pull,
                           no_pull=self.opts.no_pull or self.opts.check,  # --check pulls no image
                           persistent=plan.persistent, **extra),
            timeout=120 + (OVERLAY_IMPORT_TIMEOUT if plan.overlay else 0) + plan.pull, sudo=plan.sudo)

    # -- admit -------------------------------------------------------------------------------------
    def admit(self, plan: HostPlan, pre: "PreflightAnswer") -> HostResult | None:
        """What preflight's answer refuses (survivors, another profile running, failed checks without
        --force, rank 0 down), or a server already running with this profile (followed, or said
        healthy); None: go on and start."""
        opts, name = self.opts, plan.host.name
        fails = [c for c in pre["checks"] if c["level"] == "fail"]
        if pre.get("survivors") and not opts.restart:
            msg = next((c["message"] for c in fails if c.get("check") == "survivors"),
                       f"processes of the last server's tree are still alive: {pre['survivors']}")
            return HostResult(name, "refused", msg + "; nothing was started (--force does not override this)",
                              data={"survivors": pre["survivors"], "checks": pre["checks"]})
        if pre.get("running") and not opts.restart:
            return self._running(plan, pre.get("record") or {})
        fails = [c for c in fails if c.get("check") != "survivors"]  # --restart stops them first
        if opts.check and opts.patch:  # --patch would put these in place first: the plan says so
            fixable = {s.name for s in candidate_objects(plan.spec)} | {s.name for s in plan.checked}
            patched = sorted({str(c["spec"]) for c in fails if c.get("check") in ("patch", "eagle3")
                              and c.get("spec") in fixable})
            if patched:
                plan.notes.append(f"would patch {', '.join(patched)} first (--patch)")
                fails = [c for c in fails if c.get("spec") not in patched or c.get("check") not in ("patch", "eagle3")]
        if fails and not opts.force:
            for c in fails:  # one line per reason (the row joins them)
                self.display.message(name, f"preflight fail: {c['message']}")
            kept = ""
            if opts.restart and pre.get("running"):  # nothing was stopped: say so, a restart was asked for
                kept = f"; the running server (pid {(pre.get('record') or {}).get('pid')}) was left running"
            return HostResult(name, "refused", "preflight: " + "; ".join(c["message"] for c in fails)
                              + kept + " (--force to start anyway)", data={"checks": pre["checks"]})
        if self.multinode is not None and self.multinode.rank(plan.host) and self.multinode.rank0_failed(plan.host):
            return HostResult(name, "failed", f"not started: {self.multinode.rank0_failed(plan.host)}")
        return None

    def _running(self, plan: HostPlan, rec: dict) -> HostResult:
        """A server provision started is running here and no --restart was asked: another profile's is
        refused; this profile's is said healthy, or followed while it starts."""
        name, prof = plan.host.name, plan.prof
        if rec.get("profile_digest") != prof.digest():
            return HostResult(name, "refused", f"a server started by provision with another profile is "
                              f"running (pid {rec.get('pid')}); use --restart to replace it")
        if self.opts.check:  # nothing asked of it: no probe, no router, no smoke
            return HostResult(name, "running", f"a server with this profile runs (pid {rec.get('pid')}, port "
                              f"{prof.port}): nothing would be started (--restart replaces it)",
                              data={"pid": rec.get("pid")})
        status: ServerStatusAnswer = plan.session.call({"op": "server_status", "port": prof.port},
                                                       timeout=prof.health_timeout + 30, sudo=plan.sudo)
        if status.get("health") == 200:
            running = HostResult(name, "running", f"already running and healthy with this profile "
                                 f"(pid {rec.get('pid')}); nothing to do (--restart replaces it)",
                                 data={"pid": rec.get("pid")})
            return self.router_in(plan, self.smoke(plan, running, "running"), "running")
        self.display.message(name, "already starting with this profile: following it")
        return self.router_in(plan, self.smoke(plan, follow(plan.session, plan.host, prof, self.opts, self.display,
                                                            offset=0, sudo=plan.sudo)))

    # -- check -------------------------------------------------------------------------------------
    def planned(self, plan: HostPlan, pre: "PreflightAnswer") -> HostResult:
        """launch --check: the row a start would be ("would-start", "would-restart"), with the exact
        command line the host would run (preflight's, the one function the start uses), what it
        would stop first and the router it would take it out of; nothing is changed."""
        import shlex

        opts, name, prof = self.opts, plan.host.name, plan.prof
        argv = list(pre.get("argv") or [])
        if argv and engine_secrets(opts.secrets, prof.engine).get("args"):
            argv += [inference.get(prof.engine).config_flag, str(pre.get("config_file"))]
        rec = pre.get("record") or {}
        restart = bool(opts.restart and pre.get("running"))
        words = []
        if restart:
            words.append(f"would stop pid {rec.get('pid')} (playbook {rec.get('profile') or 'unnamed'}) first: "
                         f"SIGTERM drains it for up to {prof.grace:g} s")
            place = routing.place_of(plan.host, prof.port, opts.router, plan.fleet)
            if place is not None:
                words.append(f"{place.worker} taken out of {place.said} before, put back once ready")
        where = f"in container {prof.container.image}" if prof.container is not None else f"port {prof.port}"
        words.append(f"would run ({where}): " + (shlex.join(argv) if argv else "the container's command"))
        return HostResult(name, "restarted" if restart else "started", "; ".join(words),
                          notes=list(plan.notes),
                          data={"argv": argv, "port": prof.port, "engine": prof.engine, "playbook": prof.name,
                                "stops": rec.get("pid") if restart else None, "fix": pre.get("fix")})

    # -- start -------------------------------------------------------------------------------------
    def start(self, plan: HostPlan, pre: "PreflightAnswer") -> HostResult:
        """The start (a restart: the host's one transaction, ops/server_transaction.py), then the
        follow and the report."""
        opts, name, prof = self.opts, plan.host.name, plan.prof
        refused = self.router_out(plan, pre)
        if refused is not None:
            return refused
        self.state.stages[name] = "starting"
        extra = {"spec": plan.spec.to_engine()} if plan.spec is not None else {}
        t_call = time.monotonic()
        # A restart runs the new launch's preflight again on the host, under the port's lock, before
        # it touches the running server: it gets what the preflight above got.
        start: StartAnswer = plan.session.call(server_request(
            "start", plan.host, prof, opts, secrets=engine_secrets(opts.secrets, prof.engine), restart=opts.restart,
            persistent=plan.persistent,
            tree_grace=opts.tree_grace, overlay_stage=pre.get("overlay"), fix=pre.get("fix"),
            patch_specs=[s.to_engine() for s in plan.checked], force=opts.force, overrides=dict(opts.overrides),
            launch=recorded_launch(prof, plan.spec), lock_wait=START_LOCK_WAIT, pull_timeout=plan.pull, **extra),
            timeout=120 + START_LOCK_WAIT + plan.pull + (prof.grace + 120 if opts.restart else 0), sudo=plan.sudo)
        if not start.get("ok"):
            verdict = "refused" if start.get("refused") else "failed"
            return self.router_in(plan, HostResult(name, verdict, (start.get("error") or {}).get("message", "start failed"),
                                                   error_kind=(start.get("error") or {}).get("kind")))
        if start.get("already"):
            rec = start.get("record") or {}
            how = (f"persistent unit {start['adopted']} is in systemd's restart window: following it"
                   if start.get("adopted") else f"another run started a server here first (pid {rec.get('pid')}): "
                                                "following it")
            self.display.message(name, how)
            return self.router_in(plan, follow(plan.session, plan.host, prof, opts, self.display,
                                               offset=int(rec.get("log_offset") or 0), sudo=plan.sudo,
                                               overlay_package=overlay_package(rec)))
        rec = start["record"]
        self.state.started[name] = {"pid": rec.get("pid"), "log": rec.get("log"),
                                    "change": "restarted" if start.get("replaced") else "started"}
        self.state.stages[name] = "started"
        if plan.steps is not None:
            if start.get("old_stop"):
                routing.stop_steps(plan.steps, start["old_stop"], t_call + float(start["old_stop"].get("began") or 0))
            plan.steps.add("started", f"pid {rec['pid']}")
        self.display.message(name, f"started pid {rec['pid']} ({rec['mechanism']}), log {rec['log']}"
                             + (f", overlay {rec['overlay']['root']}" if rec.get("overlay") else ""))
        try:
            res = self.follow(plan, rec)
        except (Interrupted, UnknownOutcome):
            if not plan.session.cancelled:
                raise
            res = interrupted_result(plan.host, rec, opts)
            if name in self.state.router_out:
                res.detail += router_out_words(name, self.state.router_out[name])
            return self.report(plan, pre, start, res)
        return self.report(plan, pre, start, self.router_in(plan, res))

    # -- the router --------------------------------------------------------------------------------
    def router_out(self, plan: HostPlan, pre: "PreflightAnswer") -> HostResult | None:
        """A running server behind a router, about to be replaced: take it out of the router first and
        wait until the router no longer lists it (the timeline starts here). The router not answering:
        refused, the server left running (--force: restart it without the router)."""
        name = plan.host.name
        plan.place = routing.place_of(plan.host, plan.prof.port, self.opts.router, plan.fleet)
        if plan.place is None or not (self.opts.restart and pre.get("running")):
            return None
        plan.steps = routing.Steps()
        try:
            said = routing.take_out(plan.place, plan.steps)
        except RouterError as exc:
            pid = (pre.get("record") or {}).get("pid")
            if not self.opts.force:
                return HostResult(name, "refused", f"{exc}: the running server (pid {pid}) was not stopped and "
                                  "stays in the router (--force restarts it without the router)", error_kind="router")
            plan.place = plan.steps = None
            plan.notes.append(f"{exc}: restarted without the router (--force)")
            return None
        self.state.router_out[name] = plan.place.said
        self.display.message(name, said)
        return None

    def router_in(self, plan: HostPlan, res: HostResult, healthy: str = "ready") -> HostResult:
        """The server behind a router after the start: ready, it is warmed and put (back) in, waiting
        until the router lists it healthy; otherwise, taken out for this restart, it stays out and the
        row says so. The timeline goes to the journal (`router` lines) and the row's data."""
        name, place, steps = plan.host.name, plan.place, plan.steps
        if place is None:
            place = plan.place = routing.place_of(plan.host, plan.prof.port, self.opts.router, plan.fleet)
        if place is None:
            return res
        if res.verdict != healthy:
            if steps is not None:  # taken out for this restart: it stays out
                steps.add("left-out", f"the server did not come back ({res.verdict})")
                res.detail += f"; left out of {place.said}: the server did not come back"
                routing.record(res, place, steps, False)
            return res
        if steps is None:
            if healthy == "running" and routing.listed_words(place)[1]:
                return res  # already in: nothing to do
            steps = plan.steps = routing.Steps()
        else:
            steps.add("ready", "answers ready")
        ok, words = routing.back_in(res, place, plan.session, plan.prof.port, self.opts.secrets, plan.sudo, steps)
        self.display.message(name, words)
        if ok:
            self.state.router_out.pop(name, None)
        return res

    # -- follow ------------------------------------------------------------------------------------
    def follow(self, plan: HostPlan, rec: dict) -> HostResult:
        if self.multinode is not None and (self.multinode.rank(plan.host) or 0) > 0:
            return follow_secondary(plan.session, plan.host, plan.prof, self.multinode, self.opts, self.display,
                                    plan.sudo)
        res = follow(plan.session, plan.host, plan.prof, self.opts, self.display, offset=0, sudo=plan.sudo,
                     t_start=plan.t0, overlay_package=overlay_package(rec))
        return self.smoke(plan, res)

    def smoke(self, plan: HostPlan, res: HostResult, healthy: str = "ready") -> HostResult:
        """--smoke: one short /generate on a healthy server, the one just started or the one found
        running (a smoke asked for is never skipped in silence)."""
        if res.verdict != healthy or not self.opts.smoke:
            return res
        sm: SmokeAnswer = plan.session.call({"op": "smoke", "port": plan.prof.port,
                                             "secrets": self.opts.secrets}, timeout=180, sudo=plan.sudo)
        if sm.get("ok"):
            res.data["smoke"] = sm
            res.notes.append(f"smoke: {sm.get('completion_tokens')} tokens in {sm['elapsed']:.2f} s = "
                             f"{sm.get('tokens_per_s')} tok/s, accept length {sm.get('spec_accept_length')}, "
                             f"accept rate {sm.get('spec_accept_rate')}")
        else:
            res.verdict, res.detail = "failed", "smoke: " + sm["error"]["message"]
        return res

    # -- report ------------------------------------------------------------------------------------
    def report(self, plan: HostPlan, pre: "PreflightAnswer", start: "StartAnswer", res: HostResult) -> HostResult:
        """The row of a started server: the restart's notes, the image, and the journal's line for
        the start (restarted: the old server's pids replaced)."""
        rec = start["record"]
        res.notes = plan.notes + res.notes
        if pre.get("image"):
            res.data["image"] = pre["image"]
        replaced = start.get("replaced")
        change = "restarted" if replaced else "started"
        res.data.setdefault("pid", rec["pid"])
        res.data["server_change"] = change
        if replaced and res.verdict not in ("ready", "running"):  # the old server is gone too: say so
            res.detail += (f"; the server it replaced was stopped first ({len(replaced)} processes"
                           + (", --force: started past a refused preflight" if self.opts.force else "")
                           + f"): nothing provision started serves on port {plan.prof.port} now")
        res.data.setdefault("journal_extra", []).append({
            "command": "launch", "verdict": change,
            "detail": (f"{change} pid {rec['pid']} port {plan.prof.port} profile {plan.prof.name}"
                       + (f" (stopped {len(replaced)} processes of the old one)" if replaced else "")
                       + f"; then {res.verdict}")})
        return res
