"""The arithmetic of `provision bench` (output/benchfigures.py), the rows and exit code of
tasks/bench.py, and the GPU-name reader: pure, exhaustive."""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given, strategies as st

from provision.errors import EXIT_BENCH_FLAGGED, EXIT_CODES, EXIT_FAILED, EXIT_OK
from provision.errors import ConfigError
from provision.host.facts.gpu_name import parse_names
from provision.output import benchfigures as bf
from provision.tasks import bench as tb

SPEC = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4, "speculative_draft_model_path": "/m/d"}


def req(tokens=512, decode_s=5.11, ttft=0.2, verify=None, **extra):
    r = {"ok": True, "completion_tokens": tokens, "decode_s": decode_s, "ttft_s": ttft, "first_chunk_tokens": 1}
    if verify is not None:
        r["spec_verify_ct"] = verify
    r.update(extra)
    return r


def answer(reqs, spec=True, version="0.5.9", model="/m/Kimi", tp=8, gpu="RTX", after=None):
    info = {"version": version, "tp_size": tp, "model_path": model}
    if spec:
        info.update(SPEC)
    else:
        info["speculative_algorithm"] = None
    return {"ok": True, "server_info": info, "model_info": {"model_path": model}, "gpu": {"name": gpu},
            "requests": reqs, "server_info_after": after or {}}


# --------------------------------------------------------------------------- percentiles


def test_percentiles_match_numpys_linear_default():
    xs = [10, 20, 30, 40, 50]
    assert bf.median(xs) == 30
    assert bf.percentile(xs, 10) == pytest.approx(14)
    assert bf.percentile(xs, 90) == pytest.approx(46)
    assert bf.median([1, 2]) == 1.5 and bf.median([7]) == 7 and bf.median([]) is None
    assert bf.percentile([3, 1, 2], 0) == 1 and bf.percentile([3, 1, 2], 100) == 3


@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=50))
def test_median_is_the_statistics_median_and_p10_le_median_le_p90(xs):
    assert bf.median(xs) == pytest.approx(statistics.median(xs))
    assert bf.percentile(xs, 10) <= bf.median(xs) + 1e-9 <= bf.percentile(xs, 90) + 2e-9


# --------------------------------------------------------------------------- per request


def test_decode_rate_excludes_the_first_chunk_and_needs_an_interval():
    assert bf.decode_rate(req(101, 1.0)) == pytest.approx(100)
    assert bf.decode_rate(req(101, 1.0, first_chunk_tokens=5)) == pytest.approx(96)
    assert bf.decode_rate(req(1, 0.0)) is None and bf.decode_rate(req(10, 0)) is None
    assert bf.decode_rate({"completion_tokens": "12", "decode_s": 1}) is None
    # a burst (every chunk read at once: CI once saw 172,349 tok/s) is no decode interval
    assert bf.decode_rate(req(32, 0.00018)) is None and bf.decode_rate(req(32, 0.0021)) == pytest.approx(31 / 0.0021)
    assert bf.decode_rate({"completion_tokens": True, "decode_s": 1}) is None


def test_accept_length_is_sum_over_sum_not_a_mean_of_ratios():
    reqs = [req(100, verify=50), req(300, verify=100)]  # per-request 2.0 and 3.0
    assert bf.accept_length(reqs) == pytest.approx(400 / 150)
    assert bf.accept_length([req(100)]) is None
    assert bf.accept_length([req(100, verify=0)]) is None


@pytest.mark.parametrize("fields", [
    {"spec_accept_token_num": 60, "spec_draft_token_num": 100},          # 0.5.9
    {"spec_num_correct_drafts": 60, "spec_num_proposed_drafts": 100},    # 0.5.23
])
def test_accept_rate_from_either_releases_field_names(fields):
    reqs = [req(100, verify=40, **fields), req(100, verify=40, **fields)]
    assert bf.accept_rate(reqs) == pytest.approx(0.6)
    assert bf.accept_length(reqs) == pytest.approx(2.5)


def test_accept_rate_is_none_where_no_draft_counts_exist():
    assert bf.accept_rate([req(100, verify=40, spec_accept_length=2.5)]) is None


