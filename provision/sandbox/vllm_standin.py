"""The vLLM stand-in server of the sandbox's vLLM images (no GPU, no torch here).  STDLIB ONLY.

Run as ``python3 -m vllm_standin --model DIR --port N [vLLM's other flags]`` where a real image runs
``python3 -m vllm.entrypoints.openai.api_server``: the image holds the real vLLM release's files
(provision reads and patches those), and this module answers for the server. It shares nothing
with provision's readers; what it does is what vLLM 0.32 does at the edges the tests rely on,
read from the release:

- its log: the API server's lines in vLLM's format (``(APIServer pid=N) INFO MM-DD HH:MM:SS
  [file.py:line] message``): the version banner, ``Resolved architecture: X`` (from the model's
  config.json), ``Starting vLLM server on http://H:P``, then uvicorn's ``Application startup
  complete.``;
- its general plugins (``vllm/plugins/__init__.py``): every ``vllm.general_plugins`` entry point on
  sys.path (those ``VLLM_PLUGINS`` names, when it is set) is loaded; one that does not import is
  logged as ``Failed to load plugin NAME`` with its traceback, and the server goes on without it,
  as vLLM does. Its ``register()`` is not called: it needs vLLM's torch-backed registry, which a
  stand-in image does not have. The stand-in says which plugins it loaded (``PROVISION_STANDIN``
  lines, its own);
- ``GET /health`` 200 once up, ``GET /v1/models`` naming ``--served-model-name`` (else ``--model``),
  ``POST /v1/completions`` (a few tokens); ``--api-key`` (or ``api-key`` in ``--config FILE``)
  guards every path but ``/health`` (401), as vLLM's middleware does;
- SIGTERM: with ``--shutdown-timeout N`` (> 0) it waits up to N s for requests in flight, else it
  ends at once (vLLM aborts them).

``PROVISION_STANDIN_LOAD_SECONDS`` (default 1) is how long it "loads" before the port opens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # noqa: BLE001 - no dist-info: say so in the banner
        return "unknown"


def log(level: str, where: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stdout.write(f"(APIServer pid={os.getpid()}) {level} {stamp} [{where}] {message}\n")
    sys.stdout.flush()


def parse(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm_standin", allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--api-key")
    p.add_argument("--config")
    p.add_argument("--shutdown-timeout", type=int, default=0)
    args, _rest = p.parse_known_args(argv)  # vLLM's other flags: taken, not judged (preflight asks the parser)
    if args.config:  # vLLM's --config: a YAML file of flags, keys as flag names
        for line in open(args.config, encoding="utf-8").read().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip().replace("_", "-") == "api-key" and not args.api_key:
                args.api_key = value.strip().strip("'\"")
    args.model = args.model or args.model_tag
    return args


def load_plugins() -> list:
    """vLLM's load_plugins_by_group for the general plugins: the names loaded."""
    from importlib.metadata import entry_points

    allowed = os.environ.get("VLLM_PLUGINS")
    allowed_names = None if allowed is None else [n.strip() for n in allowed.split(",") if n.strip()]
    loaded = []
    for plugin in entry_points(group="vllm.general_plugins"):
        if allowed_names is not None and plugin.name not in allowed_names:
            continue
        try:
            plugin.load()
            loaded.append(plugin.name)
        except Exception:  # noqa: BLE001 - as vLLM: logged, the server goes on without it
            log("ERROR", "__init__.py:63", f"Failed to load plugin {plugin.name}")
            for line in traceback.format_exc().splitlines():
                log("ERROR", "__init__.py:63", line)
    return loaded


class State:
    in_flight = 0
    up = False
    lock = threading.Lock()


def handler(args: argparse.Namespace):
    served = (args.served_model_name or [args.model])[0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):  # uvicorn's access lines
            sys.stdout.write(f"(APIServer pid={os.getpid()}) INFO:     {self.client_address[0]} - "
                             f"\"{self.command} {self.path}\" {a[1] if len(a) > 1 else ''}\n")
            sys.stdout.flush()

        def _send(self, code: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            if not args.api_key or self.path.startswith("/health"):
                return True
            if self.headers.get("Authorization") == f"Bearer {args.api_key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):  # noqa: N802 - http.server's name
            if not self._authorised():
                return
            if self.path == "/health":
                self._send(200 if State.up else 503, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": served, "object": "model", "root": args.model,
                                                             "max_model_len": 512}]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):  # noqa: N802
            if not self._authorised():
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/completions":
                self._send(404, {"detail": "Not Found"})
                return
            with State.lock:
                State.in_flight += 1
            try:
                n = int(body.get("max_tokens") or 4)
                time.sleep(float(os.environ.get("PROVISION_STANDIN_TOKEN_SECONDS", "0.01")) * n)
                self._send(200, {"object": "text_completion", "model": served,
                                 "choices": [{"index": 0, "text": " x" * n, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})
            finally:
                with State.lock:
                    State.in_flight -= 1

    return Handler


def main(argv: list | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    log("INFO", "api_utils.py:347", f"vLLM API server version {_version()}")
    log("INFO", "api_utils.py:347", f"model   {args.model}")
    loaded = load_plugins()
    print(f"PROVISION_STANDIN plugins loaded: {','.join(loaded) or '-'}", flush=True)
    try:
        with open(os.path.join(args.model or "/nonexistent", "config.json"), encoding="utf-8") as fh:
            archs = json.load(fh).get("architectures") or []
    except (OSError, ValueError):
        log("ERROR", "model.py:733", f"Invalid repository ID or local directory specified: '{args.model}'")
        return 1
    for arch in archs:
        log("INFO", "model.py:733", f"Resolved architecture: {arch}")
    host = args.host or "0.0.0.0"
    server = ThreadingHTTPServer((host, args.port), handler(args))
    time.sleep(float(os.environ.get("PROVISION_STANDIN_LOAD_SECONDS", "1")))
    log("INFO", "entry.py:140", f"Starting vLLM server on http://{host}:{args.port}")
    sys.stdout.write(f"(APIServer pid={os.getpid()}) INFO:     Started server process [{os.getpid()}]\n"
                     f"(APIServer pid={os.getpid()}) INFO:     Waiting for application startup.\n"
                     f"(APIServer pid={os.getpid()}) INFO:     Application startup complete.\n")
    sys.stdout.flush()
    State.up = True

    def stop(signum, frame):
        mode = "drain" if args.shutdown_timeout > 0 else "abort"
        log("INFO", "launcher.py:121", f"[shutdown] API server: stopping engine client mode={mode} "
                                       f"timeout={args.shutdown_timeout}s")
        deadline = time.monotonic() + args.shutdown_timeout
        while mode == "drain" and State.in_flight and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)  # pid 1 of a container ignores the signal it would send itself

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
