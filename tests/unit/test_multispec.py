"""Several specs per host, decided before any host is touched: inventory `specs:`, one spec per
file, which specs apply (tasks/specs.py), the report's rows and counts. Pure."""

from __future__ import annotations

import pytest

from provision.config.applies import HostView
from provision.config.inventory import Host, host_spec_names, parse_inventory
from provision.config.playbook import load_patch_spec, parse_playbook
from provision.errors import ConfigError, UsageError
from provision.output.report import host_line, summary_line
from provision.output.results import HostResult
from provision.tasks import specs as multi
from provision.tasks.patch import status_exit_code

INV = """\
defaults:
  specs: [kimi-k25-eagle3, kimi-vl-eagle3]
groups:
  sm120:
    vars: {gpu_capability: 12.0}
    hosts: [gpu01, gpu02]
hosts:
  gpu01: {address: 10.0.0.1}
  gpu02: {address: 10.0.0.2, spec: kimi-vl-eagle3}
  gpu03: {address: 10.0.0.3, specs: [kimi-vl-eagle3, kimi-k25-eagle3]}
"""


def test_inventory_specs_layers():
    by = {h.name: h for h in parse_inventory(INV, "inv.yaml").hosts}
    assert host_spec_names(by["gpu01"]) == ["kimi-k25-eagle3", "kimi-vl-eagle3"]
    assert host_spec_names(by["gpu02"]) == ["kimi-vl-eagle3"]        # spec: X is short for specs: [X]
    assert host_spec_names(by["gpu03"]) == ["kimi-vl-eagle3", "kimi-k25-eagle3"]   # the host's order
    assert by["gpu01"].vars["gpu_capability"] == "12.0"                 # the YAML number 12.0, as text
    assert "gpu_capability" not in by["gpu03"].vars
    assert host_spec_names(Host("x")) == [None]                         # the default spec


@pytest.mark.parametrize("text, words", [
    ("hosts:\n  a: {spec: x, specs: [y]}\n", "give `spec` or `specs`, not both"),
    ("hosts:\n  a: {specs: []}\n", "non-empty list"),
    ("hosts:\n  a: {specs: [x, x]}\n", "listed twice"),
    ("hosts:\n  a: {specs: [1]}\n", "non-empty list"),
    ("hosts:\n  a: {gpu_capability: sm120}\n", "MAJOR.MINOR"),
])
def test_inventory_specs_refused(text, words):
    with pytest.raises(ConfigError) as exc:
        parse_inventory(text, "inv.yaml")
    assert words in exc.value.message and exc.value.message.startswith("inv.yaml:2:"), exc.value.message


def test_ansible_ini_specs():
    inv = parse_inventory("[gpus]\ngpu01 specs=kimi-k25-eagle3,kimi-vl-eagle3 gpu_capability=12.0\n"
                          "gpu02 spec=kimi-vl-eagle3\n", "hosts", ini_fallback=True)
    by = {h.name: h for h in inv.hosts}
    assert host_spec_names(by["gpu01"]) == ["kimi-k25-eagle3", "kimi-vl-eagle3"]
    assert by["gpu01"].vars["gpu_capability"] == "12.0"
    assert host_spec_names(by["gpu02"]) == ["kimi-vl-eagle3"]


def _spec(name: str, applies: str = "", file: str = "srt/models/kimi_k25.py"):
    text = (f"name: {name}\npatch:\n  file: {file}\n  class: K\n  delegate: language_model\n"
            f"  methods: [{{name: get_embed_and_head, params: self}}]\n" + (f"  applies: {applies}\n" if applies else ""))
    return parse_playbook(text, f"{name}.yaml").patch


def test_one_spec_per_file():
    a, b = load_patch_spec("kimi-k25-eagle3"), load_patch_spec("kimi-vl-eagle3")
    multi.check_distinct([a, b], "host h")
    with pytest.raises(UsageError) as exc:
        multi.check_distinct([a, _spec("other")], "host h")
    assert "specs kimi-k25-eagle3 and other both edit sglang/srt/models/kimi_k25.py" in exc.value.message
    with pytest.raises(UsageError, match="given twice"):
        multi.check_distinct([a, a], "--playbook")


