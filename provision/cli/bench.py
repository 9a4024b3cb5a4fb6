"""`provision bench`: does EAGLE-3 pay off on every host?"""

from __future__ import annotations

import sys

import click

from provision.cli.main import _journal, fleet_options, metrics_options, selected_hosts, server_port_option, \
    transport_options, write_metrics
from provision.errors import EXIT_NOTHING, EXIT_USAGE, ConfigError


@click.command()
@fleet_options
@transport_options(container=False)
@server_port_option("the host's launch profile's, then 30000")
@click.option("--requests", "-n", "requests", type=click.IntRange(1, 1000), default=15, show_default=True,
              help="Measured requests per host, strictly one at a time.")
@click.option("--max-new-tokens", type=click.IntRange(2, 65536), default=512, show_default=True,
              help="max_new_tokens of each request (temperature 0).")
@click.option("--warmup", type=click.IntRange(0, 100), default=2, show_default=True,
              help="Requests sent first and not measured.")
@click.option("--baseline", "baseline_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Baseline figures (from --save-baseline): each EAGLE-3 host gets a speedup against the entry "
                   "without speculative decoding of its model path, tp-size, engine version and GPU name, and is "
                   "held to the file's EAGLE-3 entry of its model, tp-size and GPU on ANY release (its own "
                   "release's if saved): flagged `regressed` below --min-ratio.")
@click.option("--save-baseline", metavar="FILE", type=click.Path(dir_okay=False),
              help="Write the measured hosts' figures as baseline entries: those without speculative decoding "
                   "(the speedup's denominator) and the EAGLE-3 ones (what a later release is held to); "
                   "entries of other keys already in FILE are kept.")
@click.option("--min-speedup", type=click.FloatRange(min=0), default=1.3, show_default=True,
              help="Flag a host `underperforming` below this speedup (needs --baseline).")
@click.option("--min-accept-length", type=click.FloatRange(min=0), default=1.8, show_default=True,
              help="Flag a host `underperforming` below this accept length (1.8 suits steps 3, topk 1, "
                   "4 draft tokens).")
@click.option("--compare-last", is_flag=True,
              help="Compare each host with its own last bench in the journal (same model, tp-size, GPU and "
                   "speculative setting, any release): flag it `regressed` below --min-ratio. A canary on a new "
                   "release is caught here; the outlier rule compares only hosts of one release.")
@click.option("--min-ratio", type=click.FloatRange(min=0, min_open=True), default=0.9, show_default=True,
              help="With --compare-last or --baseline: the lowest decode tok/s, as a share of the host's last "
                   "bench or of the baseline's EAGLE-3 figure, not flagged.")
@click.option("--force", is_flag=True,
              help="Measure a server that is serving traffic (/flush_cache answers 400); the figures then "
                   "include that traffic, and say so.")
@click.option("--api-key-file", metavar="FILE",
              help="The server's API key (default: PROVISION_API_KEY, then the key the launch left in the "
                   "host's 0600 --config file).")
@click.option("--admin-api-key-file", metavar="FILE",
              help="The server's admin key, which SGLang alone accepts on /flush_cache once it has one "
                   "(default: PROVISION_ADMIN_API_KEY, then the launch's --config file).")
