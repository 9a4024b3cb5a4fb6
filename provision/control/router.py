"""The router in front of a fleet's servers, by its worker API: take a server out before it stops,
put it back once it serves again (issue 59).

provision knows a router by what it answers, never by a name the operator gives: `GET /workers`
answering ``{"workers": [...], "total": N, ...}`` is the worker API sglang-router and vllm-router
share (read from running releases):

- sglang-router 0.3.2: each worker has an ``id``; ``POST /workers {"url"}`` queues an addition
  behind the router's own health check (``{"status": "accepted", "worker_id"}``);
  ``DELETE /workers/{id}`` takes one out by its id.
- vllm-router 0.1.17: a worker has no id; ``POST /workers {"url"}`` adds it there and then
  (``{"success": true, ...}``); ``DELETE /workers/{url}`` (the URL, percent-encoded) takes it out.

So a worker is taken out by its id where the router gives one, else by its URL. Anything else is
refused with a sentence: a router provision cannot tell about a stop is never silently ignored.

The readers (`parse_workers`, `same_url`) are pure; `Router` is the thin HTTP layer over them.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request


class RouterError(Exception):
    """A router that cannot be asked, or does not answer as a known one does: a sentence."""


def same_url(a: str, b: str) -> bool:
    """Do two worker URLs name the same server (scheme, host and port; a trailing slash aside)? Pure."""
    pa, pb = urllib.parse.urlsplit(a.rstrip("/")), urllib.parse.urlsplit(b.rstrip("/"))
    port = {"http": 80, "https": 443}
    return ((pa.scheme, (pa.hostname or "").lower(), pa.port or port.get(pa.scheme), pa.path) ==
            (pb.scheme, (pb.hostname or "").lower(), pb.port or port.get(pb.scheme), pb.path))


def parse_workers(body: bytes) -> list[dict] | None:
    """The `GET /workers` answer of sglang-router or vllm-router as [{"id", "url", "healthy"}] (the id
    the router takes a worker out by: its own, else its URL), or None when the body is not that
    API's (another router, a server, an error page). Pure."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list) or "total" not in doc:
        return None
    out = []
    for w in doc["workers"]:
        if not isinstance(w, dict) or not isinstance(w.get("url"), str):
            return None
        out.append({"id": w.get("id") or w["url"], "url": w["url"], "healthy": bool(w.get("is_healthy", True))})
    return out


class Router:
    """One router, by its URL (`router:` in the inventory, `--router`)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, doc: dict | None = None) -> tuple[int, bytes]:
        data = json.dumps(doc).encode() if doc is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (OSError, ValueError) as exc:
            raise RouterError(f"the router {self.url} did not answer ({exc})") from None

    def workers(self) -> list[dict]:
        """The servers the router lists: [{"id", "url", "healthy"}]. RouterError when it is not a
        router provision knows."""
        code, body = self._call("GET", "/workers")
        found = parse_workers(body) if code == 200 else None
        if found is None:
            raise RouterError(f"{self.url} is not a router provision knows: GET /workers answered {code} "
                              f"{body[:120]!r}, where sglang-router and vllm-router answer their workers")
        return found

    def listed(self, worker_url: str) -> dict | None:
        """The router's entry for `worker_url`, or None."""
        return next((w for w in self.workers() if same_url(w["url"], worker_url)), None)

    def take_out(self, worker_url: str, wait: float = 30.0) -> dict:
        """Take the server out and wait until the router no longer lists it: {"was_listed", "seconds"}."""
        t0 = time.monotonic()
        entry = self.listed(worker_url)
        if entry is None:
            return {"was_listed": False, "seconds": 0.0}
        code, body = self._call("DELETE", f"/workers/{urllib.parse.quote(str(entry['id']), safe='')}")
        if code >= 400:
            raise RouterError(f"the router {self.url} refused to take {worker_url} out: {code} {body[:120]!r}")
        self._until(lambda: self.listed(worker_url) is None, wait, f"{worker_url} is still listed by {self.url}")
        return {"was_listed": True, "seconds": round(time.monotonic() - t0, 2)}

    def put_back(self, worker_url: str, wait: float = 60.0) -> dict:
        """Put the server (back) in and wait until the router lists it healthy: {"seconds"}."""
        t0 = time.monotonic()
        if self.listed(worker_url) is None:
            code, body = self._call("POST", "/workers", {"url": worker_url})
            if code >= 400:
                raise RouterError(f"the router {self.url} refused to add {worker_url}: {code} {body[:120]!r}")
        self._until(lambda: bool((self.listed(worker_url) or {}).get("healthy")), wait,
                    f"{self.url} does not list {worker_url} healthy")
        return {"seconds": round(time.monotonic() - t0, 2)}

    @staticmethod
    def _until(done, wait: float, what: str) -> None:
        deadline = time.monotonic() + wait
        while not done():
            if time.monotonic() > deadline:
                raise RouterError(f"{what} after {wait:g} s")
            time.sleep(0.2)
