"""Fleet-run commands: `reconcile`, `restore`, `history`, `schedule`."""

from __future__ import annotations

import os
import sys

import click

from provision.cli.main import (check_option, check_specs, check_transport, diff_option, fleet_options, format_options,
                                gpu_option, install_options, load_spec, profile_option, renamed, run_fleet,
                                selected_hosts, spec_option, specs_option, transport_options)
from provision.errors import EXIT_NOTHING, EXIT_OK, UsageError


# --------------------------------------------------------------------------- reconcile

@click.command()
@fleet_options
@transport_options(container=False)
@specs_option
@gpu_option
@install_options
@check_option
@click.option("--force", is_flag=True, help="Also patch files someone else edited (foreign-edit).")
@click.option("--include-held", is_flag=True,
              help="Also re-patch hosts held by an explicit `provision unpatch` (by default they are left alone).")
@click.option("--restart", is_flag=True,
              help="Restart servers that run older code than their file (rolling, health-gated).")
@click.option("--serial", metavar="N|P%", help="With --restart: restart N hosts (or P%) at a time.")
@click.option("--window", metavar="HH:MM-HH:MM",
              help="With --restart: restart only inside this local-time window (may cross midnight).")
@profile_option(when="With --restart: ", name="--restart-playbook")
@click.option("--restart-deadline", type=float, default=3600.0, show_default=True, metavar="S",
              help="With --restart: seconds to wait for each restarted server to be healthy.")
@click.option("--full", is_flag=True, hidden=True, help="Skip the fast path (always discover).")
def reconcile(ctx, spec, gpu_capability, install_path, python_, check, force, include_held, restart, serial, window,
              profile, restart_deadline, full):
    """Bring every host back to the patched state; meant for cron / systemd timers.

    One remote call per host decides, from the host's provision state, the
    file's sha256, the wheel's RECORD (or git HEAD) and the engine's view:

    \b
      unchanged     our patch is in place: nothing is written, not even state
      native        the release has the methods natively: stale state dropped
      wiped         upgraded/reinstalled/downgraded, block gone: re-patched
      unpatched     never patched (or restored, or unpatched by hand): patched
      held          `provision unpatch` was run on it (who, when): left
                    alone until `provision patch` (--include-held patches)
      stale-block   our block differs from the spec: re-rendered
      foreign-edit  someone else edited the file: left alone (--force patches,
                    or adopts an edited file that still holds our block)
      blocked-git   the checkout's upstream changed the file, so our local
                    change blocks `git pull`: `provision unpatch`, `git pull`,
                    then reconcile

    An unchanged host costs one short remote call: no
    interpreter is probed and nothing is written. Every spec a host carries
    (`--playbook`, repeatable, or the inventory's `specs:`) goes in that one call,
    one row each. A spec whose `applies:` needs the host's facts goes in it
    too: intact, it is unchanged; else the answer brings the facts, and it
    is patched in a second call where it applies, not-applicable elsewhere.

    A server started before its file changed is reported "restart needed";
    --restart restarts it through the launch machinery, in --serial batches,
    each healthy before the next, and only inside --window when given.

    Takes the control-machine lock (~/.local/state/provision/reconcile.lock or
    $PROVISION_LOCK): a second reconcile exits 7 naming the holder (--check
    does not lock). Exits 3 when a host failed or needs a human (foreign-edit,
    blocked-git), 4 with --check when changes are due. Every change is
    journaled (`provision history`).
    """
    from provision.control import plan
    from provision.tasks import reconcile as rc
    from provision.control.lock import ControlLock
    from provision.control.runner import Fleet, run_hosts

    win = rc.parse_window(window) if window else None
    if restart and ctx.conn.local:
        raise UsageError("--restart restarts servers through `provision launch`, which works over SSH only: "
                         "drop --restart with --local (the report still says \"restart needed\")")
    if serial:
        plan.parse_serial(serial, 1)
    if (serial or window) and not restart:
        raise UsageError("--serial and --window only apply with --restart")
    pspec = load_spec(spec)
    check_specs(ctx, pspec)
    if restart:
        from provision.cli.launch import check_profiles
        from provision.tasks.options import LaunchOptions

        check_profiles(ctx, LaunchOptions(profile=profile))
    lock = None if check else ControlLock().acquire()
    try:
        hosts = selected_hosts(ctx)
        if not hosts:
            click.echo("error: no host matched the selection; nothing was done", err=True)
            sys.exit(EXIT_NOTHING)
        fleet = Fleet(ctx.conn)
        from provision.cli.main import journal_writer

        # each host's row is journaled as it arrives, each restart as it ends (Ctrl-C/SIGTERM keep them)
        writer = None if check else journal_writer("reconcile")
        try:
            results = run_hosts(fleet, hosts, rc.reconcile_fn(
                pspec, check=check, force=force, install_path=install_path, python=python_,
                timeout=ctx.conn.command_timeout, full=full, include_held=include_held,
                gpu_capability=gpu_capability), on_result=writer)
            batches, notes = rc.plan_restarts(results, hosts, restart=restart, window=win, serial=serial)
            by_name = rc.row_per_host(results)
            for name, note in notes.items():
                r = by_name[name]
                if note.startswith("restart needed") and any(n.startswith("restart needed") for n in r.notes):
                    continue  # the re-patch already said so
                r.notes.append(note)
            if batches and check:
                for i, b in enumerate(batches, 1):
                    for h in b:
                        by_name[h.name].notes.append(f"would restart (batch {i}/{len(batches)})")
            elif batches:
                rc.run_restarts(fleet, batches, results, profile=profile, deadline=restart_deadline, window=win,
                                spec=pspec, journal=writer.extra if writer is not None else None)
        finally:
            fleet.close()
            if writer is not None:
                fleet.warnings.extend(writer.warnings)
        for w in dict.fromkeys(fleet.warnings):
            click.echo(f"warning: {w}", err=True)
        code = rc.exit_code(results, check, restart)
        if ctx.as_json:
            from provision.output import report

            click.echo(report.to_document("reconcile", results, code, {
                "summary": rc.summary_line(results), "check": check,
                "restart_batches": [[h.name for h in b] for b in batches]}))
        else:
            for r in results:
                if r.verdict == "unchanged" and not r.notes:
                    continue
                click.echo(rc.host_line(r))
                for note in r.notes:
                    click.echo(f"    note: {note}")
            click.echo(rc.summary_line(results))
    finally:
        if lock is not None:
            lock.release()
    sys.exit(code)


