"""CLI commands for the server: launch, wait, stop, logs."""

from __future__ import annotations

import functools
import re
import sys

import click

from provision.cli.main import fleet_options, gpu_option, profile_option, run_fleet, server_port_option
from provision.errors import UsageError


def _profile_options(fn):
    """What starting a server takes: the profile, flag overrides and the secrets."""
    fn = profile_option()(fn)
    fn = server_port_option()(fn)
    fn = click.option("--arg", "args", multiple=True, metavar="FLAG=VALUE",
                      help="Override one flag of the engine's server, e.g. --arg mem-fraction-static=0.85 (SGLang) "
                           "or --arg max-model-len=4096 (vLLM); repeatable; the port is --server-port.")(fn)
    fn = click.option("--api-key-file", metavar="FILE", help="Read --api-key from FILE (or set PROVISION_API_KEY).")(fn)
    fn = click.option("--admin-api-key-file", metavar="FILE",
                      help="Read --admin-api-key from FILE (or set PROVISION_ADMIN_API_KEY).")(fn)
    return fn


def _server_options(fn):
    """What finding a running server takes: the profile and its port."""
    fn = profile_option()(fn)
    return server_port_option()(fn)


def _router_option(fn):
    return click.option("--router", metavar="URL", default=None,
                        help="The router in front of the selected hosts' servers (sglang-router, or vllm-router; "
                             "the inventory's `router:` per host or group otherwise): a stop or restart takes the "
                             "server out of it first and waits until it is no longer listed; a restarted server "
                             "is put back once ready and warmed. A router that does not answer leaves the server "
                             "as it is (--force goes on without it).")(fn)


def _server_opts(profile, server_port, **kw):
    from provision.tasks.options import LaunchOptions

    return LaunchOptions(profile=profile, overrides={"port": server_port} if server_port else {}, **kw)


def check_profiles(ctx, opts, multinode=None) -> list:
    """Load every selected host's profile before any host is touched: a bad one is exit 2, once."""
    from provision.cli.main import selected_hosts
    from provision.tasks.options import resolve

    hosts = selected_hosts(ctx)
    for h in hosts:
        resolve(h, opts, multinode)
    return hosts


def _parse_overrides(args) -> dict:
    import yaml

    from provision.config.bounded import load_yaml

    out = {}
    for a in args:
        if "=" not in a:
            raise UsageError(f"--arg {a!r}: expected FLAG=VALUE, e.g. --arg port=30001")
        k, v = a.split("=", 1)
        k = k.strip().lstrip("-")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", k):
            raise UsageError(f"--arg {a!r}: {k!r} is not a flag name (letters, digits, '-', '_'), "
                             "e.g. --arg mem-fraction-static=0.85")
        try:
            out[k] = load_yaml(v, f"--arg {a!r}") if v else True
        except yaml.YAMLError as exc:
            raise UsageError(f"--arg {a!r}: the value is not valid YAML "
                             f"({getattr(exc, 'problem', None) or exc}); quote it, e.g. --arg {k}='\"...\"'") from None
    return out


def _options(profile, server_port, args, api_key_file, admin_api_key_file, **kw):
    from provision.tasks.options import LaunchOptions
    from provision.config.profile import secrets_from_env

    files = {"api-key": api_key_file, "admin-api-key": admin_api_key_file}
    overrides = _parse_overrides(args)
    if server_port:
        if "port" in overrides and overrides["port"] != server_port:
            raise UsageError(f"--server-port {server_port} and --arg port={overrides['port']} name two ports for "
                             "one server: give --server-port only")
        overrides["port"] = server_port
    return LaunchOptions(profile=profile, overrides=overrides,
                         secrets=secrets_from_env(files={k: v for k, v in files.items() if v}),
                         secret_files=tuple(k for k, v in files.items() if v), **kw)


def _outage_option(fn):
    return click.option("--max-outage", type=float, default=300.0, show_default=True, metavar="S",
                        help="While following, reconnect with backoff after a dropped connection or a failed "
                             "probe; give up (verdict unknown, the server keeps running) only after S seconds "
                             "of consecutive failures.")(fn)


def _plain(ctx) -> bool:
    return ctx.as_json or not sys.stdout.isatty()


def _print_tails(results):
    for r in results:
        tail = r.data.get("log_tail")
        if tail:
            click.echo(f"--- {r.host}: last lines of {r.data.get('log') or 'the log'} (secrets redacted) ---", err=True)
            click.echo(tail, err=True)