def test_mixed_releases_in_one_run_sum_both():
    reqs = [req(10, verify=5, spec_accept_token_num=3, spec_draft_token_num=10),
            req(10, verify=5, spec_num_correct_drafts=7, spec_num_proposed_drafts=10)]
    assert bf.accept_rate(reqs) == pytest.approx(0.5)


# --------------------------------------------------------------------------- a host


def test_host_figures_median_p10_p90_ttft_and_key():
    rates = [90, 92, 94, 96, 98, 100, 102]
    reqs = [req(513, 512 / r, ttft=0.1 + i / 100, verify=165) for i, r in enumerate(rates)]
    f = bf.host_figures(answer(reqs))
    assert f["decode_tok_s"] == pytest.approx(96, abs=0.01)
    assert f["decode_tok_s_p10"] == pytest.approx(bf.percentile(rates, 10), abs=0.01)
    assert f["decode_tok_s_p90"] == pytest.approx(bf.percentile(rates, 90), abs=0.01)
    assert f["ttft_s"] == pytest.approx(0.13)
    assert f["accept_length"] == pytest.approx(513 / 165, abs=1e-3)
    assert f["key"] == "/m/Kimi|tp8|0.5.9|RTX" and f["spec_on"] and f["flags"] == []
    assert f["speculative"] == SPEC


def test_failed_requests_are_not_counted():
    f = bf.host_figures(answer([req(101, 1.0, verify=50), {"ok": False, "completion_tokens": 5}]))
    assert f["requests"] == 1 and f["decode_tok_s"] == pytest.approx(100)


def test_no_spec_when_the_server_says_eagle3_but_answers_carry_no_verify_count():
    f = bf.host_figures(answer([req(101, 1.0), req(101, 1.0)]))
    assert f["flags"] == ["no-spec"] and "spec_verify_ct" in f["notes"][0]
    assert bf.host_figures(answer([req(101, 1.0)], spec=False))["flags"] == []


def test_keys_tell_model_tp_version_and_gpu_apart():
    base = bf.host_figures(answer([req()]))["key"]
    for kw in ({"model": "/m/Other"}, {"tp": 4}, {"version": "0.5.23"}, {"gpu": "H100"}):
        assert bf.host_figures(answer([req()], **kw))["key"] != base
    assert bf.host_figures({"requests": [req()]})["key"] == "unknown|tp1|unknown|unknown"


def test_server_accept_length_disagreeing_is_a_note_not_a_flag():
    after = {"internal_states": [{"avg_spec_accept_length": 1.5}]}
    f = bf.host_figures(answer([req(300, verify=100)], after=after))
    assert f["server_accept_length"] == 1.5 and f["flags"] == [] and "avg_spec_accept_length" in f["notes"][0]


# --------------------------------------------------------------------------- flags


def figs_for(rates_by_host, spec=True, accept=None, key_gpu="RTX"):
    out = {}
    for host, rate in rates_by_host.items():
        verify = round(513 / accept) if accept else (165 if spec else None)
        out[host] = bf.host_figures(answer([req(513, 512 / rate, verify=verify)], spec=spec, gpu=key_gpu))
    return out


def baseline_for(rate, gpu="RTX"):
    return {bf.bench_key("/m/Kimi", 8, "0.5.9", gpu): {"decode_tok_s": rate}}


def test_speedup_and_net_negative_and_underperforming():
    figs = figs_for({"good": 96.1, "slow": 40.0, "meh": 60.0})
    bf.judge(figs, baseline_for(54.1))
    assert figs["good"]["speedup"] == pytest.approx(96.1 / 54.1, abs=0.01) and figs["good"]["flags"] == []
    assert "net-negative" in figs["slow"]["flags"] and "underperforming" in figs["slow"]["flags"]
    assert figs["meh"]["flags"] == ["underperforming"]  # 1.11x < 1.3