# --------------------------------------------------------------------------- restore

@click.command()
@fleet_options
@spec_option
@install_options
@click.option("--backup", "backup_id", metavar="ID", help="The backup to put back (an id from --list, a prefix "
                                                           "of its sha256 is enough).")
@click.option("--file", "file_", metavar="PATH", help="The file on the host (default: the spec's file in the "
                                                      "install provision finds).")
@click.option("--list", "list_", is_flag=True, help="Only list the backups.")
@click.option("--check", is_flag=True, help="Say what would be restored, change nothing (exit 4 if it would).")
@diff_option
@click.option("--force", is_flag=True, help="Restore even a backup taken under another SGLang version, or over a "
                                            "file that changed since provision last wrote it.")
def restore(ctx, spec, install_path, python_, backup_id, file_, list_, check, diff, force):
    """Put a backup of the model file back, from the host's provision state dir.

    Backups are taken before every change provision makes; the first one of a
    file (its original) is kept forever. Without --backup, the original is put
    back. The
    current bytes are backed up first, so a restore can be undone with another.

    A backup is put back only if it was taken under the SGLang version installed
    now and the file is still as provision last left it (the sha256 in the host's
    state, else in the journal): after an upgrade, restoring 0.5.9's original would
    put 0.5.9's file into 0.5.10. Anything else is refused, naming both versions;
    --force overrides.
    Verdicts: restored, unchanged (the file already holds those bytes), failed.
    """
    from provision.tasks.restore import restore_fn

    pspec = load_spec(spec)
    check_specs(ctx, pspec)

    collected: list = []
    one = restore_fn(pspec, list_=list_, backup_id=backup_id, file_=file_, check=check, diff=diff, force=force,
                     install_path=install_path, python=python_, timeout=ctx.conn.command_timeout)

    def fn(host, session, fleet):
        r = one(host, session, fleet)
        collected.append(r)
        return r

    code = run_fleet(ctx, "backups" if list_ else "restore", fn, check=check, show_diff=diff,
                     columns=["host", "verdict", "file", "detail", "elapsed"])
    if list_ and not ctx.as_json:
        from provision.output.report import print_table

        for r in sorted(collected, key=lambda x: x.host):
            if not r.data.get("backups"):
                continue
            rows = []
            for b in r.data["backups"]:
                marks = []
                if b.get("original"):
                    marks.append("original")
                if b.get("sha256") == r.data.get("current_sha"):
                    marks.append("= current")
                rows.append([b["id"], str(b.get("time"))[:19].replace("T", " "), str(b.get("sglang_version")),
                             str(b.get("reason")), str(b.get("size")), ", ".join(marks)])
            print_table(["id", "time", "sglang", "before", "size", "marks"], rows, fmt=ctx.fmt,
                        title=f"{r.host}: backups of {r.file}")
    sys.exit(code)


