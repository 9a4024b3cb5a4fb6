"""What a user is told after a Ctrl-C during launch, and what the journal keeps of server changes (pure)."""

from __future__ import annotations

from provision.control import journal
from provision.config.inventory import Host
from provision.tasks.interrupt import RunState, interrupt_report, interrupted_result
from provision.tasks.options import LaunchOptions
from provision.output.results import HostResult


def test_interrupt_report_says_per_host_how_far_the_launch_got():
    hosts = [Host("a"), Host("b"), Host("c"), Host("d"), Host("e")]
    opts, run = LaunchOptions(), RunState()
    run.stages.update({"a": "started", "b": "starting", "c": "preflight", "e": "patching"})
    run.results["a"] = interrupted_result(hosts[0], {"pid": 42, "log": "/var/log/x.log"}, opts)
    by = {r.host: r for r in interrupt_report(hosts, run, opts)}
    assert by["a"].verdict == "interrupted" and "the server was started (pid 42, log /var/log/x.log)" in by["a"].detail
    assert "left running" in by["a"].detail and "provision wait --host a" in by["a"].detail
    assert by["b"].verdict == "unknown" and "provision status --host b" in by["b"].detail
    for name in ("c", "d"):
        assert by[name].verdict == "interrupted" and "nothing was started" in by[name].detail
    assert by["e"].verdict == "unknown" and "provision status --host e" in by["e"].detail
    assert all("nothing was run there" not in r.detail for r in by.values())


def test_stop_on_interrupt_is_said():
    opts = LaunchOptions(stop_on_interrupt=True)
    r = interrupted_result(Host("a"), {"pid": 7}, opts)
    assert "stopping it (--stop-on-interrupt)" in r.detail and "left running" not in r.detail


def test_every_server_change_is_journaled():
    started = HostResult("a", "ready", "ready in 3 s", data={"journal_extra": [
        {"command": "launch", "verdict": "started", "detail": "started pid 9 port 30000 profile p; then ready"}]})
    crashed = HostResult("b", "crashed", "x", data={"journal_extra": [
        {"command": "launch", "verdict": "restarted", "detail": "restarted pid 3; then crashed"}]})
    refused = HostResult("c", "refused", "preflight: ...")
    lines = journal.entries("launch", [started, crashed, refused])
    # a refused launch is an attempt, journaled too (issue 38, item 4)
    assert [(x["host"], x["command"], x["verdict"]) for x in lines] == [("a", "launch", "started"),
                                                                        ("b", "launch", "restarted"),
                                                                        ("c", "launch", "refused")]
    stop = journal.entries("stop", [HostResult("a", "stopped", "stopped 10 processes")])
    assert [(x["command"], x["verdict"]) for x in stop] == [("stop", "stopped")]
