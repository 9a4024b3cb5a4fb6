"""The multi-node coordinator (tasks/multinode.py): rank 0's verdict, the default dist-init-addr,
and a rank > 0's decision when rank 0 did not come up. Pure: probes and stops are functions."""

from __future__ import annotations

import threading

import pytest

from provision.config.inventory import Host
from provision.errors import ConfigError
from provision.output.results import HostResult
from provision.tasks.multinode import MultiNode, follow_secondary


def group(r0_vars=None):
    return [Host("gpu-a", {"server": "k", "node_rank": 0, **(r0_vars or {})}),
            Host("gpu-b", {"server": "k", "node_rank": 1}), Host("solo", {})]


def test_dist_init_addr_prefers_address_then_ssh_hostname_then_name():
    mn = MultiNode(group())
    assert mn.args_for(group()[1], "sglang")["dist-init-addr"] == "gpu-a:50000"  # nothing resolved yet
    mn.resolve_addresses(lambda h: {"gpu-a": "10.0.0.7"}.get(h.name))
    assert mn.args_for(group()[1], "sglang") == {"nnodes": 2, "node-rank": 1, "dist-init-addr": "10.0.0.7:50000"}
    assert "10.0.0.7:50000" in mn.address_note(group()[0], "sglang") and "ssh -G" in mn.address_note(group()[0], "sglang")
    assert mn.args_for(group()[2], "sglang") == {} and mn.address_note(group()[2], "sglang") is None

    mn = MultiNode(group({"address": "192.168.1.5"}))
    mn.resolve_addresses(lambda h: "10.0.0.7")
    assert mn.args_for(group()[1], "sglang")["dist-init-addr"] == "192.168.1.5:50000"
    assert "inventory address" in mn.address_note(group()[1], "sglang")

    mn = MultiNode(group({"args": {"dist-init-addr": "ib0-a:6000"}}))
    mn.resolve_addresses(lambda h: "10.0.0.7")
    assert mn.args_for(group()[1], "sglang")["dist-init-addr"] == "ib0-a:6000" and mn.address_note(group()[1], "sglang") is None

    mn = MultiNode(group())
    mn.resolve_addresses(lambda h: h.name)  # ssh -G echoes the name: no HostName set
    assert mn.args_for(group()[1], "sglang")["dist-init-addr"] == "gpu-a:50000" and "inventory name" in mn.address_note(group()[1], "sglang")


def test_rank0s_first_verdict_counts_and_an_unreached_rank0_is_a_verdict():
    hs = group()
    mn = MultiNode(hs)
    assert mn.rank0_failed(hs[1]) is None
    mn.host_done(hs[1], HostResult("gpu-b", "failed", "x"))  # not rank 0: ignored
    assert not mn.done["k"].is_set()
    mn.host_done(hs[0], HostResult("gpu-a", "unreachable", "gpu-a: cannot connect: connection refused"))
    mn.finish(hs[0], "failed", "later")
    assert mn.done["k"].is_set() and mn.verdict["k"] == "unreachable"
    assert mn.rank0_failed(hs[1]) == "rank 0 of server k (gpu-a) unreachable: gpu-a: cannot connect: connection refused"


def test_bad_ranks_are_a_config_error():
    with pytest.raises(ConfigError, match="node_rank values"):
        MultiNode([Host("a", {"server": "k", "node_rank": 0}), Host("b", {"server": "k", "node_rank": 2})])


