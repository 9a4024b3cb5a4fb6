"""The stand-in's HTTP server and process tree: SGLang's endpoints (``/health``, ``/server_info``,
``/metrics``, ...; ``/generate`` from standin_generate.py), and the main process that forks the ranks
and the detokenizer, opens the port once every rank is ready, drains on SIGTERM and SIGKILLs its tree
on the fatal paths.  STDLIB ONLY; installed beside the stand-in.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

if __package__:  # provision.sandbox in a checkout
    from provision.sandbox.standin_auth import rule as auth_rule
    from provision.sandbox.standin_log import forms_version, log, rank_dead_lines, _uvicorn
    from provision.sandbox.standin_ranks import Launch, RANKS_OUTLIVE, _Rank, _child_setup, _env_float, _env_int
    from provision.sandbox.standin_tracebacks import _print_traceback
else:  # flat, beside the stand-in (/opt/provision-standin on a host, or run as a script)
    from standin_auth import rule as auth_rule
    from standin_log import forms_version, log, rank_dead_lines, _uvicorn
    from standin_ranks import Launch, RANKS_OUTLIVE, _Rank, _child_setup, _env_float, _env_int
    from standin_tracebacks import _print_traceback


class _State:
    def __init__(self):
        self.status = "starting"  # starting | up | shutting_down
        self.health_hits = 0
        self.lock = threading.Lock()
        self.prompt_tokens_total = 0
        self.gen_tokens_total = 0
        self.requests_total = 0
        self.dead_ranks: set[int] = set()
        self.up_since = 0.0
        self.in_flight: dict = {}  # rid -> path: requests being answered (what a drain waits for)


def _make_handler(L: Launch, state: _State):
    spec_on = L.spec_alg is not None
    accept_len = 3.10 if L.has_draft else 1.0
    accept_rate = 0.78 if L.has_draft else 0.0
    throughput = 96.2 if L.spec_alg == "EAGLE3" else 54.0
    flap_every = max(_env_int("PROVISION_STANDIN_FLAP_EVERY", 2), 1)
    flap_seconds = _env_float("PROVISION_STANDIN_FLAP_SECONDS", 0.0)
    allowed = auth_rule(L.sglang_dir, L.api_key, L.admin_api_key)  # SGLang's own rule (standin_auth.py)
    gen = _generator(L)  # /generate, /flush_cache, internal_states (standin_generate.py, when installed)
    if gen is not None:  # its per-host speed and accept length (environment) in the log and /metrics too
        accept_len, throughput = (gen.accept_len if L.has_draft else accept_len), gen.tok_s

    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # uvicorn access log goes to stdout
            pass

        def _access(self, code: int) -> None:
            phrase = {200: "OK", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable",
                      400: "Bad Request"}.get(code, "")
            _uvicorn("INFO", f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} '
                             f'HTTP/1.1" {code} {phrase}', fd=1)

        def _send(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
            self.send_response(code)
            if body or ctype != "application/json":
                self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self._access(code)

        def _json(self, code: int, obj) -> None:
            self._send(code, json.dumps(obj).encode())

        def _authorized(self, path: str) -> bool:
            return allowed(self.command, path, self.headers.get("Authorization"))

        def _body(self) -> dict:
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                obj = json.loads(raw or b"{}")
                return obj if isinstance(obj, dict) else {}
            except ValueError:
                return {}

        def _health(self) -> None:
            with state.lock:
                status = state.status
                state.health_hits += 1
                hits = state.health_hits
            ok = status == "up" and not state.dead_ranks
            if ok and L.fault == "flap":
                if flap_seconds > 0:
                    ok = int((time.monotonic() - state.up_since) / flap_seconds) % 2 == 0
                else:
                    ok = ((hits - 1) // flap_every) % 2 == 0
            self._send(200 if ok else 503, b"", ctype="text/plain")

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if not self._authorized(path):
                return self._json(401, {"error": "Unauthorized"})
            if path in ("/health", "/health_generate"):
                return self._health()
            if path in ("/model_info", "/get_model_info"):
                if path == "/get_model_info":
                    log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                                "Please use '/model_info' instead.")
                return self._json(200, {
                    "model_path": L.model_path, "tokenizer_path": getattr(L.args, "tokenizer_path", None) or L.model_path,
                    "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                    "has_image_understanding": True, "has_audio_understanding": False,
                    "model_type": L.model_type, "architectures": L.archs,
                })
            if path in ("/server_info", "/get_server_info"):
                info = dict(L.server_args)
                info.update({
                    "internal_states": gen.server_states() if gen else [{
                        "avg_spec_accept_length": accept_len if spec_on else None,
                        "last_gen_throughput": throughput, "memory_usage": {}}],
                    "version": L.version,
                })
                return self._json(200, info)
            if path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{
                    "id": L.served_name, "object": "model", "created": int(time.time()),
                    "owned_by": "sglang", "root": L.served_name, "parent": None, "max_model_len": L.context_len}]})
            if path == "/metrics":
                if not L.enable_metrics:
                    return self._json(404, {"detail": "Not Found"})
                return self._send(200, _metrics(L, state, accept_len, accept_rate, throughput).encode(),
                                  ctype="text/plain; version=0.0.4; charset=utf-8")
            if path == "/get_load":  # the scheduler's requests (0.5.9's get_load): those being answered
                with state.lock:
                    running = len(state.in_flight)
                return self._json(200, [{"dp_rank": 0, "num_reqs": running, "num_waiting_reqs": 0, "num_tokens": 0}])
            return self._json(404, {"detail": "Not Found"})

        do_HEAD = do_GET

        def do_POST(self):
            rid = uuid.uuid4().hex
            with state.lock:
                state.in_flight[rid] = self.path
            try:
                return self._post()
            finally:
                with state.lock:
                    state.in_flight.pop(rid, None)

        def _post(self):
            path = self.path.split("?", 1)[0]
            if not self._authorized(path):
                self._body()
                return self._json(401, {"error": "Unauthorized"})
            body = self._body()
            if path == "/generate" and gen:
                return gen.generate(self, body, lambda p, n: self._log_batch(p, n))
            if path == "/generate":
                text = body.get("text") or ""
                sp = body.get("sampling_params") or {}
                n = int(sp.get("max_new_tokens") or 16)
                prompt_tokens = max(1, len(str(text).split()) + 2)
                return self._json(200, self._complete(text, prompt_tokens, n, native=True))
            if path in ("/v1/chat/completions", "/v1/completions"):
                n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
                prompt = json.dumps(body.get("messages") or body.get("prompt") or "")
                res = self._complete(prompt, max(1, len(prompt.split())), n, native=False)
                usage = {"prompt_tokens": res["meta_info"]["prompt_tokens"],
                         "completion_tokens": n, "total_tokens": res["meta_info"]["prompt_tokens"] + n}
                if path == "/v1/chat/completions":
                    choice = {"index": 0, "message": {"role": "assistant", "content": res["text"]},
                              "finish_reason": "length"}
                else:
                    choice = {"index": 0, "text": res["text"], "finish_reason": "length"}
                return self._json(200, {"id": res["meta_info"]["id"], "object": "chat.completion",
                                        "created": int(time.time()), "model": L.served_name,
                                        "choices": [choice], "usage": usage})
            if path == "/flush_cache" and gen:
                return gen.flush(self)
            if path == "/flush_cache":
                return self._send(200, b"Cache flushed.\n", ctype="text/plain")
            return self._json(404, {"detail": "Not Found"})

        def _complete(self, text, prompt_tokens: int, n: int, native: bool) -> dict:
            latency = n / throughput
            time.sleep(min(latency, 0.05))
            self._log_batch(prompt_tokens, n)
            meta = {
                "id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": n},
                "prompt_tokens": prompt_tokens, "weight_version": "default", "completion_tokens": n,
                "cached_tokens": 0, "e2e_latency": round(latency, 4),
            }
            if spec_on:
                meta.update({"spec_verify_ct": max(1, round(n / accept_len)),
                             "spec_accept_length": accept_len, "spec_accept_rate": accept_rate})
            words = ("The quick brown fox jumps over the lazy dog " * (n // 9 + 1)).split()[:n]
            return {"text": " ".join(words), "meta_info": meta}

        def _log_batch(self, prompt_tokens: int, n: int) -> None:
            with state.lock:
                state.prompt_tokens_total += prompt_tokens
                state.gen_tokens_total += n
                state.requests_total += 1
            prefix = " TP0" if L.tp > 1 else ""  # the scheduler (rank 0) logs these
            ts = time.strftime("%Y-%m-%d %H:%M:%S")
            log.raw(f"[{ts}{prefix}] Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, "
                    f"token usage: 0.00, #running-req: 0, #queue-req: 0, \n")
            msg = f"Decode batch, #running-req: 1, #token: {prompt_tokens + n}, token usage: 0.01, "
            if spec_on:
                msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
            msg += f"cuda graph: True, gen throughput (token/s): {throughput:.2f}, #queue-req: 0"
            log.raw(f"[{ts}{prefix}] {msg}\n")

    return Handler


def _generator(L: Launch):
    """standin_generate.Generator for this server, or None where that module is not installed."""
    try:
        if __package__:
            from provision.sandbox import standin_generate
        else:
            import standin_generate  # beside this file (/opt/provision-standin on a host)
    except ImportError:
        return None
    return standin_generate.make(L)


def _metrics(L: Launch, state: _State, accept_len: float, accept_rate: float, throughput: float) -> str:
    labels = f'model_name="{L.served_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    rows = [
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", 0),
        ("sglang:num_used_tokens", "gauge", "The number of used tokens.", 0),
        ("sglang:token_usage", "gauge", "The token usage.", 0.0),
        ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", throughput),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", 0),
        ("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
         accept_len if L.has_draft else 0.0),
        ("sglang:spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding.",
         accept_rate if L.has_draft else 0.0),
        ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float(state.prompt_tokens_total)),
        ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", float(state.gen_tokens_total)),
        ("sglang:num_requests_total", "counter", "Number of requests processed.", float(state.requests_total)),
    ]
    out = []
    for name, kind, help_, val in rows:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}\n{name}{{{labels}}} {val}\n")
    return "".join(out)


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


# --------------------------------------------------------------------------- process tree


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read().decode("utf-8", "replace")
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    except OSError:
        return []
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


class Main:
    def __init__(self, L: Launch):
        self.L = L
        self.children: list[int] = []
        self.rank_pids: list[int] = []
        self.stop_requested = False
        self.quitting = False
        self.state = _State()
        self.httpd = None
        self.rank_dead_exc = "EOFError"

    def kill_children(self) -> None:
        pids = set(self.children) | set(_descendants(os.getpid()))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in self.children:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass

    def kill_tree(self) -> None:
        """SGLang's kill_process_tree(os.getpid()): children then itself, with SIGKILL."""
        self.kill_children()
        os.kill(os.getpid(), signal.SIGKILL)

    def on_sigquit(self, signum, frame) -> None:
        if self.quitting:  # several ranks failing at once
            return
        self.quitting = True
        log.error("Received sigquit from a child process. It usually means the child failed.")
        self.kill_tree()

    def on_term(self, signum, frame) -> None:
        self.stop_requested = True

    def spawn(self) -> list[tuple[int, int]]:
        """Fork the ranks and the detokenizer; return (status read fd, go write fd) per rank."""
        L = self.L
        links: list[tuple[int, int]] = []
        for rank in range(L.tp):
            r, w = os.pipe()
            go_r, go_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    os.close(go_w)
                    for a, b in links:
                        os.close(a)
                        os.close(b)
                    _child_setup(f"sglang::scheduler_TP{rank}", f" TP{rank}" if L.tp > 1 else "")
                    _Rank(L, rank, w, go_r).run()
                finally:
                    os._exit(0)
            os.close(w)
            os.close(go_r)
            links.append((r, go_w))
            self.children.append(pid)
            self.rank_pids.append(pid)
        pid = os.fork()
        if pid == 0:
            try:
                for a, b in links:
                    os.close(a)
                    os.close(b)
                _child_setup("sglang::detokenizer", "")
                ppid = os.getppid()
                while os.getppid() == ppid or RANKS_OUTLIVE:
                    time.sleep(0.5)
            finally:
                os._exit(0)
        self.children.append(pid)
        return links

    def wait_ready(self, links: list[tuple[int, int]]) -> int:
        """Run the rank barriers until every rank is ready.
        0 when all are ready; 1 when a rank died; -1 when stop was requested."""
        pending = {r: i for i, (r, _) in enumerate(links)}
        bufs = {r: b"" for r, _ in links}
        arrived: dict[str, set[int]] = {}
        n = len(links)
        while pending:
            if self.stop_requested:
                return -1
            try:
                readable, _, _ = select.select(list(pending), [], [], 0.2)
            except InterruptedError:
                continue
            for fd in readable:
                data = os.read(fd, 256)
                rank = pending[fd]
                if data:
                    bufs[fd] += data
                    while b"\n" in bufs[fd]:
                        msg, bufs[fd] = bufs[fd].split(b"\n", 1)
                        stage = msg.decode(errors="replace")
                        if stage == "ready":
                            pending.pop(fd)
                            os.close(fd)
                            break
                        arrived.setdefault(stage, set()).add(rank)
                        if len(arrived[stage]) == n:
                            for _, go in links:
                                try:
                                    os.write(go, b"g")
                                except OSError:
                                    pass
                    continue
                pending.pop(fd)
                os.close(fd)
                time.sleep(0.3)  # a SIGQUIT may be on its way
                if self.stop_requested:  # the whole group got SIGTERM: not a failure
                    return -1
                code = None
                try:
                    _, status = os.waitpid(self.rank_pids[rank], 0)
                    code = os.waitstatus_to_exitcode(status)
                except OSError:
                    pass
                messages, self.rank_dead_exc = rank_dead_lines(forms_version(self.L.sglang_dir), rank, code)
                for m in messages:
                    log.error(m)
                return 1
        for _, go in links:
            try:
                os.close(go)
            except OSError:
                pass
        return 0

    def serve(self) -> int:
        L = self.L
        cls = _V6Server if ":" in L.host else ThreadingHTTPServer
        try:
            httpd = cls((L.host, L.port), _make_handler(L, self.state))
        except OSError as e:
            _uvicorn("ERROR", f"[Errno {e.errno}] error while attempting to bind on address "
                              f"({L.host!r}, {L.port}): {e.strerror.lower() if e.strerror else e}")
            self.kill_children()
            return 1
        httpd.daemon_threads = True
        self.httpd = httpd
        _uvicorn("INFO", f"Started server process [{os.getpid()}]")
        _uvicorn("INFO", "Waiting for application startup.")
        _uvicorn("INFO", "Application startup complete.")
        shown = f"[{L.host}]" if ":" in L.host else L.host
        _uvicorn("INFO", f"Uvicorn running on http://{shown}:{L.port} (Press CTRL+C to quit)")
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        threading.Thread(target=self.warmup, daemon=True).start()
        while not self.stop_requested:
            time.sleep(0.1)
            self.reap()
        self.drain()
        httpd.shutdown()
        httpd.server_close()
        self.kill_children()
        return 0

    def drain(self) -> None:
        """SGLang 0.5.9's SIGTERM (tokenizer_manager.py sigterm_watchdog): /health answers 503, new
        requests are still taken, and every poll the requests in flight are counted and logged; the
        tree ends once none is left. No deadline of its own; SGL_FORCE_SHUTDOWN=1 skips the drain.
        The poll is SGLang's 5 s; PROVISION_STANDIN_DRAIN_POLL shortens it (the sandbox's 0.5 s)."""
        log.warning("SIGTERM received. signum=15 frame=None. Draining requests and shutting down...")
        with self.state.lock:
            self.state.status = "shutting_down"
        if os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() in ("1", "true", "yes"):
            log.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
            return
        poll = _env_float("PROVISION_STANDIN_DRAIN_POLL", _env_float("PROVISION_STANDIN_DRAIN_SECONDS", 0.5))
        time.sleep(poll)
        while True:
            with self.state.lock:
                rids = list(self.state.in_flight)
            log.info(f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                     f"Remaining requests remaining_rids={rids}.")
            if not rids:
                return
            time.sleep(poll)

    def reap(self) -> None:
        for rank, pid in enumerate(self.rank_pids):
            if rank in self.state.dead_ranks:
                continue
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.state.dead_ranks.add(rank)

    def warmup(self) -> None:
        L = self.L
        time.sleep(L.warmup_seconds)
        if self.stop_requested:
            return
        if L.fault == "warmup-fail":
            log.error(
                "Initialization failed. warmup error: Traceback (most recent call last):\n"
                f'  File "{L.sglang_dir}/srt/entrypoints/http_server.py", line 1790, in _execute_server_warmup\n'
                "    res = requests.post(\n"
                "requests.exceptions.ReadTimeout: HTTPConnectionPool(host='127.0.0.1', port="
                f"{L.port}): Read timed out. (read timeout=600)"
            )
            self.kill_tree()
        _uvicorn("INFO", '127.0.0.1:0 - "GET /model_info HTTP/1.1" 200 OK', fd=1)
        prefix = " TP0" if L.tp > 1 else ""
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        log.raw(f"[{ts}{prefix}] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.00, "
                f"#running-req: 0, #queue-req: 0, \n")
        _uvicorn("INFO", '127.0.0.1:0 - "POST /v1/chat/completions HTTP/1.1" 200 OK', fd=1)
        with self.state.lock:
            if self.state.status == "starting":
                self.state.status = "up"
                self.state.up_since = time.monotonic()
        log.info("The server is fired up and ready to roll!")

    def run(self) -> int:
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        try:
            links = self.spawn()
            rc = self.wait_ready(links)
            if rc == -1:
                self.kill_children()
                return 0
            if rc == 1:
                _print_traceback(self.L.sglang_dir, [
                    ("launch_server.py", "run_server(server_args)", '__name__ == "__main__"'),
                    ("entrypoints/http_server.py", "launch_server("),
                    ("entrypoints/engine.py", "_wait_for_scheduler_ready("),
                    ("entrypoints/engine.py", "data = scheduler_pipe_readers[i].recv()"),
                ], self.rank_dead_exc + "\n")
                self.kill_children()
                return 1
            if self.stop_requested:
                self.kill_children()
                return 0
            return self.serve()
        finally:
            if self.children:
                for pid in self.children:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
