"""vLLM's spec-decoding figures from its /metrics counters (output/metricsdelta.py, and
benchfigures.host_figures over a vLLM bench answer). The page is the shape vLLM 0.32 serves
(../shared/VLLM_NOTES.md): counters with `_total` and `_created` samples, one series per engine."""

from provision.output import benchfigures as bf
from provision.output.metricsdelta import counters, deltas

ROLES = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
         "accepted": "vllm:spec_decode_num_accepted_tokens", "requests": "vllm:request_success"}


def page(drafts, tokens, accepted, done=0.0, engines=1):
    out = []
    for name, v in (("spec_decode_num_drafts", drafts), ("spec_decode_num_draft_tokens", tokens),
                    ("spec_decode_num_accepted_tokens", accepted)):
        out += [f"# HELP vllm:{name}_total Number of {name}.", f"# TYPE vllm:{name}_total counter"]
        for e in range(engines):
            out.append(f'vllm:{name}_total{{engine="{e}",model_name="/data/models/target"}} {v / engines}')
            out.append(f'vllm:{name}_created{{engine="{e}",model_name="/data/models/target"}} 1.79e+09')
    out += ["# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {done}']
    return "\n".join(out) + "\n"


def answer(before, after, requests=3, spec=True):
    return {"ok": True, "gpu": {"name": "cpu"}, "server_info": {"model_path": "/data/models/target"},
            "record": {"engine": "vllm", "version": "0.32.0", "tp": 1, "model": "/data/models/target",
                       "spec_args": {"speculative-config": {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}}
                       if spec else {}},
            "metrics_roles": ROLES, "metrics_before": before, "metrics_after": after,
            "requests": [{"ok": True, "ttft_s": 0.05, "decode_s": 0.1, "completion_tokens": 48}] * requests}


def test_counters_sum_the_total_samples_over_labels_and_skip_created():
    c = counters(page(12, 36, 30, engines=2))
    assert c["vllm:spec_decode_num_drafts"] == 12 and c["vllm:spec_decode_num_accepted_tokens"] == 30
    assert not any(k.endswith("_created") for k in c)


def test_deltas_are_growth_and_a_counter_that_went_down_means_a_restart():
    assert deltas(page(10, 30, 30), page(46, 138, 138))["vllm:spec_decode_num_drafts"] == 36
    assert deltas(page(46, 138, 138), page(10, 30, 30)) is None
    assert deltas(None, page(1, 1, 1)) is None and counters("not { prometheus") is None


def test_accept_length_and_rate_come_from_the_counters_growth():
    fig = bf.host_figures(answer(page(10, 30, 30, 2), page(46, 138, 138, 5)))
    assert (fig["accept_length"], fig["accept_rate"]) == (4.0, 1.0)
    assert fig["spec_on"] and fig["speculative"]["speculative_algorithm"] == "EAGLE3"
    assert fig["key"] == "/data/models/target|tp1|vllm 0.32.0|cpu" and fig["flags"] == []
    fig = bf.host_figures(answer(page(0, 0, 0), page(141, 423, 0, 3)))
    assert (fig["accept_length"], fig["accept_rate"]) == (1.0, 0.0)
    bf.flag(fig)
    assert fig["flags"] == ["underperforming"]


def test_no_drafts_counted_is_no_spec_and_other_traffic_is_said():
    fig = bf.host_figures(answer(page(5, 15, 5), page(5, 15, 5, 9)))
    assert fig["flags"] == ["no-spec"] and "counted no drafts" in fig["notes"][0]
    assert any("finished 9 requests while 3 were measured" in n for n in fig["notes"])
    fig = bf.host_figures(answer(page(5, 15, 5), page(5, 15, 5, 3), spec=False))
    assert fig["flags"] == [] and not fig["spec_on"] and fig["accept_length"] is None


def test_an_sglang_key_is_the_one_baseline_files_already_hold():
    assert bf.bench_key("/m", 8, "0.5.9", "H200") == "/m|tp8|0.5.9|H200"


def test_the_host_hands_back_only_the_named_metrics_and_reads_the_busy_gauge():
    from provision.host.lib.promtext import gauge_sum
    from provision.host.ops.bench import metric_lines

    text = page(1, 3, 3) + ('# TYPE vllm:num_requests_running gauge\n'
                            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
                            'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
                            'vllm:spec_decode_num_drafts_per_pos_total{engine="0",position="0"} 9\n'
                            'process_cpu_seconds_total 12.5\n')
    kept = metric_lines(text, tuple(ROLES.values()))
    assert "process_cpu_seconds_total" not in kept and "num_requests_running" not in kept
    assert counters(kept)["vllm:spec_decode_num_drafts"] == 1
    assert gauge_sum(text, "vllm:num_requests_running") == 3.0 and gauge_sum(text, "vllm:nothing") == 0.0