def test_a_secondary_is_stopped_when_rank0_fails_and_kept_when_it_is_ready():
    hs = group()
    stops = []

    def stop():
        stops.append(1)
        return HostResult("gpu-b", "stopped", "stopped 3 processes in 0.2 s")

    mn = MultiNode(hs)
    threading.Timer(0.05, lambda: mn.finish(hs[0], "crashed", "CUDA out of memory")).start()
    r = follow_secondary(hs[1], mn, poll=0.01, deadline=60, probe=lambda: {"running": True}, stop=stop)
    assert r.verdict == "failed" and stops == [1]
    assert "rank 0 of server k (gpu-a) crashed: CUDA out of memory" in r.detail and "was stopped" in r.detail

    mn = MultiNode(hs)
    mn.finish(hs[0], "ready")
    r = follow_secondary(hs[1], mn, poll=0.01, deadline=60, probe=lambda: {"running": True}, stop=stop)
    assert r.verdict == "ready" and stops == [1]

    mn = MultiNode(hs)
    mn.finish(hs[0], "refused", "port busy")
    r = follow_secondary(hs[1], mn, poll=0.01, deadline=60, probe=lambda: {"running": True},
                         stop=lambda: HostResult("gpu-b", "failed", "sudo refused"))
    assert r.verdict == "failed" and "stopping this rank (rank 1) failed: sudo refused" in r.detail


def test_a_secondary_whose_own_process_dies_reports_it_without_waiting():
    hs = group()
    r = follow_secondary(hs[1], MultiNode(hs), poll=0.01, deadline=60, probe=lambda: {"running": False, "exit": 9},
                         stop=lambda: HostResult("gpu-b", "stopped", ""))
    assert r.verdict == "crashed" and "exit status 9" in r.detail


@pytest.mark.parametrize("verdict", ["unknown", "timeout"])
def test_a_secondary_stays_up_with_a_rank0_left_running(verdict):
    """Rank 0's follow ended `unknown` (the host lost past --max-outage) or `timeout`: its server is
    left running, so this rank is too (stopping it would leave rank 0 in NCCL holding its GPUs), and
    the row says so; a rank that starts after that verdict is started, not refused."""
    hs = group()
    stops = []
    mn = MultiNode(hs)
    mn.finish(hs[0], verdict, "gpu-a: no answer for 300 s; the server is left running")
    assert mn.rank0_failed(hs[1]) is None
    r = follow_secondary(hs[1], mn, poll=0.01, deadline=60, probe=lambda: {"running": True},
                         stop=lambda: stops.append(1) or HostResult("gpu-b", "stopped", ""))
    assert stops == [] and r.verdict == verdict and r.data["stopped"] is False
    assert r.detail.startswith(f"rank 0 of server k (gpu-a) ended {verdict}: gpu-a: no answer for 300 s")
    assert "this rank (rank 1) was left running with it: `provision wait" in r.detail


def test_a_vllm_group_gets_vllms_own_flags_never_sglangs_dist_init_addr():
    """Issue 60: vLLM's parser refuses --dist-init-addr; its ranks meet at --master-addr/--master-port."""
    mn = MultiNode(group())
    mn.resolve_addresses(lambda h: {"gpu-a": "10.0.0.7"}.get(h.name))
    assert mn.args_for(group()[1], "vllm") == {"nnodes": 2, "node-rank": 1, "master-addr": "10.0.0.7",
                                               "master-port": 50000}
    assert "--master-addr and --master-port 10.0.0.7:50000" in mn.address_note(group()[0], "vllm")
    mn = MultiNode(group({"args": {"master-addr": "ib0-a", "master-port": 6000}}))
    mn.resolve_addresses(lambda h: "10.0.0.7")
    assert mn.args_for(group()[1], "vllm") == {"nnodes": 2, "node-rank": 1, "master-addr": "ib0-a",
                                               "master-port": 6000}
    assert mn.address_note(group()[1], "vllm") is None


def test_vllms_multinode_flags_are_in_its_own_parser():
    """The flags vLLM's multinode_args gives are ones 0.32.0's own arg_utils.py declares."""
    import re

    from provision.host import inference
    from provision.sandbox.vllm_sources import SourceUnavailable, package_dir

    try:
        text = (package_dir("0.32.0") / "engine" / "arg_utils.py").read_text()
    except SourceUnavailable as exc:  # pragma: no cover
        import pytest
        pytest.skip(str(exc))
    declared = set(re.findall(r'add_argument\(\s*"--([a-z-]+)"', text))
    assert set(inference.get("vllm").multinode_args(2, 1, "a", 1)) <= declared, declared
