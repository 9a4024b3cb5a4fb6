"""bench's progress, as the user reads it: the plan line before the run, one line per request
during it (the host op's event, the control side's arithmetic)."""

from __future__ import annotations

from provision.host.ops.bench import progress
from provision.tasks import bench as tb


def test_the_plan_says_the_work_and_the_time_and_the_quick_spelling_when_it_is_long():
    line = tb.plan_line(tb.BenchOptions(), 3)
    assert line.startswith("bench: 3 hosts, each 2 warm-up + 15 measured requests of 512 tokens, one at a time")
    assert "about 2 min 56 s per host at 50 tok/s" in line and "`-n 3 --max-new-tokens 64` takes seconds" in line
    short = tb.plan_line(tb.BenchOptions(requests=3, max_new_tokens=64), 1)
    assert short.startswith("bench: 1 host, ") and "about 7 s per host" in short and "-n 3" not in short


def test_events_number_every_request_of_the_run():
    ev = [progress("warmup", i, 2, {}, 5) for i in (1, 2)] + [progress("request", i, 3, {}, 5) for i in (1, 2, 3)]
    assert [(e["bench"], e["done"], e["step"]) for e in ev] == [
        ("warmup", 1, 1), ("warmup", 2, 2), ("request", 1, 3), ("request", 2, 4), ("request", 3, 5)]
    assert all(e["steps"] == 5 for e in ev)


def test_a_request_line_has_its_speed_and_the_time_left_at_the_pace_so_far():
    one = {"completion_tokens": 65, "decode_s": 0.5, "first_chunk_tokens": 1}
    ev = progress("request", 1, 4, one, 5)  # step 2 of 5 after 10 s: 15 s left
    assert tb.progress_text(ev, 10.0) == "request 1/4: 128.0 tok/s; about 15 s left"
    last = progress("request", 4, 4, one, 5)
    assert tb.progress_text(last, 30.0) == "request 4/4: 128.0 tok/s"
    assert tb.progress_text(progress("warmup", 1, 1, {}, 2), 1.0) == "warm-up 1/1; about 1 s left"


def test_an_event_it_does_not_know_is_no_line():
    for bad in ({}, {"bench": "other", "done": 1, "of": 1, "step": 1, "steps": 1},
                {"bench": "request", "done": "1", "of": 1, "step": 1, "steps": 1},
                {"bench": "request", "done": 1, "of": 1, "step": 0, "steps": 1}):
        assert tb.progress_text(bad, 1.0) is None