@metrics_options
def bench(ctx, server_port, requests, max_new_tokens, warmup, baseline_file, save_baseline, min_speedup,
          min_accept_length, compare_last, min_ratio, force, api_key_file, admin_api_key_file, metrics_file):
    """Measure each host's running server: single-stream decode speed, accept length, speedup.

    \b
    For each host (hosts in parallel up to --forks, one server at a time each),
    from the host itself (the port is usually bound to 127.0.0.1):
      /server_info (version, speculative_* settings), /model_info;
      POST /flush_cache (with the admin key when the server has one): 400
      means the server is busy: skipped (--force);
      --warmup requests, then --requests streaming /generate, one at a time,
      temperature 0, the shipped prompts (code, prose, math, a JSON tool call,
      a long context) in order.
    decode tok/s = (completion_tokens - 1) / (t_last - t_first) per request; the
    host's figure is the median (with p10, p90). accept length =
    sum(completion_tokens) / sum(spec_verify_ct).
    vLLM (the server's engine, from its record): /v1/models, streaming
    /v1/completions, busy when vllm:num_requests_running > 0; accept length =
    1 + accepted / drafts and accept rate = accepted / draft tokens, from the
    vllm:spec_decode_* counters of /metrics before and after the requests.

    \b
    A baseline is a server launched without --speculative-*: measure those with
    --save-baseline FILE, then the EAGLE-3 hosts with --baseline FILE. EAGLE-3
    hosts saved too are what a later release is held to: `regressed` below
    --min-ratio of their saved figure, on any release.
    Flags: no-spec (speculation on, but no spec_verify_ct or drafts counted),
    net-negative (speedup < 1), underperforming (< --min-speedup or accept
    length < --min-accept-length), outlier (< 0.85 x the median of this run's
    hosts with the same model, tp-size, version and GPU).

    \b
    Time: the defaults (2 + 15 requests of 512 tokens) take about 3 minutes a
    host at 50 tok/s; `-n 3 --max-new-tokens 64` takes seconds. The run says its
    expected time first, then each host's requests as they finish (stderr).

    \b
    Exit 0 all measured and unflagged (busy hosts are skipped, not failed),
    8 a host is flagged, 3 a host failed (down, loading, 401, a broken stream).
    Every host's figures are journaled: `provision history --host H`.
    """
    from provision.config.profile import secrets_from_env
    from provision.control.runner import Fleet, run_hosts
    from provision.output.prometheus import bench_metrics
    from provision.tasks import bench as tb

    baseline = read_baseline(baseline_file, "--baseline") if baseline_file else None
    old_entries = (read_baseline(save_baseline, "--save-baseline", missing_ok=True) or {}) if save_baseline else {}
    secrets = secrets_from_env(files={"api-key": api_key_file, "admin-api-key": admin_api_key_file})
    opts = tb.BenchOptions(port=server_port, requests=requests, max_new_tokens=max_new_tokens, warmup=warmup,
                           force=force, secrets={"args": {k: v for k, v in secrets["args"].items()
                                                          if k in ("api-key", "admin-api-key")}},
                           timeout=ctx.conn.command_timeout)
    hosts = selected_hosts(ctx)
    if not hosts:
        click.echo("error: no host matched the selection; nothing was done", err=True)
        sys.exit(EXIT_NOTHING)
    from provision.output.progress import Display

    click.echo(tb.plan_line(opts, len(hosts)), err=True)
    fleet = Fleet(ctx.conn)
    try:
        with Display(plain=not sys.stderr.isatty(), stream=sys.stderr) as display:
            results = run_hosts(fleet, hosts, tb.bench_fn(opts, display.step))
    finally:
        fleet.close()
    for w in dict.fromkeys(fleet.warnings):
        click.echo(f"warning: {w}", err=True)
    last = None
    if compare_last:  # (before this run's rows are journaled)
        from provision.control import journal
        from provision.output import benchfigures as bfig

        last = bfig.last_figures(journal.read()[0])
    tb.judge(results, baseline, min_speedup=min_speedup, min_accept_length=min_accept_length, last=last,
             min_ratio=min_ratio)
    _journal("bench", results)
    code = tb.exit_code(results)
    if save_baseline and not save_baseline_file(save_baseline, old_entries, results) and code == 0:
        code = EXIT_USAGE
    metrics = bench_metrics(results) if (ctx.fmt == "prometheus" or metrics_file) else ""
    write_metrics(metrics_file, metrics)
    if ctx.fmt == "prometheus":
        click.echo(metrics, nl=False)
    elif ctx.as_json:
        from provision import __version__

        from provision.output.report import dumps_redacted
        from provision.tasks.options import secret_values

        click.echo(dumps_redacted({"tool": "provision", "version": __version__, "command": "bench", "exit_code": code,
                               "summary": tb.summary_line(results), "baseline": baseline_file,
                               "hosts": [tb.record(r) for r in results]}, secret_values(opts.secrets)))
    else:
        for r in results:
            click.echo(tb.host_line(r))
            for note in r.notes:
                click.echo(f"    note: {note}")
        if ctx.fmt == "table":
            print_bars(results)
        click.echo(tb.summary_line(results))
    sys.exit(code)


def read_baseline(path: str, option: str, missing_ok: bool = False) -> dict | None:
    """A baseline file's entries; None when it is absent and may be (`--save-baseline`'s first run)."""
    from provision.output import benchfigures as bf

    try:
        with open(path, encoding="utf-8") as fh:
            return bf.parse_baseline(fh.read(), path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise ConfigError(f"{option} {path}: cannot read it (No such file or directory)") from None
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot read it ({exc.strerror})") from None


def save_baseline_file(path: str, old_entries: dict, results) -> bool:
    """--save-baseline: the measured hosts without speculative decoding merged into the file's entries;
    False when there was none (nothing written)."""
    from datetime import datetime

    from provision.output import benchfigures as bf
    from provision.output.prometheus import write_atomic

    now = datetime.now().astimezone().isoformat(timespec="seconds")
    entries, notes = bf.baseline_entries({r.host: r.data for r in results if r.verdict == "measured"}, now)
    for n in notes:
        click.echo(f"note: {n}", err=True)
    if not entries:  # asked for and not done: never exit 0 on it
        click.echo(f"error: --save-baseline {path}: no host was measured, so nothing was written", err=True)
        return False
    text = bf.render_baseline(bf.merge_baseline(old_entries, entries), now)
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise ConfigError(f"--save-baseline {path}: cannot write it ({exc.strerror})") from None
    click.echo(f"saved {len(entries)} baseline entr{'y' if len(entries) == 1 else 'ies'} to {path}", err=True)
    return True


def print_bars(results) -> None:
    """On a terminal: one bar per measured host (decode tok/s), its baseline's under it, so a glance
    finds the slow host."""
    from rich.console import Console
    from rich.text import Text

    rows = [r for r in results if r.verdict == "measured" and r.data.get("decode_tok_s") is not None]
    if not rows:
        return
    top = max(max(r.data["decode_tok_s"], r.data.get("baseline_decode_tok_s") or 0) for r in rows) or 1.0
    width = max(len(r.host) for r in rows)
    console = Console(highlight=False)
    span = max(10, min(50, console.width - width - 30))
    for r in rows:
        d = r.data
        style = "bold red" if d.get("flags") else ("green" if d.get("spec_on") else "cyan")
        n = max(1, round(span * d["decode_tok_s"] / top))
        line = Text(f"{r.host:<{width}}  ")
        line.append("█" * n, style=style)
        line.append(f" {d['decode_tok_s']:.1f} tok/s" + (f"  {', '.join(d['flags'])}" if d.get("flags") else ""))
        console.print(line)
        base = d.get("baseline_decode_tok_s")
        if base:
            b = Text(f"{'':<{width}}  ")
            b.append("░" * max(1, round(span * base / top)), style="dim")
            b.append(f" {base:.1f} baseline")
            console.print(b)
