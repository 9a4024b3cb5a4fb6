"""Run one per-host function over many hosts: bounded parallelism, one session per host.

A slow or dead host never blocks the others: every connection and remote step
has a deadline, and every host ends in a HostResult, whatever happens.

The Fleet picks how each host is reached (control/transport/: an SSH Session, this
machine with --local, a container on either with --container); the per-host functions
get a base.Transport and never know which.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from provision.control.transport import settings as sshconfig
from provision.errors import ProvisionError, UnknownOutcome, UsageError
from provision.config.inventory import Host
from provision.output.results import HostResult
from provision.control.transport.base import Transport

if TYPE_CHECKING:  # paramiko and fabric are imported only when a host is reached over SSH
    from provision.control.transport.hostkeys import KnownHosts
    from provision.control.transport.ssh import GatewayPool


@dataclass
class ConnOptions:
    """Connection settings from the command line (they win over inventory and ssh config)."""

    user: str | None = None
    port: int | None = None
    identity: str | None = None
    ssh_config: str | None = None
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float | None = None   # None: ConnectTimeout from ssh config, then 10 s
    command_timeout: float = 300.0
    forks: int = 16
    sudo: bool | None = None
    sudo_password_file: str | None = None
    local: bool = False                    # this machine, no connection (--local)
    container: str | None = None           # a running container on the host (--container NAME)
    runtime: str | None = None             # its runtime: docker, podman or auto (--runtime)
    state_dir: str | None = None           # with --local: the host-side state directory (--state-dir)
    extra: dict = field(default_factory=dict)


def target_for(host: Host, opts: ConnOptions, config) -> sshconfig.Target:
    kh = opts.known_hosts or host.get("known_hosts")
    strict = "accept-new" if opts.accept_new_host_keys else None
    return sshconfig.resolve(
        host.name, config=config, hostname=host.get("address"), user=opts.user or host.get("user"),
        port=opts.port or host.get("port"), identity=opts.identity or host.get("identity"),
        jump=host.get("jump"), proxy_command=host.get("proxy_command"),
        known_hosts=[os.path.expanduser(kh)] if kh else None, strict=strict, connect_timeout=opts.connect_timeout)


class Fleet:
    """Opens sessions on demand; shares bastion connections; counts nothing itself."""

    def __init__(self, opts: ConnOptions):
        self.opts = opts
        self.config = sshconfig.load_ssh_config(None if opts.local else opts.ssh_config)
        self.gateways: GatewayPool | None = None  # opened with the first SSH session
        self._known: dict[tuple, KnownHosts] = {}  # (user files, global files) -> loaded once
        self._lock = threading.Lock()
        self.warnings: list[str] = []
        self.live: set[Transport] = set()
        self.interrupted = threading.Event()
        self.sudo_password = read_sudo_password(opts.sudo_password_file, self.warnings)
        self._passwords: dict[str, bytes | None] = {}
        self._targets: dict[str, sshconfig.Target] = {}

    def known_for(self, target: sshconfig.Target) -> KnownHosts:
        from provision.control.transport.hostkeys import KnownHosts

        key = (target.known_hosts, target.global_known_hosts)
        with self._lock:
            if key not in self._known:
                kh = KnownHosts(list(target.known_hosts), system=target.global_known_hosts)
                self._known[key] = kh
                self.warnings.extend(kh.warnings)
            return self._known[key]

    def target(self, host: Host) -> sshconfig.Target | None:
        """The host's connection settings, resolved once per run (ssh config errors raise ConfigError);
        None for this machine (--local: nothing to connect to)."""
        if self.opts.local:
            return None
        with self._lock:
            got = self._targets.get(host.name)
        if got is None:
            got = target_for(host, self.opts, self.config)
            with self._lock:
                self._targets[host.name] = got
        return got

    def session(self, host: Host) -> Transport:
        """How this host is reached: an SSH session, or this machine (--local); with --container,
        the container through either."""
        transport: Transport
        if self.opts.local:
            from provision.control.transport.local import LocalTransport

            transport = LocalTransport(host.name, sudo_password=self.password_for(host), state_dir=self.opts.state_dir)
        else:
            from provision.control.transport.ssh import GatewayPool, Session

            target = self.target(host)
            assert target is not None
            with self._lock:
                if self.gateways is None:
                    self.gateways = GatewayPool(known_for=self.known_for)
            known = self.known_for(target)
            append = target.known_hosts[0] if target.known_hosts else None
            transport = Session(target, known=known, accept_append=append, gateways=self.gateways,
                                sudo_password=self.password_for(host))
        if self.opts.container:
            from provision.control.transport.container import ContainerTransport

            transport = ContainerTransport(transport, self.opts.container, self.opts.runtime)
        return transport

    def password_for(self, host: Host) -> bytes | None:
        """--sudo-password-file wins; else the host's `sudo_password_file` (ansible_become_password_file),
        each file read once per run."""
        if self.sudo_password is not None or not host.get("sudo_password_file"):
            return self.sudo_password
        path = os.path.expanduser(str(host.get("sudo_password_file")))
        with self._lock:
            if path not in self._passwords:
                self._passwords[path] = read_sudo_password(path, self.warnings)
            return self._passwords[path]

    def track(self, session: Transport, alive: bool) -> None:
        with self._lock:
            (self.live.add if alive else self.live.discard)(session)
        if alive and self.interrupted.is_set():
            session.cancel()

    def cancel_all(self) -> None:
        """Ctrl-C: every host stops waiting now (a step in flight ends as "unknown")."""
        self.interrupted.set()
        with self._lock:
            live = list(self.live)
        for session in live:
            session.cancel()

    def uses_sudo(self, host: Host, session: Transport) -> bool:
        if self.opts.sudo is not None:
            return self.opts.sudo
        if host.get("sudo") is not None:
            return bool(host.get("sudo"))
        return session.default_sudo

    def close(self) -> None:
        if self.gateways is not None:
            self.gateways.close()
        self.config.close()


def read_sudo_password(path: str | None, warnings: list[str]) -> bytes | None:
    """The first line of --sudo-password-file (without its newline), read once per run."""
    if not path:
        return None
    path = os.path.expanduser(path)
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            data = fh.read(65536)
    except OSError as exc:
        raise UsageError(f"--sudo-password-file {path}: cannot read it ({exc.strerror}); nothing was done") from None
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    if not line:
        raise UsageError(f"--sudo-password-file {path}: the first line is empty; nothing was done")
    if st.st_mode & 0o077:
        warnings.append(f"--sudo-password-file {path} is readable by others (mode {st.st_mode & 0o777:o}); "
                        f"chmod 600 it")
    return line


# A host function returns one HostResult, or one per spec (patch, status, ...: one row per host and spec).
# It may carry an `on_host_done(host, result)` attribute: called with every host's final result, also
# when the host was never reached and the function never ran.
HostFn = Callable[[Host, Transport, "Fleet"], "HostResult | list[HostResult]"]


def run_one(fleet: Fleet, host: Host, fn: HostFn) -> HostResult | list[HostResult]:
    t0 = time.monotonic()
    res: HostResult | list[HostResult]
    session = None
    try:
        session = fleet.session(host)
        fleet.track(session, True)
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
            fleet.track(session, False)
            session.close()
    done = getattr(fn, "on_host_done", None)
    if done is not None:
        # every host's final row, also when fn never ran (the host was not reached): a multi-node
        # launch learns at once that rank 0 is not coming (tasks/multinode.py)
        try:
            done(host, res)
        except Exception:  # noqa: BLE001 - a hook's bug must not lose the host's row
            pass
    elapsed = round(time.monotonic() - t0, 3)
    for r in (res if isinstance(res, list) else [res]):
        if session is not None:
            r.data.setdefault("transport", session.kind)  # ssh, local or container
            if session.kind == "container":
                r.host = session.label  # HOST/NAME: the container's file is not the host's
        r.elapsed = elapsed
    return res


def run_hosts(fleet: Fleet, hosts: list[Host], fn: HostFn,
              on_result: Callable[[HostResult], None] | None = None) -> list[HostResult]:
    """Run fn on every host, at most ``forks`` at once; results in inventory order (a host whose
    fn returns several rows, one per spec, gives them in the fn's order)."""
    results: dict[str, list[HostResult]] = {}
    forks = max(1, min(fleet.opts.forks, len(hosts) or 1))
    pool = ThreadPoolExecutor(max_workers=forks, thread_name_prefix="host")
    try:
        # every host's ssh settings first (one `ssh -G` per name, in parallel): a config error is
        # a usage error (exit 2) before any host is touched, not one failed host after another
        list(pool.map(fleet.target, hosts))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    futs = {pool.submit(run_one, fleet, h, fn): h for h in hosts}
    try:
        for fut in as_completed(futs):
            got = fut.result()
            rows = got if isinstance(got, list) else [got]
            results[futs[fut].name] = rows
            if on_result is not None:
                for res in rows:
                    on_result(res)
    except KeyboardInterrupt:
        # Ctrl-C: hosts not started never start; hosts mid-step stop waiting at once (their
        # outcome is "unknown") and are reported; then the interrupt goes on up.
        fleet.cancel_all()
        pool.shutdown(wait=False, cancel_futures=True)
        pending = [f for f in futs if futs[f].name not in results]
        done, _ = wait(pending, timeout=(fleet.opts.connect_timeout or sshconfig.DEFAULT_CONNECT_TIMEOUT) + 5)
        for fut in pending:
            if fut in done and not fut.cancelled() and fut.exception() is None and on_result is not None:
                got = fut.result()
                for res in (got if isinstance(got, list) else [got]):
                    on_result(res)
        raise
    pool.shutdown(wait=True)
    return [r for h in hosts for r in results[h.name]]
