"""Rolling execution: batch after batch, each healthy before the next; stop on --max-fail."""

from __future__ import annotations

import sys

import click

from provision.control import plan
from provision.output import report
from provision.output.results import HostResult


def run_rolling(ctx, hosts, command: str, make_fn, serial, max_fail, plain: bool, *, groups: list | None = None,
                exit_code=None, stopped_why: str | None = None, report_interrupt: bool = True) -> int:
    """Run make_fn(display) on `hosts` (picked by the CLI) in --serial batches (or the `groups`
    given: upgrade's canary first); ctx carries the connection options (ctx.conn) and the output
    mode (ctx.as_json, ctx.fmt). `exit_code(results)`: the command's own, if it has one;
    `stopped_why`: what a host not reached says (default: the --max-fail words); `report_interrupt`:
    on a Ctrl-C, print every host's row and the summary (or the --json document) before the interrupt
    goes on up (False: the command reports it itself, as launch does from what each host got to)."""
    from provision.control.runner import Fleet, run_hosts
    from provision.output.progress import Display

    if not hosts:
        click.echo("error: no host matched the selection; nothing was done", err=True)
        return report.EXIT_NOTHING
    from provision.control.journal import Writer

    groups = groups if groups is not None else plan.batches(hosts, serial)
    fleet = Fleet(ctx.conn)
    writer = Writer(command)  # each host's row journaled as it arrives: an interrupt keeps them

    came: list[HostResult] = []  # every row as it arrived (an interrupted batch's too)

    def arrived(r: HostResult) -> None:
        """Journaled, then said (its line and notes): a Ctrl-C later keeps and shows what came back."""
        came.append(r)
        writer(r)
        if not ctx.as_json:
            click.echo(report.host_line(r))
            for note in r.notes:
                click.echo(f"    note: {note}")

    results: list[HostResult] = []
    failed = 0
    try:
        with Display(plain=plain, stream=sys.stderr if ctx.as_json else sys.stdout) as display:
            fn = make_fn(display)
            for i, batch in enumerate(groups, 1):
                if plan.should_stop(failed, max_fail):
                    for h in batch:
                        results.append(HostResult(h.name, "skipped", stopped_why or (
                            f"not run: the roll stopped after {failed} failed host(s) (--max-fail {max_fail})")))
                        if not ctx.as_json:  # each host said, as the others were (piped output has no table)
                            click.echo(report.host_line(results[-1]))
                    continue
                if not ctx.as_json:
                    display.message("roll", f"batch {i}/{len(groups)}: {', '.join(h.name for h in batch)}")
                got = run_hosts(fleet, batch, fn, on_result=arrived)
                results += got
                failed += sum(1 for r in got if r.failed)
    except KeyboardInterrupt:
        if report_interrupt:  # what came back, every host not reached said so; then exit 130
            from provision.errors import EXIT_INTERRUPTED

            seen = {r.host for r in came}
            rows = came + [HostResult(h.name, "skipped", "not run: the run was interrupted before this host")
                           for b in groups for h in b if h.name not in seen]
            if ctx.as_json:
                click.echo(report.to_document(command, rows, EXIT_INTERRUPTED,
                                              {"batches": [[h.name for h in b] for b in groups], "interrupted": True},
                                              secrets=getattr(ctx, "secrets", ())))
            else:
                for r in rows[len(came):]:
                    click.echo(report.host_line(r))
                click.echo(report.summary_line(rows))
        raise
    finally:
        fleet.close()
        for w in writer.warnings:
            click.echo(f"warning: {w}", err=True)
    code = exit_code(results) if exit_code else report.exit_code(results)
    if any(r.verdict == "skipped" for r in results) and code == 0:
        code = report.EXIT_FAILED
    if ctx.as_json:
        click.echo(report.to_document(command, results, code, {"batches": [[h.name for h in b] for b in groups]},
                                      secrets=getattr(ctx, "secrets", ())))
    else:
        if getattr(ctx, "fmt", "table") == "table":
            report.print_table(*_cols_rows(results))
        click.echo(report.summary_line(results))
    return code


def _cols_rows(results):
    cols = ["host", "verdict", "detail", "elapsed"]
    return cols, report.host_rows(results, cols)
