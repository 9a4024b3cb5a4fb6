"""The `bench` op: time a running server from the host itself.  STDLIB ONLY.

The endpoints, the request's body and the figures each answer carries are the server's engine's
(host/inference, named by the server's record); what follows is SGLang's.

The server's port is usually bound to 127.0.0.1, so the requests go from here (the host side
of the SSH call), and the timings are the host's clock: the network to the control machine is
not in them. For one server:

1. ``GET /server_info`` (falling back to ``/get_server_info``): version, tp-size, the
   ``speculative_*`` settings; ``GET /model_info``: the model path. Only those fields are
   answered (the server args can hold the API key).
2. ``POST /flush_cache``: 400 means the server is serving traffic, so the host is skipped as
   ``busy`` unless ``force`` (then the figures include the other traffic, and say so). The flush
   also resets ``/server_info``'s ``avg_spec_accept_length``, read again at the end.
3. ``warmup`` requests, then ``requests`` streaming ``POST /generate`` strictly one at a time,
   ``temperature: 0``, ``max_new_tokens``, the shipped prompts (bench_prompts.py) in order.
   Per request: time to the first chunk (TTFT), first to last chunk (decode), the final
   chunk's ``meta_info`` (completion_tokens, spec_verify_ct and the release's draft counts).

Every way it can go wrong is an answer with one sentence, never a traceback or a hang: nothing
listening (or still loading: the server's process is alive but its port is not open yet), 401,
503, a stream cut before ``[DONE]``, a chunk that is not JSON, a read that stalls past the
timeout. The API key is the run's own secret, else the one the launch left in its 0600
``--config`` file (ops/server_launch.py, rendered by ops/server_secrets.py).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import TYPE_CHECKING, Any

from provision.host import inference
from provision.host.bootstrap import emit
from provision.host.facts.gpu_name import gpu_name
from provision.host.lib.promtext import gauge_sum
from provision.host.ops import server, server_secrets
from provision.host.ops.backends import tree
from provision.host.ops.bench_prompts import PROMPTS

if TYPE_CHECKING:  # types only: protocol.py stays on the control machine
    from provision.host.protocol import BenchAnswer, BenchRequest, WarmAnswer, WarmRequest



class BenchFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def config_secret(path: str | None, name: str = "api-key") -> str | None:
    """The `name` secret (api-key, admin-api-key) of the launch's 0600 --config file, read by the
    parser of the file's one renderer (ops/server_secrets.py)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return server_secrets.parse_config(fh.read()).get(name) or None
    except OSError:
        return None


