"""`stop` drains (issue 59): the server's main process alone gets SIGTERM, so the requests in flight
finish as SGLang 0.5.9 drains (/health 503, new requests still taken, the tree gone once none is
left); at the deadline (`--grace`) what is left is ended and the row says how many requests that cut.

Over real sshd, on a sandbox host whose stand-in drains as 0.5.9's sigterm_watchdog does (its poll
shortened to 0.5 s) and decodes at 50 tok/s, so a request of N tokens takes N/50 s.
"""

from __future__ import annotations

import json
import time

import pytest

from tests import pace
from tests.cli.helpers import run_json
from tests.cli.test_server_lifecycle import env, inventory, record, sglang_pids  # noqa: F401 - fixtures

CLIENT = r"""
import json, sys, time, urllib.request
n, out = int(sys.argv[1]), sys.argv[2]
body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": n, "temperature": 0}}).encode()
t0 = time.monotonic()
try:
    r = urllib.request.Request("http://127.0.0.1:30000/generate", data=body,
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as resp:
        doc = {"status": resp.status, "tokens": json.loads(resp.read())["meta_info"]["completion_tokens"]}
except Exception as exc:
    doc = {"error": f"{type(exc).__name__}: {exc}"}
doc["seconds"] = round(time.monotonic() - t0, 2)
open(out, "w").write(json.dumps(doc))
"""


@pytest.fixture(scope="module")
def dhost_module(sandbox_factory):
    host = sandbox_factory.host("drain1", sglang="0.5.9", layout="venv")
    yield host
    sandbox_factory.remove(host)


@pytest.fixture
def host(dhost_module):
    dhost_module.reset()
    yield dhost_module
    dhost_module.run("pkill -9 -f sglang", check=False)


def launched(tmp_path, ssh_env, host, env) -> str:
    inv = inventory(tmp_path, ssh_env, host)
    doc = json.loads(open(inv).read())
    doc["defaults"]["env"].update({"PROVISION_STANDIN_DECODE_TOK_S": "50", "PROVISION_STANDIN_DRAIN_POLL": "0.5"})
    open(inv, "w").write(json.dumps(doc))
    proc, out = run_json("launch", "-i", inv, "--patch", "--poll", "0.5", env=env, timeout=300)
    assert proc.returncode == 0 and out["hosts"][0]["verdict"] == "ready", proc.stdout + proc.stderr
    return inv


def request(host, tokens: int, name: str):
    """A /generate of `tokens` tokens sent inside the host, in the background; its outcome lands in a file."""
    host.hostpath(f"/root/{name}.py").write_text(CLIENT)
    host.run(f"nohup {host.python} /root/{name}.py {tokens} /root/{name}.json >/dev/null 2>&1 &")
    wait_in_flight(host)


def wait_in_flight(host, timeout: float = 30) -> None:
    """Until the server counts the request (SGLang's /get_load: the scheduler's requests)."""
    prog = ("import json, urllib.request\n"
            "print(json.loads(urllib.request.urlopen('http://127.0.0.1:30000/get_load', timeout=5).read())[0]"
            "['num_reqs'])\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = host.run([host.python, "-c", prog], check=False).stdout.strip()
        if out.isdigit() and int(out) >= 1:
            return
        time.sleep(0.1)
    raise AssertionError("the request never showed in flight on the server")


def outcome(host, name: str) -> dict:
    path = host.hostpath(f"/root/{name}.json")
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return json.loads(path.read_text())


def test_stop_lets_the_request_in_flight_finish_whole_then_the_server_is_gone(tmp_path, ssh_env, host, env):
    inv = launched(tmp_path, ssh_env, host, env)
    # 10 s at 50 tok/s on the reference machine, longer on a slower one: still in flight when `stop`'s
    # SIGTERM lands (4 s was not, once, on a machine half as fast)
    tokens = int(500 * min(pace.pace(), 2.5))  # inside the default 30 s grace
    request(host, tokens, "long")
    t0 = time.monotonic()
    proc, doc = run_json("stop", "-i", inv, env=env, timeout=120)
    took = time.monotonic() - t0
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["verdict"] == "stopped", proc.stdout + proc.stderr
    assert "drained: every request in flight finished" in r["detail"], r["detail"]
    got = outcome(host, "long")
    assert got.get("status") == 200 and got.get("tokens") == tokens, got  # whole, not cut
    assert took >= 2.0, took  # it waited for the request
    assert sglang_pids(host) == []
    log = host.hostpath(record(host)["log"]).read_text()
    assert "Gracefully exiting... Remaining number of requests 1." in log  # it drained as SGLang does
    assert "Remaining number of requests 0." in log


def test_stop_at_its_deadline_cuts_what_is_left_and_says_how_many(tmp_path, ssh_env, host, env):
    inv = launched(tmp_path, ssh_env, host, env)
    request(host, 1000, "longer")  # 20 s at 50 tok/s
    t0 = time.monotonic()
    proc, doc = run_json("stop", "-i", inv, "--grace", "2", env=env, timeout=120)
    took = time.monotonic() - t0
    r = doc["hosts"][0]
    assert proc.returncode == 0 and r["verdict"] == "stopped", proc.stdout + proc.stderr
    assert "1 request(s) still in flight were cut at the 2 s deadline (--grace)" in r["detail"], r["detail"]
    assert r["data"]["cut"] == 1
    assert took < 12, took  # the deadline, not the request's 20 s
    assert "error" in outcome(host, "longer")
    assert sglang_pids(host) == []