# --------------------------------------------------------------------------- history

@click.command()
@click.option("--host", metavar="HOST", help="Only this host's entries.")
@click.option("--playbook", "spec_name", metavar="NAME", help="Only the entries of this playbook's spec (its name).")
@renamed("--spec", "--playbook", "spec_name")
@click.option("--last", "-n", "last", type=click.IntRange(0, None), default=50, show_default=True, metavar="N",
              help="The last N entries (0: all).")
@format_options(json_is="JSON lines, one entry each")
def history(host, spec_name, last, fmt, as_json):
    """Show the change journal of this control machine.

    Every change provision made (patched, repaired, unpatched, restored,
    started, stopped, restarted) and every failed attempt of patch, unpatch,
    restore and reconcile: time, user, host, spec, file, sha256 before and after;
    one row per host and spec.
    The journal is $PROVISION_JOURNAL or ~/.local/state/provision/journal.jsonl.
    """
    from provision.control import journal

    from provision.output.report import print_table, resolve_format

    fmt = resolve_format("json" if as_json else fmt)
    recs, bad = journal.read(host=host, limit=None if spec_name else last or None)
    if spec_name:
        recs = [r for r in recs if r.get("spec") == spec_name]
        recs = recs[-last:] if last else recs
    for n in bad[:5]:
        click.echo(f"warning: {journal.path()}:{n}: not a JSON line; skipped", err=True)
    if fmt == "json":
        from provision.output.report import dumps_redacted

        for rec in recs:
            click.echo(dumps_redacted(rec, indent=None))
        sys.exit(EXIT_OK)
    if not recs:
        which = " and ".join(x for x in ((host and f"host {host}"), (spec_name and f"spec {spec_name}")) if x)
        click.echo(f"no journal entries{' for ' + which if which else ''} in {journal.path()}", err=True)
        sys.exit(EXIT_OK)
    import shutil

    # every column where there is room (a pipe or a file has no width to fit); --json has everything
    wide = fmt == "lines" or not sys.stdout.isatty() or shutil.get_terminal_size((80, 24)).columns >= 130
    cols = ["time", "host", "spec", "command", "verdict"] + (["file"] if wide else []) + ["sha256"] + \
        (["user"] if wide else []) + ["detail"]
    rows = []
    for rec in recs:
        before, after = (rec.get("sha256_before") or "")[:8], (rec.get("sha256_after") or "")[:8]
        row = {"time": str(rec.get("time", ""))[:16].replace("T", " "), "host": str(rec.get("host", "")),
               "spec": str(rec.get("spec") or ""),
               "command": str(rec.get("command", "")), "verdict": rec.get("verdict") or "",
               "file": os.path.basename(str(rec.get("file") or "")),
               "sha256": f"{before or '-'}>{after or '-'}" if before != after else before,
               "user": f"{rec.get('user', '')}@{rec.get('control_host', '')}", "detail": str(rec.get("detail") or "")}
        if fmt == "lines":
            row["time"] = str(rec.get("time", ""))
        rows.append([row[c] for c in cols])
    print_table(cols, rows, fmt=fmt)
    sys.exit(EXIT_OK)