def _run_with_display(ctx, command, make_fn, columns):
    from provision.output.progress import Display

    collected = []

    def wrap(fn):
        @functools.wraps(fn)  # keeps fn's on_host_done (a multi-node launch's hook: control/runner.py)
        def inner(host, session, fleet):
            r = fn(host, session, fleet)
            collected.append(r)
            return r
        return inner

    with Display(plain=_plain(ctx), stream=sys.stderr if ctx.as_json else sys.stdout) as display:
        code = run_fleet(ctx, command, wrap(make_fn(display)), columns=columns)
    if not ctx.as_json:
        _print_tails(collected)
    return code


@click.command()
@fleet_options
@_profile_options
@click.option("--patch", "do_patch", is_flag=True,
              help="Apply the playbook's patch (and the profile's `requires:` specs that apply) first where missing.")
@gpu_option
@click.option("--overlay", is_flag=True,
              help="Fix EAGLE-3 without editing the engine's files: stage an overlay package in the host's state "
                   "directory and start the server on it (SGLang 0.5.6+: SGLANG_EXTERNAL_MODEL_PACKAGE; vLLM "
                   "0.16+: a general plugin, the overlay first on PYTHONPATH), as the profile's `fix: overlay`.")
@click.option("--force", is_flag=True, help="Start even when preflight checks fail.")
@click.option("--restart", is_flag=True, help="Replace a server provision started earlier.")
@click.option("--check", is_flag=True,
              help="Show the plan, change nothing: per host, preflight's verdict, the exact command line it "
                   "would run, what it would stop first (--restart) and the router it would take it out of; "
                   "with --serial, the batches; no image is pulled (a container host without it says so). "
                   "Exit 4 when something would start, 3 when a host would be refused, 0 when nothing is to do.")
@click.option("--deadline", type=float, default=3600.0, show_default=True, metavar="S",
              help="Give up following after S seconds (a 550 GB load takes long); the server keeps running.")
@click.option("--poll", type=float, default=2.0, show_default=True, metavar="S", help="Seconds between polls.")
@click.option("--smoke", is_flag=True, help="Once healthy, send one short /generate and report tok/s and accept rate.")
@click.option("--persistent", is_flag=True, help="Run as a systemd service (systemd hosts): enabled for boot, restarted "
                   "10 s after the server dies; `provision stop` disables and removes it.")
@click.option("--health-url", metavar="URL", help="Poll this URL (as seen from the host) instead of /health.")
@click.option("--serial", metavar="N|P%", help="Rolling: start N hosts (or P%) at a time, each batch healthy first.")
@click.option("--max-fail", type=int, default=None, metavar="N", help="Stop the roll after more than N failed hosts.")
@click.option("--stop-on-interrupt", is_flag=True, help="On Ctrl-C, stop the servers being followed.")
@_outage_option
@click.option("--rank-grace", type=float, default=10.0, show_default=True, metavar="S",
              help="When the main server process dies, seconds its watcher gives the rest of its tree (ranks "
                   "that hold GPU memory) before it kills them; the watcher records that it did.")
@_router_option
def launch(ctx, profile, server_port, args, api_key_file, admin_api_key_file, do_patch, gpu_capability, overlay, force, restart,
           check, deadline, poll, smoke, persistent, health_url, serial, max_fail, stop_on_interrupt, max_outage, rank_grace,
           router):
    """Start the playbook's server (SGLang, or vLLM with `engine: vllm`) with its
    EAGLE-3 drafter and follow it until healthy.

    Preflight first (patch in place, port free, weights present, GPUs free,
    disk), then a detached start with a fresh log, then live progress from the
    engine's log (target weights, KV cache, CUDA graphs, draft weights, draft
    graphs, warm-up) until GET /health answers 200 on the host. If the server
    dies, the redacted log tail that explains it is shown, with the fix when
    provision knows one.

    \b
    Behind a router (`router:` in the inventory, or --router), --restart
    takes each server out of it first, drains and restarts it, then warms it
    with one request and puts it back once the router lists it healthy; with
    --serial 1 the fleet keeps serving from the others meanwhile.

    \b
    Secrets: PROVISION_API_KEY / --api-key-file, PROVISION_ADMIN_API_KEY,
    HF_TOKEN. They reach the host on stdin and go into a 0600 --config file.
    """
    from provision.cli.main import selected_hosts
    from provision.tasks.interrupt import RunState
    from provision.tasks.launch import launch_fn
    from provision.tasks.multinode import MultiNode
    from provision.tasks.server_verbs import stop_fn

    multinode = MultiNode(selected_hosts(ctx))
    run = RunState()  # what each host got to: the Ctrl-C report's input
    opts = _options(profile, server_port, args, api_key_file, admin_api_key_file, patch=do_patch, overlay=overlay, force=force,
                    restart=restart,
                    deadline=deadline, poll=poll, smoke=smoke, persistent=persistent, health_url=health_url,
                    max_outage=max_outage, tree_grace=rank_grace, stop_on_interrupt=stop_on_interrupt,
                    gpu_capability=gpu_capability, router=router, check=check)
    check_profiles(ctx, opts, multinode)
    from provision.tasks.options import secret_values

    ctx.secrets = secret_values(opts.secrets)  # --api-key-file's too: never in a --json document
    if check:
        sys.exit(_check_plan(ctx, opts, multinode, serial))
    biggest = max((len(v) for v in multinode.members.values()), default=1)
    if ctx.conn.forks < biggest:  # every rank of a server must start together
        ctx.conn.forks = biggest
    try:
        if serial:
            from provision.control.rolling import run_rolling

            code = run_rolling(ctx, selected_hosts(ctx), "launch", lambda d: launch_fn(opts, d, multinode, run),
                               serial, max_fail, _plain(ctx), report_interrupt=False)
        else:
            code = _run_with_display(ctx, "launch", lambda d: launch_fn(opts, d, multinode, run),
                                     ["host", "verdict", "detail", "elapsed"])
    except KeyboardInterrupt:
        _interrupted(ctx, opts, run, stop_fn)
    sys.exit(code)


