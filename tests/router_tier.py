"""The real sglang-router 0.3.2 or vllm-router 0.1.17 (their venv built by .ci/run:
provision/sandbox/router_venv.py), run on this machine for the tests that put a router in front of
sandbox hosts (issue 59)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def router_venv():
    from provision.sandbox import router_venv as rv

    try:
        return rv.ensure_venv()[0]
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"sglang-router unavailable: {exc}")


class RealRouter:
    """sglang-router (or `kind="vllm_router"`) on 127.0.0.1, round robin, retries and circuit breaker off (a client sees what the
    router sees), its own health checks as shipped (every 60 s); start() again after stop() keeps
    its port."""

    def __init__(self, kind: str = "sglang_router") -> None:
        self.kind = kind
        self.venv, self.port, self.metrics_port = router_venv(), free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "RealRouter":
        self.proc = subprocess.Popen(
            [str(self.venv / "bin" / "python"), "-m", f"{self.kind}.launch_router", "--host", "127.0.0.1",
             "--port", str(self.port), "--policy", "round_robin", "--disable-retries", "--disable-circuit-breaker",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url + "/workers", timeout=2)
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"{self.kind} never answered")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def listed(self) -> list[dict]:
        with urllib.request.urlopen(self.url + "/workers", timeout=5) as resp:
            return json.loads(resp.read())["workers"]
