"""provision's router client (control/router.py) against the real sglang-router 0.3.2 and vllm-router
0.1.17 from the package registry (issue 59), each in turn: it takes a server out and waits until the router no longer lists it,
puts it back and waits until the router lists it healthy, and refuses a URL that is not a router it
knows, or a router that does not answer, with a sentence. The worker is the sandbox's vLLM stand-in
(an OpenAI-compatible server) on this machine's loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from provision.control.router import Router, RouterError, parse_workers, same_url

STANDIN = Path(__file__).resolve().parents[2] / "provision" / "sandbox" / "vllm_standin.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


@pytest.fixture(scope="module", params=["sglang_router", "vllm_router"])
def router_and_worker(tmp_path_factory, request):
    from provision.sandbox import router_venv

    try:
        venv, _ = router_venv.ensure_venv()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"sglang-router unavailable: {exc}")
    model = tmp_path_factory.mktemp("model")
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    rport, wport, mport = free_port(), free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, str(STANDIN), "--model", str(model), "--host", "127.0.0.1",
                               "--port", str(wport)], env={"PROVISION_STANDIN_LOAD_SECONDS": "0", "PATH": "/usr/bin:/bin"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen([str(venv / "bin" / "python"), "-m", f"{request.param}.launch_router", "--host", "127.0.0.1",
                               "--port", str(rport), "--policy", "round_robin", "--disable-retries",
                               "--disable-circuit-breaker", "--health-check-interval-secs", "1",
                               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(mport)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_http(f"http://127.0.0.1:{wport}/health")
        wait_http(f"http://127.0.0.1:{rport}/workers")
        yield f"http://127.0.0.1:{rport}", f"http://127.0.0.1:{wport}", model
    finally:
        for p in procs:
            p.kill()
            p.wait()


def complete(router_url: str, model) -> int:
    body = json.dumps({"model": str(model), "prompt": "hi", "max_tokens": 2}).encode()
    req = urllib.request.Request(router_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_server_is_put_in_listed_healthy_served_then_taken_out_and_no_longer_listed(router_and_worker):
    router_url, worker, model = router_and_worker
    r = Router(router_url)
    assert r.workers() == []
    r.put_back(worker)
    (w,) = r.workers()
    assert same_url(w["url"], worker) and w["healthy"]
    assert complete(router_url, model) == 200  # the router sends it there
    out = r.take_out(worker + "/")  # the same server, however its URL is spelt
    assert out["was_listed"] and r.workers() == []
    assert complete(router_url, model) != 200  # nothing to send it to
    assert r.take_out(worker) == {"was_listed": False, "seconds": 0.0}  # out already: nothing to do


def test_what_is_not_a_known_router_or_does_not_answer_is_refused_with_a_sentence(router_and_worker):
    _, worker, _ = router_and_worker
    with pytest.raises(RouterError, match=r"is not a router provision knows: GET /workers answered 404"):
        Router(worker).workers()  # a server, not a router
    with pytest.raises(RouterError, match=r"did not answer \("):
        Router(f"http://127.0.0.1:{free_port()}", timeout=2).workers()


def test_the_worker_list_reader_takes_the_routers_answers_and_nothing_else():
    real = (b'{"workers":[{"id":"8172ca34-6ce1-495a-a76f-53c58ed1e5d9","url":"http://127.0.0.1:39101",'
            b'"model_id":"unknown","priority":50,"cost":1.0,"worker_type":"regular","is_healthy":true,"load":0,'
            b'"connection_mode":"HTTP","disable_health_check":false}],"total":1,'
            b'"stats":{"prefill_count":0,"decode_count":0,"regular_count":1}}')
    assert parse_workers(real) == [{"id": "8172ca34-6ce1-495a-a76f-53c58ed1e5d9", "url": "http://127.0.0.1:39101",
                                    "healthy": True}]
    assert parse_workers(b'{"workers":[],"total":0}') == []
    vllm_router = (b'{"workers":[{"url":"http://127.0.0.1:38111","model_id":"unknown","worker_type":"regular",'
                   b'"is_healthy":false,"load":0,"connection_mode":"Http","priority":50,"cost":1.0}],"total":1,'
                   b'"stats":{"prefill_count":0,"decode_count":0,"regular_count":1}}')  # 0.1.17: no id
    assert parse_workers(vllm_router) == [{"id": "http://127.0.0.1:38111", "url": "http://127.0.0.1:38111",
                                           "healthy": False}]
    for other in (b"No models available", b'{"detail": "Not Found"}', b'{"workers": {}}', b"[]"):
        assert parse_workers(other) is None
    assert same_url("http://H:30000/", "http://h:30000") and not same_url("http://h:30000", "http://h:30001")
    assert same_url("http://h", "http://h:80")
