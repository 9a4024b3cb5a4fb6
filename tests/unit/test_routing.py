"""The router step's pure parts (tasks/routing.py): the router's URL, the server's URL there, the
timeline's words and journal lines, and the journal keeping every `router` line (issue 59)."""

from __future__ import annotations

import pytest

from provision.config.inventory import Host
from provision.control import journal
from provision.errors import ConfigError
from provision.output.results import HostResult
from provision.tasks import routing
from provision.tasks.interrupt import RunState, interrupt_report
from provision.tasks.options import LaunchOptions, resolve


@pytest.mark.parametrize("value", ["http://10.1.230.174:30080", "https://router.example:443/", " http://r:1 "])
def test_a_router_url_is_kept_without_its_trailing_slash(value):
    assert routing.router_url(value, "host a") == value.strip().rstrip("/")


@pytest.mark.parametrize("value", ["10.1.230.174:30080", "ftp://r:1", "", "http://", "router"])
def test_anything_but_an_http_url_is_a_config_error_that_shows_one(value):
    with pytest.raises(ConfigError, match=r"host a: router .*expected the router's URL, e.g. http://"):
        routing.router_url(value, "host a")


def test_the_worker_url_is_the_hosts_address_and_the_servers_port_unless_given():
    assert routing.worker_url("10.1.230.174", 30000) == "http://10.1.230.174:30000"
    assert routing.worker_url("fd00::5", 30001) == "http://[fd00::5]:30001"
    assert routing.worker_url("10.1.230.174", 30000, "http://gpu-7.internal:30000/") == "http://gpu-7.internal:30000"


def test_place_of_prefers_the_command_lines_router_and_none_means_no_router():
    h = Host("gpu1", {"address": "10.1.230.174", "router": "http://r1:30080"})
    assert routing.place_of(Host("gpu2"), 30000, None, None) is None
    p = routing.place_of(h, 30000, None, None)
    assert p.router.url == "http://r1:30080" and p.worker == "http://10.1.230.174:30000"
    assert routing.place_of(h, 30000, "http://r2:1", None).router.url == "http://r2:1"


def test_a_bad_router_is_refused_when_the_profile_is_resolved_before_any_host_is_touched():
    with pytest.raises(ConfigError, match="host gpu1: router 'r1:30080'"):
        resolve(Host("gpu1", {"router": "r1:30080"}), LaunchOptions())
    with pytest.raises(ConfigError, match="--router"):
        resolve(Host("gpu1"), LaunchOptions(router="nope"))


def test_the_timeline_says_each_step_with_its_seconds_since_the_take_out():
    s = routing.Steps(t0=100.0)
    s.add("out", "taken out", at=100.4)
    routing.stop_steps(s, {"elapsed": 2.5, "pids": [1, 2], "drain": {"drained": True, "waited": 2.0}}, began=101.0)
    s.add("back-in", "listed healthy", at=111.3)
    assert s.words() == "out 0.4 s, drained 3 s, stopped 3.5 s, back in 11.3 s"
    lines = s.journal()
    assert [x["verdict"] for x in lines] == ["out", "drained", "stopped", "back-in"]
    assert lines[2] == {"command": "router", "verdict": "stopped", "detail": "stopped 2 processes (+3.5 s)"}


def test_a_cut_drain_says_how_many_requests():
    s = routing.Steps(t0=0.0)
    routing.stop_steps(s, {"elapsed": 30.2, "pids": [1], "drain": {"drained": False, "waited": 30.0}, "cut": 3}, 0.0)
    assert s.items[0]["detail"] == "3 request(s) cut at the deadline"


def test_every_router_line_is_journaled_whatever_its_verdict():
    r = HostResult("gpu1", "ready", "ready in 9 s", data={"journal_extra": [
        {"command": "router", "verdict": v, "detail": "x (+1 s)"} for v in ("out", "warmed", "left-out")]})
    got = journal.entries("launch", [r])
    assert [(x["command"], x["verdict"]) for x in got] == [("router", "out"), ("router", "warmed"),
                                                           ("router", "left-out")]


def test_a_ctrl_c_report_says_a_host_is_out_of_its_router_and_how_to_put_it_back():
    run = RunState(stages={"gpu1": "started"}, router_out={"gpu1": "the router http://r1:30080"})
    row = interrupt_report([Host("gpu1")], run, LaunchOptions())[0]
    assert "out of the router http://r1:30080: `provision wait --host gpu1` (or the next `launch --restart`)" \
        in row.detail, row.detail
