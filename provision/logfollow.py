"""`provision logs --follow`: stream one host's current server log, redacted."""

from __future__ import annotations

import time

import click

from provision.errors import UsageError


def follow_logs(ctx, opts, lines: int) -> int:
    from provision.cli import selected_hosts
    from provision.launch import resolve, secret_values
    from provision.redact import redact
    from provision.runner import Fleet

    hosts = selected_hosts(ctx)
    if len(hosts) != 1:
        raise UsageError("--follow works on one host at a time; select one with --host or --limit")
    host = hosts[0]
    prof, _ = resolve(host, opts)
    fleet = Fleet(ctx.conn)
    secrets = secret_values(opts.secrets)
    session = fleet.session(host).open()
    try:
        sudo = fleet.uses_sudo(host, session)
        ans = session.call({"op": "logs", "port": prof.port, "lines": lines}, timeout=60, sudo=sudo)
        if not ans.get("ok"):
            click.echo(f"error: {ans['error']['message']}", err=True)
            return 3
        click.echo(redact(ans["text"], secrets))
        offset = ans["offset"]
        pending = ""
        while True:
            time.sleep(1.0)
            p = session.call({"op": "probe", "port": prof.port, "offset": offset, "health_timeout": 1}, timeout=60,
                             sudo=sudo)
            offset = p.get("offset", offset)
            text = pending + (p.get("chunk") or "").replace("\r", "\n")
            *full, pending = text.split("\n")
            for line in full:
                click.echo(redact(line, secrets))
    except KeyboardInterrupt:
        return 0
    finally:
        session.close()
        fleet.close()
