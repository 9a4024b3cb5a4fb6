"""Multi-node servers: one SGLang server spread over several hosts (inventory `server:` + `node_rank:`).

The coordinator of a launch (and of reconcile's restarts, which go through launch): every rank
gets SGLang's own --nnodes, --node-rank and --dist-init-addr; readiness is judged on rank 0; the
other ranks wait for rank 0's verdict while watching their own process.

Rank 0's verdict arrives whatever happens to it: from the launch itself, and from the runner's
``on_host_done`` hook when rank 0 was never reached (a refused or silent host, a dead gateway), so
the other ranks never wait for a rank 0 that is not coming. When rank 0 did not come up, the other
ranks do not start, or are stopped at once: a group whose rank 0 failed holds no GPUs.

The default --dist-init-addr is rank 0's address as SSH resolves it (its inventory `address`, else
the HostName `ssh -G` gives for its name), not its inventory name, which is often an ssh alias the
peers cannot resolve.

No SSH here: the launch hands in how to resolve a host, probe a rank and stop it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from provision.config.inventory import Host
from provision.errors import ConfigError
from provision.output.results import HostResult
from provision.tasks.selection import selector

DIST_INIT_PORT = 50000
UP = ("ready", "running")  # rank 0 verdicts under which the other ranks keep running
# rank 0 verdicts that leave its server running, still starting, as far as anyone knows (the follow
# lost the host past --max-outage, or --deadline passed): the other ranks keep running with it, or
# rank 0 would sit in NCCL holding its GPUs for a group that was torn down under it
LEFT_RUNNING = ("unknown", "timeout")


class MultiNode:
    """The multi-node servers among the selected hosts, and rank 0's verdict for each."""

    def __init__(self, hosts: list[Host]):
        self.members: dict[str, list[Host]] = {}
        for h in hosts:
            if h.get("server"):
                self.members.setdefault(str(h.get("server")), []).append(h)
        self.done: dict[str, threading.Event] = {name: threading.Event() for name in self.members}
        self.verdict: dict[str, str] = {}
        self.detail: dict[str, str] = {}
        self.addresses: dict[str, tuple[str, str]] = {}   # server -> (rank 0's address, where it came from)
        self._lock = threading.Lock()
        for name, hs in self.members.items():
            ranks = sorted(int(h.get("node_rank", -1)) for h in hs)
            if ranks != list(range(len(hs))):
                raise ConfigError(f"server {name}: node_rank values {ranks} must be 0..{len(hs) - 1}, "
                                  "one per host (select every host of a multi-node server)")

    def rank0(self, name: str) -> Host:
        return next(h for h in self.members[name] if int(h.get("node_rank")) == 0)

    def resolve_addresses(self, hostname_of: Callable[[Host], str | None]) -> None:
        """Rank 0's address for each server, once: its inventory `address`, else what SSH resolves its
        name to (`hostname_of`: ssh -G's HostName), else the name itself."""
        with self._lock:
            for name in self.members:
                if name in self.addresses:
                    continue
                r0 = self.rank0(name)
                if r0.get("address"):
                    self.addresses[name] = (str(r0.get("address")), "its inventory address")
                    continue
                try:
                    got = hostname_of(r0)
                except Exception:  # noqa: BLE001 - an unresolvable name keeps the name (the host will fail anyway)
                    got = None
                if got and got != r0.name:
                    self.addresses[name] = (got, "its HostName in the ssh config (ssh -G)")
                else:
                    self.addresses[name] = (r0.name, "its inventory name (no address or HostName set)")

    def args_for(self, host: Host, engine: str) -> dict:
        """The flags that place `host`'s rank, in `engine`'s words (its `multinode_args`): rank 0's
        own address flags when its inventory `args:` set them, else its resolved address."""
        from provision.host import inference

        name = host.get("server")
        if not name or name not in self.members:
            return {}
        eng = inference.get(engine)
        hs = self.members[name]
        r0 = self.rank0(name)
        resolved = self.addresses.get(name)
        out = eng.multinode_args(len(hs), int(host.get("node_rank")),
                                 resolved[0] if resolved else str(r0.get("address") or r0.name), DIST_INIT_PORT)
        given = {k: v for k, v in (r0.get("args") or {}).items() if k in eng.multinode_addr_flags}
        return {**out, **given}

    def address_note(self, host: Host, engine: str) -> str | None:
        """The row's note saying where the default meeting address came from (None: set explicitly)."""
        from provision.host import inference

        name = host.get("server")
        flags = inference.get(engine).multinode_addr_flags
        if not name or name not in self.members or any(f in (self.rank0(name).get("args") or {}) for f in flags):
            return None
        resolved = self.addresses.get(name)
        if resolved is None:
            return None
        said = " and ".join("--" + f for f in flags)
        return (f"{said} {resolved[0]}:{DIST_INIT_PORT}: rank 0 ({self.rank0(name).name}) at {resolved[1]}; "
                f"set {', '.join(f + ': ...' for f in flags)} in rank 0's `args:` to choose another")

    def rank(self, host: Host) -> int | None:
        return int(host.get("node_rank")) if host.get("server") in self.members else None

    def finish(self, host: Host, verdict: str, detail: str = "") -> None:
        """Rank 0's verdict (the first one given counts; other ranks are ignored)."""
        name = host.get("server")
        if name in self.done and self.rank(host) == 0:
            with self._lock:
                if self.done[name].is_set():
                    return
                self.verdict[name] = verdict
                self.detail[name] = detail
            self.done[name].set()

    def host_done(self, host: Host, result) -> None:
        """The runner's hook: every host's final row, also when it was never reached."""
        rows = result if isinstance(result, list) else [result]
        if rows:
            self.finish(host, rows[0].verdict, rows[0].detail)

    def rank0_failed(self, host: Host) -> str | None:
        """Why this rank must not run (rank 0 already ended without coming up), or None."""
        name = host.get("server")
        if name not in self.done or not self.done[name].is_set() or self.verdict.get(name) in UP + LEFT_RUNNING:
            return None
        r0 = self.rank0(name)
        return f"rank 0 of server {name} ({r0.name}) {self.verdict.get(name)}: {self.detail.get(name) or 'no detail'}"


