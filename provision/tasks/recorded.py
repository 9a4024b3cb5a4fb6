"""Which server a verb acts on when nothing names it (issue 63): the one provision recorded on the host.

`stop`, `bench`, `wait`, `logs` and `status` act on the port the host's launch profile says (30000 by default). A
server started with `launch --playbook X` on another port (a vLLM profile on 8000) was then never
found: `stop` answered "not-running" with exit 0 while it ran. Now, when neither `--server-port`,
`--playbook` nor the inventory's `profile:` names the port and nothing provision started is recorded
there, the host's own records decide: the one live server provision started there is the one acted
on (the row says so); several are refused, listed, with the option that picks one.
"""

from __future__ import annotations

from provision.config.inventory import Host
from provision.output.results import HostResult
from provision.tasks.selection import selector


def named(host: Host, profile: str | None, port: int | None) -> bool:
    """Whether this run or the inventory names the server: --server-port, --playbook, the host's
    `profile:` or its `args: port`."""
    return bool(port or profile or host.get("profile") or (host.get("args") or {}).get("port"))


def choose(host: str, default_port: int, answer: dict) -> tuple[int, str] | HostResult:
    """(the port to act on, the row's note or ""), or the refused row (several recorded). `answer`:
    the host's server_status of `default_port` asked with `elsewhere`. Pure."""
    rec = answer.get("record") or {}
    others = answer.get("elsewhere") or []
    if (rec and not rec.get("stopped_at")) or not others:
        return default_port, ""
    if len(others) == 1:
        o = others[0]
        return int(o["port"]), (f"no server named: the one provision recorded on this host, port {o['port']} "
                                f"({o.get('engine')}, playbook {o.get('profile') or 'unnamed'}, pid {o.get('pid')})")
    listed = "; ".join(f"port {o['port']} ({o.get('engine')}, playbook {o.get('profile') or 'unnamed'})" for o in others)
    return HostResult(host, "refused", f"nothing recorded on port {default_port}, and provision started "
                      f"{len(others)} servers here: {listed}; name one: `--server-port PORT` "
                      f"({selector(host)} --server-port {others[0]['port']})", error_kind="usage")


def port_for(host: Host, session, default_port: int, sudo: bool) -> tuple[int, str] | HostResult:
    """`choose` over the host's answer (one server_status call)."""
    ans = session.call({"op": "server_status", "port": default_port, "elsewhere": True}, timeout=60, sudo=sudo)
    return choose(host.name, default_port, dict(ans))


def server_of(host: Host, session, prof, opts, sudo: bool):
    """(the profile of the server to act on, the row's note or "") or the refused row: `prof` when
    the run or the inventory names the server; else, for the one server provision recorded on
    another port, its recorded launch (its port, its engine: a vLLM profile's log is read as vLLM's)."""
    from dataclasses import replace

    from provision.config.profile import from_record
    from provision.errors import ConfigError

    if named(host, opts.profile, opts.overrides.get("port")):
        return prof, ""
    got = port_for(host, session, prof.port, sudo)
    if isinstance(got, HostResult):
        return got
    port, note = got
    if port == prof.port:
        return prof, note
    st = session.call({"op": "server_status", "port": port}, timeout=60, sudo=sudo)
    rec = (st or {}).get("record") or {}
    launch = rec.get("launch")
    if isinstance(launch, dict):
        try:
            return from_record(launch, rec.get("profile") or "unnamed", f"{host.name}: the record of port {port}",
                               {"port": port}), note
        except ConfigError:  # a record this version cannot read back: the port alone
            pass
    return replace(prof, args={**prof.args, "port": port}), note
