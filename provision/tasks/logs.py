"""`provision logs --follow`: stream one host's current server log, redacted."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # the typed messages (provision/host/protocol.py), checked by mypy
    from provision.host.protocol import LogsAnswer, ProbeAnswer


class _Notes:
    """Where steady_call's reconnect messages go while logs stream on stdout: stderr."""

    def message(self, host: str, text: str) -> None:
        click.echo(f"{host}: {text}", err=True)


def follow_logs(host, conn, opts, lines: int) -> int:
    """Print `host`'s current server log, then its new lines until Ctrl-C (exit code 0, or 3)."""
    from provision.control.runner import Fleet
    from provision.logs.redact import redact
    from provision.tasks.follow import steady_call
    from provision.tasks.options import resolve, secret_values

    prof, _ = resolve(host, opts)
    fleet = Fleet(conn)
    secrets = secret_values(opts.secrets)
    session = fleet.session(host).open()
    try:
        sudo = fleet.uses_sudo(host, session)
        from provision.tasks import recorded

        got = recorded.server_of(host, session, prof, opts, sudo)
        if not isinstance(got, tuple):
            click.echo(f"error: {got.detail}", err=True)
            return 2
        prof, note = got
        if note:
            click.echo(f"note: {note}", err=True)
        ans: LogsAnswer = session.call({"op": "logs", "port": prof.port, "lines": lines}, timeout=60, sudo=sudo)
        if not ans.get("ok"):
            click.echo(f"error: {ans['error']['message']}", err=True)
            return 3
        who = " ".join(str(x) for x in (ans.get("engine"), ans.get("version")) if x)
        click.echo(f"--- {host.name}: {ans.get('log')}" + (f" ({who})" if who else "") + " ---", err=True)
        click.echo(redact(ans["text"], secrets))
        offset = ans["offset"]
        log = ans.get("log")  # a new launch writes another log: the probe then answers with it from its start
        pending = ""
        outage: dict = {}  # a dropped connection is reconnected (--max-outage of launch's default)
        while True:
            time.sleep(1.0)
            req = {"op": "probe", "port": prof.port, "offset": offset, "health_timeout": 1, "log": log}
            p: ProbeAnswer = steady_call(session, req, timeout=60, sudo=sudo, opts=opts, display=_Notes(), host=host,
                                         st=outage)
            offset = p.get("offset", offset)
            if p.get("log_changed"):
                log = (p.get("record") or {}).get("log") or log
                if pending:
                    click.echo(redact(pending, secrets))
                pending = ""
                click.echo(f"--- {host.name}: a new launch: {log} ---", err=True)
            text = pending + (p.get("chunk") or "").replace("\r", "\n")
            *full, pending = text.split("\n")
            for line in full:
                click.echo(redact(line, secrets))
    except KeyboardInterrupt:
        return 0
    finally:
        session.close()
        fleet.close()
