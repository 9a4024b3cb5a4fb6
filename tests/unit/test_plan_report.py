"""Rolling batches and the report: pure functions of the records."""

import json

import pytest

from provision.control import plan
from provision.output import report
from provision.errors import EXIT_CHANGES, EXIT_FAILED, EXIT_NOTHING, EXIT_OK, UsageError
from provision.config.inventory import Host
from provision.output.results import HostResult


def hosts(n, servers=None):
    servers = servers or {}
    return [Host(f"h{i}", {"server": servers.get(i)} if servers.get(i) else {}) for i in range(n)]


def names(bs):
    return [[h.name for h in b] for b in bs]


def test_serial_counts_and_percentages():
    assert names(plan.batches(hosts(5), "2")) == [["h0", "h1"], ["h2", "h3"], ["h4"]]
    assert names(plan.batches(hosts(4), "50%")) == [["h0", "h1"], ["h2", "h3"]]
    assert names(plan.batches(hosts(3), "10%")) == [["h0"], ["h1"], ["h2"]]
    assert names(plan.batches(hosts(3), None)) == [["h0", "h1", "h2"]]
    for bad in ("0", "-1", "x", "0%", "150%"):
        with pytest.raises(UsageError):
            plan.batches(hosts(3), bad)


def test_multinode_server_is_one_unit():
    hs = hosts(5, {1: "big", 3: "big"})
    assert names(plan.batches(hs, "2")) == [["h0", "h1", "h3"], ["h2", "h4"]]


def test_max_fail():
    assert not plan.should_stop(0, 0) and plan.should_stop(1, 0)
    assert not plan.should_stop(5, None)


def test_exit_codes_agree_with_verdicts():
    ok = HostResult("a", "patched")
    assert report.exit_code([]) == EXIT_NOTHING
    assert report.exit_code([ok, HostResult("b", "native")]) == EXIT_OK
    assert report.exit_code([ok], check=True) == EXIT_CHANGES
    assert report.exit_code([HostResult("a", "unchanged")], check=True) == EXIT_OK
    assert report.exit_code([ok, HostResult("b", "unknown")]) == EXIT_FAILED
    assert report.exit_code([ok, HostResult("b", "unreachable")], check=True) == EXIT_FAILED


def test_json_document_has_every_host():
    rs = [HostResult("a", "patched", added=["x"]), HostResult("b", "failed", "auth refused", error_kind="auth")]
    doc = json.loads(report.to_document("patch", rs, 3))
    assert doc["exit_code"] == 3 and [h["host"] for h in doc["hosts"]] == ["a", "b"]
    assert doc["hosts"][1]["failed"] is True and doc["hosts"][1]["error_kind"] == "auth"
    assert report.summary_line(rs) == "2 hosts: 1 failed, 1 patched"
    assert "would-patch" in report.host_line(rs[0], check=True)
    assert "would-restore" in report.host_line(HostResult("a", "restored"), check=True)
    assert "would-repair" in report.host_line(HostResult("a", "repaired"), check=True)
