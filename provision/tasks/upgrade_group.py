"""A multi-node server's upgrade as one unit (issue 62): its ranks meet at each step.

A server spread over several hosts (inventory `server:` and `node_rank:`) must never run two
releases at once, so its ranks move together, as LeaderWorkerSet moves a group: every rank
prepares its own node (the install or the image, the judge) and says how it ended, and no rank
stops until every rank's preparation passed; rank 0 (the one serving HTTP) is benched; every rank
restarts together (launch's own multi-node stages, one `MultiNode` per restart); rank 0 is gated,
and its decision, keep or roll back, is every rank's.

A rank that ends early (refused, unreachable, an error: the runner's `on_host_done` hook) is seen
by the others at once: they stop waiting and say which rank ended and why, and nothing has
stopped if it was before the restart. A Ctrl-C (the fleet's `interrupted` event) ends every wait.
No SSH here: the ranks' own threads act, this only carries what they say to each other.
"""

from __future__ import annotations

import threading

from provision.config.inventory import Host
from provision.tasks.multinode import MultiNode

# Steps the ranks meet at: each rank's preparation, rank 0's figure from before, every rank's
# restart, rank 0's decision after its gate.
PREPARED, BEFORE, RESTARTED, DECISION = "prepared", "before", "restarted", "decision"
POLL = 0.5


class Rendezvous:
    """The multi-node servers among the selected hosts and what each rank posted at each step."""

    def __init__(self, hosts: list[Host]) -> None:
        self.members: dict[str, list[Host]] = {}
        for h in hosts:
            if h.get("server"):
                self.members.setdefault(str(h.get("server")), []).append(h)
        self._cond = threading.Condition()
        self._posts: dict[tuple[str, str], dict[int, object]] = {}
        self._gone: dict[str, dict[int, str]] = {}
        self._multinode: dict[tuple[str, str], MultiNode] = {}

    def of(self, host: Host) -> str | None:
        """The multi-node server `host` is a rank of, or None."""
        name = host.get("server")
        return str(name) if name and str(name) in self.members else None

    @staticmethod
    def rank(host: Host) -> int:
        return int(host.get("node_rank", 0))

    def head(self, name: str) -> Host:
        return next(h for h in self.members[name] if self.rank(h) == 0)

    def multinode(self, name: str, restart: str) -> MultiNode:
        """The coordinator of one restart of the group (onto the new side, or back): shared by its
        ranks, a fresh one for each restart (rank 0's verdict is per start)."""
        with self._cond:
            key = (name, restart)
            if key not in self._multinode:
                self._multinode[key] = MultiNode(self.members[name])
            return self._multinode[key]

    def post(self, host: Host, step: str, value: object) -> None:
        name = self.of(host)
        if name is None:
            return
        with self._cond:
            self._posts.setdefault((name, step), {})[self.rank(host)] = value
            self._cond.notify_all()

    def host_done(self, host: Host, result) -> None:
        """The runner's hook: a rank's final row (also when it was never reached). A rank that ends
        before posting at a step is seen by the ranks waiting there."""
        name = self.of(host)
        if name is None:
            return
        rows = result if isinstance(result, list) else [result]
        words = f"{rows[0].verdict}: {rows[0].detail}" if rows else "ended"
        with self._cond:
            self._gone.setdefault(name, {})[self.rank(host)] = words
            self._cond.notify_all()

    def gather(self, host: Host, step: str, interrupted: threading.Event | None = None, *,
               only_head: bool = False, timeout: float | None = None) -> tuple[dict[int, object], str | None]:
        """Every rank's post at `step` (or rank 0's alone), and None; or what was posted and why the
        wait ended without the rest: a rank that ended first (its row's words), a Ctrl-C, the
        timeout."""
        import time

        name = self.of(host)
        if name is None:
            return {}, None
        want = [0] if only_head else sorted(self.rank(h) for h in self.members[name])
        by_rank = {self.rank(h): h for h in self.members[name]}
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                got = dict(self._posts.get((name, step), {}))
                missing = [r for r in want if r not in got]
                if not missing:
                    return got, None
                gone = self._gone.get(name, {})
                for r in missing:
                    if r in gone:
                        h = by_rank[r]
                        return got, f"rank {r} of server {name} ({h.name}) ended {gone[r]}"
                if interrupted is not None and interrupted.is_set():
                    return got, "interrupted"
                if end is not None and time.monotonic() > end:
                    ranks = ", ".join(f"rank {r} ({by_rank[r].name})" for r in missing)
                    return got, f"{ranks} of server {name} did not reach the {step} step in {timeout:g} s"
                self._cond.wait(POLL)
