"""CLI command: upgrade (a new engine release beside the serving one; tasks/upgrade.py)."""

from __future__ import annotations

import sys

import click

from provision.cli.main import fleet_options, profile_option, run_fleet, server_port_option
from provision.errors import UsageError


@click.command()
@fleet_options
@profile_option()
@server_port_option()
@click.option("--to", "to", required=True, metavar="VERSION",
              help="The release to move to (e.g. 0.5.10): it goes into a new venv beside the serving one, named "
                   "ENGINE-VERSION (/root/sglang-0.5.10 beside /root/sglang-0.5.9); the serving one is never "
                   "touched.")
@click.option("--check", is_flag=True,
              help="Print each host's plan and change nothing (exit 4 where something would change). Judged "
                   "against the new release once it is installed (--stage): the recorded launch's flags through "
                   "its own parser, the model and drafter in its registry, each spec native or to apply.")
@click.option("--stage", is_flag=True,
              help="Install the new release beside and judge it, the server untouched (then --check says the "
                   "whole plan).")
@click.option("--wheelhouse", metavar="DIR", type=click.Path(file_okay=False),
              help="Send this control-side directory's wheels to each host and install from them alone "
                   "(--no-index: the air-gapped case; up to 512 MiB).")
@click.option("--find-links", metavar="PATH", help="Install from a wheelhouse already on the hosts (--no-index).")
@click.option("--index-url", metavar="URL", help="Install from this package index (default: the host's pip "
                                                  "configuration).")
@click.option("--no-deps", is_flag=True, help="Install the engine's wheel alone: its dependencies must already be "
                                              "importable in the new venv.")
@click.option("--install-timeout", type=float, default=1800.0, show_default=True, metavar="S",
              help="How long making the venv and pip may take per host.")
def upgrade(ctx, profile, server_port, to, check, stage, wheelhouse, find_links, index_url, no_deps,
            install_timeout):
    """Move the servers to another SGLang or vLLM release, side by side.

    \b
    Per host: the serving server's record says its venv; the new release
    goes into a venv beside it (from --wheelhouse, --find-links, --index-url
    or the host's pip configuration), and the recorded launch is judged in
    the new release's interpreter before anything stops: a flag its parser
    does not take, a model its registry lacks, refuse the host with the
    engine's own words.

    \b
    Built so far: --stage and --check. The restart into the new release
    (drained, out of the router and back), the speed gate and the rollback
    are the next step: without --check or --stage a host is staged, judged
    and refused with a sentence saying so."""
    from provision.tasks.options import LaunchOptions
    from provision.tasks.upgrade import UpgradeOptions, check_version, read_wheelhouse, upgrade_fn

    if check and stage:
        raise UsageError("--check and --stage cannot go together: --check changes nothing, --stage installs")
    if sum(bool(x) for x in (wheelhouse, find_links, index_url)) > 1:
        raise UsageError("--wheelhouse, --find-links and --index-url cannot go together: name one source")
    opts = UpgradeOptions(to=check_version(to), check=check, stage=stage,
                          launch=LaunchOptions(profile=profile,
                                               overrides={"port": server_port} if server_port else {}),
                          wheels=read_wheelhouse(wheelhouse) if wheelhouse and not check else {},
                          wheelhouse=wheelhouse, find_links=find_links, index_url=index_url, no_deps=no_deps,
                          install_timeout=install_timeout)
    from provision.output.progress import Display

    with Display(plain=ctx.as_json or not sys.stdout.isatty(), stream=sys.stderr if ctx.as_json else sys.stdout) as d:
        code = run_fleet(ctx, "upgrade", upgrade_fn(opts, d), check=check,
                         columns=["host", "verdict", "detail", "elapsed"])
    sys.exit(code)