def _check_plan(ctx, opts, multinode, serial) -> int:
    """launch --check: the batches --serial would run (said first), then every host's plan at once
    (preflight only, nothing started, stopped or journaled); exit 4 when something would start."""
    from provision.cli.main import run_fleet, selected_hosts
    from provision.control import plan
    from provision.tasks.launch import launch_fn

    hosts = selected_hosts(ctx)
    if serial and hosts:
        groups = plan.batches(hosts, serial)
        ctx.check_batches = [[h.name for h in b] for b in groups]
        if not ctx.as_json:
            click.echo(f"plan: {len(groups)} batch{'es' if len(groups) != 1 else ''} (--serial {serial}), each "
                       "ready before the next:")
            for i, b in enumerate(groups, 1):
                click.echo(f"  batch {i}/{len(groups)}: {', '.join(h.name for h in b)}")
    from provision.output.progress import Display

    with Display(plain=_plain(ctx), stream=sys.stderr if ctx.as_json else sys.stdout) as display:
        return run_fleet(ctx, "launch", launch_fn(opts, display, multinode), check=True,
                         columns=["host", "verdict", "detail"],
                         extra={"check": True, "batches": getattr(ctx, "check_batches", None)})


def _interrupted(ctx, opts, run, stop_fn) -> None:
    """Ctrl-C during launch: say, per host, whether a server was started and what became of it;
    --stop-on-interrupt stops the started ones; journal the changes; --json still prints its document."""
    from provision.output import report
    from provision.cli.main import _journal, selected_hosts
    from provision.errors import EXIT_INTERRUPTED
    from provision.tasks.interrupt import interrupt_report
    from provision.control.runner import Fleet, run_hosts

    hosts = selected_hosts(ctx)
    finished = set(run.results)
    results = interrupt_report(hosts, run, opts)
    # a server was started there, or the start request was in flight
    started = [h for h, r in zip(hosts, results) if run.stages.get(h.name) in ("starting", "started")
               and r.verdict in ("interrupted", "unknown")]
    stopped = []
    if opts.stop_on_interrupt and started:
        click.echo(f"interrupted: stopping the {len(started)} server(s) being followed (--stop-on-interrupt)",
                   err=True)
        fleet = Fleet(ctx.conn)
        try:
            stopped = run_hosts(fleet, started, stop_fn(opts))
        finally:
            fleet.close()
        by = {r.host: r for r in results}
        for s in stopped:
            r = by[s.host]
            r.detail = r.detail.split("; the server was started")[0] + (
                f"; the server was started, then stopped (--stop-on-interrupt): {s.detail}" if s.verdict == "stopped"
                else f"; stopping it after the interrupt: {s.verdict}: {s.detail}")
            r.data["stop"] = {"verdict": s.verdict, "detail": s.detail}
    elif started:
        from provision.tasks.selection import selectors

        sel = selectors([h.name for h in started])
        if len(started) == 1 and not ctx.as_json:  # its row, just printed, has the two commands
            click.echo(f"interrupted: stopped following; the server on {started[0].name} keeps loading",
                       err=True)
        else:
            click.echo(f"interrupted: stopped following; {len(started)} server{'s were' if len(started) > 1 else ' was'} "
                       f"started and keep{'' if len(started) > 1 else 's'} loading: `provision wait {sel}` re-attaches, "
                       f"`provision stop {sel}` stops {'them' if len(started) > 1 else 'it'}", err=True)
    else:
        click.echo("interrupted: no server was started", err=True)
    # the hosts that finished before the interrupt were journaled as their rows arrived
    _journal("launch", [r for h, r in zip(hosts, results) if h.name not in finished])
    if stopped:
        _journal("stop", stopped)
    if ctx.as_json:
        click.echo(report.to_document("launch", results, EXIT_INTERRUPTED, {"interrupted": True},
                                      secrets=getattr(ctx, "secrets", ())))
    else:  # the rows not printed yet (a row already printed is said again only if stopping changed it)
        changed = {s.host for s in stopped}
        rest = [r for h, r in zip(hosts, results) if h.name not in finished or h.name in changed]
        if rest:
            click.echo("after the interrupt:")
            for r in rest:
                click.echo("  " + report.host_line(r))
        if len(results) > 1:
            click.echo(report.summary_line(results))
    sys.exit(EXIT_INTERRUPTED)