def test_min_speedup_and_min_accept_length_are_the_users():
    figs = figs_for({"a": 60.0}, accept=1.5)
    bf.judge(figs, baseline_for(54.1), min_speedup=1.1, min_accept_length=1.4)
    assert figs["a"]["flags"] == []
    figs = figs_for({"a": 60.0}, accept=1.5)
    bf.judge(figs, baseline_for(54.1), min_speedup=1.1)
    assert figs["a"]["flags"] == ["underperforming"] and "accept length 1.50 < 1.8" in figs["a"]["notes"][-1]


def test_no_matching_baseline_entry_is_a_note_not_a_figure():
    figs = figs_for({"a": 96.0})
    bf.judge(figs, baseline_for(54.1, gpu="H100"))
    assert figs["a"]["speedup"] is None and figs["a"]["flags"] == []
    assert "no baseline entry for /m/Kimi|tp8|0.5.9|RTX" in figs["a"]["notes"][0]


def test_a_baseline_host_gets_no_speedup_flags():
    figs = figs_for({"base": 30.0}, spec=False)
    bf.judge(figs, baseline_for(54.1))
    assert figs["base"]["speedup"] is None and figs["base"]["flags"] == []


def test_outlier_below_085_of_its_keys_median_with_at_least_two_hosts():
    figs = figs_for({"a": 96.0, "b": 95.0, "c": 97.0, "d": 70.0})
    bf.judge(figs, None)
    assert [h for h, f in figs.items() if "outlier" in f["flags"]] == ["d"]
    alone = figs_for({"x": 10.0})
    bf.judge(alone, None)
    assert alone["x"]["flags"] == []
    other_gpu = figs_for({"a": 96.0})
    other_gpu.update(figs_for({"z": 50.0}, key_gpu="H100"))
    bf.judge(other_gpu, None)
    assert all(f["flags"] == [] for f in other_gpu.values()), "hosts of another key are not compared"
    mixed = figs_for({"spec": 96.0})
    mixed.update(figs_for({"base1": 54.0, "base2": 55.0}, spec=False))
    bf.judge(mixed, None)
    assert all(f["flags"] == [] for f in mixed.values()), "a baseline is not compared with speculative hosts"


# --------------------------------------------------------------------------- baseline file


def test_baseline_entries_round_trip_and_keep_speculative_hosts_under_their_algorithm():
    figs = figs_for({"b1": 54.0, "b2": 56.0}, spec=False)
    figs.update(figs_for({"s1": 96.0}))
    entries, notes = bf.baseline_entries(figs, "2026-12-01T00:00:00+00:00")
    assert sorted(entries) == ["/m/Kimi|tp8|0.5.9|RTX", "/m/Kimi|tp8|0.5.9|RTX|EAGLE3"] and not notes
    assert entries["/m/Kimi|tp8|0.5.9|RTX"]["decode_tok_s"] == 55.0
    spec = entries["/m/Kimi|tp8|0.5.9|RTX|EAGLE3"]
    assert spec["speculative"] and spec["decode_tok_s"] == pytest.approx(96.0, rel=0.01) and spec["accept_length"]
    text = bf.render_baseline(entries, "2026-12-01T00:00:00+00:00")
    assert bf.parse_baseline(text, "b.json") == json.loads(text)["entries"]
    merged = bf.merge_baseline({"other": {"decode_tok_s": 1}}, entries)
    assert set(merged) == {"other", "/m/Kimi|tp8|0.5.9|RTX", "/m/Kimi|tp8|0.5.9|RTX|EAGLE3"}