# --------------------------------------------------------------------------- schedule

# Every option of `reconcile` is an option of `schedule` too, forwarded into the unit and the
# cron line when given (on the command line or through its environment variable, which a timer
# would not have). Except these, which make no sense unattended:
NOT_FORWARDED = {"check", "full"}
# Local files: made absolute, since the timer does not run in this directory.
LOCAL_PATHS = {"inventory", "identity", "ssh_config", "known_hosts", "sudo_password_file", "state_dir"}
# With --local the host is this machine, so its paths are local files too.
HOST_PATHS = {"install_path", "python_"}
LOCAL_PATHS_OR_NAMES = {"spec", "profile"}  # a path when such a file exists, else a shipped name


def forwarded_params() -> list[click.Parameter]:
    return [p for p in reconcile.params if isinstance(p, click.Option) and p.name not in NOT_FORWARDED]


def _long(names: list[str]) -> str:
    return next((n for n in names if n.startswith("--")), names[0])


def _abs(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def forwarded_argv(params: dict, given: set[str], only: set[str] | None = None) -> list[str]:
    """The `reconcile` arguments for the options in ``given`` (pure: values in, argv out); with
    ``only``, just those options (the ones `status` has too, for schedule --metrics-file)."""
    argv: list[str] = []
    local = "local" in given and bool(params.get("local"))
    for opt in forwarded_params():
        if opt.name not in given or (only is not None and opt.name not in only):
            continue
        val = params[opt.name]
        if opt.is_flag and opt.secondary_opts:  # --sudo/--no-sudo
            if val is not None:
                argv.append(_long(opt.opts if val else opt.secondary_opts))
            continue
        if opt.is_flag:
            if val:
                argv.append(_long(opt.opts))
            continue
        for v in (val if opt.multiple else [val]):
            if v is None:
                continue
            v = str(v)
            if opt.name in LOCAL_PATHS or isinstance(opt.type, click.Path) or (
                    opt.name in LOCAL_PATHS_OR_NAMES and os.path.isfile(v)) or (
                    local and opt.name in HOST_PATHS and os.sep in v):
                v = _abs(v)
            argv += [_long(opt.opts), v]
    return argv


def _status_metrics_argv(params: dict, given: set[str], path: str) -> list[str]:
    """`provision status` over the same hosts, the same way, printing the metrics to PATH."""
    from provision.cli.patch import status
    from provision.tasks.schedule import provision_argv

    names = {p.name for p in status.params if p.name not in ("fmt", "as_json", "metrics_file")}
    return provision_argv() + ["status"] + forwarded_argv(params, given, only=names) + [
        "--format", "prometheus", "--metrics-file", _abs(path)]


def _schedule(every, install, unit_dir, metrics_file=None, **params):
    from click.core import ParameterSource

    from provision.config.inventory import load_inventory
    from provision.control.plan import parse_serial
    from provision.tasks.reconcile import parse_window
    from provision.tasks.schedule import install_units, parse_every, provision_argv, render_units, vet_argv

    cctx = click.get_current_context()
    given = {name for name in params
             if cctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)}
    seconds, cron = parse_every(every)
    if unit_dir and not install:
        raise UsageError("--unit-dir says where --install writes the units: give --install too, or drop --unit-dir")
    inventory = params.get("inventory")
    check_transport(hosts=params.get("hosts"), inventory=inventory, limit=params.get("limit"),
                    local=params.get("local"), state_dir=params.get("state_dir"))
    if not inventory and not params.get("hosts") and not params.get("local"):
        raise UsageError("say which hosts the timer reconciles: -i INVENTORY.yaml or --host HOST, or --local "
                         "(pull mode: this machine reconciles itself)")
    if inventory:
        load_inventory(_abs(inventory))  # a bad inventory fails now (exit 2), not at 3 am
    if params.get("window"):
        parse_window(params["window"])
    if (params.get("window") or params.get("serial")) and not params.get("restart"):
        raise UsageError("--serial and --window only apply with --restart")
    if params.get("restart") and params.get("local"):
        raise UsageError("--restart restarts servers through `provision launch`, which works over SSH only: "
                         "drop --restart with --local")
    if params.get("serial"):
        parse_serial(params["serial"], 1)
    if params.get("spec"):
        load_spec(params["spec"])
    argv = provision_argv() + ["reconcile"] + forwarded_argv(params, given)
    root = os.geteuid() == 0
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    log = "/var/log/provision-reconcile.log" if root else os.path.join(state, "provision", "reconcile.log")
    units = render_units(argv, seconds, cron, log,
                         _status_metrics_argv(params, given, metrics_file) if metrics_file else None)
    if not install:
        for name in ("provision-reconcile.service", "provision-reconcile.timer"):
            click.echo(f"# ---- {name}")
            click.echo(units[name])
        click.echo("# ---- crontab line (`crontab -e`), instead of the timer")
        click.echo(units["cron"])
        sys.exit(EXIT_OK)
    target = unit_dir or ("/etc/systemd/system" if root else
                          os.path.join(os.path.expanduser("~"), ".config", "systemd", "user"))
    vet_argv(argv)  # what the unit runs: held to the trust rule before anything is written
    try:
        for p in install_units(target, units):
            click.echo(f"wrote {p}")
    except OSError as exc:
        raise UsageError(f"cannot write the units to {target}: {exc.strerror or exc}") from None
    user = "" if root else " --user"
    click.echo(f"next: systemctl{user} daemon-reload && systemctl{user} enable --now provision-reconcile.timer")
    sys.exit(EXIT_OK)