class Client:
    def __init__(self, host: str, port: int, key: str | None, timeout: float, engine,
                 flush_key: str | None = None):
        self.host, self.port, self.key, self.timeout = host, port, key, timeout
        self.flush_key = flush_key  # the flush path's own key (SGLang's admin key), when it has one
        self.engine = engine  # the server's engine (its record's): its endpoints

    def _conn(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def _headers(self, key: str | None = None) -> dict:
        h = {"Content-Type": "application/json", "Accept": "*/*"}
        if key or self.key:
            h["Authorization"] = f"Bearer {key or self.key}"
        return h

    def request(self, method: str, path: str, body: Any = None, key: str | None = None) -> tuple[int, bytes]:
        """One request; `key` replaces the client's API key for it (an admin path's key)."""
        conn = self._conn()
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                         headers=self._headers(key))
            resp = conn.getresponse()
            return resp.status, resp.read(1 << 20)
        except ConnectionRefusedError:
            raise BenchFailure("down", f"nothing answers on {self.host}:{self.port} (connection refused)") from None
        except socket.timeout:
            raise BenchFailure("timeout", f"{method} {path} got no answer in {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise BenchFailure("http", f"{method} {path} failed: {exc or type(exc).__name__}") from None
        finally:
            conn.close()

    def get_json(self, path: str) -> tuple[int, Any]:
        status, data = self.request("GET", path)
        if status != 200:
            return status, None
        try:
            return status, json.loads(data)
        except ValueError:
            raise BenchFailure("http", f"GET {path} answered 200 with a body that is not JSON") from None

    def stream(self, text: str, max_new_tokens: int, deadline_s: float) -> dict:
        """One streaming /generate; the figures of it, or BenchFailure."""
        body = self.engine.generate_body(text, max_new_tokens)
        gen = self.engine.generate_path
        conn = self._conn()
        t0 = time.monotonic()
        t_first = t_last = None
        first_tokens = 0
        last: dict = {}
        chunks = 0
        try:
            conn.request("POST", self.engine.generate_path, body=json.dumps(body).encode(), headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                detail = resp.read(400).decode("utf-8", "replace").strip()
                raise status_failure(resp.status, f"POST {gen}", detail)
            while True:
                if time.monotonic() - t0 > deadline_s:
                    raise BenchFailure("timeout", f"a {gen} stream did not finish in {deadline_s:g} s "
                                                  f"({chunks} chunks so far)")
                line = resp.readline(1 << 22)
                if not line:
                    toks = self.engine.chunk_figures(last).get("completion_tokens")
                    raise BenchFailure("stream", f"the {gen} stream was cut after {chunks} chunks"
                                                 f"{f' ({toks} tokens)' if toks else ''}, before its [DONE]")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                try:
                    obj = json.loads(payload)
                except ValueError:
                    raise BenchFailure("stream", f"a {gen} stream chunk was not JSON: "
                                                 f"{payload[:80].decode('utf-8', 'replace')!r}") from None
                if not isinstance(obj, dict):
                    raise BenchFailure("stream", f"a {gen} stream chunk was JSON but not an object")
                if obj.get("error"):
                    err = obj["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    raise BenchFailure("stream", f"the server ended the stream with an error: {str(msg)[:200]}")
                now = time.monotonic()
                chunks += 1
                if t_first is None:
                    t_first = now
                    ct = self.engine.chunk_figures(obj).get("completion_tokens")
                    first_tokens = ct if isinstance(ct, int) and ct > 0 else 1
                t_last = now
                last = obj
        except socket.timeout:
            raise BenchFailure("timeout", f"the {gen} stream stalled for {self.timeout:g} s "
                                          f"after {chunks} chunks") from None
        except ConnectionRefusedError:
            raise BenchFailure("down", f"nothing answers on {self.host}:{self.port} (connection refused)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise BenchFailure("stream", f"the {gen} stream broke after {chunks} chunks: "
                                         f"{exc or type(exc).__name__}") from None
        finally:
            conn.close()
        out: dict = {"ok": True, "chunks": chunks,
                     "ttft_s": round(t_first - t0, 5) if t_first is not None else None,
                     "decode_s": round(t_last - t_first, 5) if t_first is not None and t_last is not None else None,
                     "first_chunk_tokens": first_tokens}
        out.update(self.engine.chunk_figures(last))
        return out


def metric_lines(text: str, names) -> str:
    """The lines of a Prometheus text about `names` (their samples, HELP and TYPE): what the control
    side parses (output/metricsdelta.py), without the rest of a long page. Pure."""
    keep = []
    for line in text.splitlines():
        words = line.split()
        name = words[2] if line.startswith("# ") and len(words) > 2 else line.split("{", 1)[0].split(" ", 1)[0]
        if any(name == n or name.startswith(n + "_") for n in names):
            keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


def status_failure(status: int, what: str, detail: str = "", secret: str = "api-key") -> BenchFailure:
    if status == 401:
        var = "PROVISION_" + secret.upper().replace("-", "_")
        which = "its admin key" if secret == "admin-api-key" else "an API key"
        return BenchFailure("unauthorized", f"{what} answered 401 Unauthorized: the server wants {which} "
                                            f"this run does not have (set {var} or --{secret}-file, "
                                            "as for the launch)")
    if status == 503:
        return BenchFailure("loading", f"{what} answered 503: the server is still starting (or shutting down)")
    return BenchFailure("http", f"{what} answered HTTP {status}" + (f": {detail[:200]}" if detail else ""))


def _where(req: dict) -> tuple[str, int, dict]:
    port = int(req.get("port") or 30000)
    rec = server.read_record(req, port) or {}
    host = str(rec.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return host, port, rec


def _secret(req: dict, rec: dict, name: str) -> str | None:
    """This run's secret `name`, else the one the launch left in its --config file."""
    return ((req.get("secrets") or {}).get("args") or {}).get(name) or config_secret(rec.get("config"), name)


def op_warm(req: WarmRequest, bundle: bytes) -> WarmAnswer:
    """One short streamed generation on the server itself, from the host (the router step's warm-up,
    before a restarted server takes the router's traffic): its seconds, or the failure's sentence."""
    host, port, rec = _where(dict(req))
    engine = inference.get(inference.of_record(rec))
    timeout = float(req.get("timeout") or 120)
    client = Client(host, port, _secret(dict(req), rec, "api-key"), timeout, engine)
    t0 = time.monotonic()
    try:
        got = client.stream(str(req.get("prompt") or "Hello"), int(req.get("max_new_tokens") or 8), timeout)
    except BenchFailure as f:
        return {"ok": False, "error": {"kind": f.kind, "message": f.message}}
    return {"ok": True, "seconds": round(time.monotonic() - t0, 3), "completion_tokens": got.get("completion_tokens")}


def op_bench(req: BenchRequest, bundle: bytes) -> BenchAnswer:
    host, port, rec = _where(dict(req))

    def secret(name: str) -> str | None:
        return _secret(dict(req), rec, name)

    engine = inference.get(inference.of_record(rec))
    client = Client(host, port, secret("api-key"), float(req.get("read_timeout", 120)), engine,
                    secret(engine.flush_secret) if engine.flush_secret != "api-key" else None)
    out: dict = {"ok": True, "port": port, "gpu": gpu_name(), "requests": [], "warmup": 0}
    # what the server's own answers may not say (vLLM's /v1/models has no version nor settings)
    out["record"] = {"engine": client.engine.name, "version": rec.get("version"), "tp": rec.get("tp"),
                     "model": rec.get("model"), "spec_args": rec.get("spec_args") or {}}
    try:
        _run(client, req, out)
    except BenchFailure as f:
        kind, msg = f.kind, f.message
        if kind == "down" and rec.get("stopped_at"):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec["stopped_at"])))
            msg = (f"the server on port {port} was stopped at {when} (provision stop): nothing to measure; "
                   "`provision launch` starts it again")
        elif kind == "down" and rec and tree.alive(rec.get("pid"), rec.get("starttime")):
            kind, msg = "loading", (f"the server (pid {rec.get('pid')}) is still loading: its port {port} is not "
                                    "open yet; `provision wait` follows it")
        elif kind == "down":
            msg += ": no server runs there (`provision status` shows what does; --server-port picks another)"
        out.update(ok=False, error={"kind": kind, "message": msg})
    return out  # type: ignore[return-value]


def progress(stage: str, done: int, of: int, one: dict, steps: int) -> dict:
    """The event after one request: which, of how many (of its stage, and of all `steps`), and its
    timing fields (the control side does the arithmetic, output/benchfigures.py, as for the answer)."""
    step = done if stage == "warmup" else steps - of + done
    return {"bench": stage, "done": done, "of": of, "step": step, "steps": steps,
            "request": {k: one.get(k) for k in ("completion_tokens", "decode_s", "first_chunk_tokens")}}


def _run(client: Client, req: dict, out: dict) -> None:
    first, *older = client.engine.server_info_paths
    status, info = client.get_json(first)
    for path in older:  # an older release's name for it
        if status != 404:
            break
        status, info = client.get_json(path)
    if status != 200:
        raise status_failure(status, f"GET {first}")
    out["server_info"] = client.engine.server_info(info)
    first, *older = client.engine.model_info_paths
    status, model = client.get_json(first)
    for path in older:
        if status != 404:
            break
        status, model = client.get_json(path)
    if status == 200 and isinstance(model, dict):
        out["model_info"] = {k: model.get(k) for k in ("model_path", "architectures", "weight_version")}
    status, body = client.request("POST", client.engine.flush_path, key=client.flush_key)
    if status == 200:
        out["flushed"] = True
    elif status == 400:
        out["flushed"] = False
        if not req.get("force"):
            raise BenchFailure("busy", f"the server is serving traffic ({client.engine.flush_path} answered 400): "
                                       "not measured; "
                                       "--force measures anyway, and the figures then include that traffic")
        out["busy_forced"] = True
    elif status == 401:
        raise status_failure(status, f"POST {client.engine.flush_path}", "", client.engine.flush_secret)
    else:
        out["flushed"] = False
        out["flush_status"], out["flush_path"] = status, client.engine.flush_path
    eng = client.engine
    if eng.metrics_path:
        status, page = client.request("GET", eng.metrics_path)
        if status == 200 and eng.busy_metric and gauge_sum(page.decode("utf-8", "replace"), eng.busy_metric) > 0:
            if not req.get("force"):
                raise BenchFailure("busy", f"the server is serving traffic ({eng.busy_metric} > 0 on "
                                           f"{eng.metrics_path}): not measured; --force measures anyway, and the "
                                           "figures then include that traffic")
            out["busy_forced"] = True
    max_new = int(req.get("max_new_tokens") or 512)
    deadline = float(req.get("request_timeout") or max(120.0, max_new / 2.0))
    prompts = PROMPTS
    warmup, measured = int(req.get("warmup", 2)), int(req.get("requests") or 15)
    for i in range(warmup):
        one = client.stream(prompts[i % len(prompts)][1], max_new, deadline)
        out["warmup"] += 1
        emit(progress("warmup", i + 1, warmup, one, warmup + measured))
    if eng.metrics_path:
        out["metrics_roles"] = dict(eng.metrics_names)
        out["metrics_before"] = metrics_now(client)
    for i in range(measured):
        name, text = prompts[i % len(prompts)]
        one = client.stream(text, max_new, deadline)
        one["prompt"] = name
        out["requests"].append(one)
        emit(progress("request", i + 1, measured, one, warmup + measured))
    if eng.metrics_path:
        out["metrics_after"] = metrics_now(client)
    status, after = client.get_json(client.engine.server_info_paths[0])
    if status == 200:
        out["server_info_after"] = client.engine.server_info(after)


def metrics_now(client: Client) -> str | None:
    """The engine's metrics of interest now (None when the page does not answer 200)."""
    status, page = client.request("GET", client.engine.metrics_path)
    if status != 200:
        return None
    return metric_lines(page.decode("utf-8", "replace"), tuple(client.engine.metrics_names.values()))


OPS = {"bench": op_bench, "warm": op_warm}
