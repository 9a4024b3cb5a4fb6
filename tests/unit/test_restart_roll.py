"""Rolling restarts (reconcile --restart): server groups restart as one unit, and the window is
checked before every batch (pure: given times, a given clock, no hosts)."""

from __future__ import annotations

from datetime import datetime, time as dtime, timedelta

import pytest

from provision.tasks import reconcile as rc
from provision.config.inventory import Host
from provision.output.results import HostResult


def H(name, **vars_):
    return Host(name=name, vars=vars_)


def need(*names):
    return [HostResult(n, "patched", data={"restart_needed": ["pid 1"]}) for n in names]


@pytest.mark.parametrize("now,window,closed", [
    (dtime(2, 0), "02:00-05:00", False),
    (dtime(4, 59, 59), "02:00-05:00", False),
    (dtime(5, 0), "02:00-05:00", True),       # the end is exclusive
    (dtime(1, 59, 59), "02:00-05:00", True),
    (dtime(23, 30), "22:00-02:00", False),    # across midnight
    (dtime(1, 59), "22:00-02:00", False),
    (dtime(2, 0), "22:00-02:00", True),
    (dtime(12, 0), None, False),
])
def test_window_closed_at_given_times(now, window, closed):
    why = rc.window_closed(now, rc.parse_window(window) if window else None)
    assert (why is not None) == closed
    if closed:
        assert why == f"outside window {window}"


def test_a_server_group_is_one_unit_even_when_one_rank_needs_it():
    hosts = [H("a", server="kimi", node_rank=0), H("b", server="kimi", node_rank=1), H("c"), H("d")]
    results = need("b", "c") + [HostResult("a", "unchanged"), HostResult("d", "unchanged")]
    batches, notes = rc.plan_restarts(results, hosts, restart=True, serial="1")
    assert [[h.name for h in b] for b in batches] == [["a", "b"], ["c"]]
    assert "restarted with the rest of server kimi" in notes["a"] and "d" not in notes


def _clock(times):
    it = iter(times)
    return lambda: next(it)


def _ready(batch):
    return [HostResult(h.name, "ready", "ready in 1 s") for h in batch]


def test_a_window_that_closes_mid_roll_stops_at_a_batch_boundary():
    batches = [[H("a"), H("b")], [H("c")], [H("d")], [H("e")]]
    t = datetime(2026, 1, 1, 4, 58)
    clock = _clock([t, t + timedelta(minutes=1), t + timedelta(minutes=2), t + timedelta(minutes=3)])
    ran = []

    def run_batch(batch):
        ran.append([h.name for h in batch])
        return _ready(batch)

    out = list(rc.roll(batches, window=rc.parse_window("02:00-05:00"), clock=clock, run_batch=run_batch))
    assert ran == [["a", "b"], ["c"]]  # 04:58 and 04:59 start; 05:00 does not
    verdicts = {n: v for n, v, _ in out}
    assert verdicts == {"a": "restarted", "b": "restarted", "c": "restarted", "d": "skipped", "e": "skipped"}
    detail = dict((n, d) for n, _, d in out)
    assert detail["d"] == ("restart skipped: batch 3/4 not started, outside window 02:00-05:00 (it was 05:00:00)")
    assert detail["e"] == detail["d"]


def test_a_failed_batch_skips_the_rest_and_no_window_means_always():
    batches = [[H("a")], [H("b")], [H("c")]]

    def run_batch(batch):
        return [HostResult(h.name, "crashed" if h.name == "a" else "ready", "x") for h in batch]

    out = list(rc.roll(batches, window=None, clock=datetime.now, run_batch=run_batch))
    assert [(n, v) for n, v, _ in out] == [("a", "crashed"), ("b", "skipped"), ("c", "skipped")]
    assert out[1][2] == "restart skipped: batch 1 did not come back healthy"


def test_provision_now_drives_the_window_clock(monkeypatch):
    monkeypatch.setenv("PROVISION_NOW", "2026-01-01T04:59:57")
    now = rc.window_clock()()
    assert datetime(2026, 1, 1, 4, 59, 57) <= now < datetime(2026, 1, 1, 5, 30)
    monkeypatch.setenv("PROVISION_NOW", "not a time")
    with pytest.raises(rc.UsageError):
        rc.window_clock()
    monkeypatch.delenv("PROVISION_NOW")
    assert rc.window_clock() == datetime.now