@click.command()
@fleet_options
@_server_options
@click.option("--deadline", type=float, default=3600.0, show_default=True, metavar="S",
              help="Give up following after S seconds since the server started; the server keeps running.")
@click.option("--poll", type=float, default=2.0, show_default=True, metavar="S", help="Seconds between polls.")
@_outage_option
@_router_option
def wait(ctx, profile, server_port, deadline, poll, max_outage, router):
    """Re-attach to a start-up in progress and follow it until healthy.

    Behind a router, a healthy server the router does not list (a restart
    interrupted between taking it out and putting it back) is warmed and put
    back in."""
    from provision.tasks.server_verbs import wait_fn
    from provision.config.profile import secrets_from_env

    opts = _server_opts(profile, server_port, deadline=deadline, poll=poll, max_outage=max_outage, router=router,
                        secrets=secrets_from_env())
    check_profiles(ctx, opts)
    sys.exit(_run_with_display(ctx, "wait", lambda d: wait_fn(opts, d), ["host", "verdict", "detail", "elapsed"]))


@click.command()
@fleet_options
@_server_options
@click.option("--grace", type=float, default=None, metavar="S",
              help="The drain's deadline: seconds the server gets to finish its requests in flight after "
                   "SIGTERM (to its main process: SGLang answers 503 and ends once none is left) before what "
                   "is left is killed; the row says how many requests that cut. Default: the profile's "
                   "`grace`, 30.")
@_router_option
@click.option("--force", is_flag=True, help="Stop even when the router in front does not answer (the server "
                                            "may then still be listed there).")
def stop(ctx, profile, server_port, grace, router, force):
    """Stop the server provision started: it drains first, then the whole tree goes, ranks included.

    \b
    The server's main process alone gets SIGTERM, so it finishes the requests
    in flight as its engine drains (a signal to every rank would end them
    mid-request); at --grace what is left is ended (SIGTERM, then SIGKILL) and
    the row says how many requests were still in flight.

    Behind a router (`router:` or --router), the server is taken out of it
    first, and the stop waits until the router no longer lists it."""
    from provision.tasks.server_verbs import stop_fn

    opts = _server_opts(profile, server_port, router=router, force=force)
    check_profiles(ctx, opts)
    sys.exit(run_fleet(ctx, "stop", stop_fn(opts, grace), columns=["host", "verdict", "detail", "elapsed"]))


@click.command()
@fleet_options
@_server_options
@click.option("--lines", "-n", type=click.IntRange(0, None), default=100, show_default=True, metavar="N",
              help="How many of the log's last lines to show.")
@click.option("--follow", "-F", "follow_", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
def logs(ctx, profile, server_port, lines, follow_):
    """Show the current launch's server log (secrets redacted)."""
    from provision.tasks.server_verbs import logs_fn
    from provision.config.profile import secrets_from_env

    # secrets in the environment (PROVISION_API_KEY, HF_TOKEN...) are still redacted from what is shown
    opts = _server_opts(profile, server_port, secrets=secrets_from_env())
    check_profiles(ctx, opts)
    if follow_:
        from provision.cli.main import selected_hosts
        from provision.tasks.logs import follow_logs

        hosts = selected_hosts(ctx)
        if len(hosts) != 1:
            raise UsageError("--follow works on one host at a time; select one with --host or --limit")
        sys.exit(follow_logs(hosts[0], ctx.conn, opts, lines))
    collected = []

    def fn(host, session, fleet):
        r = logs_fn(opts, lines)(host, session, fleet)
        collected.append(r)
        return r

    ctx.as_json_saved = ctx.as_json
    code = run_fleet(ctx, "logs", fn)
    if not ctx.as_json:
        for r in collected:
            if "text" in r.data:
                who = " ".join(str(x) for x in (r.data.get("engine"), r.data.get("version")) if x)
                click.echo(f"--- {r.host}: {r.detail}" + (f" ({who})" if who else "") + " ---")
                click.echo(r.data["text"])
    sys.exit(code)


COMMANDS = [launch, wait, stop, logs]
