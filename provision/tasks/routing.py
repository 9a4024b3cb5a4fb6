"""The router in front of a host's server, around a stop or a restart (issue 59).

A host whose inventory names `router: URL` (or a run given `--router URL`) serves behind that
router. Before its server stops or restarts, provision takes it out of the router and waits until
the router no longer lists it (so no new request reaches a draining server); after a restart it
waits for ready, sends one warm-up request to the server itself, and only then puts it back and
waits until the router lists it healthy. A server that does not come back stays out, and its row
says so. `wait` and `launch` put a healthy server the router does not list back in (the step a
Ctrl-C between "out" and "back in" left undone).

The router's own API is control/router.py's; this module is the steps, their timeline (the
journal's `router` lines: out, drained, stopped, started, ready, warmed, back in) and the words.
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field

from provision.config.inventory import Host
from provision.control.router import Router, RouterError
from provision.errors import ConfigError

# Seconds a router may take to stop listing a server taken out, and to list one put back healthy
# (sglang-router checks a new worker's health before it lists it).
OUT_WAIT = 30.0
BACK_WAIT = 120.0


def router_url(value: object, where: str) -> str:
    """The `router:` value (or --router) as a URL, or a ConfigError that says what one looks like. Pure."""
    text = str(value or "").strip()
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: router {text!r}: expected the router's URL, e.g. http://10.1.230.174:30080 "
                          "(sglang-router's or vllm-router's address and port)")
    return text.rstrip("/")


def worker_url(address: str, port: int, given: str | None = None) -> str:
    """The server's URL as the router reaches it: the host's `router_worker:` when given, else
    http://ADDRESS:PORT (the address SSH reaches the host by, the server's port). Pure."""
    if given:
        return str(given).rstrip("/")
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{port}"


@dataclass
class Place:
    """Where a host's server sits behind a router: the router, and the server's URL there."""
    router: Router
    worker: str

    @property
    def said(self) -> str:
        return f"the router {self.router.url}"


def place_of(host: Host, port: int, given: str | None, fleet) -> Place | None:
    """The host's router and worker URL (--router over the inventory's `router:`), or None: no router."""
    value = given or host.get("router")
    if not value:
        return None
    url = router_url(value, "--router" if given else f"host {host.name}")
    target = fleet.target(host) if fleet is not None else None
    address = getattr(target, "hostname", None) or host.get("address") or ("127.0.0.1" if target is None else host.name)
    return Place(Router(url), worker_url(str(address), port, host.get("router_worker")))


@dataclass
class Steps:
    """One host's router-guarded change, timed from the moment it was taken out: the journal's
    lines and the row's figures."""
    t0: float = field(default_factory=time.monotonic)
    items: list = field(default_factory=list)

    def add(self, step: str, detail: str, at: float | None = None) -> None:
        when = (time.monotonic() if at is None else at) - self.t0
        self.items.append({"step": step, "at": round(max(0.0, when), 2), "detail": detail})

    def journal(self) -> list[dict]:
        return [{"command": "router", "verdict": i["step"], "detail": f"{i['detail']} (+{i['at']:g} s)"}
                for i in self.items]

    def words(self) -> str:
        """"out 0.4 s, drained 2.1 s, ..., back in 11.3 s": each step's seconds since the take-out. Pure."""
        return ", ".join(f"{i['step'].replace('-', ' ')} {i['at']:g} s" for i in self.items)


def take_out(place: Place, steps: Steps) -> str:
    """Take the server out and wait until the router no longer lists it; the step's words.
    RouterError: the router cannot be asked (the caller leaves the server as it is)."""
    got = place.router.take_out(place.worker, wait=OUT_WAIT)
    said = (f"{place.worker} taken out of {place.said}" if got["was_listed"] else
            f"{place.worker} was not listed by {place.said}")
    steps.add("out", said)
    return said


def stop_steps(steps: Steps, ans: dict, began: float) -> None:
    """The drained and stopped steps of a stop's (or a restart's old server's) answer: `began` is when
    the stop began (time.monotonic), the answer's elapsed its length."""
    elapsed = float(ans.get("elapsed") or 0)
    d = ans.get("drain") or {}
    if d:
        waited = float(d.get("waited") or elapsed)
        steps.add("drained", "every request in flight finished" if d.get("drained") else
                  f"{ans.get('cut') if ans.get('cut') is not None else 'some'} request(s) cut at the deadline",
                  began + waited)
    steps.add("stopped", f"stopped {len(ans.get('pids') or [])} processes", began + elapsed)


def bring_back(place: Place, session, port: int, secrets: dict, sudo: bool, steps: Steps) -> tuple[bool, str]:
    """A server that answers ready: one warm-up request to it (from its host), then back into the
    router, waiting until the router lists it healthy. (True, words), or (False, why it stays out)."""
    warm = session.call({"op": "warm", "port": port, "secrets": secrets, "max_new_tokens": 8, "timeout": 120},
                        timeout=180, sudo=sudo)
    if not warm.get("ok"):
        why = f"the warm-up request failed ({(warm.get('error') or {}).get('message', 'no answer')})"
        steps.add("left-out", why)
        return False, f"left out of {place.said}: {why}"
    steps.add("warmed", f"one request answered in {warm.get('seconds')} s")
    try:
        place.router.put_back(place.worker, wait=BACK_WAIT)
    except RouterError as exc:
        steps.add("left-out", str(exc))
        return False, f"left out of {place.said}: {exc}"
    steps.add("back-in", f"{place.worker} listed healthy by {place.said}")
    return True, f"back in {place.said}"


def record(res, place: Place, steps: Steps, back_in: bool) -> None:
    """The row's router data and its journal lines (the timeline), said once for every verb."""
    res.data["router"] = {"router": place.router.url, "worker": place.worker, "back_in": back_in,
                          "steps": steps.items}
    res.data.setdefault("journal_extra", []).extend(steps.journal())


def back_in(res, place: Place, session, port: int, secrets: dict, sudo: bool, steps: Steps) -> tuple[bool, str]:
    """`bring_back` for a row that answers ready: its note (the timeline) or, left out, its verdict
    failed with the reason; recorded. (back in?, words)."""
    ok, words = bring_back(place, session, port, secrets, sudo, steps)
    if ok:
        res.notes.append(f"{words}: " + steps.words())
    else:
        res.verdict, res.detail = "failed", f"{res.detail}; {words}"
    record(res, place, steps, ok)
    return ok, words


def listed_words(place: Place) -> tuple[str, bool | None]:
    """What `status` says of the host's place in its router: (words, listed?) (None: no answer)."""
    try:
        entry = place.router.listed(place.worker)
    except RouterError as exc:
        return f"{place.said}: {exc}", None
    if entry is None:
        return (f"out of {place.said} ({place.worker} is not listed): `provision wait` puts it back once it "
                "is healthy"), False
    return f"in {place.said}" + ("" if entry.get("healthy") else " (listed, not healthy)"), True