def test_a_speculative_host_is_held_to_the_baseline_of_its_kind_on_any_release():
    """issue 63: --save-baseline keeps EAGLE-3 figures; --baseline holds a canary on a new release to them."""
    key9, key10 = "/m|tp8|0.5.9|GPU|EAGLE3", "/m|tp8|0.5.10|GPU|EAGLE3"
    base = {key9: {"decode_tok_s": 96.0, "version": "0.5.9", "saved_at": "2026-12-01T00:00:00"},
            "/m|tp8|0.5.9|GPU": {"decode_tok_s": 54.0},
            "/m|tp4|0.5.9|GPU|EAGLE3": {"decode_tok_s": 50.0, "saved_at": "2026-12-02T00:00:00"}}
    fig = {"decode_tok_s": 69.9, "spec_on": True, "version": "0.5.10", "key": "/m|tp8|0.5.10|GPU",
           "speculative": {"speculative_algorithm": "EAGLE3"}, "flags": [], "notes": []}
    held = bf.spec_baseline(fig, base)
    assert held is not None and held["decode_tok_s"] == 96.0 and held["version"] == "0.5.9"
    bf.flag_regressions({"canary": fig}, {"canary": held}, 0.9)
    assert fig["flags"] == ["regressed"] and fig["vs_baseline"] == 0.728
    assert fig["notes"] == ["regressed: 69.9 tok/s on 0.5.10 is 0.73x the baseline's 96.0 tok/s on 0.5.9 (saved "
                            "2026-12-01 00:00) < 0.9"]
    # its own release's entry, when saved, is the one it is held to
    own = dict(base, **{key10: {"decode_tok_s": 70.0, "version": "0.5.10", "saved_at": "2026-11-01T00:00:00"}})
    assert bf.spec_baseline(fig, own)["decode_tok_s"] == 70.0
    assert bf.spec_baseline(dict(fig, spec_on=False), base) is None  # a server without EAGLE-3: the speedup's side
    assert bf.spec_baseline(dict(fig, key="/m|tp2|0.5.10|GPU"), base) is None  # no entry of its kind


@pytest.mark.parametrize("text,words", [
    ("not json", "not JSON"),
    ("[]", "not a bench baseline"),
    (json.dumps({"format": "x", "entries": {}}), "not a bench baseline"),
    (json.dumps({"format": bf.BASELINE_FORMAT, "entries": {"k": {"decode_tok_s": "fast"}}}), "numeric"),
])
def test_bad_baseline_files_are_config_errors_naming_the_file(text, words):
    with pytest.raises(ConfigError) as e:
        bf.parse_baseline(text, "/tmp/b.json")
    assert "/tmp/b.json" in e.value.message and words in e.value.message


# --------------------------------------------------------------------------- rows and exit code


def test_rows_verdicts_and_exit_codes():
    good = tb.result_from_answer("g", answer([req(513, 512 / 96, verify=165)]))
    slow = tb.result_from_answer("s", answer([req(513, 512 / 40, verify=400)]))
    busy = tb.result_from_answer("b", {"ok": False, "error": {"kind": "busy", "message": "busy"}, "requests": []})
    down = tb.result_from_answer("d", {"ok": False, "error": {"kind": "down", "message": "nothing answers"}})
    cut = tb.result_from_answer("c", {"ok": False, "error": {"kind": "stream", "message": "cut"},
                                      "requests": [req()]})
    assert good.verdict == "measured" and busy.verdict == "busy" and not busy.failed
    assert down.verdict == "failed" and down.failed and cut.detail == "cut (after 1 measured request)"
    tb.judge([good, slow], baseline_for(54.1), min_speedup=1.3, min_accept_length=1.8)
    assert "speedup 1.77x" in good.detail and "flags: net-negative, underperforming" in slow.detail
    assert tb.exit_code([good]) == EXIT_OK
    assert tb.exit_code([good, busy]) == EXIT_OK
    assert tb.exit_code([good, slow]) == EXIT_BENCH_FLAGGED
    assert tb.exit_code([good, slow, down]) == EXIT_FAILED
    rec = tb.record(slow)
    for k in ("host", "decode_tok_s", "decode_tok_s_p10", "decode_tok_s_p90", "ttft_s", "accept_length",
              "accept_rate", "speedup", "flags", "version", "spec"):
        assert k in rec
    # two hosts of one key: the slow one is below 0.85 x their median too
    assert rec["flags"] == ["net-negative", "underperforming", "outlier"] and "journal_fields" not in rec
    assert rec["spec"] == SPEC and "speculative" not in rec
    assert slow.data["journal_fields"]["bench"]["decode_tok_s"] == pytest.approx(40, abs=0.1)


def test_the_flag_exit_code_is_new_and_documented():
    assert EXIT_BENCH_FLAGGED not in (0, 1, 2) and EXIT_BENCH_FLAGGED in EXIT_CODES
    assert list(EXIT_CODES).count(EXIT_BENCH_FLAGGED) == 1


