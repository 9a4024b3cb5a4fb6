"""Which server a verb acts on when nothing names it (tasks/recorded.py, issue 63). Pure."""

from __future__ import annotations

from provision.config.inventory import Host
from provision.tasks.recorded import choose, named


def test_a_server_is_named_by_the_run_or_the_inventory():
    assert not named(Host("h", {}), None, None)
    assert named(Host("h", {}), None, 8000) and named(Host("h", {}), "kimi-k25-eagle3-vllm", None)
    assert named(Host("h", {"profile": "x.yaml"}), None, None) and named(Host("h", {"args": {"port": 8000}}), None, None)


def test_the_one_server_recorded_elsewhere_is_the_one_acted_on():
    vllm = {"port": 8000, "pid": 42, "profile": "kimi-k25-eagle3-vllm", "engine": "vllm"}
    port, note = choose("h", 30000, {"record": None, "elsewhere": [vllm]})
    assert port == 8000 and "the one provision recorded on this host, port 8000 (vllm, playbook " \
                             "kimi-k25-eagle3-vllm, pid 42)" in note
    # the default port's own live record wins; a stopped one does not
    assert choose("h", 30000, {"record": {"pid": 1}, "elsewhere": [vllm]}) == (30000, "")
    assert choose("h", 30000, {"record": {"pid": 1, "stopped_at": 5.0}, "elsewhere": [vllm]})[0] == 8000
    assert choose("h", 30000, {"record": None, "elsewhere": []}) == (30000, "")  # nothing anywhere: as before


def test_several_recorded_servers_are_refused_and_listed():
    two = [{"port": 8000, "engine": "vllm", "profile": "a"}, {"port": 8001, "engine": "sglang", "profile": "b"}]
    row = choose("h", 30000, {"record": None, "elsewhere": two})
    assert row.verdict == "refused" and "port 8000 (vllm, playbook a); port 8001 (sglang, playbook b)" in row.detail
    assert "--server-port 8000" in row.detail
