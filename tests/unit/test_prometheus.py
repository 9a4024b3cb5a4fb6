"""output/prometheus.py: the status and bench metrics, read back with prometheus_client's own parser."""

from __future__ import annotations

import os
import threading

import pytest

from provision.output import prometheus as pm
from provision.output.results import HostResult
from tests.promtool import lint

parser = pytest.importorskip("prometheus_client.parser")


def samples(text: str) -> dict:
    """{(name, frozenset(labels)): value} and the families' types, through prometheus_client."""
    out, types = {}, {}
    for fam in parser.text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out, types


def status_rows():
    return [
        HostResult("gpu01", "patched", version="0.5.9", install="/opt/venv/lib/python3.11/site-packages/sglang",
                   data={"spec": "kimi-k25-eagle3", "server_state": "up", "server_port": 30000,
                         "restart_needed": False}),
        HostResult("gpu01", "missing", version="0.5.9", install="/opt/venv/lib/python3.11/site-packages/sglang",
                   data={"spec": "sm120-torch-symm-mem", "server_state": "up", "server_port": 30000,
                         "restart_needed": True}),
        HostResult("gpu02", "native", version="0.5.23", install="/usr/lib/sglang",
                   data={"spec": "kimi-k25-eagle3", "server_state": "none", "server": "none"}),
        HostResult("gpu03", "unreachable", "connection refused", error_kind="connect", data={}),
        HostResult('we"ird\\host', "hand-patch", version="0.5.9", install="/x\ny",
                   data={"spec": "kimi-k25-eagle3", "server_state": "starting",
                         "server": "pid 12 port 30001 health 503 up 3 s model m"}),
    ]


def test_status_metrics_parse_and_say_each_rows_state():
    got, types = samples(pm.status_metrics(status_rows()))
    assert types == {"provision_spec_state": "gauge", "provision_server_up": "gauge",
                     "provision_restart_needed": "gauge", "provision_sglang_info": "gauge",
                     "provision_engine_info": "gauge"}

    def state(host, spec):
        ones = [dict(k[1])["state"] for k, v in got.items()
                if k[0] == "provision_spec_state" and dict(k[1])["host"] == host and dict(k[1])["spec"] == spec
                and v == 1]
        return ones

    assert state("gpu01", "kimi-k25-eagle3") == ["patched"]
    assert state("gpu01", "sm120-torch-symm-mem") == ["missing"]
    assert state("gpu02", "kimi-k25-eagle3") == ["native"]
    assert state("gpu03", "") == ["unreachable"]
    assert state('we"ird\\host', "kimi-k25-eagle3") == ["hand-patch"], "label values are escaped"
    n_states = sum(1 for k in got if k[0] == "provision_spec_state" and dict(k[1])["host"] == "gpu02")
    assert n_states == len(pm.SPEC_STATES), "every state has a series (0 or 1), so alerts can match == 1"
    assert got[("provision_server_up", frozenset({"host": "gpu01", "port": "30000"}.items()))] == 1
    assert got[("provision_server_up", frozenset({"host": "gpu02", "port": ""}.items()))] == 0
    assert got[("provision_server_up", frozenset({"host": 'we"ird\\host', "port": "30001"}.items()))] == 0
    assert not any(k[0] == "provision_server_up" and dict(k[1])["host"] == "gpu03" for k in got)
    assert got[("provision_restart_needed", frozenset({"host": "gpu01"}.items()))] == 1
    assert got[("provision_restart_needed", frozenset({"host": "gpu02"}.items()))] == 0
    assert got[("provision_sglang_info", frozenset({"host": "gpu02", "version": "0.5.23",
                                                    "install": "/usr/lib/sglang"}.items()))] == 1
    assert got[("provision_sglang_info", frozenset({"host": 'we"ird\\host', "version": "0.5.9",
                                                    "install": "/x\ny"}.items()))] == 1


def bench_rows():
    good = HostResult("g", "measured", data={"decode_tok_s": 96.1, "decode_tok_s_p10": 90.5, "decode_tok_s_p90": 99.0,
                                             "ttft_s": 0.21, "accept_length": 3.1, "accept_rate": 0.7,
                                             "speedup": 1.78, "flags": []})
    slow = HostResult("s", "measured", data={"decode_tok_s": 40.0, "decode_tok_s_p10": 39.0, "decode_tok_s_p90": 41.0,
                                             "ttft_s": 0.3, "accept_length": 1.2, "accept_rate": None,
                                             "speedup": 0.74, "flags": ["net-negative", "underperforming"]})
    base = HostResult("b", "measured", data={"decode_tok_s": 54.1, "decode_tok_s_p10": 53.0, "decode_tok_s_p90": 55.0,
                                             "ttft_s": 0.2, "accept_length": None, "speedup": None, "flags": []})
    down = HostResult("d", "failed", "nothing answers", data={"flags": []})
    return [good, slow, base, down]


def test_bench_metrics_parse_and_unknown_figures_have_no_sample():
    got, types = samples(pm.bench_metrics(bench_rows()))
    assert set(types) == {"provision_bench_decode_tokens_per_second", "provision_bench_ttft_seconds",
                          "provision_bench_accept_length", "provision_bench_accept_rate", "provision_bench_speedup",
                          "provision_bench_flag", "provision_bench_measured"}

    def v(name, **labels):
        return got.get((name, frozenset(labels.items())))

    assert v("provision_bench_decode_tokens_per_second", host="g", stat="median") == 96.1
    assert v("provision_bench_decode_tokens_per_second", host="g", stat="p10") == 90.5
    assert v("provision_bench_decode_tokens_per_second", host="g", stat="p90") == 99.0
    assert v("provision_bench_accept_length", host="g") == 3.1
    assert v("provision_bench_speedup", host="g") == 1.78
    assert v("provision_bench_speedup", host="b") is None, "no baseline: no sample, never a made-up 0"
    assert v("provision_bench_accept_length", host="b") is None
    assert v("provision_bench_flag", host="s", flag="net-negative") == 1
    assert v("provision_bench_flag", host="s", flag="underperforming") == 1
    assert v("provision_bench_flag", host="s", flag="outlier") == 0
    assert v("provision_bench_flag", host="g", flag="net-negative") == 0
    assert v("provision_bench_measured", host="d") == 0 and v("provision_bench_measured", host="g") == 1
    assert v("provision_bench_decode_tokens_per_second", host="d", stat="median") is None


