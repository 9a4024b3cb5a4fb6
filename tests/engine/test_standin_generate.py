"""The stand-in's /generate, /flush_cache and internal_states (standin_generate.py), and the host
side of `provision bench` (host/ops/bench.py) against it: real processes on loopback, no SSH.

Every bad input the bench op must survive is made real here: nothing listening, a 401, a stream
cut half way, a chunk that is not JSON, a release without spec fields, a busy server."""

from __future__ import annotations

import json
import socket

import pytest

from provision.host.ops import bench as op
from provision.output import benchfigures as bf
from tests.engine.test_standin import EAGLE3_FLAGS, base_flags, free_port, http, running, trees  # noqa: F401

FAST = {"PROVISION_STANDIN_TTFT_SECONDS": "0.02"}


def up(running, trees, env, *, spec=True, key=None, forms=None, tree="patched"):  # noqa: F811
    port = free_port()
    flags = base_flags(port, tp=1) + (EAGLE3_FLAGS if spec else []) + (["--api-key", key] if key else [])
    full = dict(FAST, **env)
    if forms:
        full["PROVISION_STANDIN_LOG_FORMS"] = forms
    s = running(trees(tree), flags, env=full, load_seconds=0.1, warmup_seconds=0.1)
    s.wait_text("The server is fired up and ready to roll!", timeout=60)
    return s, port


def bench(port, tmp_path, **kw):
    req = {"op": "bench", "port": port, "state_dir": str(tmp_path / "state"), "warmup": 1, "requests": 4,
           "max_new_tokens": 64, "read_timeout": 10}
    req.update(kw)
    return op.op_bench(req, b"")


