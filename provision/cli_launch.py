"""CLI commands for the server: launch, wait, stop, logs."""

from __future__ import annotations

import sys

import click

from provision.cli import fleet_options, run_fleet
from provision.errors import UsageError


def _profile_options(fn):
    fn = click.option("--profile", metavar="PLAYBOOK",
                      help="Launch profile (a playbook's `launch:`). Default: the host's `profile:`, "
                           "then kimi-k25-eagle3.")(fn)
    fn = click.option("--arg", "args", multiple=True, metavar="FLAG=VALUE",
                      help="Override one SGLang flag, e.g. --arg port=30001 (repeatable).")(fn)
    fn = click.option("--api-key-file", metavar="FILE", help="Read --api-key from FILE (or set PROVISION_API_KEY).")(fn)
    fn = click.option("--admin-api-key-file", metavar="FILE",
                      help="Read --admin-api-key from FILE (or set PROVISION_ADMIN_API_KEY).")(fn)
    return fn


def _parse_overrides(args) -> dict:
    import yaml

    out = {}
    for a in args:
        if "=" not in a:
            raise UsageError(f"--arg {a!r}: expected FLAG=VALUE, e.g. --arg port=30001")
        k, v = a.split("=", 1)
        out[k.strip().lstrip("-")] = yaml.safe_load(v) if v else True
    return out


def _options(profile, args, api_key_file, admin_api_key_file, **kw):
    from provision.launch import LaunchOptions
    from provision.profile import secrets_from_env

    files = {"api-key": api_key_file, "admin-api-key": admin_api_key_file}
    return LaunchOptions(profile=profile, overrides=_parse_overrides(args),
                         secrets=secrets_from_env(files={k: v for k, v in files.items() if v}), **kw)


def _plain(ctx) -> bool:
    return ctx.as_json or not sys.stdout.isatty()


def _print_tails(results):
    for r in results:
        tail = r.data.get("log_tail")
        if tail:
            click.echo(f"--- {r.host}: last lines of {r.data.get('log') or 'the log'} (secrets redacted) ---", err=True)
            click.echo(tail, err=True)


def _run_with_display(ctx, command, make_fn, columns):
    from provision.progress import Display

    collected = []

    def wrap(fn):
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
@click.option("--patch", "do_patch", is_flag=True, help="Apply the playbook's patch first if it is missing.")
@click.option("--force", is_flag=True, help="Start even when preflight checks fail.")
@click.option("--restart", is_flag=True, help="Replace a server provision started earlier.")
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
def launch(ctx, profile, args, api_key_file, admin_api_key_file, do_patch, force, restart, deadline, poll, smoke,
           persistent, health_url, serial, max_fail, stop_on_interrupt):
    """Start SGLang with the EAGLE-3 drafter and follow it until healthy.

    Preflight first (patch in place, port free, weights present, GPUs free,
    disk), then a detached start with a fresh log, then live progress from the
    log (target weights, KV cache, CUDA graphs, draft weights, draft graphs,
    warm-up) until GET /health answers 200 on the host. If the server dies, the
    redacted log tail that explains it is shown.

    \b
    Secrets: PROVISION_API_KEY / --api-key-file, PROVISION_ADMIN_API_KEY,
    HF_TOKEN. They reach the host on stdin and go into a 0600 --config file.
    """
    from provision.cli import selected_hosts
    from provision.launch import MultiNode, launch_fn, stop_fn

    multinode = MultiNode(selected_hosts(ctx))
    biggest = max((len(v) for v in multinode.members.values()), default=1)
    if ctx.conn.forks < biggest:  # every rank of a server must start together
        ctx.conn.forks = biggest
    opts = _options(profile, args, api_key_file, admin_api_key_file, patch=do_patch, force=force, restart=restart,
                    deadline=deadline, poll=poll, smoke=smoke, persistent=persistent, health_url=health_url)
    try:
        if serial:
            from provision.rolling import run_rolling

            code = run_rolling(ctx, "launch", lambda d: launch_fn(opts, d, multinode), serial, max_fail,
                               _plain(ctx))
        else:
            code = _run_with_display(ctx, "launch", lambda d: launch_fn(opts, d, multinode),
                                     ["host", "verdict", "detail", "elapsed"])
    except KeyboardInterrupt:
        if stop_on_interrupt:
            click.echo("interrupted: stopping the servers being followed (--stop-on-interrupt)", err=True)
            run_fleet(ctx, "stop", stop_fn(opts))
        else:
            click.echo("interrupted: stopped following; the servers keep loading (`provision wait` re-attaches)",
                       err=True)
        sys.exit(130)
    sys.exit(code)


@click.command()
@fleet_options
@_profile_options
@click.option("--deadline", type=float, default=3600.0, show_default=True, metavar="S")
@click.option("--poll", type=float, default=2.0, show_default=True, metavar="S")
def wait(ctx, profile, args, api_key_file, admin_api_key_file, deadline, poll):
    """Re-attach to a start-up in progress and follow it until healthy."""
    from provision.launch import wait_fn

    opts = _options(profile, args, api_key_file, admin_api_key_file, deadline=deadline, poll=poll)
    sys.exit(_run_with_display(ctx, "wait", lambda d: wait_fn(opts, d), ["host", "verdict", "detail", "elapsed"]))


@click.command()
@fleet_options
@_profile_options
@click.option("--grace", type=float, default=None, metavar="S",
              help="Seconds between SIGTERM (SGLang drains requests) and SIGKILL. Default: the profile's, 30.")
def stop(ctx, profile, args, api_key_file, admin_api_key_file, grace):
    """Stop the server provision started: the whole tree, ranks included."""
    from provision.launch import stop_fn

    opts = _options(profile, args, api_key_file, admin_api_key_file)
    sys.exit(run_fleet(ctx, "stop", stop_fn(opts, grace), columns=["host", "verdict", "detail", "elapsed"]))


@click.command()
@fleet_options
@_profile_options
@click.option("--lines", "-n", type=int, default=100, show_default=True)
@click.option("--follow", "-F", "follow_", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
def logs(ctx, profile, args, api_key_file, admin_api_key_file, lines, follow_):
    """Show the current launch's server log (secrets redacted)."""
    from provision.launch import logs_fn

    opts = _options(profile, args, api_key_file, admin_api_key_file)
    if follow_:
        from provision.logfollow import follow_logs

        sys.exit(follow_logs(ctx, opts, lines))
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
                click.echo(f"--- {r.host}: {r.detail} ---")
                click.echo(r.data["text"])
    sys.exit(code)


COMMANDS = [launch, wait, stop, logs]