def follow_secondary(host: Host, multinode: MultiNode, *, poll: float, deadline: float,
                     probe: Callable[[], "dict | HostResult"],
                     stop: Callable[[], HostResult]) -> HostResult:
    """A rank > 0 of a multi-node server: watch its own process until rank 0 has a verdict. If rank 0
    did not come up (unreachable, refused, failed, crashed), stop this rank at once to free its GPUs.

    `probe()`: this rank's probe answer, or its row when the host was lost; `stop()`: stop this
    rank's server, its row (verdict stopped when it did)."""
    name = host.get("server")
    rank = multinode.rank(host)
    t0 = time.monotonic()
    while not multinode.done[name].wait(timeout=poll):
        ans = probe()
        if isinstance(ans, HostResult):
            return ans
        if not ans.get("running"):
            return HostResult(host.name, "crashed", f"rank {rank} of server {name} exited "
                              f"(exit status {ans.get('exit')}); see `provision logs {selector(host.name)}`")
        if time.monotonic() - t0 > deadline:
            return HostResult(host.name, "timeout", f"rank 0 of server {name} not ready after {deadline:g} s; "
                              f"this rank (rank {rank}) was left running with it")
    v = multinode.verdict.get(name)
    if v in UP:
        return HostResult(host.name, "ready", f"rank {rank} of server {name}; "
                          "the server is ready (judged on rank 0)")
    if v in LEFT_RUNNING:
        r0 = multinode.rank0(name)
        return HostResult(host.name, str(v), f"rank 0 of server {name} ({r0.name}) ended {v}: "
                          f"{multinode.detail.get(name) or 'no detail'}; this rank (rank {rank}) was left running "
                          f"with it: `provision wait {selector(r0.name)}` follows the group on, "
                          f"`provision stop` ends it", data={"stopped": False, "rank0_verdict": v})
    why = multinode.rank0_failed(host) or f"rank 0 of server {name} ended {v}"
    stopped = stop()
    if stopped.verdict in ("stopped", "not-running"):
        return HostResult(host.name, "failed", f"{why}; this rank (rank {rank}) was stopped to free its GPUs: "
                          f"{stopped.detail}", data={"stopped": True, "rank0_verdict": v})
    return HostResult(host.name, "failed", f"{why}; stopping this rank (rank {rank}) failed: {stopped.detail}; "
                      f"`provision stop {selector(host.name)}`", data={"stopped": False, "rank0_verdict": v})
