"""Run one per-host function over many hosts: bounded parallelism, one session per host.

A slow or dead host never blocks the others: every connection and remote step
has a deadline, and every host ends in a HostResult, whatever happens.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Callable

from provision import sshconfig
from provision.errors import ProvisionError, UnknownOutcome
from provision.hostkeys import KnownHosts
from provision.inventory import Host
from provision.results import HostResult
from provision.ssh import GatewayPool, Session


@dataclass
class ConnOptions:
    """Connection settings from the command line (they win over inventory and ssh config)."""

    user: str | None = None
    port: int | None = None
    identity: str | None = None
    ssh_config: str | None = None
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    command_timeout: float = 300.0
    forks: int = 16
    sudo: bool | None = None
    extra: dict = field(default_factory=dict)


def target_for(host: Host, opts: ConnOptions, config) -> sshconfig.Target:
    kh = opts.known_hosts or host.get("known_hosts")
    strict = "accept-new" if opts.accept_new_host_keys else None
    return sshconfig.resolve(
        host.name, config=config, hostname=host.get("address"), user=opts.user or host.get("user"),
        port=opts.port or host.get("port"), identity=opts.identity or host.get("identity"),
        jump=host.get("jump"), known_hosts=[os.path.expanduser(kh)] if kh else None, strict=strict,
        connect_timeout=opts.connect_timeout)


class Fleet:
    """Opens sessions on demand; shares bastion connections; counts nothing itself."""

    def __init__(self, opts: ConnOptions):
        self.opts = opts
        self.config = sshconfig.load_ssh_config(opts.ssh_config)
        self.gateways = GatewayPool()
        self._known: dict[tuple, KnownHosts] = {}
        self._lock = threading.Lock()
        self.warnings: list[str] = []

    def known_for(self, target: sshconfig.Target) -> KnownHosts:
        key = target.known_hosts
        with self._lock:
            if key not in self._known:
                kh = KnownHosts(list(target.known_hosts))
                self._known[key] = kh
                self.warnings.extend(kh.warnings)
            return self._known[key]

    def session(self, host: Host) -> Session:
        target = target_for(host, self.opts, self.config)
        known = self.known_for(target)
        jump = sshconfig.resolve_jump(target.jump, config=self.config, base=target) if target.jump else None
        append = target.known_hosts[0] if target.known_hosts else None
        return Session(target, known=known, accept_append=append, gateways=self.gateways, jump_target=jump)

    def uses_sudo(self, host: Host, session: Session) -> bool:
        if self.opts.sudo is not None:
            return self.opts.sudo
        if host.get("sudo") is not None:
            return bool(host.get("sudo"))
        return session.target.user != "root"

    def close(self) -> None:
        self.gateways.close()


HostFn = Callable[[Host, Session, "Fleet"], HostResult]


def run_one(fleet: Fleet, host: Host, fn: HostFn) -> HostResult:
    t0 = time.monotonic()
    session = None
    try:
        session = fleet.session(host)
        session.open()
        res = fn(host, session, fleet)
    except UnknownOutcome as exc:
        res = HostResult(host.name, "unknown", str(exc), error_kind=exc.kind)
    except ProvisionError as exc:
        verdict = "unreachable" if exc.kind in ("connect",) else "failed"
        res = HostResult(host.name, verdict, str(exc), error_kind=exc.kind)
    except Exception as exc:  # noqa: BLE001 - one host's bug must not stop the fleet
        res = HostResult(host.name, "failed", f"internal error: {type(exc).__name__}: {exc}", error_kind="internal")
    finally:
        if session is not None:
            session.close()
    res.elapsed = round(time.monotonic() - t0, 3)
    return res


def run_hosts(fleet: Fleet, hosts: list[Host], fn: HostFn,
              on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
    """Run fn on every host, at most ``forks`` at once; results in inventory order."""
    results: dict[str, HostResult] = {}
    forks = max(1, min(fleet.opts.forks, len(hosts) or 1))
    with ThreadPoolExecutor(max_workers=forks, thread_name_prefix="host") as pool:
        futs = {pool.submit(run_one, fleet, h, fn): h for h in hosts}
        for fut in as_completed(futs):
            res = fut.result()
            results[futs[fut].name] = res
            if on_result is not None:
                on_result(res)
    return [results[h.name] for h in hosts]