def test_split_and_what_must_be_asked():
    plain = load_patch_spec("kimi-vl-eagle3")
    gpu = _spec("gpu-only", "{gpu_capability: ['12.0']}", "srt/a.py")
    newer = _spec("newer", "{sglang: '>=0.5.10'}", "srt/b.py")
    host = Host("h")
    assert multi.must_ask([gpu], host, None) and not multi.must_ask([gpu], host, "12.0")
    assert not multi.must_ask([gpu], Host("h", {"gpu_capability": "12.0"}), None)
    assert multi.must_ask([gpu, newer], host, "12.0") and not multi.must_ask([plain], host, None)
    assert multi.wants_gpu([gpu], host, None) and not multi.wants_gpu([newer], host, None)
    ok, no = multi.split([plain, gpu, newer], HostView(sglang="0.5.9", gpu=(), gpu_unknown="no nvidia-smi on the host"))
    assert [s.name for s in ok] == ["kimi-vl-eagle3"]
    assert "no nvidia-smi" in no["gpu-only"] and "SGLang 0.5.9 is outside >=0.5.10" in no["newer"]
    ok, no = multi.split([plain, gpu, newer], HostView(sglang="0.5.10", gpu=("12.0",)))
    assert len(ok) == 3 and not no


def test_host_view_reads_the_facts():
    ans = {"facts": {"chosen": "/p", "installs": [{"path": "/p", "version": "0.5.9"}],
                     "packages": {"flashinfer": {"dir": "/q/flashinfer", "version": "0.6.3"},
                                  "gone": {"dir": None, "version": None, "error": "not found"}}},
           "gpu": {"capabilities": [], "unknown": "no nvidia-smi on the host"}}
    v = multi.host_view(ans, Host("h"), None)
    assert v.sglang == "0.5.9" and v.packages == {"flashinfer": "0.6.3", "gone": None}
    assert v.gpu == () and v.gpu_unknown == "no nvidia-smi on the host"
    v = multi.host_view(ans, Host("h", {"gpu_capability": "12.0"}), None)
    assert v.gpu == ("12.0",) and v.gpu_source == "inventory gpu_capability"
    assert multi.host_view(ans, Host("h"), "9.0").gpu_source == "--gpu-capability"


def test_rows_counts_and_exit_code():
    rows = [HostResult("a", "patched", data={"spec": "kimi-k25-eagle3"}),
            HostResult("a", "not-applicable", "GPU ...", data={"spec": "sm120-torch-symm-mem"}),
            HostResult("b", "native", data={"spec": "kimi-k25-eagle3"})]
    assert summary_line(rows) == "2 hosts, 3 host-specs: 1 native, 1 not-applicable, 1 patched"
    assert summary_line(rows[2:]) == "1 host: 1 native"
    assert host_line(HostResult("a", "patched", version="0.5.9", file="/f", data={"spec": "s"})) == \
        "a  patched  sglang 0.5.9  spec s  /f"
    assert status_exit_code([r for r in rows if r.verdict != "patched"]) == 0   # not-applicable is wanted


def test_status_exits_3_when_a_server_provision_started_is_down():
    """issue 63: `status` exited 0 while the server it listed had crashed (`exited 1`)."""
    from provision.tasks.patch import status_from_answer

    def answer(server):
        return {"ok": True, "facts": {"installs": [{"path": "/opt/venv/sglang", "version": "0.5.9"}],
                                      "chosen": "/opt/venv/sglang"},
                "patch": {"methods": {"a": "present"}, "block": {"state": "ours", "matches": True}}, "server": server}

    rec = {"pid": 7, "port": 30000, "model": "m"}
    crashed = status_from_answer("h", answer({"record": rec, "running": False, "exit": 1}))
    assert crashed.data["server_state"] == "exited 1" and crashed.data["server_down"], crashed.data
    assert status_exit_code([crashed]) == 3
    stopped = status_from_answer("h", answer({"record": dict(rec, stopped_at=1.0), "running": False, "exit": 0}))
    up = status_from_answer("h", answer({"record": rec, "running": True, "health": 200, "uptime": 5}))
    none = status_from_answer("h", answer({}))
    assert not any(r.data["server_down"] for r in (stopped, up, none))
    assert status_exit_code([stopped]) == status_exit_code([up]) == status_exit_code([none]), (stopped, up, none)