def test_bench_results_are_journaled_with_their_figures():
    from provision.control import journal

    good = tb.result_from_answer("g", answer([req(513, 512 / 96, verify=165)]))
    down = tb.result_from_answer("d", {"ok": False, "error": {"kind": "down", "message": "nothing answers"}})
    tb.judge([good, down], None, min_speedup=1.3, min_accept_length=1.8)
    lines = journal.entries("bench", [good, down])
    assert [(x["host"], x["verdict"]) for x in lines] == [("g", "measured"), ("d", "failed")]
    assert lines[0]["bench"]["decode_tok_s"] == pytest.approx(96, abs=0.1) and "decode 96.0 tok/s" in lines[0]["detail"]
    assert lines[0]["spec"] is None, "the journal's spec column is a patch spec's name, not the settings"
    assert journal.entries("status", [good]) == [], "other commands' measured rows are not changes"


# --------------------------------------------------------------------------- GPU name


def test_gpu_name_from_nvidia_smi_output():
    assert parse_names("NVIDIA RTX PRO 6000 Blackwell Server Edition\n" * 8) == \
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 8)
    assert parse_names("NVIDIA H100\nNVIDIA A100\n") == ("NVIDIA H100 + NVIDIA A100", 2)
    assert parse_names("\n") == ("unknown", 0)


def test_a_host_is_compared_with_its_own_last_bench_across_releases():
    """issue 63: `bench --compare-last`."""
    from provision.output.benchfigures import flag_regressions, last_figures

    key9, key10 = "/m|tp8|0.5.9|GPU", "/m|tp8|0.5.10|GPU"
    journal = [{"command": "bench", "verdict": "measured", "host": "canary", "time": "2026-12-07T06:10:00",
                "bench": {"decode_tok_s": 96.0, "accept_length": 3.1, "version": "0.5.9", "key": key9}},
               {"command": "bench", "verdict": "failed", "host": "canary", "bench": {"decode_tok_s": 1.0}},
               {"command": "patch", "verdict": "patched", "host": "other"}]
    last = last_figures(journal)
    assert list(last) == ["canary"] and last["canary"]["decode_tok_s"] == 96.0
    figs = {"canary": {"decode_tok_s": 69.9, "spec_on": True, "version": "0.5.10", "key": key10, "flags": [],
                       "notes": []},
            "new": {"decode_tok_s": 90.0, "spec_on": True, "key": key10, "flags": [], "notes": []}}
    flag_regressions(figs, last, 0.9)
    assert figs["canary"]["flags"] == ["regressed"] and figs["canary"]["vs_last"] == 0.728
    assert figs["canary"]["notes"] == ["regressed: 69.9 tok/s on 0.5.10 is 0.73x its last bench (96.0 tok/s on "
                                       "0.5.9, 2026-12-07 06:10) < 0.9"]
    assert figs["new"]["flags"] == [] and "nothing to compare with" in figs["new"]["notes"][0]
    same = {"canary": {"decode_tok_s": 95.0, "spec_on": True, "version": "0.5.10", "key": key10, "flags": [],
                       "notes": []}}
    flag_regressions(same, last, 0.9)
    assert same["canary"]["flags"] == [] and "0.99x its last bench" in same["canary"]["notes"][0]
    other = {"canary": {"decode_tok_s": 10.0, "spec_on": False, "key": key10, "flags": [], "notes": []}}
    flag_regressions(other, last, 0.9)  # the last one ran EAGLE-3, this one does not: not compared
    assert other["canary"]["flags"] == [] and "not compared" in other["canary"]["notes"][0]


def test_streams_that_all_arrived_at_once_give_no_decode_figure_and_say_why():
    reqs = [{"ok": True, "completion_tokens": 32, "decode_s": 0.0005, "ttft_s": 0.1} for _ in range(3)]
    fig = bf.host_figures({"requests": reqs})
    assert fig["decode_tok_s"] is None
    assert any("no request's stream could be timed" in n for n in fig["notes"]), fig["notes"]