def sse(port, key=None, n=40):
    """The raw SSE events of one streaming /generate."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    c.request("POST", "/generate", json.dumps({"text": "hi", "stream": True,
                                               "sampling_params": {"max_new_tokens": n}}), h)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, r.getheader("content-type"), [e[6:] for e in body.split("\n\n") if e.startswith("data: ")]


@pytest.mark.parametrize("forms,names,absent", [
    ("0.5.9", ("spec_accept_token_num", "spec_draft_token_num"), "spec_num_correct_drafts"),
    ("0.5.23", ("spec_num_correct_drafts", "spec_num_proposed_drafts"), "spec_accept_token_num"),
])
def test_stream_carries_the_release_fields_in_its_final_event(running, trees, forms, names, absent):  # noqa: F811
    s, port = up(running, trees, {"PROVISION_STANDIN_ACCEPT_LENGTH": "2.5"}, forms=forms)
    status, ctype, events = sse(port)
    assert status == 200 and ctype.startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 40
    final = chunks[-1]["meta_info"]
    for n in names + ("spec_verify_ct", "spec_accept_length", "spec_accept_rate", "completion_tokens"):
        assert n in final
    assert absent not in final
    assert final["spec_accept_length"] == pytest.approx(40 / final["spec_verify_ct"], abs=1e-3)
    assert "spec_verify_ct" not in chunks[0]["meta_info"], "only the final event carries the spec fields"
    # tokens arrive per verify step: about accept-length tokens a chunk
    assert 2.0 <= (40 - 1) / (len(chunks) - 1) <= 3.0


def test_without_speculation_no_spec_fields_and_one_token_a_chunk(running, trees):  # noqa: F811
    s, port = up(running, trees, {}, spec=False)
    _, _, events = sse(port, n=12)
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 12 and "spec_verify_ct" not in chunks[-1]["meta_info"]
    info = json.loads(http(port, "/server_info")[1])
    assert info["internal_states"][0]["avg_spec_accept_length"] is None


def test_flush_cache_is_400_while_a_generation_runs_and_resets_the_average(running, trees):  # noqa: F811
    s, port = up(running, trees, {"PROVISION_STANDIN_DECODE_TOK_S": "40"})
    sse(port)
    assert json.loads(http(port, "/server_info")[1])["internal_states"][0]["avg_spec_accept_length"] > 1
    from http.client import HTTPConnection

    c = HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/generate", json.dumps({"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 120}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    try:
        assert r.readline().startswith(b"data: "), "the first event: the generation is running"
        assert http(port, "/flush_cache", body={})[0] == 400
    finally:
        r.read()
        c.close()
    assert http(port, "/flush_cache", body={})[0] == 200
    assert json.loads(http(port, "/server_info")[1])["internal_states"][0]["avg_spec_accept_length"] is None


@pytest.mark.parametrize("forms", ["0.5.9", "0.5.23"])
def test_bench_op_measures_what_the_standin_was_set_to(running, trees, tmp_path, forms):  # noqa: F811
    s, port = up(running, trees, {"PROVISION_STANDIN_DECODE_TOK_S": "150", "PROVISION_STANDIN_ACCEPT_LENGTH": "2.4"},
                 forms=forms)
    ans = bench(port, tmp_path)
    assert ans["ok"], ans
    assert ans["warmup"] == 1 and len(ans["requests"]) == 4 and ans["flushed"] is True
    assert [r["prompt"] for r in ans["requests"]] == ["code", "prose", "math", "tool-call"]
    fig = bf.host_figures(ans)
    assert fig["decode_tok_s"] == pytest.approx(150, rel=0.15)
    assert fig["accept_length"] == pytest.approx(2.4, rel=0.15)
    assert fig["accept_rate"] is not None and 0 < fig["accept_rate"] <= 1
    assert fig["spec_on"] and fig["speculative"]["speculative_algorithm"] == "EAGLE3" and not fig["flags"]
    assert fig["server_accept_length"] == pytest.approx(fig["accept_length"], rel=0.1)
    assert "api_key" not in json.dumps(ans)


def test_bench_op_uses_the_launch_config_file_key_and_says_401_without_it(running, trees, tmp_path):  # noqa: F811
    s, port = up(running, trees, {}, key="SECRET-KEY-1")
    ans = bench(port, tmp_path, requests=1, warmup=0)
    assert not ans["ok"] and ans["error"]["kind"] == "unauthorized" and "401" in ans["error"]["message"]
    # the launch's 0600 --config file, as ops/server.py op_start writes it, named by the record
    sdir = tmp_path / "state" / "server"
    sdir.mkdir(parents=True)
    cfg = sdir / f"server-{port}.secrets.yaml"
    cfg.write_text('# written by provision\napi-key: "SECRET-KEY-1"\n')
    op.server.write_record({"state_dir": str(tmp_path / "state")}, port,
                           {"port": port, "host": "127.0.0.1", "config": str(cfg)})
    ans = bench(port, tmp_path, requests=1, warmup=0)
    assert ans["ok"], ans
    # the run's own secret, with no record at all
    ans = bench(port, tmp_path / "other", requests=1, warmup=0, secrets={"args": {"api-key": "SECRET-KEY-1"}})
    assert ans["ok"], ans


@pytest.mark.parametrize("fault,kind,words", [
    ("cut", "stream", "cut after"),
    ("non-json", "stream", "not JSON"),
])
def test_bench_op_broken_streams_are_a_sentence(running, trees, tmp_path, fault, kind, words):  # noqa: F811
    s, port = up(running, trees, {"PROVISION_STANDIN_STREAM_FAULT": fault})
    ans = bench(port, tmp_path, warmup=0, requests=2)
    assert not ans["ok"] and ans["error"]["kind"] == kind and words in ans["error"]["message"], ans


def test_bench_op_older_release_without_spec_fields_is_flagged_no_spec(running, trees, tmp_path):  # noqa: F811
    s, port = up(running, trees, {"PROVISION_STANDIN_STREAM_FAULT": "no-spec-fields"})
    ans = bench(port, tmp_path, warmup=0, requests=2)
    assert ans["ok"]
    fig = bf.host_figures(ans)
    assert fig["flags"] == ["no-spec"] and fig["accept_length"] is None


def test_bench_op_busy_server_is_skipped_unless_forced(running, trees, tmp_path):  # noqa: F811
    s, port = up(running, trees, {"PROVISION_STANDIN_BUSY": "1"})
    ans = bench(port, tmp_path, warmup=0, requests=1)
    assert not ans["ok"] and ans["error"]["kind"] == "busy" and ans["requests"] == []
    ans = bench(port, tmp_path, warmup=0, requests=1, force=True)
    assert ans["ok"] and ans["busy_forced"] and len(ans["requests"]) == 1


def test_bench_op_nothing_listening_and_a_silent_server(tmp_path):
    port = free_port()
    ans = bench(port, tmp_path)
    assert not ans["ok"] and ans["error"]["kind"] == "down" and "connection refused" in ans["error"]["message"]
    # a port that accepts and never answers: the read timeout, not a hang
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    try:
        ans = bench(srv.getsockname()[1], tmp_path, read_timeout=0.5)
        assert not ans["ok"] and ans["error"]["kind"] == "timeout", ans
    finally:
        srv.close()