def test_write_atomic_replaces_whole_files_only(tmp_path):
    path = tmp_path / "provision.prom"
    pm.write_atomic(str(path), "a 1\n")
    assert path.read_text() == "a 1\n" and oct(path.stat().st_mode & 0o777) == "0o644"
    seen = set()
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.add(path.read_text())
            except FileNotFoundError:
                seen.add("MISSING")

    t = threading.Thread(target=reader)
    t.start()
    big = "x 2\n" * 50000
    for _ in range(20):
        pm.write_atomic(str(path), big)
        pm.write_atomic(str(path), "a 1\n")
    stop.set()
    t.join()
    assert seen <= {"a 1\n", big}, "a reader never sees a part of a file, nor none"
    assert [p.name for p in tmp_path.iterdir()] == ["provision.prom"], "no temp file left behind"


def test_write_atomic_into_a_missing_directory_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        pm.write_atomic(str(tmp_path / "nope" / "x.prom"), "a 1\n")
    assert not os.path.exists(tmp_path / "nope")


@pytest.mark.parametrize("argv", [["patch", "--host", "gpu01"], ["reconcile", "--host", "gpu01"],
                                  ["history"]])
def test_other_commands_refuse_format_prometheus(argv):
    from click.testing import CliRunner

    from provision.cli.main import main

    res = CliRunner().invoke(main, argv + ["--format", "prometheus"])
    assert res.exit_code == 2, res.output
    assert "prometheus" in res.output and "Traceback" not in res.output


def test_status_names_each_hosts_engine_and_sglang_info_stays_sglangs():
    rows = [HostResult("gpu01", "patched", version="0.5.9", install="/opt/v/sglang",
                       data={"spec": "kimi-k25-eagle3", "server_state": "up", "server_port": 30000, "engine": "sglang"}),
            HostResult("gpu02", "not-applicable", version="0.32.0", install="/opt/vllm-env/lib/python3.11/site-packages/vllm",
                       data={"spec": "kimi-k25-eagle3", "server_state": "up", "engine": "vllm",
                             "server": "pid 7 port 30000 health 200 up 40 s model /m"})]
    got, types = samples(pm.status_metrics(rows))
    assert types["provision_engine_info"] == "gauge"
    assert got[("provision_engine_info", frozenset({"host": "gpu02", "engine": "vllm", "version": "0.32.0",
                "install": "/opt/vllm-env/lib/python3.11/site-packages/vllm"}.items()))] == 1
    assert got[("provision_engine_info", frozenset({"host": "gpu01", "engine": "sglang", "version": "0.5.9",
                "install": "/opt/v/sglang"}.items()))] == 1
    assert [k for k in got if k[0] == "provision_sglang_info"] == [
        ("provision_sglang_info", frozenset({"host": "gpu01", "version": "0.5.9", "install": "/opt/v/sglang"}.items()))]
    assert got[("provision_server_up", frozenset({"host": "gpu02", "port": "30000"}.items()))] == 1


def test_promtool_finds_nothing_to_say_of_the_status_and_bench_metrics():
    """Prometheus's own linter (help text, types, names: no _total on a gauge) on every family,
    SGLang and vLLM hosts, odd label values included; and it does speak up on a bad family."""
    vllm = HostResult("gpu02", "not-applicable", version="0.32.0", install="/opt/vllm-env/lib/python3.11/site-packages/vllm",
                      data={"spec": "kimi-k25-eagle3", "server_state": "up", "engine": "vllm"})
    assert lint(pm.status_metrics(status_rows() + [vllm])) == ""
    assert lint(pm.bench_metrics(bench_rows())) == ""
    assert "no help text" in lint("# TYPE foo_total gauge\nfoo_total 1\n")


def test_the_servers_sample_is_the_hosts_and_an_unreachable_host_has_no_made_up_figure():
    """issue 43 item 4: a host whose first spec row is an error still says its server is up (the
    server is the host's, not the spec's), and an unreachable host has no provision_restart_needed
    sample (a 0 there would be a made-up figure); promtool finds nothing to say of either."""
    rows = [HostResult("gpu01", "error", "spec sm120-x: its file is not in this SGLang", version="0.5.9",
                       install="/opt/v/sglang", error_kind="spec", data={"spec": "sm120-x"}),
            HostResult("gpu01", "patched", version="0.5.9", install="/opt/v/sglang",
                       data={"spec": "kimi-k25-eagle3", "server_state": "up", "server_port": 30000,
                             "restart_needed": False}),
            HostResult("gpu03", "unreachable", "connection refused", error_kind="connect", data={})]
    text = pm.status_metrics(rows)
    got, _ = samples(text)
    assert got[("provision_server_up", frozenset({"host": "gpu01", "port": "30000"}.items()))] == 1
    assert got[("provision_restart_needed", frozenset({"host": "gpu01"}.items()))] == 0
    assert not any(k[0] in ("provision_restart_needed", "provision_server_up") and dict(k[1])["host"] == "gpu03"
                   for k in got), got
    assert lint(text) == ""