schedule = click.Command(
    "schedule", callback=_schedule,
    params=[
        click.Option(["--every"], default="15m", show_default=True, metavar="INTERVAL",
                     help="How often: minutes dividing 60 (5m, 15m, 30m) or hours dividing 24 (1h, 6h)."),
        click.Option(["--install"], is_flag=True,
                     help="Write the units: /etc/systemd/system as root, else ~/.config/systemd/user "
                          "(--unit-dir: elsewhere)."),
        click.Option(["--unit-dir"], metavar="DIR", type=click.Path(file_okay=False),
                     help="With --install: write the units into DIR instead (e.g. a systemd unit directory "
                          "of another root); the commands printed after still say how to enable them."),
        click.Option(["--metrics-file"], metavar="PATH", type=click.Path(dir_okay=False),
                     help="After each reconcile, also run `provision status --format prometheus --metrics-file "
                          "PATH` on the same hosts (for node_exporter's textfile collector; name it *.prom)."),
    ] + forwarded_params(),
    short_help="Print (or --install) a systemd timer and a cron line running `provision reconcile`.",
    help="""Print (or --install) a systemd timer and a cron line running `provision reconcile`.

    \b
    Prints provision-reconcile.service (Type=oneshot; exit 7, "another
    reconcile holds the lock", counts as success), provision-reconcile.timer
    (every INTERVAL after the last run, first 5 min after boot) and the
    equivalent crontab line, all with the absolute path of this provision
    executable. Every other option is one of `provision reconcile`'s and is
    passed on to it when given (files made absolute), so the timer reaches
    the same hosts the same way. Nothing is enabled for you:
    \b
      provision schedule -i inventories/prod.yaml --every 15m --install
      systemctl daemon-reload && systemctl enable --now provision-reconcile.timer
      (as a user: systemctl --user ...; keep it running without a login
       session with `loginctl enable-linger`)
    or put the cron line in `crontab -e`. The timer's runs log to the
    systemd journal (journalctl -u provision-reconcile.service); the cron
    line appends to /var/log/provision-reconcile.log as root, otherwise to
    ~/.local/state/provision/reconcile.log. The runs are journaled
    (`provision history`) on this machine.
    """)


COMMANDS = [reconcile, restore, history, schedule]
